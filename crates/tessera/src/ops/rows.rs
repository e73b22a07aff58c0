//! get_rows (gather rows by i32 index, from any type including quantized) and set_rows (scatter
//! rows into a destination, converting to its type).
//!
//! Indices are data, so they are checked when the graph runs: an index outside the source (or
//! destination) rows is a compute error naming the index and where it was found.

use crate::error::Result;
use crate::graph::Graph;
use crate::op::Op;
use crate::reference::{Dense, NodeRef};
use crate::shape::{fmt_ne, rows_contiguous};
use crate::tensor::TensorId;
use crate::DType;

impl Graph {
    /// ggml's `get_rows(a, idx)`: `a` [ne0, nrows, ne2, ne3] of any type (quantized rows are
    /// dequantized), `idx` i32 [n, ne2, ne3]; the result [ne0, n, ne2, ne3] holds
    /// `a[:, idx[i, i2, i3], i2, i3]` at row `(i, i2, i3)`. The result is f32, or i32 when `a` is.
    pub fn get_rows(&mut self, a: TensorId, idx: TensorId) -> Result<TensorId> {
        const OP: &str = "get_rows";
        self.check_id(OP, a)?;
        self.check_id(OP, idx)?;
        if self.dtype(idx) != DType::I32 {
            return Err(self.shape_err(
                OP,
                format!("indices must be i32, got {}", self.dtype(idx)),
                &[a, idx],
            ));
        }
        let (ane, ine) = (self.ne(a), self.ne(idx));
        if ane[2] != ine[1] || ane[3] != ine[2] || ine[3] != 1 {
            return Err(self.shape_err(
                OP,
                format!(
                    "indices {} must be [n, {}, {}, 1] for a {} (idx.ne[1] = a.ne[2], idx.ne[2] = a.ne[3])",
                    fmt_ne(&ine),
                    ane[2],
                    ane[3],
                    fmt_ne(&ane)
                ),
                &[a, idx],
            ));
        }
        let dt = if self.dtype(a) == DType::I32 {
            DType::I32
        } else {
            DType::F32
        };
        Ok(self.node(Op::GetRows, dt, [ane[0], ine[0], ine[1], ine[2]], &[a, idx]))
    }

    /// ggml's `set_rows(a, b, idx)`: writes row `(i, i2, i3)` of `b` (f32 or f16) into row
    /// `idx[i, i2 % idx.ne[1], i3 % idx.ne[2]]` of `a` (any type `a` can be written in),
    /// converting it to `a`'s type. `idx` is i64 or i32 [n, …] with `n = b.ne[1]`. Returns a
    /// tensor that aliases `a`'s memory; compute it to perform the writes.
    pub fn set_rows(&mut self, a: TensorId, b: TensorId, idx: TensorId) -> Result<TensorId> {
        const OP: &str = "set_rows";
        for id in [a, b, idx] {
            self.check_id(OP, id)?;
        }
        let (at, bt, it) = (
            self.tensor(a).clone(),
            self.tensor(b).clone(),
            self.tensor(idx).clone(),
        );
        if !matches!(bt.dtype, DType::F32 | DType::F16) {
            return Err(self.shape_err(
                OP,
                format!("b must be f32 or f16, got {}", bt.dtype),
                &[a, b, idx],
            ));
        }
        if !matches!(it.dtype, DType::I64 | DType::I32) {
            return Err(self.shape_err(
                OP,
                format!("indices must be i64 or i32, got {}", it.dtype),
                &[a, b, idx],
            ));
        }
        let (ane, bne, ine) = (at.ne, bt.ne, it.ne);
        if ane[0] != bne[0] || ane[2] != bne[2] || ane[3] != bne[3] {
            return Err(self.shape_err(
                OP,
                format!(
                    "b {} must match a {} in dims 0, 2 and 3",
                    fmt_ne(&bne),
                    fmt_ne(&ane)
                ),
                &[a, b, idx],
            ));
        }
        if ine[0] != bne[1] || ine[3] != 1 || bne[2] % ine[1] != 0 || bne[3] % ine[2] != 0 {
            return Err(self.shape_err(
                OP,
                format!(
                    "indices {} must be [{}, d1, d2, 1] with d1 dividing {} and d2 dividing {} (b {})",
                    fmt_ne(&ine),
                    bne[1],
                    bne[2],
                    bne[3],
                    fmt_ne(&bne)
                ),
                &[a, b, idx],
            ));
        }
        if !rows_contiguous(at.dtype, &at.ne, &at.nb) || !rows_contiguous(bt.dtype, &bt.ne, &bt.nb)
        {
            return Err(self.shape_err(OP, "rows of a and b must be contiguous", &[a, b, idx]));
        }
        Ok(self.aliasing_node(Op::SetRows, at.dtype, at.ne, at.nb, &[a, b, idx], a, 0))
    }
}

