//! CPU argsort and top_k against the reference: ascending and descending, odd and long rows,
//! transposed / permuted / strided-view sources, rows with many ties (sgn), NaNs (sqrt of
//! negative values) and -0.0 next to 0.0, k from 1 to the row length. Exact (tolerance 0): the
//! order is total (stable, NaNs last), so every index must match.

mod common;

use common::*;
use tessera::op::{SortOrder, UnaryOp};
use tessera::{DType, Graph, TensorId};

fn assert_fast(g: &Graph, y: TensorId) {
    assert!(
        tessera_cpu::ops::fast_path(g, g.tensor(y)),
        "{} should run on a dedicated kernel",
        g.tensor(y).op
    );
}

/// The f32 source `ne` as `layout` (0 dense, 1 transposed, 2 permuted, 3 strided rows), then
/// `variant` (0 as is, 1 sgn: ties, 2 sqrt: NaNs, 3 relu then neg: -0.0 and 0.0 ties).
fn input(g: &mut Graph, ne: [usize; 4], layout: usize, variant: usize) -> (TensorId, TensorId) {
    let (leaf, a) = match layout {
        0 => {
            let a = g.new_f32(&ne).unwrap();
            (a, a)
        }
        1 => {
            let a = g.new_f32(&[ne[1], ne[0], ne[2], ne[3]]).unwrap();
            (a, g.transpose(a).unwrap())
        }
        2 => {
            let a = g.new_f32(&[ne[1], ne[2], ne[0], ne[3]]).unwrap();
            (a, g.permute(a, [1, 2, 0, 3]).unwrap())
        }
        _ => {
            let a = g.new_f32(&[ne[0] + 3, ne[1], ne[2], ne[3]]).unwrap();
            let nb1 = (ne[0] + 3) * 4;
            let v = g
                .view(a, &ne, &[nb1, nb1 * ne[1], nb1 * ne[1] * ne[2]], 4)
                .unwrap();
            (a, v)
        }
    };
    let x = match variant {
        0 => a,
        1 => g.unary(a, UnaryOp::Sgn).unwrap(),
        2 => g.sqrt(a).unwrap(),
        _ => {
            let r = g.relu(a).unwrap();
            let z = g.scale(r, 0.0).unwrap(); // +0.0
            let q = g.unary(a, UnaryOp::Sgn).unwrap();
            g.mul(z, q).unwrap() // ±0.0 by the sign of x
        }
    };
    (leaf, x)
}

const SHAPES: [[usize; 4]; 8] = [
    [1, 1, 1, 1],
    [2, 3, 1, 1],
    [3, 17, 2, 1],
    [17, 3, 1, 2],
    [8, 64, 1, 1],
    [100, 5, 1, 1],
    [1000, 3, 1, 1],
    [4099, 2, 1, 1],
];

#[test]
fn argsort_both_orders() {
    let mut rng = Rng::new(51);
    for ne in SHAPES {
        for layout in 0..4 {
            for variant in 0..4 {
                for order in [SortOrder::Asc, SortOrder::Desc] {
                    let mut g = Graph::new();
                    let (leaf, x) = input(&mut g, ne, layout, variant);
                    let y = g.argsort(x, order).unwrap();
                    assert_fast(&g, y);
                    assert_eq!(g.dtype(y), DType::I32);
                    check(
                        g,
                        &[leaf],
                        y,
                        &mut rng,
                        0.0,
                        &format!(
                            "argsort {} {ne:?} layout {layout} variant {variant}",
                            order.name()
                        ),
                    );
                }
            }
        }
    }
}

#[test]
fn top_k_any_k() {
    let mut rng = Rng::new(52);
    for ne in SHAPES {
        for layout in 0..4 {
            for variant in 0..4 {
                let ks = [1, 2, ne[0] / 2, ne[0] - 1, ne[0]];
                let k = rng.pick(&ks).clamp(1, ne[0]);
                let mut g = Graph::new();
                let (leaf, x) = input(&mut g, ne, layout, variant);
                let y = g.top_k(x, k).unwrap();
                assert_fast(&g, y);
                check(
                    g,
                    &[leaf],
                    y,
                    &mut rng,
                    0.0,
                    &format!("top_k k={k} {ne:?} layout {layout} variant {variant}"),
                );
            }
        }
    }
}
