//! Reductions and data reshaping: sum, sum_rows, mean, argmax, count_equal, cumsum, repeat,
//! repeat_back, concat, with ggml's shapes and result types:
//!
//! | op | inputs | result |
//! |---|---|---|
//! | `sum(a)` | f32/f16/bf16, any layout | `a`'s type, `[1, 1, 1, 1]` |
//! | `sum_rows(a)` | f32/f16/bf16 | `a`'s type, `[1, ne1, ne2, ne3]` |
//! | `mean(a)` | f32/f16/bf16 | f32, `[1, ne1, ne2, ne3]` |
//! | `argmax(a)` | f32 matrix `[ne0, ne1]` | i32 `[ne1]` |
//! | `count_equal(a, b)` | i32, same shape | i64 `[1]` |
//! | `cumsum(a)` | f32 | f32, `a`'s shape |
//! | `repeat(a, b)` / `repeat_to(a, ne)` | f32/f16/bf16/i32 | `a`'s type, `b`'s shape / `ne` |
//! | `repeat_back(a, b)` | f32/f16/bf16 | `a`'s type, `b`'s shape |
//! | `concat(a, b, dim)` | f32/f16/bf16/i32, same type | `a`'s type |
//!
//! Every input may be a strided view (transposed, permuted): the reference reads values in
//! logical order, so `sum` of a permuted tensor is the sum of its elements (ggml's CPU `sum`
//! walks rows through `nb[0]`-dense pointers and is only right for dense rows).

use crate::error::Result;
use crate::graph::{Graph, F32_ONLY, FLOATS, I32_ONLY};
use crate::op::Op;
use crate::reference::{Dense, NodeRef};
use crate::shape::{can_repeat, fmt_ne, ne_from, MAX_DIMS};
use crate::tensor::TensorId;
use crate::DType;

/// Types `repeat` and `concat` copy.
const COPYABLE: &[DType] = &[DType::F32, DType::F16, DType::BF16, DType::I32];

impl Graph {
    /// ggml's `ggml_sum`: the sum of all elements of `a`, as a one-element tensor of `a`'s type.
    pub fn sum(&mut self, a: TensorId) -> Result<TensorId> {
        self.check_types("sum", &[a], &[FLOATS])?;
        let dt = self.dtype(a);
        Ok(self.node(Op::Sum, dt, [1; 4], &[a]))
    }

    /// ggml's `ggml_sum_rows`: the sum of each row (along ne0), shape `[1, ne1, ne2, ne3]`.
    pub fn sum_rows(&mut self, a: TensorId) -> Result<TensorId> {
        self.check_types("sum_rows", &[a], &[FLOATS])?;
        let (dt, ne) = (self.dtype(a), self.ne(a));
        Ok(self.node(Op::SumRows, dt, [1, ne[1], ne[2], ne[3]], &[a]))
    }

    /// ggml's `ggml_mean`: the mean of each row (along ne0), f32 `[1, ne1, ne2, ne3]`.
    pub fn mean(&mut self, a: TensorId) -> Result<TensorId> {
        self.check_types("mean", &[a], &[FLOATS])?;
        let ne = self.ne(a);
        Ok(self.node(Op::Mean, DType::F32, [1, ne[1], ne[2], ne[3]], &[a]))
    }

    /// ggml's `ggml_argmax`: for each row of the f32 matrix `a`, the index of its largest value,
    /// as i32 `[ne1]`. Ties give the last such index (as ggml's CPU kernel does); NaNs are skipped (an all-NaN row gives 0).
    /// (ggml's CPU kernel returns the last of equal maxima, and restarts its running maximum
    /// after a NaN; on rows without ties or NaNs the results agree.)
    pub fn argmax(&mut self, a: TensorId) -> Result<TensorId> {
        const OP: &str = "argmax";
        self.check_types(OP, &[a], &[F32_ONLY])?;
        let ne = self.ne(a);
        if ne[2] != 1 || ne[3] != 1 {
            return Err(self.shape_err(OP, "a must be a matrix (ne2 = ne3 = 1)", &[a]));
        }
        if ne[0] > i32::MAX as usize {
            return Err(self.shape_err(
                OP,
                "rows longer than i32::MAX cannot be indexed by i32",
                &[a],
            ));
        }
        Ok(self.node(Op::Argmax, DType::I32, [ne[1], 1, 1, 1], &[a]))
    }

