//! CPU kernels of the `binary` family: add, sub, mul, div with ggml's broadcasting of `b` over
//! `a` (each dim of `a` a multiple of `b`'s), add1 (a one-element `b`), and acc / set (a copy of
//! `a` with `b` added into, or written over, a strided region).
//!
//! add/sub/mul/div/add1: `a` and `b` of any float type (f32, f16, bf16) and any strides; the
//! result has `a`'s type and is contiguous. The destination's flat element range is split between
//! threads at multiples of 32 elements — a single huge row is shared as well as many rows.
//! - all f32 with dense rows (`b`'s row full, repeated, or one broadcast value): AVX2 straight
//!   from the sources into the destination, four registers per step. When the node touches more
//!   memory than the last-level cache holds (≥ 32 MiB in all) and does not run in place, the
//!   destination is written with non-temporal stores: no read-for-ownership, so a bandwidth-bound
//!   add moves three streams instead of four.
//! - otherwise (f16/bf16, strided rows): through f32 buffers on the stack, the same kernel, and a
//!   rounding store (nearest even) to the destination's type.
//!
//! The four operations are exact IEEE operations in both the vector and the scalar code, so
//! results do not depend on the ISA's lane width or the thread split; they equal the reference's
//! (f64, rounded once to f32) bit for bit on f32 data.
//!
//! acc / set (f32 only, as the builder requires): phase one copies `a` into the destination
//! (split by flat range), a barrier, phase two adds / writes `b`'s rows (split by rows of `b`)
//! when the region's rows cannot overlap; a region whose rows may overlap is written by thread 0
//! alone, in the reference's order.

use tessera::shape::can_repeat;
use tessera::{DType, Graph, Op, Result, Tensor};

use super::unary::walk_shape;
use super::view::{flat_share, for_row_pieces, is_float, load_f32, store_f32, CHUNK};
use crate::exec::{split, NodeCtx};
use crate::simd::Isa;

/// Nodes touching at least this many bytes (sources and destination) write with
/// non-temporal stores.
const STREAM_BYTES: usize = 32 << 20;

/// An element-wise arithmetic operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
}

impl BinOp {
    #[inline(always)]
    fn eval(self, x: f32, y: f32) -> f32 {
        match self {
            BinOp::Add => x + y,
            BinOp::Sub => x - y,
            BinOp::Mul => x * y,
            BinOp::Div => x / y,
        }
    }
}

/// `y[i] = a[i] op b[i * b_step]` for `n` f32 (`b_step` 0 broadcasts `b[0]`). With `stream`, the
/// AVX2 path writes `y` with non-temporal stores (and fences them).
///
/// # Safety
/// `a` and `y` point at `n` f32, `b` at `n` (or 1 when `b_step` is 0); `y` is either the same
/// memory as `a` (or `b`) or does not overlap them.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn binop_f32(
    isa: Isa,
    op: BinOp,
    a: *const f32,
    b: *const f32,
    b_step: usize,
    y: *mut f32,
    n: usize,
    stream: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if super::view::avx2(isa) {
        // SAFETY: AVX2 is only chosen when the CPU has it; the caller's contract.
        unsafe { x86::binop(op, a, b, b_step, y, n, stream) };
        return;
    }
    let _ = (isa, stream);
    for i in 0..n {
        // SAFETY: i < n; each index is read before it is written.
        unsafe { *y.add(i) = op.eval(*a.add(i), *b.add(i * b_step)) };
    }
}

fn binop_of(op: &Op) -> Option<BinOp> {
    Some(match op {
        Op::Add | Op::Add1 => BinOp::Add,
        Op::Sub => BinOp::Sub,
        Op::Mul => BinOp::Mul,
        Op::Div => BinOp::Div,
        _ => return None,
    })
}

