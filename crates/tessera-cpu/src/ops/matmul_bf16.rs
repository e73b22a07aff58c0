//! mul_mat for bf16 weights on CPUs with AVX-512 BF16 (`vdpbf16ps`: 16 lanes, each adding two
//! bf16 products to an f32 accumulator per instruction). Used by `matmul` under `Isa::Avx512`
//! when the CPU also has AVX512_BF16 (Cooper Lake, Sapphire Rapids and later, Zen 4 and later);
//! elsewhere bf16 weights take the AVX2/FMA path, which widens them to f32.
//!
//! As in ggml (`ggml_vec_dot_bf16` and llamafile's tinyBLAS under `__AVX512BF16__`), the
//! activations are first rounded to bf16 (`matmul::compute` does that for every ISA) and each
//! pair of elements `(2j, 2j+1)` of a 32-element step lands in lane `j`, the odd product added
//! before the even one, each addition rounded to nearest even, with bf16 denormals read as zero
//! and denormal sums flushed to zero (the instruction's fixed rules; MXCSR is not consulted).
//! So a sum differs from the AVX2 path's in its last bits (a different order of f32 additions),
//! never in the products, which are exact in f32.
//!
//! Only the mat-vec (`dot_rows`, up to `MV_MAX_N` columns) uses it: two accumulators per
//! column over alternating 32-element steps (ggml's `c1`/`c2`), a masked last step, and a fixed
//! reduction: the two accumulators added, the 512-bit vector folded to 256 bits (low + high
//! half) and then to one value as the AVX2 path's `hsum` does. [`dot_emulated`] computes the
//! same thing in plain Rust, bit for bit; the tests compare the two.
//!
//! Where it pays, measured on a Xeon with AVX512_BF16 (`tessera bench-ops --only quant --types
//! bf16`, three runs alternating with `TESSERA_ISA=avx2`): the mat-vec streams bf16 weights
//! 1.5–2× faster than the AVX2 path (1536×576 on one thread: 21–33 against 13–19 GB/s). A GEMM built on
//! `vdpbf16ps` (written, tested bit for bit against an emulation like this one, then removed)
//! ran at the AVX2 GEMM's speed, 67 GFLOP/s on one thread, because this CPU retires one
//! `vdpbf16ps` every two cycles; widening bf16 to f32 while packing and running the AVX-512
//! f32 micro-kernel (`matmul::avx512`, two 512-bit FMAs a cycle) reaches 115. So bf16 GEMMs
//! take that path.

use crate::simd::Isa;

/// Whether bf16 weights take this module's kernels under `isa`: the CPU has AVX512_BF16 and
/// the backend runs AVX-512 (`TESSERA_ISA=avx2`, or `CpuBackend::with_isa(_, Isa::Avx2)`,
/// keeps the AVX2 path).
pub fn available(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        isa == Isa::Avx512
            && *HAS.get_or_init(|| {
                is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512dq")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512bf16")
            })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// The bf16 bits of `v` (an f32 the caller has already rounded to bf16: exact).
#[inline(always)]
fn bf16_bits(v: f32) -> u32 {
    v.to_bits() >> 16
}

/// `vdpbf16ps`'s value of a bf16 operand: denormals read as zero.
fn daz(bits: u16) -> f32 {
    let v = f32::from_bits((bits as u32) << 16);
    if v != 0.0 && v.abs() < f32::MIN_POSITIVE {
        0.0f32.copysign(v)
    } else {
        v
    }
}

/// One lane of `vdpbf16ps`: `acc + x·y` rounded to nearest even (the product of two bf16 is
/// exact in f32), a denormal result flushed to zero.
fn dp_step(acc: f32, x: u16, y: u16) -> f32 {
    let r = acc + daz(x) * daz(y);
    if r != 0.0 && r.abs() < f32::MIN_POSITIVE {
        0.0f32.copysign(r)
    } else {
        r
    }
}

/// The mat-vec kernel's value of `Σ_i a[i] · b[i]` computed in plain Rust with
/// `vdpbf16ps`'s rules and the kernel's order (see the module doc): what [`dot_rows`] returns,
/// bit for bit. `a` holds bf16 bits, `b` f32 values already rounded to bf16.
pub fn dot_emulated(a: &[u16], b: &[f32]) -> f32 {
    let k = a.len().min(b.len());
    let mut acc = [[0f32; 16]; 2];
    for (step, i0) in (0..k).step_by(32).enumerate() {
        let lanes = &mut acc[step % 2];
        let at = |i: usize| -> (u16, u16) {
            if i < k {
                (a[i], bf16_bits(b[i]) as u16)
            } else {
                (0, 0)
            }
        };
        for (j, l) in lanes.iter_mut().enumerate() {
            let (xo, yo) = at(i0 + 2 * j + 1);
            let (xe, ye) = at(i0 + 2 * j);
            *l = dp_step(dp_step(*l, xo, yo), xe, ye);
        }
    }
    let mut v = [0f32; 16];
    for (j, x) in v.iter_mut().enumerate() {
        *x = acc[0][j] + acc[1][j];
    }
    let mut h = [0f32; 8];
    for (j, x) in h.iter_mut().enumerate() {
        *x = v[j] + v[j + 8];
    }
    // the AVX2 `hsum`: 128-bit halves, then movehl, then the two last lanes
    let q = [h[0] + h[4], h[1] + h[5], h[2] + h[6], h[3] + h[7]];
    let p = [q[0] + q[2], q[1] + q[3]];
    p[0] + p[1]
}

