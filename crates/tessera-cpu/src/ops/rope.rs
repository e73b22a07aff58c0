//! CPU kernel of `rope_ext`: modes normal (0, adjacent pairs) and neox (2, halves), partial
//! `n_dims`, `freq_scale`, YaRN (`ext_factor`, `attn_factor`, `beta_fast`/`beta_slow`,
//! `n_ctx_orig`), optional `freq_factors`; `a` f32 or f16 with any strides, the destination of
//! the same type, contiguous.
//!
//! Work split: each thread takes a contiguous range of rows (i1 fastest, then the token i2).
//! Its slice of the work buffer holds a cos/sin cache for the current token, rebuilt only when
//! the token changes (about once per token per thread).
//!
//! The arithmetic is ggml's CPU arithmetic, step for step, so that models reproduce llama.cpp:
//! the angle of pair k is `p · θ^k` with `θ = powf(base, -2/n_dims)` accumulated by repeated f32
//! multiplication, YaRN's ramp and magnitude scale in f32 (with the fused multiply-adds GCC
//! forms in ggml's build), `cosf`/`sinf`, and the rotation with the same fused products as
//! ggml's x86 code (both modes: `x0·c − r(x1·s)` and `x0·s + r(x1·c)`, one rounding `r`
//! before each fused add). Like ggml's, the angle carries f32
//! rounding that grows with the position (about 1e-7·p relative): the reference backend,
//! which works in f64, is the precise one.
//!
//! Layout of the cache: normal mode stores `A[2k] = cos θk`, `A[2k+1] = sin θk`, `B[2k] =
//! -sin θk`, `B[2k+1] = cos θk`, so a row is `y = even(x)·A + r(odd(x)·B)` (two in-lane
//! permutes on AVX2); neox stores `cos θk`, `sin θk` for `k < n_dims/2`.

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

/// Bytes of work buffer per thread: room for the f32 cos and sin caches (and, unused now, the
/// pair frequencies).
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

/// ggml's `ggml_rope_yarn_corr_dims`, in f32 as ggml computes it.
fn yarn_corr_dims_f32(p: &RopeParams) -> (f32, f32) {
    let dim = |n_rot: f32| -> f32 {
        p.n_dims as f32 * (p.n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
            / (2.0 * p.freq_base.ln())
    };
    let start = dim(p.beta_fast).floor();
    let end = dim(p.beta_slow).ceil();
    (start.max(0.0), end.min(p.n_dims as f32 - 1.0))
}

/// cos and sin (times the magnitude scale) of pair `k`'s angle: ggml's `rope_yarn`, in f32
/// with the fused operations of ggml's x86 build.
fn rope_yarn_f32(theta_extrap: f32, k: usize, p: &RopeParams, corr: (f32, f32)) -> (f32, f32) {
    let theta_interp = p.freq_scale * theta_extrap;
    let mut theta = theta_interp;
    let mut mscale = p.attn_factor;
    if p.ext_factor != 0.0 {
        let y = (k as f32 - corr.0) / (corr.1 - corr.0).max(0.001);
        let ramp_mix = (1.0 - y.clamp(0.0, 1.0)) * p.ext_factor;
        theta = theta_interp.mul_add(1.0 - ramp_mix, theta_extrap * ramp_mix);
        mscale *= 0.1f32.mul_add((1.0 / p.freq_scale).ln(), 1.0);
    }
    let sin = theta.sin() * mscale;
    (theta.cos() * mscale, if p.inverse { -sin } else { sin })
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
    let (cos, sin) = unsafe {
        let base = ctx.wdata.add(ctx.ith * per);
        let cache = base.add(half * 8) as *mut f32;
        (
            std::slice::from_raw_parts_mut(cache, n_dims),
            std::slice::from_raw_parts_mut(cache.add(n_dims), n_dims),
        )
    };
    let theta_scale = p.freq_base.powf(-2.0 / n_dims as f32);
    let ff = (ctx.t.src.len() > 2).then(|| ctx.s(2).nb[0]);
    let corr = yarn_corr_dims_f32(&p);
    let mut cached = usize::MAX;
    for r in rows {
        let (i1, i2, i3) = (r % ne[1], (r / ne[1]) % ne[2], r / (ne[1] * ne[2]));
        if i2 != cached {
            // SAFETY: pos has at least ne2 i32 values (`handles`), span validated.
            let position = unsafe { *(ctx.src[1].add(i2 * pos.nb[0]) as *const i32) };
            let mut theta = position as f32;
            for k in 0..half {
                let f = match ff {
                    // SAFETY: freq_factors has at least `half` values (`handles`), span validated.
                    Some(nb0) => unsafe { *(ctx.src[2].add(k * nb0) as *const f32) },
                    None => 1.0,
                };
                let (c, s) = rope_yarn_f32(theta / f, k, &p, corr);
                theta *= theta_scale;
                if neox {
                    cos[k] = c;
                    sin[k] = s;
                } else {
                    // A = [cos, sin], B = [-sin, cos] per pair: y = x0·A + r(x1·B), which is
                    // ggml's `x0·c − r(x1·s)`, `x0·s + r(x1·c)`
                    cos[2 * k] = c;
                    cos[2 * k + 1] = s;
                    sin[2 * k] = -s;
                    sin[2 * k + 1] = c;
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
                st(f16, dst, k, x0.mul_add(c, -(x1 * s)));
                st(f16, dst, k + half, x0.mul_add(s, x1 * c));
            } else {
                let (j0, j1) = (2 * k, 2 * k + 1);
                let (x0, x1) = (ld(f16, src, j0, nb0), ld(f16, src, j1, nb0));
                st(f16, dst, j0, x0.mul_add(cos[j0], x1 * sin[j0]));
                st(f16, dst, j1, x0.mul_add(cos[j1], x1 * sin[j1]));
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
                    let xe = _mm256_permute_ps(x, 0b10_10_00_00); // x0 x0 x2 x2 ...
                    let xo = _mm256_permute_ps(x, 0b11_11_01_01); // x1 x1 x3 x3 ...
                    let c = _mm256_loadu_ps(cos.as_ptr().add(j));
                    let s = _mm256_loadu_ps(sin.as_ptr().add(j));
                    store8(f16, dst, j, _mm256_fmadd_ps(xe, c, _mm256_mul_ps(xo, s)));
                    j += 8;
                }
                while j < n_dims {
                    let x0 = super::ld(f16, src, j, ts);
                    let x1 = super::ld(f16, src, j + 1, ts);
                    super::st(f16, dst, j, x0.mul_add(cos[j], x1 * sin[j]));
                    super::st(f16, dst, j + 1, x0.mul_add(cos[j + 1], x1 * sin[j + 1]));
                    j += 2;
                }
            }
        }
    }
}
