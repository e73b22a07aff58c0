//! pad, upscale, arange, timestep_embedding.
//!
//! `upscale` picks source pixels with ggml's f32 arithmetic (`i / (ne / ne_src)` truncated, and
//! for bilinear ggml's half-pixel coordinates), so that the same source pixels are chosen as in
//! ggml for every size; the values are then combined in f64.

use crate::error::Result;
use crate::graph::{Graph, F32_ONLY, FLOATS};
use crate::op::Op;
use crate::reference::{Dense, NodeRef};
use crate::shape::fmt_ne;
use crate::tensor::TensorId;
use crate::DType;

/// How `upscale` interpolates (ggml's `ggml_scale_mode`, without flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UpscaleMode {
    /// Each output pixel copies the source pixel it falls in.
    Nearest,
    /// Bilinear in dims 0 and 1 with half-pixel centres (PyTorch's `align_corners=False`),
    /// clamped at the edges; nearest in dims 2 and 3.
    Bilinear,
}

impl Graph {
    /// ggml's `pad(a, p0, p1, p2, p3)`: `a` with `p_i` zeros appended at the end of dim `i`; the
    /// result [ne0 + p0, ne1 + p1, ne2 + p2, ne3 + p3] has `a`'s type.
    pub fn pad(
        &mut self,
        a: TensorId,
        p0: usize,
        p1: usize,
        p2: usize,
        p3: usize,
    ) -> Result<TensorId> {
        self.check_types("pad", &[a], &[FLOATS])?;
        let (dt, ne) = (self.dtype(a), self.ne(a));
        let p = [p0, p1, p2, p3];
        let out = [ne[0] + p0, ne[1] + p1, ne[2] + p2, ne[3] + p3];
        Ok(self.node(Op::Pad { p }, dt, out, &[a]))
    }

    /// ggml's `upscale(a, scale_factor, nearest)`: f32 `a` [ne0, ne1, ne2, ne3] →
    /// [ne0·sf, ne1·sf, ne2, ne3], each pixel repeated `sf × sf` times. `sf` must exceed 1.
    pub fn upscale(&mut self, a: TensorId, scale_factor: usize) -> Result<TensorId> {
        self.check_types("upscale", &[a], &[F32_ONLY])?;
        if scale_factor < 2 {
            return Err(self.shape_err(
                "upscale",
                format!("scale_factor must be at least 2, got {scale_factor}"),
                &[a],
            ));
        }
        let ne = self.ne(a);
        self.upscale_ext(
            a,
            ne[0] * scale_factor,
            ne[1] * scale_factor,
            ne[2],
            ne[3],
            UpscaleMode::Nearest,
        )
    }

    /// ggml's `upscale_ext` / `interpolate`: resizes f32 `a` to [ne0, ne1, ne2, ne3] (up or
    /// down). Nearest: output index `i` reads source index `trunc(i / (ne / ne_src))` in every
    /// dim; bilinear: see [`UpscaleMode::Bilinear`].
    pub fn upscale_ext(
        &mut self,
        a: TensorId,
        ne0: usize,
        ne1: usize,
        ne2: usize,
        ne3: usize,
        mode: UpscaleMode,
    ) -> Result<TensorId> {
        const OP: &str = "upscale";
        self.check_types(OP, &[a], &[F32_ONLY])?;
        let out = [ne0, ne1, ne2, ne3];
        let ne = self.ne(a);
        if out.contains(&0) || ne.contains(&0) {
            return Err(self.shape_err(
                OP,
                format!(
                    "cannot resize {} to {}: every size must be at least 1",
                    fmt_ne(&ne),
                    fmt_ne(&out)
                ),
                &[a],
            ));
        }
        Ok(self.node(Op::Upscale { mode }, DType::F32, out, &[a]))
    }

