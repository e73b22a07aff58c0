//! CPU kernel of `flash_attn_ext`: q f32, k and v f32, f16 or bf16 (each with dense rows, any
//! other strides: permuted KV-cache views work), optional f16 or f32 mask broadcast over dims 2
//! and 3, grouped-query heads, `scale`, ALiBi (`max_bias`) and `logit_softcap`. The output is
//! contiguous f32 `[Dv, H, n_q, B]`.
//!
//! Work split: over (query, head, batch) triples, queries fastest so consecutive triples of a
//! thread share a K/V head. One triple is computed by one thread in a fixed order, so results
//! do not depend on the thread count.
//!
//! Per query row: an online softmax over blocks of `BK` = 32 kv rows. For each kv row not
//! excluded by a `-inf` mask, the score `scale · q·k` (f32 dot product with 8-lane accumulators;
//! K is read in its own type and converted in registers — the cache is never expanded in
//! memory), optionally `softcap · tanh(s / softcap)`, plus `slope · mask`. With the block's
//! scores in hand: the running max is raised if needed (`r = exp(old - new)`), `p = exp(s -
//! max)` for the whole block (the softmax family's AVX2 exp, or `f32::exp`), the block's
//! `Σ p·v` in a per-thread accumulator of `Dv` f32 (the work buffer; V converted in registers),
//! then `out = out·r + block` in the destination row and `sum = sum·r + Σp` in f64. Summing
//! per block keeps the long sum over n_kv rows to one term per block (the error of a plain f32
//! running sum over 1000 rows was 4× larger). Finally `out /= sum`; a query whose kv rows are
//! all masked gets 0 (ggml and the reference do the same).
//!
//! Accuracy: Q, the scores, the probabilities and the accumulators stay f32 (ggml's CPU rounds
//! Q to f16 for an f16 K and accumulates V in f16, and accepts an nmse of 5e-4 with f16 K/V).
//! Measured max error against the f64 reference, relative to the output's max magnitude:
//! ≤ 3.3e-7, nmse ≤ 4e-14, for f32, f16 and bf16 K/V (D from 1 to 128, n_kv up to 1100, with
//! and without mask/ALiBi/softcap) — f16 K/V values are exact inputs for both, so only f32
//! arithmetic errors remain. The tests allow 1e-6.

use tessera::{DType, Graph, Op, Result, Tensor};

use crate::exec::NodeCtx;
use crate::ops::softmax::{alibi_slope, MaskRow};
use crate::simd::Isa;

mod tiled;

/// kv rows per block of the online softmax.
const BK: usize = 32;

fn kv_type(t: DType) -> bool {
    matches!(t, DType::F32 | DType::F16 | DType::BF16)
}

/// Whether this family's kernels handle node `t` (types, layout); otherwise the fallback runs.
pub fn handles(graph: &Graph, t: &Tensor) -> bool {
    let s = |i: usize| graph.tensor(t.src[i]);
    let dense = |x: &Tensor| tessera::shape::rows_contiguous(x.dtype, &x.ne, &x.nb);
    let (q, k, v) = (s(0), s(1), s(2));
    q.dtype == DType::F32
        && dense(q)
        && kv_type(k.dtype)
        && dense(k)
        && kv_type(v.dtype)
        && dense(v)
        && t.dtype == DType::F32
        && t.is_contiguous()
        && k.ne[0] == q.ne[0]
        && v.ne[1] == k.ne[1]
        && k.ne[2] > 0
        && v.ne[2] > 0
        && q.ne[2] % k.ne[2] == 0
        && q.ne[2] % v.ne[2] == 0
        && t.ne == [v.ne[0], q.ne[2], q.ne[1], q.ne[3]]
        && (t.src.len() < 4 || {
            let m = s(3);
            matches!(m.dtype, DType::F16 | DType::F32)
                && dense(m)
                && m.ne[0] == k.ne[1]
                && m.ne[1] >= q.ne[1]
        })
        && t.src.len() <= 4
}

/// Bytes of work buffer per thread: `Dk + Dv` f32 (the rounded query and an accumulator, or
/// a block accumulator) and the ggml-precision rows kernel's `n_kv` scores and row indices.
fn per_thread(dk: usize, dv: usize, n_kv: usize) -> usize {
    ((dk + dv + 2 * n_kv) * 4).next_multiple_of(64)
}

/// Whether node `t` runs ggml's tiled algorithm (ggml precision, a batch of queries).
fn ggml_tiled(graph: &Graph, t: &Tensor) -> bool {
    let Op::FlashAttnExt(p) = t.op else {
        return false;
    };
    let s = |i: usize| graph.tensor(t.src[i]);
    p.precision == tessera::op::AttnPrecision::GgmlCpu
        && tessera::ops::attention::ggml_fa_tiled(s(0).ne[1], s(1).dtype, s(2).dtype)
}

/// Bytes of work buffer per thread for the tiled algorithm.
fn tiled_per_thread(dk: usize, dv: usize) -> usize {
    (tiled::scratch_floats(dk, dv) * 4).next_multiple_of(64)
}

