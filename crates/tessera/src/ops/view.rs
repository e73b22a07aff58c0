//! Views (view, reshape, permute, transpose) that alias their source's memory, and the copies
//! `cont` (to a contiguous tensor, optionally of another type) and `cpy` (into another tensor's
//! memory, honouring its strides — a strided destination such as a KV-cache slot is written
//! exactly where its strides say).

use crate::error::Result;
use crate::graph::Graph;
use crate::op::Op;
use crate::reference::{Dense, NodeRef};
use crate::shape::{
    contiguous_nb, fmt_ne, is_contiguous, nbytes, ne_from, nelements, Nb, MAX_DIMS,
};
use crate::tensor::TensorId;
use crate::DType;

impl Graph {
    /// A view of `a` with shape `ne` (1 to 4 dims), byte strides `nb[1..]` (`nb[0]` is the type
    /// size) and a byte offset, like ggml's `ggml_view_{1,2,3,4}d`. The view must lie inside
    /// the memory of `a`'s storage.
    pub fn view(
        &mut self,
        a: TensorId,
        ne: &[usize],
        nb_rest: &[usize],
        offset: usize,
    ) -> Result<TensorId> {
        const OP: &str = "view";
        self.check_id(OP, a)?;
        let at = self.tensor(a).clone();
        if ne.is_empty() || ne.len() > MAX_DIMS || nb_rest.len() + 1 != ne.len() {
            return Err(self.shape_err(
                OP,
                format!(
                    "{} dims and {} strides given; want 1-4 dims and one stride fewer",
                    ne.len(),
                    nb_rest.len()
                ),
                &[a],
            ));
        }
        let ne4 = ne_from(ne);
        if !ne4[0].is_multiple_of(at.dtype.block_size()) {
            return Err(self.shape_err(
                OP,
                format!(
                    "row length {} is not a multiple of the block size {}",
                    ne4[0],
                    at.dtype.block_size()
                ),
                &[a],
            ));
        }
        let mut nb: Nb = contiguous_nb(at.dtype, &ne4);
        for (i, &s) in nb_rest.iter().enumerate() {
            nb[i + 1] = s;
        }
        let span = nbytes(at.dtype, &ne4, &nb);
        let (root, root_off) = self.storage_root(a);
        let root_bytes = self.tensor(root).nbytes();
        if root_off + offset + span > root_bytes && nelements(&ne4) > 0 {
            return Err(self.shape_err(
                OP,
                format!(
                    "view {} with strides {:?} at offset {} spans {} bytes, past the end of its storage ({} bytes from offset {})",
                    fmt_ne(&ne4), nb, offset, span, root_bytes, root_off
                ),
                &[a],
            ));
        }
        Ok(self.aliasing_node(Op::View, at.dtype, ne4, nb, &[a], a, offset))
    }

    /// `a` with a new shape of the same element count; `a` must be contiguous.
    pub fn reshape(&mut self, a: TensorId, ne: &[usize]) -> Result<TensorId> {
        const OP: &str = "reshape";
        self.check_id(OP, a)?;
        let at = self.tensor(a).clone();
        if ne.is_empty() || ne.len() > MAX_DIMS {
            return Err(self.shape_err(
                OP,
                format!("{} dims given, 1 to 4 allowed", ne.len()),
                &[a],
            ));
        }
        let ne4 = ne_from(ne);
        if nelements(&ne4) != at.nelements() {
            return Err(self.shape_err(
                OP,
                format!(
                    "new shape {} has {} elements, the input {}",
                    fmt_ne(&ne4),
                    nelements(&ne4),
                    at.nelements()
                ),
                &[a],
            ));
        }
        if !at.is_contiguous() {
            return Err(self.shape_err(OP, "input is not contiguous (use cont first)", &[a]));
        }
        if !ne4[0].is_multiple_of(at.dtype.block_size()) {
            return Err(self.shape_err(
                OP,
                format!("row length {} is not a multiple of the block size", ne4[0]),
                &[a],
            ));
        }
        let nb = contiguous_nb(at.dtype, &ne4);
        Ok(self.aliasing_node(Op::Reshape, at.dtype, ne4, nb, &[a], a, 0))
    }

