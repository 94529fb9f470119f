//! Unit tests of the neuron store: bundle layout offsets and page marking against hand
//! computations on a small shape, `StoreInfo` refusing inconsistent metadata, and `convert` of
//! a tiny generated model keeping every FFN row bit for bit.

use super::*;
use crate::gguf::{Array, GgufWriter, Value};
use crate::synthetic::{synthetic_model, SyntheticSpec};
use std::path::PathBuf;

// ---------------------------------------------------------------- layout

/// Q8_0 everywhere (32 values in 34 bytes), 256 wide, 80 neurons in bundles of 32 (the last
/// bundle has 16), neuron columns.
fn q8_layout(down_layout: DownLayout, n_ff: u32) -> BundleLayout {
    BundleLayout::new(256, n_ff, [GgmlType::Q8_0; 3], down_layout, 32).unwrap()
}

/// The pages set in `bits`.
fn pages(bits: &[u64]) -> Vec<usize> {
    (0..bits.len() * 64)
        .filter(|&i| bits[i / 64] & (1 << (i % 64)) != 0)
        .collect()
}

#[test]
fn layout_sizes_match_a_hand_computation() {
    // A row of 256 Q8_0 values: 8 blocks of 34 bytes = 272 bytes.
    // A full bundle: 32 gate + 32 up + 32 down rows = 96 * 272 = 26112 bytes, 7 pages.
    let l = q8_layout(DownLayout::NeuronColumns, 80);
    assert_eq!(l.n_bundles, 3);
    assert_eq!(l.payload_bytes(32), 26_112);
    assert_eq!(l.stride, 7 * 4096);
    assert_eq!(l.bundle_pages(), 7);
    assert_eq!(l.layer_bytes(), 3 * 7 * 4096);
    assert_eq!(l.neurons_of(0), 0..32);
    assert_eq!(l.neurons_of(2), 64..80);
    assert_eq!(l.payload_bytes(16), 13_056);
    // Gate rows: 32 * 272 = 8704 bytes, pages 0..3; the short last bundle: 4352 bytes, 2.
    assert_eq!(l.gate_bytes(32), 8_704);
    assert_eq!(l.gate_pages(0), 3);
    assert_eq!(l.gate_pages(2), 2);
    // Block-columns: 256 rows of 32 values (one block, 34 bytes) = 8704 bytes of down part.
    let b = q8_layout(DownLayout::BlockColumns, 96);
    assert_eq!(b.payload_bytes(32), 26_112);
    assert_eq!(b.stride, 7 * 4096);
}

#[test]
fn split_cuts_a_bundle_at_its_parts() {
    let l = q8_layout(DownLayout::NeuronColumns, 80);
    let bytes: Vec<u8> = (0..l.stride as usize).map(|i| (i % 251) as u8).collect();
    let r = l.split(0, &bytes);
    assert_eq!((r.gate.rows, r.gate.cols), (32, 256));
    assert_eq!(r.gate.data.as_ptr(), bytes.as_ptr());
    assert_eq!(r.gate.data.len(), 8_704);
    assert_eq!(r.up.data.as_ptr(), bytes[8_704..].as_ptr());
    assert_eq!(r.up.data.len(), 8_704);
    assert_eq!(r.down.data.as_ptr(), bytes[17_408..].as_ptr());
    assert_eq!((r.down.rows, r.down.cols), (32, 256));
    // The short bundle: 16 rows each.
    let r = l.split(2, &bytes);
    assert_eq!(r.up.data.as_ptr(), bytes[4_352..].as_ptr());
    assert_eq!(r.down.data.as_ptr(), bytes[8_704..].as_ptr());
    assert_eq!(r.down.data.len(), 4_352);
    // Block-columns: the down part is 256 rows of 32 columns.
    let b = q8_layout(DownLayout::BlockColumns, 96);
    let r = b.split(1, &bytes);
    assert_eq!((r.down.rows, r.down.cols), (256, 32));
    assert_eq!(r.down_layout, DownLayout::BlockColumns);
}

