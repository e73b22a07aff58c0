//! CPU reduce-family kernels against the reference: sum, sum_rows, mean, argmax, count_equal,
//! cumsum, repeat, repeat_back and concat on f32/f16/bf16 (and i32 where the op takes it), odd
//! and long rows, transposed / permuted / strided-view sources, ties and NaNs for argmax, and
//! chains whose inputs were computed in place.
//!
//! Tolerances (relative to the output's largest magnitude): sums into f32 1e-6 (they are
//! accumulated in f64, one f32 rounding; measured ≤ 1e-7); into f16 1e-3 and bf16 8e-3 (one
//! rounding to the type, which may fall either side of a boundary). argmax, count_equal, cumsum
//! (f64 running sum in the reference's order), repeat, repeat_back (f64, reference order) and
//! concat are exact: 0.

mod common;

use common::*;
use tessera::{DType, Graph, TensorId};

fn assert_fast(g: &Graph, y: TensorId) {
    assert!(
        tessera_cpu::ops::fast_path(g, g.tensor(y)),
        "{} should run on a dedicated kernel",
        g.tensor(y).op
    );
}

fn sum_tol(dt: DType) -> f64 {
    match dt {
        DType::F32 => 1e-6,
        DType::F16 => 1e-3,
        _ => 8e-3,
    }
}

/// A source of type `dt` and logical shape `ne` laid out as `layout` (0 dense, 1 transposed,
/// 2 permuted, 3 every other row of a leaf twice as tall); returns (leaf, source).
fn source(g: &mut Graph, dt: DType, ne: [usize; 4], layout: usize) -> (TensorId, TensorId) {
    match layout {
        0 => {
            let a = g.new_tensor(dt, &ne).unwrap();
            (a, a)
        }
        1 => {
            let a = g.new_tensor(dt, &[ne[1], ne[0], ne[2], ne[3]]).unwrap();
            (a, g.transpose(a).unwrap())
        }
        2 => {
            // p = permute(leaf, [1, 2, 0, 3]): p.ne[axes[i]] = leaf.ne[i]
            let a = g.new_tensor(dt, &[ne[1], ne[2], ne[0], ne[3]]).unwrap();
            (a, g.permute(a, [1, 2, 0, 3]).unwrap())
        }
        _ => {
            let a = g.new_tensor(dt, &[ne[0], 2 * ne[1], ne[2], ne[3]]).unwrap();
            let es = dt.type_size();
            let nb1 = 2 * ne[0] * es;
            let v = g
                .view(a, &ne, &[nb1, nb1 * ne[1], nb1 * ne[1] * ne[2]], 0)
                .unwrap();
            (a, v)
        }
    }
}

const SHAPES: [[usize; 4]; 9] = [
    [1, 1, 1, 1],
    [3, 1, 1, 1],
    [17, 3, 1, 1],
    [3, 17, 2, 1],
    [64, 5, 3, 2],
    [1000, 3, 1, 1],
    [1031, 2, 2, 1],
    [5000, 1, 1, 1],
    [17, 2000, 1, 1],
];

#[test]
fn sum_sum_rows_and_mean() {
    let mut rng = Rng::new(41);
    for (si, ne) in SHAPES.iter().enumerate() {
        for layout in 0..4 {
            let dt = [DType::F32, DType::F16, DType::BF16][(si + layout) % 3];
            for op in ["sum", "sum_rows", "mean"] {
                let mut g = Graph::new();
                let (leaf, a) = source(&mut g, dt, *ne, layout);
                let y = match op {
                    "sum" => g.sum(a),
                    "sum_rows" => g.sum_rows(a),
                    _ => g.mean(a),
                }
                .unwrap();
                assert_fast(&g, y);
                let tol = if op == "mean" { 1e-6 } else { sum_tol(dt) };
                check(
                    g,
                    &[leaf],
                    y,
                    &mut rng,
                    tol,
                    &format!("{op} {dt} {ne:?} layout {layout}"),
                );
            }
        }
    }
    // a long column: rows of one value, many chunks
    let mut g = Graph::new();
    let a = g.new_f32(&[40000, 1]).unwrap();
    let t = g.transpose(a).unwrap();
    let y = g.sum(t).unwrap();
    check(g, &[a], y, &mut rng, 1e-6, "sum of a [1, 40000] column");
}

#[test]
fn argmax_rows_ties_and_nans() {
    let mut rng = Rng::new(42);
    for ne in [
        [1usize, 1],
        [3, 1],
        [17, 3],
        [8, 9],
        [1000, 5],
        [1031, 4],
        [5, 40],
    ] {
        for layout in 0..2 {
            for variant in 0..4 {
                let mut g = Graph::new();
                let (leaf, a) = source(&mut g, DType::F32, [ne[0], ne[1], 1, 1], layout);
                let x = match variant {
                    0 => a,
                    1 => g.unary(a, tessera::op::UnaryOp::Sgn).unwrap(), // ties everywhere
                    2 => g.sqrt(a).unwrap(),                             // NaN for x < 0
                    _ => {
                        // all NaN but where x == 0, and -0.0 next to 0.0
                        let b = g.abs(a).unwrap();
                        let c = g.neg(b).unwrap();
                        g.sqrt(c).unwrap()
                    }
                };
                let y = g.argmax(x).unwrap();
                assert_fast(&g, y);
                check(
                    g,
                    &[leaf],
                    y,
                    &mut rng,
                    0.0,
                    &format!("argmax {ne:?} layout {layout} variant {variant}"),
                );
            }
        }
    }
}

