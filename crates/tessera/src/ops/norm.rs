//! Normalisation over rows: norm (layer norm without affine), rms_norm, l2_norm, group_norm.
//!
//! As in ggml the result has the input's shape and type. ggml's CPU computes these in f32 only,
//! so the builders accept f32 inputs only; any strides (views, transposes) are fine.

use crate::error::Result;
use crate::graph::{Graph, F32_ONLY};
use crate::op::Op;
use crate::reference::{Dense, NodeRef};
use crate::tensor::TensorId;

impl Graph {
    fn norm_node(&mut self, op: Op, a: TensorId, eps: f32) -> Result<TensorId> {
        let name = op.name();
        self.check_types(name, &[a], &[F32_ONLY])?;
        // ggml asserts eps >= 0 when it computes; we refuse it when building.
        if eps.is_nan() || eps < 0.0 {
            return Err(self.shape_err(name, format!("eps must be >= 0, got {eps}"), &[a]));
        }
        let (dt, ne) = (self.dtype(a), self.ne(a));
        Ok(self.node(op, dt, ne, &[a]))
    }

    /// Layer norm without affine (ggml_norm): each row over dim 0 becomes
    /// `(x - mean) / sqrt(var + eps)`, `var` the biased mean of squared deviations.
    pub fn norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId> {
        self.norm_node(Op::Norm { eps }, a, eps)
    }

    /// RMS norm (ggml_rms_norm): each row over dim 0 becomes `x / sqrt(mean(x²) + eps)`.
    pub fn rms_norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId> {
        self.norm_node(Op::RmsNorm { eps }, a, eps)
    }

    /// L2 norm (ggml_l2_norm): each row over dim 0 becomes `x / max(sqrt(Σ x²), eps)`.
    pub fn l2_norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId> {
        self.norm_node(Op::L2Norm { eps }, a, eps)
    }

    /// Group norm (ggml_group_norm): the channels (dim 2) are split into `n_groups` groups of
    /// `ceil(ne2 / n_groups)` channels (the last groups smaller, possibly empty); for each group
    /// and each index of dim 3, all `ne0 * ne1 * channels` values are normalised together like
    /// [`norm`](Graph::norm) does with a row.
    pub fn group_norm(&mut self, a: TensorId, n_groups: usize, eps: f32) -> Result<TensorId> {
        const OP: &str = "group_norm";
        self.check_id(OP, a)?;
        if n_groups == 0 {
            return Err(self.shape_err(OP, "n_groups must be at least 1", &[a]));
        }
        if n_groups > i32::MAX as usize {
            return Err(self.shape_err(
                OP,
                format!("n_groups {n_groups} does not fit ggml's int32 parameter"),
                &[a],
            ));
        }
        self.norm_node(Op::GroupNorm { n_groups, eps }, a, eps)
    }
}

/// `(x - mean) / sqrt(var + eps)` for each `x` of `xs`, mean and variance over all of `xs`.
/// Which normalisation a `norm_back` node differentiates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NormBackKind {
    Norm { eps: f32 },
    Rms { eps: f32 },
    L2 { eps: f32 },
    Group { n_groups: usize, eps: f32 },
}

impl Graph {
    /// The gradient of a normalisation w.r.t. its input `x`, given the output gradient `grad`
    /// (both f32 of `x`'s shape): ggml's `rms_norm_back`, and the same for norm, l2_norm and
    /// group_norm.
    pub fn norm_back(
        &mut self,
        grad: TensorId,
        x: TensorId,
        kind: NormBackKind,
    ) -> Result<TensorId> {
        const OP: &str = "norm_back";
        self.check_types(OP, &[grad, x], &[F32_ONLY, F32_ONLY])?;
        let ne = self.ne(x);
        if self.ne(grad) != ne {
            return Err(self.shape_err(OP, "grad and x must have the same shape", &[grad, x]));
        }
        Ok(self.node(Op::NormBack(kind), crate::DType::F32, ne, &[grad, x]))
    }
}

