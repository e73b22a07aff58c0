//! CPU glu kernels against the reference: every kind, fused (plain and swapped) and split, f32
//! and f16, odd and long rows, more rows than threads and fewer, and row-strided views (column
//! blocks of a wider matrix, which ggml_is_contiguous_1 accepts).
//!
//! Tolerances (relative to the output's largest magnitude): f32 2e-6 (the activations are
//! within 5e-7 relative, see src/ops/unary.rs, plus the product's rounding); f16 1e-3 (one
//! rounding of the output to f16, which may fall either side of the reference's).

mod common;

use common::*;
use tessera::op::GluKind;
use tessera::{DType, Graph, TensorId};

fn tol(dt: DType) -> f64 {
    if dt == DType::F32 {
        2e-6
    } else {
        1e-3
    }
}

fn assert_fast(g: &Graph, id: TensorId) {
    assert!(
        tessera_cpu::ops::fast_path(g, g.tensor(id)),
        "{} must run on a dedicated kernel",
        g.tensor(id).op
    );
}

#[test]
fn fused_and_split_every_kind() {
    let mut rng = Rng::new(41);
    let shapes = [
        [1usize, 1, 1],
        [3, 2, 1],
        [17, 3, 2],
        [500, 1, 1],
        [64, 5, 1],
        [4001, 2, 1],
    ];
    for kind in GluKind::ALL {
        for (si, &[nc, n1, n2]) in shapes.iter().enumerate() {
            let dt = [DType::F32, DType::F16][si % 2];
            for swapped in [false, true] {
                let mut g = Graph::new();
                let x = g.new_tensor(dt, &[2 * nc, n1, n2]).unwrap();
                // scale the inputs so the activations see [-6, 6]
                let a = g.scale(x, 6.0).unwrap();
                let y = g.glu(a, kind, swapped).unwrap();
                assert_fast(&g, y);
                check(
                    g,
                    &[x],
                    y,
                    &mut rng,
                    tol(dt),
                    &format!(
                        "{} fused swapped={swapped} {dt} [{}, {n1}, {n2}]",
                        kind.name(),
                        2 * nc
                    ),
                );
            }
            let mut g = Graph::new();
            let x = g.new_tensor(dt, &[nc, n1, n2]).unwrap();
            let gate = g.new_tensor(dt, &[nc, n1, n2]).unwrap();
            let a = g.scale(x, 6.0).unwrap();
            let y = g.glu_split(a, gate, kind).unwrap();
            assert_fast(&g, y);
            check(
                g,
                &[x, gate],
                y,
                &mut rng,
                tol(dt),
                &format!("{} split {dt} [{nc}, {n1}, {n2}]", kind.name()),
            );
        }
    }
}

#[test]
fn row_strided_views() {
    let mut rng = Rng::new(42);
    for kind in GluKind::ALL {
        for dt in [DType::F32, DType::F16] {
            for (nc, rows) in [(3usize, 3usize), (40, 7)] {
                // split: x and g are the two column halves of a wider [2nc + 5, rows] matrix
                let w = 2 * nc + 5;
                let ts = dt.type_size();
                let mut g = Graph::new();
                let m = g.new_tensor(dt, &[w, rows]).unwrap();
                let x = g.view(m, &[nc, rows], &[w * ts], 0).unwrap();
                let gate = g.view(m, &[nc, rows], &[w * ts], (nc + 5) * ts).unwrap();
                let y = g.glu_split(x, gate, kind).unwrap();
                assert_fast(&g, y);
                check(
                    g,
                    &[m],
                    y,
                    &mut rng,
                    tol(dt),
                    &format!("{} split views {dt} nc={nc}", kind.name()),
                );
                // fused on the first 2nc columns of each row, swapped both ways
                for swapped in [false, true] {
                    let mut g = Graph::new();
                    let m = g.new_tensor(dt, &[w, rows]).unwrap();
                    let a = g.view(m, &[2 * nc, rows], &[w * ts], ts).unwrap();
                    let y = g.glu(a, kind, swapped).unwrap();
                    assert_fast(&g, y);
                    check(
                        g,
                        &[m],
                        y,
                        &mut rng,
                        tol(dt),
                        &format!("{} fused view swapped={swapped} {dt} nc={nc}", kind.name()),
                    );
                }
            }
        }
    }
}
