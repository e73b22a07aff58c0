//! CPU kernels of the `norm` family: norm (layer norm without affine), rms_norm, l2_norm and
//! group_norm, on f32 with any source strides (the destination is contiguous f32), and their
//! gradient `norm_back`.
//!
//! Work split: norm/rms_norm/l2_norm give each thread a contiguous range of rows; group_norm
//! gives each thread a contiguous range of (group, i3) units. A row (or a group) is always
//! reduced by one thread in a fixed order, so the result does not depend on the thread count.
//!
//! Accuracy: every sum (Σx, Σx², Σ(x - mean)²) is accumulated in **f64** — each f32 value is
//! widened before it is squared and added, four f64 accumulators of four lanes in the AVX2
//! path, one sequential f64 accumulator in the scalar path — as ggml does with `ggml_float`.
//! Only the final `x·scale` (or `(x - mean)·scale`) is done in f32, with the mean and the
//! scale rounded once to f32, so the error is about one f32 ulp of the output (measured
//! ≤ 1e-7 of the output's max magnitude, scalar and AVX2, on rows and groups of 17 to 40000
//! values; the tests allow 1e-6).
//!
//! Non-contiguous rows (a transposed or permuted source) are first gathered into the
//! destination row (which is contiguous), then normalised in place there.
//!
//! **norm_back** (the gradient of the four, sources grad and x, f32 with dense rows and any row
//! strides; a transposed source takes the fallback): the same split — rows, or (group, i3)
//! units — and one thread per vector. Three passes over a vector: its mean (norm and
//! group_norm only), then `Σ(x - mean)²`, `Σg` and `Σg(x - mean)` with `x - mean` and every
//! product in f64 (four-lane f64 accumulators on AVX2, sequential on the scalar path), then
//! `dx = r·((g - mean(g)) - (x - mean)·r²·mean(g·(x - mean)))` (and its rms / l2 analogues)
//! per element in f64, rounded once to f32. So the output is the reference's to about half an
//! f32 ulp of each element (the f64 sums' order aside), a constant gradient gives exactly 0
//! for norm, and a large mean does not cancel (the tests allow 1e-6 of the output's largest
//! magnitude). A group of both-contiguous sources is one segment; otherwise its rows are
//! walked in the reference's order (channel, then row).

use tessera::op::NormBackKind;
use tessera::{DType, Graph, Op, Result, Tensor};

use crate::exec::NodeCtx;
use crate::simd::Isa;

/// Whether this family's kernels handle node `t` (types, layout); otherwise the fallback runs.
pub fn handles(graph: &Graph, t: &Tensor) -> bool {
    let a = graph.tensor(t.src[0]);
    if let Op::NormBack(_) = t.op {
        let x = graph.tensor(t.src[1]);
        let dense_rows = |s: &Tensor| s.nb[0] == 4 || s.ne[0] <= 1;
        return [a, x]
            .iter()
            .all(|s| s.dtype == DType::F32 && s.ne == t.ne && dense_rows(s))
            && t.dtype == DType::F32
            && t.is_contiguous();
    }
    a.dtype == DType::F32 && t.dtype == DType::F32 && t.is_contiguous() && a.ne == t.ne
}

/// Scratch bytes node `t` needs with `nth` threads (none: the destination is the scratch).
pub fn work_size(_graph: &Graph, _t: &Tensor, _nth: usize) -> usize {
    0
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Norm,
    Rms,
    L2,
}

