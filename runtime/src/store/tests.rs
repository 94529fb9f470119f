//! Unit tests of the neuron store: bundle layout offsets and page marking against hand
//! computations on a small shape, and `StoreInfo` refusing inconsistent metadata.

use super::*;
use crate::gguf::{Array, GgufWriter, Value};

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
    /// `conductor.store.down_types` (format 4), when written.
    down_types: Option<Vec<u32>>,
    /// `conductor.store.interleaved` (format 5), when written.
    interleaved: Option<bool>,
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
            down_types: None,
            interleaved: None,
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
        if let Some(t) = &self.down_types {
            w.add_metadata(KEY_DOWN_TYPES, Value::Array(Array::U32(t.clone())))
                .unwrap();
        }
        if let Some(on) = self.interleaved {
            w.add_metadata(KEY_INTERLEAVED, Value::Bool(on)).unwrap();
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
        // The page table of the bundle tensor (all zeros), as format 3 has.
        let mut pages = Vec::new();
        if self.bundle_tensor {
            PageCrcs::push_pages(&vec![0; self.stride as usize * 3], &mut pages);
        }
        if !pages.is_empty() {
            let n = pages.len() as u64 / 4;
            w.add_tensor(PAGE_CRC_TENSOR, vec![n], GgmlType::I32, pages)
                .unwrap();
        }
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
    assert!(info.pages.is_some());
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
    // Format 5 says whether its parts are interleaved.
    for on in [false, true] {
        let v5 = Meta {
            version: Some(STORE_VERSION_INTERLEAVED),
            interleaved: Some(on),
            ..Meta::valid()
        };
        assert_eq!(v5.info().unwrap().unwrap().layout.interleaved, on);
    }
    assert!(!Meta::valid().info().unwrap().unwrap().layout.interleaved);
}

#[test]
fn an_interleaved_key_out_of_its_format_is_refused() {
    let v5_without = Meta {
        version: Some(STORE_VERSION_INTERLEAVED),
        ..Meta::valid()
    };
    bad_metadata(v5_without.info(), KEY_INTERLEAVED, "missing");
    let v4_with = Meta {
        interleaved: Some(true),
        ..Meta::valid()
    };
    bad_metadata(v4_with.info(), KEY_INTERLEAVED, "format-4");
}

/// Interleaved parts: Q4_K and Q6_K parts of whole groups of 8 rows are `Layout::X8`, the
/// others rows; a row's pages are those of its whole group of 8.
#[test]
fn interleaved_bundles_lay_out_whole_groups_and_mark_their_pages() {
    let (q4k, q6k) = (GgmlType::Q4_K, GgmlType::Q6_K);
    // 256 values a row: 144 bytes of Q4_K, 210 of Q6_K; bundles of 256 neurons.
    let rows = BundleLayout::new(256, 512, [q4k, q4k, q6k], DownLayout::BlockColumns, 256).unwrap();
    let x8 = rows.with_interleaved(true);
    assert_eq!((rows.stride, rows.n_bundles), (x8.stride, x8.n_bundles));
    let bytes = vec![0u8; x8.stride as usize];
    let parts = x8.split(1, &bytes);
    for p in [parts.gate, parts.up, parts.down] {
        assert!(matches!(p.layout, Layout::X8 { skip: 0 }), "{:?}", p.ty);
        crate::quant::interleave::row_bytes_of(p, p.rows - 1).unwrap();
    }
    let parts = rows.split(1, &bytes);
    for p in [parts.gate, parts.up, parts.down] {
        assert!(matches!(p.layout, Layout::Rows), "{:?}", p.ty);
    }
    // Q8_0 has no interleaved form; 12 rows are not whole groups.
    assert_eq!(x8.part_layout(GgmlType::Q8_0, 256), Layout::Rows);
    assert_eq!(x8.part_layout(q4k, 12), Layout::Rows);
    // Q4_K rows of 144 bytes: gate bytes 0..36864, up 36864..73728, then the Q6_K down part
    // (256 rows of 210 bytes) 73728..127488, pages 18..=31: read whole for any active neuron.
    let pages = |layout: &BundleLayout, neuron: u32| {
        let mut bits = vec![0u64; 4];
        layout.mark_neuron_pages(0, &[neuron], &mut bits, 0);
        (0..32)
            .filter(|p| bits[p / 64] >> (p % 64) & 1 == 1)
            .collect::<Vec<usize>>()
    };
    let with_down = |mut p: Vec<usize>| {
        p.extend(18..=31);
        p
    };
    // Row 9 (gate 1296..1440, up 38160..38304) and its group 1 (gate 1152..2304, up
    // 38016..39168) lie in the same pages.
    assert_eq!(pages(&rows, 9), with_down(vec![0, 9]));
    assert_eq!(pages(&x8, 9), with_down(vec![0, 9]));
    // Row 27 (gate 3888..4032, up 40752..40896) does not cross a page; its group 3 (gate
    // 3456..4608, up 40320..41472) does.
    assert_eq!(pages(&rows, 27), with_down(vec![0, 9]));
    assert_eq!(pages(&x8, 27), with_down(vec![0, 1, 9, 10]));
}

