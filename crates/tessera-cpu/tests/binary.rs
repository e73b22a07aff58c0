//! CPU binary kernels against the reference: add/sub/mul/div with every broadcast pattern
//! (full rows, repeated rows, one value, broadcast over dims 1-3), every float type pair,
//! transposed and permuted operands, long single rows split across threads, in-place chains,
//! add1, and acc/set with disjoint and overlapping regions.
//!
//! Tolerances (relative to the output's largest magnitude): the four operations are exact IEEE
//! operations on f32 values in both the kernels and the reference (which rounds its f64 result
//! once), so f32 results agree bit for bit; 1e-7 is used to state that. f16/bf16 outputs: the
//! same (the reference rounds through f32 like we do), so 1e-7 too; acc: 1e-7.

mod common;

use common::*;
use tessera::{DType, Graph, Session, TensorId};
use tessera_cpu::CpuBackend;

const TOL: f64 = 1e-7;

fn assert_fast(g: &Graph, id: TensorId) {
    assert!(
        tessera_cpu::ops::fast_path(g, g.tensor(id)),
        "{} must run on a dedicated kernel",
        g.tensor(id).op
    );
}

fn op(g: &mut Graph, k: usize, a: TensorId, b: TensorId) -> TensorId {
    match k {
        0 => g.add(a, b),
        1 => g.sub(a, b),
        2 => g.mul(a, b),
        _ => g.div(a, b),
    }
    .unwrap()
}

const NAMES: [&str; 4] = ["add", "sub", "mul", "div"];

#[test]
fn broadcasting_every_type_pair() {
    let mut rng = Rng::new(31);
    let types = [DType::F32, DType::F16, DType::BF16];
    let n0s = [1usize, 3, 8, 17, 64, 1001];
    for case in 0..120 {
        let ne = [
            rng.pick(&n0s),
            rng.pick(&[1usize, 2, 5]),
            rng.pick(&[1usize, 3]),
            rng.pick(&[1usize, 2]),
        ];
        // b: each dim equal to a's or 1; dim 0 sometimes a proper divisor (a repeated row)
        let mut bne = ne.map(|n| if rng.below(2) == 0 { n } else { 1 });
        if case % 5 == 0 && ne[0] & 1 == 0 {
            bne[0] = ne[0] / 2;
        }
        let (ta, tb) = (rng.pick(&types), rng.pick(&types));
        let k = case % 4;
        let mut g = Graph::new();
        let a = g.new_tensor(ta, &ne).unwrap();
        let b = g.new_tensor(tb, &bne).unwrap();
        let y = op(&mut g, k, a, b);
        assert_fast(&g, y);
        check(
            g,
            &[a, b],
            y,
            &mut rng,
            TOL,
            &format!("{} {ta}{ne:?} {tb}{bne:?}", NAMES[k]),
        );
    }
}

#[test]
fn strided_operands() {
    let mut rng = Rng::new(32);
    for (case, (m, n)) in [(5usize, 7usize), (17, 33), (64, 3), (1, 9), (130, 20)]
        .into_iter()
        .enumerate()
    {
        for (k, name) in NAMES.iter().enumerate() {
            let dt = [DType::F32, DType::F16][case % 2];
            // a = transpose of [n, m] -> [m, n] strided; b = a full transposed copy or a column
            let mut g = Graph::new();
            let at = g.new_tensor(dt, &[n, m]).unwrap();
            let a = g.transpose(at).unwrap();
            let bt = g.new_f32(&[n, m]).unwrap();
            let b = g.transpose(bt).unwrap();
            let y = op(&mut g, k, a, b);
            assert_fast(&g, y);
            check(
                g,
                &[at, bt],
                y,
                &mut rng,
                TOL,
                &format!("{name} transposed {dt} [{m}, {n}]"),
            );
            // contiguous a, b a strided column [1, n] (a view with nb1 = 4*m)
            let mut g = Graph::new();
            let a = g.new_tensor(dt, &[m, n]).unwrap();
            let w = g.new_f32(&[m, n]).unwrap();
            let col = g.view(w, &[1, n], &[4 * m], 0).unwrap();
            let y = op(&mut g, k, a, col);
            assert_fast(&g, y);
            check(
                g,
                &[a, w],
                y,
                &mut rng,
                TOL,
                &format!("{name} column {dt} [{m}, {n}]"),
            );
            // permuted 3-d a and b
            let mut g = Graph::new();
            let x = g.new_tensor(dt, &[m, 3, n]).unwrap();
            let a = g.permute(x, [2, 0, 1, 3]).unwrap(); // [3, n, m]
            let z = g.new_f32(&[m, 3, n]).unwrap();
            let b = g.permute(z, [2, 0, 1, 3]).unwrap();
            let y = op(&mut g, k, a, b);
            assert_fast(&g, y);
            check(
                g,
                &[x, z],
                y,
                &mut rng,
                TOL,
                &format!("{name} permuted {dt} [{m}, 3, {n}]"),
            );
        }
    }
}