    /// ggml's `ggml_count_equal`: how many elements of the i32 tensors `a` and `b` (same shape)
    /// are equal, as an i64 scalar `[1]`.
    pub fn count_equal(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        const OP: &str = "count_equal";
        self.check_types(OP, &[a, b], &[I32_ONLY, I32_ONLY])?;
        let (ane, bne) = (self.ne(a), self.ne(b));
        if ane != bne {
            return Err(self.shape_err(
                OP,
                format!(
                    "a {} and b {} must have the same shape",
                    fmt_ne(&ane),
                    fmt_ne(&bne)
                ),
                &[a, b],
            ));
        }
        Ok(self.node(Op::CountEqual, DType::I64, [1; 4], &[a, b]))
    }

    /// ggml's `ggml_cumsum`: running sums along each row (ne0), f32, `a`'s shape.
    pub fn cumsum(&mut self, a: TensorId) -> Result<TensorId> {
        self.check_types("cumsum", &[a], &[F32_ONLY])?;
        let ne = self.ne(a);
        Ok(self.node(Op::Cumsum, DType::F32, ne, &[a]))
    }

    fn repeat_node(&mut self, a: TensorId, ne: [usize; 4], src: &[TensorId]) -> Result<TensorId> {
        const OP: &str = "repeat";
        let ane = self.ne(a);
        if !can_repeat(&ane, &ne) {
            return Err(self.shape_err(
                OP,
                format!(
                    "a {} cannot be tiled to {}: each target dim must be a multiple of a's",
                    fmt_ne(&ane),
                    fmt_ne(&ne)
                ),
                src,
            ));
        }
        let dt = self.dtype(a);
        Ok(self.node(Op::Repeat, dt, ne, &[a]))
    }

    /// ggml's `ggml_repeat`: `a` tiled to `b`'s shape (each dim of `b` a multiple of `a`'s).
    /// Only `b`'s shape is used; the result has `a`'s type and only `a` as its source.
    pub fn repeat(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.check_id("repeat", b)?;
        self.check_types("repeat", &[a], &[COPYABLE])?;
        let ne = self.ne(b);
        self.repeat_node(a, ne, &[a, b])
    }

    /// `a` tiled to the shape `ne` (1 to 4 dims, each a multiple of `a`'s), like ggml's
    /// `ggml_repeat_4d`.
    pub fn repeat_to(&mut self, a: TensorId, ne: &[usize]) -> Result<TensorId> {
        self.check_types("repeat", &[a], &[COPYABLE])?;
        if ne.is_empty() || ne.len() > MAX_DIMS {
            return Err(self.shape_err(
                "repeat",
                format!("{} dims given, 1 to 4 allowed", ne.len()),
                &[a],
            ));
        }
        self.repeat_node(a, ne_from(ne), &[a])
    }

    /// Like [`repeat_back`](Graph::repeat_back) with the target shape given as dims.
    pub fn repeat_back_to(&mut self, a: TensorId, ne: &[usize]) -> Result<TensorId> {
        const OP: &str = "repeat_back";
        self.check_types(OP, &[a], &[FLOATS])?;
        let (ane, bne) = (self.ne(a), crate::shape::ne_from(ne));
        if ne.is_empty() || ne.len() > 4 || !can_repeat(&bne, &ane) {
            return Err(self.shape_err(
                OP,
                format!("a {} is not a tiling of {}", fmt_ne(&ane), fmt_ne(&bne)),
                &[a],
            ));
        }
        let dt = self.dtype(a);
        Ok(self.node(Op::RepeatBack, dt, bne, &[a]))
    }

    /// ggml's `ggml_repeat_back`: the reverse of `repeat`: `a` summed over its tiles down to
    /// `b`'s shape (each dim of `a` a multiple of `b`'s). Result: `a`'s type, `b`'s shape.
    pub fn repeat_back(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        const OP: &str = "repeat_back";
        self.check_id(OP, b)?;
        self.check_types(OP, &[a], &[FLOATS])?;
        let (ane, bne) = (self.ne(a), self.ne(b));
        if !can_repeat(&bne, &ane) {
            return Err(self.shape_err(
                OP,
                format!(
                    "a {} is not a tiling of b {}: each dim of a must be a multiple of b's",
                    fmt_ne(&ane),
                    fmt_ne(&bne)
                ),
                &[a, b],
            ));
        }
        let dt = self.dtype(a);
        Ok(self.node(Op::RepeatBack, dt, bne, &[a]))
    }

