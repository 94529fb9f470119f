//! Reading a run of units into their cache slots: what a driver does with a `Load` run the
//! scheduler decided (the inline driver at once, the storage actor on its own thread).
//!
//! A slot is given to its unit when the load is decided ([`SlotRead::assign`], on the thread
//! that carries out the scheduler's commands) and read later; the slot's generation, taken at
//! assignment, tells a read that the slot was given to another unit since (a failed step's
//! leftover, with several I/O threads), which then reads nothing.

use super::{BundleFile, LoadError, SlotArena};
use std::ops::Range;

/// One unit of a read: `(layer, cluster)` into cache slot `slot`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotRead {
    pub layer: u32,
    pub cluster: u32,
    pub slot: u32,
    /// The slot's generation when the load was decided.
    pub generation: u64,
    /// Only these pages of the unit (`None`: all of it).
    pub pages: Option<Range<u32>>,
}

impl SlotRead {
    /// Gives `slot` to `(layer, cluster)` (it held `evicted`), or for a top-up keeps it with
    /// its unit: the read that `Load` asks for, with the slot's generation.
    pub fn assign(
        arena: &SlotArena,
        (layer, cluster): (u32, u32),
        slot: u32,
        evicted: Option<(u32, u32)>,
        pages: Option<Range<u32>>,
        top_up: bool,
    ) -> SlotRead {
        let generation = if top_up {
            arena.generation(slot)
        } else {
            arena.assign(layer, cluster, slot, evicted)
        };
        SlotRead {
            layer,
            cluster,
            slot,
            generation,
            pages,
        }
    }
}

/// Reads `items` (one run) into their slots, handing each item's result (the bytes it read)
/// to `done` with its index as soon as that item is in and its slot's lock released, so compute
/// can read the slot while the rest of the run is still on its way. Returns false, reading
/// nothing, when a slot was given to another unit since (stale).
///
/// One whole unit, or one run of pages: one read. Runs of pages of bundles whose checksum
/// was confirmed: all in flight together ([`BundleFile::load_parts`]). Whole units: one
/// vectored read when back to back, or in flight together with io_uring, each handed over as
/// its own read completes ([`BundleFile::load_run_each`]). Slots are locked in increasing order
/// of index, so two readers (a stale read and a new one) never wait on each other in opposite
/// orders.
pub fn read_slots(
    arena: &SlotArena,
    file: &BundleFile,
    items: &[SlotRead],
    mut done: impl FnMut(usize, Result<u64, LoadError>),
) -> bool {
    let stale = |it: &SlotRead| arena.generation(it.slot) != it.generation;
    let parts = |it: &SlotRead| it.pages.is_some() && file.part_ready(it.layer, it.cluster);
    // One unit, or pages of bundles not yet checked, or pages and whole units mixed (the
    // scheduler does not run them so): one after another.
    if items.len() == 1 || (!items.iter().all(parts) && items.iter().any(|it| it.pages.is_some())) {
        for (i, it) in items.iter().enumerate() {
            let mut slot = arena.write(it.slot);
            if stale(it) {
                return false;
            }
            let result = file.load_part(it.layer, it.cluster, it.pages.clone(), slot.bytes_mut());
            drop(slot);
            done(i, result);
        }
        return true;
    }
    if items.iter().all(parts) {
        let mut results = Vec::with_capacity(items.len());
        if !read_parts(arena, file, items, &mut results) {
            return false;
        }
        for (i, result) in results.into_iter().enumerate() {
            done(i, result);
        }
        return true;
    }
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| items[i].slot);
    let mut locked: Vec<Option<_>> = items.iter().map(|_| None).collect();
    for i in order {
        locked[i] = Some(arena.write_buf(items[i].slot));
    }
    if items.iter().any(stale) {
        return false;
    }
    let units = items
        .iter()
        .zip(locked)
        .filter_map(|(it, guard)| Some((it.layer, it.cluster, guard?)))
        .collect();
    file.load_run_each(units, |i, slot, result| {
        drop(slot);
        let it = &items[i];
        done(i, result.map(|()| file.read_bytes(it.layer, it.cluster)));
    });
    true
}

/// Reads the pages of `items` (every one some pages of a bundle whose checksum was confirmed)
/// with [`BundleFile::load_parts`], all in flight together: each slot locked once (in
/// increasing order, as for whole units), each item's pages carved out of it. False when a
/// slot was given to another unit since (stale).
fn read_parts(
    arena: &SlotArena,
    file: &BundleFile,
    items: &[SlotRead],
    results: &mut Vec<Result<u64, LoadError>>,
) -> bool {
    let page = crate::store::STORE_ALIGN as usize;
    let mut slots: Vec<u32> = items.iter().map(|it| it.slot).collect();
    slots.sort_unstable();
    slots.dedup();
    let mut guards: Vec<_> = slots.iter().map(|&s| arena.write(s)).collect();
    if items
        .iter()
        .any(|it| arena.generation(it.slot) != it.generation)
    {
        return false;
    }
    // A slot's items in page order: their runs are disjoint, so each gets its own slice.
    let first_page = |i: usize| items[i].pages.as_ref().map_or(0, |p| p.start);
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| (items[i].slot, first_page(i)));
    results.extend(items.iter().map(|_| Ok(0)));
    let mut parts = Vec::with_capacity(items.len());
    let mut index = Vec::with_capacity(items.len());
    let mut next = order.iter().peekable();
    for (guard, &slot) in guards.iter_mut().zip(&slots) {
        let mut rest: &mut [u8] = guard.bytes_mut();
        let mut at = 0;
        while let Some(&i) = next.next_if(|&&i| items[i].slot == slot) {
            let it = &items[i];
            let pages = it.pages.clone().unwrap_or(0..0);
            let start = pages.start as usize * page;
            if start >= at + rest.len() {
                // Past a slot as long as its unit (a hot slot): the pages after the unit's
                // read are the stride's padding, nothing to read (as `load_part` says).
                results[i] = Ok(0);
                continue;
            }
            if start < at {
                results[i] = Err(LoadError {
                    what: format!("layer {} cluster {} pages {pages:?}", it.layer, it.cluster),
                    path: String::new(),
                    why: "runs of pages overlap".into(),
                });
                continue;
            }
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(start - at);
            let len = (pages.len() * page).min(tail.len());
            let (dst, tail) = tail.split_at_mut(len);
            rest = tail;
            at = start + len;
            parts.push((it.layer, it.cluster, pages, dst));
            index.push(i);
        }
    }
    for (i, result) in index.into_iter().zip(file.load_parts(&mut parts)) {
        results[i] = result;
    }
    true
}
