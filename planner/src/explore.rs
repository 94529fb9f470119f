//! Plan exploration: sweeps over memory budgets × models × hardware profiles × plan features,
//! every point simulated on virtual time. What `conductor explore` runs, and the paper-trend
//! table's engine.
//!
//! A point is a named model shape on a profile under a budget, with one setting of each
//! feature: bundling (one read per neuron bundle, or three as apart matrices), the cache
//! (`static`: the hot segment takes units in plain layer order, no ranking; `segmented`: the
//! hottest units by the model's activation statistics; `lru`: one LRU over every slot),
//! the pipeline's depth (loads in flight), the NPU (prefill on it, or on the CPU groups), I/O
//! threads and neurons per bundle. Sparse models' decode steps are synthesized from their
//! published statistics (`conductor_simulator::activation_stats`); the cache starts as a long
//! run leaves it (`Workload::warm_cache`), so a few simulated tokens give steady state.

use crate::search::{hot_units_from_frequencies, planned_store_sizes_with};
use conductor_runtime::cache::{fit_plan_to_budget, split_sizes};
use conductor_runtime::plan::{CachePlan, CachePolicy, FfnSelect};
use conductor_runtime::plan::{
    ExecutionPlan, HardwareProfile, IoEngine, ModelDescription, Topology, XpuKind,
};
use conductor_runtime::trace::StepActivity;
use conductor_simulator::{
    activation_stats, named_shape, neuron_frequencies, simulate, synthesize_activity, SimOptions,
    Workload, NAMED_SHAPES,
};
use std::collections::HashMap;
use std::sync::Arc;

/// How much memory a point gets.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Memory {
    /// A budget in bytes.
    Bytes(u64),
    /// Everything the runtime needs besides the FFN, plus this share of the FFN's bundles
    /// (the paper's "x% of the FFN offloaded" is a share of 1 − x).
    FfnShare(f64),
}

impl Memory {
    /// `7GB`, `512MiB`, `1000000` (bytes), or `50%` (of the FFN in memory).
    pub fn parse(s: &str) -> Result<Memory, String> {
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p
                .trim()
                .parse()
                .map_err(|_| format!("`{s}`: not a percentage"))?;
            if !(0.0..=100.0).contains(&v) {
                return Err(format!("`{s}`: a share of the FFN must be within 0%..100%"));
            }
            return Ok(Memory::FfnShare(v / 100.0));
        }
        parse_bytes(t).map(Memory::Bytes)
    }

    pub fn label(&self) -> String {
        match self {
            Memory::Bytes(b) => format!("{:.2} GB", *b as f64 / 1e9),
            Memory::FfnShare(p) => format!("{:.0}% FFN", p * 100.0),
        }
    }
}

/// Bytes with an optional unit: B, KB, MB, GB (powers of 1000) or KiB, MiB, GiB.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("`{s}`: not a size (e.g. 7GB, 512MiB)"))?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => return Err(format!("`{s}`: unknown unit `{other}`")),
    };
    let bytes = v * scale;
    if !bytes.is_finite() || !(1.0..=1e15).contains(&bytes) {
        return Err(format!("`{s}`: out of range"));
    }
    Ok(bytes as u64)
}

/// The neuron cache's arrangement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheMode {
    /// The hot segment holds units in layer order (no activation ranking): a fixed share of
    /// the FFN resident, the rest read on every use.
    Static,
    /// PowerInfer-2's: the hot segment holds the hottest units, a small cold segment the rest.
    Segmented,
    /// One LRU over every slot.
    Lru,
}

impl CacheMode {
    pub fn name(self) -> &'static str {
        match self {
            CacheMode::Static => "static",
            CacheMode::Segmented => "segmented",
            CacheMode::Lru => "lru",
        }
    }
}

/// One point of a sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// A named shape (`conductor_simulator::NAMED_SHAPES`).
    pub model: String,
    /// Index into the sweep's profiles.
    pub profile: usize,
    pub memory: Memory,
    pub bundled: bool,
    pub cache: CacheMode,
    /// Loads in flight ahead of compute, and reads in the device's queue (1: each read waits
    /// for the one before).
    pub pipeline: u32,
    pub npu: bool,
    pub io_threads: u32,
    pub bundle_neurons: u32,
}

