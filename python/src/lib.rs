//! `conductor._native`: the Python package's native half. It loads an engine and serves it
//! in-process ([`conductor_server::local::Local`]): requests are the OpenAI API's JSON, handled
//! by `conductor serve`'s own code (chat template, constrained decoding, tool calls, stop
//! sequences, log-probabilities), so the Python `Llama` class (conductor/llama.py) only
//! translates llama-cpp-python's arguments into requests and answers into its dicts.
//!
//! The engine computes on its own thread, never holding the GIL; a thread waiting for the next
//! piece of an answer waits without the GIL, in slices, checking for Ctrl-C between them.

use conductor::fetch;
use conductor::runtime::cache::MemoryBudget;
use conductor::runtime::convert::{convert as convert_model, ConvertOptions};
use conductor::runtime::plan::ExecutionPlan;
use conductor::runtime::sparse::SparsityMode;
use conductor::{Engine, SparsitySettings};
use conductor_server::local::{self, Local};
use conductor_server::ServeOptions;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

/// How long a waiting thread goes without looking for Ctrl-C.
const SIGNAL_SLICE: Duration = Duration::from_millis(50);

/// `error` and its sources, "outer: inner", as the CLI prints them.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let more = e.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = e.source();
    }
    text
}

/// A load error as Python sees it: the caller's input at fault (a file, a name, a budget, a
/// setting) is a `ValueError`, the rest a `RuntimeError`.
fn load_error(error: conductor::Error) -> PyErr {
    use conductor::Error as E;
    let message = chain(&error);
    match error {
        E::Fetch(fetch::FetchError::Unknown { .. })
        | E::Load { .. }
        | E::Tokenizer(_)
        | E::Budget(_)
        | E::Sparse(_)
        | E::NoProfile { .. }
        | E::Settings(_)
        | E::Session(_)
        | E::Schedule(_) => PyValueError::new_err(message),
        _ => PyRuntimeError::new_err(message),
    }
}

fn value_error(message: impl Into<String>) -> PyErr {
    PyValueError::new_err(message.into())
}

/// A memory budget from Python: bytes (an int) or a size text ("50%", "48MiB").
fn memory_budget(value: &Bound<'_, PyAny>) -> PyResult<MemoryBudget> {
    if let Ok(bytes) = value.extract::<i64>() {
        if bytes <= 0 {
            return Err(value_error(format!(
                "memory={bytes}: a budget must be a positive number of bytes"
            )));
        }
        return Ok(MemoryBudget::Bytes(bytes as u64));
    }
    let text: String = value.extract().map_err(|_| {
        value_error("memory must be a number of bytes or a text such as \"50%\" or \"48MiB\"")
    })?;
    text.parse()
        .map_err(|e: String| value_error(format!("memory: {e}")))
}

fn sparsity_mode(name: &str) -> PyResult<Option<SparsityMode>> {
    SparsityMode::setting(name).map_err(value_error)
}

/// A loaded model served in-process. `conductor.Llama` wraps it.
#[pyclass(module = "conductor._native", frozen)]
struct NativeEngine {
    /// `None` once closed.
    local: RwLock<Option<Arc<Local>>>,
    model_path: PathBuf,
    n_vocab: usize,
    load_ms: f64,
}

impl NativeEngine {
    fn local(&self) -> PyResult<Arc<Local>> {
        self.local
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| PyRuntimeError::new_err("the model is closed: make a new Llama"))
    }
}

