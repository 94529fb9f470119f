//! Unit tests of `convert`: a tiny generated model keeps every FFN row bit for bit, and what
//! cannot be converted is refused.

use super::*;
use crate::gguf::GgufFile;
use crate::quant::{row_bytes, Layout, MatRef};
use crate::store::{DownLayout, StoreInfo};
use crate::synthetic::{synthetic_model, SyntheticSpec};
use std::path::PathBuf;

/// A scratch directory for one test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("conductor-store-unit-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Converts a model generated from `spec` with `options`; checks that every bundle holds the
/// source's gate and up rows bit for bit, `down(bundle, neuron, e)` (the bytes of value `e` of
/// the neuron's down part, for block-columns, or the neuron's down column for neuron columns)
/// as the source has them, zero padding, and its checksum; the other tensors are copied as
/// they were.
fn check_convert(tag: &str, spec: &SyntheticSpec, options: &ConvertOptions) {
    let dir = Scratch::new(tag);
    let src = dir.0.join("tiny.gguf");
    let dst = dir.0.join("tiny-store.gguf");
    let bytes = synthetic_model(spec).unwrap().to_bytes().unwrap();
    std::fs::write(&src, &bytes).unwrap();
    let summary = convert(&src, &dst, options, &mut |_, _| {}).unwrap();
    // Not twice over the same file.
    assert!(matches!(
        convert(&src, &dst, options, &mut |_, _| {}),
        Err(ConvertError::Store(StoreError::Output { .. }))
    ));
    let source = GgufFile::open(&src).unwrap();
    let store = GgufFile::open(&dst).unwrap();
    let info = StoreInfo::from_gguf(&store, spec.n_embd, spec.n_ff, spec.n_layer)
        .unwrap()
        .unwrap();
    assert_eq!(info.layout, summary.layout);
    assert_eq!(info.down_types, summary.down_types);
    assert_eq!(Some(info.layout.down_layout), options.down_layout);
    assert_eq!(info.source_crc32, crc32fast::hash(&bytes));
    assert_eq!(info.source_name, "tiny.gguf");
    let ffn = |l: u32, t: &str| {
        let t = source.tensor(&format!("blk.{l}.{t}.weight")).unwrap();
        (t.ty, source.tensor_data(t))
    };
    let (embd, ff) = (spec.n_embd as usize, spec.n_ff as usize);
    let mut bundles = 0;
    for l in 0..spec.n_layer {
        let layout = &info.layout_of(l);
        let t = store.tensor(&bundle_tensor_name(l)).unwrap();
        let data = store.tensor_data(t);
        let (gate_ty, gate) = ffn(l, "ffn_gate");
        let (up_ty, up) = ffn(l, "ffn_up");
        let (down_ty, down) = ffn(l, "ffn_down");
        let (gr, ur) = (
            row_bytes(gate_ty, embd).unwrap(),
            row_bytes(up_ty, embd).unwrap(),
        );
        for b in 0..layout.n_bundles {
            let bundle = &data[(b as u64 * layout.stride) as usize..][..layout.stride as usize];
            let n = layout.neurons_of(b);
            let (i, m) = (n.start as usize, n.len());
            let payload = layout.payload_bytes(m as u32);
            let r = layout.split(b, bundle);
            // Interleaved where the options, the type and whole groups of rows allow it.
            for part in [&r.gate, &r.up, &r.down] {
                let x8 = options.interleave
                    && layout.down_layout == DownLayout::BlockColumns
                    && crate::quant::interleave::interleavable(part.ty)
                    && part.rows % 8 == 0;
                assert_eq!(
                    matches!(part.layout, Layout::X8 { .. }),
                    x8,
                    "{:?} part of {l}/{b}",
                    part.ty
                );
            }
            let (gate_rows, up_rows) = (in_rows(&r.gate), in_rows(&r.up));
            assert_eq!(gate_rows, &gate[i * gr..(i + m) * gr], "gate {l}/{b}");
            assert_eq!(up_rows, &up[i * ur..(i + m) * ur], "up {l}/{b}");
            match layout.down_layout {
                DownLayout::BlockColumns => {
                    // Row e of the bundle's down part: columns i..i+m of the source's row e.
                    let row = row_bytes(down_ty, ff).unwrap();
                    let (bs, ts) = (down_ty.block_size(), down_ty.type_size());
                    let part = row_bytes(down_ty, m).unwrap();
                    let down_rows = in_rows(&r.down);
                    for e in 0..embd {
                        let from = e * row + i / bs * ts;
                        assert_eq!(
                            down_rows[e * part..][..part],
                            down[from..from + part],
                            "down row {e} of {l}/{b}"
                        );
                    }
                }
                DownLayout::NeuronColumns => {
                    // f32 columns, transposed: value e of neuron j's column is the source's
                    // row e, column j, bit for bit.
                    assert_eq!((down_ty, layout.down_ty), (GgmlType::F32, GgmlType::F32));
                    for j in 0..m {
                        for e in 0..embd {
                            assert_eq!(
                                f32_at(r.down.data, j * embd + e),
                                f32_at(down, e * ff + i + j),
                                "down column of neuron {} of layer {l}, value {e}",
                                i + j
                            );
                        }
                    }
                }
            }
            assert!(bundle[payload..].iter().all(|&x| x == 0), "padding {l}/{b}");
            info.check_bundle(l, b, &bundle[..payload]).unwrap();
            bundles += 1;
        }
    }
    assert_eq!(bundles, spec.n_layer * info.layout.n_bundles);
    // Everything else as it was; the FFN matrices gone.
    for t in source.tensors() {
        match store.tensor(&t.name) {
            Some(s) => assert_eq!(store.tensor_data(s), source.tensor_data(t), "{}", t.name),
            None => assert!(t.name.contains(".ffn_"), "{} was dropped", t.name),
        }
    }
    assert_eq!(
        summary.bundle_bytes,
        info.layout.layer_bytes() * u64::from(spec.n_layer)
    );
}

