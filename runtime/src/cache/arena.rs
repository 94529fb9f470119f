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

/// One slot's bytes, aligned to [`SLOT_ALIGN`].
pub struct SlotBuf {
    backing: Vec<u8>,
    shift: usize,
    len: usize,
}

impl SlotBuf {
    fn new(len: usize) -> SlotBuf {
        // Over-allocate and start at the first aligned byte: no `unsafe` allocation needed.
        let backing = vec![0u8; len + SLOT_ALIGN];
        let shift = backing.as_ptr().align_offset(SLOT_ALIGN);
        SlotBuf {
            backing,
            shift,
            len,
        }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.backing[self.shift..self.shift + self.len]
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.backing[self.shift..self.shift + self.len]
    }
}

/// The slots and the unit → slot table.
pub struct SlotArena {
    slots: Vec<RwLock<SlotBuf>>,
    map: UnitMap,
    /// Unit → slot, or `NONE`.
    table: Vec<AtomicU32>,
    /// Where each unit's bytes lie inside its slot (reads start on aligned offsets).
    data: Vec<Range<usize>>,
    /// Bumped each time a slot is given to a unit.
    generations: Vec<AtomicU64>,
}

impl SlotArena {
    /// `n_slots` slots for the units of `map`, whose reads `extents` describe.
    pub fn new(n_slots: u32, map: &UnitMap, extents: &[Extent]) -> SlotArena {
        let longest = extents.iter().map(|e| e.len).max().unwrap_or(0);
        let slot_bytes = longest.div_ceil(SLOT_ALIGN) * SLOT_ALIGN;
        SlotArena {
            slots: (0..n_slots)
                .map(|_| RwLock::new(SlotBuf::new(slot_bytes)))
                .collect(),
            map: map.clone(),
            table: (0..map.n_units()).map(|_| AtomicU32::new(NONE)).collect(),
            data: extents.iter().map(|e| e.data.clone()).collect(),
            generations: (0..n_slots).map(|_| AtomicU64::new(0)).collect(),
        }
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

    pub fn read(&self, slot: u32) -> RwLockReadGuard<'_, SlotBuf> {
        self.slots[slot as usize]
            .read()
            .unwrap_or_else(|e| e.into_inner())
    }

    pub fn write(&self, slot: u32) -> RwLockWriteGuard<'_, SlotBuf> {
        self.slots[slot as usize]
            .write()
            .unwrap_or_else(|e| e.into_inner())
    }
}
