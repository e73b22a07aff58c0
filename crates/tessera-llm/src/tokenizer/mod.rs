//! Tokenizers read from GGUF metadata (`tokenizer.ggml.*`).