pub fn compute(ctx: &NodeCtx) -> Result<()> {
    match ctx.t.op {
        Op::Norm { eps } => rows(ctx, Kind::Norm, eps),
        Op::RmsNorm { eps } => rows(ctx, Kind::Rms, eps),
        Op::L2Norm { eps } => rows(ctx, Kind::L2, eps),
        Op::GroupNorm { n_groups, eps } => groups(ctx, n_groups, eps),
        Op::NormBack(kind) => back(ctx, kind),
        _ => Err(ctx.err("not a normalisation op")),
    }
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn use_avx2(isa: Isa) -> bool {
    cfg!(target_arch = "x86_64") && isa >= Isa::Avx2 && isa != Isa::Neon
}

/// Copies the `ne0` values of a strided f32 row at `src` (element stride `nb0` bytes) to `dst`.
///
/// # Safety
/// `src` points at a row of `n` f32 with stride `nb0`; `dst` at `n` writable f32.
unsafe fn gather_row(src: *const u8, nb0: usize, dst: *mut f32, n: usize) {
    for i in 0..n {
        // SAFETY: i < n, within both rows (caller's contract).
        unsafe { *dst.add(i) = *(src.add(i * nb0) as *const f32) };
    }
}

fn rows(ctx: &NodeCtx, kind: Kind, eps: f32) -> Result<()> {
    let (a, d) = (ctx.s(0), ctx.t);
    let ne = a.ne;
    let n = ne[0];
    if n == 0 {
        return Ok(());
    }
    let dense = a.nb[0] == 4 || n == 1;
    for r in ctx.share(a.nrows()) {
        let (i1, i2, i3) = (r % ne[1], (r / ne[1]) % ne[2], r / (ne[1] * ne[2]));
        // SAFETY: `exec::validate` checked both tensors' spans; row (i1, i2, i3) of the
        // source has `n` values at stride nb0 and the destination row `n` contiguous f32, which
        // this thread alone writes. The destination may be the source's memory (same layout),
        // so the rows are only touched through raw pointers, each value read before written.
        unsafe {
            let src = ctx.src[0].add(i1 * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3]);
            let y = ctx.dst.add(i1 * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]) as *mut f32;
            let x = if dense {
                src as *const f32
            } else {
                gather_row(src, a.nb[0], y, n);
                y as *const f32
            };
            norm_block(ctx.isa, kind, x, y, n, eps as f64);
        }
    }
    Ok(())
}

/// Normalises the `n` values at `x` into `y` (which may equal `x`).
///
/// # Safety
/// `x` has `n` readable f32, `y` `n` writable f32; they are equal or do not overlap.
unsafe fn norm_block(isa: Isa, kind: Kind, x: *const f32, y: *mut f32, n: usize, eps: f64) {
    // SAFETY: forwarded caller's contract.
    unsafe {
        match kind {
            Kind::Norm => {
                let mean = sum(isa, x, n) / n as f64;
                let ss = sub_sq(isa, x, mean as f32, y, n);
                let scale = 1.0 / (ss / n as f64 + eps).sqrt();
                scale_in_place(isa, y, n, scale as f32);
            }
            Kind::Rms => {
                // ggml's arithmetic exactly: f32 squares summed in order in f64, the mean
                // rounded to f32, `1/sqrtf(mean + eps)` in f32 (models then reproduce llama.cpp)
                let mut sum = 0f64;
                for i in 0..n {
                    let v = *x.add(i);
                    sum += (v * v) as f64;
                }
                let mean = (sum / n as f64) as f32;
                let scale = 1.0f32 / (mean + eps as f32).sqrt();
                scale_to(isa, x, y, n, scale);
            }
            Kind::L2 => {
                let norm = sum_sq(isa, x, n).sqrt();
                let scale = 1.0 / norm.max(eps);
                scale_to(isa, x, y, n, scale as f32);
            }
        }
    }
}

fn groups(ctx: &NodeCtx, n_groups: usize, eps: f32) -> Result<()> {
    let (a, d) = (ctx.s(0), ctx.t);
    let ne = a.ne;
    let channels = ne[2];
    let per_group = channels.div_ceil(n_groups.max(1));
    let plane = ne[0] * ne[1];
    let contiguous = a.is_contiguous();
    for u in ctx.share(n_groups * ne[3]) {
        let (g, i3) = (u % n_groups, u / n_groups);
        let start = (g * per_group).min(channels);
        let end = (start + per_group).min(channels);
        let m = (end - start) * plane;
        if m == 0 {
            continue;
        }
        // SAFETY: spans validated by `exec::validate`; the destination block of channels
        // start..end at i3 is `m` contiguous f32 (the destination is contiguous) that this
        // thread alone writes; source rows are read through their strides.
        unsafe {
            let y = ctx.dst.add(start * d.nb[2] + i3 * d.nb[3]) as *mut f32;
            let x = if contiguous {
                ctx.src[0].add(start * a.nb[2] + i3 * a.nb[3]) as *const f32
            } else {
                for i2 in start..end {
                    for i1 in 0..ne[1] {
                        let src = ctx.src[0].add(i1 * a.nb[1] + i2 * a.nb[2] + i3 * a.nb[3]);
                        let dst = y.add(((i2 - start) * ne[1] + i1) * ne[0]);
                        gather_row(src, a.nb[0], dst, ne[0]);
                    }
                }
                y as *const f32
            };
            norm_block(ctx.isa, Kind::Norm, x, y, m, eps as f64);
        }
    }
    Ok(())
}

