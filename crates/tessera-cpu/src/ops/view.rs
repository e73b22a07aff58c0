//! CPU kernels of the `view` family: `cont` (a contiguous copy, optionally converting) and `cpy`
//! (a copy through the destination's strides: a strided destination such as a KV-cache slot is
//! written exactly where its strides say, and nothing else of the cache is touched).
//!
//! Both copy the logical sequence of the source's elements into the logical sequence of the
//! destination's (the shapes may differ for `cpy`: only the element counts agree). The flat
//! element range is split between threads; each thread walks its range in runs that stay inside
//! one row of the source and one row of the destination:
//! - same type, both runs dense: `memcpy` (any non-quantized type);
//! - same type, strided: an element-by-element copy of the bytes;
//! - f32 / f16 / bf16 / i32 to another of these: through an f32 buffer on the stack
//!   (f16 with F16C, bf16 with AVX2 shifts, rounding to nearest even like ggml; i32 by `as`
//!   casts — truncating and saturating from floats — like the reference).
//!
//! Quantized sources or destinations, and conversions involving f64/i8/i16/i64, take the
//! fallback.
//!
//! This file also holds the helpers the element-wise families (binary, unary, glu) share: the
//! thread split of a flat range, the walk over row pieces, and the f32 load/store of rows of
//! any float type.

use std::ops::Range;

use tessera::shape::Ne;
use tessera::{DType, Graph, Op, Result, Tensor};

use crate::exec::{split, NodeCtx};
use crate::simd::Isa;

/// f32 elements of the stack buffers the converting paths use.
pub(crate) const CHUNK: usize = 256;
/// Thread shares of flat ranges start at multiples of this many elements (a cache line of f16).
pub(crate) const ALIGN: usize = 32;

/// Does this ISA run the AVX2 kernels?
#[inline(always)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn avx2(isa: Isa) -> bool {
    cfg!(target_arch = "x86_64") && matches!(isa, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512)
}

/// This thread's part of `0..n`, split at multiples of [`ALIGN`].
pub(crate) fn flat_share(n: usize, ith: usize, nth: usize) -> Range<usize> {
    let r = split(n.div_ceil(ALIGN), ith, nth);
    (r.start * ALIGN).min(n)..(r.end * ALIGN).min(n)
}

/// The float types the converting loads and stores read and write.
pub(crate) fn is_float(dt: DType) -> bool {
    matches!(dt, DType::F32 | DType::F16 | DType::BF16)
}

/// Calls `f([i0, i1, i2, i3], len, flat)` for the pieces of the flat element range `range` of a
/// tensor of shape `ne`, each inside one row: elements `i0..i0 + len` of row `(i1, i2, i3)`,
/// whose flat index is `flat`.
#[inline]
pub(crate) fn for_row_pieces(
    ne: &Ne,
    range: Range<usize>,
    mut f: impl FnMut([usize; 4], usize, usize),
) {
    if range.is_empty() || ne[0] == 0 {
        return;
    }
    let mut k = range.start;
    let mut i = tessera::shape::unravel(k, ne);
    while k < range.end {
        let len = (ne[0] - i[0]).min(range.end - k);
        f(i, len, k);
        k += len;
        advance(&mut i, ne, len);
    }
}

/// Reads `n` elements of type `dt` (f32, f16, bf16 or i32) from `p`, `stride` bytes apart, into
/// `out` as f32. A dense f16/bf16 row is converted eight at a time with AVX2 — its tail too, via
/// a padded buffer, so that an element's value never depends on where a run starts.
///
/// # Safety
/// `p` points at `n` readable elements `stride` bytes apart; `out` at `n` writable f32 that
/// do not overlap them.
#[inline]
pub(crate) unsafe fn load_f32(
    isa: Isa,
    dt: DType,
    p: *const u8,
    stride: usize,
    out: *mut f32,
    n: usize,
) {
    let ts = dt.type_size();
    // SAFETY: the caller's contract covers every access below.
    unsafe {
        if stride == ts {
            match dt {
                DType::F32 => return std::ptr::copy_nonoverlapping(p as *const f32, out, n),
                #[cfg(target_arch = "x86_64")]
                DType::F16 | DType::BF16 if avx2(isa) => {
                    return x86::load_half(dt, p as *const u16, out, n)
                }
                _ => {}
            }
        }
        let _ = isa;
        for i in 0..n {
            let q = p.add(i * stride);
            *out.add(i) = match dt {
                DType::F32 => (q as *const f32).read_unaligned(),
                DType::F16 => half::f16::from_bits((q as *const u16).read_unaligned()).to_f32(),
                DType::BF16 => f32::from_bits(((q as *const u16).read_unaligned() as u32) << 16),
                DType::I32 => (q as *const i32).read_unaligned() as f32,
                _ => unreachable!("load_f32 of {dt}"),
            };
        }
    }
}

