//! soft_max / soft_max_ext (scale, optional f16 or f32 mask broadcast over dims 2 and 3, ALiBi
//! max_bias) and diag_mask_inf / diag_mask_zero.
//!
//! ggml's CPU computes these in f32 only, so `a` must be f32. As in ggml's builder, soft_max's
//! `a` and mask must be contiguous; the diagonal masks take any strides.

use crate::error::Result;
use crate::graph::{Graph, F32_ONLY};
use crate::op::Op;
use crate::reference::{Dense, NodeRef};
use crate::shape::fmt_ne;
use crate::tensor::TensorId;
use crate::DType;

/// The ALiBi slope of head `h` of `n_head`, as ggml computes it for soft_max and
/// flash_attn_ext: with `n = 2^floor(log2 n_head)`, `m0 = 2^(-max_bias/n)`,
/// `m1 = 2^(-max_bias/2/n)`, head `h < n` gets `m0^(h+1)`, the others `m1^(2(h-n)+1)`.
/// Without ALiBi (`max_bias <= 0`) every slope is 1.
pub(crate) fn alibi_slope(max_bias: f32, n_head: usize, h: usize) -> f64 {
    if max_bias <= 0.0 {
        return 1.0;
    }
    let n_head = n_head.max(1);
    let n_log2 = 1usize << (usize::BITS - 1 - n_head.leading_zeros());
    let max_bias = max_bias as f64;
    let m0 = 2f64.powf(-max_bias / n_log2 as f64);
    let m1 = 2f64.powf(-(max_bias / 2.0) / n_log2 as f64);
    if h < n_log2 {
        m0.powi(h as i32 + 1)
    } else {
        m1.powi(2 * (h - n_log2) as i32 + 1)
    }
}

impl Graph {
    /// Softmax over dim 0 of each row (ggml_soft_max); `a` must be contiguous f32.
    pub fn soft_max(&mut self, a: TensorId) -> Result<TensorId> {
        self.soft_max_ext(a, None, 1.0, 0.0)
    }

