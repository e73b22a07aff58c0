//! CPU unary kernels against the reference: every UnaryOp, scale, leaky_relu and clamp on f32,
//! f16 and bf16; dense, transposed and permuted sources; odd sizes and a long single row split
//! across threads; in-place chains; special values (NaN, ±inf, ±0, subnormals, huge); and the
//! accuracy of the vectorised transcendentals, measured against the f64 reference.
//!
//! Tolerances (relative to the output's largest magnitude): f32 2e-6 (the transcendentals are
//! within a few f32 ulps; see the table in src/ops/unary.rs); f16 outputs 1e-3 and bf16 8e-3 —
//! one rounding of the output to the type (the reference rounds the f64 value, we the f32 one,
//! so a value on a rounding boundary may go either way: one ulp of the type).

mod common;

use common::*;
use tessera::op::UnaryOp;
use tessera::{DType, Graph, ReferenceBackend, Session, TensorId};
use tessera_cpu::{CpuBackend, Isa};

type Build = Box<dyn Fn(&mut Graph, TensorId) -> TensorId>;

fn tol(dt: DType) -> f64 {
    match dt {
        DType::F32 => 2e-6,
        DType::F16 => 1e-3,
        _ => 8e-3,
    }
}

fn assert_fast(g: &Graph, id: TensorId) {
    assert!(
        tessera_cpu::ops::fast_path(g, g.tensor(id)),
        "node {} must run on a dedicated kernel",
        g.tensor(id).op
    );
}

/// The input `x` (scaled by `k` so the functions see a wider range), then `f(x)`.
fn unary_graph(
    dt: DType,
    dims: &[usize],
    layout: usize,
    k: f32,
    op: &dyn Fn(&mut Graph, TensorId) -> TensorId,
) -> (Graph, TensorId, TensorId) {
    let mut g = Graph::new();
    let x = g.new_tensor(dt, dims).unwrap();
    let xs = if k != 1.0 { g.scale(x, k).unwrap() } else { x };
    // a source with the wanted layout, of type dt
    let src = match layout {
        0 => xs,
        1 => g.transpose(xs).unwrap(),
        _ => g.permute(xs, [2, 0, 1, 3]).unwrap(),
    };
    let y = op(&mut g, src);
    assert_fast(&g, y);
    (g, x, y)
}

#[test]
fn every_unary_op_every_type_and_layout() {
    let mut rng = Rng::new(21);
    let shapes: [&[usize]; 6] = [&[1], &[3], &[17, 3], &[1000, 2], &[5, 7, 3], &[33, 1, 2, 2]];
    for u in UnaryOp::ALL {
        for (si, dims) in shapes.iter().enumerate() {
            let dt = [DType::F32, DType::F16, DType::BF16][si % 3];
            for layout in 0..3 {
                if layout == 2 && dims.len() < 3 {
                    continue;
                }
                // a wider range for the activations (within f16's range for exp)
                let k = match u {
                    UnaryOp::Exp => 4.0,
                    UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Sqr => 1.0,
                    _ => 6.0,
                };
                let (g, x, y) = unary_graph(dt, dims, layout, k, &|g, s| g.unary(s, u).unwrap());
                check(
                    g,
                    &[x],
                    y,
                    &mut rng,
                    tol(dt),
                    &format!("{} {dt} {dims:?} layout {layout}", u.name()),
                );
            }
        }
    }
}

#[test]
fn scale_leaky_relu_clamp() {
    let mut rng = Rng::new(22);
    for dt in [DType::F32, DType::F16, DType::BF16] {
        for dims in [&[1usize][..], &[9, 5], &[1031, 3]] {
            for layout in 0..2 {
                let ops: [(&str, Build); 4] = [
                    (
                        "scale",
                        Box::new(|g: &mut Graph, s| g.scale(s, -2.5).unwrap()),
                    ),
                    (
                        "scale_bias",
                        Box::new(|g: &mut Graph, s| g.scale_bias(s, 0.75, 0.3).unwrap()),
                    ),
                    (
                        "leaky_relu",
                        Box::new(|g: &mut Graph, s| g.leaky_relu(s, 0.1).unwrap()),
                    ),
                    (
                        "clamp",
                        Box::new(|g: &mut Graph, s| g.clamp(s, -0.4, 0.6).unwrap()),
                    ),
                ];
                for (name, f) in ops {
                    let (g, x, y) = unary_graph(dt, dims, layout, 1.0, &*f);
                    check(
                        g,
                        &[x],
                        y,
                        &mut rng,
                        tol(dt),
                        &format!("{name} {dt} {dims:?} layout {layout}"),
                    );
                }
            }
        }
    }
}

