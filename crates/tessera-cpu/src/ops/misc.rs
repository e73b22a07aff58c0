//! CPU kernels of the `misc` family: pad, upscale (nearest and bilinear), arange and
//! timestep_embedding; sources of any strides, contiguous destinations.
//!
//! Every value is computed the way the reference computes it, so the results are bit-identical
//! to the reference: pad and nearest upscale copy values; bilinear upscale picks its source
//! pixels and weights with ggml's f32 arithmetic and combines them in f64 with the reference's
//! expression; arange is `start + step·i` in f64; timestep_embedding evaluates `exp`, `cos` and
//! `sin` in f64 (it is small: `dim × N` values). Work is split over destination rows
//! (timestep_embedding and arange: over elements).

use tessera::op::UpscaleMode;
use tessera::{DType, Graph, Op, Result, Tensor};

use crate::exec::NodeCtx;
use crate::ops::reduce::{copy_elems, row_offset};

/// Whether this family's kernels handle node `t` (types, layout); otherwise the fallback runs.
pub fn handles(graph: &Graph, t: &Tensor) -> bool {
    if !t.is_contiguous() {
        return false;
    }
    let src = |i: usize| graph.tensor(t.src[i]);
    match t.op {
        Op::Pad { .. } => {
            matches!(t.dtype, DType::F32 | DType::F16 | DType::BF16) && src(0).dtype == t.dtype
        }
        Op::Upscale { .. } => t.dtype == DType::F32 && src(0).dtype == DType::F32,
        Op::Arange { .. } => t.dtype == DType::F32,
        Op::TimestepEmbedding { .. } => t.dtype == DType::F32 && src(0).dtype == DType::F32,
        Op::Fill { .. } => t.dtype == DType::F32,
        _ => false,
    }
}

/// Scratch bytes node `t` needs with `nth` threads (none).
pub fn work_size(_graph: &Graph, _t: &Tensor, _nth: usize) -> usize {
    0
}

pub fn compute(ctx: &NodeCtx) -> Result<()> {
    match ctx.t.op {
        Op::Pad { .. } => pad(ctx),
        Op::Upscale { mode } => upscale(ctx, mode),
        Op::Arange { start, step, .. } => arange(ctx, start, step),
        Op::TimestepEmbedding { dim, max_period } => timestep_embedding(ctx, dim, max_period),
        Op::Fill { value } => fill(ctx, value),
        _ => Err(ctx.err("not a misc op")),
    }
}

fn fill(ctx: &NodeCtx, value: f32) -> Result<()> {
    let n = ctx.t.nelements();
    let range = ctx.share(n);
    // SAFETY: the node is contiguous f32 (see `handles`) and this thread writes only its share.
    let dst = unsafe {
        std::slice::from_raw_parts_mut((ctx.dst as *mut f32).add(range.start), range.len())
    };
    dst.fill(value);
    Ok(())
}

fn pad(ctx: &NodeCtx) -> Result<()> {
    let (a, d) = (ctx.s(0), ctx.t);
    let es = d.dtype.type_size();
    for r in ctx.share(d.nrows()) {
        let (i1, i2, i3) = (
            r % d.ne[1],
            (r / d.ne[1]) % d.ne[2],
            r / (d.ne[1] * d.ne[2]),
        );
        let dst = ctx.dst.wrapping_add(row_offset(d, r));
        let inside = i1 < a.ne[1] && i2 < a.ne[2] && i3 < a.ne[3];
        let copied = if inside { a.ne[0] } else { 0 };
        // SAFETY: the destination row (dense, ne0 elements) is this thread's; when inside, the
        // source row (i1, i2, i3) lies in the source's span.
        unsafe {
            if inside {
                let src = ctx.src[0].add(i1 * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3]);
                copy_elems(src, a.nb[0], es, copied, dst);
            }
            std::ptr::write_bytes(dst.add(copied * es), 0, (d.ne[0] - copied) * es);
        }
    }
    Ok(())
}

/// ggml's `ne / ne_src` scale factor, in f32.
fn scale_factor(ne: usize, ne_src: usize) -> f32 {
    ne as f32 / ne_src as f32
}

/// The source index nearest-neighbour resizing reads for output index `i` (the reference's f32
/// formula, clamped to the source).
#[inline(always)]
fn nearest(i: usize, sf: f32, ne_src: usize) -> usize {
    ((i as f32 / sf) as usize).min(ne_src - 1)
}

