//! CPU kernels of the backward ops autodiff builds, against the reference: `unary_back` (every
//! derivative, f32/f16/bf16 sources, dense, transposed and permuted, odd sizes, a long row split
//! across threads, special values, and the accuracy of the vectorised derivatives measured
//! against f64), `norm_back` (every kind, group_norm with every group count, rows of permuted
//! sources, a large mean) and `get_rows_back` (repeated indices, empty rows, 70 000 gathered
//! rows, every index into one row, planes, strided gradients, out-of-range indices). Every
//! configuration of `common::cpu_configs` runs (thread counts 1-3, scalar and the best ISA)
//! and must give bit-identical results whatever the thread count.
//!
//! Tolerances, relative to the output's largest magnitude: unary_back 2e-6 (the derivatives'
//! errors are tabulated in src/ops/unary.rs); norm_back 1e-6 (f64 sums, one rounding of the
//! output); get_rows_back 0 (the reference's f64 sums in the reference's order).

mod common;

use common::*;
use tessera::op::{Deriv, NormBackKind, UnaryOp};
use tessera::{DType, Graph, ReferenceBackend, Session, TensorId};
use tessera_cpu::{CpuBackend, Isa};

fn assert_fast(g: &Graph, id: TensorId) {
    assert!(
        tessera_cpu::ops::fast_path(g, g.tensor(id)),
        "node {} must run on a dedicated kernel",
        g.tensor(id).op
    );
}

fn all_derivs() -> Vec<Deriv> {
    let mut v: Vec<Deriv> = UnaryOp::ALL.into_iter().map(Deriv::Unary).collect();
    v.push(Deriv::LeakyRelu {
        negative_slope: 0.1,
    });
    v.push(Deriv::LeakyRelu {
        negative_slope: -0.37,
    });
    v.push(Deriv::Clamp {
        min: -0.4,
        max: 0.6,
    });
    v
}

fn deriv_name(d: Deriv) -> String {
    match d {
        Deriv::Unary(u) => u.name().to_string(),
        other => format!("{other:?}"),
    }
}

/// `x` mapped into the range where `d` is interesting: `x·k + b`.
fn range_of(d: Deriv) -> (f32, f32) {
    match d {
        Deriv::Unary(UnaryOp::Exp) => (4.0, 0.0),
        Deriv::Unary(UnaryOp::Log | UnaryOp::Sqrt) => (0.5, 1.0),
        Deriv::Unary(UnaryOp::Sqr) | Deriv::LeakyRelu { .. } | Deriv::Clamp { .. } => (1.0, 0.0),
        _ => (6.0, 0.0),
    }
}

const BACK_TOL: f64 = 2e-6;

/// Leaves grad (type `gdt`) and x (type `xdt`), x mapped by `range_of(d)`, in layout
/// 0 (dense), 1 (x transposed, grad dense) or 2 (both permuted); then `unary_back`.
fn unary_back_graph(
    gdt: DType,
    xdt: DType,
    dims: &[usize],
    layout: usize,
    d: Deriv,
) -> (Graph, [TensorId; 2], TensorId) {
    let mut g = Graph::new();
    let x = g.new_tensor(xdt, dims).unwrap();
    let (k, b) = range_of(d);
    let xs = if (k, b) != (1.0, 0.0) {
        g.scale_bias(x, k, b).unwrap()
    } else {
        x
    };
    let (gr, xv) = match layout {
        0 => (g.new_tensor(gdt, dims).unwrap(), xs),
        1 => {
            let xt = g.transpose(xs).unwrap();
            let ne = g.tensor(xt).ne;
            (g.new_tensor(gdt, &ne).unwrap(), xt)
        }
        _ => {
            let gr = g.new_tensor(gdt, dims).unwrap();
            let axes = [2, 0, 1, 3];
            (g.permute(gr, axes).unwrap(), g.permute(xs, axes).unwrap())
        }
    };
    let y = g.unary_back(gr, xv, d).unwrap();
    assert_fast(&g, y);
    // the leaves: the permuted grad's source is the leaf
    let grad_leaf = if layout == 2 { g.tensor(gr).src[0] } else { gr };
    (g, [grad_leaf, x], y)
}

