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

use super::StableBuf;
use io_uring::{opcode, types, IoUring};

/// Most reads a [`Ring`] keeps in flight at once (the ring's size).
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

impl Progress {
    fn result(&self) -> io::Result<usize> {
        if self.error != 0 {
            Err(io::Error::from_raw_os_error(self.error))
        } else {
            Ok(self.done)
        }
    }
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
        let owned = reads
            .iter_mut()
            .map(|(buf, offset)| {
                let len = buf.len();
                (&mut **buf, *offset, len)
            })
            .collect();
        self.read_each(file, owned, |i, _, result| out[i] = result);
    }

    /// Reads `len` bytes at `offset` of `file` into the first `len` bytes of each buffer of
    /// `reads` (fewer where the file ends first), up to [`RING_ENTRIES`] in flight at once, and
    /// hands each buffer back to `done` with its index and result (the bytes read, or the
    /// read's error) as soon as its own read is over, in the order reads finish: the caller
    /// can use one read's bytes while the others are still on their way. A read that comes
    /// back short is continued from where it stopped (as `pread` loops are); an interrupted
    /// one is queued again. Returns when every read is over.
    pub fn read_each<B: StableBuf>(
        &self,
        file: &File,
        reads: Vec<(B, u64, usize)>,
        mut done: impl FnMut(usize, B, io::Result<usize>),
    ) {
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let mut progress = vec![Progress::default(); reads.len()];
        let mut spans = Vec::with_capacity(reads.len());
        let mut owners = Vec::with_capacity(reads.len());
        for (mut buf, offset, len) in reads {
            let len = len.min(buf.len());
            spans.push((buf.as_mut_ptr(), len, offset));
            owners.push(Some(buf));
        }
        let fd = types::Fd(file.as_raw_fd());
        loop {
            // Queue reads that are neither finished nor in flight, in order, at most
            // RING_ENTRIES in flight.
            let mut in_flight = progress.iter().filter(|p| p.in_flight).count();
            for i in 0..spans.len() {
                if in_flight == RING_ENTRIES as usize {
                    break;
                }
                let p = &mut progress[i];
                if p.finished || p.in_flight {
                    continue;
                }
                let (ptr, len, offset) = spans[i];
                if p.done >= len {
                    p.finished = true;
                    if let Some(buf) = owners[i].take() {
                        done(i, buf, p.result());
                    }
                    continue;
                }
                let rest_len = (len - p.done).min(u32::MAX as usize) as u32;
                // SAFETY: `ptr + done .. ptr + len` lies inside the buffer `owners[i]` owns,
                // which `StableBuf` keeps in place while it lives; `owners[i]` is held here
                // until this read is over (handed back only once `finished`), so the kernel
                // writes into memory nothing else uses, and never after it is handed back.
                let entry = opcode::Read::new(fd, unsafe { ptr.add(p.done) }, rest_len)
                    .offset(offset + p.done as u64)
                    .build()
                    .user_data(i as u64);
                // SAFETY: the entry's buffer stays valid until its completion (above); at most
                // RING_ENTRIES reads are in flight, each at most once, so the submission queue
                // (of that size) cannot overflow.
                let pushed = unsafe { ring.submission().push(&entry) };
                if pushed.is_err() {
                    break; // queue full: the rest goes after some complete
                }
                p.in_flight = true;
                in_flight += 1;
            }
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
                        // The kernel may still own buffers of reads in flight: returning would
                        // let it write into memory the caller reuses. Nothing sound is left but
                        // to stop.
                        eprintln!("io_uring: submit failed with reads in flight ({e}); aborting");
                        std::process::abort();
                    }
                }
            }
            for cqe in ring.completion() {
                let i = cqe.user_data() as usize;
                let Some(p) = progress.get_mut(i) else {
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
                if !p.finished && p.done >= spans[i].1 {
                    p.finished = true;
                }
                if p.finished {
                    if let Some(buf) = owners[i].take() {
                        done(i, buf, p.result());
                    }
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

    /// Owned buffers (here `Vec`s) go in, and each comes back once, with its index, the bytes
    /// `pread` reads and the count it returns, however many more reads than the ring holds;
    /// `len` reads only a prefix of a longer buffer and leaves the rest as it was.
    #[test]
    fn each_buffer_comes_back_once_with_its_own_read() {
        let ring = match Ring::new() {
            Ok(ring) => ring,
            Err(e) => return environment_missing(&format!("io_uring unavailable here ({e})")),
        };
        let path = temp_file(200_000, "each");
        let file = File::open(&path).unwrap();
        let spans: Vec<(u64, usize)> = (0..75)
            .map(|i| ((i * 2741) as u64 % 199_000, (i * 613) % 9_000))
            .collect();
        let reads = spans
            .iter()
            .map(|&(off, n)| (vec![0xAAu8; n + 7], off, n))
            .collect();
        let mut back: Vec<Option<(Vec<u8>, usize)>> = spans.iter().map(|_| None).collect();
        ring.read_each(&file, reads, |i, buf, got| {
            assert!(back[i].is_none(), "read {i} handed back twice");
            back[i] = Some((buf, got.unwrap()));
        });
        for (i, &(off, n)) in spans.iter().enumerate() {
            let (buf, got) = back[i].take().expect("every buffer comes back");
            let mut expect = vec![0u8; n];
            let want = read_full(&file, &mut expect, off).unwrap();
            assert_eq!(got, want, "read {i}: {n} bytes at {off}");
            assert_eq!(buf[..want], expect[..want], "read {i}'s bytes");
            assert!(
                buf[n..].iter().all(|&b| b == 0xAA),
                "read {i} wrote past its length"
            );
        }
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
