//! CPU kernel of `rope_ext`: modes normal (0, adjacent pairs) and neox (2, halves), partial
//! `n_dims`, `freq_scale`, YaRN (`ext_factor`, `attn_factor`, `beta_fast`/`beta_slow`,
//! `n_ctx_orig`), optional `freq_factors`; `a` f32 or f16 with any strides, the destination of
//! the same type, contiguous.
//!
//! Work split: each thread takes a contiguous range of rows (i1 fastest, then the token i2).
//! Its slice of the work buffer holds the pair frequencies `base^(-2k/n_dims) / ff[k]` (f64,
//! computed once per node) and a cos/sin cache for the current token, rebuilt only when the
//! token changes (so about once per token per thread). Angles, YaRN's ramp and cos/sin are
//! computed in **f64** exactly like the core's reference (`rope_yarn`) and rounded once to f32
//! (ggml works in f32, whose angle error grows with the position: at position 10⁵ it is
//! ~10⁻² rad; ours stays at f32 rounding of cos/sin). The rotation itself is f32 (FMA on AVX2):
//! measured within 1e-7 of the output's max magnitude for f32 (with and without YaRN,
//! positions up to 10⁵; the tests allow 2e-6);
//! f16 results are the f32 result rounded to nearest even (1 f16 ulp at most from the
//! reference's rounding, 1e-3 relative).
//!
//! Layout of the cache: normal mode stores `C[2k] = C[2k+1] = cos θk`, `S[2k] = -sin θk`,
//! `S[2k+1] = sin θk`, so a row is `y = x·C + swap_pairs(x)·S` (one in-lane permute on
//! AVX2); neox stores `cos θk`, `sin θk` for `k < n_dims/2`.

use tessera::op::RopeParams;
use tessera::{DType, Graph, Op, Result, Tensor};

use crate::exec::NodeCtx;
use crate::simd::Isa;

const MODE_NORMAL: i32 = 0;
const MODE_NEOX: i32 = 2;

/// Whether this family's kernels handle node `t` (types, layout); otherwise the fallback runs.
pub fn handles(graph: &Graph, t: &Tensor) -> bool {
    let Op::Rope(p) = t.op else {
        return false;
    };
    let a = graph.tensor(t.src[0]);
    let pos = graph.tensor(t.src[1]);
    matches!(a.dtype, DType::F32 | DType::F16)
        && t.dtype == a.dtype
        && t.ne == a.ne
        && t.is_contiguous()
        && pos.dtype == DType::I32
        && pos.ne[0] >= a.ne[2]
        && (p.mode == MODE_NORMAL || p.mode == MODE_NEOX)
        && p.n_dims % 2 == 0
        && p.n_dims <= a.ne[0]
        && t.src.get(2).is_none_or(|&f| {
            let f = graph.tensor(f);
            f.dtype == DType::F32 && f.ne[0] >= p.n_dims / 2
        })
}

/// Bytes of work buffer per thread: the f64 frequencies, then the f32 cos and sin caches.
fn per_thread(n_dims: usize) -> usize {
    (n_dims / 2 * 8 + 2 * n_dims * 4).next_multiple_of(64)
}