    /// ggml's `arange(start, stop, step)`: f32 [ceil((stop - start) / step)] holding
    /// `start + i·step`. Needs `stop > start` and `step > 0`; the length is computed in f32 as
    /// ggml does.
    pub fn arange(&mut self, start: f32, stop: f32, step: f32) -> Result<TensorId> {
        let bad = |msg: String| crate::Error::Shape {
            op: "arange",
            msg,
            inputs: String::new(),
        };
        if !(start.is_finite() && stop.is_finite() && step.is_finite())
            || stop <= start
            || step <= 0.0
        {
            return Err(bad(format!(
                "start {start}, stop {stop}, step {step}: need finite values with stop > start and step > 0"
            )));
        }
        let steps = ((stop - start) / step).ceil();
        if !(1.0..=(1u64 << 31) as f32).contains(&steps) {
            return Err(bad(format!(
                "start {start}, stop {stop}, step {step} give {steps} elements"
            )));
        }
        Ok(self.node(
            Op::Arange { start, stop, step },
            DType::F32,
            [steps as usize, 1, 1, 1],
            &[],
        ))
    }

    /// ggml's `timestep_embedding(timesteps, dim, max_period)`: f32 timesteps [N] → f32
    /// [dim, N]; with `half = dim / 2` and `freq_j = exp(-ln(max_period)·j/half)`, row `n` holds
    /// `cos(t_n·freq_j)` at `j` and `sin(t_n·freq_j)` at `j + half`, and 0 last when `dim` is odd.
    pub fn timestep_embedding(
        &mut self,
        timesteps: TensorId,
        dim: usize,
        max_period: i32,
    ) -> Result<TensorId> {
        const OP: &str = "timestep_embedding";
        self.check_types(OP, &[timesteps], &[F32_ONLY])?;
        let ne = self.ne(timesteps);
        if ne[1] != 1 || ne[2] != 1 || ne[3] != 1 {
            return Err(self.shape_err(
                OP,
                format!("timesteps must be a vector [N], got {}", fmt_ne(&ne)),
                &[timesteps],
            ));
        }
        if dim == 0 || max_period < 1 {
            return Err(self.shape_err(
                OP,
                format!("dim ({dim}) and max_period ({max_period}) must be at least 1"),
                &[timesteps],
            ));
        }
        Ok(self.node(
            Op::TimestepEmbedding { dim, max_period },
            DType::F32,
            [dim, ne[0], 1, 1],
            &[timesteps],
        ))
    }
}

impl Graph {
    /// A new f32 tensor of shape `ne` (1 to 4 dims) holding `value` everywhere, computed by the
    /// graph (no leaf to set). Autodiff starts sums of gradients from `fill(…, 0.0)`.
    pub fn fill(&mut self, ne: &[usize], value: f32) -> Result<TensorId> {
        if ne.is_empty() || ne.len() > crate::shape::MAX_DIMS {
            return Err(crate::error::Error::Invalid(format!(
                "fill: {} dims given, 1 to 4 allowed",
                ne.len()
            )));
        }
        Ok(self.node(
            Op::Fill { value },
            DType::F32,
            crate::shape::ne_from(ne),
            &[],
        ))
    }

    /// Gradient of `upscale_ext(a, …)` w.r.t. `a`: every output gradient added back to the source
    /// pixels the forward op read, with the same weights. `grad` has the upscaled shape.
    pub fn upscale_back(
        &mut self,
        grad: TensorId,
        a: TensorId,
        mode: UpscaleMode,
    ) -> Result<TensorId> {
        const OP: &str = "upscale_back";
        self.check_types(OP, &[grad], &[F32_ONLY])?;
        self.check_id(OP, a)?;
        let ne = self.ne(a);
        Ok(self.node(Op::UpscaleBack { mode }, DType::F32, ne, &[grad, a]))
    }
}

/// ggml's `ne / ne_src` scale factor, in f32.
fn scale_factor(ne: usize, ne_src: usize) -> f32 {
    ne as f32 / ne_src as f32
}

/// The source index nearest-neighbour resizing reads for output index `i` (ggml's f32 formula,
/// clamped to the source).
fn nearest(i: usize, sf: f32, ne_src: usize) -> usize {
    ((i as f32 / sf) as usize).min(ne_src - 1)
}

/// Bilinear source indices and weight of the second one for output index `i`, as ggml computes
/// them (half-pixel centres, clamped to the edges).
fn bilinear(i: usize, sf: f32, ne_src: usize) -> (usize, usize, f64) {
    let x = (i as f32 + 0.5) / sf - 0.5;
    let last = ne_src as i64 - 1;
    let x0 = (x.floor() as i64).clamp(0, last);
    let x1 = (x0 + 1).clamp(0, last);
    let dx = (x - x0 as f32).clamp(0.0, 1.0);
    (x0 as usize, x1 as usize, dx as f64)
}