/// `dx` for one normalised vector `x` with output gradient `g`.
fn norm_back_vec(kind: NormBackKind, g: &[f64], x: &[f64]) -> Vec<f64> {
    let n = x.len() as f64;
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(p, q)| p * q).sum::<f64>();
    match kind {
        NormBackKind::Norm { eps } | NormBackKind::Group { eps, .. } => {
            // y = (x - mean)·r, r = 1/sqrt(var + eps): dx = r·(g - mean(g) - y·mean(g·y))
            let mean = x.iter().sum::<f64>() / n;
            let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
            let r = 1.0 / (var + eps as f64).sqrt();
            let y: Vec<f64> = x.iter().map(|v| (v - mean) * r).collect();
            let mg = g.iter().sum::<f64>() / n;
            let mgy = dot(g, &y) / n;
            g.iter()
                .zip(&y)
                .map(|(gi, yi)| r * (gi - mg - yi * mgy))
                .collect()
        }
        NormBackKind::Rms { eps } => {
            // y = x·r, r = 1/sqrt(mean(x²) + eps): dx = r·g - x·r³·mean(g·x)
            let ms = dot(x, x) / n;
            let r = 1.0 / (ms + eps as f64).sqrt();
            let mgx = dot(g, x) / n;
            g.iter()
                .zip(x)
                .map(|(gi, xi)| r * gi - xi * r * r * r * mgx)
                .collect()
        }
        NormBackKind::L2 { eps } => {
            // y = x / max(|x|, eps): below eps the scale is a constant
            let norm = dot(x, x).sqrt();
            if norm <= eps as f64 {
                let s = 1.0 / eps as f64;
                return g.iter().map(|gi| gi * s).collect();
            }
            let s = 1.0 / norm;
            let gx = dot(g, x);
            g.iter()
                .zip(x)
                .map(|(gi, xi)| s * gi - xi * s * s * s * gx)
                .collect()
        }
    }
}

fn standardize(xs: &[f64], eps: f64) -> Vec<f64> {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    let scale = 1.0 / (var + eps).sqrt();
    xs.iter().map(|x| (x - mean) * scale).collect()
}

pub(crate) fn reference(n: &NodeRef, src: &[Dense]) -> Result<Dense> {
    let a = &src[0];
    let ne = a.ne;
    let mut out = Dense::zeros(ne);
    if let Op::NormBack(kind) = n.t.op {
        let x = &src[1];
        if let NormBackKind::Group { n_groups, .. } = kind {
            let channels = ne[2];
            let per_group = channels.div_ceil(n_groups);
            for gr in 0..n_groups {
                let start = (gr * per_group).min(channels);
                let end = (start + per_group).min(channels);
                for i3 in 0..ne[3] {
                    let (mut xs, mut gs) = (Vec::new(), Vec::new());
                    for i2 in start..end {
                        for i1 in 0..ne[1] {
                            xs.extend_from_slice(x.row(i1, i2, i3));
                            gs.extend_from_slice(a.row(i1, i2, i3));
                        }
                    }
                    if xs.is_empty() {
                        continue;
                    }
                    let dx = norm_back_vec(kind, &gs, &xs);
                    let mut k = 0;
                    for i2 in start..end {
                        for i1 in 0..ne[1] {
                            out.row_mut(i1, i2, i3).copy_from_slice(&dx[k..k + ne[0]]);
                            k += ne[0];
                        }
                    }
                }
            }
        } else {
            for i3 in 0..ne[3] {
                for i2 in 0..ne[2] {
                    for i1 in 0..ne[1] {
                        let dx = norm_back_vec(kind, a.row(i1, i2, i3), x.row(i1, i2, i3));
                        out.row_mut(i1, i2, i3).copy_from_slice(&dx);
                    }
                }
            }
        }
        return Ok(out);
    }
    match n.t.op {
        Op::Norm { eps } | Op::RmsNorm { eps } | Op::L2Norm { eps } => {
            let eps = eps as f64;
            for i3 in 0..ne[3] {
                for i2 in 0..ne[2] {
                    for i1 in 0..ne[1] {
                        let x = a.row(i1, i2, i3);
                        let y: Vec<f64> = match n.t.op {
                            Op::Norm { .. } => standardize(x, eps),
                            Op::RmsNorm { .. } => {
                                let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
                                let scale = 1.0 / (ms + eps).sqrt();
                                x.iter().map(|v| v * scale).collect()
                            }
                            _ => {
                                let norm = x.iter().map(|v| v * v).sum::<f64>().sqrt();
                                let scale = 1.0 / norm.max(eps);
                                x.iter().map(|v| v * scale).collect()
                            }
                        };
                        out.row_mut(i1, i2, i3).copy_from_slice(&y);
                    }
                }
            }
        }
        Op::GroupNorm { n_groups, eps } => {
            let channels = ne[2];
            let per_group = channels.div_ceil(n_groups);
            for g in 0..n_groups {
                let start = (g * per_group).min(channels);
                let end = (start + per_group).min(channels);
                if start == end {
                    continue;
                }
                for i3 in 0..ne[3] {
                    let mut xs = Vec::with_capacity(ne[0] * ne[1] * (end - start));
                    for i2 in start..end {
                        for i1 in 0..ne[1] {
                            xs.extend_from_slice(a.row(i1, i2, i3));
                        }
                    }
                    let ys = standardize(&xs, eps as f64);
                    let mut k = 0;
                    for i2 in start..end {
                        for i1 in 0..ne[1] {
                            out.row_mut(i1, i2, i3).copy_from_slice(&ys[k..k + ne[0]]);
                            k += ne[0];
                        }
                    }
                }
            }
        }
        _ => return Err(n.err("not a normalisation op")),
    }
    Ok(out)
}

