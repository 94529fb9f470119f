//! A CPU processor group: W worker threads on the group's cores, each core's class giving its
//! kernel rates.
//!
//! Cost of one cluster on a core of class c (nanoseconds; a rate in GMAC/s is MACs per ns):
//! - matrices: Σ_role MACs_role × tokens / rate_c(role), with rate = `matvec_stream_gmacs`
//!   when one token is multiplied and the model's dense weights exceed the LLC (for the FFN
//!   roles, decode's neuron clusters, `ffn_cluster_stream_gmacs` when the profile has it),
//!   `matvec_gmacs` when they fit, and `matmul_gmacs` for several tokens;
//! - element-wise work per token: the gated activation (SiLU(gate)·up) of FFN neurons and rows at
//!   `activation_ns_per_element`, RoPE on query and key heads at 2 × `finish_ns_per_element`;
//! - decode-shape attention: heads × Σ_t (n_past + t + 1) × `attn_decode_ns_per_head_pos`;
//! - prefill-shape attention: heads × 4 · head_dim · Σ_t (n_past + t + 1) / `attn_prefill_gflops`.
//!
//! A phase's clusters are list-scheduled in index order onto the earliest available worker
//! (ties: lowest index), as the worker pool's atomic counter hands them out. Phase time =
//! max(makespan, bytes / min(cores · per_core_gbs, bandwidth_gbs)) + dispatch_ns when more
//! than one worker takes part (+ wakeup_ns under a plan with a cache, whose pool helpers park
//! at once); the bandwidth floor applies only when the weights are streamed
//! from DRAM (dense weights larger than the LLC).
//!
//! Cores streaming weights at once share the memory system: `k` workers streaming a decode
//! phase together get through at most `scaling(k)` times the work of one, where `scaling(k)`
//! is the profile's measured `memory.stream_scaling` (decode's FFN phases on the worker pool
//! with `k` threads, relative to one; made non-decreasing) or, without it, `min(k,
//! bandwidth_gbs / per_core_gbs)`. So a streamed decode phase takes at least (Σ cluster time on one core) /
//! scaling(k); a straggler finishing alone runs at full speed, so more workers never make a
//! phase slower.

use super::{role_types, ActiveCursor, Load, ModelCosts, StepCtx, ROLES};
use crate::SimError;
use conductor_runtime::neuron::Phase;
use conductor_runtime::plan::{
    HardwareProfile, ModelDescription, PlacedGroup, Topology, FEW_TOKENS,
};
use conductor_runtime::schedule::StepShape;
use std::ops::Range;

/// Rates of one core class, as nanoseconds per unit of work.
#[derive(Clone, Debug)]
struct ClassRates {
    /// ns per MAC of a single-token matvec, by role.
    matvec_ns: [f64; ROLES],
    /// ns per MAC of a multi-token matmul, by role.
    matmul_ns: [f64; ROLES],
    /// ns per MAC of a step of at most `FEW_TOKENS` tokens (a verified draft), by role.
    matmul_few_ns: [f64; ROLES],
    attn_decode_ns_per_head_pos: f64,
    /// ns per flop of prefill attention.
    attn_prefill_ns_per_flop: f64,
    /// ns per element of SiLU(gate)·up.
    activation_ns: f64,
    /// ns per element rotated by RoPE (two passes of element-wise work).
    rope_ns: f64,
}

impl ClassRates {
    fn cluster_ns(&self, load: &Load, tokens: f64, attn_per_head: f64) -> f64 {
        let priced = |per_mac: &[f64; ROLES]| -> f64 {
            load.macs
                .iter()
                .zip(per_mac)
                .map(|(macs, per)| macs * per)
                .sum()
        };
        let one_token = priced(&self.matvec_ns);
        // Several tokens at the matmul rate (a few at the rate measured for a verified draft's
        // step), but never below one token's matvec: every weight is read once either way.
        let matrices = if tokens == 1.0 {
            one_token
        } else if tokens <= FEW_TOKENS as f64 {
            (priced(&self.matmul_few_ns) * tokens).max(one_token)
        } else {
            (priced(&self.matmul_ns) * tokens).max(one_token)
        };
        matrices
            + load.heads * attn_per_head
            + (load.activations * self.activation_ns + load.rotated * self.rope_ns) * tokens
    }
}

