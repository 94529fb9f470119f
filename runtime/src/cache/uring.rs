//! Reads through io_uring (cargo feature `io-uring`, on by default; picked at run time with
//! `storage.engine = "uring"` / `--io-engine uring`).
//!
//! One call queues every read of a request at once, so the device sees them together (queue
//! depth = the number of reads, up to the ring's size) and one system call both submits them
//! and waits. Android apps cannot use io_uring (seccomp), which is why positional reads stay the
//! default, as on the paper's phones.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Mutex;

use io_uring::{opcode, types, IoUring};

/// Most reads one [`Ring::read_all`] keeps in flight (the ring's size).
pub const RING_ENTRIES: u32 = 32;

/// An io_uring instance for one file's reads; callers take turns (a mutex), as one issuer.
pub struct Ring {
    ring: Mutex<IoUring>,
}

/// Per read of a batch: bytes read so far, and whether it is finished or in flight.
#[derive(Clone, Copy, Default)]
struct Progress {
    done: usize,
    in_flight: bool,
    finished: bool,
    error: i32,
}

impl Ring {
    /// A ring of [`RING_ENTRIES`] entries; fails where the kernel has no io_uring or a seccomp
    /// filter forbids it (containers often do).
    pub fn new() -> io::Result<Ring> {
        Ok(Ring {
            ring: Mutex::new(IoUring::new(RING_ENTRIES)?),
        })
    }

    /// Fills each `reads[i].0` from offset `reads[i].1` of `file`, all reads in flight
    /// together, until each buffer is full or the file ends. `out[i]` gets the bytes read into
    /// `reads[i].0` or the error of its read. A read that comes back short is continued from
    /// where it stopped (as `pread` loops are); an interrupted one is queued again.
    pub fn read_all(
        &self,
        file: &File,
        reads: &mut [(&mut [u8], u64)],
        out: &mut [io::Result<usize>],
    ) {
        assert_eq!(reads.len(), out.len(), "one result per read");
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        for (chunk, results) in reads
            .chunks_mut(RING_ENTRIES as usize)
            .zip(out.chunks_mut(RING_ENTRIES as usize))
        {
            let mut progress = [Progress::default(); RING_ENTRIES as usize];
            run_batch(&mut ring, file, chunk, &mut progress[..chunk.len()]);
            for (p, r) in progress[..chunk.len()].iter().zip(results.iter_mut()) {
                *r = if p.error != 0 {
                    Err(io::Error::from_raw_os_error(p.error))
                } else {
                    Ok(p.done)
                };
            }
        }
    }
}

/// Runs at most [`RING_ENTRIES`] reads to completion. Returns only when no read of the batch is
/// in flight any more: the kernel writes into the buffers only while this function runs.
fn run_batch(
    ring: &mut IoUring,
    file: &File,
    reads: &mut [(&mut [u8], u64)],
    progress: &mut [Progress],
) {
    let fd = types::Fd(file.as_raw_fd());
    loop {
        // Queue every read that is neither finished nor in flight.
        for (i, ((buf, offset), p)) in reads.iter_mut().zip(progress.iter_mut()).enumerate() {
            if p.finished || p.in_flight {
                continue;
            }
            if p.done >= buf.len() {
                p.finished = true;
                continue;
            }
            let rest = &mut buf[p.done..];
            let len = rest.len().min(u32::MAX as usize) as u32;
            let entry = opcode::Read::new(fd, rest.as_mut_ptr(), len)
                .offset(*offset + p.done as u64)
                .build()
                .user_data(i as u64);
            // SAFETY: the entry points into `reads[i].0`, which this function borrows mutably
            // until it returns, and it returns only after every queued read has completed (the
            // loop below waits for all in-flight reads), so the kernel never writes into
            // memory that is freed or used elsewhere. The batch has at most RING_ENTRIES reads,
            // each in flight at most once, so the queue (of that size) cannot overflow.
            let pushed = unsafe { ring.submission().push(&entry) };
            if pushed.is_err() {
                break; // queue full: the rest goes after some complete
            }
            p.in_flight = true;
        }
        let in_flight = progress.iter().filter(|p| p.in_flight).count();
        if in_flight == 0 {
            return;
        }
        // Submit what was queued and wait for at least one completion. Transient failures
        // (interrupted, out of kernel resources) are retried; the entries stay queued.
        let mut attempts = 0u32;
        loop {
            match ring.submit_and_wait(1) {
                Ok(_) => break,
                Err(e) if transient(&e) && attempts < 10_000 => {
                    attempts += 1;
                    std::thread::yield_now();
                }
                Err(e) => {
                    // The kernel may still own buffers of reads in flight: returning would let
                    // it write into memory the caller reuses. Nothing sound is left but to stop.
                    eprintln!("io_uring: submit failed with reads in flight ({e}); aborting");
                    std::process::abort();
                }
            }
        }
        for cqe in ring.completion() {
            let Some(p) = progress.get_mut(cqe.user_data() as usize) else {
                continue;
            };
            p.in_flight = false;
            match cqe.result() {
                n if n > 0 => p.done += n as usize,
                0 => p.finished = true, // end of file
                e if transient(&io::Error::from_raw_os_error(-e)) => {} // queued again
                e => {
                    p.error = -e;
                    p.finished = true;
                }
            }
        }
    }
}

