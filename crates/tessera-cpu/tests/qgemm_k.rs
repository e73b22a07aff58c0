//! The k-quant mat-mat path (`qgemm_k`, ggml's tiled numerics for eight or more columns): every
//! element of a CPU mul_mat equals `qgemm_k::dot_ref` of its weight row and its quantized
//! column, bit for bit, on every ISA and thread count — across types, ragged row and column
//! counts, several column windows and batches with a broadcast weight matrix.

mod common;

use common::*;
use tessera::{DType, Graph, Session};
use tessera_cpu::ops::{matmul_quant, qgemm_k};

/// Every type ggml's tiled path takes.
const TYPES: [DType; 13] = [
    DType::Q2K,
    DType::Q3K,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
    DType::IQ4XS,
    DType::IQ2XXS,
    DType::IQ2XS,
    DType::IQ2S,
    DType::IQ3XXS,
    DType::IQ3S,
    DType::IQ1S,
    DType::IQ1M,
];

/// Every element of y = mul_mat(a [k, m, 1], b [k, n, nb2]) against `dot_ref`.
fn check(t: DType, k: usize, m: usize, n: usize, nb2: usize, rng: &mut Rng) {
    check_quantized_product(t, (k, m, n, nb2), rng, |_, w, x| {
        qgemm_k::dot_ref(t, w, x, k)
    });
}

#[test]
fn every_element_equals_the_tiled_definition() {
    let mut rng = Rng::new(41);
    for t in TYPES {
        for &(k, m, n, nb2) in &[
            (256usize, 5usize, 8usize, 1usize),
            (512, 7, 9, 1),
            (768, 4, 17, 2),
        ] {
            check(t, k, m, n, nb2, &mut rng);
        }
    }
}

/// More rows than one unpacked window (32) and more columns than one accumulated window
/// (64 groups of 8), with ragged ends of both.
#[test]
fn windows_and_ragged_edges() {
    let mut rng = Rng::new(42);
    check(DType::Q4K, 256, 37, 523, 1, &mut rng);
    check(DType::Q6K, 256, 70, 12, 1, &mut rng);
}

/// Below eight columns ggml keeps its one-column kernels; from eight on it takes the tiled
/// path; the threshold is on b's second dimension, not on all its columns.
#[test]
fn the_threshold_is_eight_columns_per_batch() {
    assert!(!qgemm_k::applies(DType::Q4K, 7));
    assert!(qgemm_k::applies(DType::Q4K, 8));
    assert!(!qgemm_k::applies(DType::Q4_0, 64));
    assert!(!qgemm_k::applies(DType::IQ4NL, 64));
    assert!(!qgemm_k::applies(DType::TQ1_0, 64));
    for t in TYPES {
        assert!(qgemm_k::applies(t, 8), "{t}");
    }
}

