//! Integer dot products of one quantized weight row with one row of quantized activations, as
//! ggml's CPU backend computes them (`ggml_vec_dot_<type>_<vec_dot_type>`), for the weight types
//! whose partner format is q8_0 (q5_0, iq4_nl), q8_1 (q5_1) or q8_K (q2_K … q6_K, iq4_xs, tq1_0,
//! tq2_0).
//!
//! Two paths, each reproducing one of ggml's down to the last bit:
//! - scalar: ggml's portable code (`ggml-cpu/quants.c`, `*_generic`) with C's evaluation order
//!   and no contraction of `a*b + c` into fused multiply-adds (what a compiler emits for it with
//!   `-ffp-contract=off` or for a target without FMA);
//! - AVX2 (`Isa::Avx2`, `Isa::AvxVnni` and `Isa::Avx512`): ggml's x86 AVX2 code (`ggml-cpu/arch/x86/quants.c`):
//!   the same integer partial sums in the same 32-bit lanes (they are exact, but which lane a
//!   product lands in decides the float rounding), the same fused multiply-adds per block and the
//!   same horizontal reduction. Where gcc contracts a scalar `s += a*b` of that code into an FMA
//!   (q5_1's and q5_K's min terms, tq1_0's and tq2_0's block accumulation) this does too, and
//!   where it does not (iq4_nl's odd last block) neither does this, so the result equals that
//!   of llama.cpp built by gcc for an AVX2 machine (checked against its `libggml-cpu` in
//!   `tests/qdot.rs`).
//!
//! The integer arithmetic is exact in both paths; they differ only in how the per-block float
//! terms are grouped.

use tessera::DType;

use crate::simd::Isa;

const QK_K: usize = 256;
/// Bytes of one q8_0 / q8_1 / q8_K block.
const Q8_0_SIZE: usize = 34;
const Q8_1_SIZE: usize = 36;
const Q8_K_SIZE: usize = 4 + QK_K + 2 * (QK_K / 16);

/// ggml's 4-bit non-linear codebook (`kvalues_iq4nl`), shared by iq4_nl and iq4_xs.
pub(crate) const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Weight types with an integer kernel here.
pub fn supported(t: DType) -> bool {
    use DType::*;
    matches!(
        t,
        Q5_0 | Q5_1 | IQ4NL | Q2K | Q3K | Q4K | Q5K | Q6K | IQ4XS | TQ1_0 | TQ2_0 | NVFP4
    ) || super::qdot_iq2::supported(t)
        || super::qdot_iq13::supported(t)
        || super::qdot_fp::supported(t)
}

/// Bytes of one block of the activation format `t` is paired with.
/// Whether the AVX2 one-row kernel of `t` prefetches its own weights a little ahead as it goes
/// (the caller then does not prefetch whole rows for it).
pub(crate) fn self_prefetching(t: DType) -> bool {
    use DType::*;
    matches!(
        t,
        Q5_0 | Q5_1 | IQ4NL | Q2K | Q3K | Q4K | Q5K | Q6K | IQ4XS | TQ1_0 | TQ2_0 | NVFP4
    )
}

fn act_block_size(t: DType) -> usize {
    match t {
        DType::Q5_1 => Q8_1_SIZE,
        DType::Q5_0 | DType::IQ4NL => Q8_0_SIZE,
        // weight blocks of 32, 64 or 128 against blocks of 32 activations
        DType::MXFP4 | DType::NVFP4 | DType::Q1_0 | DType::Q2_0 => t.block_size() / 32 * Q8_0_SIZE,
        _ => Q8_K_SIZE,
    }
}

/// Dot of one weight row (type `t`, `k` elements) with one activation row already in `t`'s
/// `vec_dot_type` (q8_0, q8_1 or q8_K, as `matmul_quant::vec_dot_type` says). The scalar path
/// is ggml's generic code; the AVX2 path (`Isa::Avx2`, `Isa::AvxVnni`, `Isa::Avx512`, when the CPU has AVX2, FMA
/// and F16C) is ggml's AVX2 code, with the same result as llama.cpp on an AVX2 machine.
///
/// Panics if `t` is not [`supported`], `k` is not a multiple of its block size or a row is
/// shorter than `k` elements of its format.
pub fn vec_dot(isa: Isa, t: DType, w: &[u8], x: &[u8], k: usize) -> f32 {
    assert!(supported(t), "qdot: no integer kernel for {t}");
    let bs = t.block_size();
    assert!(
        k.is_multiple_of(bs),
        "qdot: {k} elements are not whole {t} blocks of {bs}"
    );
    let nb = k / bs;
    assert!(
        w.len() >= nb * t.type_size() && x.len() >= nb * act_block_size(t),
        "qdot: rows of {} and {} bytes for {k} elements of {t}",
        w.len(),
        x.len()
    );
    if super::qdot_iq2::supported(t) {
        return super::qdot_iq2::vec_dot(isa, t, w, x, nb);
    }
    if super::qdot_iq13::supported(t) {
        return super::qdot_iq13::vec_dot(isa, t, w, x, nb);
    }
    if super::qdot_fp::supported(t) {
        return super::qdot_fp::vec_dot(isa, t, w, x, nb);
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512) && avx2::available() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked just above), and VNNI where that
        // kernel runs; w and x hold at least nb blocks of their formats (asserted above),
        // which is all the kernels read.
        return unsafe {
            if avx2::uses_vnni(isa) {
                avx2::vec_dot_vnni(t, w, x, nb)
            } else if avx2::uses_avx_vnni(isa) {
                avx2::vec_dot_avxvnni(t, w, x, nb)
            } else {
                avx2::vec_dot(t, w, x, nb)
            }
        };
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon {
        // SAFETY: NEON is part of every AArch64 CPU; w and x hold nb blocks of their formats
        // (asserted above), which is all the kernels read.
        if let Some(v) = unsafe { super::qdot_neon::vec_dot(t, w, x, nb) } {
            return v;
        }
    }
    let _ = isa;
    scalar::vec_dot(t, w, x, nb)
}

#[inline(always)]
/// `vec_dot` of `out.len()` rows against one activation row: row `r` starts at byte
/// `r * stride` of `w`. The kernel is chosen once for all rows (the per-call checks and
/// dispatch of [`vec_dot`] cost as much as a short row's products: SmolLM2-sized k-quant rows
/// hold 2-6 superblocks). Every result is bit-identical to `vec_dot` on its row.
///
/// Panics as [`vec_dot`] does, or if `w` does not hold the rows.
pub fn vec_dot_rows(
    isa: Isa,
    t: DType,
    w: &[u8],
    stride: usize,
    x: &[u8],
    k: usize,
    out: &mut [f32],
) {
    vec_dot_rows_ahead(isa, t, w, stride, x, k, out, None)
}

