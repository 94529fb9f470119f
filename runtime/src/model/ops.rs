//! Element-wise pieces of the forward pass: RMSNorm, RoPE, FFN activations.
//!
//! Where the order of floating-point operations is visible in the logits, it follows llama.cpp
//! (RMSNorm sums squares in f64; RoPE angles are built by repeated multiplication in f32).

use super::config::{RopeConfig, RopeStyle};
use crate::plan::FfnActivation;

/// `out = x / rms(x) * weight`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let scale = rms_scale(x, eps);
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
    }
}

/// [`rms_norm`] of `x` into itself (the same operations, so the same bits).
pub fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let scale = rms_scale(x, eps);
    for (v, &w) in x.iter_mut().zip(weight) {
        *v = *v * scale * w;
    }
}

/// `1 / √(mean(x²) + eps)`, the squares summed in f64.
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// cos/sin of every rotated pair for a run of consecutive positions, computed once per step
/// and shared by every head of every layer.
#[derive(Default)]
pub struct RopeTable {
    half: usize,
    /// `[token][pair]` (cos, sin).
    cos_sin: Vec<(f32, f32)>,
}

impl RopeTable {
    pub fn fill(
        &mut self,
        rope: &RopeConfig,
        freq_factors: Option<&[f32]>,
        first_pos: u32,
        n: usize,
    ) {
        self.fill_positions(rope, freq_factors, (0..n as u32).map(|t| first_pos + t));
    }

    /// Row `t` for the `t`-th of `positions` (any positions: a multi-sequence step's tokens
    /// each sit where their own sequence is). A row depends on its position only.
    pub fn fill_positions(
        &mut self,
        rope: &RopeConfig,
        freq_factors: Option<&[f32]>,
        positions: impl Iterator<Item = u32>,
    ) {
        self.half = rope.n_dims as usize / 2;
        self.cos_sin.clear();
        let theta_scale = rope.freq_base.powf(-2.0 / rope.n_dims as f32);
        for pos in positions {
            let mut theta = pos as usize as f32;
            for i in 0..self.half {
                let ff = freq_factors.map_or(1.0, |f| f[i]);
                let angle = rope.freq_scale * (theta / ff);
                self.cos_sin
                    .push((angle.cos() * rope.mscale, angle.sin() * rope.mscale));
                theta *= theta_scale;
            }
        }
    }

    /// Rotates one head of token `t` in place.
    pub fn apply(&self, style: RopeStyle, t: usize, head: &mut [f32]) {
        let table = &self.cos_sin[t * self.half..(t + 1) * self.half];
        match style {
            RopeStyle::Normal => {
                for (i, &(c, s)) in table.iter().enumerate() {
                    let (x0, x1) = (head[2 * i], head[2 * i + 1]);
                    head[2 * i] = x0 * c - x1 * s;
                    head[2 * i + 1] = x0 * s + x1 * c;
                }
            }
            RopeStyle::Neox => {
                for (i, &(c, s)) in table.iter().enumerate() {
                    let (x0, x1) = (head[i], head[i + self.half]);
                    head[i] = x0 * c - x1 * s;
                    head[i + self.half] = x0 * s + x1 * c;
                }
            }
        }
    }
}

/// `act(g)`, the gate's nonlinearity, as every path (dense, sparse, profiling) computes it.
#[inline]
pub fn activate(act: FfnActivation, g: f32) -> f32 {
    act.apply(g)
}

/// `gate[i] = act(gate[i]) * up[i]`, in place.
pub fn gated_activation(act: FfnActivation, gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = activate(act, *g) * u;
    }
}

pub use crate::plan::gelu_tanh;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_of_a_constant_vector_is_the_weight() {
        let x = vec![3.0f32; 8];
        let w: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let mut out = vec![0.0; 8];
        rms_norm(&x, &w, 0.0, &mut out);
        for (o, w) in out.iter().zip(&w) {
            assert!((o - w).abs() < 1e-6);
        }
    }

    #[test]
    fn rope_rotates_pairs_by_position_times_frequency() {
        let rope = RopeConfig {
            style: RopeStyle::Normal,
            n_dims: 4,
            freq_base: 100.0,
            freq_scale: 1.0,
            mscale: 1.0,
        };
        let mut table = RopeTable::default();
        table.fill(&rope, None, 3, 1);
        let mut head = [1.0, 0.0, 1.0, 0.0, 7.0];
        table.apply(RopeStyle::Normal, 0, &mut head);
        // pair 0 turns by 3 rad, pair 1 by 3 / 100^(2/4) = 0.3 rad; dim 4 is not rotated
        assert!((head[0] - 3f32.cos()).abs() < 1e-6 && (head[1] - 3f32.sin()).abs() < 1e-6);
        assert!((head[2] - 0.3f32.cos()).abs() < 1e-6 && (head[3] - 0.3f32.sin()).abs() < 1e-6);
        assert_eq!(head[4], 7.0);

        let mut neox = [1.0, 1.0, 0.0, 0.0];
        table.apply(RopeStyle::Neox, 0, &mut neox);
        assert!((neox[0] - 3f32.cos()).abs() < 1e-6 && (neox[2] - 3f32.sin()).abs() < 1e-6);
        assert!((neox[1] - 0.3f32.cos()).abs() < 1e-6 && (neox[3] - 0.3f32.sin()).abs() < 1e-6);
    }

    #[test]
    fn activations() {
        let mut g = [0.0f32, 2.0, -2.0];
        gated_activation(FfnActivation::Relu, &mut g, &[5.0, 3.0, 3.0]);
        assert_eq!(g, [0.0, 6.0, 0.0]);
        let mut g = [0.0f32, 10.0];
        gated_activation(FfnActivation::Silu, &mut g, &[1.0, 2.0]);
        assert_eq!(g[0], 0.0);
        assert!((g[1] - 2.0 * 10.0 / (1.0 + (-10.0f32).exp())).abs() < 1e-5);
    }

    /// The f16-table GELU stays within f16 rounding of the exact tanh form, and is exactly
    /// 0 and the identity past ±10.
    #[test]
    fn gelu_tanh_is_the_tanh_form_rounded_to_f16() {
        let exact = |x: f64| {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
        };
        for i in -1200..=1200 {
            let x = i as f32 / 100.0;
            let got = gelu_tanh(x) as f64;
            let want = exact(x as f64);
            // Input rounding to f16 (rel. 2^-11, times a slope below 1.13) and output rounding.
            let tol = 2e-3 * want.abs().max(x.abs() as f64) + 1e-4;
            assert!((got - want).abs() <= tol, "gelu({x}) = {got}, want {want}");
        }
        assert_eq!(gelu_tanh(-10.0), 0.0);
        assert_eq!(gelu_tanh(-50.0), 0.0);
        assert_eq!(gelu_tanh(12.5), 12.5);
        let mut g = [1.5f32, -20.0];
        gated_activation(FfnActivation::GeluTanh, &mut g, &[2.0, 3.0]);
        assert_eq!(g, [gelu_tanh(1.5) * 2.0, 0.0]);
    }
}
