//! The noise the weights are made of: a xorshift stream that can jump to any position, seeds
//! for planted gates, and the normal quantile.

/// Deterministic normal-ish noise (sum of uniforms), independent of any crate's RNG versions.
pub(super) struct Noise(pub(super) u64);

impl Noise {
    /// xorshift64: linear over GF(2), so it can jump ahead ([`Jumps`]).
    pub(super) fn step(&mut self) {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
    }

    fn uniform(&mut self) -> f32 {
        self.step();
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }

    /// Four steps of the stream.
    pub(super) fn normal(&mut self, std: f32) -> f32 {
        (self.uniform() + self.uniform() + self.uniform() + self.uniform()) * std * 1.732
    }
}

/// Steps of the noise stream one normal value takes.
pub(super) const STEPS_PER_NORMAL: u64 = 4;

/// A 64×64 matrix over GF(2): entry `i` is the image of bit `i`.
type Gf2 = [u64; 64];

fn gf2_apply(m: &Gf2, mut v: u64) -> u64 {
    let mut r = 0;
    while v != 0 {
        r ^= m[v.trailing_zeros() as usize];
        v &= v - 1;
    }
    r
}

/// The noise step raised to every power of two: jumping `n` steps costs one matrix-vector
/// product per set bit of `n`, however far.
pub(super) struct Jumps(Vec<Gf2>);

impl Jumps {
    pub(super) fn new() -> Self {
        let mut step = [0u64; 64];
        for (i, m) in step.iter_mut().enumerate() {
            let mut n = Noise(1 << i);
            n.step();
            *m = n.0;
        }
        let mut powers = vec![step];
        for k in 1..64 {
            let p = &powers[k - 1];
            let mut sq = [0u64; 64];
            for (s, &col) in sq.iter_mut().zip(p.iter()) {
                *s = gf2_apply(p, col);
            }
            powers.push(sq);
        }
        Jumps(powers)
    }

    pub(super) fn jump(&self, mut state: u64, steps: u64) -> u64 {
        for (k, m) in self.0.iter().enumerate() {
            if steps >> k & 1 == 1 {
                state = gf2_apply(m, state);
            }
        }
        state
    }
}

/// splitmix64 of a key: seeds for the per-layer and per-row streams of planted gates.
pub(super) fn mix(key: u64) -> u64 {
    let mut z = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) | 1
}

/// The standard normal quantile Φ⁻¹(p), 0 < p < 1 (Acklam's rational approximation, relative
/// error below 1.2e-9).
pub(super) fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}