/// What a point measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The budget in bytes.
    pub budget: u64,
    /// Bytes of the neuron cache, and the share of the FFN's bundles it holds.
    pub cache_bytes: u64,
    pub ffn_in_memory: f64,
    pub decode_tok_s: f64,
    /// Storage bytes read per decode token (over every simulated token).
    pub bytes_per_token: f64,
    /// Cache misses per unit used (over every simulated token).
    pub miss_rate: f64,
    /// Share of the run the busiest compute group was busy, and the storage had a read in
    /// flight.
    pub compute_busy: f64,
    pub storage_busy: f64,
    /// Prompt tokens per second (`None` without a prompt).
    pub prefill_tok_s: Option<f64>,
}

/// How much to simulate per point.
#[derive(Clone, Debug, PartialEq)]
pub struct ExploreOptions {
    /// Decode tokens simulated before measuring (after the warm cache start).
    pub warm_tokens: u32,
    pub measured_tokens: u32,
    /// Prompt tokens before decode (0: none; prefill then is not measured).
    pub prompt: u32,
    pub n_ctx: u32,
    /// Seed of the synthesized decode steps.
    pub seed: u64,
}

impl Default for ExploreOptions {
    fn default() -> Self {
        ExploreOptions {
            warm_tokens: 2,
            measured_tokens: 4,
            prompt: 0,
            n_ctx: 1024,
            seed: 1,
        }
    }
}

/// Why a point could not run.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ExploreError {
    #[error("unknown model shape `{0}` (known: {known})", known = NAMED_SHAPES.join(", "))]
    UnknownShape(String),
    #[error("{0}")]
    Point(String),
}

/// What points of one model share: its store's shape and sizes, synthesized steps and ranking.
struct Prepared {
    store_model: ModelDescription,
    sizes: conductor_runtime::cache::StoreSizes,
    activity: Option<Arc<Vec<StepActivity>>>,
    hot_units: Arc<Vec<u32>>,
}

/// Runs sweeps, reusing each model's synthesized steps across points.
pub struct Explorer {
    profiles: Vec<HardwareProfile>,
    options: ExploreOptions,
    prepared: HashMap<(String, u32), Prepared>,
}

impl Explorer {
    pub fn new(profiles: Vec<HardwareProfile>, options: ExploreOptions) -> Explorer {
        Explorer {
            profiles,
            options,
            prepared: HashMap::new(),
        }
    }

    pub fn profiles(&self) -> &[HardwareProfile] {
        &self.profiles
    }

    fn prepare(&mut self, model: &str, bundle_neurons: u32) -> Result<&Prepared, ExploreError> {
        let key = (model.to_string(), bundle_neurons);
        if !self.prepared.contains_key(&key) {
            let desc =
                named_shape(model).ok_or_else(|| ExploreError::UnknownShape(model.into()))?;
            // Bundles as the paper stores them: down columns in the model's own type.
            let (store_model, sizes) =
                planned_store_sizes_with(&desc, Some(bundle_neurons), Some(desc.types.ffn_down))
                    .map_err(ExploreError::Point)?;
            let stats = activation_stats(model);
            let steps = self.options.warm_tokens + self.options.measured_tokens.max(1);
            let (activity, hot_units) = match &stats {
                Some(stats) => {
                    let freq = neuron_frequencies(&desc, stats);
                    let hot = hot_units_from_frequencies(
                        freq.iter().map(|l| l.as_slice()),
                        store_model.shape.ffn_bundle,
                    );
                    let steps = synthesize_activity(&desc, stats, steps, self.options.seed);
                    (Some(Arc::new(steps)), hot)
                }
                None if desc.shape.is_moe() => {
                    return Err(ExploreError::Point(format!(
                        "`{model}` is a mixture of experts without published activation statistics"
                    )))
                }
                None => (None, Vec::new()),
            };
            self.prepared.insert(
                key.clone(),
                Prepared {
                    store_model,
                    sizes,
                    activity,
                    hot_units: Arc::new(hot_units),
                },
            );
        }
        Ok(&self.prepared[&key])
    }

