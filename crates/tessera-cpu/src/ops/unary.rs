//! CPU kernels of the `unary` family: `scale` (`x*s + b`), every [`UnaryOp`], `leaky_relu` and
//! `clamp`, on f32, f16 and bf16 (the result has the source's type), from any strided source;
//! and their backward, `unary_back` (at the end of these notes).
//!
//! The destination is contiguous; its flat element range is split between threads at multiples
//! of 32 elements, so a single huge row is shared too. A dense f32 source is mapped straight into
//! the destination (in place when the planner gave them the same memory); any other source goes
//! through an f32 buffer on the stack (f16 via F16C, bf16 via shifts, strided element by
//! element) and is rounded back to nearest even.
//!
//! With AVX2 every function is evaluated eight lanes at a time by the same code for every
//! element (a row's tail goes through a padded register), so an element's result never depends
//! on how the work was split. The transcendental ones (`pub(crate)` in [`x86`], also used by
//! the glu kernels):
//! - `exp`: Cephes' range reduction `x = n ln2 + r` (ln2 split in two) and its degree-6
//!   polynomial, the scale `2^n` applied as two factors so that results in the subnormal range
//!   are rounded once; the input is clamped to [-104, 89], so it overflows to +inf and underflows
//!   to 0 like libm, and NaN stays NaN.
//! - `sigmoid = 1/(1+exp(-x))`, `silu = x/(1+exp(-x))`, `elu` with `expm1` (a degree-9 Taylor
//!   polynomial for |x| < 0.5, `exp(x) - 1` beyond).
//! - `gelu_quick = x/(1+exp(-1.702x))` and gelu (tanh form) as `x/(1+exp(-2u))` — the same
//!   value as `0.5x(1+tanh u)` without its cancellation — with the exponent's product formed
//!   exactly (the rounding error of `x·k`, of `x²`, and the f32 constants' remainders are put
//!   back to first order), so the far negative tail keeps full relative accuracy.
//! - `tanh`: Cephes' odd polynomial for |x| < 0.625, `1 - 2/(exp(2|x|)+1)` beyond.
//! - `gelu_erf`: `0.5x·(1+erf(x/√2))` with `1+erf(z)` taken as `erfc(|z|)` (z < 0) or
//!   `2 - erfc(z)`, and `erfc(a) = t·exp(P(t) - a²)`, `t = 1/(1+a/2)` (Numerical Recipes'
//!   Chebyshev fit: relative error 1.05e-7 in exact arithmetic), `a² = x²/2` and `P - a²`
//!   formed exactly to first order: no cancellation in either tail. The absolute error of the
//!   `1 + erf` involved, measured on [-5, 5] (output rounding included), is 4.0e-7 (AVX2) and
//!   1.3e-7 (scalar).
//! - `log`, `sin`, `cos` use the standard library's f32 functions element by element.
//!
//! The scalar path (every target; `Isa::Scalar`) uses the standard library's f32 functions, and
//! f64 arithmetic for the gelu family (the same erfc fit for gelu_erf).
//!
//! Max relative error, f32 in and out, measured by the `accuracy_of_the_transcendentals` test of
//! tests/unary.rs on 200 000 points of x in [-20, 20] (exp: [-88, 88]; log: [1e-30, 1e30]),
//! results of magnitude under 1e-30 left out, against the functions in f64 (gelu and gelu_erf
//! in a cancellation-free form: the reference's `0.5x(1+tanh u)` and `0.5x(1+erf z)` keep only
//! about 1e-16 absolute accuracy in their negative tails):
//!
//! | function    | AVX2    | scalar  |
//! |-------------|---------|---------|
//! | exp         | 8.1e-8  | 6.0e-8  |
//! | sigmoid     | 1.5e-7  | 1.4e-7  |
//! | silu        | 1.7e-7  | 1.7e-7  |
//! | tanh        | 1.3e-7  | 1.6e-7  |
//! | elu         | 9.3e-8  | 7.2e-8  |
//! | gelu_quick  | 2.0e-7  | 6.0e-8  |
//! | gelu        | 2.0e-7  | 6.0e-8  |
//! | gelu_erf    | 4.5e-7  | 1.7e-7  |
//! | log         | 7.5e-8  | 7.5e-8  |
//!
//! Subnormal results are rounded once (exp) or flushed to a signed zero where `1 + exp(-x)`
//! overflows (sigmoid, silu, gelu*: |error| < 1e-37), as libm-based code does. The algebraic
//! functions (abs, sgn, neg, step, relu, hardswish, hardsigmoid, sqr, sqrt, scale, leaky_relu,
//! clamp) are exact or within one rounding. NaN conventions follow the reference (and ggml):
//! relu, step, sgn and leaky_relu of NaN give 0; clamp keeps NaN; infinities map like libm's.
//!
//! **unary_back** (`grad · f'(x)`, the derivative autodiff builds for every function above):
//! grad and x f32, f16 or bf16 with any strides, the destination contiguous f32, the same
//! split and conversions as the forward functions (dense f32 sources are read in place). The
//! product is formed in f32 and rounded once, so the exact derivatives (abs, sgn, neg, step,
//! relu, sqr, leaky_relu, clamp) give the reference's bits. The others are evaluated in forms
//! without overflow and without cancellation, from `e = e^(-|v|)` (the AVX2 `exp` above):
//! - `sigmoid' = e/(1+e)²`, `tanh' = 4e/(1+e)²` (e = e^(-2|x|)), `elu'`, `exp'`;
//! - silu, gelu_quick and gelu are `x·σ(v)`, `v = x·k(x)`: with `w = x·v'`,
//!   `f' = (1 + e + w e)/(1+e)²` for x >= 0 and `e ((1 + w) + e)/(1+e)²` below (`1 + w` is
//!   exact near the zero crossing); the gelus' exponent and `w` in double-f32 as in the forward;
//! - gelu_erf: `0.5 (1 + erf(x/√2)) + x φ(x)`, the forward's erfc fit sharing `e^(-x²/2)`
//!   with φ;
//! - `log' = 1/x`, `sqrt' = 0.5/√x`, hardswish' `(2x+3)/6` and hardsigmoid' `1/6` in f32
//!   (within two roundings), sin' and cos' in f64 element by element.
//!
//! The scalar path evaluates the same forms in f64 and rounds `g·f'(x)` once. Error of `f'`
//! (grad 1, f32), measured by `accuracy_of_the_derivatives` in tests/backward_ops.rs on
//! 200 000 points in [-20, 20] (exp': [-88, 88]) against the derivatives in f64
//! (cancellation-free forms, the exact erfc): the relative error where |f'| >= 1e-30, leaving
//! out ±0.05 around the zero of silu', gelu_quick', gelu' and gelu_erf' (near a zero crossing
//! no f32 evaluation keeps relative accuracy), and the absolute error everywhere:
//!
//! | derivative  | AVX2 rel | AVX2 abs | scalar rel | scalar abs |
//! |-------------|----------|----------|------------|------------|
//! | exp'        | 8.1e-8   | —        | 6.0e-8     | —          |
//! | elu'        | 8.0e-8   | 4.5e-8   | 5.9e-8     | 3.0e-8     |
//! | sigmoid'    | 2.7e-7   | 4.0e-8   | 5.9e-8     | 7.5e-9     |
//! | tanh'       | 2.6e-7   | 1.5e-7   | 5.9e-8     | 3.0e-8     |
//! | silu'       | 3.6e-7   | 2.3e-7   | 6.0e-8     | 6.0e-8     |
//! | gelu_quick' | 5.1e-7   | 2.3e-7   | 6.0e-8     | 6.0e-8     |
//! | gelu'       | 3.5e-7   | 2.3e-7   | 6.0e-8     | 6.0e-8     |
//! | gelu_erf'   | 2.4e-6   | 1.7e-7   | 3.6e-7     | 7.3e-8     |
//!
//! (gelu_erf's relative figures are the erfc fit's 1.2e-7 amplified by the cancellation of its
//! two terms 0.06 from the zero.) Against the reference, whose own `1 - tanh²`, `s(1 - s)` and
//! `0.5(1 + tanh u)` keep only about 1e-16 absolute accuracy in the tails, the outputs agree
//! within 2e-6 of their largest magnitude (the tests' bound). Special values follow the
//! reference: `inf·0` gives NaN (silu', gelu*' at ±inf) and, where `e` underflows at a finite
//! x, the derivative is its limit 0 or 1. One known difference: exp' overflows to inf where
//! `e^x` does (x > 88.72, where the forward exp is inf too) even when `g·e^x` would not.

