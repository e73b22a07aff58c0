//! CPU kernels of the `rows` family.
//!
//! **get_rows** gathers rows of `a` (f32, f16, bf16 with any strides; i32; or any quantized
//! type with a dequantizer, rows dense) into the contiguous f32 (i32 for an i32 `a`)
//! destination. Each thread takes a contiguous range of destination rows. f16/bf16 rows are
//! widened 8 at a time on AVX2; quantized rows are decoded by
//! `tessera_quants::dequantize_row` straight into the destination row. Exact (conversions to
//! f32 are exact; the dequantizer is the reference's).
//!
//! **set_rows** writes rows of `b` (f32 or f16, dense rows) into the rows of the destination
//! (`a`'s memory, any row strides, dense rows) named by i32 or i64 indices, converted to the
//! destination's type: f32, f16 (round to nearest even, 8 at a time on AVX2) or bf16 (round to
//! nearest even). Quantized destinations take the fallback. Each thread owns a contiguous range
//! of destination rows and scans the indices of the planes it touches in order, so duplicate
//! indices resolve like the reference (the last write wins) whatever the thread count, and no
//! two threads ever write the same row.
//!
//! **get_rows_back** (the gradient of get_rows: f32 gradient rows `[ne0, n, ne2, ne3]`, dense
//! rows with any row strides, scatter-added by i32 indices `[n, ne2, ne3]` into the contiguous
//! f32 destination; any number of rows) never races on a destination row: each thread owns a
//! contiguous range of destination rows and, per plane, counting-sorts the indices that fall in
//! its range into per-row buckets (scratch: an f64 row and u32 buckets, from the work buffer).
//! Each destination row is then written once: zeros, `0 + g` for one gradient row, or the f64
//! sum of its gradient rows in ascending order — the reference's arithmetic exactly, so the
//! result is the reference's bit for bit whatever the thread count. (The work of a thread is
//! the rows it owns: indices that all name one row leave the other threads idle.)
//!
//! Indices are data: before writing anything, every thread checks all of them, so an index
//! outside the rows is an error (naming the index, its position and the row count) that leaves
//! the destination untouched.

use tessera::{DType, Graph, Op, Result, Tensor};

use crate::exec::NodeCtx;
use crate::simd::Isa;

/// Whether this family's kernels handle node `t` (types, layout); otherwise the fallback runs.
pub fn handles(graph: &Graph, t: &Tensor) -> bool {
    let s = |i: usize| graph.tensor(t.src[i]);
    match t.op {
        Op::GetRows => {
            let (a, idx) = (s(0), s(1));
            let src_ok = match a.dtype {
                DType::F32 | DType::F16 | DType::BF16 => t.dtype == DType::F32,
                DType::I32 => t.dtype == DType::I32,
                q if q.is_quantized() => {
                    t.dtype == DType::F32
                        && tessera_quants::layout(q.id()).is_some()
                        && tessera::shape::rows_contiguous(q, &a.ne, &a.nb)
                }
                _ => false,
            };
            src_ok && idx.dtype == DType::I32 && t.is_contiguous() && t.ne[0] == a.ne[0]
        }
        Op::SetRows => {
            let (b, idx) = (s(1), s(2));
            matches!(t.dtype, DType::F32 | DType::F16 | DType::BF16)
                && matches!(b.dtype, DType::F32 | DType::F16)
                && matches!(idx.dtype, DType::I32 | DType::I64)
                && tessera::shape::rows_contiguous(b.dtype, &b.ne, &b.nb)
                && tessera::shape::rows_contiguous(t.dtype, &t.ne, &t.nb)
                && b.ne[0] == t.ne[0]
        }
        Op::GetRowsBack => {
            let (g, idx) = (s(0), s(1));
            g.dtype == DType::F32
                && idx.dtype == DType::I32
                && t.dtype == DType::F32
                && (g.nb[0] == 4 || g.ne[0] <= 1)
                && t.is_contiguous()
                && u32::try_from(s(1).ne[0]).is_ok()
        }
        _ => false,
    }
}