/// `norm_back`: the gradient of norm / rms_norm / l2_norm (one row per unit) or group_norm (one
/// (group, i3) block per unit), units split between threads in contiguous ranges. A unit is a
/// list of segments (its rows, or one segment when both sources are contiguous), always walked
/// in the same order, so the result does not depend on the thread count.
fn back(ctx: &NodeCtx, kind: NormBackKind) -> Result<()> {
    let (gt, xt, d) = (ctx.s(0), ctx.s(1), ctx.t);
    let ne = d.ne;
    if ne[0] == 0 {
        return Ok(());
    }
    let isa = ctx.isa;
    // SAFETY (for `seg` below): `exec::validate` checked all three spans; row (i1, i2, i3) of
    // each source has ne0 dense f32 (`handles`) and of the destination ne0 contiguous f32.
    let row = |i1: usize, i2: usize, i3: usize| unsafe {
        let at = |nb: [usize; 4]| i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
        (
            ctx.src[0].add(at(gt.nb)) as *const f32,
            ctx.src[1].add(at(xt.nb)) as *const f32,
            ctx.dst.add(at(d.nb)) as *mut f32,
        )
    };
    match kind {
        NormBackKind::Group { n_groups, eps } => {
            let channels = ne[2];
            let per_group = channels.div_ceil(n_groups.max(1));
            let dense = gt.is_contiguous() && xt.is_contiguous();
            for u in ctx.share(n_groups * ne[3]) {
                let (gr, i3) = (u % n_groups, u / n_groups);
                let start = (gr * per_group).min(channels);
                let end = (start + per_group).min(channels);
                let rows = (end - start) * ne[1];
                if rows == 0 {
                    continue;
                }
                let unit = if dense {
                    Unit {
                        len: rows * ne[0],
                        count: 1,
                        seg: &|_| row(0, start, i3),
                    }
                } else {
                    Unit {
                        len: ne[0],
                        count: rows,
                        seg: &|k| row(k % ne[1], start + k / ne[1], i3),
                    }
                };
                // SAFETY: the segments are this unit's rows (see `row`); this thread alone
                // writes the destination rows of channels start..end at i3.
                unsafe { back_unit(isa, kind, eps as f64, &unit) };
            }
        }
        NormBackKind::Norm { eps } | NormBackKind::Rms { eps } | NormBackKind::L2 { eps } => {
            for r in ctx.share(d.nrows()) {
                let (i1, i2, i3) = (r % ne[1], (r / ne[1]) % ne[2], r / (ne[1] * ne[2]));
                let unit = Unit {
                    len: ne[0],
                    count: 1,
                    seg: &|_| row(i1, i2, i3),
                };
                // SAFETY: as above; this thread alone writes destination row r.
                unsafe { back_unit(isa, kind, eps as f64, &unit) };
            }
        }
    }
    Ok(())
}

/// A normalised vector of `count · len` values as `count` segments of `len`: segment `k` is
/// `seg(k) = (grad, x, dst)`.
struct Unit<'a> {
    len: usize,
    count: usize,
    seg: &'a dyn Fn(usize) -> (*const f32, *const f32, *mut f32),
}