pub(crate) fn reference(n: &NodeRef, src: &[Dense]) -> Result<Dense> {
    let ne = n.t.ne;
    match n.t.op {
        Op::Pad { .. } => {
            let a = &src[0];
            Ok(Dense::from_fn(ne, |i0, i1, i2, i3| {
                if i0 < a.ne[0] && i1 < a.ne[1] && i2 < a.ne[2] && i3 < a.ne[3] {
                    a.at(i0, i1, i2, i3)
                } else {
                    0.0
                }
            }))
        }
        Op::Upscale { mode } => {
            let a = &src[0];
            let sf: Vec<f32> = (0..4).map(|d| scale_factor(ne[d], a.ne[d])).collect();
            Ok(Dense::from_fn(ne, |i0, i1, i2, i3| {
                let j2 = nearest(i2, sf[2], a.ne[2]);
                let j3 = nearest(i3, sf[3], a.ne[3]);
                match mode {
                    UpscaleMode::Nearest => a.at(
                        nearest(i0, sf[0], a.ne[0]),
                        nearest(i1, sf[1], a.ne[1]),
                        j2,
                        j3,
                    ),
                    UpscaleMode::Bilinear => {
                        let (x0, x1, dx) = bilinear(i0, sf[0], a.ne[0]);
                        let (y0, y1, dy) = bilinear(i1, sf[1], a.ne[1]);
                        a.at(x0, y0, j2, j3) * (1.0 - dx) * (1.0 - dy)
                            + a.at(x1, y0, j2, j3) * dx * (1.0 - dy)
                            + a.at(x0, y1, j2, j3) * (1.0 - dx) * dy
                            + a.at(x1, y1, j2, j3) * dx * dy
                    }
                }
            }))
        }
        Op::UpscaleBack { mode } => {
            let g = &src[0];
            let mut out = Dense::zeros(ne);
            let sf: Vec<f32> = (0..4).map(|d| scale_factor(g.ne[d], ne[d])).collect();
            Dense::for_each_index(&g.ne, |i0, i1, i2, i3| {
                let gv = g.at(i0, i1, i2, i3);
                let j2 = nearest(i2, sf[2], ne[2]);
                let j3 = nearest(i3, sf[3], ne[3]);
                match mode {
                    UpscaleMode::Nearest => {
                        let k =
                            out.idx(nearest(i0, sf[0], ne[0]), nearest(i1, sf[1], ne[1]), j2, j3);
                        out.data[k] += gv;
                    }
                    UpscaleMode::Bilinear => {
                        let (x0, x1, dx) = bilinear(i0, sf[0], ne[0]);
                        let (y0, y1, dy) = bilinear(i1, sf[1], ne[1]);
                        for (x, y, w) in [
                            (x0, y0, (1.0 - dx) * (1.0 - dy)),
                            (x1, y0, dx * (1.0 - dy)),
                            (x0, y1, (1.0 - dx) * dy),
                            (x1, y1, dx * dy),
                        ] {
                            let k = out.idx(x, y, j2, j3);
                            out.data[k] += gv * w;
                        }
                    }
                }
            });
            Ok(out)
        }
        Op::Fill { value } => Ok(Dense::filled(ne, value as f64)),
        Op::Arange { start, step, .. } => Ok(Dense::from_fn(ne, |i, _, _, _| {
            start as f64 + step as f64 * i as f64
        })),
        Op::TimestepEmbedding { dim, max_period } => {
            let t = &src[0];
            let half = dim / 2;
            let ln_p = (max_period as f64).ln();
            Ok(Dense::from_fn(ne, |j, i, _, _| {
                let (k, cos) = if j < half {
                    (j, true)
                } else {
                    (j - half, false)
                };
                if k >= half {
                    return 0.0; // the odd last element
                }
                let arg = t.at(i, 0, 0, 0) * (-ln_p * k as f64 / half as f64).exp();
                if cos {
                    arg.cos()
                } else {
                    arg.sin()
                }
            }))
        }
        _ => Err(n.err("not a misc op")),
    }
}