use tessera::op::{Deriv, UnaryOp};
use tessera::{DType, Graph, Op, Result, Tensor};

use super::view::{flat_share, for_row_pieces, is_float, load_f32, store_f32, CHUNK};
use crate::exec::NodeCtx;
use crate::simd::Isa;

/// An element-wise f32 function.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Fun {
    Scale { s: f32, b: f32 },
    Unary(UnaryOp),
    Leaky(f32),
    Clamp { min: f32, max: f32 },
}

impl Fun {
    pub(crate) fn of(op: &Op) -> Option<Fun> {
        Some(match *op {
            Op::Scale { s, b } => Fun::Scale { s, b },
            Op::Unary(u) => Fun::Unary(u),
            Op::LeakyRelu { negative_slope } => Fun::Leaky(negative_slope),
            Op::Clamp { min, max } => Fun::Clamp { min, max },
            _ => return None,
        })
    }
}

/// `2·sqrt(2/π)` and `2·sqrt(2/π)·0.044715` (gelu's `2u = x (k1 + k2 x²)`) and gelu_quick's
/// 1.702, each as an f32 and the f32 of its remainder.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const GELU_K1: (f32, f32) = (1.595_769_2, -4.534_068e-8);
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const GELU_K2: (f32, f32) = (0.071_354_814, 2.398_832_5e-9);
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const GELU_QUICK: (f32, f32) = (1.702, -2.193_451e-8);

/// Numerical Recipes' `erfcc` coefficients, `c0 + c1 t + … + c9 t⁹`.
const ERFC_C: [f32; 10] = [
    -1.265_512_2,
    1.000_023_7,
    0.374_091_96,
    0.096_784_18,
    -0.186_288_06,
    0.278_868_07,
    -1.135_204,
    1.488_515_9,
    -0.822_152_23,
    0.170_872_77,
];

/// `erfc(a)` for `a >= 0` (NaN stays NaN), evaluated in f64.
#[inline]
fn erfc_pos(a: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.5 * a);
    let mut p = ERFC_C[9] as f64;
    for &c in ERFC_C[..9].iter().rev() {
        p = p * t + c as f64;
    }
    t * (p - a * a).exp()
}

/// The scalar (portable) form of `f`, built on the standard library's f32 functions.
#[inline]
pub(crate) fn scalar(f: Fun, x: f32) -> f32 {
    match f {
        Fun::Scale { s, b } => x * s + b,
        Fun::Leaky(slope) => x.max(0.0) + slope * x.min(0.0),
        Fun::Clamp { min, max } => {
            // ggml's MAX(MIN(x, max), min): NaN becomes `max`
            let m = if x < max { x } else { max };
            if m > min {
                m
            } else {
                min
            }
        }
        Fun::Unary(u) => match u {
            // exact in any precision: the core's definition (ggml's NaN rules included)
            UnaryOp::Abs | UnaryOp::Sgn | UnaryOp::Neg | UnaryOp::Step | UnaryOp::Relu => {
                u.eval(x as f64) as f32
            }
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Elu => {
                if x > 0.0 {
                    x
                } else {
                    x.exp_m1()
                }
            }
            UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            // the gelu family in f64: its exponent is a product that f32 would round
            UnaryOp::Gelu => {
                let x = x as f64;
                let v = 2.0 * (2.0 / std::f64::consts::PI).sqrt() * x * (1.0 + 0.044715 * x * x);
                (x / (1.0 + (-v).exp())) as f32
            }
            UnaryOp::GeluErf => {
                let x = x as f64;
                let z = x * std::f64::consts::FRAC_1_SQRT_2;
                let e = erfc_pos(z.abs());
                (0.5 * x * if z < 0.0 { e } else { 2.0 - e }) as f32
            }
            UnaryOp::GeluQuick => {
                let x = x as f64;
                (x / (1.0 + (-1.702 * x).exp())) as f32
            }
            UnaryOp::Silu => x / (1.0 + (-x).exp()),
            UnaryOp::Hardswish => x * ((x + 3.0) / 6.0).clamp(0.0, 1.0),
            UnaryOp::Hardsigmoid => ((x + 3.0) / 6.0).clamp(0.0, 1.0),
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sqr => x * x,
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Sin => x.sin(),
            UnaryOp::Cos => x.cos(),
        },
    }
}

