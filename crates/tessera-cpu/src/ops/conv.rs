//! CPU kernels of the `conv` family: conv_2d, im2col and pool_2d, for f32/f16/bf16 sources
//! with any strides; contiguous destinations.
//!
//! **conv_2d** is an implicit GEMM. First every thread converts its share of the output
//! channels of the kernel to f32 rows of `K = KW·KH·Cin` values in the work buffer, rounded to
//! f16 like ggml (and the reference) unless the kernel is bf16; a barrier follows. Then the
//! output is split in units of (image, output row, block of `XB` output columns); for each unit
//! and each block of `KB` taps a thread builds the patch matrix `col[k][x]` (also rounded like
//! the reference) in its slice of the work buffer and multiplies it by the kernel rows with a
//! 4-channel × 16-column register tile (AVX2 FMA, or plain Rust). Each output value is summed in
//! f32 over k in a fixed order (within a block, then block after block), whatever the thread
//! count. f16 × f16 products are exact in f32, so the only error is the f32 summation
//! (measured ≤ 8e-7 relative to the output's largest magnitude, f32 and bf16 kernels, K from
//! 144 to 1152, scalar and AVX2; the tests allow 1e-5).
//!
//! **im2col** writes each destination row (one output position) in the reference's order
//! `(ic, ky, kx)`, converting to the destination type (exact for f32; one rounding to f16/bf16,
//! as the reference). **pool_2d** computes each output value as the reference does (max in
//! order with `std::max`'s NaN behaviour, average summed in f64), bit for bit.

use tessera::op::{Conv2dParams, Im2colParams, Pool2dParams, PoolKind};
use tessera::{DType, Graph, Op, Result, Tensor};

use crate::exec::NodeCtx;
use crate::ops::ggml_math::{round_f16, round_f16_row};
use crate::ops::reduce::{load, row_offset, store};
use crate::simd::Isa;

/// Output columns per conv_2d unit (a multiple of 16, the register tile's width).
const XB: usize = 64;
/// Taps per block of the patch matrix.
const KB: usize = 256;
/// Output channels per register tile.
const OCT: usize = 4;
/// Output columns per register tile.
const XT: usize = 16;

fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

/// Whether this family's kernels handle node `t` (types, layout); otherwise the fallback runs.
pub fn handles(graph: &Graph, t: &Tensor) -> bool {
    if !t.is_contiguous() || t.src.is_empty() {
        return false;
    }
    match t.op {
        Op::Conv2d(_) => {
            t.src.len() == 2
                && is_float(graph.tensor(t.src[0]).dtype)
                && is_float(graph.tensor(t.src[1]).dtype)
                && t.dtype == DType::F32
        }
        Op::Im2col(_) => {
            t.src.len() == 2 && is_float(graph.tensor(t.src[1]).dtype) && is_float(t.dtype)
        }
        Op::Pool2d(_) => is_float(graph.tensor(t.src[0]).dtype) && t.dtype == DType::F32,
        _ => false,
    }
}

/// Bytes of the converted kernel of a conv_2d node.
fn kernel_bytes(k: &Tensor) -> usize {
    (k.nelements() * 4).next_multiple_of(64)
}

const COL_BYTES: usize = XB * KB * 4;

/// Scratch bytes node `t` needs with `nth` threads.
pub fn work_size(graph: &Graph, t: &Tensor, nth: usize) -> usize {
    match t.op {
        Op::Conv2d(_) => kernel_bytes(graph.tensor(t.src[0])) + nth * COL_BYTES,
        _ => 0,
    }
}

pub fn compute(ctx: &NodeCtx) -> Result<()> {
    match ctx.t.op {
        Op::Conv2d(p) => conv_2d(ctx, p),
        Op::Im2col(p) => im2col(ctx, p),
        Op::Pool2d(p) => pool_2d(ctx, p),
        _ => Err(ctx.err("not a convolution or pooling op")),
    }
}

