//! CPU soft_max / soft_max_ext and diag_mask_inf / diag_mask_zero against the reference: odd and
//! long rows, f16 and f32 masks broadcast over dims 2 and 3 with padded rows and -inf entries,
//! ALiBi, fully masked rows (NaN like the reference), transposed inputs to the masks, and an
//! in-place diag_mask chain.
//!
//! Tolerance: 1e-6 of the output's max magnitude for soft_max (f64 row sums; the AVX2 exp is
//! within 1.2e-7 relative; measured ≤ 3e-7 on a whole row); diag masks are exact.

mod common;

use common::*;
use tessera::{DType, Graph, ReferenceBackend, Session, TensorId};

const TOL: f64 = 1e-6;

fn assert_fast(g: &Graph, y: TensorId) {
    assert!(
        tessera_cpu::ops::fast_path(g, g.tensor(y)),
        "{} should run on a dedicated kernel",
        g.tensor(y).op
    );
}

/// Like `common::check`, with the inputs' values given (set again before every run).
fn check_values(g: Graph, inputs: &[(TensorId, Vec<f32>)], out: TensorId, tol: f64, what: &str) {
    let mut s = Session::new(g, &[out]).expect("plan");
    let set = |s: &mut Session| {
        for (i, v) in inputs {
            s.set_f32(*i, v).unwrap();
        }
    };
    set(&mut s);
    s.compute(&ReferenceBackend).expect("reference");
    let want = s.get_f64(out).unwrap();
    let scale = want
        .iter()
        .filter(|x| x.is_finite())
        .fold(0f64, |m, x| m.max(x.abs()))
        .max(1e-30);
    let mut first: Vec<(tessera_cpu::Isa, Vec<f32>)> = Vec::new();
    for cpu in cpu_configs() {
        set(&mut s);
        s.compute(&cpu).unwrap();
        let got = s.get_f32(out).unwrap();
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            let ok = (g as f64 == w)
                || (g.is_nan() && w.is_nan())
                || ((g as f64 - w).abs() / scale <= tol);
            assert!(
                ok,
                "{what}: cpu {:?}/{}t: element {i}: got {g}, reference {w}",
                cpu.isa(),
                cpu.n_threads()
            );
        }
        match first.iter().find(|(isa, _)| *isa == cpu.isa()) {
            Some((_, f)) => assert!(
                f.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: results differ between thread counts on {:?}",
                cpu.isa()
            ),
            None => first.push((cpu.isa(), got)),
        }
    }
}

fn rand_vec(rng: &mut Rng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.uniform(lo, hi)).collect()
}

#[test]
fn plain_soft_max_on_random_shapes() {
    let mut rng = Rng::new(41);
    for ne in [
        [1usize, 1, 1, 1],
        [3, 1, 1, 1],
        [17, 3, 2, 1],
        [8, 5, 1, 2],
        [1000, 3, 1, 1],
        [1031, 2, 2, 1],
        [5000, 1, 1, 1],
    ] {
        let mut g = Graph::new();
        let a = g.new_f32(&ne).unwrap();
        let y = g.soft_max(a).unwrap();
        assert_fast(&g, y);
        // logits spread over [-20, 20] so the exponentials cover a wide range
        let x = rand_vec(&mut rng, ne.iter().product(), -20.0, 20.0);
        check_values(g, &[(a, x)], y, TOL, &format!("soft_max {ne:?}"));
    }
}