/// Scratch bytes node `t` needs with `nth` threads.
pub fn work_size(graph: &Graph, t: &Tensor, nth: usize) -> usize {
    match t.op {
        Op::GetRowsBack => nth * back_scratch(graph, t, nth).per_thread,
        _ => 0,
    }
}

/// Per-thread scratch of get_rows_back: an f64 accumulator row, then the counting sort's
/// bucket ends (one per destination row the thread may own in a plane, plus one) and its list
/// of gradient rows (one per index of a plane), as u32.
struct BackScratch {
    buckets: usize,
    per_thread: usize,
}

fn back_scratch(graph: &Graph, t: &Tensor, nth: usize) -> BackScratch {
    let n = graph.tensor(t.src[1]).ne[0];
    let units = t.ne[1] * t.ne[2] * t.ne[3];
    let buckets = t.ne[1].min(units.div_ceil(nth.max(1))) + 1;
    let per_thread = (t.ne[0] * 8 + (buckets + n) * 4).next_multiple_of(64);
    BackScratch {
        buckets,
        per_thread,
    }
}

pub fn compute(ctx: &NodeCtx) -> Result<()> {
    match ctx.t.op {
        Op::GetRows => get_rows(ctx),
        Op::SetRows => set_rows(ctx),
        Op::GetRowsBack => get_rows_back(ctx),
        _ => Err(ctx.err("not a rows op")),
    }
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn use_avx2(isa: Isa) -> bool {
    cfg!(target_arch = "x86_64") && isa >= Isa::Avx2 && isa != Isa::Neon
}

/// Index `(i, j2, j3)` of an i32 or i64 index tensor.
///
/// # Safety
/// `base` is the index tensor's first byte; the position lies inside it.
#[inline(always)]
unsafe fn index_at(base: *const u8, idx: &Tensor, i: usize, j2: usize, j3: usize) -> i64 {
    // SAFETY: caller's contract.
    unsafe {
        let p = base.add(i * idx.nb[0] + j2 * idx.nb[1] + j3 * idx.nb[2]);
        if idx.dtype == DType::I64 {
            *(p as *const i64)
        } else {
            *(p as *const i32) as i64
        }
    }
}

/// Checks every index of `idx` (dims 0-2) against `nrows`.
fn check_indices(ctx: &NodeCtx, k: usize, nrows: usize, what: &str) -> Result<()> {
    let idx = ctx.s(k);
    let ne = idx.ne;
    for j3 in 0..ne[2] {
        for j2 in 0..ne[1] {
            for i in 0..ne[0] {
                // SAFETY: (i, j2, j3) lies inside the index tensor, whose span was validated.
                let v = unsafe { index_at(ctx.src[k], idx, i, j2, j3) };
                if v < 0 || v as u64 >= nrows as u64 {
                    return Err(ctx.err(format!(
                        "index {v} at position [{i}, {j2}, {j3}] of the indices is out of range: \
                         {what} has {nrows} rows"
                    )));
                }
            }
        }
    }
    Ok(())
}

fn get_rows(ctx: &NodeCtx) -> Result<()> {
    let (a, idx, d) = (ctx.s(0), ctx.s(1), ctx.t);
    check_indices(ctx, 1, a.ne[1], "the source")?;
    let n = a.ne[0];
    let dne = d.ne;
    let quant = a.dtype.is_quantized();
    let row_bytes = if quant {
        a.dtype.row_size(n).unwrap_or(0)
    } else {
        0
    };
    for r in ctx.share(d.nrows()) {
        let (i, i2, i3) = (r % dne[1], (r / dne[1]) % dne[2], r / (dne[1] * dne[2]));
        // SAFETY: the index was checked above; the source row (row, i2, i3) lies inside `a`
        // (span validated) and the destination row (i, i2, i3) holds `n` contiguous 4-byte
        // values that this thread alone writes; `a` is a different tensor from the
        // destination (get_rows never runs in place), so the slices below do not overlap.
        unsafe {
            let row = index_at(ctx.src[1], idx, i, i2, i3) as usize;
            let src = ctx.src[0].add(row * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3]);
            let dst = ctx.dst.add(i * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]);
            if quant {
                let s = std::slice::from_raw_parts(src, row_bytes);
                let o = std::slice::from_raw_parts_mut(dst as *mut f32, n);
                tessera_quants::dequantize_row(a.dtype.id(), s, o)
                    .map_err(|e| ctx.err(format!("row {row}: {e}")))?;
            } else {
                widen_row(ctx.isa, a.dtype, src, a.nb[0], dst as *mut f32, n);
            }
        }
    }
    Ok(())
}