/// Scratch bytes node `t` needs with `nth` threads.
pub fn work_size(graph: &Graph, t: &Tensor, nth: usize) -> usize {
    let (dk, dv) = (graph.tensor(t.src[0]).ne[0], t.ne[0]);
    if ggml_tiled(graph, t) {
        return tiled_per_thread(dk, dv) * nth;
    }
    per_thread(dk, dv, graph.tensor(t.src[1]).ne[1]) * nth
}

/// ggml's tiled algorithm (see `tiled`): each thread takes a contiguous range of (query, head,
/// batch) rows and cuts it into tiles of up to 64 queries of one head.
fn compute_tiled(ctx: &NodeCtx, p: &tessera::op::FlashAttnParams) -> Result<()> {
    let (q, k, v, d) = (ctx.s(0), ctx.s(1), ctx.s(2), ctx.t);
    let mask = (ctx.t.src.len() > 3).then(|| ctx.s(3));
    let (dk, dv) = (q.ne[0], v.ne[0]);
    let (n_q, n_head) = (q.ne[1], q.ne[2]);
    let (rk, rv) = (n_head / k.ne[2], n_head / v.ne[2]);
    let per = tiled_per_thread(dk, dv);
    if ctx.wsize < per * ctx.nth {
        return Err(ctx.err(format!(
            "work buffer of {} bytes, {} needed",
            ctx.wsize,
            per * ctx.nth
        )));
    }
    let simd = use_avx2(ctx.isa) && tiled::simd_shape(dk, dv);
    let mut scale = p.scale;
    if p.logit_softcap != 0.0 {
        scale /= p.logit_softcap;
    }
    // SAFETY: this thread owns bytes [ith·per, (ith+1)·per) of the work buffer (size checked
    // above, 64-byte aligned).
    let scratch = unsafe { ctx.wdata.add(ctx.ith * per) as *mut f32 };
    let units = ctx.share(n_q * n_head * q.ne[3]);
    let mut u = units.start;
    while u < units.end {
        let (iq, h, b) = (u % n_q, (u / n_q) % n_head, u / (n_q * n_head));
        let rows = tessera::ops::attention::GGML_FA_TILE
            .min(units.end - u)
            .min(n_q - iq);
        let (hk, hv) = (h / rk, h / rv);
        // SAFETY: spans validated by `exec::validate` and shapes by `handles`: query rows
        // iq..iq+rows of head h, kv rows below n_kv of heads hk/hv, their mask rows and output
        // rows lie inside their tensors with dense rows; the output rows are written by this
        // thread alone; `scratch` is this thread's.
        unsafe {
            let tile = tiled::Tile {
                q: ctx.src[0].add(iq * q.nb[1] + h * q.nb[2] + b * q.nb[3]),
                q_nb1: q.nb[1],
                k: ctx.src[1].add(hk * k.nb[2] + b * k.nb[3]),
                k_nb1: k.nb[1],
                v: ctx.src[2].add(hv * v.nb[2] + b * v.nb[3]),
                v_nb1: v.nb[1],
                kv_f16: k.dtype == DType::F16,
                mask: mask.map(|m| MaskRow {
                    ptr: ctx.src[3]
                        .add(iq * m.nb[1] + (h % m.ne[2]) * m.nb[2] + (b % m.ne[3]) * m.nb[3]),
                    f16: m.dtype == DType::F16,
                }),
                mask_nb1: mask.map_or(0, |m| m.nb[1]),
                slope: alibi_slope(p.max_bias, n_head, h),
                scale,
                softcap: p.logit_softcap,
                dk,
                dv,
                n_kv: k.ne[1],
                rows,
                out: ctx.dst.add(h * d.nb[1] + iq * d.nb[2] + b * d.nb[3]),
                out_nb: d.nb[2],
            };
            #[cfg(target_arch = "x86_64")]
            if simd {
                tiled::avx2::run(&tile, scratch);
                u += rows;
                continue;
            }
            let _ = simd;
            tiled::run_scalar(&tile, scratch);
        }
        u += rows;
    }
    Ok(())
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn use_avx2(isa: Isa) -> bool {
    cfg!(target_arch = "x86_64") && isa >= Isa::Avx2 && isa != Isa::Neon
}

/// One query row's job.
struct Row {
    q: *const f32,
    /// First K and V rows of the kv head, and their row strides in bytes.
    k: *const u8,
    k_nb1: usize,
    v: *const u8,
    v_nb1: usize,
    mask: Option<MaskRow>,
    slope: f32,
    scale: f32,
    softcap: f32,
    dk: usize,
    dv: usize,
    n_kv: usize,
    /// The output row (`dv` f32) and this thread's scratch (`per_thread` bytes).
    out: *mut f32,
    blk: *mut f32,
}

pub fn compute(ctx: &NodeCtx) -> Result<()> {
    let Op::FlashAttnExt(p) = ctx.t.op else {
        return Err(ctx.err("not flash_attn_ext"));
    };
    let (q, k, v, d) = (ctx.s(0), ctx.s(1), ctx.s(2), ctx.t);
    let mask = if ctx.t.src.len() > 3 {
        Some(ctx.s(3))
    } else {
        None
    };
    let (n_q, n_head, n_b) = (q.ne[1], q.ne[2], q.ne[3]);
    let dv = v.ne[0];
    let (rk, rv) = (n_head / k.ne[2], n_head / v.ne[2]);
    let per = per_thread(q.ne[0], dv, k.ne[1]);
    if ctx.wsize < per * ctx.nth {
        return Err(ctx.err(format!(
            "work buffer of {} bytes, {} needed",
            ctx.wsize,
            per * ctx.nth
        )));
    }
    let ggml = matches!(
        p.precision,
        tessera::op::AttnPrecision::GgmlCpu | tessera::op::AttnPrecision::GgmlCpuRows
    );
    if ggml_tiled(ctx.graph, ctx.t) {
        return compute_tiled(ctx, &p);
    }
    let attend = if ggml {
        ggml_compat::pick(use_avx2(ctx.isa), k.dtype, v.dtype)
    } else {
        pick(use_avx2(ctx.isa), k.dtype, v.dtype)
    };
    // SAFETY: this thread owns bytes [ith·per, (ith+1)·per) of the work buffer (size checked
    // above, 64-byte aligned): the block accumulator.
    let blk = unsafe { ctx.wdata.add(ctx.ith * per) as *mut f32 };
    let mut slope_of: Option<(usize, f32)> = None;
    for u in ctx.share(n_q * n_head * n_b) {
        let (iq, h, b) = (u % n_q, (u / n_q) % n_head, u / (n_q * n_head));
        let slope = match slope_of {
            Some((hh, s)) if hh == h => s,
            _ => {
                let s = alibi_slope(p.max_bias, n_head, h);
                slope_of = Some((h, s));
                s
            }
        };
        let (hk, hv) = (h / rk, h / rv);
        // SAFETY: spans validated by `exec::validate`; `handles` checked the shapes, so query
        // row (iq, h, b), kv rows (ic, hk|hv, b) for ic < n_kv and mask row
        // (iq, h % m2, b % m3) lie inside their tensors with dense rows. The output row
        // (h, iq, b) — `dv` contiguous f32 — is written by this thread alone and aliases no
        // source (flash_attn_ext never runs in place); `blk` is this thread's scratch.
        unsafe {
            let row = Row {
                q: ctx.src[0].add(iq * q.nb[1] + h * q.nb[2] + b * q.nb[3]) as *const f32,
                k: ctx.src[1].add(hk * k.nb[2] + b * k.nb[3]),
                k_nb1: k.nb[1],
                v: ctx.src[2].add(hv * v.nb[2] + b * v.nb[3]),
                v_nb1: v.nb[1],
                mask: mask.map(|m| MaskRow {
                    ptr: ctx.src[3]
                        .add(iq * m.nb[1] + (h % m.ne[2]) * m.nb[2] + (b % m.ne[3]) * m.nb[3]),
                    f16: m.dtype == DType::F16,
                }),
                slope,
                scale: p.scale,
                softcap: p.logit_softcap,
                dk: q.ne[0],
                dv,
                n_kv: k.ne[1],
                out: ctx.dst.add(h * d.nb[1] + iq * d.nb[2] + b * d.nb[3]) as *mut f32,
                blk,
            };
            attend(&row);
        }
    }
    Ok(())
}

/// [`AttnPrecision::GgmlCpu`](tessera::op::AttnPrecision::GgmlCpu): ggml's CPU algorithm step
/// for step — Q rounded to f16 for an f16 K, a sequential online softmax with `expf`, the V
/// accumulator rounded to f16 after every update when V is f16, and the final `· (1/S)` — so that
/// a model reproduces llama.cpp's outputs. The dot product follows ggml's AVX2 `vec_dot_f16`
/// (four 8-lane f32 accumulators over chunks of 32, then a fixed reduction).
mod ggml_compat {
    use super::{is_masked, Attend, Row};
    use crate::ops::ggml_math::{round_f16, round_f16_row};
    use crate::simd::Isa;
    use tessera::DType;

    /// Element `i` of a row of `t` as f32.
    unsafe fn ld(t: DType, p: *const u8, i: usize) -> f32 {
        // SAFETY: the caller's contract (i is inside the row).
        unsafe {
            match t {
                DType::F16 => half::f16::from_bits(*(p as *const u16).add(i)).to_f32(),
                DType::BF16 => f32::from_bits((*(p as *const u16).add(i) as u32) << 16),
                _ => *(p as *const f32).add(i),
            }
        }
    }

    /// How many K/V rows ahead of the one computed the rows kernel asks for.
    const ROWS_AHEAD: usize = 8;

    /// Asks for the `bytes` at `p` (one K or V row) ahead of use: a hint that never faults, so
    /// `p` may lie past the tensor's end.
    #[inline(always)]
    fn prefetch_row(p: *const u8, bytes: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let mut off = 0;
            while off < bytes {
                // SAFETY: prefetches do not fault and read nothing architecturally.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off) as *const i8) };
                off += 64;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (p, bytes);
    }

    /// The state the kernels share: q (rounded) and the accumulator in the row's scratch.
    /// Generic (and always inlined) so that the AVX2 kernel's primitives inline into it.
    #[inline(always)]
    unsafe fn run<D, M, S>(r: &Row, isa: Isa, kt: DType, vt: DType, dot: D, mad: M, scale16: S)
    where
        D: Fn(*const f32, *const u8, usize) -> f32,
        M: Fn(*mut f32, *const u8, f32, usize, bool),
        S: Fn(*mut f32, f32, usize, bool),
    {
        // SAFETY: `blk` holds dk + dv + 2·n_kv f32 of this thread's scratch; the other
        // pointers follow `compute`'s contract.
        unsafe {
            let (dk, dv) = (r.dk, r.dv);
            let qv = r.blk;
            let acc = r.blk.add(dk);
            std::ptr::copy_nonoverlapping(r.q, qv, dk);
            if kt == DType::F16 {
                round_f16_row(isa, qv, dk);
            }
            for i in 0..dv {
                *acc.add(i) = 0.0;
            }
            let v16 = vt == DType::F16;
            let (mut s_sum, mut m_max) = (0f32, f32::NEG_INFINITY);
            let mut scale = r.scale;
            if r.softcap != 0.0 {
                scale /= r.softcap;
            }
            // Three passes, with ggml's arithmetic in ggml's order for each row: the rows the
            // mask does not exclude and their mask terms (runs of -inf skipped 16 at a time),
            // every score (independent dot products, so the core overlaps them and their K
            // rows' misses), then the sequential online softmax and V accumulation. In one
            // pass each row waited for the previous row's exp and accumulator update before its
            // own K row was even asked for, and the excluded rows (three quarters of a
            // generation step's, whose cache grows in steps of 256) were tested one by one.
            let sc = r.blk.add(dk + dv);
            let rows = sc.add(r.n_kv) as *mut u32;
            let mut n = 0;
            let mut ic = 0;
            while ic < r.n_kv {
                if let Some(m) = r.mask {
                    if ic % 16 == 0 && ic + 16 <= r.n_kv && m.neg_inf_run16(ic) {
                        ic += 16;
                        continue;
                    }
                }
                // a -inf entry by its bits first, then the term itself
                let mv = match r.mask {
                    Some(m) if m.neg_inf_bits(ic) => f32::NEG_INFINITY,
                    Some(m) => r.slope * m.at(ic),
                    None => 0.0,
                };
                if mv != f32::NEG_INFINITY && !is_masked(r.mask, ic) {
                    *sc.add(n) = mv;
                    *rows.add(n) = ic as u32;
                    n += 1;
                }
                ic += 1;
            }
            // rows are asked for ROWS_AHEAD ahead of their use
            let row = |base: *const u8, nb1: usize, j: usize| {
                base.wrapping_add(*rows.add(j) as usize * nb1)
            };
            let (kb, vb) = (dk * kt.type_size(), dv * vt.type_size());
            for j in 0..ROWS_AHEAD.min(n) {
                prefetch_row(row(r.k, r.k_nb1, j), kb);
            }
            for j in 0..n {
                if j + ROWS_AHEAD < n {
                    prefetch_row(row(r.k, r.k_nb1, j + ROWS_AHEAD), kb);
                }
                let mut s = dot(qv, row(r.k, r.k_nb1, j), dk) * scale;
                if r.softcap != 0.0 {
                    s = r.softcap * s.tanh();
                }
                *sc.add(j) = s + *sc.add(j);
            }
            for j in 0..ROWS_AHEAD.min(n) {
                prefetch_row(row(r.v, r.v_nb1, j), vb);
            }
            for j in 0..n {
                if j + ROWS_AHEAD < n {
                    prefetch_row(row(r.v, r.v_nb1, j + ROWS_AHEAD), vb);
                }
                let s = *sc.add(j);
                let m_old = m_max;
                let (mut ms, mut vs) = (1f32, 1f32);
                if s > m_max {
                    m_max = s;
                    ms = (m_old - m_max).exp();
                    scale16(acc, ms, dv, v16);
                } else {
                    vs = (s - m_max).exp();
                }
                mad(acc, row(r.v, r.v_nb1, j), vs, dv, v16);
                s_sum = s_sum.mul_add(ms, vs); // GCC contracts this to an FMA in ggml
            }
            let inv = if s_sum == 0.0 { 0.0 } else { 1.0 / s_sum };
            for i in 0..dv {
                *r.out.add(i) = *acc.add(i) * inv;
            }
        }
    }

    macro_rules! scalar_kernels {
        ($name:ident, $kt:expr, $vt:expr) => {
            unsafe fn $name(r: &Row) {
                unsafe fn dot(q: *const f32, k: *const u8, n: usize) -> f32 {
                    // SAFETY: n elements at q and k.
                    unsafe {
                        let mut sum = [[0f32; 8]; 4];
                        let full = n - n % 32;
                        let mut i = 0;
                        while i < full {
                            for j in 0..4 {
                                for l in 0..8 {
                                    let e = i + j * 8 + l;
                                    sum[j][l] = (*q.add(e)).mul_add(ld($kt, k, e), sum[j][l]);
                                }
                            }
                            i += 32;
                        }
                        reduce(&mut sum)
                            + (full..n)
                                .map(|e| *q.add(e) as f64 * ld($kt, k, e) as f64)
                                .sum::<f64>() as f32
                    }
                }
                unsafe fn mad(acc: *mut f32, v: *const u8, vs: f32, n: usize, v16: bool) {
                    // SAFETY: n elements at acc and v.
                    unsafe {
                        for i in 0..n {
                            let x = ld($vt, v, i).mul_add(vs, *acc.add(i));
                            *acc.add(i) = if v16 { round_f16(x) } else { x };
                        }
                    }
                }
                unsafe fn scale16(acc: *mut f32, ms: f32, n: usize, v16: bool) {
                    // SAFETY: n elements at acc.
                    unsafe {
                        for i in 0..n {
                            let x = *acc.add(i) * ms;
                            *acc.add(i) = if v16 { round_f16(x) } else { x };
                        }
                    }
                }
                // SAFETY: forwarded contract; the primitives' own contracts hold for the calls
                // `run` makes (in-bounds rows of the caller's tensors).
                unsafe {
                    run(
                        r,
                        Isa::Scalar,
                        $kt,
                        $vt,
                        |q, k, n| dot(q, k, n),
                        |a, v, s, n, b| mad(a, v, s, n, b),
                        |a, m, n, b| scale16(a, m, n, b),
                    )
                }
            }
        };
    }

    /// ggml's reduction of four 8-lane accumulators: 0+=2, 1+=3, 0+=1, then the 8 lanes.
    fn reduce(sum: &mut [[f32; 8]; 4]) -> f32 {
        for l in 0..8 {
            sum[0][l] += sum[2][l];
            sum[1][l] += sum[3][l];
        }
        for l in 0..8 {
            sum[0][l] += sum[1][l];
        }
        let t: [f32; 4] = std::array::from_fn(|l| sum[0][l] + sum[0][l + 4]);
        let h = [t[0] + t[1], t[2] + t[3]];
        h[0] + h[1]
    }

    scalar_kernels!(k16_v16, DType::F16, DType::F16);

    /// The f16 K / f16 V kernel with F16C and FMA: the same operations as ggml's AVX2 build
    /// (`ggml_vec_dot_f16`, `ggml_vec_mad_f16`, `ggml_vec_scale_f16`), 8 lanes at a time.
    #[cfg(target_arch = "x86_64")]
    pub(super) mod avx2 {
        use super::{run, Row};
        use crate::ops::ggml_math::round_f16;
        use crate::simd::Isa;
        use std::arch::x86_64::*;
        use tessera::DType;

        /// q (f32 values already rounded to f16) · k (f16 row), ggml's order: four 8-lane
        /// accumulators over chunks of 32, ggml's reduction, the rest in f64.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn dot(q: *const f32, k: *const u8, n: usize) -> f32 {
            // SAFETY: n elements at q and k (the caller's contract).
            unsafe {
                let k = k as *const u16;
                let mut acc = [_mm256_setzero_ps(); 4];
                let full = n - n % 32;
                let mut i = 0;
                while i < full {
                    for (j, a) in acc.iter_mut().enumerate() {
                        let kx =
                            _mm256_cvtph_ps(_mm_loadu_si128(k.add(i + j * 8) as *const __m128i));
                        let qy = _mm256_loadu_ps(q.add(i + j * 8));
                        *a = _mm256_fmadd_ps(kx, qy, *a);
                    }
                    i += 32;
                }
                let a0 =
                    _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
                let t0 = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
                let t1 = _mm_hadd_ps(t0, t0);
                let mut sum = _mm_cvtss_f32(_mm_hadd_ps(t1, t1)) as f64;
                for e in full..n {
                    let kv = crate::ops::qdot::avx2::f16_bits(*k.add(e));
                    sum += (*q.add(e) * kv) as f64;
                }
                sum as f32
            }
        }

        /// acc = f16(v·vs + acc), fused, 8 lanes at a time.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn mad(acc: *mut f32, v: *const u8, vs: f32, n: usize, _v16: bool) {
            // SAFETY: n elements at acc and v.
            unsafe {
                let v = v as *const u16;
                let s = _mm256_set1_ps(vs);
                let mut i = 0;
                while i + 8 <= n {
                    let vx = _mm256_cvtph_ps(_mm_loadu_si128(v.add(i) as *const __m128i));
                    let y = _mm256_fmadd_ps(vx, s, _mm256_loadu_ps(acc.add(i)));
                    let r = _mm256_cvtph_ps(_mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT));
                    _mm256_storeu_ps(acc.add(i), r);
                    i += 8;
                }
                while i < n {
                    let vx = crate::ops::qdot::avx2::f16_bits(*v.add(i));
                    let y = vx.mul_add(vs, *acc.add(i));
                    *acc.add(i) = round_f16(y);
                    i += 1;
                }
            }
        }

        /// acc = f16(acc·ms).
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn scale16(acc: *mut f32, ms: f32, n: usize, _v16: bool) {
            // SAFETY: n elements at acc.
            unsafe {
                let s = _mm256_set1_ps(ms);
                let mut i = 0;
                while i + 8 <= n {
                    let y = _mm256_mul_ps(_mm256_loadu_ps(acc.add(i)), s);
                    _mm256_storeu_ps(
                        acc.add(i),
                        _mm256_cvtph_ps(_mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT)),
                    );
                    i += 8;
                }
                while i < n {
                    *acc.add(i) = round_f16(*acc.add(i) * ms);
                    i += 1;
                }
            }
        }

        /// # Safety
        /// As for every `Attend`; the CPU has AVX2, FMA and F16C.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(crate) unsafe fn k16_v16(r: &Row) {
            // SAFETY: forwarded; the wrappers are only called on CPUs with the features.
            unsafe {
                run(
                    r,
                    Isa::Avx2,
                    DType::F16,
                    DType::F16,
                    |q, k, n| dot(q, k, n),
                    |a, v, s, n, b| mad(a, v, s, n, b),
                    |a, m, n, b| scale16(a, m, n, b),
                )
            }
        }
    }
    scalar_kernels!(k16_v32, DType::F16, DType::F32);
    scalar_kernels!(k32_v16, DType::F32, DType::F16);
    scalar_kernels!(k32_v32, DType::F32, DType::F32);
    scalar_kernels!(kb_vb, DType::BF16, DType::BF16);

    pub(super) fn pick(avx: bool, kt: DType, vt: DType) -> Attend {
        #[cfg(target_arch = "x86_64")]
        if avx && kt == DType::F16 && vt == DType::F16 {
            return avx2::k16_v16 as Attend;
        }
        let _ = avx;
        match (kt, vt) {
            (DType::F16, DType::F16) => k16_v16 as Attend,
            (DType::F16, _) => k16_v32 as Attend,
            (DType::F32, DType::F16) => k32_v16 as Attend,
            (DType::BF16, DType::BF16) => kb_vb as Attend,
            _ => k32_v32 as Attend,
        }
    }
}

