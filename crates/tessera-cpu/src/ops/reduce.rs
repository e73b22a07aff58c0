//! CPU kernels of the `reduce` family: sum, sum_rows, mean, argmax, count_equal, cumsum,
//! repeat, repeat_back and concat, on every type the builders accept (f32/f16/bf16, i32 where
//! the op takes it) and any source strides; the destination is contiguous.
//!
//! Determinism: every value is computed by one thread in an order that does not depend on the
//! thread count. `sum` adds fixed chunks of rows (each chunk's sum by whichever thread, stored
//! in the work buffer), then thread 0 adds the chunk sums in order after a barrier;
//! `count_equal` counts per thread and adds integers (exact in any order).
//!
//! Accuracy: sums (sum, sum_rows, mean, cumsum, repeat_back) are accumulated in **f64** like
//! ggml's `ggml_float`: each value is widened exactly and added, so the result is within one
//! rounding of the output type of the reference's f64 sum (measured ≤ 1e-7 relative to the
//! output's largest magnitude for f32 outputs, scalar and AVX2, on rows up to 5000 values).
//! cumsum and repeat_back add in the reference's order and are bit-identical to it; argmax,
//! count_equal, repeat and concat are exact.

use tessera::{DType, Graph, Op, Result, Tensor};

use crate::exec::NodeCtx;
use crate::simd::Isa;

/// Elements per chunk of `sum`: the chunk sums are the only thing that depends on this, never
/// on the thread count.
const SUM_CHUNK: usize = 1 << 14;

/// Whether this family's kernels handle node `t` (types, layout); otherwise the fallback runs.
pub fn handles(graph: &Graph, t: &Tensor) -> bool {
    if !t.is_contiguous() || t.src.is_empty() {
        return false;
    }
    let a = graph.tensor(t.src[0]);
    let float = |d: DType| matches!(d, DType::F32 | DType::F16 | DType::BF16);
    let copyable = |d: DType| float(d) || d == DType::I32;
    match t.op {
        Op::Sum | Op::SumRows => float(a.dtype) && t.dtype == a.dtype,
        Op::Mean => float(a.dtype) && t.dtype == DType::F32,
        Op::Argmax => a.dtype == DType::F32 && t.dtype == DType::I32,
        Op::CountEqual => {
            t.src.len() == 2
                && a.dtype == DType::I32
                && graph.tensor(t.src[1]).dtype == DType::I32
                && graph.tensor(t.src[1]).ne == a.ne
                && t.dtype == DType::I64
        }
        Op::Cumsum => a.dtype == DType::F32 && t.dtype == DType::F32 && a.ne == t.ne,
        Op::Repeat => copyable(a.dtype) && t.dtype == a.dtype,
        Op::RepeatBack => float(a.dtype) && t.dtype == a.dtype,
        Op::Concat { dim } => {
            t.src.len() == 2
                && dim < 4
                && copyable(a.dtype)
                && t.dtype == a.dtype
                && graph.tensor(t.src[1]).dtype == a.dtype
        }
        _ => false,
    }
}

fn sum_chunks(a: &Tensor) -> (usize, usize) {
    let rows_per_chunk = (SUM_CHUNK / a.ne[0].max(1)).max(1);
    (rows_per_chunk, a.nrows().div_ceil(rows_per_chunk))
}

/// Bytes of f64 scratch per thread for repeat_back (one destination row), 64-byte multiple.
fn repeat_back_per_thread(t: &Tensor) -> usize {
    (t.ne[0] * 8).next_multiple_of(64)
}

/// Scratch bytes node `t` needs with `nth` threads.
pub fn work_size(graph: &Graph, t: &Tensor, nth: usize) -> usize {
    match t.op {
        Op::Sum => (sum_chunks(graph.tensor(t.src[0])).1 * 8).next_multiple_of(64),
        Op::CountEqual => nth * 64,
        Op::RepeatBack => nth * repeat_back_per_thread(t),
        _ => 0,
    }
}

pub fn compute(ctx: &NodeCtx) -> Result<()> {
    let need = work_size(ctx.graph, ctx.t, ctx.nth);
    if ctx.wsize < need {
        return Err(ctx.err(format!("work buffer of {} bytes, {need} needed", ctx.wsize)));
    }
    match ctx.t.op {
        Op::Sum => sum_all(ctx),
        Op::SumRows => sum_rows(ctx, false),
        Op::Mean => sum_rows(ctx, true),
        Op::Argmax => argmax(ctx),
        Op::CountEqual => count_equal(ctx),
        Op::Cumsum => cumsum(ctx),
        Op::Repeat => repeat(ctx),
        Op::RepeatBack => repeat_back(ctx),
        Op::Concat { dim } => concat(ctx, dim),
        _ => Err(ctx.err("not a reduce-family op")),
    }
}

