//! Matrix products with ggml's conventions: mul_mat(a, b) = b · aᵀ with a [K, M, …], b [K, N, …]
//! and result [M, N, …], `a` broadcast over dims 2 and 3 of `b`; out_prod(a, b) with a [M, K, …],
//! b [N, K, …] and result [M, N, …] = Σ_k a[:, k] ⊗ b[:, k], broadcast the same way.
//!
//! Precision follows ggml's CPU backend where it is part of the result: with `a` in f16 or bf16,
//! ggml converts `b` to `a`'s type before the dot products, so the reference rounds `b` the same
//! way (the products and sums are then exact in f64). With a quantized `a`, ggml also quantizes
//! `b` (to q8_0, q8_1 or q8_K); the reference does not, and computes with the dequantized `a` and
//! the exact `b` (ggml's own tests allow an nmse of 5e-4 for these).

use crate::error::Result;
use crate::graph::{Graph, F32_ONLY, FLOATS};
use crate::op::Op;
use crate::reference::{Dense, NodeRef};
use crate::shape::{fmt_ne, rows_contiguous, Ne};
use crate::tensor::TensorId;
use crate::DType;

impl Graph {
    /// Checks that `a` is a float or quantized matrix (quantized rows contiguous) and `b` one of
    /// `b_types`.
    fn check_product_types(
        &self,
        op: &'static str,
        a: TensorId,
        b: TensorId,
        b_types: &[DType],
    ) -> Result<()> {
        self.check_id(op, a)?;
        self.check_id(op, b)?;
        let at = self.tensor(a);
        if !(FLOATS.contains(&at.dtype) || at.dtype.is_quantized()) {
            return Err(self.shape_err(
                op,
                format!(
                    "a has type {}, expected a float or quantized type",
                    at.dtype
                ),
                &[a, b],
            ));
        }
        if at.dtype.is_quantized() && !rows_contiguous(at.dtype, &at.ne, &at.nb) {
            return Err(self.shape_err(op, "a quantized a needs contiguous rows", &[a, b]));
        }
        let bt = self.dtype(b);
        if !b_types.contains(&bt) {
            let names: Vec<&str> = b_types.iter().map(|d| d.name()).collect();
            return Err(self.shape_err(
                op,
                format!("b has type {bt}, expected one of {}", names.join("/")),
                &[a, b],
            ));
        }
        Ok(())
    }

    /// The shape rules mul_mat and out_prod share: `a` and `b` agree on the summed dim, and `a`
    /// broadcasts over `b` in dims 2 and 3.
    fn check_product_shapes(
        &self,
        op: &'static str,
        a: TensorId,
        b: TensorId,
        summed: usize,
    ) -> Result<(Ne, Ne)> {
        let (ane, bne) = (self.ne(a), self.ne(b));
        if ane[summed] != bne[summed] {
            let what = if summed == 0 {
                "row length ne[0]"
            } else {
                "ne[1]"
            };
            return Err(self.shape_err(
                op,
                format!(
                    "a {} and b {} must have the same {what} (the summed dim)",
                    fmt_ne(&ane),
                    fmt_ne(&bne)
                ),
                &[a, b],
            ));
        }
        if bne[2] % ane[2] != 0 || bne[3] % ane[3] != 0 {
            return Err(self.shape_err(
                op,
                format!(
                    "a {} cannot be broadcast over b {} (b's dims 2 and 3 must be multiples of a's)",
                    fmt_ne(&ane),
                    fmt_ne(&bne)
                ),
                &[a, b],
            ));
        }
        Ok((ane, bne))
    }

    /// ggml's `mul_mat(a, b)` = b · aᵀ: a [K, M, a2, a3] (f32, f16, bf16 or quantized; float `a`
    /// may be any strided view), b [K, N, b2, b3] (f32, f16 or bf16) with `b2 % a2 == 0` and
    /// `b3 % a3 == 0`; the f32 result [M, N, b2, b3] holds
    /// `Σ_k a[k, m, i2 / (b2/a2), i3 / (b3/a3)] · b[k, n, i2, i3]`.
    pub fn mul_mat(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        const OP: &str = "mul_mat";
        self.check_product_types(OP, a, b, FLOATS)?;
        let (ane, bne) = self.check_product_shapes(OP, a, b, 0)?;
        Ok(self.node(
            Op::MulMat,
            DType::F32,
            [ane[1], bne[1], bne[2], bne[3]],
            &[a, b],
        ))
    }

