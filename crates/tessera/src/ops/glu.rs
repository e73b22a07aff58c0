//! Gated linear units: swiglu, geglu, reglu (and geglu_erf, geglu_quick), as ggml's `GGML_OP_GLU`.
//!
//! - fused (one source `a`, `a.ne0` even): each row is split into halves `[x | g]` and the result
//!   row is `act(x) * g` (or, swapped, `act(g) * x`: the second half is activated and gates the
//!   first); the result has `ne0 = a.ne0 / 2` and `a`'s other dims.
//! - split (two sources of equal shape and type): `act(a) * b`, the shape of `a`.
//!
//! Inputs are f32 or f16 (ggml's CPU kernels) and, as ggml's builder asserts, their rows must be
//! dense and dims 2 and 3 must follow dim 1 contiguously (`ggml_is_contiguous_1`); the row stride
//! itself is free, so a view that picks some columns of a wider matrix is accepted.
//!
//! The activations are the f64 functions of [`UnaryOp::eval`]: geglu uses gelu's tanh form. Note:
//! ggml's CPU backend evaluates gelu (and gelu_quick) of f32 through an f16 lookup table
//! (`GGML_GELU_FP16`), so its geglu results differ from the exact formula by about f16 rounding
//! (nmse near 1e-7 on golden case c032); the reference keeps the exact formula.

use crate::error::Result;
use crate::graph::Graph;
use crate::op::Op;
use crate::ops::unary::UnaryOp;
use crate::reference::{Dense, NodeRef};
use crate::shape::fmt_ne;
use crate::tensor::TensorId;
use crate::DType;

/// The activation applied to the gate half.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GluKind {
    Reglu,
    Geglu,
    Swiglu,
    GegluErf,
    GegluQuick,
}

impl GluKind {
    pub const ALL: [GluKind; 5] = [
        GluKind::Reglu,
        GluKind::Geglu,
        GluKind::Swiglu,
        GluKind::GegluErf,
        GluKind::GegluQuick,
    ];

    pub fn name(self) -> &'static str {
        match self {
            GluKind::Reglu => "reglu",
            GluKind::Geglu => "geglu",
            GluKind::Swiglu => "swiglu",
            GluKind::GegluErf => "geglu_erf",
            GluKind::GegluQuick => "geglu_quick",
        }
    }

    pub fn from_name(name: &str) -> Option<GluKind> {
        GluKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The activation applied to `x` before it is multiplied by the gate.
    pub fn activation(self) -> UnaryOp {
        match self {
            GluKind::Reglu => UnaryOp::Relu,
            GluKind::Geglu => UnaryOp::Gelu,
            GluKind::Swiglu => UnaryOp::Silu,
            GluKind::GegluErf => UnaryOp::GeluErf,
            GluKind::GegluQuick => UnaryOp::GeluQuick,
        }
    }
}

/// Types ggml's CPU GLU kernels take.
const GLU_TYPES: &[DType] = &[DType::F32, DType::F16];

impl Graph {
    /// ggml's `ggml_is_contiguous_1`: dense rows, dims 2 and 3 packed after dim 1 (any `nb1`).
    fn rows_packed(&self, a: TensorId) -> bool {
        let t = self.tensor(a);
        if t.ne[0] != 1 && t.nb[0] != t.dtype.type_size() {
            return false;
        }
        let mut next = t.ne[1] * t.nb[1];
        for i in 2..4 {
            if t.ne[i] != 1 && t.nb[i] != next {
                return false;
            }
            next *= t.ne[i];
        }
        true
    }

    fn glu_node(
        &mut self,
        a: TensorId,
        b: Option<TensorId>,
        kind: GluKind,
        swapped: bool,
    ) -> Result<TensorId> {
        let op = kind.name();
        let src: Vec<TensorId> = std::iter::once(a).chain(b).collect();
        self.check_types(op, &src, &[GLU_TYPES, GLU_TYPES])?;
        for (i, &s) in src.iter().enumerate() {
            if !self.rows_packed(s) {
                return Err(self.shape_err(
                    op,
                    format!(
                        "input {i} needs dense rows with dims 2 and 3 packed after dim 1 (ggml_is_contiguous_1); use cont first"
                    ),
                    &src,
                ));
            }
        }
        let ane = self.ne(a);
        let ne = match b {
            Some(b) => {
                let bne = self.ne(b);
                if ane != bne {
                    return Err(self.shape_err(
                        op,
                        format!(
                            "split form needs a and b of the same shape, got {} and {}",
                            fmt_ne(&ane),
                            fmt_ne(&bne)
                        ),
                        &src,
                    ));
                }
                if self.dtype(a) != self.dtype(b) {
                    return Err(self.shape_err(
                        op,
                        "split form needs a and b of the same type",
                        &src,
                    ));
                }
                ane
            }
            None => {
                if ane[0] % 2 == 1 {
                    return Err(self.shape_err(
                        op,
                        format!(
                            "fused form splits each row in two halves, row length {} is odd",
                            ane[0]
                        ),
                        &src,
                    ));
                }
                [ane[0] / 2, ane[1], ane[2], ane[3]]
            }
        };
        let dt = self.dtype(a);
        Ok(self.node(Op::Glu { kind, swapped }, dt, ne, &src))
    }