/// A query-row kernel, monomorphised for the K and V types and the instruction set.
type Attend = unsafe fn(&Row);

fn pick(avx: bool, kt: DType, vt: DType) -> Attend {
    macro_rules! by_v {
        ($simd:ty, $k:ty) => {
            match vt {
                DType::F16 => attend_with::<$simd, $k, F16> as Attend,
                DType::BF16 => attend_with::<$simd, $k, Bf16> as Attend,
                _ => attend_with::<$simd, $k, F32> as Attend,
            }
        };
    }
    macro_rules! by_kv {
        ($simd:ty) => {
            match kt {
                DType::F16 => by_v!($simd, F16),
                DType::BF16 => by_v!($simd, Bf16),
                _ => by_v!($simd, F32),
            }
        };
    }
    #[cfg(target_arch = "x86_64")]
    if avx {
        return by_kv!(avx2::Avx2);
    }
    let _ = avx;
    by_kv!(Scalar)
}

/// The entry point of one monomorphised kernel: `S::run` enables S's instruction set.
///
/// # Safety
/// The pointers of `r` are valid as `compute` describes; `S` is supported by the CPU.
unsafe fn attend_with<S: Simd, K: Elem, V: Elem>(r: &Row) {
    // SAFETY: forwarded caller's contract.
    unsafe { S::run::<K, V>(r) }
}

