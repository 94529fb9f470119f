//! Processor groups: what kind each is, which cores it runs on, its share of each phase's
//! clusters, and the dense backend's fixed shapes.

use serde::{Deserialize, Serialize};

/// What kind of processor a group is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum XpuKind {
    /// CPU cores computing clusters with the quantized kernels (decode's sparse work).
    Cpu,
    /// A dense backend with fixed graph shapes (prefill). Here: an int8 GEMM on CPU cores.
    Npu,
}

/// Which cores a group runs on. In JSON and TOML a class name or a list of ids; in bincode
/// (which cannot guess which one follows) a tagged enum.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CoreSet {
    /// A core class of the machine: `"all"`, `"big"`, `"little"` (and, on three-class phones,
    /// `"mid"`), as detected from `cpu_capacity` / `cpuinfo_max_freq`.
    Class(String),
    /// Explicit core ids.
    Ids(Vec<u32>),
}

/// [`CoreSet`] as people write it: a name or a list.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum CoreSetText {
    Class(String),
    Ids(Vec<u32>),
}

/// The field holding a group's cores: untagged for people, tagged for bincode.
mod core_set_serde {
    use super::{CoreSet, CoreSetText};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(cores: &CoreSet, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            match cores {
                CoreSet::Class(c) => CoreSetText::Class(c.clone()),
                CoreSet::Ids(ids) => CoreSetText::Ids(ids.clone()),
            }
            .serialize(s)
        } else {
            cores.serialize(s)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<CoreSet, D::Error> {
        if d.is_human_readable() {
            Ok(match CoreSetText::deserialize(d)? {
                CoreSetText::Class(c) => CoreSet::Class(c),
                CoreSetText::Ids(ids) => CoreSet::Ids(ids),
            })
        } else {
            CoreSet::deserialize(d)
        }
    }
}

/// One processor group: the unit the scheduler sends cluster messages to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupPlan {
    pub name: String,
    pub kind: XpuKind,
    #[serde(with = "core_set_serde")]
    pub cores: CoreSet,
    /// Worker threads; 0 means one per core of the group (or the `-t` given on the command line).
    #[serde(default)]
    pub threads: u32,
}

/// A group's share of each phase's clusters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    pub group: String,
    /// Relative weight: a group with weight 3 gets three times the clusters of one with 1.
    pub weight: u32,
}

/// Fixed shapes of the dense backend (an NPU runs precompiled graphs of fixed size).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DenseShapes {
    /// Tokens per launch: a prefill step is computed in chunks of this many tokens.
    pub token_chunk: u32,
}
