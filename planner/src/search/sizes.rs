//! A neuron store's sizes for a model the planner has no store of: a named shape, or a model
//! file not converted yet. What `conductor convert` would write with its defaults.

use conductor_runtime::cache::StoreSizes;
use conductor_runtime::plan::ModelDescription;
use conductor_runtime::quant::GgmlType;
use conductor_runtime::store::{
    BundleLayout, DownLayout, DEFAULT_BUNDLE_NEURONS, DEFAULT_DOWN_TYPE,
};

/// Bytes of a GGUF header per vocabulary entry, estimated: the token's text, score and type,
/// and a BPE merge (SmolLM2's 49152-token vocabulary takes about 2 MiB of metadata).
pub const DEFAULT_HEADER_BYTES: u64 = 40;

/// The store `model` would convert to (bundles of `bundle_neurons`, default
/// [`DEFAULT_BUNDLE_NEURONS`], down columns in [`DEFAULT_DOWN_TYPE`]) unless its shape is a
/// store's already: the shape with its bundles, and the sizes a budget split needs. The
/// resident part is attention, norms and an estimated header.
pub fn planned_store_sizes(
    model: &ModelDescription,
    bundle_neurons: Option<u32>,
) -> Result<(ModelDescription, StoreSizes), String> {
    planned_store_sizes_with(model, bundle_neurons, None)
}

/// [`planned_store_sizes`] with the down columns in `down_type` (`None`:
/// [`DEFAULT_DOWN_TYPE`]), as `conductor convert --sparse-down-type` writes them.
pub fn planned_store_sizes_with(
    model: &ModelDescription,
    bundle_neurons: Option<u32>,
    down_type: Option<GgmlType>,
) -> Result<(ModelDescription, StoreSizes), String> {
    // A shape from a description file: its products below must not wrap.
    model.shape.check_limits()?;
    let s = &model.shape;
    let t = &model.types;
    let mut model = model.clone();
    if s.ffn_bundle == 0 || s.ffn_bundle_stride == 0 {
        let neurons = bundle_neurons.unwrap_or(DEFAULT_BUNDLE_NEURONS);
        let layout = BundleLayout::new(
            s.n_embd,
            s.n_ff,
            [t.ffn_gate, t.ffn_up, down_type.unwrap_or(DEFAULT_DOWN_TYPE)],
            DownLayout::NeuronColumns,
            neurons,
        )
        .map_err(|e| e.to_string())?;
        model.shape.ffn_bundle = layout.neurons;
        model.shape.ffn_bundle_stride = layout.stride;
        model.shape.ffn_bundle_gate_bytes = layout.gate_bytes(layout.neurons) as u64;
        model.shape.ffn_granule = 1;
    }
    let s = &model.shape;
    let row = ModelDescription::row_bytes;
    let (q, kv) = (s.n_head * s.head_dim, s.n_head_kv * s.head_dim);
    let attention = model.attention_bytes_per_layer();
    // Two norms per layer and the output norm, f32.
    let norms = (2 * u64::from(s.n_layer) + 1) * u64::from(s.n_embd) * 4;
    let sizes = StoreSizes {
        resident_weights: attention * u64::from(s.n_layer)
            + norms
            + DEFAULT_HEADER_BYTES * u64::from(s.n_vocab),
        n_layer: s.n_layer,
        n_embd: s.n_embd,
        n_ff: s.n_ff,
        q_dim: q,
        kv_dim: kv,
        n_vocab: s.n_vocab,
        bundles_per_layer: s.n_ff.div_ceil(s.ffn_bundle),
        bundle_stride: s.ffn_bundle_stride,
        output_row_bytes: row(t.output, s.n_embd),
        attention_bytes: attention * u64::from(s.n_layer),
        // The longest matrix, on 4 KiB aligned reads.
        attention_unit_bytes: model
            .attention_matrix_bytes()
            .into_iter()
            .max()
            .unwrap_or(0)
            .div_ceil(4096)
            * 4096,
        // A planned store's layers share one down type: every bundle is the stride long.
        layer_bundle_bytes: Vec::new(),
    };
    Ok((model, sizes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Heads x head size that would wrap a u32 are refused, naming the field.
    #[test]
    fn shapes_beyond_the_limits_are_refused() {
        let mut big = conductor_simulator::named_shape("smollm2-135m").unwrap();
        big.shape.n_head = 1 << 16;
        big.shape.head_dim = 1 << 16;
        let e = planned_store_sizes(&big, None).unwrap_err();
        assert!(e.contains("n_head x head_dim"), "{e}");
    }

    #[test]
    fn a_shape_is_planned_as_the_store_convert_would_write() {
        let smol = conductor_simulator::named_shape("smollm2-135m").unwrap();
        let (store, sizes) = planned_store_sizes(&smol, None).unwrap();
        assert_eq!(store.shape.ffn_bundle, 256);
        assert_eq!(sizes.bundles_per_layer, 6);
        // Gate and up rows of 576 Q4_1 values (360 bytes each) and a Q8_0 down column
        // (612 bytes) per neuron: 256 × 1332 bytes, padded to 4 KiB.
        assert_eq!(sizes.bundle_stride, (256 * 1332u64).div_ceil(4096) * 4096);
        // Attention of 30 layers: q and out 576×576, k and v 192×576, Q4_1.
        let attn = 30 * (2 * 576 + 2 * 192) * 360;
        assert!(sizes.resident_weights > attn && sizes.resident_weights < attn + (3 << 20));
        // A bundle size the layout refuses is an error, not a panic.
        assert!(planned_store_sizes(&smol, Some(0)).is_err());
        // A store's own shape is kept.
        let (again, _) = planned_store_sizes(&store, Some(64)).unwrap();
        assert_eq!(again.shape, store.shape);
    }
}
