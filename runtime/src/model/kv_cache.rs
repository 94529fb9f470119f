//! The KV cache: keys and values of past positions, f16, one contiguous run of positions per
//! (layer, KV head) so that attending a head reads one sequential stream.

use crate::quant::Kernels;
use half::slice::HalfBitsSliceExt;
use std::alloc::Layout;

/// Why a KV cache could not be made. Either way nothing was allocated for it.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum KvCacheError {
    #[error(
        "a KV cache of {n_ctx} positions ({n_layer} layers x {n_head_kv} KV heads x {head_dim} \
         dimensions) is larger than this machine can address"
    )]
    Overflow {
        n_ctx: usize,
        n_layer: usize,
        n_head_kv: usize,
        head_dim: usize,
    },
    #[error(
        "cannot reserve {bytes} bytes for a KV cache of {n_ctx} positions: the system refused \
         (give a smaller context)"
    )]
    Refused { n_ctx: usize, bytes: u64 },
}

/// Bytes of the keys and values of one position across every layer and KV head (`None` when
/// that overflows).
pub fn kv_bytes_per_position(n_layer: usize, n_head_kv: usize, head_dim: usize) -> Option<u64> {
    // Keys and values, 2 bytes each (f16).
    (n_layer as u64)
        .checked_mul(n_head_kv as u64)?
        .checked_mul(head_dim as u64)?
        .checked_mul(4)
}

/// The context a session gets when none is asked for: the model's training context `n_ctx`,
/// or, when its KV cache would not fit in `memory` bytes, the most positions that do (at
/// least 1). The second value says whether it was cut.
pub fn context_that_fits(
    n_layer: usize,
    n_head_kv: usize,
    head_dim: usize,
    n_ctx: usize,
    memory: u64,
) -> (usize, bool) {
    let per_position = kv_bytes_per_position(n_layer, n_head_kv, head_dim).unwrap_or(u64::MAX);
    let fits = usize::try_from(memory / per_position.max(1)).unwrap_or(usize::MAX);
    if fits >= n_ctx {
        (n_ctx, false)
    } else {
        (fits.max(1), true)
    }
}

/// `len` zeroed u16s, or `None` when the allocator refuses. `vec![0; len]` would abort the
/// process on refusal; this asks for zeroed pages the same way (untouched pages commit no
/// memory) but reports the refusal.
fn try_zeroed(len: usize) -> Option<Vec<u16>> {
    let layout = Layout::array::<u16>(len).ok()?;
    if layout.size() == 0 {
        return Some(Vec::new());
    }
    // SAFETY: the layout's size is not zero (checked above), as `alloc_zeroed` requires.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<u16>();
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `[u16; len]`, which is
    // what a `Vec<u16>` of capacity `len` frees with; its `len` elements are zero bits, a valid
    // u16 each.
    Some(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

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
        KvCache {
            n_head_kv: 0,
            head_dim: 0,
            capacity: 0,
            k: Vec::new(),
            v: Vec::new(),
        }
    }
}

impl KvCache {
    /// A cache of `capacity` positions. Every size is computed with checked arithmetic, and
    /// an allocation the system refuses is an error, not an abort: a model's context (or a
    /// caller's) may ask for more than the machine has.
    pub fn new(
        n_layer: usize,
        n_head_kv: usize,
        head_dim: usize,
        capacity: usize,
    ) -> Result<KvCache, KvCacheError> {
        let overflow = KvCacheError::Overflow {
            n_ctx: capacity,
            n_layer,
            n_head_kv,
            head_dim,
        };
        let per_layer = n_head_kv
            .checked_mul(capacity)
            .and_then(|n| n.checked_mul(head_dim))
            .filter(|&n| Layout::array::<u16>(n).is_ok())
            .ok_or_else(|| overflow.clone())?;
        let bytes = kv_bytes_per_position(n_layer, n_head_kv, head_dim)
            .and_then(|b| b.checked_mul(capacity as u64))
            .filter(|&b| usize::try_from(b).is_ok())
            .ok_or(overflow)?;
        let refused = || KvCacheError::Refused {
            n_ctx: capacity,
            bytes,
        };
        let mut k = Vec::new();
        let mut v = Vec::new();
        k.try_reserve_exact(n_layer).map_err(|_| refused())?;
        v.try_reserve_exact(n_layer).map_err(|_| refused())?;
        for _ in 0..n_layer {
            k.push(try_zeroed(per_layer).ok_or_else(refused)?);
            v.push(try_zeroed(per_layer).ok_or_else(refused)?);
        }
        Ok(KvCache {
            n_head_kv,
            head_dim,
            capacity,
            k,
            v,
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes whose product overflows, or that no machine can hold, are errors: never a wrapped
    /// size, a capacity-overflow panic or an allocation-failure abort.
    #[test]
    fn caches_too_large_to_make_are_errors_not_aborts() {
        let e = KvCache::new(32, 8, 128, usize::MAX / 2).err().unwrap();
        assert!(matches!(e, KvCacheError::Overflow { .. }), "{e}");
        assert!(KvCache::new(usize::MAX, 2, 2, 2).is_err());
        // 2^62 bytes per layer: within what a layout may describe, beyond any address space.
        let e = KvCache::new(1, 1, 1, 1 << 61).err().unwrap();
        assert!(
            matches!(e, KvCacheError::Refused { n_ctx, .. } if n_ctx == 1 << 61),
            "{e}"
        );
        assert!(e.to_string().contains("smaller context"), "{e}");
        let kv = KvCache::new(2, 2, 8, 16).unwrap();
        assert_eq!((kv.capacity(), kv.keys(1, 1).len()), (16, 16 * 8));
        assert_eq!(kv_bytes_per_position(2, 2, 8), Some(128));
        assert_eq!(kv_bytes_per_position(usize::MAX, 2, 8), None);
    }

    #[test]
    fn the_default_context_is_cut_to_what_memory_holds() {
        // 128 bytes a position: 1 MiB holds 8192 positions.
        assert_eq!(context_that_fits(2, 2, 8, 4096, 1 << 20), (4096, false));
        assert_eq!(context_that_fits(2, 2, 8, 1 << 24, 1 << 20), (8192, true));
        assert_eq!(context_that_fits(2, 2, 8, 100, 0), (1, true));
        assert_eq!(context_that_fits(usize::MAX, 2, 8, 100, 1 << 40), (1, true));
    }
}
