//! Rotary position embeddings, ggml's rope_ext: normal and neox modes, partial rotary dims,
//! freq_scale, YaRN (ext_factor, attn_factor, beta_fast, beta_slow), optional frequency factors.
//!
//! `a` is `[head_dim, n_head, n_tokens, batch]` (f32 or f16), `pos` holds one i32 position per
//! token. Pair `k` (of `n_dims / 2`) of a row at position `p` is rotated by the angle
//! `p * freq_base^(-2k/n_dims) / freq_factors[k]`, adjusted by YaRN as in ggml's `rope_yarn`;
//! the values past `n_dims` are copied. The multi-section modes (mrope, vision) are not here.

use crate::error::Result;
use crate::graph::{Graph, F32_ONLY, I32_ONLY};
use crate::op::Op;
use crate::reference::{Dense, NodeRef};
use crate::shape::fmt_ne;
use crate::tensor::TensorId;
use crate::DType;

/// Mode 0: rotate adjacent pairs `(2k, 2k+1)` (GGML_ROPE_TYPE_NORMAL).
pub const ROPE_MODE_NORMAL: i32 = 0;
/// Mode 2: rotate `(k, k + n_dims/2)` (GGML_ROPE_TYPE_NEOX).
pub const ROPE_MODE_NEOX: i32 = 2;

/// rope_ext parameters, as ggml takes them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    pub n_dims: usize,
    /// 0 = normal (adjacent pairs), 2 = neox (halves).
    pub mode: i32,
    pub n_ctx_orig: usize,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub ext_factor: f32,
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// Rotate by the negated angle (ggml's `rope_back`): the gradient of the rotation.
    pub inverse: bool,
}

impl RopeParams {
    /// The parameters `ggml_rope(a, pos, n_dims, mode)` uses: base 10000, no scaling, no YaRN.
    pub fn new(n_dims: usize, mode: i32) -> RopeParams {
        RopeParams {
            n_dims,
            mode,
            n_ctx_orig: 0,
            freq_base: 10000.0,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 0.0,
            beta_slow: 0.0,
            inverse: false,
        }
    }
}

