//! CPU kernels of the `glu` family: swiglu, geglu (tanh form), reglu, geglu_erf and geglu_quick,
//! fused (each row of the one source is `[x | g]`, or with `swapped` `[g | x]`) or split (two
//! sources `x`, `g`): `dst = act(x) * g`.
//!
//! f32 and f16 (the types ggml's builder allows), rows dense and any row strides (the builder's
//! `ggml_is_contiguous_1` rule); the destination is contiguous and of the sources' type. The
//! destination's flat range is split between threads at multiples of 32 elements. Each piece of
//! a row goes in chunks of up to 256 through a stack buffer: the activation is the unary family's
//! (`unary::apply`, the AVX2 `exp`-based silu / gelu / gelu_erf / gelu_quick documented there),
//! then the product with the gate is written (f16: rounded to nearest even). Accuracy is the
//! activation's plus one rounding of the product.

use tessera::{DType, Graph, Op, Result, Tensor};

use super::binary::{binop_f32, BinOp};
use super::unary::{apply, Fun};
use super::view::{flat_share, for_row_pieces, load_f32, store_f32, CHUNK};
use crate::exec::NodeCtx;

fn dense_rows(t: &Tensor) -> bool {
    t.ne[0] <= 1 || t.nb[0] == t.dtype.type_size()
}

pub fn handles(graph: &Graph, t: &Tensor) -> bool {
    if !matches!(t.op, Op::Glu { .. }) || t.src.is_empty() || t.src.len() > 2 {
        return false;
    }
    let a = graph.tensor(t.src[0]);
    let types_ok = matches!(a.dtype, DType::F32 | DType::F16) && t.dtype == a.dtype;
    let shape_ok = match t.src.get(1) {
        Some(&b) => {
            let b = graph.tensor(b);
            b.dtype == a.dtype && b.ne == a.ne && a.ne == t.ne && dense_rows(b)
        }
        None => a.ne[0] == 2 * t.ne[0] && a.ne[1..] == t.ne[1..],
    };
    types_ok && shape_ok && dense_rows(a) && t.is_contiguous()
}

pub fn work_size(_graph: &Graph, _t: &Tensor, _nth: usize) -> usize {
    0
}

pub fn compute(ctx: &NodeCtx) -> Result<()> {
    let Op::Glu { kind, swapped } = ctx.t.op else {
        return Err(ctx.err("not a glu op"));
    };
    let act = Fun::Unary(kind.activation());
    let d = ctx.t;
    let a = ctx.s(0);
    let dt = d.dtype;
    let ts = dt.type_size();
    let nc = d.ne[0];
    // x and g: (source pointer, its strides, element offset in the row)
    let (x_src, x_nb, x_off, g_src, g_nb, g_off) = if ctx.t.src.len() == 2 {
        let b = ctx.s(1);
        (ctx.src[0], a.nb, 0, ctx.src[1], b.nb, 0)
    } else if swapped {
        (ctx.src[0], a.nb, nc, ctx.src[0], a.nb, 0)
    } else {
        (ctx.src[0], a.nb, 0, ctx.src[0], a.nb, nc)
    };
    let isa = ctx.isa;
    let range = flat_share(d.nelements(), ctx.ith, ctx.nth);
    let mut bx = [0f32; CHUNK];
    let mut bg = [0f32; CHUNK];
    for_row_pieces(&d.ne, range, |i, len, flat| {
        let row = |nb: [usize; 4]| i[1] * nb[1] + i[2] * nb[2] + i[3] * nb[3];
        // SAFETY: `exec::validate` checked every span; the piece's elements lie inside one
        // (dense) row of each source and at `flat` of the contiguous destination, which this
        // thread alone writes; the destination never shares memory with the sources (glu does
        // not run in place).
        unsafe {
            let xp = x_src.add(row(x_nb) + (x_off + i[0]) * ts);
            let gp = g_src.add(row(g_nb) + (g_off + i[0]) * ts);
            let dp = ctx.dst.add(flat * ts);
            let mut done = 0;
            while done < len {
                let c = CHUNK.min(len - done);
                let (xc, gc, dc) = (xp.add(done * ts), gp.add(done * ts), dp.add(done * ts));
                if dt == DType::F32 && kind == tessera::op::GluKind::Swiglu {
                    // ggml's swiglu arithmetic, bit for bit (see ggml_math)
                    super::ggml_math::swiglu_row_piece(
                        isa,
                        xc as *const f32,
                        gc as *const f32,
                        dc as *mut f32,
                        c,
                        i[0] + done,
                        d.ne[0],
                    );
                } else if dt == DType::F32 {
                    apply(isa, act, xc as *const f32, bx.as_mut_ptr(), c);
                    binop_f32(
                        isa,
                        BinOp::Mul,
                        bx.as_ptr(),
                        gc as *const f32,
                        1,
                        dc as *mut f32,
                        c,
                        false,
                    );
                } else {
                    load_f32(isa, dt, xc, ts, bx.as_mut_ptr(), c);
                    apply(isa, act, bx.as_ptr(), bx.as_mut_ptr(), c);
                    load_f32(isa, dt, gc, ts, bg.as_mut_ptr(), c);
                    binop_f32(
                        isa,
                        BinOp::Mul,
                        bx.as_ptr(),
                        bg.as_ptr(),
                        1,
                        bx.as_mut_ptr(),
                        c,
                        false,
                    );
                    store_f32(isa, dt, bx.as_ptr(), dc, ts, c);
                }
                done += c;
            }
        }
    });
    Ok(())
}
