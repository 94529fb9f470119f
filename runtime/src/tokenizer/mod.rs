//! Tokenizers built from GGUF metadata (gpt2-style BPE, SentencePiece) and chat templates.
