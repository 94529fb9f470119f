//! [`ModelIdentity::of`]: the identity (`plan::ModelIdentity`) a profile or plan names a
//! model by, computed from its weights.

use super::Model;
use crate::plan::{FfnActivation, ModelIdentity};

impl ModelIdentity {
    pub fn of(model: &Model) -> ModelIdentity {
        let mut crc = crc32fast::Hasher::new();
        for l in model.layers() {
            for v in l.attn_norm.iter().chain(&l.ffn_norm) {
                crc.update(&v.to_le_bytes());
            }
        }
        for v in model.output_norm() {
            crc.update(&v.to_le_bytes());
        }
        let mut row = vec![0f32; model.config().n_embd as usize];
        for token in 0..model.config().n_vocab.min(16) {
            if model.embed(token, &mut row).is_ok() {
                row.iter().for_each(|v| crc.update(&v.to_le_bytes()));
            }
        }
        let c = model.config();
        ModelIdentity {
            arch: c.arch_name.clone(),
            n_layer: c.n_layer,
            n_embd: c.n_embd,
            n_ff: c.n_ff,
            relu: c.activation == FfnActivation::Relu,
            norms_crc32: crc.finalize(),
        }
    }
}
