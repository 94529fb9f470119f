//! The scheduler's host thread: finishing phases between them, and messages between hosts.
//!
//! `FinishPhase` (and the start of a step) run on the scheduler's host core: elements touched
//! × `finish_ns_per_element` of that core's class. The element counts follow
//! `Executor::begin_step` / `finish_phase` (n = the step's tokens, n_out = tokens with logits,
//! A(types) = distinct activation formats the next phase's weights need):
//! - begin step: n·n_embd (embedding rows) + n·n_embd (RMSNorm) + n·n_embd·A(q,k,v);
//! - qkv: 2·n_head_kv·n·head_dim (keys and values stored into the f16 KV cache);
//! - attn: n·q_dim (gather heads) + n·q_dim (quantize for attn_out);
//! - attn_out: 2·n·n_embd (gather, add to the residual) + n·n_embd (norm) + n·n_embd·A(gate,up)
//!   + n·n_expert·n_embd (a mixture of experts' router: one f32 dot product per expert);
//! - ffn (neurons): clusters·n·n_embd (sum of partial down projections) + n·n_embd (add) + next;
//! - ffn_gate_up: n·n_ff (gather) + n·n_ff (quantize for down);
//! - ffn_down: 2·n·n_embd + next;
//! - next = the following layer's norm and quantization, n·n_embd·(1 + A(q,k,v)); after the
//!   last layer, when logits are wanted, 2·n_out·n_embd (output norm, quantize);
//! - output: n_out·n_vocab (gather logits);
//! - plus, when several groups shared the phase, a copy of its whole output out of each
//!   group's buffer (`collect`; one group's buffer is swapped in for free).

use super::{role_types, StepCtx};
use conductor_runtime::cache::IO_BOUND_SPIN_NS;
use conductor_runtime::neuron::Phase;
use conductor_runtime::plan::{ExecutionPlan, MessagingProfile, ModelDescription};
use conductor_runtime::quant::{try_activation_type, GgmlType};

/// A host that has been idle longer than this has parked its thread: waking it costs
/// `wakeup_ns` (the worker pool and the actors spin about this long before parking; under a
/// plan with a cache, [`IO_BOUND_SPIN_NS`]).
pub const SPIN_WINDOW_NS: u64 = 50_000;

/// How long an idle host spins before parking under `plan`: [`IO_BOUND_SPIN_NS`] when it has
/// a cache (as the actor driver does), else [`SPIN_WINDOW_NS`].
pub(crate) fn spin_window_ns(plan: &ExecutionPlan) -> u64 {
    if plan.cache.is_some() {
        IO_BOUND_SPIN_NS
    } else {
        SPIN_WINDOW_NS
    }
}

pub(crate) struct FinishModel {
    ns_per_element: f64,
    n_layer: u32,
    n_embd: f64,
    n_ff: f64,
    n_vocab: f64,
    q_dim: f64,
    kv_elements: f64,
    qkv_heads: f64,
    head_dim: f64,
    n_head: f64,
    acts_qkv: f64,
    acts_gate_up: f64,
    n_expert: f64,
}

/// How many distinct activation formats weights of these types need.
fn activation_formats(types: &[GgmlType]) -> f64 {
    let mut seen: Vec<GgmlType> = Vec::with_capacity(types.len());
    for &t in types {
        let at = try_activation_type(t).unwrap_or(t);
        if !seen.contains(&at) {
            seen.push(at);
        }
    }
    seen.len() as f64
}

impl FinishModel {
    pub fn new(model: &ModelDescription, ns_per_element: f64) -> FinishModel {
        let s = &model.shape;
        let t = role_types(model);
        FinishModel {
            ns_per_element,
            n_layer: s.n_layer,
            n_embd: f64::from(s.n_embd),
            n_ff: f64::from(s.n_ff),
            n_vocab: f64::from(s.n_vocab),
            q_dim: f64::from(s.n_head) * f64::from(s.head_dim),
            kv_elements: 2.0 * f64::from(s.n_head_kv) * f64::from(s.head_dim),
            qkv_heads: f64::from(s.n_head + 2 * s.n_head_kv),
            head_dim: f64::from(s.head_dim),
            n_head: f64::from(s.n_head),
            acts_qkv: activation_formats(&t[0..3]),
            acts_gate_up: activation_formats(&t[4..6]),
            n_expert: f64::from(s.n_expert),
        }
    }

    /// Embedding, first norm and quantization of a step.
    pub fn begin_ns(&self, ctx: &StepCtx<'_>) -> f64 {
        let n = f64::from(ctx.n_tokens);
        n * self.n_embd * (2.0 + self.acts_qkv) * self.ns_per_element
    }