/// Scratch bytes node `t` needs with `nth` threads.
pub fn work_size(_graph: &Graph, t: &Tensor, nth: usize) -> usize {
    match t.op {
        Op::Rope(p) => per_thread(p.n_dims) * nth,
        _ => 0,
    }
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn use_avx2(isa: Isa) -> bool {
    cfg!(target_arch = "x86_64") && isa >= Isa::Avx2 && isa != Isa::Neon
}

/// ggml_rope_yarn_corr_dim.
fn yarn_corr_dim(n_dims: f64, n_ctx_orig: f64, n_rot: f64, base: f64) -> f64 {
    n_dims * (n_ctx_orig / (n_rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
}

/// ggml_rope_yarn_corr_dims, as the core's reference computes it.
fn yarn_corr_dims(p: &RopeParams) -> (f64, f64) {
    let (nd, nc, base) = (p.n_dims as f64, p.n_ctx_orig as f64, p.freq_base as f64);
    let start = yarn_corr_dim(nd, nc, p.beta_fast as f64, base).floor();
    let end = yarn_corr_dim(nd, nc, p.beta_slow as f64, base).ceil();
    let low = if 0.0 > start { 0.0 } else { start };
    let high = if nd - 1.0 < end { nd - 1.0 } else { end };
    (low, high)
}

/// cos and sin (times the magnitude scale) of pair `k`'s angle: ggml's `rope_yarn` in f64.
fn rope_yarn(theta_extrap: f64, k: usize, p: &RopeParams, corr: (f64, f64)) -> (f64, f64) {
    let freq_scale = p.freq_scale as f64;
    let ext_factor = p.ext_factor as f64;
    let theta_interp = freq_scale * theta_extrap;
    let mut theta = theta_interp;
    let mut mscale = p.attn_factor as f64;
    if ext_factor != 0.0 {
        let y = (k as f64 - corr.0) / (corr.1 - corr.0).max(0.001);
        let ramp_mix = (1.0 - y.clamp(0.0, 1.0)) * ext_factor;
        theta = theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
        mscale *= 1.0 + 0.1 * (1.0 / freq_scale).ln();
    }
    let (s, c) = theta.sin_cos();
    (c * mscale, s * mscale)
}

pub fn compute(ctx: &NodeCtx) -> Result<()> {
    let Op::Rope(p) = ctx.t.op else {
        return Err(ctx.err("not a rope op"));
    };
    let (a, pos, d) = (ctx.s(0), ctx.s(1), ctx.t);
    let ne = a.ne;
    let (n, n_dims, half) = (ne[0], p.n_dims, p.n_dims / 2);
    let per = per_thread(n_dims);
    if ctx.wsize < per * ctx.nth {
        return Err(ctx.err(format!(
            "work buffer of {} bytes, {} needed",
            ctx.wsize,
            per * ctx.nth
        )));
    }
    let rows = ctx.share(a.nrows());
    if rows.is_empty() {
        return Ok(());
    }
    let neox = p.mode == MODE_NEOX;
    let f16 = a.dtype == DType::F16;
    let ts = a.dtype.type_size();
    // SAFETY: this thread owns bytes [ith·per, (ith+1)·per) of the work buffer (size checked
    // above; the buffer is 64-byte aligned and `per` a multiple of 64): `half` f64 then
    // `2·n_dims` f32.
    let (freq, cos, sin) = unsafe {
        let base = ctx.wdata.add(ctx.ith * per);
        let cache = base.add(half * 8) as *mut f32;
        (
            std::slice::from_raw_parts_mut(base as *mut f64, half),
            std::slice::from_raw_parts_mut(cache, n_dims),
            std::slice::from_raw_parts_mut(cache.add(n_dims), n_dims),
        )
    };
    let fbase = p.freq_base as f64;
    let ff = (ctx.t.src.len() > 2).then(|| ctx.s(2).nb[0]);
    for (k, f) in freq.iter_mut().enumerate() {
        *f = fbase.powf(-2.0 * k as f64 / n_dims as f64);
        if let Some(nb0) = ff {
            // SAFETY: freq_factors has at least `half` values (`handles`), span validated.
            *f /= unsafe { *(ctx.src[2].add(k * nb0) as *const f32) } as f64;
        }
    }
    let corr = yarn_corr_dims(&p);
    let mut cached = usize::MAX;
    for r in rows {
        let (i1, i2, i3) = (r % ne[1], (r / ne[1]) % ne[2], r / (ne[1] * ne[2]));
        if i2 != cached {
            // SAFETY: pos has at least ne2 i32 values (`handles`), span validated.
            let position = unsafe { *(ctx.src[1].add(i2 * pos.nb[0]) as *const i32) } as f64;
            for k in 0..half {
                let (c, s) = rope_yarn(position * freq[k], k, &p, corr);
                let (c, s) = (c as f32, s as f32);
                if neox {
                    cos[k] = c;
                    sin[k] = s;
                } else {
                    cos[2 * k] = c;
                    cos[2 * k + 1] = c;
                    sin[2 * k] = -s;
                    sin[2 * k + 1] = s;
                }
            }
            cached = i2;
        }
        // SAFETY: spans validated: row (i1, i2, i3) of `a` has `n` elements at stride nb0,
        // the destination row `n` contiguous elements of the same type, written by this
        // thread alone; rope never runs in place, but each pair is read before it is written.
        unsafe {
            let src = ctx.src[0].add(i1 * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3]);
            let dst = ctx.dst.add(i1 * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]);
            let dense = a.nb[0] == ts || n == 1;
            #[cfg(target_arch = "x86_64")]
            if dense && use_avx2(ctx.isa) {
                avx2::rotate(neox, f16, src, dst, n_dims, cos, sin);
                std::ptr::copy(
                    src.add(n_dims * ts),
                    dst.add(n_dims * ts),
                    (n - n_dims) * ts,
                );
                continue;
            }
            let _ = dense;
            rotate_scalar(neox, f16, src, a.nb[0], dst, n_dims, cos, sin);
            for i in n_dims..n {
                std::ptr::copy(src.add(i * a.nb[0]), dst.add(i * ts), ts);
            }
        }
    }
    Ok(())
}

/// Reads element `i` (stride `nb0` bytes) as f32.
///
/// # Safety
/// The element is readable.
#[inline(always)]
unsafe fn ld(f16: bool, p: *const u8, i: usize, nb0: usize) -> f32 {
    // SAFETY: caller's contract.
    unsafe {
        if f16 {
            half::f16::from_bits(*(p.add(i * nb0) as *const u16)).to_f32()
        } else {
            *(p.add(i * nb0) as *const f32)
        }
    }
}

/// Writes element `i` of a contiguous row, rounding to nearest even for f16.
///
/// # Safety
/// The element is writable.
#[inline(always)]
unsafe fn st(f16: bool, p: *mut u8, i: usize, v: f32) {
    // SAFETY: caller's contract.
    unsafe {
        if f16 {
            *(p as *mut u16).add(i) = half::f16::from_f32(v).to_bits();
        } else {
            *(p as *mut f32).add(i) = v;
        }
    }
}

/// Rotates the first `n_dims` values of a row (source stride `nb0` bytes, destination dense).
///
/// # Safety
/// `src` has `n_dims` elements at stride `nb0`, `dst` `n_dims` writable elements.
#[allow(clippy::too_many_arguments)]
unsafe fn rotate_scalar(
    neox: bool,
    f16: bool,
    src: *const u8,
    nb0: usize,
    dst: *mut u8,
    n_dims: usize,
    cos: &[f32],
    sin: &[f32],
) {
    let half = n_dims / 2;
    // SAFETY: all indices are below n_dims (caller's contract).
    unsafe {
        for k in 0..half {
            if neox {
                let (x0, x1) = (ld(f16, src, k, nb0), ld(f16, src, k + half, nb0));
                let (c, s) = (cos[k], sin[k]);
                st(f16, dst, k, x0 * c - x1 * s);
                st(f16, dst, k + half, x0 * s + x1 * c);
            } else {
                let (j0, j1) = (2 * k, 2 * k + 1);
                let (x0, x1) = (ld(f16, src, j0, nb0), ld(f16, src, j1, nb0));
                st(f16, dst, j0, x0 * cos[j0] + x1 * sin[j0]);
                st(f16, dst, j1, x1 * cos[j1] + x0 * sin[j1]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn load8(f16: bool, p: *const u8, i: usize) -> __m256 {
        // SAFETY: the caller guarantees 8 readable elements at i; F16C enabled by the caller.
        unsafe {
            if f16 {
                _mm256_cvtph_ps(_mm_loadu_si128((p as *const u16).add(i) as *const __m128i))
            } else {
                _mm256_loadu_ps((p as *const f32).add(i))
            }
        }
    }

    #[inline(always)]
    unsafe fn store8(f16: bool, p: *mut u8, i: usize, v: __m256) {
        // SAFETY: the caller guarantees 8 writable elements at i; F16C enabled by the caller.
        unsafe {
            if f16 {
                let h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
                _mm_storeu_si128((p as *mut u16).add(i) as *mut __m128i, h);
            } else {
                _mm256_storeu_ps((p as *mut f32).add(i), v);
            }
        }
    }

    /// Rotates the first `n_dims` values of a dense row.
    ///
    /// # Safety
    /// `src` and `dst` hold `n_dims` dense elements; `cos`/`sin` the cache of the module docs.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn rotate(
        neox: bool,
        f16: bool,
        src: *const u8,
        dst: *mut u8,
        n_dims: usize,
        cos: &[f32],
        sin: &[f32],
    ) {
        let half = n_dims / 2;
        let ts = if f16 { 2 } else { 4 };
        // SAFETY: every access is below n_dims (caller's contract) and below the caches'
        // lengths (n_dims each).
        unsafe {
            if neox {
                let mut k = 0;
                while k + 8 <= half {
                    let x0 = load8(f16, src, k);
                    let x1 = load8(f16, src, k + half);
                    let c = _mm256_loadu_ps(cos.as_ptr().add(k));
                    let s = _mm256_loadu_ps(sin.as_ptr().add(k));
                    store8(f16, dst, k, _mm256_fmsub_ps(x0, c, _mm256_mul_ps(x1, s)));
                    store8(
                        f16,
                        dst,
                        k + half,
                        _mm256_fmadd_ps(x0, s, _mm256_mul_ps(x1, c)),
                    );
                    k += 8;
                }
                while k < half {
                    let x0 = super::ld(f16, src, k, ts);
                    let x1 = super::ld(f16, src, k + half, ts);
                    let (c, s) = (cos[k], sin[k]);
                    super::st(f16, dst, k, x0.mul_add(c, -(x1 * s)));
                    super::st(f16, dst, k + half, x0.mul_add(s, x1 * c));
                    k += 1;
                }
            } else {
                let mut j = 0;
                while j + 8 <= n_dims {
                    let x = load8(f16, src, j);
                    let xs = _mm256_permute_ps(x, 0b10_11_00_01);
                    let c = _mm256_loadu_ps(cos.as_ptr().add(j));
                    let s = _mm256_loadu_ps(sin.as_ptr().add(j));
                    store8(f16, dst, j, _mm256_fmadd_ps(x, c, _mm256_mul_ps(xs, s)));
                    j += 8;
                }
                while j < n_dims {
                    let x0 = super::ld(f16, src, j, ts);
                    let x1 = super::ld(f16, src, j + 1, ts);
                    super::st(f16, dst, j, x0.mul_add(cos[j], x1 * sin[j]));
                    super::st(f16, dst, j + 1, x1.mul_add(cos[j + 1], x0 * sin[j + 1]));
                    j += 2;
                }
            }
        }
    }
}