#[test]
fn unary_back_every_derivative_type_and_layout() {
    let mut rng = Rng::new(71);
    let shapes: [&[usize]; 6] = [&[1], &[3], &[17, 3], &[1000, 2], &[5, 7, 3], &[33, 1, 2, 2]];
    let types = [
        (DType::F32, DType::F32),
        (DType::F32, DType::F16),
        (DType::BF16, DType::F32),
        (DType::F16, DType::BF16),
    ];
    for d in all_derivs() {
        for (si, dims) in shapes.iter().enumerate() {
            let (gdt, xdt) = types[si % types.len()];
            for layout in 0..3 {
                if layout == 2 && dims.len() < 3 {
                    continue;
                }
                let (g, inputs, y) = unary_back_graph(gdt, xdt, dims, layout, d);
                check(
                    g,
                    &inputs,
                    y,
                    &mut rng,
                    BACK_TOL,
                    &format!(
                        "unary_back {} grad {gdt} x {xdt} {dims:?} layout {layout}",
                        deriv_name(d)
                    ),
                );
            }
        }
    }
}

#[test]
fn unary_back_long_rows_are_split_across_threads() {
    let mut rng = Rng::new(72);
    for (u, n) in [
        (UnaryOp::Silu, 100_003usize),
        (UnaryOp::GeluErf, 4099),
        (UnaryOp::Gelu, 65),
        (UnaryOp::Tanh, 33),
    ] {
        for xdt in [DType::F32, DType::F16] {
            let (g, inputs, y) = unary_back_graph(DType::F32, xdt, &[n], 0, Deriv::Unary(u));
            check(
                g,
                &inputs,
                y,
                &mut rng,
                BACK_TOL,
                &format!("{} x {xdt} [{n}]", u.name()),
            );
        }
    }
}

fn same(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

/// `g · f'(x)` for the given values with `cpu`.
fn run_back(cpu: &dyn tessera::Backend, d: Deriv, gs: &[f32], xs: &[f32]) -> Vec<f64> {
    let mut g = Graph::new();
    let gr = g.new_f32(&[xs.len()]).unwrap();
    let x = g.new_f32(&[xs.len()]).unwrap();
    let y = g.unary_back(gr, x, d).unwrap();
    let mut s = Session::new(g, &[y]).unwrap();
    s.set_f32(gr, gs).unwrap();
    s.set_f32(x, xs).unwrap();
    s.compute(cpu).unwrap();
    s.get_f64(y).unwrap()
}

#[test]
fn unary_back_special_values_follow_the_reference() {
    let xs = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1e-45,
        -1e-45,
        1e-38,
        -3e-39,
        1e30,
        -1e30,
        1e20,
        -1e20,
        88.0,
        88.8,
        89.5,
        -87.0,
        -100.0,
        -103.5,
        -110.0,
        20.0,
        -20.0,
        0.5,
        -0.625,
        0.625,
        -1.0,
        3.0,
        -3.0,
        -0.4,
        0.6,
        1e-4,
    ];
    let gs: Vec<f32> = (0..xs.len()).map(|i| [1.0, -1.5, 0.25][i % 3]).collect();
    let cpus = [
        CpuBackend::with_isa(1, Isa::Scalar),
        CpuBackend::with_isa(2, tessera_cpu::simd::isa()),
    ];
    for d in all_derivs() {
        let want = run_back(&ReferenceBackend, d, &gs, &xs);
        for cpu in &cpus {
            let got = run_back(cpu, d, &gs, &xs);
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                // the reference's own formulas keep about 1e-16 absolute accuracy in the tails
                let ok = same(g, w) || (w.is_finite() && (g - w).abs() <= 4e-6 * w.abs() + 1e-15);
                // exp' overflows where e^x does (the forward exp is inf there too), even when
                // the product with a gradient below 1 would not
                let ok = ok
                    || (d == Deriv::Unary(UnaryOp::Exp)
                        && xs[i].exp().is_infinite()
                        && g.is_infinite());
                assert!(
                    ok,
                    "{} ({:?}) at x = {}: got {g}, reference {w}",
                    deriv_name(d),
                    cpu.isa(),
                    xs[i]
                );
            }
        }
    }
}