#[test]
fn long_rows_are_split_across_threads() {
    let mut rng = Rng::new(33);
    for n in [100_003usize, 65, 4096] {
        for (k, name) in NAMES.iter().enumerate() {
            for (bn, dt) in [(n, DType::F32), (1, DType::F32), (n, DType::F16)] {
                let mut g = Graph::new();
                let a = g.new_tensor(dt, &[n]).unwrap();
                let b = g.new_f32(&[bn]).unwrap();
                let y = op(&mut g, k, a, b);
                assert_fast(&g, y);
                check(
                    g,
                    &[a, b],
                    y,
                    &mut rng,
                    TOL,
                    &format!("{name} {dt} [{n}] by [{bn}]"),
                );
            }
        }
    }
}

#[test]
fn add1_every_type() {
    let mut rng = Rng::new(34);
    for ta in [DType::F32, DType::F16, DType::BF16] {
        for tb in [DType::F32, DType::F16] {
            for dims in [&[1usize][..], &[19, 3], &[4000]] {
                let mut g = Graph::new();
                let a = g.new_tensor(ta, dims).unwrap();
                let b = g.new_tensor(tb, &[1]).unwrap();
                let y = g.add1(a, b).unwrap();
                assert_fast(&g, y);
                check(
                    g,
                    &[a, b],
                    y,
                    &mut rng,
                    TOL,
                    &format!("add1 {ta}{dims:?} {tb}"),
                );
            }
        }
    }
}

#[test]
fn in_place_chains() {
    let mut rng = Rng::new(35);
    for dt in [DType::F32, DType::F16] {
        let mut g = Graph::new();
        let x = g.new_tensor(dt, &[33, 7]).unwrap();
        let b = g.new_f32(&[33]).unwrap();
        let c = g.new_f32(&[33, 7]).unwrap();
        let y1 = g.scale(x, 2.0).unwrap();
        let y2 = g.add(y1, b).unwrap();
        let y3 = g.mul(y2, c).unwrap();
        let y4 = g.sub(y3, b).unwrap();
        let y5 = g.add(y4, y4).unwrap(); // both sources are the memory it overwrites
        let y6 = g.div(y5, c).unwrap();
        let s = Session::new(g.clone(), &[y6]).unwrap();
        assert!(
            s.plan().inplace.len() >= 4,
            "runs in place: {:?}",
            s.plan().inplace
        );
        check(
            g,
            &[x, b, c],
            y6,
            &mut rng,
            TOL,
            &format!("in-place chain {dt}"),
        );
    }
}

/// `a op b` where `b` is a view of `a` (a row of it, a transposed view): the planner must not
/// run it in place (it would overwrite what `b` still has to read), and the values must be
/// right. (The kernel also copes with such an in-place node, should a plan ever make one.)
#[test]
fn in_place_over_a_source_that_b_views() {
    let mut rng = Rng::new(37);
    for (k, name) in NAMES.iter().enumerate() {
        for dt in [DType::F32, DType::F16] {
            let ts = dt.type_size();
            let mut g = Graph::new();
            let x = g.new_tensor(dt, &[40, 9]).unwrap();
            let a = g.scale(x, 1.5).unwrap();
            let row = g.view(a, &[40, 1], &[40 * ts], 2 * 40 * ts).unwrap();
            let y = op(&mut g, k, a, row);
            assert_fast(&g, y);
            let s = Session::new(g.clone(), &[y]).unwrap();
            assert!(s.plan().inplace.is_empty(), "{:?}", s.plan().inplace);
            check(
                g,
                &[x],
                y,
                &mut rng,
                TOL,
                &format!("{name} {dt} in place, b a row of a"),
            );
            let mut g = Graph::new();
            let x = g.new_tensor(dt, &[9, 9]).unwrap();
            let a = g.scale(x, 1.5).unwrap();
            let t = g.transpose(a).unwrap();
            let y = op(&mut g, k, a, t);
            check(
                g,
                &[x],
                y,
                &mut rng,
                TOL,
                &format!("{name} {dt} in place, b = aᵀ"),
            );
            let mut g = Graph::new();
            let x = g.new_tensor(dt, &[300]).unwrap();
            let a = g.scale(x, 1.5).unwrap();
            let one = g.view(a, &[1], &[], 7 * ts).unwrap();
            let y = g.add1(a, one).unwrap();
            check(
                g,
                &[x],
                y,
                &mut rng,
                TOL,
                &format!("add1 {dt} in place, b an element of a"),
            );
        }
    }
}

