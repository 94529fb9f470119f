//! The hardware profiler behind `conductor profile-hw`: measures this machine into a
//! [`HardwareProfile`] for the simulator and the planner.
//!
//! What is measured, and how:
//! * **Per core class** of the given topology, on one core of the class (the measuring thread
//!   pinned to it): for each weight type the kernels support among Q4_0, Q4_1, Q8_0, Q4_K,
//!   Q6_K (and F16), matvec GMAC/s with the weights in cache (SmolLM2's 1536×576, or 576×1536
//!   for 256-element K-quant blocks), matvec GMAC/s streamed from DRAM (rotating over copies
//!   totalling ≥ 4× the LLC), matmul GMAC/s (× 256 tokens); decode attention (`attend`,
//!   ns per query head and cached position) and prefill attention (`attend` causally, GFLOP/s),
//!   head_dim 64 over 512 positions of an f16 KV cache; the per-element cost of residual add +
//!   RMSNorm + activation quantization over 576-wide rows; the int8 multiply-add peak (the
//!   widest integer dot product in a loop with nothing else, `peak.rs`). Each figure is a
//!   median.
//! * **Memory**: streaming read bandwidth of one pinned core and of one pinned thread per core
//!   together, over a buffer ≫ LLC; the LLC size from sysfs.
//! * **Storage**: read curves on a temporary file (method in the `storage` submodule: O_DIRECT
//!   preads, queue depths emulated with threads).
//! * **Messaging** is measured by the actors crate and passed in.
//! * **NPU**: none. Here the dense backend is the CPU GEMM, which the simulator models with
//!   the core classes' matmul rates.

mod compute;
mod memory;
mod peak;
mod storage;
mod system;
mod timing;

use conductor_runtime::plan::{
    CoreClassProfile, HardwareProfile, MemoryProfile, MessagingProfile, ProfileError, Topology,
    PROFILE_FORMAT_VERSION,
};
use conductor_runtime::quant::Kernels;
use std::path::PathBuf;
use std::sync::mpsc;
use timing::Effort;

pub use peak::{measure_int8_peak, Int8Peak};
pub use storage::{MIN_FILE_BYTES, QUEUE_DEPTHS, REPLAY_DEPTHS, SIZES as STORAGE_SIZES};

/// What to measure and how long to take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeasureOptions {
    /// Fewer repetitions and smaller buffers: seconds instead of about a minute, noisier.
    pub quick: bool,
    /// Where the storage test file is written (and removed after).
    pub storage_dir: PathBuf,
    /// Size of the storage test file (rounded down to whole MiB; at least [`MIN_FILE_BYTES`]).
    pub storage_file_bytes: u64,
    /// Leave storage unmeasured: the profile then carries placeholder storage figures and says
    /// so in its description.
    pub skip_storage: bool,
    /// Measure storage by reading this existing file (never written) instead of a test file:
    /// the device, file system and placement the model itself is read from (a model store).
    pub storage_file: Option<PathBuf>,
    /// Reads of `storage_file` as a run issues them, `(offset, length)` in issue order (a
    /// neuron store's units in decode order; empty: none). Replayed after the curves at each of
    /// [`REPLAY_DEPTHS`]; their rates by size join the random table at those depths (see
    /// [`storage::measure_storage_on`]).
    pub storage_reads: Vec<(u64, usize)>,
    /// How many distinct buffers the replay of `storage_reads` reads into, in turn: the slots
    /// of the cache a run reads into (0 or 1: one buffer per thread). On the virtual disk of
    /// the build VM a stream of reads into a cache's worth of buffers (35 slots, 12 MiB) got
    /// 16–25% fewer reads per second than the same reads into one buffer reused
    /// (`docs/benchmarks-journal.md`, 2026-11-26), so a replay into one buffer overstates a run.
    pub storage_replay_buffers: usize,
}

impl Default for MeasureOptions {
    fn default() -> Self {
        MeasureOptions {
            quick: false,
            storage_dir: std::env::temp_dir(),
            storage_file_bytes: 1 << 30,
            skip_storage: false,
            storage_file: None,
            storage_reads: Vec::new(),
            storage_replay_buffers: 0,
        }
    }
}