/// erfc(a), a >= 0, in f64 without cancellation (as in tests/unary.rs).
fn erfc64(a: f64) -> f64 {
    if a < 2.5 {
        return 1.0 - tessera::ops::unary::erf(a);
    }
    let mut f = a;
    for k in (1..=80).rev() {
        f = a + (k as f64 / 2.0) / f;
    }
    (-a * a).exp() / (std::f64::consts::PI.sqrt() * f)
}

/// The derivative of `x·σ(v)` from `e = e^(-|v|)` and `w = x v'`, in f64 without overflow or
/// cancellation (but at its zero).
fn x_sigma(x: f64, e: f64, w: f64) -> f64 {
    let q = 1.0 + e;
    if x >= 0.0 {
        (q + w * e) / (q * q)
    } else {
        e * (q + w) / (q * q)
    }
}

/// `f'(x)` in f64, accurate in the tails (the reference's `1 - tanh²`, `s(1 - s)`,
/// `0.5(1 + tanh u)`, `0.5(1 + erf z)` keep only about 1e-16 absolute accuracy there).
fn exact_deriv(u: UnaryOp, x: f64) -> f64 {
    match u {
        UnaryOp::Tanh => 1.0 / (x.cosh() * x.cosh()),
        UnaryOp::Sigmoid => {
            let e = (-x.abs()).exp();
            e / ((1.0 + e) * (1.0 + e))
        }
        UnaryOp::Silu => x_sigma(x, (-x.abs()).exp(), x),
        UnaryOp::GeluQuick => x_sigma(x, (-1.702 * x.abs()).exp(), 1.702 * x),
        UnaryOp::Gelu => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            let v = 2.0 * c * x * (1.0 + 0.044715 * x * x);
            let vp = 2.0 * c * (1.0 + 3.0 * 0.044715 * x * x);
            x_sigma(x, (-v.abs()).exp(), x * vp)
        }
        UnaryOp::GeluErf => {
            let a = x.abs() / std::f64::consts::SQRT_2;
            let half = if x < 0.0 {
                0.5 * erfc64(a)
            } else {
                1.0 - 0.5 * erfc64(a)
            };
            half + x * (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt()
        }
        _ => Deriv::Unary(u).eval(x),
    }
}

/// The zero of `f'` in [-2, -0.3] (silu and the gelus have one), by bisection.
fn root(u: UnaryOp) -> Option<f64> {
    let f = |x| exact_deriv(u, x);
    let (mut lo, mut hi) = (-2.0, -0.3);
    if f(lo) * f(hi) > 0.0 {
        return None;
    }
    for _ in 0..200 {
        let m = 0.5 * (lo + hi);
        if f(lo) * f(m) <= 0.0 {
            hi = m;
        } else {
            lo = m;
        }
    }
    Some(0.5 * (lo + hi))
}

