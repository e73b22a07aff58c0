//! soft_max / soft_max_ext (scale, optional f16 or f32 mask broadcast over dims 2 and 3, ALiBi max_bias) and diag_mask_inf / diag_mask_zero.

use crate::error::Result;
use crate::reference::{Dense, NodeRef};


pub(crate) fn reference(n: &NodeRef, _src: &[Dense]) -> Result<Dense> {
    Err(n.err("reference kernel not written yet"))
}
