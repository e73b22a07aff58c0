//! ggml's vectorised f32 functions, reproduced operation for operation so that models give
//! llama.cpp's results bit for bit: `exp` (ggml's `ggml_v_expf`, a range reduction to
//! `2^n · (1 + p(b))` with a degree-5 polynomial, from ARM's optimized-routines, as ggml uses it
//! on x86) and the SiLU built on it. The scalar forms compute each lane exactly as the AVX2 form
//! does (the same fused multiply-adds), so every ISA gives the same bits. Also the f32 → f16 → f32
//! rounding ggml applies where it stores f16 (conv's kernels, attention's query).

use crate::simd::Isa;

/// One lane of ggml's AVX2 `ggml_v_expf` (kept in the core crate: the reference backend's
/// ggml-precision attention needs it too).
pub use tessera::numerics::ggml_expf as expf_lane;

/// One lane of ggml's AVX2 `ggml_v_silu`: `x / (1 + exp(0 - x))`.
#[inline]
pub fn silu_lane(x: f32) -> f32 {
    x / (1.0 + expf_lane(0.0 - x))
}

/// ggml's scalar `ggml_silu_f32` (libm `expf`), used for the elements after the last full
/// group of 8 in a row.
#[inline]
pub fn silu_tail(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `y[i] = silu(x[i]) · g[i]` for the elements `i0..i0 + n` of a row of `ne0`, as ggml's
/// `ggml_vec_swiglu_f32` computes them on x86 (groups of 8 from the row start, then the tail).
///
/// # Safety
/// `x`, `g` have `n` readable f32, `y` `n` writable f32 (y may equal x or g).
pub unsafe fn swiglu_row_piece(
    isa: crate::simd::Isa,
    x: *const f32,
    g: *const f32,
    y: *mut f32,
    n: usize,
    i0: usize,
    ne0: usize,
) {
    let full = ne0 - ne0 % 8;
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if isa >= crate::simd::Isa::Avx2 && isa != crate::simd::Isa::Neon {
        // vector groups must start on a multiple of 8 of the row, like ggml's
        while i < n && !(i0 + i).is_multiple_of(8) {
            // SAFETY: i < n (caller's contract).
            unsafe { *y.add(i) = silu_lane(*x.add(i)) * *g.add(i) };
            i += 1;
        }
        while i + 8 <= n && i0 + i + 8 <= full {
            // SAFETY: 8 elements from i lie below n; AVX2 and FMA are present.
            unsafe { avx2::swiglu8(x.add(i), g.add(i), y.add(i)) };
            i += 8;
        }
    }
    let _ = isa;
    while i < n {
        // SAFETY: i < n.
        unsafe {
            let v = *x.add(i);
            let s = if i0 + i < full {
                silu_lane(v)
            } else {
                silu_tail(v)
            };
            *y.add(i) = s * *g.add(i);
        }
        i += 1;
    }
}

/// Rounds `v` through f16 (nearest even), as ggml's conversion does.
#[inline(always)]
pub(crate) fn round_f16(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

/// Rounds the `n` f32 at `x` through f16 in place (eight lanes at a time with AVX2/F16C; the
/// same bits either way).
///
/// # Safety
/// `x` holds `n` writable f32.
pub(crate) unsafe fn round_f16_row(isa: Isa, x: *mut f32, n: usize) {
    #[cfg(target_arch = "x86_64")]
    if crate::ops::reduce::use_avx2(isa) {
        // SAFETY: AVX2/F16C present; the caller's contract.
        unsafe { avx2::round_f16(x, n) };
        return;
    }
    let _ = isa;
    for i in 0..n {
        // SAFETY: i < n.
        unsafe { *x.add(i) = round_f16(*x.add(i)) };
    }
}

#[cfg(target_arch = "x86_64")]
pub mod avx2 {
    use std::arch::x86_64::*;

    /// Rounds `n` f32 through f16 in place, eight at a time, the rest one by one.
    ///
    /// # Safety
    /// AVX2/F16C present; `x` holds `n` writable f32.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn round_f16(x: *mut f32, n: usize) {
        // SAFETY: loads and stores stay below n.
        unsafe {
            let mut i = 0;
            while i + 8 <= n {
                let h = _mm256_cvtps_ph(_mm256_loadu_ps(x.add(i)), _MM_FROUND_TO_NEAREST_INT);
                _mm256_storeu_ps(x.add(i), _mm256_cvtph_ps(h));
                i += 8;
            }
            while i < n {
                *x.add(i) = super::round_f16(*x.add(i));
                i += 1;
            }
        }
    }

    /// ggml's `ggml_v_expf` on 8 lanes.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn expf8(x: __m256) -> __m256 {
        let c = |b: u32| _mm256_castsi256_ps(_mm256_set1_epi32(b as i32));
        let r = c(0x4b40_0000);
        let z = _mm256_fmadd_ps(x, c(0x3fb8_aa3b), r);
        let n = _mm256_sub_ps(z, r);
        let b = _mm256_fnmadd_ps(n, c(0x35bf_be8e), _mm256_fnmadd_ps(n, c(0x3f31_7200), x));
        let e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
        let k = _mm256_castsi256_ps(_mm256_add_epi32(
            e,
            _mm256_castps_si256(_mm256_set1_ps(1.0)),
        ));
        let absn = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
        let cm = _mm256_cmp_ps(absn, _mm256_set1_ps(126.0), _CMP_GT_OQ);
        let u = _mm256_mul_ps(b, b);
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(
                _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
                u,
                _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
            ),
            u,
            _mm256_mul_ps(c(0x3f7f_fff6), b),
        );
        if _mm256_movemask_ps(cm) == 0 {
            return _mm256_fmadd_ps(j, k, k);
        }
        let g = _mm256_and_si256(
            _mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
            _mm256_set1_epi32(0x8200_0000u32 as i32),
        );
        let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f00_0000)));
        let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
        let dm = _mm256_cmp_ps(absn, _mm256_set1_ps(192.0), _CMP_GT_OQ);
        _mm256_or_ps(
            _mm256_and_ps(dm, _mm256_mul_ps(s1, s1)),
            _mm256_andnot_ps(
                dm,
                _mm256_or_ps(
                    _mm256_and_ps(cm, _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)),
                    _mm256_andnot_ps(cm, _mm256_fmadd_ps(k, j, k)),
                ),
            ),
        )
    }

    /// `y = silu(x) · g` on 8 lanes, as ggml's AVX2 swiglu.
    ///
    /// # Safety
    /// 8 readable f32 at x and g, 8 writable at y.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn swiglu8(x: *const f32, g: *const f32, y: *mut f32) {
        // SAFETY: the caller's contract.
        unsafe {
            let xv = _mm256_loadu_ps(x);
            let e = expf8(_mm256_sub_ps(_mm256_setzero_ps(), xv));
            let s = _mm256_div_ps(xv, _mm256_add_ps(_mm256_set1_ps(1.0), e));
            _mm256_storeu_ps(y, _mm256_mul_ps(s, _mm256_loadu_ps(g)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lane_form_is_the_vector_form_and_close_to_exp() {
        let xs: Vec<f32> = (-2000..2000)
            .map(|i| i as f32 * 0.0517)
            .chain([
                0.0, -0.0, 88.0, -87.0, -100.0, 100.0, 130.0, -130.0, 200.0, -200.0,
            ])
            .collect();
        for &x in &xs {
            let e = expf_lane(x);
            let want = (x as f64).exp();
            if want.is_finite() && want > 1e-37 && want < 1e38 {
                assert!(
                    ((e as f64) - want).abs() / want < 3e-7,
                    "exp({x}) = {e}, want {want}"
                );
            }
        }
        #[cfg(target_arch = "x86_64")]
        if crate::simd::isa() >= crate::simd::Isa::Avx2 {
            for chunk in xs.chunks_exact(8) {
                let mut out = [0f32; 8];
                // SAFETY: AVX2 present; 8 lanes.
                unsafe {
                    use std::arch::x86_64::*;
                    _mm256_storeu_ps(
                        out.as_mut_ptr(),
                        avx2::expf8(_mm256_loadu_ps(chunk.as_ptr())),
                    );
                }
                for (o, &x) in out.iter().zip(chunk) {
                    assert_eq!(o.to_bits(), expf_lane(x).to_bits(), "exp lane {x}");
                }
            }
        }
    }
}
