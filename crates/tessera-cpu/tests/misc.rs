//! CPU pad, upscale, arange and timestep_embedding against the reference: f32/f16/bf16 pad of
//! transposed / permuted sources in every dim, nearest and bilinear resizing up and down from
//! views, arange of odd lengths, timestep_embedding with even and odd dims from a strided
//! vector. All exact (tolerance 0): the kernels compute every value as the reference does.

mod common;

use common::*;
use tessera::op::UpscaleMode;
use tessera::{DType, Graph, TensorId};

fn assert_fast(g: &Graph, y: TensorId) {
    assert!(
        tessera_cpu::ops::fast_path(g, g.tensor(y)),
        "{} should run on a dedicated kernel",
        g.tensor(y).op
    );
}

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
        _ => {
            let a = g.new_tensor(dt, &[ne[1], ne[2], ne[0], ne[3]]).unwrap();
            (a, g.permute(a, [1, 2, 0, 3]).unwrap())
        }
    }
}

#[test]
fn pad_every_dim_type_and_layout() {
    let mut rng = Rng::new(91);
    for (ne, p) in [
        ([1usize, 1, 1, 1], [0usize, 0, 0, 0]),
        ([2, 2, 1, 1], [1, 1, 0, 0]),
        ([1, 3, 17, 2], [2, 1, 3, 1]),
        ([1000, 3, 1, 1], [17, 0, 2, 0]),
        ([5, 7, 3, 2], [0, 0, 0, 3]),
    ] {
        for dt in [DType::F32, DType::F16, DType::BF16] {
            for layout in 0..3 {
                let mut g = Graph::new();
                let (leaf, a) = source(&mut g, dt, ne, layout);
                let y = g.pad(a, p[0], p[1], p[2], p[3]).unwrap();
                assert_fast(&g, y);
                check(
                    g,
                    &[leaf],
                    y,
                    &mut rng,
                    0.0,
                    &format!("pad {dt} {ne:?} by {p:?} layout {layout}"),
                );
            }
        }
    }
}

#[test]
fn upscale_nearest_and_bilinear() {
    let mut rng = Rng::new(92);
    for (ne, out) in [
        ([1usize, 1, 1, 1], [3usize, 2, 1, 1]),
        ([2, 2, 2, 1], [4, 4, 2, 1]),
        ([3, 5, 2, 1], [7, 2, 4, 1]),
        ([17, 9, 3, 2], [40, 31, 3, 2]),
        ([64, 48, 1, 1], [21, 17, 1, 1]),
        ([5, 3, 4, 3], [5, 3, 2, 6]),
    ] {
        for mode in [UpscaleMode::Nearest, UpscaleMode::Bilinear] {
            for layout in 0..3 {
                let mut g = Graph::new();
                let (leaf, a) = source(&mut g, DType::F32, ne, layout);
                let y = g
                    .upscale_ext(a, out[0], out[1], out[2], out[3], mode)
                    .unwrap();
                assert_fast(&g, y);
                check(
                    g,
                    &[leaf],
                    y,
                    &mut rng,
                    0.0,
                    &format!("upscale {mode:?} {ne:?} -> {out:?} layout {layout}"),
                );
            }
        }
    }
    let mut g = Graph::new();
    let a = g.new_f32(&[7, 5, 3]).unwrap();
    let y = g.upscale(a, 3).unwrap();
    assert_fast(&g, y);
    check(g, &[a], y, &mut rng, 0.0, "upscale x3");
}

#[test]
fn arange_lengths() {
    let mut rng = Rng::new(93);
    for (start, stop, step) in [
        (0.0f32, 1.0f32, 1.0f32),
        (0.5, 6.0, 0.75),
        (-3.0, 1000.0, 0.37),
        (1e6, 1e6 + 5000.0, 1.0),
        (-1.0, 1.0, 1e-3),
    ] {
        let mut g = Graph::new();
        let y = g.arange(start, stop, step).unwrap();
        assert_fast(&g, y);
        check(
            g,
            &[],
            y,
            &mut rng,
            0.0,
            &format!("arange({start}, {stop}, {step})"),
        );
    }
}

#[test]
fn timestep_embedding_even_odd_and_strided() {
    let mut rng = Rng::new(94);
    for (n, dim, period) in [
        (1usize, 1usize, 10000i32),
        (3, 4, 10000),
        (3, 5, 10000),
        (17, 320, 10000),
        (2, 33, 100),
        (5, 1001, 7),
    ] {
        for strided in [false, true] {
            let mut g = Graph::new();
            let leaf = g.new_f32(&[if strided { 2 * n } else { n }]).unwrap();
            let s = g.scale(leaf, 1000.0).unwrap(); // timesteps up to 1000
            let t = if strided {
                // every other value: [1, n] at row stride 8 bytes, transposed to [n, 1]
                let v = g.view(s, &[1, n], &[8], 0).unwrap();
                let t = g.transpose(v).unwrap();
                assert_eq!(g.tensor(t).nb[0], 8);
                t
            } else {
                s
            };
            let y = g.timestep_embedding(t, dim, period).unwrap();
            assert_fast(&g, y);
            check(
                g,
                &[leaf],
                y,
                &mut rng,
                0.0,
                &format!("timestep_embedding n={n} dim={dim} period={period} strided={strided}"),
            );
        }
    }
}