/// (max relative error and where, max absolute error) of `f'` over `xs` with grad 1; the
/// relative error over |f'| >= 1e-30 outside ±0.05 of the derivative's zero (where no f32
/// evaluation keeps relative accuracy).
fn deriv_errors(cpu: &CpuBackend, u: UnaryOp, xs: &[f32]) -> (f64, f32, f64) {
    let ones = vec![1f32; xs.len()];
    let got = run_back(cpu, Deriv::Unary(u), &ones, xs);
    let zero = root(u);
    let (mut rel, mut at, mut abs) = (0f64, 0f32, 0f64);
    for (&g, &x) in got.iter().zip(xs) {
        let w = exact_deriv(u, x as f64);
        if !w.is_finite() {
            continue;
        }
        abs = abs.max((g - w).abs());
        if w.abs() < 1e-30 || zero.is_some_and(|z| (x as f64 - z).abs() < 0.05) {
            continue;
        }
        let e = (g - w).abs() / w.abs();
        if e > rel {
            (rel, at) = (e, x);
        }
    }
    (rel, at, abs)
}

#[test]
fn accuracy_of_the_derivatives() {
    let n = 200_000;
    let sweep = |lo: f32, hi: f32| -> Vec<f32> {
        (0..n)
            .map(|i| lo + (hi - lo) * i as f32 / (n - 1) as f32)
            .collect()
    };
    let wide = sweep(-20.0, 20.0);
    let exp_range = sweep(-88.0, 88.0);
    // (function, points, bound on the relative error, bound on the absolute error)
    let cases: [(UnaryOp, &[f32], f64, f64); 8] = [
        (UnaryOp::Exp, &exp_range, 1.5e-7, f64::INFINITY),
        (UnaryOp::Elu, &wide, 1.5e-7, 1e-7),
        (UnaryOp::Sigmoid, &wide, 4e-7, 1e-7),
        (UnaryOp::Tanh, &wide, 4e-7, 3e-7),
        (UnaryOp::Silu, &wide, 5e-7, 3e-7),
        (UnaryOp::GeluQuick, &wide, 7e-7, 3e-7),
        (UnaryOp::Gelu, &wide, 5e-7, 3e-7),
        (UnaryOp::GeluErf, &wide, 3.5e-6, 3e-7),
    ];
    let mut bad = Vec::new();
    for isa in [Isa::Scalar, tessera_cpu::simd::isa()] {
        let cpu = CpuBackend::with_isa(2, isa);
        for &(u, xs, bound, abs_bound) in &cases {
            let (e, at, abs) = deriv_errors(&cpu, u, xs);
            println!(
                "{isa:?} {:>10}': max rel err {e:.2e} (at {at}), max abs err {abs:.2e}",
                u.name()
            );
            if e > bound || abs > abs_bound {
                bad.push(format!(
                    "{} {isa:?}: rel {e:e} at {at}, abs {abs:e}",
                    u.name()
                ));
            }
        }
    }
    assert!(bad.is_empty(), "errors above their bounds: {bad:#?}");
}

// ----- norm_back

fn norm_kinds() -> Vec<NormBackKind> {
    let mut v = vec![
        NormBackKind::Norm { eps: 1e-5 },
        NormBackKind::Rms { eps: 1e-6 },
        NormBackKind::L2 { eps: 1e-12 },
        // rows of uniform(-1, 1) values shorter than 300 have |x| < 10: the constant-scale branch
        NormBackKind::L2 { eps: 10.0 },
    ];
    for n_groups in [1, 2, 3, 4, 7] {
        v.push(NormBackKind::Group {
            n_groups,
            eps: 1e-5,
        });
    }
    v
}