pub fn handles(graph: &Graph, t: &Tensor) -> bool {
    if t.src.len() != 2 {
        return false;
    }
    let (a, b) = (graph.tensor(t.src[0]), graph.tensor(t.src[1]));
    match t.op {
        Op::Add | Op::Sub | Op::Mul | Op::Div | Op::Add1 => {
            is_float(a.dtype)
                && is_float(b.dtype)
                && t.dtype == a.dtype
                && a.ne == t.ne
                && t.is_contiguous()
                && (can_repeat(&b.ne, &a.ne) || b.nelements() == 1)
                && b.nelements() > 0
        }
        Op::Acc(_) | Op::Set(_) => {
            a.dtype == DType::F32
                && b.dtype == DType::F32
                && t.dtype == DType::F32
                && a.ne == t.ne
                && a.is_contiguous()
                && t.is_contiguous()
        }
        _ => false,
    }
}

/// Whether `b` may share memory with `a` (a view of the same storage): if the node then runs
/// in place, `b` would be overwritten while it is read, so it is first copied to the scratch.
fn b_aliases_a(graph: &Graph, t: &Tensor) -> bool {
    binop_of(&t.op).is_some() && graph.storage_root(t.src[0]).0 == graph.storage_root(t.src[1]).0
}

pub fn work_size(graph: &Graph, t: &Tensor, _nth: usize) -> usize {
    if b_aliases_a(graph, t) {
        (graph.tensor(t.src[1]).nelements() * 4).next_multiple_of(64)
    } else {
        0
    }
}

/// Internal barriers `compute` passes for this node (the same on every thread).
pub(crate) fn barriers(ctx: &NodeCtx) -> usize {
    match ctx.t.op {
        Op::Acc(_) | Op::Set(_) => 1,
        _ => {
            let (a, b) = (ctx.s(0), ctx.s(1));
            let b_is_a = std::ptr::eq(ctx.src[0], ctx.src[1]) && b.ne == a.ne && b.nb == a.nb;
            usize::from(
                b_aliases_a(ctx.graph, ctx.t) && std::ptr::eq(ctx.dst, ctx.src[0]) && !b_is_a,
            )
        }
    }
}

pub fn compute(ctx: &NodeCtx) -> Result<()> {
    match ctx.t.op {
        Op::Acc(r) | Op::Set(r) => region(ctx, matches!(ctx.t.op, Op::Acc(_)), r),
        _ => elementwise(ctx),
    }
}

