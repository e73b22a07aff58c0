//! CPU rope_ext against the reference: normal and neox modes, partial n_dims (with the vector
//! body and the scalar tail), freq_scale, attn_factor, YaRN, freq_factors, positions up to 10⁵,
//! f32 and f16 inputs, permuted and transposed (strided-element) inputs.
//!
//! Tolerances (relative to the output's max magnitude): the CPU kernel computes the angles as
//! ggml does, in f32 by repeated multiplication (so that models reproduce llama.cpp; it agrees
//! with ggml's CPU bit for bit on the golden rope cases, see `tessera conformance ops`), whose
//! error grows with the position: f32 `2e-6 + 4e-7·p_max` (YaRN's f32 ramp adds about 5e-4);
//! f16 1e-3 on top (one f16 ulp of rounding).

mod common;

use common::*;
use tessera::op::RopeParams;
use tessera::{DType, Graph, ReferenceBackend, Session, TensorId};

enum Val {
    F(Vec<f32>),
    I(Vec<i32>),
}

fn assert_fast(g: &Graph, y: TensorId) {
    assert!(
        tessera_cpu::ops::fast_path(g, g.tensor(y)),
        "{} should run on a dedicated kernel",
        g.tensor(y).op
    );
}

/// Like `common::check`, with the inputs' values given (set again before every run).
fn check_values(g: Graph, inputs: &[(TensorId, Val)], out: TensorId, tol: f64, what: &str) {
    // ggml's f32 angles drift with the position (see the module docs)
    let p_max = inputs
        .iter()
        .filter_map(|(_, v)| match v {
            Val::I(p) => p.iter().map(|x| x.unsigned_abs() as f64).reduce(f64::max),
            Val::F(_) => None,
        })
        .fold(0.0, f64::max);
    let yarn = what.contains("yarn");
    let tol = tol + 4e-7 * p_max + if yarn { 5e-4 } else { 0.0 };
    let mut s = Session::new(g, &[out]).expect("plan");
    let set = |s: &mut Session| {
        for (i, v) in inputs {
            match v {
                Val::F(v) => s.set_f32(*i, v).unwrap(),
                Val::I(v) => s.set_i32(*i, v).unwrap(),
            }
        }
    };
    set(&mut s);
    s.compute(&ReferenceBackend).expect("reference");
    let want = s.get_f64(out).unwrap();
    let scale = want.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-30);
    let mut first: Vec<(tessera_cpu::Isa, Vec<f32>)> = Vec::new();
    for cpu in cpu_configs() {
        set(&mut s);
        s.compute(&cpu).unwrap();
        let got = s.get_f32(out).unwrap();
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            let err = (g as f64 - w).abs() / scale;
            assert!(
                err <= tol,
                "{what}: cpu {:?}/{}t: element {i}: got {g}, reference {w} (error {err:e})",
                cpu.isa(),
                cpu.n_threads()
            );
        }
        match first.iter().find(|(isa, _)| *isa == cpu.isa()) {
            Some((_, f)) => assert!(
                f.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: results differ between thread counts on {:?}",
                cpu.isa()
            ),
            None => first.push((cpu.isa(), got)),
        }
    }
}

fn rand_vec(rng: &mut Rng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.uniform(lo, hi)).collect()
}

fn tol(dt: DType) -> f64 {
    if dt == DType::F16 {
        1e-3
    } else {
        2e-6
    }
}

#[test]
fn modes_partial_dims_freq_factors_and_types() {
    let mut rng = Rng::new(51);
    for (ne, n_dims) in [
        ([2usize, 1, 1, 1], 2usize),
        ([6, 3, 1, 1], 4),
        ([10, 2, 3, 1], 10),
        ([18, 1, 17, 1], 18),
        ([16, 3, 5, 2], 8),
        ([80, 3, 3, 1], 64),
        ([128, 4, 7, 1], 128),
        ([34, 2, 2, 1], 34),
    ] {
        for mode in [0, 2] {
            for with_ff in [false, true] {
                for dt in [DType::F32, DType::F16] {
                    let mut p = RopeParams::new(n_dims, mode);
                    p.freq_base = rng.pick(&[10000.0, 500.0, 1e6]);
                    p.freq_scale = rng.pick(&[1.0, 0.5, 0.25]);
                    p.attn_factor = rng.pick(&[1.0, 1.25]);
                    let mut g = Graph::new();
                    let a = g.new_tensor(dt, &ne).unwrap();
                    let pos = g.new_tensor(DType::I32, &[ne[2]]).unwrap();
                    let ff = with_ff.then(|| g.new_f32(&[n_dims / 2]).unwrap());
                    let y = g.rope_ext(a, pos, ff, p).unwrap();
                    assert_fast(&g, y);
                    let mut inputs = vec![
                        (
                            a,
                            Val::F(rand_vec(&mut rng, ne.iter().product(), -2.0, 2.0)),
                        ),
                        (
                            pos,
                            Val::I((0..ne[2]).map(|_| rng.below(100_000) as i32).collect()),
                        ),
                    ];
                    if let Some(f) = ff {
                        inputs.push((f, Val::F(rand_vec(&mut rng, n_dims / 2, 0.5, 4.0))));
                    }
                    check_values(
                        g,
                        &inputs,
                        y,
                        tol(dt),
                        &format!("rope {dt} {ne:?} n_dims={n_dims} mode={mode} ff={with_ff} {p:?}"),
                    );
                }
            }
        }
    }
}

