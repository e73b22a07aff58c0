//! flash_attn_ext: softmax(scale · q·kᵀ (+ ALiBi mask), optional logit softcap) · v, with
//! grouped-query heads.
//!
//! Shapes as in ggml: q `[D, n_q, H, B]` f32, k `[D, n_kv, H_kv, B]`, v `[Dv, n_kv, H_kv', B]`
//! (f32, f16 or bf16; `H` a multiple of `H_kv` and `H_kv'`: head `h` reads kv head
//! `h / (H / H_kv)`), mask f16 `[n_kv, >= n_q, …]` broadcast over dims 2 and 3. The result is
//! f32 `[Dv, H, n_q, B]`: heads and queries swapped relative to q (ggml's permute(0, 2, 1, 3)).

use crate::error::Result;
use crate::graph::{Graph, F32_ONLY, FLOATS};
use crate::op::Op;
use crate::ops::softmax::alibi_slope;
use crate::reference::{Dense, NodeRef};
use crate::shape::fmt_ne;
use crate::tensor::TensorId;
use crate::DType;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlashAttnParams {
    pub scale: f32,
    pub max_bias: f32,
    pub logit_softcap: f32,
    pub precision: AttnPrecision,
}

/// How precisely flash attention computes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AttnPrecision {
    /// Scores, probabilities and the weighted sum of V in full precision (f32 on the CPU, f64
    /// in the reference). The default.
    #[default]
    F32,
    /// Exactly what ggml's CPU backend computes when K is f16: Q rounded to f16 before the
    /// dot products, a sequential online softmax over the kv rows in f32 (`expf`), and — when V
    /// is f16 — the running weighted sum of V kept in f16 (rounded after every update). Less
    /// precise; used to reproduce llama.cpp's outputs token for token. For a batch of at least
    /// 64 queries with f16 or f32 K and V, ggml (and so this mode) runs its tiled algorithm
    /// instead: Q in f32, tiles of 64 kv rows, f32 accumulators.
    GgmlCpu,
    /// ggml's row-by-row algorithm (as `GgmlCpu` for fewer than 64 queries) for any batch size,
    /// so that a query's result does not depend on how many other queries share its batch —
    /// what a server that batches independent requests needs.
    GgmlCpuRows,
}

impl Graph {
    /// ggml_flash_attn_ext: for each query row, `s = scale · q·k` over the kv rows, then
    /// `s = softcap · tanh(s / softcap)` when `logit_softcap != 0`, plus `slope · mask` (ALiBi
    /// slope of the head with `max_bias > 0`, else 1); the result is `Σ softmax(s) · v`, and 0
    /// for a query whose mask is `-inf` everywhere. Output f32 `[Dv, H, n_q, B]`.
    #[allow(clippy::too_many_arguments)]
    pub fn flash_attn_ext(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        mask: Option<TensorId>,
        scale: f32,
        max_bias: f32,
        logit_softcap: f32,
    ) -> Result<TensorId> {
        const OP: &str = "flash_attn_ext";
        let mut src = vec![q, k, v];
        src.extend(mask);
        let f16: &[DType] = &[DType::F16];
        self.check_types(OP, &src, &[F32_ONLY, FLOATS, FLOATS, f16])?;
        let (qn, kn, vn) = (self.ne(q), self.ne(k), self.ne(v));
        let shapes = format!("q {}, k {}, v {}", fmt_ne(&qn), fmt_ne(&kn), fmt_ne(&vn));
        if kn[0] != qn[0] {
            return Err(self.shape_err(
                OP,
                format!(
                    "{shapes}: k's head size {} differs from q's {}",
                    kn[0], qn[0]
                ),
                &src,
            ));
        }
        if vn[1] != kn[1] {
            return Err(self.shape_err(
                OP,
                format!("{shapes}: v has {} kv rows, k has {}", vn[1], kn[1]),
                &src,
            ));
        }
        if kn[2] == 0 || vn[2] == 0 || !qn[2].is_multiple_of(kn[2]) || !qn[2].is_multiple_of(vn[2])
        {
            return Err(self.shape_err(
                OP,
                format!(
                    "{shapes}: q's {} heads are not a multiple of k's {} and v's {} heads",
                    qn[2], kn[2], vn[2]
                ),
                &src,
            ));
        }
        if kn[3] != qn[3] || vn[3] != qn[3] {
            return Err(self.shape_err(
                OP,
                format!("{shapes}: q, k and v must have the same dim 3"),
                &src,
            ));
        }
        if let Some(m) = mask {
            let mn = self.ne(m);
            if !self.is_contiguous(m) {
                return Err(self.shape_err(OP, "the mask must be contiguous", &src));
            }
            if mn[0] != kn[1]
                || mn[1] < qn[1]
                || !qn[2].is_multiple_of(mn[2])
                || !qn[3].is_multiple_of(mn[3])
            {
                return Err(self.shape_err(
                    OP,
                    format!(
                        "mask {} does not fit: it needs ne0 == n_kv = {}, ne1 >= n_q = {}, and ne2, ne3 dividing {}, {}",
                        fmt_ne(&mn),
                        kn[1],
                        qn[1],
                        qn[2],
                        qn[3]
                    ),
                    &src,
                ));
            }
        } else if max_bias > 0.0 {
            return Err(self.shape_err(
                OP,
                format!("max_bias {max_bias} > 0 (ALiBi) needs a mask"),
                &src,
            ));
        }
        let ne = [vn[0], qn[2], qn[1], qn[3]];
        let params = FlashAttnParams {
            precision: AttnPrecision::F32,
            scale,
            max_bias,
            logit_softcap,
        };
        Ok(self.node(Op::FlashAttnExt(params), DType::F32, ne, &src))
    }
}