/// Writes `n` f32 from `x` as type `dt` (f32, f16, bf16 or i32) to `q`, `stride` bytes apart.
/// f16/bf16 round to nearest even; i32 truncates (saturating, NaN to 0) like the reference.
///
/// # Safety
/// `x` points at `n` readable f32; `q` at `n` writable elements `stride` bytes apart. They may
/// be the same memory only when `dt` is f32 and the layout is dense.
#[inline]
pub(crate) unsafe fn store_f32(
    isa: Isa,
    dt: DType,
    x: *const f32,
    q: *mut u8,
    stride: usize,
    n: usize,
) {
    let ts = dt.type_size();
    // SAFETY: the caller's contract covers every access below.
    unsafe {
        if stride == ts {
            match dt {
                DType::F32 => return std::ptr::copy(x, q as *mut f32, n),
                #[cfg(target_arch = "x86_64")]
                DType::F16 | DType::BF16 if avx2(isa) => {
                    return x86::store_half(dt, x, q as *mut u16, n)
                }
                _ => {}
            }
        }
        let _ = isa;
        for i in 0..n {
            let v = *x.add(i);
            let o = q.add(i * stride);
            match dt {
                DType::F32 => (o as *mut f32).write_unaligned(v),
                DType::F16 => (o as *mut u16).write_unaligned(half::f16::from_f32(v).to_bits()),
                DType::BF16 => (o as *mut u16).write_unaligned(half::bf16::from_f32(v).to_bits()),
                DType::I32 => (o as *mut i32).write_unaligned(v as i32),
                _ => unreachable!("store_f32 of {dt}"),
            }
        }
    }
}

/// Types a converting copy goes through f32 for.
fn convertible(dt: DType) -> bool {
    is_float(dt) || dt == DType::I32
}

pub fn handles(graph: &Graph, t: &Tensor) -> bool {
    let s = graph.tensor(t.src[0]);
    let (a, d) = (s.dtype, t.dtype);
    if a.is_quantized() || d.is_quantized() || s.nelements() != t.nelements() {
        return false;
    }
    match t.op {
        Op::Cont => {
            t.is_contiguous() && s.ne == t.ne && (a == d || (convertible(a) && convertible(d)))
        }
        Op::Cpy => a == d || (convertible(a) && convertible(d)),
        _ => false,
    }
}

pub fn work_size(_graph: &Graph, _t: &Tensor, _nth: usize) -> usize {
    0
}

/// Element strides/shape of a tensor seen as one flat row when it is dense.
fn flat_if_dense(t: &Tensor) -> (Ne, [usize; 4]) {
    if t.is_contiguous() {
        let n = t.nelements();
        ([n, 1, 1, 1], [t.dtype.type_size(), 0, 0, 0])
    } else {
        (t.ne, t.nb)
    }
}

pub fn compute(ctx: &NodeCtx) -> Result<()> {
    let (s, d) = (ctx.s(0), ctx.t);
    let n = d.nelements();
    if s.nelements() != n {
        return Err(ctx.err(format!("{} elements into {}", s.nelements(), n)));
    }
    let (sne, snb) = flat_if_dense(s);
    let (dne, dnb) = flat_if_dense(d);
    let range = flat_share(n, ctx.ith, ctx.nth);
    if range.is_empty() {
        return Ok(());
    }
    let (sdt, ddt) = (s.dtype, d.dtype);
    let (sts, dts) = (sdt.type_size(), ddt.type_size());
    let isa = ctx.isa;
    // Walk the range in runs inside one row of the source and one of the destination.
    let mut k = range.start;
    let mut si = unravel(k, &sne);
    let mut di = unravel(k, &dne);
    let mut buf = [0f32; CHUNK];
    while k < range.end {
        let len = (sne[0] - si[0]).min(dne[0] - di[0]).min(range.end - k);
        let so = si[0] * snb[0] + si[1] * snb[1] + si[2] * snb[2] + si[3] * snb[3];
        let dof = di[0] * dnb[0] + di[1] * dnb[1] + di[2] * dnb[2] + di[3] * dnb[3];
        // SAFETY: `exec::validate` checked that both tensors lie inside their buffers; the run
        // covers elements of one row of each, inside their shapes. Threads write disjoint
        // element ranges of the destination.
        unsafe {
            let (sp, dp) = (ctx.src[0].add(so), ctx.dst.add(dof));
            let (ss, ds) = (snb[0], dnb[0]);
            if sdt == ddt {
                if ss == sts && ds == dts {
                    std::ptr::copy(sp, dp, len * sts);
                } else {
                    copy_strided(sp, ss, dp, ds, sts, len);
                }
            } else {
                let mut done = 0;
                while done < len {
                    let c = CHUNK.min(len - done);
                    load_f32(isa, sdt, sp.add(done * ss), ss, buf.as_mut_ptr(), c);
                    store_f32(isa, ddt, buf.as_ptr(), dp.add(done * ds), ds, c);
                    done += c;
                }
            }
        }
        k += len;
        advance(&mut si, &sne, len);
        advance(&mut di, &dne, len);
    }
    Ok(())
}

