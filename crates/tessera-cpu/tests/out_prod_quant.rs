//! CPU out_prod with a quantized `a` (the gradient of `mul_mat(W, x)` w.r.t. `x` for a frozen
//! quantized weight) against the reference: q4_0, q4_1, q5_1, q8_0, q2_K, q4_K, q6_K, iq4_nl,
//! mxfp4, nvfp4 and q1_0 weights (blocks of 32, 64, 128 and 256), odd column counts, rows of
//! `a` spanning several dequantized chunks, several packed depth blocks (128 rows of `a`),
//! broadcasting over dims 2 and 3, a single block split over 3 threads by columns, a strided
//! `b`, no rows at all, and the graph autodiff builds for a quantized weight.
//!
//! Tolerance: 1e-5 of the output's magnitude. The reference dequantizes with the same
//! `tessera_quants::dequantize_row`, so the values multiplied are identical; the only
//! difference is f32 products summed in f32 (in a fixed order) against f64. Measured ≤ 4e-7
//! (q4_0 to q6_K, M up to 4000).

mod common;

use common::*;
use tessera::{DType, Graph, Session, TensorId};
use tessera_cpu::CpuBackend;

const TOL: f64 = 1e-5;

fn assert_fast(g: &Graph, y: TensorId) {
    assert!(
        tessera_cpu::ops::fast_path(g, g.tensor(y)),
        "out_prod({}) should run on a dedicated kernel",
        g.tensor(g.tensor(y).src[0]).dtype
    );
}

/// out_prod of a quantized `a` and an f32 `b` of these shapes, on the kernel, against the
/// reference.
fn check_out_prod(rng: &mut Rng, dt: DType, a_ne: [usize; 4], b_ne: [usize; 4], what: &str) {
    let mut g = Graph::new();
    let a = g.new_tensor(dt, &a_ne).unwrap();
    let b = g.new_f32(&b_ne).unwrap();
    let y = g.out_prod(a, b).unwrap();
    assert_fast(&g, y);
    check(g, &[a, b], y, rng, TOL, what);
}

#[test]
fn quantized_out_prod_matches_the_reference() {
    let mut rng = Rng::new(211);
    let types = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2K,
        DType::Q4K,
        DType::Q6K,
        DType::IQ4NL,
        DType::NVFP4,
        DType::Q1_0,
        DType::MXFP4,
    ];
    for (case, &dt) in types.iter().cycle().take(4 * types.len()).enumerate() {
        let blck = dt.block_size();
        // rows of a: one block, or more than one dequantized chunk (256 elements)
        let blocks = rng.pick(&[1usize, 3, 9, 11]);
        let k = blck * if blck > 32 { blocks.min(3) } else { blocks };
        let m = rng.pick(&[1usize, 5, 64, 129, 300]);
        let n = rng.pick(&[1usize, 3, 7, 13, 37, 200]);
        let (a2, a3) = if case % 3 == 0 {
            (rng.pick(&[1usize, 2]), rng.pick(&[1usize, 2]))
        } else {
            (1, 1)
        };
        let (b2, b3) = (a2 * rng.pick(&[1usize, 3]), a3 * rng.pick(&[1usize, 2]));
        check_out_prod(
            &mut rng,
            dt,
            [k, m, a2, a3],
            [n, m, b2, b3],
            &format!("out_prod {dt} k={k} m={m} n={n} a=[{a2},{a3}] b=[{b2},{b3}]"),
        );
    }
}

#[test]
fn quantized_out_prod_with_a_transposed_b_and_no_rows() {
    let mut rng = Rng::new(212);
    for dt in [DType::Q4_0, DType::Q8_0, DType::Q4K, DType::Q6K] {
        let k = dt.block_size() * 2;
        // b as autodiff would see it without `contig`: the transpose of a [m, n] gradient
        let (m, n) = (150, 23);
        let mut g = Graph::new();
        let a = g.new_tensor(dt, &[k, m]).unwrap();
        let gl = g.new_f32(&[m, n]).unwrap();
        let b = g.transpose(gl).unwrap();
        let y = g.out_prod(a, b).unwrap();
        assert_fast(&g, y);
        check(
            g,
            &[a, gl],
            y,
            &mut rng,
            TOL,
            &format!("out_prod {dt} transposed b"),
        );
    }
    // one row of a per column: a single product per output, zero rows are a zero sum
    for m in [0usize, 1] {
        check_out_prod(
            &mut rng,
            DType::Q4_1,
            [64, m, 1, 1],
            [5, m, 1, 1],
            &format!("out_prod q4_1 m={m}"),
        );
    }
}

