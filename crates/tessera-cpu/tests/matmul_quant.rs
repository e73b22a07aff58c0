//! CPU mul_mat with quantized weights against the reference. The CPU quantizes the activations
//! to the weight type's partner format first, as ggml does, so it is compared by normalised mean
//! squared error with ggml's own bound for these cases (5e-4); results must be bit-identical
//! for every thread count.

mod common;

use common::*;
use tessera::{DType, Graph, ReferenceBackend, Session};

fn nmse(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w).powi(2))
        .sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    num / den.max(1e-300)
}

/// A session computing `mul_mat(a, b)` for weights `av` quantized to `t` (shape `a_ne`) and
/// f32 activations `bv` (shape `b_ne`): the session, the product's id and the weights' bytes.
fn product(
    t: DType,
    a_ne: &[usize],
    b_ne: &[usize],
    av: &[f32],
    bv: &[f32],
) -> (Session, tessera::TensorId, Vec<u8>) {
    let mut g = Graph::new();
    let a = g.new_tensor(t, a_ne).unwrap();
    let b = g.new_f32(b_ne).unwrap();
    let y = g.mul_mat(a, b).unwrap();
    let mut s = Session::new(g, &[y]).unwrap();
    if tessera_quants::requires_imatrix(t.id()) {
        // the i-quants that need an importance matrix get a uniform one
        let k = a_ne[0];
        let row = t.row_size(k).unwrap();
        let ones = vec![1f32; k];
        let mut bytes = vec![0u8; row * (av.len() / k)];
        for (src, dst) in av.chunks(k).zip(bytes.chunks_mut(row)) {
            tessera_quants::quantize_row(t.id(), src, dst, Some(&ones)).unwrap();
        }
        s.set_bytes(a, &bytes).unwrap();
    } else {
        s.set_f32(a, av).unwrap();
    }
    s.set_f32(b, bv).unwrap();
    let wbytes = s.get_bytes(a).unwrap();
    (s, y, wbytes)
}

#[test]
fn quantized_mul_mat_matches_the_reference() {
    let mut rng = Rng::new(21);
    let types: Vec<DType> = DType::ALL
        .into_iter()
        .filter(|t| t.is_quantized() && !matches!(t, DType::Q8_1 | DType::Q8K))
        .filter(|t| {
            tessera_quants::can_quantize(t.id()) && !tessera_quants::requires_imatrix(t.id())
        })
        .collect();
    assert!(types.len() >= 10, "quantizers available: {types:?}");
    for &t in &types {
        let blk = t.block_size().max(32);
        for &(kb, m, n, b2) in &[
            (2usize, 7usize, 1usize, 1usize),
            (3, 5, 4, 2),
            (1, 33, 9, 1),
        ] {
            let k = kb * blk.max(256) / if blk >= 256 { 1 } else { 256 / blk };
            let k = k.max(blk);
            let mut g = Graph::new();
            let a = g.new_tensor(t, &[k, m, 1]).unwrap();
            let b = g.new_f32(&[k, n, b2]).unwrap();
            let y = g.mul_mat(a, b).unwrap();
            let mut s = Session::new(g, &[y]).unwrap();
            let av: Vec<f32> = (0..k * m).map(|_| rng.uniform(-1.0, 1.0)).collect();
            let bv: Vec<f32> = (0..k * n * b2).map(|_| rng.uniform(-1.0, 1.0)).collect();
            s.set_f32(a, &av).unwrap();
            s.set_f32(b, &bv).unwrap();
            s.compute(&ReferenceBackend).unwrap();
            let want = s.get_f64(y).unwrap();
            let mut first: Option<Vec<f32>> = None;
            for cpu in cpu_configs() {
                s.compute(&cpu).unwrap();
                let got = s.get_f32(y).unwrap();
                let e = nmse(&got, &want);
                assert!(
                    e < 5e-4,
                    "{t} k={k} m={m} n={n}: nmse {e:e} on {:?}/{}t",
                    cpu.isa(),
                    cpu.n_threads()
                );
                assert!(
                    tessera_cpu::ops::fast_path(s.graph(), s.graph().tensor(y)),
                    "{t} should not fall back"
                );
                if cpu.isa() == tessera_cpu::simd::isa() {
                    match &first {
                        None => first = Some(got),
                        Some(f) => assert!(
                            f.iter().zip(&got).all(|(x, y)| x.to_bits() == y.to_bits()),
                            "{t}: thread counts differ"
                        ),
                    }
                }
            }
        }
    }
}