    /// After the last cluster of `phase` in `layer`; `clusters` is the phase's cluster count
    /// and `parts` the groups that computed it.
    pub fn finish_ns(
        &self,
        phase: Phase,
        layer: u32,
        clusters: usize,
        parts: usize,
        ctx: &StepCtx<'_>,
    ) -> f64 {
        let n = f64::from(ctx.n_tokens);
        let n_out = f64::from(ctx.n_out);
        let embd = self.n_embd;
        let next = || {
            if layer + 1 < self.n_layer {
                n * embd * (1.0 + self.acts_qkv)
            } else if ctx.n_out > 0 {
                2.0 * n_out * embd
            } else {
                0.0
            }
        };
        let elements = match phase {
            Phase::QkvHeads => n * self.kv_elements,
            Phase::AttnHeads => 2.0 * n * self.q_dim,
            Phase::AttnOutRows => n * embd * (3.0 + self.acts_gate_up + self.n_expert),
            Phase::FfnNeurons => clusters as f64 * n * embd + n * embd + next(),
            // Gather the gate values; decide each neuron (gate-first loading).
            Phase::FfnGateRows => 2.0 * n * self.n_ff,
            Phase::FfnGateUpRows => 2.0 * n * self.n_ff,
            Phase::FfnDownRows => 2.0 * n * embd + next(),
            Phase::OutputRows => n_out * self.n_vocab,
        };
        let collect = if parts > 1 {
            match phase {
                Phase::QkvHeads => self.qkv_heads * n * self.head_dim,
                Phase::AttnHeads => self.n_head * n * self.head_dim,
                Phase::AttnOutRows | Phase::FfnDownRows => n * embd,
                Phase::FfnNeurons => clusters as f64 * n * embd,
                Phase::FfnGateUpRows | Phase::FfnGateRows => n * self.n_ff,
                Phase::OutputRows => n_out * self.n_vocab,
            }
        } else {
            0.0
        };
        (elements + collect) * self.ns_per_element
    }
}

/// What a message between hosts costs.
pub(crate) struct MessageModel {
    local_ns: f64,
    remote_ns: f64,
    wakeup_ns: f64,
    /// How long an idle host spins before parking ([`spin_window_ns`]).
    spin_window_ns: u64,
}

impl MessageModel {
    pub fn new(m: &MessagingProfile, spin_window_ns: u64) -> MessageModel {
        MessageModel {
            local_ns: m.local_message_ns,
            remote_ns: m.remote_message_ns,
            wakeup_ns: m.wakeup_ns,
            spin_window_ns,
        }
    }

    /// Nanoseconds from sending at `sent` to the receiver seeing the message. A message to the
    /// same host is local. Otherwise it is remote, plus a wake-up when the receiving host
    /// (busy until `receiver_free_at`, idle after) has been idle longer than the spin window
    /// by the time the message arrives.
    pub fn latency_ns(&self, same_host: bool, sent: u64, receiver_free_at: u64) -> u64 {
        if same_host {
            return self.local_ns.round() as u64;
        }
        let remote = self.remote_ns.round() as u64;
        let arrives = sent + remote;
        if arrives.saturating_sub(receiver_free_at) > self.spin_window_ns {
            remote + self.wakeup_ns.round() as u64
        } else {
            remote
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::named_shape;
    use conductor_runtime::schedule::StepShape;

    #[test]
    fn finish_counts_follow_the_executor() {
        let d = named_shape("smollm2-135m").unwrap();
        let f = FinishModel::new(&d, 1.0);
        let ctx = StepCtx {
            shape: StepShape::Decode,
            n_tokens: 1,
            n_past: 0,
            n_out: 1,
            activity: None,
        };
        // Q4_1 weights take Q8_1 activations: one format for q, k, v.
        assert_eq!(f.begin_ns(&ctx), 576.0 * 3.0);
        assert_eq!(
            f.finish_ns(Phase::QkvHeads, 0, 15, 1, &ctx),
            2.0 * 3.0 * 64.0
        );
        assert_eq!(
            f.finish_ns(Phase::FfnNeurons, 0, 12, 1, &ctx),
            12.0 * 576.0 + 576.0 + 576.0 * 2.0
        );
        assert_eq!(
            f.finish_ns(Phase::FfnNeurons, 29, 12, 1, &ctx),
            12.0 * 576.0 + 576.0 + 2.0 * 576.0
        );
        let no_logits = StepCtx { n_out: 0, ..ctx };
        assert_eq!(
            f.finish_ns(Phase::FfnNeurons, 29, 12, 1, &no_logits),
            12.0 * 576.0 + 576.0
        );
        assert_eq!(f.finish_ns(Phase::OutputRows, 30, 24, 1, &ctx), 49152.0);
        // Shared among two groups: the output is copied out of their buffers.
        assert_eq!(
            f.finish_ns(Phase::OutputRows, 30, 24, 2, &ctx),
            2.0 * 49152.0
        );
        assert_eq!(
            f.finish_ns(Phase::QkvHeads, 0, 15, 2, &ctx),
            2.0 * 3.0 * 64.0 + 15.0 * 64.0
        );
        let mixed = ModelDescription {
            types: conductor_runtime::plan::WeightTypes {
                attn_v: GgmlType::Q6_K,
                ..d.types.clone()
            },
            ..d
        };
        assert_eq!(FinishModel::new(&mixed, 1.0).acts_qkv, 2.0);
    }

    #[test]
    fn remote_messages_wake_parked_hosts() {
        let m = MessageModel {
            local_ns: 100.0,
            remote_ns: 1000.0,
            wakeup_ns: 10_000.0,
            spin_window_ns: SPIN_WINDOW_NS,
        };
        assert_eq!(m.latency_ns(true, 90_000, 0), 100);
        // Busy until after the message arrives, or idle for less than the spin window.
        assert_eq!(m.latency_ns(false, 5_000, 70_000), 1000);
        assert_eq!(m.latency_ns(false, 5_000, 0), 1000);
        assert_eq!(m.latency_ns(false, 60_000, 0), 11_000);
        assert_eq!(m.latency_ns(false, 60_000, 20_000), 1000);
        // Under a cache's plan hosts park after a few microseconds.
        let io_bound = MessageModel {
            spin_window_ns: IO_BOUND_SPIN_NS,
            ..m
        };
        assert_eq!(io_bound.latency_ns(false, 3_000, 0), 1000);
        assert_eq!(io_bound.latency_ns(false, 20_000, 0), 11_000);
        assert_eq!(io_bound.latency_ns(false, 20_000, 19_000), 1000);
    }
}
