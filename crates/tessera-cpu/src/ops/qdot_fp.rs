//! Integer dot products (see `qdot`) for the weight types paired with q8_0 activations whose
//! blocks are not q8_0's 32 elements or whose scales are not f16: mxfp4 (32 E2M1 values, one
//! E8M0 exponent), nvfp4 (64 E2M1 values, four UE4M3 sub-block scales), q1_0 (128 signs, one
//! f16 scale) and q2_0 (64 values in -1..2, one f16 scale). One nvfp4 or q2_0 block meets two
//! q8_0 blocks, one q1_0 block four.
//!
//! As in `qdot`, two paths, each reproducing one of ggml's down to the last bit:
//! - scalar: ggml's portable code (`ggml-cpu/quants.c`, `ggml_vec_dot_<type>_q8_0_generic`) with
//!   C's evaluation order and no contraction of `a*b + c` into fused multiply-adds;
//! - AVX2 (`Isa::Avx2`, `Isa::AvxVnni` and `Isa::Avx512`): ggml's x86 AVX2 code (`ggml-cpu/arch/x86/quants.c`),
//!   the same exact integer sums in the same 32-bit lanes, the same fused multiply-adds and the
//!   same horizontal reduction. mxfp4 takes two blocks per step into two accumulators and an odd
//!   last block the generic way (gcc does not fuse that `sumf += d*sumi`); q2_0 has no x86 code
//!   and llama.cpp's AVX2 build runs the generic code, which gcc compiles without contraction
//!   there, so its AVX2 path has the scalar one's float steps, with the exact 32-element integer
//!   sums in vector registers (as gcc vectorizes them). (Checked against llama.cpp's `libggml-cpu` in
//!   `tests/qdot_fp.rs`.) Under `Isa::Avx512` on a CPU with VNNI, mxfp4, nvfp4 and q1_0 take
//!   the same loops with one `vpdpbusd` for each `vpmaddubsw` + `vpmaddwd` pair: the same i32
//!   lanes, so the same results.
//!
//! `qdot::vec_dot_rows` takes nvfp4 rows two at a time (`avx2_rows_kernel`): each row keeps
//! its own accumulator and its own order of operations, so every result is the one-row
//! kernel's, but the two chains of dependent FMAs overlap (checked against llama.cpp's values
//! at every position of one to five rows in `tests/qdot_fp.rs`).
//!
//! The E2M1 codes go through `kvalues_fp4` (the values doubled, so integers) and the block
//! scales are halved to match, exactly as ggml does; every scale conversion is exact.

use tessera::DType;

use crate::ops::qdot::{f16_at, IntSums, ScalarSums, ONES8};
use crate::simd::Isa;

/// Bytes of one q8_0 block: f16 scale, 32 signed quants.
const Q8_0_SIZE: usize = 34;

/// ggml's `kvalues_fp4`: the E2M1 values doubled (bit 3 is the sign).
pub(crate) const KVALUES_FP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Weight types with an integer kernel here.
pub fn supported(t: DType) -> bool {
    matches!(t, DType::MXFP4 | DType::NVFP4 | DType::Q1_0 | DType::Q2_0)
}

/// The AVX2 kernel [`vec_dot`] runs for `t` on `isa`, for callers that loop over rows; `None`
/// where `vec_dot` takes another path (q2_0's generic code included).
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx2_kernel(isa: Isa, t: DType) -> Option<crate::ops::qdot::RowKernel> {
    (supported(t)
        && t != DType::Q2_0
        && matches!(isa, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512)
        && avx2::available())
    .then(|| avx2::kernel(isa, t))
}

/// A several-row kernel: the dots of `n` weight rows of `nb` blocks, `stride` bytes apart from
/// the first pointer, with the activation blocks at the second, into the `n` f32 at `out`.
///
/// Safety: the pointers hold that much, and the CPU has the features the kernel was chosen
/// for.
#[cfg(target_arch = "x86_64")]
pub(crate) type RowsKernel = unsafe fn(*const u8, usize, *const u8, usize, *mut f32, usize);

