//! Optimizer steps as graph ops: opt_step_adamw and opt_step_sgd (ggml's parameter tensors).

use crate::error::Result;
use crate::reference::{Dense, NodeRef};


pub(crate) fn reference(n: &NodeRef, _src: &[Dense]) -> Result<Dense> {
    Err(n.err("reference kernel not written yet"))
}
