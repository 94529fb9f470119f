//! The plans the search tries: a small grid over the features that change speed on the
//! machines we model. The engine's default plan comes first, so it wins ties.

use conductor_runtime::plan::{CachePlan, CachePolicy, DEFAULT_MAX_LOADS};
use conductor_runtime::plan::{
    CoreSet, ExecutionPlan, GroupPlan, HardwareProfile, ModelDescription, Share, Topology, XpuKind,
};
use conductor_runtime::quant::GgmlType;

/// Decode cluster sizes tried for a model in memory (a store's clusters are its bundles).
const FFN_NEURONS: [u32; 3] = [128, 64, 256];
/// Loads kept in flight ahead of compute (1: no read-ahead beyond the cluster being read).
const MAX_LOADS: [u32; 4] = [DEFAULT_MAX_LOADS, 1, 2, 8];
/// Adjacent bundles merged into one read, at most.
const COALESCE: [u32; 2] = [1, 2];
/// Threads issuing reads.
const IO_THREADS: [u32; 2] = [1, 2];
/// Gate-first loading's gaps tried (runs of wanted pages this many pages apart read as one):
/// many small reads, or fewer and larger ones carrying some pages not needed.
const GATE_FIRST_GAPS: [u32; 2] = [0, 4];

/// How decode reads a cluster's FFN bundle under a budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadPolicy {
    /// The whole bundle (the engine's default).
    Whole,
    /// Only the pages decode needs: the gate rows first, then the up rows and down columns of
    /// the neurons the gate lets through (threshold sparsity). Runs up to `gap` pages apart
    /// are read as one.
    GateFirst { gap: u32 },
}

/// How the decode groups are laid over the cores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupLayout {
    /// One CPU group per core class, each sharing decode by its number of cores (the
    /// engine's default on machines with several classes).
    PerClass,
    /// One CPU group over every core.
    OneGroup,
    /// Decode on the fastest class only (the others idle: less contention for memory).
    FastestClass,
    /// One CPU group per core class, each sharing decode by its cores' kernel speed
    /// ([`shares_by_speed`]): a slow class no longer finishes every phase last.
    PerClassBySpeed,
}

impl GroupLayout {
    pub fn name(self) -> &'static str {
        match self {
            GroupLayout::PerClass => "a group per core class",
            GroupLayout::OneGroup => "one group over all cores",
            GroupLayout::FastestClass => "the fastest class only",
            GroupLayout::PerClassBySpeed => "a group per core class, shares by speed",
        }
    }
}

/// What distinguishes a candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Features {
    pub groups: GroupLayout,
    /// Neurons per decode FFN cluster (`None`: a store's bundles decide).
    pub ffn_neurons: Option<u32>,
    /// The cache's shape under a budget.
    pub policy: Option<CachePolicy>,
    pub max_loads: u32,
    pub coalesce: u32,
    pub io_threads: u32,
    pub read: ReadPolicy,
}

impl Features {
    /// In a few words, for the planner's explanation.
    pub fn describe(&self) -> String {
        let mut parts = vec![self.groups.name().to_string()];
        if let Some(n) = self.ffn_neurons {
            parts.push(format!("{n}-neuron clusters"));
        }
        if let Some(p) = self.policy {
            parts.push(match p {
                CachePolicy::Segmented => "segmented cache".into(),
                CachePolicy::Lru => "LRU cache".into(),
            });
            parts.push(count(self.max_loads, "load", "loads") + " in flight");
            parts.push(format!(
                "up to {} per read",
                count(self.coalesce, "bundle", "bundles")
            ));
            parts.push(count(self.io_threads, "I/O thread", "I/O threads"));
            if let ReadPolicy::GateFirst { gap } = self.read {
                parts.push(format!("gate-first reads, gap {gap}"));
            }
        }
        parts.join(", ")
    }
}

fn count(n: u32, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A plan to score.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub features: Features,
    pub plan: ExecutionPlan,
}

