//! The storage actor: the one issuer of reads of the model file.
//!
//! PowerInfer-2 reads cold neurons with positional reads from a single I/O thread (a phone's
//! UFS has one command queue; issuing from several cores loses throughput). This actor owns the
//! file and serves [`ReadAt`] requests on its own host thread, bypassing the page cache with
//! `O_DIRECT` when the plan asks and the file system allows. A read that fails or comes back
//! short is retried once, then reported with the offset and length. The scheduler
//! routes the cold neurons' bundles through it: a [`LoadClusters`] carries one read run the
//! scheduler decided (one unit, adjacent bundles fetched with one vectored read, or runs in
//! flight together with io_uring), read straight into the cache slots
//! ([`conductor_runtime::cache::read_slots`]), each unit answered to the scheduler.
//!
//! Supervision as for the groups: a panic while reading is caught by kameo and reported to
//! the scheduler by `on_panic` ([`StorageFailed`]), which fails the step in flight; an actor
//! that stops (killed, or its host gone) reports from its destructor. Either way the scheduler
//! never waits for loads that will not come.

use crate::protocol::{ClusterLoaded, InjectPanic};
pub use crate::protocol::{LoadClusters, ReadAt, StorageError, StorageFailed};
use crate::step::StepShared;
use conductor_runtime::cache::{open_for_reads, read_full, read_slots};
use kameo::actor::{Actor, ActorRef, Recipient, WeakActorRef};
use kameo::error::{ActorStopReason, Infallible, PanicError};
use kameo::message::{Context, Message};
use std::fs::File;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Alignment of `O_DIRECT` offsets, lengths and buffers (the logical block size of any
/// device we run on divides it).
pub const DIRECT_ALIGN: u64 = 4096;

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
    scheduler: Option<Recipient<ClusterLoaded>>,
    queued: QueuedLoads,
    /// Where failures go (`None`: no scheduler to tell).
    failed: Option<Recipient<StorageFailed>>,
    /// `storage{i}`, for reports.
    name: String,
    /// Fault injection for tests: the next [`LoadClusters`] panics.
    panic_next: bool,
}

impl Storage {
    fn report(&self, why: String) {
        if let Some(failed) = &self.failed {
            // If the scheduler is gone the driver already sees its reply channel closed.
            let _ = failed.tell(StorageFailed { why }).try_send();
        }
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        self.report(format!("storage `{}` stopped", self.name));
    }
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
    /// The engine's shared state (cache slots, bundle file, counters), for [`LoadClusters`].
    pub(crate) shared: Option<Arc<StepShared>>,
    pub(crate) scheduler: Option<Recipient<ClusterLoaded>>,
    /// This actor's count of loads sent and not yet done.
    pub(crate) queued: QueuedLoads,
    /// Where the actor reports its failures.
    pub(crate) failed: Option<Recipient<StorageFailed>>,
    /// `storage{i}`.
    pub(crate) name: String,
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
            failed: args.failed,
            name: args.name,
            panic_next: false,
        })
    }

    /// A panic while reading fails the step in flight; the actor carries on (its file and
    /// counters are intact; the slots of the failed run are forgotten by the scheduler).
    async fn on_panic(
        &mut self,
        _: WeakActorRef<Self>,
        err: PanicError,
    ) -> Result<ControlFlow<ActorStopReason>, Infallible> {
        let why = err
            .with_str(|s| format!("storage `{}` panicked: {s}", self.name))
            .unwrap_or_else(|| format!("storage `{}` panicked: {err:?}", self.name));
        self.report(why);
        Ok(ControlFlow::Continue(()))
    }
}

impl Message<InjectPanic> for Storage {
    type Reply = ();

    async fn handle(&mut self, _: InjectPanic, _: &mut Context<Self, ()>) {
        self.panic_next = true;
    }
}

impl Message<LoadClusters> for Storage {
    type Reply = ();

    async fn handle(&mut self, msg: LoadClusters, _: &mut Context<Self, ()>) {
        let _done = DoneOnDrop(self.queued.clone());
        if std::mem::take(&mut self.panic_next) {
            panic!("injected fault in storage `{}`", self.name);
        }
        let (Some(shared), Some(scheduler)) = (&self.shared, &self.scheduler) else {
            return;
        };
        let Some((arena, file)) = &shared.cache else {
            return;
        };
        let timed = shared.recording.load(Ordering::Relaxed);
        let started_ns = if timed { shared.now_ns() } else { 0 };
        let started = Instant::now();
        let c = &shared.counters;
        let bytes_read = &mut self.bytes_read;
        // Each unit goes to the scheduler as soon as it is in (its slot already released), so
        // its cluster can compute while the rest of the run is still being read.
        let fresh = read_slots(arena, file, &msg.items, |i, result| {
            let it = &msg.items[i];
            if let Ok(bytes) = result {
                c.io_bytes.fetch_add(bytes, Ordering::Relaxed);
                if let Some(l) = c.layer_bytes.get(it.layer as usize) {
                    l.fetch_add(bytes, Ordering::Relaxed);
                }
                c.loads.fetch_add(1, Ordering::Relaxed);
                *bytes_read += bytes;
            }
            let _ = scheduler
                .tell(ClusterLoaded {
                    step: msg.step,
                    layer: it.layer,
                    cluster: it.cluster,
                    result: result.map(|_| ()),
                    started_ns,
                    finished_ns: if timed { shared.now_ns() } else { 0 },
                })
                .try_send();
        });
        if fresh {
            c.io_ns
                .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            c.reads.fetch_add(1, Ordering::Relaxed);
        }
    }
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
