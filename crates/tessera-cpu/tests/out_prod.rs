//! CPU out_prod against the reference: f32/f16/bf16 `a`, odd sizes, K beyond one packed block
//! (128) and M beyond one row chunk (64), broadcasting over dims 2 and 3, transposed operands
//! (ggml's backward of mul_mat feeds out_prod transposed views), and a long single row of `b`
//! split across threads.
//!
//! Tolerance: 1e-5 of the output's magnitude (f32 sums in a fixed order; measured ≤ 2e-7).

mod common;

use common::*;
use tessera::{DType, Graph, TensorId};

const TOL: f64 = 1e-5;

fn assert_fast(g: &Graph, y: TensorId) {
    assert!(
        tessera_cpu::ops::fast_path(g, g.tensor(y)),
        "{} should run on a dedicated kernel",
        g.tensor(y).op
    );
}

#[test]
fn out_prod_matches_the_reference() {
    let mut rng = Rng::new(101);
    let sizes = [1usize, 3, 4, 16, 17, 64, 65, 130];
    for case in 0..48 {
        let dt = [DType::F32, DType::F16, DType::BF16][case % 3];
        let m = rng.pick(&sizes);
        let n = rng.pick(&sizes);
        let k = rng.pick(&sizes) + if case % 5 == 0 { 300 } else { 0 };
        let (a2, a3) = (rng.pick(&[1usize, 2]), rng.pick(&[1usize, 2]));
        let (b2, b3) = (a2 * rng.pick(&[1usize, 3]), a3 * rng.pick(&[1usize, 2]));
        let mut g = Graph::new();
        let a = g.new_tensor(dt, &[m, k, a2, a3]).unwrap();
        let b = g.new_f32(&[n, k, b2, b3]).unwrap();
        let y = g.out_prod(a, b).unwrap();
        assert_fast(&g, y);
        check(
            g,
            &[a, b],
            y,
            &mut rng,
            TOL,
            &format!("out_prod {dt} m={m} n={n} k={k} a=[{a2},{a3}] b=[{b2},{b3}]"),
        );
    }
}

#[test]
fn out_prod_with_transposed_operands() {
    let mut rng = Rng::new(102);
    for (m, n, k) in [
        (5usize, 7usize, 9usize),
        (70, 3, 200),
        (17, 40, 1),
        (1, 1000, 33),
    ] {
        for dt in [DType::F32, DType::F16] {
            let mut g = Graph::new();
            let al = g.new_tensor(dt, &[k, m]).unwrap();
            let a = g.transpose(al).unwrap(); // [m, k] strided along m
            let bl = g.new_f32(&[k, n]).unwrap();
            let b = g.transpose(bl).unwrap(); // [n, k]
            let y = g.out_prod(a, b).unwrap();
            assert_fast(&g, y);
            check(
                g,
                &[al, bl],
                y,
                &mut rng,
                TOL,
                &format!("out_prod transposed {dt} m={m} n={n} k={k}"),
            );
        }
    }
    // an in-place chain feeding b
    let mut g = Graph::new();
    let a = g.new_f32(&[33, 20]).unwrap();
    let bl = g.new_f32(&[19, 20]).unwrap();
    let nb = g.neg(bl).unwrap();
    let b = g.exp(nb).unwrap();
    let y = g.out_prod(a, b).unwrap();
    check(g, &[a, bl], y, &mut rng, TOL, "neg -> exp -> out_prod");
}