/// An element type of K or V.
trait Elem {
    /// Element `i` of a row as f32.
    ///
    /// # Safety
    /// The row has more than `i` elements.
    unsafe fn ld(p: *const u8, i: usize) -> f32;
    /// Eight elements at `i` (AVX2 + F16C enabled by the caller).
    ///
    /// # Safety
    /// The row has at least `i + 8` elements.
    #[cfg(target_arch = "x86_64")]
    unsafe fn ld8(p: *const u8, i: usize) -> std::arch::x86_64::__m256;
}

struct F32;
struct F16;
struct Bf16;

impl Elem for F32 {
    #[inline(always)]
    unsafe fn ld(p: *const u8, i: usize) -> f32 {
        // SAFETY: caller's contract.
        unsafe { *(p as *const f32).add(i) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn ld8(p: *const u8, i: usize) -> std::arch::x86_64::__m256 {
        // SAFETY: caller's contract.
        unsafe { std::arch::x86_64::_mm256_loadu_ps((p as *const f32).add(i)) }
    }
}

impl Elem for F16 {
    #[inline(always)]
    unsafe fn ld(p: *const u8, i: usize) -> f32 {
        // SAFETY: caller's contract.
        unsafe { half::f16::from_bits(*(p as *const u16).add(i)).to_f32() }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn ld8(p: *const u8, i: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: caller's contract.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128((p as *const u16).add(i) as *const __m128i)) }
    }
}

impl Elem for Bf16 {
    #[inline(always)]
    unsafe fn ld(p: *const u8, i: usize) -> f32 {
        // SAFETY: caller's contract.
        unsafe { f32::from_bits((*(p as *const u16).add(i) as u32) << 16) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn ld8(p: *const u8, i: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: caller's contract.
        unsafe {
            let h = _mm_loadu_si128((p as *const u16).add(i) as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
        }
    }
}

/// The vector primitives of the kernel, per instruction set.
trait Simd {
    /// Runs [`attend`] with this instruction set enabled.
    ///
    /// # Safety
    /// As for `attend`; the CPU supports the instruction set.
    unsafe fn run<K: Elem, V: Elem>(r: &Row);
    /// `Σ q[i]·k[i]` over `n` values.
    ///
    /// # Safety
    /// `q` has `n` f32, `k` `n` elements.
    unsafe fn dot<K: Elem>(q: *const f32, k: *const u8, n: usize) -> f32;
    /// `out[i] += p·v[i]`, or `out[i] = p·v[i]` when `first`.
    ///
    /// # Safety
    /// `v` has `n` elements, `out` `n` f32.
    unsafe fn axpy<V: Elem>(p: f32, v: *const u8, out: *mut f32, n: usize, first: bool);
    /// `out = out·r + blk`.
    ///
    /// # Safety
    /// `out` and `blk` have `n` f32 and do not overlap.
    unsafe fn merge(out: *mut f32, r: f32, blk: *const f32, n: usize);
    /// `out *= s`.
    ///
    /// # Safety
    /// `out` has `n` f32.
    unsafe fn scale(out: *mut f32, n: usize, s: f32);
    /// `s = exp(s - max)` for at most `BK` scores.
    ///
    /// # Safety
    /// The instruction set is enabled (always true for the scalar one).
    unsafe fn exp_block(s: &mut [f32], max: f32);
}

struct Scalar;

impl Simd for Scalar {
    unsafe fn run<K: Elem, V: Elem>(r: &Row) {
        // SAFETY: forwarded caller's contract.
        unsafe { attend::<Self, K, V>(r) }
    }
    #[inline(always)]
    unsafe fn dot<K: Elem>(q: *const f32, k: *const u8, n: usize) -> f32 {
        let mut acc = [0f32; 8];
        let mut i = 0;
        // SAFETY: every index is below n.
        unsafe {
            while i + 8 <= n {
                for (l, a) in acc.iter_mut().enumerate() {
                    *a += *q.add(i + l) * K::ld(k, i + l);
                }
                i += 8;
            }
            let mut s =
                ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
            while i < n {
                s += *q.add(i) * K::ld(k, i);
                i += 1;
            }
            s
        }
    }
    #[inline(always)]
    unsafe fn axpy<V: Elem>(p: f32, v: *const u8, out: *mut f32, n: usize, first: bool) {
        for i in 0..n {
            // SAFETY: i < n.
            unsafe {
                let x = p * V::ld(v, i);
                *out.add(i) = if first { x } else { *out.add(i) + x };
            }
        }
    }
    #[inline(always)]
    unsafe fn merge(out: *mut f32, r: f32, blk: *const f32, n: usize) {
        for i in 0..n {
            // SAFETY: i < n.
            unsafe { *out.add(i) = *out.add(i) * r + *blk.add(i) };
        }
    }
    #[inline(always)]
    unsafe fn scale(out: *mut f32, n: usize, s: f32) {
        for i in 0..n {
            // SAFETY: i < n.
            unsafe { *out.add(i) *= s };
        }
    }
    #[inline(always)]
    unsafe fn exp_block(s: &mut [f32], max: f32) {
        for x in s {
            *x = (*x - max).exp();
        }
    }
}

/// Whether kv row `ic` is excluded by a `-inf` mask entry.
///
/// # Safety
/// The mask row has more than `ic` values.
#[inline(always)]
unsafe fn is_masked(m: Option<MaskRow>, ic: usize) -> bool {
    // SAFETY: caller's contract.
    m.is_some_and(|m| unsafe { m.at(ic) } == f32::NEG_INFINITY)
}

/// One query row: the online softmax of the module docs, with `S`'s primitives.
///
/// # Safety
/// The pointers of `r` are valid as `compute` describes; `S`'s instruction set is enabled.
#[inline(always)]
unsafe fn attend<S: Simd, K: Elem, V: Elem>(r: &Row) {
    // SAFETY: every K/V row read is below n_kv, every mask value below n_kv, every output and
    // block-accumulator value below dv (the caller's contract).
    unsafe {
        let (out, blk, dv) = (r.out, r.blk, r.dv);
        for i in 0..dv {
            *out.add(i) = 0.0;
        }
        let mut max = f32::NEG_INFINITY;
        let mut sum = 0f64;
        let mut scores = [0f32; BK];
        let mut c0 = 0;
        while c0 < r.n_kv {
            let nb = BK.min(r.n_kv - c0);
            let mut bmax = f32::NEG_INFINITY;
            for (j, sc) in scores.iter_mut().enumerate().take(nb) {
                let ic = c0 + j;
                let mv = match r.mask {
                    Some(m) => {
                        let mv = m.at(ic);
                        if mv == f32::NEG_INFINITY {
                            *sc = f32::NEG_INFINITY;
                            continue;
                        }
                        r.slope * mv
                    }
                    None => 0.0,
                };
                let mut s = S::dot::<K>(r.q, r.k.add(ic * r.k_nb1), r.dk) * r.scale;
                if r.softcap != 0.0 {
                    s = r.softcap * (s / r.softcap).tanh();
                }
                s += mv;
                *sc = s;
                bmax = bmax.max(s);
            }
            if bmax == f32::NEG_INFINITY {
                c0 += nb;
                continue; // every row of the block is masked
            }
            // the accumulated rows' weights shrink by exp(old max - new max)
            let rs = if bmax > max {
                let rs = if max == f32::NEG_INFINITY {
                    0.0
                } else {
                    (max - bmax).exp()
                };
                max = bmax;
                rs
            } else {
                1.0
            };
            S::exp_block(&mut scores[..nb], max);
            // Σ p·v of the block in its own accumulator, then out = out·rs + block
            let mut bsum = 0f64;
            let mut first = true;
            for (j, &pj) in scores.iter().enumerate().take(nb) {
                // masked rows have p = exp(-inf) = 0 and are skipped like the reference skips
                // them (a 0 · inf in V must not give NaN)
                if pj == 0.0 && is_masked(r.mask, c0 + j) {
                    continue;
                }
                bsum += pj as f64;
                S::axpy::<V>(pj, r.v.add((c0 + j) * r.v_nb1), blk, dv, first);
                first = false;
            }
            if !first {
                S::merge(out, rs, blk, dv);
                sum = sum * rs as f64 + bsum;
            }
            c0 += nb;
        }
        if sum > 0.0 {
            S::scale(out, dv, (1.0 / sum) as f32);
        } else if sum.is_nan() {
            S::scale(out, dv, f32::NAN);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{attend, Elem, Row, Simd, BK};
    use crate::ops::softmax::avx2::exp8;
    use std::arch::x86_64::*;

    pub struct Avx2;

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        // SAFETY: register arithmetic, AVX enabled by the caller.
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
        }
    }

    /// [`attend`] compiled with AVX2, FMA and F16C: every primitive below inlines into it.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn run_avx2<K: Elem, V: Elem>(r: &Row) {
        // SAFETY: forwarded caller's contract; the features are enabled here.
        unsafe { attend::<Avx2, K, V>(r) }
    }

    impl Simd for Avx2 {
        unsafe fn run<K: Elem, V: Elem>(r: &Row) {
            // SAFETY: `Avx2` is picked only when the CPU has AVX2, FMA and F16C.
            unsafe { run_avx2::<K, V>(r) }
        }

        #[inline(always)]
        unsafe fn dot<K: Elem>(q: *const f32, k: *const u8, n: usize) -> f32 {
            // SAFETY: loads stay below n (caller's contract).
            unsafe {
                let mut a0 = _mm256_setzero_ps();
                let mut a1 = _mm256_setzero_ps();
                let mut i = 0;
                while i + 16 <= n {
                    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(i)), K::ld8(k, i), a0);
                    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(i + 8)), K::ld8(k, i + 8), a1);
                    i += 16;
                }
                if i + 8 <= n {
                    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(i)), K::ld8(k, i), a0);
                    i += 8;
                }
                let mut s = hsum(_mm256_add_ps(a0, a1));
                while i < n {
                    s = (*q.add(i)).mul_add(K::ld(k, i), s);
                    i += 1;
                }
                s
            }
        }

