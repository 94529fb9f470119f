// Evaluates token ids with llama.cpp and writes the last position's logits (f32, little endian).
// Built and used by bench/llama-cpp-vs-refs.
//
//   llama-logits MODEL OUT.bin FLASH_ATTN(0|1) ID...
//
// The context settings are those of the reference outputs (shared refs README): n_ctx 1024,
// n_batch 1024, n_ubatch 512, 2 threads, KV cache f16.
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char ** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL OUT.bin FLASH_ATTN(0|1) ID...\n", argv[0]);
        return 2;
    }
    llama_backend_init();
    llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 1024;
    cp.n_batch = 1024;
    cp.n_ubatch = 512;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.flash_attn_type = atoi(argv[3]) ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    llama_context * ctx = llama_init_from_model(model, cp);
    std::vector<llama_token> tokens;
    for (int i = 4; i < argc; i++) {
        tokens.push_back(atoi(argv[i]));
    }
    if (llama_decode(ctx, llama_batch_get_one(tokens.data(), (int) tokens.size()))) {
        fprintf(stderr, "llama_decode failed\n");
        return 1;
    }
    const float * logits = llama_get_logits_ith(ctx, -1);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE * f = fopen(argv[2], "wb");
    if (!f || fwrite(logits, sizeof(float), n_vocab, f) != (size_t) n_vocab || fclose(f)) {
        fprintf(stderr, "cannot write %s\n", argv[2]);
        return 1;
    }
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
