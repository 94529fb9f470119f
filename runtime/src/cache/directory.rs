//! The neuron cache's bookkeeping: which FFN cluster is in which slot, which may be evicted,
//! and the counters. Pure state, owned by the scheduler, so a simulation replays it exactly.
//!
//! Segments (PowerInfer-2's segmented neuron cache):
//! - *hot*: slots reserved for clusters the plan marks hot. Loaded on first use, never evicted.
//! - *cold*: every other cluster competes for the remaining slots; the victim is the slot
//!   released longest ago (LRU) among slots no step is using.
//!
//! A unit is one FFN cluster (a store's bundle) or, when the output projection streams too,
//! one cluster of its rows, or, when attention streams, one attention matrix of a layer;
//! [`UnitMap`] numbers them.
//!
//! The fixed segment (attention unless it streams, norms, KV cache, scratch) is not managed
//! here: it is resident for the whole run. With [`CachePolicy::Lru`] there is no hot segment: every slot is
//! cold, the baseline the segmented policy is measured against.

use super::UnitMap;
use crate::neuron::Phase;
use crate::plan::{CachePlan, CachePolicy};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::ops::Range;

/// Counters of one layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerCacheStats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

/// What [`CacheDirectory::acquire`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// The cluster is in a slot (or on its way there): nothing to read.
    Hit,
    /// Read the cluster into `slot`, which held `evicted` until now.
    Load { slot: u32, evicted: Option<u32> },
    /// Every slot it could use is busy: try again after a release.
    Full,
    /// The unit is in `slot` but only in part (gate-first loading): read pages `pages` of it
    /// into the slot, which keeps the pages it has.
    TopUp { slot: u32, pages: Range<u32> },
}

/// A slot [`CacheDirectory::acquire_pages`] pinned: given to the unit now (`fresh`, after
/// holding `evicted`), or its slot already.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagesAcquired {
    pub slot: u32,
    pub evicted: Option<u32>,
    pub fresh: bool,
}