/// [`vec_dot_rows`], and for the types whose kernels do not prefetch their own weights
/// (not [`self_prefetching`]) with `ahead = Some((a, until))`: as row `r` is computed, row
/// `r + a` (while `r + a < until`; rows past `w` are fine, a prefetch is only a hint) is asked
/// into the cache. The mat-vec of those types takes its rows this way: each row through
/// [`vec_dot`] instead cost them 5-7 % (iq2_xxs, 4096 wide).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn vec_dot_rows_ahead(
    isa: Isa,
    t: DType,
    w: &[u8],
    stride: usize,
    x: &[u8],
    k: usize,
    out: &mut [f32],
    ahead: Option<(usize, usize)>,
) {
    let n = out.len();
    if n == 0 {
        return;
    }
    let bs = t.block_size();
    assert!(
        supported(t) && k.is_multiple_of(bs),
        "qdot: no {t} kernel for rows of {k}"
    );
    let nb = k / bs;
    let row = nb * t.type_size();
    assert!(
        w.len() >= (n - 1) * stride + row && x.len() >= nb * act_block_size(t),
        "qdot: {n} rows of {row} bytes {stride} apart do not fit {} bytes",
        w.len()
    );
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512)
        && avx2::available()
        && !super::qdot_iq2::supported(t)
        && !super::qdot_iq13::supported(t)
        && !super::qdot_fp::supported(t)
    {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked above), and VNNI where that kernel
        // runs; every row and x hold nb blocks of their formats (asserted above).
        unsafe {
            if avx2::uses_vnni(isa) {
                avx2::vec_dot_rows_vnni(t, w.as_ptr(), stride, x, nb, out)
            } else if avx2::uses_avx_vnni(isa) {
                avx2::vec_dot_rows_avxvnni(t, w.as_ptr(), stride, x, nb, out)
            } else {
                avx2::vec_dot_rows(t, w.as_ptr(), stride, x, nb, out)
            }
        };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(kernel) = super::qdot_fp::avx2_rows_kernel(isa, t) {
        // nvfp4: two rows at a time, each with its own accumulator (same bits as one row)
        // SAFETY: n rows of nb blocks lie stride apart in w and x holds nb activation blocks
        // (asserted above); out has n elements; `avx2_rows_kernel` checked the CPU's features.
        unsafe { kernel(w.as_ptr(), stride, x.as_ptr(), nb, out.as_mut_ptr(), n) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(kernel) = super::qdot_iq2::avx2_kernel(isa, t)
        .or_else(|| super::qdot_iq13::avx2_kernel(isa, t))
        .or_else(|| super::qdot_fp::avx2_kernel(isa, t))
    {
        // the lattice and small-float kernels, chosen once: per row, `vec_dot`'s checks and
        // dispatch cost 5 % of an iq1 row of 4096
        for (r, o) in out.iter_mut().enumerate() {
            prefetch_ahead(w, stride, row, r, ahead);
            // SAFETY: row r holds nb blocks at r * stride and x nb activation blocks (asserted
            // above), all the kernel reads; `avx2_kernel` checked the CPU's features.
            *o = unsafe { kernel(w.as_ptr().add(r * stride), x.as_ptr(), nb) };
        }
        return;
    }
    for (r, o) in out.iter_mut().enumerate() {
        prefetch_ahead(w, stride, row, r, ahead);
        *o = vec_dot(isa, t, &w[r * stride..r * stride + row], x, k);
    }
}

/// The prefetch of [`vec_dot_rows_ahead`] before row `r`: row `r + a` of `row` bytes.
#[inline(always)]
fn prefetch_ahead(w: &[u8], stride: usize, row: usize, r: usize, ahead: Option<(usize, usize)>) {
    if let Some((a, until)) = ahead {
        if r + a < until {
            prefetch_row(w.as_ptr().wrapping_add((r + a) * stride), row);
        }
    }
}

/// Asks the `bytes` at `p` into the cache, one line per 64 bytes (a hint: any address will do).
#[inline(always)]
pub(crate) fn prefetch_row(p: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    for off in (0..bytes).step_by(64) {
        // SAFETY: prefetching is a hint that never faults, whatever the address.
        unsafe {
            std::arch::x86_64::_mm_prefetch(
                p.wrapping_add(off) as *const i8,
                std::arch::x86_64::_MM_HINT_T0,
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, bytes);
}

/// A one-row kernel of `qdot_iq2`, `qdot_iq13` or `qdot_fp` (their `avx2_kernel`): the dot of
/// `nb` weight blocks at the first pointer with the activation blocks at the second.
///
/// Safety: both pointers hold that many blocks, and the CPU has the features the kernel was
/// chosen for.
#[cfg(target_arch = "x86_64")]
pub(crate) type RowKernel = unsafe fn(*const u8, *const u8, usize) -> f32;

/// The integer sums inside the lattice and small-float kernels (`qdot_iq2`, `qdot_iq13`,
/// `qdot_fp`). They are exact, so every implementation returns the same numbers, and those
/// files' generic code (the float arithmetic around the sums) runs unchanged on each: the
/// scalar path with [`ScalarSums`], aarch64 with `qdot_neon::NeonSums`.
pub(crate) trait IntSums {
    /// Σ q8[e]·g[e] over 32 elements, g the signed bytes of four 8-element points (one
    /// little-endian u64 each), element j of point l negated where bit j of `s[l]` is set; the
    /// sums over points 0-1 and 2-3. Grid bytes are within ±127, so no negation wraps.
    fn dot32(g: [u64; 4], s: [u8; 4], q8: &[u8]) -> [i32; 2];
    /// Σ y[j]·fp4(lo nibble of q[j]) and Σ y[j + n]·fp4(hi nibble of q[j]), n = q.len() (8 or
    /// 16), with ggml's doubled E2M1 values.
    fn fp4_sums(q: &[u8], y: &[u8]) -> (i32, i32);
    /// Σ (code e − 1)·y[e] over 32 elements, the 2-bit code e at bit 2(e mod 4) of byte e/4.
    fn q2_sum(qs: &[u8], y: &[u8]) -> i32;
}

/// [`IntSums`] element by element (ggml's generic loops).
pub(crate) struct ScalarSums;

impl IntSums for ScalarSums {
    fn dot32(g: [u64; 4], s: [u8; 4], q8: &[u8]) -> [i32; 2] {
        let mut out = [0i32; 2];
        for (l, (gl, sl)) in g.iter().zip(s).enumerate() {
            for (j, &b) in gl.to_le_bytes().iter().enumerate() {
                let p = b as i8 as i32 * q8[8 * l + j] as i8 as i32;
                out[l / 2] += if sl & (1 << j) != 0 { -p } else { p };
            }
        }
        out
    }

    fn fp4_sums(q: &[u8], y: &[u8]) -> (i32, i32) {
        super::qdot_fp::fp4_sums(q, y)
    }

    fn q2_sum(qs: &[u8], y: &[u8]) -> i32 {
        (0..32)
            .map(|e| ((qs[e / 4] >> (2 * (e % 4))) & 3) as i32 - 1)
            .zip(&y[..32])
            .map(|(q, &y)| q * y as i8 as i32)
            .sum()
    }
}

/// The signed bytes of an 8-element point of ones (`dot32` with it sums ±q8).
pub(crate) const ONES8: u64 = 0x0101_0101_0101_0101;

/// f16 → f32 of every bit pattern (exact), as ggml's x86 builds convert block scales
/// (`ggml_table_f32_f16`): a load and a broadcast from memory, where F16C's conversion of one
/// scale takes four instructions, two of them on the shuffle port that the small-block kernels'
/// code lookups also need.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) static F16_TO_F32: [f32; 65536] = {
    let mut t = [0f32; 65536];
    let mut i = 0;
    while i < 65536 {
        t[i] = half::f16::from_bits(i as u16).to_f32_const();
        i += 1;
    }
    t
};

pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

#[inline(always)]
fn f32_at(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline(always)]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline(always)]
fn i16_at(b: &[u8], at: usize) -> i32 {
    i16::from_le_bytes([b[at], b[at + 1]]) as i32
}

/// The 6-bit scales and mins of q4_K / q5_K (12 bytes) unpacked to 8 scales then 8 mins, as
/// ggml's `utmp` shuffle does, in four little-endian words.
#[inline(always)]
pub(crate) fn k4_scales_mins(s: &[u8]) -> [u32; 4] {
    const M1: u32 = 0x3f3f_3f3f;
    const M2: u32 = 0x0f0f_0f0f;
    const M3: u32 = 0x0303_0303;
    let (u0, u1, u2) = (u32_at(s, 0), u32_at(s, 4), u32_at(s, 8));
    [
        u0 & M1,
        (u2 & M2) | (((u0 >> 6) & M3) << 4),
        u1 & M1,
        ((u2 >> 4) & M2) | (((u1 >> 6) & M3) << 4),
    ]
}

/// The 16 6-bit scales of q3_K (12 bytes), unpacked but not yet re-centred (0..63), in four
/// little-endian words.
#[inline(always)]
pub(crate) fn q3k_scales(s: &[u8]) -> [u32; 4] {
    const M1: u32 = 0x0303_0303;
    const M2: u32 = 0x0f0f_0f0f;
    let (a0, a1, a2) = (u32_at(s, 0), u32_at(s, 4), u32_at(s, 8));
    [
        (a0 & M2) | ((a2 & M1) << 4),
        (a1 & M2) | (((a2 >> 2) & M1) << 4),
        ((a0 >> 4) & M2) | (((a2 >> 4) & M1) << 4),
        ((a1 >> 4) & M2) | (((a2 >> 6) & M1) << 4),
    ]
}

/// Four little-endian words as 16 bytes.
#[inline(always)]
pub(crate) fn words_to_bytes(w: [u32; 4]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(w) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// ggml's generic kernels, one function per type.
pub(crate) mod scalar {
    use super::*;

    pub fn vec_dot(t: DType, w: &[u8], x: &[u8], nb: usize) -> f32 {
        let ts = t.type_size();
        let xs = act_block_size(t);
        let blocks = w[..nb * ts]
            .chunks_exact(ts)
            .zip(x[..nb * xs].chunks_exact(xs));
        match t {
            DType::Q5_0 => q5_0(blocks),
            DType::Q5_1 => q5_1(blocks),
            DType::IQ4NL => iq4_nl(blocks),
            DType::Q2K => q2_k(blocks),
            DType::Q3K => q3_k(blocks),
            DType::Q4K => q4_k(blocks, false),
            DType::Q5K => q4_k(blocks, true),
            DType::Q6K => q6_k(blocks),
            DType::IQ4XS => iq4_xs(blocks),
            DType::TQ1_0 => tq1_0(blocks),
            DType::TQ2_0 => tq2_0(blocks),
            _ => unreachable!("checked by the caller"),
        }
    }

    /// A weight row's blocks zipped with the activation row's.
    pub(crate) type Blocks<'a> =
        std::iter::Zip<std::slice::ChunksExact<'a, u8>, std::slice::ChunksExact<'a, u8>>;

    fn q5_0(blocks: Blocks) -> f32 {
        let mut sumf = 0f32;
        for (wb, xb) in blocks {
            let qh = u32_at(wb, 2);
            let (qs, y) = (&wb[6..22], &xb[2..34]);
            let (mut s0, mut s1) = (0i32, 0i32);
            for j in 0..16 {
                let h0 = (((qh >> j) & 1) << 4) as u8;
                let h1 = (((qh >> (j + 16)) & 1) << 4) as u8;
                let x0 = ((qs[j] & 15) | h0) as i32 - 16;
                let x1 = ((qs[j] >> 4) | h1) as i32 - 16;
                s0 += x0 * y[j] as i8 as i32;
                s1 += x1 * y[j + 16] as i8 as i32;
            }
            sumf += (f16_at(wb, 0) * f16_at(xb, 0)) * (s0 + s1) as f32;
        }
        sumf
    }

    fn q5_1(blocks: Blocks) -> f32 {
        let mut sumf = 0f32;
        for (wb, xb) in blocks {
            let qh = u32_at(wb, 4);
            let (qs, y) = (&wb[8..24], &xb[4..36]);
            let (mut s0, mut s1) = (0i32, 0i32);
            for j in 0..16 {
                let h0 = (((qh >> j) & 1) << 4) as u8;
                let h1 = (((qh >> (j + 16)) & 1) << 4) as u8;
                s0 += ((qs[j] & 15) | h0) as i32 * y[j] as i8 as i32;
                s1 += ((qs[j] >> 4) | h1) as i32 * y[j + 16] as i8 as i32;
            }
            let scaled = (f16_at(wb, 0) * f16_at(xb, 0)) * (s0 + s1) as f32;
            sumf += scaled + f16_at(wb, 2) * f16_at(xb, 2);
        }
        sumf
    }

    fn iq4_nl(blocks: Blocks) -> f32 {
        let mut sumf = 0f32;
        for (wb, xb) in blocks {
            let d = f16_at(xb, 0) * f16_at(wb, 0);
            let (qs, y) = (&wb[2..18], &xb[2..34]);
            let (mut s1, mut s2) = (0i32, 0i32);
            for j in 0..16 {
                s1 += y[j] as i8 as i32 * KVALUES_IQ4NL[(qs[j] & 15) as usize] as i32;
                s2 += y[j + 16] as i8 as i32 * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as i32;
            }
            sumf += d * (s1 + s2) as f32;
        }
        sumf
    }

    /// q8_K's 256 quants and 16 group sums.
    fn q8k(xb: &[u8]) -> (&[u8], impl Fn(usize) -> i32 + '_) {
        (&xb[4..4 + QK_K], move |j| i16_at(xb, 4 + QK_K + 2 * j))
    }

    fn q2_k(blocks: Blocks) -> f32 {
        let mut sumf = 0f32;
        for (wb, xb) in blocks {
            let (sc, q2) = (&wb[0..16], &wb[16..80]);
            let (q8, bsum) = q8k(xb);
            let summs: i32 = (0..16).map(|j| bsum(j) * (sc[j] >> 4) as i32).sum();
            let yd = f32_at(xb, 0);
            let dall = yd * f16_at(wb, 80);
            let dmin = yd * f16_at(wb, 82);
            let mut isum = 0i32;
            let mut is = 0;
            for (h, q2h) in q2.chunks_exact(32).enumerate() {
                for j in 0..4 {
                    let q8j = &q8[h * 128 + j * 32..][..32];
                    for half in 0..2 {
                        let d = (sc[is] & 15) as i32;
                        is += 1;
                        let s: i32 = (half * 16..half * 16 + 16)
                            .map(|l| q8j[l] as i8 as i32 * ((q2h[l] >> (2 * j)) & 3) as i32)
                            .sum();
                        isum += d * s;
                    }
                }
            }
            sumf += dall * isum as f32 - dmin * summs as f32;
        }
        sumf
    }

    /// The generic K-quant inner loop: adds `scale(g)·a[e]·q8[e]` into integer lane e mod 8, g
    /// being e's group of 8. (The callers then scale each lane by the block's d into its own
    /// float lane, and sum the 8 float lanes in order at the end of the row.)
    fn lanes_add(aux32: &mut [i32; 8], a: &[i8], q8: &[u8], scale: impl Fn(usize) -> i32) {
        for (g, (ag, qg)) in a.chunks_exact(8).zip(q8.chunks_exact(8)).enumerate() {
            let s = scale(g);
            for l in 0..8 {
                // ggml forms the product in int16 first; it always fits
                aux32[l] += s * (qg[l] as i8 as i32 * ag[l] as i32);
            }
        }
    }

    fn q3_k(blocks: Blocks) -> f32 {
        let mut sums = [0f32; 8];
        for (wb, xb) in blocks {
            let (hm, q3) = (&wb[0..32], &wb[32..96]);
            let mut a = [0i8; QK_K];
            let mut m = 1u8;
            for (h, q3h) in q3.chunks_exact(32).enumerate() {
                for shift in 0..4 {
                    let out = &mut a[h * 128 + shift * 32..][..32];
                    for l in 0..32 {
                        let low = ((q3h[l] >> (2 * shift)) & 3) as i8;
                        out[l] = low - if hm[l] & m != 0 { 0 } else { 4 };
                    }
                    m = m.wrapping_shl(1);
                }
            }
            let sc = words_to_bytes(q3k_scales(&wb[96..108]));
            let mut aux32 = [0i32; 8];
            lanes_add(&mut aux32, &a, &xb[4..4 + QK_K], |g| sc[g / 2] as i32 - 32);
            let d = f16_at(wb, 108) * f32_at(xb, 0);
            for l in 0..8 {
                sums[l] += d * aux32[l] as f32;
            }
        }
        let mut sumf = 0f32;
        for s in sums {
            sumf += s;
        }
        sumf
    }

    /// q4_K, and q5_K when `fifth` (its high bits at 16..48, quants at 48..176).
    fn q4_k(blocks: Blocks, fifth: bool) -> f32 {
        let mut sums = [0f32; 8];
        let mut sumf = 0f32;
        for (wb, xb) in blocks {
            let qs = if fifth { &wb[48..176] } else { &wb[16..144] };
            let mut a = [0i8; QK_K];
            let mut m = 1u8;
            for (j, q4j) in qs.chunks_exact(32).enumerate() {
                for l in 0..32 {
                    let (mut lo, mut hi) = ((q4j[l] & 15) as i8, (q4j[l] >> 4) as i8);
                    if fifth {
                        let hm = wb[16 + l];
                        lo += if hm & m != 0 { 16 } else { 0 };
                        hi += if hm & (m << 1) != 0 { 16 } else { 0 };
                    }
                    a[j * 64 + l] = lo;
                    a[j * 64 + 32 + l] = hi;
                }
                m = m.wrapping_shl(2);
            }
            let sm = words_to_bytes(k4_scales_mins(&wb[4..16]));
            let (q8, bsum) = q8k(xb);
            let sumi: i32 = (0..16).map(|j| bsum(j) * sm[8 + j / 2] as i32).sum();
            let mut aux32 = [0i32; 8];
            lanes_add(&mut aux32, &a, q8, |g| sm[g / 4] as i32);
            let yd = f32_at(xb, 0);
            let d = f16_at(wb, 0) * yd;
            for l in 0..8 {
                sums[l] += d * aux32[l] as f32;
            }
            let dmin = f16_at(wb, 2) * yd;
            sumf -= dmin * sumi as f32;
        }
        for s in sums {
            sumf += s;
        }
        sumf
    }

    fn q6_k(blocks: Blocks) -> f32 {
        let mut sums = [0f32; 8];
        for (wb, xb) in blocks {
            let (ql, qh) = (&wb[0..128], &wb[128..192]);
            let mut a = [0i8; QK_K];
            for h in 0..2 {
                let (ql, qh, a) = (&ql[h * 64..], &qh[h * 32..], &mut a[h * 128..]);
                for l in 0..32 {
                    let hb = |s: u32| ((qh[l] >> s) & 3) << 4;
                    a[l] = ((ql[l] & 15) | hb(0)) as i8 - 32;
                    a[l + 32] = ((ql[l + 32] & 15) | hb(2)) as i8 - 32;
                    a[l + 64] = ((ql[l] >> 4) | hb(4)) as i8 - 32;
                    a[l + 96] = ((ql[l + 32] >> 4) | hb(6)) as i8 - 32;
                }
            }
            let sc = &wb[192..208];
            let mut aux32 = [0i32; 8];
            lanes_add(&mut aux32, &a, &xb[4..4 + QK_K], |g| sc[g / 2] as i8 as i32);
            let d = f16_at(wb, 208) * f32_at(xb, 0);
            for l in 0..8 {
                sums[l] += d * aux32[l] as f32;
            }
        }
        let mut sumf = 0f32;
        for s in sums {
            sumf += s;
        }
        sumf
    }

    fn iq4_xs(blocks: Blocks) -> f32 {
        let mut sumf = 0f32;
        for (wb, xb) in blocks {
            let d4d8 = f16_at(wb, 0) * f32_at(xb, 0);
            let mut h = u16::from_le_bytes([wb[2], wb[3]]) as u32;
            let (sl, qs, q8) = (&wb[4..8], &wb[8..136], &xb[4..4 + QK_K]);
            for ib in 0..QK_K / 32 {
                // sub-block ib: its 6-bit scale from a nibble of scales_l and 2 bits of scales_h
                let ls = if ib % 2 == 0 {
                    (sl[ib / 2] as u32 & 15) | ((h << 4) & 0x30)
                } else {
                    let v = (sl[ib / 2] as u32 >> 4) | ((h << 2) & 0x30);
                    h >>= 4;
                    v
                };
                let dl = d4d8 * (ls as i32 - 32) as f32;
                let (q, y) = (&qs[ib * 16..][..16], &q8[ib * 32..][..32]);
                let (mut s1, mut s2) = (0i32, 0i32);
                for j in 0..16 {
                    s1 += y[j] as i8 as i32 * KVALUES_IQ4NL[(q[j] & 15) as usize] as i32;
                    s2 += y[j + 16] as i8 as i32 * KVALUES_IQ4NL[(q[j] >> 4) as usize] as i32;
                }
                sumf += dl * (s1 + s2) as f32;
            }
        }
        sumf
    }

    /// One base-3 digit of a tq1_0 byte: the byte times 3^l (mod 256) scaled to 0..2.
    fn trit(b: u8, pow3: u8) -> i32 {
        ((b.wrapping_mul(pow3) as u16 * 3) >> 8) as i32 - 1
    }

    fn tq1_0(blocks: Blocks) -> f32 {
        const POW3: [u8; 5] = [1, 3, 9, 27, 81];
        let mut sumf = 0f32;
        for (wb, xb) in blocks {
            let (qs, qh, q8) = (&wb[0..48], &wb[48..52], &xb[4..4 + QK_K]);
            let mut sum = 0i32;
            // 32 bytes of 5 digits for elements 0..160, 16 bytes of 5 for 160..240, 4 of 4
            for (l, &p) in POW3.iter().enumerate() {
                for m in 0..32 {
                    sum += trit(qs[m], p) * q8[l * 32 + m] as i8 as i32;
                }
            }
            for (l, &p) in POW3.iter().enumerate() {
                for m in 0..16 {
                    sum += trit(qs[32 + m], p) * q8[160 + l * 16 + m] as i8 as i32;
                }
            }
            for (l, &p) in POW3[..4].iter().enumerate() {
                for j in 0..4 {
                    sum += trit(qh[j], p) * q8[240 + l * 4 + j] as i8 as i32;
                }
            }
            sumf += sum as f32 * (f16_at(wb, 52) * f32_at(xb, 0));
        }
        sumf
    }

    fn tq2_0(blocks: Blocks) -> f32 {
        let mut sumf = 0f32;
        for (wb, xb) in blocks {
            let (qs, q8) = (&wb[0..64], &xb[4..4 + QK_K]);
            let mut sumi = 0i32;
            for j in (0..64).step_by(32) {
                for l in 0..4 {
                    for k in 0..32 {
                        let v = ((qs[j + k] >> (2 * l)) & 3) as i32 - 1;
                        sumi += q8[j * 4 + l * 32 + k] as i8 as i32 * v;
                    }
                }
            }
            let d = f32_at(xb, 0) * f16_at(wb, 64);
            sumf += sumi as f32 * d;
        }
        sumf
    }
}

// The `unsafe` blocks around register arithmetic date from a minimum Rust version (1.85)
// before intrinsics were safe inside `#[target_feature]` functions (1.87).
#[cfg(target_arch = "x86_64")]
#[allow(unused_unsafe)]
pub(crate) mod avx2 {
    //! Every kernel reads `nb` blocks behind its two pointers and nothing else; the callers
    //! guarantee they are there and that the CPU has AVX2, FMA and F16C.

    use std::arch::x86_64::*;

    use super::*;

    /// An 8×8 transpose of `r` (rows → columns).
    #[inline(always)]
    pub(crate) unsafe fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
        // register arithmetic only
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(s0, s4),
            _mm256_permute2f128_ps::<0x20>(s1, s5),
            _mm256_permute2f128_ps::<0x20>(s2, s6),
            _mm256_permute2f128_ps::<0x20>(s3, s7),
            _mm256_permute2f128_ps::<0x31>(s0, s4),
            _mm256_permute2f128_ps::<0x31>(s1, s5),
            _mm256_permute2f128_ps::<0x31>(s2, s6),
            _mm256_permute2f128_ps::<0x31>(s3, s7),
        ]
    }

    /// Whether this CPU runs the AVX2 kernels (std caches the answer).
    pub fn available() -> bool {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }

    /// Whether a kernel called with `isa` takes its VNNI entry point: `isa` asks for AVX-512
    /// and this CPU has VNNI (an `Isa::Avx512` passed in by hand on a CPU without it gets the
    /// AVX2 kernels). The one test every dispatcher of the two entry points makes.
    #[inline]
    pub(crate) fn uses_vnni(isa: Isa) -> bool {
        isa == Isa::Avx512 && vnni_available()
    }

    /// Whether a kernel called with `isa` takes its AVX-VNNI entry point (`Isa::AvxVnni` on a
    /// CPU with AVX-VNNI; by hand on one without, the AVX2 kernels).
    #[inline]
    pub(crate) fn uses_avx_vnni(isa: Isa) -> bool {
        isa == Isa::AvxVnni && crate::simd::avx_vnni_available()
    }

    /// Whether this CPU also runs the VNNI kernels (AVX-512 F/BW/VL + VNNI, as `Isa::Avx512`
    /// requires); checked again wherever `Isa::Avx512` is passed in by hand.
    pub fn vnni_available() -> bool {
        // asked once per kernel call on AVX-512 CPUs: one load instead of five feature tests
        static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *VNNI.get_or_init(|| {
            available()
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
        })
    }

    /// `get_scale_shuffle_q3k`: row i picks 16-bit scale 2i for the low 128-bit lane and 2i+1
    /// for the high one (the scales vector holds the same 8 scales in both lanes).
    pub(crate) static SHUF_Q3K: [[u8; 32]; 4] = {
        let mut t = [[0u8; 32]; 4];
        let mut i = 0;
        while i < 4 {
            let mut b = 0;
            while b < 32 {
                let s = 2 * i + b / 16;
                t[i][b] = (2 * s + b % 2) as u8;
                b += 1;
            }
            i += 1;
        }
        t
    };

    /// `get_scale_shuffle_k4`: row i broadcasts 16-bit scale i.
    pub(crate) static SHUF_K4: [[u8; 32]; 8] = {
        let mut t = [[0u8; 32]; 8];
        let mut i = 0;
        while i < 8 {
            let mut b = 0;
            while b < 32 {
                t[i][b] = (2 * i + b % 2) as u8;
                b += 1;
            }
            i += 1;
        }
        t
    };

    /// `get_scale_shuffle`: row i spreads byte 2i over bytes 0..8 and byte 2i+1 over 8..16.
    pub(crate) static SHUF_Q6K: [[u8; 16]; 8] = {
        let mut t = [[0u8; 16]; 8];
        let mut i = 0;
        while i < 8 {
            let mut b = 0;
            while b < 16 {
                t[i][b] = (2 * i + b / 8) as u8;
                b += 1;
            }
            i += 1;
        }
        t
    };

    /// The four 32-byte groups of 6-bit q6_K codes (0..63) of a 128-element half: low nibbles
    /// of `b1`, `b2`, then their high nibbles, each with two high bits from `bh` (ggml's order).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn q6k_codes(b1: __m256i, b2: __m256i, bh: __m256i) -> [__m256i; 4] {
        // SAFETY: register arithmetic only.
        unsafe {
            let (m3, m15) = (_mm256_set1_epi8(3), _mm256_set1_epi8(15));
            let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(bh, m3));
            let h1 = _mm256_slli_epi16::<2>(_mm256_and_si256(bh, _mm256_set1_epi8(12)));
            let h2 = _mm256_and_si256(bh, _mm256_set1_epi8(48));
            let h3 = _mm256_srli_epi16::<2>(_mm256_and_si256(bh, _mm256_set1_epi8(-64)));
            [
                _mm256_or_si256(_mm256_and_si256(b1, m15), h0),
                _mm256_or_si256(_mm256_and_si256(b2, m15), h1),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(b1), m15), h2),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(b2), m15), h3),
            ]
        }
    }

    /// One row: [`vec_dot_rows`] of a single row.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(t: DType, w: &[u8], x: &[u8], nb: usize) -> f32 {
        let mut out = [0f32];
        // SAFETY: forwarded (one row at w).
        unsafe { rows_in::<0>(t, w.as_ptr(), 0, x, nb, &mut out) };
        out[0]
    }

    /// [`vec_dot`] with AVX-512 VNNI.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn vec_dot_vnni(t: DType, w: &[u8], x: &[u8], nb: usize) -> f32 {
        let mut out = [0f32];
        // SAFETY: forwarded (one row at w); the caller checked the CPU's VNNI.
        unsafe { rows_in::<1>(t, w.as_ptr(), 0, x, nb, &mut out) };
        out[0]
    }

    /// [`vec_dot`] with AVX-VNNI.
    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    pub unsafe fn vec_dot_avxvnni(t: DType, w: &[u8], x: &[u8], nb: usize) -> f32 {
        let mut out = [0f32];
        // SAFETY: forwarded (one row at w); the caller checked the CPU's AVX-VNNI.
        unsafe { rows_in::<2>(t, w.as_ptr(), 0, x, nb, &mut out) };
        out[0]
    }

    /// [`super::vec_dot_rows`] on AVX2: one dispatch, then the kernel row after row.
    ///
    /// # Safety
    /// `n = out.len()` rows of `nb` blocks of `t` at `w + r * stride`, `nb` activation blocks
    /// in `x`; the CPU has AVX2, FMA and F16C; `t` is one of [`vec_dot`]'s types.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot_rows(
        t: DType,
        w: *const u8,
        stride: usize,
        x: &[u8],
        nb: usize,
        out: &mut [f32],
    ) {
        // SAFETY: forwarded.
        unsafe { rows_in::<0>(t, w, stride, x, nb, out) }
    }

    /// [`vec_dot_rows`] with AVX-512 VNNI: the same integer sums (so the same results), with
    /// `vpdpbusd` where AVX2 needs `vpmaddubsw` + `vpmaddwd`, and the compiler folding each
    /// `vpmaddwd` + `vpaddd` of the k-quants' scales into one `vpdpwssd`.
    ///
    /// # Safety
    /// As [`vec_dot_rows`], and the CPU has AVX-512 F/BW/VL and VNNI.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn vec_dot_rows_vnni(
        t: DType,
        w: *const u8,
        stride: usize,
        x: &[u8],
        nb: usize,
        out: &mut [f32],
    ) {
        // SAFETY: forwarded.
        unsafe { rows_in::<1>(t, w, stride, x, nb, out) }
    }

    /// [`vec_dot_rows`] with AVX-VNNI.
    ///
    /// # Safety
    /// As [`vec_dot_rows`], and the CPU has AVX-VNNI.
    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    pub unsafe fn vec_dot_rows_avxvnni(
        t: DType,
        w: *const u8,
        stride: usize,
        x: &[u8],
        nb: usize,
        out: &mut [f32],
    ) {
        // SAFETY: forwarded.
        unsafe { rows_in::<2>(t, w, stride, x, nb, out) }
    }

    /// The body of both: every kernel is inlined into each caller and compiled with its
    /// instruction set; `V` picks VNNI's byte dot product.
    #[inline(always)]
    unsafe fn rows_in<const V: u8>(
        t: DType,
        w: *const u8,
        stride: usize,
        x: &[u8],
        nb: usize,
        out: &mut [f32],
    ) {
        let x = x.as_ptr();
        macro_rules! rows {
            ($kernel:ident) => {
                for (r, o) in out.iter_mut().enumerate() {
                    // SAFETY: row r lies at w + r * stride (caller).
                    *o = unsafe { $kernel::<V>(w.add(r * stride), x, nb) };
                }
            };
        }
        match t {
            DType::Q5_0 => rows!(q5_0),
            DType::Q5_1 => rows!(q5_1),
            DType::IQ4NL => rows!(iq4_nl),
            DType::Q2K => rows!(q2_k),
            DType::Q3K => rows!(q3_k),
            DType::Q4K | DType::Q5K if nb <= PAIR_SUMS_MAX_BLOCKS && out.len() > 1 => {
                let mut sums = [_mm_setzero_si128(); PAIR_SUMS_MAX_BLOCKS];
                for (i, s) in sums.iter_mut().take(nb).enumerate() {
                    // SAFETY: nb activation blocks at x (caller).
                    *s = unsafe { q8k_pair_sums(x.add(i * Q8_K_SIZE)) };
                }
                let sums = sums.as_ptr();
                // SAFETY: row r lies at w + r * stride (caller); the closures read entries
                // below nb, all written above.
                unsafe {
                    for (r, o) in out.iter_mut().enumerate() {
                        let wr = w.add(r * stride);
                        *o = if t == DType::Q4K {
                            q4_k_with::<V, _>(wr, x, nb, |_, i| *sums.add(i))
                        } else {
                            q5_k_with::<V, _>(wr, x, nb, |_, i| *sums.add(i))
                        };
                    }
                }
            }
            DType::Q4K => rows!(q4_k),
            DType::Q5K => rows!(q5_k),
            DType::Q6K => rows!(q6_k),
            DType::IQ4XS if nb <= ABS_MAX_BLOCKS && out.len() > 1 => {
                let mut ay = std::mem::MaybeUninit::<[u8; ABS_MAX_BLOCKS * Q8_K_SIZE]>::uninit();
                let ay = ay.as_mut_ptr() as *mut u8;
                // SAFETY: nb ≤ ABS_MAX_BLOCKS blocks fit; the kernel reads back only the
                // bytes written here; row r lies at w + r * stride (caller).
                unsafe {
                    q8k_magnitudes(x, nb, ay);
                    for (r, o) in out.iter_mut().enumerate() {
                        *o = iq4_xs_abs::<V>(w.add(r * stride), x, ay, nb);
                    }
                }
            }
            DType::IQ4XS => rows!(iq4_xs),
            DType::TQ1_0 => rows!(tq1_0),
            DType::TQ2_0 => rows!(tq2_0),
            _ => unreachable!("checked by the caller"),
        }
    }

    /// How far ahead of the block being multiplied a one-row kernel asks for its weights: a
    /// single core streams a row from memory at only ~60 % of its bandwidth on the hardware
    /// prefetcher alone (a mat-vec's rows lie one after another, so running past a row's end
    /// prefetches the next row; a prefetch never faults).
    pub(crate) const PREFETCH_AHEAD: usize = 4096;

    /// Prefetches `PREFETCH_AHEAD` bytes after the `B`-byte block at `p`, one line per 64 bytes
    /// of the block (consecutive blocks cover every line of the stream; a line straddling two
    /// blocks may be asked for twice). Measured on q4_K mat-vec, one and two threads, against
    /// no prefetch: +15-30 % from memory (16384×8192), -3-5 % when the matrix sits in L3
    /// (4096×4096); 2 or 8 KiB ahead and the T1/T2/NTA hints the same within noise.
    #[inline(always)]
    pub(crate) unsafe fn prefetch_block<const B: usize>(p: *const u8) {
        let q = p.wrapping_add(PREFETCH_AHEAD);
        let mut off = 0;
        while off < B {
            // SAFETY: a prefetch is a hint that never faults, whatever the address.
            unsafe { _mm_prefetch(q.wrapping_add(off) as *const i8, _MM_HINT_T0) };
            off += 64;
        }
    }

    /// One f16 at `p` as f32 (F16C, in registers).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn f16(p: *const u8) -> f32 {
        // SAFETY: two readable bytes at p (caller); F16C is enabled.
        unsafe { f16_bits((p as *const u16).read_unaligned()) }
    }

    /// An f16 bit pattern as f32 with F16C: `vmovd` then `vcvtph2ps`, written out because
    /// LLVM otherwise inserts the 16 bits into whatever register is free (`vpinsrw $0`),
    /// which makes the conversion wait for that register's last writer — in the dot-product
    /// loops an FMA accumulator, a false dependency that chained every block of a loop
    /// through the FMA's latency (q4_0 and q8_0 mat-vec: 6 cycles a block instead of 4).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn f16_bits(bits: u16) -> f32 {
        let out: f32;
        // SAFETY: register arithmetic only (no memory, no stack, flags untouched); F16C is
        // enabled in every caller.
        unsafe {
            std::arch::asm!(
                "vmovd {t}, {b:e}",
                "vcvtph2ps {t}, {t}",
                b = in(reg) bits as u32,
                t = out(xmm_reg) out,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        out
    }

    /// The f32 at `p` (q8_K's scale).
    #[inline]
    pub(crate) unsafe fn f32_le(p: *const u8) -> f32 {
        // SAFETY: four readable bytes at p (caller).
        unsafe { (p as *const f32).read_unaligned() }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn load256(p: *const u8) -> __m256i {
        // SAFETY: 32 readable bytes at p (caller).
        unsafe { _mm256_loadu_si256(p as *const __m256i) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn load128(p: *const u8) -> __m128i {
        // SAFETY: 16 readable bytes at p (caller).
        unsafe { _mm_loadu_si128(p as *const __m128i) }
    }

    /// ggml's `hsum_float_8`: high half + low half, then the two 64-bit halves, then the pair.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn hsum(v: __m256) -> f32 {
        // SAFETY: register arithmetic only.
        unsafe {
            let r = _mm_add_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
            let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
            _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
        }
    }

    /// 32 nibbles of 16 bytes: the low nibbles in bytes 0..16, the high ones in 16..32 — one
    /// broadcast load, one variable shift, one mask.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn nibbles(p: *const u8) -> __m256i {
        // SAFETY: 16 readable bytes at p (caller).
        unsafe {
            let q = _mm256_broadcastsi128_si256(load128(p));
            let q = _mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 0, 4, 4));
            _mm256_and_si256(q, _mm256_set1_epi8(15))
        }
    }

    /// The 32 bits at p spread to 32 bytes: 0xFF where the bit is set, 0 where not.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn bits_to_bytes(p: *const u8) -> __m256i {
        // SAFETY: four readable bytes at p (caller).
        unsafe {
            let v = (p as *const i32).read_unaligned();
            let spread = _mm256_shuffle_epi8(
                _mm256_set1_epi32(v),
                _mm256_set_epi64x(
                    0x0303_0303_0303_0303,
                    0x0202_0202_0202_0202,
                    0x0101_0101_0101_0101,
                    0,
                ),
            );
            // every bit but the byte's own is set, so the byte is all ones iff its bit is
            let others = _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
            _mm256_cmpeq_epi8(others, _mm256_set1_epi64x(-1))
        }
    }

    /// Pairwise sums of 16 i16 lanes into 8 i32 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn pair_sums(p: __m256i) -> __m256i {
        // SAFETY: register arithmetic only.
        unsafe { _mm256_madd_epi16(p, _mm256_set1_epi16(1)) }
    }

    /// Σ a·b of four adjacent byte pairs into each i32 lane, a unsigned, b signed (no pair
    /// sum may exceed i16: true of every caller's values): `vpmaddubsw` + `vpmaddwd` on AVX2,
    /// one `vpdpbusd` with VNNI (`V`), as ggml's `mul_sum_us8_pairs_float`.
    #[inline(always)]
    pub(crate) unsafe fn dot4<const V: u8>(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: register arithmetic only; V = 1 only in functions compiled for AVX-512
        // VNNI, V = 2 only in functions compiled for AVX-VNNI.
        unsafe {
            if V != 0 {
                dpbusd::<V>(_mm256_setzero_si256(), a, b)
            } else {
                _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))
            }
        }
    }

    /// `vpdpbusd` on 256-bit vectors: the EVEX form (AVX-512 VL + VNNI) for `V` = 1, the VEX
    /// form (AVX-VNNI) for `V` = 2; the same operation.
    #[inline(always)]
    pub(crate) unsafe fn dpbusd<const V: u8>(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: the caller is compiled with the instruction set `V` names.
        unsafe {
            if V == 2 {
                _mm256_dpbusd_avx_epi32(acc, a, b)
            } else {
                _mm256_dpbusd_epi32(acc, a, b)
            }
        }
    }

    /// Signed x·y summed in fours (ggml's `mul_sum_i8_pairs_float`): |x| times y with x's sign.
    #[inline(always)]
    pub(crate) unsafe fn dot4_i8<const V: u8>(x: __m256i, y: __m256i) -> __m256i {
        // SAFETY: register arithmetic only.
        unsafe { dot4::<V>(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)) }
    }

    /// Signed bytes x·y summed in pairs to i16 (ggml's `mul_add_epi8`): |x| as unsigned times
    /// y with x's sign.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn mul_i8_pairs(x: __m256i, y: __m256i) -> __m256i {
        // SAFETY: register arithmetic only.
        unsafe { _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)) }
    }

    /// The same 8 16-bit values (half `H` of `v`) in both 128-bit halves.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn both_halves<const H: i32>(v: __m256i) -> __m256i {
        // SAFETY: register arithmetic only.
        unsafe {
            let h = _mm256_extracti128_si256::<H>(v);
            _mm256_set_m128i(h, h)
        }
    }

    /// 16 bytes of nibbles mapped through the iq4_nl codebook: low nibbles to bytes 0..16,
    /// high nibbles to 16..32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn iq4_values(p: *const u8) -> __m256i {
        // SAFETY: 16 readable bytes at p (caller); the codebook is 16 bytes.
        unsafe {
            // one 256-bit lookup (two 128-bit lookups and an insert before)
            let values = _mm256_broadcastsi128_si256(load128(KVALUES_IQ4NL.as_ptr() as *const u8));
            _mm256_shuffle_epi8(values, nibbles(p))
        }
    }

    #[inline(always)]
    unsafe fn q5_0<const V: u8>(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: nb blocks behind w and x (caller).
        unsafe {
            let mut acc = _mm256_setzero_ps();
            for i in 0..nb {
                let (wb, xb) = (w.add(i * 22), x.add(i * Q8_0_SIZE));
                prefetch_block::<22>(wb);
                let d = _mm256_set1_ps(f16(wb) * f16(xb));
                // a clear fifth bit makes the value nibble - 16: set the byte's top four bits
                let hi = _mm256_andnot_si256(bits_to_bytes(wb.add(2)), _mm256_set1_epi8(-16));
                let q = _mm256_or_si256(nibbles(wb.add(6)), hi);
                let p = dot4_i8::<V>(q, load256(xb.add(2)));
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
            }
            hsum(acc)
        }
    }

    #[inline(always)]
    unsafe fn q5_1<const V: u8>(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: nb blocks behind w and x (caller).
        unsafe {
            let mut acc = _mm256_setzero_ps();
            let mut summs = 0f32;
            for i in 0..nb {
                let (wb, xb) = (w.add(i * 24), x.add(i * Q8_1_SIZE));
                prefetch_block::<24>(wb);
                let dx = f16(wb);
                // gcc fuses ggml's `summs += m*s`
                summs = f16(wb.add(2)).mul_add(f16(xb.add(2)), summs);
                let hi = _mm256_and_si256(bits_to_bytes(wb.add(4)), _mm256_set1_epi8(16));
                let q = _mm256_or_si256(nibbles(wb.add(8)), hi);
                let dy = f16(xb);
                let p = dot4::<V>(q, load256(xb.add(4)));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dx * dy), acc);
            }
            hsum(acc) + summs
        }
    }

    #[inline(always)]
    unsafe fn iq4_nl<const V: u8>(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: nb blocks behind w and x (caller).
        unsafe {
            let (mut acc1, mut acc2) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut i = 0;
            // two blocks per step, each into its own accumulator
            while i + 1 < nb {
                let (w1, x1) = (w.add(i * 18), x.add(i * Q8_0_SIZE));
                prefetch_block::<18>(w1);
                let (w2, x2) = (w1.add(18), x1.add(Q8_0_SIZE));
                let p1 = dot4_i8::<V>(iq4_values(w1.add(2)), load256(x1.add(2)));
                let p2 = dot4_i8::<V>(iq4_values(w2.add(2)), load256(x2.add(2)));
                let (d1, d2) = (f16(x1) * f16(w1), f16(x2) * f16(w2));
                acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d1), _mm256_cvtepi32_ps(p1), acc1);
                acc2 = _mm256_fmadd_ps(_mm256_set1_ps(d2), _mm256_cvtepi32_ps(p2), acc2);
                i += 2;
            }
            let mut sumf = hsum(_mm256_add_ps(acc1, acc2));
            if i < nb {
                sumf += iq4_nl_odd_block(w.add(i * 18), x.add(i * Q8_0_SIZE));
            }
            sumf
        }
    }

    /// ggml's AVX2 iq4_nl kernel takes blocks in pairs and an odd last block the generic way
    /// (gcc does not fuse this one): that block's term.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn iq4_nl_odd_block(wb: *const u8, xb: *const u8) -> f32 {
        // SAFETY: one iq4_nl block at wb and one q8_0 block at xb (caller).
        unsafe { codebook_odd_block(f16(xb) * f16(wb), wb.add(2), xb, &KVALUES_IQ4NL) }
    }

    /// An odd last mxfp4 block the way ggml's `vec_dot` ends: `d·Σ`, not fused.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn mxfp4_odd_block(wb: *const u8, xb: *const u8) -> f32 {
        use crate::ops::qdot_fp::{e8m0_half, KVALUES_FP4};
        // SAFETY: one mxfp4 block at wb and one q8_0 block at xb (caller).
        unsafe { codebook_odd_block(f16(xb) * e8m0_half(*wb), wb.add(1), xb, &KVALUES_FP4) }
    }

    /// The generic tail of a 4-bit codebook block (iq4_nl, mxfp4): `d·Σ` of its 16 code bytes at
    /// `codes` (low nibbles against the q8_0 block's first 16 values, high ones against the
    /// last 16) through `table`, the multiply not fused.
    #[inline]
    pub(crate) unsafe fn codebook_odd_block(
        d: f32,
        codes: *const u8,
        xb: *const u8,
        table: &[i8; 16],
    ) -> f32 {
        // SAFETY: 16 code bytes at codes and one q8_0 block at xb (caller).
        unsafe {
            let (mut s1, mut s2) = (0i32, 0i32);
            for j in 0..16 {
                let q = *codes.add(j);
                s1 += *xb.add(2 + j) as i8 as i32 * table[(q & 15) as usize] as i32;
                s2 += *xb.add(18 + j) as i8 as i32 * table[(q >> 4) as usize] as i32;
            }
            d * (s1 + s2) as f32
        }
    }

    #[inline(always)]
    unsafe fn q2_k<const V: u8>(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: nb blocks behind w and x (caller); shuffle rows are < 4.
        unsafe {
            let m3 = _mm256_set1_epi8(3);
            let m4 = _mm_set1_epi8(15);
            let mut acc = _mm256_setzero_ps();
            for i in 0..nb {
                let (wb, xb) = (w.add(i * 84), x.add(i * Q8_K_SIZE));
                prefetch_block::<84>(wb);
                let yd = f32_le(xb);
                let d = yd * f16(wb.add(80));
                let dmin = -yd * f16(wb.add(82));
                // the mins against the group sums of the activations
                let packed = load128(wb);
                let mins = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(packed), m4));
                let prod = _mm256_madd_epi16(mins, load256(xb.add(4 + QK_K)));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc);
                let all = _mm256_cvtepi8_epi16(_mm_and_si128(packed, m4));
                let scales = [both_halves::<0>(all), both_halves::<1>(all)];
                let (mut q2, mut q8) = (wb.add(16), xb.add(4));
                let mut sumi = _mm256_setzero_si256();
                for sc in scales {
                    let bits = load256(q2);
                    q2 = q2.add(32);
                    let mut p = [_mm256_setzero_si256(); 4];
                    for (s, ps) in p.iter_mut().enumerate() {
                        let shift = _mm_cvtsi32_si128(2 * s as i32);
                        let q = _mm256_and_si256(_mm256_srl_epi16(bits, shift), m3);
                        let prod = _mm256_maddubs_epi16(q, load256(q8.add(32 * s)));
                        let row = load256(SHUF_Q3K[s].as_ptr());
                        *ps = _mm256_madd_epi16(_mm256_shuffle_epi8(sc, row), prod);
                    }
                    q8 = q8.add(128);
                    let p01 = _mm256_add_epi32(p[0], p[1]);
                    let p23 = _mm256_add_epi32(p[2], p[3]);
                    sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p01, p23));
                }
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
            }
            hsum(acc)
        }
    }

    #[inline(always)]
    unsafe fn q3_k<const V: u8>(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: nb blocks behind w and x (caller); shuffle rows are < 4.
        unsafe {
            let m3 = _mm256_set1_epi8(3);
            let one = _mm256_set1_epi8(1);
            let mut acc = _mm256_setzero_ps();
            for i in 0..nb {
                let (wb, xb) = (w.add(i * 110), x.add(i * Q8_K_SIZE));
                prefetch_block::<110>(wb);
                let d = f32_le(xb) * f16(wb.add(108));
                let sc = _mm_sub_epi8(q3k_scales_v(wb.add(96)), _mm_set1_epi8(32));
                let all = _mm256_cvtepi8_epi16(sc);
                let scales = [both_halves::<0>(all), both_halves::<1>(all)];
                let hbits = load256(wb);
                let (mut q3, mut q8) = (wb.add(32), xb.add(4));
                let mut sumi = _mm256_setzero_si256();
                let mut bit = 0;
                for sc in scales {
                    let bits = load256(q3);
                    q3 = q3.add(32);
                    let mut p = [_mm256_setzero_si256(); 4];
                    for (s, ps) in p.iter_mut().enumerate() {
                        let shift = _mm_cvtsi32_si128(2 * s as i32);
                        let low = _mm256_and_si256(_mm256_srl_epi16(bits, shift), m3);
                        // 4 where the high bit is clear, 0 where it is set: subtracted below
                        let count = _mm_cvtsi32_si128(bit);
                        let clear = _mm256_andnot_si256(hbits, _mm256_sll_epi16(one, count));
                        let high = _mm256_slli_epi16::<2>(_mm256_srl_epi16(clear, count));
                        bit += 1;
                        let y = load256(q8.add(32 * s));
                        let sub = _mm256_maddubs_epi16(high, y);
                        *ps = _mm256_sub_epi16(_mm256_maddubs_epi16(low, y), sub);
                    }
                    q8 = q8.add(128);
                    for (s, ps) in p.iter_mut().enumerate() {
                        let row = load256(SHUF_Q3K[s].as_ptr());
                        *ps = _mm256_madd_epi16(_mm256_shuffle_epi8(sc, row), *ps);
                    }
                    let p01 = _mm256_add_epi32(p[0], p[1]);
                    let p23 = _mm256_add_epi32(p[2], p[3]);
                    sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p01, p23));
                }
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
            }
            hsum(acc)
        }
    }

    /// q4_K / q5_K: the 6-bit scales and mins at `s` unpacked to 16 i16 (scales in the low
    /// half), [`k4_scales_mins`] in vector registers (its scalar form costs a q4_K mat-vec
    /// about a tenth of its time). Reads 16 bytes: the 12 of the scales and 4 of the codes or
    /// high bits after them, which it ignores.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn k4_scales_mins_v(s: *const u8) -> __m256i {
        // SAFETY: 16 readable bytes at s (caller).
        unsafe {
            // words u0 u1 u2 (and one ignored) in the four lanes
            let v = load128(s);
            let low6 = _mm_and_si128(v, _mm_set1_epi32(0x3f3f_3f3f));
            // ((u >> 6) & 0x03030303) << 4 for u0, u1
            let top2 = _mm_and_si128(_mm_srli_epi32::<2>(v), _mm_set1_epi32(0x3030_3030));
            // u2 & 0x0f0f0f0f, (u2 >> 4) & 0x0f0f0f0f
            let u2 = _mm_srlv_epi32(_mm_shuffle_epi32::<0xAA>(v), _mm_set_epi32(0, 0, 4, 0));
            let mixed = _mm_or_si128(_mm_and_si128(u2, _mm_set1_epi32(0x0f0f_0f0f)), top2);
            _mm256_cvtepu8_epi16(_mm_unpacklo_epi32(low6, mixed))
        }
    }

    /// q3_K's 16 6-bit scales at `s` (12 bytes) unpacked but not re-centred, [`q3k_scales`] in
    /// vector registers.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q3k_scales_v(s: *const u8) -> __m128i {
        // SAFETY: 12 readable bytes at s (caller).
        unsafe {
            // [a0 a1 a0 a1] >> [0 0 4 4] & 0x0f: the low four bits of each scale
            let a01 = _mm_loadl_epi64(s as *const __m128i);
            let low = _mm_srlv_epi32(_mm_shuffle_epi32::<0x44>(a01), _mm_set_epi32(4, 4, 0, 0));
            let low = _mm_and_si128(low, _mm_set1_epi32(0x0f0f_0f0f));
            // ([a2 a2 a2 a2] >> [0 2 4 6] & 0x03) << 4: the two high bits
            let a2 = _mm_set1_epi32((s.add(8) as *const i32).read_unaligned());
            let high = _mm_srlv_epi32(a2, _mm_set_epi32(6, 4, 2, 0));
            let high = _mm_slli_epi32::<4>(_mm_and_si128(high, _mm_set1_epi32(0x0303_0303)));
            _mm_or_si128(low, high)
        }
    }

    /// The group sums of a q8_K block's activations added in pairs, one per 32 elements (8 i16).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q8k_pair_sums(xb: *const u8) -> __m128i {
        // SAFETY: one q8_K block at xb (caller).
        unsafe {
            let bsums = load256(xb.add(4 + QK_K));
            _mm_hadd_epi16(
                _mm256_extracti128_si256::<0>(bsums),
                _mm256_extracti128_si256::<1>(bsums),
            )
        }
    }

    /// Most activation blocks for which a q4_K / q5_K mat-vec takes [`q8k_pair_sums`] from a
    /// copy made once per call (4 KiB on the stack): K up to 65536.
    const PAIR_SUMS_MAX_BLOCKS: usize = 256;

    /// A q4_K / q5_K block's `d` and `dmin` (the block's first four bytes, two f16) times the
    /// activations' scale `yd`: `yd·d` in lane 0 and `-yd·dmin` in lane 1 (ggml's two scalar
    /// products, in one conversion and one multiplication).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn k4_block_scales(wb: *const u8, xb: *const u8) -> __m128 {
        // SAFETY: four readable bytes at wb and at xb (caller).
        unsafe {
            let dd = _mm_cvtph_ps(_mm_cvtsi32_si128((wb as *const i32).read_unaligned()));
            let yd = _mm_set1_ps(f32_le(xb));
            let minus_lane1 = _mm_castsi128_ps(_mm_set_epi32(0, 0, i32::MIN, 0));
            _mm_mul_ps(_mm_xor_ps(yd, minus_lane1), dd)
        }
    }

    /// A shuffle table ([`SHUF_K4`], [`SHUF_Q6K`]) behind a pointer the compiler cannot see
    /// through. Given the table itself it turns each one-instruction `vpshufb` of a scale into
    /// two or three shuffles (`vpshuflw` + `vpshufd`, after a `vpunpcklbw` for q6_K): 8 more
    /// instructions a superblock in q4_K's mat-vec, 12 in q6_K's (+10 % with the matrix in L2).
    /// (q2_K/q3_K keep the visible table: there LLVM's choice measured as fast or faster.)
    #[inline(always)]
    fn opaque<T>(table: &'static T) -> *const u8 {
        std::hint::black_box(table as *const T as *const u8)
    }

    #[inline(always)]
    unsafe fn q4_k<const V: u8>(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: forwarded.
        unsafe { q4_k_with::<V, _>(w, x, nb, |xb, _| q8k_pair_sums(xb)) }
    }

    /// q4_K with the activations' pair sums of block `i` (at `xb`) from `pair_sums(xb, i)`.
    #[inline(always)]
    unsafe fn q4_k_with<const V: u8, P: Fn(*const u8, usize) -> __m128i>(
        w: *const u8,
        x: *const u8,
        nb: usize,
        pair_sums: P,
    ) -> f32 {
        // SAFETY: nb blocks behind w and x (caller); a block's scales are followed by its
        // codes, so 16 bytes are readable there; the shuffle table has 8 rows of 32 bytes.
        unsafe {
            let m4 = _mm256_set1_epi8(15);
            let shuf = opaque(&SHUF_K4);
            let mut acc = _mm256_setzero_ps();
            let mut acc_m = _mm_setzero_ps();
            for i in 0..nb {
                let (wb, xb) = (w.add(i * 144), x.add(i * Q8_K_SIZE));
                prefetch_block::<144>(wb);
                let dd = k4_block_scales(wb, xb);
                let sm = k4_scales_mins_v(wb.add(4));
                let prod = _mm_madd_epi16(_mm256_extracti128_si256::<1>(sm), pair_sums(xb, i));
                acc_m = _mm_fmadd_ps(_mm_permute_ps::<0x55>(dd), _mm_cvtepi32_ps(prod), acc_m);
                let scales = both_halves::<0>(sm);
                let (mut q4, mut q8) = (wb.add(16), xb.add(4));
                let mut sumi = _mm256_setzero_si256();
                for j in 0..QK_K / 64 {
                    let scale_l = _mm256_shuffle_epi8(scales, load256(shuf.add(64 * j)));
                    let scale_h = _mm256_shuffle_epi8(scales, load256(shuf.add(64 * j + 32)));
                    let bits = load256(q4);
                    q4 = q4.add(32);
                    let lo = _mm256_and_si256(bits, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
                    let pl = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(lo, load256(q8)));
                    let ph =
                        _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(hi, load256(q8.add(32))));
                    q8 = q8.add(64);
                    sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
                }
                acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(sumi), acc);
            }
            let acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
            let acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
            hsum(acc) + _mm_cvtss_f32(acc_m)
        }
    }

    #[inline(always)]
    unsafe fn q5_k<const V: u8>(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: forwarded.
        unsafe { q5_k_with::<V, _>(w, x, nb, |xb, _| q8k_pair_sums(xb)) }
    }

    /// q5_K with the activations' pair sums of block `i` (at `xb`) from `pair_sums(xb, i)`.
    #[inline(always)]
    unsafe fn q5_k_with<const V: u8, P: Fn(*const u8, usize) -> __m128i>(
        w: *const u8,
        x: *const u8,
        nb: usize,
        pair_sums: P,
    ) -> f32 {
        // SAFETY: nb blocks behind w and x (caller); a block's scales are followed by its
        // high bits, so 16 bytes are readable there; the shuffle table has 8 rows of 32 bytes.
        unsafe {
            let m4 = _mm256_set1_epi8(15);
            let shuf = opaque(&SHUF_K4);
            let zero = _mm_setzero_si128();
            let mut acc = _mm256_setzero_ps();
            let mut summs = 0f32;
            for i in 0..nb {
                let (wb, xb) = (w.add(i * 176), x.add(i * Q8_K_SIZE));
                prefetch_block::<176>(wb);
                let dd = k4_block_scales(wb, xb);
                let dmin = _mm_cvtss_f32(_mm_movehdup_ps(dd));
                let sm = k4_scales_mins_v(wb.add(4));
                let prod = _mm_madd_epi16(_mm256_extracti128_si256::<1>(sm), pair_sums(xb, i));
                let total = _mm_hadd_epi32(_mm_hadd_epi32(prod, zero), zero);
                // gcc fuses ggml's `summs += dmin * sum`
                summs = dmin.mul_add(_mm_cvtsi128_si32(total) as f32, summs);
                let scales = both_halves::<0>(sm);
                let hbits = load256(wb.add(16));
                let mut hmask = _mm256_set1_epi8(1);
                let (mut q5, mut q8) = (wb.add(48), xb.add(4));
                let mut sumi = _mm256_setzero_si256();
                for j in 0..QK_K / 64 {
                    let scale_0 = _mm256_shuffle_epi8(scales, load256(shuf.add(64 * j)));
                    let scale_1 = _mm256_shuffle_epi8(scales, load256(shuf.add(64 * j + 32)));
                    let bits = load256(q5);
                    q5 = q5.add(32);
                    // the fifth bits of this pair of 32-element groups: bits 2j and 2j+1 of qh
                    let c0 = _mm_cvtsi32_si128(2 * j as i32);
                    let h0 = _mm256_srl_epi16(_mm256_and_si256(hbits, hmask), c0);
                    hmask = _mm256_slli_epi16::<1>(hmask);
                    let c1 = _mm_cvtsi32_si128(2 * j as i32 + 1);
                    let h1 = _mm256_srl_epi16(_mm256_and_si256(hbits, hmask), c1);
                    hmask = _mm256_slli_epi16::<1>(hmask);
                    let v0 =
                        _mm256_add_epi8(_mm256_and_si256(bits, m4), _mm256_slli_epi16::<4>(h0));
                    let lo4 = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
                    let v1 = _mm256_add_epi8(lo4, _mm256_slli_epi16::<4>(h1));
                    let p0 = _mm256_madd_epi16(scale_0, _mm256_maddubs_epi16(v0, load256(q8)));
                    let p1 =
                        _mm256_madd_epi16(scale_1, _mm256_maddubs_epi16(v1, load256(q8.add(32))));
                    q8 = q8.add(64);
                    sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
                }
                acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(sumi), acc);
            }
            hsum(acc) + summs
        }
    }

    #[inline(always)]
    unsafe fn q6_k<const V: u8>(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: nb blocks behind w and x (caller); shuffle rows are < 8.
        unsafe {
            let shuf = opaque(&SHUF_Q6K);
            let mut acc = _mm256_setzero_ps();
            for i in 0..nb {
                let (wb, xb) = (w.add(i * 210), x.add(i * Q8_K_SIZE));
                prefetch_block::<210>(wb);
                let d = f32_le(xb) * f16(wb.add(208));
                let scales = load128(wb.add(192));
                // 32·Σ scale·q8 over the block: the quants' -32 offset, taken out once
                let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(
                    load256(xb.add(4 + QK_K)),
                    _mm256_cvtepi8_epi16(scales),
                ));
                let (mut ql, mut qh, mut q8) = (wb, wb.add(128), xb.add(4));
                let mut sumi = _mm256_setzero_si256();
                for h in 0..2 {
                    let b1 = load256(ql);
                    let b2 = load256(ql.add(32));
                    let bh = load256(qh);
                    ql = ql.add(64);
                    qh = qh.add(32);
                    let v = q6k_codes(b1, b2, bh);
                    let mut p = [_mm256_setzero_si256(); 4];
                    for s in 0..4 {
                        let prod = _mm256_maddubs_epi16(v[s], load256(q8.add(32 * s)));
                        let row = load128(shuf.add(16 * (4 * h + s)));
                        let sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, row));
                        p[s] = _mm256_madd_epi16(sc, prod);
                    }
                    q8 = q8.add(128);
                    sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[0], p[1]));
                    sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[2], p[3]));
                }
                let sumi = _mm256_sub_epi32(sumi, offset);
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
            }
            hsum(acc)
        }
    }

    #[inline(always)]
    unsafe fn iq4_xs<const V: u8>(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: forwarded.
        unsafe { iq4_xs_body(w, x, nb, |v, y| mul_i8_pairs(v, load256(y))) }
    }

    /// Most activation blocks for which a mat-vec of iq4_xs takes |y| from a copy made once
    /// (16 KiB on the stack): K up to 14336.
    const ABS_MAX_BLOCKS: usize = 56;

    /// `iq4_xs` with |y| read from `ay` (the activation blocks with their values replaced by
    /// their magnitudes, made once per mat-vec): |y| · (v with y's sign) per pair — the same
    /// products as ggml's |v| · (y with v's sign), with one sign operation instead of two
    /// (|y| ≤ 127: q8_K's values, so no pair sum saturates).
    #[inline(always)]
    unsafe fn iq4_xs_abs<const V: u8>(w: *const u8, x: *const u8, ay: *const u8, nb: usize) -> f32 {
        // SAFETY: forwarded; `ay` has x's layout.
        unsafe {
            iq4_xs_body(w, x, nb, |v, y| {
                let a = load256(ay.offset(y.offset_from(x)));
                _mm256_maddubs_epi16(a, _mm256_sign_epi8(v, load256(y)))
            })
        }
    }

    /// Replaces the 256 values of each of `nb` q8_K blocks at `x` by their magnitudes, at the
    /// same offsets in `ay` (the other bytes are left unwritten).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q8k_magnitudes(x: *const u8, nb: usize, ay: *mut u8) {
        // SAFETY: nb blocks at x and room for them at ay (caller).
        unsafe {
            for i in 0..nb {
                for k in 0..QK_K / 32 {
                    let off = i * Q8_K_SIZE + 4 + 32 * k;
                    let y = load256(x.add(off));
                    _mm256_storeu_si256(ay.add(off) as *mut __m256i, _mm256_sign_epi8(y, y));
                }
            }
        }
    }

    /// iq4_xs row × q8_K column with `pairs(v, y)`: the i16 pair sums of 32 codebook values
    /// against the 32 activations at `y`.
    #[inline(always)]
    unsafe fn iq4_xs_body<P: Fn(__m256i, *const u8) -> __m256i>(
        w: *const u8,
        x: *const u8,
        nb: usize,
        pairs: P,
    ) -> f32 {
        // SAFETY: nb blocks behind w and x (caller).
        unsafe {
            let mut acc = _mm256_setzero_ps();
            for i in 0..nb {
                let (wb, xb) = (w.add(i * 136), x.add(i * Q8_K_SIZE));
                prefetch_block::<136>(wb);
                let mut sh = (wb.add(2) as *const u16).read_unaligned() as i32;
                let (mut qs, mut q8) = (wb.add(8), xb.add(4));
                let (mut sumi1, mut sumi2) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                // two 32-element sub-blocks per step, into separate sums
                for ib in 0..QK_K / 64 {
                    let p1 = pairs(iq4_values(qs), q8);
                    let p2 = pairs(iq4_values(qs.add(16)), q8.add(32));
                    qs = qs.add(32);
                    q8 = q8.add(64);
                    let sl = *wb.add(4 + ib) as i32;
                    let ls1 = ((sl & 15) | ((sh << 4) & 0x30)) - 32;
                    let ls2 = ((sl >> 4) | ((sh << 2) & 0x30)) - 32;
                    sh >>= 4;
                    let s1 = _mm256_madd_epi16(p1, _mm256_set1_epi16(ls1 as i16));
                    let s2 = _mm256_madd_epi16(p2, _mm256_set1_epi16(ls2 as i16));
                    sumi1 = _mm256_add_epi32(s1, sumi1);
                    sumi2 = _mm256_add_epi32(s2, sumi2);
                }
                let d = _mm256_set1_ps(f16(wb) * f32_le(xb));
                let s = _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2));
                acc = _mm256_fmadd_ps(d, s, acc);
            }
            hsum(acc)
        }
    }

    /// `avg(q, avg(q, 0))` per byte (`vpavgb` twice), written out: LLVM sees `vpavgb` as a
    /// widening add and shift and, given [`top_trit`]'s `q - 1` and zero, rewrites it into
    /// byte-to-word widening or `vpmaxub` + `vpsrlw` + `vpand` chains, several instructions
    /// for one (tq1_0's kernel is bound by its vector instructions).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn avg_twice(q: __m256i) -> __m256i {
        let (out, _t): (__m256i, __m256i);
        // SAFETY: register arithmetic only (no memory, no stack, flags untouched).
        unsafe {
            std::arch::asm!(
                "vpxor {t:x}, {t:x}, {t:x}",
                "vpavgb {t}, {q}, {t}",
                "vpavgb {q}, {q}, {t}",
                q = inout(ymm_reg) q => out,
                t = out(ymm_reg) _t,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        out
    }

    /// Base-3 digits of bytes already multiplied by their power of 3 (mod 256): the top two
    /// bits of about 3·q/2 (ggml's halving-add trick), 0..2 per byte.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn top_trit(q: __m256i) -> __m256i {
        // SAFETY: register arithmetic only.
        unsafe {
            let q = avg_twice(_mm256_subs_epu8(q, _mm256_set1_epi8(1)));
            _mm256_and_si256(_mm256_srli_epi16::<6>(q), _mm256_set1_epi8(3))
        }
    }

    /// 9·q per byte, mod 256 (8·q as a 16-bit shift with the bits that cross bytes cleared).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn times9(q: __m256i) -> __m256i {
        // SAFETY: register arithmetic only.
        unsafe {
            let q8 = _mm256_and_si256(_mm256_slli_epi16::<3>(q), _mm256_set1_epi8(-8));
            _mm256_add_epi8(q8, q)
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn times9_128(q: __m128i) -> __m128i {
        // SAFETY: register arithmetic only.
        unsafe { _mm_add_epi8(_mm_and_si128(_mm_slli_epi16::<3>(q), _mm_set1_epi8(-8)), q) }
    }

    /// A tq1_0 block's last 20 bytes as three registers of two 16-byte digit groups each,
    /// still to go through [`top_trit`]: the five digits of bytes 32..48 (times 1, 3, 9, 27,
    /// 81) for elements 160..240, then the four of bytes 48..52 (times 1, 3, 9, 27) for
    /// 240..256.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn tq1_0_tail(wb: *const u8) -> [__m256i; 3] {
        // SAFETY: a whole block at wb (caller).
        unsafe {
            let r0 = load128(wb.add(32));
            let qh = (wb.add(48) as *const i32).read_unaligned();
            let r1 = _mm_add_epi8(r0, _mm_add_epi8(r0, r0));
            let r2 = times9_128(r0);
            let r3 = times9_128(r1);
            let r4 = times9_128(r2);
            let h = _mm256_mullo_epi16(
                _mm256_cvtepu8_epi16(_mm_set1_epi32(qh)),
                _mm256_set_epi16(27, 27, 27, 27, 9, 9, 9, 9, 3, 3, 3, 3, 1, 1, 1, 1),
            );
            let h = _mm256_and_si256(h, _mm256_set1_epi16(0xff));
            let r5 = _mm_packus_epi16(
                _mm256_extracti128_si256::<0>(h),
                _mm256_extracti128_si256::<1>(h),
            );
            [
                _mm256_set_m128i(r1, r0),
                _mm256_set_m128i(r3, r2),
                _mm256_set_m128i(r5, r4),
            ]
        }
    }

    #[inline(always)]
    unsafe fn tq1_0<const V: u8>(w: *const u8, x: *const u8, nb: usize) -> f32 {
        if V == 1 {
            // SAFETY: forwarded; V = 1 only in functions compiled for AVX-512 VNNI.
            return unsafe { ternary_zmm::tq1_0(w, x, nb) };
        }
        // SAFETY: nb blocks behind w and x (caller).
        unsafe {
            let mut sumf = _mm256_setzero_ps();
            for i in 0..nb {
                let (wb, xb) = (w.add(i * 54), x.add(i * Q8_K_SIZE));
                prefetch_block::<54>(wb);
                let q8 = xb.add(4);
                // elements 0..160: 32 bytes of five digits, times 1, 3, 9, 27, 81
                let q0 = load256(wb);
                let q1 = _mm256_add_epi8(q0, _mm256_add_epi8(q0, q0));
                let q2 = times9(q0);
                let q3 = times9(q1);
                let q4 = times9(q2);
                let mut p = [q0, q1, q2, q3, q4];
                for (l, v) in p.iter_mut().enumerate() {
                    *v = _mm256_maddubs_epi16(top_trit(*v), load256(q8.add(32 * l)));
                }
                let mut sumi0 = _mm256_add_epi16(p[0], p[1]);
                let mut sumi1 = _mm256_add_epi16(p[2], p[3]);
                let mut sumi2 = p[4];
                // elements 160..240 (16 bytes of five digits) and 240..256 (4 bytes of four)
                let pairs = tq1_0_tail(wb);
                let mut p = [_mm256_setzero_si256(); 3];
                for (l, v) in pairs.into_iter().enumerate() {
                    p[l] = _mm256_maddubs_epi16(top_trit(v), load256(q8.add(160 + 32 * l)));
                }
                sumi0 = _mm256_add_epi16(sumi0, p[0]);
                sumi1 = _mm256_add_epi16(sumi1, p[1]);
                sumi2 = _mm256_add_epi16(sumi2, p[2]);
                // the digits 0..2 stand for -1..1: Σ q8 comes off once
                let ysum = load256(xb.add(4 + QK_K));
                let d = _mm256_set1_ps(f32_le(xb) * f16(wb.add(52)));
                let s = _mm256_sub_epi16(sumi0, ysum);
                let s = _mm256_add_epi16(s, _mm256_add_epi16(sumi1, sumi2));
                // gcc fuses ggml's mul + add here
                sumf = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pair_sums(s)), d, sumf);
            }
            hsum(sumf)
        }
    }

    #[inline(always)]
    unsafe fn tq2_0<const V: u8>(w: *const u8, x: *const u8, nb: usize) -> f32 {
        if V == 1 {
            // SAFETY: forwarded; V = 1 only in functions compiled for AVX-512 VNNI.
            return unsafe { ternary_zmm::tq2_0(w, x, nb) };
        }
        // SAFETY: nb blocks behind w and x (caller).
        unsafe {
            let m3 = _mm256_set1_epi8(3);
            let mut sumf = _mm256_setzero_ps();
            for i in 0..nb {
                let (wb, xb) = (w.add(i * 66), x.add(i * Q8_K_SIZE));
                prefetch_block::<66>(wb);
                let (mut sumi0, mut sumi1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                for j in (0..QK_K / 4).step_by(32) {
                    let q = load256(wb.add(j));
                    let y = xb.add(4 + 4 * j);
                    let v0 = _mm256_and_si256(q, m3);
                    let v1 = _mm256_and_si256(_mm256_srli_epi16::<2>(q), m3);
                    let v2 = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m3);
                    let v3 = _mm256_and_si256(_mm256_srli_epi16::<6>(q), m3);
                    let p0 = _mm256_maddubs_epi16(v0, load256(y));
                    let p1 = _mm256_maddubs_epi16(v1, load256(y.add(32)));
                    let p2 = _mm256_maddubs_epi16(v2, load256(y.add(64)));
                    let p3 = _mm256_maddubs_epi16(v3, load256(y.add(96)));
                    sumi0 = _mm256_add_epi16(sumi0, _mm256_add_epi16(p0, p1));
                    sumi1 = _mm256_add_epi16(sumi1, _mm256_add_epi16(p2, p3));
                }
                // the digits 0..2 stand for -1..1: Σ q8 comes off once
                let ysum = load256(xb.add(4 + QK_K));
                let d = _mm256_set1_ps(f32_le(xb) * f16(wb.add(64)));
                let s = _mm256_sub_epi16(_mm256_add_epi16(sumi0, sumi1), ysum);
                // gcc fuses ggml's mul + add here
                sumf = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pair_sums(s)), d, sumf);
            }
            hsum(sumf)
        }
    }

    /// tq1_0 and tq2_0 in 512-bit registers with `vpdpbusd`, for AVX-512 VNNI.
    ///
    /// ggml's AVX2 kernels sum each 32-byte group of a block's 256 activations into 16-bit
    /// lanes (bytes 2i, 2i+1 of every group into lane i), take the activations' sums off, and
    /// add lane pairs into eight i32 lanes before the one float step per block. Those sums are
    /// exact (|each| < 2^13 even with the invalid digit 3), so lane i of the eight is
    /// Σ over the groups of bytes 4i..4i+3 of w·y, minus bsums[2i] + bsums[2i+1], however it
    /// is grouped. Here every 512-bit register holds two groups, `vpdpbusd` adds four bytes
    /// into each i32 lane, and the halves are added at the end: the same eight integers, so
    /// the same float steps give the same bits, with about half the instructions.
    mod ternary_zmm {
        use std::arch::x86_64::*;

        use super::{f16, f32_le, hsum, load256, pair_sums, prefetch_block};
        use super::{times9, tq1_0_tail, Q8_K_SIZE, QK_K};

        #[inline(always)]
        unsafe fn ld(p: *const u8) -> __m512i {
            // SAFETY: 64 readable bytes at p (caller).
            unsafe { _mm512_loadu_si512(p as *const _) }
        }

        /// Two 32-byte groups, `lo` and `hi`, in one register.
        #[inline(always)]
        unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
            // SAFETY: register arithmetic only (AVX-512 F in the caller).
            unsafe { _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi) }
        }

        /// [`super::top_trit`] on 64 bytes.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw")]
        unsafe fn top_trit_zmm(q: __m512i) -> __m512i {
            // SAFETY: register arithmetic only (no memory, no stack, flags untouched).
            unsafe {
                let q0 = _mm512_subs_epu8(q, _mm512_set1_epi8(1));
                // `vpavgb` twice, written out as in `super::avg_twice`
                let (q, _t): (__m512i, __m512i);
                std::arch::asm!(
                    "vpxord {t:x}, {t:x}, {t:x}",
                    "vpavgb {t}, {q}, {t}",
                    "vpavgb {q}, {q}, {t}",
                    q = inout(zmm_reg) q0 => q,
                    t = out(zmm_reg) _t,
                    options(pure, nomem, nostack, preserves_flags),
                );
                _mm512_and_si512(_mm512_srli_epi16::<6>(q), _mm512_set1_epi8(3))
            }
        }

        /// The block's eight i32 lanes from its two-group sums and its activations' sums,
        /// into the float accumulator as ggml's kernel does (d·sum, fused into the add).
        #[inline(always)]
        unsafe fn finish(acc: __m512i, xb: *const u8, d_w: f32, sumf: __m256) -> __m256 {
            // SAFETY: a whole q8_K block at xb (caller); register arithmetic otherwise.
            unsafe {
                let s = _mm256_add_epi32(
                    _mm512_castsi512_si256(acc),
                    _mm512_extracti64x4_epi64::<1>(acc),
                );
                let s = _mm256_sub_epi32(s, pair_sums(load256(xb.add(4 + QK_K))));
                let d = _mm256_set1_ps(f32_le(xb) * d_w);
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, sumf)
            }
        }

        #[inline(always)]
        pub(super) unsafe fn tq1_0(w: *const u8, x: *const u8, nb: usize) -> f32 {
            // SAFETY: nb blocks behind w and x (caller); AVX-512 F/BW/VL + VNNI (caller).
            unsafe {
                let mut sumf = _mm256_setzero_ps();
                for i in 0..nb {
                    let (wb, xb) = (w.add(i * 54), x.add(i * Q8_K_SIZE));
                    prefetch_block::<54>(wb);
                    let y = xb.add(4);
                    // groups 0..5: the first 32 bytes' five digits (times 1, 3, 9, 27, 81)
                    let q0 = load256(wb);
                    let z01 = join(q0, _mm256_add_epi8(q0, _mm256_add_epi8(q0, q0)));
                    let z23 = _mm512_add_epi8(
                        _mm512_and_si512(_mm512_slli_epi16::<3>(z01), _mm512_set1_epi8(-8)),
                        z01,
                    );
                    let q4 = times9(_mm512_castsi512_si256(z23));
                    // groups 5..8: the next 16 bytes' five digits and the last 4 bytes' four
                    let [r01, r23, r45] = tq1_0_tail(wb);
                    let z45 = join(q4, r01);
                    let z67 = join(r23, r45);
                    let mut acc = _mm512_setzero_si512();
                    for (g, z) in [z01, z23, z45, z67].into_iter().enumerate() {
                        acc = _mm512_dpbusd_epi32(acc, top_trit_zmm(z), ld(y.add(64 * g)));
                    }
                    sumf = finish(acc, xb, f16(wb.add(52)), sumf);
                }
                hsum(sumf)
            }
        }

        #[inline(always)]
        pub(super) unsafe fn tq2_0(w: *const u8, x: *const u8, nb: usize) -> f32 {
            // SAFETY: nb blocks behind w and x (caller); AVX-512 F/BW/VL + VNNI (caller).
            unsafe {
                let m3 = _mm512_set1_epi8(3);
                // per 16-bit lane: digit 0 in the low half, 1 in the high (then 2 and 3)
                let s01 = join(_mm256_setzero_si256(), _mm256_set1_epi16(2));
                let s23 = join(_mm256_set1_epi16(4), _mm256_set1_epi16(6));
                let mut sumf = _mm256_setzero_ps();
                for i in 0..nb {
                    let (wb, xb) = (w.add(i * 66), x.add(i * Q8_K_SIZE));
                    prefetch_block::<66>(wb);
                    let y = xb.add(4);
                    let mut acc = _mm512_setzero_si512();
                    for c in 0..2 {
                        // 32 bytes of four digits against activations 128c .. 128c + 128
                        let q = _mm512_broadcast_i64x4(load256(wb.add(32 * c)));
                        let v01 = _mm512_and_si512(_mm512_srlv_epi16(q, s01), m3);
                        let v23 = _mm512_and_si512(_mm512_srlv_epi16(q, s23), m3);
                        acc = _mm512_dpbusd_epi32(acc, v01, ld(y.add(128 * c)));
                        acc = _mm512_dpbusd_epi32(acc, v23, ld(y.add(128 * c + 64)));
                    }
                    sumf = finish(acc, xb, f16(wb.add(64)), sumf);
                }
                hsum(sumf)
            }
        }
    }
}

