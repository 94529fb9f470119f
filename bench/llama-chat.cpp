// Renders conversations through a chat template the way llama.cpp's tools do (llama-cli,
// llama-server: the jinja engine, which is their default) and prints the prompts as JSON.
// Built and used by bench/chat-templates-vs-llama-cpp.
//
//   llama-chat < REQUEST.json > RENDERED.json
//
// REQUEST: {"template": SOURCE, "bos": TEXT, "eos": TEXT, "add_bos": BOOL, "add_eos": BOOL,
//           "cases": [{"messages": [{"role": R, "content": C}...], "add_generation_prompt": B}]}
// RENDERED: [PROMPT, ...], one per case; a case the template refuses gives {"error": MESSAGE}.
//
// With a model, llama.cpp takes add_bos/add_eos from its vocabulary and drops the BOS text a
// template writes first (and the EOS it writes last), since tokenizing adds them again. Without
// a model the library cannot know them, so this tool does the same from the request's flags.
#include "chat.h"
#include "nlohmann/json.hpp"

#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

using json = nlohmann::ordered_json;

static bool starts_with(const std::string & s, const std::string & p) {
    return !p.empty() && s.size() >= p.size() && s.compare(0, p.size(), p) == 0;
}

static bool ends_with(const std::string & s, const std::string & p) {
    return !p.empty() && s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

int main() {
    const std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    const json req = json::parse(input);
    const std::string bos = req.value("bos", "");
    const std::string eos = req.value("eos", "");
    const bool add_bos = req.value("add_bos", false);
    const bool add_eos = req.value("add_eos", false);
    auto tmpls = common_chat_templates_init(nullptr, req.at("template").get<std::string>(), bos, eos);

    json out = json::array();
    for (const auto & c : req.at("cases")) {
        common_chat_templates_inputs inputs;
        inputs.use_jinja = true;
        inputs.add_generation_prompt = c.value("add_generation_prompt", true);
        for (const auto & m : c.at("messages")) {
            common_chat_msg msg;
            msg.role = m.at("role").get<std::string>();
            msg.content = m.at("content").get<std::string>();
            inputs.messages.push_back(msg);
        }
        try {
            std::string prompt = common_chat_templates_apply(tmpls.get(), inputs).prompt;
            if (add_bos && starts_with(prompt, bos)) {
                prompt = prompt.substr(bos.size());
            }
            if (add_eos && ends_with(prompt, eos)) {
                prompt = prompt.substr(0, prompt.size() - eos.size());
            }
            out.push_back(prompt);
        } catch (const std::exception & e) {
            out.push_back(json{{"error", e.what()}});
        }
    }
    std::cout << out.dump() << std::endl;
    return 0;
}
