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
        _ => false,
    }
}

/// Scratch bytes node `t` needs with `nth` threads.
pub fn work_size(_graph: &Graph, _t: &Tensor, _nth: usize) -> usize {
    0
}

pub fn compute(ctx: &NodeCtx) -> Result<()> {
    match ctx.t.op {
        Op::GetRows => get_rows(ctx),
        Op::SetRows => set_rows(ctx),
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
