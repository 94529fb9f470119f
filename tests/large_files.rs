//! Stores as large as the models Conductor is for: offsets past 4 GiB read right through every
//! read path, and a disk that fills while a file is written leaves no file behind.

mod common;

use common::ScratchDir;
use conductor::runtime::convert::{convert, ConvertOptions};
use conductor::runtime::exec::{ffn_plan_of, Driver, InlineDriver, Serial, Session};
use conductor::runtime::gguf::{GgufFile, GgufWriter};
use conductor::runtime::model::{Model, WeightSource};
use conductor::runtime::plan::{CachePlan, CachePolicy, ExecutionPlan, IoEngine, ReadPolicy};
use conductor::runtime::quant::{GgmlType, Kernels};
use conductor::runtime::store::{PageCrcs, PAGE_BYTES, PAGE_CRC_TENSOR};
use conductor::runtime::synthetic::SyntheticModel;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Bytes of the hole before the tensors of the shifted store: past 4 GiB.
const HOLE: u64 = (4 << 30) + (1 << 20);

/// `store` rewritten with a first tensor of [`HOLE`] bytes never written (a sparse file), so
/// that every other tensor lies past 4 GiB; its bytes are written at their new offsets, and its
/// page checksums are those of the new layout (the hole's pages read as zeros).
fn shifted(store: &Path, to: &Path) {
    let orig = GgufFile::open(store).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in orig.metadata() {
        w.add_metadata(k.clone(), v.clone()).unwrap();
    }
    w.add_tensor_info("zz.hole", vec![HOLE], GgmlType::I8)
        .unwrap();
    let covered = PageCrcs::covered(&orig);
    let n_pages = PageCrcs::n_pages(covered.iter().map(|t| t.n_bytes)) + HOLE / PAGE_BYTES;
    for t in orig.tensors() {
        let dims = if t.name == PAGE_CRC_TENSOR {
            vec![n_pages]
        } else {
            t.dims.clone()
        };
        w.add_tensor_info(t.name.clone(), dims, t.ty).unwrap();
    }
    // The new layout's covered tensors in file order: the hole first, then the others in
    // their old order (written in that order above).
    let zero_page = crc32fast::hash(&[0u8; PAGE_BYTES as usize]).to_le_bytes();
    let mut table = zero_page.repeat((HOLE / PAGE_BYTES) as usize);
    for t in &covered {
        PageCrcs::push_pages(orig.tensor_data(t), &mut table);
    }
    let header = w.header_bytes();
    let last = w.tensors().last().unwrap();
    let data_offset = (header.len() as u64).div_ceil(w.alignment()) * w.alignment();
    let f = std::fs::File::create(to).unwrap();
    f.write_all_at(&header, 0).unwrap();
    f.set_len(data_offset + last.offset + last.n_bytes).unwrap();
    let new = GgufFile::open(to).unwrap();
    assert_eq!(new.data_offset(), data_offset);
    for t in orig.tensors() {
        let at = new.data_offset() + new.tensor(&t.name).unwrap().offset;
        assert!(at > 1 << 32, "`{}` at {at} is not past 4 GiB", t.name);
        let data = if t.name == PAGE_CRC_TENSOR {
            &table[..]
        } else {
            orig.tensor_data(t)
        };
        f.write_all_at(data, at).unwrap();
    }
    f.sync_all().unwrap();
}

const PROMPT: [u32; 6] = [3, 17, 42, 5, 99, 120];

