//! Element-wise binary ops with ggml's broadcasting: `b` is repeated over `a` when every dim of
//! `a` is a multiple of `b`'s. Also `add1` (a scalar `b`), and `acc` / `set`, which add `b` into,
//! or write it over, a region of `a` given by strides and a byte offset.

use crate::error::Result;
use crate::graph::{Graph, F32_ONLY, FLOATS};
use crate::op::{Op, RegionParams};
use crate::reference::{Dense, NodeRef};
use crate::shape::{can_repeat, fmt_ne};
use crate::tensor::TensorId;

impl Graph {
    fn binary(&mut self, op: Op, a: TensorId, b: TensorId) -> Result<TensorId> {
        let name = op.name();
        self.check_types(name, &[a, b], &[FLOATS, FLOATS])?;
        let (ane, bne) = (self.ne(a), self.ne(b));
        if !can_repeat(&bne, &ane) {
            return Err(self.shape_err(
                name,
                format!(
                    "b {} cannot be broadcast to a {} (each dim of a must be a multiple of b's)",
                    fmt_ne(&bne),
                    fmt_ne(&ane)
                ),
                &[a, b],
            ));
        }
        let dt = self.dtype(a);
        Ok(self.node(op, dt, ane, &[a, b]))
    }

    /// `a + b`, `b` broadcast over `a`.
    pub fn add(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(Op::Add, a, b)
    }
    /// `a - b`, `b` broadcast over `a`.
    pub fn sub(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(Op::Sub, a, b)
    }
    /// `a * b` element-wise, `b` broadcast over `a`.
    pub fn mul(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(Op::Mul, a, b)
    }
    /// `a / b` element-wise, `b` broadcast over `a`.
    pub fn div(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(Op::Div, a, b)
    }

    /// `a + b` where `b` holds one value.
    pub fn add1(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        const OP: &str = "add1";
        self.check_types(OP, &[a, b], &[FLOATS, FLOATS])?;
        if self.tensor(b).nelements() != 1 {
            return Err(self.shape_err(OP, "b must hold exactly one value", &[a, b]));
        }
        let (dt, ne) = (self.dtype(a), self.ne(a));
        Ok(self.node(Op::Add1, dt, ne, &[a, b]))
    }

    fn region(&mut self, op: Op, a: TensorId, b: TensorId, r: RegionParams) -> Result<TensorId> {
        let name = op.name();
        self.check_types(name, &[a, b], &[F32_ONLY, F32_ONLY])?;
        if !self.is_contiguous(a) {
            return Err(self.shape_err(name, "a must be contiguous", &[a, b]));
        }
        let bt = self.tensor(b).clone();
        let at = self.tensor(a).clone();
        if bt.nelements() > 0 {
            let last = r.offset
                + 4 * (bt.ne[0] - 1)
                + r.nb1 * (bt.ne[1] - 1)
                + r.nb2 * (bt.ne[2] - 1)
                + r.nb3 * (bt.ne[3] - 1)
                + 4;
            if !r.offset.is_multiple_of(4)
                || !r.nb1.is_multiple_of(4)
                || !r.nb2.is_multiple_of(4)
                || !r.nb3.is_multiple_of(4)
                || last > at.nbytes()
            {
                return Err(self.shape_err(
                    name,
                    format!(
                        "region of b's shape with strides [4, {}, {}, {}] at byte offset {} does not fit in a ({} bytes) or is misaligned",
                        r.nb1, r.nb2, r.nb3, r.offset, at.nbytes()
                    ),
                    &[a, b],
                ));
            }
        }
        Ok(self.node(op, at.dtype, at.ne, &[a, b]))
    }

    /// `a` with `b` added into the region of `a` at byte `offset` with strides `nb1..nb3`.
    pub fn acc(
        &mut self,
        a: TensorId,
        b: TensorId,
        nb1: usize,
        nb2: usize,
        nb3: usize,
        offset: usize,
    ) -> Result<TensorId> {
        self.region(
            Op::Acc(RegionParams {
                nb1,
                nb2,
                nb3,
                offset,
            }),
            a,
            b,
            RegionParams {
                nb1,
                nb2,
                nb3,
                offset,
            },
        )
    }