// ----- helpers shared by this crate's less hot families (sort, loss, optim, conv, misc)

/// The AVX2 (+FMA, F16C) paths run for `Isa::Avx2`, `Isa::AvxVnni` and `Isa::Avx512`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[inline]
pub(crate) fn use_avx2(isa: Isa) -> bool {
    cfg!(target_arch = "x86_64") && isa >= Isa::Avx2 && isa != Isa::Neon
}

/// Byte offset of row `r` of `t` (rows numbered in logical order over dims 1..3).
#[inline]
pub(crate) fn row_offset(t: &Tensor, r: usize) -> usize {
    let (i1, i2, i3) = (
        r % t.ne[1],
        (r / t.ne[1]) % t.ne[2],
        r / (t.ne[1] * t.ne[2]),
    );
    i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3]
}

/// Reads the f32/f16/bf16 value at `p` as f32 (exact).
///
/// # Safety
/// `p` points at a readable value of `dtype`.
#[inline(always)]
pub(crate) unsafe fn load(dtype: DType, p: *const u8) -> f32 {
    // SAFETY: the caller's contract; unaligned reads are allowed.
    unsafe {
        match dtype {
            DType::F32 => (p as *const f32).read_unaligned(),
            DType::F16 => half::f16::from_bits((p as *const u16).read_unaligned()).to_f32(),
            DType::BF16 => f32::from_bits(((p as *const u16).read_unaligned() as u32) << 16),
            _ => unreachable!("float types only"),
        }
    }
}

/// Writes `v` at `p` as `dtype` (f16/bf16 rounded to nearest even, as ggml converts).
///
/// # Safety
/// `p` points at a writable value of `dtype`.
#[inline(always)]
pub(crate) unsafe fn store(dtype: DType, p: *mut u8, v: f32) {
    // SAFETY: the caller's contract; unaligned writes are allowed.
    unsafe {
        match dtype {
            DType::F32 => (p as *mut f32).write_unaligned(v),
            DType::F16 => (p as *mut u16).write_unaligned(half::f16::from_f32(v).to_bits()),
            DType::BF16 => (p as *mut u16).write_unaligned(half::bf16::from_f32(v).to_bits()),
            _ => unreachable!("float types only"),
        }
    }
}

/// Copies `n` elements of `es` bytes from `src` (element stride `nb0` bytes) to dense `dst`.
///
/// # Safety
/// `src` holds `n` elements at that stride, `dst` `n * es` writable bytes not overlapping them.
#[inline]
pub(crate) unsafe fn copy_elems(src: *const u8, nb0: usize, es: usize, n: usize, dst: *mut u8) {
    // SAFETY: the caller's contract.
    unsafe {
        if nb0 == es || n == 1 {
            std::ptr::copy_nonoverlapping(src, dst, n * es);
            return;
        }
        match es {
            4 => {
                for i in 0..n {
                    let v = (src.add(i * nb0) as *const u32).read_unaligned();
                    (dst as *mut u32).add(i).write_unaligned(v);
                }
            }
            2 => {
                for i in 0..n {
                    let v = (src.add(i * nb0) as *const u16).read_unaligned();
                    (dst as *mut u16).add(i).write_unaligned(v);
                }
            }
            _ => {
                for i in 0..n {
                    std::ptr::copy_nonoverlapping(src.add(i * nb0), dst.add(i * es), es);
                }
            }
        }
    }
}

/// Σ of a row of `n` f32/f16/bf16 values (element stride `nb0` bytes), in f64.
///
/// # Safety
/// `p` holds `n` values of `dtype` at that stride.
pub(crate) unsafe fn sum_f64(isa: Isa, dtype: DType, p: *const u8, nb0: usize, n: usize) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if use_avx2(isa) && (nb0 == dtype.type_size() || n <= 1) {
        // SAFETY: Avx2 is chosen only when the CPU has AVX2, FMA and F16C; the row is dense.
        return unsafe { avx2::sum_f64(dtype, p, n) };
    }
    let _ = isa;
    let mut s = 0f64;
    for i in 0..n {
        // SAFETY: i < n (caller's contract).
        s += unsafe { load(dtype, p.add(i * nb0)) } as f64;
    }
    s
}