    /// ggml's `ggml_concat`: `a` followed by `b` along `dim` (0..=3); the other dims and the
    /// types must be equal.
    pub fn concat(&mut self, a: TensorId, b: TensorId, dim: usize) -> Result<TensorId> {
        const OP: &str = "concat";
        self.check_types(OP, &[a, b], &[COPYABLE, COPYABLE])?;
        if dim >= MAX_DIMS {
            return Err(self.shape_err(OP, format!("dim {dim} is out of range 0..=3"), &[a, b]));
        }
        if self.dtype(a) != self.dtype(b) {
            return Err(self.shape_err(OP, "a and b must have the same type", &[a, b]));
        }
        let (ane, bne) = (self.ne(a), self.ne(b));
        let mut ne = ane;
        for d in 0..MAX_DIMS {
            if d == dim {
                ne[d] = ane[d] + bne[d];
            } else if ane[d] != bne[d] {
                return Err(self.shape_err(
                    OP,
                    format!(
                        "along dim {dim}, a {} and b {} differ in dim {d}",
                        fmt_ne(&ane),
                        fmt_ne(&bne)
                    ),
                    &[a, b],
                ));
            }
        }
        let dt = self.dtype(a);
        Ok(self.node(Op::Concat { dim }, dt, ne, &[a, b]))
    }
}

pub(crate) fn reference(n: &NodeRef, src: &[Dense]) -> Result<Dense> {
    let a = &src[0];
    let ne = n.t.ne;
    match n.t.op {
        Op::Sum => Ok(Dense::filled(ne, a.data.iter().sum())),
        Op::SumRows => Ok(Dense::from_fn(ne, |_, i1, i2, i3| {
            a.row(i1, i2, i3).iter().sum()
        })),
        Op::Mean => Ok(Dense::from_fn(ne, |_, i1, i2, i3| {
            a.row(i1, i2, i3).iter().sum::<f64>() / a.ne[0] as f64
        })),
        Op::Argmax => Ok(Dense::from_fn(ne, |i1, _, _, _| {
            let mut best: Option<(usize, f64)> = None;
            for (i, &x) in a.row(i1, 0, 0).iter().enumerate() {
                let better = match best {
                    Some((_, m)) => x >= m, // ties: the last index, as ggml's CPU kernel
                    None => true,
                };
                if !x.is_nan() && better {
                    best = Some((i, x));
                }
            }
            best.map_or(0, |(i, _)| i) as f64
        })),
        Op::CountEqual => {
            let b = &src[1];
            let count = a.data.iter().zip(&b.data).filter(|(x, y)| x == y).count();
            Ok(Dense::filled(ne, count as f64))
        }
        Op::Cumsum => {
            let mut out = a.clone();
            for i3 in 0..ne[3] {
                for i2 in 0..ne[2] {
                    for i1 in 0..ne[1] {
                        let mut acc = 0.0;
                        for v in out.row_mut(i1, i2, i3) {
                            acc += *v;
                            *v = acc;
                        }
                    }
                }
            }
            Ok(out)
        }
        Op::Repeat => Ok(Dense::from_fn(ne, |i0, i1, i2, i3| {
            a.at(i0 % a.ne[0], i1 % a.ne[1], i2 % a.ne[2], i3 % a.ne[3])
        })),
        Op::RepeatBack => {
            let mut out = Dense::zeros(ne);
            Dense::for_each_index(&a.ne, |i0, i1, i2, i3| {
                let k = out.idx(i0 % ne[0], i1 % ne[1], i2 % ne[2], i3 % ne[3]);
                out.data[k] += a.at(i0, i1, i2, i3);
            });
            Ok(out)
        }
        Op::Concat { dim } => {
            let b = &src[1];
            Ok(Dense::from_fn(ne, |i0, i1, i2, i3| {
                let mut i = [i0, i1, i2, i3];
                if i[dim] < a.ne[dim] {
                    a.at(i[0], i[1], i[2], i[3])
                } else {
                    i[dim] -= a.ne[dim];
                    b.at(i[0], i[1], i[2], i[3])
                }
            }))
        }
        _ => Err(n.err("not a reduction op")),
    }
}

