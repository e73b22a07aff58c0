//! The reference kernel run on thread 0, for ops without a dedicated CPU kernel.

use tessera::reference::{gather, run_node, scatter, NodeRef};
use tessera::{DType, Op, ReferenceBackend, Result};

use crate::exec::NodeCtx;

pub fn supports(op: &Op, src: &[DType], dst: DType) -> bool {
    use tessera::Backend;
    ReferenceBackend.supports(op, src, dst)
}

pub fn compute(ctx: &NodeCtx) -> Result<()> {
    if ctx.ith != 0 {
        return Ok(());
    }
    let mut srcs = Vec::with_capacity(ctx.t.src.len());
    for k in 0..ctx.t.src.len() {
        let st = ctx.s(k);
        // SAFETY: `exec::validate` checked that this tensor's bytes lie inside its buffer; no
        // other thread writes while thread 0 runs a fallback node (others only wait at the
        // barrier), and the slice is dropped before the destination is written.
        let bytes = unsafe { std::slice::from_raw_parts(ctx.src[k], st.nbytes()) };
        srcs.push(gather(st, bytes)?);
    }
    let out = run_node(
        &NodeRef {
            id: ctx.id,
            t: ctx.t,
            graph: ctx.graph,
        },
        &srcs,
    )?;
    // SAFETY: as above for the destination, which `validate` checked is writable; no shared
    // slice of the sources is alive any more.
    let dst = unsafe { std::slice::from_raw_parts_mut(ctx.dst, ctx.t.nbytes()) };
    scatter(ctx.t, &out, dst)
}