        #[inline(always)]
        unsafe fn axpy<V: Elem>(p: f32, v: *const u8, out: *mut f32, n: usize, first: bool) {
            // SAFETY: loads and stores stay below n (caller's contract).
            unsafe {
                let pv = _mm256_set1_ps(p);
                let mut i = 0;
                if first {
                    while i + 8 <= n {
                        _mm256_storeu_ps(out.add(i), _mm256_mul_ps(pv, V::ld8(v, i)));
                        i += 8;
                    }
                    while i < n {
                        *out.add(i) = p * V::ld(v, i);
                        i += 1;
                    }
                    return;
                }
                while i + 8 <= n {
                    let o = _mm256_loadu_ps(out.add(i));
                    _mm256_storeu_ps(out.add(i), _mm256_fmadd_ps(pv, V::ld8(v, i), o));
                    i += 8;
                }
                while i < n {
                    *out.add(i) = p.mul_add(V::ld(v, i), *out.add(i));
                    i += 1;
                }
            }
        }

        #[inline(always)]
        unsafe fn merge(out: *mut f32, r: f32, blk: *const f32, n: usize) {
            // SAFETY: loads and stores stay below n (caller's contract).
            unsafe {
                let rv = _mm256_set1_ps(r);
                let mut i = 0;
                while i + 8 <= n {
                    let o = _mm256_loadu_ps(out.add(i));
                    let b = _mm256_loadu_ps(blk.add(i));
                    _mm256_storeu_ps(out.add(i), _mm256_fmadd_ps(o, rv, b));
                    i += 8;
                }
                while i < n {
                    *out.add(i) = (*out.add(i)).mul_add(r, *blk.add(i));
                    i += 1;
                }
            }
        }

