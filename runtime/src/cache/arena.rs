//! The neuron cache's memory: fixed-size, 4096-byte-aligned slots allocated once, and the table
//! of which cluster each slot holds.
//!
//! Which slot holds what is decided by the scheduler's [`super::CacheDirectory`]; the driver
//! mirrors its decisions here (`assign`) before the slot is filled, and a group reads a slot
//! only after the scheduler has seen it loaded. Each slot sits behind its own `RwLock`, so a
//! bug in that protocol can never turn into a torn read: at worst a wait.

use super::{Extent, UnitMap};
use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Alignment of slots (what `O_DIRECT` asks of buffers).
pub const SLOT_ALIGN: usize = 4096;

const NONE: u32 = u32::MAX;

/// Every slot's bytes in one zeroed allocation aligned to [`SLOT_ALIGN`]: exactly
/// `n_slots × slot_bytes`, so the cache's resident memory is what the budget gave it. (Slots
/// allocated one by one carried a page of alignment slack each, which writes around it
/// committed: 1.5× the budget with 8 KiB slots.) A large allocation is mapped fresh, so its
/// pages are committed only as slots are first filled.
struct SlotMemory {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

impl SlotMemory {
    /// `None` when `bytes` cannot be described or the allocator refuses: a plan may ask for
    /// more slots than the machine holds, which is an error, not an abort.
    fn new(bytes: usize) -> Option<SlotMemory> {
        let layout = std::alloc::Layout::from_size_align(bytes.max(SLOT_ALIGN), SLOT_ALIGN).ok()?;
        // SAFETY: the layout's size is non-zero (at least one page).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        Some(SlotMemory {
            ptr: std::ptr::NonNull::new(ptr)?,
            layout,
        })
    }
}

// SAFETY: `SlotMemory` only owns the allocation (freed once, on drop); every access to its
// bytes goes through a `SlotBuf` behind its lock.
unsafe impl Send for SlotMemory {}
// SAFETY: as for `Send`: `&SlotMemory` reads nothing through the pointer.
unsafe impl Sync for SlotMemory {}

impl Drop for SlotMemory {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed` with this layout and is freed once, here.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// One slot's bytes, aligned to [`SLOT_ALIGN`]: a region of the arena's [`SlotMemory`].
pub struct SlotBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: a `SlotBuf` is the only handle to its region (regions are disjoint), reached only
// through its arena's `RwLock`, so shared access is `&[u8]` and mutation needs the write lock,
// from whichever thread.
unsafe impl Send for SlotBuf {}
// SAFETY: as for `Send`: `&SlotBuf` only gives `&[u8]`.
unsafe impl Sync for SlotBuf {}

impl SlotBuf {
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr..ptr + len` lies within the arena's allocation, which outlives every
        // `SlotBuf` (the arena drops its slots before its memory, and hands out only guards
        // that borrow it); no `&mut` to the region exists while `&self` does.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` is the only access to this disjoint region.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// A slot's write lock as its bytes (a [`super::StableBuf`]): dropping it lets readers in.
pub struct SlotWrite<'a>(RwLockWriteGuard<'a, SlotBuf>);

impl std::ops::Deref for SlotWrite<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.0.bytes()
    }
}

impl std::ops::DerefMut for SlotWrite<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.0.bytes_mut()
    }
}

/// The slots and the unit → slot table.
pub struct SlotArena {
    /// Regions of `memory`; declared first, so dropped before it.
    slots: Vec<RwLock<SlotBuf>>,
    map: UnitMap,
    /// Unit → slot, or `NONE`.
    table: Vec<AtomicU32>,
    /// Where each unit's bytes lie inside its slot (reads start on aligned offsets).
    data: Vec<Range<usize>>,
    /// Bumped each time a slot is given to a unit.
    generations: Vec<AtomicU64>,
    /// The units a resident-only step computes ([`crate::cache::resident_step_units`]);
    /// empty: every unit.
    resident: Vec<bool>,
    /// The slots' bytes: held for its drop, after the slots'.
    _memory: SlotMemory,
}

impl SlotArena {
    /// `n_slots` slots for the units of `map`, whose reads `extents` describe. Slots the
    /// machine cannot hold (the size overflows, or the allocator refuses) are an error.
    pub fn new(n_slots: u32, map: &UnitMap, extents: &[Extent]) -> Result<SlotArena, String> {
        let longest = extents.iter().map(|e| e.len).max().unwrap_or(0);
        let slot_bytes = longest.div_ceil(SLOT_ALIGN) * SLOT_ALIGN;
        let memory = (n_slots as usize)
            .checked_mul(slot_bytes)
            .and_then(SlotMemory::new)
            .ok_or_else(|| {
                format!(
                    "cannot reserve {n_slots} cache slots of {slot_bytes} bytes (plan field \
                     `cache.slots`: fewer slots, or a smaller budget)"
                )
            })?;
        Ok(SlotArena {
            slots: (0..n_slots as usize)
                .map(|i| {
                    RwLock::new(SlotBuf {
                        // SAFETY: slot i's region, i·slot_bytes.., lies within the allocation.
                        ptr: unsafe {
                            std::ptr::NonNull::new_unchecked(
                                memory.ptr.as_ptr().add(i * slot_bytes),
                            )
                        },
                        len: slot_bytes,
                    })
                })
                .collect(),
            map: map.clone(),
            table: (0..map.n_units()).map(|_| AtomicU32::new(NONE)).collect(),
            data: extents.iter().map(|e| e.data.clone()).collect(),
            generations: (0..n_slots).map(|_| AtomicU64::new(0)).collect(),
            resident: Vec::new(),
            _memory: memory,
        })
    }