#[test]
fn active_pages_are_those_of_the_active_rows() {
    let l = q8_layout(DownLayout::NeuronColumns, 80);
    // Up rows start at 8704, down columns at 17408, 272 bytes each.
    // Neuron 0: up 8704..8976 (page 2), down 17408..17680 (page 4).
    // Neuron 31: up 17136..17408 (page 4), down 25840..26112 (page 6).
    let mut bits = [0u64; 2];
    l.mark_active_pages(0, &[0, 31], false, &mut bits, 0);
    assert_eq!(pages(&bits), [2, 4, 6]);
    // At bit 60 of the map: pages 2, 4, 6 are bits 62, 64, 66 (across the word boundary).
    let mut bits = [0u64; 2];
    l.mark_active_pages(0, &[0, 31], false, &mut bits, 60);
    assert_eq!(bits, [1 << 62, 1 | 1 << 2]);
    // Every up row (8704..17408: pages 2 to 4) and no down column for no active neuron.
    let mut bits = [0u64; 1];
    l.mark_active_pages(0, &[], true, &mut bits, 0);
    assert_eq!(pages(&bits), [2, 3, 4]);
    // Nothing active, up rows not whole: nothing to read.
    let mut bits = [0u64; 1];
    l.mark_active_pages(1, &[], false, &mut bits, 0);
    assert_eq!(bits, [0]);
    // The short bundle (16 neurons): up rows at 4352, down at 8704; neuron 15's up row
    // 8432..8704 (page 2), its down column 12784..13056 (page 3).
    let mut bits = [0u64; 1];
    l.mark_active_pages(2, &[15], false, &mut bits, 0);
    assert_eq!(pages(&bits), [2, 3]);
}

#[test]
fn block_columns_read_their_whole_down_part() {
    let l = q8_layout(DownLayout::BlockColumns, 96);
    // Neuron 5's up row: 8704 + 5 * 272 = 10064..10336 (page 2); the down part 17408..26112
    // (pages 4 to 6) whole.
    let mut bits = [0u64; 1];
    l.mark_active_pages(0, &[5], false, &mut bits, 0);
    assert_eq!(pages(&bits), [2, 4, 5, 6]);
    let mut bits = [0u64; 1];
    l.mark_active_pages(0, &[], false, &mut bits, 0);
    assert_eq!(bits, [0], "no active neuron reads no down part");
}

#[test]
fn neuron_pages_add_the_gate_rows() {
    let l = q8_layout(DownLayout::NeuronColumns, 80);
    // Neuron 1: gate 272..544 (page 0), up 8976..9248 (page 2), down 17680..17952 (page 4).
    // Neuron 16: gate 4352..4624 (page 1), up 13056..13328 (page 3), down 21760..22032 (5).
    let mut bits = [0u64; 1];
    l.mark_neuron_pages(0, &[1], &mut bits, 0);
    assert_eq!(pages(&bits), [0, 2, 4]);
    let mut bits = [0u64; 1];
    l.mark_neuron_pages(0, &[1, 16], &mut bits, 3);
    assert_eq!(pages(&bits), [3, 4, 5, 6, 7, 8]);
    // A gate row across a page boundary: neuron 15's is 4080..4352, pages 0 and 1.
    let mut bits = [0u64; 1];
    l.mark_neuron_pages(0, &[15], &mut bits, 0);
    assert_eq!(pages(&bits), [0, 1, 3, 5]);
}