// ----- kernels

fn sum_all(ctx: &NodeCtx) -> Result<()> {
    let a = ctx.s(0);
    let n = a.ne[0];
    let (rpc, chunks) = sum_chunks(a);
    let nrows = a.nrows();
    let partial = ctx.wdata as *mut f64;
    for c in ctx.share(chunks) {
        let mut acc = 0f64;
        for r in c * rpc..((c + 1) * rpc).min(nrows) {
            // SAFETY: row r of the source lies in its validated span.
            acc += unsafe {
                sum_f64(
                    ctx.isa,
                    a.dtype,
                    ctx.src[0].add(row_offset(a, r)),
                    a.nb[0],
                    n,
                )
            };
        }
        // SAFETY: `compute` checked the work buffer holds `chunks` f64 (64-byte aligned); slot
        // c belongs to this thread.
        unsafe { *partial.add(c) = acc };
    }
    ctx.barrier();
    if ctx.ith == 0 {
        let mut total = 0f64;
        for c in 0..chunks {
            // SAFETY: every slot was written before the barrier.
            total += unsafe { *partial.add(c) };
        }
        // SAFETY: the destination holds one value of its type.
        unsafe { store(ctx.t.dtype, ctx.dst, total as f32) };
    }
    Ok(())
}

fn sum_rows(ctx: &NodeCtx, mean: bool) -> Result<()> {
    let (a, d) = (ctx.s(0), ctx.t);
    let n = a.ne[0];
    let es = d.dtype.type_size();
    for r in ctx.share(a.nrows()) {
        // SAFETY: row r of the source lies in its span; destination element r (contiguous) is
        // this thread's.
        unsafe {
            let s = sum_f64(
                ctx.isa,
                a.dtype,
                ctx.src[0].add(row_offset(a, r)),
                a.nb[0],
                n,
            );
            let v = if mean { s / n as f64 } else { s };
            store(d.dtype, ctx.dst.add(r * es), v as f32);
        }
    }
    Ok(())
}

fn argmax(ctx: &NodeCtx) -> Result<()> {
    let a = ctx.s(0);
    let n = a.ne[0];
    let dense = a.nb[0] == 4 || n <= 1;
    for r in ctx.share(a.nrows()) {
        // SAFETY: row r of the source has n f32 at stride nb0; destination element r is this
        // thread's.
        unsafe {
            let row = ctx.src[0].add(row_offset(a, r));
            let idx = argmax_row(ctx.isa, row, a.nb[0], n, dense);
            *(ctx.dst as *mut i32).add(r) = idx as i32;
        }
    }
    Ok(())
}

/// The last index of the largest non-NaN value (0 when there is none).
///
/// # Safety
/// `row` holds `n` f32 at stride `nb0` bytes (`nb0 == 4` when `dense`).
unsafe fn argmax_row(isa: Isa, row: *const u8, nb0: usize, n: usize, dense: bool) -> usize {
    #[cfg(target_arch = "x86_64")]
    if dense && use_avx2(isa) {
        // SAFETY: AVX2 present; the row is dense.
        return unsafe { avx2::argmax(row as *const f32, n) };
    }
    let _ = (isa, dense);
    let mut best = 0usize;
    let mut m = f32::NEG_INFINITY;
    let mut found = false;
    for i in 0..n {
        // SAFETY: i < n.
        let x = unsafe { (row.add(i * nb0) as *const f32).read_unaligned() };
        if !x.is_nan() && (!found || x >= m) {
            best = i;
            m = x;
            found = true;
        }
    }
    best
}

fn count_equal(ctx: &NodeCtx) -> Result<()> {
    let (a, b) = (ctx.s(0), ctx.s(1));
    let n = a.ne[0];
    let dense = (a.nb[0] == 4 && b.nb[0] == 4) || n <= 1;
    let mut count = 0u64;
    for r in ctx.share(a.nrows()) {
        // SAFETY: row r of both sources holds n i32 at their strides.
        unsafe {
            let pa = ctx.src[0].add(row_offset(a, r));
            let pb = ctx.src[1].add(row_offset(b, r));
            count += count_row(ctx.isa, pa, a.nb[0], pb, b.nb[0], n, dense);
        }
    }
    let slots = ctx.wdata as *mut u64;
    // SAFETY: the work buffer holds nth slots of 64 bytes; slot ith is this thread's.
    unsafe { *slots.add(ctx.ith * 8) = count };
    ctx.barrier();
    if ctx.ith == 0 {
        let mut total = 0u64;
        for t in 0..ctx.nth {
            // SAFETY: every slot was written before the barrier.
            total += unsafe { *slots.add(t * 8) };
        }
        // SAFETY: the destination is one i64.
        unsafe { (ctx.dst as *mut i64).write_unaligned(total as i64) };
    }
    Ok(())
}

