//! Unit tests of the synthetic models' noise: the stream's jumps and the normal quantiles.
//! Streaming and planted frequencies are tested through the public API, in
//! `tests/synthetic_models.rs` (a forward pass needs `exec`, which sits above this module).

use super::layout::llama3_rope_factors;
use super::noise::{normal_quantile, Jumps, Noise};
use super::types::{fallback_type, more_bits};
use super::*;

#[test]
fn the_noise_stream_jumps_to_any_position() {
    let jumps = Jumps::new();
    let start = 0x1234_5678_9abc_def1;
    let mut n = Noise(start);
    for steps in 0..300u64 {
        assert_eq!(jumps.jump(start, steps), n.0, "{steps} steps");
        n.step();
    }
    // A far jump is the composition of two nearer ones.
    let far = (1u64 << 40) + 12_345;
    assert_eq!(
        jumps.jump(start, far),
        jumps.jump(jumps.jump(start, 1 << 40), 12_345)
    );
}

#[test]
fn normal_quantiles() {
    for (p, z) in [
        (0.5, 0.0),
        (0.975, 1.959_964),
        (0.9, 1.281_552),
        (0.999, 3.090_232),
    ] {
        assert!((normal_quantile(p) - z).abs() < 1e-5, "{p}");
        assert!((normal_quantile(1.0 - p) + z).abs() < 1e-5, "{p}");
    }
}

#[test]
fn more_bits_follows_llama_cpp() {
    // llama.cpp's use_more_bits over 8 and 32 layers.
    let eight: Vec<u32> = (0..8).filter(|&l| more_bits(l, 8)).collect();
    assert_eq!(eight, [0, 3, 6, 7]);
    let many: Vec<u32> = (0..32).filter(|&l| more_bits(l, 32)).collect();
    assert_eq!(
        many,
        [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    );
}

#[test]
fn rows_off_the_256_grid_fall_back_to_32_blocks() {
    assert_eq!(fallback_type(GgmlType::Q4_K, 512), GgmlType::Q4_K);
    assert_eq!(fallback_type(GgmlType::Q4_K, 640), GgmlType::Q5_0);
    assert_eq!(fallback_type(GgmlType::Q6_K, 896), GgmlType::Q8_0);
    assert_eq!(fallback_type(GgmlType::Q5_K, 320), GgmlType::Q5_1);
    assert_eq!(fallback_type(GgmlType::Q4_0, 640), GgmlType::Q4_0);
}

#[test]
fn llama3_rope_factors_span_one_to_the_factor() {
    let f = llama3_rope_factors(500_000.0, 128, 32.0, 1.0, 4.0, 8192);
    assert_eq!(f.len(), 64);
    // Short wavelengths keep their frequency, long ones are divided by the factor, and the
    // factors rise monotonically between.
    assert_eq!(f[0], 1.0);
    assert_eq!(f[63], 32.0);
    assert!(f.windows(2).all(|w| w[0] <= w[1]));
    assert!(f.iter().any(|&x| x > 1.0 && x < 32.0));
}

#[test]
fn every_arch_preset_has_its_tensors_and_types() {
    for info in ARCHS {
        let spec = SyntheticSpec::preset(info.name, Preset::Tiny).unwrap();
        let model = SyntheticModel::new(&spec).unwrap();
        let tensors = model.header().tensors();
        let find = |n: &str| tensors.iter().find(|t| t.name == n);
        let has = |n: &str| find(n).is_some();
        assert_eq!(
            has("blk.0.attn_qkv.weight"),
            info.fused_qkv,
            "{}",
            info.name
        );
        assert_eq!(has("blk.0.attn_q.weight"), !info.fused_qkv, "{}", info.name);
        assert_eq!(
            has("blk.0.ffn_gate.weight"),
            !info.fused_gate_up,
            "{}",
            info.name
        );
        assert_eq!(
            has("blk.1.attn_q_norm.weight"),
            info.qk_norm,
            "{}",
            info.name
        );
        assert_eq!(
            has("blk.1.post_ffw_norm.weight"),
            info.post_norms,
            "{}",
            info.name
        );
        assert_eq!(has("blk.0.attn_q.bias"), info.qkv_bias, "{}", info.name);
        assert_eq!(
            has("rope_freqs.weight"),
            matches!(info.rope_factors, RopeFactors::Llama3 { .. }),
            "{}",
            info.name
        );
        assert_eq!(
            has("rope_factors_short.weight"),
            matches!(info.rope_factors, RopeFactors::LongRope { .. }),
            "{}",
            info.name
        );
        if info.fused_qkv {
            assert_eq!(find("blk.0.attn_qkv.weight").unwrap().ty, GgmlType::Q5_K);
        }
        if info.fused_gate_up {
            let up = find("blk.0.ffn_up.weight").unwrap();
            assert_eq!(up.dims, [u64::from(spec.n_embd), 2 * u64::from(spec.n_ff)]);
        }
        // Q4_K_M: the last of two layers gives attn_v and ffn_down more bits; 256-wide rows
        // stay K-quants, others fall back.
        let ty = |n: &str| find(n).unwrap().ty;
        assert_eq!(ty("blk.1.ffn_down.weight"), GgmlType::Q6_K, "{}", info.name);
        assert_eq!(ty("blk.0.ffn_down.weight"), GgmlType::Q4_K, "{}", info.name);
        let wide = if spec.n_embd.is_multiple_of(256) {
            GgmlType::Q4_K
        } else {
            GgmlType::Q5_0
        };
        assert_eq!(ty("blk.0.ffn_up.weight"), wide, "{}", info.name);
        assert_eq!(ty("token_embd.weight"), GgmlType::Q8_0, "{}", info.name);
    }
}

#[test]
fn unknown_archs_and_impossible_shapes_are_refused() {
    let spec = SyntheticSpec {
        arch: "gpt-j",
        ..SyntheticSpec::default()
    };
    let e = SyntheticModel::new(&spec).err().expect("refused");
    assert!(e.to_string().contains("known: llama, llama3"), "{e}");
    let mut phi3 = SyntheticSpec::preset("phi3", Preset::Tiny).unwrap();
    phi3.head_dim = Some(32);
    assert!(SyntheticModel::new(&phi3).is_err());
    phi3.head_dim = None;
    phi3.relu_active_share = Some(0.1);
    assert!(SyntheticModel::new(&phi3).is_err());
}
