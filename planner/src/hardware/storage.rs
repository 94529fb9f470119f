//! Storage read curves, measured on a temporary file: random reads by size and queue depth,
//! sequential reads by size, and the latency of one small read.
//!
//! Reads bypass the page cache with O_DIRECT where the file system allows it; otherwise they
//! are buffered and the file's cached pages are dropped (`posix_fadvise(DONTNEED)`) before each
//! repetition, and the profile says so. Queue depth N is emulated by N threads, each keeping one
//! blocking `pread` in flight: N reads outstanding, as an asynchronous queue of depth N would
//! keep, without io_uring (which Android apps cannot use).

use super::timing::{median, Effort};
use super::MeasureError;
use conductor_runtime::cache::read_full;
use conductor_runtime::plan::{StorageProfile, StorageRate};
use conductor_runtime::sample::SplitMix64;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Read sizes of both curves.
pub const SIZES: [u64; 8] = [
    4 << 10,
    8 << 10,
    16 << 10,
    32 << 10,
    64 << 10,
    128 << 10,
    256 << 10,
    512 << 10,
];
/// Queue depths of the random-read curve: up to the 32 reads one io_uring submission keeps in
/// flight ([`conductor_runtime::cache::RING_ENTRIES`]), so a run's reads can be set beside the
/// device's rate at the depth they were offered (`conductor bench --memory`). An NVMe or
/// virtual disk serves small reads several times faster at 32 than at 8.
pub const QUEUE_DEPTHS: [u32; 6] = [1, 2, 4, 8, 16, 32];
/// The smallest test file: a few of the largest reads must fit at distinct offsets.
pub const MIN_FILE_BYTES: u64 = 4 << 20;
const MIB: u64 = 1 << 20;
/// O_DIRECT wants buffers, offsets and lengths aligned to the logical block (4096 covers it).
const ALIGN: usize = 4096;

/// What the storage measurement found, and what the profile's description should say about it.
pub struct StorageOutcome {
    pub profile: StorageProfile,
    pub notes: Vec<String>,
}

/// A temporary file that is removed when dropped: after the measurement, on error, on panic.
struct TempFile {
    path: PathBuf,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn unique_name(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        ".conductor-profile-hw-{tag}-{}-{nanos}.tmp",
        std::process::id()
    )
}

fn dir_error(dir: &Path, why: impl Into<String>) -> MeasureError {
    MeasureError::StorageDir {
        dir: dir.to_path_buf(),
        why: why.into(),
    }
}

/// Creates a new file in `dir`, saying why not in the error.
fn create_in(dir: &Path, tag: &str) -> Result<(TempFile, File), MeasureError> {
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(dir_error(dir, "does not exist"))
        }
        Err(e) => return Err(dir_error(dir, format!("cannot be read: {e}"))),
        Ok(m) if !m.is_dir() => return Err(dir_error(dir, "is not a directory")),
        Ok(_) => {}
    }
    let path = dir.join(unique_name(tag));
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| dir_error(dir, format!("cannot create a file there: {e}")))?;
    Ok((TempFile { path }, file))
}

/// Fails early (before a minute of compute measurements) if no file can be created in `dir`.
pub fn check_dir(dir: &Path) -> Result<(), MeasureError> {
    let (probe, file) = create_in(dir, "probe")?;
    drop(file);
    drop(probe);
    Ok(())
}

/// A heap buffer with a 4096-aligned window of `len` bytes (over-allocated, then sliced at an
/// aligned offset: no `unsafe`, no custom allocator).
struct AlignedBuf {
    raw: Vec<u8>,
    off: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let raw = vec![0u8; len + ALIGN];
        let off = (ALIGN - raw.as_ptr() as usize % ALIGN) % ALIGN;
        AlignedBuf { raw, off, len }
    }

    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.off..self.off + self.len]
    }
}

