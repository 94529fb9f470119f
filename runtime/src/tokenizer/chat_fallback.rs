//! Chat formats for files that carry no `tokenizer.chat_template`.
//!
//! llama.cpp renders ChatML for such a file, whatever its family. That is right for the many
//! ChatML models and wrong for Gemma, whose files often come without a template (the Gemma 3
//! file Conductor fetches is one) and which was trained on its own turn markers; Gemma files
//! get those here, everything else gets ChatML as in llama.cpp.

/// ChatML: `<|im_start|>ROLE\nCONTENT<|im_end|>\n` per message.
const CHATML: &str = "\
{%- for message in messages -%}
{{- '<|im_start|>' ~ message.role ~ '\n' ~ message.content ~ '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}";

/// Gemma's turns: BOS, `<start_of_turn>user|model\nCONTENT<end_of_turn>\n`, contents trimmed;
/// a system message opens the next user turn, followed by a blank line.
const GEMMA: &str = "\
{{- bos_token -}}
{%- set pending = namespace(system='') -%}
{%- for message in messages -%}
{%- if message.role == 'system' -%}
{%- set pending.system = message.content | trim ~ '\n\n' -%}
{%- else -%}
{{- '<start_of_turn>' ~ ('model' if message.role == 'assistant' else message.role) ~ '\n'
    ~ pending.system ~ message.content | trim ~ '<end_of_turn>\n' -}}
{%- set pending.system = '' -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}";

/// The format, as (name, template source), that a file of `architecture`
/// (`general.architecture`) without a template gets.
pub fn fallback_chat_template(architecture: &str) -> (&'static str, &'static str) {
    if architecture.starts_with("gemma") {
        ("gemma", GEMMA)
    } else {
        ("chatml", CHATML)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::{ChatMessage, ChatTemplate};

    fn render(architecture: &str, messages: &[ChatMessage]) -> String {
        let (_, source) = fallback_chat_template(architecture);
        ChatTemplate::new(source)
            .unwrap()
            .with_special_tokens("<bos>", "<eos>")
            .apply(messages, true)
            .unwrap()
    }

    #[test]
    fn gemma_turns() {
        let messages = [
            ChatMessage::new("system", " Be brief. "),
            ChatMessage::new("user", "Hi\n"),
            ChatMessage::new("assistant", "Hello."),
            ChatMessage::new("user", "Bye"),
        ];
        assert_eq!(
            render("gemma3", &messages),
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n\
             <start_of_turn>model\nHello.<end_of_turn>\n\
             <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
    }

    #[test]
    fn chatml_elsewhere() {
        let messages = [
            ChatMessage::new("system", "S"),
            ChatMessage::new("user", " U "),
        ];
        assert_eq!(
            render("qwen2", &messages),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n U <|im_end|>\n\
             <|im_start|>assistant\n"
        );
    }
}