/// `y[i] = f(x[i])` for `n` f32, with AVX2 when `isa` has it.
///
/// # Safety
/// `x` points at `n` readable f32 and `y` at `n` writable f32; they are either the same memory
/// or do not overlap.
pub(crate) unsafe fn apply(isa: Isa, f: Fun, x: *const f32, y: *mut f32, n: usize) {
    #[cfg(target_arch = "x86_64")]
    if super::view::avx2(isa) {
        // SAFETY: `avx2(isa)` holds only when the CPU has AVX2, FMA and F16C; the caller's
        // contract covers the pointers.
        unsafe { x86::apply(f, x, y, n) };
        return;
    }
    let _ = isa;
    for i in 0..n {
        // SAFETY: i < n; reading before writing the same index keeps in-place use correct.
        unsafe { *y.add(i) = scalar(f, *x.add(i)) };
    }
}

pub fn handles(graph: &Graph, t: &Tensor) -> bool {
    let s = graph.tensor(t.src[0]);
    if let Op::UnaryBack(_) = t.op {
        let x = graph.tensor(t.src[1]);
        return is_float(s.dtype)
            && is_float(x.dtype)
            && t.dtype == DType::F32
            && s.ne == t.ne
            && x.ne == t.ne
            && t.is_contiguous();
    }
    Fun::of(&t.op).is_some()
        && is_float(s.dtype)
        && t.dtype == s.dtype
        && s.ne == t.ne
        && t.is_contiguous()
}

pub fn work_size(_graph: &Graph, _t: &Tensor, _nth: usize) -> usize {
    0
}

/// Shape and strides to walk `t` with: one flat row when it is dense.
pub(crate) fn walk_shape(t: &Tensor) -> ([usize; 4], [usize; 4]) {
    if t.is_contiguous() {
        ([t.nelements(), 1, 1, 1], [t.dtype.type_size(), 0, 0, 0])
    } else {
        (t.ne, t.nb)
    }
}

pub fn compute(ctx: &NodeCtx) -> Result<()> {
    if let Op::UnaryBack(deriv) = ctx.t.op {
        return compute_back(ctx, deriv);
    }
    let (s, d) = (ctx.s(0), ctx.t);
    let Some(f) = Fun::of(&d.op) else {
        return Err(ctx.err("not a unary op"));
    };
    let (ne, nb) = walk_shape(s);
    let dts = d.dtype.type_size();
    let isa = ctx.isa;
    let range = flat_share(d.nelements(), ctx.ith, ctx.nth);
    let direct = s.dtype == DType::F32 && d.dtype == DType::F32 && (nb[0] == 4 || ne[0] == 1);
    let mut buf = [0f32; CHUNK];
    for_row_pieces(&ne, range, |i, len, flat| {
        // SAFETY: `exec::validate` checked both tensors' spans; the piece lies in one row of the
        // source and at flat index `flat` of the contiguous destination, which this thread
        // alone writes. When the planner ran the node in place the source and destination are
        // the same dense memory, read before written element by element.
        unsafe {
            let sp = ctx.src[0].add(i[0] * nb[0] + i[1] * nb[1] + i[2] * nb[2] + i[3] * nb[3]);
            let dp = ctx.dst.add(flat * dts);
            if direct {
                apply(isa, f, sp as *const f32, dp as *mut f32, len);
                return;
            }
            let mut done = 0;
            while done < len {
                let c = CHUNK.min(len - done);
                load_f32(
                    isa,
                    s.dtype,
                    sp.add(done * nb[0]),
                    nb[0],
                    buf.as_mut_ptr(),
                    c,
                );
                apply(isa, f, buf.as_ptr(), buf.as_mut_ptr(), c);
                store_f32(isa, d.dtype, buf.as_ptr(), dp.add(done * dts), dts, c);
                done += c;
            }
        }
    });
    Ok(())
}

/// `g · f'(x)` for one element on the scalar path: the product and the derivative in f64,
/// rounded once.
#[inline]
pub(crate) fn scalar_back(d: Deriv, g: f32, x: f32) -> f32 {
    (g as f64 * deriv64(d, x as f64)) as f32
}

/// `e = e^(-|v|)` and `w = x·v'` give `(1 + e + w e)/(1 + e)²` for x >= 0 and `e (1 + e + w)/(1 + e)²` below — the
/// derivative of `x·σ(v)` for `v = x·k(x)`, `k > 0` (silu, gelu_quick, gelu), without overflow
/// and without cancellation but at its zero crossing.
#[inline]
fn x_sigma_deriv64(x: f64, e: f64, w: f64) -> f64 {
    let q = 1.0 + e;
    if x >= 0.0 {
        (q + w * e) / (q * q)
    } else {
        e * (q + w) / (q * q)
    }
}

/// `f'(x)` in f64: the core's definition ([`Deriv::eval`]) where it is exact or direct, and
/// cancellation-free forms for tanh, sigmoid, silu, elu and the gelus (the core's
/// `1 - tanh²`, `s(1 - s)`, `0.5(1 + tanh u)` lose their relative accuracy in the tails).
pub(crate) fn deriv64(d: Deriv, x: f64) -> f64 {
    let Deriv::Unary(u) = d else {
        return d.eval(x);
    };
    match u {
        UnaryOp::Tanh => {
            // sech²x = 4e/(1 + e)², e = e^(-2|x|)
            let e = (-2.0 * x.abs()).exp();
            4.0 * e / ((1.0 + e) * (1.0 + e))
        }
        UnaryOp::Sigmoid => {
            let e = (-x.abs()).exp();
            e / ((1.0 + e) * (1.0 + e))
        }
        UnaryOp::Silu => x_sigma_deriv64(x, (-x.abs()).exp(), x),
        UnaryOp::GeluQuick => x_sigma_deriv64(x, (-1.702 * x.abs()).exp(), 1.702 * x),
        UnaryOp::Gelu => {
            // v = x (k1 + k2 x²), v' = k1 + 3 k2 x²
            let k1 = 2.0 * (2.0 / std::f64::consts::PI).sqrt();
            let k2 = k1 * 0.044715;
            let e = (-x.abs() * (k1 + k2 * x * x)).exp();
            x_sigma_deriv64(x, e, x * (k1 + 3.0 * k2 * x * x))
        }
        UnaryOp::GeluErf => {
            // 0.5 (1 + erf(x/√2)) + x φ(x), 1 + erf from erfc as in the forward function
            let ec = erfc_pos((x * std::f64::consts::FRAC_1_SQRT_2).abs());
            let phi = (-0.5 * x * x).exp()
                * (0.5 * std::f64::consts::FRAC_2_SQRT_PI)
                * std::f64::consts::FRAC_1_SQRT_2;
            let half = if x < 0.0 { 0.5 * ec } else { 1.0 - 0.5 * ec };
            half + x * phi
        }
        UnaryOp::Elu => {
            if x > 0.0 {
                1.0
            } else {
                x.exp()
            }
        }
        _ => d.eval(x),
    }
}