/// Why a measurement could not be made. One line each.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    #[error("the topology lists no cores")]
    NoCores,
    #[error("storage directory {}: {why}", dir.display())]
    StorageDir { dir: PathBuf, why: String },
    #[error("storage test file of {bytes} bytes is too small (at least {min} bytes)")]
    StorageTooSmall { bytes: u64, min: u64 },
    #[error("storage test file {}: {op} failed: {source}", path.display())]
    StorageIo {
        path: PathBuf,
        op: &'static str,
        source: std::io::Error,
    },
    #[error("the thread measuring {what} panicked")]
    Panicked { what: String },
    #[error("the measured profile does not validate (a bug in the profiler): {0}")]
    Invalid(#[from] ProfileError),
}

/// Runs `f` on a thread pinned to `core`, forwarding the lines it says to `progress` as they
/// come (the callback stays on this thread). Returns `f`'s result and whether pinning worked.
fn on_core<T: Send>(
    core: u32,
    what: &str,
    progress: &mut dyn FnMut(&str),
    f: impl FnOnce(&mut dyn FnMut(String)) -> T + Send,
) -> Result<(T, bool), MeasureError> {
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::scope(|s| {
        let handle = s.spawn(move || {
            let pinned = system::pin_to(core);
            let mut say = |line: String| {
                let _ = tx.send(line);
            };
            (f(&mut say), pinned)
        });
        // Ends when the thread drops its sender, i.e. when it is done (or panicked).
        for line in rx {
            progress(&line);
        }
        handle.join().map_err(|_| MeasureError::Panicked {
            what: what.to_string(),
        })
    })
}

/// `v` to 4 significant digits: the measurements are not better than that, and the TOML reads
/// better without 2.5961399999999997.
fn round4(v: f64) -> f64 {
    if !v.is_finite() || v == 0.0 {
        return v;
    }
    let scale = 10f64.powi(3 - v.abs().log10().floor() as i32);
    (v * scale).round() / scale
}

/// Rounds every measured figure of `p` (see [`round4`]).
fn round_profile(p: &mut HardwareProfile) {
    for c in &mut p.core_classes {
        c.freq_ghz = round4(c.freq_ghz);
        c.attn_decode_ns_per_head_pos = round4(c.attn_decode_ns_per_head_pos);
        c.attn_prefill_gflops = round4(c.attn_prefill_gflops);
        c.finish_ns_per_element = round4(c.finish_ns_per_element);
        c.int8_peak_gmacs = c.int8_peak_gmacs.map(round4);
        for k in &mut c.kernels {
            k.matvec_gmacs = round4(k.matvec_gmacs);
            k.matvec_stream_gmacs = round4(k.matvec_stream_gmacs);
            k.matmul_gmacs = round4(k.matmul_gmacs);
            k.matmul_few_gmacs = k.matmul_few_gmacs.map(round4);
        }
    }
    p.memory.bandwidth_gbs = round4(p.memory.bandwidth_gbs);
    p.memory.per_core_gbs = round4(p.memory.per_core_gbs);
    p.storage.latency_us = round4(p.storage.latency_us);
    for r in p.storage.random.iter_mut().chain(&mut p.storage.sequential) {
        r.mbps = round4(r.mbps);
    }
}

fn mib(bytes: u64) -> u64 {
    bytes >> 20
}

/// Checks what can be checked before measuring (storage file size, storage directory
/// writable), so that a bad option fails in milliseconds, not after a minute. [`measure`] calls
/// it first; a caller with slow work of its own before `measure` can call it earlier.
pub fn check_options(opts: &MeasureOptions) -> Result<(), MeasureError> {
    if opts.skip_storage {
        return Ok(());
    }
    if let Some(path) = &opts.storage_file {
        return storage::measurable_len(path).map(|_| ());
    }
    if opts.storage_file_bytes / (1 << 20) * (1 << 20) < MIN_FILE_BYTES {
        return Err(MeasureError::StorageTooSmall {
            bytes: opts.storage_file_bytes,
            min: MIN_FILE_BYTES,
        });
    }
    storage::check_dir(&opts.storage_dir)
}