/// Leaves grad and x of shape `dims` (x shifted by `shift`), in layout 0 (dense), 1 (both
/// permuted: dims 1 and 2 swapped, rows dense) or 2 (x transposed: rows not dense, so the
/// fallback runs); then `norm_back`.
fn norm_back_graph(
    dims: [usize; 4],
    layout: usize,
    shift: f32,
    kind: NormBackKind,
) -> (Graph, [TensorId; 2], TensorId) {
    let mut g = Graph::new();
    let (gr, x, gv, xv) = match layout {
        0 => {
            let gr = g.new_f32(&dims).unwrap();
            let x = g.new_f32(&dims).unwrap();
            (gr, x, gr, x)
        }
        1 => {
            let sw = [dims[0], dims[2], dims[1], dims[3]];
            let gr = g.new_f32(&sw).unwrap();
            let x = g.new_f32(&sw).unwrap();
            let p = [0, 2, 1, 3];
            (gr, x, g.permute(gr, p).unwrap(), g.permute(x, p).unwrap())
        }
        _ => {
            let gr = g.new_f32(&dims).unwrap();
            let tr = [dims[1], dims[0], dims[2], dims[3]];
            let x = g.new_f32(&tr).unwrap();
            (gr, x, gr, g.transpose(x).unwrap())
        }
    };
    let xv = if shift != 0.0 {
        g.scale_bias(xv, 1.0, shift).unwrap()
    } else {
        xv
    };
    let y = g.norm_back(gv, xv, kind).unwrap();
    assert_eq!(
        tessera_cpu::ops::fast_path(&g, g.tensor(y)),
        layout < 2 || dims[0] == 1 || dims[1] == 1,
        "{kind:?} layout {layout}: dense rows run on the dedicated kernel, others fall back"
    );
    (g, [gr, x], y)
}

#[test]
fn norm_back_every_kind_and_layout() {
    let mut rng = Rng::new(73);
    let shapes = [
        [1usize, 1, 1, 1],
        [17, 3, 1, 1],
        [7, 5, 6, 2],
        [33, 1, 5, 1],
        [1, 2, 4, 1],
        [4099, 1, 2, 1],
        [64, 3, 3, 3],
    ];
    for kind in norm_kinds() {
        for dims in shapes {
            if dims[0] == 1 && matches!(kind, NormBackKind::L2 { eps } if eps < 1.0) {
                // x/|x| of one value is ±1: its gradient is 0 up to f64 rounding in both
                continue;
            }
            for layout in 0..3 {
                let (g, inputs, y) = norm_back_graph(dims, layout, 0.0, kind);
                check(
                    g,
                    &inputs,
                    y,
                    &mut rng,
                    1e-6,
                    &format!("norm_back {kind:?} {dims:?} layout {layout}"),
                );
            }
        }
    }
}

#[test]
fn norm_back_with_a_large_mean() {
    // x around 1000 with a spread of 1: the mean is found before the centred sums
    let mut rng = Rng::new(74);
    for kind in [
        NormBackKind::Norm { eps: 1e-5 },
        NormBackKind::Group {
            n_groups: 2,
            eps: 1e-5,
        },
        NormBackKind::Rms { eps: 1e-6 },
    ] {
        for dims in [[4096usize, 2, 1, 1], [31, 3, 4, 1]] {
            let (g, inputs, y) = norm_back_graph(dims, 0, 1000.0, kind);
            check(
                g,
                &inputs,
                y,
                &mut rng,
                1e-6,
                &format!("{kind:?} {dims:?} mean 1000"),
            );
        }
    }
}

// ----- get_rows_back

/// Runs `out` on the reference and on every CPU configuration with the given inputs and
/// requires the same bits.
fn check_exact(
    g: Graph,
    f32s: &[(TensorId, Vec<f32>)],
    idx: (TensorId, &[i32]),
    out: TensorId,
    what: &str,
) {
    let mut s = Session::new(g, &[out]).expect("plan");
    for (t, v) in f32s {
        s.set_f32(*t, v).unwrap();
    }
    s.set_i32(idx.0, idx.1).unwrap();
    s.compute(&ReferenceBackend).expect("reference");
    let want = s.get_f32(out).unwrap();
    for cpu in cpu_configs() {
        s.compute(&cpu)
            .unwrap_or_else(|e| panic!("{what}: cpu {:?}/{}t: {e}", cpu.isa(), cpu.n_threads()));
        let got = s.get_f32(out).unwrap();
        if let Some(k) = got
            .iter()
            .zip(&want)
            .position(|(a, b)| a.to_bits() != b.to_bits())
        {
            panic!(
                "{what}: cpu {:?}/{}t differs from the reference at element {k}: {} vs {}",
                cpu.isa(),
                cpu.n_threads(),
                got[k],
                want[k]
            );
        }
    }
}