/// `y[i] = g[i] · f'(x[i])` for `n` f32, with AVX2 when `isa` has it.
///
/// # Safety
/// `g` and `x` point at `n` readable f32 and `y` at `n` writable f32; `y` is either the same
/// memory as `g` (or `x`) or overlaps neither.
pub(crate) unsafe fn apply_back(
    isa: Isa,
    d: Deriv,
    g: *const f32,
    x: *const f32,
    y: *mut f32,
    n: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if super::view::avx2(isa) {
        // SAFETY: `avx2(isa)` holds only when the CPU has AVX2, FMA and F16C; the caller's
        // contract covers the pointers.
        unsafe { x86::apply_back(d, g, x, y, n) };
        return;
    }
    let _ = isa;
    for i in 0..n {
        // SAFETY: i < n; both inputs are read before the output of the same index is written.
        unsafe { *y.add(i) = scalar_back(d, *g.add(i), *x.add(i)) };
    }
}

/// `unary_back`: `grad · f'(x)` into the contiguous f32 destination, the flat range split
/// between threads at multiples of 32 elements as for the forward functions. Dense f32 pieces
/// are read in place; any other (f16, bf16, strided) goes through f32 buffers on the stack.
fn compute_back(ctx: &NodeCtx, deriv: Deriv) -> Result<()> {
    let (g, x, d) = (ctx.s(0), ctx.s(1), ctx.t);
    // one flat row when both sources are dense, else x's shape walked with each one's strides
    let (ne, gnb, xnb) = if g.is_contiguous() && x.is_contiguous() {
        let n = d.nelements();
        let flat = |dt: DType| [dt.type_size(), 0, 0, 0];
        ([n, 1, 1, 1], flat(g.dtype), flat(x.dtype))
    } else {
        (d.ne, g.nb, x.nb)
    };
    let isa = ctx.isa;
    let direct = g.dtype == DType::F32
        && x.dtype == DType::F32
        && (gnb[0] == 4 || ne[0] == 1)
        && (xnb[0] == 4 || ne[0] == 1);
    let range = flat_share(d.nelements(), ctx.ith, ctx.nth);
    let mut bg = [0f32; CHUNK];
    let mut bx = [0f32; CHUNK];
    for_row_pieces(&ne, range, |i, len, flat| {
        let off = |nb: [usize; 4]| i[0] * nb[0] + i[1] * nb[1] + i[2] * nb[2] + i[3] * nb[3];
        // SAFETY: `exec::validate` checked every tensor's span; the piece lies in one row of
        // each source (`handles`: the same shape as the destination) and at flat index `flat`
        // of the contiguous f32 destination, which this thread alone writes. unary_back does
        // not run in place, and `apply_back` reads each element before writing it anyway.
        unsafe {
            let gp = ctx.src[0].add(off(gnb));
            let xp = ctx.src[1].add(off(xnb));
            let dp = (ctx.dst as *mut f32).add(flat);
            if direct {
                apply_back(isa, deriv, gp as *const f32, xp as *const f32, dp, len);
                return;
            }
            let mut done = 0;
            while done < len {
                let c = CHUNK.min(len - done);
                load_f32(
                    isa,
                    g.dtype,
                    gp.add(done * gnb[0]),
                    gnb[0],
                    bg.as_mut_ptr(),
                    c,
                );
                load_f32(
                    isa,
                    x.dtype,
                    xp.add(done * xnb[0]),
                    xnb[0],
                    bx.as_mut_ptr(),
                    c,
                );
                apply_back(isa, deriv, bg.as_ptr(), bx.as_ptr(), dp.add(done), c);
                done += c;
            }
        }
    });
    Ok(())
}

