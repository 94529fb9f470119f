//! The KV cache: keys and values of past positions, f16, one contiguous run of positions per
//! (layer, KV head) so that attending a head reads one sequential stream.

use crate::quant::Kernels;
use half::slice::HalfBitsSliceExt;

/// Keys and values in f16 (as llama.cpp stores them by default). Stored as raw `u16` bits in
/// zero-initialised vectors: the allocator hands out untouched pages, so a large context costs
/// resident memory only for the positions actually used.
pub struct KvCache {
    n_head_kv: usize,
    head_dim: usize,
    capacity: usize,
    /// Per layer: `[head][position][dim]`.
    k: Vec<Vec<u16>>,
    v: Vec<Vec<u16>>,
}

impl Default for KvCache {
    /// A cache that holds nothing (a placeholder while a session's cache is lent out).
    fn default() -> Self {
        KvCache::new(0, 0, 0, 0)
    }
}

impl KvCache {
    pub fn new(n_layer: usize, n_head_kv: usize, head_dim: usize, capacity: usize) -> KvCache {
        let per_layer = n_head_kv * capacity * head_dim;
        KvCache {
            n_head_kv,
            head_dim,
            capacity,
            k: (0..n_layer).map(|_| vec![0u16; per_layer]).collect(),
            v: (0..n_layer).map(|_| vec![0u16; per_layer]).collect(),
        }
    }

    /// The most positions the cache holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn head_range(&self, head: usize) -> std::ops::Range<usize> {
        let len = self.capacity * self.head_dim;
        head * len..(head + 1) * len
    }

    /// Keys of one head, `[position][dim]` for every position the cache can hold.
    pub fn keys(&self, layer: usize, head: usize) -> &[u16] {
        &self.k[layer][self.head_range(head)]
    }

    /// Values of one head, laid out like [`KvCache::keys`].
    pub fn values(&self, layer: usize, head: usize) -> &[u16] {
        &self.v[layer][self.head_range(head)]
    }

    /// Stores keys (`is_value == false`) or values of `n` consecutive positions from `first`,
    /// given as `n * head_dim` f32 values, rounding to f16.
    pub fn store(
        &mut self,
        kernels: &Kernels,
        layer: usize,
        head: usize,
        is_value: bool,
        first: usize,
        src: &[f32],
    ) {
        debug_assert!(head < self.n_head_kv);
        let range = self.head_range(head);
        let start = range.start + first * self.head_dim;
        let buf = if is_value { &mut self.v } else { &mut self.k };
        let dst = &mut buf[layer][start..start + src.len()];
        kernels.f32_to_f16(src, dst.reinterpret_cast_mut());
    }
}