/// Logits of a prompt and three greedy decode steps, as bits.
fn run(driver: &mut dyn Driver) -> Vec<Vec<u32>> {
    let model = Arc::clone(driver.model());
    let mut session = Session::new(&model, 64).unwrap();
    let mut out = Vec::new();
    let mut logits = driver.eval_last(&mut session, &PROMPT).unwrap().to_vec();
    for _ in 0..3 {
        out.push(logits.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        let next = (0..logits.len())
            .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
            .unwrap() as u32;
        logits = driver.eval_last(&mut session, &[next]).unwrap().to_vec();
    }
    out.push(logits.iter().map(|x| x.to_bits()).collect());
    out
}

/// A cache too small for the model (every step reads), the embeddings and the output
/// projection streamed too: every tensor of the store is read from storage or at load.
fn plan(engine: IoEngine, direct: bool) -> ExecutionPlan {
    let mut plan = ExecutionPlan {
        cache: Some(CachePlan {
            slots: 4,
            hot_slots: 1,
            policy: CachePolicy::Segmented,
            max_loads: 2,
            stream_output: true,
            stream_attention: true,
            coalesce: 2,
            hot_units: Vec::new(),
            reads: ReadPolicy::Bundles,
            gate_first_gap: 0,
        }),
        prefill_max_tokens: 4,
        ..ExecutionPlan::default()
    };
    plan.decode.output_rows = 60;
    plan.prefill.output_rows = 60;
    plan.storage.engine = engine;
    plan.storage.direct_io = direct;
    plan
}

fn driver(path: &Path, plan: &ExecutionPlan) -> Result<InlineDriver<Serial>, String> {
    let model = Arc::new(Model::open(path, WeightSource::STREAMED).unwrap());
    let ffn = ffn_plan_of(&model, plan).map_err(|e| e.to_string())?;
    InlineDriver::new(model, plan, ffn, Kernels::best(), Serial).map_err(|e| e.to_string())
}

#[test]
fn offsets_past_4_gib_read_the_same_through_every_path() {
    let dir = ScratchDir::new("past-4gib");
    let store = dir.store(&dir.small_model(11), &ConvertOptions::neuron_columns(64));
    let far = dir.join("far.gguf");
    shifted(&store, &far);
    // The map: every tensor's bytes as written (the page table is the new layout's).
    let (near, mapped) = (
        GgufFile::open(&store).unwrap(),
        GgufFile::open(&far).unwrap(),
    );
    for t in near.tensors().iter().filter(|t| t.name != PAGE_CRC_TENSOR) {
        let f = mapped.tensor(&t.name).unwrap();
        assert_eq!(mapped.tensor_data(f), near.tensor_data(t), "{}", t.name);
    }
    // Positional reads (with and without O_DIRECT) and io_uring: the resident tensors read
    // at load, embedding rows per token, bundles, attention and output rows through the
    // cache; the same bits as the store whose offsets are small.
    let reference = run(&mut driver(&store, &plan(IoEngine::Pread, false)).unwrap());
    for direct in [false, true] {
        let mut d = driver(&far, &plan(IoEngine::Pread, direct)).unwrap();
        assert_eq!(run(&mut d), reference, "pread, O_DIRECT {direct}");
        assert!(d.cache_report().unwrap().loads > 0);
    }
    match driver(&far, &plan(IoEngine::Uring, true)) {
        Ok(mut d) => assert_eq!(run(&mut d), reference, "io_uring"),
        Err(why) => {
            assert!(why.contains("io_uring") && why.contains("pread"), "{why}");
            common::environment_missing(&format!("io_uring unavailable here ({why})"));
        }
    }
}

/// A tmpfs of `bytes` mounted at a directory, unmounted when dropped.
struct SmallFs(PathBuf);

impl SmallFs {
    fn mount(at: PathBuf, bytes: u64) -> Result<SmallFs, String> {
        std::fs::create_dir_all(&at).unwrap();
        if !is_root() {
            return Err("mounting a small tmpfs needs root".into());
        }
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(&at)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(SmallFs(at))
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// What is in `dir`, by name.
fn listing(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn a_disk_that_fills_leaves_no_file_behind() {
    let dir = ScratchDir::new("disk-full");
    let source = dir.small_model(11);
    // Room for the header and some tensors, not the whole store (nor the whole model).
    let fs = match SmallFs::mount(dir.join("small"), 256 << 10) {
        Ok(fs) => fs,
        Err(why) => {
            common::environment_missing(&why);
            return;
        }
    };
    let dst = fs.0.join("store.gguf");
    let err = convert(&source, &dst, &ConvertOptions::default(), &mut |_, _| {}).unwrap_err();
    assert!(
        err.to_string().contains("No space left") || err.to_string().contains("os error 28"),
        "{err}"
    );
    assert_eq!(listing(&fs.0), Vec::<String>::new(), "after convert: {err}");
    // The same through the CLI, which must fail.
    let out = common::conductor()
        .args(["convert", "-m"])
        .arg(&source)
        .arg("-o")
        .arg(&dst)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert_eq!(
        listing(&fs.0),
        Vec::<String>::new(),
        "after conductor convert"
    );
    // And a generated model, streamed as `examples/synthetic_model` writes it.
    let model = SyntheticModel::new(&common::small_spec(3)).unwrap();
    let err = model
        .header()
        .write_file_atomic_with(&fs.0.join("model.gguf"), |s| {
            model.write_data(s, &mut |_, _| {})
        })
        .unwrap_err();
    assert_eq!(
        listing(&fs.0),
        Vec::<String>::new(),
        "after generating: {err}"
    );
}

/// A file system that refuses `O_DIRECT` (forced here: the open with it fails as tmpfs's did
/// before Linux 6.6) falls back to the page cache and says so.
#[test]
fn a_file_system_without_o_direct_falls_back() {
    use conductor::runtime::cache::{direct_io_refused, open_for_reads_with};
    let dir = ScratchDir::new("no-direct");
    let path = dir.file("data", || vec![7u8; 4096]);
    let (file, direct) = open_for_reads_with(&path, true, |_| {
        Err(std::io::Error::from_raw_os_error(libc::EINVAL))
    })
    .unwrap();
    assert!(!direct, "the fallback reads through the page cache");
    assert!(direct_io_refused(), "the fallback is noted");
    let mut buf = [0u8; 16];
    file.read_exact_at(&mut buf, 100).unwrap();
    assert_eq!(buf, [7u8; 16]);
    // A file that cannot be opened at all is still an error, not a fallback.
    let missing = dir.join("missing");
    assert!(open_for_reads_with(&missing, true, |_| {
        Err(std::io::Error::from_raw_os_error(libc::EINVAL))
    })
    .is_err());
}
