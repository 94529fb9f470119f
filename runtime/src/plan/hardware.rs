//! A hardware profile: how fast a machine's processors, memory, messages and storage are.
//!
//! The simulator turns commands into durations with it; the planner compares plans with it.
//! `conductor profile-hw` measures one for the machine it runs on; profiles of machines we do
//! not have (phones from the PowerInfer-2 paper) are written from published figures, each with
//! its source. Stored as TOML under `profiles/`.

use crate::quant::GgmlType;
use serde::{Deserialize, Serialize};

/// Version of the profile format.
pub const PROFILE_FORMAT_VERSION: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HardwareProfile {
    pub version: u32,
    pub name: String,
    pub description: String,
    /// Where the numbers come from: "measured by conductor profile-hw on …" or a citation.
    pub source: String,
    pub core_classes: Vec<CoreClassProfile>,
    pub memory: MemoryProfile,
    pub messaging: MessagingProfile,
    #[serde(default)]
    pub npu: Option<NpuProfile>,
    pub storage: StorageProfile,
}

/// One class of identical cores (big, mid, little).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CoreClassProfile {
    pub name: String,
    /// Core ids of this class.
    pub cores: Vec<u32>,
    pub freq_ghz: f64,
    /// Throughput of the quantized kernels on one core, per weight type.
    pub kernels: Vec<KernelRates>,
    /// Decode attention: nanoseconds per (query head, cached position) on one core.
    pub attn_decode_ns_per_head_pos: f64,
    /// Prefill attention (the one attention path, causally): GFLOP/s of one core (a score or a
    /// value product is 2 flops per head dimension).
    pub attn_prefill_gflops: f64,
    /// Work between phases on the driver's thread (reductions, gathers, norms, activation
    /// quantization): nanoseconds per element and pass (one sweep over the element).
    pub finish_ns_per_element: f64,
    /// The FFN's gated activation, SiLU(gate)·up: nanoseconds per element. Absent: as
    /// `finish_ns_per_element`.
    #[serde(default)]
    pub activation_ns_per_element: Option<f64>,
    /// The int8 multiply-add peak of one core, GMAC/s: the widest integer dot product in a loop
    /// with nothing else (`conductor profile-hw`); what prefill is reported against. Absent:
    /// not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub int8_peak_gmacs: Option<f64>,
}

/// Kernel throughput of one core for one weight type, in multiply-accumulates per second.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelRates {
    #[serde(rename = "type")]
    pub ty: GgmlType,
    /// Decode matvec with the weights in cache, GMAC/s.
    pub matvec_gmacs: f64,
    /// Decode matvec with the weights streamed from DRAM, GMAC/s.
    pub matvec_stream_gmacs: f64,
    /// Prefill matmul (hundreds of tokens), GMAC/s.
    pub matmul_gmacs: f64,
    /// Decode FFN neuron cluster — gate and up rows, then the down projection's columns of the
    /// same neurons — with the weights streamed from DRAM, GMAC/s over all three products.
    /// The down columns are the cluster's contiguous block-column (as the engine lays a model
    /// in memory out at load). Absent: the cluster's work runs at `matvec_stream_gmacs`.
    #[serde(default)]
    pub ffn_cluster_stream_gmacs: Option<f64>,
    /// A step of a few tokens (`FEW_TOKENS`: a verified draft of 8) over the whole matrix,
    /// the weights streamed from DRAM, GMAC/s over all its tokens: the prefill rate does not
    /// hold for so few. Absent: such steps run at `matmul_gmacs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matmul_few_gmacs: Option<f64>,
}

/// Tokens of the step `KernelRates::matmul_few_gmacs` measures: a pending token and 8 drafted
/// ones, `--draft-max`'s default.
pub const FEW_TOKENS: usize = 9;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemoryProfile {
    /// Sustained read bandwidth of all cores together, GB/s.
    pub bandwidth_gbs: f64,
    /// Sustained read bandwidth of one core, GB/s.
    pub per_core_gbs: f64,
    /// Last-level cache size: weights that fit are read at cache speed.
    pub llc_bytes: u64,
    /// How much faster decode's streamed phases run on `k` worker threads (on `k` cores) than on
    /// one: element `k - 1` (measured by `conductor profile-hw` on the engine's worker pool).
    /// Absent: derived from the two bandwidths.
    #[serde(default)]
    pub stream_scaling: Vec<f64>,
}