/// The row index stored at `v`, checked against `nrows`.
fn row_index(
    n: &NodeRef,
    v: f64,
    nrows: usize,
    at: (usize, usize, usize),
    what: &str,
) -> Result<usize> {
    if v < 0.0 || v >= nrows as f64 || v.fract() != 0.0 {
        return Err(n.err(format!(
            "index {v} at position [{}, {}, {}] of the indices is out of range: {what} has {nrows} rows",
            at.0, at.1, at.2
        )));
    }
    Ok(v as usize)
}

impl Graph {
    /// ggml's `get_rows_back`: the gradient of `get_rows(a, idx)` w.r.t. `a`: row `(i, i2, i3)`
    /// of `grad` added into row `idx[i, i2, i3]` of an f32 tensor of `a`'s shape `a_ne`, for any
    /// number of rows.
    pub fn get_rows_back(
        &mut self,
        grad: TensorId,
        idx: TensorId,
        a_ne: [usize; 4],
    ) -> Result<TensorId> {
        const OP: &str = "get_rows_back";
        self.check_types(OP, &[grad, idx], &[&[DType::F32], &[DType::I32]])?;
        let (gne, ine) = (self.ne(grad), self.ne(idx));
        if gne[0] != a_ne[0]
            || gne[1] != ine[0]
            || gne[2] != a_ne[2]
            || gne[3] != a_ne[3]
            || ine[1] != a_ne[2]
            || ine[2] != a_ne[3]
        {
            return Err(self.shape_err(
                OP,
                format!(
                    "grad must be [{}, n, {}, {}] with idx [n, {}, {}]",
                    a_ne[0], a_ne[2], a_ne[3], a_ne[2], a_ne[3]
                ),
                &[grad, idx],
            ));
        }
        Ok(self.node(Op::GetRowsBack, DType::F32, a_ne, &[grad, idx]))
    }
}

pub(crate) fn reference(n: &NodeRef, src: &[Dense]) -> Result<Dense> {
    match n.t.op {
        Op::GetRowsBack => {
            let (g, idx) = (&src[0], &src[1]);
            let mut out = Dense::zeros(n.t.ne);
            for i3 in 0..g.ne[3] {
                for i2 in 0..g.ne[2] {
                    for i1 in 0..g.ne[1] {
                        let r = row_index(
                            n,
                            idx.at(i1, i2, i3, 0),
                            n.t.ne[1],
                            (i1, i2, i3),
                            "the gradient",
                        )?;
                        let gr = g.row(i1, i2, i3).to_vec();
                        for (o, v) in out.row_mut(r, i2, i3).iter_mut().zip(gr) {
                            *o += v;
                        }
                    }
                }
            }
            Ok(out)
        }
        Op::GetRows => {
            let (a, idx) = (&src[0], &src[1]);
            let ne = n.t.ne;
            let mut out = Dense::zeros(ne);
            for i3 in 0..ne[3] {
                for i2 in 0..ne[2] {
                    for i1 in 0..ne[1] {
                        let r = row_index(
                            n,
                            idx.at(i1, i2, i3, 0),
                            a.ne[1],
                            (i1, i2, i3),
                            "the source",
                        )?;
                        out.row_mut(i1, i2, i3).copy_from_slice(a.row(r, i2, i3));
                    }
                }
            }
            Ok(out)
        }
        Op::SetRows => {
            let (a, b, idx) = (&src[0], &src[1], &src[2]);
            let mut out = a.clone();
            for i3 in 0..b.ne[3] {
                for i2 in 0..b.ne[2] {
                    for i in 0..b.ne[1] {
                        let (j2, j3) = (i2 % idx.ne[1], i3 % idx.ne[2]);
                        let r = row_index(
                            n,
                            idx.at(i, j2, j3, 0),
                            a.ne[1],
                            (i, j2, j3),
                            "the destination",
                        )?;
                        out.row_mut(r, i2, i3).copy_from_slice(b.row(i, i2, i3));
                    }
                }
            }
            Ok(out)
        }
        _ => Err(n.err("not a rows op")),
    }
}

