//! CPU mul_mat against the reference: f32/f16/bf16 weights, mat-vec and GEMM paths, odd sizes,
//! transposed (strided) operands, broadcasting over dims 2 and 3, any thread count and ISA.

mod common;

use common::*;
use tessera::{DType, Graph};

#[test]
fn mul_mat_matches_the_reference() {
    let mut rng = Rng::new(11);
    let sizes = [1usize, 3, 8, 17, 33, 64, 130];
    for case in 0..60 {
        let dt = rng.pick(&[DType::F32, DType::F16, DType::BF16]);
        let k = rng.pick(&sizes) + if case % 7 == 0 { 300 } else { 0 };
        let m = rng.pick(&sizes);
        let n = if case % 3 == 0 {
            1 + rng.below(4)
        } else {
            rng.pick(&sizes)
        };
        let (a2, a3) = (rng.pick(&[1usize, 2]), 1);
        let (b2, b3) = (a2 * rng.pick(&[1usize, 2]), a3 * rng.pick(&[1usize, 2]));
        let mut g = Graph::new();
        let a = g.new_tensor(dt, &[k, m, a2, a3]).unwrap();
        let b = g.new_f32(&[k, n, b2, b3]).unwrap();
        let y = g.mul_mat(a, b).unwrap();
        check(
            g,
            &[a, b],
            y,
            &mut rng,
            1e-5,
            &format!("mul_mat {dt} k={k} m={m} n={n} a2={a2} b2={b2} b3={b3}"),
        );
    }
}

#[test]
fn mul_mat_with_transposed_operands() {
    let mut rng = Rng::new(12);
    for (k, m, n) in [(5, 7, 9), (64, 17, 3), (33, 40, 20), (300, 50, 70)] {
        let mut g = Graph::new();
        let at = g.new_f32(&[m, k]).unwrap();
        let a = g.transpose(at).unwrap(); // [k, m] with k strided
        let bt = g.new_f32(&[n, k]).unwrap();
        let b = g.transpose(bt).unwrap();
        let y = g.mul_mat(a, b).unwrap();
        check(
            g,
            &[at, bt],
            y,
            &mut rng,
            1e-5,
            &format!("mul_mat transposed k={k} m={m} n={n}"),
        );
    }
}

#[test]
fn large_gemm_blocks_across_k() {
    let mut rng = Rng::new(13);
    let mut g = Graph::new();
    let a = g.new_tensor(DType::F16, &[600, 150]).unwrap();
    let b = g.new_f32(&[600, 200]).unwrap();
    let y = g.mul_mat(a, b).unwrap();
    check(g, &[a, b], y, &mut rng, 1e-5, "mul_mat 600x150x200 f16");
}
