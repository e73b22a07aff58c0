//! conv_2d (direct), im2col and pool_2d, with ggml's layouts: images are [W, H, C, N] and
//! kernels [KW, KH, Cin, Cout]; dim 0 is the width. Output sizes follow ggml:
//! `(in + 2p - d(k-1) - 1) / s + 1` for convolutions, `(in + 2p - k) / s + 1` for pooling.
//!
//! ggml's `conv_2d` is im2col to f16 followed by a matrix product, which converts the kernel to
//! f16 too (both stay f32 when the kernel is bf16). That rounding is part of ggml's result, so the
//! reference convolves the f16-rounded input and kernel (exactly, in f64) unless the kernel is
//! bf16; computing with the unrounded values differs from ggml by an nmse of about 5e-8.

use crate::error::Result;
use crate::graph::{Graph, FLOATS};
use crate::op::Op;
use crate::reference::{Dense, NodeRef};
use crate::shape::fmt_ne;
use crate::tensor::TensorId;
use crate::DType;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dParams {
    pub s0: usize,
    pub s1: usize,
    pub p0: usize,
    pub p1: usize,
    pub d0: usize,
    pub d1: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Im2colParams {
    pub s0: usize,
    pub s1: usize,
    pub p0: usize,
    pub p1: usize,
    pub d0: usize,
    pub d1: usize,
    pub is_2d: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolKind {
    Max,
    Avg,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pool2dParams {
    pub kind: PoolKind,
    pub k0: usize,
    pub k1: usize,
    pub s0: usize,
    pub s1: usize,
    pub p0: usize,
    pub p1: usize,
}

/// ggml's convolution output size, or `None` when the input is too small for the kernel.
fn conv_out(ins: usize, k: usize, s: usize, p: usize, d: usize) -> Option<usize> {
    if k == 0 {
        return None;
    }
    let span = d * (k - 1) + 1;
    (ins + 2 * p >= span).then(|| (ins + 2 * p - span) / s + 1)
}

/// ggml's pooling output size, or `None` when the padded input is smaller than the window.
fn pool_out(ins: usize, k: usize, s: usize, p: usize) -> Option<usize> {
    (ins + 2 * p >= k).then(|| (ins + 2 * p - k) / s + 1)
}

/// The input index that kernel tap `k` of output `o` reads, if it lies inside `0..len`.
#[inline]
fn tap(o: usize, k: usize, s: usize, p: usize, d: usize, len: usize) -> Option<usize> {
    let i = (o * s + k * d) as i64 - p as i64;
    (i >= 0 && (i as usize) < len).then_some(i as usize)
}

impl Graph {
    /// ggml's `conv_2d(kernel, input, s0, s1, p0, p1, d0, d1)`: kernel [KW, KH, Cin, Cout],
    /// input [W, H, Cin, N] → f32 [OW, OH, Cout, N], `OW = (W + 2p0 - d0(KW-1) - 1)/s0 + 1`
    /// (OH likewise); zero padding, stride `s`, dilation `d`. Like ggml, input and kernel are
    /// rounded to f16 first unless the kernel is bf16.
    #[allow(clippy::too_many_arguments)]
    pub fn conv_2d(
        &mut self,
        kernel: TensorId,
        input: TensorId,
        s0: usize,
        s1: usize,
        p0: usize,
        p1: usize,
        d0: usize,
        d1: usize,
    ) -> Result<TensorId> {
        const OP: &str = "conv_2d";
        let src = [kernel, input];
        self.check_types(OP, &src, &[FLOATS, FLOATS])?;
        let (kne, ine) = (self.ne(kernel), self.ne(input));
        if kne[2] != ine[2] {
            return Err(self.shape_err(
                OP,
                format!(
                    "kernel {} has {} input channels (ne[2]), the input {} has {}",
                    fmt_ne(&kne),
                    kne[2],
                    fmt_ne(&ine),
                    ine[2]
                ),
                &src,
            ));
        }
        if s0 == 0 || s1 == 0 || d0 == 0 || d1 == 0 {
            return Err(self.shape_err(
                OP,
                format!("strides ({s0}, {s1}) and dilations ({d0}, {d1}) must be at least 1"),
                &src,
            ));
        }
        let (ow, oh) = match (conv_out(ine[0], kne[0], s0, p0, d0), conv_out(ine[1], kne[1], s1, p1, d1)) {
            (Some(w), Some(h)) => (w, h),
            _ => {
                return Err(self.shape_err(
                    OP,
                    format!(
                        "input {} with padding ({p0}, {p1}) is smaller than the dilated kernel {} (dilation ({d0}, {d1}))",
                        fmt_ne(&ine),
                        fmt_ne(&kne)
                    ),
                    &src,
                ))
            }
        };
        let params = Conv2dParams {
            s0,
            s1,
            p0,
            p1,
            d0,
            d1,
        };
        Ok(self.node(
            Op::Conv2d(params),
            DType::F32,
            [ow, oh, kne[3], ine[3]],
            &src,
        ))
    }

    /// ggml's `im2col(kernel, input, …, is_2d, dst_type)`: unfolds each kernel-sized patch of
    /// the input into a row. 2-D: input [W, H, Cin, N] → [KW·KH·Cin, OW, OH, N] with element
    /// `ic·KH·KW + kh·KW + kw` of row `(ow, oh, n)` = `input[ow·s0 + kw·d0 - p0, oh·s1 + kh·d1 - p1,
    /// ic, n]` (0 outside). 1-D: input [W, Cin, N] → [KW·Cin, OW, N] (s1, p1, d1 unused; p1 must
    /// be 0). The kernel (any type) gives only its shape: KW = ne[0], KH = ne[1], Cin = ne[2]
    /// (1-D: Cin = ne[1]). `dst_type` is f32, f16 or bf16.
    #[allow(clippy::too_many_arguments)]
    pub fn im2col(
        &mut self,
        kernel: TensorId,
        input: TensorId,
        s0: usize,
        s1: usize,
        p0: usize,
        p1: usize,
        d0: usize,
        d1: usize,
        is_2d: bool,
        dst_type: DType,
    ) -> Result<TensorId> {
        const OP: &str = "im2col";
        let src = [kernel, input];
        self.check_id(OP, kernel)?;
        self.check_id(OP, input)?;
        if !FLOATS.contains(&self.dtype(input)) {
            return Err(self.shape_err(
                OP,
                format!(
                    "input has type {}, expected f32/f16/bf16",
                    self.dtype(input)
                ),
                &src,
            ));
        }
        if !FLOATS.contains(&dst_type) {
            return Err(self.shape_err(
                OP,
                format!("dst_type {dst_type} is not f32, f16 or bf16"),
                &src,
            ));
        }
        let (kne, ine) = (self.ne(kernel), self.ne(input));
        let cin_dim = if is_2d { 2 } else { 1 };
        if kne[cin_dim] != ine[cin_dim] || (!is_2d && ine[3] != 1) {
            return Err(self.shape_err(
                OP,
                format!(
                    "kernel {} and input {} must have the same channel count in ne[{cin_dim}]{}",
                    fmt_ne(&kne),
                    fmt_ne(&ine),
                    if is_2d {
                        ""
                    } else {
                        " and a 1-D input must be [W, Cin, N, 1]"
                    }
                ),
                &src,
            ));
        }
        if s0 == 0 || d0 == 0 || (is_2d && (s1 == 0 || d1 == 0)) {
            return Err(self.shape_err(
                OP,
                format!("strides ({s0}, {s1}) and dilations ({d0}, {d1}) must be at least 1 (dim 1 only in 2-D)"),
                &src,
            ));
        }
        if !is_2d && p1 != 0 {
            return Err(self.shape_err(
                OP,
                format!("a 1-D im2col takes no padding in dim 1, got p1 = {p1}"),
                &src,
            ));
        }
        let ow = conv_out(ine[0], kne[0], s0, p0, d0);
        let oh = if is_2d {
            conv_out(ine[1], kne[1], s1, p1, d1)
        } else {
            Some(1)
        };
        let (ow, oh) = match (ow, oh) {
            (Some(w), Some(h)) if w > 0 && h > 0 => (w, h),
            _ => {
                return Err(self.shape_err(
                    OP,
                    format!(
                        "input {} with padding ({p0}, {p1}) is smaller than the dilated kernel {}",
                        fmt_ne(&ine),
                        fmt_ne(&kne)
                    ),
                    &src,
                ))
            }
        };
        let ne = if is_2d {
            [kne[0] * kne[1] * kne[2], ow, oh, ine[3]]
        } else {
            [kne[0] * kne[1], ow, ine[2], 1]
        };
        let params = Im2colParams {
            s0,
            s1,
            p0,
            p1,
            d0,
            d1,
            is_2d,
        };
        Ok(self.node(Op::Im2col(params), dst_type, ne, &src))
    }

    /// ggml's `pool_2d(a, kind, k0, k1, s0, s1, p0, p1)`: a [W, H, C, N] → f32 [OW, OH, C, N],
    /// `OW = (W + 2p0 - k0)/s0 + 1`. Max takes the largest value inside the image (−FLT_MAX when
    /// the window holds none); avg sums the values inside the image and divides by `k0·k1`, so
    /// padding counts as zeros.
    #[allow(clippy::too_many_arguments)]
    pub fn pool_2d(
        &mut self,
        a: TensorId,
        kind: PoolKind,
        k0: usize,
        k1: usize,
        s0: usize,
        s1: usize,
        p0: usize,
        p1: usize,
    ) -> Result<TensorId> {
        const OP: &str = "pool_2d";
        self.check_types(OP, &[a], &[FLOATS])?;
        if k0 == 0 || k1 == 0 || s0 == 0 || s1 == 0 {
            return Err(self.shape_err(
                OP,
                format!("window ({k0}, {k1}) and strides ({s0}, {s1}) must be at least 1"),
                &[a],
            ));
        }
        let ne = self.ne(a);
        let (ow, oh) = match (pool_out(ne[0], k0, s0, p0), pool_out(ne[1], k1, s1, p1)) {
            (Some(w), Some(h)) => (w, h),
            _ => {
                return Err(self.shape_err(
                    OP,
                    format!(
                    "input {} with padding ({p0}, {p1}) is smaller than the window ({k0}, {k1})",
                    fmt_ne(&ne)
                ),
                    &[a],
                ))
            }
        };
        let params = Pool2dParams {
            kind,
            k0,
            k1,
            s0,
            s1,
            p0,
            p1,
        };
        Ok(self.node(Op::Pool2d(params), DType::F32, [ow, oh, ne[2], ne[3]], &[a]))
    }
}

/// `d` rounded to f16 (round to nearest even, as ggml converts).
impl Graph {
    /// Gradient of `conv_2d(kernel, input, …)` w.r.t. the kernel (`wrt_kernel`) or the input;
    /// `grad` has the convolution's output shape. f32 result of that operand's shape.
    pub fn conv_2d_back(
        &mut self,
        grad: TensorId,
        kernel: TensorId,
        input: TensorId,
        p: Conv2dParams,
        wrt_kernel: bool,
    ) -> Result<TensorId> {
        const OP: &str = "conv_2d_back";
        self.check_types(OP, &[grad, kernel, input], &[&[DType::F32], FLOATS, FLOATS])?;
        let ne = self.ne(if wrt_kernel { kernel } else { input });
        Ok(self.node(
            Op::Conv2dBack { p, wrt_kernel },
            DType::F32,
            ne,
            &[grad, kernel, input],
        ))
    }

    /// Gradient of `im2col(kernel, input, …)` w.r.t. the input: every column entry added back
    /// to the input element it was copied from.
    pub fn im2col_back(
        &mut self,
        grad: TensorId,
        kernel: TensorId,
        input: TensorId,
        p: Im2colParams,
    ) -> Result<TensorId> {
        const OP: &str = "im2col_back";
        self.check_types(OP, &[grad], &[&[DType::F32]])?;
        self.check_id(OP, kernel)?;
        self.check_id(OP, input)?;
        let ne = self.ne(input);
        Ok(self.node(Op::Im2colBack(p), DType::F32, ne, &[grad, kernel, input]))
    }

    /// Gradient of `pool_2d(a, …)` w.r.t. `a`: max pooling routes each gradient to the element
    /// the forward op picked, average pooling spreads it over the window.
    pub fn pool_2d_back(
        &mut self,
        grad: TensorId,
        a: TensorId,
        p: Pool2dParams,
    ) -> Result<TensorId> {
        const OP: &str = "pool_2d_back";
        self.check_types(OP, &[grad, a], &[&[DType::F32], FLOATS])?;
        let ne = self.ne(a);
        Ok(self.node(Op::Pool2dBack(p), DType::F32, ne, &[grad, a]))
    }
}

fn to_f16(d: &Dense) -> Dense {
    Dense {
        ne: d.ne,
        data: d
            .data
            .iter()
            .map(|&v| half::f16::from_f32(v as f32).to_f64())
            .collect(),
    }
}

pub(crate) fn reference(n: &NodeRef, src: &[Dense]) -> Result<Dense> {
    let ne = n.t.ne;
    match n.t.op {
        Op::Conv2d(p) => {
            let (k, x) = if n.src(0).dtype == DType::BF16 {
                (src[0].clone(), src[1].clone())
            } else {
                (to_f16(&src[0]), to_f16(&src[1]))
            };
            let (kw, kh, cin) = (k.ne[0], k.ne[1], k.ne[2]);
            Ok(Dense::from_fn(ne, |ow, oh, oc, b| {
                let mut s = 0.0;
                for ic in 0..cin {
                    for ky in 0..kh {
                        let Some(iy) = tap(oh, ky, p.s1, p.p1, p.d1, x.ne[1]) else {
                            continue;
                        };
                        for kx in 0..kw {
                            if let Some(ix) = tap(ow, kx, p.s0, p.p0, p.d0, x.ne[0]) {
                                s += k.at(kx, ky, ic, oc) * x.at(ix, iy, ic, b);
                            }
                        }
                    }
                }
                s
            }))
        }
        Op::Im2col(p) => {
            let x = &src[1];
            let kt = n.src(0);
            let (kw, kh) = (kt.ne[0], if p.is_2d { kt.ne[1] } else { 1 });
            Ok(Dense::from_fn(ne, |i0, ow, i2, i3| {
                let (kx, ky, ic) = (i0 % kw, i0 / kw % kh, i0 / (kw * kh));
                let ix = tap(ow, kx, p.s0, p.p0, p.d0, x.ne[0]);
                if p.is_2d {
                    // i2 = oh, i3 = n
                    match (ix, tap(i2, ky, p.s1, p.p1, p.d1, x.ne[1])) {
                        (Some(ix), Some(iy)) => x.at(ix, iy, ic, i3),
                        _ => 0.0,
                    }
                } else {
                    // input [W, Cin, N]: i2 = n
                    ix.map_or(0.0, |ix| x.at(ix, ic, i2, 0))
                }
            }))
        }
        Op::Pool2d(p) => {
            let a = &src[0];
            Ok(Dense::from_fn(ne, |ox, oy, c, b| {
                let mut res = match p.kind {
                    PoolKind::Max => -(f32::MAX as f64),
                    PoolKind::Avg => 0.0,
                };
                for ky in 0..p.k1 {
                    let Some(iy) = tap(oy, ky, p.s1, p.p1, 1, a.ne[1]) else {
                        continue;
                    };
                    for kx in 0..p.k0 {
                        let Some(ix) = tap(ox, kx, p.s0, p.p0, 1, a.ne[0]) else {
                            continue;
                        };
                        let v = a.at(ix, iy, c, b);
                        res = match p.kind {
                            // std::max(v, res) as ggml writes it: a NaN input wins
                            PoolKind::Max => {
                                if v < res {
                                    res
                                } else {
                                    v
                                }
                            }
                            PoolKind::Avg => res + v,
                        };
                    }
                }
                match p.kind {
                    PoolKind::Max => res,
                    PoolKind::Avg => res / (p.k0 * p.k1) as f64,
                }
            }))
        }
        Op::Conv2dBack { p, wrt_kernel } => {
            let g = &src[0];
            let (k, x) = if n.src(1).dtype == DType::BF16 {
                (src[1].clone(), src[2].clone())
            } else {
                (to_f16(&src[1]), to_f16(&src[2]))
            };
            let (kw, kh, cin) = (k.ne[0], k.ne[1], k.ne[2]);
            let mut out = Dense::zeros(ne);
            Dense::for_each_index(&g.ne, |ow, oh, oc, b| {
                let gv = g.at(ow, oh, oc, b);
                for ic in 0..cin {
                    for ky in 0..kh {
                        let Some(iy) = tap(oh, ky, p.s1, p.p1, p.d1, x.ne[1]) else {
                            continue;
                        };
                        for kx in 0..kw {
                            if let Some(ix) = tap(ow, kx, p.s0, p.p0, p.d0, x.ne[0]) {
                                if wrt_kernel {
                                    let i = out.idx(kx, ky, ic, oc);
                                    out.data[i] += gv * x.at(ix, iy, ic, b);
                                } else {
                                    let i = out.idx(ix, iy, ic, b);
                                    out.data[i] += gv * k.at(kx, ky, ic, oc);
                                }
                            }
                        }
                    }
                }
            });
            Ok(out)
        }
        Op::Im2colBack(p) => {
            let g = &src[0];
            let kt = n.src(1);
            let (kw, kh) = (kt.ne[0], if p.is_2d { kt.ne[1] } else { 1 });
            let xne = ne;
            let mut out = Dense::zeros(ne);
            Dense::for_each_index(&g.ne, |i0, ow, i2, i3| {
                let (kx, ky, ic) = (i0 % kw, i0 / kw % kh, i0 / (kw * kh));
                let gv = g.at(i0, ow, i2, i3);
                let ix = tap(ow, kx, p.s0, p.p0, p.d0, xne[0]);
                if p.is_2d {
                    if let (Some(ix), Some(iy)) = (ix, tap(i2, ky, p.s1, p.p1, p.d1, xne[1])) {
                        let i = out.idx(ix, iy, ic, i3);
                        out.data[i] += gv;
                    }
                } else if let Some(ix) = ix {
                    let i = out.idx(ix, ic, i2, 0);
                    out.data[i] += gv;
                }
            });
            Ok(out)
        }
        Op::Pool2dBack(p) => {
            let (g, a) = (&src[0], &src[1]);
            let mut out = Dense::zeros(ne);
            Dense::for_each_index(&g.ne, |ox, oy, c, b| {
                let gv = g.at(ox, oy, c, b);
                let mut best: Option<(usize, usize)> = None;
                let mut res = -(f32::MAX as f64);
                for ky in 0..p.k1 {
                    let Some(iy) = tap(oy, ky, p.s1, p.p1, 1, a.ne[1]) else {
                        continue;
                    };
                    for kx in 0..p.k0 {
                        let Some(ix) = tap(ox, kx, p.s0, p.p0, 1, a.ne[0]) else {
                            continue;
                        };
                        match p.kind {
                            PoolKind::Max => {
                                let v = a.at(ix, iy, c, b);
                                if !(v < res) {
                                    res = v;
                                    best = Some((ix, iy));
                                }
                            }
                            PoolKind::Avg => {
                                let i = out.idx(ix, iy, c, b);
                                out.data[i] += gv / (p.k0 * p.k1) as f64;
                            }
                        }
                    }
                }
                if let Some((ix, iy)) = best {
                    let i = out.idx(ix, iy, c, b);
                    out.data[i] += gv;
                }
            });
            Ok(out)
        }
        _ => Err(n.err("not a convolution or pooling op")),
    }
}

impl Graph {
    /// Backward of conv_2d (both operands), im2col (its input) and pool_2d, through their
    /// `*_back` nodes. conv_2d rounds its operands to f16 like ggml; the rounding is treated
    /// as the identity (its derivative almost everywhere).
    pub(crate) fn backward_conv(
        &mut self,
        bw: &crate::autodiff::Bw,
    ) -> Result<crate::autodiff::Grads> {
        let t = self.tensor(bw.node).clone();
        let g = self.contig(bw.grad)?;
        match t.op {
            Op::Conv2d(p) => {
                let (k, x) = (t.src[0], t.src[1]);
                let gk = if bw.wants(0) {
                    Some(self.conv_2d_back(g, k, x, p, true)?)
                } else {
                    None
                };
                let gx = if bw.wants(1) {
                    Some(self.conv_2d_back(g, k, x, p, false)?)
                } else {
                    None
                };
                Ok(vec![gk, gx])
            }
            Op::Im2col(p) => {
                if bw.wants(0) {
                    return Err(self.not_diff(bw.node, 0, "im2col uses only the kernel's shape"));
                }
                Ok(vec![
                    None,
                    Some(self.im2col_back(g, t.src[0], t.src[1], p)?),
                ])
            }
            Op::Pool2d(p) => Ok(vec![Some(self.pool_2d_back(g, t.src[0], p)?)]),
            _ => Err(self.not_diff(bw.node, 0, "not a convolution")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PoolKind;
    use crate::ops::testutil::*;
    use crate::*;

    /// Direct convolution from the definition; `k` [KW, KH, Cin, Cout], `x` [W, H, Cin, N].
    #[allow(clippy::too_many_arguments)]
    /// With `f16`, input and kernel are rounded to f16 first, as ggml's conv_2d does.
    fn conv_want(
        k: &[f32],
        kne: [usize; 4],
        x: &[f32],
        xne: [usize; 4],
        s: [usize; 2],
        p: [usize; 2],
        d: [usize; 2],
        f16: bool,
    ) -> (Vec<f64>, [usize; 2]) {
        let r = |v: f32| {
            if f16 {
                half::f16::from_f32(v).to_f64()
            } else {
                v as f64
            }
        };
        let ow = (xne[0] + 2 * p[0] - d[0] * (kne[0] - 1) - 1) / s[0] + 1;
        let oh = (xne[1] + 2 * p[1] - d[1] * (kne[1] - 1) - 1) / s[1] + 1;
        let mut out = vec![];
        for b in 0..xne[3] {
            for oc in 0..kne[3] {
                for y in 0..oh {
                    for xx in 0..ow {
                        let mut sum = 0.0;
                        for ic in 0..kne[2] {
                            for ky in 0..kne[1] {
                                for kx in 0..kne[0] {
                                    let iy = (y * s[1] + ky * d[1]) as i64 - p[1] as i64;
                                    let ix = (xx * s[0] + kx * d[0]) as i64 - p[0] as i64;
                                    if iy < 0
                                        || ix < 0
                                        || iy >= xne[1] as i64
                                        || ix >= xne[0] as i64
                                    {
                                        continue;
                                    }
                                    let kv = r(k[((oc * kne[2] + ic) * kne[1] + ky) * kne[0] + kx]);
                                    let xv = r(x[((b * xne[2] + ic) * xne[1] + iy as usize)
                                        * xne[0]
                                        + ix as usize]);
                                    sum += kv * xv;
                                }
                            }
                        }
                        out.push(sum);
                    }
                }
            }
        }
        (out, [ow, oh])
    }

    #[test]
    fn conv_2d_by_hand() {
        // 1 channel 3x3 image 1..9, 2x2 kernel [[1, 0], [0, -1]] (kx, ky), no padding:
        // out(x, y) = img(x, y) - img(x+1, y+1) = -4 everywhere
        let mut g = Graph::new();
        let k = g.new_f32(&[2, 2, 1, 1]).unwrap();
        let x = g.new_f32(&[3, 3, 1, 1]).unwrap();
        let c = g.conv_2d(k, x, 1, 1, 0, 0, 1, 1).unwrap();
        assert_eq!(g.ne(c), [2, 2, 1, 1]);
        let out = run1(
            g,
            &[
                (k, vec![1., 0., 0., -1.]),
                (x, (1..=9).map(|v| v as f32).collect()),
            ],
            c,
        );
        assert_eq!(out, vec![-4., -4., -4., -4.]);
    }

    #[test]
    fn conv_2d_random_with_stride_padding_dilation() {
        let mut rng = Rng::new(21);
        for (kne, xne, s, p, d) in [
            ([3, 3, 2, 4], [10, 9, 2, 1], [1, 1], [1, 1], [1, 1]),
            ([3, 1, 3, 2], [17, 5, 3, 2], [2, 1], [0, 2], [1, 1]),
            ([2, 3, 1, 3], [7, 8, 1, 1], [3, 2], [1, 0], [2, 3]),
            ([1, 1, 1, 1], [1, 1, 1, 1], [1, 1], [0, 0], [1, 1]),
        ] {
            let mut g = Graph::new();
            let k = g.new_f32(&kne).unwrap();
            let x = g.new_f32(&xne).unwrap();
            let c = g.conv_2d(k, x, s[0], s[1], p[0], p[1], d[0], d[1]).unwrap();
            let kv = rng.vec(kne.iter().product(), -1.0, 1.0);
            let xv = rng.vec(xne.iter().product(), -1.0, 1.0);
            let (want, [ow, oh]) = conv_want(&kv, kne, &xv, xne, s, p, d, true);
            assert_eq!(g.ne(c), [ow, oh, kne[3], xne[3]]);
            let out = run1(g, &[(k, kv), (x, xv)], c);
            assert_close(&out, &want, 1e-6);
        }
    }

    #[test]
    fn conv_2d_on_a_permuted_f16_input() {
        // the input is a permuted view of an f16 [C, W, H] tensor -> [W, H, C]
        let mut rng = Rng::new(4);
        let mut g = Graph::new();
        let k = g.new_f32(&[2, 2, 3, 2]).unwrap();
        let raw = g.new_tensor(DType::F16, &[3, 5, 4]).unwrap();
        let x = g.permute(raw, [2, 0, 1, 3]).unwrap();
        assert_eq!(g.ne(x), [5, 4, 3, 1]);
        let c = g.conv_2d(k, x, 1, 1, 1, 0, 1, 1).unwrap();
        let kv = rng.vec(24, -1.0, 1.0);
        let rv: Vec<f32> = rng
            .vec(60, -1.0, 1.0)
            .iter()
            .map(|&v| half::f16::from_f32(v).to_f32())
            .collect();
        // logical [W, H, C] order of the permuted view
        let mut xv = vec![0.0f32; 60];
        for h in 0..4 {
            for w in 0..5 {
                for ch in 0..3 {
                    xv[(ch * 4 + h) * 5 + w] = rv[(h * 5 + w) * 3 + ch];
                }
            }
        }
        let (want, _) = conv_want(
            &kv,
            [2, 2, 3, 2],
            &xv,
            [5, 4, 3, 1],
            [1, 1],
            [1, 0],
            [1, 1],
            true,
        );
        let out = run1(g, &[(k, kv), (raw, rv)], c);
        assert_close(&out, &want, 1e-6);
    }

    #[test]
    fn conv_2d_rounds_to_f16_like_ggml_except_with_a_bf16_kernel() {
        // 1x1 kernel: out = k * x; 0.1 * 0.3 in f16 is not 0.1 * 0.3 in f32
        for (kdt, f16) in [(DType::F32, true), (DType::F16, true), (DType::BF16, false)] {
            let mut g = Graph::new();
            let k = g.new_tensor(kdt, &[1, 1, 1, 1]).unwrap();
            let x = g.new_f32(&[3, 1, 1, 1]).unwrap();
            let c = g.conv_2d(k, x, 1, 1, 0, 0, 1, 1).unwrap();
            let kv = half::bf16::from_f32(0.1).to_f32(); // exact in bf16; not in f16
            let xv = vec![0.3f32, -1.7, 1000.1];
            let (want, _) = conv_want(
                &[kv],
                [1, 1, 1, 1],
                &xv,
                [3, 1, 1, 1],
                [1, 1],
                [0, 0],
                [1, 1],
                f16,
            );
            let out = run1(g, &[(k, vec![kv]), (x, xv)], c);
            assert_close(&out, &want, 1e-7);
            let exact: Vec<f64> = [0.3f32, -1.7, 1000.1]
                .iter()
                .map(|&v| v as f64 * kv as f64)
                .collect();
            assert_eq!(f16, (out[2] as f64 - exact[2]).abs() > 1e-3, "{kdt}");
        }
    }

    #[test]
    fn conv_2d_errors() {
        let mut g = Graph::new();
        let k = g.new_f32(&[3, 3, 2, 4]).unwrap();
        let x = g.new_f32(&[10, 9, 3]).unwrap();
        let e = g.conv_2d(k, x, 1, 1, 0, 0, 1, 1).unwrap_err().to_string();
        assert!(
            e.starts_with("conv_2d:") && e.contains("[3, 3, 2, 4]") && e.contains("[10, 9, 3, 1]"),
            "{e}"
        );
        let x = g.new_f32(&[2, 9, 2]).unwrap();
        let e = g.conv_2d(k, x, 1, 1, 0, 0, 1, 1).unwrap_err().to_string();
        assert!(e.contains("smaller than the dilated kernel"), "{e}");
        let x = g.new_f32(&[5, 5, 2]).unwrap();
        assert!(g
            .conv_2d(k, x, 0, 1, 0, 0, 1, 1)
            .unwrap_err()
            .to_string()
            .contains("at least 1"));
    }

    #[test]
    fn im2col_2d_matches_its_definition_and_conv() {
        // ggml's conv_2d is mul_mat(reshape(im2col to f16) [KW*KH*Cin, OW*OH*N],
        // reshape(kernel) [KW*KH*Cin, Cout]) -> [OW*OH*N, Cout], then a permute
        let mut rng = Rng::new(8);
        let (kne, xne) = ([3, 2, 2, 3], [6, 5, 2, 2]);
        let mut g = Graph::new();
        let k = g.new_f32(&kne).unwrap();
        let x = g.new_f32(&xne).unwrap();
        let col = g.im2col(k, x, 2, 1, 1, 1, 1, 2, true, DType::F32).unwrap();
        let (ow, oh) = ((6 + 2 - 2 - 1) / 2 + 1, (5 + 2 - 2 - 1) + 1);
        assert_eq!(g.ne(col), [12, ow, oh, 2]);
        let k2 = g.reshape(k, &[12, 3]).unwrap();
        let col16 = g.im2col(k, x, 2, 1, 1, 1, 1, 2, true, DType::F16).unwrap();
        let col2 = g.reshape(col16, &[12, ow * oh * 2]).unwrap();
        let mm = g.mul_mat(col2, k2).unwrap(); // [(OW, OH, N), Cout]
        let conv = g.conv_2d(k, x, 2, 1, 1, 1, 1, 2).unwrap();
        let kv = rng.vec(36, -1.0, 1.0);
        let xv = rng.vec(120, -1.0, 1.0);
        let mut s = Session::new(g, &[col, mm, conv]).unwrap();
        s.set_f32(k, &kv).unwrap();
        s.set_f32(x, &xv).unwrap();
        s.compute(&ReferenceBackend).unwrap();
        let got = s.get_f32(col).unwrap();
        for b in 0..2 {
            for y in 0..oh {
                for xx in 0..ow {
                    for ic in 0..2 {
                        for ky in 0..2 {
                            for kx in 0..3 {
                                let ix = (xx * 2 + kx) as i64 - 1;
                                let iy = (y + ky * 2) as i64 - 1;
                                let want = if ix < 0 || iy < 0 || ix >= 6 || iy >= 5 {
                                    0.0
                                } else {
                                    xv[((b * 2 + ic) * 5 + iy as usize) * 6 + ix as usize]
                                };
                                let i0 = (ic * 2 + ky) * 3 + kx;
                                assert_eq!(got[((b * oh + y) * ow + xx) * 12 + i0], want);
                            }
                        }
                    }
                }
            }
        }
        // mm[(xx, y, b), oc] = conv[xx, y, oc, b]
        let (mm, conv) = (s.get_f32(mm).unwrap(), s.get_f32(conv).unwrap());
        let want: Vec<f64> = (0..mm.len())
            .map(|i| {
                let (r, oc) = (i % (ow * oh * 2), i / (ow * oh * 2));
                let (xx, y, b) = (r % ow, r / ow % oh, r / (ow * oh));
                conv[((b * 3 + oc) * oh + y) * ow + xx] as f64
            })
            .collect();
        assert_close(&mm, &want, 1e-6);
    }

    #[test]
    fn im2col_1d_and_f16_output() {
        // input [W=5, Cin=2, N=2], kernel [KW=3, Cin=2, Cout=1], s0 = 2, p0 = 1
        let mut g = Graph::new();
        let k = g.new_tensor(DType::F16, &[3, 2, 1]).unwrap();
        let x = g.new_f32(&[5, 2, 2]).unwrap();
        let col = g.im2col(k, x, 2, 0, 1, 0, 1, 0, false, DType::F16).unwrap();
        assert_eq!(g.ne(col), [6, 3, 2, 1]);
        assert_eq!(g.dtype(col), DType::F16);
        let xv: Vec<f32> = (0..20).map(|v| v as f32 + 0.1).collect();
        let out = run1(g, &[(k, vec![0.0; 6]), (x, xv.clone())], col);
        let mut want = vec![];
        for b in 0..2 {
            for o in 0..3 {
                for ic in 0..2 {
                    for kx in 0..3 {
                        let ix = (o * 2 + kx) as i64 - 1;
                        let v = if (0..5).contains(&ix) {
                            xv[(b * 2 + ic) * 5 + ix as usize]
                        } else {
                            0.0
                        };
                        want.push(half::f16::from_f32(v).to_f64());
                    }
                }
            }
        }
        assert_close(&out, &want, 0.0);
    }

    #[test]
    fn im2col_errors() {
        let mut g = Graph::new();
        let k = g.new_f32(&[3, 3, 2, 4]).unwrap();
        let x = g.new_f32(&[10, 9, 3]).unwrap();
        let e = g
            .im2col(k, x, 1, 1, 0, 0, 1, 1, true, DType::F32)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("im2col:") && e.contains("[3, 3, 2, 4]") && e.contains("[10, 9, 3, 1]"),
            "{e}"
        );
        let x = g.new_f32(&[10, 9, 2]).unwrap();
        let e = g
            .im2col(k, x, 1, 1, 0, 0, 1, 1, true, DType::I32)
            .unwrap_err()
            .to_string();
        assert!(e.contains("dst_type i32"), "{e}");
    }

    #[test]
    fn pool_2d_max_and_avg_by_hand() {
        // 3x3 image 1..9; 2x2 windows, stride 1, padding 1 -> 4x4 output
        let mut g = Graph::new();
        let a = g.new_f32(&[3, 3]).unwrap();
        let mx = g.pool_2d(a, PoolKind::Max, 2, 2, 1, 1, 1, 1).unwrap();
        let av = g.pool_2d(a, PoolKind::Avg, 2, 2, 1, 1, 1, 1).unwrap();
        assert_eq!(g.ne(mx), [4, 4, 1, 1]);
        let mut s = Session::new(g, &[mx, av]).unwrap();
        s.set_f32(a, &(1..=9).map(|v| v as f32).collect::<Vec<_>>())
            .unwrap();
        s.compute(&ReferenceBackend).unwrap();
        let img = |x: i64, y: i64| {
            if (0..3).contains(&x) && (0..3).contains(&y) {
                (y * 3 + x + 1) as f64
            } else {
                0.0
            }
        };
        let (mut wmax, mut wavg) = (vec![], vec![]);
        for oy in 0..4i64 {
            for ox in 0..4i64 {
                let win = [(ox - 1, oy - 1), (ox, oy - 1), (ox - 1, oy), (ox, oy)];
                wmax.push(win.iter().map(|&(x, y)| img(x, y)).fold(0.0, f64::max)); // inputs > 0
                wavg.push(win.iter().map(|&(x, y)| img(x, y)).sum::<f64>() / 4.0);
                // padding counts
            }
        }
        assert_close(&s.get_f32(mx).unwrap(), &wmax, 0.0);
        assert_close(&s.get_f32(av).unwrap(), &wavg, 1e-7);
    }

    #[test]
    fn pool_2d_random_f16_view_and_empty_windows() {
        let mut rng = Rng::new(13);
        // a transposed f16 view [5, 7, 3]; 3x2 windows, strides (2, 3), padding (1, 1)
        let mut g = Graph::new();
        let raw = g.new_tensor(DType::F16, &[7, 5, 3]).unwrap();
        let a = g.transpose(raw).unwrap();
        let mx = g.pool_2d(a, PoolKind::Max, 3, 2, 2, 3, 1, 1).unwrap();
        let av = g.pool_2d(a, PoolKind::Avg, 3, 2, 2, 3, 1, 1).unwrap();
        let (ow, oh) = ((5 + 2 - 3) / 2 + 1, (7 + 2 - 2) / 3 + 1);
        assert_eq!(g.ne(mx), [ow, oh, 3, 1]);
        // k = 1 with padding 1: the corner windows lie wholly in the padding
        let b = g.new_f32(&[2, 2]).unwrap();
        let empty = g.pool_2d(b, PoolKind::Max, 1, 1, 1, 1, 1, 1).unwrap();
        let rv: Vec<f32> = rng
            .vec(105, -3.0, 3.0)
            .iter()
            .map(|&v| half::f16::from_f32(v).to_f32())
            .collect();
        let mut s = Session::new(g, &[mx, av, empty]).unwrap();
        s.set_f32(raw, &rv).unwrap();
        s.set_f32(b, &[1., 2., 3., 4.]).unwrap();
        s.compute(&ReferenceBackend).unwrap();
        let (mut wmax, mut wavg) = (vec![], vec![]);
        for c in 0..3 {
            for oy in 0..oh {
                for ox in 0..ow {
                    let (mut m, mut sum) = (f64::NEG_INFINITY, 0.0);
                    for ky in 0..2 {
                        for kx in 0..3 {
                            let (x, y) = ((ox * 2 + kx) as i64 - 1, (oy * 3 + ky) as i64 - 1);
                            if (0..5).contains(&x) && (0..7).contains(&y) {
                                // a[x, y, c] = raw[y, x, c]
                                let v = rv[(c * 5 + x as usize) * 7 + y as usize] as f64;
                                m = m.max(v);
                                sum += v;
                            }
                        }
                    }
                    wmax.push(m);
                    wavg.push(sum / 6.0);
                }
            }
        }
        assert_close(&s.get_f32(mx).unwrap(), &wmax, 0.0);
        assert_close(&s.get_f32(av).unwrap(), &wavg, 1e-6);
        let e = s.get_f32(empty).unwrap();
        assert_eq!(e.len(), 16);
        assert_eq!(e[0], -f32::MAX);
        assert_eq!(e[5], 1.0);
    }

    #[test]
    fn pool_2d_errors() {
        let mut g = Graph::new();
        let a = g.new_f32(&[3, 3]).unwrap();
        let e = g
            .pool_2d(a, PoolKind::Avg, 4, 2, 1, 1, 0, 0)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("pool_2d:") && e.contains("[3, 3, 1, 1]") && e.contains("window (4, 2)"),
            "{e}"
        );
        assert!(g.pool_2d(a, PoolKind::Max, 2, 2, 0, 1, 0, 0).is_err());
        let i = g.new_tensor(DType::I32, &[3, 3]).unwrap();
        assert!(g
            .pool_2d(i, PoolKind::Max, 2, 2, 1, 1, 0, 0)
            .unwrap_err()
            .to_string()
            .contains("type i32"));
    }
}