/// A part's bytes in the row layout (taken back out of its groups when interleaved).
fn in_rows(part: &MatRef<'_>) -> Vec<u8> {
    match part.layout {
        Layout::Rows => part.data.to_vec(),
        Layout::X8 { .. } => (0..part.rows)
            .flat_map(|r| crate::quant::interleave::row_bytes_of(*part, r).unwrap())
            .collect(),
    }
}

/// The 4 bytes of f32 number `k` of `bytes`.
fn f32_at(bytes: &[u8], k: usize) -> &[u8] {
    &bytes[4 * k..4 * k + 4]
}

#[test]
fn convert_keeps_block_columns_bit_for_bit() {
    // 160 neurons in bundles of 64: the last has 32. Q4_1 blocks of 32 values.
    let spec = SyntheticSpec {
        n_ff: 160,
        seed: 5,
        ..SyntheticSpec::default()
    };
    check_convert("blocks", &spec, &ConvertOptions::block_columns(64));
}

/// A Q4_K_M file's down projections are Q6_K in some layers and Q4_K in the others: block-
/// columns keep each layer's own blocks (format 4), at the Q6_K layers' stride.
#[test]
fn convert_keeps_a_q4_k_m_files_mixed_down_types_as_block_columns() {
    let spec = SyntheticSpec {
        n_layer: 8,
        n_embd: 256,
        n_ff: 512,
        n_head: 4,
        n_head_kv: 2,
        mix: crate::synthetic::TypeMix::Q4KM,
        seed: 8,
        ..SyntheticSpec::default()
    };
    check_convert("mixed", &spec, &ConvertOptions::block_columns(256));
    let rows = ConvertOptions::block_columns(256).rows_as_in_the_source();
    check_convert("mixed-rows", &spec, &rows);
    let dir = Scratch::new("mixed-types");
    let src = dir.0.join("tiny.gguf");
    std::fs::write(&src, synthetic_model(&spec).unwrap().to_bytes().unwrap()).unwrap();
    let summary = convert(
        &src,
        &dir.0.join("store.gguf"),
        &ConvertOptions::block_columns(256),
        &mut |_, _| {},
    )
    .unwrap();
    let types = &summary.down_types;
    assert!(
        types.contains(&GgmlType::Q6_K) && types.contains(&GgmlType::Q4_K),
        "{types:?}"
    );
    assert_eq!(
        summary.layout.down_ty,
        GgmlType::Q6_K,
        "the widest sets the stride"
    );
}

