//! Traces: what a driver saw and did, for replay, simulation and timelines.
//!
//! A [`Trace`] holds the events fed to the scheduler with their times and the commands each
//! produced (so a fresh scheduler can replay them and must produce the identical stream), the
//! activation sets of decode steps (what the simulator needs to size FFN work), and timeline
//! [`Span`]s, which [`write_chrome_trace`] turns into a Chrome-trace / Perfetto JSON file. The
//! actor driver and the simulator write the same format, so a person can open both side by
//! side.

mod chrome;

pub use chrome::write_chrome_trace;

use crate::plan::{ExecutionPlan, ModelDescription};
use crate::schedule::{Command, Event, StepId};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::path::Path;

/// Version of the trace format (4: steps carry `StepRequest::sequences`; 5: the header holds
/// the run's FFN plan where it held the scheduler's modes).
pub const TRACE_FORMAT_VERSION: u32 = 5;
const MAGIC: &[u8; 8] = b"CNDTRACE";
/// A trace larger than this is refused rather than allocated (hostile or corrupt file).
const MAX_TRACE_BYTES: usize = 1 << 30;

/// What produced a trace and for what.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceHeader {
    pub version: u32,
    pub model: ModelDescription,
    pub plan: ExecutionPlan,
    /// How the run computed and read decode's FFN (the scheduler's FFN plan).
    pub ffn: crate::plan::FfnPlan,
    /// `actors`, `inline` or `simulator`.
    pub driver: String,
    pub threads: u32,
    /// The program and version that wrote it.
    pub writer: String,
}

/// One event fed to the scheduler, when, and the commands it answered with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceRecord {
    /// Nanoseconds since the trace started (wall clock for real drivers, virtual for the
    /// simulator).
    pub t_ns: u64,
    pub event: Event,
    pub commands: Vec<Command>,
}

/// Which FFN neurons of a layer were active in a decode step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ActiveSet {
    /// Every neuron (dense decode).
    All,
    /// These neurons, ascending.
    Neurons(Vec<u32>),
}

impl ActiveSet {
    /// How many of a layer's `n_ff` neurons are active.
    pub fn count(&self, n_ff: u32) -> u32 {
        match self {
            ActiveSet::All => n_ff,
            ActiveSet::Neurons(v) => v.len() as u32,
        }
    }

    /// How many of the neurons in `range` are active.
    pub fn count_in(&self, range: std::ops::Range<u32>) -> u32 {
        match self {
            ActiveSet::All => range.len() as u32,
            ActiveSet::Neurons(v) => {
                let lo = v.partition_point(|&n| n < range.start);
                let hi = v.partition_point(|&n| n < range.end);
                (hi - lo) as u32
            }
        }
    }
}

/// The activation sets of one decode step, one per layer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepActivity {
    pub step: StepId,
    pub layers: Vec<ActiveSet>,
}

/// A span of time on one track (an actor, a worker, the storage device).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Span {
    pub track: String,
    pub name: String,
    pub start_ns: u64,
    pub dur_ns: u64,
}

/// A recorded or simulated run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    pub header: TraceHeader,
    pub records: Vec<TraceRecord>,
    pub activity: Vec<StepActivity>,
    pub spans: Vec<Span>,
}

/// A trace that cannot be read or used.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read trace {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{0} is not a Conductor trace (bad magic)")]
    NotATrace(String),
    #[error("trace format version {found} is not supported: this build reads version {expected} only (record the trace again with this build)")]
    Version { found: u32, expected: u32 },
    #[error("trace {path} is corrupt: {why}")]
    Corrupt { path: String, why: String },
}

fn bincode_config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_TRACE_BYTES>()
}

impl Trace {
    /// Writes the trace: magic, format version, the header as JSON (readable with `head`; the
    /// plan's untagged fields need a self-describing format) behind its length, then the
    /// records, activity and spans in bincode.
    pub fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        let header = serde_json::to_vec(&self.header)?;
        w.write_all(MAGIC)?;
        w.write_all(&TRACE_FORMAT_VERSION.to_le_bytes())?;
        w.write_all(&(header.len() as u64).to_le_bytes())?;
        w.write_all(&header)?;
        let body = bincode::serde::encode_to_vec(
            (&self.records, &self.activity, &self.spans),
            bincode_config(),
        )
        .map_err(|e| std::io::Error::other(e.to_string()))?;
        w.write_all(&body)
    }

    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
        self.write_to(&mut f)?;
        f.flush()
    }

    /// Reads a trace; corrupt or hostile bytes give an error, never a panic or a huge
    /// allocation.
    pub fn from_bytes(bytes: &[u8], path: &str) -> Result<Trace, TraceError> {
        let corrupt = |why: String| TraceError::Corrupt {
            path: path.to_string(),
            why,
        };
        if bytes.len() < 12 || &bytes[..8] != MAGIC {
            return Err(TraceError::NotATrace(path.to_string()));
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if version != TRACE_FORMAT_VERSION {
            return Err(TraceError::Version {
                found: version,
                expected: TRACE_FORMAT_VERSION,
            });
        }
        let rest = &bytes[12..];
        let len_bytes: [u8; 8] = rest
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| corrupt("ends before the header".into()))?;
        let header_len = usize::try_from(u64::from_le_bytes(len_bytes))
            .ok()
            .filter(|&n| n <= rest.len() - 8)
            .ok_or_else(|| corrupt("header length runs past the end".into()))?;
        let header: TraceHeader = serde_json::from_slice(&rest[8..8 + header_len])
            .map_err(|e| corrupt(format!("header: {e}")))?;
        if header.version != TRACE_FORMAT_VERSION {
            return Err(TraceError::Version {
                found: header.version,
                expected: TRACE_FORMAT_VERSION,
            });
        }
        // The header sizes everything a replay or a simulation builds: a shape or plan beyond
        // the limits (a model of 2^32 neurons in clusters of one) is refused here.
        header
            .model
            .shape
            .check_limits()
            .map_err(|why| corrupt(format!("header: {why}")))?;
        header
            .plan
            .validate()
            .map_err(|e| corrupt(format!("header: {e}")))?;
        let body = &rest[8 + header_len..];
        type Body = (Vec<TraceRecord>, Vec<StepActivity>, Vec<Span>);
        let ((records, activity, spans), used): (Body, usize) =
            bincode::serde::decode_from_slice(body, bincode_config())
                .map_err(|e| corrupt(e.to_string()))?;
        if used != body.len() {
            return Err(corrupt(format!(
                "{} bytes after the end",
                body.len() - used
            )));
        }
        Ok(Trace {
            header,
            records,
            activity,
            spans,
        })
    }

    pub fn load(path: &Path) -> Result<Trace, TraceError> {
        let io = |source| TraceError::Io {
            path: path.display().to_string(),
            source,
        };
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .map_err(io)?
            .take(MAX_TRACE_BYTES as u64 + 12)
            .read_to_end(&mut bytes)
            .map_err(io)?;
        Trace::from_bytes(&bytes, &path.display().to_string())
    }

    /// A 64-bit FNV-1a hash of the records and spans: two runs that did the same thing at the
    /// same (virtual) times have the same hash.
    pub fn hash(&self) -> u64 {
        let mut h = Fnv1a::default();
        let body = bincode::serde::encode_to_vec((&self.records, &self.spans), bincode_config())
            .expect("a trace is plain data");
        h.write(&body);
        h.0
    }
}

/// FNV-1a, 64 bit: a stable hash (std's `DefaultHasher` may change between Rust versions).
struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv1a {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests;