/// # Safety
/// `pa`, `pb` hold `n` i32 at strides `sa`, `sb` bytes (4 when `dense`).
unsafe fn count_row(
    isa: Isa,
    pa: *const u8,
    sa: usize,
    pb: *const u8,
    sb: usize,
    n: usize,
    dense: bool,
) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if dense && use_avx2(isa) {
        // SAFETY: AVX2 present; both rows dense.
        return unsafe { avx2::count_equal(pa as *const i32, pb as *const i32, n) };
    }
    let _ = (isa, dense);
    let mut c = 0u64;
    for i in 0..n {
        // SAFETY: i < n.
        unsafe {
            let x = (pa.add(i * sa) as *const i32).read_unaligned();
            let y = (pb.add(i * sb) as *const i32).read_unaligned();
            c += u64::from(x == y);
        }
    }
    c
}

fn cumsum(ctx: &NodeCtx) -> Result<()> {
    let (a, d) = (ctx.s(0), ctx.t);
    let n = a.ne[0];
    for r in ctx.share(a.nrows()) {
        // SAFETY: row r of the source holds n f32 at stride nb0; the destination row (dense)
        // is this thread's.
        unsafe {
            let src = ctx.src[0].add(row_offset(a, r));
            let dst = ctx.dst.add(row_offset(d, r)) as *mut f32;
            let mut acc = 0f64;
            for i in 0..n {
                acc += (src.add(i * a.nb[0]) as *const f32).read_unaligned() as f64;
                *dst.add(i) = acc as f32;
            }
        }
    }
    Ok(())
}

fn repeat(ctx: &NodeCtx) -> Result<()> {
    let (a, d) = (ctx.s(0), ctx.t);
    let es = d.dtype.type_size();
    let (n0, s0) = (d.ne[0], a.ne[0]);
    if s0 == 0 {
        return Ok(());
    }
    for r in ctx.share(d.nrows()) {
        let (i1, i2, i3) = (
            r % d.ne[1],
            (r / d.ne[1]) % d.ne[2],
            r / (d.ne[1] * d.ne[2]),
        );
        let src_off =
            (i1 % a.ne[1]) * a.nb[1] + (i2 % a.ne[2]) * a.nb[2] + (i3 % a.ne[3]) * a.nb[3];
        // SAFETY: the source row holds s0 elements at stride nb0; the destination row n0
        // dense elements, this thread's alone; n0 is a multiple of s0.
        unsafe {
            let src = ctx.src[0].add(src_off);
            let dst = ctx.dst.add(row_offset(d, r));
            copy_elems(src, a.nb[0], es, s0, dst);
            // the other tiles copy the first one
            let mut done = s0;
            while done < n0 {
                let m = done.min(n0 - done);
                std::ptr::copy_nonoverlapping(dst, dst.add(done * es), m * es);
                done += m;
            }
        }
    }
    Ok(())
}