/// Measures this machine. `topology` gives the core classes (fastest first) and their core ids;
/// `messaging` (measured by the actors crate) is copied into the profile. Progress lines go to
/// `progress`. The profile is validated before it is returned.
pub fn measure(
    opts: &MeasureOptions,
    topology: &Topology,
    messaging: MessagingProfile,
    progress: &mut dyn FnMut(&str),
) -> Result<HardwareProfile, MeasureError> {
    if topology.cores.is_empty() {
        return Err(MeasureError::NoCores);
    }
    check_options(opts)?;
    let effort = Effort::new(opts.quick);
    let kernels = Kernels::best();
    let cpu = system::cpu_model();
    let n_cores = topology.cores.len();
    let mut notes: Vec<String> = Vec::new();
    let mut unpinned: Vec<u32> = Vec::new();

    let llc = system::llc_bytes().unwrap_or_else(|| {
        notes.push(format!(
            "The LLC size could not be read from /sys/devices/system/cpu/cpu0/cache: {} MiB \
             assumed.",
            mib(system::FALLBACK_LLC_BYTES)
        ));
        system::FALLBACK_LLC_BYTES
    });
    let stream_bytes = (4 * llc).max(64 << 20);
    progress(&format!(
        "profile-hw: {cpu}, {n_cores} cores, kernels {}, LLC {} MiB{}",
        kernels.isa(),
        mib(llc),
        if opts.quick { " (quick)" } else { "" }
    ));

    let mut core_classes = Vec::new();
    let mut freq_notes = Vec::new();
    let mut peak_notes: Vec<String> = Vec::new();
    for class in topology.classes() {
        let cores: Vec<u32> = topology
            .cores
            .iter()
            .filter(|(_, c)| c == class)
            .map(|(id, _)| *id)
            .collect();
        let core = cores[0];
        progress(&format!(
            "core class {class} (cores {cores:?}): measuring on core {core}"
        ));
        let (rates, pinned) = on_core(core, &format!("core class {class}"), progress, |say| {
            compute::measure_core(&kernels, stream_bytes, &effort, say)
        })?;
        if !pinned {
            unpinned.push(core);
        }
        let freq_ghz = match system::core_freq_ghz(core) {
            Some((ghz, from)) => {
                freq_notes.push(format!("{class} {ghz:.2} GHz ({from})"));
                ghz
            }
            None => {
                freq_notes.push(format!(
                    "{class}: unknown, 1.0 GHz written as a placeholder"
                ));
                1.0
            }
        };
        core_classes.push(CoreClassProfile {
            name: class.to_string(),
            cores,
            freq_ghz,
            kernels: rates.kernels,
            attn_decode_ns_per_head_pos: rates.attn_decode_ns_per_head_pos,
            attn_prefill_gflops: rates.attn_prefill_gflops,
            finish_ns_per_element: rates.finish_ns_per_element,
            activation_ns_per_element: Some(rates.activation_ns_per_element),
            int8_peak_gmacs: rates.int8_peak.as_ref().map(|p| p.gmacs),
        });
        if let Some(p) = &rates.int8_peak {
            peak_notes.push(format!(
                "{class}: {} ({:.1} GMAC/s with i32 sums){}",
                p.how,
                p.i32_gmacs,
                match p.unmeasured.is_empty() {
                    true => String::new(),
                    false => format!(
                        "; the CPU also has {}, not measured by this build: the peak is a floor",
                        p.unmeasured.join(", ")
                    ),
                }
            ));
        }
    }

    // Memory: one core of the fastest class, then every core of the topology at once.
    let mem_bytes = (effort.mem_llc_multiple * llc).max(effort.mem_min);
    progress(&format!(
        "memory: streaming reads over {} MiB",
        mib(mem_bytes)
    ));
    let words = memory::buffer(mem_bytes);
    let first = topology.cores[0].0;
    let (per_core_gbs, pinned) = on_core(first, "memory bandwidth", progress, |_| {
        memory::one_core_gbs(&words, &effort)
    })?;
    if !pinned {
        unpinned.push(first);
    }
    let all: Vec<u32> = topology.cores.iter().map(|(id, _)| *id).collect();
    // How decode scales with threads is measured by the caller on the engine's worker pool
    // (`conductor profile-hw`); without it the simulator falls back to the bandwidth ratio.
    let stream_scaling = Vec::new();
    let passes = if opts.quick { 1 } else { 2 };
    let (bandwidth_gbs, mut missed) =
        memory::all_cores_gbs(&words, &all, passes, effort.reps.min(5));
    unpinned.append(&mut missed);
    drop(words);
    progress(&format!(
        "memory: one core {per_core_gbs:.1} GB/s, all {} cores {bandwidth_gbs:.1} GB/s",
        all.len()
    ));

    let storage = if opts.skip_storage {
        progress("storage: skipped");
        storage::placeholder()
    } else {
        match &opts.storage_file {
            Some(path) => storage::measure_storage_on(
                path,
                &opts.storage_reads,
                opts.storage_replay_buffers,
                &effort,
                progress,
            )?,
            None => storage::measure_storage(
                &opts.storage_dir,
                opts.storage_file_bytes,
                &effort,
                progress,
            )?,
        }
    };

    unpinned.sort_unstable();
    unpinned.dedup();
    let classes: Vec<String> = core_classes
        .iter()
        .map(|c| {
            format!(
                "{} = cores {:?} (measured on core {})",
                c.name, c.cores, c.cores[0]
            )
        })
        .collect();
    let mut description = vec![
        format!(
            "Measured on this machine by conductor profile-hw ({} run), kernels {} \
             (Kernels::best), {}.",
            if opts.quick { "quick" } else { "full" },
            kernels.isa(),
            std::env::consts::ARCH
        ),
        format!(
            "Core classes from the detected topology: {}.",
            classes.join("; ")
        ),
        format!("Clock: {}.", freq_notes.join("; ")),
        format!(
            "Kernel rates: one pinned thread; weights 1536x576 (576x1536 for Q4_K/Q6_K, whose \
             256-element blocks do not divide 576); in cache = the same matrix again and \
             again; streamed = rotating over {} MiB of copies (>= 4x the {} MiB LLC); FFN \
             cluster = a streamed 1536x576 FFN swept in clusters of {} neurons (gate and up \
             rows, down as each cluster's contiguous block-column); matmul = clusters of {} \
             rows against {} tokens; medians of {} repetitions.",
            mib(stream_bytes),
            mib(llc),
            compute::FFN_CLUSTER,
            compute::MATMUL_ROWS,
            compute::MATMUL_TOKENS,
            effort.reps
        ),
        format!(
            "Attention: head_dim {}, f16 KV; decode = attend over {} cached positions, \
             prefill = attend causally over {} positions (query t over 0..=t), 4*head_dim \
             flops per query-key pair. Finish: residual add + rms_norm + Q8_1 activation \
             quantization over {}-wide rows, per element and pass. Gated activation: \
             SiLU(gate)*up per element.",
            compute::HEAD_DIM,
            compute::CACHED_POSITIONS,
            compute::CACHED_POSITIONS,
            compute::FINISH_WIDTH
        ),
        format!(
            "Memory: streaming reads of a {} MiB buffer; all cores = one pinned thread per \
             core.",
            mib(mem_bytes)
        ),
        format!(
            "Int8 peak (int8_peak_gmacs): the widest integer dot product in a loop with nothing \
             else, with independent accumulators enough to hide its latency; {}.",
            match peak_notes.is_empty() {
                true => "not measured on this CPU".to_string(),
                false => peak_notes.join("; "),
            }
        ),
    ];
    description.append(&mut notes);
    description.extend(storage.notes);
    if !unpinned.is_empty() {
        description.push(format!(
            "Pinning to cores {unpinned:?} failed: those measurements ran unpinned."
        ));
    }
    description.push(
        "No NPU: the dense backend on this machine is the CPU GEMM, which the simulator models \
         with the core classes' matmul rates."
            .into(),
    );

    let mut profile = HardwareProfile {
        version: PROFILE_FORMAT_VERSION,
        name: format!("this machine: {cpu}, {n_cores} cores"),
        description: description.join(" "),
        source: format!("measured by conductor profile-hw on {}", system::today()),
        core_classes,
        memory: MemoryProfile {
            bandwidth_gbs,
            per_core_gbs,
            llc_bytes: llc,
            stream_scaling,
        },
        messaging,
        npu: None,
        storage: storage.profile,
    };
    round_profile(&mut profile);
    profile.validate()?;
    Ok(profile)
}

#[cfg(test)]
mod tests {
    use super::round4;

    #[test]
    fn figures_round_to_four_digits() {
        assert_eq!(round4(2.5961399999999997), 2.596);
        assert_eq!(round4(13467.74), 13470.0);
        assert_eq!(round4(0.0012345), 0.001235);
        assert_eq!(round4(0.0), 0.0);
        assert!(round4(1e-300) > 0.0);
    }
}
