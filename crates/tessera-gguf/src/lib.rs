//! GGUF files.