    /// ggml's `ggml_glu`: each row of `a` is `[x | g]`; the result row is `act(x) * g`, or with
    /// `swapped` `act(g) * x`. Result: `[a.ne0 / 2, a.ne1, a.ne2, a.ne3]`, `a.ne0` even.
    pub fn glu(&mut self, a: TensorId, kind: GluKind, swapped: bool) -> Result<TensorId> {
        self.glu_node(a, None, kind, swapped)
    }

    /// ggml's `ggml_glu_split`: `act(a) * b` for `a` and `b` of the same shape and type.
    pub fn glu_split(&mut self, a: TensorId, b: TensorId, kind: GluKind) -> Result<TensorId> {
        self.glu_node(a, Some(b), kind, false)
    }

    /// `ggml_swiglu`: silu(first half) * second half of each row.
    pub fn swiglu(&mut self, a: TensorId) -> Result<TensorId> {
        self.glu(a, GluKind::Swiglu, false)
    }
    /// `ggml_swiglu_split`: silu(a) * b.
    pub fn swiglu_split(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.glu_split(a, b, GluKind::Swiglu)
    }
    /// `ggml_geglu`: gelu (tanh form) of the first half * second half of each row.
    pub fn geglu(&mut self, a: TensorId) -> Result<TensorId> {
        self.glu(a, GluKind::Geglu, false)
    }
    /// `ggml_geglu_split`: gelu(a) * b (tanh form).
    pub fn geglu_split(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.glu_split(a, b, GluKind::Geglu)
    }
    /// `ggml_reglu`: relu(first half) * second half of each row.
    pub fn reglu(&mut self, a: TensorId) -> Result<TensorId> {
        self.glu(a, GluKind::Reglu, false)
    }
    /// `ggml_reglu_split`: relu(a) * b.
    pub fn reglu_split(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.glu_split(a, b, GluKind::Reglu)
    }
    /// `ggml_geglu_erf`: gelu with the exact erf of the first half * second half of each row.
    pub fn geglu_erf(&mut self, a: TensorId) -> Result<TensorId> {
        self.glu(a, GluKind::GegluErf, false)
    }
    /// `ggml_geglu_erf_split`: gelu_erf(a) * b.
    pub fn geglu_erf_split(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.glu_split(a, b, GluKind::GegluErf)
    }
    /// `ggml_geglu_quick`: `x * sigmoid(1.702 x)` of the first half * second half of each row.
    pub fn geglu_quick(&mut self, a: TensorId) -> Result<TensorId> {
        self.glu(a, GluKind::GegluQuick, false)
    }
    /// `ggml_geglu_quick_split`: gelu_quick(a) * b.
    pub fn geglu_quick_split(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.glu_split(a, b, GluKind::GegluQuick)
    }
}

pub(crate) fn reference(n: &NodeRef, src: &[Dense]) -> Result<Dense> {
    let Op::Glu { kind, swapped } = n.t.op else {
        return Err(n.err("not a glu op"));
    };
    let act = kind.activation();
    let a = &src[0];
    let ne = n.t.ne;
    if let Some(b) = src.get(1) {
        return Ok(Dense::from_fn(ne, |i0, i1, i2, i3| {
            act.eval(a.at(i0, i1, i2, i3)) * b.at(i0, i1, i2, i3)
        }));
    }
    // fused: x is the activated half, g the gate
    let nc = ne[0];
    let (xoff, goff) = if swapped { (nc, 0) } else { (0, nc) };
    Ok(Dense::from_fn(ne, |i0, i1, i2, i3| {
        act.eval(a.at(i0 + xoff, i1, i2, i3)) * a.at(i0 + goff, i1, i2, i3)
    }))
}