#[pymethods]
impl NativeEngine {
    #[new]
    #[pyo3(signature = (
        model=None, *, n_ctx=None, n_threads=None, memory=None, sparsity=None,
        target_sparsity=None, sparse_profile=None, plan=None, chat_template=None, verbose=false
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: Option<PathBuf>,
        n_ctx: Option<i64>,
        n_threads: Option<i64>,
        memory: Option<&Bound<'_, PyAny>>,
        sparsity: Option<&str>,
        target_sparsity: Option<f32>,
        sparse_profile: Option<PathBuf>,
        plan: Option<PathBuf>,
        chat_template: Option<String>,
        verbose: bool,
    ) -> PyResult<NativeEngine> {
        let n_ctx = match n_ctx {
            None | Some(0) => None,
            Some(n) if n < 0 => return Err(value_error(format!("n_ctx={n}: must be positive"))),
            Some(n) => Some(n as usize),
        };
        let threads = match n_threads {
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
            Some(n) if n < 1 => {
                return Err(value_error(format!("n_threads={n}: must be at least 1")))
            }
            Some(n) => n as usize,
        };
        let memory = memory.map(memory_budget).transpose()?;
        let mode = sparsity.map(sparsity_mode).transpose()?.flatten();
        if let Some(t) = target_sparsity {
            if !(0.0..=1.0).contains(&t) {
                return Err(value_error(format!(
                    "target_sparsity={t}: a share within 0..=1"
                )));
            }
        }
        let plan = plan
            .map(|p| {
                ExecutionPlan::from_file(&p)
                    .map_err(|e| value_error(format!("plan {}: {}", p.display(), chain(&e))))
            })
            .transpose()?;
        // Loading reads and checks the whole file (and may download a known model): no GIL.
        let (local, model_path, n_vocab, load_time) = py.detach(move || {
            let started = std::time::Instant::now();
            let mut say = move |line: &str| {
                if verbose {
                    eprintln!("{line}");
                }
            };
            let path = fetch::resolve_model(model.as_deref(), &mut say)
                .map_err(|e| load_error(conductor::Error::Fetch(e)))?;
            if let Err(e) = std::fs::metadata(&path) {
                return Err(value_error(format!(
                    "cannot read model file {}: {e}",
                    path.display()
                )));
            }
            let mut builder = Engine::builder()
                .model(path.clone())
                .threads(threads)
                .on_progress(say)
                .sparsity(SparsitySettings {
                    mode,
                    target: target_sparsity,
                    profile: sparse_profile,
                    ..SparsitySettings::default()
                });
            if let Some(plan) = plan {
                builder = builder.plan(plan);
            }
            if let Some(memory) = memory {
                builder = builder.memory(memory);
            }
            if let Some(n) = n_ctx {
                builder = builder.context(n);
            }
            let engine = builder.build().map_err(load_error)?;
            let n_vocab = engine.tokenizer().n_vocab();
            let options = ServeOptions {
                context: n_ctx,
                chat_template,
                ..ServeOptions::default()
            };
            let local = Local::new(engine, &options, &mut |line| {
                if verbose {
                    eprintln!("{line}");
                }
            })
            .map_err(|e| value_error(format!("{e:#}")))?;
            Ok((local, path, n_vocab, started.elapsed()))
        })?;
        Ok(NativeEngine {
            local: RwLock::new(Some(Arc::new(local))),
            model_path,
            n_vocab,
            load_ms: load_time.as_secs_f64() * 1e3,
        })
    }

    /// The model file's path.
    #[getter]
    fn model_path(&self) -> PathBuf {
        self.model_path.clone()
    }

    /// Milliseconds the load took (reading, checking, starting the engine).
    #[getter]
    fn load_ms(&self) -> f64 {
        self.load_ms
    }

    fn n_ctx(&self) -> PyResult<usize> {
        Ok(self.local()?.n_ctx())
    }

    fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    fn token_bos(&self) -> PyResult<Option<u32>> {
        Ok(self.local()?.tokenizer().bos())
    }

    fn token_eos(&self) -> PyResult<Option<u32>> {
        let local = self.local()?;
        let tokenizer = local.tokenizer();
        Ok(tokenizer.eot().or(tokenizer.eos()))
    }

    #[pyo3(signature = (text, add_bos=true, special=false))]
    fn tokenize(
        &self,
        py: Python<'_>,
        text: &[u8],
        add_bos: bool,
        special: bool,
    ) -> PyResult<Vec<u32>> {
        let text = std::str::from_utf8(text)
            .map_err(|e| value_error(format!("the text is not UTF-8: {e}")))?;
        let local = self.local()?;
        Ok(py.detach(|| local.tokenizer().encode(text, add_bos, special)))
    }

    #[pyo3(signature = (tokens, special=false))]
    fn detokenize<'py>(
        &self,
        py: Python<'py>,
        tokens: Vec<i64>,
        special: bool,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let local = self.local()?;
        let tokenizer = local.tokenizer();
        let mut out = Vec::new();
        for t in tokens {
            if t < 0 || t as usize >= self.n_vocab {
                return Err(value_error(format!(
                    "token {t} is not in the vocabulary (0..{})",
                    self.n_vocab
                )));
            }
            out.extend(tokenizer.token_to_piece(t as u32, special));
        }
        Ok(PyBytes::new(py, &out))
    }

    /// The next request evaluates its whole prompt (the session forgets what it holds).
    fn reset(&self) -> PyResult<()> {
        self.local()?.forget();
        Ok(())
    }

    /// Starts a request: `path` is an endpoint of `conductor serve`, `body` its JSON.
    fn request(&self, path: &str, body: &str) -> PyResult<NativeCall> {
        let call = self
            .local()?
            .call(path, body.as_bytes())
            .map_err(PyRuntimeError::new_err)?;
        Ok(NativeCall {
            call: Mutex::new(Some(call)),
        })
    }

    /// Stops the engine and frees the model; waits for its thread.
    fn close(&self, py: Python<'_>) {
        let local = self
            .local
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(local) = local {
            // A call still open holds no reference to `Local`, so this is the last one unless
            // another thread is inside a method right now; then the engine goes with it.
            if let Some(mut local) = Arc::into_inner(local) {
                py.detach(move || local.close());
            }
        }
    }

    fn is_closed(&self) -> bool {
        self.local
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
    }
}