#[test]
fn inconsistent_metadata_is_refused() {
    for version in [0, STORE_VERSION_MAX + 1] {
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
    // Format 3 without its page table.
    let m = Meta {
        bundle_tensor: false,
        ..Meta::valid()
    };
    let mut file = m.file();
    assert!(file.tensor(PAGE_CRC_TENSOR).is_none());
    file = {
        let mut w = GgufWriter::from_file(&file).unwrap();
        w.add_tensor(
            bundle_tensor_name(0),
            vec![7 * 4096, 3],
            GgmlType::I8,
            vec![0; 7 * 4096 * 3],
        )
        .unwrap();
        GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
    };
    layout_error(
        StoreInfo::from_gguf(&file, 256, 80, 1),
        "`conductor.page_crc` is missing",
    );
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
        down_types: Vec::new(),
        source_crc32: 0,
        source_name: String::new(),
        bundle_crc: vec![0, 0, crc32fast::hash(b"bundle"), 0, 0, 0],
        pages: None,
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

/// Page checksums: each page of a tensor is checked whole (a tensor's last page covers its own
/// bytes only, the padding after it is not covered); a read that ends inside a page, starts
/// off a page boundary or changed a byte is refused, naming the page's file offset.
#[test]
fn page_checksums_check_whole_pages_of_tensors_only() {
    let page = PAGE_BYTES as usize;
    // Tensor A: 2.5 pages at 0; padding to 3 pages; tensor B: 1 page at 3 pages.
    let a: Vec<u8> = (0..page * 5 / 2).map(|i| (i * 7 % 251) as u8).collect();
    let b: Vec<u8> = (0..page).map(|i| (i * 13 % 241) as u8).collect();
    let mut file = a.clone();
    file.resize(3 * page, 0xee);
    file.extend_from_slice(&b);
    let mut table = Vec::new();
    PageCrcs::push_pages(&a, &mut table);
    PageCrcs::push_pages(&b, &mut table);
    let pages = PageCrcs {
        tensors: vec![(0, a.len() as u64, 0), (3 * PAGE_BYTES, 4 * PAGE_BYTES, 3)],
        crc: table
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    };
    assert_eq!(PageCrcs::n_pages([a.len() as u64, b.len() as u64]), 4);
    pages.check("all", 0, &file).unwrap();
    pages.check("b", 3 * PAGE_BYTES, &file[3 * page..]).unwrap();
    pages
        .check("a's last page", 2 * PAGE_BYTES, &file[2 * page..3 * page])
        .unwrap();
    // The padding is not covered; a's last page must be there up to a's end.
    let mut padded = file.clone();
    padded[3 * page - 1] ^= 1;
    pages.check("padding", 0, &padded).unwrap();
    let err = pages
        .check("short", 2 * PAGE_BYTES, &file[2 * page..2 * page + 100])
        .unwrap_err();
    assert!(matches!(err, StoreError::PageChecksum { offset, .. } if offset == 2 * PAGE_BYTES));
    for at in [5, page + 1, 3 * page + 4095] {
        let mut bad = file.clone();
        bad[at] ^= 0x10;
        let err = pages.check("flipped", 0, &bad).unwrap_err().to_string();
        let expect = (at / page * page).to_string();
        assert!(err.contains("flipped") && err.contains(&expect), "{err}");
    }
    assert!(pages.check("unaligned", 1, &file[1..]).is_err());
    // Past every tensor: nothing to check.
    pages.check("beyond", 4 * PAGE_BYTES, &[1, 2, 3]).unwrap();
}

/// Format 4: each layer's down type, each laid out at the store's stride; a type that does
/// not fit the stride, the wrong count of layers, an unknown type or the key in an older
/// format are refused, naming the key.
#[test]
fn per_layer_down_types_read_back_and_bad_ones_are_refused() {
    let m = Meta {
        down_types: Some(vec![GgmlType::Q4_0.id()]),
        ..Meta::valid()
    };
    let info = m.info().unwrap().unwrap();
    assert_eq!(info.down_types, [GgmlType::Q4_0]);
    let own = info.layout_of(0);
    assert_eq!(
        (own.down_ty, own.stride),
        (GgmlType::Q4_0, info.layout.stride)
    );
    assert!(own.payload_bytes(32) < info.layout.payload_bytes(32));
    // Without the key, every layer has the layout's own down type.
    let info = Meta::valid().info().unwrap().unwrap();
    assert_eq!(info.down_types, [GgmlType::Q8_0]);
    assert_eq!(info.layout_of(0), info.layout);
    for (types, part) in [
        (vec![GgmlType::F32.id()], "more than the stride"),
        (vec![GgmlType::Q4_0.id(); 2], "one per layer"),
        (vec![99], "type id 99"),
    ] {
        let m = Meta {
            down_types: Some(types),
            ..Meta::valid()
        };
        bad_metadata(m.info(), KEY_DOWN_TYPES, part);
    }
    let m = Meta {
        version: Some(3),
        down_types: Some(vec![GgmlType::Q4_0.id()]),
        ..Meta::valid()
    };
    bad_metadata(m.info(), KEY_DOWN_TYPES, "format-4");
}
