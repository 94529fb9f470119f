//! What a step waits for after a phase, and the one place that turns a layer's active neurons
//! into the event that phase owes the scheduler.
//!
//! The executor observes the active neurons (gates that pass the threshold, predictions, the
//! router's experts); the simulator takes them from recorded or synthesized activity. Both hand
//! them to [`owed_event`], so a simulated run reads exactly the pages a real one would.

use super::{Event, StepId};
use crate::store::BundleLayout;
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// The event a finished phase owes before the step can go on ([`super::Command::FinishPhase`]'s
/// `then`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Awaited {
    /// After a decode step's attention, with a selection (predictors, a router): which FFN
    /// units (bundles) hold a selected neuron ([`Event::FfnPredicted`]).
    Clusters,
    /// After a gate phase (gate-first loading): the pages holding the up rows and down columns
    /// of the neurons whose gate fires ([`Event::FfnPages`]).
    GatedPages,
    /// After a decode step's attention, with predictors reading pages: the pages holding the
    /// predicted neurons' gate rows, up rows and down columns ([`Event::FfnPages`]).
    PredictedPages,
}

/// The active neurons of one layer in one step, token by token (each token's ascending), or
/// every neuron.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Activity {
    all: bool,
    neurons: Vec<u32>,
    /// End of each token's neurons in `neurons`.
    ends: Vec<u32>,
}

impl Activity {
    /// No token yet (and not every neuron).
    pub fn clear(&mut self) {
        self.all = false;
        self.neurons.clear();
        self.ends.clear();
    }

    /// Every neuron of the layer is active (nothing selected them).
    pub fn set_all(&mut self) {
        self.clear();
        self.all = true;
    }

    /// Whether every neuron is active.
    pub fn is_all(&self) -> bool {
        self.all
    }

    /// Adds a token's active neurons (ascending).
    pub fn push_token(&mut self, neurons: impl IntoIterator<Item = u32>) {
        self.neurons.extend(neurons);
        self.end_token();
    }

    /// Adds an active neuron to the token being built (ascending).
    pub fn push(&mut self, neuron: u32) {
        self.neurons.push(neuron);
    }

    /// Ends the token being built ([`Activity::push`]).
    pub fn end_token(&mut self) {
        self.ends.push(self.neurons.len() as u32);
    }

    /// Each token's active neurons.
    pub fn tokens(&self) -> impl Iterator<Item = &[u32]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(self.ends.iter().copied())
            .map(|(a, z)| &self.neurons[a as usize..z as usize])
    }

    /// The neurons active for any token, ascending, into `out`.
    pub fn union_into(&self, out: &mut Vec<u32>) {
        out.clear();
        out.extend_from_slice(&self.neurons);
        if self.ends.len() > 1 {
            out.sort_unstable();
            out.dedup();
        }
    }
}

/// Where a bundle's neurons lie in its pages (a store's [`BundleLayout`]; tests give
/// their own).
pub trait PageMap {
    /// Pages a bundle takes.
    fn bundle_pages(&self) -> u32;
    /// Sets the bits (from bit `first`) of the pages of bundle `b` holding the up rows (every
    /// up row when `up_whole`) and down columns of its neurons `active` (local, ascending).
    fn mark_active_pages(
        &self,
        b: u32,
        active: &[u32],
        up_whole: bool,
        bits: &mut [u64],
        first: usize,
    );
    /// Sets the bits of the pages of bundle `b` holding the gate rows, up rows and down
    /// columns of its neurons `neurons` (local, ascending).
    fn mark_neuron_pages(&self, b: u32, neurons: &[u32], bits: &mut [u64], first: usize);
}

impl PageMap for BundleLayout {
    fn bundle_pages(&self) -> u32 {
        BundleLayout::bundle_pages(self)
    }

    fn mark_active_pages(
        &self,
        b: u32,
        active: &[u32],
        up_whole: bool,
        bits: &mut [u64],
        first: usize,
    ) {
        BundleLayout::mark_active_pages(self, b, active, up_whole, bits, first);
    }

