//! The q4_0 / q4_1 / q5_0 / q5_1 / q8_0 mat-mat path for five or more columns (`qgemm_0`, AVX2): every
//! element of a CPU mul_mat equals the one-column kernel (`matmul_quant::vec_dot`, ggml's
//! x86 `vec_dot`) for its row and quantized column, bit for bit, on every thread count —
//! across row chunks (32), column windows (128), K chunks (32 blocks), ragged edges and batches
//! with a broadcast weight matrix. On the scalar ISA the one-column kernels run as before.
//! mxfp4 takes the path too, with its `vec_dot`'s two accumulators (even and odd blocks) and
//! its odd last block added after the horizontal sum.
//!
//! iq4_nl takes this path from two columns on, with the arithmetic of ggml's x86 mat-mat
//! (llamafile's tinyBLAS: one accumulator per lane, `matmul_quant::vec_dot_scalar`), which its
//! one-column kernel does not share; the scalar ISA keeps ggml's generic `vec_dot` for it.

mod common;

use common::*;
use tessera::DType;
use tessera_cpu::ops::matmul_quant;

fn check(t: DType, k: usize, m: usize, n: usize, nb2: usize, rng: &mut Rng) {
    check_quantized_product(t, (k, m, n, nb2), rng, |isa, w, x| {
        if matmul_quant::lanes_numerics(isa, t, n) {
            matmul_quant::vec_dot_scalar(t, w, x, k)
        } else {
            matmul_quant::vec_dot(isa, t, w, x, k)
        }
    });
}

/// iq4_nl: one column as its `vec_dot` (ggml's, two accumulators), two or more as ggml's x86
/// mat-mat (one accumulator per lane) on AVX2 and as `vec_dot` on the scalar ISA, on every
/// thread count and path (few groups, chunks, windows), with odd and even block counts.
#[test]
fn iq4_nl_rounds_as_ggml_for_one_and_for_many_columns() {
    let mut rng = Rng::new(55);
    for &(k, m, n, nb2) in &[
        (96usize, 9usize, 1usize, 1usize),
        (96, 9, 2, 1),
        (288, 6, 3, 2),
        (64, 5, 4, 1),
        (1088, 35, 9, 1),
        (1056, 70, 131, 1),
    ] {
        check(DType::IQ4NL, k, m, n, nb2, &mut rng);
    }
}

/// iq4_nl mul_mat against ggml's own results (`data/iq4nl_mm_ggml.bin`, written by a small C
/// program, not part of this repository, linked against llama.cpp's `libggml-cpu` as vendored by
/// llama-cpp-python 0.3.36, gcc 12, AVX2, llamafile on; 1 and 2 threads gave the same bytes):
/// weights quantized by `ggml_quantize_chunk`, f32 activations, the results of
/// `ggml_mul_mat` for 1, 2, 3, 5 and 8 columns, 8 and 9 and 33 blocks. One column is ggml's
/// `vec_dot`, more are tinyBLAS; every element bit for bit on AVX2 (and AVX-512) and every
/// thread count. (The scalar ISA computes ggml's generic code for iq4_nl, checked elsewhere.)
/// Format: `common::qmm_fixture`.
#[test]
fn iq4_nl_equals_ggml_mul_mat() {
    use tessera::{Graph, Session};
    use tessera_cpu::Isa;
    let cases = qmm_fixture(include_bytes!("data/iq4nl_mm_ggml.bin"));
    let mut cols_seen = Vec::new();
    let mut checked = 0;
    for c in &cases {
        let (t, k, m, n) = (c.t, c.k, c.m, c.n);
        assert_eq!(t, DType::IQ4NL);
        let mut g = Graph::new();
        let ta = g.new_tensor(t, &[k, m]).unwrap();
        let tb = g.new_f32(&[k, n]).unwrap();
        let y = g.mul_mat(ta, tb).unwrap();
        let mut s = Session::new(g, &[y]).unwrap();
        s.set_bytes(ta, &c.w).unwrap();
        s.set_f32(tb, &c.b).unwrap();
        for cpu in cpu_configs().into_iter().filter(|c| c.isa() != Isa::Scalar) {
            s.compute(&cpu).unwrap();
            let got = s.get_f32(y).unwrap();
            checked += 1;
            for (i, (g, w)) in got.iter().zip(&c.want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "k={k} m={m} n={n}: element {i} is {g} not ggml's {w} on {:?}/{}t",
                    cpu.isa(),
                    cpu.n_threads()
                );
            }
        }
        cols_seen.push(n);
    }
    assert!(tessera_cpu::simd::isa() == Isa::Scalar || checked > 0);
    assert!(cols_seen.contains(&1) && cols_seen.contains(&2) && cols_seen.contains(&8));
}

/// The two roundings of iq4_nl do differ (else the test above could not tell them apart): on
/// random rows of eight blocks, most results of the two disagree in their last bits.
#[test]
fn iq4_nl_one_and_many_column_roundings_differ() {
    use tessera_cpu::ops::matmul_quant::vec_dot_scalar;
    use tessera_cpu::Isa;
    let mut rng = Rng::new(56);
    let (k, t) = (256, DType::IQ4NL);
    let mut differ = 0;
    for _ in 0..50 {
        let (w, x) = random_row_and_q8_0(t, k, &mut rng);
        let one = matmul_quant::vec_dot(Isa::Scalar, t, &w, &x, k);
        let many = vec_dot_scalar(t, &w, &x, k);
        assert!(
            (one - many).abs() <= 1e-4 * one.abs().max(1.0),
            "{one} vs {many}"
        );
        differ += (one.to_bits() != many.to_bits()) as usize;
    }
    assert!(differ >= 10, "only {differ} of 50 differ");
}