/// Writes `len` bytes of incompressible data, every 4 KiB block different (so neither a
/// compressing nor a deduplicating device or host can shortcut the reads).
fn write_data(file: &mut File, len: u64) -> std::io::Result<()> {
    let mut rng = SplitMix64::new(42);
    let mut chunk = vec![0u8; MIB as usize];
    for w in chunk.chunks_exact_mut(8) {
        w.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    for i in 0..len / MIB {
        for (b, block) in chunk.chunks_exact_mut(ALIGN).enumerate() {
            block[..8].copy_from_slice(&(i << 16 | b as u64).to_le_bytes());
        }
        file.write_all(&chunk)?;
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Direct,
    Buffered,
}

/// A file opened for the measurement, and how its reads are made.
struct Reader {
    file: File,
    mode: Mode,
    /// Why reads are buffered (`None`: O_DIRECT).
    why_buffered: Option<String>,
}

/// Opens `path` for O_DIRECT reads if the file system accepts them (checked with one aligned
/// read), else for buffered reads, with the reason.
fn open_reader(path: &Path) -> Result<Reader, MeasureError> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let why = {
        use std::os::unix::fs::OpenOptionsExt;
        let flags = rustix::fs::OFlags::DIRECT.bits() as i32;
        match OpenOptions::new().read(true).custom_flags(flags).open(path) {
            Ok(f) => {
                let mut buf = AlignedBuf::new(ALIGN);
                match f.read_at(buf.as_mut(), 0) {
                    Ok(n) if n == ALIGN => {
                        return Ok(Reader {
                            file: f,
                            mode: Mode::Direct,
                            why_buffered: None,
                        })
                    }
                    Ok(n) => format!("an O_DIRECT read returned {n} of {ALIGN} bytes"),
                    Err(e) => format!("the file system refused an O_DIRECT read ({e})"),
                }
            }
            Err(e) => format!("the file system refused O_DIRECT ({e})"),
        }
    };
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let why = String::from("O_DIRECT is Linux-only");
    let file = File::open(path).map_err(|e| io_error(path, "open", e))?;
    Ok(Reader {
        file,
        mode: Mode::Buffered,
        why_buffered: Some(why),
    })
}

fn io_error(path: &Path, op: &'static str, source: std::io::Error) -> MeasureError {
    MeasureError::StorageIo {
        path: path.to_path_buf(),
        op,
        source,
    }
}

/// Buffered mode: drops the file's cached pages and sets the read-ahead hint for the pattern.
#[cfg_attr(
    not(any(target_os = "linux", target_os = "android")),
    allow(unused_variables)
)]
fn uncache(file: &File, mode: Mode, sequential: bool) {
    if mode == Mode::Direct {
        return;
    }
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        use rustix::fs::{fadvise, Advice};
        // Best effort: the measurement stands without the hints, and the profile says how
        // reads were made.
        let _ = fadvise(file, 0, None, Advice::DontNeed);
        let hint = if sequential {
            Advice::Sequential
        } else {
            Advice::Random
        };
        let _ = fadvise(file, 0, None, hint);
    }
}