impl Graph {
    /// Backward of the gated linear units: with `out = act(x)·y`, `dx = grad·y·act'(x)` and
    /// `dy = grad·act(x)`; the fused form concatenates the two halves' gradients back.
    pub(crate) fn backward_glu(
        &mut self,
        bw: &crate::autodiff::Bw,
    ) -> Result<crate::autodiff::Grads> {
        let t = self.tensor(bw.node).clone();
        let Op::Glu { kind, swapped } = t.op else {
            return Err(self.not_diff(bw.node, 0, "not a glu op"));
        };
        let act = kind.activation();
        let g = bw.grad;
        let (x, y) = if t.src.len() == 2 {
            (t.src[0], t.src[1])
        } else {
            let a = t.src[0];
            let at = self.tensor(a).clone();
            let n = at.ne[0] / 2;
            let ne = [n, at.ne[1], at.ne[2], at.ne[3]];
            let nb = [at.nb[1], at.nb[2], at.nb[3]];
            let first = self.view(a, &ne, &nb, 0)?;
            let second = self.view(a, &ne, &nb, n * at.dtype.type_size())?;
            if swapped {
                (second, first)
            } else {
                (first, second)
            }
        };
        let gy_raw = self.mul(g, y)?;
        let gx = self.unary_back(gy_raw, x, crate::ops::unary::Deriv::Unary(act))?;
        let ax = self.unary(x, act)?;
        let gy = self.mul(g, ax)?;
        if t.src.len() == 2 {
            return Ok(vec![bw.wants(0).then_some(gx), bw.wants(1).then_some(gy)]);
        }
        let (g0, g1) = if swapped { (gy, gx) } else { (gx, gy) };
        Ok(vec![Some(self.concat(g0, g1, 0)?)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;
    use crate::*;

    fn silu(x: f64) -> f64 {
        x / (1.0 + (-x).exp())
    }

    #[test]
    fn swiglu_fused_and_swapped_by_hand() {
        // one row [x0, x1 | g0, g1]
        let mut g = Graph::new();
        let a = g.new_f32(&[4]).unwrap();
        let y = g.swiglu(a).unwrap();
        let ys = g.glu(a, GluKind::Swiglu, true).unwrap();
        assert_eq!(g.ne(y), [2, 1, 1, 1]);
        let mut s = Session::new(g, &[y, ys]).unwrap();
        s.set_f32(a, &[1.0, -2.0, 3.0, 0.5]).unwrap();
        s.compute(&ReferenceBackend).unwrap();
        assert_close(
            &s.get_f32(y).unwrap(),
            &[silu(1.0) * 3.0, silu(-2.0) * 0.5],
            1e-7,
        );
        assert_close(
            &s.get_f32(ys).unwrap(),
            &[silu(3.0) * 1.0, silu(0.5) * -2.0],
            1e-7,
        );
    }

    #[test]
    fn reglu_and_geglu_values_by_hand() {
        let mut g = Graph::new();
        let a = g.new_f32(&[2, 2]).unwrap();
        let b = g.new_f32(&[2, 2]).unwrap();
        let r = g.reglu_split(a, b).unwrap();
        let ge = g.geglu_split(a, b).unwrap();
        let mut s = Session::new(g, &[r, ge]).unwrap();
        s.set_f32(a, &[-1.0, 2.0, 0.0, 1.0]).unwrap();
        s.set_f32(b, &[5.0, 3.0, 7.0, -2.0]).unwrap();
        s.compute(&ReferenceBackend).unwrap();
        assert_eq!(s.get_f32(r).unwrap(), vec![0.0, 6.0, 0.0, -2.0]);
        // gelu(1) (tanh form) = 0.5 * (1 + tanh(sqrt(2/pi) * 1.044715)) = 0.8411919906082768
        // gelu(2) = 1.954597694087775, gelu(-1) = -0.15880800939172324
        assert_close(
            &s.get_f32(ge).unwrap(),
            &[
                -0.158_808_009_391_723_24 * 5.0,
                1.954_597_694_087_775 * 3.0,
                0.0,
                0.841_191_990_608_276_8 * -2.0,
            ],
            1e-6,
        );
    }

    #[test]
    fn every_kind_fused_matches_split_on_random_shapes() {
        let mut rng = Rng::new(7);
        for &(nc, n1, n2) in &[(1usize, 1usize, 1usize), (3, 2, 1), (17, 3, 2)] {
            for kind in GluKind::ALL {
                for swapped in [false, true] {
                    let mut g = Graph::new();
                    let a = g.new_f32(&[2 * nc, n1, n2]).unwrap();
                    let y = g.glu(a, kind, swapped).unwrap();
                    assert_eq!(g.ne(y), [nc, n1, n2, 1]);
                    let av = rng.vec(2 * nc * n1 * n2, -4.0, 4.0);
                    let got = run1(g, &[(a, av.clone())], y);
                    let act = kind.activation();
                    let mut want = vec![];
                    for r in 0..n1 * n2 {
                        let row = &av[r * 2 * nc..(r + 1) * 2 * nc];
                        let (x, gate) = if swapped {
                            (&row[nc..], &row[..nc])
                        } else {
                            (&row[..nc], &row[nc..])
                        };
                        for i in 0..nc {
                            want.push(act.eval(x[i] as f64) * gate[i] as f64);
                        }
                    }
                    assert_close(&got, &want, 1e-6);
                }
            }
        }
    }

    #[test]
    fn split_on_column_views_and_f16() {
        // a and b are the two column halves of a wider [6, 3] matrix: non-contiguous views
        // (nb1 = 24 bytes for 3-wide rows), which ggml_is_contiguous_1 accepts.
        let mut g = Graph::new();
        let w = g.new_f32(&[6, 3]).unwrap();
        let a = g.view(w, &[3, 3], &[24], 0).unwrap();
        let b = g.view(w, &[3, 3], &[24], 12).unwrap();
        assert!(!g.is_contiguous(a));
        let y = g.swiglu_split(a, b).unwrap();
        let fused = g.swiglu(w).unwrap();
        let wv: Vec<f32> = (0..18).map(|i| (i as f32 - 8.0) * 0.37).collect();
        let mut s = Session::new(g, &[y, fused]).unwrap();
        s.set_f32(w, &wv).unwrap();
        s.compute(&ReferenceBackend).unwrap();
        let want: Vec<f64> = (0..9)
            .map(|k| {
                let (r, i) = (k / 3, k % 3);
                silu(wv[r * 6 + i] as f64) * wv[r * 6 + 3 + i] as f64
            })
            .collect();
        assert_close(&s.get_f32(y).unwrap(), &want, 1e-6);
        assert_close(&s.get_f32(fused).unwrap(), &want, 1e-6);

        // f16 in, f16 out (values rounded to f16)
        let mut g = Graph::new();
        let a = g.new_tensor(DType::F16, &[4, 2]).unwrap();
        let y = g.geglu_quick(a).unwrap();
        assert_eq!(g.dtype(y), DType::F16);
        let av = vec![0.5, -1.0, 1.5, 2.0, -0.25, 3.0, 4.0, 1.0];
        let got = run1(g, &[(a, av.clone())], y);
        let q = |x: f64| x * (1.0 / (1.0 + (-1.702 * x).exp()));
        let want = [q(0.5) * 1.5, q(-1.0) * 2.0, q(-0.25) * 4.0, q(3.0) * 1.0];
        assert_close(&got, &want, 2e-3);
    }

    #[test]
    fn bad_inputs_are_errors_naming_op_and_shapes() {
        let mut g = Graph::new();
        let odd = g.new_f32(&[5, 2]).unwrap();
        let e = g.swiglu(odd).unwrap_err().to_string();
        assert!(
            e.starts_with("swiglu:") && e.contains("odd") && e.contains("f32 [5, 2, 1, 1]"),
            "{e}"
        );
        let a = g.new_f32(&[4, 2]).unwrap();
        let b = g.new_f32(&[4, 3]).unwrap();
        let e = g.geglu_split(a, b).unwrap_err().to_string();
        assert!(
            e.starts_with("geglu:") && e.contains("[4, 2, 1, 1]") && e.contains("[4, 3, 1, 1]"),
            "{e}"
        );
        let h = g.new_tensor(DType::F16, &[4, 2]).unwrap();
        let e = g.reglu_split(a, h).unwrap_err().to_string();
        assert!(e.starts_with("reglu:") && e.contains("same type"), "{e}");
        let i = g.new_tensor(DType::I32, &[4, 2]).unwrap();
        let e = g.swiglu(i).unwrap_err().to_string();
        assert!(e.contains("type i32"), "{e}");
        let t = g.transpose(a).unwrap();
        let e = g.geglu_erf(t).unwrap_err().to_string();
        assert!(
            e.starts_with("geglu_erf:") && e.contains("contiguous"),
            "{e}"
        );
    }
}
