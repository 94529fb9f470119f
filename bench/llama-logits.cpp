// Evaluates token ids with llama.cpp and writes logits (f32, little endian): the last
// position's, or with --all every position's ([token][n_vocab]). Built and used by
// bench/llama-cpp-vs-refs and bench/logits-vs-llama-cpp.
//
//   llama-logits MODEL OUT.bin FLASH_ATTN(0|1) [--all] [--tensors FILE] ID...
//
// --tensors FILE also writes the graph's named f32 tensors as llama.cpp computes them (its
// callback names: attn_norm-0, Qcur-0, kqv_out-0, ffn_out-0, l_out-0, result_norm ...), each
// as: u32 name length, the name, u32 element count, the elements. A name can repeat (Qcur
// before and after RoPE); the last is the graph's final value of it.
//
// The context settings are those of the reference outputs (shared refs README): n_ctx 1024,
// n_batch 1024, n_ubatch 512, 2 threads, KV cache f16.
#include "ggml-backend.h"
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static FILE * tensors_out = nullptr;

static void put_u32(FILE * f, uint32_t v) { fwrite(&v, sizeof v, 1, f); }

// Asked (ask = true) whether a tensor is wanted, then given it once computed.
static bool on_tensor(ggml_tensor * t, bool ask, void *) {
    if (ask) {
        return t->type == GGML_TYPE_F32 && t->name[0] != '\0';
    }
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) {
        return true;
    }
    const size_t n = (size_t) ggml_nelements(t);
    std::vector<float> data(n);
    ggml_backend_tensor_get(t, data.data(), 0, n * sizeof(float));
    const size_t len = strlen(t->name);
    put_u32(tensors_out, (uint32_t) len);
    fwrite(t->name, 1, len, tensors_out);
    put_u32(tensors_out, (uint32_t) n);
    fwrite(data.data(), sizeof(float), n, tensors_out);
    return true;
}

int main(int argc, char ** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL OUT.bin FLASH_ATTN(0|1) [--all] [--tensors FILE] ID...\n", argv[0]);
        return 2;
    }
    bool all = false;
    const char * tensors_path = nullptr;
    int first_id = 4;
    while (first_id < argc && argv[first_id][0] == '-') {
        if (strcmp(argv[first_id], "--all") == 0) {
            all = true;
            first_id += 1;
        } else if (strcmp(argv[first_id], "--tensors") == 0 && first_id + 1 < argc) {
            tensors_path = argv[first_id + 1];
            first_id += 2;
        } else {
            fprintf(stderr, "unknown option %s\n", argv[first_id]);
            return 2;
        }
    }
    std::vector<llama_token> tokens;
    for (int i = first_id; i < argc; i++) {
        tokens.push_back(atoi(argv[i]));
    }
    if (tokens.empty()) {
        fprintf(stderr, "no token ids\n");
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
    if (tensors_path) {
        tensors_out = fopen(tensors_path, "wb");
        if (!tensors_out) {
            fprintf(stderr, "cannot write %s\n", tensors_path);
            return 1;
        }
        cp.cb_eval = on_tensor;
        cp.cb_eval_user_data = nullptr;
    }
    llama_context * ctx = llama_init_from_model(model, cp);
    const int n = (int) tokens.size();
    llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        batch.token[i] = tokens[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = all || i == n - 1;
    }
    batch.n_tokens = n;
    if (llama_decode(ctx, batch)) {
        fprintf(stderr, "llama_decode failed\n");
        return 1;
    }
    if (tensors_out && fclose(tensors_out)) {
        fprintf(stderr, "cannot write %s\n", tensors_path);
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE * f = fopen(argv[2], "wb");
    bool ok = f != nullptr;
    for (int i = all ? 0 : n - 1; ok && i < n; i++) {
        const float * logits = llama_get_logits_ith(ctx, i);
        ok = logits && fwrite(logits, sizeof(float), n_vocab, f) == (size_t) n_vocab;
    }
    if (!ok || fclose(f)) {
        fprintf(stderr, "cannot write %s\n", argv[2]);
        return 1;
    }
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
