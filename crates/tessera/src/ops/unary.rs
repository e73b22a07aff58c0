//! Element-wise unary ops: `scale` (with bias), the activations (abs … hardsigmoid), the math
//! functions exp/log/sqr/sqrt/sin/cos, `leaky_relu` and `clamp`. The result has the input's type
//! and shape; the input may be any float type and any strided view.

use crate::error::Result;
use crate::graph::{Graph, FLOATS};
use crate::op::Op;
use crate::reference::{Dense, NodeRef};
use crate::tensor::TensorId;

/// Unary functions without parameters (ggml's `ggml_unary_op` plus the plain math ops).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Abs,
    Sgn,
    Neg,
    Step,
    Tanh,
    Elu,
    Relu,
    Sigmoid,
    /// GELU, tanh approximation.
    Gelu,
    /// GELU with the exact erf.
    GeluErf,
    /// `x * sigmoid(1.702 x)`.
    GeluQuick,
    Silu,
    Hardswish,
    Hardsigmoid,
    Exp,
    Log,
    Sqr,
    Sqrt,
    Sin,
    Cos,
}

impl UnaryOp {
    pub const ALL: [UnaryOp; 20] = [
        UnaryOp::Abs,
        UnaryOp::Sgn,
        UnaryOp::Neg,
        UnaryOp::Step,
        UnaryOp::Tanh,
        UnaryOp::Elu,
        UnaryOp::Relu,
        UnaryOp::Sigmoid,
        UnaryOp::Gelu,
        UnaryOp::GeluErf,
        UnaryOp::GeluQuick,
        UnaryOp::Silu,
        UnaryOp::Hardswish,
        UnaryOp::Hardsigmoid,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqr,
        UnaryOp::Sqrt,
        UnaryOp::Sin,
        UnaryOp::Cos,
    ];

    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Abs => "abs",
            UnaryOp::Sgn => "sgn",
            UnaryOp::Neg => "neg",
            UnaryOp::Step => "step",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Elu => "elu",
            UnaryOp::Relu => "relu",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Gelu => "gelu",
            UnaryOp::GeluErf => "gelu_erf",
            UnaryOp::GeluQuick => "gelu_quick",
            UnaryOp::Silu => "silu",
            UnaryOp::Hardswish => "hardswish",
            UnaryOp::Hardsigmoid => "hardsigmoid",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqr => "sqr",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
        }
    }

    pub fn from_name(name: &str) -> Option<UnaryOp> {
        UnaryOp::ALL.into_iter().find(|u| u.name() == name)
    }

    /// The function in f64.
    pub fn eval(self, x: f64) -> f64 {
        const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
        match self {
            UnaryOp::Abs => x.abs(),
            UnaryOp::Sgn => {
                if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    0.0 // NaN gives 0, as in ggml
                }
            }
            UnaryOp::Neg => -x,
            UnaryOp::Step => {
                if x > 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Elu => {
                if x > 0.0 {
                    x
                } else {
                    x.exp_m1()
                }
            }
            UnaryOp::Relu => {
                if x > 0.0 {
                    x
                } else {
                    0.0 // NaN gives 0, as in ggml
                }
            }
            UnaryOp::Sigmoid => sigmoid(x),
            UnaryOp::Gelu => {
                0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + 0.044715 * x * x)).tanh())
            }
            UnaryOp::GeluErf => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
            UnaryOp::GeluQuick => x * sigmoid(1.702 * x),
            UnaryOp::Silu => x * sigmoid(x),
            UnaryOp::Hardswish => x * ((x + 3.0) / 6.0).clamp(0.0, 1.0),
            UnaryOp::Hardsigmoid => ((x + 3.0) / 6.0).clamp(0.0, 1.0),
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sqr => x * x,
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Sin => x.sin(),
            UnaryOp::Cos => x.cos(),
        }
    }
}

/// The derivative a `unary_back` node multiplies the gradient by.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Deriv {
    Unary(UnaryOp),
    LeakyRelu { negative_slope: f32 },
    Clamp { min: f32, max: f32 },
}

