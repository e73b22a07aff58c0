//! CPU kernels of the `optim` family.

use tessera::{Graph, Result, Tensor};

use crate::exec::NodeCtx;

/// Whether this family's kernels handle node `t` (types, layout); otherwise the fallback runs.
pub fn handles(_graph: &Graph, _t: &Tensor) -> bool {
    false
}

/// Scratch bytes node `t` needs with `nth` threads.
pub fn work_size(_graph: &Graph, _t: &Tensor, _nth: usize) -> usize {
    0
}

pub fn compute(ctx: &NodeCtx) -> Result<()> {
    Err(ctx.err("no cpu kernel yet"))
}