/// The AVX2 several-row kernel for `t` on `isa` (nvfp4: two rows at a time, each row's bits
/// those of [`vec_dot`]); `None` where rows go one at a time through [`avx2_kernel`].
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx2_rows_kernel(isa: Isa, t: DType) -> Option<RowsKernel> {
    (matches!(isa, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512) && avx2::available())
        .then(|| avx2::rows_kernel(isa, t))
        .flatten()
}

/// Dot of `nb` blocks of weight type `t` with the `nb · t.block_size() / 32` q8_0 blocks they
/// meet. The scalar path is ggml's generic code, the AVX2 path (when the CPU has AVX2, FMA and
/// F16C) what llama.cpp's AVX2 build computes.
///
/// Panics if `t` is not [`supported`] or a row is shorter than `nb` blocks' worth.
pub fn vec_dot(isa: Isa, t: DType, w: &[u8], x: &[u8], nb: usize) -> f32 {
    assert!(supported(t), "qdot_fp: no integer kernel for {t}");
    let acts = nb * (t.block_size() / 32);
    assert!(
        w.len() >= nb * t.type_size() && x.len() >= acts * Q8_0_SIZE,
        "qdot_fp: rows of {} and {} bytes for {nb} blocks of {t}",
        w.len(),
        x.len()
    );
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512) && avx2::available() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked just above); w and x hold at least nb
        // weight blocks and the q8_0 blocks they meet (asserted above), all the kernels read.
        return unsafe {
            if t == DType::Q2_0 {
                // ggml's generic code (llama.cpp's AVX2 build runs it), its exact integer
                // sums in vector registers
                avx2::generic_q2_0(w, x, nb)
            } else {
                avx2::vec_dot(isa, t, w, x, nb)
            }
        };
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon {
        return scalar::vec_dot::<super::qdot_neon::NeonSums>(t, w, x, nb);
    }
    let _ = isa;
    scalar::vec_dot::<ScalarSums>(t, w, x, nb)
}

/// Half of the E8M0 scale, 2^(e−128), as ggml's `GGML_E8M0_TO_FP32_HALF` (subnormal for e < 2).
pub(crate) fn e8m0_half(e: u8) -> f32 {
    E8M0_HALF[e as usize]
}

/// Half of the UE4M3 scale, as ggml's `ggml_ue4m3_to_fp32` (bias 7, three mantissa bits, 0 and
/// 0x7F give 0, bit 7 is ignored). Every step is exact.
fn ue4m3_half(x: u8) -> f32 {
    UE4M3_HALF[x as usize]
}

/// [`e8m0_half`] of every byte (a load instead of a branch in the kernels' block loop).
static E8M0_HALF: [f32; 256] = {
    let mut t = [0f32; 256];
    let mut e = 0;
    while e < 256 {
        t[e] = f32::from_bits(if e < 2 {
            0x0020_0000 << e
        } else {
            ((e - 1) as u32) << 23
        });
        e += 1;
    }
    t
};

/// [`ue4m3_half`] of every byte: nvfp4's kernel converts four scales a block, and the
/// branches and multiplies of the conversion cost as much as the block's products.
static UE4M3_HALF: [f32; 256] = {
    let mut t = [0f32; 256];
    let mut i = 0;
    while i < 256 {
        let x = i as u8;
        if x != 0 && x != 0x7F {
            let (exp, man) = (((x >> 3) & 15) as i32, (x & 7) as f32);
            let raw = if exp == 0 {
                man * f32::from_bits(((-9 + 127) as u32) << 23)
            } else {
                (1.0 + man / 8.0) * f32::from_bits(((exp - 7 + 127) as u32) << 23)
            };
            t[i] = raw * 0.5;
        }
        i += 1;
    }
    t
};