/// One request in flight. Dropping it (or `close()`) cancels its generation.
#[pyclass(module = "conductor._native", frozen)]
struct NativeCall {
    call: Mutex<Option<local::Call>>,
}

#[pymethods]
impl NativeCall {
    /// The next piece of the answer (a JSON text: the whole body, or one event of a stream),
    /// or `None` at its end. Waits without the GIL; Ctrl-C raises `KeyboardInterrupt` and
    /// cancels the request.
    fn next(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let mut guard = self.call.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let Some(call) = guard.as_mut() else {
                return Ok(None);
            };
            let piece = py.detach(|| call.next(SIGNAL_SLICE));
            match piece {
                Ok(local::Piece::Data(text)) => return Ok(Some(text)),
                Ok(local::Piece::End) => {
                    *guard = None;
                    return Ok(None);
                }
                Ok(local::Piece::Waiting) => {
                    if let Err(interrupt) = py.check_signals() {
                        // Dropping the call cancels the generation at its next token.
                        *guard = None;
                        return Err(interrupt);
                    }
                }
                Err(e) => {
                    *guard = None;
                    return Err(PyRuntimeError::new_err(e));
                }
            }
        }
    }

    /// The answer's HTTP status (200, or the server's error status), once known.
    #[getter]
    fn status(&self) -> Option<u16> {
        self.call
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .and_then(|c| c.status())
    }

    /// Cancels the request.
    fn close(&self) {
        self.call
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }
}

/// Converts a GGUF model into a neuron store (`conductor convert`), which runs under a memory
/// budget. `model` is a file or a known model's name.
#[pyfunction]
#[pyo3(signature = (model, output, overwrite=false))]
fn convert(py: Python<'_>, model: PathBuf, output: PathBuf, overwrite: bool) -> PyResult<()> {
    py.detach(move || {
        let source = fetch::resolve_model(Some(&model), &mut |_| {})
            .map_err(|e| load_error(conductor::Error::Fetch(e)))?;
        let options = ConvertOptions {
            // Chosen for the model, as `conductor convert` does by default.
            down_layout: None,
            overwrite,
            ..ConvertOptions::default()
        };
        convert_model(&source, &output, &options, &mut |_, _| {})
            .map(|_| ())
            .map_err(|e| value_error(format!("converting {}: {}", source.display(), chain(&e))))
    })
}

/// Names of the models Conductor fetches on first use.
#[pyfunction]
fn known_models() -> Vec<&'static str> {
    fetch::KNOWN_MODELS.iter().map(|m| m.name).collect()
}

/// Where a known model lives once fetched, or `None` for a name Conductor does not know.
#[pyfunction]
fn known_model_path(name: &str) -> Option<PathBuf> {
    fetch::known_model(name).map(fetch::model_path)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeEngine>()?;
    m.add_class::<NativeCall>()?;
    m.add_function(wrap_pyfunction!(convert, m)?)?;
    m.add_function(wrap_pyfunction!(known_models, m)?)?;
    m.add_function(wrap_pyfunction!(known_model_path, m)?)?;
    Ok(())
}