/// What moving work between actors and threads costs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MessagingProfile {
    /// One message between actors hosted on the same thread, ns.
    pub local_message_ns: f64,
    /// One message to an actor spinning on another thread, ns.
    pub remote_message_ns: f64,
    /// Waking a parked thread, ns.
    pub wakeup_ns: f64,
    /// Handing one phase to a group's worker threads and joining them (beyond the work), ns.
    pub dispatch_ns: f64,
}

/// A dense accelerator with fixed graph shapes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NpuProfile {
    pub name: String,
    /// Fixed cost of one graph launch, µs.
    pub launch_us: f64,
    /// Whether a partial token chunk costs as much as a full one (fixed graph shapes).
    pub pads_to_chunk: bool,
    /// Measured throughput by shape; between shapes the simulator uses the nearest by MACs.
    pub shapes: Vec<NpuShapeRate>,
    /// Attention on the accelerator, GFLOP/s.
    pub attn_gflops: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NpuShapeRate {
    pub tokens: u32,
    pub rows: u32,
    pub cols: u32,
    /// Throughput at this shape, GMAC/s.
    pub gmacs: f64,
}

/// Storage: one device, read by size and queue depth.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StorageProfile {
    pub name: String,
    /// Every issuer shares one command queue (UFS): reads are served in submission order.
    pub single_queue: bool,
    /// Latency of one small read on an idle device, µs.
    pub latency_us: f64,
    /// Random-read throughput by read size and queue depth.
    pub random: Vec<StorageRate>,
    /// Sequential-read throughput by read size (queue depth as measured).
    pub sequential: Vec<StorageRate>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StorageRate {
    pub size_bytes: u64,
    pub queue_depth: u32,
    /// MB/s (10^6 bytes per second).
    pub mbps: f64,
}

/// A profile that cannot be used. Each error names the field.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ProfileError {
    #[error("hardware profile: {0}")]
    Parse(String),
    #[error(
        "hardware profile format version {found} is not supported (this build reads {expected})"
    )]
    Version { found: u32, expected: u32 },
    #[error("hardware profile field `{field}`: {why}")]
    Field { field: String, why: String },
}

fn positive(field: impl Into<String>, v: f64) -> Result<(), ProfileError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(ProfileError::Field {
            field: field.into(),
            why: format!("must be a positive number, is {v}"),
        })
    }
}

impl HardwareProfile {
    /// Parses and checks a TOML profile.
    pub fn from_toml(text: &str) -> Result<HardwareProfile, ProfileError> {
        let p: HardwareProfile =
            toml::from_str(text).map_err(|e| ProfileError::Parse(e.to_string()))?;
        p.validate()?;
        Ok(p)
    }