fn elementwise(ctx: &NodeCtx) -> Result<()> {
    let Some(op) = binop_of(&ctx.t.op) else {
        return Err(ctx.err("not a binary op"));
    };
    let (a, b, d) = (ctx.s(0), ctx.s(1), ctx.t);
    let isa = ctx.isa;
    let n = d.nelements();
    // b's type, shape, strides and memory
    let (mut b_dt, b_ne, mut b_nb, mut b_ptr) = (b.dtype, b.ne, b.nb, ctx.src[1]);
    let mut b_dense = b.is_contiguous();
    let b_is_a = std::ptr::eq(ctx.src[0], ctx.src[1]) && b.ne == a.ne && b.nb == a.nb;
    if b_aliases_a(ctx.graph, d) && std::ptr::eq(ctx.dst, ctx.src[0]) && !b_is_a {
        // In place over a's memory, which b views: copy b (as dense f32) to the scratch first.
        let need = work_size(ctx.graph, d, ctx.nth);
        if ctx.wsize < need {
            return Err(ctx.err(format!("work buffer of {} bytes, {need} needed", ctx.wsize)));
        }
        let scratch = ctx.wdata as *mut f32;
        for_row_pieces(
            &b.ne,
            flat_share(b.nelements(), ctx.ith, ctx.nth),
            |i, len, flat| {
                // SAFETY: b's span was validated; this thread fills its own flat range of the
                // scratch, which holds b's element count (checked above).
                unsafe {
                    let p = ctx.src[1]
                        .add(i[0] * b.nb[0] + i[1] * b.nb[1] + i[2] * b.nb[2] + i[3] * b.nb[3]);
                    load_f32(isa, b.dtype, p, b.nb[0], scratch.add(flat), len);
                }
            },
        );
        ctx.barrier();
        b_dt = DType::F32;
        b_nb = tessera::shape::contiguous_nb(DType::F32, &b.ne);
        b_ptr = scratch as *const u8;
        b_dense = true;
    }
    // Walk a's shape (flat when dense and b is a full copy of it or one value).
    let b_one = b.nelements() == 1;
    let flat = a.is_contiguous() && (b_one || (b_ne == a.ne && b_dense));
    let (ane, anb) = if flat { walk_shape(a) } else { (a.ne, a.nb) };
    let (bne, bnb) = if flat && !b_one {
        ([b.nelements(), 1, 1, 1], [b_dt.type_size(), 0, 0, 0])
    } else if b_one {
        ([1, 1, 1, 1], [0; 4])
    } else {
        (b_ne, b_nb)
    };
    let dts = d.dtype.type_size();
    let all_f32 = a.dtype == DType::F32 && b_dt == DType::F32 && d.dtype == DType::F32;
    let fast = all_f32 && (anb[0] == 4 || ane[0] == 1) && (bnb[0] == 4 || bne[0] == 1);
    let stream = fast
        && a.nbytes() + b.nbytes() + d.nbytes() >= STREAM_BYTES
        && !std::ptr::eq(ctx.dst, ctx.src[0])
        && !std::ptr::eq(ctx.dst, ctx.src[1]);
    let range = flat_share(n, ctx.ith, ctx.nth);
    let mut ba = [0f32; CHUNK];
    let mut bb = [0f32; CHUNK];
    for_row_pieces(&ane, range, |i, len, flat| {
        // SAFETY: `exec::validate` checked every span; the piece lies inside one row of `a`, the
        // matching (broadcast) row of `b` and the destination at `flat`, which only this thread
        // writes. In place, the destination is `a`'s (or `b`'s) own dense memory, read before
        // written index by index.
        unsafe {
            let ap = ctx.src[0].add(i[0] * anb[0] + i[1] * anb[1] + i[2] * anb[2] + i[3] * anb[3]);
            let brow = b_ptr.add(
                (i[1] % bne[1]) * bnb[1] + (i[2] % bne[2]) * bnb[2] + (i[3] % bne[3]) * bnb[3],
            );
            let dp = ctx.dst.add(flat * dts);
            if fast {
                let (ap, dp) = (ap as *const f32, dp as *mut f32);
                let brow = brow as *const f32;
                if bne[0] == 1 {
                    binop_f32(isa, op, ap, brow, 0, dp, len, stream);
                } else {
                    // runs of b's (repeated) row
                    let mut j = 0;
                    while j < len {
                        let bj = (i[0] + j) % bne[0];
                        let c = (bne[0] - bj).min(len - j);
                        binop_f32(isa, op, ap.add(j), brow.add(bj), 1, dp.add(j), c, stream);
                        j += c;
                    }
                }
                return;
            }
            let mut done = 0;
            while done < len {
                let c = CHUNK.min(len - done);
                load_f32(
                    isa,
                    a.dtype,
                    ap.add(done * anb[0]),
                    anb[0],
                    ba.as_mut_ptr(),
                    c,
                );
                let b_step = if bne[0] == 1 {
                    load_f32(isa, b_dt, brow, bnb[0], bb.as_mut_ptr(), 1);
                    0
                } else {
                    let mut j = 0;
                    while j < c {
                        let bj = (i[0] + done + j) % bne[0];
                        let cc = (bne[0] - bj).min(c - j);
                        load_f32(
                            isa,
                            b_dt,
                            brow.add(bj * bnb[0]),
                            bnb[0],
                            bb.as_mut_ptr().add(j),
                            cc,
                        );
                        j += cc;
                    }
                    1
                };
                binop_f32(
                    isa,
                    op,
                    ba.as_ptr(),
                    bb.as_ptr(),
                    b_step,
                    ba.as_mut_ptr(),
                    c,
                    false,
                );
                store_f32(isa, d.dtype, ba.as_ptr(), dp.add(done * dts), dts, c);
                done += c;
            }
        }
    });
    #[cfg(target_arch = "x86_64")]
    if stream {
        // SAFETY: a store fence; SSE is part of x86_64. Non-temporal stores must be ordered
        // before the barrier releases the other threads.
        unsafe { std::arch::x86_64::_mm_sfence() };
    }
    Ok(())
}