/// Interrupted, or out of kernel resources for the moment: worth trying again.
fn transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock | io::ErrorKind::ResourceBusy
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::read_full;

    /// The machine lacks what a test needs (`what`): under `CI=true` a failure (CI runs as
    /// root on machines with io_uring), elsewhere a message and the test stops there. (The
    /// end-to-end tests' `tests/common::environment_missing`, for this crate's unit tests.)
    fn environment_missing(what: &str) {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{what}: under CI=true this test must run, not skip");
        }
        eprintln!("{what}: this test did not run (under CI=true it fails)");
    }

    fn temp_file(len: usize, tag: &str) -> std::path::PathBuf {
        let path =
            std::env::temp_dir().join(format!("conductor-uring-{tag}-{}", std::process::id()));
        let bytes: Vec<u8> = (0..len).map(|i| (i * 13 % 251) as u8).collect();
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn batched_reads_match_pread_and_stop_at_the_end_of_the_file() {
        let ring = match Ring::new() {
            Ok(ring) => ring,
            Err(e) => return environment_missing(&format!("io_uring unavailable here ({e})")),
        };
        let path = temp_file(300_000, "match");
        let file = File::open(&path).unwrap();
        // More reads than the ring holds, odd sizes, one running past the end, one empty.
        let spans: Vec<(u64, usize)> = (0..70)
            .map(|i| ((i * 4099) as u64 % 290_000, 1 + (i * 977) % 20_000))
            .chain([(299_000, 5_000), (10, 0)])
            .collect();
        let mut bufs: Vec<Vec<u8>> = spans.iter().map(|&(_, n)| vec![0u8; n]).collect();
        let mut reads: Vec<(&mut [u8], u64)> = bufs
            .iter_mut()
            .zip(&spans)
            .map(|(b, &(off, _))| (b.as_mut_slice(), off))
            .collect();
        let mut out: Vec<io::Result<usize>> = spans.iter().map(|_| Ok(0)).collect();
        ring.read_all(&file, &mut reads, &mut out);
        drop(reads);
        for ((buf, &(off, n)), got) in bufs.iter().zip(&spans).zip(&out) {
            let mut expect = vec![0u8; n];
            let want = read_full(&file, &mut expect, off).unwrap();
            assert_eq!(*got.as_ref().unwrap(), want, "read of {n} at {off}");
            assert_eq!(buf[..want], expect[..want], "bytes of the read at {off}");
        }
        assert_eq!(
            *out[70].as_ref().unwrap(),
            1_000,
            "short at the end of the file"
        );
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn a_failing_read_reports_its_error_and_the_others_still_complete() {
        let ring = match Ring::new() {
            Ok(ring) => ring,
            Err(e) => return environment_missing(&format!("io_uring unavailable here ({e})")),
        };
        let path = temp_file(10_000, "fail");
        // A directory cannot be read: EISDIR for every read of it.
        let dir = File::open(std::env::temp_dir()).unwrap();
        let mut a = vec![0u8; 100];
        let mut reads: Vec<(&mut [u8], u64)> = vec![(a.as_mut_slice(), 0)];
        let mut out = vec![Ok(0)];
        ring.read_all(&dir, &mut reads, &mut out);
        assert!(out[0].is_err(), "reading a directory must fail");
        let file = File::open(&path).unwrap();
        let mut out = vec![Ok(0)];
        let mut reads: Vec<(&mut [u8], u64)> = vec![(a.as_mut_slice(), 50)];
        ring.read_all(&file, &mut reads, &mut out);
        assert_eq!(*out[0].as_ref().unwrap(), 100);
        assert_eq!(a[0], (50 * 13 % 251) as u8);
        std::fs::remove_file(path).unwrap();
    }
}