fn repeat_back(ctx: &NodeCtx) -> Result<()> {
    let (a, d) = (ctx.s(0), ctx.t);
    let n0 = d.ne[0];
    if d.nelements() == 0 {
        return Ok(());
    }
    let tiles = [
        a.ne[0] / n0,
        a.ne[1] / d.ne[1],
        a.ne[2] / d.ne[2],
        a.ne[3] / d.ne[3],
    ];
    // SAFETY: `compute` checked the work buffer; this thread's slice of n0 f64 is its own.
    let acc = unsafe {
        std::slice::from_raw_parts_mut(
            ctx.wdata.add(ctx.ith * repeat_back_per_thread(d)) as *mut f64,
            n0,
        )
    };
    let es = d.dtype.type_size();
    // Few destination rows (a bias gradient is one) would leave threads idle: split each row's
    // columns too. Every element is still summed in the reference's order, so the result is
    // the same for any split.
    let nrows = d.nrows();
    let chunks = if nrows >= ctx.nth {
        1
    } else {
        ctx.nth.div_ceil(nrows).min(n0.div_ceil(64)).max(1)
    };
    let width = n0.div_ceil(chunks);
    let f32_dense = a.dtype == DType::F32 && a.nb[0] == 4;
    for item in ctx.share(nrows * chunks) {
        let (r, c) = (item / chunks, item % chunks);
        let (c0, c1) = (c * width, ((c + 1) * width).min(n0));
        if c0 >= c1 {
            continue;
        }
        let (j1, j2, j3) = (
            r % d.ne[1],
            (r / d.ne[1]) % d.ne[2],
            r / (d.ne[1] * d.ne[2]),
        );
        let acc = &mut acc[c0..c1];
        acc.fill(0.0);
        // the reference's order: a's dims 3, 2, 1, 0 from the outside in
        for t3 in 0..tiles[3] {
            for t2 in 0..tiles[2] {
                for t1 in 0..tiles[1] {
                    let off = (j1 + t1 * d.ne[1]) * a.nb[1]
                        + (j2 + t2 * d.ne[2]) * a.nb[2]
                        + (j3 + t3 * d.ne[3]) * a.nb[3];
                    for t0 in 0..tiles[0] {
                        let base = off + (t0 * n0 + c0) * a.nb[0];
                        if f32_dense {
                            // SAFETY: elements t0*n0 + c0 .. t0*n0 + c1 of this f32 source row
                            // are in its span and dense.
                            let src = unsafe {
                                std::slice::from_raw_parts(
                                    ctx.src[0].add(base) as *const f32,
                                    c1 - c0,
                                )
                            };
                            for (s, &v) in acc.iter_mut().zip(src) {
                                *s += v as f64;
                            }
                        } else {
                            for (j, s) in acc.iter_mut().enumerate() {
                                // SAFETY: element t0*n0 + c0 + j < a.ne[0] of this source row.
                                *s += unsafe { load(a.dtype, ctx.src[0].add(base + j * a.nb[0])) }
                                    as f64;
                            }
                        }
                    }
                }
            }
        }
        let dst = ctx.dst.wrapping_add(row_offset(d, r) + c0 * es);
        for (j, &s) in acc.iter().enumerate() {
            // SAFETY: columns c0..c1 of the destination row (dense) are this thread's.
            unsafe { store(d.dtype, dst.add(j * es), s as f32) };
        }
    }
    Ok(())
}

