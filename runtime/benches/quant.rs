//! Quant kernel throughput, single thread: `cargo bench -p conductor-runtime --bench quant`.
//!
//! A std::time harness (no criterion, to keep build time down): each number is the median over
//! repetitions of a timed batch. Optional args filter by substring (e.g. `-- matmul`).
//!
//! * `hot`: the same matrix again and again (it stays in L1/L2 when small).
//! * `stream`: rotates through copies totalling ~96 MB, the weight bytes one decode token reads
//!   for SmolLM2-135M, so weights come from L3/DRAM as in real decoding.
//!
//! `axpy_rows` (sparse FFN down projection over the transposed matrix) is shown next to the dense
//! `matvec` of the down projection it replaces; its GB/s counts the weight bytes of the active
//! rows only.

use conductor_runtime::quant::interleave::interleave;
use conductor_runtime::quant::{activation_type, GgmlType, Isa, Kernels, Layout, MatRef};
use conductor_runtime::sample::SplitMix64;
use std::hint::black_box;
use std::time::Duration;

fn data(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    (0..n).map(|_| rng.signed_unit()).collect()
}

fn quantized(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let x = data(seed, rows * cols);
    let rb = ty.bytes_for(cols as u64).unwrap() as usize;
    let mut out = vec![0u8; rows * rb];
    for (src, dst) in x.chunks(cols).zip(out.chunks_mut(rb)) {
        conductor_runtime::quant::quantize_row(ty, src, dst).unwrap();
    }
    out
}

/// This thread's CPU time: on a shared machine, time spent preempted does not count.
fn cpu_secs() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// (median, min) thread-CPU seconds per call of `f`, over `reps` batches sized to take
/// ~`target` each. The machine is shared: the median is the headline, the min shows the
/// quiet-machine speed (other threads still share caches and memory bandwidth).
fn median_secs(mut f: impl FnMut(), target: Duration, reps: usize) -> (f64, f64) {
    f();
    let t = cpu_secs();
    f();
    let one = (cpu_secs() - t).max(1e-9);
    let iters = ((target.as_secs_f64() / one) as usize).clamp(1, 1_000_000);
    let mut v: Vec<f64> = (0..reps)
        .map(|_| {
            let t = cpu_secs();
            for _ in 0..iters {
                f();
            }
            (cpu_secs() - t) / iters as f64
        })
        .collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v[v.len() / 2], v[0])
}

