//! Buffers a read may fill while their owner is moved around: what lets a run of reads hand
//! each unit back (and its cache slot's lock go) as soon as its own read is over.

use std::ops::DerefMut;

/// A buffer owner whose bytes stay where they are when the owner is moved: a `&mut [u8]`, a
/// `Vec<u8>`, a cache slot's write lock ([`super::SlotWrite`]). io_uring's `Ring::read_each`
/// and [`super::BundleFile::load_run_each`] take such owners, let the kernel write into their
/// bytes, and give each back when its read is over.
///
/// # Safety
/// An implementation promises that the pointer `deref_mut` returns, and the length, stay the
/// same, and the bytes valid for writes, for as long as the value lives, wherever it is moved.
pub unsafe trait StableBuf: DerefMut<Target = [u8]> {}

// SAFETY: moving a reference does not move the bytes it points to, which outlive it.
unsafe impl StableBuf for &mut [u8] {}
// SAFETY: a Vec's bytes are on the heap; moving the Vec moves only its pointer.
unsafe impl StableBuf for Vec<u8> {}
// SAFETY: a slot's bytes lie in the arena's one allocation, which outlives the guard; the
// guard holds the slot's write lock, so nothing else reaches them while it lives.
unsafe impl StableBuf for super::SlotWrite<'_> {}
