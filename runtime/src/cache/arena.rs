//! The neuron cache's memory: 4096-byte-aligned slots allocated once (a hot slot as long as its
//! own unit, a cold one as the longest unit), and the table of which cluster each slot holds.
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

/// Every slot's bytes in one zeroed allocation aligned to [`SLOT_ALIGN`]: exactly the slots'
/// lengths summed, so the cache's resident memory is what the budget gave it. (Slots
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
    /// `n_slots` slots for the units of `map`, whose reads `extents` describe: slot `i` of the
    /// first `hot.len()` is the hot slot of unit `hot[i]` alone (the directory's
    /// [`super::hot_segment`]) and is as long as that unit's read; the others hold any unit,
    /// as long as the longest. Slots the machine cannot hold (the size overflows, or the
    /// allocator refuses) are an error.
    pub fn new(
        n_slots: u32,
        hot: &[u32],
        map: &UnitMap,
        extents: &[Extent],
    ) -> Result<SlotArena, String> {
        let aligned = |len: usize| len.div_ceil(SLOT_ALIGN) * SLOT_ALIGN;
        let longest = aligned(extents.iter().map(|e| e.len).max().unwrap_or(0));
        let len_of = |i: usize| {
            hot.get(i)
                .and_then(|&u| extents.get(u as usize))
                .map_or(longest, |e| aligned(e.len))
        };
        // Summed without listing the slots first: a plan may ask for billions of them.
        let n_hot = hot.len().min(n_slots as usize);
        let total = (0..n_hot).try_fold(0usize, |sum, i| sum.checked_add(len_of(i)));
        let cold = (n_slots as usize - n_hot).checked_mul(longest);
        let memory = total
            .zip(cold)
            .and_then(|(hot, cold)| hot.checked_add(cold))
            .and_then(SlotMemory::new)
            .ok_or_else(|| {
                format!(
                    "cannot reserve {n_slots} cache slots of up to {longest} bytes (plan field \
                     `cache.slots`: fewer slots, or a smaller budget)"
                )
            })?;
        let mut at = 0;
        let slots = (0..n_slots as usize)
            .map(|i| {
                let len = len_of(i);
                // SAFETY: the regions at, at + len, … are disjoint and end at the allocation's
                // size (the lengths' sum above).
                let ptr = unsafe { std::ptr::NonNull::new_unchecked(memory.ptr.as_ptr().add(at)) };
                at += len;
                RwLock::new(SlotBuf { ptr, len })
            })
            .collect();
        Ok(SlotArena {
            slots,
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

    /// One layer of one FFN cluster.
    fn one_unit() -> UnitMap {
        UnitMap {
            n_layer: 1,
            ffn_clusters: 1,
            output_clusters: 0,
            attn_units: 0,
        }
    }

    /// A unit read of `len` bytes at the file's start.
    fn extent(len: usize) -> Extent {
        Extent {
            offset: 0,
            len,
            data: 0..len,
            what: String::new(),
            bundle: None,
        }
    }

    /// Slots whose memory overflows or that no machine holds are an error naming the plan
    /// field, not an abort.
    #[test]
    fn slots_the_machine_cannot_hold_are_an_error() {
        let map = one_unit();
        // 2^32 slots of 2^40 bytes overflow; 2^20 slots of 2^40 bytes (2^60) no machine holds.
        for (slots, len) in [(u32::MAX, 1 << 40), (1 << 20, 1 << 40)] {
            let e = SlotArena::new(slots, &[], &map, &[extent(len)])
                .err()
                .unwrap();
            assert!(e.contains("cache.slots"), "{e}");
        }
        let arena = SlotArena::new(2, &[], &map, &[extent(5000)]).unwrap();
        assert_eq!(arena.slots.len(), 2);
    }

    /// Hot slots are as long as their own unit's read, cold ones as the longest unit's, all
    /// aligned, back to back in one allocation of their sum.
    #[test]
    fn hot_slots_are_as_long_as_their_units() {
        let map = UnitMap {
            n_layer: 2,
            output_clusters: 1,
            ..one_unit()
        };
        let extents = [extent(3 * 4096), extent(5 * 4096), extent(4096 + 1)];
        // Units 2 and 0 hot, then two cold slots.
        let arena = SlotArena::new(4, &[2, 0], &map, &extents).unwrap();
        let lens: Vec<usize> = (0..4).map(|s| arena.read(s).bytes().len()).collect();
        assert_eq!(lens, [2 * 4096, 3 * 4096, 5 * 4096, 5 * 4096]);
        assert_eq!(arena._memory.layout.size(), lens.iter().sum::<usize>());
        let starts: Vec<usize> = (0..4)
            .map(|s| arena.read(s).bytes().as_ptr() as usize)
            .collect();
        for s in 0..4 {
            assert_eq!(starts[s] % SLOT_ALIGN, 0);
            if s > 0 {
                assert_eq!(
                    starts[s] - starts[s - 1],
                    lens[s - 1],
                    "slot {s} follows slot {}",
                    s - 1
                );
            }
        }
        // Filling every slot whole touches nothing of another's (each is its own region).
        for s in 0..4 {
            arena.write(s).bytes_mut().fill(s as u8 + 1);
        }
        for s in 0..4 {
            assert!(arena.read(s).bytes().iter().all(|&b| b == s as u8 + 1));
        }
    }
}