/// `dx` of one normalised vector, every sum in f64 and `dx = A·((g + C) + B·(x - mean))` per
/// element in f64, rounded once to f32:
/// - norm / group: `y = (x - mean) r`, `r = 1/sqrt(var + eps)`:
///   `dx = r (g - mean(g) - y·mean(g y))`, i.e. `A = r`, `B = -r² Σg(x-mean)/m`, `C = -Σg/m`
///   (`g - mean(g)` is formed before the scaling, as the reference does, so a constant
///   gradient gives exactly 0);
/// - rms: `r = 1/sqrt(mean(x²) + eps)`: `dx = r g - x r³ mean(g x)`, `A = r`,
///   `B = -r² Σgx/m` (mean 0, C 0);
/// - l2: `s = 1/|x|`: `A = s`, `B = -s² Σgx`; `A = 1/eps`, `B = 0` where `|x| <= eps`.
///
/// The mean is found first (a pass of its own), so `Σ(x - mean)²` and `Σ g (x - mean)` do not
/// cancel.
///
/// # Safety
/// Every segment's pointers address `len` f32 (grad and x readable, dst writable); the
/// destination segments are disjoint from each other and from the sources.
unsafe fn back_unit(isa: Isa, kind: NormBackKind, eps: f64, u: &Unit) {
    let m = (u.len * u.count) as f64;
    let mean = if matches!(kind, NormBackKind::Norm { .. } | NormBackKind::Group { .. }) {
        let mut s = 0f64;
        for k in 0..u.count {
            // SAFETY: caller's contract.
            s += unsafe { sum(isa, (u.seg)(k).1, u.len) };
        }
        s / m
    } else {
        0.0
    };
    // [Σ(x - mean)², Σg, Σg(x - mean)]
    let mut sums = [0f64; 3];
    for k in 0..u.count {
        let (g, x, _) = (u.seg)(k);
        // SAFETY: caller's contract.
        let s = unsafe { back_sums(isa, g, x, mean, u.len) };
        for (a, b) in sums.iter_mut().zip(s) {
            *a += b;
        }
    }
    let [sdd, sg, sgd] = sums;
    let (a, b, c) = match kind {
        NormBackKind::Norm { .. } | NormBackKind::Group { .. } => {
            let r = 1.0 / (sdd / m + eps).sqrt();
            (r, -r * r * sgd / m, -sg / m)
        }
        NormBackKind::Rms { .. } => {
            let r = 1.0 / (sdd / m + eps).sqrt();
            (r, -r * r * sgd / m, 0.0)
        }
        NormBackKind::L2 { .. } => {
            let norm = sdd.sqrt();
            if norm <= eps {
                (1.0 / eps, 0.0, 0.0)
            } else {
                let s = 1.0 / norm;
                (s, -s * s * sgd, 0.0)
            }
        }
    };
    for k in 0..u.count {
        let (g, x, y) = (u.seg)(k);
        // SAFETY: caller's contract.
        unsafe { back_combine(isa, g, x, y, u.len, [a, b, c, mean]) };
    }
}

/// `[Σ(x - mean)², Σg, Σg(x - mean)]` over `n` values, in f64 (`x - mean` too).
///
/// # Safety
/// `g` and `x` have `n` readable f32.
unsafe fn back_sums(isa: Isa, g: *const f32, x: *const f32, mean: f64, n: usize) -> [f64; 3] {
    #[cfg(target_arch = "x86_64")]
    if use_avx2(isa) {
        // SAFETY: Avx2 is chosen only when the CPU has AVX2 and FMA; caller's contract.
        return unsafe { avx2::back_sums(g, x, mean, n) };
    }
    let _ = isa;
    let mut s = [0f64; 3];
    for i in 0..n {
        // SAFETY: i < n.
        let (gi, d) = unsafe { (*g.add(i) as f64, *x.add(i) as f64 - mean) };
        s[0] += d * d;
        s[1] += gi;
        s[2] += gi * d;
    }
    s
}

/// `y = A·((g + C) + B·(x - mean))` in f64 (`k = [A, B, C, mean]`), rounded to f32.
///
/// # Safety
/// `g`, `x` have `n` readable f32, `y` `n` writable f32, equal to `g` or `x` or disjoint.
unsafe fn back_combine(isa: Isa, g: *const f32, x: *const f32, y: *mut f32, n: usize, k: [f64; 4]) {
    #[cfg(target_arch = "x86_64")]
    if use_avx2(isa) {
        // SAFETY: as in `back_sums`.
        return unsafe { avx2::back_combine(g, x, y, n, k) };
    }
    let _ = isa;
    for i in 0..n {
        // SAFETY: i < n; both inputs are read before y[i] is written.
        unsafe {
            let (gi, d) = (*g.add(i) as f64, *x.add(i) as f64 - k[3]);
            *y.add(i) = (k[0] * ((gi + k[2]) + k[1] * d)) as f32;
        }
    }
}

/// Σ x in f64.
///
/// # Safety
/// `x` has `n` readable f32.
unsafe fn sum(isa: Isa, x: *const f32, n: usize) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if use_avx2(isa) {
        // SAFETY: Avx2 is chosen only when the CPU has AVX2 and FMA; caller's contract.
        return unsafe { avx2::sum(x, n, false) };
    }
    let _ = isa;
    let mut s = 0f64;
    for i in 0..n {
        // SAFETY: i < n.
        s += unsafe { *x.add(i) } as f64;
    }
    s
}