impl Graph {
    /// Backward of pad (the unpadded part of the gradient) and upscale (gradients added back to
    /// the source pixels with the forward weights).
    pub(crate) fn backward_misc(
        &mut self,
        bw: &crate::autodiff::Bw,
    ) -> Result<crate::autodiff::Grads> {
        let t = self.tensor(bw.node).clone();
        let a = t.src[0];
        let g = self.contig(bw.grad)?;
        match t.op {
            Op::Pad { .. } => {
                let gt = self.tensor(g).clone();
                let ne = self.ne(a);
                let v = self.view(g, &ne, &[gt.nb[1], gt.nb[2], gt.nb[3]], 0)?;
                Ok(vec![Some(self.cont(v)?)])
            }
            Op::Upscale { mode } => Ok(vec![Some(self.upscale_back(g, a, mode)?)]),
            _ => Err(self.not_diff(bw.node, 0, "not differentiable")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::UpscaleMode;
    use crate::ops::testutil::*;
    use crate::*;

    #[test]
    fn pad_appends_zeros() {
        let mut g = Graph::new();
        let a = g.new_f32(&[2, 2]).unwrap();
        let p = g.pad(a, 1, 1, 0, 0).unwrap();
        assert_eq!(g.ne(p), [3, 3, 1, 1]);
        let out = run1(g, &[(a, vec![1., 2., 3., 4.])], p);
        assert_eq!(out, vec![1., 2., 0., 3., 4., 0., 0., 0., 0.]);
    }

    #[test]
    fn pad_random_f16_view_in_all_dims() {
        let mut rng = Rng::new(2);
        let mut g = Graph::new();
        let raw = g.new_tensor(DType::F16, &[3, 1, 17, 2]).unwrap();
        let a = g.permute(raw, [1, 0, 2, 3]).unwrap(); // [1, 3, 17, 2]
        let p = g.pad(a, 2, 1, 3, 1).unwrap();
        assert_eq!(g.ne(p), [3, 4, 20, 3]);
        assert_eq!(g.dtype(p), DType::F16);
        let rv: Vec<f32> = rng
            .vec(102, -1.0, 1.0)
            .iter()
            .map(|&v| half::f16::from_f32(v).to_f32())
            .collect();
        let out = run1(g, &[(raw, rv.clone())], p);
        let mut want = vec![];
        for i3 in 0..3 {
            for i2 in 0..20 {
                for i1 in 0..4 {
                    for i0 in 0..3 {
                        // a[0, i1, i2, i3] = raw[i1, 0, i2, i3]
                        let inside = i0 < 1 && i1 < 3 && i2 < 17 && i3 < 2;
                        want.push(if inside {
                            rv[(i3 * 17 + i2) * 3 + i1] as f64
                        } else {
                            0.0
                        });
                    }
                }
            }
        }
        assert_close(&out, &want, 0.0);
    }

    #[test]
    fn upscale_nearest_repeats_pixels() {
        let mut g = Graph::new();
        let a = g.new_f32(&[2, 2, 2]).unwrap();
        let u = g.upscale(a, 2).unwrap();
        assert_eq!(g.ne(u), [4, 4, 2, 1]);
        let av: Vec<f32> = (0..8).map(|v| v as f32).collect();
        let out = run1(g, &[(a, av.clone())], u);
        let want: Vec<f64> = (0..32)
            .map(|i| {
                let (x, y, c) = (i % 4, i / 4 % 4, i / 16);
                av[(c * 2 + y / 2) * 2 + x / 2] as f64
            })
            .collect();
        assert_close(&out, &want, 0.0);
    }

    #[test]
    fn upscale_ext_nearest_any_sizes_from_a_view() {
        // resize a transposed [3, 5, 2] view to [7, 2, 4, 1]: sources from ggml's f32 formula
        let mut rng = Rng::new(6);
        let mut g = Graph::new();
        let raw = g.new_f32(&[5, 3, 2]).unwrap();
        let a = g.transpose(raw).unwrap();
        let u = g.upscale_ext(a, 7, 2, 4, 1, UpscaleMode::Nearest).unwrap();
        let rv = rng.vec(30, -1.0, 1.0);
        let out = run1(g, &[(raw, rv.clone())], u);
        let pick =
            |i: usize, ne: usize, src: usize| ((i as f32) / (ne as f32 / src as f32)) as usize;
        let mut want = vec![];
        for i2 in 0..4 {
            for i1 in 0..2 {
                for i0 in 0..7 {
                    let (x, y, z) = (pick(i0, 7, 3), pick(i1, 2, 5), pick(i2, 4, 2));
                    want.push(rv[(z * 3 + x) * 5 + y] as f64); // a[x, y, z] = raw[y, x, z]
                }
            }
        }
        assert_close(&out, &want, 0.0);
    }

    #[test]
    fn upscale_bilinear_by_hand() {
        // [0, 4] -> [0, 1, 3, 4] (half-pixel centres, clamped); rows likewise
        let mut g = Graph::new();
        let a = g.new_f32(&[2, 2]).unwrap();
        let u = g.upscale_ext(a, 4, 2, 1, 1, UpscaleMode::Bilinear).unwrap();
        let out = run1(g, &[(a, vec![0., 4., 8., 12.])], u);
        assert_eq!(out, vec![0., 1., 3., 4., 8., 9., 11., 12.]);
        let mut g = Graph::new();
        let a = g.new_f32(&[1, 2]).unwrap();
        let u = g.upscale_ext(a, 1, 4, 1, 1, UpscaleMode::Bilinear).unwrap();
        let out = run1(g, &[(a, vec![0., 4.])], u);
        assert_eq!(out, vec![0., 1., 3., 4.]);
    }

    #[test]
    fn upscale_errors() {
        let mut g = Graph::new();
        let a = g.new_f32(&[2, 2]).unwrap();
        assert!(g
            .upscale(a, 1)
            .unwrap_err()
            .to_string()
            .contains("at least 2"));
        let e = g
            .upscale_ext(a, 0, 2, 1, 1, UpscaleMode::Nearest)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("upscale:") && e.contains("[0, 2, 1, 1]") && e.contains("[2, 2, 1, 1]"),
            "{e}"
        );
        let h = g.new_tensor(DType::F16, &[2, 2]).unwrap();
        assert!(g
            .upscale(h, 2)
            .unwrap_err()
            .to_string()
            .contains("type f16"));
    }

    #[test]
    fn arange_values_and_errors() {
        let mut g = Graph::new();
        let r = g.arange(0.5, 6.0, 0.75).unwrap();
        assert_eq!(g.ne(r), [8, 1, 1, 1]);
        let r2 = g.arange(0.0, 3.0, 1.0).unwrap();
        let mut s = Session::new(g, &[r, r2]).unwrap();
        s.compute(&ReferenceBackend).unwrap();
        assert_eq!(
            s.get_f32(r).unwrap(),
            vec![0.5, 1.25, 2.0, 2.75, 3.5, 4.25, 5.0, 5.75]
        );
        assert_eq!(s.get_f32(r2).unwrap(), vec![0.0, 1.0, 2.0]);
        let mut g = Graph::new();
        let e = g.arange(3.0, 1.0, 1.0).unwrap_err().to_string();
        assert!(
            e.starts_with("arange:") && e.contains("stop > start"),
            "{e}"
        );
        assert!(g.arange(0.0, 1.0, -1.0).is_err());
        assert!(g.arange(0.0, f32::INFINITY, 1.0).is_err());
    }

    #[test]
    fn timestep_embedding_by_hand_even_and_odd() {
        for dim in [4usize, 5] {
            let mut g = Graph::new();
            let t = g.new_f32(&[3]).unwrap();
            let e = g.timestep_embedding(t, dim, 10000).unwrap();
            assert_eq!(g.ne(e), [dim, 3, 1, 1]);
            let ts = [0.0f32, 1.0, 250.0];
            let out = run1(g, &[(t, ts.to_vec())], e);
            let mut want = vec![];
            for &tv in &ts {
                let tv = tv as f64;
                // half = 2: freq = [1, 10000^(-1/2) = 0.01]
                want.extend([tv.cos(), (tv * 0.01).cos(), tv.sin(), (tv * 0.01).sin()]);
                if dim == 5 {
                    want.push(0.0);
                }
            }
            assert_close(&out, &want, 1e-6);
        }
        let mut g = Graph::new();
        let t = g.new_f32(&[3, 2]).unwrap();
        let e = g.timestep_embedding(t, 4, 10000).unwrap_err().to_string();
        assert!(
            e.starts_with("timestep_embedding:") && e.contains("[3, 2, 1, 1]"),
            "{e}"
        );
    }
}
