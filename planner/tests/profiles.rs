//! The profiles in `profiles/`: the PowerInfer-2 phones' parse, validate, keep the paper's figures
//! and the relations their comments derive, and every number has its source above it; the
//! measured build machine's parses and validates.

use conductor_runtime::plan::{CoreClassProfile, HardwareProfile, StorageRate};
use conductor_runtime::quant::GgmlType;

const ONEPLUS_12: &str = include_str!("../../profiles/oneplus-12.toml");
const ONEPLUS_ACE_2: &str = include_str!("../../profiles/oneplus-ace-2.toml");
const BUILD_MACHINE: &str = include_str!("../../profiles/build-machine.toml");

/// MACs per token of a 7B model, as the profiles' comments use it.
const MACS_7B: f64 = 6.7e9;

const TYPES: [GgmlType; 5] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs()
}

fn class<'a>(p: &'a HardwareProfile, name: &str) -> &'a CoreClassProfile {
    p.core_class(name)
        .unwrap_or_else(|| panic!("{}: no class {name}", p.name))
}

fn rate(rates: &[StorageRate], size: u64, qd: u32) -> f64 {
    rates
        .iter()
        .find(|r| r.size_bytes == size && r.queue_depth == qd)
        .unwrap_or_else(|| panic!("no rate for {size} B at QD{qd}"))
        .mbps
}

/// Relations both phones keep: three classes on distinct cores, faster classes faster
/// everywhere, streamed never above in-cache, larger reads and deeper queues never slower.
fn check_common(p: &HardwareProfile, counts: [usize; 3]) {
    let names = ["big", "mid", "little"];
    let classes: Vec<&CoreClassProfile> = names.iter().map(|n| class(p, n)).collect();
    let mut ids: Vec<u32> = classes.iter().flat_map(|c| c.cores.clone()).collect();
    for (c, n) in classes.iter().zip(counts) {
        assert_eq!(c.cores.len(), n, "{}: cores of {}", p.name, c.name);
    }
    ids.sort_unstable();
    let n = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), n, "{}: a core id is in two classes", p.name);
    assert_eq!(
        ids,
        (0..n as u32).collect::<Vec<_>>(),
        "{}: core ids",
        p.name
    );

    for pair in classes.windows(2) {
        let (fast, slow) = (pair[0], pair[1]);
        let what = format!("{}: {} vs {}", p.name, fast.name, slow.name);
        assert!(fast.freq_ghz > slow.freq_ghz, "{what}: clock");
        assert!(
            fast.attn_decode_ns_per_head_pos < slow.attn_decode_ns_per_head_pos,
            "{what}: decode attention"
        );
        assert!(
            fast.attn_prefill_gflops > slow.attn_prefill_gflops,
            "{what}: prefill attention"
        );
        assert!(
            fast.finish_ns_per_element < slow.finish_ns_per_element,
            "{what}: finish"
        );
        for ty in TYPES {
            let (f, s) = (fast.rates(ty).unwrap(), slow.rates(ty).unwrap());
            assert!(f.matvec_gmacs > s.matvec_gmacs, "{what}: {ty} matvec");
            assert!(
                f.matvec_stream_gmacs > s.matvec_stream_gmacs,
                "{what}: {ty} stream"
            );
            assert!(f.matmul_gmacs > s.matmul_gmacs, "{what}: {ty} matmul");
        }
    }
    for c in &classes {
        for ty in TYPES {
            let r = c
                .rates(ty)
                .unwrap_or_else(|| panic!("{}: {} has no {ty} rates", p.name, c.name));
            assert!(
                r.matvec_stream_gmacs <= r.matvec_gmacs,
                "{}: {} {ty}: streamed above in cache",
                p.name,
                c.name
            );
        }
    }

    assert!(p.memory.per_core_gbs < p.memory.bandwidth_gbs, "{}", p.name);
    assert!(p.npu.is_some(), "{}: the phones have an NPU", p.name);

    let s = &p.storage;
    assert!(s.single_queue, "{}: UFS has one command queue", p.name);
    let k = 1024;
    assert!(
        rate(&s.sequential, 512 * k, 1) > rate(&s.sequential, 4 * k, 1),
        "{}: sequential 512K vs 4K",
        p.name
    );
    for w in s.sequential.windows(2) {
        assert!(w[1].size_bytes > w[0].size_bytes && w[1].mbps >= w[0].mbps);
    }
    for size in [4, 8, 16, 32, 64, 128, 256, 512].map(|s| s * k) {
        let mut last = 0.0;
        for qd in [1, 2, 4, 8, 32] {
            let r = rate(&s.random, size, qd);
            assert!(r >= last, "{}: random {size} B slower at QD{qd}", p.name);
            last = r;
        }
        // One 4 KiB read at QD1 takes the latency.
        if size == 4 * k {
            let us = size as f64 / (rate(&s.random, size, 1) * 1e6) * 1e6;
            assert!(close(us, s.latency_us, 0.01), "{}: QD1 vs latency", p.name);
        }
    }
}