    /// ggml's `out_prod(a, b)`: a [M, K, a2, a3] (f32, f16, bf16 or quantized), b [N, K, b2, b3]
    /// f32 with `b2 % a2 == 0` and `b3 % a3 == 0`; the f32 result [M, N, b2, b3] holds
    /// `Σ_k a[i, k, i2 / (b2/a2), i3 / (b3/a3)] · b[j, k, i2, i3]` at `(i, j, i2, i3)`.
    pub fn out_prod(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        const OP: &str = "out_prod";
        self.check_product_types(OP, a, b, F32_ONLY)?;
        let (ane, bne) = self.check_product_shapes(OP, a, b, 1)?;
        Ok(self.node(
            Op::OutProd,
            DType::F32,
            [ane[0], bne[0], bne[2], bne[3]],
            &[a, b],
        ))
    }
}

/// `b` as ggml's CPU backend feeds it to the dot products with an `a` of type `a_type`.
fn round_like(a_type: DType, b: &Dense) -> Dense {
    let r: fn(f64) -> f64 = match a_type {
        DType::F16 => |v| half::f16::from_f32(v as f32).to_f64(),
        DType::BF16 => |v| half::bf16::from_f32(v as f32).to_f64(),
        _ => return b.clone(),
    };
    Dense {
        ne: b.ne,
        data: b.data.iter().map(|&v| r(v)).collect(),
    }
}

pub(crate) fn reference(n: &NodeRef, src: &[Dense]) -> Result<Dense> {
    let (a, b) = (&src[0], &src[1]);
    let ne = n.t.ne;
    let (r2, r3) = (b.ne[2] / a.ne[2], b.ne[3] / a.ne[3]);
    match n.t.op {
        Op::MulMat => {
            let b = round_like(n.src(0).dtype, b);
            let k = a.ne[0];
            Ok(Dense::from_fn(ne, |m, j, i2, i3| {
                let ar = a.row(m, i2 / r2, i3 / r3);
                let br = b.row(j, i2, i3);
                (0..k).map(|x| ar[x] * br[x]).sum()
            }))
        }
        Op::OutProd => {
            let k = a.ne[1];
            Ok(Dense::from_fn(ne, |i, j, i2, i3| {
                (0..k)
                    .map(|x| a.at(i, x, i2 / r2, i3 / r3) * b.at(j, x, i2, i3))
                    .sum()
            }))
        }
        _ => Err(n.err("not a matrix product")),
    }
}

