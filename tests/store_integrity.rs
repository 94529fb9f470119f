//! Item 5 of issue 28: what is read from a neuron store is checked on every read (the default
//! `storage.verify = "always"`), not only on a bundle's first read. A byte flipped in the file
//! after a unit was read once is found on the next read of every kind: a whole bundle, pages
//! of a bundle, an attention matrix, output rows, an embedding row; and a run fails with an
//! error instead of computing with it. Under `verify = "first"` the same reads are trusted
//! (what every read did before the fix).

mod common;

use common::ScratchDir;
use conductor::runtime::cache::{unit_extents, BundleFile, UnitMap, ATTN_K};
use conductor::runtime::convert::ConvertOptions;
use conductor::runtime::exec::{Driver, Session};
use conductor::runtime::model::{Model, WeightSource};
use conductor::runtime::plan::{CachePlan, CachePolicy, ExecutionPlan, ReadPolicy, Verify};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

const OUTPUT_ROWS: u32 = 60;

fn map_of(model: &Model) -> UnitMap {
    UnitMap {
        n_layer: model.config().n_layer,
        ffn_clusters: model.store().unwrap().layout.n_bundles,
        output_clusters: model.config().n_vocab.div_ceil(OUTPUT_ROWS),
        attn_units: 4,
    }
}

fn open(path: &Path, model: &Model, verify: Verify) -> BundleFile {
    let map = map_of(model);
    let mut storage = ExecutionPlan::default().storage;
    storage.verify = verify;
    let extents = unit_extents(model, &map, OUTPUT_ROWS);
    BundleFile::open_with(path, model, &map, extents, &storage)
        .unwrap()
        .unwrap()
}

/// Flips byte `at` of the file at `path`.
fn flip(path: &Path, at: u64) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x5a], at).unwrap();
}

#[test]
fn a_byte_changed_after_the_first_read_fails_every_later_read_of_every_kind() {
    let dir = ScratchDir::new("integrity-reads");
    let store = dir.store(&dir.small_model(7), &ConvertOptions::neuron_columns(64));
    let victim = dir.join("victim.gguf");
    std::fs::copy(&store, &victim).unwrap();
    let model = Model::open(&victim, WeightSource::STREAMED).unwrap();
    let map = map_of(&model);
    let extents = unit_extents(&model, &map, OUTPUT_ROWS);
    let always = open(&victim, &model, Verify::Always);
    let first = open(&victim, &model, Verify::First);
    assert!(
        always.has_page_checksums(),
        "a store this build writes has page checksums"
    );
    let longest = extents.iter().map(|e| e.len).max().unwrap();
    let mut raw = vec![0u8; longest + 4096];
    let at = raw.as_ptr().align_offset(4096);
    let slot = &mut raw[at..at + longest];

    // (what, layer, cluster): a bundle, an attention matrix, output rows.
    let units = [
        ("bundle", 1, 2),
        ("attention", 1, map.ffn_clusters + ATTN_K),
        ("output", map.n_layer, 1),
    ];
    for (what, layer, cluster) in units {
        let e = &extents[map.unit(layer, cluster) as usize];
        for f in [&always, &first] {
            f.load(layer, cluster, slot).unwrap();
        }
        // Inside the unit's data, past its first page.
        let byte = e.offset + (e.data.start + (e.data.len() * 2 / 3)) as u64;
        flip(&victim, byte);
        let err = always
            .load(layer, cluster, slot)
            .expect_err(&format!("a changed {what} read with verify always"))
            .to_string();
        assert!(err.contains("checksum"), "{what}: {err}");
        first
            .load(layer, cluster, slot)
            .unwrap_or_else(|e| panic!("verify first trusts a {what} read before: {e}"));
        flip(&victim, byte);
        always.load(layer, cluster, slot).unwrap();
    }

    // Pages of a bundle read on their own (gate-first loading), once it was read whole.
    let (layer, cluster) = (2, 1);
    let e = &extents[map.unit(layer, cluster) as usize];
    for f in [&always, &first] {
        f.load(layer, cluster, slot).unwrap();
        assert!(f.part_ready(layer, cluster));
    }
    flip(&victim, e.offset + 4096 + 7);
    let err = always
        .load_part(layer, cluster, Some(1..2), slot)
        .expect_err("a changed page read with verify always")
        .to_string();
    assert!(err.contains("checksum") && err.contains("layer 2"), "{err}");
    assert_eq!(
        first.load_part(layer, cluster, Some(1..2), slot).unwrap(),
        4096
    );
    // Pages the change is not in are still served.
    always.load_part(layer, cluster, Some(0..1), slot).unwrap();
    let mut pages = [(layer, cluster, 1..2, &mut slot[4096..8192])];
    assert!(always.load_parts(&mut pages)[0].is_err());
    flip(&victim, e.offset + 4096 + 7);
    always.load_part(layer, cluster, Some(1..2), slot).unwrap();

    // An embedding row read from the file (the embeddings stream with the output).
    let t = model.tok_embd();
    let token = 5;
    let byte = (t.bytes.start + token * t.row_bytes() + 3) as u64;
    let mut row = vec![0f32; model.config().n_embd as usize];
    model.embed(token as u32, &mut row).unwrap();
    flip(&victim, byte);
    let err = model.embed(token as u32, &mut row).unwrap_err().to_string();
    assert!(
        err.contains("checksum") && err.contains("embedding row 5"),
        "{err}"
    );
    flip(&victim, byte);
    model.embed(token as u32, &mut row).unwrap();
}

/// A run that streams attention and the output, over a store whose attention matrix changed:
/// the step fails naming the unit (before the fix it computed with the changed weights).
#[test]
fn a_run_over_a_changed_attention_matrix_fails_instead_of_computing_with_it() {
    let dir = ScratchDir::new("integrity-run");
    let store = dir.store(&dir.small_model(7), &ConvertOptions::neuron_columns(64));
    let victim = dir.join("victim.gguf");
    std::fs::copy(&store, &victim).unwrap();
    let model = Model::open(&victim, WeightSource::STREAMED).unwrap();
    let wv = model.layers()[1].wv.bytes.clone();
    flip(&victim, (wv.start + wv.len() / 2) as u64);
    let mut plan = ExecutionPlan {
        cache: Some(CachePlan {
            slots: 64,
            hot_slots: 0,
            policy: CachePolicy::Lru,
            max_loads: 1,
            stream_output: true,
            stream_attention: true,
            coalesce: 1,
            hot_units: Vec::new(),
            reads: ReadPolicy::Bundles,
            gate_first_gap: 0,
        }),
        ..ExecutionPlan::default()
    };
    plan.decode.output_rows = OUTPUT_ROWS;
    plan.prefill.output_rows = OUTPUT_ROWS;
    let model = Arc::new(model);
    let mut d = common::serial_driver(&model, &plan);
    let mut session = Session::new(&model, 32).unwrap();
    let err = d
        .eval_last(&mut session, &[3, 17, 42])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("layer 1 attn_v") && err.contains("checksum"),
        "{err}"
    );
}