#[test]
fn oneplus_12_keeps_the_papers_figures() {
    let p = HardwareProfile::from_toml(ONEPLUS_12).unwrap();
    check_common(&p, [1, 5, 2]);
    assert_eq!(class(&p, "big").cores, vec![7]);
    for (name, ghz) in [("big", 3.3), ("mid", 3.0), ("little", 2.2)] {
        assert_eq!(class(&p, name).freq_ghz, ghz, "paper: {name} clock");
    }
    assert_eq!(p.memory.bandwidth_gbs, 43.9, "paper: CPU memory bandwidth");

    // NPU: 770 tok/s of a 7B INT4 model.
    let npu = p.npu.as_ref().unwrap();
    for s in &npu.shapes {
        assert!(close(s.gmacs, 770.0 * MACS_7B / 1e9, 0.005), "{s:?}");
    }
    // CPU: Conductor's NEON dotprod kernels from instruction counts (docs/aarch64.md, "CPU
    // rates from instruction counts"): Q4_0 matvec, 128 MACs per 9.75 / 19.5 / 39 cycles on the
    // X4 / A720 / A520, at the paper's clocks.
    for (name, cycles, ghz) in [
        ("big", 9.75, 3.3),
        ("mid", 19.5, 3.0),
        ("little", 39.0, 2.2),
    ] {
        let r = class(&p, name).rates(GgmlType::Q4_0).unwrap();
        assert!(
            close(r.matvec_gmacs, 128.0 / cycles * ghz, 0.001),
            "{name}: {}",
            r.matvec_gmacs
        );
    }
    // They are throughput bounds: all cores together above the paper's llama.cpp-class CPU
    // prefill (8 tok/s of the same model; Q4_0 stands for INT4).
    let all_cores: f64 = p
        .core_classes
        .iter()
        .map(|c| c.cores.len() as f64 * c.rates(GgmlType::Q4_0).unwrap().matmul_gmacs)
        .sum();
    assert!(all_cores > 8.0 * MACS_7B / 1e9, "{all_cores}");

    // Storage: 450 MB/s at 4 KB to 4 GB/s at 512 KB sequential; 4 KB random < 850 MB/s.
    let s = &p.storage;
    assert!(close(rate(&s.sequential, 4096, 1), 450.0, 0.005));
    assert!(close(rate(&s.sequential, 512 << 10, 1), 4000.0, 0.005));
    let r4 = rate(&s.random, 4096, 32);
    assert!(r4 < 850.0 && r4 > 700.0, "{r4}");
}

#[test]
fn oneplus_ace_2_is_the_slower_phone() {
    let ace = HardwareProfile::from_toml(ONEPLUS_ACE_2).unwrap();
    let op12 = HardwareProfile::from_toml(ONEPLUS_12).unwrap();
    check_common(&ace, [1, 3, 4]);
    assert_eq!(class(&ace, "big").cores, vec![7]);
    for (name, ghz) in [("big", 3.2), ("mid", 2.75), ("little", 2.0)] {
        assert_eq!(class(&ace, name).freq_ghz, ghz, "public spec: {name} clock");
    }
    // UFS 3.1's public 2100 MB/s sequential.
    assert!(close(
        rate(&ace.storage.sequential, 512 << 10, 1),
        2100.0,
        0.005
    ));
    // The older phone is slower at everything it shares with the OnePlus 12.
    assert!(ace.memory.bandwidth_gbs < op12.memory.bandwidth_gbs);
    assert!(ace.memory.llc_bytes < op12.memory.llc_bytes);
    assert!(ace.storage.latency_us > op12.storage.latency_us);
    for (a, o) in ace.storage.sequential.iter().zip(&op12.storage.sequential) {
        assert_eq!(a.size_bytes, o.size_bytes);
        assert!(a.mbps < o.mbps, "sequential {} B", a.size_bytes);
    }
    let (a, o) = (ace.npu.as_ref().unwrap(), op12.npu.as_ref().unwrap());
    assert!(a.shapes[0].gmacs < o.shapes[0].gmacs);
    for name in ["big", "mid", "little"] {
        let (a, o) = (class(&ace, name), class(&op12, name));
        let (a, o) = (
            a.rates(GgmlType::Q4_0).unwrap(),
            o.rates(GgmlType::Q4_0).unwrap(),
        );
        assert!(a.matmul_gmacs < o.matmul_gmacs, "{name}");
    }
}

/// Every line that sets a number has a comment above it in its paragraph (the lines between
/// blank lines): its source. Table headers and other keys may sit between the two.
fn check_sources(name: &str, text: &str) {
    let lines: Vec<&str> = text.lines().collect();
    let sets_number = |l: &str| {
        let Some((key, value)) = l.split_once('=') else {
            return false;
        };
        let (key, value) = (key.trim(), value.trim());
        !key.starts_with('#')
            && !key.starts_with('[')
            && value.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '[')
    };
    for (i, line) in lines.iter().enumerate() {
        if !sets_number(line) {
            continue;
        }
        let sourced = lines[..i]
            .iter()
            .rev()
            .take_while(|l| !l.trim().is_empty())
            .any(|l| l.trim_start().starts_with('#'));
        assert!(sourced, "{name}:{}: `{line}` has no source comment", i + 1);
    }
}

#[test]
fn every_number_has_its_source() {
    check_sources("oneplus-12.toml", ONEPLUS_12);
    check_sources("oneplus-ace-2.toml", ONEPLUS_ACE_2);
    // The checker itself fails on an uncommented number.
    let bad = "# a source\nx = 1\n\ny = 2\n";
    assert!(std::panic::catch_unwind(|| check_sources("bad", bad)).is_err());
}

#[test]
fn the_measured_build_machine_profile_validates() {
    let p = HardwareProfile::from_toml(BUILD_MACHINE).unwrap();
    assert!(p.source.starts_with("measured by conductor profile-hw on "));
    assert!(p.npu.is_none());
    for c in &p.core_classes {
        for ty in TYPES {
            assert!(c.rates(ty).is_some(), "{}: {ty}", c.name);
        }
    }
}
