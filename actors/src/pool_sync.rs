//! The primitives the worker pool (`pool.rs`) synchronises with: std's here. The model check
//! in `tests/pool_model.rs` compiles the same `pool.rs` against loom's twins of these names,
//! which is why the pool reaches them through this module and not through `std` directly.

pub(crate) use std::hint::spin_loop;
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
pub(crate) use std::sync::{Arc, Condvar, Mutex};
pub(crate) use std::thread;

/// A value one thread writes while no other thread reads it, and others read between such
/// writes (the pool's current job). The pool's atomics order the accesses; loom's twin of this
/// cell checks that they do.
pub(crate) struct SharedCell<T>(std::cell::UnsafeCell<T>);

impl<T: Copy> SharedCell<T> {
    pub(crate) fn new(value: T) -> SharedCell<T> {
        SharedCell(std::cell::UnsafeCell::new(value))
    }

    /// # Safety
    /// No [`SharedCell::write`] may run at the same time.
    pub(crate) unsafe fn read(&self) -> T {
        // SAFETY: the caller rules out a concurrent write; `T: Copy` reads by value.
        unsafe { *self.0.get() }
    }

    /// # Safety
    /// No other access may run at the same time.
    pub(crate) unsafe fn write(&self, value: T) {
        // SAFETY: the caller rules out any concurrent access.
        unsafe { *self.0.get() = value }
    }
}