    /// Softmax over dim 0 of `a*scale + slope*mask` (ggml_soft_max_ext). The mask (f16 or f32,
    /// contiguous) has `a`'s row length, at least `a.ne1` rows (row `i1` of `a` uses mask row
    /// `i1`; extra rows are padding) and is broadcast over dims 2 and 3, whose sizes must divide
    /// `a`'s. `slope` is 1, or with `max_bias > 0` (which needs a mask) the ALiBi slope of head
    /// `i2` of `a.ne2`. A `-inf` mask entry gives probability 0.
    pub fn soft_max_ext(
        &mut self,
        a: TensorId,
        mask: Option<TensorId>,
        scale: f32,
        max_bias: f32,
    ) -> Result<TensorId> {
        const OP: &str = "soft_max";
        let mut src = vec![a];
        src.extend(mask);
        let mask_types: &[DType] = &[DType::F16, DType::F32];
        self.check_types(OP, &src, &[F32_ONLY, mask_types])?;
        if !self.is_contiguous(a) {
            return Err(self.shape_err(OP, "a must be contiguous (use cont first)", &src));
        }
        let ane = self.ne(a);
        if let Some(m) = mask {
            let mne = self.ne(m);
            if !self.is_contiguous(m) {
                return Err(self.shape_err(OP, "the mask must be contiguous", &src));
            }
            if mne[0] != ane[0]
                || mne[1] < ane[1]
                || !ane[2].is_multiple_of(mne[2])
                || !ane[3].is_multiple_of(mne[3])
            {
                return Err(self.shape_err(
                    OP,
                    format!(
                        "mask {} does not fit a {}: it needs ne0 == {}, ne1 >= {}, and ne2, ne3 dividing {}, {}",
                        fmt_ne(&mne),
                        fmt_ne(&ane),
                        ane[0],
                        ane[1],
                        ane[2],
                        ane[3]
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
        let dt = self.dtype(a);
        Ok(self.node(Op::SoftMax { scale, max_bias }, dt, ane, &src))
    }

    fn diag_mask(&mut self, op: Op, a: TensorId, n_past: usize) -> Result<TensorId> {
        let name = op.name();
        self.check_types(name, &[a], &[F32_ONLY])?;
        if n_past > i32::MAX as usize {
            return Err(self.shape_err(
                name,
                format!("n_past {n_past} does not fit ggml's int32 parameter"),
                &[a],
            ));
        }
        let (dt, ne) = (self.dtype(a), self.ne(a));
        Ok(self.node(op, dt, ne, &[a]))
    }

    /// Causal mask (ggml_diag_mask_inf): elements with `i0 > n_past + i1` become `-inf`, in
    /// every matrix of dims 2 and 3; the others are copied.
    pub fn diag_mask_inf(&mut self, a: TensorId, n_past: usize) -> Result<TensorId> {
        self.diag_mask(Op::DiagMaskInf { n_past }, a, n_past)
    }

    /// Like [`diag_mask_inf`](Graph::diag_mask_inf) but the masked elements become 0
    /// (ggml_diag_mask_zero).
    pub fn diag_mask_zero(&mut self, a: TensorId, n_past: usize) -> Result<TensorId> {
        self.diag_mask(Op::DiagMaskZero { n_past }, a, n_past)
    }
}

pub(crate) fn reference(n: &NodeRef, src: &[Dense]) -> Result<Dense> {
    let a = &src[0];
    let ne = a.ne;
    match n.t.op {
        Op::SoftMax { scale, max_bias } => {
            let mask = src.get(1);
            let mut out = Dense::zeros(ne);
            for i3 in 0..ne[3] {
                for i2 in 0..ne[2] {
                    let slope = alibi_slope(max_bias, ne[2], i2);
                    for i1 in 0..ne[1] {
                        let w: Vec<f64> = (0..ne[0])
                            .map(|i0| {
                                let mut v = a.at(i0, i1, i2, i3) * scale as f64;
                                if let Some(m) = mask {
                                    v += slope * m.at(i0, i1, i2 % m.ne[2], i3 % m.ne[3]);
                                }
                                v
                            })
                            .collect();
                        // max over the row; all -inf gives NaN as in ggml
                        let max = w.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
                        let e: Vec<f64> = w.iter().map(|v| (v - max).exp()).collect();
                        let sum: f64 = e.iter().sum();
                        for (y, ei) in out.row_mut(i1, i2, i3).iter_mut().zip(&e) {
                            *y = ei / sum;
                        }
                    }
                }
            }
            Ok(out)
        }
        Op::DiagMaskInf { n_past } | Op::DiagMaskZero { n_past } => {
            let value = if matches!(n.t.op, Op::DiagMaskInf { .. }) {
                f64::NEG_INFINITY
            } else {
                0.0
            };
            Ok(Dense::from_fn(ne, |i0, i1, i2, i3| {
                if i0 > n_past + i1 {
                    value
                } else {
                    a.at(i0, i1, i2, i3)
                }
            }))
        }
        _ => Err(n.err("not a softmax or mask op")),
    }
}

impl Graph {
    /// Backward of soft_max_ext and the diagonal masks. With `y = softmax(scale·x + slope·mask)`,
    /// `dz = y·(grad - Σ grad·y)`, `dx = scale·dz` and `dmask = slope·dz` (summed over the
    /// dims the mask is broadcast along; ALiBi masks, `max_bias > 0`, are not differentiated).
    pub(crate) fn backward_softmax(
        &mut self,
        bw: &crate::autodiff::Bw,
    ) -> Result<crate::autodiff::Grads> {
        let t = self.tensor(bw.node).clone();
        let g = bw.grad;
        match t.op {
            Op::SoftMax { scale, max_bias } => {
                let y = bw.node;
                let gy = self.mul(g, y)?;
                let dot = self.sum_rows(gy)?;
                let d = self.sub(g, dot)?;
                let dz = self.mul(d, y)?;
                let ga = if bw.wants(0) {
                    Some(self.scale(dz, scale)?)
                } else {
                    None
                };
                let gm = if bw.wants(1) {
                    let m = t.src[1];
                    if max_bias != 0.0 || self.ne(m)[1] != t.ne[1] {
                        return Err(self.not_diff(
                            bw.node,
                            1,
                            "the mask is differentiated only without ALiBi (max_bias = 0) and with as many rows as the input",
                        ));
                    }
                    Some(self.reduce_to(dz, m)?)
                } else {
                    None
                };
                Ok(vec![ga, gm])
            }
            Op::DiagMaskInf { n_past } | Op::DiagMaskZero { n_past } => {
                let gc = self.contig(g)?;
                Ok(vec![Some(self.diag_mask_zero(gc, n_past)?)])
            }
            _ => Err(self.not_diff(bw.node, 0, "not a softmax op")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::alibi_slope;
    use crate::ops::testutil::*;
    use crate::*;

    /// softmax over rows of `n` of a flat buffer, computed directly.
    fn softmax_rows(z: &[f64], n: usize) -> Vec<f64> {
        z.chunks(n)
            .flat_map(|r| {
                let m = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let s: f64 = r.iter().map(|v| (v - m).exp()).sum();
                r.iter().map(move |v| (v - m).exp() / s).collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn soft_max_by_hand() {
        let mut g = Graph::new();
        let a = g.new_f32(&[3, 2]).unwrap();
        let y = g.soft_max(a).unwrap();
        let out = run1(g, &[(a, vec![1.0, 2.0, 3.0, 0.0, 0.0, 1000.0])], y);
        let s = 1.0 + 1f64.exp() + 2f64.exp();
        let want = [1.0 / s, 1f64.exp() / s, 2f64.exp() / s, 0.0, 0.0, 1.0];
        assert_close(&out, &want, 1e-6);
    }

    #[test]
    fn alibi_slopes_match_ggml_formula() {
        // 4 heads (a power of two): m0 = 2^(-8/4) = 1/4, slopes m0^(h+1)
        for h in 0..4 {
            assert!((alibi_slope(8.0, 4, h) - 0.25f64.powi(h as i32 + 1)).abs() < 1e-15);
        }
        // 3 heads: n = 2, m0 = 2^-4, m1 = 2^-2; heads 0, 1 get m0, m0^2; head 2 gets m1^1
        assert!((alibi_slope(8.0, 3, 0) - 1.0 / 16.0).abs() < 1e-15);
        assert!((alibi_slope(8.0, 3, 1) - 1.0 / 256.0).abs() < 1e-15);
        assert!((alibi_slope(8.0, 3, 2) - 0.25).abs() < 1e-15);
        // 6 heads: n = 4, heads 4 and 5 get m1^1 and m1^3 with m1 = 2^-1
        assert!((alibi_slope(8.0, 6, 5) - 0.125).abs() < 1e-15);
        assert_eq!(alibi_slope(0.0, 6, 5), 1.0);
    }

    #[test]
    fn soft_max_ext_with_mask_scale_and_alibi() {
        let mut rng = Rng::new(21);
        // (a shape, mask shape, mask type, max_bias)
        let cases = [
            ([5, 3, 4, 1], [5, 3, 1, 1], DType::F32, 0.0f32),
            ([5, 3, 4, 1], [5, 8, 1, 1], DType::F16, 0.0), // padded mask rows
            ([17, 2, 3, 2], [17, 2, 3, 1], DType::F32, 8.0),
            ([3, 1, 6, 2], [3, 1, 2, 2], DType::F16, 4.0),
            ([1, 1, 1, 1], [1, 1, 1, 1], DType::F32, 1.0),
        ];
        for (ane, mne, mt, max_bias) in cases {
            let scale = 0.5f32;
            let mut g = Graph::new();
            let a = g.new_f32(&ane).unwrap();
            let m = g.new_tensor(mt, &mne).unwrap();
            let y = g.soft_max_ext(a, Some(m), scale, max_bias).unwrap();
            let av = rng.vec(ane.iter().product(), -3.0, 3.0);
            let mut mv = rng.vec(mne.iter().product(), -2.0, 2.0);
            if mv.len() > 2 {
                mv[1] = f32::NEG_INFINITY;
            }
            if mt == DType::F16 {
                // the values the f16 mask will hold
                mv = mv
                    .iter()
                    .map(|&v| half::f16::from_f32(v).to_f32())
                    .collect();
            }
            let got = run1(g, &[(a, av.clone()), (m, mv.clone())], y);
            let mut z = vec![0.0; av.len()];
            for (k, zk) in z.iter_mut().enumerate() {
                let (i0, i1, i2, i3) = (
                    k % ane[0],
                    (k / ane[0]) % ane[1],
                    (k / (ane[0] * ane[1])) % ane[2],
                    k / (ane[0] * ane[1] * ane[2]),
                );
                let mk = i0 + mne[0] * (i1 + mne[1] * (i2 % mne[2] + mne[2] * (i3 % mne[3])));
                *zk = av[k] as f64 * 0.5 + alibi_slope(max_bias, ane[2], i2) * mv[mk] as f64;
            }
            let want = softmax_rows(&z, ane[0]);
            assert_close(&got, &want, 1e-6);
            if mv.len() > 2 && ane[0] > 1 {
                assert_eq!(got[1], 0.0, "-inf in the mask gives 0");
            }
        }
    }

    #[test]
    fn diag_mask_inf_and_zero() {
        let mut g = Graph::new();
        let a = g.new_f32(&[4, 3, 2]).unwrap();
        let inf = g.diag_mask_inf(a, 1).unwrap();
        let zero = g.diag_mask_zero(a, 1).unwrap();
        let mut s = Session::new(g, &[inf, zero]).unwrap();
        let x: Vec<f32> = (1..=24).map(|v| v as f32).collect();
        s.set_f32(a, &x).unwrap();
        s.compute(&ReferenceBackend).unwrap();
        // with n_past = 1: row 0 keeps i0 <= 1, row 1 keeps i0 <= 2, row 2 keeps all
        let masked = |k: usize| {
            let (i0, i1) = (k % 4, (k / 4) % 3);
            i0 > 1 + i1
        };
        let got_inf = s.get_f32(inf).unwrap();
        let got_zero = s.get_f32(zero).unwrap();
        for k in 0..24 {
            if masked(k) {
                assert_eq!(got_inf[k], f32::NEG_INFINITY, "{k}");
                assert_eq!(got_zero[k], 0.0, "{k}");
            } else {
                assert_eq!(got_inf[k], x[k], "{k}");
                assert_eq!(got_zero[k], x[k], "{k}");
            }
        }
        assert_eq!(got_inf.iter().filter(|v| v.is_infinite()).count(), 2 * 3);
    }

    #[test]
    fn diag_mask_on_a_transposed_view_then_soft_max() {
        let mut rng = Rng::new(2);
        let mut g = Graph::new();
        let a = g.new_f32(&[3, 17]).unwrap();
        let t = g.transpose(a).unwrap(); // [17, 3]
        let m = g.diag_mask_inf(t, 0).unwrap();
        let y = g.soft_max(m).unwrap();
        let x = rng.vec(51, -1.0, 1.0);
        let got = run1(g, &[(a, x.clone())], y);
        let z: Vec<f64> = (0..51)
            .map(|k| {
                let (i0, i1) = (k % 17, k / 17);
                if i0 > i1 {
                    f64::NEG_INFINITY
                } else {
                    x[i0 * 3 + i1] as f64
                }
            })
            .collect();
        assert_close(&got, &softmax_rows(&z, 17), 1e-6);
        assert_close(&got[..2], &[1.0, 0.0], 0.0);
    }

    #[test]
    fn bad_inputs_name_the_op_and_shapes() {
        let mut g = Graph::new();
        let a = g.new_f32(&[8, 4, 2]).unwrap();
        let m = g.new_tensor(DType::F16, &[8, 3]).unwrap();
        let e = g
            .soft_max_ext(a, Some(m), 1.0, 0.0)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("soft_max:")
                && e.contains("ne1 >= 4")
                && e.contains("f16 [8, 3, 1, 1]")
                && e.contains("f32 [8, 4, 2, 1]"),
            "{e}"
        );
        let m3 = g.new_f32(&[8, 4, 3]).unwrap();
        let e = g
            .soft_max_ext(a, Some(m3), 1.0, 0.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("mask [8, 4, 3, 1] does not fit"), "{e}");
        let e = g.soft_max_ext(a, None, 1.0, 8.0).unwrap_err().to_string();
        assert!(e.contains("needs a mask"), "{e}");
        let t = g.transpose(a).unwrap();
        let e = g.soft_max(t).unwrap_err().to_string();
        assert!(
            e.starts_with("soft_max:") && e.contains("contiguous"),
            "{e}"
        );
        let i = g.new_tensor(DType::I32, &[8, 4]).unwrap();
        let e = g
            .soft_max_ext(a, Some(i), 1.0, 0.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("input 1 has type i32"), "{e}");
        let h = g.new_tensor(DType::F16, &[8, 4]).unwrap();
        let e = g.diag_mask_inf(h, 0).unwrap_err().to_string();
        assert!(
            e.starts_with("diag_mask_inf:") && e.contains("f16 [8, 4, 1, 1]"),
            "{e}"
        );
    }
}
