//! Matrix products with ggml's conventions: mul_mat(a, b) = b · aᵀ with a [K, M, …], b [K, N, …] and result [M, N, …], broadcast over dims 2 and 3; out_prod.

use crate::error::Result;
use crate::reference::{Dense, NodeRef};


pub(crate) fn reference(n: &NodeRef, _src: &[Dense]) -> Result<Dense> {
    Err(n.err("reference kernel not written yet"))
}
