//! GGUF language models on Tessera: tokenizers, model graphs with a KV cache, sampling.

pub mod tokenizer;