impl Graph {
    /// Backward of the normalisations through one fused `norm_back` node each.
    pub(crate) fn backward_norm(
        &mut self,
        bw: &crate::autodiff::Bw,
    ) -> Result<crate::autodiff::Grads> {
        let t = self.tensor(bw.node).clone();
        let kind = match t.op {
            Op::Norm { eps } => NormBackKind::Norm { eps },
            Op::RmsNorm { eps } => NormBackKind::Rms { eps },
            Op::L2Norm { eps } => NormBackKind::L2 { eps },
            Op::GroupNorm { n_groups, eps } => NormBackKind::Group { n_groups, eps },
            _ => return Err(self.not_diff(bw.node, 0, "not a normalisation")),
        };
        Ok(vec![Some(self.norm_back(bw.grad, t.src[0], kind)?)])
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::testutil::*;
    use crate::*;

    /// Direct per-row formulas on a flat row-major buffer with rows of `n`.
    fn rows_direct(x: &[f32], n: usize, f: impl Fn(&[f64]) -> Vec<f64>) -> Vec<f64> {
        x.chunks(n)
            .flat_map(|r| f(&r.iter().map(|&v| v as f64).collect::<Vec<_>>()))
            .collect()
    }

    fn direct(kind: &str, eps: f64) -> impl Fn(&[f64]) -> Vec<f64> + '_ {
        move |r: &[f64]| {
            let n = r.len() as f64;
            match kind {
                "norm" => {
                    let m = r.iter().sum::<f64>() / n;
                    let v = r.iter().map(|x| (x - m).powi(2)).sum::<f64>() / n;
                    r.iter().map(|x| (x - m) / (v + eps).sqrt()).collect()
                }
                "rms_norm" => {
                    let ms = r.iter().map(|x| x * x).sum::<f64>() / n;
                    r.iter().map(|x| x / (ms + eps).sqrt()).collect()
                }
                _ => {
                    let l = r.iter().map(|x| x * x).sum::<f64>().sqrt();
                    r.iter().map(|x| x / l.max(eps)).collect()
                }
            }
        }
    }

    fn build(g: &mut Graph, kind: &str, a: TensorId, eps: f32) -> TensorId {
        match kind {
            "norm" => g.norm(a, eps),
            "rms_norm" => g.rms_norm(a, eps),
            _ => g.l2_norm(a, eps),
        }
        .unwrap()
    }

