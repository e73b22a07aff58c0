//! CPU cross_entropy_loss against the reference: odd and long rows, many rows, 4-d shapes,
//! transposed / permuted logits and labels, logits spread widely (exp underflows), an in-place
//! chain before it.
//!
//! Tolerance: 1e-5 of the loss's magnitude. Sums are in f64 and the AVX2 path's f32 exp is
//! within about one ulp; measured: the result is the reference's value rounded to f32.

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

#[test]
fn cross_entropy_on_random_shapes() {
    let mut rng = Rng::new(61);
    for ne in [
        [1usize, 1, 1, 1],
        [3, 1, 1, 1],
        [17, 3, 1, 1],
        [10, 6, 2, 3],
        [1000, 5, 1, 1],
        [1031, 3, 1, 1],
        [32000, 2, 1, 1],
        [2, 999, 1, 1],
    ] {
        for spread in [1.0f32, 10.0, 100.0] {
            let mut g = Graph::new();
            let a = g.new_f32(&ne).unwrap();
            let x = g.scale(a, spread).unwrap();
            let b = g.new_f32(&ne).unwrap();
            let y = g.cross_entropy_loss(x, b).unwrap();
            assert_fast(&g, y);
            check(
                g,
                &[a, b],
                y,
                &mut rng,
                TOL,
                &format!("cross_entropy {ne:?} x{spread}"),
            );
        }
    }
}

#[test]
fn cross_entropy_on_views() {
    let mut rng = Rng::new(62);
    // transposed logits, permuted labels
    for (n0, n1, n2) in [(5usize, 3usize, 1usize), (37, 4, 2), (300, 3, 2)] {
        let mut g = Graph::new();
        let a = g.new_f32(&[n1, n0, n2]).unwrap();
        let x = g.transpose(a).unwrap(); // [n0, n1, n2]
        let l = g.new_f32(&[n1, n2, n0]).unwrap();
        let y_ = g.permute(l, [1, 2, 0, 3]).unwrap(); // [n0, n1, n2]
        let y = g.cross_entropy_loss(x, y_).unwrap();
        assert_fast(&g, y);
        check(
            g,
            &[a, l],
            y,
            &mut rng,
            TOL,
            &format!("cross_entropy views {n0}x{n1}x{n2}"),
        );
    }
    // logits computed in place: x -> neg -> exp
    let mut g = Graph::new();
    let a = g.new_f32(&[129, 7]).unwrap();
    let n = g.neg(a).unwrap();
    let e = g.exp(n).unwrap();
    let b = g.new_f32(&[129, 7]).unwrap();
    let y = g.cross_entropy_loss(e, b).unwrap();
    check(g, &[a, b], y, &mut rng, TOL, "neg -> exp -> cross_entropy");
}