impl Graph {
    /// Backward of mul_mat and out_prod. For `out = mul_mat(a, b)` (`out[m,n] = Σk a[k,m]·b[k,n]`):
    /// - `db = mul_mat(aᵀ, grad)` for f32/f16/bf16 `a` (the transposed copy keeps `a`'s type);
    ///   for a quantized `a`, `db = out_prod(a, gradᵀ)`, which reads `a` a row at a time: no
    ///   gradient and no f32 copy of the frozen weight is ever made;
    /// - `da = mul_mat(bᵀ, gradᵀ)` (summed over broadcast batches), only when `a` needs it —
    ///   a quantized `a` cannot be trained (freeze it, e.g. under LoRA).
    pub(crate) fn backward_matmul(
        &mut self,
        bw: &crate::autodiff::Bw,
    ) -> Result<crate::autodiff::Grads> {
        let t = self.tensor(bw.node).clone();
        let (a, b) = (t.src[0], t.src[1]);
        let g = bw.grad;
        match t.op {
            Op::MulMat => {
                let mut ga = None;
                let mut gb = None;
                if bw.wants(0) {
                    if self.dtype(a).is_quantized() {
                        return Err(self.not_diff(
                            bw.node,
                            0,
                            &format!("a {} weight cannot be trained: freeze it (LoRA trains adapters beside it)", self.dtype(a)),
                        ));
                    }
                    // the GEMM packs its panels from strided operands: no transposed copies
                    let bc = self.cast_f32(b)?;
                    let bt = self.transpose(bc)?;
                    let gt = self.transpose(g)?;
                    let full = self.mul_mat(bt, gt)?;
                    ga = Some(self.reduce_batches_to(full, a)?);
                }
                if bw.wants(1) {
                    gb = Some(if self.dtype(a).is_quantized() {
                        let gt = self.transpose(g)?;
                        let gt = self.contig(gt)?;
                        self.out_prod(a, gt)?
                    } else {
                        let at = self.transpose(a)?;
                        self.mul_mat(at, g)?
                    });
                }
                Ok(vec![ga, gb])
            }
            Op::OutProd => {
                // out[i,j] = Σk a[i,k]·b[j,k]
                let mut ga = None;
                let mut gb = None;
                if bw.wants(0) {
                    let gt = self.transposed(g)?;
                    let bc = self.cast(b, DType::F32)?;
                    let full = self.mul_mat(gt, bc)?;
                    ga = Some(self.reduce_batches_to(full, a)?);
                }
                if bw.wants(1) {
                    let gc = self.contig(g)?;
                    let ac = if self.dtype(a).is_quantized() {
                        return Err(self.not_diff(bw.node, 1, "out_prod with a quantized a is differentiated w.r.t. b through mul_mat, which needs a float a"));
                    } else {
                        self.cast(a, DType::F32)?
                    };
                    let gne = self.ne(gc);
                    if self.ne(ac)[2] != gne[2] || self.ne(ac)[3] != gne[3] {
                        return Err(self.not_diff(
                            bw.node,
                            1,
                            "out_prod broadcasting a over batches is differentiated only w.r.t. a",
                        ));
                    }
                    gb = Some(self.mul_mat(gc, ac)?);
                }
                Ok(vec![ga, gb])
            }
            _ => Err(self.not_diff(bw.node, 0, "not a matrix product")),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::testutil::*;
    use crate::*;

    /// b · aᵀ with broadcasting, straight from the definition (a, b logical order).
    fn mul_mat_want(a: &[f64], ane: [usize; 4], b: &[f64], bne: [usize; 4]) -> Vec<f64> {
        let (r2, r3) = (bne[2] / ane[2], bne[3] / ane[3]);
        let mut out = vec![];
        for i3 in 0..bne[3] {
            for i2 in 0..bne[2] {
                for n in 0..bne[1] {
                    for m in 0..ane[1] {
                        let mut s = 0.0;
                        for k in 0..ane[0] {
                            let ai = ((i3 / r3 * ane[2] + i2 / r2) * ane[1] + m) * ane[0] + k;
                            let bi = ((i3 * bne[2] + i2) * bne[1] + n) * bne[0] + k;
                            s += a[ai] * b[bi];
                        }
                        out.push(s);
                    }
                }
            }
        }
        out
    }

    fn f64s(v: &[f32]) -> Vec<f64> {
        v.iter().map(|&x| x as f64).collect()
    }

    #[test]
    fn mul_mat_by_hand() {
        // a: 2 rows [1 2 3], [4 5 6]; b: 1 row [1 0 -1] -> [1-3, 4-6] = [-2, -2]
        let mut g = Graph::new();
        let a = g.new_f32(&[3, 2]).unwrap();
        let b = g.new_f32(&[3, 2]).unwrap();
        let c = g.mul_mat(a, b).unwrap();
        assert_eq!(g.ne(c), [2, 2, 1, 1]);
        let out = run1(
            g,
            &[
                (a, vec![1., 2., 3., 4., 5., 6.]),
                (b, vec![1., 0., -1., 0.5, 1., 2.]),
            ],
            c,
        );
        assert_eq!(out, vec![-2., -2., 8.5, 19.]);
    }

    #[test]
    fn mul_mat_random_shapes_with_broadcast() {
        let mut rng = Rng::new(11);
        for (ane, bne) in [
            ([1, 1, 1, 1], [1, 1, 1, 1]),
            ([3, 17, 1, 1], [3, 1, 1, 1]),
            ([17, 3, 2, 1], [17, 5, 6, 1]),
            ([5, 4, 1, 3], [5, 3, 2, 3]),
            ([32, 12, 2, 1], [32, 5, 6, 2]),
        ] {
            let mut g = Graph::new();
            let a = g.new_f32(&ane).unwrap();
            let b = g.new_f32(&bne).unwrap();
            let c = g.mul_mat(a, b).unwrap();
            assert_eq!(g.ne(c), [ane[1], bne[1], bne[2], bne[3]]);
            let av = rng.vec(ane.iter().product(), -1.0, 1.0);
            let bv = rng.vec(bne.iter().product(), -1.0, 1.0);
            let out = run1(g, &[(a, av.clone()), (b, bv.clone())], c);
            assert_close(&out, &mul_mat_want(&f64s(&av), ane, &f64s(&bv), bne), 1e-6);
        }
    }

    #[test]
    fn mul_mat_with_transposed_and_permuted_views() {
        // a = transpose(x), x [4, 3] -> a [3, 4]; b = a permuted view of y [2, 3, 1] -> [3, 2]
        let mut rng = Rng::new(3);
        let mut g = Graph::new();
        let x = g.new_f32(&[4, 3]).unwrap();
        let a = g.transpose(x).unwrap();
        let y = g.new_f32(&[2, 3]).unwrap();
        let b = g.permute(y, [1, 0, 2, 3]).unwrap();
        let c = g.mul_mat(a, b).unwrap();
        // c097's form: b = cont(transpose(y))
        let bt = g.transpose(y).unwrap();
        let bc = g.cont(bt).unwrap();
        let c2 = g.mul_mat(a, bc).unwrap();
        let xv = rng.vec(12, -2.0, 2.0);
        let yv = rng.vec(6, -2.0, 2.0);
        let mut s = Session::new(g, &[c, c2]).unwrap();
        s.set_f32(x, &xv).unwrap();
        s.set_f32(y, &yv).unwrap();
        s.compute(&ReferenceBackend).unwrap();
        let at: Vec<f64> = (0..12).map(|i| xv[(i % 3) * 4 + i / 3] as f64).collect();
        let bt: Vec<f64> = (0..6).map(|i| yv[(i % 3) * 2 + i / 3] as f64).collect();
        let want = mul_mat_want(&at, [3, 4, 1, 1], &bt, [3, 2, 1, 1]);
        assert_close(&s.get_f32(c).unwrap(), &want, 1e-6);
        assert_close(&s.get_f32(c2).unwrap(), &want, 1e-6);
    }

    #[test]
    fn mul_mat_half_precision_a_rounds_b_like_ggml() {
        let mut rng = Rng::new(5);
        for dt in [DType::F16, DType::BF16] {
            let (ane, bne) = ([17, 3, 1, 1], [17, 4, 1, 1]);
            let mut g = Graph::new();
            let a = g.new_tensor(dt, &ane).unwrap();
            let b = g.new_f32(&bne).unwrap();
            let c = g.mul_mat(a, b).unwrap();
            let av = rng.vec(51, -1.0, 1.0);
            let bv = rng.vec(68, -1.0, 1.0);
            let out = run1(g, &[(a, av.clone()), (b, bv.clone())], c);
            let round = |v: f32| match dt {
                DType::F16 => half::f16::from_f32(v).to_f64(),
                _ => half::bf16::from_f32(v).to_f64(),
            };
            let ar: Vec<f64> = av.iter().map(|&v| round(v)).collect();
            let br: Vec<f64> = bv.iter().map(|&v| round(v)).collect();
            assert_close(&out, &mul_mat_want(&ar, ane, &br, bne), 1e-6);
        }
        // an f16 b with an f32 a is used as it is
        let mut g = Graph::new();
        let a = g.new_f32(&[2, 1]).unwrap();
        let b = g.new_tensor(DType::F16, &[2, 1]).unwrap();
        let c = g.mul_mat(a, b).unwrap();
        let out = run1(g, &[(a, vec![0.1, 0.3]), (b, vec![2.0, 0.5])], c);
        assert_close(&out, &[0.1f32 as f64 * 2.0 + 0.3f32 as f64 * 0.5], 1e-7);
    }

    #[test]
    fn mul_mat_errors_name_both_shapes() {
        let mut g = Graph::new();
        let a = g.new_f32(&[4, 3]).unwrap();
        let b = g.new_f32(&[5, 2]).unwrap();
        let e = g.mul_mat(a, b).unwrap_err().to_string();
        assert!(
            e.starts_with("mul_mat:") && e.contains("[4, 3, 1, 1]") && e.contains("[5, 2, 1, 1]"),
            "{e}"
        );
        let a3 = g.new_f32(&[4, 3, 2]).unwrap();
        let b3 = g.new_f32(&[4, 3, 3]).unwrap();
        let e = g.mul_mat(a3, b3).unwrap_err().to_string();
        assert!(
            e.contains("broadcast") && e.contains("[4, 3, 2, 1]") && e.contains("[4, 3, 3, 1]"),
            "{e}"
        );
        let i = g.new_tensor(DType::I32, &[4, 3]).unwrap();
        assert!(g
            .mul_mat(i, a)
            .unwrap_err()
            .to_string()
            .contains("type i32"));
        assert!(g
            .mul_mat(a, i)
            .unwrap_err()
            .to_string()
            .contains("type i32"));
    }

    #[test]
    fn out_prod_by_hand_and_random() {
        // a [2, 2] columns k: a[:,0] = [1, 2], a[:,1] = [3, 4]; b [1, 2]: b[0,0] = 10, b[0,1] = 1
        let mut g = Graph::new();
        let a = g.new_f32(&[2, 2]).unwrap();
        let b = g.new_f32(&[1, 2]).unwrap();
        let c = g.out_prod(a, b).unwrap();
        assert_eq!(g.ne(c), [2, 1, 1, 1]);
        let out = run1(g, &[(a, vec![1., 2., 3., 4.]), (b, vec![10., 1.])], c);
        assert_eq!(out, vec![13., 24.]);

        let mut rng = Rng::new(9);
        for (ane, bne) in [
            ([6, 4, 1, 1], [5, 4, 1, 1]),
            ([3, 17, 2, 1], [1, 17, 4, 3]),
            ([1, 1, 1, 1], [17, 1, 1, 1]),
        ] {
            let mut g = Graph::new();
            let a = g.new_f32(&ane).unwrap();
            let b = g.new_f32(&bne).unwrap();
            let c = g.out_prod(a, b).unwrap();
            let av = rng.vec(ane.iter().product(), -1.0, 1.0);
            let bv = rng.vec(bne.iter().product(), -1.0, 1.0);
            let out = run1(g, &[(a, av.clone()), (b, bv.clone())], c);
            let (r2, r3) = (bne[2] / ane[2], bne[3] / ane[3]);
            let mut want = vec![];
            for i3 in 0..bne[3] {
                for i2 in 0..bne[2] {
                    for j in 0..bne[0] {
                        for i in 0..ane[0] {
                            let mut s = 0.0;
                            for k in 0..ane[1] {
                                let ai = ((i3 / r3 * ane[2] + i2 / r2) * ane[1] + k) * ane[0] + i;
                                let bi = ((i3 * bne[2] + i2) * bne[1] + k) * bne[0] + j;
                                s += av[ai] as f64 * bv[bi] as f64;
                            }
                            want.push(s);
                        }
                    }
                }
            }
            assert_close(&out, &want, 1e-6);
        }
    }

    #[test]
    fn out_prod_of_a_transposed_f16_view_and_errors() {
        // a = transpose(x) with x f16 [2, 3] -> a [3, 2]; b [1, 2]
        let mut g = Graph::new();
        let x = g.new_tensor(DType::F16, &[2, 3]).unwrap();
        let a = g.transpose(x).unwrap();
        let b = g.new_f32(&[1, 2]).unwrap();
        let c = g.out_prod(a, b).unwrap();
        let out = run1(
            g,
            &[(x, vec![1., 2., 3., 4., 5., 6.]), (b, vec![1., -1.])],
            c,
        );
        // a[i, k] = x[k, i]: rows k of a are columns of x -> out[i] = x[0, i] - x[1, i]
        assert_eq!(out, vec![-1., -1., -1.]);

        let mut g = Graph::new();
        let a = g.new_f32(&[6, 4]).unwrap();
        let b = g.new_f32(&[5, 3]).unwrap();
        let e = g.out_prod(a, b).unwrap_err().to_string();
        assert!(
            e.starts_with("out_prod:") && e.contains("[6, 4, 1, 1]") && e.contains("[5, 3, 1, 1]"),
            "{e}"
        );
    }
}
