//! CPU conv_2d, im2col and pool_2d against the reference: f32/f16/bf16 kernels and inputs,
//! strides, padding, dilation, taps beyond one block (K > 256) and output rows beyond one
//! column block (OW > 64), channel counts that are not multiples of the register tile,
//! permuted and transposed inputs, 1-D and 2-D im2col to every type, max and average pooling
//! with windows lying wholly in the padding.
//!
//! Tolerances: conv_2d 1e-5 of the output's magnitude (f32 summation of exact f16 products;
//! measured ≤ 8e-7); im2col and pool_2d are exact (0): they copy or convert once, or compute
//! exactly as the reference does.

mod common;

use common::*;
use tessera::op::PoolKind;
use tessera::{DType, Graph, TensorId};

fn assert_fast(g: &Graph, y: TensorId) {
    assert!(
        tessera_cpu::ops::fast_path(g, g.tensor(y)),
        "{} should run on a dedicated kernel",
        g.tensor(y).op
    );
}

type Case = ([usize; 4], [usize; 4], [usize; 2], [usize; 2], [usize; 2]);

const CASES: [Case; 8] = [
    ([1, 1, 1, 1], [1, 1, 1, 1], [1, 1], [0, 0], [1, 1]),
    ([3, 3, 2, 4], [10, 9, 2, 1], [1, 1], [1, 1], [1, 1]),
    ([3, 1, 3, 2], [17, 5, 3, 2], [2, 1], [0, 2], [1, 1]),
    ([2, 3, 1, 3], [7, 8, 1, 1], [3, 2], [1, 0], [2, 3]),
    ([3, 3, 32, 5], [70, 5, 32, 1], [1, 1], [1, 1], [1, 1]),
    ([3, 3, 128, 7], [20, 6, 128, 2], [2, 2], [1, 1], [1, 1]),
    ([5, 5, 3, 9], [131, 4, 3, 1], [1, 1], [2, 2], [1, 1]),
    ([1, 1, 300, 6], [9, 9, 300, 1], [1, 1], [0, 0], [1, 1]),
];

#[test]
fn conv_2d_types_strides_padding_dilation() {
    let mut rng = Rng::new(81);
    for (ci, (kne, xne, s, p, d)) in CASES.iter().enumerate() {
        for kdt in [DType::F32, DType::F16, DType::BF16] {
            let xdt = [DType::F32, DType::F16, DType::BF16][ci % 3];
            let mut g = Graph::new();
            let k = g.new_tensor(kdt, kne).unwrap();
            let x = g.new_tensor(xdt, xne).unwrap();
            let y = g.conv_2d(k, x, s[0], s[1], p[0], p[1], d[0], d[1]).unwrap();
            assert_fast(&g, y);
            check(
                g,
                &[k, x],
                y,
                &mut rng,
                1e-5,
                &format!("conv_2d k {kdt} {kne:?} x {xdt} {xne:?} s {s:?} p {p:?} d {d:?}"),
            );
        }
    }
}

#[test]
fn conv_2d_on_views() {
    let mut rng = Rng::new(82);
    // a permuted f16 input: [C, W, H] -> [W, H, C]; a transposed kernel
    let mut g = Graph::new();
    let kl = g.new_f32(&[3, 2, 3, 2]).unwrap();
    let k = g.transpose(kl).unwrap(); // [2, 3, 3, 2]
    let raw = g.new_tensor(DType::F16, &[3, 25, 14]).unwrap();
    let x = g.permute(raw, [2, 0, 1, 3]).unwrap(); // [25, 14, 3]
    let y = g.conv_2d(k, x, 1, 2, 1, 0, 2, 1).unwrap();
    assert_fast(&g, y);
    check(g, &[kl, raw], y, &mut rng, 1e-5, "conv_2d on views");
    // the input computed in place
    let mut g = Graph::new();
    let k = g.new_f32(&[3, 3, 4, 3]).unwrap();
    let a = g.new_f32(&[33, 9, 4, 2]).unwrap();
    let n = g.neg(a).unwrap();
    let e = g.exp(n).unwrap();
    let y = g.conv_2d(k, e, 1, 1, 1, 1, 1, 1).unwrap();
    check(g, &[k, a], y, &mut rng, 1e-5, "neg -> exp -> conv_2d");
}