    /// `a` with the region at byte `offset` with strides `nb1..nb3` replaced by `b`.
    pub fn set(
        &mut self,
        a: TensorId,
        b: TensorId,
        nb1: usize,
        nb2: usize,
        nb3: usize,
        offset: usize,
    ) -> Result<TensorId> {
        self.region(
            Op::Set(RegionParams {
                nb1,
                nb2,
                nb3,
                offset,
            }),
            a,
            b,
            RegionParams {
                nb1,
                nb2,
                nb3,
                offset,
            },
        )
    }
}

/// `b`'s value broadcast to index `(i0..i3)` of `a`'s shape.
#[inline]
pub(crate) fn bcast(b: &Dense, i0: usize, i1: usize, i2: usize, i3: usize) -> f64 {
    b.at(i0 % b.ne[0], i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3])
}

pub(crate) fn reference(n: &NodeRef, src: &[Dense]) -> Result<Dense> {
    let (a, b) = (&src[0], &src[1]);
    let f: fn(f64, f64) -> f64 = match n.t.op {
        Op::Add => |x, y| x + y,
        Op::Sub => |x, y| x - y,
        Op::Mul => |x, y| x * y,
        Op::Div => |x, y| x / y,
        Op::Add1 => {
            return Ok(Dense {
                ne: a.ne,
                data: a.data.iter().map(|x| x + b.data[0]).collect(),
            })
        }
        Op::Acc(r) | Op::Set(r) => {
            let mut out = a.clone();
            let acc = matches!(n.t.op, Op::Acc(_));
            Dense::for_each_index(&b.ne, |i0, i1, i2, i3| {
                let k = (r.offset + 4 * i0 + r.nb1 * i1 + r.nb2 * i2 + r.nb3 * i3) / 4;
                let v = b.at(i0, i1, i2, i3);
                out.data[k] = if acc { out.data[k] + v } else { v };
            });
            return Ok(out);
        }
        _ => return Err(n.err("not a binary op")),
    };
    Ok(Dense::from_fn(a.ne, |i0, i1, i2, i3| {
        f(a.at(i0, i1, i2, i3), bcast(b, i0, i1, i2, i3))
    }))
}