/// One repetition of random reads of `size` bytes with `depth` threads for about `dur`:
/// MB/s over all threads, and each read's latency in seconds if `record`.
fn random_rep(
    file: &File,
    len: u64,
    size: u64,
    depth: u32,
    dur: Duration,
    seed: u64,
    record: bool,
) -> std::io::Result<(f64, Vec<f64>)> {
    let blocks = len / size;
    let deadline = Instant::now() + dur;
    type Thread = std::io::Result<(u64, Instant, Instant, Vec<f64>)>;
    let results: Vec<Thread> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..depth)
            .map(|t| {
                s.spawn(move || -> Thread {
                    let mut buf = AlignedBuf::new(size as usize);
                    let mut rng = SplitMix64::new(seed * 64 + t as u64);
                    let mut latencies = Vec::new();
                    let mut bytes = 0;
                    let start = Instant::now();
                    loop {
                        let off = rng.below(blocks) * size;
                        let t0 = Instant::now();
                        file.read_exact_at(buf.as_mut(), off)?;
                        if record {
                            latencies.push(t0.elapsed().as_secs_f64());
                        }
                        bytes += size;
                        if Instant::now() >= deadline {
                            break;
                        }
                    }
                    Ok((bytes, start, Instant::now(), latencies))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a storage thread panicked"))
            .collect()
    });
    let mut bytes = 0;
    let mut span: Option<(Instant, Instant)> = None;
    let mut latencies = Vec::new();
    for r in results {
        let (b, start, end, lat) = r?;
        bytes += b;
        latencies.extend(lat);
        span = Some(match span {
            None => (start, end),
            Some((s, e)) => (s.min(start), e.max(end)),
        });
    }
    let (start, end) = span.expect("at least one thread");
    let secs = (end - start).as_secs_f64().max(1e-9);
    Ok((bytes as f64 / secs / 1e6, latencies))
}

/// One repetition of sequential reads of `size` bytes from `from` for about `dur` (at most one
/// pass over the file): MB/s.
fn sequential_rep(
    file: &File,
    len: u64,
    size: u64,
    from: u64,
    dur: Duration,
) -> std::io::Result<f64> {
    let mut buf = AlignedBuf::new(size as usize);
    let mut off = from / size * size;
    let mut bytes = 0;
    let start = Instant::now();
    let deadline = start + dur;
    loop {
        if off + size > len {
            off = 0;
        }
        file.read_exact_at(buf.as_mut(), off)?;
        off += size;
        bytes += size;
        if bytes >= len || Instant::now() >= deadline {
            break;
        }
    }
    Ok(bytes as f64 / start.elapsed().as_secs_f64().max(1e-9) / 1e6)
}

/// What the profile can say about the device under `dir`.
struct Device {
    /// For the profile's `storage.name`.
    name: String,
    single_queue: bool,
    /// Why `single_queue` is what it is (for the description).
    why: String,
    /// The file system lives in memory (tmpfs, ramfs): the "storage" figures are RAM's.
    in_memory: bool,
}

/// The block device under `dir`, from statfs and sysfs.
fn describe_device(dir: &Path) -> Device {
    let unknown = Device {
        name: format!("file system at {}", dir.display()),
        single_queue: false,
        why: "single_queue = false: the block device could not be identified; on a server \
              (NVMe, virtio, SCSI) there is no reliable way to tell a single-queue device"
            .into(),
        in_memory: false,
    };
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        use rustix::fs::{major, minor, stat, statfs};
        // statfs(2) magic numbers (linux/magic.h); the value is 32 bits whatever f_type's type.
        const TMPFS_MAGIC: u32 = 0x0102_1994;
        const RAMFS_MAGIC: u32 = 0x8584_58f6;
        if let Ok(fs) = statfs(dir) {
            if matches!(fs.f_type as u32, TMPFS_MAGIC | RAMFS_MAGIC) {
                return Device {
                    name: format!("memory file system (tmpfs) at {}", dir.display()),
                    single_queue: false,
                    why: format!(
                        "WARNING: {} is a memory file system (tmpfs/ramfs), so the storage \
                         figures are memory speeds, not a storage device's; measure again with \
                         a storage directory on disk",
                        dir.display()
                    ),
                    in_memory: true,
                };
            }
        }
        let Ok(st) = stat(dir) else {
            return unknown;
        };
        let link = format!("/sys/dev/block/{}:{}", major(st.st_dev), minor(st.st_dev));
        let Ok(sys) = std::fs::canonicalize(&link) else {
            return unknown;
        };
        // A partition's attributes (model, queue) live on its parent disk.
        let disk = if sys.join("partition").exists() {
            sys.parent().map_or(sys.clone(), Path::to_path_buf)
        } else {
            sys.clone()
        };
        let dev = disk
            .file_name()
            .map_or(String::new(), |n| n.to_string_lossy().into_owned());
        let model = std::fs::read_to_string(disk.join("device/model"))
            .map(|m| m.trim().to_string())
            .unwrap_or_default();
        let name = if model.is_empty() {
            format!("{dev} (file system at {})", dir.display())
        } else {
            format!("{dev}: {model} (file system at {})", dir.display())
        };
        let (single_queue, why) = if dev.starts_with("mmcblk") {
            (
                true,
                "single_queue = true: an eMMC device (mmcblk), one command queue".to_string(),
            )
        } else if disk.to_string_lossy().to_lowercase().contains("ufs") {
            (
                true,
                "single_queue = true: the device sits under a UFS host controller, one command \
                 queue"
                    .to_string(),
            )
        } else {
            (
                false,
                format!(
                    "single_queue = false: {dev} is not a UFS/eMMC device as far as sysfs shows; \
                     on a server (NVMe, virtio, SCSI) one cannot reliably tell whether issuers \
                     share one queue"
                ),
            )
        };
        Device {
            name,
            single_queue,
            why,
            in_memory: false,
        }
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    unknown
}

fn size_label(size: u64) -> String {
    format!("{}K", size >> 10)
}

/// The bytes of the existing file `path` a measurement reads (whole MiB), or why it cannot be
/// measured on.
pub fn measurable_len(path: &Path) -> Result<u64, MeasureError> {
    let len = std::fs::metadata(path)
        .map_err(|e| io_error(path, "stat", e))?
        .len();
    if len / MIB * MIB < MIN_FILE_BYTES {
        return Err(MeasureError::StorageTooSmall {
            bytes: len,
            min: MIN_FILE_BYTES,
        });
    }
    Ok(len / MIB * MIB)
}

/// Queue depths at which a file's own reads are replayed: the I/O threads the planner tries.
pub const REPLAY_DEPTHS: [u32; 2] = [1, 2];

/// Measures by reading the existing file `path` (whole MiB of it; it is never written): the
/// figures of the device, file system and placement a model is actually read from.
///
/// `reads` (offset, length), when given, are the reads a run of this file issues, in its
/// order: after the curves they are replayed at each of [`REPLAY_DEPTHS`] (that many threads
/// taking the next read in turn), cycling, into `buffers` distinct buffers in turn (a run's
/// cache slots; at least one per thread), and each read size's rate replaces the random
/// table's figure at that depth and size. On a shared virtual disk the rate of a run's stream
/// of reads differs from what the same sizes give in the curve's short samples at uniformly
/// random offsets (`docs/benchmarks-journal.md`, 2026-11-25, third session), and the simulator predicts
/// a run from the figures at the sizes it reads.
pub fn measure_storage_on(
    path: &Path,
    reads: &[(u64, usize)],
    buffers: usize,
    effort: &Effort,
    progress: &mut dyn FnMut(&str),
) -> Result<StorageOutcome, MeasureError> {
    let len = measurable_len(path)?;
    let what = format!(
        "the existing file {} ({} MiB read, never written)",
        path.display(),
        len / MIB
    );
    let reader = open_reader(path)?;
    let mut outcome = measure_reads(path, &reader, len, &what, effort, progress)?;
    if reads.is_empty() {
        return Ok(outcome);
    }
    let duration = effort.storage_target * (effort.storage_reps as u32 * 10);
    let mut replayed = 0;
    let mut sizes = std::collections::BTreeSet::new();
    for depth in REPLAY_DEPTHS {
        let (rates, count) = replay_reads(&reader, reads, duration, depth, buffers)
            .map_err(|e| io_error(path, "read", e))?;
        replayed = count;
        let mut line = format!(
            "storage: the file's own reads, replayed (QD{depth}, into {} buffers):",
            buffers.max(depth as usize)
        );
        for &(size, mbps) in &rates {
            line += &format!(" {} {mbps:.0}", size_label(size));
            sizes.insert(size);
        }
        progress(&format!("{line} MB/s"));
        merge_rates(&mut outcome.profile.random, &rates, depth);
    }
    outcome.notes.push(format!(
        "Random reads of {} at queue depths {} come from replaying the {} reads a run of this \
         file issues, in its order, for {:.1} s at each depth (N threads taking the next read in \
         turn, into {} buffers in turn as into a cache's slots, at least one per thread; per \
         size: N x bytes / time spent reading them).",
        sizes
            .iter()
            .map(|size| format!("{size} B"))
            .collect::<Vec<_>>()
            .join(", "),
        REPLAY_DEPTHS
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(" and "),
        replayed,
        duration.as_secs_f64(),
        buffers.max(1)
    ));
    Ok(outcome)
}

/// Replays `reads` of `reader`'s file in order with `depth` threads, each taking the next read
/// in turn, cycling, for about `duration` (at least one pass). The threads read into `buffers`
/// distinct buffers (at least one each), each thread cycling through its share: where the
/// bytes land changes what this VM's disk gives (see
/// [`super::MeasureOptions::storage_replay_buffers`]). Returns MB/s at that depth by
/// read size, ascending, of the sizes read at least 8 times — `depth` × bytes / seconds spent
/// reading them, so that with `depth` reads in flight one read of the size costs
/// bytes × depth / rate, as the simulator computes it — and how many of `reads` were replayed
/// (those that run past the file's end are not).
fn replay_reads(
    reader: &Reader,
    reads: &[(u64, usize)],
    duration: Duration,
    depth: u32,
    buffers: usize,
) -> std::io::Result<(Vec<(u64, f64)>, usize)> {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let depth = depth.max(1);
    let file_len = reader.file.metadata()?.len();
    let reads: Vec<(u64, usize)> = reads
        .iter()
        .copied()
        .filter(|&(offset, len)| len > 0 && offset.saturating_add(len as u64) <= file_len)
        .collect();
    let Some(longest) = reads.iter().map(|&(_, len)| len).max() else {
        return Ok((Vec::new(), 0));
    };
    let depth_n = depth as usize;
    // Thread k's share of the buffers: `max(buffers, depth)` in all, at least one each.
    let share = |k: usize| (buffers / depth_n + usize::from(k < buffers % depth_n)).max(1);
    let next = AtomicUsize::new(0);
    let start = Instant::now();
    // Per thread: size -> (reads, seconds).
    type Tally = std::io::Result<BTreeMap<u64, (u32, f64)>>;
    let tallies: Vec<Tally> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..depth_n)
            .map(|k| {
                let (next, reads, reader) = (&next, &reads, reader);
                let per_thread = share(k);
                s.spawn(move || -> Tally {
                    // Rounded up to whole blocks: O_DIRECT reads need aligned lengths.
                    let mut bufs: Vec<AlignedBuf> = (0..per_thread)
                        .map(|_| AlignedBuf::new(longest.div_ceil(ALIGN) * ALIGN))
                        .collect();
                    let mut by_size = BTreeMap::new();
                    let mut turn = 0;
                    loop {
                        let buf = &mut bufs[turn % per_thread];
                        turn += 1;
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= reads.len() && start.elapsed() >= duration {
                            return Ok(by_size);
                        }
                        let (offset, len) = reads[i % reads.len()];
                        let want = if reader.mode == Mode::Direct {
                            len.div_ceil(ALIGN) * ALIGN
                        } else {
                            len
                        };
                        let t0 = Instant::now();
                        let got = read_full(&reader.file, &mut buf.as_mut()[..want], offset)?;
                        let secs = t0.elapsed().as_secs_f64();
                        if got >= len {
                            let e = by_size.entry(len as u64).or_insert((0u32, 0.0f64));
                            e.0 += 1;
                            e.1 += secs;
                        }
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a storage thread panicked"))
            .collect()
    });
    let mut by_size: BTreeMap<u64, (u32, f64)> = BTreeMap::new();
    for tally in tallies {
        for (size, (n, secs)) in tally? {
            let e = by_size.entry(size).or_insert((0, 0.0));
            e.0 += n;
            e.1 += secs;
        }
    }
    let rates = by_size
        .into_iter()
        .filter(|&(_, (n, secs))| n >= 8 && secs > 0.0)
        .map(|(size, (n, secs))| {
            let bytes = size as f64 * f64::from(n);
            (size, f64::from(depth) * bytes / secs / 1e6)
        })
        .collect();
    Ok((rates, reads.len()))
}

/// Puts `rates` (size, MB/s) into `table` at `depth`, replacing a figure of the same size and
/// depth.
fn merge_rates(table: &mut Vec<StorageRate>, rates: &[(u64, f64)], depth: u32) {
    for &(size_bytes, mbps) in rates {
        table.retain(|r| !(r.queue_depth == depth && r.size_bytes == size_bytes));
        table.push(StorageRate {
            size_bytes,
            queue_depth: depth,
            mbps,
        });
    }
    table.sort_by_key(|r| (r.size_bytes, r.queue_depth));
}

/// Writes a test file of `bytes` (rounded down to whole MiB) in `dir`, measures, removes it.
pub fn measure_storage(
    dir: &Path,
    bytes: u64,
    effort: &Effort,
    progress: &mut dyn FnMut(&str),
) -> Result<StorageOutcome, MeasureError> {
    measure_storage_with(dir, bytes, effort, progress, false)
}

/// [`measure_storage`]; `buffered` skips O_DIRECT (to test the fallback on file systems that
/// accept O_DIRECT).
fn measure_storage_with(
    dir: &Path,
    bytes: u64,
    effort: &Effort,
    progress: &mut dyn FnMut(&str),
    buffered: bool,
) -> Result<StorageOutcome, MeasureError> {
    let len = bytes / MIB * MIB;
    if len < MIN_FILE_BYTES {
        return Err(MeasureError::StorageTooSmall {
            bytes,
            min: MIN_FILE_BYTES,
        });
    }
    let (tmp, mut file) = create_in(dir, "data")?;
    progress(&format!(
        "storage: writing a {} MiB test file {}",
        len / MIB,
        tmp.path.display()
    ));
    write_data(&mut file, len).map_err(|e| io_error(&tmp.path, "write", e))?;
    file.sync_all()
        .map_err(|e| io_error(&tmp.path, "fsync", e))?;
    drop(file);
    let reader = if buffered {
        Reader {
            file: File::open(&tmp.path).map_err(|e| io_error(&tmp.path, "open", e))?,
            mode: Mode::Buffered,
            why_buffered: Some("O_DIRECT not tried".to_string()),
        }
    } else {
        open_reader(&tmp.path)?
    };
    let what = format!(
        "a {} MiB file in {} (written first, removed after)",
        len / MIB,
        dir.display()
    );
    let outcome = measure_reads(&tmp.path, &reader, len, &what, effort, progress);
    drop(reader);
    drop(tmp);
    outcome
}

/// The read curves of `len` bytes of the file at `path`, opened as `reader`; the profile's
/// notes describe it as `what`.
fn measure_reads(
    path: &Path,
    reader: &Reader,
    len: u64,
    what: &str,
    effort: &Effort,
    progress: &mut dyn FnMut(&str),
) -> Result<StorageOutcome, MeasureError> {
    let Reader {
        file,
        mode,
        why_buffered,
    } = reader;
    let mode = *mode;
    let read_err = |e| io_error(path, "read", e);
    let mut notes = Vec::new();
    match why_buffered {
        None => notes.push(format!("Storage: O_DIRECT preads on {what}.")),
        Some(why) => notes.push(format!(
            "Storage: BUFFERED preads ({why}); the file's cached pages were dropped with \
             posix_fadvise(DONTNEED) before each repetition, so figures may include read-ahead \
             or cache effects. On {what}."
        )),
    }
    notes.push(
        "Queue depth N = N threads each issuing blocking preads (N reads in flight); random \
         offsets are uniform over the whole file, aligned to the read size; latency_us = median \
         4 KiB random read at depth 1; sequential = one thread reading consecutive offsets; each \
         figure is the median of repetitions made in passes over every pattern, spread over the \
         whole measurement (a shared disk drifts over seconds)."
            .into(),
    );
    // The directory holding the file (`.` for a bare file name).
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let device = describe_device(dir);
    if device.in_memory {
        progress(&format!("storage: {}", device.why));
    }
    notes.push(format!("{}.", device.why));

    // Repetitions are passes over every pattern, not runs of one pattern: a shared or
    // virtual disk drifts by tens of percent over seconds, and a figure measured in one
    // stretch of time would carry that stretch's level (adjacent sizes measured a few seconds
    // apart then disagree by more than their real difference). Each figure is the median of
    // samples spread over the whole measurement, so every figure sees the same drift.
    let reps = effort.storage_reps.max(1);
    let patterns: Vec<(usize, u64, u32)> = SIZES
        .iter()
        .enumerate()
        .flat_map(|(si, &size)| QUEUE_DEPTHS.iter().map(move |&depth| (si, size, depth)))
        .collect();
    let mut random_samples = vec![Vec::with_capacity(reps); patterns.len()];
    let mut sequential_samples = vec![Vec::with_capacity(reps); SIZES.len()];
    let mut latencies = Vec::new();
    for rep in 0..reps {
        progress(&format!("storage: pass {}/{reps}", rep + 1));
        // Each pass starts at another pattern, so no pattern always follows the same one.
        let shift = rep * patterns.len() / reps;
        for k in 0..patterns.len() {
            let p = (k + shift) % patterns.len();
            let (si, size, depth) = patterns[p];
            uncache(file, mode, false);
            let record = depth == 1 && size == SIZES[0];
            let seed = (si * 16 + depth as usize) as u64 * 1000 + rep as u64;
            let (rate, lat) =
                random_rep(file, len, size, depth, effort.storage_target, seed, record)
                    .map_err(read_err)?;
            random_samples[p].push(rate);
            latencies.extend(lat);
        }
        for (si, &size) in SIZES.iter().enumerate() {
            uncache(file, mode, true);
            let from = len / reps as u64 * rep as u64;
            sequential_samples[si].push(
                sequential_rep(file, len, size, from, effort.storage_target).map_err(read_err)?,
            );
        }
    }
    let mut random = Vec::new();
    for (si, &size) in SIZES.iter().enumerate() {
        let mut line = format!("storage: random {:>4}:", size_label(size));
        for (p, &(_, _, depth)) in patterns.iter().enumerate().filter(|(_, q)| q.0 == si) {
            let mbps = median(&mut random_samples[p]);
            line += &format!(" QD{depth} {mbps:.0} MB/s");
            random.push(StorageRate {
                size_bytes: size,
                queue_depth: depth,
                mbps,
            });
        }
        progress(&line);
    }
    let mut sequential = Vec::new();
    let mut line = String::from("storage: sequential:");
    for (&size, samples) in SIZES.iter().zip(&mut sequential_samples) {
        let mbps = median(samples);
        line += &format!(" {} {mbps:.0}", size_label(size));
        sequential.push(StorageRate {
            size_bytes: size,
            queue_depth: 1,
            mbps,
        });
    }
    progress(&format!("{line} MB/s"));
    let latency_us = median(&mut latencies) * 1e6;
    progress(&format!(
        "storage: 4K random read latency (QD1, median) {latency_us:.1} us"
    ));
    Ok(StorageOutcome {
        profile: StorageProfile {
            name: device.name,
            single_queue: device.single_queue,
            latency_us: latency_us.max(1e-3),
            random,
            sequential,
        },
        notes,
    })
}

/// The storage section of a profile measured with storage skipped: nominal figures, named as
/// such, so the profile still validates.
pub fn placeholder() -> StorageOutcome {
    let rate = |size_bytes, mbps| StorageRate {
        size_bytes,
        queue_depth: 1,
        mbps,
    };
    StorageOutcome {
        profile: StorageProfile {
            name: "not measured (placeholder figures)".into(),
            single_queue: false,
            latency_us: 100.0,
            random: vec![rate(4096, 40.0), rate(512 << 10, 1000.0)],
            sequential: vec![rate(4096, 100.0), rate(512 << 10, 1000.0)],
        },
        notes: vec![
            "Storage was NOT measured (skipped): its section holds placeholder figures (100 us, \
             40 MB/s random 4 KiB, 1000 MB/s at 512 KiB), not this machine's."
                .into(),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffers_are_aligned() {
        for len in [4096, 8192, 512 << 10] {
            let mut b = AlignedBuf::new(len);
            let s = b.as_mut();
            assert_eq!(s.len(), len);
            assert_eq!(s.as_ptr() as usize % ALIGN, 0);
        }
    }

    #[test]
    fn buffered_fallback_measures_and_says_so() {
        let dir = std::env::temp_dir();
        let mut lines = 0;
        let out = measure_storage_with(
            &dir,
            MIN_FILE_BYTES,
            &Effort::new(true),
            &mut |_| lines += 1,
            true,
        )
        .unwrap();
        assert!(out.notes[0].starts_with("Storage: BUFFERED preads (O_DIRECT not tried)"));
        assert_eq!(out.profile.random.len(), SIZES.len() * QUEUE_DEPTHS.len());
        assert!(out.profile.random.iter().all(|r| r.mbps > 0.0));
        assert!(lines > 0);
    }

    #[test]
    fn temp_files_are_removed_on_drop() {
        let dir = std::env::temp_dir();
        let (tmp, _file) = create_in(&dir, "unit").unwrap();
        let path = tmp.path.clone();
        assert!(path.exists());
        drop(tmp);
        assert!(!path.exists());
    }
}