#[test]
fn layouts_that_cannot_be_laid_out_are_refused() {
    let q8 = [GgmlType::Q8_0; 3];
    let bundle_size = |r| matches!(r, Err(StoreError::BundleSize { .. }));
    // Block-columns need whole blocks of the down type per bundle, and per layer.
    assert!(bundle_size(BundleLayout::new(
        256,
        96,
        q8,
        DownLayout::BlockColumns,
        16
    )));
    assert!(bundle_size(BundleLayout::new(
        256,
        80,
        q8,
        DownLayout::BlockColumns,
        32
    )));
    assert!(bundle_size(BundleLayout::new(
        256,
        80,
        q8,
        DownLayout::NeuronColumns,
        0
    )));
    // Neuron columns take any bundle size.
    assert_eq!(
        BundleLayout::new(256, 80, q8, DownLayout::NeuronColumns, 7)
            .unwrap()
            .n_bundles,
        12
    );
    // Rows of 100 values do not fit whole Q8_0 blocks.
    let err = BundleLayout::new(100, 64, q8, DownLayout::NeuronColumns, 32).unwrap_err();
    assert!(
        matches!(&err, StoreError::Layout(why) if why.contains("gate rows of 100")),
        "{err}"
    );
}

#[test]
fn down_layout_names_round_trip() {
    for d in [DownLayout::NeuronColumns, DownLayout::BlockColumns] {
        assert_eq!(DownLayout::from_name(d.name()), Some(d));
    }
    assert_eq!(DownLayout::from_name("rows"), None);
}

// ---------------------------------------------------------------- metadata

/// The metadata and tensors of a store of `q8_layout(NeuronColumns, 80)` with one layer, each
/// field there to be spoiled by one test.
struct Meta {
    version: Option<u32>,
    neurons: Option<u32>,
    stride: u64,
    types: Vec<u32>,
    down_layout: Option<&'static str>,
    alignment: u32,
    crc_dims: Vec<u64>,
    bundle_tensor: bool,
}

impl Meta {
    fn valid() -> Meta {
        Meta {
            version: Some(STORE_VERSION),
            neurons: Some(32),
            stride: 7 * 4096,
            types: vec![GgmlType::Q8_0.id(); 3],
            down_layout: Some("neuron_columns"),
            alignment: STORE_ALIGN as u32,
            crc_dims: vec![3],
            bundle_tensor: true,
        }
    }

    fn file(&self) -> GgufFile {
        let mut w = GgufWriter::new();
        w.add_metadata("general.alignment", Value::U32(self.alignment))
            .unwrap();
        if let Some(v) = self.version {
            w.add_metadata(KEY_VERSION, Value::U32(v)).unwrap();
        }
        if let Some(n) = self.neurons {
            w.add_metadata(KEY_BUNDLE_NEURONS, Value::U32(n)).unwrap();
        }
        w.add_metadata(KEY_BUNDLE_STRIDE, Value::U64(self.stride))
            .unwrap();
        w.add_metadata(KEY_SOURCE_CHECKSUM, Value::U32(0xDEAD_BEEF))
            .unwrap();
        w.add_metadata(KEY_SOURCE_NAME, Value::String("tiny.gguf".into()))
            .unwrap();
        w.add_metadata(KEY_FFN_TYPES, Value::Array(Array::U32(self.types.clone())))
            .unwrap();
        if let Some(d) = self.down_layout {
            w.add_metadata(KEY_DOWN_LAYOUT, Value::String(d.into()))
                .unwrap();
        }
        if self.bundle_tensor {
            w.add_tensor(
                bundle_tensor_name(0),
                vec![self.stride, 3],
                GgmlType::I8,
                vec![0; self.stride as usize * 3],
            )
            .unwrap();
        }
        let n: u64 = self.crc_dims.iter().product();
        let crcs = (0..n as u32).flat_map(|i| (i + 7).to_le_bytes()).collect();
        w.add_tensor(CRC_TENSOR, self.crc_dims.clone(), GgmlType::I32, crcs)
            .unwrap();
        GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
    }

    fn info(&self) -> Result<Option<StoreInfo>, StoreError> {
        StoreInfo::from_gguf(&self.file(), 256, 80, 1)
    }
}

/// `StoreError::BadMetadata` for `key`, with `why` containing `part`.
#[track_caller]
fn bad_metadata(r: Result<Option<StoreInfo>, StoreError>, key: &str, part: &str) {
    match r {
        Err(StoreError::BadMetadata { key: k, why }) if k == key && why.contains(part) => {}
        other => panic!("expected bad `{key}` ({part}), got {other:?}"),
    }
}