/// Can two rows of the region (`ne0` f32 each, strides `nb1..nb3`, `b`'s shape) overlap?
fn rows_may_overlap(bne: &[usize; 4], nb: [usize; 3]) -> bool {
    let mut dims: [(usize, usize); 3] = [(nb[0], bne[1]), (nb[1], bne[2]), (nb[2], bne[3])];
    dims.sort_unstable();
    let mut extent = bne[0] * 4; // bytes one index of the inner dims spans
    for (stride, count) in dims {
        if count <= 1 {
            continue;
        }
        if stride < extent {
            return true;
        }
        extent = stride * count;
    }
    false
}

fn region(ctx: &NodeCtx, acc: bool, r: tessera::op::RegionParams) -> Result<()> {
    let (b, d) = (ctx.s(1), ctx.t);
    let isa = ctx.isa;
    // phase 1: dst = a
    let n = d.nelements();
    let range = flat_share(n, ctx.ith, ctx.nth);
    if !range.is_empty() && !std::ptr::eq(ctx.dst, ctx.src[0]) {
        // SAFETY: both are dense f32 of `n` elements (validated spans); this thread copies its
        // own range; the destination does not run in place for acc/set, but if it shares `a`'s
        // memory the copy is skipped.
        unsafe {
            std::ptr::copy(
                (ctx.src[0] as *const f32).add(range.start),
                (ctx.dst as *mut f32).add(range.start),
                range.len(),
            );
        }
    }
    ctx.barrier();
    // phase 2: b's rows into the region
    let nrows = b.nrows();
    let ne0 = b.ne[0];
    if nrows == 0 || ne0 == 0 {
        return Ok(());
    }
    let rows = if rows_may_overlap(&b.ne, [r.nb1, r.nb2, r.nb3]) {
        if ctx.ith == 0 {
            0..nrows
        } else {
            0..0
        }
    } else {
        split(nrows, ctx.ith, ctx.nth)
    };
    let last = r.offset
        + 4 * (ne0 - 1)
        + r.nb1 * (b.ne[1] - 1)
        + r.nb2 * (b.ne[2] - 1)
        + r.nb3 * (b.ne[3] - 1)
        + 4;
    if last > d.nbytes() || r.offset & 3 != 0 {
        return Err(ctx.err(format!(
            "region ends at byte {last}, past the {} bytes of the destination",
            d.nbytes()
        )));
    }
    let mut buf = [0f32; CHUNK];
    for row in rows {
        let (i1, i2, i3) = (
            row % b.ne[1],
            (row / b.ne[1]) % b.ne[2],
            row / (b.ne[1] * b.ne[2]),
        );
        // SAFETY: the region was checked above to lie inside the destination; b's row lies in
        // b's validated span; rows handled by different threads do not overlap.
        unsafe {
            let dp = ctx.dst.add(r.offset + i1 * r.nb1 + i2 * r.nb2 + i3 * r.nb3) as *mut f32;
            let bp = ctx.src[1].add(i1 * b.nb[1] + i2 * b.nb[2] + i3 * b.nb[3]);
            let mut done = 0;
            while done < ne0 {
                let c = CHUNK.min(ne0 - done);
                load_f32(
                    isa,
                    DType::F32,
                    bp.add(done * b.nb[0]),
                    b.nb[0],
                    buf.as_mut_ptr(),
                    c,
                );
                if acc {
                    binop_f32(
                        isa,
                        BinOp::Add,
                        dp.add(done),
                        buf.as_ptr(),
                        1,
                        dp.add(done),
                        c,
                        false,
                    );
                } else {
                    store_f32(isa, DType::F32, buf.as_ptr(), dp.add(done) as *mut u8, 4, c);
                }
                done += c;
            }
        }
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::BinOp;
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn vop(op: BinOp, x: __m256, y: __m256) -> __m256 {
        // SAFETY: register arithmetic; AVX is enabled in the (inlining) caller.
        unsafe {
            match op {
                BinOp::Add => _mm256_add_ps(x, y),
                BinOp::Sub => _mm256_sub_ps(x, y),
                BinOp::Mul => _mm256_mul_ps(x, y),
                BinOp::Div => _mm256_div_ps(x, y),
            }
        }
    }

    /// The loop for one operation; `STEP` is 1 (b a row) or 0 (b one value), `NT` selects
    /// non-temporal stores.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run<const STEP: usize, const NT: bool>(
        op: BinOp,
        a: *const f32,
        b: *const f32,
        y: *mut f32,
        n: usize,
    ) {
        // SAFETY: the caller guarantees n f32 at a, y (and b unless STEP is 0); all accesses
        // below are at indices < n; NT stores are only issued at 32-byte aligned addresses.
        unsafe {
            let mut i = 0;
            if NT {
                // scalar prologue up to a 32-byte boundary of y
                while i < n && (y.add(i) as usize) & 31 != 0 {
                    *y.add(i) = op.eval(*a.add(i), *b.add(i * STEP));
                    i += 1;
                }
            }
            let bs = _mm256_set1_ps(*b);
            macro_rules! ld_b {
                ($k:expr) => {
                    if STEP == 0 {
                        bs
                    } else {
                        _mm256_loadu_ps(b.add($k))
                    }
                };
            }
            macro_rules! st {
                ($p:expr, $v:expr) => {
                    if NT {
                        _mm256_stream_ps($p, $v)
                    } else {
                        _mm256_storeu_ps($p, $v)
                    }
                };
            }
            while i + 32 <= n {
                let r0 = vop(op, _mm256_loadu_ps(a.add(i)), ld_b!(i));
                let r1 = vop(op, _mm256_loadu_ps(a.add(i + 8)), ld_b!(i + 8));
                let r2 = vop(op, _mm256_loadu_ps(a.add(i + 16)), ld_b!(i + 16));
                let r3 = vop(op, _mm256_loadu_ps(a.add(i + 24)), ld_b!(i + 24));
                st!(y.add(i), r0);
                st!(y.add(i + 8), r1);
                st!(y.add(i + 16), r2);
                st!(y.add(i + 24), r3);
                i += 32;
            }
            while i + 8 <= n {
                st!(y.add(i), vop(op, _mm256_loadu_ps(a.add(i)), ld_b!(i)));
                i += 8;
            }
            while i < n {
                *y.add(i) = op.eval(*a.add(i), *b.add(i * STEP));
                i += 1;
            }
        }
    }

    /// See [`super::binop_f32`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn binop(
        op: BinOp,
        a: *const f32,
        b: *const f32,
        b_step: usize,
        y: *mut f32,
        n: usize,
        stream: bool,
    ) {
        if n == 0 {
            return;
        }
        // SAFETY: the caller's contract; dispatch on the operation outside the loop so each
        // instance has one arithmetic instruction.
        unsafe {
            macro_rules! go {
                ($op:expr) => {
                    match (b_step == 0, stream) {
                        (true, false) => run::<0, false>($op, a, b, y, n),
                        (true, true) => run::<0, true>($op, a, b, y, n),
                        (false, false) => run::<1, false>($op, a, b, y, n),
                        (false, true) => run::<1, true>($op, a, b, y, n),
                    }
                };
            }
            match op {
                BinOp::Add => go!(BinOp::Add),
                BinOp::Sub => go!(BinOp::Sub),
                BinOp::Mul => go!(BinOp::Mul),
                BinOp::Div => go!(BinOp::Div),
            }
        }
    }
}