/// The input index tap `k` of output `o` reads, if inside `0..len`.
#[inline(always)]
fn tap(o: usize, k: usize, s: usize, p: usize, d: usize, len: usize) -> Option<usize> {
    let i = (o * s + k * d) as isize - p as isize;
    (i >= 0 && (i as usize) < len).then_some(i as usize)
}

fn conv_2d(ctx: &NodeCtx, p: Conv2dParams) -> Result<()> {
    let (k, x, d) = (ctx.s(0), ctx.s(1), ctx.t);
    let need = work_size(ctx.graph, d, ctx.nth);
    if ctx.wsize < need {
        return Err(ctx.err(format!("work buffer of {} bytes, {need} needed", ctx.wsize)));
    }
    let (kw, kh, cin, cout) = (k.ne[0], k.ne[1], k.ne[2], k.ne[3]);
    let kk = kw * kh * cin;
    let rounded = k.dtype != DType::BF16;
    let kbuf = ctx.wdata as *mut f32;
    // phase 1: the kernel as f32 rows of K, rounded like the reference
    for oc in ctx.share(cout) {
        let mut j = oc * kk;
        for ic in 0..cin {
            for ky in 0..kh {
                for kx in 0..kw {
                    // SAFETY: the element lies in the kernel's span; kbuf holds cout·K f32
                    // (checked above) and row oc is this thread's.
                    unsafe {
                        let off = kx * k.nb[0] + ky * k.nb[1] + ic * k.nb[2] + oc * k.nb[3];
                        let v = load(k.dtype, ctx.src[0].add(off));
                        *kbuf.add(j) = if rounded { round_f16(v) } else { v };
                    }
                    j += 1;
                }
            }
        }
    }
    ctx.barrier();
    // phase 2: units of (image, output row, column block)
    let (ow, oh, nimg) = (d.ne[0], d.ne[1], d.ne[3]);
    let (iw, ih) = (x.ne[0], x.ne[1]);
    let round_input = rounded && x.dtype != DType::F16;
    let nxb = ow.div_ceil(XB);
    // SAFETY: this thread's slice of the work buffer after the kernel (sizes checked above).
    let col = unsafe { ctx.wdata.add(kernel_bytes(k) + ctx.ith * COL_BYTES) } as *mut f32;
    let mut acc = [[0f32; XT]; OCT];
    for u in ctx.share(nimg * oh * nxb) {
        let (xb, oy, b) = (u % nxb, (u / nxb) % oh, u / (nxb * oh));
        let x0 = xb * XB;
        let xn = XB.min(ow - x0);
        let xpad = xn.next_multiple_of(XT);
        let mut k0 = 0;
        while k0 < kk {
            let kb = KB.min(kk - k0);
            // the patch matrix col[t][x] for taps k0..k0+kb
            for t in 0..kb {
                let kidx = k0 + t;
                let (kx, ky, ic) = (kidx % kw, (kidx / kw) % kh, kidx / (kw * kh));
                // SAFETY: row t of col has XB f32 in this thread's slice.
                let crow = unsafe { col.add(t * XB) };
                match tap(oy, ky, p.s1, p.p1, p.d1, ih) {
                    None => {
                        for c in 0..xpad {
                            // SAFETY: c < xpad <= XB.
                            unsafe { *crow.add(c) = 0.0 };
                        }
                    }
                    Some(iy) => {
                        // columns c read ix = off + c·s0; those in c_lo..c_hi are inside
                        let off = (x0 * p.s0 + kx * p.d0) as isize - p.p0 as isize;
                        let s0 = p.s0 as isize;
                        let c_lo = if off >= 0 {
                            0
                        } else {
                            ((-off + s0 - 1) / s0) as usize
                        };
                        let c_hi = ((iw as isize - off + s0 - 1).max(0) / s0) as usize;
                        let (c_lo, c_hi) = (c_lo.min(xn), c_hi.clamp(c_lo.min(xn), xn));
                        // SAFETY: the input elements read, (off + c·s0, iy, ic, b) for c in
                        // c_lo..c_hi, are inside the input's span; writes stay in row t of col.
                        unsafe {
                            let base = ctx.src[1].add(iy * x.nb[1] + ic * x.nb[2] + b * x.nb[3]);
                            for c in 0..c_lo {
                                *crow.add(c) = 0.0;
                            }
                            if c_hi > c_lo {
                                let first =
                                    base.offset((off + c_lo as isize * s0) * x.nb[0] as isize);
                                if p.s0 == 1 && x.dtype == DType::F32 && x.nb[0] == 4 {
                                    std::ptr::copy_nonoverlapping(
                                        first as *const f32,
                                        crow.add(c_lo),
                                        c_hi - c_lo,
                                    );
                                } else {
                                    let step = p.s0 * x.nb[0];
                                    for c in c_lo..c_hi {
                                        *crow.add(c) = load(x.dtype, first.add((c - c_lo) * step));
                                    }
                                }
                            }
                            for c in c_hi..xpad {
                                *crow.add(c) = 0.0;
                            }
                            if round_input {
                                round_f16_row(ctx.isa, crow, xpad);
                            }
                        }
                    }
                }
            }
            // the product: OCT channels × XT columns at a time
            for oc0 in (0..cout).step_by(OCT) {
                let rows = OCT.min(cout - oc0);
                // rows past the end repeat the last one (computed, not stored)
                // SAFETY: every pointer is a row of kbuf, at tap k0, with kb values left.
                let w: [*const f32; OCT] = std::array::from_fn(|r| unsafe {
                    kbuf.add((oc0 + r.min(rows - 1)) * kk + k0) as *const f32
                });
                for px in (0..xn).step_by(XT) {
                    let cols = XT.min(xn - px);
                    // SAFETY: col holds kb rows of XB f32 with XT readable from px (xpad);
                    // the w rows hold kb values each.
                    unsafe { tile(ctx.isa, kb, &w, col.add(px), &mut acc) };
                    for (r, arow) in acc.iter().enumerate().take(rows) {
                        let oc = oc0 + r;
                        // SAFETY: outputs (x0+px .. +cols, oy, oc, b) lie in the destination and
                        // belong to this unit alone.
                        unsafe {
                            let out = ctx
                                .dst
                                .add(oy * d.nb[1] + oc * d.nb[2] + b * d.nb[3] + (x0 + px) * 4)
                                as *mut f32;
                            for (c, &v) in arow.iter().enumerate().take(cols) {
                                let o = out.add(c);
                                *o = if k0 == 0 { v } else { *o + v };
                            }
                        }
                    }
                }
            }
            k0 += kb;
        }
    }
    Ok(())
}

