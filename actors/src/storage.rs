//! The storage actor: the one issuer of reads of the model file.
//!
//! PowerInfer-2 reads cold neurons with positional reads from a single I/O thread (a phone's
//! UFS has one command queue; issuing from several cores loses throughput). This actor owns the
//! file and serves [`ReadAt`] requests on its own host thread, bypassing the page cache with
//! `O_DIRECT` when the plan asks and the file system allows. A read that fails or comes back
//! short is retried once, then reported with the offset and length. The scheduler
//! routes the cold neurons' bundles through it: a load reads one FFN cluster's bundle
//! straight into its cache slot and tells the scheduler; [`LoadClusters`] carries several
//! adjacent ones, fetched with one vectored read.

use crate::scheduler::{ClusterLoaded, SchedulerActor};
use crate::step::StepShared;
use conductor_runtime::cache::{open_for_reads, read_full, BundleFile, LoadError, SlotArena};
use conductor_runtime::schedule::StepId;
use kameo::actor::{Actor, ActorRef};
use kameo::error::Infallible;
use kameo::message::{Context, Message};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::Instant;

/// Alignment of `O_DIRECT` offsets, lengths and buffers (the logical block size of any
/// device we run on divides it).
pub const DIRECT_ALIGN: u64 = 4096;

/// Read `len` bytes at `offset`.
pub struct ReadAt {
    pub offset: u64,
    pub len: usize,
    pub reply: SyncSender<Result<Vec<u8>, StorageError>>,
}

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("storage has no file to read (the model was not loaded from a file)")]
    NoFile,
    #[error("cannot open {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("read of {len} bytes at offset {offset} of {path} failed twice: {source}")]
    Read {
        path: PathBuf,
        offset: u64,
        len: usize,
        source: std::io::Error,
    },
    #[error("read of {len} bytes at offset {offset} of {path} returned {got} bytes twice (file truncated?)")]
    Short {
        path: PathBuf,
        offset: u64,
        len: usize,
        got: usize,
    },
}

/// The file and how it was opened.
pub struct StorageFile {
    path: PathBuf,
    file: File,
    direct: bool,
}

impl StorageFile {
    /// Opens `path` for reading, with `O_DIRECT` if `direct` and the file system accepts it.
    pub fn open(path: &Path, direct: bool) -> Result<StorageFile, StorageError> {
        let open_err = |source| StorageError::Open {
            path: path.to_path_buf(),
            source,
        };
        let (file, direct) = open_for_reads(path, direct).map_err(open_err)?;
        Ok(StorageFile {
            path: path.to_path_buf(),
            file,
            direct,
        })
    }

    /// Whether reads bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Reads exactly `len` bytes at `offset`, retrying once.
    pub fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>, StorageError> {
        match self.try_read(offset, len) {
            Ok(bytes) => Ok(bytes),
            Err(_) => self.try_read(offset, len),
        }
    }

    fn try_read(&self, offset: u64, len: usize) -> Result<Vec<u8>, StorageError> {
        let short = |got| StorageError::Short {
            path: self.path.clone(),
            offset,
            len,
            got,
        };
        let io = |source| StorageError::Read {
            path: self.path.clone(),
            offset,
            len,
            source,
        };
        if !self.direct {
            let mut out = vec![0u8; len];
            let got = read_full(&self.file, &mut out, offset).map_err(io)?;
            return if got == len { Ok(out) } else { Err(short(got)) };
        }
        // O_DIRECT: read the aligned span that covers the request into an aligned buffer.
        let start = offset / DIRECT_ALIGN * DIRECT_ALIGN;
        let end = (offset + len as u64).div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
        let span = (end - start) as usize;
        let mut backing = vec![0u8; span + DIRECT_ALIGN as usize];
        let shift = backing.as_ptr().align_offset(DIRECT_ALIGN as usize);
        let buf = &mut backing[shift..shift + span];
        let got = read_full(&self.file, buf, start).map_err(io)?;
        let skip = (offset - start) as usize;
        let have = got.saturating_sub(skip).min(len);
        if have < len {
            return Err(short(have));
        }
        Ok(buf[skip..skip + len].to_vec())
    }
}

/// The storage actor.
pub struct Storage {
    file: Option<StorageFile>,
    /// Bytes served so far.
    bytes_read: u64,
    shared: Option<Arc<StepShared>>,
    scheduler: Option<ActorRef<SchedulerActor>>,
    queued: QueuedLoads,
}

/// [`LoadClusters`] messages sent to one storage actor and not yet carried out: the scheduler
/// counts one up when it sends, the actor counts it down when done (read, failed or stale), and
/// the scheduler gives the next load to the actor with the fewest. So with several I/O threads
/// a thread whose read finished early takes the next one, as from a shared queue, rather than
/// one thread's mailbox backing up behind a slow read while another idles.
#[derive(Clone, Debug, Default)]
pub struct QueuedLoads(Arc<AtomicU32>);

impl QueuedLoads {
    pub(crate) fn get(&self) -> u32 {
        self.0.load(Ordering::Acquire)
    }