#[cfg(test)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
mod tests {
    use super::*;

    /// The f16 table holds F16C's conversion of every bit pattern (NaN for NaN).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn f16_table_equals_the_hardware_conversion() {
        if !avx2::available() {
            return;
        }
        for b in 0..=u16::MAX {
            // SAFETY: F16C present (checked).
            let hw = unsafe { avx2::f16_bits(b) };
            let t = F16_TO_F32[b as usize];
            if hw.is_nan() {
                assert!(t.is_nan(), "{b:#06x}");
            } else {
                assert_eq!(t.to_bits(), hw.to_bits(), "{b:#06x}");
            }
        }
    }

    const TYPES: [DType; 11] = [
        DType::Q5_0,
        DType::Q5_1,
        DType::IQ4NL,
        DType::Q2K,
        DType::Q3K,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
        DType::IQ4XS,
        DType::TQ1_0,
        DType::TQ2_0,
    ];

    fn rng_bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 32) as u8
            })
            .collect()
    }

    /// Offsets of the f16 scales in a weight block.
    fn f16_fields(t: DType) -> &'static [usize] {
        match t {
            DType::Q5_0 | DType::IQ4NL | DType::IQ4XS => &[0],
            DType::Q5_1 | DType::Q4K | DType::Q5K => &[0, 2],
            DType::Q2K => &[80, 82],
            DType::Q3K => &[108],
            DType::Q6K => &[208],
            DType::TQ1_0 => &[52],
            DType::TQ2_0 => &[64],
            _ => unreachable!(),
        }
    }

    /// Random block bytes (every bit pattern of quants, scales and high bits) with scales near
    /// 1 and activations in q8's range (-127..127, q8_K's group sums consistent): the AVX2 path
    /// sums the scalar path's integers, so only the float grouping may differ.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx2_matches_scalar_on_random_blocks() {
        if !avx2::available() {
            return;
        }
        for t in TYPES {
            for (seed, k) in [(1u64, 256usize), (2, 512), (3, 2816)] {
                let nb = k / t.block_size();
                let (ts, xs) = (t.type_size(), act_block_size(t));
                let mut w = rng_bytes(nb * ts, seed);
                let mut x = rng_bytes(nb * xs, seed + 100);
                for b in 0..nb {
                    for &f in f16_fields(t) {
                        w[b * ts + f + 1] = 0x3c; // 1.0 .. 2.0
                    }
                    let xb = &mut x[b * xs..(b + 1) * xs];
                    let qs = if xs == Q8_K_SIZE {
                        4..4 + QK_K
                    } else {
                        xs - 32..xs
                    };
                    for v in &mut xb[qs] {
                        if *v == 0x80 {
                            *v = 0x81; // q8 never holds -128
                        }
                    }
                    if xs == Q8_K_SIZE {
                        xb[0..4].copy_from_slice(&0.01f32.to_le_bytes());
                        for g in 0..16 {
                            let s: i32 =
                                xb[4 + 16 * g..][..16].iter().map(|&v| v as i8 as i32).sum();
                            let at = 4 + QK_K + 2 * g;
                            xb[at..at + 2].copy_from_slice(&(s as i16).to_le_bytes());
                        }
                    } else {
                        xb[1] = 0x20; // d ≈ 0.008
                        xb[3] = 0x3c;
                    }
                }
                let want = scalar::vec_dot(t, &w, &x, nb);
                let got = vec_dot(Isa::Avx2, t, &w, &x, k);
                let mut wd = vec![0f32; k];
                let mut xd = vec![0f32; k];
                tessera_quants::dequantize_row(t.id(), &w, &mut wd).unwrap();
                let vdt = crate::ops::matmul_quant::vec_dot_type(t);
                tessera_quants::dequantize_row(vdt.id(), &x, &mut xd).unwrap();
                let mut mag: f64 = wd
                    .iter()
                    .zip(&xd)
                    .map(|(&a, &b)| (a as f64 * b as f64).abs())
                    .sum();
                if t == DType::Q5_1 {
                    mag += 4.0 * nb as f64; // m·s terms
                }
                // each path rounds at most 8 partial sums per block and the final lanes, every
                // rounding off by at most 2^-24 of a value bounded by Σ|terms|
                let tol = 2.0 * (8 * nb + 16) as f64 * f64::from(f32::EPSILON) / 2.0 * mag;
                assert!(
                    ((got - want) as f64).abs() <= tol,
                    "{t} k={k}: avx2 {got} vs scalar {want} (terms {mag})"
                );
                // the VNNI kernels (where the CPU has them; AVX2's otherwise) sum the same
                // integers: AVX2's bits, one row or many
                for isa in [Isa::Avx512, Isa::AvxVnni] {
                    let vnni = vec_dot(isa, t, &w, &x, k);
                    assert_eq!(
                        vnni.to_bits(),
                        got.to_bits(),
                        "{t} k={k}: {isa:?} {vnni} vs avx2 {got}"
                    );
                }
                let mut ww = w.clone();
                ww.extend(w.iter().map(|b| b ^ 0x5a));
                let (mut o2, mut o5) = ([0f32; 2], [0f32; 2]);
                vec_dot_rows(Isa::Avx2, t, &ww, nb * ts, &x, k, &mut o2);
                assert_eq!(o2[0].to_bits(), got.to_bits(), "{t} k={k}: rows vs one row");
                for isa in [Isa::Avx512, Isa::AvxVnni] {
                    vec_dot_rows(isa, t, &ww, nb * ts, &x, k, &mut o5);
                    assert_eq!(
                        o5.map(f32::to_bits),
                        o2.map(f32::to_bits),
                        "{t} k={k}: {isa:?} rows"
                    );
                }
            }
        }
    }

    /// `TESSERA_EXPECT_AVX512=1` (set where the tests run on an AVX-512 VNNI CPU, emulated or
    /// not) fails the run unless this process chose the VNNI kernels; `=0` unless it did not.
    #[test]
    fn vnni_kernels_run_where_expected() {
        let chosen = crate::simd::isa() == Isa::Avx512;
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            chosen,
            avx2::vnni_available() && std::env::var("TESSERA_ISA").is_err()
        );
        match std::env::var("TESSERA_EXPECT_AVX_VNNI").as_deref() {
            Ok("1") => assert!(
                crate::simd::avx_vnni_available(),
                "expected a CPU with AVX-VNNI (the Isa::AvxVnni kernels)"
            ),
            Ok("0") => assert!(
                !crate::simd::avx_vnni_available(),
                "did not expect AVX-VNNI"
            ),
            _ => eprintln!("AVX-VNNI: {}", crate::simd::avx_vnni_available()),
        }
        match std::env::var("TESSERA_EXPECT_AVX512").as_deref() {
            Ok("1") => assert!(
                chosen,
                "expected the AVX-512 VNNI kernels, ISA {:?}",
                crate::simd::isa()
            ),
            Ok("0") => assert!(!chosen, "did not expect the AVX-512 VNNI kernels"),
            _ => eprintln!("ISA chosen: {}", crate::simd::isa().name()),
        }
    }
}