#[test]
fn im2col_2d_and_1d_every_type() {
    let mut rng = Rng::new(83);
    for (kne, xne, s, p, d) in CASES {
        for dst in [DType::F32, DType::F16, DType::BF16] {
            let xdt = rng.pick(&[DType::F32, DType::F16, DType::BF16]);
            let mut g = Graph::new();
            let k = g.new_tensor(DType::F16, &kne).unwrap();
            let x = g.new_tensor(xdt, &xne).unwrap();
            let y = g
                .im2col(k, x, s[0], s[1], p[0], p[1], d[0], d[1], true, dst)
                .unwrap();
            assert_fast(&g, y);
            check(
                g,
                &[x],
                y,
                &mut rng,
                0.0,
                &format!("im2col 2d {xdt} -> {dst} k {kne:?} x {xne:?}"),
            );
        }
    }
    // 1-D: input [W, Cin, N], kernel [KW, Cin, Cout]
    for (kne, xne, s0, p0, d0) in [
        ([3usize, 2, 1], [5usize, 2, 2], 2usize, 1usize, 1usize),
        ([1, 1, 1], [1, 1, 1], 1, 0, 1),
        ([5, 7, 3], [100, 7, 3], 1, 2, 2),
        ([4, 3, 2], [33, 3, 1], 3, 0, 1),
    ] {
        for dst in [DType::F32, DType::F16, DType::BF16] {
            let mut g = Graph::new();
            let k = g.new_f32(&kne).unwrap();
            let xl = g.new_f32(&[xne[1], xne[0], xne[2]]).unwrap();
            let x = g.transpose(xl).unwrap();
            let y = g.im2col(k, x, s0, 0, p0, 0, d0, 0, false, dst).unwrap();
            assert_fast(&g, y);
            check(
                g,
                &[xl],
                y,
                &mut rng,
                0.0,
                &format!("im2col 1d -> {dst} k {kne:?} x {xne:?}"),
            );
        }
    }
}

#[test]
fn pool_2d_max_and_avg() {
    let mut rng = Rng::new(84);
    for (ne, k, s, p) in [
        ([3usize, 3, 1, 1], [2usize, 2], [1usize, 1], [1usize, 1]),
        ([2, 2, 1, 1], [1, 1], [1, 1], [1, 1]), // corner windows in the padding only
        ([17, 9, 3, 2], [3, 2], [2, 3], [1, 1]),
        ([64, 64, 2, 1], [2, 2], [2, 2], [0, 0]),
        ([1, 1, 1, 1], [1, 1], [1, 1], [0, 0]),
        ([33, 5, 4, 1], [5, 5], [1, 1], [2, 2]),
    ] {
        for kind in [PoolKind::Max, PoolKind::Avg] {
            for layout in 0..2 {
                let dt = rng.pick(&[DType::F32, DType::F16, DType::BF16]);
                let mut g = Graph::new();
                let (leaf, a) = if layout == 0 {
                    let a = g.new_tensor(dt, &ne).unwrap();
                    (a, a)
                } else {
                    let l = g.new_tensor(dt, &[ne[1], ne[0], ne[2], ne[3]]).unwrap();
                    (l, g.transpose(l).unwrap())
                };
                // sqrt gives NaNs for max's NaN rule (f32 inputs only)
                let src = if dt == DType::F32 && layout == 1 {
                    g.sqrt(a).unwrap()
                } else {
                    a
                };
                let y = g
                    .pool_2d(src, kind, k[0], k[1], s[0], s[1], p[0], p[1])
                    .unwrap();
                assert_fast(&g, y);
                check(
                    g,
                    &[leaf],
                    y,
                    &mut rng,
                    0.0,
                    &format!(
                        "pool_2d {kind:?} {dt} {ne:?} k {k:?} s {s:?} p {p:?} layout {layout}"
                    ),
                );
            }
        }
    }
}