    /// ggml's permute: source axis `i` goes to position `axes[i]`.
    pub fn permute(&mut self, a: TensorId, axes: [usize; 4]) -> Result<TensorId> {
        const OP: &str = "permute";
        self.check_id(OP, a)?;
        let mut seen = [false; 4];
        for &x in &axes {
            if x >= 4 || seen[x] {
                return Err(self.shape_err(
                    OP,
                    format!("axes {axes:?} are not a permutation of 0..4"),
                    &[a],
                ));
            }
            seen[x] = true;
        }
        let at = self.tensor(a).clone();
        if at.dtype.is_quantized() && axes[0] != 0 {
            return Err(self.shape_err(OP, "a quantized tensor cannot move its dim 0", &[a]));
        }
        let mut ne = [1; 4];
        let mut nb = [0; 4];
        for i in 0..4 {
            ne[axes[i]] = at.ne[i];
            nb[axes[i]] = at.nb[i];
        }
        Ok(self.aliasing_node(Op::Permute { axes }, at.dtype, ne, nb, &[a], a, 0))
    }

    /// Swaps dims 0 and 1.
    pub fn transpose(&mut self, a: TensorId) -> Result<TensorId> {
        const OP: &str = "transpose";
        self.check_id(OP, a)?;
        let at = self.tensor(a).clone();
        if at.dtype.is_quantized() {
            return Err(self.shape_err(OP, "a quantized tensor cannot be transposed", &[a]));
        }
        let ne = [at.ne[1], at.ne[0], at.ne[2], at.ne[3]];
        let nb = [at.nb[1], at.nb[0], at.nb[2], at.nb[3]];
        Ok(self.aliasing_node(Op::Transpose, at.dtype, ne, nb, &[a], a, 0))
    }

    /// A contiguous copy of `a`.
    pub fn cont(&mut self, a: TensorId) -> Result<TensorId> {
        self.check_id("cont", a)?;
        let dt = self.dtype(a);
        self.cast(a, dt)
    }

    /// A contiguous copy of `a` converted to `dtype` (quantizing when `dtype` is quantized).
    pub fn cast(&mut self, a: TensorId, dtype: DType) -> Result<TensorId> {
        const OP: &str = "cont";
        self.check_id(OP, a)?;
        let at = self.tensor(a).clone();
        if !at.ne[0].is_multiple_of(dtype.block_size()) {
            return Err(self.shape_err(
                OP,
                format!(
                    "row length {} is not a multiple of {}'s block size {}",
                    at.ne[0],
                    dtype,
                    dtype.block_size()
                ),
                &[a],
            ));
        }
        Ok(self.node(Op::Cont, dtype, at.ne, &[a]))
    }

    /// Copies `a` into `b`'s memory (same element count; types may differ), honouring `b`'s
    /// strides. Returns a tensor that aliases `b`; compute it to perform the copy.
    pub fn cpy(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        const OP: &str = "cpy";
        self.check_id(OP, a)?;
        self.check_id(OP, b)?;
        let (at, bt) = (self.tensor(a).clone(), self.tensor(b).clone());
        if at.nelements() != bt.nelements() {
            return Err(self.shape_err(
                OP,
                format!(
                    "{} elements cannot be copied into {}",
                    at.nelements(),
                    bt.nelements()
                ),
                &[a, b],
            ));
        }
        if bt.dtype.is_quantized() && !crate::shape::rows_contiguous(bt.dtype, &bt.ne, &bt.nb) {
            return Err(self.shape_err(
                OP,
                "a quantized destination needs contiguous rows",
                &[a, b],
            ));
        }
        Ok(self.aliasing_node(Op::Cpy, bt.dtype, bt.ne, bt.nb, &[a, b], b, 0))
    }

    /// Is this tensor laid out densely?
    pub fn is_contiguous(&self, a: TensorId) -> bool {
        let t = self.tensor(a);
        is_contiguous(t.dtype, &t.ne, &t.nb)
    }
}

pub(crate) fn reference(n: &NodeRef, src: &[Dense]) -> Result<Dense> {
    match n.t.op {
        // Both copy the logical sequence of values; the destination's type and strides are
        // applied when the result is scattered.
        Op::Cont | Op::Cpy => Ok(Dense {
            ne: n.t.ne,
            data: src[0].data.clone(),
        }),
        _ => Err(n.err("not a copy op")),
    }
}