    #[test]
    fn hand_checked_rows() {
        // row [1, 2, 3, 4]: mean 2.5, var 1.25; mean of squares 7.5; norm sqrt(30)
        let x = vec![1.0f32, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0];
        let mut g = Graph::new();
        let a = g.new_f32(&[4, 2]).unwrap();
        let n = g.norm(a, 0.0).unwrap();
        let r = g.rms_norm(a, 0.0).unwrap();
        let l = g.l2_norm(a, 1e-3).unwrap();
        let mut s = Session::new(g, &[n, r, l]).unwrap();
        s.set_f32(a, &x).unwrap();
        s.compute(&ReferenceBackend).unwrap();
        let sd = 1.25f64.sqrt();
        let want_n = [-1.5 / sd, -0.5 / sd, 0.5 / sd, 1.5 / sd];
        let got_n = s.get_f32(n).unwrap();
        assert_close(&got_n[..4], &want_n, 1e-6);
        // with eps = 0 an all-zero row is 0 * 1/sqrt(0): NaN, as in ggml
        assert!(got_n[4..].iter().all(|v| v.is_nan()), "{got_n:?}");
        let rms = 7.5f64.sqrt();
        let want_r = [1.0 / rms, 2.0 / rms, 3.0 / rms, 4.0 / rms];
        assert_close(&s.get_f32(r).unwrap()[..4], &want_r, 1e-6);
        // the all-zero row: 0 * 1/max(0, eps) = 0
        let l30 = 30f64.sqrt();
        let want_l = [
            1.0 / l30,
            2.0 / l30,
            3.0 / l30,
            4.0 / l30,
            0.0,
            0.0,
            0.0,
            0.0,
        ];
        assert_close(&s.get_f32(l).unwrap(), &want_l, 1e-6);
    }

    #[test]
    fn l2_norm_clamps_small_norms_to_eps() {
        let mut g = Graph::new();
        let a = g.new_f32(&[2]).unwrap();
        let l = g.l2_norm(a, 0.5).unwrap();
        // ||(0.3, 0.0)|| = 0.3 < 0.5, so the row is divided by 0.5
        let out = run1(g, &[(a, vec![0.3, 0.0])], l);
        assert_close(&out, &[0.6, 0.0], 1e-6);
    }

    #[test]
    fn random_shapes_against_direct_formulas() {
        let mut rng = Rng::new(7);
        for kind in ["norm", "rms_norm", "l2_norm"] {
            for ne in [
                [1, 1, 1, 1],
                [3, 1, 1, 1],
                [17, 3, 1, 2],
                [3, 17, 2, 1],
                [64, 5, 3, 1],
            ] {
                let mut g = Graph::new();
                let a = g.new_f32(&ne).unwrap();
                let y = build(&mut g, kind, a, 1e-5);
                let x = rng.vec(ne.iter().product(), -3.0, 3.0);
                let got = run1(g, &[(a, x.clone())], y);
                assert_close(&got, &rows_direct(&x, ne[0], direct(kind, 1e-5)), 1e-5);
            }
        }
    }

    #[test]
    fn transposed_and_permuted_inputs() {
        let mut rng = Rng::new(11);
        for kind in ["norm", "rms_norm", "l2_norm"] {
            // a leaf [3, 17]; its transpose [17, 3] has rows of 17 spread with stride 3
            let mut g = Graph::new();
            let a = g.new_f32(&[3, 17]).unwrap();
            let t = g.transpose(a).unwrap();
            assert!(!g.is_contiguous(t));
            let y = build(&mut g, kind, t, 1e-6);
            let x = rng.vec(51, -2.0, 2.0);
            let got = run1(g, &[(a, x.clone())], y);
            let tx: Vec<f32> = (0..51).map(|k| x[(k % 17) * 3 + k / 17]).collect();
            assert_close(&got, &rows_direct(&tx, 17, direct(kind, 1e-6)), 1e-5);

            // a permuted 3-d view: [4, 3, 5] -> dims (1, 2, 0): ne = [5, 4, 3]
            let mut g = Graph::new();
            let a = g.new_f32(&[4, 3, 5]).unwrap();
            let p = g.permute(a, [1, 2, 0, 3]).unwrap();
            assert_eq!(g.ne(p), [5, 4, 3, 1]);
            let y = build(&mut g, kind, p, 1e-6);
            let x = rng.vec(60, -2.0, 2.0);
            let got = run1(g, &[(a, x.clone())], y);
            // p[j0, j1, j2] = a[j1, j2, j0]
            let px: Vec<f32> = (0..60)
                .map(|k| {
                    let (j0, j1, j2) = (k % 5, (k / 5) % 4, k / 20);
                    x[j0 * 12 + j2 * 4 + j1]
                })
                .collect();
            assert_close(&got, &rows_direct(&px, 5, direct(kind, 1e-6)), 1e-5);
        }
    }