/// ggml_rope_yarn_corr_dim: the dim (of `n_dims`) whose wavelength fits `n_rot` rotations in
/// `n_ctx_orig` positions.
fn yarn_corr_dim(n_dims: f64, n_ctx_orig: f64, n_rot: f64, base: f64) -> f64 {
    n_dims * (n_ctx_orig / (n_rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
}

/// ggml_rope_yarn_corr_dims: the pair range `[low, high]` over which YaRN ramps from
/// extrapolation to interpolation.
fn yarn_corr_dims(p: &RopeParams) -> (f64, f64) {
    let (nd, nc, base) = (p.n_dims as f64, p.n_ctx_orig as f64, p.freq_base as f64);
    let start = yarn_corr_dim(nd, nc, p.beta_fast as f64, base).floor();
    let end = yarn_corr_dim(nd, nc, p.beta_slow as f64, base).ceil();
    // ggml's MAX(0, start) and MIN(n_dims - 1, end)
    let low = if 0.0 > start { 0.0 } else { start };
    let high = if nd - 1.0 < end { nd - 1.0 } else { end };
    (low, high)
}

/// cos and sin (times the magnitude scale) of pair `k`'s angle, with `theta_extrap` the
/// unscaled angle: ggml's `rope_yarn`.
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
    let sin = theta.sin() * mscale;
    (theta.cos() * mscale, if p.inverse { -sin } else { sin })
}

impl Graph {
    /// ggml_rope_ext: rotary embedding of `a` (`[head_dim, n_head, n_tokens, batch]`, f32 or
    /// f16) at positions `pos` (i32, one per token), rotating the first `n_dims` (even) values
    /// of each row; `freq_factors` (f32, at least `n_dims/2` values) divide the angles.
    pub fn rope_ext(
        &mut self,
        a: TensorId,
        pos: TensorId,
        freq_factors: Option<TensorId>,
        params: RopeParams,
    ) -> Result<TensorId> {
        const OP: &str = "rope_ext";
        let mut src = vec![a, pos];
        src.extend(freq_factors);
        let rope_types: &[DType] = &[DType::F32, DType::F16];
        self.check_types(OP, &src, &[rope_types, I32_ONLY, F32_ONLY])?;
        let (ane, pne) = (self.ne(a), self.ne(pos));
        let p = params;
        if p.mode != ROPE_MODE_NORMAL && p.mode != ROPE_MODE_NEOX {
            return Err(self.shape_err(
                OP,
                format!("mode {} is not supported (0 = normal, 2 = neox; mode & 1 is no longer supported by ggml)", p.mode),
                &src,
            ));
        }
        if p.n_dims == 0 || !p.n_dims.is_multiple_of(2) || p.n_dims > ane[0] {
            return Err(self.shape_err(
                OP,
                format!(
                    "n_dims {} must be even, positive and at most the row length {}",
                    p.n_dims, ane[0]
                ),
                &src,
            ));
        }
        if p.n_ctx_orig > i32::MAX as usize {
            return Err(self.shape_err(
                OP,
                format!(
                    "n_ctx_orig {} does not fit ggml's int32 parameter",
                    p.n_ctx_orig
                ),
                &src,
            ));
        }
        if pne[1] * pne[2] * pne[3] != 1 || pne[0] != ane[2] {
            return Err(self.shape_err(
                OP,
                format!(
                    "positions {} must be a vector of a.ne2 = {} values (one per token)",
                    fmt_ne(&pne),
                    ane[2]
                ),
                &src,
            ));
        }
        if let Some(f) = freq_factors {
            let fne = self.ne(f);
            if fne[0] < p.n_dims / 2 {
                return Err(self.shape_err(
                    OP,
                    format!(
                        "freq_factors {} needs at least n_dims/2 = {} values in dim 0",
                        fmt_ne(&fne),
                        p.n_dims / 2
                    ),
                    &src,
                ));
            }
        }
        let dt = self.dtype(a);
        Ok(self.node(Op::Rope(params), dt, ane, &src))
    }

    /// ggml_rope: [`rope_ext`](Graph::rope_ext) with [`RopeParams::new`]`(n_dims, mode)`.
    pub fn rope(
        &mut self,
        a: TensorId,
        pos: TensorId,
        n_dims: usize,
        mode: i32,
    ) -> Result<TensorId> {
        self.rope_ext(a, pos, None, RopeParams::new(n_dims, mode))
    }
}

pub(crate) fn reference(n: &NodeRef, src: &[Dense]) -> Result<Dense> {
    let Op::Rope(p) = n.t.op else {
        return Err(n.err("not a rope op"));
    };
    let (a, pos) = (&src[0], &src[1]);
    let ff = src.get(2);
    let ne = a.ne;
    let half = p.n_dims / 2;
    let corr = yarn_corr_dims(&p);
    let base = p.freq_base as f64;
    let mut out = a.clone();
    for i2 in 0..ne[2] {
        let position = pos.data[i2];
        // cos and sin of each pair's angle at this position
        let cs: Vec<(f64, f64)> = (0..half)
            .map(|k| {
                let mut theta = position * base.powf(-2.0 * k as f64 / p.n_dims as f64);
                if let Some(f) = ff {
                    theta /= f.data[k];
                }
                rope_yarn(theta, k, &p, corr)
            })
            .collect();
        for i3 in 0..ne[3] {
            for i1 in 0..ne[1] {
                let x = a.row(i1, i2, i3);
                let y = out.row_mut(i1, i2, i3);
                for (k, &(c, s)) in cs.iter().enumerate() {
                    let (j0, j1) = if p.mode == ROPE_MODE_NORMAL {
                        (2 * k, 2 * k + 1)
                    } else {
                        (k, k + half)
                    };
                    y[j0] = x[j0] * c - x[j1] * s;
                    y[j1] = x[j0] * s + x[j1] * c;
                }
            }
        }
    }
    Ok(out)
}

impl Graph {
    /// Backward of rope_ext: the rotation by the negated angles (with the same YaRN ramp and
    /// magnitude scale), ggml's `rope_back`. Positions and frequency factors are data.
    pub(crate) fn backward_rope(
        &mut self,
        bw: &crate::autodiff::Bw,
    ) -> Result<crate::autodiff::Grads> {
        let t = self.tensor(bw.node).clone();
        let Op::Rope(mut p) = t.op else {
            return Err(self.not_diff(bw.node, 0, "not rope"));
        };
        for i in 1..t.src.len() {
            if bw.wants(i) {
                return Err(self.not_diff(
                    bw.node,
                    i,
                    "positions and frequency factors are not differentiated",
                ));
            }
        }
        p.inverse = !p.inverse;
        let gc = self.contig(bw.grad)?;
        let ff = t.src.get(2).copied();
        Ok(vec![Some(self.rope_ext(gc, t.src[1], ff, p)?)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;
    use crate::*;

    /// Direct rope on a flat `[d, h, t, b]` buffer: angles `p * base^(-2k/n_dims) / ff[k]`,
    /// no YaRN (ext_factor 0): interpolation by freq_scale, magnitude attn_factor.
    fn direct(
        x: &[f32],
        ne: [usize; 4],
        pos: &[i32],
        p: &RopeParams,
        ff: Option<&[f32]>,
    ) -> Vec<f64> {
        let mut y: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let half = p.n_dims / 2;
        for r in 0..ne[1] * ne[2] * ne[3] {
            let t = (r / ne[1]) % ne[2];
            let o = r * ne[0];
            for k in 0..half {
                let mut theta =
                    pos[t] as f64 * (p.freq_base as f64).powf(-2.0 * k as f64 / p.n_dims as f64);
                if let Some(f) = ff {
                    theta /= f[k] as f64;
                }
                theta *= p.freq_scale as f64;
                let (c, s) = (
                    theta.cos() * p.attn_factor as f64,
                    theta.sin() * p.attn_factor as f64,
                );
                let (i, j) = if p.mode == 0 {
                    (2 * k, 2 * k + 1)
                } else {
                    (k, k + half)
                };
                let (x0, x1) = (x[o + i] as f64, x[o + j] as f64);
                y[o + i] = x0 * c - x1 * s;
                y[o + j] = x0 * s + x1 * c;
            }
        }
        y
    }

    #[test]
    fn rotates_a_pair_by_hand() {
        // one head of 4 values, n_dims 2, base 10000: pair 0 turns by angle p exactly
        for mode in [ROPE_MODE_NORMAL, ROPE_MODE_NEOX] {
            let mut g = Graph::new();
            let a = g.new_f32(&[4, 1, 2]).unwrap();
            let pos = g.new_tensor(DType::I32, &[2]).unwrap();
            let y = g.rope(a, pos, 2, mode).unwrap();
            let out = run1(
                g,
                &[
                    (a, vec![1.0, 0.0, 5.0, 6.0, 0.0, 2.0, 7.0, 8.0]),
                    (pos, vec![0.0, 3.0]),
                ],
                y,
            );
            // position 0: unchanged; position 3: (0, 2) rotated by 3 rad
            let want = [
                1.0,
                0.0,
                5.0,
                6.0,
                -2.0 * 3f64.sin(),
                2.0 * 3f64.cos(),
                7.0,
                8.0,
            ];
            assert_close(&out, &want, 1e-6);
        }
        // neox with n_dims 4: pairs (0, 2) at angle p and (1, 3) at angle p / 100
        let mut g = Graph::new();
        let a = g.new_f32(&[4]).unwrap();
        let pos = g.new_tensor(DType::I32, &[1]).unwrap();
        let y = g.rope(a, pos, 4, ROPE_MODE_NEOX).unwrap();
        let out = run1(g, &[(a, vec![1.0, 1.0, 0.0, 0.0]), (pos, vec![2.0])], y);
        let want = [2f64.cos(), 0.02f64.cos(), 2f64.sin(), 0.02f64.sin()];
        assert_close(&out, &want, 1e-6);
    }

    #[test]
    fn random_shapes_modes_partial_dims_and_freq_factors() {
        let mut rng = Rng::new(9);
        for (ne, n_dims) in [
            ([2, 1, 1, 1], 2),
            ([6, 3, 1, 1], 4),
            ([18, 1, 17, 1], 18),
            ([16, 3, 5, 2], 8),
            ([64, 2, 3, 1], 64),
        ] {
            for mode in [ROPE_MODE_NORMAL, ROPE_MODE_NEOX] {
                for with_ff in [false, true] {
                    let mut p = RopeParams::new(n_dims, mode);
                    p.freq_base = 500.0;
                    p.freq_scale = 0.5;
                    p.attn_factor = 1.25;
                    let mut g = Graph::new();
                    let a = g.new_f32(&ne).unwrap();
                    let pos = g.new_tensor(DType::I32, &[ne[2]]).unwrap();
                    let ff = if with_ff {
                        Some(g.new_f32(&[n_dims / 2]).unwrap())
                    } else {
                        None
                    };
                    let y = g.rope_ext(a, pos, ff, p).unwrap();
                    let x = rng.vec(ne.iter().product(), -2.0, 2.0);
                    let pv: Vec<i32> = (0..ne[2]).map(|_| rng.below(300) as i32).collect();
                    let fv = rng.vec(n_dims / 2, 0.5, 4.0);
                    let mut inputs = vec![
                        (a, x.clone()),
                        (pos, pv.iter().map(|&v| v as f32).collect()),
                    ];
                    if let Some(f) = ff {
                        inputs.push((f, fv.clone()));
                    }
                    let got = run1(g, &inputs, y);
                    let want = direct(&x, ne, &pv, &p, with_ff.then_some(&fv[..]));
                    assert_close(&got, &want, 1e-5);
                }
            }
        }
    }

    #[test]
    fn yarn_ramps_between_extrapolation_and_interpolation() {
        // c056-like: n_dims 64, n_ctx_orig 4096, base 10000, beta 32 / 1 -> corr dims [10, 23]
        let mut p = RopeParams::new(64, ROPE_MODE_NORMAL);
        p.n_ctx_orig = 4096;
        p.freq_scale = 0.25;
        p.ext_factor = 1.0;
        p.beta_fast = 32.0;
        p.beta_slow = 1.0;
        assert_eq!(yarn_corr_dims(&p), (10.0, 23.0));
        let mscale = 1.0 + 0.1 * 4f64.ln();
        let pos = 7.0;
        for (k, ramp) in [
            (0usize, 1.0f64),
            (10, 1.0),
            (16, 1.0 - 6.0 / 13.0),
            (23, 0.0),
            (31, 0.0),
        ] {
            let te = pos * 10000f64.powf(-2.0 * k as f64 / 64.0);
            let theta = 0.25 * te * (1.0 - ramp) + te * ramp;
            let (c, s) = rope_yarn(te, k, &p, yarn_corr_dims(&p));
            assert!(
                (c - theta.cos() * mscale).abs() < 1e-12
                    && (s - theta.sin() * mscale).abs() < 1e-12,
                "pair {k}"
            );
        }
        // and through a graph: pair 31 is pure interpolation times mscale
        let mut g = Graph::new();
        let a = g.new_f32(&[64]).unwrap();
        let pp = g.new_tensor(DType::I32, &[1]).unwrap();
        let y = g.rope_ext(a, pp, None, p).unwrap();
        let mut x = vec![0.0f32; 64];
        x[62] = 1.0;
        let out = run1(g, &[(a, x), (pp, vec![7.0])], y);
        let th = 0.25 * 7.0 * 10000f64.powf(-62.0 / 64.0);
        assert_close(&out[62..], &[th.cos() * mscale, th.sin() * mscale], 1e-6);
    }

    #[test]
    fn f16_input_and_permuted_view() {
        let mut rng = Rng::new(4);
        // q as [d, t, h] permuted to [d, h, t] (dims 1 and 2 swapped, rows stay dense)
        let (d, h, t) = (8, 3, 5);
        for dt in [DType::F32, DType::F16] {
            let mut g = Graph::new();
            let a = g.new_tensor(dt, &[d, t, h]).unwrap();
            let v = g.permute(a, [0, 2, 1, 3]).unwrap();
            assert_eq!(g.ne(v), [d, h, t, 1]);
            assert!(!g.is_contiguous(v));
            let pos = g.new_tensor(DType::I32, &[t]).unwrap();
            let y = g.rope(v, pos, 6, ROPE_MODE_NEOX).unwrap();
            assert_eq!(g.dtype(y), dt);
            let mut x = rng.vec(d * t * h, -1.0, 1.0);
            if dt == DType::F16 {
                x = x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
            }
            let pv: Vec<i32> = (0..t as i32).map(|i| 3 * i + 1).collect();
            let got = run1(
                g,
                &[
                    (a, x.clone()),
                    (pos, pv.iter().map(|&v| v as f32).collect()),
                ],
                y,
            );
            // the permuted values in logical order
            let px: Vec<f32> = (0..d * h * t)
                .map(|k| {
                    let (i0, i1, i2) = (k % d, (k / d) % h, k / (d * h));
                    x[i1 * d * t + i2 * d + i0]
                })
                .collect();
            let want = direct(
                &px,
                [d, h, t, 1],
                &pv,
                &RopeParams::new(6, ROPE_MODE_NEOX),
                None,
            );
            let tol = if dt == DType::F16 { 2e-3 } else { 1e-6 };
            assert_close(&got, &want, tol);
            // the two values past n_dims are copied
            assert_eq!(got[6..8], px[6..8]);
        }
    }

    #[test]
    fn bad_inputs_name_the_op_and_shapes() {
        let mut g = Graph::new();
        let a = g.new_f32(&[8, 2, 3]).unwrap();
        let pos = g.new_tensor(DType::I32, &[3]).unwrap();
        let e = g.rope(a, pos, 5, 0).unwrap_err().to_string();
        assert!(
            e.starts_with("rope_ext:")
                && e.contains("n_dims 5")
                && e.contains("f32 [8, 2, 3, 1]")
                && e.contains("i32 [3, 1, 1, 1]"),
            "{e}"
        );
        let e = g.rope(a, pos, 10, 0).unwrap_err().to_string();
        assert!(e.contains("at most the row length 8"), "{e}");
        let e = g.rope(a, pos, 8, 1).unwrap_err().to_string();
        assert!(e.contains("mode 1"), "{e}");
        let pos4 = g.new_tensor(DType::I32, &[4]).unwrap();
        let e = g.rope(a, pos4, 8, 0).unwrap_err().to_string();
        assert!(
            e.contains("a.ne2 = 3") && e.contains("i32 [4, 1, 1, 1]"),
            "{e}"
        );
        let pf = g.new_f32(&[3]).unwrap();
        let e = g.rope(a, pf, 8, 0).unwrap_err().to_string();
        assert!(e.contains("input 1 has type f32"), "{e}");
        let ff = g.new_f32(&[3]).unwrap();
        let e = g
            .rope_ext(a, pos, Some(ff), RopeParams::new(8, 0))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("freq_factors") && e.contains("n_dims/2 = 4"),
            "{e}"
        );
    }
}