#[cfg(target_arch = "x86_64")]
pub use x86::dot_rows;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use crate::ops::matmul::MV_MAX_N;
    use std::arch::x86_64::*;

    /// 32 bf16 values in a register as `vdpbf16ps` reads them.
    #[inline(always)]
    unsafe fn bh(v: __m512i) -> __m512bh {
        // SAFETY: both are 512 bits of plain data.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
    }

    /// The kernel's fixed reduction of two accumulators (see the module doc).
    #[inline(always)]
    unsafe fn reduce(a: __m512, b: __m512) -> f32 {
        // SAFETY: register arithmetic; the caller enabled AVX-512F.
        unsafe {
            let v = _mm512_add_ps(a, b);
            let h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps::<1>(v));
            let lo = _mm256_castps256_ps128(h);
            let hi = _mm256_extractf128_ps::<1>(h);
            let s = _mm_add_ps(lo, hi);
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
            _mm_cvtss_f32(s)
        }
    }

    /// `out[j] = Σ_i a[i] · b_j[i]` for one bf16 row against up to `MV_MAX_N` f32 columns
    /// holding bf16-rounded values; equals [`super::dot_emulated`] bit for bit.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/DQ and BF16 ([`super::available`]); `a` points at `k` bf16
    /// values and each `b[j]` at `k` f32; `out.len() == b.len() <= MV_MAX_N`.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")]
    pub unsafe fn dot_rows(a: *const u16, b: &[*const f32], k: usize, out: &mut [f32]) {
        // SAFETY: the caller's guarantees, passed on; the column count picks the body.
        unsafe {
            match b.len() {
                1 => rows::<1>(a, b, k, out),
                2 => rows::<2>(a, b, k, out),
                3 => rows::<3>(a, b, k, out),
                _ => rows::<MV_MAX_N>(a, b, k, out),
            }
        }
    }

    /// [`dot_rows`] for exactly `N` columns (the accumulators then live in registers).
    #[inline(always)]
    unsafe fn rows<const N: usize>(a: *const u16, b: &[*const f32], k: usize, out: &mut [f32]) {
        /// Step `i` of column `j`: 32 elements of `b[j]` as bf16 pairs.
        #[inline(always)]
        unsafe fn col(b: *const f32, i: usize) -> __m512bh {
            // SAFETY: the caller reads 32 elements below k.
            unsafe {
                _mm512_cvtne2ps_pbh(_mm512_loadu_ps(b.add(i + 16)), _mm512_loadu_ps(b.add(i)))
            }
        }
        // SAFETY: full loads stay below k; the last step's loads are masked to the elements
        // below k (masked-off lanes are neither read nor faulted on).
        unsafe {
            let mut acc0 = [_mm512_setzero_ps(); N];
            let mut acc1 = [_mm512_setzero_ps(); N];
            let mut i = 0;
            // steps alternate between the two accumulators: even steps in acc0, odd in acc1
            while i + 64 <= k {
                let x0 = bh(_mm512_loadu_si512(a.add(i) as *const _));
                let x1 = bh(_mm512_loadu_si512(a.add(i + 32) as *const _));
                for j in 0..N {
                    acc0[j] = _mm512_dpbf16_ps(acc0[j], x0, col(b[j], i));
                    acc1[j] = _mm512_dpbf16_ps(acc1[j], x1, col(b[j], i + 32));
                }
                i += 64;
            }
            if i + 32 <= k {
                let x0 = bh(_mm512_loadu_si512(a.add(i) as *const _));
                for j in 0..N {
                    acc0[j] = _mm512_dpbf16_ps(acc0[j], x0, col(b[j], i));
                }
                i += 32;
            }
            if i < k {
                let r = k - i;
                let m32: u32 = (1u32 << r) - 1; // r < 32
                let x = bh(_mm512_maskz_loadu_epi16(m32, a.add(i) as *const i16));
                let odd = (i / 32) % 2 == 1;
                for j in 0..N {
                    let lo = _mm512_maskz_loadu_ps(m32 as u16, b[j].add(i));
                    let hi = _mm512_maskz_loadu_ps((m32 >> 16) as u16, b[j].add(i + 16));
                    let y = _mm512_cvtne2ps_pbh(hi, lo);
                    if odd {
                        acc1[j] = _mm512_dpbf16_ps(acc1[j], x, y);
                    } else {
                        acc0[j] = _mm512_dpbf16_ps(acc0[j], x, y);
                    }
                }
            }
            for j in 0..N {
                out[j] = reduce(acc0[j], acc1[j]);
            }
        }
    }
}