#[test]
fn soft_max_ext_with_masks_scale_and_alibi() {
    let mut rng = Rng::new(42);
    // (a shape, mask shape, mask type, scale, max_bias)
    let cases = [
        (
            [5usize, 3, 4, 1],
            [5usize, 3, 1, 1],
            DType::F32,
            0.5f32,
            0.0f32,
        ),
        ([5, 3, 4, 1], [5, 8, 1, 1], DType::F16, 0.5, 0.0),
        ([17, 2, 3, 2], [17, 2, 3, 1], DType::F32, 1.0, 8.0),
        ([3, 1, 6, 2], [3, 1, 2, 2], DType::F16, 2.0, 4.0),
        ([1, 1, 1, 1], [1, 1, 1, 1], DType::F32, 1.0, 1.0),
        ([256, 7, 12, 1], [256, 9, 1, 1], DType::F16, 0.125, 8.0),
        ([1001, 2, 5, 1], [1001, 2, 5, 1], DType::F32, 0.3, 0.0),
    ];
    for (ane, mne, mt, scale, max_bias) in cases {
        let mut g = Graph::new();
        let a = g.new_f32(&ane).unwrap();
        let m = g.new_tensor(mt, &mne).unwrap();
        let y = g.soft_max_ext(a, Some(m), scale, max_bias).unwrap();
        assert_fast(&g, y);
        let av = rand_vec(&mut rng, ane.iter().product(), -4.0, 4.0);
        let mut mv = rand_vec(&mut rng, mne.iter().product(), -3.0, 3.0);
        // a causal-like sprinkling of -inf
        for (k, v) in mv.iter_mut().enumerate() {
            if k % 7 == 3 {
                *v = f32::NEG_INFINITY;
            }
        }
        check_values(
            g,
            &[(a, av), (m, mv)],
            y,
            TOL,
            &format!("soft_max_ext a={ane:?} mask={mt} {mne:?} scale={scale} max_bias={max_bias}"),
        );
    }
}

#[test]
fn fully_masked_rows_give_nan_like_the_reference() {
    let mut g = Graph::new();
    let a = g.new_f32(&[9, 2]).unwrap();
    let m = g.new_tensor(DType::F16, &[9, 2]).unwrap();
    let y = g.soft_max_ext(a, Some(m), 1.0, 0.0).unwrap();
    let mut mv = vec![0.0f32; 18];
    for v in &mut mv[9..] {
        *v = f32::NEG_INFINITY;
    }
    let av: Vec<f32> = (0..18).map(|k| k as f32 * 0.1).collect();
    check_values(g, &[(a, av), (m, mv)], y, TOL, "fully masked row");
}

#[test]
fn diag_masks_then_soft_max() {
    let mut rng = Rng::new(43);
    for (ne, n_past) in [
        ([17usize, 3, 2, 1], 0usize),
        ([4, 3, 2, 1], 1),
        ([33, 33, 1, 1], 5),
        ([1000, 4, 1, 1], 997),
        ([3, 1, 1, 1], 1000),
    ] {
        // leaf -> scale -> diag_mask_inf (in place) -> soft_max; and diag_mask_zero
        let mut g = Graph::new();
        let a = g.new_f32(&ne).unwrap();
        let s = g.scale(a, 3.0).unwrap();
        let mi = g.diag_mask_inf(s, n_past).unwrap();
        assert_fast(&g, mi);
        let y = g.soft_max(mi).unwrap();
        check(
            g,
            &[a],
            y,
            &mut rng,
            TOL,
            &format!("diag_mask_inf+soft_max {ne:?} n_past={n_past}"),
        );
        let mut g = Graph::new();
        let a = g.new_f32(&ne).unwrap();
        let s = g.neg(a).unwrap();
        let mz = g.diag_mask_zero(s, n_past).unwrap();
        check(
            g,
            &[a],
            mz,
            &mut rng,
            0.0,
            &format!("diag_mask_zero {ne:?} n_past={n_past}"),
        );
    }
}

#[test]
fn diag_masks_on_strided_views() {
    let mut rng = Rng::new(44);
    let mut g = Graph::new();
    let a = g.new_f32(&[5, 17, 2]).unwrap();
    let t = g.permute(a, [1, 0, 2, 3]).unwrap(); // [17, 5, 2], rows at stride 5 floats
    let mi = g.diag_mask_inf(t, 2).unwrap();
    assert_fast(&g, mi);
    // (common::check cannot compare outputs holding infinities: its scale would be inf)
    let av = rand_vec(&mut rng, 170, -1.0, 1.0);
    check_values(g, &[(a, av)], mi, 0.0, "diag_mask_inf transposed");
    let mut g = Graph::new();
    let a = g.new_f32(&[5, 17, 2]).unwrap();
    let t = g.permute(a, [1, 0, 2, 3]).unwrap();
    let mz = g.diag_mask_zero(t, 0).unwrap();
    let y = g.soft_max(mz).unwrap();
    check(
        g,
        &[a],
        y,
        &mut rng,
        TOL,
        "diag_mask_zero transposed + soft_max",
    );
}