#[test]
fn yarn() {
    let mut rng = Rng::new(52);
    for (n_dims, d, mode, freq_scale, ext_factor, beta_fast, beta_slow) in [
        (64usize, 64usize, 0, 0.25f32, 1.0f32, 32.0f32, 1.0f32),
        (64, 96, 2, 0.25, 1.0, 32.0, 1.0),
        (128, 128, 2, 0.125, 0.5, 32.0, 1.0),
        (32, 40, 0, 0.5, 1.0, 8.0, 2.0),
        (16, 16, 2, 1.0, 1.0, 64.0, 64.0), // an empty ramp: corr dims clamp to 0.001
    ] {
        for dt in [DType::F32, DType::F16] {
            let mut p = RopeParams::new(n_dims, mode);
            p.n_ctx_orig = 4096;
            p.freq_scale = freq_scale;
            p.ext_factor = ext_factor;
            p.attn_factor = 1.0;
            p.beta_fast = beta_fast;
            p.beta_slow = beta_slow;
            let (h, t) = (3, 9);
            let mut g = Graph::new();
            let a = g.new_tensor(dt, &[d, h, t]).unwrap();
            let pos = g.new_tensor(DType::I32, &[t]).unwrap();
            let y = g.rope_ext(a, pos, None, p).unwrap();
            assert_fast(&g, y);
            let inputs = [
                (a, Val::F(rand_vec(&mut rng, d * h * t, -1.0, 1.0))),
                (
                    pos,
                    Val::I((0..t).map(|_| rng.below(20_000) as i32).collect()),
                ),
            ];
            check_values(g, &inputs, y, tol(dt), &format!("rope yarn {dt} {p:?}"));
        }
    }
}

#[test]
fn permuted_and_transposed_inputs() {
    let mut rng = Rng::new(53);
    for dt in [DType::F32, DType::F16] {
        for mode in [0, 2] {
            // q as [d, t, h] permuted to [d, h, t]: dense rows, permuted outer dims
            let (d, h, t) = (24, 3, 5);
            let mut g = Graph::new();
            let a = g.new_tensor(dt, &[d, t, h]).unwrap();
            let v = g.permute(a, [0, 2, 1, 3]).unwrap();
            let pos = g.new_tensor(DType::I32, &[t]).unwrap();
            let y = g.rope(v, pos, 16, mode).unwrap();
            assert_fast(&g, y);
            let inputs = [
                (a, Val::F(rand_vec(&mut rng, d * h * t, -1.0, 1.0))),
                (pos, Val::I((0..t as i32).map(|i| 3 * i + 1).collect())),
            ];
            check_values(
                g,
                &inputs,
                y,
                tol(dt),
                &format!("rope permuted {dt} mode={mode}"),
            );
            // a transposed matrix: rows of 12 elements at a stride of 7 elements
            let mut g = Graph::new();
            let a = g.new_tensor(dt, &[7, 12]).unwrap();
            let v = g.transpose(a).unwrap();
            let pos = g.new_tensor(DType::I32, &[1]).unwrap();
            let y = g.rope(v, pos, 10, mode).unwrap();
            assert_fast(&g, y);
            let inputs = [
                (a, Val::F(rand_vec(&mut rng, 84, -1.0, 1.0))),
                (pos, Val::I(vec![12345])),
            ];
            check_values(
                g,
                &inputs,
                y,
                tol(dt),
                &format!("rope transposed {dt} mode={mode}"),
            );
        }
    }
}

#[test]
fn rope_in_a_chain() {
    // x -> neg -> rope -> scale: the rope output feeds an in-place op
    let mut rng = Rng::new(54);
    let mut g = Graph::new();
    let a = g.new_f32(&[64, 4, 6]).unwrap();
    let n = g.neg(a).unwrap();
    let pos = g.new_tensor(DType::I32, &[6]).unwrap();
    let r = g.rope(n, pos, 64, 2).unwrap();
    let y = g.scale(r, 0.5).unwrap();
    check(g, &[a, pos], y, &mut rng, 2e-6, "neg -> rope -> scale");
}