    /// Simulates one point.
    pub fn run(&mut self, point: &Point) -> Result<Outcome, ExploreError> {
        let options = self.options.clone();
        let profile = self
            .profiles
            .get(point.profile)
            .ok_or_else(|| ExploreError::Point(format!("no profile {}", point.profile)))?
            .clone();
        let prepared = self.prepare(&point.model, point.bundle_neurons)?;
        let sizes = &prepared.sizes;
        let ffn_bytes =
            sizes.bundle_stride * u64::from(sizes.bundles_per_layer) * u64::from(sizes.n_layer);
        let budget = match point.memory {
            Memory::Bytes(b) => b,
            Memory::FfnShare(share) => {
                let probe = split_sizes(
                    sizes,
                    u64::MAX / 4,
                    options.n_ctx,
                    64,
                    &CachePlan::default(),
                )
                .map_err(|e| ExploreError::Point(e.to_string()))?;
                let fixed = probe.resident_weights
                    + probe.kv_cache
                    + probe.scratch
                    + probe.runtime_overhead;
                let slot = sizes.bundle_stride + 4096;
                fixed + (share * ffn_bytes as f64) as u64 + 12 * slot
            }
        };
        let mut plan = ExecutionPlan::for_topology(&Topology::of_profile(&profile));
        // Cores share decode by speed, as the planner would lay them out on a phone.
        crate::search::shares_by_speed(&mut plan, &profile, &prepared.store_model);
        if !point.npu {
            plan.prefill_on = plan.decode_on.clone();
        }
        let npu_used = plan.prefill_on.iter().any(|s| {
            plan.groups
                .iter()
                .any(|g| g.name == s.group && g.kind == XpuKind::Npu)
        });
        if !npu_used {
            plan.groups.retain(|g| g.kind != XpuKind::Npu);
        }
        plan.storage.io_threads = point.io_threads.max(1);
        // The pipeline's loads are the reads in flight: an asynchronous issuer keeps them all
        // in the device's queue (1: each read waits for the one before, as synchronous I/O).
        plan.storage.queue_depth = point.pipeline.max(1);
        plan.storage.engine = IoEngine::Uring;
        plan.cache = Some(CachePlan {
            policy: match point.cache {
                CacheMode::Lru => CachePolicy::Lru,
                _ => CachePolicy::Segmented,
            },
            max_loads: point.pipeline.max(1),
            coalesce: 1,
            hot_units: match point.cache {
                CacheMode::Static => Vec::new(),
                _ => prepared.hot_units.as_ref().clone(),
            },
            ..CachePlan::default()
        });
        let split = fit_plan_to_budget(sizes, &mut plan, budget, options.n_ctx)
            .map_err(|e| ExploreError::Point(format!("{}: {e}", point.memory.label())))?;
        let n_gen = options.warm_tokens + options.measured_tokens.max(1);
        let workload = Workload {
            activity: prepared.activity.as_ref().map(|a| a.as_ref().clone()),
            bundled: point.bundled,
            warm_cache: true,
            // PowerInfer-2's decode: predictors choose the neurons, only theirs are read (a
            // mixture's router chooses its experts' neurons).
            ffn: prepared.activity.is_some().then(|| {
                if prepared.store_model.shape.is_moe() {
                    FfnSelect::Experts
                } else {
                    FfnSelect::Predicted
                }
            }),
            ..Workload::new(prepared.store_model.clone(), options.prompt, n_gen)
        };
        let report = simulate(&profile, &plan, &workload, &SimOptions::lean())
            .map_err(|e| ExploreError::Point(e.to_string()))?;
        let decode: Vec<_> = report.steps.iter().filter(|s| s.n_tokens == 1).collect();
        let measured = &decode[decode
            .len()
            .saturating_sub(options.measured_tokens.max(1) as usize)..];
        let measured_ns = measured.iter().map(|s| s.end_ns - s.start_ns).sum::<u64>() as f64;
        let prefill_ns: u64 = report
            .steps
            .iter()
            .filter(|s| s.n_tokens > 1 || options.prompt == 1 && s.step == 0)
            .map(|s| s.end_ns - s.start_ns)
            .sum();
        let cache_bytes = split.cache;
        let slots = split.plan.slots;
        let ffn_units = sizes.bundles_per_layer * sizes.n_layer;
        let window = |track: &str| {
            report
                .utilisation
                .iter()
                .find(|u| u.track == track)
                .map_or(0.0, |u| u.busy_ns as f64 / report.end_ns.max(1) as f64)
        };
        let busiest = plan
            .groups
            .iter()
            .map(|g| window(&g.name))
            .fold(0.0, f64::max);
        Ok(Outcome {
            budget,
            cache_bytes,
            ffn_in_memory: (f64::from(slots) / f64::from(ffn_units.max(1))).min(1.0),
            decode_tok_s: if measured_ns > 0.0 {
                measured.len() as f64 * 1e9 / measured_ns
            } else {
                0.0
            },
            bytes_per_token: report.bytes_read as f64 / f64::from(n_gen),
            miss_rate: report.cache_misses as f64
                / (report.cache_hits + report.cache_misses).max(1) as f64,
            compute_busy: busiest,
            storage_busy: report.storage_active_ns as f64 / report.end_ns.max(1) as f64,
            prefill_tok_s: (options.prompt > 0 && prefill_ns > 0)
                .then(|| f64::from(options.prompt) * 1e9 / prefill_ns as f64),
        })
    }
}