    /// The arena of a plan whose resident-only steps compute the units flagged in `resident`
    /// ([`crate::cache::resident_step_units`], one flag per unit).
    pub fn with_resident_step_units(mut self, resident: Vec<bool>) -> SlotArena {
        self.resident = resident;
        self
    }

    /// Whether a resident-only step computes `(layer, cluster)` (it is not read for one).
    pub fn in_resident_step(&self, layer: u32, cluster: u32) -> bool {
        self.resident
            .get(self.unit(layer, cluster))
            .is_none_or(|&kept| kept)
    }

    /// How units are numbered.
    pub fn map(&self) -> &UnitMap {
        &self.map
    }

    /// Whether clusters of `phase` are read from slots.
    pub fn streams(&self, phase: crate::neuron::Phase) -> bool {
        self.map.streams(phase)
    }

    /// Where the bytes of `(layer, cluster)` lie in its slot.
    pub fn data_range(&self, layer: u32, cluster: u32) -> Range<usize> {
        self.data[self.unit(layer, cluster)].clone()
    }

    fn unit(&self, layer: u32, cluster: u32) -> usize {
        self.map.unit(layer, cluster) as usize
    }

    /// Records that `slot` now holds `(layer, cluster)`, and that `evicted` (its previous
    /// cluster, if any) no longer has a slot. Returns the slot's new generation.
    pub fn assign(&self, layer: u32, cluster: u32, slot: u32, evicted: Option<(u32, u32)>) -> u64 {
        if let Some((l, c)) = evicted {
            self.table[self.unit(l, c)].store(NONE, Ordering::Release);
        }
        self.table[self.unit(layer, cluster)].store(slot, Ordering::Release);
        self.generations[slot as usize].fetch_add(1, Ordering::AcqRel) + 1
    }

    /// How many times `slot` was given to a unit.
    pub fn generation(&self, slot: u32) -> u64 {
        self.generations[slot as usize].load(Ordering::Acquire)
    }

    /// Forgets that `(layer, cluster)` has a slot (its load failed).
    pub fn forget(&self, layer: u32, cluster: u32) {
        self.table[self.unit(layer, cluster)].store(NONE, Ordering::Release);
    }

    /// The slot holding `(layer, cluster)`, if any.
    pub fn slot_of(&self, layer: u32, cluster: u32) -> Option<u32> {
        let s = self
            .table
            .get(self.unit(layer, cluster))?
            .load(Ordering::Acquire);
        (s != NONE).then_some(s)
    }

    /// Slots in the arena.
    pub fn n_slots(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Whether something holds `slot` now (a read into it, a computation from it): its lock
    /// cannot be taken at once.
    pub fn is_busy(&self, slot: u32) -> bool {
        matches!(
            self.slots[slot as usize].try_write(),
            Err(std::sync::TryLockError::WouldBlock)
        )
    }

    pub fn read(&self, slot: u32) -> RwLockReadGuard<'_, SlotBuf> {
        self.slots[slot as usize]
            .read()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// `slot` locked for a read into it, as a buffer a run of reads can hand back unit by unit.
    pub fn write_buf(&self, slot: u32) -> SlotWrite<'_> {
        SlotWrite(self.write(slot))
    }

    pub fn write(&self, slot: u32) -> RwLockWriteGuard<'_, SlotBuf> {
        self.slots[slot as usize]
            .write()
            .unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots whose memory overflows or that no machine holds are an error naming the plan
    /// field, not an abort.
    #[test]
    fn slots_the_machine_cannot_hold_are_an_error() {
        let map = UnitMap {
            n_layer: 1,
            ffn_clusters: 1,
            output_clusters: 0,
            attn_units: 0,
        };
        let extent = |len| Extent {
            offset: 0,
            len,
            data: 0..len,
            what: String::new(),
            bundle: None,
        };
        // 2^32 slots of 2^40 bytes overflow; 2^20 slots of 2^40 bytes (2^60) no machine holds.
        for (slots, len) in [(u32::MAX, 1 << 40), (1 << 20, 1 << 40)] {
            let e = SlotArena::new(slots, &map, &[extent(len)]).err().unwrap();
            assert!(e.contains("cache.slots"), "{e}");
        }
        let arena = SlotArena::new(2, &map, &[extent(5000)]).unwrap();
        assert_eq!(arena.slots.len(), 2);
    }
}