    /// Reads a profile: TOML, or JSON when the file name ends in `.json`.
    pub fn from_file(path: &std::path::Path) -> Result<HardwareProfile, ProfileError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ProfileError::Parse(format!("cannot read {}: {e}", path.display())))?;
        let in_file = |e: ProfileError| ProfileError::Parse(format!("{}: {e}", path.display()));
        if path.extension().is_some_and(|e| e == "json") {
            let p: HardwareProfile = serde_json::from_str(&text)
                .map_err(|e| in_file(ProfileError::Parse(e.to_string())))?;
            p.validate().map_err(in_file)?;
            return Ok(p);
        }
        HardwareProfile::from_toml(&text).map_err(in_file)
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a profile is plain data")
    }

    /// The core class called `name`.
    pub fn core_class(&self, name: &str) -> Option<&CoreClassProfile> {
        self.core_classes.iter().find(|c| c.name == name)
    }

    /// Checks that every number the simulator divides by is positive and that lists are there.
    pub fn validate(&self) -> Result<(), ProfileError> {
        if self.version != PROFILE_FORMAT_VERSION {
            return Err(ProfileError::Version {
                found: self.version,
                expected: PROFILE_FORMAT_VERSION,
            });
        }
        if self.core_classes.is_empty() {
            return Err(ProfileError::Field {
                field: "core_classes".into(),
                why: "at least one core class is needed".into(),
            });
        }
        for (i, c) in self.core_classes.iter().enumerate() {
            let f = |name: &str| format!("core_classes[{i}].{name}");
            if c.cores.is_empty() {
                return Err(ProfileError::Field {
                    field: f("cores"),
                    why: "lists no cores".into(),
                });
            }
            if c.kernels.is_empty() {
                return Err(ProfileError::Field {
                    field: f("kernels"),
                    why: "lists no kernel rates".into(),
                });
            }
            positive(f("freq_ghz"), c.freq_ghz)?;
            positive(
                f("attn_decode_ns_per_head_pos"),
                c.attn_decode_ns_per_head_pos,
            )?;
            positive(f("attn_prefill_gflops"), c.attn_prefill_gflops)?;
            positive(f("finish_ns_per_element"), c.finish_ns_per_element)?;
            if let Some(v) = c.activation_ns_per_element {
                positive(f("activation_ns_per_element"), v)?;
            }
            if let Some(v) = c.int8_peak_gmacs {
                positive(f("int8_peak_gmacs"), v)?;
            }
            for (k, r) in c.kernels.iter().enumerate() {
                let g = |name: &str| format!("core_classes[{i}].kernels[{k}].{name}");
                positive(g("matvec_gmacs"), r.matvec_gmacs)?;
                positive(g("matvec_stream_gmacs"), r.matvec_stream_gmacs)?;
                positive(g("matmul_gmacs"), r.matmul_gmacs)?;
                if let Some(v) = r.ffn_cluster_stream_gmacs {
                    positive(g("ffn_cluster_stream_gmacs"), v)?;
                }
                if let Some(v) = r.matmul_few_gmacs {
                    positive(g("matmul_few_gmacs"), v)?;
                }
            }
        }
        positive("memory.bandwidth_gbs", self.memory.bandwidth_gbs)?;
        for (k, &v) in self.memory.stream_scaling.iter().enumerate() {
            positive(format!("memory.stream_scaling[{k}]"), v)?;
        }
        positive("memory.per_core_gbs", self.memory.per_core_gbs)?;
        let m = &self.messaging;
        for (name, v) in [
            ("messaging.local_message_ns", m.local_message_ns),
            ("messaging.remote_message_ns", m.remote_message_ns),
            ("messaging.wakeup_ns", m.wakeup_ns),
            ("messaging.dispatch_ns", m.dispatch_ns),
        ] {
            positive(name, v)?;
        }
        if let Some(npu) = &self.npu {
            positive("npu.launch_us", npu.launch_us)?;
            positive("npu.attn_gflops", npu.attn_gflops)?;
            if npu.shapes.is_empty() {
                return Err(ProfileError::Field {
                    field: "npu.shapes".into(),
                    why: "lists no measured shapes".into(),
                });
            }
            for (k, s) in npu.shapes.iter().enumerate() {
                positive(format!("npu.shapes[{k}].gmacs"), s.gmacs)?;
            }
        }
        let s = &self.storage;
        positive("storage.latency_us", s.latency_us)?;
        for (name, rates) in [
            ("storage.random", &s.random),
            ("storage.sequential", &s.sequential),
        ] {
            if rates.is_empty() {
                return Err(ProfileError::Field {
                    field: name.into(),
                    why: "lists no measured read sizes".into(),
                });
            }
            for (k, r) in rates.iter().enumerate() {
                positive(format!("{name}[{k}].mbps"), r.mbps)?;
                if r.size_bytes == 0 || r.queue_depth == 0 {
                    return Err(ProfileError::Field {
                        field: format!("{name}[{k}]"),
                        why: "size_bytes and queue_depth must be at least 1".into(),
                    });
                }
            }
        }
        Ok(())
    }
}

impl CoreClassProfile {
    /// Kernel rates for weights of type `ty`.
    pub fn rates(&self, ty: GgmlType) -> Option<&KernelRates> {
        self.kernels.iter().find(|r| r.ty == ty)
    }
}