impl Deriv {
    /// `f'(x)` in f64. At the kinks (relu, abs, leaky_relu and clamp at their corners,
    /// hardswish/hardsigmoid at ±3) the derivative of the right-hand side is taken for
    /// relu-like functions, as PyTorch does (relu'(0) = 0).
    pub fn eval(self, x: f64) -> f64 {
        const C: f64 = 0.797_884_560_802_865_4; // sqrt(2/pi)
        match self {
            Deriv::LeakyRelu { negative_slope } => {
                if x > 0.0 {
                    1.0
                } else {
                    negative_slope as f64
                }
            }
            Deriv::Clamp { min, max } => {
                if x >= min as f64 && x <= max as f64 {
                    1.0
                } else {
                    0.0
                }
            }
            Deriv::Unary(u) => match u {
                UnaryOp::Abs => UnaryOp::Sgn.eval(x),
                UnaryOp::Sgn | UnaryOp::Step => 0.0,
                UnaryOp::Neg => -1.0,
                UnaryOp::Tanh => {
                    let t = x.tanh();
                    1.0 - t * t
                }
                UnaryOp::Elu => {
                    if x > 0.0 {
                        1.0
                    } else {
                        x.exp()
                    }
                }
                UnaryOp::Relu => {
                    if x > 0.0 {
                        1.0
                    } else {
                        0.0
                    }
                }
                UnaryOp::Sigmoid => {
                    let s = sigmoid(x);
                    s * (1.0 - s)
                }
                UnaryOp::Gelu => {
                    let u = C * x * (1.0 + 0.044715 * x * x);
                    let t = u.tanh();
                    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * C * (1.0 + 3.0 * 0.044715 * x * x)
                }
                UnaryOp::GeluErf => {
                    0.5 * (1.0 + erf(x / std::f64::consts::SQRT_2))
                        + x * (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt()
                }
                UnaryOp::GeluQuick => {
                    let s = sigmoid(1.702 * x);
                    s + 1.702 * x * s * (1.0 - s)
                }
                UnaryOp::Silu => {
                    let s = sigmoid(x);
                    s * (1.0 + x * (1.0 - s))
                }
                UnaryOp::Hardswish => {
                    if x < -3.0 {
                        0.0
                    } else if x > 3.0 {
                        1.0
                    } else {
                        (2.0 * x + 3.0) / 6.0
                    }
                }
                UnaryOp::Hardsigmoid => {
                    if x > -3.0 && x < 3.0 {
                        1.0 / 6.0
                    } else {
                        0.0
                    }
                }
                UnaryOp::Exp => x.exp(),
                UnaryOp::Log => 1.0 / x,
                UnaryOp::Sqr => 2.0 * x,
                UnaryOp::Sqrt => 0.5 / x.sqrt(),
                UnaryOp::Sin => x.cos(),
                UnaryOp::Cos => -x.sin(),
            },
        }
    }
}

pub(crate) fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The error function, to about 1e-15: its Maclaurin series for |x| < 2.5, the continued
/// fraction of erfc beyond.
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let ax = x.abs();
    if ax < 2.5 {
        // erf x = 2/sqrt(pi) * sum_n (-1)^n x^(2n+1) / (n! (2n+1))
        let x2 = x * x;
        let mut term = x; // (-1)^n x^(2n+1) / n!
        let mut sum = x;
        for n in 1..200 {
            term *= -x2 / n as f64;
            let add = term / (2 * n + 1) as f64;
            sum += add;
            if add.abs() < 1e-17 * sum.abs() {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else {
        if ax > 27.0 {
            return x.signum();
        }
        // erfc x = exp(-x^2)/sqrt(pi) * 1/(x + 1/2/(x + 1/(x + 3/2/(x + 2/(x + ...)))))
        let mut f = ax;
        for k in (1..=80).rev() {
            f = ax + (k as f64 / 2.0) / f;
        }
        let erfc = (-ax * ax).exp() / (std::f64::consts::PI.sqrt() * f);
        x.signum() * (1.0 - erfc)
    }
}

impl Graph {
    fn unary_node(&mut self, op: Op, a: TensorId) -> Result<TensorId> {
        self.check_types(op.name(), &[a], &[FLOATS])?;
        let (dt, ne) = (self.dtype(a), self.ne(a));
        Ok(self.node(op, dt, ne, &[a]))
    }

    /// Applies a parameterless unary function.
    pub fn unary(&mut self, a: TensorId, u: UnaryOp) -> Result<TensorId> {
        self.unary_node(Op::Unary(u), a)
    }

    /// `a * s`.
    pub fn scale(&mut self, a: TensorId, s: f32) -> Result<TensorId> {
        self.unary_node(Op::Scale { s, b: 0.0 }, a)
    }

    /// `a * s + b`.
    pub fn scale_bias(&mut self, a: TensorId, s: f32, b: f32) -> Result<TensorId> {
        self.unary_node(Op::Scale { s, b }, a)
    }

    /// `x` where positive, `negative_slope * x` elsewhere.
    pub fn leaky_relu(&mut self, a: TensorId, negative_slope: f32) -> Result<TensorId> {
        self.unary_node(Op::LeakyRelu { negative_slope }, a)
    }

    /// `min(max(x, min), max)`; NaN gives `max`, as in ggml.
    pub fn clamp(&mut self, a: TensorId, min: f32, max: f32) -> Result<TensorId> {
        if min.is_nan() || max.is_nan() || min > max {
            return Err(self.shape_err(
                "clamp",
                format!("min {min} must not exceed max {max}"),
                &[a],
            ));
        }
        self.unary_node(Op::Clamp { min, max }, a)
    }

    /// `grad * f'(x)` (the backward of a unary op); `grad` and `x` have the same shape, the
    /// result is f32.
    pub fn unary_back(&mut self, grad: TensorId, x: TensorId, d: Deriv) -> Result<TensorId> {
        const OP: &str = "unary_back";
        self.check_types(OP, &[grad, x], &[FLOATS, FLOATS])?;
        let ne = self.ne(x);
        if self.ne(grad) != ne {
            return Err(self.shape_err(OP, "grad and x must have the same shape", &[grad, x]));
        }
        Ok(self.node(Op::UnaryBack(d), crate::DType::F32, ne, &[grad, x]))
    }

    pub fn abs(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Abs)
    }
    pub fn neg(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Neg)
    }
    pub fn relu(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Relu)
    }
    pub fn gelu(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Gelu)
    }
    pub fn silu(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Silu)
    }
    pub fn tanh(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Tanh)
    }
    pub fn sigmoid(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Sigmoid)
    }
    pub fn exp(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Exp)
    }
    pub fn log(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Log)
    }
    pub fn sqr(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Sqr)
    }
    pub fn sqrt(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Sqrt)
    }
}