impl Graph {
    /// Backward of the reductions and tilings: sums spread the gradient back with `repeat`,
    /// `repeat` sums it with `repeat_back`, `cumsum` takes the reversed cumulative sum, and
    /// `concat` hands each input its slice.
    pub(crate) fn backward_reduce(
        &mut self,
        bw: &crate::autodiff::Bw,
    ) -> Result<crate::autodiff::Grads> {
        let t = self.tensor(bw.node).clone();
        let a = t.src[0];
        let g = bw.grad;
        match t.op {
            Op::Sum | Op::SumRows => Ok(vec![Some(self.repeat(g, a)?)]),
            Op::Mean => {
                let n = self.ne(a)[0] as f32;
                let s = self.scale(g, 1.0 / n)?;
                Ok(vec![Some(self.repeat(s, a)?)])
            }
            Op::Cumsum => {
                // d/dx_i of sum_j g_j·cumsum_j = sum_{j >= i} g_j = total - cumsum_i + g_i
                let gc = self.contig(g)?;
                let total = self.sum_rows(gc)?;
                let tr = self.repeat(total, gc)?;
                let cs = self.cumsum(gc)?;
                let d = self.sub(tr, cs)?;
                Ok(vec![Some(self.add(d, gc)?)])
            }
            Op::Repeat => Ok(vec![Some(self.repeat_back(g, a)?), None]),
            Op::RepeatBack => Ok(vec![Some(self.repeat(g, a)?)]),
            Op::Concat { dim } => {
                let b = t.src[1];
                let gc = self.contig(g)?;
                let gt = self.tensor(gc).clone();
                let nb = [gt.nb[1], gt.nb[2], gt.nb[3]];
                let (ane, bne) = (self.ne(a), self.ne(b));
                let ga = if bw.wants(0) {
                    let v = self.view(gc, &ane, &nb, 0)?;
                    Some(self.cont(v)?)
                } else {
                    None
                };
                let gb = if bw.wants(1) {
                    let v = self.view(gc, &bne, &nb, ane[dim] * gt.nb[dim])?;
                    Some(self.cont(v)?)
                } else {
                    None
                };
                Ok(vec![ga, gb])
            }
            _ => Err(self.not_diff(bw.node, 0, "not a reduction")),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::testutil::*;
    use crate::*;

    #[test]
    fn sums_and_means_by_hand() {
        let mut g = Graph::new();
        let a = g.new_f32(&[3, 2]).unwrap();
        let s = g.sum(a).unwrap();
        let r = g.sum_rows(a).unwrap();
        let m = g.mean(a).unwrap();
        let c = g.cumsum(a).unwrap();
        assert_eq!(g.ne(s), [1, 1, 1, 1]);
        assert_eq!(g.ne(r), [1, 2, 1, 1]);
        let mut sess = Session::new(g, &[s, r, m, c]).unwrap();
        sess.set_f32(a, &[1., 2., 3., 10., 20., 40.]).unwrap();
        sess.compute(&ReferenceBackend).unwrap();
        assert_eq!(sess.get_f32(s).unwrap(), vec![76.]);
        assert_eq!(sess.get_f32(r).unwrap(), vec![6., 70.]);
        assert_eq!(sess.get_f32(m).unwrap(), vec![2., 70. / 3.]);
        assert_eq!(sess.get_f32(c).unwrap(), vec![1., 3., 6., 10., 30., 70.]);
    }

    #[test]
    fn reductions_of_permuted_and_f16_inputs() {
        let mut rng = Rng::new(3);
        for &(n0, n1, n2) in &[(1usize, 1usize, 1usize), (3, 17, 2), (17, 3, 1)] {
            let mut g = Graph::new();
            let a = g.new_f32(&[n0, n1, n2]).unwrap();
            // p[i0, i1, i2] = a[i1, i2, i0]: ne = [n2, n0, n1]
            let p = g.permute(a, [1, 2, 0, 3]).unwrap();
            assert_eq!(g.ne(p), [n2, n0, n1, 1]);
            let s = g.sum(p).unwrap();
            let r = g.sum_rows(p).unwrap();
            let m = g.mean(p).unwrap();
            let c = g.cumsum(p).unwrap();
            let av = rng.vec(n0 * n1 * n2, -2.0, 2.0);
            let mut sess = Session::new(g, &[s, r, m, c]).unwrap();
            sess.set_f32(a, &av).unwrap();
            sess.compute(&ReferenceBackend).unwrap();
            let at = |i0: usize, i1: usize, i2: usize| av[(i2 * n1 + i1) * n0 + i0] as f64;
            let total: f64 = av.iter().map(|&v| v as f64).sum();
            assert_close(&sess.get_f32(s).unwrap(), &[total], 1e-6);
            // rows of p: fixed (p1 = i0 of a, p2 = i1 of a), running over p0 = i2 of a
            let (mut rows, mut means, mut cums) = (vec![], vec![], vec![]);
            for i1 in 0..n1 {
                for i0 in 0..n0 {
                    let mut acc = 0.0;
                    for i2 in 0..n2 {
                        acc += at(i0, i1, i2);
                        cums.push(acc);
                    }
                    rows.push(acc);
                    means.push(acc / n2 as f64);
                }
            }
            assert_close(&sess.get_f32(r).unwrap(), &rows, 1e-6);
            assert_close(&sess.get_f32(m).unwrap(), &means, 1e-6);
            assert_close(&sess.get_f32(c).unwrap(), &cums, 1e-6);
        }
        // f16: sum and sum_rows keep the type, mean is f32
        let mut g = Graph::new();
        let h = g.new_tensor(DType::F16, &[4, 2]).unwrap();
        let s = g.sum(h).unwrap();
        let r = g.sum_rows(h).unwrap();
        let m = g.mean(h).unwrap();
        assert_eq!(
            (g.dtype(s), g.dtype(r), g.dtype(m)),
            (DType::F16, DType::F16, DType::F32)
        );
        let mut sess = Session::new(g, &[s, r, m]).unwrap();
        sess.set_f32(h, &[0.5, 1.5, 2.0, 4.0, -1.0, -3.0, 0.25, 0.75])
            .unwrap();
        sess.compute(&ReferenceBackend).unwrap();
        assert_eq!(sess.get_f32(s).unwrap(), vec![5.0]);
        assert_eq!(sess.get_f32(r).unwrap(), vec![8.0, -3.0]);
        assert_eq!(sess.get_f32(m).unwrap(), vec![2.0, -0.75]);
    }

    #[test]
    fn argmax_last_max_nan_skipped_and_count_equal() {
        let mut g = Graph::new();
        let a = g.new_f32(&[4, 4]).unwrap();
        let am = g.argmax(a).unwrap();
        assert_eq!((g.dtype(am), g.ne(am)), (DType::I32, [4, 1, 1, 1]));
        let b = g.new_tensor(DType::I32, &[4]).unwrap();
        let ce = g.count_equal(am, b).unwrap();
        assert_eq!((g.dtype(ce), g.ne(ce)), (DType::I64, [1, 1, 1, 1]));
        let mut s = Session::new(g, &[am, ce]).unwrap();
        #[rustfmt::skip]
        s.set_f32(a, &[
            1.0, 5.0, 5.0, -2.0,               // tie: the last index, like ggml
            -3.0, -1.0, -2.0, -7.0,            // all negative
            f32::NAN, 2.0, f32::NAN, 1.0,      // NaNs skipped
            f32::NAN, f32::NAN, f32::NAN, f32::NAN,
        ]).unwrap();
        s.set_i32(b, &[1, 0, 1, 3]).unwrap();
        s.compute(&ReferenceBackend).unwrap();
        assert_eq!(s.get_f32(am).unwrap(), vec![2.0, 1.0, 1.0, 0.0]);
        assert_eq!(s.get_f32(ce).unwrap(), vec![1.0]);
        assert_eq!(s.get_bytes(ce).unwrap(), 1i64.to_le_bytes().to_vec());
    }

    #[test]
    fn argmax_of_transposed_matrix() {
        let mut g = Graph::new();
        let a = g.new_f32(&[3, 17]).unwrap();
        let t = g.transpose(a).unwrap(); // rows of t are columns of a
        let am = g.argmax(t).unwrap();
        let mut rng = Rng::new(11);
        let av = rng.vec(51, -1.0, 1.0);
        let got = run1(g, &[(a, av.clone())], am);
        let want: Vec<f64> = (0..3)
            .map(|c| {
                (0..17).fold(0, |best, r| {
                    if av[r * 3 + c] > av[best * 3 + c] {
                        r
                    } else {
                        best
                    }
                }) as f64
            })
            .collect();
        assert_close(&got, &want, 0.0);
    }

    #[test]
    fn repeat_and_repeat_back_by_formula() {
        let mut rng = Rng::new(5);
        for &(src, dst) in &[
            ([1usize, 1, 1, 1], [3usize, 1, 1, 1]),
            ([8, 1, 3, 1], [8, 4, 3, 2]),
            ([3, 2, 1, 1], [6, 4, 17, 1]),
        ] {
            let mut g = Graph::new();
            let a = g.new_f32(&src).unwrap();
            let shape = g.new_f32(&dst).unwrap();
            let r = g.repeat(a, shape).unwrap();
            let r2 = g.repeat_to(a, &dst).unwrap();
            assert_eq!(g.tensor(r).src, vec![a]);
            let big = g.new_f32(&dst).unwrap();
            let back = g.repeat_back(big, a).unwrap();
            assert_eq!(g.ne(back), src);
            let av = rng.vec(src.iter().product(), -1.0, 1.0);
            let bv = rng.vec(dst.iter().product(), -1.0, 1.0);
            let mut s = Session::new(g, &[r, r2, back]).unwrap();
            s.set_f32(a, &av).unwrap();
            s.set_f32(big, &bv).unwrap();
            s.compute(&ReferenceBackend).unwrap();
            let mut want = vec![];
            let mut want_back = vec![0.0f64; av.len()];
            let mut k = 0;
            Dense::for_each_index(&dst, |i0, i1, i2, i3| {
                let j = ((i3 % src[3] * src[2] + i2 % src[2]) * src[1] + i1 % src[1]) * src[0]
                    + i0 % src[0];
                want.push(av[j] as f64);
                want_back[j] += bv[k] as f64;
                k += 1;
            });
            assert_close(&s.get_f32(r).unwrap(), &want, 0.0);
            assert_close(&s.get_f32(r2).unwrap(), &want, 0.0);
            assert_close(&s.get_f32(back).unwrap(), &want_back, 1e-6);
        }
    }

    #[test]
    fn repeat_of_transposed_i32_and_f16() {
        let mut g = Graph::new();
        let a = g.new_tensor(DType::I32, &[2, 3]).unwrap();
        let t = g.transpose(a).unwrap(); // [3, 2]: t[i0, i1] = a[i1, i0]
        let r = g.repeat_to(t, &[3, 4]).unwrap();
        assert_eq!(g.dtype(r), DType::I32);
        let out = run1(g, &[(a, vec![1., 2., 3., 4., 5., 6.])], r);
        assert_eq!(out, vec![1., 3., 5., 2., 4., 6., 1., 3., 5., 2., 4., 6.]);

        let mut g = Graph::new();
        let h = g.new_tensor(DType::F16, &[2]).unwrap();
        let r = g.repeat_to(h, &[4, 2]).unwrap();
        assert_eq!(g.dtype(r), DType::F16);
        let out = run1(g, &[(h, vec![0.5, -1.25])], r);
        assert_eq!(out, vec![0.5, -1.25, 0.5, -1.25, 0.5, -1.25, 0.5, -1.25]);
    }

    #[test]
    fn concat_every_dim_with_views() {
        let mut rng = Rng::new(9);
        let base = [3usize, 2, 2, 2];
        for dim in 0..4 {
            let mut bne = base;
            bne[dim] = if dim == 1 { 17 } else { 1 };
            let mut g = Graph::new();
            // a is given as a transposed view of a leaf
            let aleaf = g.new_f32(&[base[1], base[0], base[2], base[3]]).unwrap();
            let a = g.transpose(aleaf).unwrap();
            let b = g.new_f32(&bne).unwrap();
            let c = g.concat(a, b, dim).unwrap();
            let mut cne = base;
            cne[dim] += bne[dim];
            assert_eq!(g.ne(c), cne);
            let av = rng.vec(base.iter().product(), -1.0, 1.0);
            let bv = rng.vec(bne.iter().product(), -1.0, 1.0);
            let got = run1(g, &[(aleaf, av.clone()), (b, bv.clone())], c);
            let mut want = vec![];
            Dense::for_each_index(&cne, |i0, i1, i2, i3| {
                let mut i = [i0, i1, i2, i3];
                if i[dim] < base[dim] {
                    // a[i0, i1, i2, i3] = aleaf[i1, i0, i2, i3]
                    want.push(
                        av[((i[3] * base[2] + i[2]) * base[0] + i[0]) * base[1] + i[1]] as f64,
                    );
                } else {
                    i[dim] -= base[dim];
                    want.push(bv[((i[3] * bne[2] + i[2]) * bne[1] + i[1]) * bne[0] + i[0]] as f64);
                }
            });
            assert_close(&got, &want, 0.0);
        }
        // by hand, f16 along dim 0
        let mut g = Graph::new();
        let a = g.new_tensor(DType::F16, &[2, 2]).unwrap();
        let b = g.new_tensor(DType::F16, &[1, 2]).unwrap();
        let c = g.concat(a, b, 0).unwrap();
        let mut s = Session::new(g, &[c]).unwrap();
        s.set_f32(a, &[1., 2., 3., 4.]).unwrap();
        s.set_f32(b, &[9., 8.]).unwrap();
        s.compute(&ReferenceBackend).unwrap();
        assert_eq!(s.get_f32(c).unwrap(), vec![1., 2., 9., 3., 4., 8.]);
    }

    #[test]
    fn bad_inputs_are_errors_naming_op_and_shapes() {
        let mut g = Graph::new();
        let a = g.new_f32(&[4, 3]).unwrap();
        let b = g.new_f32(&[5, 2]).unwrap();
        let e = g.concat(a, b, 0).unwrap_err().to_string();
        assert!(
            e.starts_with("concat:")
                && e.contains("differ in dim 1")
                && e.contains("f32 [5, 2, 1, 1]"),
            "{e}"
        );
        let e = g.concat(a, a, 4).unwrap_err().to_string();
        assert!(e.contains("dim 4"), "{e}");
        let h = g.new_tensor(DType::F16, &[4, 3]).unwrap();
        let e = g.concat(a, h, 1).unwrap_err().to_string();
        assert!(
            e.contains("same type") && e.contains("f16 [4, 3, 1, 1]"),
            "{e}"
        );
        let e = g.repeat_to(a, &[6, 3]).unwrap_err().to_string();
        assert!(
            e.starts_with("repeat:") && e.contains("[4, 3, 1, 1]") && e.contains("[6, 3, 1, 1]"),
            "{e}"
        );
        let e = g.repeat(a, b).unwrap_err().to_string();
        assert!(
            e.starts_with("repeat:") && e.contains("f32 [5, 2, 1, 1]"),
            "{e}"
        );
        let e = g.repeat_back(b, a).unwrap_err().to_string();
        assert!(
            e.starts_with("repeat_back:") && e.contains("[5, 2, 1, 1]"),
            "{e}"
        );
        let c3 = g.new_f32(&[4, 3, 2]).unwrap();
        let e = g.argmax(c3).unwrap_err().to_string();
        assert!(
            e.starts_with("argmax:") && e.contains("matrix") && e.contains("[4, 3, 2, 1]"),
            "{e}"
        );
        let i = g.new_tensor(DType::I32, &[4]).unwrap();
        let j = g.new_tensor(DType::I32, &[5]).unwrap();
        let e = g.count_equal(i, j).unwrap_err().to_string();
        assert!(
            e.starts_with("count_equal:") && e.contains("same shape"),
            "{e}"
        );
        let e = g.count_equal(a, a).unwrap_err().to_string();
        assert!(e.contains("type f32"), "{e}");
        let e = g.cumsum(h).unwrap_err().to_string();
        assert!(e.starts_with("cumsum:") && e.contains("type f16"), "{e}");
        let e = g.sum(i).unwrap_err().to_string();
        assert!(e.starts_with("sum:") && e.contains("type i32"), "{e}");
    }
}
