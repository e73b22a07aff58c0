//! CPU kernels, one file per op family (the same names as the core's `ops/`). Ops without a
//! dedicated kernel yet run the reference kernel on one thread (`fallback`): correct, slow, and
//! listed by `CpuBackend` diagnostics.

pub mod fallback;

use tessera::{DType, Graph, Op, Result, Tensor};

use crate::exec::NodeCtx;

/// Can this backend run `op` on these types?
pub fn supports(op: &Op, src: &[DType], dst: DType) -> bool {
    fallback::supports(op, src, dst)
}

/// Bytes of scratch a node needs with `nth` threads.
pub fn work_size(_graph: &Graph, _t: &Tensor, _nth: usize) -> usize {
    0
}

/// Computes this thread's share of one node.
pub fn compute(ctx: &NodeCtx) -> Result<()> {
    match &ctx.t.op {
        Op::Leaf | Op::View | Op::Reshape | Op::Permute { .. } | Op::Transpose => Ok(()),
        _ => fallback::compute(ctx),
    }
}
