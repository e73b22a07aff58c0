//! Rotary position embeddings, ggml's rope_ext: normal and neox modes, partial rotary dims, freq_scale, YaRN (ext_factor, attn_factor, beta_fast, beta_slow), optional frequency factors.

use crate::error::Result;
use crate::reference::{Dense, NodeRef};

/// rope_ext parameters, as ggml takes them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    pub n_dims: usize,
    /// 0 = normal (adjacent pairs), 2 = neox (halves).
    pub mode: i32,
    pub n_ctx_orig: usize,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub ext_factor: f32,
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
}

pub(crate) fn reference(n: &NodeRef, _src: &[Dense]) -> Result<Dense> {
    Err(n.err("reference kernel not written yet"))
}