pub(crate) fn reference(n: &NodeRef, src: &[Dense]) -> Result<Dense> {
    let a = &src[0];
    if let Op::UnaryBack(d) = n.t.op {
        let x = &src[1];
        return Ok(Dense {
            ne: x.ne,
            data: a
                .data
                .iter()
                .zip(&x.data)
                .map(|(g, &x)| g * d.eval(x))
                .collect(),
        });
    }
    let f: Box<dyn Fn(f64) -> f64> = match n.t.op {
        Op::Scale { s, b } => Box::new(move |x| x * s as f64 + b as f64),
        Op::Unary(u) => Box::new(move |x| u.eval(x)),
        Op::LeakyRelu { negative_slope } => {
            Box::new(move |x| x.max(0.0) + negative_slope as f64 * x.min(0.0))
        }
        // ggml's MAX(MIN(x, max), min) with C's comparison macros: NaN becomes `max`
        Op::Clamp { min, max } => Box::new(move |x| {
            let m = if x < max as f64 { x } else { max as f64 };
            if m > min as f64 {
                m
            } else {
                min as f64
            }
        }),
        _ => return Err(n.err("not a unary op")),
    };
    Ok(Dense {
        ne: a.ne,
        data: a.data.iter().map(|&x| f(x)).collect(),
    })
}