/// get_rows_back of a `[ne0, n, ne2, ne3]` gradient into `nrows` rows; the gradient is dense,
/// or (`permuted`) a permutation of a `[ne0, ne2, n, ne3]` leaf (dense rows, strided).
fn rows_back_case(
    rng: &mut Rng,
    ne0: usize,
    n: usize,
    planes: [usize; 2],
    nrows: usize,
    idx: &dyn Fn(&mut Rng, usize) -> i32,
    permuted: bool,
) {
    let [ne2, ne3] = planes;
    let mut g = Graph::new();
    let (leaf, grad) = if permuted {
        let l = g.new_f32(&[ne0, ne2, n, ne3]).unwrap();
        (l, g.permute(l, [0, 2, 1, 3]).unwrap())
    } else {
        let l = g.new_f32(&[ne0, n, ne2, ne3]).unwrap();
        (l, l)
    };
    let i = g.new_tensor(DType::I32, &[n, ne2, ne3]).unwrap();
    let y = g.get_rows_back(grad, i, [ne0, nrows, ne2, ne3]).unwrap();
    assert_fast(&g, y);
    let gv: Vec<f32> = (0..ne0 * n * ne2 * ne3)
        .map(|_| rng.uniform(-1.0, 1.0))
        .collect();
    let iv: Vec<i32> = (0..n * ne2 * ne3).map(|k| idx(rng, k)).collect();
    check_exact(
        g,
        &[(leaf, gv)],
        (i, &iv),
        y,
        &format!(
            "get_rows_back ne0 {ne0} n {n} planes {planes:?} rows {nrows} permuted {permuted}"
        ),
    );
}

#[test]
fn get_rows_back_sums_repeated_rows() {
    let mut rng = Rng::new(75);
    for (ne0, n, planes, nrows) in [
        (1usize, 1usize, [1usize, 1usize], 1usize),
        (5, 7, [2, 1], 3),
        (5, 3, [1, 1], 10),
        (17, 40, [3, 2], 6),
        (1, 100, [1, 1], 7),
        (1031, 9, [1, 2], 4),
        (8, 2, [1, 1], 1),
    ] {
        for permuted in [false, true] {
            rows_back_case(
                &mut rng,
                ne0,
                n,
                planes,
                nrows,
                &|r, _| r.below(nrows) as i32,
                permuted,
            );
        }
    }
    // every index the same row; every row once in reverse order; -0 gradients stay exact
    rows_back_case(&mut rng, 33, 500, [1, 1], 9, &|_, _| 4, false);
    rows_back_case(
        &mut rng,
        3,
        50,
        [2, 1],
        50,
        &|_, k| 49 - (k % 50) as i32,
        false,
    );
}

#[test]
fn get_rows_back_of_many_rows() {
    // more than 65535 gathered rows (ggml's grid limit on GPUs): 70 000 into 1000 and into
    // 100 000 rows
    let mut rng = Rng::new(76);
    for nrows in [1000usize, 100_000] {
        rows_back_case(
            &mut rng,
            8,
            70_000,
            [1, 1],
            nrows,
            &|r, _| r.below(nrows) as i32,
            false,
        );
    }
}

