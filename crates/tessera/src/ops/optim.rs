//! Optimizer steps as graph ops: opt_step_adamw and opt_step_sgd (ggml's parameter tensors).
//!
//! In ggml these ops update the parameter (and AdamW's moments `m`, `v`) in place and return
//! a view of the parameter. Here, for now, the node's value is the updated parameter, a tensor
//! of its own; the parameter, `m` and `v` are left unchanged. Writing the updates back (the
//! parameter and both moments) is the optimizer's job and lands with it.

use crate::error::Result;
use crate::graph::{Graph, F32_ONLY};
use crate::op::Op;
use crate::reference::{Dense, NodeRef};
use crate::shape::fmt_ne;
use crate::tensor::TensorId;
use crate::DType;

impl Graph {
    /// Checks shared by both steps: f32 everywhere, `param` marked as a parameter, the
    /// same-shaped tensors match it, and the hyper-parameter tensor holds `n_hyper` values.
    fn opt_step_checks(&self, op: &'static str, src: &[TensorId], n_hyper: usize) -> Result<()> {
        self.check_types(op, src, &[F32_ONLY; 5][..src.len()])?;
        let param = src[0];
        if !self.flags(param).param {
            return Err(self.shape_err(
                op,
                "the first input must be a trainable parameter (set_param)",
                src,
            ));
        }
        let pne = self.ne(param);
        let hyper = src[src.len() - 1];
        for &s in &src[1..src.len() - 1] {
            if self.ne(s) != pne {
                return Err(self.shape_err(
                    op,
                    format!(
                        "{} must have the parameter's shape {}",
                        fmt_ne(&self.ne(s)),
                        fmt_ne(&pne)
                    ),
                    src,
                ));
            }
        }
        if self.tensor(hyper).nelements() != n_hyper {
            return Err(self.shape_err(
                op,
                format!("the hyper-parameter tensor must hold {n_hyper} values"),
                src,
            ));
        }
        Ok(())
    }

    /// ggml_opt_step_adamw: one AdamW step. `params` holds `[alpha, beta1, beta2, eps, wd,
    /// beta1h, beta2h]` with `beta1h = 1/(1-beta1^t)`, `beta2h = 1/(1-beta2^t)`. With
    /// `m' = beta1·m + (1-beta1)·g` and `v' = beta2·v + (1-beta2)·g²`, the value is
    /// `param·(1 - alpha·wd) - alpha·(m'·beta1h) / (sqrt(v'·beta2h) + eps)`.
    pub fn opt_step_adamw(
        &mut self,
        param: TensorId,
        grad: TensorId,
        m: TensorId,
        v: TensorId,
        params: TensorId,
    ) -> Result<TensorId> {
        let src = [param, grad, m, v, params];
        self.opt_step_checks("opt_step_adamw", &src, 7)?;
        let ne = self.ne(param);
        Ok(self.node(Op::OptStepAdamw, DType::F32, ne, &src))
    }

    /// ggml_opt_step_sgd: `param·(1 - alpha·wd) - alpha·grad` with `params = [alpha, wd]`.
    pub fn opt_step_sgd(
        &mut self,
        param: TensorId,
        grad: TensorId,
        params: TensorId,
    ) -> Result<TensorId> {
        let src = [param, grad, params];
        self.opt_step_checks("opt_step_sgd", &src, 2)?;
        let ne = self.ne(param);
        Ok(self.node(Op::OptStepSgd, DType::F32, ne, &src))
    }
}

