//! Sorting: `argsort` (each row's indices ordered by value, ascending or descending) and `top_k`
//! (the indices of each row's k largest values). Inputs are f32 (as in ggml's kernels), results
//! i32.
//!
//! Order is total and deterministic: the sort is stable (equal values keep their index order,
//! where ggml's `std::sort` leaves ties in an unspecified order) and NaNs go last in both orders,
//! in index order (ggml's comparator gives no defined place to NaN). On rows without ties or
//! NaNs the results are ggml's.

use std::cmp::Ordering;

use crate::error::Result;
use crate::graph::{Graph, F32_ONLY};
use crate::op::Op;
use crate::reference::{Dense, NodeRef};
use crate::tensor::TensorId;
use crate::DType;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SortOrder {
    Asc,
    Desc,
}

impl SortOrder {
    /// ggml's name (`asc`, `desc`).
    pub fn name(self) -> &'static str {
        match self {
            SortOrder::Asc => "asc",
            SortOrder::Desc => "desc",
        }
    }

    pub fn from_name(name: &str) -> Option<SortOrder> {
        match name {
            "asc" => Some(SortOrder::Asc),
            "desc" => Some(SortOrder::Desc),
            _ => None,
        }
    }
}

impl Graph {
    fn check_sortable(&self, op: &'static str, a: TensorId) -> Result<()> {
        self.check_types(op, &[a], &[F32_ONLY])?;
        if self.ne(a)[0] > i32::MAX as usize {
            return Err(self.shape_err(
                op,
                "rows longer than i32::MAX cannot be indexed by i32",
                &[a],
            ));
        }
        Ok(())
    }

    /// ggml's `ggml_argsort`: for each row of `a`, the indices 0..ne0 ordered by their values
    /// (stable; NaNs last), as i32 of `a`'s shape.
    pub fn argsort(&mut self, a: TensorId, order: SortOrder) -> Result<TensorId> {
        self.check_sortable("argsort", a)?;
        let ne = self.ne(a);
        Ok(self.node(Op::Argsort { order }, DType::I32, ne, &[a]))
    }

    /// ggml's `ggml_top_k`: for each row of `a`, the indices of its `k` largest values, i32
    /// `[k, ne1, ne2, ne3]`, `1 <= k <= ne0`. ggml leaves their order unspecified (its CPU kernel
    /// even swaps the first two to make the point); ours are in descending order of value, ties
    /// by lower index, NaNs last — i.e. the first `k` columns of `argsort(a, Desc)` (ggml's
    /// `ggml_argsort_top_k`). Compare with ggml as sets.
    pub fn top_k(&mut self, a: TensorId, k: usize) -> Result<TensorId> {
        const OP: &str = "top_k";
        self.check_sortable(OP, a)?;
        let ne = self.ne(a);
        if k == 0 || k > ne[0] {
            return Err(self.shape_err(
                OP,
                format!("k = {k} must be in 1..={} (the row length)", ne[0]),
                &[a],
            ));
        }
        Ok(self.node(Op::TopK { k }, DType::I32, [k, ne[1], ne[2], ne[3]], &[a]))
    }
}

/// Compares two values for `order`, NaN after every number.
fn cmp_values(x: f64, y: f64, order: SortOrder) -> Ordering {
    match (x.is_nan(), y.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => {
            let o = x.partial_cmp(&y).unwrap_or(Ordering::Equal);
            match order {
                SortOrder::Asc => o,
                SortOrder::Desc => o.reverse(),
            }
        }
    }
}

/// The indices of `row` stably sorted by value.
fn sorted_indices(row: &[f64], order: SortOrder) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..row.len()).collect();
    idx.sort_by(|&i, &j| cmp_values(row[i], row[j], order));
    idx
}

