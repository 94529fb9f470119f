//! Conductor's test harness: what the workspace's tests and experiments share and the products
//! (the `conductor` library, the server, the CLI) do not ship: the seeded fault harness and the
//! small random-weight model the tests share.

pub mod faults;

use conductor::runtime::synthetic::SyntheticSpec;

/// The small generated llama the fault harness and the store and cache tests share (random
/// weights): 3 layers, 128 wide, 512 FFN neurons, grouped-query attention (4 heads, 2 KV
/// heads), a 320-token vocabulary; weights drawn from `seed`.
pub fn small_spec(seed: u64) -> SyntheticSpec {
    SyntheticSpec {
        n_layer: 3,
        n_embd: 128,
        n_ff: 512,
        n_head: 4,
        n_head_kv: 2,
        seed,
        ..SyntheticSpec::default()
    }
}