/// Copies a row of `n` f32/i32/f16/bf16 values (stride `nb0` bytes) to `n` contiguous f32
/// (i32 values are copied bit for bit).
///
/// # Safety
/// `src` has `n` elements at stride `nb0`; `dst` `n` writable 4-byte values, not overlapping.
unsafe fn widen_row(isa: Isa, dtype: DType, src: *const u8, nb0: usize, dst: *mut f32, n: usize) {
    let ts = dtype.type_size();
    let dense = nb0 == ts || n <= 1;
    // SAFETY: caller's contract; every index is below n.
    unsafe {
        match dtype {
            DType::F32 | DType::I32 if dense => {
                std::ptr::copy_nonoverlapping(src, dst as *mut u8, n * 4);
            }
            DType::F32 | DType::I32 => {
                // as u32, so that every bit pattern is copied unchanged
                for i in 0..n {
                    *(dst as *mut u32).add(i) = *(src.add(i * nb0) as *const u32);
                }
            }
            _ => {
                let bf = dtype == DType::BF16;
                let mut i = if dense {
                    vector_widen(isa, bf, src as *const u16, dst, n)
                } else {
                    0
                };
                while i < n {
                    let h = *(src.add(i * nb0) as *const u16);
                    *dst.add(i) = if bf {
                        f32::from_bits((h as u32) << 16)
                    } else {
                        half::f16::from_bits(h).to_f32()
                    };
                    i += 1;
                }
            }
        }
    }
}

fn set_rows(ctx: &NodeCtx) -> Result<()> {
    let (d, b, idx) = (ctx.t, ctx.s(1), ctx.s(2));
    let nrows = d.ne[1];
    check_indices(ctx, 2, nrows, "the destination")?;
    let n = d.ne[0];
    let mine = ctx.share(nrows * d.ne[2] * d.ne[3]);
    if mine.is_empty() || nrows == 0 {
        return Ok(());
    }
    for plane in mine.start / nrows..=(mine.end - 1) / nrows {
        let (i2, i3) = (plane % d.ne[2], plane / d.ne[2]);
        let lo = mine.start.max(plane * nrows) - plane * nrows;
        let hi = mine.end.min((plane + 1) * nrows) - plane * nrows;
        let (j2, j3) = (i2 % idx.ne[1], i3 % idx.ne[2]);
        for i in 0..b.ne[1] {
            // SAFETY: (i, j2, j3) lies inside the index tensor; indices were checked above.
            let r = unsafe { index_at(ctx.src[2], idx, i, j2, j3) } as usize;
            if r < lo || r >= hi {
                continue;
            }
            // SAFETY: row (i, i2, i3) of `b` holds `n` dense values and destination row
            // (r, i2, i3) `n` dense values of its type (spans validated, rows dense by
            // `handles`); this thread alone owns destination row r of this plane. `b` is not
            // the destination's memory.
            unsafe {
                let src = ctx.src[1].add(i * b.nb[1] + i2 * b.nb[2] + i3 * b.nb[3]);
                let dst = ctx.dst.add(r * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]);
                store_row(ctx.isa, b.dtype, src, d.dtype, dst, n);
            }
        }
    }
    Ok(())
}