/// `acc[r][c] = Σ_t w[r][t] · col[t·XB + c]` for `t < kb`, in order of t.
///
/// # Safety
/// Each `w[r]` holds `kb` f32; `col` holds `kb` rows of stride `XB` with `XT` readable values.
unsafe fn tile(
    isa: Isa,
    kb: usize,
    w: &[*const f32; OCT],
    col: *const f32,
    acc: &mut [[f32; XT]; OCT],
) {
    #[cfg(target_arch = "x86_64")]
    if crate::ops::reduce::use_avx2(isa) {
        // SAFETY: AVX2/FMA present; the caller's contract.
        unsafe { avx2::tile(kb, w, col, acc) };
        return;
    }
    let _ = isa;
    *acc = [[0f32; XT]; OCT];
    for t in 0..kb {
        // SAFETY: t < kb (caller's contract).
        unsafe {
            let c = std::slice::from_raw_parts(col.add(t * XB), XT);
            for r in 0..OCT {
                let wv = *w[r].add(t);
                for (a, &cv) in acc[r].iter_mut().zip(c) {
                    *a += wv * cv;
                }
            }
        }
    }
}

fn im2col(ctx: &NodeCtx, p: Im2colParams) -> Result<()> {
    let (k, x, d) = (ctx.s(0), ctx.s(1), ctx.t);
    let (kw, kh) = (k.ne[0], if p.is_2d { k.ne[1] } else { 1 });
    let cin = if p.is_2d { k.ne[2] } else { k.ne[1] };
    // the input as [W, H, C, N] (1-D: H = 1)
    let (iw, ih) = (x.ne[0], if p.is_2d { x.ne[1] } else { 1 });
    let (sy, sc, sn) = if p.is_2d {
        (x.nb[1], x.nb[2], x.nb[3])
    } else {
        (0, x.nb[1], x.nb[2])
    };
    let (s1, p1, d1) = if p.is_2d {
        (p.s1, p.p1, p.d1)
    } else {
        (1, 0, 1)
    };
    let kk = d.ne[0];
    if kk != kw * kh * cin {
        return Err(ctx.err(format!("rows of {kk}, kernel of {kw}x{kh}x{cin}")));
    }
    let es = d.dtype.type_size();
    let mut buf = [0f32; 256];
    for r in ctx.share(d.nrows()) {
        let (ox, i2, i3) = (
            r % d.ne[1],
            (r / d.ne[1]) % d.ne[2],
            r / (d.ne[1] * d.ne[2]),
        );
        let (oy, b) = if p.is_2d { (i2, i3) } else { (0, i2) };
        let dst = ctx.dst.wrapping_add(row_offset(d, r));
        let mut fill = 0;
        let mut written = 0;
        for ic in 0..cin {
            for ky in 0..kh {
                let iy = tap(oy, ky, s1, p1, d1, ih);
                for kx in 0..kw {
                    buf[fill] = match (iy, tap(ox, kx, p.s0, p.p0, p.d0, iw)) {
                        // SAFETY: (ix, iy, ic, b) is inside the input's span.
                        (Some(iy), Some(ix)) => unsafe {
                            load(
                                x.dtype,
                                ctx.src[1].add(ix * x.nb[0] + iy * sy + ic * sc + b * sn),
                            )
                        },
                        _ => 0.0,
                    };
                    fill += 1;
                    if fill == buf.len() {
                        // SAFETY: elements written..written+fill of the destination row.
                        unsafe { store_row(ctx.isa, d.dtype, &buf, dst.add(written * es)) };
                        written += fill;
                        fill = 0;
                    }
                }
            }
        }
        // SAFETY: the rest of the destination row (this thread's).
        unsafe { store_row(ctx.isa, d.dtype, &buf[..fill], dst.add(written * es)) };
    }
    Ok(())
}