    pub(crate) fn add(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn done(&self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Counts one [`LoadClusters`] done however its handler returns.
struct DoneOnDrop(QueuedLoads);

impl Drop for DoneOnDrop {
    fn drop(&mut self) {
        self.0.done();
    }
}

/// What the storage actor starts with.
pub struct StorageArgs {
    /// The model file for [`ReadAt`].
    pub file: Option<StorageFile>,
    /// The engine's shared state (cache slots, bundle file, counters), for [`LoadCluster`].
    pub(crate) shared: Option<Arc<StepShared>>,
    pub(crate) scheduler: Option<ActorRef<SchedulerActor>>,
    /// This actor's count of loads sent and not yet done.
    pub(crate) queued: QueuedLoads,
}

/// One unit of a [`LoadClusters`]: read `(layer, cluster)` into cache slot `slot`.
pub struct LoadItem {
    pub layer: u32,
    pub cluster: u32,
    pub slot: u32,
    /// The slot's generation when the load was decided: a load overtaken by a newer one for
    /// the same slot (after a failed step, with several I/O threads) reads nothing.
    pub generation: u64,
    /// Gate-first loading: only these pages of the unit (`None`: all of it).
    pub pages: Option<std::ops::Range<u32>>,
}

/// Read these units (the scheduler's `Load`s; adjacent ones in the file, so one vectored read
/// fetches them all) and answer each with a [`ClusterLoaded`] to the scheduler.
pub struct LoadClusters {
    pub step: StepId,
    pub items: Vec<LoadItem>,
}

impl Actor for Storage {
    type Args = StorageArgs;
    type Error = Infallible;

    async fn on_start(args: StorageArgs, _: ActorRef<Self>) -> Result<Self, Infallible> {
        Ok(Storage {
            file: args.file,
            bytes_read: 0,
            shared: args.shared,
            scheduler: args.scheduler,
            queued: args.queued,
        })
    }
}

impl Message<LoadClusters> for Storage {
    type Reply = ();

    async fn handle(&mut self, msg: LoadClusters, _: &mut Context<Self, ()>) {
        let _done = DoneOnDrop(self.queued.clone());
        let (Some(shared), Some(scheduler)) = (&self.shared, &self.scheduler) else {
            return;
        };
        let Some((arena, file)) = &shared.cache else {
            return;
        };
        // Bytes each item read (some pages of a bundle read less than the whole).
        let mut many: Vec<Result<u64, LoadError>>;
        let timed = shared.recording.load(Ordering::Relaxed);
        let started_ns = if timed { shared.now_ns() } else { 0 };
        let started = Instant::now();
        let mut one = [Ok(0)];
        let items = msg.items.as_slice();
        let parts = |it: &LoadItem| it.pages.is_some() && file.part_ready(it.layer, it.cluster);
        let results: &mut [Result<u64, LoadError>] = if let [it] = items {
            // One unit (the default: loads are not batched): no lists to build.
            let mut slot = arena.write(it.slot);
            if arena.generation(it.slot) != it.generation {
                return; // stale: the slot was given to another unit since
            }
            one[0] = file.load_part(it.layer, it.cluster, it.pages.clone(), slot.bytes_mut());
            &mut one
        } else if items.iter().all(parts) {
            // Runs of pages (gate-first loading), in flight together.
            let Some(results) = read_parts(arena, file, items) else {
                return; // stale
            };
            many = results;
            &mut many
        } else if items.iter().any(|it| it.pages.is_some()) {
            // Pages and whole units mixed (the scheduler actor does not batch them so): one
            // after another.
            many = Vec::with_capacity(items.len());
            for it in items {
                let mut slot = arena.write(it.slot);
                if arena.generation(it.slot) != it.generation {
                    return; // stale
                }
                many.push(file.load_part(it.layer, it.cluster, it.pages.clone(), slot.bytes_mut()));
            }
            &mut many
        } else {
            // Lock slots in increasing order of index: two storage threads (a stale read and a
            // new one) never wait on each other in opposite orders.
            let mut order: Vec<usize> = (0..msg.items.len()).collect();
            order.sort_by_key(|&i| msg.items[i].slot);
            let mut locked: Vec<Option<_>> = msg.items.iter().map(|_| None).collect();
            for i in order {
                locked[i] = Some(arena.write(msg.items[i].slot));
            }
            let mut guards: Vec<_> = locked.into_iter().flatten().collect();
            if msg
                .items
                .iter()
                .any(|it| arena.generation(it.slot) != it.generation)
            {
                return; // stale: a slot was given to another unit since
            }
            let mut units: Vec<(u32, u32, &mut [u8])> = msg
                .items
                .iter()
                .zip(guards.iter_mut())
                .map(|(it, g)| (it.layer, it.cluster, g.bytes_mut()))
                .collect();
            many = file
                .load_run(&mut units)
                .into_iter()
                .zip(items)
                .map(|(r, it)| r.map(|()| file.read_bytes(it.layer, it.cluster)))
                .collect();
            &mut many
        };
        let c = &shared.counters;
        c.io_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        c.reads.fetch_add(1, Ordering::Relaxed);
        let finished_ns = if timed { shared.now_ns() } else { 0 };
        for (it, result) in msg.items.iter().zip(results.iter_mut()) {
            let result = std::mem::replace(result, Ok(0));
            if let Ok(bytes) = result {
                c.io_bytes.fetch_add(bytes, Ordering::Relaxed);
                if let Some(l) = c.layer_bytes.get(it.layer as usize) {
                    l.fetch_add(bytes, Ordering::Relaxed);
                }
                c.loads.fetch_add(1, Ordering::Relaxed);
                self.bytes_read += bytes;
            }
            let _ = scheduler
                .tell(ClusterLoaded {
                    step: msg.step,
                    layer: it.layer,
                    cluster: it.cluster,
                    result: result.map(|_| ()),
                    started_ns,
                    finished_ns,
                })
                .try_send();
        }
    }
}

/// Reads the pages of `items` (every one some pages of a bundle whose checksum was confirmed)
/// with [`BundleFile::load_parts`], all in flight together: each slot locked once (in
/// increasing order, as for whole units), each item's pages carved out of it. `None` when a
/// slot was given to another unit since (stale). The bytes each item read, in item order.
fn read_parts(
    arena: &SlotArena,
    file: &BundleFile,
    items: &[LoadItem],
) -> Option<Vec<Result<u64, LoadError>>> {
    let page = conductor_runtime::store::STORE_ALIGN as usize;
    let mut slots: Vec<u32> = items.iter().map(|it| it.slot).collect();
    slots.sort_unstable();
    slots.dedup();
    let mut guards: Vec<_> = slots.iter().map(|&s| arena.write(s)).collect();
    if items
        .iter()
        .any(|it| arena.generation(it.slot) != it.generation)
    {
        return None;
    }
    // A slot's items in page order: their runs are disjoint, so each gets its own slice.
    let first_page = |i: usize| items[i].pages.as_ref().map_or(0, |p| p.start);
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| (items[i].slot, first_page(i)));
    let mut results: Vec<Result<u64, LoadError>> = items.iter().map(|_| Ok(0)).collect();
    let mut parts = Vec::with_capacity(items.len());
    let mut index = Vec::with_capacity(items.len());
    let mut next = order.iter().peekable();
    for (guard, &slot) in guards.iter_mut().zip(&slots) {
        let mut rest: &mut [u8] = guard.bytes_mut();
        let mut at = 0;
        while let Some(&i) = next.next_if(|&&i| items[i].slot == slot) {
            let it = &items[i];
            let pages = it.pages.clone().unwrap_or(0..0);
            let start = pages.start as usize * page;
            if start < at || start > at + rest.len() {
                results[i] = Err(LoadError {
                    what: format!("layer {} cluster {} pages {pages:?}", it.layer, it.cluster),
                    path: String::new(),
                    why: "runs of pages overlap or lie past the slot".into(),
                });
                continue;
            }
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(start - at);
            let len = (pages.len() * page).min(tail.len());
            let (dst, tail) = tail.split_at_mut(len);
            rest = tail;
            at = start + len;
            parts.push((it.layer, it.cluster, pages, dst));
            index.push(i);
        }
    }
    for (i, result) in index.into_iter().zip(file.load_parts(&mut parts)) {
        results[i] = result;
    }
    Some(results)
}

impl Message<ReadAt> for Storage {
    type Reply = ();

    async fn handle(&mut self, msg: ReadAt, _: &mut Context<Self, ()>) {
        let result = match &self.file {
            Some(file) => file.read_at(msg.offset, msg.len),
            None => Err(StorageError::NoFile),
        };
        if result.is_ok() {
            self.bytes_read += msg.len as u64;
        }
        let _ = msg.reply.send(result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(len: usize) -> PathBuf {
        let path =
            std::env::temp_dir().join(format!("conductor-storage-{}-{len}", std::process::id()));
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn unaligned_reads_return_exactly_the_bytes_direct_or_not() {
        let path = temp_file(50_000);
        let expected: Vec<u8> = (0..50_000).map(|i| (i * 7 % 251) as u8).collect();
        for direct in [false, true] {
            let f = StorageFile::open(&path, direct).unwrap();
            for (offset, len) in [
                (0, 1),
                (1, 4095),
                (4095, 2),
                (12_345, 10_000),
                (49_000, 1000),
            ] {
                let got = f.read_at(offset as u64, len).unwrap();
                assert_eq!(
                    got,
                    expected[offset..offset + len],
                    "direct={direct} at {offset}"
                );
            }
        }
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn reads_past_the_end_are_short_errors_naming_the_offset() {
        let path = temp_file(10_000);
        for direct in [false, true] {
            let f = StorageFile::open(&path, direct).unwrap();
            let err = f.read_at(9_000, 2_000).unwrap_err();
            assert!(
                matches!(err, StorageError::Short { got: 1000, .. }),
                "{err}"
            );
            assert!(err.to_string().contains("offset 9000"));
        }
        std::fs::remove_file(path).unwrap();
        assert!(matches!(
            StorageFile::open(Path::new("/nonexistent/model.gguf"), false),
            Err(StorageError::Open { .. })
        ));
    }
}
