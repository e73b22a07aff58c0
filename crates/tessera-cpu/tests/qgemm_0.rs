//! The q4_0 / q4_1 / q5_0 / q5_1 / q8_0 mat-mat path for five or more columns (`qgemm_0`, AVX2): every
//! element of a CPU mul_mat equals the one-column kernel (`matmul_quant::vec_dot`, ggml's
//! x86 `vec_dot`) for its row and quantized column, bit for bit, on every thread count —
//! across row chunks (32), column windows (128), K chunks (32 blocks), ragged edges and batches
//! with a broadcast weight matrix. On the scalar ISA the one-column kernels run as before.

mod common;

use common::*;
use tessera::DType;
use tessera_cpu::ops::matmul_quant;

fn check(t: DType, k: usize, m: usize, n: usize, nb2: usize, rng: &mut Rng) {
    check_quantized_product(t, (k, m, n, nb2), rng, |isa, w, x| {
        matmul_quant::vec_dot(isa, t, w, x, k)
    });
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
    ] {
        for &(k, m, n, nb2) in &[
            (32usize, 5usize, 8usize, 1usize),
            (64, 6, 5, 1),
            (96, 9, 7, 2),
            (320, 7, 9, 1),
            (256, 4, 17, 2),
        ] {
            check(t, k, m, n, nb2, &mut rng);
        }
    }
}

/// More rows than a chunk (32), more columns than a window (128 = 16 groups), more blocks
/// than a K chunk (32), all ragged; and the few-group path (up to 24 columns).
#[test]
fn chunks_windows_and_ragged_edges() {
    let mut rng = Rng::new(52);
    check(DType::Q4_1, 1056, 70, 131, 1, &mut rng);
    check(DType::Q8_0, 1088, 35, 135, 1, &mut rng);
    check(DType::Q4_1, 352, 70, 75, 1, &mut rng);
    check(DType::Q4_0, 96, 130, 8, 1, &mut rng);
    check(DType::Q5_1, 64, 9, 24, 1, &mut rng);
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
