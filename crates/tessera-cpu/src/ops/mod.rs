//! CPU kernels, one file per op family (the same names as the core's `ops/`). Ops without a
//! dedicated kernel yet run the reference kernel on one thread (`fallback`): correct, slow, and
//! listed by [`fast_path`].

pub mod fallback;
pub mod matmul;

use tessera::{DType, Graph, Op, Result, Tensor};

use crate::exec::NodeCtx;

/// Can this backend run `op` on these types?
pub fn supports(op: &Op, src: &[DType], dst: DType) -> bool {
    fallback::supports(op, src, dst)
}

/// Whether node `t` runs on a dedicated kernel (true) or on the single-threaded fallback.
pub fn fast_path(graph: &Graph, t: &Tensor) -> bool {
    let s = |i: usize| graph.tensor(t.src[i]);
    match &t.op {
        Op::Leaf | Op::View | Op::Reshape | Op::Permute { .. } | Op::Transpose => true,
        Op::MulMat => matmul::handles(t, s(0), s(1)),
        _ => false,
    }
}

/// Bytes of scratch a node needs with `nth` threads.
pub fn work_size(graph: &Graph, t: &Tensor, nth: usize) -> usize {
    let s = |i: usize| graph.tensor(t.src[i]);
    match &t.op {
        Op::MulMat if matmul::handles(t, s(0), s(1)) => matmul::work_size(s(0), s(1), nth),
        _ => 0,
    }
}

/// Computes this thread's share of one node.
pub fn compute(ctx: &NodeCtx) -> Result<()> {
    match &ctx.t.op {
        Op::Leaf | Op::View | Op::Reshape | Op::Permute { .. } | Op::Transpose => Ok(()),
        Op::MulMat if matmul::handles(ctx.t, ctx.s(0), ctx.s(1)) => matmul::compute(ctx),
        _ => fallback::compute(ctx),
    }
}