#[test]
fn a_long_row_is_split_across_threads() {
    let mut rng = Rng::new(23);
    for (u, n) in [
        (UnaryOp::Silu, 100_003usize),
        (UnaryOp::GeluErf, 4099),
        (UnaryOp::Tanh, 65),
    ] {
        for dt in [DType::F32, DType::F16] {
            let (g, x, y) = unary_graph(dt, &[n], 0, 5.0, &|g, s| g.unary(s, u).unwrap());
            check(
                g,
                &[x],
                y,
                &mut rng,
                tol(dt),
                &format!("{} {dt} [{n}]", u.name()),
            );
        }
    }
}

#[test]
fn in_place_chains() {
    let mut rng = Rng::new(24);
    for dt in [DType::F32, DType::F16] {
        let mut g = Graph::new();
        let x = g.new_tensor(dt, &[37, 11]).unwrap();
        let a = g.scale(x, 3.0).unwrap();
        let b = g.neg(a).unwrap();
        let c = g.exp(b).unwrap();
        let d = g.unary(c, UnaryOp::Sqrt).unwrap();
        let e = g.silu(d).unwrap();
        let f = g.clamp(e, 0.0, 2.0).unwrap();
        let s = Session::new(g.clone(), &[f]).unwrap();
        assert!(
            s.plan().inplace.len() >= 4,
            "the chain runs in place: {:?}",
            s.plan().inplace
        );
        check(
            g,
            &[x],
            f,
            &mut rng,
            tol(dt),
            &format!("in-place chain {dt}"),
        );
    }
}

/// Runs `u` on the given f32 values with `cpu`; returns the output.
fn run_values(
    cpu: &dyn tessera::Backend,
    dt: DType,
    f: &dyn Fn(&mut Graph, TensorId) -> TensorId,
    xs: &[f32],
) -> Vec<f64> {
    let mut g = Graph::new();
    let x = g.new_tensor(dt, &[xs.len()]).unwrap();
    let y = f(&mut g, x);
    let mut s = Session::new(g, &[y]).unwrap();
    s.set_f32(x, xs).unwrap();
    s.compute(cpu).unwrap();
    s.get_f64(y).unwrap()
}

fn same(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

#[test]
fn special_values_follow_the_reference() {
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
        1e-4,
    ];
    let cpus = [
        CpuBackend::with_isa(1, Isa::Scalar),
        CpuBackend::with_isa(2, tessera_cpu::simd::isa()),
    ];
    for u in UnaryOp::ALL {
        let f = |g: &mut Graph, x| g.unary(x, u).unwrap();
        let want = run_values(&ReferenceBackend, DType::F32, &f, &xs);
        for cpu in &cpus {
            let got = run_values(cpu, DType::F32, &f, &xs);
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                let ok = same(g, w) || (w.is_finite() && (g - w).abs() <= 4e-6 * w.abs() + 1e-37);
                assert!(
                    ok,
                    "{} ({:?}) of {}: got {g}, reference {w}",
                    u.name(),
                    cpu.isa(),
                    xs[i]
                );
            }
        }
    }
    // relu, step, sgn, leaky_relu of NaN give 0; clamp keeps NaN
    let nan = [f32::NAN];
    let cpu = CpuBackend::with_isa(1, tessera_cpu::simd::isa());
    for (name, f, want) in [
        (
            "relu",
            Box::new(|g: &mut Graph, x| g.relu(x).unwrap()) as Build,
            0.0,
        ),
        (
            "step",
            Box::new(|g: &mut Graph, x| g.unary(x, UnaryOp::Step).unwrap()),
            0.0,
        ),
        (
            "sgn",
            Box::new(|g: &mut Graph, x| g.unary(x, UnaryOp::Sgn).unwrap()),
            0.0,
        ),
        (
            "leaky_relu",
            Box::new(|g: &mut Graph, x| g.leaky_relu(x, 0.1).unwrap()),
            0.0,
        ),
        (
            "clamp",
            Box::new(|g: &mut Graph, x| g.clamp(x, -1.0, 1.0).unwrap()),
            1.0, // ggml's MAX(MIN(x, max), min): NaN becomes max
        ),
    ] {
        let got = run_values(&cpu, DType::F32, &*f, &nan)[0];
        assert!(same(got, want), "{name}(NaN) = {got}, want {want}");
    }
}