fn main() {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let want = |name: &str| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()));
    let kernels = Kernels::available();
    println!(
        "isas: {:?}; best: {}",
        kernels.iter().map(|k| k.isa().name()).collect::<Vec<_>>(),
        Kernels::best().isa()
    );
    let reps = 7;
    let target = Duration::from_millis(60);

    println!(
        "\n{:<34} {:>9} {:>10} {:>9} {:>9} {:>11}",
        "matvec (rows x cols)", "isa", "us/call", "GB/s", "GMAC/s", "GMAC/s@min"
    );
    let shapes = [
        (1536, 576),
        (576, 1536),
        (576, 576),
        (192, 576),
        (49152, 576),
    ];
    // SmolLM2's shapes for its types; a 1B-class Llama-3's (rows of 2048 and 8192 columns) for
    // the types of its Q4_K_M and Q4_0 files.
    let k_shapes = [(2048, 2048), (8192, 2048), (2048, 8192)];
    let cases = [GgmlType::Q4_1, GgmlType::Q8_0]
        .into_iter()
        .flat_map(|ty| shapes.map(|s| (ty, s)))
        .chain(
            [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q4_0]
                .into_iter()
                .flat_map(|ty| k_shapes.map(|s| (ty, s))),
        );
    for (ty, (rows, cols)) in cases {
        // Q4_K and Q6_K also interleaved 8 rows by 8 (`Layout::X8`, what a model loads for
        // decode).
        let layouts: &[Layout] = match ty {
            GgmlType::Q4_K | GgmlType::Q6_K => &[Layout::Rows, Layout::X8 { skip: 0 }],
            _ => &[Layout::Rows],
        };
        for &layout in layouts {
            let mut w = quantized(ty, rows, cols, 1);
            if layout != Layout::Rows {
                w = interleave(MatRef::new(ty, &w, rows, cols).unwrap()).unwrap();
            }
            let label = match layout {
                Layout::Rows => ty.to_string(),
                Layout::X8 { .. } => format!("{ty}-x8"),
            };
            let x = data(2, cols);
            // Enough copies to make ~96 MB per rotation.
            let copies = (96 << 20) / w.len() + 1;
            let stream: Vec<Vec<u8>> = (0..copies).map(|_| w.clone()).collect();
            for mode in ["hot", "stream"] {
                let name = format!("matvec {label} {rows}x{cols} {mode}");
                if !want(&name) {
                    continue;
                }
                for k in &kernels {
                    let at = activation_type(ty);
                    let mut a = vec![0u8; at.bytes_for(cols as u64).unwrap() as usize];
                    k.quantize_activations(ty, &x, &mut a);
                    let mut out = vec![0f32; rows];
                    let mut i = 0;
                    let (secs, min) = median_secs(
                        || {
                            let data = if mode == "hot" {
                                &w
                            } else {
                                i = (i + 1) % stream.len();
                                &stream[i]
                            };
                            let m = MatRef {
                                ty,
                                data,
                                rows,
                                cols,
                                layout,
                            };
                            k.matvec(m, 0..cols, black_box(&a), &mut out);
                            black_box(&out);
                        },
                        target,
                        reps,
                    );
                    println!(
                        "{:<34} {:>9} {:>10.2} {:>9.2} {:>9.2} {:>11.2}",
                        name,
                        k.isa().name(),
                        secs * 1e6,
                        w.len() as f64 / secs / 1e9,
                        (rows * cols) as f64 / secs / 1e9,
                        (rows * cols) as f64 / min / 1e9
                    );
                }
            }
        }
    }

    sparse_down(&kernels, &want);
    few_tokens(&want);

    println!(
        "\n{:<34} {:>9} {:>10} {:>9} {:>11}",
        "matmul (rows x cols x tokens)", "isa", "ms/call", "GMAC/s", "GMAC/s@min"
    );
    let matmul_types = [
        (GgmlType::Q4_1, 576),
        (GgmlType::Q8_0, 576),
        (GgmlType::Q4_0, 576),
        (GgmlType::Q5_0, 576),
        (GgmlType::Q4_K, 512),
        (GgmlType::Q5_K, 512),
        (GgmlType::Q6_K, 512),
    ]
    .into_iter()
    .map(|(ty, cols)| (ty, 1536, cols, Layout::Rows))
    .chain([
        (GgmlType::Q4_K, 1536, 512, Layout::X8 { skip: 0 }),
        (GgmlType::Q6_K, 1536, 512, Layout::X8 { skip: 0 }),
        // Qwen2.5-Coder-1.5B's FFN matrices as its Q4_K_M file loads them (gate and up;
        // down in Q4_K or Q6_K by layer): what issue 41's share of the int8 peak is about.
        (GgmlType::Q4_K, 8960, 1536, Layout::X8 { skip: 0 }),
        (GgmlType::Q4_K, 1536, 8960, Layout::X8 { skip: 0 }),
        (GgmlType::Q6_K, 1536, 8960, Layout::X8 { skip: 0 }),
    ]);
    for (ty, rows, cols, layout) in matmul_types {
        let n = 512;
        let ffn = rows * cols > 1536 * 576;
        let label = match layout {
            Layout::Rows => ty.to_string(),
            Layout::X8 { .. } => format!("{ty}-x8"),
        };
        let name = format!("matmul {label} {rows}x{cols}x{n}");
        // (Types a build does not support are skipped, so this file also measures older builds.)
        if !want(&name) || !ty.is_supported() {
            continue;
        }
        let mut w = quantized(ty, rows, cols, 3);
        if layout != Layout::Rows {
            w = interleave(MatRef::new(ty, &w, rows, cols).unwrap()).unwrap();
        }
        let x = data(4, cols * n);
        // (The scalar kernels would take minutes over the FFN shapes.)
        for k in kernels.iter().filter(|k| !ffn || k.isa() != Isa::Scalar) {
            let at = activation_type(ty);
            let arow = at.bytes_for(cols as u64).unwrap() as usize;
            let mut acts = vec![0u8; arow * n];
            for (src, dst) in x.chunks(cols).zip(acts.chunks_mut(arow)) {
                k.quantize_activations(ty, src, dst);
            }
            let mut out = vec![0f32; rows * n];
            let (secs, min) = median_secs(
                || {
                    let m = MatRef {
                        ty,
                        data: &w,
                        rows,
                        cols,
                        layout,
                    };
                    k.matmul(m, black_box(&acts), n, &mut out, rows);
                    black_box(&out);
                },
                Duration::from_millis(300),
                5,
            );
            println!(
                "{:<34} {:>9} {:>10.2} {:>9.2} {:>11.2}",
                name,
                k.isa().name(),
                secs * 1e3,
                (rows * cols * n) as f64 / secs / 1e9,
                (rows * cols * n) as f64 / min / 1e9
            );
        }
    }

    println!(
        "\n{:<34} {:>9} {:>10} {:>9}",
        "other", "isa", "us/call", "GB/s in"
    );
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_K] {
        let n = 1536;
        let name = format!("quantize_activations {ty} n={n}");
        if !want(&name) {
            continue;
        }
        let x = data(5, n);
        for k in &kernels {
            let at = activation_type(ty);
            let mut a = vec![0u8; at.bytes_for(n as u64).unwrap() as usize];
            let (secs, _) = median_secs(
                || k.quantize_activations(ty, black_box(&x), &mut a),
                target,
                reps,
            );
            println!(
                "{:<34} {:>9} {:>10.3} {:>9.2}",
                name,
                k.isa().name(),
                secs * 1e6,
                (4 * n) as f64 / secs / 1e9
            );
        }
    }
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q5_K,
        GgmlType::Q3_K,
        GgmlType::Q2_K,
        GgmlType::IQ4_XS,
        GgmlType::Q5_0,
        GgmlType::Q4_0,
        GgmlType::F16,
        GgmlType::BF16,
    ] {
        let (rows, cols) = (576, 1536);
        let name = format!("matvec {ty} {rows}x{cols} hot");
        if !want(&name) || !ty.is_supported() {
            continue;
        }
        let w = quantized(ty, rows, cols, 6);
        let x = data(7, cols);
        for k in &kernels {
            let at = activation_type(ty);
            let mut a = vec![0u8; at.bytes_for(cols as u64).unwrap() as usize];
            k.quantize_activations(ty, &x, &mut a);
            let mut out = vec![0f32; rows];
            let (secs, min) = median_secs(
                || {
                    let m = MatRef::new(ty, &w, rows, cols).unwrap();
                    k.matvec(m, 0..cols, black_box(&a), &mut out);
                },
                target,
                reps,
            );
            println!(
                "{:<34} {:>9} {:>10.2} {:>9.2} {:>9.2} {:>11.2}",
                name,
                k.isa().name(),
                secs * 1e6,
                w.len() as f64 / secs / 1e9,
                (rows * cols) as f64 / secs / 1e9,
                (rows * cols) as f64 / min / 1e9
            );
        }
    }
}