#[track_caller]
fn layout_error(r: Result<Option<StoreInfo>, StoreError>, part: &str) {
    match r {
        Err(StoreError::Layout(why)) if why.contains(part) => {}
        other => panic!("expected a layout error ({part}), got {other:?}"),
    }
}

#[test]
fn consistent_metadata_reads_back() {
    let info = Meta::valid().info().unwrap().unwrap();
    assert_eq!(info.layout, q8_layout(DownLayout::NeuronColumns, 80));
    assert_eq!(info.source_crc32, 0xDEAD_BEEF);
    assert_eq!(info.source_name, "tiny.gguf");
    assert_eq!(info.bundle_crc, [7, 8, 9]);
    // Without a store version it is an ordinary model.
    let plain = Meta {
        version: None,
        ..Meta::valid()
    };
    assert!(plain.info().unwrap().is_none());
    // Version 1 stores are block-columns, whatever (or whether) a layout key says.
    let v1 = Meta {
        version: Some(1),
        down_layout: None,
        ..Meta::valid()
    };
    let info = StoreInfo::from_gguf(&v1.file(), 256, 96, 1);
    // 96 neurons in bundles of 32: three bundles, as the tensors hold.
    assert_eq!(
        info.unwrap().unwrap().layout.down_layout,
        DownLayout::BlockColumns
    );
}

#[test]
fn inconsistent_metadata_is_refused() {
    for version in [0, STORE_VERSION + 1] {
        let m = Meta {
            version: Some(version),
            ..Meta::valid()
        };
        assert!(
            matches!(m.info(), Err(StoreError::Version { found }) if found == version),
            "version {version}"
        );
    }
    let m = Meta {
        neurons: None,
        ..Meta::valid()
    };
    bad_metadata(m.info(), KEY_BUNDLE_NEURONS, "missing");
    let m = Meta {
        types: vec![GgmlType::Q8_0.id(); 2],
        ..Meta::valid()
    };
    bad_metadata(m.info(), KEY_FFN_TYPES, "expected 3");
    let m = Meta {
        types: vec![GgmlType::Q8_0.id(), 99, GgmlType::Q8_0.id()],
        ..Meta::valid()
    };
    bad_metadata(m.info(), KEY_FFN_TYPES, "unknown ggml type id 99");
    let m = Meta {
        down_layout: Some("rows"),
        ..Meta::valid()
    };
    bad_metadata(m.info(), KEY_DOWN_LAYOUT, "unknown layout `rows`");
    let m = Meta {
        down_layout: None,
        ..Meta::valid()
    };
    bad_metadata(m.info(), KEY_DOWN_LAYOUT, "missing");
    // A stride that is not what this model's bundles take.
    let m = Meta {
        stride: 8 * 4096,
        ..Meta::valid()
    };
    bad_metadata(m.info(), KEY_BUNDLE_STRIDE, "another model");
    // The right store, the wrong model (wider rows: bigger bundles).
    bad_metadata(
        StoreInfo::from_gguf(&Meta::valid().file(), 512, 80, 1),
        KEY_BUNDLE_STRIDE,
        "another model",
    );
}

#[test]
fn inconsistent_tensors_are_refused() {
    let m = Meta {
        alignment: 32,
        ..Meta::valid()
    };
    layout_error(m.info(), "general.alignment is 32");
    let m = Meta {
        crc_dims: vec![4],
        ..Meta::valid()
    };
    layout_error(m.info(), "expected I32 [3]");
    let m = Meta {
        bundle_tensor: false,
        ..Meta::valid()
    };
    layout_error(m.info(), "`blk.0.ffn_bundles` is missing");
    // Two layers asked of a one-layer store: the checksums do not cover them.
    layout_error(
        StoreInfo::from_gguf(&Meta::valid().file(), 256, 80, 2),
        "expected I32 [6]",
    );
    // A bundle tensor of another model's shape (fewer neurons: two bundles).
    let err = StoreInfo::from_gguf(&Meta::valid().file(), 256, 64, 1).unwrap_err();
    assert!(err.to_string().contains("expected I32 [2]"), "{err}");
}