/// ggml's own results: `tests/data/qgemm_ggml.bin` was written by a small C program (not in
/// this repository) that runs `ggml_mul_mat` with llama.cpp's `libggml-cpu` (plain CPU buffer,
/// one thread) on each of the 13 types at [256×4]·[256×8], [512×3]·[512×20] (ggml's 16-column
/// window and its narrow path both) and [256×17]·[256×9], weights quantized with an importance
/// matrix of 1 + (i mod 7). Format: `QGEMMFX1`, a u32 count, then per
/// case u32 type id, K, M, N, seed, weight bytes, the weights (quantized by ggml) and the
/// M×N f32 result. The activations are not stored: both sides draw them from the seed
/// (xorshift32, every 97th value 25.0).
#[test]
fn equals_ggml_bit_for_bit() {
    let b = include_bytes!("data/qgemm_ggml.bin");
    assert_eq!(&b[0..8], b"QGEMMFX1");
    let u32_at = |p: usize| u32::from_le_bytes(b[p..p + 4].try_into().unwrap());
    let count = u32_at(8) as usize;
    let mut p = 12;
    let mut types_seen = std::collections::BTreeSet::new();
    let mut differs_from_vec_dot = 0usize;
    for _ in 0..count {
        let (id, k, m, n, seed, wl) = (
            u32_at(p),
            u32_at(p + 4) as usize,
            u32_at(p + 8) as usize,
            u32_at(p + 12) as usize,
            u32_at(p + 16),
            u32_at(p + 20) as usize,
        );
        p += 24;
        let t = DType::from_id(id).unwrap();
        let w = &b[p..p + wl];
        p += wl;
        let want: Vec<f32> = (0..m * n)
            .map(|i| f32::from_le_bytes(b[p + 4 * i..p + 4 * i + 4].try_into().unwrap()))
            .collect();
        p += 4 * m * n;
        types_seen.insert(id);
        // the generator's draws: the weights' floats first (not needed: their quantized bytes
        // are stored), then the activations
        let mut xs = seed.wrapping_mul(2_654_435_761) | 1;
        let mut rnd = || {
            xs ^= xs << 13;
            xs ^= xs >> 17;
            xs ^= xs << 5;
            xs as f32 / u32::MAX as f32 - 0.5
        };
        for _ in 0..k * m {
            rnd();
        }
        let bv: Vec<f32> = (0..k * n)
            .map(|i| if i % 97 == 5 { 25.0 } else { rnd() })
            .collect();
        let mut g = Graph::new();
        let a = g.new_tensor(t, &[k, m]).unwrap();
        let bt = g.new_f32(&[k, n]).unwrap();
        let y = g.mul_mat(a, bt).unwrap();
        let mut s = Session::new(g, &[y]).unwrap();
        s.set_bytes(a, w).unwrap();
        s.set_f32(bt, &bv).unwrap();
        for cpu in cpu_configs() {
            s.compute(&cpu).unwrap();
            let got = s.get_f32(y).unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{t} [{k}×{m}]·[{k}×{n}]: row {} column {}: {g} vs ggml {w} on {:?}/{}t",
                    i % m,
                    i / m,
                    cpu.isa(),
                    cpu.n_threads()
                );
            }
        }
        // the one-column kernels round differently: the fixture tells the two paths apart
        let vdt = matmul_quant::vec_dot_type(t);
        let xr = vdt.row_size(k).unwrap();
        let wr = t.row_size(k).unwrap();
        for c in 0..n {
            let mut xq = vec![0u8; xr];
            matmul_quant::quantize_activations(vdt, &bv[c * k..(c + 1) * k], &mut xq).unwrap();
            for r in 0..m {
                let one = tessera_cpu::ops::qdot::vec_dot(
                    tessera_cpu::Isa::Scalar,
                    t,
                    &w[r * wr..(r + 1) * wr],
                    &xq,
                    k,
                );
                differs_from_vec_dot += (one.to_bits() != want[c * m + r].to_bits()) as usize;
            }
        }
    }
    assert_eq!(p, b.len());
    assert_eq!(types_seen.len(), TYPES.len(), "every type has cases");
    assert!(
        differs_from_vec_dot > 0,
        "no element tells the tiled rounding from the one-column kernels'"
    );
}

/// A batch-invariant backend (the server's batches) keeps the one-column rounding for these
/// types at any column count: every element equals `vec_dot` of its row and column.
#[test]
fn batch_invariant_backends_keep_the_one_column_rounding() {
    use tessera_cpu::ops::matmul_quant;
    let mut rng = Rng::new(43);
    let (k, m, n) = (512usize, 6usize, 19usize);
    for t in [DType::Q4K, DType::IQ4XS, DType::Q6K] {
        let av: Vec<f32> = (0..k * m).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let bv: Vec<f32> = (0..k * n).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let wr = t.row_size(k).unwrap();
        let mut wq = vec![0u8; wr * m];
        for (row, o) in av.chunks_exact(k).zip(wq.chunks_exact_mut(wr)) {
            tessera_quants::quantize_row(t.id(), row, o, None).unwrap();
        }
        let xr = DType::Q8K.row_size(k).unwrap();
        let mut g = Graph::new();
        let a = g.new_tensor(t, &[k, m]).unwrap();
        let b = g.new_f32(&[k, n]).unwrap();
        let y = g.mul_mat(a, b).unwrap();
        let mut s = Session::new(g, &[y]).unwrap();
        s.set_bytes(a, &wq).unwrap();
        s.set_f32(b, &bv).unwrap();
        for cpu in cpu_configs() {
            let (isa, nth) = (cpu.isa(), cpu.n_threads());
            let cpu = cpu.batch_invariant(true);
            s.compute(&cpu).unwrap();
            let got = s.get_f32(y).unwrap();
            for c in 0..n {
                let mut xq = vec![0u8; xr];
                matmul_quant::quantize_activations(DType::Q8K, &bv[c * k..(c + 1) * k], &mut xq)
                    .unwrap();
                for r in 0..m {
                    let want = matmul_quant::vec_dot(isa, t, &wq[r * wr..(r + 1) * wr], &xq, k);
                    assert_eq!(
                        got[c * m + r].to_bits(),
                        want.to_bits(),
                        "{t}: row {r} column {c} on {isa:?}/{nth}t"
                    );
                }
            }
        }
    }
}