/// The candidates for `model` on `profile`'s machine, with cache shapes when `budgeted`; under
/// a budget with threshold sparsity (`threshold`) on a store whose bundles record their gate
/// rows' size, gate-first reads too.
pub fn candidates(
    model: &ModelDescription,
    profile: &HardwareProfile,
    budgeted: bool,
    threshold: bool,
) -> Vec<Candidate> {
    let mut reads = vec![ReadPolicy::Whole];
    if budgeted && threshold && model.shape.ffn_bundle_gate_bytes > 0 {
        reads.extend(GATE_FIRST_GAPS.map(|gap| ReadPolicy::GateFirst { gap }));
    }
    let topology = Topology::of_profile(profile);
    let mut layouts = vec![GroupLayout::PerClass];
    if topology.classes().len() > 1 {
        layouts.push(GroupLayout::OneGroup);
        layouts.push(GroupLayout::FastestClass);
        layouts.push(GroupLayout::PerClassBySpeed);
    }
    let store = model.shape.ffn_bundle > 0;
    let sizes: Vec<Option<u32>> = if store || budgeted {
        vec![None]
    } else {
        FFN_NEURONS.iter().map(|&n| Some(n)).collect()
    };
    let mut out = Vec::new();
    for &groups in &layouts {
        for &ffn_neurons in &sizes {
            let base = group_plan(&topology, profile, model, groups, ffn_neurons);
            if !budgeted {
                out.push(Candidate {
                    features: Features {
                        groups,
                        ffn_neurons,
                        policy: None,
                        max_loads: 0,
                        coalesce: 0,
                        io_threads: base.storage.io_threads,
                        read: ReadPolicy::Whole,
                    },
                    plan: base,
                });
                continue;
            }
            for policy in [CachePolicy::Segmented, CachePolicy::Lru] {
                for max_loads in MAX_LOADS {
                    for coalesce in COALESCE.into_iter().filter(|&c| c <= max_loads) {
                        for io_threads in IO_THREADS {
                            for &read in &reads {
                                let mut plan = base.clone();
                                plan.storage.io_threads = io_threads;
                                use conductor_runtime::plan::ReadPolicy as Reads;
                                let (reads, gate_first_gap) = match read {
                                    ReadPolicy::Whole => (Reads::Bundles, 0),
                                    ReadPolicy::GateFirst { gap } => (Reads::GateFirst, gap),
                                };
                                plan.cache = Some(CachePlan {
                                    policy,
                                    max_loads,
                                    coalesce,
                                    reads,
                                    gate_first_gap,
                                    ..CachePlan::default()
                                });
                                out.push(Candidate {
                                    features: Features {
                                        groups,
                                        ffn_neurons,
                                        policy: Some(policy),
                                        max_loads,
                                        coalesce,
                                        io_threads,
                                        read,
                                    },
                                    plan,
                                });
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// Sets the decode shares of `plan`'s per-class groups to each class's speed: its cores times
/// one core's streamed matvec rate for the model's FFN weight type (Q4_0's where the profile
/// has no rate for that type), in hundredths of GMAC/s. Groups of a class the profile does not
/// describe keep their share.
pub fn shares_by_speed(
    plan: &mut ExecutionPlan,
    profile: &HardwareProfile,
    model: &ModelDescription,
) {
    let ty = model.types.ffn_gate;
    for share in &mut plan.decode_on {
        let Some(class) = profile.core_classes.iter().find(|c| c.name == share.group) else {
            continue;
        };
        let rate = class
            .kernels
            .iter()
            .find(|k| k.ty == ty)
            .or_else(|| class.kernels.iter().find(|k| k.ty == GgmlType::Q4_0))
            .map(|k| k.matvec_stream_gmacs);
        if let Some(rate) = rate.filter(|r| r.is_finite() && *r > 0.0) {
            let cores = class.cores.len().max(1) as f64;
            share.weight = (cores * rate * 100.0)
                .round()
                .clamp(1.0, f64::from(u32::MAX)) as u32;
        }
    }
}

/// The engine's plan for `topology` with the groups laid out as `layout` and decode clusters
/// of `ffn_neurons`.
fn group_plan(
    topology: &Topology,
    profile: &HardwareProfile,
    model: &ModelDescription,
    layout: GroupLayout,
    ffn_neurons: Option<u32>,
) -> ExecutionPlan {
    let mut plan = match layout {
        GroupLayout::PerClass => ExecutionPlan::for_topology(topology),
        GroupLayout::PerClassBySpeed => {
            let mut plan = ExecutionPlan::for_topology(topology);
            shares_by_speed(&mut plan, profile, model);
            plan
        }
        GroupLayout::OneGroup => ExecutionPlan::default(),
        GroupLayout::FastestClass => {
            let mut plan = ExecutionPlan::default();
            let fastest = topology.classes().first().map_or("all", |c| c).to_string();
            plan.groups[0] = GroupPlan {
                name: fastest.clone(),
                kind: XpuKind::Cpu,
                cores: CoreSet::Class(fastest.clone()),
                threads: 0,
            };
            plan.decode_on = vec![Share {
                group: fastest,
                weight: 1,
            }];
            plan
        }
    };
    if let Some(n) = ffn_neurons {
        plan.decode.ffn_neurons = n;
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(file: &str) -> HardwareProfile {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles");
        HardwareProfile::from_file(&dir.join(file)).unwrap()
    }

    fn model(bundle: u32) -> ModelDescription {
        let mut m = conductor_simulator::named_shape("smollm2-135m").unwrap();
        m.shape.ffn_bundle = bundle;
        m
    }

    #[test]
    fn the_default_plan_comes_first_and_every_candidate_is_valid_and_distinct() {
        for (file, budgeted, bundle) in [
            ("build-machine.toml", false, 0),
            ("build-machine.toml", true, 256),
            ("oneplus-12.toml", true, 256),
            ("oneplus-12.toml", false, 0),
        ] {
            let p = profile(file);
            let classes = Topology::of_profile(&p).classes().len();
            let list = candidates(&model(bundle), &p, budgeted, false);
            let topology = Topology::of_profile(&p);
            let mut first = ExecutionPlan::for_topology(&topology);
            if budgeted {
                first.cache = Some(CachePlan::default());
            }
            assert_eq!(list[0].plan, first, "{file}");
            for (i, c) in list.iter().enumerate() {
                topology.place(&c.plan, None).unwrap();
                assert!(
                    list[..i].iter().all(|d| d.plan != c.plan),
                    "candidate {i} repeats an earlier one: {}",
                    c.features.describe()
                );
                assert_eq!(c.plan.cache.is_some(), budgeted);
            }
            let n_layouts = if classes > 1 { 4 } else { 1 };
            let expected = if budgeted {
                // policy 2 × loads 4 × (coalesce 1, or 1 and 2) 7 × I/O threads 2
                n_layouts * 2 * 7 * 2
            } else {
                n_layouts * FFN_NEURONS.len()
            };
            assert_eq!(list.len(), expected, "{file} budgeted {budgeted}");
        }
    }

    #[test]
    fn shares_by_speed_follow_cores_times_rate() {
        let p = profile("oneplus-12.toml");
        let mut m = model(256);
        m.types.ffn_gate = GgmlType::Q4_0;
        let mut plan = ExecutionPlan::for_topology(&Topology::of_profile(&p));
        shares_by_speed(&mut plan, &p, &m);
        let weight = |g: &str| plan.decode_on.iter().find(|s| s.group == g).unwrap().weight;
        // The profile's streamed Q4_0 rates: big 30.22 (1 core), mid 16.74 (5), little 6.138 (2).
        assert_eq!(weight("big"), 3022);
        assert_eq!(weight("mid"), 8370);
        assert_eq!(weight("little"), 1228);
        // A type the profile has no rate for falls back to Q4_0's.
        m.types.ffn_gate = GgmlType::Q5_K;
        let mut fallback = ExecutionPlan::for_topology(&Topology::of_profile(&p));
        shares_by_speed(&mut fallback, &p, &m);
        assert_eq!(fallback.decode_on, plan.decode_on);
        // One class: nothing to share; the plan is the default.
        let build = profile("build-machine.toml");
        let mut one = ExecutionPlan::for_topology(&Topology::of_profile(&build));
        shares_by_speed(&mut one, &build, &m);
        assert_eq!(
            one,
            ExecutionPlan::for_topology(&Topology::of_profile(&build))
        );
    }
}