pub(crate) fn reference(n: &NodeRef, src: &[Dense]) -> Result<Dense> {
    let a = &src[0];
    let (order, keep) = match n.t.op {
        Op::Argsort { order } => (order, a.ne[0]),
        Op::TopK { k } => (SortOrder::Desc, k),
        _ => return Err(n.err("not a sort op")),
    };
    let ne = n.t.ne;
    let mut out = Dense::zeros(ne);
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                let idx = sorted_indices(a.row(i1, i2, i3), order);
                for (o, &i) in out.row_mut(i1, i2, i3).iter_mut().zip(&idx[..keep]) {
                    *o = i as f64;
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;
    use crate::*;

    fn as_idx(v: Vec<f32>) -> Vec<usize> {
        v.into_iter().map(|x| x as usize).collect()
    }

    #[test]
    fn argsort_and_top_k_by_hand_with_ties_and_nan() {
        let mut g = Graph::new();
        let a = g.new_f32(&[6, 2]).unwrap();
        let asc = g.argsort(a, SortOrder::Asc).unwrap();
        let desc = g.argsort(a, SortOrder::Desc).unwrap();
        let top = g.top_k(a, 3).unwrap();
        assert_eq!((g.dtype(top), g.ne(top)), (DType::I32, [3, 2, 1, 1]));
        let mut s = Session::new(g, &[asc, desc, top]).unwrap();
        #[rustfmt::skip]
        s.set_f32(a, &[
            3.0, 1.0, 2.0, 1.0, -5.0, 3.0,
            f32::NAN, 0.5, -0.0, f32::NAN, 0.0, 7.0,
        ]).unwrap();
        s.compute(&ReferenceBackend).unwrap();
        // ties keep index order; NaNs last in both orders; -0.0 == 0.0
        assert_eq!(
            as_idx(s.get_f32(asc).unwrap()),
            vec![4, 1, 3, 2, 0, 5, 2, 4, 1, 5, 0, 3]
        );
        assert_eq!(
            as_idx(s.get_f32(desc).unwrap()),
            vec![0, 5, 2, 1, 3, 4, 5, 1, 2, 4, 0, 3]
        );
        assert_eq!(as_idx(s.get_f32(top).unwrap()), vec![0, 5, 2, 5, 1, 2]);
    }

    #[test]
    fn random_rows_and_transposed_input() {
        let mut rng = Rng::new(21);
        for &(n0, n1, n2) in &[(1usize, 1usize, 1usize), (3, 2, 1), (17, 3, 2)] {
            let mut g = Graph::new();
            let leaf = g.new_f32(&[n1, n0, n2]).unwrap();
            let a = g.transpose(leaf).unwrap(); // [n0, n1, n2], a[i0, i1, i2] = leaf[i1, i0, i2]
            let asc = g.argsort(a, SortOrder::Asc).unwrap();
            let desc = g.argsort(a, SortOrder::Desc).unwrap();
            let k = n0.div_ceil(2);
            let top = g.top_k(a, k).unwrap();
            let lv = rng.vec(n0 * n1 * n2, -3.0, 3.0);
            let mut s = Session::new(g, &[asc, desc, top]).unwrap();
            s.set_f32(leaf, &lv).unwrap();
            s.compute(&ReferenceBackend).unwrap();
            let (ga, gd, gt) = (
                as_idx(s.get_f32(asc).unwrap()),
                as_idx(s.get_f32(desc).unwrap()),
                as_idx(s.get_f32(top).unwrap()),
            );
            for i2 in 0..n2 {
                for i1 in 0..n1 {
                    let row: Vec<f32> = (0..n0).map(|i0| lv[(i2 * n0 + i0) * n1 + i1]).collect();
                    let r = i2 * n1 + i1;
                    let ra = &ga[r * n0..(r + 1) * n0];
                    let rd = &gd[r * n0..(r + 1) * n0];
                    let rt = &gt[r * k..(r + 1) * k];
                    // a permutation, in order
                    let mut seen = ra.to_vec();
                    seen.sort();
                    assert_eq!(seen, (0..n0).collect::<Vec<_>>());
                    assert!(ra.windows(2).all(|w| row[w[0]] <= row[w[1]]));
                    assert!(rd.windows(2).all(|w| row[w[0]] >= row[w[1]]));
                    assert_eq!(rt, &rd[..k]);
                    // the k-th largest is at least every value left out
                    let kth = row[rt[k - 1]];
                    assert!((0..n0).filter(|i| !rt.contains(i)).all(|i| row[i] <= kth));
                }
            }
        }
    }

    #[test]
    fn bad_inputs_are_errors_naming_op_and_shapes() {
        let mut g = Graph::new();
        let a = g.new_f32(&[5, 2]).unwrap();
        let e = g.top_k(a, 6).unwrap_err().to_string();
        assert!(
            e.starts_with("top_k:") && e.contains("k = 6") && e.contains("f32 [5, 2, 1, 1]"),
            "{e}"
        );
        assert!(g.top_k(a, 0).is_err());
        let h = g.new_tensor(DType::F16, &[5, 2]).unwrap();
        let e = g.argsort(h, SortOrder::Desc).unwrap_err().to_string();
        assert!(e.starts_with("argsort:") && e.contains("type f16"), "{e}");
    }
}