/// The AVX2 + FMA forms, eight lanes at a time.
///
/// Safety: the vector functions here are `#[inline(always)]` (so that they are inlined into the
/// loops of [`x86::apply`] at every optimisation level) and do not enable target features
/// themselves: they may only be called from code compiled with AVX2 and FMA enabled, i.e.
/// from `#[target_feature(enable = "avx2,fma")]` functions, on a CPU that has them.
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::{Deriv, Fun, ERFC_C, GELU_K1, GELU_K2, GELU_QUICK};
    use std::arch::x86_64::*;
    use tessera::op::UnaryOp;

    #[inline(always)]
    fn c(v: f32) -> __m256 {
        // SAFETY: AVX is available wherever this module's functions run (they are only called
        // from `#[target_feature(enable = "avx2,...")]` functions).
        unsafe { _mm256_set1_ps(v) }
    }

    /// `e^x`.
    #[inline(always)]
    pub(crate) unsafe fn exp(x: __m256) -> __m256 {
        // min/max return their second operand when either is NaN: NaN passes through.
        let x = _mm256_max_ps(c(-104.0), _mm256_min_ps(c(89.0), x));
        let n = _mm256_round_ps(
            _mm256_mul_ps(x, c(std::f32::consts::LOG2_E)),
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
        );
        let r = _mm256_fnmadd_ps(n, c(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(n, c(-2.121_944_4e-4), r);
        let mut p = c(1.987_569_1e-4);
        p = _mm256_fmadd_ps(p, r, c(1.398_199_9e-3));
        p = _mm256_fmadd_ps(p, r, c(8.333_452e-3));
        p = _mm256_fmadd_ps(p, r, c(4.166_579_6e-2));
        p = _mm256_fmadd_ps(p, r, c(1.666_666_5e-1));
        p = _mm256_fmadd_ps(p, r, c(0.5));
        let y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), c(1.0));
        // 2^n as 2^n1 · 2^n2 (n in [-150, 128]) so subnormal results round once.
        let ni = _mm256_cvtps_epi32(n);
        let n1 = _mm256_srai_epi32(ni, 1);
        let n2 = _mm256_sub_epi32(ni, n1);
        let bias = _mm256_set1_epi32(127);
        let s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
        let s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
        _mm256_mul_ps(_mm256_mul_ps(y, s1), s2)
    }

    #[inline(always)]
    unsafe fn neg(x: __m256) -> __m256 {
        _mm256_xor_ps(x, c(-0.0))
    }

    /// `x / (1 + e^(-k x))`: sigmoid (x = 1 numerator), silu, gelu_quick.
    #[inline(always)]
    unsafe fn x_over_1_exp(num: __m256, arg: __m256) -> __m256 {
        _mm256_div_ps(num, _mm256_add_ps(c(1.0), exp(arg)))
    }

    #[inline(always)]
    pub(crate) unsafe fn sigmoid(x: __m256) -> __m256 {
        x_over_1_exp(c(1.0), neg(x))
    }

    #[inline(always)]
    pub(crate) unsafe fn silu(x: __m256) -> __m256 {
        x_over_1_exp(x, neg(x))
    }

    /// `e·(1 - lo)`, the first-order correction of `e = e^(-hi)` to `e^(-(hi + lo))` for a tiny
    /// `lo`; where it is not a number (an infinite `e` or `lo`) `e` itself.
    #[inline(always)]
    unsafe fn corrected(e: __m256, lo: __m256) -> __m256 {
        let r = _mm256_fnmadd_ps(e, lo, e);
        _mm256_blendv_ps(e, r, _mm256_cmp_ps(r, r, _CMP_ORD_Q))
    }

    /// `e^(-a·(b + b_lo))` for the exact product: the rounding error of `a·b` and the term
    /// `a·b_lo` are put back, so the relative error does not grow with the argument's size.
    #[inline(always)]
    unsafe fn exp_neg_prod(a: __m256, b: __m256, b_lo: __m256) -> __m256 {
        let hi = _mm256_mul_ps(a, b);
        let lo = _mm256_fmadd_ps(a, b_lo, _mm256_fmsub_ps(a, b, hi));
        corrected(exp(neg(hi)), lo)
    }

    /// `s + e = a + b` exactly (Knuth's two-sum).
    #[inline(always)]
    unsafe fn two_sum(a: __m256, b: __m256) -> (__m256, __m256) {
        let s = _mm256_add_ps(a, b);
        let bb = _mm256_sub_ps(s, a);
        let e = _mm256_add_ps(_mm256_sub_ps(a, _mm256_sub_ps(s, bb)), _mm256_sub_ps(b, bb));
        (s, e)
    }

    /// All ones where `v` is finite.
    #[inline(always)]
    unsafe fn finite(v: __m256) -> __m256 {
        _mm256_cmp_ps(_mm256_andnot_ps(c(-0.0), v), c(f32::MAX), _CMP_LE_OQ)
    }

    #[inline(always)]
    pub(crate) unsafe fn gelu_quick(x: __m256) -> __m256 {
        let e = exp_neg_prod(x, c(GELU_QUICK.0), c(GELU_QUICK.1));
        _mm256_div_ps(x, _mm256_add_ps(c(1.0), e))
    }

    /// `t + t_lo = k1 + k2 x²` in double-f32 (gelu's `2u = x·t`), and `x²`.
    #[inline(always)]
    unsafe fn gelu_t(x: __m256) -> (__m256, __m256, __m256) {
        let x2 = _mm256_mul_ps(x, x);
        // the square's rounding error (0 where the square overflows)
        let x2_lo = _mm256_and_ps(_mm256_fmsub_ps(x, x, x2), finite(x2));
        // k2·x² = p + p_lo
        let p = _mm256_mul_ps(c(GELU_K2.0), x2);
        let p_lo = _mm256_fmsub_ps(c(GELU_K2.0), x2, p);
        let p_lo = _mm256_fmadd_ps(c(GELU_K2.0), x2_lo, p_lo);
        let p_lo = _mm256_fmadd_ps(c(GELU_K2.1), x2, p_lo);
        // t + t_lo = k1 + k2·x²
        let (t, t_err) = two_sum(c(GELU_K1.0), p);
        let t_lo = _mm256_add_ps(_mm256_add_ps(t_err, p_lo), c(GELU_K1.1));
        let t_lo = _mm256_and_ps(t_lo, finite(t));
        (t, t_lo, x2)
    }

    /// gelu, tanh form: `0.5x(1 + tanh u) = x / (1 + e^(-2u))`, `2u = x (k1 + k2 x²)`, with
    /// `k1 + k2 x²` in double-f32 so that the exponent is right to about 1e-14 relative.
    #[inline(always)]
    pub(crate) unsafe fn gelu(x: __m256) -> __m256 {
        let (t, t_lo, _) = gelu_t(x);
        _mm256_div_ps(x, _mm256_add_ps(c(1.0), exp_neg_prod(x, t, t_lo)))
    }

    /// gelu with the exact erf: `0.5x(1 + erf(x/√2))`, where `1 + erf(z)` is `erfc(|z|)` for
    /// z < 0 and `2 - erfc(z)` otherwise, `erfc(a) = t·e^(P(t) - a²)`, `t = 1/(1 + a/2)`.
    /// The exponent is formed exactly to first order (`a² = x²/2` from the exact square,
    /// `P - a²` with its rounding error), so the tails keep their relative accuracy.
    #[inline(always)]
    pub(crate) unsafe fn gelu_erf(x: __m256) -> __m256 {
        let z = _mm256_mul_ps(x, c(std::f32::consts::FRAC_1_SQRT_2));
        let a = _mm256_andnot_ps(c(-0.0), z);
        let t = _mm256_div_ps(c(1.0), _mm256_fmadd_ps(c(0.5), a, c(1.0)));
        let mut p = c(ERFC_C[9]);
        for &k in ERFC_C[..9].iter().rev() {
            p = _mm256_fmadd_ps(p, t, c(k));
        }
        // a² = s + s_lo exactly
        let xx = _mm256_mul_ps(x, x);
        let s = _mm256_mul_ps(xx, c(0.5));
        let s_lo = _mm256_mul_ps(_mm256_fmsub_ps(x, x, xx), c(0.5));
        // p - s = arg + err exactly
        let (arg, err) = two_sum(p, neg(s));
        // e^(arg + err - s_lo) = e^arg · (1 - (s_lo - err))
        let e = corrected(exp(arg), _mm256_sub_ps(s_lo, err));
        let e = _mm256_mul_ps(t, e);
        let m = _mm256_blendv_ps(
            _mm256_sub_ps(c(2.0), e),
            e,
            _mm256_cmp_ps(z, c(0.0), _CMP_LT_OQ),
        );
        _mm256_mul_ps(_mm256_mul_ps(c(0.5), x), m)
    }

    #[inline(always)]
    pub(crate) unsafe fn tanh(x: __m256) -> __m256 {
        let sign = _mm256_and_ps(x, c(-0.0));
        let ax = _mm256_andnot_ps(c(-0.0), x);
        // |x| < 0.625: x + x³ P(x²)
        let z = _mm256_mul_ps(x, x);
        let mut p = c(-5.704_988_7e-3);
        p = _mm256_fmadd_ps(p, z, c(2.063_909e-2));
        p = _mm256_fmadd_ps(p, z, c(-5.373_971_6e-2));
        p = _mm256_fmadd_ps(p, z, c(1.333_144_2e-1));
        p = _mm256_fmadd_ps(p, z, c(-0.333_332_8));
        let small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), x, x);
        // beyond: 1 - 2/(e^(2|x|) + 1), with x's sign
        let e = exp(_mm256_add_ps(ax, ax));
        let big = _mm256_sub_ps(c(1.0), _mm256_div_ps(c(2.0), _mm256_add_ps(e, c(1.0))));
        let big = _mm256_or_ps(big, sign);
        _mm256_blendv_ps(big, small, _mm256_cmp_ps(ax, c(0.625), _CMP_LT_OQ))
    }

    /// `e^x - 1`.
    #[inline(always)]
    pub(crate) unsafe fn expm1(x: __m256) -> __m256 {
        let big = _mm256_sub_ps(exp(x), c(1.0));
        // |x| < 0.5: x (1 + x/2 + x²/6 + … + x⁸/9!)
        const INV_FACT: [f32; 10] = [
            1.0,
            1.0 / 2.0,
            1.0 / 6.0,
            1.0 / 24.0,
            1.0 / 120.0,
            1.0 / 720.0,
            1.0 / 5040.0,
            1.0 / 40320.0,
            1.0 / 362_880.0,
            1.0 / 3_628_800.0,
        ];
        let mut p = c(INV_FACT[9]);
        for &k in INV_FACT[..9].iter().rev() {
            p = _mm256_fmadd_ps(p, x, c(k));
        }
        let small = _mm256_mul_ps(p, x);
        let ax = _mm256_andnot_ps(c(-0.0), x);
        _mm256_blendv_ps(big, small, _mm256_cmp_ps(ax, c(0.5), _CMP_LT_OQ))
    }

    #[inline(always)]
    pub(crate) unsafe fn elu(x: __m256) -> __m256 {
        _mm256_blendv_ps(expm1(x), x, _mm256_cmp_ps(x, c(0.0), _CMP_GT_OQ))
    }

    #[inline(always)]
    pub(crate) unsafe fn relu(x: __m256) -> __m256 {
        _mm256_and_ps(x, _mm256_cmp_ps(x, c(0.0), _CMP_GT_OQ))
    }

    #[inline(always)]
    unsafe fn hardsigmoid(x: __m256) -> __m256 {
        let v = _mm256_div_ps(_mm256_add_ps(x, c(3.0)), c(6.0));
        // constant first: NaN passes through like the reference's clamp
        _mm256_min_ps(c(1.0), _mm256_max_ps(c(0.0), v))
    }

    /// Maps `f` over eight lanes at a time; the tail goes through a padded register so every
    /// element is computed by the same code.
    macro_rules! map {
        ($x:ident, $y:ident, $n:ident, |$v:ident| $body:expr) => {{
            let mut i = 0;
            while i + 8 <= $n {
                let $v = _mm256_loadu_ps($x.add(i));
                _mm256_storeu_ps($y.add(i), $body);
                i += 8;
            }
            if i < $n {
                let mut t = [0f32; 8];
                std::ptr::copy_nonoverlapping($x.add(i), t.as_mut_ptr(), $n - i);
                let $v = _mm256_loadu_ps(t.as_ptr());
                _mm256_storeu_ps(t.as_mut_ptr(), $body);
                std::ptr::copy_nonoverlapping(t.as_ptr(), $y.add(i), $n - i);
            }
        }};
    }

    /// `y[i] = f(x[i])`.
    ///
    /// # Safety
    /// As [`super::apply`]; the CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn apply(f: Fun, x: *const f32, y: *mut f32, n: usize) {
        // SAFETY: the caller guarantees `n` f32 at `x` and `y` (the same memory or disjoint);
        // every block of 8 is loaded before it is stored.
        unsafe {
            match f {
                Fun::Scale { s, b } => {
                    let (s, b) = (c(s), c(b));
                    map!(x, y, n, |v| _mm256_fmadd_ps(v, s, b))
                }
                Fun::Leaky(slope) => {
                    let k = c(slope);
                    let z = c(0.0);
                    // max/min(v, 0) give 0 for NaN, like the reference
                    map!(x, y, n, |v| _mm256_fmadd_ps(
                        k,
                        _mm256_min_ps(v, z),
                        _mm256_max_ps(v, z)
                    ))
                }
                Fun::Clamp { min, max } => {
                    let (lo, hi) = (c(min), c(max));
                    // minps returns its second operand when either is NaN: NaN becomes `hi`
                    map!(x, y, n, |v| _mm256_max_ps(_mm256_min_ps(v, hi), lo))
                }
                Fun::Unary(u) => match u {
                    UnaryOp::Abs => map!(x, y, n, |v| _mm256_andnot_ps(c(-0.0), v)),
                    UnaryOp::Sgn => map!(x, y, n, |v| _mm256_or_ps(
                        _mm256_and_ps(c(1.0), _mm256_cmp_ps(v, c(0.0), _CMP_GT_OQ)),
                        _mm256_and_ps(c(-1.0), _mm256_cmp_ps(v, c(0.0), _CMP_LT_OQ))
                    )),
                    UnaryOp::Neg => map!(x, y, n, |v| neg(v)),
                    UnaryOp::Step => {
                        map!(x, y, n, |v| _mm256_and_ps(
                            c(1.0),
                            _mm256_cmp_ps(v, c(0.0), _CMP_GT_OQ)
                        ))
                    }
                    UnaryOp::Tanh => map!(x, y, n, |v| tanh(v)),
                    UnaryOp::Elu => map!(x, y, n, |v| elu(v)),
                    UnaryOp::Relu => map!(x, y, n, |v| relu(v)),
                    UnaryOp::Sigmoid => map!(x, y, n, |v| sigmoid(v)),
                    UnaryOp::Gelu => map!(x, y, n, |v| gelu(v)),
                    UnaryOp::GeluErf => map!(x, y, n, |v| gelu_erf(v)),
                    UnaryOp::GeluQuick => map!(x, y, n, |v| gelu_quick(v)),
                    UnaryOp::Silu => map!(x, y, n, |v| silu(v)),
                    UnaryOp::Hardswish => map!(x, y, n, |v| _mm256_mul_ps(v, hardsigmoid(v))),
                    UnaryOp::Hardsigmoid => map!(x, y, n, |v| hardsigmoid(v)),
                    UnaryOp::Exp => map!(x, y, n, |v| exp(v)),
                    UnaryOp::Sqr => map!(x, y, n, |v| _mm256_mul_ps(v, v)),
                    UnaryOp::Sqrt => map!(x, y, n, |v| _mm256_sqrt_ps(v)),
                    UnaryOp::Log | UnaryOp::Sin | UnaryOp::Cos => {
                        for i in 0..n {
                            *y.add(i) = super::scalar(f, *x.add(i));
                        }
                    }
                },
            }
        }
    }

    // ----- derivatives (unary_back)

    /// `|x|`.
    #[inline(always)]
    unsafe fn abs(x: __m256) -> __m256 {
        _mm256_andnot_ps(c(-0.0), x)
    }

    /// All ones where `a <= b` etc.: `_mm256_cmp_ps` with an ordered predicate (false for NaN).
    macro_rules! cmp {
        ($a:expr, $op:ident, $b:expr) => {
            _mm256_cmp_ps($a, $b, $op)
        };
    }

    /// The derivative of `x·σ(v)`, `v = x·k(x)` with `k > 0` (silu, gelu_quick, gelu), from
    /// `e = e^(-|v|)` and `w + w_lo = x·v'` (double-f32): `(1 + e + w e)/(1 + e)²` for x >= 0
    /// and `e ((1 + w) + (w_lo + e))/(1 + e)²` below — no overflow, and no cancellation but at
    /// the derivative's zero crossing, where `w` is in [-2, -1] so that `1 + w` is exact
    /// (Sterbenz) and the sum is rounded once. Where `e` underflows to 0 and x is finite the
    /// derivative is 1 (x > 0) or 0 (so `w` may have overflowed there); x = ±inf gives NaN
    /// like the reference's `inf·0`.
    #[inline(always)]
    unsafe fn x_sigma_deriv(x: __m256, e: __m256, w: __m256, w_lo: __m256) -> __m256 {
        let q = _mm256_add_ps(c(1.0), e);
        let q2 = _mm256_mul_ps(q, q);
        let pos = _mm256_div_ps(_mm256_fmadd_ps(w, e, q), q2);
        let s = _mm256_add_ps(_mm256_add_ps(c(1.0), w), _mm256_add_ps(w_lo, e));
        let neg = _mm256_div_ps(_mm256_mul_ps(e, s), q2);
        let r = _mm256_blendv_ps(neg, pos, cmp!(x, _CMP_GE_OQ, c(0.0)));
        let sat = _mm256_and_ps(cmp!(e, _CMP_EQ_OQ, c(0.0)), finite(x));
        let limit = _mm256_and_ps(c(1.0), cmp!(x, _CMP_GT_OQ, c(0.0)));
        _mm256_blendv_ps(r, limit, sat)
    }

    /// `x·(k + k_lo)` as `(hi, lo)`: the product's rounding error and `x·k_lo` in `lo`.
    #[inline(always)]
    unsafe fn prod2(x: __m256, k: __m256, k_lo: __m256) -> (__m256, __m256) {
        let hi = _mm256_mul_ps(x, k);
        (hi, _mm256_fmadd_ps(x, k_lo, _mm256_fmsub_ps(x, k, hi)))
    }

    /// σ'(x) = e/(1 + e)², e = e^(-|x|).
    #[inline(always)]
    unsafe fn d_sigmoid(x: __m256) -> __m256 {
        let e = exp(neg(abs(x)));
        let q = _mm256_add_ps(c(1.0), e);
        _mm256_div_ps(e, _mm256_mul_ps(q, q))
    }

    /// tanh'(x) = sech²x = 4e/(1 + e)², e = e^(-2|x|).
    #[inline(always)]
    unsafe fn d_tanh(x: __m256) -> __m256 {
        let ax = abs(x);
        let e = exp(neg(_mm256_add_ps(ax, ax)));
        let q = _mm256_add_ps(c(1.0), e);
        _mm256_div_ps(_mm256_mul_ps(c(4.0), e), _mm256_mul_ps(q, q))
    }

    #[inline(always)]
    unsafe fn d_silu(x: __m256) -> __m256 {
        x_sigma_deriv(x, exp(neg(abs(x))), x, c(0.0))
    }

    #[inline(always)]
    unsafe fn d_gelu_quick(x: __m256) -> __m256 {
        let (k, k_lo) = (c(GELU_QUICK.0), c(GELU_QUICK.1));
        let e = exp_neg_prod(abs(x), k, k_lo);
        let (w, w_lo) = prod2(x, k, k_lo);
        x_sigma_deriv(x, e, w, w_lo)
    }

    /// gelu (tanh form): `v = x (k1 + k2 x²)` with its exponent exact to first order as in
    /// [`gelu`], and `v' = k1 + 3 k2 x² = (t + t_lo) + 2 k2 x²` in double-f32 too.
    #[inline(always)]
    unsafe fn d_gelu(x: __m256) -> __m256 {
        let (t, t_lo, x2) = gelu_t(x);
        let e = exp_neg_prod(abs(x), t, t_lo);
        // 2 k2 x² = p2 + p2_lo (k2's remainder and x²'s rounding are below f32's reach here)
        let k2x2 = _mm256_mul_ps(c(2.0 * GELU_K2.0), x2);
        let k2x2_lo = _mm256_fmsub_ps(c(2.0 * GELU_K2.0), x2, k2x2);
        let (vp, vp_err) = two_sum(t, k2x2);
        let vp_lo = _mm256_add_ps(vp_err, _mm256_add_ps(t_lo, k2x2_lo));
        let vp_lo = _mm256_and_ps(vp_lo, finite(vp));
        let (w, w_lo) = prod2(x, vp, vp_lo);
        x_sigma_deriv(x, e, w, _mm256_and_ps(w_lo, finite(w)))
    }

    /// gelu_erf: `0.5 (1 + erf(x/√2)) + x φ(x)` with `φ(x) = E/√(2π)`, `E = e^(-x²/2)` (its
    /// exponent exact to first order) and `0.5 erfc(|x|/√2) = h·E`, `h = 0.5 t e^(P(t))` (the
    /// forward's fit): `E (h + x/√(2π))` for x < 0, `1 - h E + x E/√(2π)` otherwise.
    #[inline(always)]
    unsafe fn d_gelu_erf(x: __m256) -> __m256 {
        let z = _mm256_mul_ps(x, c(std::f32::consts::FRAC_1_SQRT_2));
        let a = abs(z);
        let t = _mm256_div_ps(c(1.0), _mm256_fmadd_ps(c(0.5), a, c(1.0)));
        let mut p = c(ERFC_C[9]);
        for &k in ERFC_C[..9].iter().rev() {
            p = _mm256_fmadd_ps(p, t, c(k));
        }
        let h = _mm256_mul_ps(_mm256_mul_ps(c(0.5), t), exp(p));
        // x²/2 = s + s_lo exactly
        let xx = _mm256_mul_ps(x, x);
        let s = _mm256_mul_ps(xx, c(0.5));
        let s_lo = _mm256_mul_ps(_mm256_fmsub_ps(x, x, xx), c(0.5));
        let e = corrected(exp(neg(s)), s_lo);
        // 1/√(2π)
        let xc = _mm256_mul_ps(x, c(0.398_942_3));
        let below = _mm256_mul_ps(e, _mm256_add_ps(h, xc));
        let above = _mm256_fmadd_ps(xc, e, _mm256_fnmadd_ps(h, e, c(1.0)));
        _mm256_blendv_ps(above, below, cmp!(x, _CMP_LT_OQ, c(0.0)))
    }

    /// Maps `g · f'(x)` over eight lanes at a time; the tail goes through padded registers.
    macro_rules! map_back {
        ($g:ident, $x:ident, $y:ident, $n:ident, |$v:ident| $body:expr) => {{
            let mut i = 0;
            while i + 8 <= $n {
                let gv = _mm256_loadu_ps($g.add(i));
                let $v = _mm256_loadu_ps($x.add(i));
                _mm256_storeu_ps($y.add(i), _mm256_mul_ps(gv, $body));
                i += 8;
            }
            if i < $n {
                let mut tg = [0f32; 8];
                let mut tx = [0f32; 8];
                std::ptr::copy_nonoverlapping($g.add(i), tg.as_mut_ptr(), $n - i);
                std::ptr::copy_nonoverlapping($x.add(i), tx.as_mut_ptr(), $n - i);
                let gv = _mm256_loadu_ps(tg.as_ptr());
                let $v = _mm256_loadu_ps(tx.as_ptr());
                _mm256_storeu_ps(tg.as_mut_ptr(), _mm256_mul_ps(gv, $body));
                std::ptr::copy_nonoverlapping(tg.as_ptr(), $y.add(i), $n - i);
            }
        }};
    }

    /// `y[i] = g[i] · f'(x[i])`.
    ///
    /// # Safety
    /// As [`super::apply_back`]; the CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn apply_back(d: Deriv, g: *const f32, x: *const f32, y: *mut f32, n: usize) {
        // SAFETY: the caller guarantees `n` f32 at `g`, `x` and `y` (`y` the same memory as an
        // input or disjoint from both); every block of 8 is loaded before it is stored.
        unsafe {
            match d {
                Deriv::LeakyRelu { negative_slope } => {
                    let k = c(negative_slope);
                    map_back!(g, x, y, n, |v| _mm256_blendv_ps(
                        k,
                        c(1.0),
                        cmp!(v, _CMP_GT_OQ, c(0.0))
                    ))
                }
                Deriv::Clamp { min, max } => {
                    let (lo, hi) = (c(min), c(max));
                    map_back!(g, x, y, n, |v| _mm256_and_ps(
                        c(1.0),
                        _mm256_and_ps(cmp!(v, _CMP_GE_OQ, lo), cmp!(v, _CMP_LE_OQ, hi))
                    ))
                }
                Deriv::Unary(u) => match u {
                    // abs' = sgn (NaN gives 0)
                    UnaryOp::Abs => map_back!(g, x, y, n, |v| _mm256_or_ps(
                        _mm256_and_ps(c(1.0), cmp!(v, _CMP_GT_OQ, c(0.0))),
                        _mm256_and_ps(c(-1.0), cmp!(v, _CMP_LT_OQ, c(0.0)))
                    )),
                    UnaryOp::Sgn | UnaryOp::Step => map_back!(g, x, y, n, |_v| c(0.0)),
                    UnaryOp::Neg => map_back!(g, x, y, n, |_v| c(-1.0)),
                    UnaryOp::Relu => {
                        map_back!(g, x, y, n, |v| _mm256_and_ps(
                            c(1.0),
                            cmp!(v, _CMP_GT_OQ, c(0.0))
                        ))
                    }
                    UnaryOp::Tanh => map_back!(g, x, y, n, |v| d_tanh(v)),
                    UnaryOp::Sigmoid => map_back!(g, x, y, n, |v| d_sigmoid(v)),
                    UnaryOp::Silu => map_back!(g, x, y, n, |v| d_silu(v)),
                    UnaryOp::GeluQuick => map_back!(g, x, y, n, |v| d_gelu_quick(v)),
                    UnaryOp::Gelu => map_back!(g, x, y, n, |v| d_gelu(v)),
                    UnaryOp::GeluErf => map_back!(g, x, y, n, |v| d_gelu_erf(v)),
                    UnaryOp::Elu => map_back!(g, x, y, n, |v| _mm256_blendv_ps(
                        exp(v),
                        c(1.0),
                        cmp!(v, _CMP_GT_OQ, c(0.0))
                    )),
                    UnaryOp::Exp => map_back!(g, x, y, n, |v| exp(v)),
                    UnaryOp::Hardswish => map_back!(g, x, y, n, |v| {
                        // (2x + 3)/6 on [-3, 3], 0 below, 1 above (NaN stays NaN)
                        let m = _mm256_div_ps(_mm256_fmadd_ps(c(2.0), v, c(3.0)), c(6.0));
                        let m = _mm256_blendv_ps(m, c(0.0), cmp!(v, _CMP_LT_OQ, c(-3.0)));
                        _mm256_blendv_ps(m, c(1.0), cmp!(v, _CMP_GT_OQ, c(3.0)))
                    }),
                    UnaryOp::Hardsigmoid => map_back!(g, x, y, n, |v| _mm256_and_ps(
                        c(1.0 / 6.0),
                        _mm256_and_ps(cmp!(v, _CMP_GT_OQ, c(-3.0)), cmp!(v, _CMP_LT_OQ, c(3.0)))
                    )),
                    UnaryOp::Log => map_back!(g, x, y, n, |v| _mm256_div_ps(c(1.0), v)),
                    UnaryOp::Sqr => map_back!(g, x, y, n, |v| _mm256_add_ps(v, v)),
                    UnaryOp::Sqrt => {
                        map_back!(g, x, y, n, |v| _mm256_div_ps(c(0.5), _mm256_sqrt_ps(v)))
                    }
                    UnaryOp::Sin | UnaryOp::Cos => {
                        for i in 0..n {
                            *y.add(i) = super::scalar_back(d, *g.add(i), *x.add(i));
                        }
                    }
                },
            }
        }
    }
}