impl Graph {
    /// Backward of get_rows: gradient rows scatter-added into the source's shape, for any
    /// number of rows. The indices are data.
    pub(crate) fn backward_rows(
        &mut self,
        bw: &crate::autodiff::Bw,
    ) -> Result<crate::autodiff::Grads> {
        let t = self.tensor(bw.node).clone();
        if bw.wants(1) {
            return Err(self.not_diff(bw.node, 1, "indices are not differentiated"));
        }
        let gc = self.contig(bw.grad)?;
        let ne = self.ne(t.src[0]);
        Ok(vec![Some(self.get_rows_back(gc, t.src[1], ne)?), None])
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::testutil::*;
    use crate::*;

    #[test]
    fn get_rows_by_hand() {
        let mut g = Graph::new();
        let a = g.new_f32(&[3, 4]).unwrap();
        let i = g.new_tensor(DType::I32, &[5]).unwrap();
        let r = g.get_rows(a, i).unwrap();
        assert_eq!(g.ne(r), [3, 5, 1, 1]);
        assert_eq!(g.dtype(r), DType::F32);
        let mut s = Session::new(g, &[r]).unwrap();
        s.set_f32(a, &(0..12).map(|x| x as f32).collect::<Vec<_>>())
            .unwrap();
        s.set_i32(i, &[3, 0, 3, 1, 2]).unwrap();
        s.compute(&ReferenceBackend).unwrap();
        assert_eq!(
            s.get_f32(r).unwrap(),
            vec![9., 10., 11., 0., 1., 2., 9., 10., 11., 3., 4., 5., 6., 7., 8.]
        );
    }

    #[test]
    fn get_rows_batched_f16_and_i32_sources() {
        // a [4, 5, 3, 2] f16, idx [2, 3, 2]: row (i, i2, i3) takes a[:, idx[i, i2, i3], i2, i3]
        let mut rng = Rng::new(7);
        let mut g = Graph::new();
        let a = g.new_tensor(DType::F16, &[4, 5, 3, 2]).unwrap();
        let i = g.new_tensor(DType::I32, &[2, 3, 2]).unwrap();
        let r = g.get_rows(a, i).unwrap();
        assert_eq!(g.ne(r), [4, 2, 3, 2]);
        let ai = g.new_tensor(DType::I32, &[2, 3]).unwrap();
        let j = g.new_tensor(DType::I32, &[2]).unwrap();
        let ri = g.get_rows(ai, j).unwrap();
        assert_eq!(g.dtype(ri), DType::I32);
        // exactly representable in f16
        let av: Vec<f32> = (0..120).map(|x| x as f32 * 0.5 - 7.0).collect();
        let iv: Vec<i32> = (0..12).map(|_| rng.below(5) as i32).collect();
        let mut s = Session::new(g, &[r, ri]).unwrap();
        s.set_f32(a, &av).unwrap();
        s.set_i32(i, &iv).unwrap();
        s.set_i32(ai, &[1, -2, 300000, 4, 5, -6]).unwrap();
        s.set_i32(j, &[2, 0]).unwrap();
        s.compute(&ReferenceBackend).unwrap();
        let mut want = vec![];
        for i3 in 0..2 {
            for i2 in 0..3 {
                for k in 0..2 {
                    let row = iv[(i3 * 3 + i2) * 2 + k] as usize;
                    for i0 in 0..4 {
                        want.push(av[((i3 * 3 + i2) * 5 + row) * 4 + i0] as f64);
                    }
                }
            }
        }
        assert_close(&s.get_f32(r).unwrap(), &want, 0.0);
        assert_eq!(s.get_f64(ri).unwrap(), vec![5., -6., 1., -2.]);
    }

    #[test]
    fn get_rows_from_a_non_contiguous_view() {
        // rows of the transpose of a [3, 4] matrix are its columns
        let mut g = Graph::new();
        let a = g.new_f32(&[3, 4]).unwrap();
        let t = g.transpose(a).unwrap(); // [4, 3]
        let i = g.new_tensor(DType::I32, &[2]).unwrap();
        let r = g.get_rows(t, i).unwrap();
        let mut s = Session::new(g, &[r]).unwrap();
        s.set_f32(a, &(0..12).map(|x| x as f32).collect::<Vec<_>>())
            .unwrap();
        s.set_i32(i, &[2, 0]).unwrap();
        s.compute(&ReferenceBackend).unwrap();
        assert_eq!(s.get_f32(r).unwrap(), vec![2., 5., 8., 11., 0., 3., 6., 9.]);
    }

    #[test]
    fn get_rows_out_of_range_index_is_a_compute_error() {
        for bad in [4, -1] {
            let mut g = Graph::new();
            let a = g.new_f32(&[3, 4]).unwrap();
            let i = g.new_tensor(DType::I32, &[3]).unwrap();
            let r = g.get_rows(a, i).unwrap();
            let mut s = Session::new(g, &[r]).unwrap();
            s.set_f32(a, &[0.0; 12]).unwrap();
            s.set_i32(i, &[0, bad, 1]).unwrap();
            let e = s.compute(&ReferenceBackend).unwrap_err().to_string();
            assert!(e.starts_with("get_rows"), "{e}");
            assert!(
                e.contains(&format!("index {bad} ")) && e.contains("4 rows"),
                "{e}"
            );
        }
    }

    #[test]
    fn get_rows_shape_and_type_errors() {
        let mut g = Graph::new();
        let a = g.new_f32(&[3, 4, 2]).unwrap();
        let i = g.new_tensor(DType::I32, &[5, 3]).unwrap();
        let e = g.get_rows(a, i).unwrap_err().to_string();
        assert!(
            e.starts_with("get_rows:") && e.contains("[5, 3, 1, 1]") && e.contains("[3, 4, 2, 1]"),
            "{e}"
        );
        let f = g.new_f32(&[5, 2]).unwrap();
        let e = g.get_rows(a, f).unwrap_err().to_string();
        assert!(e.starts_with("get_rows:") && e.contains("i32"), "{e}");
    }

    #[test]
    fn set_rows_writes_into_the_destination() {
        for (dt, it) in [(DType::F32, DType::I64), (DType::F16, DType::I32)] {
            let mut g = Graph::new();
            let a = g.new_tensor(dt, &[3, 4]).unwrap();
            let b = g.new_f32(&[3, 2]).unwrap();
            let i = g.new_tensor(it, &[2]).unwrap();
            let w = g.set_rows(a, b, i).unwrap();
            assert_eq!(g.storage_root(w), (a, 0));
            let mut s = Session::new(g, &[w, a]).unwrap();
            s.set_f32(a, &[-1.0; 12]).unwrap();
            s.set_f32(b, &[1., 2., 3., 4., 5., 6.]).unwrap();
            s.set_f32(i, &[3., 1.]).unwrap();
            s.compute(&ReferenceBackend).unwrap();
            let want = vec![-1., -1., -1., 4., 5., 6., -1., -1., -1., 1., 2., 3.];
            assert_eq!(s.get_f32(a).unwrap(), want);
            assert_eq!(s.get_f32(w).unwrap(), want);
        }
    }

    #[test]
    fn set_rows_broadcasts_indices_and_rounds_to_the_destination_type() {
        // a [2, 3, 4] f16, b [2, 1, 4] with values not representable in f16, idx [1, 2]:
        // plane i2 takes its index from idx[0, i2 % 2]
        let mut g = Graph::new();
        let a = g.new_tensor(DType::F16, &[2, 3, 4]).unwrap();
        let b = g.new_f32(&[2, 1, 4]).unwrap();
        let i = g.new_tensor(DType::I32, &[1, 2]).unwrap();
        let w = g.set_rows(a, b, i).unwrap();
        let mut s = Session::new(g, &[w]).unwrap();
        let bv = [0.1f32, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8];
        s.set_f32(a, &[0.0; 24]).unwrap();
        s.set_f32(b, &bv).unwrap();
        s.set_i32(i, &[2, 0]).unwrap();
        s.compute(&ReferenceBackend).unwrap();
        let mut want = vec![0.0f64; 24];
        for i2 in 0..4 {
            let row = [2, 0][i2 % 2];
            for i0 in 0..2 {
                want[(i2 * 3 + row) * 2 + i0] = half::f16::from_f32(bv[i2 * 2 + i0]).to_f64();
            }
        }
        assert_close(&s.get_f32(w).unwrap(), &want, 0.0);
    }

    #[test]
    fn set_rows_errors() {
        let mut g = Graph::new();
        let a = g.new_f32(&[3, 4]).unwrap();
        let b = g.new_f32(&[3, 2]).unwrap();
        let i = g.new_tensor(DType::I32, &[3]).unwrap();
        let e = g.set_rows(a, b, i).unwrap_err().to_string();
        assert!(
            e.starts_with("set_rows:")
                && e.contains("[3, 1, 1, 1]")
                && e.contains("f32 [3, 2, 1, 1]"),
            "{e}"
        );
        let b4 = g.new_f32(&[4, 2]).unwrap();
        let i2 = g.new_tensor(DType::I32, &[2]).unwrap();
        let e = g.set_rows(a, b4, i2).unwrap_err().to_string();
        assert!(e.contains("dims 0, 2 and 3"), "{e}");
        let fi = g.new_f32(&[2]).unwrap();
        assert!(g
            .set_rows(a, b, fi)
            .unwrap_err()
            .to_string()
            .contains("i64 or i32"));

        let w = g.set_rows(a, b, i2).unwrap();
        let mut s = Session::new(g, &[w]).unwrap();
        s.set_f32(a, &[0.0; 12]).unwrap();
        s.set_f32(b, &[0.0; 6]).unwrap();
        s.set_i32(i2, &[0, 7]).unwrap();
        let e = s.compute(&ReferenceBackend).unwrap_err().to_string();
        assert!(
            e.starts_with("set_rows") && e.contains("index 7 ") && e.contains("4 rows"),
            "{e}"
        );
    }
}
