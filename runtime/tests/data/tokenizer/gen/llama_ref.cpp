// Prints llama.cpp's view of a vocabulary as JSON: for each input text, the token ids for every
// (add_special, parse_special) combination and the detokenizations of the (true, true) ids;
// every token's piece (special = false / true); the end-of-generation tokens.
//
// Development tool for make_fixtures.py; not part of the build. Build against a llama.cpp tree:
//   g++ -O2 -std=c++17 -I$LLAMA/include -I$LLAMA/ggml/include llama_ref.cpp \
//       -L$LLAMA/build/bin -lllama -Wl,-rpath,$LLAMA/build/bin -o llama_ref
// Usage: llama_ref MODEL.gguf TEXTS  (TEXTS: texts separated by "\n__case__\n")
#include "llama.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static void print_hex(const char * p, int n) {
    printf("\"");
    for (int i = 0; i < n; i++) {
        printf("%02x", (unsigned char) p[i]);
    }
    printf("\"");
}

static std::vector<llama_token> tokenize(const llama_vocab * v, const std::string & s, bool add, bool parse) {
    std::vector<llama_token> t(s.size() * 2 + 8);
    int n = llama_tokenize(v, s.data(), (int) s.size(), t.data(), (int) t.size(), add, parse);
    if (n < 0) {
        t.resize(-n);
        n = llama_tokenize(v, s.data(), (int) s.size(), t.data(), (int) t.size(), add, parse);
    }
    t.resize(n);
    return t;
}

int main(int argc, char ** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL.gguf TEXTS\n", argv[0]);
        return 1;
    }
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const llama_vocab * v = llama_model_get_vocab(model);

    std::ifstream f(argv[2], std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string raw = ss.str();
    const std::string sep = "\n__case__\n";
    std::vector<std::string> texts;
    for (size_t pos = 0;;) {
        size_t next = raw.find(sep, pos);
        texts.push_back(raw.substr(pos, next == std::string::npos ? std::string::npos : next - pos));
        if (next == std::string::npos) {
            break;
        }
        pos = next + sep.size();
    }

    const int n = llama_vocab_n_tokens(v);
    printf("{\"bos\": %d, \"eos\": %d, \"eot\": %d, \"add_bos\": %s, \"add_eos\": %s,\n", llama_vocab_bos(v),
           llama_vocab_eos(v), llama_vocab_eot(v), llama_vocab_get_add_bos(v) ? "true" : "false",
           llama_vocab_get_add_eos(v) ? "true" : "false");
    printf("\"eog\": [");
    for (int i = 0, k = 0; i < n; i++) {
        if (llama_vocab_is_eog(v, i)) {
            printf(k++ ? ", %d" : "%d", i);
        }
    }
    printf("],\n\"pieces\": [");
    char buf[4096];
    for (int i = 0; i < n; i++) {
        printf(i ? ",\n[" : "\n[");
        print_hex(buf, llama_token_to_piece(v, i, buf, sizeof buf, 0, false));
        printf(", ");
        print_hex(buf, llama_token_to_piece(v, i, buf, sizeof buf, 0, true));
        printf("]");
    }
    printf("],\n\"cases\": [");
    for (size_t c = 0; c < texts.size(); c++) {
        printf(c ? ",\n{" : "\n{");
        std::vector<llama_token> last;
        for (int mode = 0; mode < 4; mode++) {
            const bool add = mode & 2, parse = mode & 1;
            last = tokenize(v, texts[c], add, parse);
            printf("\"ids_%d%d\": [", add, parse);
            for (size_t i = 0; i < last.size(); i++) {
                printf(i ? ", %d" : "%d", last[i]);
            }
            printf("], ");
        }
        // Detokenizations of the (add_special, parse_special) ids, for each
        // (remove_special, unparse_special).
        printf("\"detok\": [");
        for (int d = 0; d < 4; d++) {
            std::vector<char> out(last.size() * 64 + 64);
            int k = llama_detokenize(v, last.data(), (int) last.size(), out.data(), (int) out.size(), d & 2, d & 1);
            if (d) {
                printf(", ");
            }
            print_hex(out.data(), k);
        }
        printf("]}");
    }
    printf("]}\n");
    llama_model_free(model);
    return 0;
}