/// The axes of a sweep; every combination is a point.
#[derive(Clone, Debug, PartialEq)]
pub struct Sweep {
    pub models: Vec<String>,
    /// Hardware profile files (the caller loads them, in this order).
    pub profiles: Vec<String>,
    pub memory: Vec<Memory>,
    pub bundling: Vec<bool>,
    pub cache: Vec<CacheMode>,
    pub pipeline: Vec<u32>,
    pub npu: Vec<bool>,
    pub io_threads: Vec<u32>,
    pub bundle_neurons: Vec<u32>,
}

/// The axes `--sweep` knows, in the order points vary (the last fastest).
pub const AXES: &[&str] = &[
    "model",
    "profile",
    "memory",
    "bundling",
    "cache",
    "pipeline",
    "npu",
    "io-threads",
    "bundle-neurons",
];

fn on_off(v: &str) -> Result<bool, String> {
    match v {
        "on" | "true" | "yes" => Ok(true),
        "off" | "false" | "no" => Ok(false),
        _ => Err(format!("`{v}`: expected on or off")),
    }
}

fn count(v: &str) -> Result<u32, String> {
    v.parse::<u32>()
        .ok()
        .filter(|&n| (1..=1 << 16).contains(&n))
        .ok_or_else(|| format!("`{v}`: expected a whole number from 1"))
}

impl Sweep {
    /// Axes from `axis=v1,v2,…` specs; axes not given keep one default value (memory 50%,
    /// bundling on, segmented cache, 4 loads in flight, NPU on, 1 I/O thread, bundles of one
    /// neuron as PowerInfer-2 stores them). `model` and `profile` must be given.
    pub fn parse(specs: &[String]) -> Result<Sweep, String> {
        let mut sweep = Sweep {
            models: Vec::new(),
            profiles: Vec::new(),
            memory: vec![Memory::FfnShare(0.5)],
            bundling: vec![true],
            cache: vec![CacheMode::Segmented],
            pipeline: vec![conductor_runtime::plan::DEFAULT_MAX_LOADS],
            npu: vec![true],
            io_threads: vec![1],
            bundle_neurons: vec![1],
        };
        let mut seen: Vec<String> = Vec::new();
        for spec in specs {
            let (axis, values) = spec.split_once('=').ok_or_else(|| {
                format!("`{spec}`: expected AXIS=V1,V2 (axes: {})", AXES.join(", "))
            })?;
            let axis = axis.trim();
            if seen.iter().any(|a| a == axis) {
                return Err(format!("axis `{axis}` given twice"));
            }
            seen.push(axis.to_string());
            let values: Vec<&str> = values.split(',').map(str::trim).collect();
            if values.iter().any(|v| v.is_empty()) {
                return Err(format!("`{spec}`: an empty value"));
            }
            fn all<T>(v: &[&str], f: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
                v.iter().map(|x| f(x)).collect()
            }
            match axis {
                "model" => {
                    for v in &values {
                        if named_shape(v).is_none() {
                            return Err(ExploreError::UnknownShape(v.to_string()).to_string());
                        }
                    }
                    sweep.models = values.iter().map(|v| v.to_string()).collect();
                }
                "profile" => sweep.profiles = values.iter().map(|v| v.to_string()).collect(),
                "memory" => sweep.memory = all(&values, Memory::parse)?,
                "bundling" => sweep.bundling = all(&values, on_off)?,
                "cache" => {
                    sweep.cache = all(&values, |v| match v {
                        "static" => Ok(CacheMode::Static),
                        "segmented" => Ok(CacheMode::Segmented),
                        "lru" => Ok(CacheMode::Lru),
                        _ => Err(format!("`{v}`: expected static, segmented or lru")),
                    })?
                }
                "pipeline" => sweep.pipeline = all(&values, count)?,
                "npu" => sweep.npu = all(&values, on_off)?,
                "io-threads" => sweep.io_threads = all(&values, count)?,
                "bundle-neurons" => sweep.bundle_neurons = all(&values, count)?,
                other => {
                    return Err(format!(
                        "unknown axis `{other}` (axes: {})",
                        AXES.join(", ")
                    ))
                }
            }
        }
        if sweep.models.is_empty() {
            return Err("give the models: --sweep model=NAME[,NAME…]".into());
        }
        if sweep.profiles.is_empty() {
            return Err("give the hardware profiles: --sweep profile=FILE[,FILE…]".into());
        }
        Ok(sweep)
    }