/// What part of a unit a step asks [`CacheDirectory::acquire_part`] for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// All of it.
    Whole,
    /// Its first `n` pages (a bundle's gate rows, under gate-first loading).
    Prefix(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Residency {
    Absent,
    Loading(u32),
    Ready(u32),
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    owner: Option<u32>,
    pins: u32,
    hot: bool,
    /// When it was last released (for LRU).
    stamp: u64,
    /// It holds only some pages of its unit (gate-first loading): those set in its page bits.
    partial: bool,
    /// Left out of the cache ([`CacheDirectory::retire`]): never given to a unit.
    retired: bool,
}

/// Which unit (see [`UnitMap`]) is where.
pub struct CacheDirectory {
    map: UnitMap,
    units: Vec<Residency>,
    /// The reserved slot of each hot unit.
    hot_slot: Vec<Option<u32>>,
    slots: Vec<Slot>,
    /// Unpinned cold slots by (release stamp, slot): the first is the LRU victim.
    evictable: BTreeSet<(u64, u32)>,
    clock: u64,
    stats: Vec<LayerCacheStats>,
    /// Gate-first loading: pages per bundle, and for each slot the bits of the pages it holds
    /// (`page_words` words a slot; 0 words without gate-first loading).
    bundle_pages: u32,
    page_words: usize,
    pages: Vec<u64>,
    /// Runs of pages at most this far apart are read as one.
    gap: u32,
}

/// The units the hot segment keeps for good, in the order its slots go to them: first the
/// plan's `hot_units` (out of range or repeated ones skipped; when there are any, the units
/// every token reads, streamed attention and output projection, come before them), then
/// units in `map`'s hot order (every layer's first clusters, round-robin over layers: without
/// a ranking every neuron is as hot as any other). What a resident-only step computes
/// ([`crate::schedule::StepRequest::resident_only`]), with the units that are not streamed.
pub fn hot_segment(plan: &CachePlan, map: &UnitMap) -> Vec<u32> {
    let n_units = map.n_units();
    let mut hot = match plan.policy {
        CachePolicy::Segmented => plan.hot_slots.min(plan.slots).min(n_units),
        CachePolicy::Lru => 0,
    };
    // Clusters that are not hot need at least one cold slot to pass through.
    if hot < n_units && hot == plan.slots {
        hot = hot.saturating_sub(1);
    }
    // With a ranking (sparse decode), streamed attention and output projection go first:
    // every token reads all of them, no FFN unit is hotter.
    let output: Vec<u32> = if plan.hot_units.is_empty() {
        Vec::new()
    } else {
        map.every_token_units().collect()
    };
    let ranked = plan.hot_units.iter().filter_map(|&u| map.from_plain(u));
    let mut taken = vec![false; n_units as usize];
    let mut segment = Vec::with_capacity(hot as usize);
    for unit in output.into_iter().chain(ranked).chain(map.hot_order()) {
        if segment.len() == hot as usize {
            break;
        }
        if !std::mem::replace(&mut taken[unit as usize], true) {
            segment.push(unit);
        }
    }
    segment
}

/// The units of `map` a resident-only step computes, a flag each
/// ([`crate::schedule::StepRequest::resident_only`]): those of the [`hot_segment`], and
/// streamed attention, which a layer cannot do without (read if it is not in). The scheduler
/// leaves the others unread and the executor leaves them out, from this one list.
pub fn resident_step_units(plan: &CachePlan, map: &UnitMap) -> Vec<bool> {
    let mut kept: Vec<bool> = (0..map.n_units())
        .map(|u| {
            let (layer, cluster) = map.layer_cluster(u);
            let phase = map.phase_cluster(layer, cluster).0;
            matches!(phase, Phase::QkvHeads | Phase::AttnOutRows)
        })
        .collect();
    for u in hot_segment(plan, map) {
        kept[u as usize] = true;
    }
    kept
}

impl CacheDirectory {
    /// A directory for the units of `map`, whose hot slots go to the [`hot_segment`].
    pub fn new(plan: &CachePlan, map: &UnitMap) -> CacheDirectory {
        let n_units = map.n_units();
        let segment = hot_segment(plan, map);
        let hot = segment.len() as u32;
        let mut hot_slot = vec![None; n_units as usize];
        for (slot, &unit) in segment.iter().enumerate() {
            hot_slot[unit as usize] = Some(slot as u32);
        }
        let slots: Vec<Slot> = (0..plan.slots)
            .map(|s| Slot {
                owner: None,
                pins: 0,
                hot: s < hot,
                stamp: 0,
                partial: false,
                retired: false,
            })
            .collect();
        let evictable = (hot..plan.slots).map(|s| (0, s)).collect();
        CacheDirectory {
            map: map.clone(),
            units: vec![Residency::Absent; n_units as usize],
            hot_slot,
            slots,
            evictable,
            clock: 0,
            stats: vec![LayerCacheStats::default(); map.n_layer as usize + 1],
            bundle_pages: 0,
            page_words: 0,
            pages: Vec::new(),
            gap: plan.gate_first_gap,
        }
    }

    /// Slots that units without a reserved (hot) slot share; every unit's count when every
    /// unit has a hot slot of its own.
    pub fn cold_slots(&self) -> u32 {
        if self.hot_slot.iter().all(|s| s.is_some()) {
            return self.units.len() as u32;
        }
        self.slots.iter().filter(|s| !s.hot).count() as u32
    }

    /// Lets slots hold bundles of `bundle_pages` pages in part (gate-first loading).
    pub fn with_pages(mut self, bundle_pages: u32) -> CacheDirectory {
        self.bundle_pages = bundle_pages;
        self.page_words = (bundle_pages as usize).div_ceil(64);
        self.pages = vec![0; self.slots.len() * self.page_words];
        self
    }

    fn unit(&self, layer: u32, cluster: u32) -> usize {
        self.map.unit(layer, cluster) as usize
    }

    /// (layer, cluster) of a unit index (`n_layer` is the output projection).
    pub fn split_unit(&self, unit: u32) -> (u32, u32) {
        self.map.layer_cluster(unit)
    }

    /// Pins `(layer, cluster)` for use by the current step: a hit, a load to issue, or `Full`
    /// (nothing changed).
    pub fn acquire(&mut self, layer: u32, cluster: u32) -> Acquired {
        self.acquire_part(layer, cluster, Want::Whole)
    }

    /// [`CacheDirectory::acquire`] for `want` of the unit: a unit held in part whose missing
    /// pages are wanted is a [`Acquired::TopUp`] (counted as a miss).
    pub fn acquire_part(&mut self, layer: u32, cluster: u32, want: Want) -> Acquired {
        let u = self.unit(layer, cluster);
        match self.units[u] {
            Residency::Ready(s)
                if want == Want::Whole
                    && self.slots[s as usize].partial
                    && (0..self.bundle_pages).any(|p| !self.has_page(s, p)) =>
            {
                // Partial slots always hold a prefix (the gate rows): read from the first
                // page missing on; pages already in are read again, the same bytes.
                let first = (0..self.bundle_pages)
                    .find(|&p| !self.has_page(s, p))
                    .unwrap_or(self.bundle_pages);
                self.pin(s);
                self.set_whole(s);
                self.units[u] = Residency::Loading(s);
                self.stats[layer as usize].misses += 1;
                Acquired::TopUp {
                    slot: s,
                    pages: first..self.bundle_pages,
                }
            }
            Residency::Ready(s) | Residency::Loading(s) => {
                self.pin(s);
                self.stats[layer as usize].hits += 1;
                Acquired::Hit
            }
            Residency::Absent => {
                let slot = match self.hot_slot[u] {
                    Some(s) => s,
                    None => match self.evictable.pop_first() {
                        Some((_, s)) => s,
                        None => return Acquired::Full,
                    },
                };
                let evicted = self.slots[slot as usize].owner.take();
                if let Some(v) = evicted {
                    self.units[v as usize] = Residency::Absent;
                    self.stats[layer as usize].evictions += 1;
                }
                self.slots[slot as usize].owner = Some(u as u32);
                self.units[u] = Residency::Loading(slot);
                self.pin(slot);
                self.stats[layer as usize].misses += 1;
                match want {
                    Want::Prefix(n) if self.page_words > 0 => {
                        let at = slot as usize * self.page_words;
                        self.pages[at..at + self.page_words].fill(0);
                        for p in 0..n.min(self.bundle_pages) {
                            self.pages[at + p as usize / 64] |= 1 << (p % 64);
                        }
                        self.slots[slot as usize].partial = true;
                    }
                    _ => self.slots[slot as usize].partial = false,
                }
                Acquired::Load { slot, evicted }
            }
        }
    }

    fn has_page(&self, slot: u32, page: u32) -> bool {
        let at = slot as usize * self.page_words + page as usize / 64;
        self.pages
            .get(at)
            .is_some_and(|w| w >> (page % 64) & 1 == 1)
    }

    fn set_whole(&mut self, slot: u32) {
        self.slots[slot as usize].partial = false;
    }

    /// Pins `(layer, cluster)` for the pages `wanted` says (predicted neurons' pages): a slot
    /// for it if it has none (then every wanted page is to read), else the wanted pages its
    /// slot lacks. Appends the runs to read to `runs` (marked held; the unit loading until
    /// [`CacheDirectory::loaded`]); `None` when every slot it could use is busy.
    pub fn acquire_pages(
        &mut self,
        layer: u32,
        cluster: u32,
        wanted: impl Fn(u32) -> bool,
        runs: &mut Vec<Range<u32>>,
    ) -> Option<PagesAcquired> {
        let u = self.unit(layer, cluster);
        if let Residency::Ready(s) | Residency::Loading(s) = self.units[u] {
            self.pin(s);
            self.stats[layer as usize].hits += 1;
            if matches!(self.units[u], Residency::Ready(_)) {
                self.top_up(layer, cluster, wanted, runs);
            }
            return Some(PagesAcquired {
                slot: s,
                evicted: None,
                fresh: false,
            });
        }
        let Acquired::Load { slot, evicted } = self.acquire_part(layer, cluster, Want::Prefix(0))
        else {
            return None;
        };
        // A slot of no pages yet: every wanted page is missing.
        self.missing_runs(slot, wanted, runs);
        Some(PagesAcquired {
            slot,
            evicted,
            fresh: true,
        })
    }

    /// Gate-first loading: `(layer, cluster)`, ready in its slot, is wanted for the pages
    /// `wanted` says. Appends to `runs` the runs of those pages its slot lacks (now marked
    /// held, the unit loading until [`CacheDirectory::loaded`]) and returns the slot; `None`
    /// when the unit is not ready in a slot.
    pub fn top_up(
        &mut self,
        layer: u32,
        cluster: u32,
        wanted: impl Fn(u32) -> bool,
        runs: &mut Vec<Range<u32>>,
    ) -> Option<u32> {
        let u = self.unit(layer, cluster);
        let Residency::Ready(s) = self.units[u] else {
            return None;
        };
        if self.missing_runs(s, wanted, runs) {
            self.units[u] = Residency::Loading(s);
        }
        Some(s)
    }

    /// Appends to `runs` the runs of pages `wanted` says that `slot` (holding its unit in
    /// part) lacks, runs at most the gap apart merged, and marks them held. False when it
    /// lacks none (or holds its unit whole).
    fn missing_runs(
        &mut self,
        s: u32,
        wanted: impl Fn(u32) -> bool,
        runs: &mut Vec<Range<u32>>,
    ) -> bool {
        if !self.slots[s as usize].partial {
            return false;
        }
        let before = runs.len();
        let mut run: Option<Range<u32>> = None;
        for p in 0..self.bundle_pages {
            if !wanted(p) || self.has_page(s, p) {
                continue;
            }
            match &mut run {
                // Close enough to the run: the pages between come along.
                Some(r) if p - r.end <= self.gap => r.end = p + 1,
                _ => {
                    runs.extend(run.take());
                    run = Some(p..p + 1);
                }
            }
        }
        runs.extend(run);
        let at = s as usize * self.page_words;
        for r in &runs[before..] {
            for p in r.clone() {
                self.pages[at + p as usize / 64] |= 1 << (p % 64);
            }
        }
        runs.len() > before
    }

    fn pin(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        if s.pins == 0 && !s.hot {
            self.evictable.remove(&(s.stamp, slot));
        }
        s.pins += 1;
    }

    /// The read into its slot finished. Returns false if `(layer, cluster)` was not loading.
    pub fn loaded(&mut self, layer: u32, cluster: u32) -> bool {
        let u = self.unit(layer, cluster);
        match self.units[u] {
            Residency::Loading(s) => {
                self.units[u] = Residency::Ready(s);
                true
            }
            _ => false,
        }
    }

    /// Whether `(layer, cluster)` is in its slot and readable.
    pub fn is_ready(&self, layer: u32, cluster: u32) -> bool {
        matches!(self.units[self.unit(layer, cluster)], Residency::Ready(_))
    }

    /// The step no longer needs `(layer, cluster)`.
    pub fn release(&mut self, layer: u32, cluster: u32) {
        let u = self.unit(layer, cluster);
        let (Residency::Ready(slot) | Residency::Loading(slot)) = self.units[u] else {
            return;
        };
        let s = &mut self.slots[slot as usize];
        s.pins = s.pins.saturating_sub(1);
        if s.pins == 0 && !s.hot {
            self.clock += 1;
            s.stamp = self.clock;
            self.evictable.insert((s.stamp, slot));
        }
    }

    /// Slots held by a step now: pinned ones, ones a load is on its way into, and cold slots
    /// that are neither pinned nor evictable (lost to every later step). Between steps, after
    /// a step done or failed, every count is 0; more is a leak.
    pub fn held_slots(&self) -> u32 {
        let pinned = self.slots.iter().filter(|s| s.pins > 0).count();
        let loading = self
            .units
            .iter()
            .filter(|u| matches!(u, Residency::Loading(_)))
            .count();
        let stranded = self
            .slots
            .iter()
            .enumerate()
            .filter(|(i, s)| {
                !s.hot
                    && !s.retired
                    && s.pins == 0
                    && !self.evictable.contains(&(s.stamp, *i as u32))
            })
            .count();
        (pinned + loading + stranded) as u32
    }

    /// Leaves `slot` out of the cache from now on: its unit (if any) is no longer in it, it is
    /// never given to a unit again, and a hot unit it was reserved for competes for cold slots.
    /// For a slot something outside the directory still holds (a read stuck in it, from actors
    /// that were replaced). Only for an idle directory (between steps).
    pub fn retire(&mut self, slot: u32) {
        let Some(s) = self.slots.get(slot as usize).copied() else {
            return;
        };
        if s.retired {
            return;
        }
        if let Some(u) = s.owner {
            self.units[u as usize] = Residency::Absent;
        }
        for h in self.hot_slot.iter_mut().filter(|h| **h == Some(slot)) {
            *h = None;
        }
        self.evictable.remove(&(s.stamp, slot));
        self.slots[slot as usize] = Slot {
            owner: None,
            pins: 0,
            hot: false,
            stamp: 0,
            partial: false,
            retired: true,
        };
    }

    /// Slots left out of the cache ([`CacheDirectory::retire`]).
    pub fn retired_slots(&self) -> u32 {
        self.slots.iter().filter(|s| s.retired).count() as u32
    }

    /// Forgets every pin and every load in flight (the step failed): loading slots become
    /// empty and the first to be reused.
    pub fn abort(&mut self) {
        for u in 0..self.units.len() {
            if let Residency::Loading(s) = self.units[u] {
                self.units[u] = Residency::Absent;
                self.slots[s as usize].owner = None;
                self.slots[s as usize].partial = false;
            }
        }
        self.evictable.clear();
        for (i, s) in self.slots.iter_mut().enumerate() {
            s.pins = 0;
            if !s.hot && !s.retired {
                if s.owner.is_none() {
                    s.stamp = 0;
                }
                self.evictable.insert((s.stamp, i as u32));
            }
        }
    }

    /// Fills the cache as a long run leaves it, without reads: every hot slot holds its unit,
    /// then the empty cold slots take the next units of the plan's ranking (its `hot_units`,
    /// then the hot order), the hottest the most recently used. For a steady-state start (the
    /// simulator's `warm_cache`); the runtime fills slots as steps first use them. Returns the
    /// units now resident. Only for an idle directory (nothing pinned or loading).
    pub fn warm(&mut self, plan: &CachePlan) -> u32 {
        let mut resident = 0;
        for (u, slot) in self.hot_slot.iter().enumerate() {
            if let (Some(s), Residency::Absent) = (*slot, self.units[u]) {
                if self.slots[s as usize].owner.is_none() {
                    self.slots[s as usize].owner = Some(u as u32);
                    self.units[u] = Residency::Ready(s);
                    resident += 1;
                }
            }
        }
        let free: Vec<u32> = self
            .evictable
            .iter()
            .map(|&(_, s)| s)
            .filter(|&s| self.slots[s as usize].owner.is_none())
            .collect();
        let map = &self.map;
        let output = map.every_token_units();
        let ranked = plan.hot_units.iter().filter_map(|&u| map.from_plain(u));
        let ranked = output
            .take(if plan.hot_units.is_empty() {
                0
            } else {
                usize::MAX
            })
            .chain(ranked);
        let mut picked = Vec::with_capacity(free.len());
        let mut taken = vec![false; self.units.len()];
        for u in ranked.chain(self.map.hot_order()) {
            if picked.len() == free.len() {
                break;
            }
            if self.units[u as usize] == Residency::Absent && !taken[u as usize] {
                taken[u as usize] = true;
                picked.push(u);
            }
        }
        // The least hot first, so it gets the oldest stamp and is evicted first.
        for (&slot, &u) in free.iter().zip(picked.iter().rev()) {
            self.evictable
                .remove(&(self.slots[slot as usize].stamp, slot));
            self.clock += 1;
            let s = &mut self.slots[slot as usize];
            s.owner = Some(u);
            s.partial = false;
            s.stamp = self.clock;
            self.evictable.insert((s.stamp, slot));
            self.units[u as usize] = Residency::Ready(slot);
            resident += 1;
        }
        resident
    }

    /// Counters per layer (the last entry is the output projection).
    pub fn stats(&self) -> &[LayerCacheStats] {
        &self.stats
    }
}