#[test]
fn acc_and_set_regions() {
    let mut rng = Rng::new(36);
    // (a shape, b shape, nb1, nb2, nb3, offset) in bytes of f32
    type Region = ([usize; 3], [usize; 3], usize, usize, usize, usize);
    let cases: [Region; 6] = [
        ([4, 3, 1], [2, 2, 1], 16, 32, 32, 20),
        ([17, 9, 2], [5, 4, 2], 68, 17 * 9 * 4, 17 * 9 * 8, 8),
        ([1000, 4, 1], [999, 3, 1], 4000, 16000, 16000, 4004),
        ([64, 64, 1], [8, 8, 4], 256, 8 * 4, 2048, 100 * 4), // dims 1, 2 interleaved, disjoint
        ([32, 8, 1], [16, 6, 1], 20, 1024, 1024, 12),        // rows overlap: nb1 < 16 * 4
        ([10, 10, 1], [3, 3, 3], 40, 8, 0, 4),               // overlapping, nb3 = 0 repeats
    ];
    for (an, bn, nb1, nb2, nb3, off) in cases {
        for acc in [false, true] {
            for bt in [false, true] {
                let mut g = Graph::new();
                let a = g.new_f32(&an).unwrap();
                let (bsrc, b) = if bt {
                    // b as a transposed view
                    let s = g.new_f32(&[bn[1], bn[0], bn[2]]).unwrap();
                    (s, g.transpose(s).unwrap())
                } else {
                    let s = g.new_f32(&bn).unwrap();
                    (s, s)
                };
                let y = if acc {
                    g.acc(a, b, nb1, nb2, nb3, off).unwrap()
                } else {
                    g.set(a, b, nb1, nb2, nb3, off).unwrap()
                };
                assert_fast(&g, y);
                let what = format!(
                    "{} a{an:?} b{bn:?} nb [{nb1}, {nb2}, {nb3}] offset {off} transposed b {bt}",
                    if acc { "acc" } else { "set" }
                );
                check(g, &[a, bsrc], y, &mut rng, TOL, &what);
            }
        }
    }
}

/// `cargo test -p tessera-cpu --test binary -- --ignored --nocapture`: GB/s of a 16M-float add
/// (bytes read + written) against a plain copy, for 1 and 2 threads. Run it in an optimised
/// build to judge the kernel; the test profile (opt-level 1) gives a lower bound.
#[test]
#[ignore]
fn add_throughput() {
    let n = 16 << 20;
    let mut g = Graph::new();
    let a = g.new_f32(&[n]).unwrap();
    let b = g.new_f32(&[n]).unwrap();
    let y = g.add(a, b).unwrap();
    let mut s = Session::new(g, &[y]).unwrap();
    let v: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    s.set_f32(a, &v).unwrap();
    s.set_f32(b, &v).unwrap();
    let best = |f: &mut dyn FnMut()| {
        f();
        (0..7)
            .map(|_| {
                let t = std::time::Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::MAX, f64::min)
    };
    let src = vec![1f32; n];
    let mut dst = vec![0f32; n];
    let t_copy = best(&mut || dst.copy_from_slice(std::hint::black_box(&src)));
    let bytes = (n * 4) as f64;
    println!("copy: {:.1} GB/s", 2.0 * bytes / t_copy / 1e9);
    for th in [1, 2] {
        let cpu = CpuBackend::new(th);
        let t = best(&mut || s.compute(&cpu).unwrap());
        println!(
            "add, {th} threads: {:.1} GB/s ({:.2} ms)",
            3.0 * bytes / t / 1e9,
            t * 1e3
        );
    }
    assert_eq!(s.get_f32(y).unwrap()[999], 1998.0);
}