/// Large products run in cache blocks (rows × columns): every element equals the one computed
/// for its column alone, on any thread count — for a type with four-row tiles (q4_1) and one
/// with one-row kernels (q4_K), with several row and column blocks and ragged edges. (From
/// eight columns on q4_K takes ggml's tiled path, whose elements each depend on their own row
/// and column only: there "alone" is a window of eight columns.)
#[test]
fn cache_blocking_does_not_change_any_element() {
    let mut rng = Rng::new(22);
    for (t, k, m, n, window) in [
        (DType::Q4_1, 4096usize, 53usize, 70usize, 1usize),
        (DType::Q4K, 4096, 61, 64, 8),
    ] {
        let av: Vec<f32> = (0..k * m).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let bv: Vec<f32> = (0..k * n).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let run = |cols: std::ops::Range<usize>, cpu: &tessera_cpu::CpuBackend| {
            let mut g = Graph::new();
            let a = g.new_tensor(t, &[k, m]).unwrap();
            let b = g.new_f32(&[k, cols.len()]).unwrap();
            let y = g.mul_mat(a, b).unwrap();
            let mut s = Session::new(g, &[y]).unwrap();
            s.set_f32(a, &av).unwrap();
            s.set_f32(b, &bv[cols.start * k..cols.end * k]).unwrap();
            s.compute(cpu).unwrap();
            s.get_f32(y).unwrap()
        };
        for cpu in cpu_configs() {
            let all = run(0..n, &cpu);
            for j in [0, 1, 26, 27, 28, 40, n - 1] {
                let start = j.min(n - window);
                let one = run(start..start + window, &cpu);
                for r in 0..m {
                    assert_eq!(
                        all[j * m + r].to_bits(),
                        one[(j - start) * m + r].to_bits(),
                        "{t}: row {r} column {j} on {:?}/{}t",
                        cpu.isa(),
                        cpu.n_threads()
                    );
                }
            }
        }
    }
}

/// A mat-vec (or a product with a few columns, as in decoding several sequences) of the
/// four-row types takes each call's rows from four quarters of a thread's rows, for streaming:
/// every element must still be the one-row, one-column kernel's value, at every row count
/// (remainders of 1-3 rows, fewer rows than four; eight rows a call for one column), column
/// count, thread count and batch, with a broadcast weight matrix.
#[test]
fn few_column_products_equal_the_one_row_kernel_in_any_row_order() {
    use tessera_cpu::ops::matmul_quant::{quantize_activations, vec_dot, vec_dot_type};
    let mut rng = Rng::new(23);
    // (iq4_nl's products of two or more columns take ggml's mat-mat numerics: mat-vec only;
    // k = 96 gives it an odd last block)
    for t in [DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::IQ4NL] {
        let k = 96;
        for (m, n) in [
            (1usize, 1usize),
            (3, 2),
            (4, 1),
            (5, 3),
            (37, 1),
            (37, 7),
            (130, 5),
            (130, 1),
        ] {
            if t == DType::IQ4NL && n > 1 {
                continue;
            }
            let av: Vec<f32> = (0..k * m).map(|_| rng.uniform(-1.0, 1.0)).collect();
            let bv: Vec<f32> = (0..k * n * 2).map(|_| rng.uniform(-1.0, 1.0)).collect();
            let (mut s, y, wbytes) = product(t, &[k, m, 1], &[k, n, 2], &av, &bv);
            let row = t.row_size(k).unwrap();
            let vdt = vec_dot_type(t);
            for cpu in cpu_configs() {
                s.compute(&cpu).unwrap();
                let got = s.get_f32(y).unwrap();
                for col in 0..2 * n {
                    let mut x = vec![0u8; vdt.row_size(k).unwrap()];
                    quantize_activations(vdt, &bv[col * k..(col + 1) * k], &mut x).unwrap();
                    for r in 0..m {
                        let want = vec_dot(cpu.isa(), t, &wbytes[r * row..(r + 1) * row], &x, k);
                        assert_eq!(
                            got[col * m + r].to_bits(),
                            want.to_bits(),
                            "{t}: m={m} n={n} row {r} column {col} on {:?}/{}t",
                            cpu.isa(),
                            cpu.n_threads()
                        );
                    }
                }
            }
        }
    }
}