/// Σ y[j]·kvalues[lo nibble of q[j]] and Σ y[j + n]·kvalues[hi nibble of q[j]], n = q.len().
pub(crate) fn fp4_sums(q: &[u8], y: &[u8]) -> (i32, i32) {
    let n = q.len();
    let (mut lo, mut hi) = (0i32, 0i32);
    for j in 0..n {
        lo += y[j] as i8 as i32 * KVALUES_FP4[(q[j] & 15) as usize] as i32;
        hi += y[j + n] as i8 as i32 * KVALUES_FP4[(q[j] >> 4) as usize] as i32;
    }
    (lo, hi)
}

/// ggml's generic kernels, one function per type, each over pairs of (weight block, the q8_0
/// blocks it meets).
mod scalar {
    use super::*;

    pub fn vec_dot<I: IntSums>(t: DType, w: &[u8], x: &[u8], nb: usize) -> f32 {
        let ts = t.type_size();
        let xs = (t.block_size() / 32) * Q8_0_SIZE;
        let blocks = w[..nb * ts]
            .chunks_exact(ts)
            .zip(x[..nb * xs].chunks_exact(xs));
        match t {
            DType::MXFP4 => mxfp4::<I>(blocks),
            DType::NVFP4 => nvfp4::<I>(blocks),
            DType::Q1_0 => q1_0::<I>(blocks),
            DType::Q2_0 => q2_0::<I>(blocks),
            _ => unreachable!("checked by the caller"),
        }
    }

    use crate::ops::qdot::scalar::Blocks;

    fn mxfp4<I: IntSums>(blocks: Blocks) -> f32 {
        let mut sumf = 0f32;
        for (wb, xb) in blocks {
            let d = f16_at(xb, 0) * e8m0_half(wb[0]);
            let (s1, s2) = I::fp4_sums(&wb[1..17], &xb[2..34]);
            sumf += d * (s1 + s2) as f32;
        }
        sumf
    }

    fn nvfp4<I: IntSums>(blocks: Blocks) -> f32 {
        let mut sumf = 0f32;
        for (wb, xb) in blocks {
            for s in 0..4 {
                let d = ue4m3_half(wb[s]);
                let yb = &xb[(s / 2) * Q8_0_SIZE..][..Q8_0_SIZE];
                let dy = f16_at(yb, 0);
                let off = 2 + (s % 2) * 16;
                let (lo, hi) = I::fp4_sums(&wb[4 + 8 * s..][..8], &yb[off..off + 16]);
                sumf += dy * d * (lo + hi) as f32;
            }
        }
        sumf
    }

    fn q1_0<I: IntSums>(blocks: Blocks) -> f32 {
        let mut sumf = 0f32;
        for (wb, xb) in blocks {
            let d0 = f16_at(wb, 0);
            let mut sumi = 0f32;
            for (k, yb) in xb.chunks_exact(Q8_0_SIZE).enumerate() {
                let bits = &wb[2 + 4 * k..][..4];
                // bit e of the block's 32 is element e's sign: set +y, clear −y
                let minus = [0, 1, 2, 3].map(|l| !bits[l]);
                let [a, b] = I::dot32([ONES8; 4], minus, &yb[2..34]);
                let s = a + b;
                sumi += f16_at(yb, 0) * s as f32;
            }
            sumf += d0 * sumi;
        }
        sumf
    }

    fn q2_0<I: IntSums>(blocks: Blocks) -> f32 {
        let mut sumf = 0f32;
        for (wb, xb) in blocks {
            let d0 = f16_at(wb, 0);
            let mut sumi = 0f32;
            for (k, yb) in xb.chunks_exact(Q8_0_SIZE).enumerate() {
                // element e: bits 2(e mod 4).. of byte e/4, 0..3 meaning -1..2
                let s = I::q2_sum(&wb[2 + 8 * k..][..8], &yb[2..34]);
                sumi += f16_at(yb, 0) * s as f32;
            }
            sumf += d0 * sumi;
        }
        sumf
    }
}