#[derive(Clone, Debug)]
struct Worker {
    class: usize,
    /// Workers sharing a core split its time: each runs this many times slower.
    slowdown: f64,
}

pub(crate) struct CpuGroup {
    classes: Vec<ClassRates>,
    workers: Vec<Worker>,
    /// Bandwidth (GB/s = bytes per ns) available when the first `k + 1` workers take part.
    bandwidth: Vec<f64>,
    /// How many times one core's streaming work the first `k + 1` workers get through together.
    stream_scaling: Vec<f64>,
    streamed: bool,
    dispatch_ns: f64,
    head_dim: f64,
    // Scratch reused by every phase: the hot path does not allocate.
    free_at: Vec<f64>,
    class_ns: Vec<f64>,
    unit_ns: Vec<f64>,
}

impl CpuGroup {
    /// `io_bound`: the plan has a cache (see [`conductor_runtime::cache::IO_BOUND_SPIN_NS`]).
    pub fn new(
        profile: &HardwareProfile,
        topology: &Topology,
        group: &PlacedGroup,
        model: &ModelDescription,
        io_bound: bool,
    ) -> Result<CpuGroup, SimError> {
        let streamed = model.dense_weight_bytes() > profile.memory.llc_bytes;
        let types = role_types(model);
        let mut class_names: Vec<&str> = Vec::new();
        let mut classes = Vec::new();
        let mut workers = Vec::new();
        let threads = group.threads.max(1) as usize;
        let worker_core = |w: usize| group.cores[w % group.cores.len()];
        for w in 0..threads {
            let core = worker_core(w);
            let name = topology
                .class_of(core)
                .expect("placement only uses cores of the topology");
            let class = match class_names.iter().position(|c| *c == name) {
                Some(i) => i,
                None => {
                    let (index, profile_class) = profile
                        .core_classes
                        .iter()
                        .enumerate()
                        .find(|(_, c)| c.name == name)
                        .expect("the topology comes from the profile");
                    let mut matvec_ns = [0.0; ROLES];
                    let mut matmul_ns = [0.0; ROLES];
                    let mut matmul_few_ns = [0.0; ROLES];
                    for (r, &ty) in types.iter().enumerate() {
                        let rates =
                            profile_class
                                .rates(ty)
                                .ok_or_else(|| SimError::MissingRates {
                                    class: name.to_string(),
                                    index,
                                    ty,
                                })?;
                        // Decode's FFN roles are only ever computed as neuron clusters (rows of
                        // gate and up, columns of down): their measured rate when streamed.
                        let ffn_role = (4..=6).contains(&r);
                        let matvec = match (streamed, ffn_role, rates.ffn_cluster_stream_gmacs) {
                            (true, true, Some(cluster)) => cluster,
                            (true, _, _) => rates.matvec_stream_gmacs,
                            (false, _, _) => rates.matvec_gmacs,
                        };
                        matvec_ns[r] = 1.0 / matvec;
                        matmul_ns[r] = 1.0 / rates.matmul_gmacs;
                        matmul_few_ns[r] =
                            1.0 / rates.matmul_few_gmacs.unwrap_or(rates.matmul_gmacs);
                    }
                    classes.push(ClassRates {
                        matvec_ns,
                        matmul_ns,
                        matmul_few_ns,
                        attn_decode_ns_per_head_pos: profile_class.attn_decode_ns_per_head_pos,
                        attn_prefill_ns_per_flop: 1.0 / profile_class.attn_prefill_gflops,
                        activation_ns: profile_class
                            .activation_ns_per_element
                            .unwrap_or(profile_class.finish_ns_per_element),
                        rope_ns: 2.0 * profile_class.finish_ns_per_element,
                    });
                    class_names.push(name);
                    classes.len() - 1
                }
            };
            let sharing = (0..threads).filter(|&v| worker_core(v) == core).count();
            workers.push(Worker {
                class,
                slowdown: sharing as f64,
            });
        }
        let mem = &profile.memory;
        let mut cores_seen: Vec<u32> = Vec::new();
        let mut stream_scaling = Vec::with_capacity(threads);
        let bandwidth = (0..threads)
            .map(|w| {
                let core = worker_core(w);
                if !cores_seen.contains(&core) {
                    cores_seen.push(core);
                }
                let k = cores_seen.len() as f64;
                // Measured scaling of the streaming kernel when the profile has it; else the
                // ratio of the raw bandwidths.
                let measured = mem
                    .stream_scaling
                    .get(cores_seen.len() - 1)
                    .copied()
                    .unwrap_or_else(|| k.min(mem.bandwidth_gbs / mem.per_core_gbs));
                let previous = stream_scaling.last().copied().unwrap_or(1.0);
                stream_scaling.push(measured.clamp(previous, k.max(previous)));
                (k * mem.per_core_gbs).min(mem.bandwidth_gbs)
            })
            .collect();
        Ok(CpuGroup {
            classes,
            free_at: vec![0.0; threads],
            class_ns: Vec::new(),
            unit_ns: Vec::new(),
            workers,
            bandwidth,
            stream_scaling,
            streamed,
            // Under a cache's plan the helpers park at once: each shared phase wakes them.
            dispatch_ns: profile.messaging.dispatch_ns
                + if io_bound {
                    profile.messaging.wakeup_ns
                } else {
                    0.0
                },
            head_dim: f64::from(model.shape.head_dim),
        })
    }