/// erfc(a), a >= 0, in f64 without cancellation: `1 - erf` while erfc >= 4e-4, then the
/// continued fraction (as the reference's erf uses it).
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

/// `u(x)` in f64. gelu and gelu_erf in a form without the cancellation of `1 + tanh(u)` /
/// `1 + erf(z)` that the reference's formulas have in their negative tails (there the reference
/// keeps only about 1e-16 absolute accuracy, far less than f32's relative precision).
fn exact(u: UnaryOp, x: f64) -> f64 {
    match u {
        UnaryOp::Gelu => {
            let v = 2.0 * (2.0 / std::f64::consts::PI).sqrt() * x * (1.0 + 0.044715 * x * x);
            x / (1.0 + (-v).exp())
        }
        UnaryOp::GeluErf => {
            let z = x / std::f64::consts::SQRT_2;
            0.5 * x * if z < 0.0 { erfc64(-z) } else { 2.0 - erfc64(z) }
        }
        _ => u.eval(x),
    }
}

/// Max relative error (values with |exact| >= 1e-30) of `u` over `xs`.
fn max_rel_err(cpu: &CpuBackend, u: UnaryOp, xs: &[f32]) -> (f64, f32) {
    let f = |g: &mut Graph, x| g.unary(x, u).unwrap();
    let got = run_values(cpu, DType::F32, &f, xs);
    let mut worst = (0f64, 0f32);
    for (&g, &x) in got.iter().zip(xs) {
        let w = exact(u, x as f64);
        if w.abs() < 1e-30 || !w.is_finite() {
            continue;
        }
        let e = (g - w).abs() / w.abs();
        if e > worst.0 {
            worst = (e, x);
        }
    }
    worst
}

#[test]
fn accuracy_of_the_transcendentals() {
    let n = 200_000;
    let sweep = |lo: f32, hi: f32| -> Vec<f32> {
        (0..n)
            .map(|i| lo + (hi - lo) * i as f32 / (n - 1) as f32)
            .collect()
    };
    let wide = sweep(-20.0, 20.0);
    let near = sweep(-5.0, 5.0);
    let exp_range = sweep(-88.0, 88.0);
    let logs: Vec<f32> = (0..n)
        .map(|i| 10f32.powf(-30.0 + 60.0 * i as f32 / (n - 1) as f32))
        .collect();
    // bounds: a few f32 ulps (measured figures are in src/ops/unary.rs's header)
    type Case<'a> = (UnaryOp, &'a [f32], f64, &'a [f32], f64);
    let cases: [Case; 9] = [
        (UnaryOp::Exp, &exp_range, 2e-7, &near, 2e-7),
        (UnaryOp::Sigmoid, &wide, 3e-7, &near, 3e-7),
        (UnaryOp::Silu, &wide, 3e-7, &near, 3e-7),
        (UnaryOp::Tanh, &wide, 3e-7, &near, 3e-7),
        (UnaryOp::Elu, &wide, 2e-7, &near, 2e-7),
        (UnaryOp::GeluQuick, &wide, 3e-7, &near, 3e-7),
        (UnaryOp::Gelu, &wide, 3e-7, &near, 3e-7),
        (UnaryOp::GeluErf, &wide, 6e-7, &near, 6e-7),
        (UnaryOp::Log, &logs, 2e-7, &near, 2e-7),
    ];
    let mut bad = Vec::new();
    for isa in [Isa::Scalar, tessera_cpu::simd::isa()] {
        let cpu = CpuBackend::with_isa(2, isa);
        for (u, xs, bound, xs2, bound2) in cases {
            let (e, at) = max_rel_err(&cpu, u, xs);
            let (e2, at2) = max_rel_err(&cpu, u, xs2);
            println!(
                "{:?} {:>10}: max rel err {e:.2e} (at {at}); on [-5, 5] {e2:.2e} (at {at2})",
                isa,
                u.name()
            );
            if e > bound || e2 > bound2 {
                bad.push(format!(
                    "{} {:?}: {e:e} at {at}, {e2:e} at {at2} on [-5, 5]",
                    u.name(),
                    isa
                ));
            }
        }
    }
    assert!(bad.is_empty(), "errors above their bounds: {bad:#?}");
    // the absolute error of erf inside gelu_erf: |got - want| / |x/2| = |Δ(1 + erf(x/√2))|
    for isa in [Isa::Scalar, tessera_cpu::simd::isa()] {
        let cpu = CpuBackend::with_isa(2, isa);
        let xs: Vec<f32> = near.iter().filter(|x| x.abs() > 1e-3).copied().collect();
        let got = run_values(
            &cpu,
            DType::F32,
            &|g, x| g.unary(x, UnaryOp::GeluErf).unwrap(),
            &xs,
        );
        let worst = got
            .iter()
            .zip(&xs)
            .map(|(&g, &x)| (g - exact(UnaryOp::GeluErf, x as f64)).abs() / (0.5 * x.abs() as f64))
            .fold(0f64, f64::max);
        println!("{isa:?} erf absolute error {worst:.2e}");
        assert!(worst < 1e-6, "{isa:?}: erf's absolute error {worst:e}");
    }
}