#[test]
fn every_element_equals_the_one_column_kernel() {
    let mut rng = Rng::new(51);
    for t in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::MXFP4,
    ] {
        for &(k, m, n, nb2) in &[
            (32usize, 5usize, 8usize, 1usize),
            (64, 6, 5, 1),
            (96, 9, 7, 2),
            (320, 7, 9, 1),
            (256, 4, 17, 2),
            // (the pairs-of-groups layout on AVX-512 VNNI: 5 groups, the last one ragged)
            (64, 5, 33, 2),
        ] {
            check(t, k, m, n, nb2, &mut rng);
        }
    }
}

/// More rows than a chunk (32), more columns than a window (128 = 16 groups), more blocks
/// than a K chunk (32), all ragged; and the few-group path (up to 24 columns). On AVX-512
/// VNNI more than 24 columns take the pairs-of-groups layout: odd group counts (an empty
/// half), a half-filled last group and two batches of them, for every type.
#[test]
fn chunks_windows_and_ragged_edges() {
    let mut rng = Rng::new(52);
    check(DType::Q4_1, 1056, 70, 131, 1, &mut rng);
    check(DType::Q8_0, 1088, 35, 135, 1, &mut rng);
    check(DType::Q4_1, 352, 70, 75, 1, &mut rng);
    check(DType::Q4_0, 96, 130, 8, 1, &mut rng);
    check(DType::Q5_1, 64, 9, 24, 1, &mut rng);
    check(DType::Q4_0, 1088, 37, 33, 2, &mut rng);
    check(DType::Q5_0, 320, 9, 41, 2, &mut rng);
    check(DType::Q5_1, 1056, 20, 25, 1, &mut rng);
    check(DType::Q4_1, 64, 33, 48, 2, &mut rng);
    // mxfp4's two accumulators and odd last block: 33 blocks (the last in the second K chunk),
    // 34, and one
    check(DType::MXFP4, 1056, 37, 131, 1, &mut rng);
    check(DType::MXFP4, 1088, 9, 40, 2, &mut rng);
    check(DType::MXFP4, 32, 5, 33, 1, &mut rng);
    check(DType::MXFP4, 32, 6, 6, 1, &mut rng);
}

/// q8_0 codes no quantizer writes but a file may hold: −128 (its magnitude 128 does not fit
/// i8) and zeros, alone and in whole blocks, against activations with outliers; on every path
/// (few groups, chunks) the same bits as ggml's one-column kernel.
#[test]
fn q8_0_extreme_codes_equal_the_one_column_kernel() {
    let mut rng = Rng::new(54);
    let edit = |w: &mut [u8]| {
        for (b, blk) in w.chunks_exact_mut(34).enumerate() {
            match b % 5 {
                0 => blk[2..].fill(0x80),
                1 => blk[2..].fill(0),
                _ => {
                    blk[2 + (7 * b) % 32] = 0x80;
                    blk[2 + (11 * b + 3) % 32] = 0;
                    blk[2 + (13 * b + 5) % 32] = 0x7f;
                }
            }
        }
    };
    for &(k, m, n) in &[(96usize, 9usize, 8usize), (1088, 35, 135)] {
        check_quantized_product_edited(DType::Q8_0, (k, m, n, 1), &mut rng, edit, |isa, w, x| {
            matmul_quant::vec_dot(isa, DType::Q8_0, w, x, k)
        });
    }
}

/// A strided `b` (a transposed view, columns 4·n bytes apart element to element) gives the
/// same bits as its contiguous copy, for both packed paths.
#[test]
fn strided_columns_equal_contiguous_ones() {
    use tessera::{Graph, Session};
    let mut rng = Rng::new(53);
    for t in [DType::Q4_1, DType::Q4K] {
        let (k, m, n) = (256usize, 9usize, 11usize);
        let av: Vec<f32> = (0..k * m).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let bv: Vec<f32> = (0..k * n).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let mut g = Graph::new();
        let a = g.new_tensor(t, &[k, m]).unwrap();
        let b0 = g.new_f32(&[n, k]).unwrap();
        let bt = g.transpose(b0).unwrap();
        let strided = g.mul_mat(a, bt).unwrap();
        let bc = g.cont(bt).unwrap();
        let contiguous = g.mul_mat(a, bc).unwrap();
        let mut s = Session::new(g, &[strided, contiguous]).unwrap();
        s.set_f32(a, &av).unwrap();
        s.set_f32(b0, &bv).unwrap();
        for cpu in cpu_configs() {
            s.compute(&cpu).unwrap();
            let (x, y) = (s.get_f32(strided).unwrap(), s.get_f32(contiguous).unwrap());
            assert!(
                x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()),
                "{t} on {:?}/{}t",
                cpu.isa(),
                cpu.n_threads()
            );
        }
    }
}
