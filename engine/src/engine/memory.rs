//! What the machine's memory allows: the context sessions get by default, and handing freed
//! pages back to the system.

use conductor_runtime::model::Model;

/// The share of the machine's memory a session's KV cache may take by default (the weights
/// and everything else need the rest).
const DEFAULT_KV_SHARE: u64 = 2;

/// The context sessions get by default without a budget: the model's training context, or
/// what half of `memory` holds when its KV cache would be larger (said through `say`). A model
/// may claim a context of millions of tokens; reserving that much would fail, or succeed and
/// be killed when used.
pub(super) fn fit_default_context(
    model: &Model,
    memory: Option<u64>,
    say: &mut dyn FnMut(&str),
) -> usize {
    let c = model.config();
    let n_ctx = c.n_ctx_train as usize;
    let Some(memory) = memory else {
        return n_ctx;
    };
    let (n, cut) = conductor_runtime::model::context_that_fits(
        c.n_layer as usize,
        c.n_head_kv as usize,
        c.head_dim as usize,
        n_ctx,
        memory / DEFAULT_KV_SHARE,
    );
    if cut {
        say(&format!(
            "context: the model's {n_ctx} tokens would need more KV cache than half of this \
             machine's {} MiB; sessions default to {n} tokens (ask for more explicitly)",
            memory >> 20
        ));
    }
    n
}

/// Physical memory of this machine in bytes, where the system says.
pub(super) fn physical_memory() -> Option<u64> {
    #[cfg(unix)]
    {
        // SAFETY: sysconf only reads system configuration; any name is safe to ask for (an
        // unknown one returns -1).
        let (pages, size) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        if pages > 0 && size > 0 {
            return (pages as u64).checked_mul(size as u64);
        }
    }
    None
}

/// Hands the allocator's free pages back to the system: loading parses the GGUF header into
/// short-lived tables (the tokenizer's metadata) whose freed pages would otherwise stay in the
/// process's resident set, counted against a memory budget.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the kernel; it touches no memory
    // the program holds and is safe to call at any time from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use conductor_runtime::gguf::GgufFile;
    use conductor_runtime::synthetic::{synthetic_model, SyntheticSpec};

    /// A model that claims 16M tokens of context: its sessions default to what half of the
    /// machine's memory holds, and the engine says so.
    #[test]
    fn a_context_too_large_for_the_machine_defaults_to_what_fits_and_says_so() {
        let spec = SyntheticSpec {
            n_ctx: 1 << 24,
            ..SyntheticSpec::default()
        };
        let bytes = synthetic_model(&spec).unwrap().to_bytes().unwrap();
        let model = Model::from_gguf(GgufFile::from_bytes(bytes).unwrap()).unwrap();
        let mut said = Vec::new();
        // 2 layers x 2 KV heads x 16 dimensions x 4 bytes: 256 bytes a position, so half of
        // 1 MiB holds 2048 positions.
        let n = fit_default_context(&model, Some(1 << 20), &mut |l| said.push(l.to_string()));
        assert_eq!(n, 2048);
        assert!(
            said.len() == 1 && said[0].contains("16777216 tokens") && said[0].contains("2048"),
            "{said:?}"
        );
        said.clear();
        let n = fit_default_context(&model, Some(1 << 40), &mut |l| said.push(l.to_string()));
        assert_eq!((n, said.len()), (1 << 24, 0));
        assert_eq!(fit_default_context(&model, None, &mut |_| {}), 1 << 24);
    }
}
