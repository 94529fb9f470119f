//! Unit tests of the synthetic models' noise: the stream's jumps and the normal quantiles.
//! Streaming and planted frequencies are tested through the public API, in
//! `tests/synthetic_models.rs` (a forward pass needs `exec`, which sits above this module).

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