    /// Nanoseconds of attention per query head on a core of `class`.
    fn attn_per_head(&self, class: &ClassRates, ctx: &StepCtx<'_>) -> f64 {
        let positions = ctx.attended_positions();
        match ctx.shape {
            StepShape::Decode => positions * class.attn_decode_ns_per_head_pos,
            StepShape::Prefill => 4.0 * self.head_dim * positions * class.attn_prefill_ns_per_flop,
        }
    }

    pub fn phase_ns(
        &mut self,
        costs: &ModelCosts,
        phase: Phase,
        layer: u32,
        clusters: &[Range<u32>],
        ctx: &StepCtx<'_>,
    ) -> f64 {
        let tokens = f64::from(ctx.tokens_of(phase));
        let used = self.workers.len().min(clusters.len()).max(1);
        self.free_at.clear();
        self.free_at.resize(used, 0.0);
        let mut bytes = 0.0;
        let mut active = ActiveCursor::new(ctx.activity, phase, layer);
        // Every phase but q|k|v (whose units mix weight types) costs the same per unit: price
        // one unit per class once, then scale by the cluster's (active) units. This is the
        // per-cluster hot path of sparse decode.
        let linear = phase != Phase::QkvHeads;
        let mut unit_bytes = 0.0;
        // Streaming weights from several cores at once: together they do at most this much.
        let streaming = self.streamed && tokens == 1.0;
        let mut single_core_ns = 0.0;
        self.unit_ns.clear();
        if linear {
            let unit = costs.load(phase, 0..1, &mut ActiveCursor::dense());
            unit_bytes = unit.bytes;
            for class in &self.classes {
                let attn = if unit.heads > 0.0 {
                    self.attn_per_head(class, ctx)
                } else {
                    0.0
                };
                self.unit_ns.push(class.cluster_ns(&unit, tokens, attn));
            }
        }
        for range in clusters {
            self.class_ns.clear();
            if linear {
                let units = active
                    .count_in(range.clone())
                    .map_or(range.len() as f64, f64::from);
                bytes += units * unit_bytes;
                self.class_ns
                    .extend(self.unit_ns.iter().map(|ns| units * ns));
            } else {
                let load = costs.load(phase, range.clone(), &mut active);
                bytes += load.bytes;
                for class in &self.classes {
                    let attn = if load.heads > 0.0 {
                        self.attn_per_head(class, ctx)
                    } else {
                        0.0
                    };
                    self.class_ns.push(class.cluster_ns(&load, tokens, attn));
                }
            }
            // Earliest available worker; ties go to the lowest index.
            let mut best = 0;
            for w in 1..used {
                if self.free_at[w] < self.free_at[best] {
                    best = w;
                }
            }
            let worker = &self.workers[best];
            self.free_at[best] += self.class_ns[worker.class] * worker.slowdown;
            single_core_ns += self.class_ns[worker.class];
        }
        let mut makespan = self.free_at.iter().copied().fold(0.0, f64::max);
        if streaming {
            makespan = makespan.max(single_core_ns / self.stream_scaling[used - 1]);
        }
        let floor = if self.streamed {
            bytes / self.bandwidth[used - 1]
        } else {
            0.0
        };
        let dispatch = if used > 1 { self.dispatch_ns } else { 0.0 };
        makespan.max(floor) + dispatch
    }
}