impl Graph {
    /// Backward of views and copies: a view's gradient is added into zeros of its source's
    /// shape at the same place; reshape/permute/transpose undo themselves; cont and cpy pass
    /// the gradient through (cpy's destination is overwritten: its gradient is zero).
    pub(crate) fn backward_view(
        &mut self,
        bw: &crate::autodiff::Bw,
    ) -> Result<crate::autodiff::Grads> {
        let t = self.tensor(bw.node).clone();
        let a = t.src[0];
        let g = bw.grad;
        let ga = match t.op {
            Op::Cont => g,
            Op::Cpy => {
                let gb = if bw.wants(1) {
                    let ne = self.ne(t.src[1]);
                    Some(self.fill(&ne, 0.0)?)
                } else {
                    None
                };
                return Ok(vec![Some(g), gb]);
            }
            Op::Reshape => {
                let gc = self.contig(g)?;
                let ne = self.ne(a);
                self.reshape(gc, &ne)?
            }
            Op::Transpose => self.transpose(g)?,
            Op::Permute { axes } => {
                let mut inv = [0; 4];
                for (i, &x) in axes.iter().enumerate() {
                    inv[x] = i;
                }
                self.permute(g, inv)?
            }
            Op::View => {
                let at = self.tensor(a).clone();
                if at.dtype.is_quantized() || !at.is_contiguous() {
                    return Err(self.not_diff(
                        bw.node,
                        0,
                        &format!(
                            "the gradient of a view needs a contiguous f32/f16/bf16 source, this one is {}",
                            at.describe()
                        ),
                    ));
                }
                let ts = at.dtype.type_size();
                let off = t.view_of.map(|v| v.offset).unwrap_or(0);
                let f = |b: usize| b / ts * 4;
                let zeros = self.fill(&at.ne, 0.0)?;
                let gc = self.contig(g)?;
                self.acc(zeros, gc, f(t.nb[1]), f(t.nb[2]), f(t.nb[3]), f(off))?
            }
            _ => return Err(self.not_diff(bw.node, 0, "not a view op")),
        };
        Ok(vec![Some(ga)])
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::testutil::*;
    use crate::*;

    #[test]
    fn permute_transpose_and_cont_move_values() {
        let mut g = Graph::new();
        let a = g.new_f32(&[3, 2, 2]).unwrap();
        let p = g.permute(a, [2, 0, 1, 3]).unwrap(); // ne = [2, 2, 3]
        assert_eq!(g.ne(p), [2, 2, 3, 1]);
        let _ = p;
        let t = g.transpose(a).unwrap();
        let c = g.cont(t).unwrap();
        let vals: Vec<f32> = (0..12).map(|x| x as f32).collect();
        let out = run1(g, &[(a, vals.clone())], c);
        // transpose of [3,2,2]: out[i0,i1,i2] = a[i1,i0,i2]
        let mut want = vec![];
        for i2 in 0..2 {
            for i1 in 0..3 {
                for i0 in 0..2 {
                    want.push(vals[i2 * 6 + i0 * 3 + i1]);
                }
            }
        }
        assert_eq!(out, want);
    }

    #[test]
    fn cpy_into_strided_view_writes_only_its_slots() {
        // a KV-cache-like destination: write 2 rows of 4 into columns 1..3 of a [4, 5] cache
        let mut g = Graph::new();
        let cache = g.new_tensor(DType::F16, &[4, 5]).unwrap();
        let x = g.new_f32(&[4, 2]).unwrap();
        let slot = g.view(cache, &[4, 2], &[8], 8).unwrap();
        let w = g.cpy(x, slot).unwrap();
        let mut s = Session::new(g, &[w, cache]).unwrap();
        s.set_f32(cache, &[-1.0; 20]).unwrap();
        s.set_f32(x, &[1., 2., 3., 4., 5., 6., 7., 8.]).unwrap();
        s.compute(&ReferenceBackend).unwrap();
        let got = s.get_f32(cache).unwrap();
        let mut want = vec![-1.0f32; 20];
        want[4..12].copy_from_slice(&[1., 2., 3., 4., 5., 6., 7., 8.]);
        assert_eq!(got, want);
    }

    #[test]
    fn views_out_of_bounds_and_bad_reshapes_are_errors() {
        let mut g = Graph::new();
        let a = g.new_f32(&[4, 3]).unwrap();
        let e = g.view(a, &[4, 2], &[16], 20).unwrap_err().to_string();
        assert!(e.contains("view") && e.contains("past the end"), "{e}");
        let e = g.reshape(a, &[5, 2]).unwrap_err().to_string();
        assert!(e.contains("reshape") && e.contains("10 elements"), "{e}");
        let t = g.transpose(a).unwrap();
        assert!(g
            .reshape(t, &[12])
            .unwrap_err()
            .to_string()
            .contains("not contiguous"));
        assert!(g.permute(a, [0, 0, 1, 2]).is_err());
    }
}
