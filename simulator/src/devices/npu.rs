//! A dense accelerator with fixed graph shapes (a processor group of kind `npu` when the
//! profile describes an NPU).
//!
//! A `Compute` runs as one graph launch per chunk of `plan.dense.token_chunk` tokens; with
//! `pads_to_chunk` a partial chunk costs a full one. Per chunk of k tokens:
//! - matrices: launch_us + MACs(k) / gmacs of the measured shape nearest by MACs (nearest in
//!   log(MACs), ties to the first listed);
//! - attention: launch_us + heads × 4 · head_dim · Σ_positions / attn_gflops, positions of
//!   padded tokens continuing past the real ones.
//!
//! The phase is never faster than reading its weights once per launch at the memory's
//! `bandwidth_gbs`. There is no worker dispatch: the group's host thread drives the device.

use super::{ActiveCursor, Load, ModelCosts, StepCtx};
use conductor_runtime::neuron::Phase;
use conductor_runtime::plan::NpuProfile;
use std::ops::Range;

pub(crate) struct NpuGroup {
    launch_ns: f64,
    pads_to_chunk: bool,
    token_chunk: u32,
    /// (ln MACs of the measured shape, its GMAC/s), in profile order.
    shapes: Vec<(f64, f64)>,
    attn_gflops: f64,
    bandwidth_gbs: f64,
}

impl NpuGroup {
    pub fn new(npu: &NpuProfile, token_chunk: u32, bandwidth_gbs: f64) -> NpuGroup {
        NpuGroup {
            launch_ns: npu.launch_us * 1e3,
            pads_to_chunk: npu.pads_to_chunk,
            token_chunk: token_chunk.max(1),
            shapes: npu
                .shapes
                .iter()
                .map(|s| {
                    let macs = f64::from(s.tokens) * f64::from(s.rows) * f64::from(s.cols);
                    (macs.max(1.0).ln(), s.gmacs)
                })
                .collect(),
            attn_gflops: npu.attn_gflops,
            bandwidth_gbs,
        }
    }

    /// GMAC/s of the measured shape nearest to `macs`.
    fn rate(&self, macs: f64) -> f64 {
        let x = macs.max(1.0).ln();
        let mut best = self.shapes[0];
        for &s in &self.shapes[1..] {
            if (s.0 - x).abs() < (best.0 - x).abs() {
                best = s;
            }
        }
        best.1
    }

    pub fn phase_ns(
        &mut self,
        costs: &ModelCosts,
        phase: Phase,
        layer: u32,
        clusters: &[Range<u32>],
        ctx: &StepCtx<'_>,
    ) -> f64 {
        let mut load = Load::default();
        let mut active = ActiveCursor::new(ctx.activity, phase, layer);
        for range in clusters {
            load.add(&costs.load(phase, range.clone(), &mut active));
        }
        let per_token = load.total_macs();
        let tokens = ctx.tokens_of(phase);
        let chunk = self.token_chunk;
        let n_chunks = tokens.div_ceil(chunk);
        let mut ns = 0.0;
        for c in 0..n_chunks {
            let first = c * chunk;
            let real = chunk.min(tokens - first);
            let k = if self.pads_to_chunk { chunk } else { real };
            ns += self.launch_ns;
            if load.heads > 0.0 {
                // Σ over the chunk's tokens t of (n_past + t + 1).
                let p0 = f64::from(ctx.n_past + first);
                let k = f64::from(k);
                let positions = k * p0 + k * (k + 1.0) / 2.0;
                ns += load.heads * 4.0 * costs.head_dim * positions / self.attn_gflops;
            }
            if per_token > 0.0 {
                let macs = per_token * f64::from(k);
                ns += macs / self.rate(macs);
            }
        }
        let floor = load.bytes * f64::from(n_chunks) / self.bandwidth_gbs;
        ns.max(floor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::named_shape;
    use conductor_runtime::plan::NpuShapeRate;
    use conductor_runtime::schedule::StepShape;

    fn npu(pads: bool) -> NpuGroup {
        let p = NpuProfile {
            name: "test".into(),
            launch_us: 100.0,
            pads_to_chunk: pads,
            shapes: vec![
                NpuShapeRate {
                    tokens: 1,
                    rows: 1000,
                    cols: 1000,
                    gmacs: 1.0,
                },
                NpuShapeRate {
                    tokens: 100,
                    rows: 1000,
                    cols: 1000,
                    gmacs: 100.0,
                },
            ],
            attn_gflops: 10.0,
        };
        NpuGroup::new(&p, 64, 1e9)
    }

    #[test]
    fn chunks_pad_launch_and_pick_the_nearest_shape() {
        let n = npu(true);
        assert_eq!(n.rate(1e6), 1.0);
        assert_eq!(n.rate(2e6), 1.0);
        assert_eq!(n.rate(5e7), 100.0);
        let d = named_shape("smollm2-135m").unwrap();
        let costs = ModelCosts::new(&d);
        let ctx = |n_tokens| StepCtx {
            shape: StepShape::Prefill,
            n_tokens,
            n_past: 0,
            n_out: 1,
            activity: None,
        };
        let rows = std::slice::from_ref(&(0..128));
        // 65 tokens = two launches; padded, both cost a full chunk.
        let padded = npu(true).phase_ns(&costs, Phase::AttnOutRows, 0, rows, &ctx(65));
        let macs = 64.0 * 128.0 * 576.0;
        // 4.7 M MACs per launch is nearer (in log) the 1 M-MAC shape than the 100 M one.
        assert_eq!(n.rate(macs), 1.0);
        let expected = 2.0 * (100e3 + macs / 1.0);
        assert!((padded - expected).abs() < 1e-6, "{padded} vs {expected}");
        let unpadded = npu(false).phase_ns(&costs, Phase::AttnOutRows, 0, rows, &ctx(65));
        assert!(unpadded < padded);
        let heads = std::slice::from_ref(&(0..9));
        let more = npu(true).phase_ns(&costs, Phase::AttnHeads, 0, heads, &ctx(128));
        let fewer = npu(true).phase_ns(&costs, Phase::AttnHeads, 0, heads, &ctx(64));
        assert!(more > 2.0 * fewer, "later chunks attend to more positions");
    }
}