fn concat(ctx: &NodeCtx, dim: usize) -> Result<()> {
    let (a, b, d) = (ctx.s(0), ctx.s(1), ctx.t);
    let es = d.dtype.type_size();
    for r in ctx.share(d.nrows()) {
        let mut i = [
            0,
            r % d.ne[1],
            (r / d.ne[1]) % d.ne[2],
            r / (d.ne[1] * d.ne[2]),
        ];
        let dst = ctx.dst.wrapping_add(row_offset(d, r));
        // SAFETY: the rows read lie in the sources' spans (their indices are in range); the
        // destination row (dense, ne0 elements) is this thread's.
        unsafe {
            if dim == 0 {
                let oa = i[1] * a.nb[1] + i[2] * a.nb[2] + i[3] * a.nb[3];
                let ob = i[1] * b.nb[1] + i[2] * b.nb[2] + i[3] * b.nb[3];
                copy_elems(ctx.src[0].add(oa), a.nb[0], es, a.ne[0], dst);
                copy_elems(
                    ctx.src[1].add(ob),
                    b.nb[0],
                    es,
                    b.ne[0],
                    dst.add(a.ne[0] * es),
                );
            } else {
                let (t, src) = if i[dim] < a.ne[dim] {
                    (a, ctx.src[0])
                } else {
                    i[dim] -= a.ne[dim];
                    (b, ctx.src[1])
                };
                let off = i[1] * t.nb[1] + i[2] * t.nb[2] + i[3] * t.nb[3];
                copy_elems(src.add(off), t.nb[0], es, t.ne[0], dst);
            }
        }
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;
    use tessera::DType;

    /// Eight f32/f16/bf16 values at `p` as f32.
    ///
    /// # Safety
    /// AVX2 and F16C present; 8 readable values of `dtype` at `p`.
    #[inline(always)]
    pub unsafe fn load8(dtype: DType, p: *const u8) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe {
            match dtype {
                DType::F32 => _mm256_loadu_ps(p as *const f32),
                DType::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
                _ => {
                    let h = _mm_loadu_si128(p as *const __m128i);
                    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                }
            }
        }
    }

    #[inline(always)]
    pub unsafe fn hsum_pd(v: __m256d) -> f64 {
        // SAFETY: register arithmetic, AVX enabled by the caller.
        unsafe {
            let lo = _mm256_castpd256_pd128(v);
            let hi = _mm256_extractf128_pd(v, 1);
            let s = _mm_add_pd(lo, hi);
            _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)))
        }
    }

    #[inline(always)]
    pub unsafe fn hmax_ps(v: __m256) -> f32 {
        // SAFETY: register arithmetic, AVX enabled by the caller.
        unsafe {
            let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
            _mm_cvtss_f32(m)
        }
    }

    /// Σ of `n` dense values in f64: 16 per step into four f64×4 accumulators.
    ///
    /// # Safety
    /// AVX2 and F16C present; `p` holds `n` values of `dtype`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn sum_f64(dtype: DType, p: *const u8, n: usize) -> f64 {
        let es = dtype.type_size();
        // SAFETY: loads stay below n.
        unsafe {
            let mut acc = [_mm256_setzero_pd(); 4];
            let mut i = 0;
            while i + 16 <= n {
                let a = load8(dtype, p.add(i * es));
                let b = load8(dtype, p.add((i + 8) * es));
                acc[0] = _mm256_add_pd(acc[0], _mm256_cvtps_pd(_mm256_castps256_ps128(a)));
                acc[1] = _mm256_add_pd(acc[1], _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)));
                acc[2] = _mm256_add_pd(acc[2], _mm256_cvtps_pd(_mm256_castps256_ps128(b)));
                acc[3] = _mm256_add_pd(acc[3], _mm256_cvtps_pd(_mm256_extractf128_ps(b, 1)));
                i += 16;
            }
            if i + 8 <= n {
                let a = load8(dtype, p.add(i * es));
                acc[0] = _mm256_add_pd(acc[0], _mm256_cvtps_pd(_mm256_castps256_ps128(a)));
                acc[1] = _mm256_add_pd(acc[1], _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)));
                i += 8;
            }
            let t = _mm256_add_pd(_mm256_add_pd(acc[0], acc[1]), _mm256_add_pd(acc[2], acc[3]));
            let mut s = hsum_pd(t);
            while i < n {
                s += super::load(dtype, p.add(i * es)) as f64;
                i += 1;
            }
            s
        }
    }

    /// The last index of the largest non-NaN value of a dense f32 row (0 when none).
    ///
    /// # Safety
    /// AVX2 present; `x` holds `n` f32.
    #[target_feature(enable = "avx2")]
    pub unsafe fn argmax(x: *const f32, n: usize) -> usize {
        // SAFETY: loads stay below n.
        unsafe {
            // max over non-NaN values: maxps returns its second operand when either is NaN
            let mut acc = _mm256_set1_ps(f32::NEG_INFINITY);
            let mut i = 0;
            while i + 8 <= n {
                acc = _mm256_max_ps(_mm256_loadu_ps(x.add(i)), acc);
                i += 8;
            }
            let mut m = hmax_ps(acc);
            for j in i..n {
                let v = *x.add(j);
                if v > m {
                    m = v;
                }
            }
            // the last index holding it
            let n8 = i;
            for j in (n8..n).rev() {
                if *x.add(j) == m {
                    return j;
                }
            }
            let mv = _mm256_set1_ps(m);
            let mut b = n8;
            while b >= 8 {
                b -= 8;
                let eq = _mm256_cmp_ps(_mm256_loadu_ps(x.add(b)), mv, _CMP_EQ_OQ);
                let mask = _mm256_movemask_ps(eq) as u32;
                if mask != 0 {
                    return b + 31 - mask.leading_zeros() as usize;
                }
            }
            0
        }
    }

    /// How many of `n` i32 pairs are equal.
    ///
    /// # Safety
    /// AVX2 present; `a` and `b` hold `n` i32.
    #[target_feature(enable = "avx2")]
    pub unsafe fn count_equal(a: *const i32, b: *const i32, n: usize) -> u64 {
        // SAFETY: loads stay below n.
        unsafe {
            let mut c = 0u64;
            let mut i = 0;
            while i + 8 <= n {
                let x = _mm256_loadu_si256(a.add(i) as *const __m256i);
                let y = _mm256_loadu_si256(b.add(i) as *const __m256i);
                let eq = _mm256_cmpeq_epi32(x, y);
                c += (_mm256_movemask_ps(_mm256_castsi256_ps(eq)) as u32).count_ones() as u64;
                i += 8;
            }
            while i < n {
                c += u64::from(*a.add(i) == *b.add(i));
                i += 1;
            }
            c
        }
    }
}