    fn mark_neuron_pages(&self, b: u32, neurons: &[u32], bits: &mut [u64], first: usize) {
        BundleLayout::mark_neuron_pages(self, b, neurons, bits, first);
    }
}

/// Whether a cluster of `len` neurons of which `active` fire reads every up row (one dense
/// product) rather than the active ones: the rule sparse decode's kernel follows, and so the
/// pages gate-first loading reads.
pub fn reads_whole_up_rows(active: usize, len: usize) -> bool {
    active * 2 > len
}

/// The event `awaited` asks of layer `layer` of step `step`, from its FFN selection units
/// `clusters` ([`super::Program::ffn_selection_units`]: neuron ranges, ascending, a store's
/// bundles) and their `activity`; `pages` places neurons in bundle pages
/// (needed for the page events; every page without it). `scratch` is reused between calls.
pub fn owed_event(
    awaited: Awaited,
    step: StepId,
    layer: u32,
    clusters: &[Range<u32>],
    activity: &Activity,
    pages: Option<&dyn PageMap>,
    scratch: &mut Vec<u32>,
) -> Event {
    match awaited {
        Awaited::Clusters => {
            let mut needed = vec![0u64; clusters.len().div_ceil(64)];
            if !activity.is_all() {
                activity.union_into(scratch);
            }
            for (c, r) in clusters.iter().enumerate() {
                if activity.is_all() || !in_range(scratch, r).is_empty() {
                    needed[c / 64] |= 1 << (c % 64);
                }
            }
            Event::FfnPredicted {
                step,
                layer,
                needed,
            }
        }
        Awaited::GatedPages | Awaited::PredictedPages => {
            let per = pages.map_or(1, |p| p.bundle_pages()) as usize;
            let mut bits = vec![0u64; (clusters.len() * per).div_ceil(64)];
            match pages {
                Some(map) => mark_pages(awaited, map, clusters, activity, &mut bits, scratch),
                None => (0..clusters.len() * per).for_each(|i| bits[i / 64] |= 1 << (i % 64)),
            }
            Event::FfnPages {
                step,
                layer,
                pages: bits,
            }
        }
    }
}

fn mark_pages(
    awaited: Awaited,
    map: &dyn PageMap,
    clusters: &[Range<u32>],
    activity: &Activity,
    bits: &mut [u64],
    scratch: &mut Vec<u32>,
) {
    let per = map.bundle_pages() as usize;
    let mut local = Vec::new();
    let mut mark = |c: usize, r: &Range<u32>, active: &[u32], local: &mut Vec<u32>| {
        local.clear();
        if activity.is_all() {
            local.extend(0..r.len() as u32);
        } else {
            local.extend(in_range(active, r).iter().map(|&n| n - r.start));
        }
        match awaited {
            Awaited::PredictedPages => map.mark_neuron_pages(c as u32, local, bits, c * per),
            _ if local.is_empty() => {}
            _ => {
                let whole = reads_whole_up_rows(local.len(), r.len());
                map.mark_active_pages(c as u32, local, whole, bits, c * per);
            }
        }
    };
    if awaited == Awaited::PredictedPages || activity.is_all() {
        // Predicted neurons' pages are those of any token's; every neuron's are every token's.
        activity.union_into(scratch);
        for (c, r) in clusters.iter().enumerate() {
            mark(c, r, scratch, &mut local);
        }
        return;
    }
    // Gated pages token by token: whether a cluster reads its up rows whole is each token's
    // own decision, as in the kernel.
    for active in activity.tokens() {
        for (c, r) in clusters.iter().enumerate() {
            mark(c, r, active, &mut local);
        }
    }
}

/// The part of `sorted` within `r`.
fn in_range<'a>(sorted: &'a [u32], r: &Range<u32>) -> &'a [u32] {
    let from = sorted.partition_point(|&n| n < r.start);
    let to = sorted.partition_point(|&n| n < r.end);
    &sorted[from..to]
}