impl Graph {
    /// Sets the precision of a `flash_attn_ext` node (ggml's `ggml_flash_attn_ext_set_prec`).
    pub fn set_flash_attn_precision(
        &mut self,
        node: TensorId,
        precision: AttnPrecision,
    ) -> Result<()> {
        self.check_id("flash_attn_ext", node)?;
        match &mut self.tensor_mut(node).op {
            Op::FlashAttnExt(p) => {
                p.precision = precision;
                Ok(())
            }
            other => Err(crate::Error::Invalid(format!(
                "set_flash_attn_precision: node {node} is {other}, not flash_attn_ext"
            ))),
        }
    }
}

/// f32 → f16 → f32, round to nearest even (ggml's conversion).
fn f16r(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// Query rows (and kv rows) per tile of ggml's tiled CPU flash attention (`GGML_FA_TILE_Q`,
/// `GGML_FA_TILE_KV`).
pub const GGML_FA_TILE: usize = 64;

/// Whether ggml's CPU backend computes this flash attention with its tiled algorithm (at least
/// a tile of queries, K and V both f32 or both f16) rather than row by row.
pub fn ggml_fa_tiled(n_q: usize, k: DType, v: DType) -> bool {
    n_q >= GGML_FA_TILE && k == v && matches!(k, DType::F16 | DType::F32)
}

/// One query row's online-softmax step over a tile of ggml's tiled flash attention: `sc`
/// holds the tile's scores (`-inf` where masked or past the last kv row). Returns false (and
/// changes nothing) when the whole tile is masked; else raises the running max `m_max` —
/// rescaling `acc` and `s_sum` by `expf` of the difference — turns `sc` into probabilities
/// with ggml's vector `exp` and adds their sum (groups of 8 in ggml's horizontal order, in f64)
/// to `s_sum`. Shared by the reference and the CPU backend's portable kernel.
pub fn ggml_fa_tile_softmax(
    sc: &mut [f32; GGML_FA_TILE],
    m_max: &mut f32,
    s_sum: &mut f32,
    acc: &mut [f32],
) -> bool {
    let tile_max = sc
        .iter()
        .fold(f32::NEG_INFINITY, |m, &x| if m > x { m } else { x });
    if tile_max == f32::NEG_INFINITY {
        return false;
    }
    let m_new = m_max.max(tile_max);
    if m_new > *m_max {
        let ms = (*m_max - m_new).exp();
        for a in acc.iter_mut() {
            *a *= ms;
        }
        *s_sum *= ms;
    }
    *m_max = m_new;
    let mut sum = 0f64;
    for g in sc.chunks_exact_mut(8) {
        for x in g.iter_mut() {
            *x = crate::numerics::ggml_expf(*x - m_new);
        }
        sum += (((g[0] + g[4]) + (g[2] + g[6])) + ((g[1] + g[5]) + (g[3] + g[7]))) as f64;
    }
    *s_sum = (*s_sum as f64 + sum) as f32;
    true
}

/// ggml's tiled CPU flash attention (`ggml_compute_forward_flash_attn_ext_tiled`), one query
/// row at a time (the row's result does not depend on the tiling): Q stays f32; per tile of 64
/// kv rows, each score is a sequential f32 FMA chain over D, times `scale` (soft-capped), plus
/// `slope · mask`; the tile's max raises the running max (`expf` of the difference rescales
/// the accumulator and the sum); the probabilities are ggml's vector `exp`, summed in groups of
/// 8 (ggml's horizontal order) into an f64 that is added to the f32 sum; `acc += p·v` is a
/// sequential FMA chain over the tile's rows in f32; at the end `acc · (1/S)`.
fn reference_ggml_tiled(p: &FlashAttnParams, src: &[Dense]) -> Result<Dense> {
    let (q, k, v) = (&src[0], &src[1], &src[2]);
    let mask = src.get(3);
    let (d, n_q, n_head, n_b) = (q.ne[0], q.ne[1], q.ne[2], q.ne[3]);
    let (n_kv, dv) = (k.ne[1], v.ne[0]);
    let (rk, rv) = (n_head / k.ne[2], n_head / v.ne[2]);
    let mut scale = p.scale;
    if p.logit_softcap != 0.0 {
        scale /= p.logit_softcap;
    }
    let mut out = Dense::zeros([dv, n_head, n_q, n_b]);
    let mut acc = vec![0f32; dv];
    let mut sc = [0f32; GGML_FA_TILE];
    for b in 0..n_b {
        for h in 0..n_head {
            let slope = alibi_slope(p.max_bias, n_head, h) as f32;
            let (hk, hv) = (h / rk, h / rv);
            for iq in 0..n_q {
                let (mut s_sum, mut m_max) = (0f32, f32::NEG_INFINITY);
                acc.fill(0.0);
                for ic in (0..n_kv).step_by(GGML_FA_TILE) {
                    let kv_tile = GGML_FA_TILE.min(n_kv - ic);
                    for (j, s) in sc.iter_mut().enumerate() {
                        if j >= kv_tile {
                            *s = f32::NEG_INFINITY;
                            continue;
                        }
                        let mut dot = 0f32;
                        for i in 0..d {
                            dot = (q.at(i, iq, h, b) as f32)
                                .mul_add(k.at(i, ic + j, hk, b) as f32, dot);
                        }
                        let mut x = dot * scale;
                        if p.logit_softcap != 0.0 {
                            x = x.tanh() * p.logit_softcap;
                        }
                        if let Some(m) = mask {
                            x += slope * m.at(ic + j, iq, h % m.ne[2], b % m.ne[3]) as f32;
                        }
                        *s = x;
                    }
                    if !ggml_fa_tile_softmax(&mut sc, &mut m_max, &mut s_sum, &mut acc) {
                        continue;
                    }
                    for (i, a) in acc.iter_mut().enumerate() {
                        for (j, &pj) in sc[..kv_tile].iter().enumerate() {
                            *a = (v.at(i, ic + j, hv, b) as f32).mul_add(pj, *a);
                        }
                    }
                }
                let inv = if s_sum == 0.0 { 0.0 } else { 1.0 / s_sum };
                for (i, &a) in acc.iter().enumerate() {
                    out.set(i, h, iq, b, (a * inv) as f64);
                }
            }
        }
    }
    Ok(out)
}

/// ggml's CPU algorithm, step for step (see [`AttnPrecision::GgmlCpu`]): the tiled algorithm
/// for batches of at least [`GGML_FA_TILE`] queries with f32 or f16 K and V (as ggml chooses),
/// else the row-by-row one.
fn reference_ggml(n: &NodeRef, p: &FlashAttnParams, src: &[Dense]) -> Result<Dense> {
    let (q, k, v) = (&src[0], &src[1], &src[2]);
    if p.precision == AttnPrecision::GgmlCpu
        && ggml_fa_tiled(q.ne[1], n.src(1).dtype, n.src(2).dtype)
    {
        return reference_ggml_tiled(p, src);
    }
    let mask = src.get(3);
    let (d, n_q, n_head, n_b) = (q.ne[0], q.ne[1], q.ne[2], q.ne[3]);
    let (n_kv, dv) = (k.ne[1], v.ne[0]);
    let (rk, rv) = (n_head / k.ne[2], n_head / v.ne[2]);
    let k_f16 = n.src(1).dtype == DType::F16;
    let v_f16 = n.src(2).dtype == DType::F16;
    let mut scale = p.scale;
    if p.logit_softcap != 0.0 {
        scale /= p.logit_softcap;
    }
    let mut out = Dense::zeros([dv, n_head, n_q, n_b]);
    let mut acc = vec![0f32; dv];
    for b in 0..n_b {
        for h in 0..n_head {
            let slope = alibi_slope(p.max_bias, n_head, h) as f32;
            let (hk, hv) = (h / rk, h / rv);
            for iq in 0..n_q {
                let qr: Vec<f32> = (0..d)
                    .map(|i| {
                        let x = q.at(i, iq, h, b) as f32;
                        if k_f16 {
                            f16r(x)
                        } else {
                            x
                        }
                    })
                    .collect();
                let (mut s_sum, mut m_max) = (0f32, f32::NEG_INFINITY);
                acc.fill(0.0);
                for ic in 0..n_kv {
                    let mv = mask.map_or(0.0, |m| {
                        slope * m.at(ic, iq, h % m.ne[2], b % m.ne[3]) as f32
                    });
                    if mv == f32::NEG_INFINITY {
                        continue;
                    }
                    // f16·f16 products are exact in f64; ggml sums them in f32 lanes
                    let dot: f64 = (0..d).map(|i| qr[i] as f64 * k.at(i, ic, hk, b)).sum();
                    let mut s = dot as f32 * scale;
                    if p.logit_softcap != 0.0 {
                        s = p.logit_softcap * s.tanh();
                    }
                    s += mv;
                    let m_old = m_max;
                    let (mut ms, mut vs) = (1f32, 1f32);
                    if s > m_max {
                        m_max = s;
                        ms = (m_old - m_max).exp();
                        for a in acc.iter_mut() {
                            *a = if v_f16 { f16r(*a * ms) } else { *a * ms };
                        }
                    } else {
                        vs = (s - m_max).exp();
                    }
                    for (i, a) in acc.iter_mut().enumerate() {
                        let x = *a + v.at(i, ic, hv, b) as f32 * vs;
                        *a = if v_f16 { f16r(x) } else { x };
                    }
                    s_sum = s_sum.mul_add(ms, vs); // GCC contracts this to an FMA in ggml
                }
                if s_sum == 0.0 {
                    continue;
                }
                for (i, &a) in acc.iter().enumerate() {
                    out.set(i, h, iq, b, (a / s_sum) as f64);
                }
            }
        }
    }
    Ok(out)
}

pub(crate) fn reference(n: &NodeRef, src: &[Dense]) -> Result<Dense> {
    let Op::FlashAttnExt(p) = n.t.op else {
        return Err(n.err("not flash_attn_ext"));
    };
    if matches!(
        p.precision,
        AttnPrecision::GgmlCpu | AttnPrecision::GgmlCpuRows
    ) {
        return reference_ggml(n, &p, src);
    }
    let (q, k, v) = (&src[0], &src[1], &src[2]);
    let mask = src.get(3);
    let (d, n_q, n_head, n_b) = (q.ne[0], q.ne[1], q.ne[2], q.ne[3]);
    let (n_kv, dv) = (k.ne[1], v.ne[0]);
    let (rk, rv) = (n_head / k.ne[2], n_head / v.ne[2]);
    let (scale, softcap) = (p.scale as f64, p.logit_softcap as f64);
    let mut out = Dense::zeros([dv, n_head, n_q, n_b]);
    for b in 0..n_b {
        for h in 0..n_head {
            let slope = alibi_slope(p.max_bias, n_head, h);
            let (hk, hv) = (h / rk, h / rv);
            for iq in 0..n_q {
                // scores of the kv rows the mask does not exclude
                let mut scores: Vec<(usize, f64)> = Vec::with_capacity(n_kv);
                for ic in 0..n_kv {
                    let mv = mask.map_or(0.0, |m| slope * m.at(ic, iq, h % m.ne[2], b % m.ne[3]));
                    if mv == f64::NEG_INFINITY {
                        continue;
                    }
                    let dot: f64 = (0..d).map(|i| q.at(i, iq, h, b) * k.at(i, ic, hk, b)).sum();
                    let mut s = scale * dot;
                    if softcap != 0.0 {
                        s = softcap * (s / softcap).tanh();
                    }
                    scores.push((ic, s + mv));
                }
                if scores.is_empty() {
                    continue; // ggml writes 0 when every kv row is masked out
                }
                let max = scores.iter().fold(f64::NEG_INFINITY, |m, &(_, s)| m.max(s));
                let weights: Vec<(usize, f64)> = scores
                    .iter()
                    .map(|&(ic, s)| (ic, (s - max).exp()))
                    .collect();
                let sum: f64 = weights.iter().map(|w| w.1).sum();
                for i in 0..dv {
                    let acc: f64 = weights.iter().map(|&(ic, w)| w * v.at(i, ic, hv, b)).sum();
                    out.set(i, h, iq, b, acc / sum);
                }
            }
        }
    }
    Ok(out)
}

impl Graph {
    /// Backward of flash_attn_ext: the attention is rebuilt from primitives on the same inputs
    /// (`softmax(scale·K·Q + mask)` then `V·P`, with the soft-cap's tanh when set) and that
    /// decomposition is differentiated, so q, k, v (and the mask, without ALiBi) get exact
    /// gradients of the f32 attention.
    pub(crate) fn backward_attention(
        &mut self,
        bw: &crate::autodiff::Bw,
    ) -> Result<crate::autodiff::Grads> {
        let t = self.tensor(bw.node).clone();
        let Op::FlashAttnExt(p) = t.op else {
            return Err(self.not_diff(bw.node, 0, "not flash_attn_ext"));
        };
        let (q, k, v) = (t.src[0], t.src[1], t.src[2]);
        let mask = t.src.get(3).copied();
        let kq = self.mul_mat(k, q)?; // [n_kv, n_q, H, B]
        let (kq, sm_scale) = if p.logit_softcap != 0.0 {
            let s = self.scale(kq, p.scale / p.logit_softcap)?;
            let th = self.tanh(s)?;
            (self.scale(th, p.logit_softcap)?, 1.0)
        } else {
            (kq, p.scale)
        };
        let n_q = self.ne(q)[1];
        let mask_v = match mask {
            Some(m) if self.ne(m)[1] != n_q => {
                let mt = self.tensor(m).clone();
                let ne = [mt.ne[0], n_q, mt.ne[2], mt.ne[3]];
                let view = self.view(m, &ne, &[mt.nb[1], mt.nb[2], mt.nb[3]], 0)?;
                Some(self.cont(view)?)
            }
            other => other,
        };
        let pr = self.soft_max_ext(kq, mask_v, sm_scale, p.max_bias)?;
        let vt = self.transposed(v)?; // [n_kv, Dv, H_kv, B]
        let o = self.mul_mat(vt, pr)?; // [Dv, n_q, H, B]
        let out = self.permute(o, [0, 2, 1, 3])?; // [Dv, H, n_q, B]
        let mut targets = vec![q, k, v];
        if bw.wants(3) {
            targets.extend(mask_v);
        }
        let found = self.backprop(&[(out, bw.grad)], &targets)?;
        let mut res: crate::autodiff::Grads = vec![None; t.src.len()];
        for i in 0..3 {
            if bw.wants(i) {
                res[i] = found[i];
            }
        }
        if bw.wants(3) {
            if mask_v != mask {
                return Err(self.not_diff(
                    bw.node,
                    3,
                    "a padded mask (more rows than queries) is not differentiated",
                ));
            }
            res[3] = found[3];
        }
        Ok(res)
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::softmax::alibi_slope;
    use crate::ops::testutil::*;
    use crate::*;

    struct Case {
        d: usize,
        dv: usize,
        n_q: usize,
        n_kv: usize,
        h: usize,
        h_kv: usize,
        b: usize,
        kv_type: DType,
        mask_ne: Option<[usize; 4]>,
        scale: f32,
        max_bias: f32,
        softcap: f32,
    }

    /// Plain attention from the flat inputs, output `[dv, h, n_q, b]`.
    #[allow(clippy::too_many_arguments)]
    fn direct(c: &Case, q: &[f32], k: &[f32], v: &[f32], m: Option<&[f32]>) -> Vec<f64> {
        let mut out = vec![0.0; c.dv * c.h * c.n_q * c.b];
        let g = c.h / c.h_kv;
        for b in 0..c.b {
            for h in 0..c.h {
                let hk = h / g;
                for iq in 0..c.n_q {
                    let mut s = vec![0.0f64; c.n_kv];
                    for (ic, sc) in s.iter_mut().enumerate() {
                        let mut dot = 0.0;
                        for i in 0..c.d {
                            dot += q[((b * c.h + h) * c.n_q + iq) * c.d + i] as f64
                                * k[((b * c.h_kv + hk) * c.n_kv + ic) * c.d + i] as f64;
                        }
                        let mut x = c.scale as f64 * dot;
                        if c.softcap != 0.0 {
                            x = c.softcap as f64 * (x / c.softcap as f64).tanh();
                        }
                        if let (Some(m), Some(mn)) = (m, c.mask_ne) {
                            let mi = ic + mn[0] * (iq + mn[1] * (h % mn[2] + mn[2] * (b % mn[3])));
                            x += alibi_slope(c.max_bias, c.h, h) * m[mi] as f64;
                        }
                        *sc = x;
                    }
                    let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    if mx == f64::NEG_INFINITY {
                        continue;
                    }
                    let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
                    let sum: f64 = e.iter().sum();
                    for i in 0..c.dv {
                        let acc: f64 = (0..c.n_kv)
                            .map(|ic| {
                                e[ic] * v[((b * c.h_kv + hk) * c.n_kv + ic) * c.dv + i] as f64
                            })
                            .sum();
                        out[((b * c.n_q + iq) * c.h + h) * c.dv + i] = acc / sum;
                    }
                }
            }
        }
        out
    }

    fn round_f16(x: Vec<f32>) -> Vec<f32> {
        x.into_iter()
            .map(|v| half::f16::from_f32(v).to_f32())
            .collect()
    }

    #[test]
    fn random_cases_against_plain_attention() {
        let mut rng = Rng::new(99);
        let cases = [
            Case {
                d: 4,
                dv: 4,
                n_q: 1,
                n_kv: 1,
                h: 1,
                h_kv: 1,
                b: 1,
                kv_type: DType::F32,
                mask_ne: None,
                scale: 1.0,
                max_bias: 0.0,
                softcap: 0.0,
            },
            Case {
                d: 8,
                dv: 8,
                n_q: 3,
                n_kv: 17,
                h: 4,
                h_kv: 2,
                b: 1,
                kv_type: DType::F16,
                mask_ne: Some([17, 3, 1, 1]),
                scale: 0.35,
                max_bias: 0.0,
                softcap: 0.0,
            },
            Case {
                d: 3,
                dv: 5,
                n_q: 17,
                n_kv: 3,
                h: 3,
                h_kv: 1,
                b: 2,
                kv_type: DType::F32,
                mask_ne: Some([3, 20, 3, 1]),
                scale: 0.5,
                max_bias: 8.0,
                softcap: 0.0,
            },
            Case {
                d: 16,
                dv: 16,
                n_q: 5,
                n_kv: 9,
                h: 2,
                h_kv: 2,
                b: 1,
                kv_type: DType::F32,
                mask_ne: Some([9, 5, 1, 1]),
                scale: 0.25,
                max_bias: 0.0,
                softcap: 2.0,
            },
        ];
        for c in &cases {
            let mut g = Graph::new();
            let q = g.new_f32(&[c.d, c.n_q, c.h, c.b]).unwrap();
            let k = g
                .new_tensor(c.kv_type, &[c.d, c.n_kv, c.h_kv, c.b])
                .unwrap();
            let v = g
                .new_tensor(c.kv_type, &[c.dv, c.n_kv, c.h_kv, c.b])
                .unwrap();
            let m = c.mask_ne.map(|mn| g.new_tensor(DType::F16, &mn).unwrap());
            let o = g
                .flash_attn_ext(q, k, v, m, c.scale, c.max_bias, c.softcap)
                .unwrap();
            assert_eq!(g.ne(o), [c.dv, c.h, c.n_q, c.b]);
            let qv = rng.vec(c.d * c.n_q * c.h * c.b, -1.0, 1.0);
            let mut kv = rng.vec(c.d * c.n_kv * c.h_kv * c.b, -1.0, 1.0);
            let mut vv = rng.vec(c.dv * c.n_kv * c.h_kv * c.b, -1.0, 1.0);
            if c.kv_type == DType::F16 {
                kv = round_f16(kv);
                vv = round_f16(vv);
            }
            let mut inputs = vec![(q, qv.clone()), (k, kv.clone()), (v, vv.clone())];
            let mv = c.mask_ne.map(|mn| {
                let mut x = round_f16(rng.vec(mn.iter().product(), -1.0, 1.0));
                x[0] = f32::NEG_INFINITY; // query 0 of head 0 ignores kv row 0
                x
            });
            if let (Some(m), Some(mv)) = (m, &mv) {
                inputs.push((m, mv.clone()));
            }
            let got = run1(g, &inputs, o);
            assert_close(&got, &direct(c, &qv, &kv, &vv, mv.as_deref()), 1e-5);
        }
    }

    #[test]
    fn one_query_by_hand_and_fully_masked_rows_give_zero() {
        // q = (1, 0), keys (1, 0) and (0, 1), scale ln 3: scores ln 3 and 0 -> weights 3/4, 1/4
        let mut g = Graph::new();
        let q = g.new_f32(&[2, 2]).unwrap();
        let k = g.new_f32(&[2, 2]).unwrap();
        let v = g.new_f32(&[1, 2]).unwrap();
        let m = g.new_tensor(DType::F16, &[2, 2]).unwrap();
        let o = g
            .flash_attn_ext(q, k, v, Some(m), 3f32.ln(), 0.0, 0.0)
            .unwrap();
        let inputs = [
            (q, vec![1.0, 0.0, 1.0, 0.0]),
            (k, vec![1.0, 0.0, 0.0, 1.0]),
            (v, vec![10.0, 2.0]),
            (m, vec![0.0, 0.0, f32::NEG_INFINITY, f32::NEG_INFINITY]),
        ];
        let out = run1(g, &inputs, o);
        assert_close(&out, &[0.75 * 10.0 + 0.25 * 2.0, 0.0], 1e-6);
    }

    #[test]
    fn permuted_k_and_v_views_like_a_kv_cache() {
        // the cache stores [D, H_kv, n_kv]; attention reads it permuted to [D, n_kv, H_kv]
        let mut rng = Rng::new(17);
        let (d, n_q, h, n_kv) = (4, 3, 2, 5);
        let mut g = Graph::new();
        let q = g.new_f32(&[d, n_q, h]).unwrap();
        let kc = g.new_tensor(DType::F16, &[d, h, n_kv]).unwrap();
        let vc = g.new_f32(&[d, h, n_kv]).unwrap();
        let k = g.permute(kc, [0, 2, 1, 3]).unwrap();
        let v = g.permute(vc, [0, 2, 1, 3]).unwrap();
        assert!(!g.is_contiguous(k));
        let o = g.flash_attn_ext(q, k, v, None, 0.5, 0.0, 0.0).unwrap();
        let qv = rng.vec(d * n_q * h, -1.0, 1.0);
        let kcv = round_f16(rng.vec(d * h * n_kv, -1.0, 1.0));
        let vcv = rng.vec(d * h * n_kv, -1.0, 1.0);
        let got = run1(
            g,
            &[(q, qv.clone()), (kc, kcv.clone()), (vc, vcv.clone())],
            o,
        );
        // unpermute the caches to [D, n_kv, H] for the direct formula
        let unperm = |x: &[f32]| -> Vec<f32> {
            (0..d * n_kv * h)
                .map(|i| {
                    let (i0, ic, hh) = (i % d, (i / d) % n_kv, i / (d * n_kv));
                    x[(ic * h + hh) * d + i0]
                })
                .collect()
        };
        let c = Case {
            d,
            dv: d,
            n_q,
            n_kv,
            h,
            h_kv: h,
            b: 1,
            kv_type: DType::F32,
            mask_ne: None,
            scale: 0.5,
            max_bias: 0.0,
            softcap: 0.0,
        };
        assert_close(
            &got,
            &direct(&c, &qv, &unperm(&kcv), &unperm(&vcv), None),
            1e-6,
        );
    }

    #[test]
    fn bad_inputs_name_the_op_and_shapes() {
        let mut g = Graph::new();
        let q = g.new_f32(&[8, 3, 4]).unwrap();
        let k = g.new_tensor(DType::F16, &[8, 5, 3]).unwrap();
        let v = g.new_tensor(DType::F16, &[8, 5, 3]).unwrap();
        let e = g
            .flash_attn_ext(q, k, v, None, 1.0, 0.0, 0.0)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("flash_attn_ext:")
                && e.contains("4 heads")
                && e.contains("f16 [8, 5, 3, 1]"),
            "{e}"
        );
        let k = g.new_tensor(DType::F16, &[6, 5, 2]).unwrap();
        let e = g
            .flash_attn_ext(q, k, v, None, 1.0, 0.0, 0.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("head size 6"), "{e}");
        let k = g.new_tensor(DType::F16, &[8, 5, 2]).unwrap();
        let v = g.new_tensor(DType::F16, &[8, 4, 2]).unwrap();
        let e = g
            .flash_attn_ext(q, k, v, None, 1.0, 0.0, 0.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("v has 4 kv rows, k has 5"), "{e}");
        let v = g.new_tensor(DType::F16, &[8, 5, 2]).unwrap();
        let m = g.new_tensor(DType::F16, &[5, 2]).unwrap();
        let e = g
            .flash_attn_ext(q, k, v, Some(m), 1.0, 0.0, 0.0)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("mask [5, 2, 1, 1] does not fit") && e.contains("n_q = 3"),
            "{e}"
        );
        let m32 = g.new_f32(&[5, 3]).unwrap();
        let e = g
            .flash_attn_ext(q, k, v, Some(m32), 1.0, 0.0, 0.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("input 3 has type f32"), "{e}");
        let e = g
            .flash_attn_ext(q, k, v, None, 1.0, 8.0, 0.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs a mask"), "{e}");
        let qh = g.new_tensor(DType::F16, &[8, 3, 4]).unwrap();
        let e = g
            .flash_attn_ext(qh, k, v, None, 1.0, 0.0, 0.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("input 0 has type f16"), "{e}");
    }
}