pub(crate) fn reference(n: &NodeRef, src: &[Dense]) -> Result<Dense> {
    let (w, g) = (&src[0], &src[1]);
    match n.t.op {
        Op::OptStepAdamw => {
            let (m, v, h) = (&src[2], &src[3], &src[4].data);
            let (alpha, beta1, beta2, eps, wd, beta1h, beta2h) =
                (h[0], h[1], h[2], h[3], h[4], h[5], h[6]);
            let keep = 1.0 - alpha * wd;
            let data = (0..w.data.len())
                .map(|i| {
                    let gi = g.data[i];
                    let mi = m.data[i] * beta1 + gi * (1.0 - beta1);
                    let vi = v.data[i] * beta2 + gi * gi * (1.0 - beta2);
                    let mh = mi * beta1h;
                    let vh = (vi * beta2h).sqrt() + eps;
                    w.data[i] * keep - alpha * mh / vh
                })
                .collect();
            Ok(Dense { ne: w.ne, data })
        }
        Op::OptStepSgd => {
            let (alpha, wd) = (src[2].data[0], src[2].data[1]);
            let keep = 1.0 - alpha * wd;
            let data = w
                .data
                .iter()
                .zip(&g.data)
                .map(|(wi, gi)| wi * keep - alpha * gi)
                .collect();
            Ok(Dense { ne: w.ne, data })
        }
        _ => Err(n.err("not an optimizer step")),
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::testutil::*;
    use crate::*;

    #[test]
    fn sgd_by_hand() {
        let mut g = Graph::new();
        let w = g.new_f32(&[3]).unwrap();
        g.set_param(w).unwrap();
        let gr = g.new_f32(&[3]).unwrap();
        let p = g.new_f32(&[2]).unwrap();
        let y = g.opt_step_sgd(w, gr, p).unwrap();
        // alpha 0.5, wd 0.1: w * 0.95 - 0.5 g
        let out = run1(
            g,
            &[
                (w, vec![1.0, -2.0, 4.0]),
                (gr, vec![2.0, 0.0, -1.0]),
                (p, vec![0.5, 0.1]),
            ],
            y,
        );
        assert_close(&out, &[0.95 - 1.0, -1.9, 3.8 + 0.5], 1e-6);
    }

    #[test]
    fn adamw_first_step_by_hand() {
        // t = 1, m = v = 0: m' = (1-b1) g, v' = (1-b2) g², bias-corrected m'/(1-b1) = g,
        // sqrt(v'/(1-b2)) = |g|: the step is alpha * g / (|g| + eps) (plus weight decay)
        let (alpha, b1, b2, eps, wd) = (0.1f32, 0.9f32, 0.999f32, 1e-8f32, 0.0f32);
        let mut g = Graph::new();
        let w = g.new_f32(&[2, 2]).unwrap();
        g.set_param(w).unwrap();
        let gr = g.new_f32(&[2, 2]).unwrap();
        let m = g.new_f32(&[2, 2]).unwrap();
        let v = g.new_f32(&[2, 2]).unwrap();
        let p = g.new_f32(&[7]).unwrap();
        let y = g.opt_step_adamw(w, gr, m, v, p).unwrap();
        let hp = vec![alpha, b1, b2, eps, wd, 1.0 / (1.0 - b1), 1.0 / (1.0 - b2)];
        let grads = vec![0.5, -2.0, 1e-3, 3.0];
        let out = run1(
            g,
            &[
                (w, vec![1.0; 4]),
                (gr, grads.clone()),
                (m, vec![0.0; 4]),
                (v, vec![0.0; 4]),
                (p, hp),
            ],
            y,
        );
        let want: Vec<f64> = grads
            .iter()
            .map(|&gv| 1.0 - 0.1 * gv.signum() as f64)
            .collect();
        assert_close(&out, &want, 1e-5);
    }

    #[test]
    fn adamw_random_shapes_and_strided_views() {
        let mut rng = Rng::new(12);
        for ne in [[1, 1, 1, 1], [3, 1, 1, 1], [17, 3, 1, 1], [5, 3, 2, 2]] {
            let n: usize = ne.iter().product();
            let mut g = Graph::new();
            let w = g.new_f32(&ne).unwrap();
            g.set_param(w).unwrap();
            // the gradient arrives transposed
            let gl = g.new_f32(&[ne[1], ne[0], ne[2], ne[3]]).unwrap();
            let gr = g.transpose(gl).unwrap();
            let m = g.new_f32(&ne).unwrap();
            let v = g.new_f32(&ne).unwrap();
            let p = g.new_f32(&[7]).unwrap();
            let y = g.opt_step_adamw(w, gr, m, v, p).unwrap();
            let (wv, glv, mv) = (
                rng.vec(n, -1.0, 1.0),
                rng.vec(n, -1.0, 1.0),
                rng.vec(n, -0.1, 0.1),
            );
            let vv = rng.vec(n, 0.0, 0.01);
            let (alpha, b1, b2, eps, wd) = (1e-3f32, 0.9f32, 0.99f32, 1e-8f32, 0.01f32);
            let t = 3;
            let (b1h, b2h) = (1.0 / (1.0 - b1.powi(t)), 1.0 / (1.0 - b2.powi(t)));
            let hp = vec![alpha, b1, b2, eps, wd, b1h, b2h];
            let inputs = [
                (w, wv.clone()),
                (gl, glv.clone()),
                (m, mv.clone()),
                (v, vv.clone()),
                (p, hp.clone()),
            ];
            let got = run1(g, &inputs, y);
            let h: Vec<f64> = hp.iter().map(|&x| x as f64).collect();
            let want: Vec<f64> = (0..n)
                .map(|i| {
                    let (i0, i1, rest) = (i % ne[0], (i / ne[0]) % ne[1], i / (ne[0] * ne[1]));
                    let gv = glv[(rest * ne[0] + i0) * ne[1] + i1] as f64;
                    let m2 = h[1] * mv[i] as f64 + (1.0 - h[1]) * gv;
                    let v2 = h[2] * vv[i] as f64 + (1.0 - h[2]) * gv * gv;
                    wv[i] as f64 * (1.0 - h[0] * h[4])
                        - h[0] * m2 * h[5] / ((v2 * h[6]).sqrt() + h[3])
                })
                .collect();
            assert_close(&got, &want, 1e-5);
        }
    }

    #[test]
    fn bad_inputs_name_the_op_and_shapes() {
        let mut g = Graph::new();
        let w = g.new_f32(&[4, 2]).unwrap();
        let gr = g.new_f32(&[4, 2]).unwrap();
        let p2 = g.new_f32(&[2]).unwrap();
        let e = g.opt_step_sgd(w, gr, p2).unwrap_err().to_string();
        assert!(
            e.starts_with("opt_step_sgd:")
                && e.contains("set_param")
                && e.contains("f32 [4, 2, 1, 1]"),
            "{e}"
        );
        g.set_param(w).unwrap();
        let bad = g.new_f32(&[2, 4]).unwrap();
        let e = g.opt_step_sgd(w, bad, p2).unwrap_err().to_string();
        assert!(
            e.contains("[2, 4, 1, 1] must have the parameter's shape [4, 2, 1, 1]"),
            "{e}"
        );
        let p3 = g.new_f32(&[3]).unwrap();
        let e = g.opt_step_sgd(w, gr, p3).unwrap_err().to_string();
        assert!(
            e.contains("hold 2 values") && e.contains("f32 [3, 1, 1, 1]"),
            "{e}"
        );
        let m = g.new_f32(&[4, 2]).unwrap();
        let e = g.opt_step_adamw(w, gr, m, bad, p3).unwrap_err().to_string();
        assert!(
            e.starts_with("opt_step_adamw:") && e.contains("[2, 4, 1, 1]"),
            "{e}"
        );
        let e = g.opt_step_adamw(w, gr, m, m, p3).unwrap_err().to_string();
        assert!(e.contains("hold 7 values"), "{e}");
        let h = g.new_tensor(DType::F16, &[4, 2]).unwrap();
        let e = g.opt_step_adamw(w, h, m, m, p3).unwrap_err().to_string();
        assert!(e.contains("input 1 has type f16"), "{e}");
    }
}