#[test]
fn convert_transposes_f32_down_columns_exactly() {
    // 160 neurons in bundles of 48: the last has 16.
    let spec = SyntheticSpec {
        n_ff: 160,
        weight_type: GgmlType::F32,
        seed: 6,
        ..SyntheticSpec::default()
    };
    let options = ConvertOptions {
        down_type: GgmlType::F32,
        ..ConvertOptions::neuron_columns(48)
    };
    check_convert("columns", &spec, &options);
}

#[test]
fn convert_refuses_a_store_and_bundles_that_straddle_blocks() {
    let dir = Scratch::new("refuse");
    let src = dir.0.join("tiny.gguf");
    let spec = SyntheticSpec::default();
    std::fs::write(&src, synthetic_model(&spec).unwrap().to_bytes().unwrap()).unwrap();
    // Block-columns of 16 neurons cannot hold whole Q4_1 blocks of the down projection.
    let out = dir.0.join("a.gguf");
    assert!(matches!(
        convert(
            &src,
            &out,
            &ConvertOptions::block_columns(16),
            &mut |_, _| {}
        ),
        Err(ConvertError::Store(StoreError::BundleSize {
            neurons: 16,
            granule: 32
        }))
    ));
    assert!(!out.exists(), "nothing written on refusal");
    // A store is not converted again; nor is a file converted onto itself.
    convert(
        &src,
        &out,
        &ConvertOptions::neuron_columns(64),
        &mut |_, _| {},
    )
    .unwrap();
    let again = dir.0.join("b.gguf");
    match convert(&out, &again, &ConvertOptions::default(), &mut |_, _| {}) {
        Err(ConvertError::Store(StoreError::AlreadyStore { source_name, .. })) => {
            assert_eq!(source_name, "tiny.gguf")
        }
        other => panic!("{other:?}"),
    }
    let options = ConvertOptions::default().overwriting();
    assert!(matches!(
        convert(&src, &src, &options, &mut |_, _| {}),
        Err(ConvertError::Store(StoreError::Output { .. }))
    ));
}

#[test]
fn down_columns_transposed_in_strips_are_each_bundles_own() {
    // Quantized down columns of a mixture (4 experts of 320 neurons), in bundles of 1 and of
    // 40 (one of them straddles the 256-neuron strip): every bundle's down part is what
    // transposing exactly its own columns gives.
    let spec = SyntheticSpec {
        n_ff: 320,
        n_expert: 4,
        n_expert_used: 2,
        seed: 7,
        ..SyntheticSpec::default()
    };
    let dir = Scratch::new("strips");
    let src = dir.0.join("moe.gguf");
    std::fs::write(&src, synthetic_model(&spec).unwrap().to_bytes().unwrap()).unwrap();
    let model = Model::open(&src, WeightSource::Mapped).unwrap();
    for bundle_neurons in [1, 40] {
        let options = ConvertOptions::neuron_columns(bundle_neurons);
        let dst = dir.0.join(format!("moe-{bundle_neurons}.store.gguf"));
        let summary = convert(&src, &dst, &options, &mut |_, _| {}).unwrap();
        let layout = summary.layout;
        let store = GgufFile::open(&dst).unwrap();
        for l in 0..spec.n_layer {
            let data = store.tensor_data(store.tensor(&bundle_tensor_name(l)).unwrap());
            for b in 0..layout.n_bundles {
                let bundle = &data[(b as u64 * layout.stride) as usize..][..layout.stride as usize];
                let n = layout.neurons_of(b);
                let (down, cols) = model.down_columns(l as usize, n.start as usize..n.end as usize);
                let mut want =
                    vec![0u8; row_bytes(layout.down_ty, down.rows).unwrap() * cols.len()];
                transpose_requantize_cols(down, cols, layout.down_ty, &mut want).unwrap();
                assert!(
                    layout.split(b, bundle).down.data == want.as_slice(),
                    "bundles of {bundle_neurons}: layer {l}, bundle {b}"
                );
            }
        }
    }
}

/// Faults for [`a_store_s_embedding_rows_are_read_with_faults_and_checked`]: each read gets
/// the next answer of the list, then none.
#[derive(Debug)]
struct Answers(std::sync::Mutex<Vec<crate::cache::ReadFault>>);