impl Graph {
    /// Backward of the element-wise binary ops, with `b` broadcast over `a`: the gradient of
    /// `b` is summed back over the broadcast dims.
    pub(crate) fn backward_binary(
        &mut self,
        bw: &crate::autodiff::Bw,
    ) -> Result<crate::autodiff::Grads> {
        let t = self.tensor(bw.node).clone();
        let (a, b) = (t.src[0], t.src[1]);
        let g = bw.grad;
        let mut ga = None;
        let mut gb = None;
        match t.op {
            Op::Add => {
                ga = Some(g);
                if bw.wants(1) {
                    gb = Some(self.reduce_to(g, b)?);
                }
            }
            Op::Sub => {
                ga = Some(g);
                if bw.wants(1) {
                    let r = self.reduce_to(g, b)?;
                    gb = Some(self.scale(r, -1.0)?);
                }
            }
            Op::Mul => {
                if bw.wants(0) {
                    ga = Some(self.mul(g, b)?);
                }
                if bw.wants(1) {
                    let p = self.mul(g, a)?;
                    gb = Some(self.reduce_to(p, b)?);
                }
            }
            Op::Div => {
                if bw.wants(0) {
                    ga = Some(self.div(g, b)?);
                }
                if bw.wants(1) {
                    // d(a/b)/db = -a/b² = -out/b
                    let p = self.mul(g, bw.node)?;
                    let q = self.div(p, b)?;
                    let r = self.reduce_to(q, b)?;
                    gb = Some(self.scale(r, -1.0)?);
                }
            }
            Op::Add1 => {
                ga = Some(g);
                if bw.wants(1) {
                    let s = self.sum(g)?;
                    let ne = self.ne(b);
                    gb = Some(self.reshape(s, &ne)?);
                }
            }
            Op::Acc(r) | Op::Set(r) => {
                if bw.wants(0) {
                    ga = Some(match t.op {
                        Op::Acc(_) => g,
                        _ => {
                            let ne = self.ne(b);
                            let z = self.fill(&ne, 0.0)?;
                            let gc = self.contig(g)?;
                            self.set(gc, z, r.nb1, r.nb2, r.nb3, r.offset)?
                        }
                    });
                }
                if bw.wants(1) {
                    let gc = self.contig(g)?;
                    let ne = self.ne(b);
                    let v = self.view(gc, &ne, &[r.nb1, r.nb2, r.nb3], r.offset)?;
                    gb = Some(self.cont(v)?);
                }
            }
            _ => return Err(self.not_diff(bw.node, 0, "not a binary op")),
        }
        Ok(vec![ga, gb])
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::testutil::*;
    use crate::*;

    #[test]
    fn broadcast_add_sub_mul_div_by_hand() {
        for (op, f) in [
            ("add", (|x, y| x + y) as fn(f64, f64) -> f64),
            ("sub", |x, y| x - y),
            ("mul", |x, y| x * y),
            ("div", |x, y| x / y),
        ] {
            let mut g = Graph::new();
            let a = g.new_f32(&[3, 2, 2]).unwrap();
            let b = g.new_f32(&[3, 1, 2]).unwrap();
            let c = match op {
                "add" => g.add(a, b),
                "sub" => g.sub(a, b),
                "mul" => g.mul(a, b),
                _ => g.div(a, b),
            }
            .unwrap();
            let av: Vec<f32> = (1..=12).map(|x| x as f32).collect();
            let bv = vec![1.0, 2.0, 4.0, -1.0, 0.5, 8.0];
            let got = run1(g, &[(a, av.clone()), (b, bv.clone())], c);
            let want: Vec<f64> = (0..12)
                .map(|i| {
                    let (i0, i2) = (i % 3, i / 6);
                    f(av[i] as f64, bv[i2 * 3 + i0] as f64)
                })
                .collect();
            assert_close(&got, &want, 1e-7);
        }
    }

    #[test]
    fn non_broadcastable_shapes_name_op_shapes_and_types() {
        let mut g = Graph::new();
        let a = g.new_f32(&[4, 3]).unwrap();
        let b = g.new_tensor(DType::F16, &[3]).unwrap();
        let e = g.sub(a, b).unwrap_err().to_string();
        assert!(e.starts_with("sub:"), "{e}");
        assert!(
            e.contains("f32 [4, 3, 1, 1]") && e.contains("f16 [3, 1, 1, 1]"),
            "{e}"
        );
        let i = g.new_tensor(DType::I32, &[4, 3]).unwrap();
        let e = g.add(a, i).unwrap_err().to_string();
        assert!(e.contains("type i32"), "{e}");
    }

    #[test]
    fn acc_and_set_write_the_region() {
        let mut g = Graph::new();
        let a = g.new_f32(&[4, 3]).unwrap();
        let b = g.new_f32(&[2, 2]).unwrap();
        // region: columns 1..3 of rows 1..3 -> offset = (1*4 + 1) * 4, nb1 = 16
        let acc = g.acc(a, b, 16, 32, 32, 20).unwrap();
        let set = g.set(a, b, 16, 32, 32, 20).unwrap();
        let mut s = Session::new(g, &[acc, set]).unwrap();
        s.set_f32(a, &[1.0; 12]).unwrap();
        s.set_f32(b, &[10., 20., 30., 40.]).unwrap();
        s.compute(&ReferenceBackend).unwrap();
        let mut want = vec![1.0f32; 12];
        for (k, v) in [(5, 10.), (6, 20.), (9, 30.), (10, 40.)] {
            want[k] = v;
        }
        assert_eq!(s.get_f32(set).unwrap(), want);
        let want_acc: Vec<f32> = want
            .iter()
            .map(|&v| if v == 1.0 { 1.0 } else { v + 1.0 })
            .collect();
        assert_eq!(s.get_f32(acc).unwrap(), want_acc);
    }
}