        #[inline(always)]
        unsafe fn scale(out: *mut f32, n: usize, s: f32) {
            // SAFETY: loads and stores stay below n (caller's contract).
            unsafe {
                let sv = _mm256_set1_ps(s);
                let mut i = 0;
                while i + 8 <= n {
                    _mm256_storeu_ps(out.add(i), _mm256_mul_ps(_mm256_loadu_ps(out.add(i)), sv));
                    i += 8;
                }
                while i < n {
                    *out.add(i) *= s;
                    i += 1;
                }
            }
        }

        /// Through a padded copy, so that every score gets the same vector exp.
        #[inline(always)]
        unsafe fn exp_block(s: &mut [f32], max: f32) {
            let mut buf = [f32::NEG_INFINITY; BK];
            let n = s.len().min(BK);
            buf[..n].copy_from_slice(&s[..n]);
            // SAFETY: `buf` holds BK floats, a multiple of 8; AVX2 and FMA are enabled by the
            // caller (this is only inlined into `run_avx2`).
            unsafe {
                let m = _mm256_set1_ps(max);
                for c in (0..BK).step_by(8) {
                    let p = buf.as_mut_ptr().add(c);
                    _mm256_storeu_ps(p, exp8(_mm256_sub_ps(_mm256_loadu_ps(p), m)));
                }
            }
            s[..n].copy_from_slice(&buf[..n]);
        }
    }
}