/// (median, 10th percentile) thread-CPU seconds of single calls of `f` over `calls` calls. For kernels of
/// tens of microseconds this is robust on a loaded machine: a call preempted mid-way lands in
/// the tail instead of inflating a whole batch.
fn per_call_secs(mut f: impl FnMut(), calls: usize) -> (f64, f64) {
    for _ in 0..calls / 10 + 1 {
        f();
    }
    let mut v: Vec<f64> = (0..calls)
        .map(|_| {
            let t = cpu_secs();
            f();
            cpu_secs() - t
        })
        .collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v[v.len() / 2], v[v.len() / 10])
}

/// Sparse FFN decode: `axpy_rows` of 768 of 1536 neurons over a transposed 1536 x 576 down
/// projection, and the dense 576 x 1536 Q4_1 `matvec` it replaces.
fn sparse_down(kernels: &[Kernels], want: &dyn Fn(&str) -> bool) {
    let (n_ff, n_embd, active) = (1536, 576, 768);
    println!(
        "\n{:<34} {:>9} {:>10} {:>9} {:>11}",
        "sparse down (per call)", "isa", "us median", "GB/s", "GB/s@p10"
    );
    // A sorted random half of the neurons (as a predictor's top-k would give).
    let mut rng = SplitMix64::new(1);
    let mut idx: Vec<u32> = (0..n_ff as u32).collect();
    for i in (1..idx.len()).rev() {
        idx.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut neurons = idx[..active].to_vec();
    neurons.sort_unstable();
    let coefs = data(8, active);
    for ty in [GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::Q4_0] {
        let w = quantized(ty, n_ff, n_embd, 9);
        let row = w.len() / n_ff;
        let copies = (96 << 20) / w.len() + 1;
        let stream: Vec<Vec<u8>> = (0..copies).map(|_| w.clone()).collect();
        for mode in ["hot", "stream"] {
            let name = format!("axpy_rows {ty} {active}/{n_ff}x{n_embd} {mode}");
            if !want(&name) {
                continue;
            }
            for k in kernels {
                let mut out = vec![0f32; n_embd];
                let mut i = 0;
                let (secs, p10) = per_call_secs(
                    || {
                        let data = if mode == "hot" {
                            &w
                        } else {
                            i = (i + 1) % stream.len();
                            &stream[i]
                        };
                        let m = MatRef::new(ty, data, n_ff, n_embd).unwrap();
                        k.axpy_rows(m, black_box(&neurons), black_box(&coefs), &mut out);
                        black_box(&out);
                    },
                    2000,
                );
                let bytes = (active * row) as f64;
                println!(
                    "{:<34} {:>9} {:>10.2} {:>9.2} {:>11.2}",
                    name,
                    k.isa().name(),
                    secs * 1e6,
                    bytes / secs / 1e9,
                    bytes / p10 / 1e9
                );
            }
        }
    }
    // The dense down projection: n_embd rows of n_ff.
    let ty = GgmlType::Q4_1;
    let w = quantized(ty, n_embd, n_ff, 10);
    let x = data(11, n_ff);
    let copies = (96 << 20) / w.len() + 1;
    let stream: Vec<Vec<u8>> = (0..copies).map(|_| w.clone()).collect();
    for mode in ["hot", "stream"] {
        let name = format!("dense matvec {ty} {n_embd}x{n_ff} {mode}");
        if !want(&name) {
            continue;
        }
        for k in kernels {
            let at = activation_type(ty);
            let mut a = vec![0u8; at.bytes_for(n_ff as u64).unwrap() as usize];
            k.quantize_activations(ty, &x, &mut a);
            let mut out = vec![0f32; n_embd];
            let mut i = 0;
            let (secs, p10) = per_call_secs(
                || {
                    let data = if mode == "hot" {
                        &w
                    } else {
                        i = (i + 1) % stream.len();
                        &stream[i]
                    };
                    let m = MatRef::new(ty, data, n_embd, n_ff).unwrap();
                    k.matvec(m, 0..n_ff, black_box(&a), &mut out);
                    black_box(&out);
                },
                2000,
            );
            println!(
                "{:<34} {:>9} {:>10.2} {:>9.2} {:>11.2}",
                name,
                k.isa().name(),
                secs * 1e6,
                w.len() as f64 / secs / 1e9,
                w.len() as f64 / p10 / 1e9
            );
        }
    }
}

/// A step of a few tokens against one of one token (speculative decoding verifies its drafts
/// in such steps): Qwen2.5-Coder-1.5B's FFN matrices as it loads them (interleaved), the best
/// ISA, weights rotated through copies of ~250 MB so that they come from DRAM as in decode.
/// `x1` is the time of the n-token product over that of one token.
fn few_tokens(want: &dyn Fn(&str) -> bool) {
    let k = Kernels::best();
    println!(
        "\n{:<34} {:>9} {:>10} {:>9}",
        "few tokens (rows x cols x tokens)", "isa", "us/call", "x1"
    );
    for (ty, rows, cols) in [(GgmlType::Q4_K, 8960, 1536), (GgmlType::Q6_K, 1536, 8960)] {
        if !want(&format!("few {ty}")) {
            continue;
        }
        let file = quantized(ty, rows, cols, 8);
        let w = interleave(MatRef::new(ty, &file, rows, cols).unwrap()).unwrap();
        let copies: Vec<Vec<u8>> = (0..(250 << 20) / w.len() + 1).map(|_| w.clone()).collect();
        let at = activation_type(ty);
        let arow = at.bytes_for(cols as u64).unwrap() as usize;
        let mut one = 0.0;
        for n in 1..=9 {
            let x = data(9, cols * n);
            let mut acts = vec![0u8; arow * n];
            for (src, dst) in x.chunks(cols).zip(acts.chunks_mut(arow)) {
                k.quantize_activations(ty, src, dst);
            }
            let mut out = vec![0f32; rows * n];
            let mut i = 0;
            let (secs, _) = median_secs(
                || {
                    i = (i + 1) % copies.len();
                    let m = MatRef {
                        ty,
                        data: &copies[i],
                        rows,
                        cols,
                        layout: Layout::X8 { skip: 0 },
                    };
                    k.matmul(m, black_box(&acts), n, &mut out, rows);
                    black_box(&out);
                },
                Duration::from_millis(200),
                5,
            );
            if n == 1 {
                one = secs;
            }
            println!(
                "{:<34} {:>9} {:>10.1} {:>9.2}",
                format!("few {ty}-x8 {rows}x{cols}x{n}"),
                k.isa().name(),
                secs * 1e6,
                secs / one
            );
        }
    }
}