/// Bilinear source indices and weight of the second one for output index `i` (the reference's
/// f32 formula: half-pixel centres, clamped to the edges).
#[inline(always)]
fn bilinear(i: usize, sf: f32, ne_src: usize) -> (usize, usize, f64) {
    let x = (i as f32 + 0.5) / sf - 0.5;
    let last = ne_src as i64 - 1;
    let x0 = (x.floor() as i64).clamp(0, last);
    let x1 = (x0 + 1).clamp(0, last);
    let dx = (x - x0 as f32).clamp(0.0, 1.0);
    (x0 as usize, x1 as usize, dx as f64)
}

fn upscale(ctx: &NodeCtx, mode: UpscaleMode) -> Result<()> {
    let (a, d) = (ctx.s(0), ctx.t);
    if a.nelements() == 0 {
        return Ok(());
    }
    let sf: [f32; 4] = std::array::from_fn(|k| scale_factor(d.ne[k], a.ne[k]));
    for r in ctx.share(d.nrows()) {
        let (i1, i2, i3) = (
            r % d.ne[1],
            (r / d.ne[1]) % d.ne[2],
            r / (d.ne[1] * d.ne[2]),
        );
        let j2 = nearest(i2, sf[2], a.ne[2]);
        let j3 = nearest(i3, sf[3], a.ne[3]);
        let plane = ctx.src[0].wrapping_add(j2 * a.nb[2] + j3 * a.nb[3]);
        let out = ctx.dst.wrapping_add(row_offset(d, r)) as *mut f32;
        // In both arms every source index is clamped into a's shape, so each read lies in its
        // span, and the destination row (dense, ne0 f32) is this thread's.
        match mode {
            UpscaleMode::Nearest => {
                let row = plane.wrapping_add(nearest(i1, sf[1], a.ne[1]) * a.nb[1]);
                for i0 in 0..d.ne[0] {
                    // SAFETY: see above.
                    unsafe {
                        let p = row.add(nearest(i0, sf[0], a.ne[0]) * a.nb[0]);
                        *out.add(i0) = (p as *const f32).read_unaligned();
                    }
                }
            }
            UpscaleMode::Bilinear => {
                let (y0, y1, dy) = bilinear(i1, sf[1], a.ne[1]);
                let (r0, r1) = (
                    plane.wrapping_add(y0 * a.nb[1]),
                    plane.wrapping_add(y1 * a.nb[1]),
                );
                for i0 in 0..d.ne[0] {
                    let (x0, x1, dx) = bilinear(i0, sf[0], a.ne[0]);
                    // SAFETY: see above.
                    unsafe {
                        let at = |row: *const u8, x: usize| {
                            (row.add(x * a.nb[0]) as *const f32).read_unaligned() as f64
                        };
                        let v = at(r0, x0) * (1.0 - dx) * (1.0 - dy)
                            + at(r0, x1) * dx * (1.0 - dy)
                            + at(r1, x0) * (1.0 - dx) * dy
                            + at(r1, x1) * dx * dy;
                        *out.add(i0) = v as f32;
                    }
                }
            }
        }
    }
    Ok(())
}

fn arange(ctx: &NodeCtx, start: f32, step: f32) -> Result<()> {
    let out = ctx.dst as *mut f32;
    for i in ctx.share(ctx.t.nelements()) {
        // SAFETY: element i of the (contiguous) destination is this thread's.
        unsafe { *out.add(i) = (start as f64 + step as f64 * i as f64) as f32 };
    }
    Ok(())
}

fn timestep_embedding(ctx: &NodeCtx, dim: usize, max_period: i32) -> Result<()> {
    let (t, d) = (ctx.s(0), ctx.t);
    if d.ne[0] != dim {
        return Err(ctx.err(format!("rows of {}, dim {dim}", d.ne[0])));
    }
    let half = dim / 2;
    let ln_p = (max_period as f64).ln();
    let out = ctx.dst as *mut f32;
    for e in ctx.share(d.nelements()) {
        let (j, i) = (e % dim, e / dim);
        let (k, cos) = if j < half {
            (j, true)
        } else {
            (j - half, false)
        };
        let v = if k >= half {
            0.0 // the odd last element
        } else {
            // SAFETY: timestep i lies in the source's span.
            let tv = unsafe { (ctx.src[0].add(i * t.nb[0]) as *const f32).read_unaligned() } as f64;
            let arg = tv * (-ln_p * k as f64 / half as f64).exp();
            if cos {
                arg.cos()
            } else {
                arg.sin()
            }
        };
        // SAFETY: element e of the (contiguous) destination is this thread's.
        unsafe { *out.add(e) = v as f32 };
    }
    Ok(())
}
