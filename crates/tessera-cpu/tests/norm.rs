//! CPU norm, rms_norm, l2_norm and group_norm against the reference: odd and long rows,
//! transposed / permuted / strided-view inputs, rows with a large mean, chains of norms.
//!
//! Tolerance: 1e-6 of the output's max magnitude. The sums are accumulated in f64; the only
//! f32 roundings are of the mean, the scale and the final product (measured ≤ 1e-7).

mod common;

use common::*;
use tessera::{Graph, TensorId};

const TOL: f64 = 1e-6;

fn build(g: &mut Graph, kind: &str, a: TensorId, eps: f32) -> TensorId {
    match kind {
        "norm" => g.norm(a, eps),
        "rms_norm" => g.rms_norm(a, eps),
        _ => g.l2_norm(a, eps),
    }
    .unwrap()
}

fn assert_fast(g: &Graph, y: TensorId) {
    assert!(
        tessera_cpu::ops::fast_path(g, g.tensor(y)),
        "{} should run on a dedicated kernel",
        g.tensor(y).op
    );
}

#[test]
fn row_norms_on_random_shapes() {
    let mut rng = Rng::new(31);
    let shapes: [[usize; 4]; 8] = [
        [1, 1, 1, 1],
        [3, 1, 1, 1],
        [17, 3, 1, 2],
        [3, 17, 2, 1],
        [64, 5, 3, 1],
        [1000, 3, 1, 1],
        [1031, 2, 2, 1],
        [5000, 1, 1, 1],
    ];
    for kind in ["norm", "rms_norm", "l2_norm"] {
        for ne in shapes {
            let eps = rng.pick(&[0.0f32, 1e-6, 1e-5]);
            let mut g = Graph::new();
            let a = g.new_f32(&ne).unwrap();
            let y = build(&mut g, kind, a, eps);
            assert_fast(&g, y);
            check(
                g,
                &[a],
                y,
                &mut rng,
                TOL,
                &format!("{kind} {ne:?} eps={eps}"),
            );
        }
    }
}

#[test]
fn row_norms_on_views() {
    let mut rng = Rng::new(32);
    for kind in ["norm", "rms_norm", "l2_norm"] {
        // transposed: rows of 37 at stride 5 floats
        let mut g = Graph::new();
        let a = g.new_f32(&[5, 37]).unwrap();
        let t = g.transpose(a).unwrap();
        let y = build(&mut g, kind, t, 1e-6);
        assert_fast(&g, y);
        check(g, &[a], y, &mut rng, TOL, &format!("{kind} transposed"));
        // permuted 3-d
        let mut g = Graph::new();
        let a = g.new_f32(&[4, 3, 19]).unwrap();
        let p = g.permute(a, [1, 2, 0, 3]).unwrap();
        let y = build(&mut g, kind, p, 1e-6);
        check(g, &[a], y, &mut rng, TOL, &format!("{kind} permuted"));
        // a view with dense rows but padded row stride (every other row of 33)
        let mut g = Graph::new();
        let a = g.new_f32(&[33, 10]).unwrap();
        let v = g.view(a, &[33, 5], &[2 * 33 * 4], 0).unwrap();
        let y = build(&mut g, kind, v, 1e-6);
        check(g, &[a], y, &mut rng, TOL, &format!("{kind} strided rows"));
    }
}

#[test]
fn layer_norm_of_rows_with_a_large_mean() {
    // x + 50 with x in [-1, 1): the variance is small next to the mean
    let mut rng = Rng::new(33);
    for n in [7usize, 300, 4099] {
        let mut g = Graph::new();
        let a = g.new_f32(&[n, 3]).unwrap();
        let b = g.scale_bias(a, 1.0, 50.0).unwrap();
        let y = g.norm(b, 1e-5).unwrap();
        // f32 x + 50 is exact to 2^-18 so the reference sees the same values; our mean is
        // rounded to f32 (an error of 50·2^-24 against deviations of ~0.5)
        check(g, &[a], y, &mut rng, 1e-5, &format!("norm of x+50, n={n}"));
    }
}

#[test]
fn chained_norms() {
    let mut rng = Rng::new(34);
    let mut g = Graph::new();
    let a = g.new_f32(&[129, 7, 2]).unwrap();
    let n1 = g.neg(a).unwrap();
    let n2 = g.rms_norm(n1, 1e-6).unwrap();
    let n3 = g.norm(n2, 1e-6).unwrap();
    let y = g.l2_norm(n3, 1e-6).unwrap();
    check(
        g,
        &[a],
        y,
        &mut rng,
        TOL,
        "neg -> rms_norm -> norm -> l2_norm",
    );
}

#[test]
fn group_norm_even_uneven_and_views() {
    let mut rng = Rng::new(35);
    for (ne, groups) in [
        ([4usize, 2, 8, 1], 4usize),
        ([3, 2, 5, 1], 4), // groups of 2, 2, 1 and an empty one
        ([1, 1, 3, 1], 1),
        ([3, 1, 17, 2], 17),
        ([2, 3, 6, 3], 4),
        ([17, 13, 32, 1], 32),
        ([64, 64, 8, 2], 2),
    ] {
        let mut g = Graph::new();
        let a = g.new_f32(&ne).unwrap();
        let y = g.group_norm(a, groups, 1e-6).unwrap();
        assert_fast(&g, y);
        check(
            g,
            &[a],
            y,
            &mut rng,
            TOL,
            &format!("group_norm {ne:?} / {groups}"),
        );
    }
    // a permuted source: p = permute(2, 0, 1) of [6, 3, 2] -> [3, 2, 6]
    let mut g = Graph::new();
    let a = g.new_f32(&[6, 3, 2]).unwrap();
    let p = g.permute(a, [2, 0, 1, 3]).unwrap();
    let y = g.group_norm(p, 3, 1e-6).unwrap();
    check(g, &[a], y, &mut rng, TOL, "group_norm permuted");
}