/// Nanoseconds this thread has run on a CPU (Linux x86_64; elsewhere 0, and wall time is used).
fn cpu_ns() -> u64 {
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    {
        #[repr(C)]
        struct Timespec {
            sec: i64,
            nsec: i64,
        }
        extern "C" {
            fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
        }
        const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
        let mut t = Timespec { sec: 0, nsec: 0 };
        // SAFETY: libc's clock_gettime writes one timespec (two i64 on x86_64 Linux) to `t`.
        if unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut t) } == 0 {
            return t.sec as u64 * 1_000_000_000 + t.nsec as u64;
        }
    }
    0
}

/// `cargo test -p tessera-cpu --test unary -- --ignored --nocapture`: nanoseconds per element
/// of some activations on `N` (default 4M) f32, AVX2 with one and two threads, and scalar. With
/// one thread the time is the thread's CPU time, so a busy machine does not inflate it.
#[test]
#[ignore]
fn activation_throughput() {
    let n: usize = std::env::var("N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4 << 20);
    for u in [
        UnaryOp::Exp,
        UnaryOp::Silu,
        UnaryOp::Gelu,
        UnaryOp::GeluErf,
        UnaryOp::Tanh,
        UnaryOp::Relu,
    ] {
        let mut g = Graph::new();
        let x = g.new_f32(&[n]).unwrap();
        let y = g.unary(x, u).unwrap();
        let mut s = Session::new(g, &[y]).unwrap();
        let v: Vec<f32> = (0..n).map(|i| (i % 2000) as f32 * 0.005 - 5.0).collect();
        s.set_f32(x, &v).unwrap();
        for (isa, th) in [
            (tessera_cpu::simd::isa(), 1),
            (tessera_cpu::simd::isa(), 2),
            (Isa::Scalar, 1),
        ] {
            let cpu = CpuBackend::with_isa(th, isa);
            s.compute(&cpu).unwrap();
            let t = (0..(5 + (1 << 24) / n))
                .map(|_| {
                    let (t, c) = (std::time::Instant::now(), cpu_ns());
                    s.compute(&cpu).unwrap();
                    if th == 1 && c > 0 {
                        // on-CPU time of this thread (the machine may be shared)
                        (cpu_ns() - c) as f64 * 1e-9
                    } else {
                        t.elapsed().as_secs_f64()
                    }
                })
                .fold(f64::MAX, f64::min);
            println!(
                "{:>10} {isa:?} {th}t: {:.2} ns/element",
                u.name(),
                t * 1e9 / n as f64
            );
        }
    }
}