/// Σ x² in f64 (each value widened before squaring).
///
/// # Safety
/// `x` has `n` readable f32.
unsafe fn sum_sq(isa: Isa, x: *const f32, n: usize) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if use_avx2(isa) {
        // SAFETY: as in `sum`.
        return unsafe { avx2::sum(x, n, true) };
    }
    let _ = isa;
    let mut s = 0f64;
    for i in 0..n {
        // SAFETY: i < n.
        let v = unsafe { *x.add(i) } as f64;
        s += v * v;
    }
    s
}

/// `y = x - mean` (f32), returns Σ y² in f64.
///
/// # Safety
/// `x` has `n` readable f32, `y` `n` writable f32, equal to `x` or not overlapping it.
unsafe fn sub_sq(isa: Isa, x: *const f32, mean: f32, y: *mut f32, n: usize) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if use_avx2(isa) {
        // SAFETY: as in `sum`.
        return unsafe { avx2::sub_sq(x, mean, y, n) };
    }
    let _ = isa;
    let mut s = 0f64;
    for i in 0..n {
        // SAFETY: i < n; x[i] is read before y[i] is written.
        unsafe {
            let v = *x.add(i) - mean;
            *y.add(i) = v;
            s += v as f64 * v as f64;
        }
    }
    s
}

/// `y = x · s`.
///
/// # Safety
/// As for `sub_sq`.
unsafe fn scale_to(isa: Isa, x: *const f32, y: *mut f32, n: usize, s: f32) {
    #[cfg(target_arch = "x86_64")]
    if use_avx2(isa) {
        // SAFETY: as in `sum`.
        unsafe { avx2::scale_to(x, y, n, s) };
        return;
    }
    let _ = isa;
    for i in 0..n {
        // SAFETY: i < n.
        unsafe { *y.add(i) = *x.add(i) * s };
    }
}