fn unravel(k: usize, ne: &Ne) -> [usize; 4] {
    tessera::shape::unravel(k, ne)
}

/// Moves index `i` of shape `ne` forward by `len` elements that end at or before its row's end.
#[inline]
fn advance(i: &mut [usize; 4], ne: &Ne, len: usize) {
    i[0] += len;
    if i[0] == ne[0] {
        i[0] = 0;
        i[1] += 1;
        if i[1] == ne[1] {
            i[1] = 0;
            i[2] += 1;
            if i[2] == ne[2] {
                i[2] = 0;
                i[3] += 1;
            }
        }
    }
}

/// Copies `n` elements of `ts` bytes from `s` (stride `ss`) to `d` (stride `ds`).
///
/// # Safety
/// Both point at `n` elements at their strides, readable and writable respectively.
#[inline]
unsafe fn copy_strided(s: *const u8, ss: usize, d: *mut u8, ds: usize, ts: usize, n: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        match ts {
            2 => {
                for i in 0..n {
                    (d.add(i * ds) as *mut u16)
                        .write_unaligned((s.add(i * ss) as *const u16).read_unaligned());
                }
            }
            4 => {
                for i in 0..n {
                    (d.add(i * ds) as *mut u32)
                        .write_unaligned((s.add(i * ss) as *const u32).read_unaligned());
                }
            }
            _ => {
                for i in 0..n {
                    std::ptr::copy(s.add(i * ss), d.add(i * ds), ts);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use tessera::DType;

    /// Eight f32 rounded to bf16 (nearest even; NaN stays a quiet NaN), in the low 128 bits.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn f32_to_bf16(x: __m256) -> __m128i {
        let b = _mm256_castps_si256(x);
        let lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
        let r = _mm256_srli_epi32(
            _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))),
            16,
        );
        let nan = _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x40));
        let is_nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        let v = _mm256_blendv_epi8(r, nan, is_nan);
        let packed = _mm256_packus_epi32(v, v); // lanes: [0..4, 0..4 | 4..8, 4..8]
        _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0b1000))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn half8_to_f32(dt: DType, h: __m128i) -> __m256 {
        if dt == DType::F16 {
            _mm256_cvtph_ps(h)
        } else {
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn f32_to_half8(dt: DType, x: __m256) -> __m128i {
        if dt == DType::F16 {
            _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)
        } else {
            f32_to_bf16(x)
        }
    }

    /// `n` f16/bf16 at `p` to f32 at `out`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn load_half(dt: DType, p: *const u16, out: *mut f32, n: usize) {
        // SAFETY: the caller guarantees `n` elements at `p` and `out`; loads and stores of 8 stay
        // inside them, the tail goes through a padded buffer.
        unsafe {
            let mut i = 0;
            while i + 8 <= n {
                let h = _mm_loadu_si128(p.add(i) as *const __m128i);
                _mm256_storeu_ps(out.add(i), half8_to_f32(dt, h));
                i += 8;
            }
            if i < n {
                let mut t = [0u16; 8];
                std::ptr::copy_nonoverlapping(p.add(i), t.as_mut_ptr(), n - i);
                let mut o = [0f32; 8];
                _mm256_storeu_ps(
                    o.as_mut_ptr(),
                    half8_to_f32(dt, _mm_loadu_si128(t.as_ptr() as *const __m128i)),
                );
                std::ptr::copy_nonoverlapping(o.as_ptr(), out.add(i), n - i);
            }
        }
    }

    /// `n` f32 at `x` to f16/bf16 at `q`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn store_half(dt: DType, x: *const f32, q: *mut u16, n: usize) {
        // SAFETY: as for `load_half`.
        unsafe {
            let mut i = 0;
            while i + 8 <= n {
                let v = _mm256_loadu_ps(x.add(i));
                _mm_storeu_si128(q.add(i) as *mut __m128i, f32_to_half8(dt, v));
                i += 8;
            }
            if i < n {
                let mut t = [0f32; 8];
                std::ptr::copy_nonoverlapping(x.add(i), t.as_mut_ptr(), n - i);
                let mut o = [0u16; 8];
                _mm_storeu_si128(
                    o.as_mut_ptr() as *mut __m128i,
                    f32_to_half8(dt, _mm256_loadu_ps(t.as_ptr())),
                );
                std::ptr::copy_nonoverlapping(o.as_ptr(), q.add(i), n - i);
            }
        }
    }
}
