//! Embedding Conductor: load the default model, stream an answer token by token, stop early.
//! Run: `cargo run --release --example embed -- "Why is the sky blue?"`
use conductor::runtime::{sample::SamplingParams, tokenizer::ChatMessage};
use conductor::{Engine, GenerateOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let question = std::env::args()
        .nth(1)
        .unwrap_or("What is the capital of France?".into());
    let mut engine = Engine::builder().build()?; // actor driver, default model (fetched once)
    let (chat, _) = engine.chat_template()?; // the file's own, or its family's format
    let prompt =
        engine.tokenize(&chat.apply(&[ChatMessage::new("user", question.as_str())], true)?);
    let mut session = engine.session(Some(2048))?; // its own KV cache
    let options = GenerateOptions {
        max_tokens: 96,
        sampling: SamplingParams::greedy(),
        ignore_eos: false,
    };
    for piece in engine.stream(&mut session, &prompt, &options)? {
        print!("{}", piece?.text); // dropping the stream (break) cancels generation
    }
    println!();
    Ok(()) // dropping the engine stops its actors and joins their threads
}
