//! GGUF v2/v3 reader (memory-mapped) and writer.