/// The types with one-row kernels only (ternary, microscaling, most i-quants) run a product's
/// columns one by one over L1-sized groups of rows, inside row and column cache blocks; the
/// mat-vec of the one-row kernels hands its rows out in chunks, batch by batch: every element
/// must still be `vec_dot` of its row and column, with ragged row groups and chunks, two row
/// blocks and two column blocks, on every instruction set and thread count.
#[test]
fn one_row_kernel_types_compute_every_element_as_vec_dot() {
    use tessera_cpu::ops::matmul_quant::{quantize_activations, vec_dot, vec_dot_type};
    let mut rng = Rng::new(24);
    let k = 4096usize;
    let many = [DType::TQ1_0, DType::TQ2_0, DType::MXFP4].map(|t| (t, 70usize, 30usize, 1usize));
    let matvec = [
        DType::TQ1_0,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
        DType::IQ4XS,
        DType::Q5_0,
        // the lattice and small-float types' rows go through `qdot`'s row-kernel loop
        DType::IQ1S,
        DType::IQ1M,
        DType::IQ2XXS,
        DType::IQ3S,
        DType::NVFP4,
        DType::Q1_0,
    ]
    .into_iter()
    .flat_map(|t| [(t, 70, 1, 1), (t, 37, 1, 3)]);
    for (t, m, n, nb) in many.into_iter().chain(matvec) {
        assert!(tessera_quants::can_quantize(t.id()), "{t} has a quantizer");
        let av: Vec<f32> = (0..k * m).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let bv: Vec<f32> = (0..k * n * nb).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let (mut s, y, wbytes) = product(t, &[k, m], &[k, n, nb], &av, &bv);
        let row = t.row_size(k).unwrap();
        let vdt = vec_dot_type(t);
        let xs: Vec<Vec<u8>> = (0..n * nb)
            .map(|col| {
                let mut x = vec![0u8; vdt.row_size(k).unwrap()];
                quantize_activations(vdt, &bv[col * k..(col + 1) * k], &mut x).unwrap();
                x
            })
            .collect();
        for cpu in cpu_configs() {
            s.compute(&cpu).unwrap();
            let got = s.get_f32(y).unwrap();
            for (col, x) in xs.iter().enumerate() {
                for r in 0..m {
                    let want = vec_dot(cpu.isa(), t, &wbytes[r * row..(r + 1) * row], x, k);
                    assert_eq!(
                        got[col * m + r].to_bits(),
                        want.to_bits(),
                        "{t} m={m} n={n} batches={nb}: row {r} column {col} on {:?}/{}t",
                        cpu.isa(),
                        cpu.n_threads()
                    );
                }
            }
        }
    }
}

/// `mul_mat(a, b)` for q4_0/q4_1/iq4_nl/iq4_xs weights `av` with `a`'s rows plain or interleaved
/// (`tessera::layout`): the session and the product's id.
fn product_with_layout(
    t: DType,
    layout: tessera::RowLayout,
    a_ne: &[usize],
    b_ne: &[usize],
    av: &[f32],
    bv: &[f32],
) -> (Session, tessera::TensorId, tessera::TensorId) {
    let mut g = Graph::new();
    let a = g.new_tensor(t, a_ne).unwrap();
    g.set_layout(a, layout).unwrap();
    let b = g.new_f32(b_ne).unwrap();
    let y = g.mul_mat(a, b).unwrap();
    let mut s = Session::new(g, &[y]).unwrap();
    s.set_f32(a, av).unwrap();
    s.set_f32(b, bv).unwrap();
    (s, y, a)
}