// The `unsafe` blocks around register arithmetic date from a minimum Rust version (1.85)
// before intrinsics were safe inside `#[target_feature]` functions (1.87).
#[cfg(target_arch = "x86_64")]
#[allow(unused_unsafe)]
mod avx2 {
    //! Every kernel reads `nb` weight blocks and the q8_0 blocks they meet behind its two
    //! pointers and nothing else; the callers guarantee they are there and that the CPU has
    //! AVX2, FMA and F16C.

    use std::arch::x86_64::*;

    // the helpers the integer kernels share
    use crate::ops::qdot::avx2::{hsum, load128, load256, prefetch_block};

    /// The f16 at `p` through [`crate::ops::qdot::F16_TO_F32`] (a table load the compiler
    /// folds into the broadcast that follows).
    #[inline(always)]
    unsafe fn f16(p: *const u8) -> f32 {
        // SAFETY: two readable bytes at p (caller).
        let bits = unsafe { (p as *const u16).read_unaligned() };
        // (a u16 always indexes the 65536 entries: no bounds check is emitted)
        crate::ops::qdot::F16_TO_F32[bits as usize]
    }

    use super::*;

    pub use crate::ops::qdot::avx2::available;

    /// q2_0 as ggml's generic code computes it (the float steps of `scalar::q2_0`, in order
    /// and unfused), each 32-element integer sum from [`Avx2Sums`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn generic_q2_0(w: &[u8], x: &[u8], nb: usize) -> f32 {
        scalar::vec_dot::<Avx2Sums>(DType::Q2_0, w, x, nb)
    }

    /// [`IntSums`] with AVX2 where it pays (q2_0's sums; the rest element by element).
    struct Avx2Sums;

    impl IntSums for Avx2Sums {
        fn dot32(g: [u64; 4], s: [u8; 4], q8: &[u8]) -> [i32; 2] {
            ScalarSums::dot32(g, s, q8)
        }

        fn fp4_sums(q: &[u8], y: &[u8]) -> (i32, i32) {
            ScalarSums::fp4_sums(q, y)
        }

        #[inline(always)]
        fn q2_sum(qs: &[u8], y: &[u8]) -> i32 {
            assert!(qs.len() >= 8 && y.len() >= 32, "q2_sum: a short block");
            // SAFETY: 8 and 32 readable bytes (asserted); only called from `generic_q2_0`,
            // compiled for AVX2.
            unsafe { q2_sum(qs.as_ptr(), y.as_ptr()) }
        }
    }

    /// Σ (code e − 1)·y[e] over 32 elements, code e at bit 2(e mod 4) of byte e / 4: the codes
    /// of bytes 0..4 (then 4..8) spread over the four dwords of the low (high) half, shifted by
    /// 0, 2, 4, 6 (dword j, byte b: element 4b + j of the half), the activations transposed to
    /// match, then Σ code·y − Σ y (exact).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q2_sum(qs: *const u8, y: *const u8) -> i32 {
        // SAFETY: 8 bytes at qs and 32 at y (caller).
        unsafe {
            let lo = (qs as *const i32).read_unaligned();
            let hi = (qs.add(4) as *const i32).read_unaligned();
            let spread = _mm256_set_epi32(hi, hi, hi, hi, lo, lo, lo, lo);
            let codes = _mm256_and_si256(
                _mm256_srlv_epi32(spread, _mm256_set_epi32(6, 4, 2, 0, 6, 4, 2, 0)),
                _mm256_set1_epi8(3),
            );
            let yv = load256(y);
            // byte 4j + b of each half takes element 4b + j
            let tr = _mm256_setr_epi8(
                0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13, 2,
                6, 10, 14, 3, 7, 11, 15,
            );
            let yt = _mm256_shuffle_epi8(yv, tr);
            let ones16 = _mm256_set1_epi16(1);
            let cy = _mm256_madd_epi16(_mm256_maddubs_epi16(codes, yt), ones16);
            let sy = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), yv), ones16);
            let d = _mm256_sub_epi32(cy, sy);
            let d = _mm_add_epi32(_mm256_castsi256_si128(d), _mm256_extracti128_si256::<1>(d));
            let d = _mm_add_epi32(d, _mm_unpackhi_epi64(d, d));
            _mm_cvtsi128_si32(_mm_add_epi32(d, _mm_shuffle_epi32::<1>(d)))
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(isa: crate::simd::Isa, t: DType, w: &[u8], x: &[u8], nb: usize) -> f32 {
        // SAFETY: the caller guarantees nb blocks of t and the q8_0 blocks they meet behind w
        // and x, and the CPU features every kernel is compiled for (`kernel` checks VNNI).
        unsafe { kernel(isa, t)(w.as_ptr(), x.as_ptr(), nb) }
    }

    /// The kernel for `t` (mxfp4, nvfp4 or q1_0) under `isa`: with AVX-512 VNNI where `isa`
    /// asks for AVX-512 and the CPU has it (`vpdpbusd` for each `vpmaddubsw` + `vpmaddwd`
    /// pair: the same i32 lanes, so the same results), else AVX2.
    pub fn kernel(isa: crate::simd::Isa, t: DType) -> crate::ops::qdot::RowKernel {
        let vnni = crate::ops::qdot::avx2::uses_vnni(isa);
        match t {
            DType::MXFP4 if vnni => mxfp4_vnni,
            DType::NVFP4 if vnni => nvfp4_vnni,
            DType::Q1_0 if vnni => q1_0_vnni,
            DType::MXFP4 => mxfp4,
            DType::NVFP4 => nvfp4,
            DType::Q1_0 => q1_0,
            _ => unreachable!("checked by the caller"),
        }
    }

    /// Signed bytes x·y summed in fours into 8 i32 lanes (ggml's `mul_add_epi8`, |x| as unsigned
    /// times y with x's sign, then pairs of i16 summed; one `vpdpbusd` for `V` = 1).
    #[inline(always)]
    unsafe fn dot_fours<const V: u8>(x: __m256i, y: __m256i) -> __m256i {
        // SAFETY: register arithmetic only; V = 1 only inside functions compiled for AVX-512
        // VNNI.
        unsafe { crate::ops::qdot::avx2::dot4_i8::<V>(x, y) }
    }

    /// 16 bytes of E2M1 codes through `kvalues_fp4`: (low nibbles, high nibbles).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn fp4_values(p: *const u8) -> (__m128i, __m128i) {
        // SAFETY: 16 readable bytes at p (caller); the table is 16 bytes.
        unsafe {
            let values = load128(KVALUES_FP4.as_ptr() as *const u8);
            let q = load128(p);
            let m4 = _mm_set1_epi8(15);
            (
                _mm_shuffle_epi8(values, _mm_and_si128(q, m4)),
                _mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16::<4>(q), m4)),
            )
        }
    }

    /// The integer lanes of one mxfp4 block against its q8_0 block (elements j and j + 16 are
    /// qs[j]'s low and high nibble).
    #[inline(always)]
    unsafe fn mxfp4_lanes<const V: u8>(wb: *const u8, xb: *const u8) -> __m256 {
        // SAFETY: one block of each behind wb and xb (caller).
        unsafe {
            let (lo, hi) = fp4_values(wb.add(1));
            _mm256_cvtepi32_ps(dot_fours::<V>(_mm256_set_m128i(hi, lo), load256(xb.add(2))))
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn mxfp4(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: forwarded.
        unsafe { mxfp4_body::<0>(w, x, nb) }
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn mxfp4_vnni(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: forwarded; the CPU has AVX-512 VNNI (`kernel`).
        unsafe { mxfp4_body::<1>(w, x, nb) }
    }

    #[inline(always)]
    unsafe fn mxfp4_body<const V: u8>(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: nb blocks behind w and x (caller).
        unsafe {
            let (mut acc1, mut acc2) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut i = 0;
            // two blocks per step, each into its own accumulator
            while i + 1 < nb {
                let (w1, x1) = (w.add(i * 17), x.add(i * Q8_0_SIZE));
                let (w2, x2) = (w1.add(17), x1.add(Q8_0_SIZE));
                let d1 = f16(x1) * e8m0_half(*w1);
                let d2 = f16(x2) * e8m0_half(*w2);
                acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d1), mxfp4_lanes::<V>(w1, x1), acc1);
                acc2 = _mm256_fmadd_ps(_mm256_set1_ps(d2), mxfp4_lanes::<V>(w2, x2), acc2);
                i += 2;
            }
            let mut sumf = hsum(_mm256_add_ps(acc1, acc2));
            // an odd last block the generic way (gcc does not fuse this one)
            if i < nb {
                let wb = std::slice::from_raw_parts(w.add(i * 17), 17);
                let xb = std::slice::from_raw_parts(x.add(i * Q8_0_SIZE), Q8_0_SIZE);
                let d = f16_at(xb, 0) * e8m0_half(wb[0]);
                let (s1, s2) = fp4_sums(&wb[1..17], &xb[2..34]);
                sumf += d * (s1 + s2) as f32;
            }
            sumf
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn nvfp4(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: forwarded.
        unsafe { nvfp4_body::<0>(w, x, nb) }
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn nvfp4_vnni(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: forwarded; the CPU has AVX-512 VNNI (`kernel`).
        unsafe { nvfp4_body::<1>(w, x, nb) }
    }

    /// 16 bytes of E2M1 codes (two nvfp4 sub-blocks) through `kvalues_fp4`, in ggml's order
    /// for them: the low lane holds the first sub-block (the low nibbles of bytes 0..8, then
    /// their high nibbles), the high lane the second (bytes 8..16). Built from a 128-bit
    /// broadcast load, one in-lane shuffle and a per-qword shift where the unpacks and the
    /// lane insert of ggml's loop take the shuffle port.
    #[inline(always)]
    unsafe fn nvfp4_codes(p: *const u8, values: __m256i) -> __m256i {
        // SAFETY: 16 readable bytes at p (caller); register arithmetic otherwise.
        unsafe {
            let q = _mm256_broadcastsi128_si256(load128(p));
            // each lane's qwords: its eight bytes twice, the second copy shifted by a nibble
            let dup = _mm256_setr_epi8(
                0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 8, 9,
                10, 11, 12, 13, 14, 15,
            );
            let q = _mm256_srlv_epi64(_mm256_shuffle_epi8(q, dup), _mm256_setr_epi64x(0, 4, 0, 4));
            _mm256_shuffle_epi8(values, _mm256_and_si256(q, _mm256_set1_epi8(15)))
        }
    }

    /// [`ue4m3_half`] of the bytes at `d` and `d + 1`, each in four lanes (low, then high).
    #[inline(always)]
    unsafe fn scale_pair(d: *const u8) -> __m256 {
        // SAFETY: two readable bytes at d (caller).
        unsafe {
            _mm256_blend_ps::<0xF0>(
                _mm256_set1_ps(ue4m3_half(*d)),
                _mm256_set1_ps(ue4m3_half(*d.add(1))),
            )
        }
    }

    /// `R` weight rows of `nb` blocks each (at `w[r]`) against one activation row: each row
    /// the same lanes, the same FMAs in ggml's order and the same reduction as ggml's one-row
    /// loop, so the same bits, but `R` independent accumulators. One row is bound by its
    /// accumulator (two dependent FMAs a block, 8 cycles); with two rows the shuffles bound
    /// it instead. The activation loads and their scales are shared; each row asks for its
    /// weights `PREFETCH_AHEAD` bytes ahead (`qdot::avx2::prefetch_block`).
    #[inline(always)]
    unsafe fn nvfp4_rows_r<const V: u8, const R: usize>(
        w: [*const u8; R],
        x: *const u8,
        nb: usize,
    ) -> [f32; R] {
        // SAFETY: nb blocks behind every w[r] and 2·nb q8_0 blocks behind x (caller).
        unsafe {
            let values = _mm256_broadcastsi128_si256(load128(KVALUES_FP4.as_ptr() as *const u8));
            let mut acc = [_mm256_setzero_ps(); R];
            for i in 0..nb {
                let y0 = x.add(2 * i * Q8_0_SIZE);
                let y1 = y0.add(Q8_0_SIZE);
                let (ya, yb) = (load256(y0.add(2)), load256(y1.add(2)));
                let (dy0, dy1) = (_mm256_set1_ps(f16(y0)), _mm256_set1_ps(f16(y1)));
                for r in 0..R {
                    let wb = w[r].add(i * 36);
                    prefetch_block::<36>(wb);
                    // sub-blocks 0 and 1 (qs 0..16) meet q8_0 block 0, 2 and 3 block 1
                    let q01 = nvfp4_codes(wb.add(4), values);
                    let q23 = nvfp4_codes(wb.add(20), values);
                    let p1 = _mm256_cvtepi32_ps(dot_fours::<V>(q01, ya));
                    let p2 = _mm256_cvtepi32_ps(dot_fours::<V>(q23, yb));
                    // ggml's s_k = ue4m3(d_k)·dy (the same products, lane by lane), from
                    // broadcast table loads and a blend rather than scalar products and lane
                    // inserts
                    let sc01 = _mm256_mul_ps(scale_pair(wb), dy0);
                    let sc23 = _mm256_mul_ps(scale_pair(wb.add(2)), dy1);
                    acc[r] = _mm256_fmadd_ps(sc01, p1, acc[r]);
                    acc[r] = _mm256_fmadd_ps(sc23, p2, acc[r]);
                }
            }
            acc.map(|a| hsum(a))
        }
    }

    #[inline(always)]
    unsafe fn nvfp4_body<const V: u8>(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: forwarded.
        unsafe { nvfp4_rows_r::<V, 1>([w], x, nb)[0] }
    }

    /// `n` rows `stride` bytes apart into `out[..n]`: row q with row q + n/2 (two long runs
    /// through memory rather than two short ones), an odd last row alone.
    #[inline(always)]
    unsafe fn nvfp4_rows_body<const V: u8>(
        w: *const u8,
        stride: usize,
        x: *const u8,
        nb: usize,
        out: *mut f32,
        n: usize,
    ) {
        // SAFETY: n rows of nb blocks behind w, stride apart; 2·nb q8_0 blocks behind x; n
        // writable f32 at out (caller).
        unsafe {
            let h = n / 2;
            for q in 0..h {
                let [a, b] =
                    nvfp4_rows_r::<V, 2>([w.add(q * stride), w.add((q + h) * stride)], x, nb);
                *out.add(q) = a;
                *out.add(q + h) = b;
            }
            if n % 2 == 1 {
                *out.add(n - 1) = nvfp4_body::<V>(w.add((n - 1) * stride), x, nb);
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn nvfp4_rows(
        w: *const u8,
        stride: usize,
        x: *const u8,
        nb: usize,
        out: *mut f32,
        n: usize,
    ) {
        // SAFETY: forwarded.
        unsafe { nvfp4_rows_body::<0>(w, stride, x, nb, out, n) }
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn nvfp4_rows_vnni(
        w: *const u8,
        stride: usize,
        x: *const u8,
        nb: usize,
        out: *mut f32,
        n: usize,
    ) {
        // SAFETY: forwarded; the CPU has AVX-512 VNNI (`rows_kernel`).
        unsafe { nvfp4_rows_body::<1>(w, stride, x, nb, out, n) }
    }

    /// The several-row kernel for `t` under `isa` (nvfp4 only), as [`kernel`] chooses.
    pub fn rows_kernel(isa: crate::simd::Isa, t: DType) -> Option<RowsKernel> {
        let vnni = crate::ops::qdot::avx2::uses_vnni(isa);
        match t {
            DType::NVFP4 if vnni => Some(nvfp4_rows_vnni),
            DType::NVFP4 => Some(nvfp4_rows),
            _ => None,
        }
    }

    /// The integer lanes of one q1_0 quarter (32 sign bits at `bits`) against one q8_0 block:
    /// each quant negated (two's complement, in bytes) where its bit is clear, summed in fours.
    #[inline(always)]
    unsafe fn q1_lanes<const V: u8>(bits: *const u8, yb: *const u8) -> __m256 {
        // SAFETY: four readable bytes at bits, one q8_0 block at yb (caller).
        unsafe {
            let v = (bits as *const i32).read_unaligned();
            // byte e gets bits byte e/8, then only bit e mod 8 of it
            let spread = _mm256_shuffle_epi8(
                _mm256_set1_epi32(v),
                _mm256_set_epi64x(
                    0x0303_0303_0303_0303,
                    0x0202_0202_0202_0202,
                    0x0101_0101_0101_0101,
                    0,
                ),
            );
            let bit = _mm256_and_si256(spread, _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64));
            let neg = _mm256_cmpeq_epi8(bit, _mm256_setzero_si256());
            let qy = load256(yb.add(2));
            let sy = _mm256_sub_epi8(_mm256_xor_si256(qy, neg), neg);
            _mm256_cvtepi32_ps(crate::ops::qdot::avx2::dot4::<V>(_mm256_set1_epi8(1), sy))
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q1_0(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: forwarded.
        unsafe { q1_0_body::<0>(w, x, nb) }
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn q1_0_vnni(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: forwarded; the CPU has AVX-512 VNNI (`kernel`).
        unsafe { q1_0_body::<1>(w, x, nb) }
    }

    #[inline(always)]
    unsafe fn q1_0_body<const V: u8>(w: *const u8, x: *const u8, nb: usize) -> f32 {
        // SAFETY: nb blocks behind w and 4·nb q8_0 blocks behind x (caller).
        unsafe {
            let mut acc = _mm256_setzero_ps();
            for i in 0..nb {
                let (wb, yb) = (w.add(i * 18), x.add(4 * i * Q8_0_SIZE));
                let mut block =
                    _mm256_mul_ps(_mm256_set1_ps(f16(yb)), q1_lanes::<V>(wb.add(2), yb));
                for k in 1..4 {
                    let y = yb.add(k * Q8_0_SIZE);
                    let lanes = q1_lanes::<V>(wb.add(2 + 4 * k), y);
                    block = _mm256_fmadd_ps(_mm256_set1_ps(f16(y)), lanes, block);
                }
                acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(wb)), block, acc);
            }
            hsum(acc)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scales against ggml's definitions, computed another way.
    #[test]
    fn scale_decoders() {
        for e in 0..=255u8 {
            let want = 2f64.powi(e as i32 - 128);
            assert_eq!(e8m0_half(e) as f64, want, "e8m0 {e}");
        }
        for x in 0..=255u8 {
            let (exp, man) = (((x >> 3) & 15) as i32, (x & 7) as f64);
            let want = if x == 0 || x == 0x7F {
                0.0
            } else if exp == 0 {
                man / 512.0 / 2.0
            } else {
                (8.0 + man) / 8.0 * 2f64.powi(exp - 7) / 2.0
            };
            assert_eq!(ue4m3_half(x) as f64, want, "ue4m3 {x:#x}");
        }
    }
}