/// get_rows_back: destination row `(r, i2, i3)` is the sum of the gradient rows `(i, i2, i3)`
/// with `idx[i, i2, i3] == r`. Each thread owns a contiguous range of destination rows; per
/// plane it sorts the indices that fall in its range into buckets (a counting sort, so each
/// bucket lists its gradient rows in ascending order), then writes each row once: zeros, the
/// one gradient row, or the sum of several in f64 in ascending order — the reference's
/// arithmetic exactly, whatever the thread count.
fn get_rows_back(ctx: &NodeCtx) -> Result<()> {
    let (g, idx, d) = (ctx.s(0), ctx.s(1), ctx.t);
    let nrows = d.ne[1];
    check_indices(ctx, 1, nrows, "the gradient")?;
    let mine = ctx.share(nrows * d.ne[2] * d.ne[3]);
    if mine.is_empty() {
        return Ok(());
    }
    let (ne0, n) = (d.ne[0], idx.ne[0]);
    let sc = back_scratch(ctx.graph, d, ctx.nth);
    if ctx.wsize < ctx.nth * sc.per_thread {
        return Err(ctx.err("work buffer too small"));
    }
    // SAFETY: the work buffer holds `nth` slices of `per_thread` bytes (checked above); this
    // thread's is its own. It is 64-byte aligned, the f64 row comes first and the u32 arrays
    // after it (8-byte multiple), so every slice is aligned for its type.
    let (acc, ends, list) = unsafe {
        let base = ctx.wdata.add(ctx.ith * sc.per_thread);
        let acc = std::slice::from_raw_parts_mut(base as *mut f64, ne0);
        let u = base.add(ne0 * 8) as *mut u32;
        (
            acc,
            std::slice::from_raw_parts_mut(u, sc.buckets),
            std::slice::from_raw_parts_mut(u.add(sc.buckets), n),
        )
    };
    for plane in mine.start / nrows..=(mine.end - 1) / nrows {
        let (i2, i3) = (plane % d.ne[2], plane / d.ne[2]);
        let lo = mine.start.max(plane * nrows) - plane * nrows;
        let hi = mine.end.min((plane + 1) * nrows) - plane * nrows;
        // SAFETY: (i, i2, i3) lies inside the index tensor ([n, ne2, ne3]); indices were
        // checked above.
        let index = |i: usize| unsafe { index_at(ctx.src[1], idx, i, i2, i3) } as usize;
        // counting sort of this plane's gradient rows by destination row, rows lo..hi only:
        // ends[k + 1] counts bucket k, then the prefix sums make ends[k] its start; filling
        // advances ends[k] to the bucket's end (= the start of bucket k + 1)
        let nb = hi - lo;
        ends[..=nb].fill(0);
        for i in 0..n {
            let r = index(i);
            if (lo..hi).contains(&r) {
                ends[r - lo + 1] += 1;
            }
        }
        for k in 1..=nb {
            ends[k] += ends[k - 1];
        }
        for i in 0..n {
            let r = index(i);
            if (lo..hi).contains(&r) {
                list[ends[r - lo] as usize] = i as u32;
                ends[r - lo] += 1;
            }
        }
        for r in lo..hi {
            let k = r - lo;
            let start = if k == 0 { 0 } else { ends[k - 1] as usize };
            let rows = &list[start..ends[k] as usize];
            let grow = |i: u32| {
                let off = i as usize * g.nb[1] + i2 * g.nb[2] + i3 * g.nb[3];
                // SAFETY: gradient row (i, i2, i3) has ne0 dense f32 (span validated, rows
                // dense by `handles`); the gradient is not the destination's memory.
                unsafe { std::slice::from_raw_parts(ctx.src[0].add(off) as *const f32, ne0) }
            };
            // SAFETY: destination row (r, i2, i3) holds ne0 contiguous f32 that this thread
            // alone writes (it owns row r of this plane).
            let out = unsafe {
                let p = ctx.dst.add(r * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]);
                std::slice::from_raw_parts_mut(p as *mut f32, ne0)
            };
            match rows {
                [] => out.fill(0.0),
                // 0 + v, as the reference's f64 sum starting from zero gives (-0 becomes +0)
                [i] => {
                    for (o, &v) in out.iter_mut().zip(grow(*i)) {
                        *o = 0.0 + v;
                    }
                }
                _ => {
                    acc.fill(0.0);
                    for &i in rows {
                        for (a, &v) in acc.iter_mut().zip(grow(i)) {
                            *a += v as f64;
                        }
                    }
                    for (o, &a) in out.iter_mut().zip(acc.iter()) {
                        *o = a as f32;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Converts a dense row of `n` f32/f16 values to a dense row of f32/f16/bf16.
///
/// # Safety
/// `src` has `n` dense values of `from`, `dst` room for `n` values of `to`; no overlap.
unsafe fn store_row(isa: Isa, from: DType, src: *const u8, to: DType, dst: *mut u8, n: usize) {
    // SAFETY: caller's contract; every index is below n.
    unsafe {
        if from == to {
            std::ptr::copy_nonoverlapping(src, dst, n * from.type_size());
            return;
        }
        let mut i = match (from, to) {
            (DType::F16, DType::F32) => {
                vector_widen(isa, false, src as *const u16, dst as *mut f32, n)
            }
            (DType::F32, DType::F16) => vector_narrow(isa, src as *const f32, dst as *mut u16, n),
            _ => 0,
        };
        while i < n {
            let v = if from == DType::F16 {
                half::f16::from_bits(*(src as *const u16).add(i)).to_f32()
            } else {
                *(src as *const f32).add(i)
            };
            match to {
                DType::F32 => *(dst as *mut f32).add(i) = v,
                DType::F16 => *(dst as *mut u16).add(i) = half::f16::from_f32(v).to_bits(),
                _ => *(dst as *mut u16).add(i) = half::bf16::from_f32(v).to_bits(),
            }
            i += 1;
        }
    }
}

/// Widens a prefix of `n` f16 (or bf16) values to f32 with SIMD; returns its length (0 on
/// the scalar path).
///
/// # Safety
/// `src` has `n` readable values, `dst` room for `n` f32.
unsafe fn vector_widen(isa: Isa, bf16: bool, src: *const u16, dst: *mut f32, n: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    if use_avx2(isa) {
        // SAFETY: Avx2 is chosen only when the CPU has AVX2 and F16C; caller's contract.
        return unsafe { avx2::widen16(bf16, src, dst, n) };
    }
    let _ = (isa, bf16, src, dst, n);
    0
}

/// Rounds a prefix of `n` f32 to f16 with SIMD; returns its length (0 on the scalar path).
///
/// # Safety
/// `src` has `n` readable f32, `dst` room for `n` f16.
unsafe fn vector_narrow(isa: Isa, src: *const f32, dst: *mut u16, n: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    if use_avx2(isa) {
        // SAFETY: as in `vector_widen`.
        return unsafe { avx2::narrow_f16(src, dst, n) };
    }
    let _ = (isa, src, dst, n);
    0
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// Widens the first multiple of 8 of `n` f16 (or bf16) values to f32; returns how many.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn widen16(bf16: bool, src: *const u16, dst: *mut f32, n: usize) -> usize {
        let mut i = 0;
        // SAFETY: loads and stores stay below n (caller's contract).
        unsafe {
            while i + 8 <= n {
                let h = _mm_loadu_si128(src.add(i) as *const __m128i);
                let v = if bf16 {
                    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                } else {
                    _mm256_cvtph_ps(h)
                };
                _mm256_storeu_ps(dst.add(i), v);
                i += 8;
            }
        }
        i
    }

    /// Rounds the first multiple of 8 of `n` f32 to f16 (nearest even); returns how many.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn narrow_f16(src: *const f32, dst: *mut u16, n: usize) -> usize {
        let mut i = 0;
        // SAFETY: loads and stores stay below n (caller's contract).
        unsafe {
            while i + 8 <= n {
                let h = _mm256_cvtps_ph(_mm256_loadu_ps(src.add(i)), _MM_FROUND_TO_NEAREST_INT);
                _mm_storeu_si128(dst.add(i) as *mut __m128i, h);
                i += 8;
            }
        }
        i
    }
}