    /// Group norm by hand: groups of channels along dim 2, per index of dim 3.
    fn group_direct(x: &[f32], ne: [usize; 4], groups: usize, eps: f64) -> Vec<f64> {
        let plane = ne[0] * ne[1];
        let per = ne[2].div_ceil(groups);
        let mut out = vec![0.0; x.len()];
        for i3 in 0..ne[3] {
            let mut c = 0;
            while c < ne[2] {
                let end = (c + per).min(ne[2]);
                let lo = (i3 * ne[2] + c) * plane;
                let hi = (i3 * ne[2] + end) * plane;
                let vals: Vec<f64> = x[lo..hi].iter().map(|&v| v as f64).collect();
                let n = vals.len() as f64;
                let m = vals.iter().sum::<f64>() / n;
                let v = vals.iter().map(|x| (x - m).powi(2)).sum::<f64>() / n;
                for (k, xv) in vals.iter().enumerate() {
                    out[lo + k] = (xv - m) / (v + eps).sqrt();
                }
                c = end;
            }
        }
        out
    }

    #[test]
    fn group_norm_even_and_uneven_groups() {
        let mut rng = Rng::new(3);
        // 8 channels in 4 groups; 5 channels in 4 groups (2, 2, 1, and an empty group);
        // 3 channels in 1 group; 17 channels in 17 groups; a batch dim
        for (ne, groups) in [
            ([4, 2, 8, 1], 4),
            ([3, 2, 5, 1], 4),
            ([1, 1, 3, 1], 1),
            ([3, 1, 17, 2], 17),
            ([2, 3, 6, 3], 4),
        ] {
            let mut g = Graph::new();
            let a = g.new_f32(&ne).unwrap();
            let y = g.group_norm(a, groups, 1e-6).unwrap();
            let x = rng.vec(ne.iter().product(), -2.0, 2.0);
            let got = run1(g, &[(a, x.clone())], y);
            assert_close(&got, &group_direct(&x, ne, groups, 1e-6), 1e-5);
        }
        // by hand: 1 x 1 x 2 channels in one group: [1, 3] -> mean 2, var 1 -> [-1, 1]
        let mut g = Graph::new();
        let a = g.new_f32(&[1, 1, 2]).unwrap();
        let y = g.group_norm(a, 1, 0.0).unwrap();
        assert_close(&run1(g, &[(a, vec![1.0, 3.0])], y), &[-1.0, 1.0], 1e-7);
    }

    #[test]
    fn group_norm_on_a_permuted_view() {
        let mut rng = Rng::new(5);
        let mut g = Graph::new();
        let a = g.new_f32(&[6, 3, 2]).unwrap();
        // p = permute (2, 0, 1): ne = [3, 2, 6]; p[j0, j1, j2] = a[j2, j0, j1]
        let p = g.permute(a, [2, 0, 1, 3]).unwrap();
        assert_eq!(g.ne(p), [3, 2, 6, 1]);
        let y = g.group_norm(p, 3, 1e-6).unwrap();
        let x = rng.vec(36, -1.0, 1.0);
        let got = run1(g, &[(a, x.clone())], y);
        let px: Vec<f32> = (0..36)
            .map(|k| {
                let (j0, j1, j2) = (k % 3, (k / 3) % 2, k / 6);
                x[j1 * 18 + j0 * 6 + j2]
            })
            .collect();
        assert_close(&got, &group_direct(&px, [3, 2, 6, 1], 3, 1e-6), 1e-5);
    }

    #[test]
    fn bad_inputs_name_the_op_and_shapes() {
        let mut g = Graph::new();
        let h = g.new_tensor(DType::F16, &[8, 2]).unwrap();
        let e = g.rms_norm(h, 1e-6).unwrap_err().to_string();
        assert!(
            e.starts_with("rms_norm:") && e.contains("type f16") && e.contains("f16 [8, 2, 1, 1]"),
            "{e}"
        );
        let a = g.new_f32(&[8, 2]).unwrap();
        let e = g.norm(a, -1.0).unwrap_err().to_string();
        assert!(
            e.starts_with("norm:") && e.contains("eps") && e.contains("f32 [8, 2, 1, 1]"),
            "{e}"
        );
        let e = g.group_norm(a, 0, 1e-6).unwrap_err().to_string();
        assert!(
            e.starts_with("group_norm:")
                && e.contains("n_groups")
                && e.contains("f32 [8, 2, 1, 1]"),
            "{e}"
        );
        let e = g.l2_norm(h, 1e-6).unwrap_err().to_string();
        assert!(e.starts_with("l2_norm:"), "{e}");
    }
}
