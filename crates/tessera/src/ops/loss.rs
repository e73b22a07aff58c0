//! cross_entropy_loss(logits, labels): mean over rows of -Σ labels · log_softmax(logits).

use crate::error::Result;
use crate::graph::{Graph, F32_ONLY};
use crate::op::Op;
use crate::reference::{Dense, NodeRef};
use crate::shape::fmt_ne;
use crate::tensor::TensorId;
use crate::DType;

impl Graph {
    /// ggml_cross_entropy_loss: `-(1/nrows) Σ_rows Σ_i labels_i · log_softmax(logits)_i`, the
    /// softmax over dim 0; logits and labels are f32 of the same shape, the result an f32 `[1]`.
    pub fn cross_entropy_loss(&mut self, logits: TensorId, labels: TensorId) -> Result<TensorId> {
        const OP: &str = "cross_entropy_loss";
        self.check_types(OP, &[logits, labels], &[F32_ONLY, F32_ONLY])?;
        let (a, b) = (self.ne(logits), self.ne(labels));
        if a != b {
            return Err(self.shape_err(
                OP,
                format!(
                    "logits {} and labels {} must have the same shape",
                    fmt_ne(&a),
                    fmt_ne(&b)
                ),
                &[logits, labels],
            ));
        }
        Ok(self.node(
            Op::CrossEntropyLoss,
            DType::F32,
            [1, 1, 1, 1],
            &[logits, labels],
        ))
    }
}

pub(crate) fn reference(n: &NodeRef, src: &[Dense]) -> Result<Dense> {
    if n.t.op != Op::CrossEntropyLoss {
        return Err(n.err("not cross_entropy_loss"));
    }
    let (x, y) = (&src[0], &src[1]);
    let ne = x.ne;
    let mut total = 0.0;
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                let (xr, yr) = (x.row(i1, i2, i3), y.row(i1, i2, i3));
                let max = xr.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
                let log_sum = xr.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
                total += xr
                    .iter()
                    .zip(yr)
                    .map(|(xv, yv)| yv * (xv - max - log_sum))
                    .sum::<f64>();
            }
        }
    }
    let nrows = (ne[1] * ne[2] * ne[3]) as f64;
    Ok(Dense {
        ne: [1, 1, 1, 1],
        data: vec![-total / nrows],
    })
}

impl Graph {
    /// Backward of cross_entropy_loss (mean over rows of `-Σ labels·log_softmax(logits)`):
    /// `dlogits = (softmax(logits) - labels)·grad/nrows` (assuming rows of labels sum to 1, as
    /// ggml does) and `dlabels = -log_softmax(logits)·grad/nrows`.
    pub(crate) fn backward_loss(
        &mut self,
        bw: &crate::autodiff::Bw,
    ) -> Result<crate::autodiff::Grads> {
        let t = self.tensor(bw.node).clone();
        let (x, y) = (t.src[0], t.src[1]);
        let nr = self.tensor(x).nrows() as f32;
        let xc = self.contig(x)?;
        let sm = self.soft_max(xc)?;
        let mut ga = None;
        let mut gb = None;
        if bw.wants(0) {
            let d = self.sub(sm, y)?;
            let s = self.scale(d, 1.0 / nr)?;
            ga = Some(self.mul(s, bw.grad)?);
        }
        if bw.wants(1) {
            let ls = self.log(sm)?;
            let s = self.scale(ls, -1.0 / nr)?;
            gb = Some(self.mul(s, bw.grad)?);
        }
        Ok(vec![ga, gb])
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::testutil::*;
    use crate::*;

    /// The loss computed directly from softmax probabilities.
    fn direct(x: &[f32], y: &[f32], n: usize) -> f64 {
        let rows = x.len() / n;
        let mut total = 0.0;
        for r in 0..rows {
            let xr = &x[r * n..(r + 1) * n];
            let z: f64 = xr.iter().map(|&v| (v as f64).exp()).sum();
            for i in 0..n {
                let p = (xr[i] as f64).exp() / z;
                total -= y[r * n + i] as f64 * p.ln();
            }
        }
        total / rows as f64
    }

    #[test]
    fn by_hand() {
        // uniform logits over 4 classes, one-hot labels: the loss is ln 4 for every row
        let mut g = Graph::new();
        let a = g.new_f32(&[4, 2]).unwrap();
        let b = g.new_f32(&[4, 2]).unwrap();
        let l = g.cross_entropy_loss(a, b).unwrap();
        assert_eq!(g.ne(l), [1, 1, 1, 1]);
        let labels = vec![1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0];
        let out = run1(g, &[(a, vec![2.5; 8]), (b, labels)], l);
        assert_close(&out, &[4f64.ln()], 1e-6);
        // logits (0, ln 3): p = (1/4, 3/4); labels (1/2, 1/2): loss = -(ln(1/4) + ln(3/4)) / 2
        let mut g = Graph::new();
        let a = g.new_f32(&[2]).unwrap();
        let b = g.new_f32(&[2]).unwrap();
        let l = g.cross_entropy_loss(a, b).unwrap();
        let out = run1(g, &[(a, vec![0.0, 3f32.ln()]), (b, vec![0.5, 0.5])], l);
        assert_close(&out, &[-(0.25f64.ln() + 0.75f64.ln()) / 2.0], 1e-6);
    }

    #[test]
    fn random_shapes_and_a_transposed_view() {
        let mut rng = Rng::new(8);
        for ne in [[1, 1, 1, 1], [3, 1, 1, 1], [17, 3, 1, 1], [10, 6, 2, 3]] {
            let mut g = Graph::new();
            let a = g.new_f32(&ne).unwrap();
            let b = g.new_f32(&ne).unwrap();
            let l = g.cross_entropy_loss(a, b).unwrap();
            let n: usize = ne.iter().product();
            let x = rng.vec(n, -4.0, 4.0);
            let y = rng.vec(n, 0.0, 1.0);
            let out = run1(g, &[(a, x.clone()), (b, y.clone())], l);
            assert_close(&out, &[direct(&x, &y, ne[0])], 1e-5);
        }
        // logits given as a transposed view: rows of 5 gathered with stride 3
        let mut g = Graph::new();
        let a = g.new_f32(&[3, 5]).unwrap();
        let t = g.transpose(a).unwrap();
        let b = g.new_f32(&[5, 3]).unwrap();
        let l = g.cross_entropy_loss(t, b).unwrap();
        let x = rng.vec(15, -2.0, 2.0);
        let y = rng.vec(15, 0.0, 1.0);
        let out = run1(g, &[(a, x.clone()), (b, y.clone())], l);
        let tx: Vec<f32> = (0..15).map(|k| x[(k % 5) * 3 + k / 5]).collect();
        assert_close(&out, &[direct(&tx, &y, 5)], 1e-5);
    }

    #[test]
    fn bad_inputs_name_the_op_and_shapes() {
        let mut g = Graph::new();
        let a = g.new_f32(&[10, 6]).unwrap();
        let b = g.new_f32(&[10, 5]).unwrap();
        let e = g.cross_entropy_loss(a, b).unwrap_err().to_string();
        assert!(
            e.starts_with("cross_entropy_loss:")
                && e.contains("f32 [10, 6, 1, 1]")
                && e.contains("f32 [10, 5, 1, 1]"),
            "{e}"
        );
        let h = g.new_tensor(DType::F16, &[10, 6]).unwrap();
        let e = g.cross_entropy_loss(a, h).unwrap_err().to_string();
        assert!(e.contains("input 1 has type f16"), "{e}");
    }
}