#[test]
fn count_equal_any_layout() {
    let mut rng = Rng::new(43);
    for ne in [
        [1usize, 1, 1, 1],
        [3, 1, 1, 1],
        [17, 3, 2, 1],
        [1000, 3, 1, 1],
        [4, 999, 1, 1],
    ] {
        for layout in 0..3 {
            let mut g = Graph::new();
            let (la, a) = source(&mut g, DType::I32, ne, layout);
            let b = g.new_tensor(DType::I32, &ne).unwrap();
            let y = g.count_equal(a, b).unwrap();
            assert_fast(&g, y);
            check(
                g,
                &[la, b],
                y,
                &mut rng,
                0.0,
                &format!("count_equal {ne:?} layout {layout}"),
            );
        }
    }
}

#[test]
fn cumsum_rows() {
    let mut rng = Rng::new(44);
    for ne in SHAPES {
        for layout in 0..4 {
            let mut g = Graph::new();
            let (leaf, a) = source(&mut g, DType::F32, ne, layout);
            let y = g.cumsum(a).unwrap();
            assert_fast(&g, y);
            check(
                g,
                &[leaf],
                y,
                &mut rng,
                0.0,
                &format!("cumsum {ne:?} layout {layout}"),
            );
        }
    }
}

#[test]
fn repeat_every_type_and_layout() {
    let mut rng = Rng::new(45);
    for (src, dst) in [
        ([1usize, 1, 1, 1], [3usize, 1, 1, 1]),
        ([1, 1, 1, 1], [1000, 2, 1, 1]),
        ([3, 2, 1, 1], [6, 4, 17, 1]),
        ([17, 1, 3, 1], [17, 4, 3, 2]),
        ([5, 3, 2, 2], [15, 3, 4, 2]),
        ([1000, 1, 1, 1], [1000, 3, 1, 1]),
    ] {
        for dt in [DType::F32, DType::F16, DType::BF16, DType::I32] {
            for layout in 0..3 {
                let mut g = Graph::new();
                let (leaf, a) = source(&mut g, dt, src, layout);
                let y = g.repeat_to(a, &dst).unwrap();
                assert_fast(&g, y);
                check(
                    g,
                    &[leaf],
                    y,
                    &mut rng,
                    0.0,
                    &format!("repeat {dt} {src:?} -> {dst:?} layout {layout}"),
                );
            }
        }
    }
}

#[test]
fn repeat_back_sums_the_tiles() {
    let mut rng = Rng::new(46);
    for (big, small) in [
        ([3usize, 1, 1, 1], [1usize, 1, 1, 1]),
        ([1000, 2, 1, 1], [1, 1, 1, 1]),
        ([6, 4, 17, 1], [3, 2, 1, 1]),
        ([17, 4, 3, 2], [17, 1, 3, 1]),
        ([15, 3, 4, 2], [5, 3, 2, 2]),
        ([64, 64, 1, 1], [32, 1, 1, 1]),
    ] {
        for dt in [DType::F32, DType::F16, DType::BF16] {
            for layout in 0..3 {
                let mut g = Graph::new();
                let (leaf, a) = source(&mut g, dt, big, layout);
                let shape = g.new_f32(&small).unwrap();
                let y = g.repeat_back(a, shape).unwrap();
                assert_fast(&g, y);
                check(
                    g,
                    &[leaf],
                    y,
                    &mut rng,
                    0.0,
                    &format!("repeat_back {dt} {big:?} -> {small:?} layout {layout}"),
                );
            }
        }
    }
}

#[test]
fn concat_every_dim_type_and_layout() {
    let mut rng = Rng::new(47);
    for base in [
        [3usize, 2, 2, 2],
        [17, 5, 1, 1],
        [1000, 2, 3, 1],
        [1, 1, 1, 1],
    ] {
        for dim in 0..4 {
            for dt in [DType::F32, DType::F16, DType::BF16, DType::I32] {
                let layout = rng.below(4);
                let mut bne = base;
                bne[dim] = rng.pick(&[1usize, 3, 17]);
                let mut g = Graph::new();
                let (la, a) = source(&mut g, dt, base, layout);
                let (lb, b) = source(&mut g, dt, bne, rng.below(3));
                let y = g.concat(a, b, dim).unwrap();
                assert_fast(&g, y);
                check(
                    g,
                    &[la, lb],
                    y,
                    &mut rng,
                    0.0,
                    &format!("concat {dt} {base:?} + {bne:?} along {dim} layout {layout}"),
                );
            }
        }
    }
}

#[test]
fn reductions_of_in_place_chains() {
    // x -> neg -> exp runs in place; then the reductions read the reused memory
    let mut rng = Rng::new(48);
    for op in ["sum", "sum_rows", "mean", "cumsum", "argmax", "repeat_back"] {
        let mut g = Graph::new();
        let a = g.new_f32(&[129, 7]).unwrap();
        let n = g.neg(a).unwrap();
        let e = g.exp(n).unwrap();
        let y = match op {
            "sum" => g.sum(e),
            "sum_rows" => g.sum_rows(e),
            "mean" => g.mean(e),
            "cumsum" => g.cumsum(e),
            "argmax" => g.argmax(e),
            _ => {
                let s = g.new_f32(&[129, 1]).unwrap();
                g.repeat_back(e, s)
            }
        }
        .unwrap();
        let z = g.scale(y, 0.5).unwrap_or(y);
        let tol = if op == "argmax" { 0.0 } else { 1e-6 };
        check(g, &[a], z, &mut rng, tol, &format!("neg -> exp -> {op}"));
    }
}