impl crate::cache::ReadFaults for Answers {
    fn before_read(&self, _offset: u64, _len: usize) -> crate::cache::ReadFault {
        let mut a = self.0.lock().unwrap();
        if a.is_empty() {
            crate::cache::ReadFault::None
        } else {
            a.remove(0)
        }
    }
}

#[test]
fn a_store_s_embedding_rows_are_read_with_faults_and_checked() {
    // A store loaded with its output streaming reads each token's embedding row from the file:
    // an injected failure or short read is an error, a flipped bit fails the page checksum,
    // and the next clean read gives the row.
    use crate::cache::ReadFault;
    let spec = SyntheticSpec {
        seed: 11,
        ..SyntheticSpec::default()
    };
    let dir = Scratch::new("embd-faults");
    let src = dir.0.join("tiny.gguf");
    let dst = dir.0.join("tiny-store.gguf");
    std::fs::write(&src, synthetic_model(&spec).unwrap().to_bytes().unwrap()).unwrap();
    convert(
        &src,
        &dst,
        &ConvertOptions::neuron_columns(64),
        &mut |_, _| {},
    )
    .unwrap();
    let whole = Model::open(&src, WeightSource::Mapped).unwrap();
    let n = spec.n_embd as usize;
    let (mut want, mut got) = (vec![0f32; n], vec![0f32; n]);
    whole.embed(5, &mut want).unwrap();
    let faults = std::sync::Arc::new(Answers(std::sync::Mutex::new(vec![
        ReadFault::Fail(std::io::ErrorKind::Other),
        ReadFault::Short(3),
        ReadFault::Flip(77),
    ])));
    let options = crate::model::LoadOptions {
        source: WeightSource::RESIDENT,
        read_faults: Some(faults.clone()),
        ..Default::default()
    };
    let model = Model::open(&dst, options).unwrap();
    for what in ["a failed read", "a short read", "a flipped bit"] {
        got.fill(0.0);
        let e = model.embed(5, &mut got).expect_err(what).to_string();
        assert!(e.contains("embedding row"), "{what}: {e}");
    }
    model.embed(5, &mut got).unwrap();
    assert_eq!(got, want);
    // A model loaded without faults asks none.
    faults
        .0
        .lock()
        .unwrap()
        .push(ReadFault::Fail(std::io::ErrorKind::Other));
    let model = Model::open(&dst, WeightSource::RESIDENT).unwrap();
    model.embed(6, &mut got).unwrap();
    assert_eq!(faults.0.lock().unwrap().len(), 1, "no fault was asked for");
}

/// Without a layout asked for, a SwiGLU model (dense decode by default) keeps its down blocks,
/// where they fit the bundle; a ReLU model, or blocks that straddle bundles, get neuron columns.
#[test]
fn convert_chooses_block_columns_for_dense_decode_where_the_blocks_fit() {
    let dir = Scratch::new("chosen");
    let cases = [
        (FfnActivation::Silu, 256, DownLayout::BlockColumns),
        (FfnActivation::GeluTanh, 256, DownLayout::BlockColumns),
        (FfnActivation::Silu, 64, DownLayout::NeuronColumns),
        (FfnActivation::Relu, 256, DownLayout::NeuronColumns),
    ];
    for (i, (activation, bundle_neurons, want)) in cases.into_iter().enumerate() {
        let spec = SyntheticSpec {
            n_layer: 2,
            n_embd: 256,
            n_ff: 512,
            n_head: 4,
            n_head_kv: 2,
            mix: crate::synthetic::TypeMix::Q4KM,
            activation,
            seed: 11,
            ..SyntheticSpec::default()
        };
        let src = dir.0.join(format!("tiny-{i}.gguf"));
        std::fs::write(&src, synthetic_model(&spec).unwrap().to_bytes().unwrap()).unwrap();
        let options = ConvertOptions {
            down_layout: None,
            ..ConvertOptions::neuron_columns(bundle_neurons)
        };
        let dst = dir.0.join(format!("store-{i}.gguf"));
        let summary = convert(&src, &dst, &options, &mut |_, _| {}).unwrap();
        assert_eq!(
            summary.layout.down_layout, want,
            "{activation:?} {bundle_neurons}"
        );
        let model = Model::open(&src, WeightSource::Mapped).unwrap();
        assert_eq!(chosen_down_layout(&model, bundle_neurons), want);
    }
}
