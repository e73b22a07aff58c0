//! ggml's quantized block formats.
