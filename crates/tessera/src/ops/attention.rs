//! flash_attn_ext: softmax(scale · q·kᵀ (+ ALiBi mask), optional logit softcap) · v, with grouped-query heads.

use crate::error::Result;
use crate::reference::{Dense, NodeRef};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlashAttnParams {
    pub scale: f32,
    pub max_bias: f32,
    pub logit_softcap: f32,
}

pub(crate) fn reference(n: &NodeRef, _src: &[Dense]) -> Result<Dense> {
    Err(n.err("reference kernel not written yet"))
}
