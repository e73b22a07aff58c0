//! CPU opt_step_adamw and opt_step_sgd against the reference: odd and long shapes (a long
//! single row is split across threads), a transposed gradient, a permuted moment, hyper-
//! parameters computed in the graph (|x|: all in [0, 1), so every square root is real).
//!
//! Tolerance: 1e-5 of the output's magnitude. The kernels compute in f32 like ggml (the AVX2
//! path with the scalar path's exact operations); measured ≤ 3e-7.

mod common;

use common::*;
use tessera::{Graph, TensorId};

const TOL: f64 = 1e-5;

fn assert_fast(g: &Graph, y: TensorId) {
    assert!(
        tessera_cpu::ops::fast_path(g, g.tensor(y)),
        "{} should run on a dedicated kernel",
        g.tensor(y).op
    );
}

const SHAPES: [[usize; 4]; 7] = [
    [1, 1, 1, 1],
    [3, 1, 1, 1],
    [17, 3, 1, 1],
    [5, 3, 2, 2],
    [1000, 3, 1, 1],
    [10007, 1, 1, 1],
    [3, 1000, 1, 1],
];

#[test]
fn adamw_step() {
    let mut rng = Rng::new(71);
    for ne in SHAPES {
        for layout in 0..2 {
            let mut g = Graph::new();
            let w = g.new_f32(&ne).unwrap();
            g.set_param(w).unwrap();
            let (gl, gr) = if layout == 1 {
                let gl = g.new_f32(&[ne[1], ne[0], ne[2], ne[3]]).unwrap();
                (gl, g.transpose(gl).unwrap())
            } else {
                let gl = g.new_f32(&ne).unwrap();
                (gl, gl)
            };
            let m = g.new_f32(&ne).unwrap();
            let vl = g.new_f32(&ne).unwrap();
            let v = g.sqr(vl).unwrap(); // second moments are never negative
            let hl = g.new_f32(&[7]).unwrap();
            let h = g.abs(hl).unwrap();
            let y = g.opt_step_adamw(w, gr, m, v, h).unwrap();
            assert_fast(&g, y);
            check(
                g,
                &[w, gl, m, vl, hl],
                y,
                &mut rng,
                TOL,
                &format!("adamw {ne:?} layout {layout}"),
            );
        }
    }
}

#[test]
fn adamw_with_permuted_moment() {
    let mut rng = Rng::new(72);
    let mut g = Graph::new();
    let w = g.new_f32(&[6, 4, 3]).unwrap();
    g.set_param(w).unwrap();
    let gr = g.new_f32(&[6, 4, 3]).unwrap();
    let ml = g.new_f32(&[4, 3, 6]).unwrap();
    let m = g.permute(ml, [1, 2, 0, 3]).unwrap();
    let vl = g.new_f32(&[6, 4, 3]).unwrap();
    let v = g.sqr(vl).unwrap();
    let hl = g.new_f32(&[7]).unwrap();
    let h = g.abs(hl).unwrap();
    let y = g.opt_step_adamw(w, gr, m, v, h).unwrap();
    assert_fast(&g, y);
    check(
        g,
        &[w, gr, ml, vl, hl],
        y,
        &mut rng,
        TOL,
        "adamw permuted m",
    );
}

#[test]
fn sgd_step() {
    let mut rng = Rng::new(73);
    for ne in SHAPES {
        for layout in 0..2 {
            let mut g = Graph::new();
            let w = g.new_f32(&ne).unwrap();
            g.set_param(w).unwrap();
            let (gl, gr) = if layout == 1 {
                let gl = g.new_f32(&[ne[1], ne[0], ne[2], ne[3]]).unwrap();
                (gl, g.transpose(gl).unwrap())
            } else {
                let gl = g.new_f32(&ne).unwrap();
                (gl, gl)
            };
            let h = g.new_f32(&[2]).unwrap();
            let y = g.opt_step_sgd(w, gr, h).unwrap();
            assert_fast(&g, y);
            check(
                g,
                &[w, gl, h],
                y,
                &mut rng,
                TOL,
                &format!("sgd {ne:?} layout {layout}"),
            );
        }
    }
}