#[test]
fn check_bundle_names_the_neurons_of_a_corrupt_bundle() {
    let info = StoreInfo {
        layout: q8_layout(DownLayout::NeuronColumns, 80),
        source_crc32: 0,
        source_name: String::new(),
        bundle_crc: vec![0, 0, crc32fast::hash(b"bundle"), 0, 0, 0],
    };
    info.check_bundle(0, 2, b"bundle").unwrap();
    match info.check_bundle(0, 2, b"bundlf") {
        Err(StoreError::Checksum {
            layer: 0,
            bundle: 2,
            first: 64,
            end: 80,
        }) => {}
        other => panic!("{other:?}"),
    }
    // The same bytes as bundle 2 of layer 1: another checksum.
    assert!(info.check_bundle(1, 2, b"bundle").is_err());
    // Past the recorded checksums.
    assert!(info.check_bundle(2, 0, b"bundle").is_err());
}

// ---------------------------------------------------------------- convert

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
        Err(StoreError::Output { .. })
    ));
    let source = GgufFile::open(&src).unwrap();
    let store = GgufFile::open(&dst).unwrap();
    let info = StoreInfo::from_gguf(&store, spec.n_embd, spec.n_ff, spec.n_layer)
        .unwrap()
        .unwrap();
    let layout = &info.layout;
    assert_eq!(*layout, summary.layout);
    assert_eq!(layout.down_layout, options.down_layout);
    assert_eq!(info.source_crc32, crc32fast::hash(&bytes));
    assert_eq!(info.source_name, "tiny.gguf");
    let ffn = |l: u32, t: &str| {
        let t = source.tensor(&format!("blk.{l}.{t}.weight")).unwrap();
        (t.ty, source.tensor_data(t))
    };
    let (embd, ff) = (spec.n_embd as usize, spec.n_ff as usize);
    let mut bundles = 0;
    for l in 0..spec.n_layer {
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
            assert_eq!(r.gate.data, &gate[i * gr..(i + m) * gr], "gate {l}/{b}");
            assert_eq!(r.up.data, &up[i * ur..(i + m) * ur], "up {l}/{b}");
            match layout.down_layout {
                DownLayout::BlockColumns => {
                    // Row e of the bundle's down part: columns i..i+m of the source's row e.
                    let row = row_bytes(down_ty, ff).unwrap();
                    let (bs, ts) = (down_ty.block_size(), down_ty.type_size());
                    let part = row_bytes(down_ty, m).unwrap();
                    for e in 0..embd {
                        let from = e * row + i / bs * ts;
                        assert_eq!(
                            r.down.data[e * part..][..part],
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
    assert_eq!(bundles, spec.n_layer * layout.n_bundles);
    // Everything else as it was; the FFN matrices gone.
    for t in source.tensors() {
        match store.tensor(&t.name) {
            Some(s) => assert_eq!(store.tensor_data(s), source.tensor_data(t), "{}", t.name),
            None => assert!(t.name.contains(".ffn_"), "{} was dropped", t.name),
        }
    }
    assert_eq!(
        summary.bundle_bytes,
        layout.layer_bytes() * u64::from(spec.n_layer)
    );
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
        Err(StoreError::BundleSize {
            neurons: 16,
            granule: 32
        })
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
        Err(StoreError::AlreadyStore { source_name, .. }) => assert_eq!(source_name, "tiny.gguf"),
        other => panic!("{other:?}"),
    }
    let options = ConvertOptions::default().overwriting();
    assert!(matches!(
        convert(&src, &src, &options, &mut |_, _| {}),
        Err(StoreError::Output { .. })
    ));
}