    /// How many values `axis` takes.
    pub fn len_of(&self, axis: &str) -> usize {
        match axis {
            "model" => self.models.len(),
            "profile" => self.profiles.len(),
            "memory" => self.memory.len(),
            "bundling" => self.bundling.len(),
            "cache" => self.cache.len(),
            "pipeline" => self.pipeline.len(),
            "npu" => self.npu.len(),
            "io-threads" => self.io_threads.len(),
            "bundle-neurons" => self.bundle_neurons.len(),
            _ => 0,
        }
    }

    /// Every combination, the last axis varying fastest.
    pub fn points(&self) -> Vec<Point> {
        let mut out = Vec::new();
        for model in &self.models {
            for profile in 0..self.profiles.len() {
                for &memory in &self.memory {
                    for &bundled in &self.bundling {
                        for &cache in &self.cache {
                            for &pipeline in &self.pipeline {
                                for &npu in &self.npu {
                                    for &io_threads in &self.io_threads {
                                        for &bundle_neurons in &self.bundle_neurons {
                                            out.push(Point {
                                                model: model.clone(),
                                                profile,
                                                memory,
                                                bundled,
                                                cache,
                                                pipeline,
                                                npu,
                                                io_threads,
                                                bundle_neurons,
                                            });
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }
}

impl Point {
    /// The point's value on `axis`, as a label.
    pub fn value(&self, axis: &str, profiles: &[String]) -> String {
        let on = |b: bool| if b { "on" } else { "off" }.to_string();
        match axis {
            "model" => self.model.clone(),
            "profile" => profiles.get(self.profile).cloned().unwrap_or_default(),
            "memory" => self.memory.label(),
            "bundling" => on(self.bundled),
            "cache" => self.cache.name().into(),
            "pipeline" => self.pipeline.to_string(),
            "npu" => on(self.npu),
            "io-threads" => self.io_threads.to_string(),
            "bundle-neurons" => self.bundle_neurons.to_string(),
            _ => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_shares_parse() {
        assert_eq!(Memory::parse("7GB"), Ok(Memory::Bytes(7_000_000_000)));
        assert_eq!(Memory::parse("512MiB"), Ok(Memory::Bytes(512 << 20)));
        assert_eq!(Memory::parse("50%"), Ok(Memory::FfnShare(0.5)));
        assert_eq!(Memory::parse("1000"), Ok(Memory::Bytes(1000)));
        assert!(Memory::parse("150%").is_err());
        assert!(Memory::parse("7XB").unwrap_err().contains("unknown unit"));
        assert!(Memory::parse("GB").is_err());
        assert!(Memory::parse("-3GB").is_err());
    }

    #[test]
    fn sweeps_parse_and_multiply() {
        let specs: Vec<String> = [
            "model=turbosparse-mistral-7b",
            "profile=a.toml,b.toml",
            "memory=4GB,50%",
            "cache=static,segmented,lru",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let sweep = Sweep::parse(&specs).unwrap();
        let points = sweep.points();
        assert_eq!(points.len(), 2 * 2 * 3);
        assert_eq!(points[0].cache, CacheMode::Static);
        assert_eq!(points[1].cache, CacheMode::Segmented);
        assert_eq!(points[3].memory, Memory::FfnShare(0.5));
        assert_eq!(points[6].profile, 1);
        assert!(points.iter().all(|p| p.bundled && p.bundle_neurons == 1));
        assert_eq!(points[6].value("profile", &sweep.profiles), "b.toml");
        let err = |v: &[&str]| {
            Sweep::parse(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap_err()
        };
        assert!(err(&["model=gpt-5", "profile=a"]).contains("unknown model shape `gpt-5`"));
        assert!(err(&["model=mistral-7b"]).contains("profile"));
        assert!(err(&["profile=a"]).contains("models"));
        assert!(err(&["model=mistral-7b", "profile=a", "colour=red"]).contains("unknown axis"));
        assert!(err(&["model=mistral-7b", "profile=a", "npu=maybe"]).contains("on or off"));
        assert!(err(&["model=mistral-7b", "profile=a", "pipeline=0"]).contains("from 1"));
        assert!(err(&["model=mistral-7b", "model=bamboo-7b", "profile=a"]).contains("twice"));
        assert!(err(&["model=mistral-7b,", "profile=a"]).contains("empty"));
    }
}