impl Graph {
    /// Backward of the unary ops: `grad * f'(x)` through `unary_back` (neg and scale directly).
    /// `step` and `sgn` have a zero derivative almost everywhere and no useful gradient: they
    /// are refused, like ggml does.
    pub(crate) fn backward_unary(
        &mut self,
        bw: &crate::autodiff::Bw,
    ) -> Result<crate::autodiff::Grads> {
        let t = self.tensor(bw.node).clone();
        let a = t.src[0];
        let g = bw.grad;
        let ga = match t.op {
            Op::Scale { s, .. } => self.scale(g, s)?,
            Op::Unary(UnaryOp::Neg) => self.scale(g, -1.0)?,
            Op::Unary(u @ (UnaryOp::Step | UnaryOp::Sgn)) => {
                return Err(self.not_diff(
                    bw.node,
                    0,
                    &format!(
                        "{} is piecewise constant: its gradient is zero or undefined everywhere",
                        u.name()
                    ),
                ))
            }
            Op::Unary(u) => self.unary_back(g, a, Deriv::Unary(u))?,
            Op::LeakyRelu { negative_slope } => {
                self.unary_back(g, a, Deriv::LeakyRelu { negative_slope })?
            }
            Op::Clamp { min, max } => self.unary_back(g, a, Deriv::Clamp { min, max })?,
            _ => return Err(self.not_diff(bw.node, 0, "not a unary op")),
        };
        Ok(vec![Some(ga)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;
    use crate::*;

    #[test]
    fn erf_matches_known_values() {
        // values from tables of erf
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (2.5, 0.999_593_047_982_555),
            (3.0, 0.999_977_909_503_001_4),
            (-1.0, -0.842_700_792_949_714_9),
        ] {
            assert!(
                (erf(x) - want).abs() < 1e-14,
                "erf({x}) = {} want {want}",
                erf(x)
            );
        }
    }

    #[test]
    fn hand_checked_values() {
        let x = [-2.0f64, -0.5, 0.0, 0.5, 3.0];
        let check = |u: UnaryOp, want: [f64; 5]| {
            for (xi, w) in x.iter().zip(want) {
                assert!(
                    (u.eval(*xi) - w).abs() < 1e-12,
                    "{} ({xi}) = {} want {w}",
                    u.name(),
                    u.eval(*xi)
                );
            }
        };
        check(UnaryOp::Relu, [0.0, 0.0, 0.0, 0.5, 3.0]);
        check(UnaryOp::Sgn, [-1.0, -1.0, 0.0, 1.0, 1.0]);
        check(UnaryOp::Step, [0.0, 0.0, 0.0, 1.0, 1.0]);
        check(
            UnaryOp::Hardsigmoid,
            [1.0 / 6.0, 2.5 / 6.0, 0.5, 3.5 / 6.0, 1.0],
        );
        check(
            UnaryOp::Hardswish,
            [-2.0 / 6.0, -0.5 * 2.5 / 6.0, 0.0, 0.5 * 3.5 / 6.0, 3.0],
        );
        check(
            UnaryOp::Elu,
            [(-2.0f64).exp_m1(), (-0.5f64).exp_m1(), 0.0, 0.5, 3.0],
        );
        check(UnaryOp::Sqr, [4.0, 0.25, 0.0, 0.25, 9.0]);
        check(UnaryOp::Silu, x.map(|v| v / (1.0 + (-v).exp())));
    }

    #[test]
    fn clamp_turns_nan_into_max_like_ggml() {
        let mut g = Graph::new();
        let a = g.new_f32(&[3]).unwrap();
        let c = g.clamp(a, -1.0, 2.0).unwrap();
        let out = run1(
            g,
            &[(a, vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY])],
            c,
        );
        assert_eq!(out, vec![2.0, 2.0, -1.0]);
    }

    #[test]
    fn unary_on_a_transposed_f16_view() {
        let mut g = Graph::new();
        let a = g.new_tensor(DType::F16, &[3, 2]).unwrap();
        let t = g.transpose(a).unwrap();
        let y = g.unary(t, UnaryOp::Neg).unwrap();
        let out = run1(g, &[(a, vec![1., 2., 3., 4., 5., 6.])], y);
        assert_eq!(out, vec![-1., -4., -2., -5., -3., -6.]);
    }

    #[test]
    fn scale_leaky_relu_clamp() {
        let mut g = Graph::new();
        let a = g.new_f32(&[4]).unwrap();
        let s = g.scale_bias(a, 2.0, -1.0).unwrap();
        let l = g.leaky_relu(a, 0.1).unwrap();
        let c = g.clamp(a, -0.5, 0.75).unwrap();
        let mut sess = Session::new(g, &[s, l, c]).unwrap();
        sess.set_f32(a, &[-2.0, -0.25, 0.5, 1.0]).unwrap();
        sess.compute(&ReferenceBackend).unwrap();
        assert_eq!(sess.get_f32(s).unwrap(), vec![-5.0, -1.5, 0.0, 1.0]);
        assert_eq!(sess.get_f32(l).unwrap(), vec![-0.2, -0.025, 0.5, 1.0]);
        assert_eq!(sess.get_f32(c).unwrap(), vec![-0.5, -0.25, 0.5, 0.75]);
    }
}
