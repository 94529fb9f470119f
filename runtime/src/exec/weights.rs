//! Where a cluster's weights come from: the model in memory, or the cache slot its unit was
//! loaded into under a memory budget (read-locked while the cluster computes). Also the FFN
//! cluster's weights ([`FfnCluster`]), from the model's matrices or from a store's bundle.

use crate::cache::{SlotArena, SlotBuf};
use crate::model::Model;
use crate::quant::MatRef;
use crate::store::{BundleLayout, DownLayout};
use std::ops::Range;
use std::sync::RwLockReadGuard;

/// A unit's bytes in its cache slot; the slot stays read-locked while this lives.
pub(super) struct SlotBytes<'a> {
    guard: RwLockReadGuard<'a, SlotBuf>,
    range: Range<usize>,
}

impl SlotBytes<'_> {
    /// The unit's bytes.
    pub(super) fn bytes(&self) -> &[u8] {
        &self.guard.bytes()[self.range.clone()]
    }
}

/// The slot holding unit `cluster` of `layer`, read-locked. A unit is computed only once it
/// is loaded: otherwise this panics with `missing()`.
pub(super) fn read_slot(
    arena: &SlotArena,
    layer: u32,
    cluster: u32,
    missing: impl FnOnce() -> String,
) -> SlotBytes<'_> {
    let slot = arena
        .slot_of(layer, cluster)
        .unwrap_or_else(|| panic!("{}", missing()));
    SlotBytes {
        guard: arena.read(slot),
        range: arena.data_range(layer, cluster),
    }
}

/// A store's bundle: from its cache slot when there is a cache, else from the file in memory.
pub(super) enum BundleBytes<'a> {
    Memory(&'a [u8]),
    Slot(SlotBytes<'a>),
}

impl BundleBytes<'_> {
    /// Bundle `bundle` of layer `layer`; `missing()` is the panic message if its slot is
    /// not loaded.
    pub(super) fn of<'a>(
        model: &'a Model,
        cache: Option<&'a SlotArena>,
        layer: u32,
        bundle: u32,
        missing: impl FnOnce() -> String,
    ) -> BundleBytes<'a> {
        match cache {
            Some(arena) => BundleBytes::Slot(read_slot(arena, layer, bundle, missing)),
            None => BundleBytes::Memory(model.bundle_bytes(layer as usize, bundle)),
        }
    }

    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            BundleBytes::Memory(bytes) => bytes,
            BundleBytes::Slot(slot) => slot.bytes(),
        }
    }
}

/// One FFN cluster's weights: gate and up rows of its neurons, and its share of the down
/// projection.
pub(super) struct FfnCluster<'a> {
    pub(super) gate: MatRef<'a>,
    pub(super) up: MatRef<'a>,
    pub(super) down: DownPart<'a>,
}

/// A cluster's share of the down projection.
pub(super) enum DownPart<'a> {
    /// `n_embd` rows whose columns `cols` are the cluster's neurons: a block-column of its own
    /// (`cols` = all), or the file's whole matrix.
    Columns { mat: MatRef<'a>, cols: Range<usize> },
    /// `m` rows of `n_embd`: row `j` is neuron `j`'s down column (a store's neuron columns).
    NeuronRows(MatRef<'a>),
}

impl<'a> FfnCluster<'a> {
    /// FFN neurons `neurons` of layer `l` from the model's matrices in memory.
    pub(super) fn of_model(model: &'a Model, l: usize, neurons: &Range<usize>) -> Self {
        let layer = &model.layers()[l];
        let (gate, up) = (
            model.rows(&layer.gate, neurons.clone()),
            model.rows(&layer.up, neurons.clone()),
        );
        // The cluster's own block-column when the down projection was re-laid per decode
        // cluster; otherwise slices of the file's rows.
        let down = match model.cluster_down(l, neurons) {
            Some(mat) => DownPart::Columns {
                mat,
                cols: 0..neurons.len(),
            },
            None => {
                let (mat, cols) = model.down_columns(l, neurons.clone());
                DownPart::Columns { mat, cols }
            }
        };
        FfnCluster { gate, up, down }
    }

    /// Bundle `bundle` of a store laid out as `layout`, from its bytes.
    pub(super) fn of_bundle(layout: &BundleLayout, bundle: u32, bytes: &'a [u8]) -> Self {
        let b = layout.split(bundle, bytes);
        let down = match b.down_layout {
            DownLayout::NeuronColumns => DownPart::NeuronRows(b.down),
            DownLayout::BlockColumns => DownPart::Columns {
                mat: b.down,
                cols: 0..b.down.cols,
            },
        };
        FfnCluster {
            gate: b.gate,
            up: b.up,
            down,
        }
    }
}