/// # Safety
/// `y` has `n` readable and writable f32.
unsafe fn scale_in_place(isa: Isa, y: *mut f32, n: usize, s: f32) {
    // SAFETY: x == y is allowed by `scale_to`.
    unsafe { scale_to(isa, y, y, n, s) }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn hsum_pd(v: __m256d) -> f64 {
        // SAFETY: register arithmetic, AVX enabled by the caller.
        unsafe {
            let lo = _mm256_castpd256_pd128(v);
            let hi = _mm256_extractf128_pd(v, 1);
            let s = _mm_add_pd(lo, hi);
            _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)))
        }
    }

    /// Σ x (or Σ x² with `square`) in f64: 16 values per step into four f64×4 accumulators.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn sum(x: *const f32, n: usize, square: bool) -> f64 {
        // SAFETY: loads stay below n (caller's contract).
        unsafe {
            let mut acc = [_mm256_setzero_pd(); 4];
            let mut i = 0;
            while i + 16 <= n {
                let a = _mm256_loadu_ps(x.add(i));
                let b = _mm256_loadu_ps(x.add(i + 8));
                let v = [
                    _mm256_cvtps_pd(_mm256_castps256_ps128(a)),
                    _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)),
                    _mm256_cvtps_pd(_mm256_castps256_ps128(b)),
                    _mm256_cvtps_pd(_mm256_extractf128_ps(b, 1)),
                ];
                for k in 0..4 {
                    acc[k] = if square {
                        _mm256_fmadd_pd(v[k], v[k], acc[k])
                    } else {
                        _mm256_add_pd(acc[k], v[k])
                    };
                }
                i += 16;
            }
            while i + 4 <= n {
                let v = _mm256_cvtps_pd(_mm_loadu_ps(x.add(i)));
                acc[0] = if square {
                    _mm256_fmadd_pd(v, v, acc[0])
                } else {
                    _mm256_add_pd(acc[0], v)
                };
                i += 4;
            }
            let t = _mm256_add_pd(_mm256_add_pd(acc[0], acc[1]), _mm256_add_pd(acc[2], acc[3]));
            let mut s = hsum_pd(t);
            while i < n {
                let v = *x.add(i) as f64;
                s += if square { v * v } else { v };
                i += 1;
            }
            s
        }
    }

    /// `y = x - mean` in f32; Σ y² in f64.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn sub_sq(x: *const f32, mean: f32, y: *mut f32, n: usize) -> f64 {
        // SAFETY: loads and stores stay below n; each block is loaded before it is stored.
        unsafe {
            let m = _mm256_set1_ps(mean);
            let mut acc = [_mm256_setzero_pd(); 2];
            let mut i = 0;
            while i + 8 <= n {
                let v = _mm256_sub_ps(_mm256_loadu_ps(x.add(i)), m);
                _mm256_storeu_ps(y.add(i), v);
                let lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
                let hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
                acc[0] = _mm256_fmadd_pd(lo, lo, acc[0]);
                acc[1] = _mm256_fmadd_pd(hi, hi, acc[1]);
                i += 8;
            }
            let mut s = hsum_pd(_mm256_add_pd(acc[0], acc[1]));
            while i < n {
                let v = *x.add(i) - mean;
                *y.add(i) = v;
                s += v as f64 * v as f64;
                i += 1;
            }
            s
        }
    }

    /// `y = x · s` in f32.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scale_to(x: *const f32, y: *mut f32, n: usize, s: f32) {
        // SAFETY: loads and stores stay below n; each block is loaded before it is stored.
        unsafe {
            let sv = _mm256_set1_ps(s);
            let mut i = 0;
            while i + 8 <= n {
                _mm256_storeu_ps(y.add(i), _mm256_mul_ps(_mm256_loadu_ps(x.add(i)), sv));
                i += 8;
            }
            while i < n {
                *y.add(i) = *x.add(i) * s;
                i += 1;
            }
        }
    }

    /// `[Σ(x - mean)², Σg, Σg(x - mean)]` in f64: 8 values per step, two sets of accumulators.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn back_sums(g: *const f32, x: *const f32, mean: f64, n: usize) -> [f64; 3] {
        // SAFETY: loads stay below n (caller's contract).
        unsafe {
            let mv = _mm256_set1_pd(mean);
            let mut dd = [_mm256_setzero_pd(); 2];
            let mut sg = [_mm256_setzero_pd(); 2];
            let mut gd = [_mm256_setzero_pd(); 2];
            let mut i = 0;
            while i + 8 <= n {
                let gv = _mm256_loadu_ps(g.add(i));
                let xv = _mm256_loadu_ps(x.add(i));
                let gs = [
                    _mm256_cvtps_pd(_mm256_castps256_ps128(gv)),
                    _mm256_cvtps_pd(_mm256_extractf128_ps(gv, 1)),
                ];
                let ds = [
                    _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(xv)), mv),
                    _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(xv, 1)), mv),
                ];
                for k in 0..2 {
                    dd[k] = _mm256_fmadd_pd(ds[k], ds[k], dd[k]);
                    sg[k] = _mm256_add_pd(sg[k], gs[k]);
                    gd[k] = _mm256_fmadd_pd(gs[k], ds[k], gd[k]);
                }
                i += 8;
            }
            let mut s = [
                hsum_pd(_mm256_add_pd(dd[0], dd[1])),
                hsum_pd(_mm256_add_pd(sg[0], sg[1])),
                hsum_pd(_mm256_add_pd(gd[0], gd[1])),
            ];
            while i < n {
                let (gi, d) = (*g.add(i) as f64, *x.add(i) as f64 - mean);
                s[0] += d * d;
                s[1] += gi;
                s[2] += gi * d;
                i += 1;
            }
            s
        }
    }

    /// `y = A·((g + C) + B·(x - mean))` in f64, rounded to f32 (`k = [A, B, C, mean]`).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn back_combine(g: *const f32, x: *const f32, y: *mut f32, n: usize, k: [f64; 4]) {
        // SAFETY: loads and stores stay below n; each block is loaded before it is stored.
        unsafe {
            let [a, b, c, m] = k.map(|v| _mm256_set1_pd(v));
            let one = |gv: __m128, xv: __m128| {
                let d = _mm256_sub_pd(_mm256_cvtps_pd(xv), m);
                let v = _mm256_fmadd_pd(b, d, _mm256_add_pd(_mm256_cvtps_pd(gv), c));
                _mm256_cvtpd_ps(_mm256_mul_pd(a, v))
            };
            let mut i = 0;
            while i + 8 <= n {
                let gv = _mm256_loadu_ps(g.add(i));
                let xv = _mm256_loadu_ps(x.add(i));
                let lo = one(_mm256_castps256_ps128(gv), _mm256_castps256_ps128(xv));
                let hi = one(_mm256_extractf128_ps(gv, 1), _mm256_extractf128_ps(xv, 1));
                _mm256_storeu_ps(y.add(i), _mm256_set_m128(hi, lo));
                i += 8;
            }
            while i < n {
                let (gi, d) = (*g.add(i) as f64, *x.add(i) as f64 - k[3]);
                *y.add(i) = (k[0] * k[1].mul_add(d, gi + k[2])) as f32;
                i += 1;
            }
        }
    }
}