/// Weights interleaved in groups of eight rows give every element the bits of the plain rows,
/// on every instruction set and thread count: mat-vec and up to 24 columns through the
/// eight-row group loop (the interleaved kernels on AVX-512 VNNI), more columns (and iq4_nl's
/// from two on) through the packed paths with each chunk of rows de-interleaved;
/// with a batch broadcasting the weights, and an odd last block for iq4_nl; iq4_xs (eight
/// runs of 16 quant bytes a superblock) and q4_K, q5_K, q6_K (whole superblocks one row after
/// the other; from some columns on, ggml's tiled rounding of `qgemm_k`) with whole
/// superblocks. The reference reads
/// them as the plain rows, and `get_bytes` gives ggml's bytes back.
#[test]
fn interleaved_weights_give_the_plain_bits() {
    use tessera::RowLayout::{Interleaved8, Plain};
    let mut rng = Rng::new(29);
    for t in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::IQ4NL,
        DType::MXFP4,
        DType::IQ4XS,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
    ] {
        let shapes: &[(usize, usize, usize)] = if t.block_size() == 256 {
            // whole 256-element superblocks
            &[
                (256, 8, 1),
                (512, 24, 1),
                (256, 40, 2),
                (256, 48, 7),
                (512, 16, 8),
                (256, 40, 24),
                (256, 72, 25),
                (768, 136, 1),
            ]
        } else {
            &[
                (64, 8, 1),
                (96, 8, 1),
                (256, 24, 1),
                (96, 40, 2),
                (64, 48, 7),
                (64, 48, 1),
                (96, 48, 7),
                (64, 8, 2),
                (96, 16, 8),
                (32, 24, 13),
                (64, 40, 24),
                (64, 72, 25),
                (288, 136, 1),
            ]
        };
        for &(k, m, n) in shapes {
            let av: Vec<f32> = (0..k * m).map(|_| rng.uniform(-1.0, 1.0)).collect();
            let bv: Vec<f32> = (0..k * n * 2).map(|_| rng.uniform(-1.0, 1.0)).collect();
            let (mut p, yp, ap) = product_with_layout(t, Plain, &[k, m, 1], &[k, n, 2], &av, &bv);
            let (mut q, yq, aq) =
                product_with_layout(t, Interleaved8, &[k, m, 1], &[k, n, 2], &av, &bv);
            assert_eq!(
                q.get_bytes(aq).unwrap(),
                p.get_bytes(ap).unwrap(),
                "{t} bytes"
            );
            p.compute(&ReferenceBackend).unwrap();
            q.compute(&ReferenceBackend).unwrap();
            assert_eq!(
                q.get_f32(yq).unwrap(),
                p.get_f32(yp).unwrap(),
                "{t} reference"
            );
            for cpu in cpu_configs() {
                p.compute(&cpu).unwrap();
                q.compute(&cpu).unwrap();
                let (want, got) = (p.get_f32(yp).unwrap(), q.get_f32(yq).unwrap());
                for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        w.to_bits(),
                        "{t}: k={k} m={m} n={n} element {i} on {:?}/{}t: {g} vs {w}",
                        cpu.isa(),
                        cpu.n_threads()
                    );
                }
            }
        }
    }
}

/// Interleaved rows are for mul_mat's first operand only: anything else reading them, a type
/// or shape without the layout, and a param are errors that say so.
#[test]
fn interleaved_weights_refuse_other_readers() {
    use tessera::RowLayout::Interleaved8;
    let mut g = Graph::new();
    let a = g.new_tensor(DType::Q4_0, &[64, 16]).unwrap();
    g.set_layout(a, Interleaved8).unwrap();
    let idx = g.new_tensor(DType::I32, &[2]).unwrap();
    let r = g.get_rows(a, idx).unwrap();
    let e = Session::new(g, &[r])
        .err()
        .expect("get_rows of interleaved rows");
    let msg = e.to_string();
    assert!(
        msg.contains("interleaved") && msg.contains("get_rows"),
        "{msg}"
    );

    let mut g = Graph::new();
    let a = g.new_tensor(DType::Q4_0, &[64, 16]).unwrap();
    g.set_layout(a, Interleaved8).unwrap();
    // a view of them, even one mul_mat reads
    let v = g.reshape(a, &[64, 8, 2]).unwrap();
    let x = g.new_f32(&[64, 3, 2]).unwrap();
    let y = g.mul_mat(v, x).unwrap();
    let e = Session::new(g, &[y])
        .err()
        .expect("a view of interleaved rows");
    assert!(e.to_string().contains("reshape"), "{e}");

    let mut g = Graph::new();
    let a = g.new_tensor(DType::Q4_0, &[64, 12]).unwrap();
    let e = g.set_layout(a, Interleaved8).unwrap_err().to_string();
    assert!(e.contains("12 rows"), "{e}");
    let a = g.new_tensor(DType::Q8_0, &[64, 16]).unwrap();
    let e = g.set_layout(a, Interleaved8).unwrap_err().to_string();
    assert!(
        e.contains("q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4, iq4_xs, q4_K, q5_K and q6_K"),
        "{e}"
    );
    let a = g.new_tensor(DType::Q4_0, &[64, 16]).unwrap();
    g.set_layout(a, Interleaved8).unwrap();
    let e = g.set_param(a).unwrap_err().to_string();
    assert!(e.contains("interleaved"), "{e}");
}