#[test]
fn get_rows_back_out_of_range_index_is_an_error() {
    for bad in [5, -1, i32::MAX] {
        let mut g = Graph::new();
        let gr = g.new_f32(&[3, 4]).unwrap();
        let i = g.new_tensor(DType::I32, &[4]).unwrap();
        let y = g.get_rows_back(gr, i, [3, 5, 1, 1]).unwrap();
        let mut s = Session::new(g, &[y]).unwrap();
        s.set_f32(gr, &[0.5; 12]).unwrap();
        s.set_i32(i, &[0, 4, bad, 1]).unwrap();
        let want = s.compute(&ReferenceBackend).unwrap_err().to_string();
        if bad == 5 {
            assert!(want.contains("index 5 at position [2, 0, 0]"), "{want}");
        }
        for cpu in cpu_configs() {
            let got = s.compute(&cpu).unwrap_err().to_string();
            assert_eq!(got, want, "cpu {:?}/{}t", cpu.isa(), cpu.n_threads());
        }
    }
}

// ----- timing (cargo test --release -p tessera-cpu --test backward_ops -- --ignored --nocapture)

fn time(s: &mut Session, b: &dyn tessera::Backend) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = std::time::Instant::now();
        s.compute(b).unwrap();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

fn report(what: &str, s: &mut Session) {
    let r = time(s, &ReferenceBackend);
    let mut line = format!(
        "{what}: reference (the fallback's kernel) {:.1} ms",
        r * 1e3
    );
    for nth in [1, 2] {
        let t = time(s, &CpuBackend::new(nth));
        line += &format!(", {nth}t {:.2} ms ({:.0}x)", t * 1e3, r / t);
    }
    println!("{line}");
}

#[test]
#[ignore]
fn timing_against_the_fallback() {
    let n = 8 << 20;
    let mut rng = Rng::new(77);
    let vals =
        |rng: &mut Rng, n: usize| (0..n).map(|_| rng.uniform(-4.0, 4.0)).collect::<Vec<f32>>();
    for u in [
        UnaryOp::Gelu,
        UnaryOp::GeluErf,
        UnaryOp::Silu,
        UnaryOp::Tanh,
    ] {
        let mut g = Graph::new();
        let gr = g.new_f32(&[n]).unwrap();
        let x = g.new_f32(&[n]).unwrap();
        let y = g.unary_back(gr, x, Deriv::Unary(u)).unwrap();
        let mut s = Session::new(g, &[y]).unwrap();
        s.set_f32(gr, &vals(&mut rng, n)).unwrap();
        s.set_f32(x, &vals(&mut rng, n)).unwrap();
        report(&format!("unary_back {} [{n}]", u.name()), &mut s);
    }
    for kind in [
        NormBackKind::Rms { eps: 1e-6 },
        NormBackKind::Norm { eps: 1e-5 },
        NormBackKind::Group {
            n_groups: 32,
            eps: 1e-5,
        },
    ] {
        let dims = [4096usize, 64, 32, 1];
        let mut g = Graph::new();
        let gr = g.new_f32(&dims).unwrap();
        let x = g.new_f32(&dims).unwrap();
        let y = g.norm_back(gr, x, kind).unwrap();
        let mut s = Session::new(g, &[y]).unwrap();
        s.set_f32(gr, &vals(&mut rng, n)).unwrap();
        s.set_f32(x, &vals(&mut rng, n)).unwrap();
        report(&format!("norm_back {kind:?} {dims:?}"), &mut s);
    }
    let (ne0, rows, nrows) = (1024usize, 8192usize, 4096usize);
    let mut g = Graph::new();
    let gr = g.new_f32(&[ne0, rows]).unwrap();
    let i = g.new_tensor(DType::I32, &[rows]).unwrap();
    let y = g.get_rows_back(gr, i, [ne0, nrows, 1, 1]).unwrap();
    let mut s = Session::new(g, &[y]).unwrap();
    s.set_f32(gr, &vals(&mut rng, ne0 * rows)).unwrap();
    let iv: Vec<i32> = (0..rows).map(|_| rng.below(nrows) as i32).collect();
    s.set_i32(i, &iv).unwrap();
    report(
        &format!("get_rows_back [{ne0}, {rows}] into {nrows} rows"),
        &mut s,
    );
}
