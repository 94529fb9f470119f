//! Fault injection into file reads, for the seeded fault harness (`conductor::faults`) and
//! tests: a [`ReadFaults`] set on a [`crate::cache::BundleFile`] at construction (or on a
//! model's embedding rows) sees every read before the kernel does and says what to do to it.
//! It sits below both `cache` and `model`, which each apply it to their own reads. Without one (every normal run) a
//! read pays one branch on an `Option`.
//!
//! The runtime has no clocks and no threads: a latency spike or a stuck read is the hook
//! itself taking its time (sleeping, or waiting until it is cancelled or a deadline passes)
//! before it answers; the runtime only applies the answer.

use std::io;

/// What a [`ReadFaults`] does to one read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadFault {
    /// The read goes through untouched.
    None,
    /// The read fails with this error, reading nothing.
    Fail(io::ErrorKind),
    /// The read returns at most this many bytes (a short read).
    Short(usize),
    /// Bit `n` (modulo the bits read) of what the read returned is flipped.
    Flip(u64),
}

/// Sees every read of a store before it is made (offset and length in the file) and decides
/// its fault. It may block first (a latency spike, a stuck read), on the reading thread.
pub trait ReadFaults: Send + Sync + std::fmt::Debug {
    fn before_read(&self, offset: u64, len: usize) -> ReadFault;
}

impl ReadFault {
    /// The fault `faults` (if any) decides for a read of `len` bytes at `offset`.
    pub(crate) fn of(faults: Option<&dyn ReadFaults>, offset: u64, len: usize) -> ReadFault {
        match faults {
            Some(f) => f.before_read(offset, len),
            None => ReadFault::None,
        }
    }

    /// `result`, what a read into `bufs` (one after another, as a vectored read fills them)
    /// returned, with the fault applied: shortened, or a bit flipped in what was read.
    pub(crate) fn apply(
        self,
        bufs: &mut [&mut [u8]],
        result: io::Result<usize>,
    ) -> io::Result<usize> {
        match (self, result) {
            (ReadFault::Fail(kind), _) => Err(io::Error::new(kind, "injected read fault")),
            (ReadFault::Short(n), Ok(got)) => Ok(got.min(n)),
            (ReadFault::Flip(bit), Ok(got)) if got > 0 => {
                let mut at = (bit % (got as u64 * 8)) as usize;
                for buf in bufs.iter_mut() {
                    if at / 8 < buf.len() {
                        buf[at / 8] ^= 1 << (at % 8);
                        break;
                    }
                    at -= buf.len() * 8;
                }
                Ok(got)
            }
            (_, result) => result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_shorten_fail_or_flip_exactly_one_bit_of_what_was_read() {
        let mut a = [0u8; 4];
        let mut b = [0u8; 4];
        let got = ReadFault::Flip(8 * 6 + 3).apply(&mut [&mut a, &mut b], Ok(8));
        assert_eq!(got.unwrap(), 8);
        assert_eq!((a, b), ([0; 4], [0, 0, 8, 0]));
        // Modulo the bits read: only the first 5 bytes were.
        let (mut a, mut b) = ([0u8; 4], [0u8; 4]);
        ReadFault::Flip(5 * 8 + 1)
            .apply(&mut [&mut a, &mut b], Ok(5))
            .unwrap();
        assert_eq!((a, b), ([2, 0, 0, 0], [0; 4]));
        assert_eq!(ReadFault::Short(3).apply(&mut [], Ok(8)).unwrap(), 3);
        let err = ReadFault::Fail(io::ErrorKind::TimedOut)
            .apply(&mut [], Ok(8))
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(ReadFault::None.apply(&mut [], Ok(8)).unwrap(), 8);
    }
}