/// Writes `v` to the dense row `dst` of `dtype`.
///
/// # Safety
/// `dst` holds `v.len()` writable values of `dtype`.
unsafe fn store_row(isa: Isa, dtype: DType, v: &[f32], dst: *mut u8) {
    #[cfg(target_arch = "x86_64")]
    if dtype == DType::F16 && crate::ops::reduce::use_avx2(isa) {
        // SAFETY: AVX2/F16C present; the caller's contract.
        unsafe { avx2::store_f16(v, dst as *mut u16) };
        return;
    }
    let _ = isa;
    let es = dtype.type_size();
    for (i, &x) in v.iter().enumerate() {
        // SAFETY: i < v.len().
        unsafe { store(dtype, dst.add(i * es), x) };
    }
}

fn pool_2d(ctx: &NodeCtx, p: Pool2dParams) -> Result<()> {
    let (a, d) = (ctx.s(0), ctx.t);
    let (iw, ih) = (a.ne[0], a.ne[1]);
    let ow = d.ne[0];
    let area = (p.k0 * p.k1) as f64;
    for r in ctx.share(d.nrows()) {
        let (oy, c, b) = (
            r % d.ne[1],
            (r / d.ne[1]) % d.ne[2],
            r / (d.ne[1] * d.ne[2]),
        );
        let base = ctx.src[0].wrapping_add(c * a.nb[2] + b * a.nb[3]);
        let out = ctx.dst.wrapping_add(row_offset(d, r)) as *mut f32;
        for ox in 0..ow {
            let mut mx = -f32::MAX;
            let mut sum = 0f64;
            for ky in 0..p.k1 {
                let Some(iy) = tap(oy, ky, p.s1, p.p1, 1, ih) else {
                    continue;
                };
                for kx in 0..p.k0 {
                    let Some(ix) = tap(ox, kx, p.s0, p.p0, 1, iw) else {
                        continue;
                    };
                    // SAFETY: (ix, iy, c, b) lies in the source's span.
                    let v = unsafe { load(a.dtype, base.add(ix * a.nb[0] + iy * a.nb[1])) };
                    match p.kind {
                        // std::max(v, res): a NaN input wins until the next value
                        PoolKind::Max => mx = if v < mx { mx } else { v },
                        PoolKind::Avg => sum += v as f64,
                    }
                }
            }
            let v = match p.kind {
                PoolKind::Max => mx,
                PoolKind::Avg => (sum / area) as f32,
            };
            // SAFETY: output ox of this thread's destination row.
            unsafe { *out.add(ox) = v };
        }
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{OCT, XB, XT};
    use std::arch::x86_64::*;

    /// Converts `v` to f16 (nearest even) at `dst`.
    ///
    /// # Safety
    /// AVX2/F16C present; `dst` holds `v.len()` writable u16.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn store_f16(v: &[f32], dst: *mut u16) {
        // SAFETY: loads and stores stay below v.len().
        unsafe {
            let mut i = 0;
            while i + 8 <= v.len() {
                let h = _mm256_cvtps_ph(
                    _mm256_loadu_ps(v.as_ptr().add(i)),
                    _MM_FROUND_TO_NEAREST_INT,
                );
                _mm_storeu_si128(dst.add(i) as *mut __m128i, h);
                i += 8;
            }
            while i < v.len() {
                dst.add(i)
                    .write_unaligned(half::f16::from_f32(v[i]).to_bits());
                i += 1;
            }
        }
    }

    /// The 4 × 16 register tile of the conv product (see `super::tile`).
    ///
    /// # Safety
    /// AVX2/FMA present; as `super::tile`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn tile(
        kb: usize,
        w: &[*const f32; OCT],
        col: *const f32,
        acc: &mut [[f32; XT]; OCT],
    ) {
        // SAFETY: reads stay inside kb rows of col (XT values from the pointer) and kb values
        // of each w row. (Unrolled by hand so that the accumulators stay in registers at any
        // optimisation level.)
        unsafe {
            let (mut c00, mut c01) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let (mut c10, mut c11) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let (mut c20, mut c21) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let (mut c30, mut c31) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let [w0, w1, w2, w3] = *w;
            let mut p = col;
            for t in 0..kb {
                let a0 = _mm256_loadu_ps(p);
                let a1 = _mm256_loadu_ps(p.add(8));
                let b0 = _mm256_broadcast_ss(&*w0.add(t));
                c00 = _mm256_fmadd_ps(b0, a0, c00);
                c01 = _mm256_fmadd_ps(b0, a1, c01);
                let b1 = _mm256_broadcast_ss(&*w1.add(t));
                c10 = _mm256_fmadd_ps(b1, a0, c10);
                c11 = _mm256_fmadd_ps(b1, a1, c11);
                let b2 = _mm256_broadcast_ss(&*w2.add(t));
                c20 = _mm256_fmadd_ps(b2, a0, c20);
                c21 = _mm256_fmadd_ps(b2, a1, c21);
                let b3 = _mm256_broadcast_ss(&*w3.add(t));
                c30 = _mm256_fmadd_ps(b3, a0, c30);
                c31 = _mm256_fmadd_ps(b3, a1, c31);
                p = p.add(XB);
            }
            for (row, (lo, hi)) in
                acc.iter_mut()
                    .zip([(c00, c01), (c10, c11), (c20, c21), (c30, c31)])
            {
                _mm256_storeu_ps(row.as_mut_ptr(), lo);
                _mm256_storeu_ps(row.as_mut_ptr().add(8), hi);
            }
        }
    }
}