#[test]
fn quantized_weight_gradient_runs_on_the_kernel() {
    // y = mul_mat(W, x) with a frozen q4_K W: the gradient w.r.t. x is out_prod(W, gᵀ)
    let mut rng = Rng::new(213);
    let (k, m, n) = (512, 96, 19);
    let mut g = Graph::new();
    let w = g.new_tensor(DType::Q4K, &[k, m]).unwrap();
    let x = g.new_f32(&[k, n]).unwrap();
    g.set_param(x).unwrap();
    let y = g.mul_mat(w, x).unwrap();
    let l = g.sum(y).unwrap();
    g.set_loss(l).unwrap();
    let gr = g.build_backward(false).unwrap();
    let gx = gr.grads[0];
    let op = (0..g.len() as u32)
        .map(TensorId)
        .find(|&id| {
            let t = g.tensor(id);
            matches!(t.op, tessera::Op::OutProd) && t.src[0] == w
        })
        .expect("the backward graph has an out_prod of the weight");
    assert_fast(&g, op);
    let mut s = Session::new(g, &gr.outputs()).unwrap();
    let wv: Vec<f32> = (0..k * m).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let xv: Vec<f32> = (0..k * n).map(|_| rng.uniform(-1.0, 1.0)).collect();
    s.set_f32(w, &wv).unwrap();
    s.set_f32(x, &xv).unwrap();
    gr.reset(&mut s).unwrap();
    s.compute(&tessera::ReferenceBackend).unwrap();
    let want = s.get_f64(gx).unwrap();
    // d(sum y)/dx[i, j] = Σ_m W[i, m], the same for every column j
    let wq = s.get_f32(w).unwrap();
    for i in 0..k {
        let col: f64 = (0..m).map(|r| wq[r * k + i] as f64).sum();
        assert!((want[i] - col).abs() < 1e-9, "reference gradient {i}");
    }
    for nth in 1..=3 {
        gr.reset(&mut s).unwrap();
        s.compute(&CpuBackend::new(nth)).unwrap();
        let got = s.get_f32(gx).unwrap();
        let scale = want.iter().fold(0f64, |a, v| a.max(v.abs()));
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(
                ((g as f64) - w).abs() <= TOL * scale,
                "{nth} threads: element {i}: {g} vs {w}"
            );
        }
    }
}

/// Timing (run with `cargo test --release -p tessera-cpu --test out_prod_quant -- --ignored
/// --nocapture`): out_prod of a q4_1 [576, 1536] weight with N = 512 columns, 1 and 2 threads,
/// best of several runs, and the same product with an f32 weight (the float kernel) beside it.
#[test]
#[ignore]
fn quantized_out_prod_timing() {
    let (k, m, n) = (576usize, 1536usize, 512usize);
    let mut rng = Rng::new(214);
    let av: Vec<f32> = (0..k * m).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let bv: Vec<f32> = (0..n * m).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let flop = 2.0 * (k * m * n) as f64;
    for dt in [DType::Q4_1, DType::F32] {
        let mut g = Graph::new();
        let a = g.new_tensor(dt, &[k, m]).unwrap();
        let b = g.new_f32(&[n, m]).unwrap();
        let y = g.out_prod(a, b).unwrap();
        let fast = tessera_cpu::ops::fast_path(&g, g.tensor(y));
        let mut s = Session::new(g, &[y]).unwrap();
        s.set_f32(a, &av).unwrap();
        s.set_f32(b, &bv).unwrap();
        for nth in [1usize, 2] {
            let cpu = CpuBackend::new(nth);
            s.compute(&cpu).unwrap();
            let reps = if fast { 20 } else { 2 };
            let mut best = f64::MAX;
            for _ in 0..reps {
                let t = std::time::Instant::now();
                s.compute(&cpu).unwrap();
                best = best.min(t.elapsed().as_secs_f64());
            }
            println!(
                "out_prod {dt} [{k}, {m}] x N={n}, {nth} thread(s), {}: {:.2} ms, {:.2} GFLOP/s",
                if fast { "kernel" } else { "fallback" },
                best * 1e3,
                flop / best / 1e9
            );
        }
    }
}
