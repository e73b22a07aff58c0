//! The integer dot products of `ops::qdot_fp` (mxfp4, nvfp4, q1_0, q2_0 against q8_0):
//! bit-exact against ggml itself, close to the exact dot product of the dequantized rows, and
//! the AVX2 path close to the scalar one.
//!
//! `data/qdot_ggml_fp.bin` was written by a small C program (not part of this repository)
//! linked against llama.cpp's `libggml-cpu`/`libggml-base` (the copy vendored by
//! llama-cpp-python 0.3.36, built by gcc 12 with `GGML_NATIVE` on an AVX2 machine without
//! AVX-512 or AVX-VNNI). For each type it holds weight rows quantized by `ggml_quantize_chunk`
//! from float patterns (0 random, 1 mixed magnitudes, 2 zero weights, 3 constants, 4 huge ×
//! tiny, 5/6 alternating signs in and out of phase, 7 zero activations, 8 outliers, 9 ternary,
//! 10 offset, 11 tiny × huge) against activation rows quantized by the CPU backend's q8_0
//! `from_float`, at one block, odd block counts and longer rows; rows of random block bytes
//! (pattern 100: every code and sign bit; f16 scales near ±1, mxfp4 exponents 110..140 or, in
//! one row, 0..7 (subnormal scales), nvfp4's UE4M3 bytes all random); random rows biased to
//! large block sums (pattern 101: the largest codes against activations 64..127, so that a
//! block's d·sumi needs more than 24 bits); and mxfp4 rows of odd block counts whose last block
//! dominates (pattern 102), where it shows whether the AVX2 kernel's generic tail is fused
//! (it is not). For each pair two results:
//! - `avx2`: `ggml_get_type_traits_cpu(type)->vec_dot` of that library, i.e. ggml's AVX2
//!   kernel as llama.cpp runs it (for q2_0, which has no x86 kernel, the generic code as gcc
//!   built it for that machine);
//! - `generic`: ggml's `ggml_vec_dot_<type>_q8_0_generic` (`ggml-cpu/quants.c`) compiled with
//!   `-ffp-contract=off` for plain x86-64 (no FMA), i.e. the C source's own order of float
//!   operations.
//!
//! Format (little-endian): `b"QDOTFIX1"`, u32 case count, then per case u32 type id, u32 k,
//! u32 pattern (100 = random bytes), u32 weight bytes, u32 activation bytes, the weight row,
//! the activation row, f32 `avx2`, f32 `generic`.

use tessera::DType;
use tessera_cpu::ops::matmul_quant::{quantize_activations, vec_dot_type};
use tessera_cpu::ops::qdot::vec_dot;
use tessera_cpu::ops::{qdot, qdot_fp};
use tessera_cpu::Isa;

mod qdot_common;
use qdot_common::*;

fn fixture() -> Vec<Case> {
    parse_fixture(include_bytes!("data/qdot_ggml_fp.bin"))
}

const TYPES: [DType; 4] = [DType::MXFP4, DType::NVFP4, DType::Q1_0, DType::Q2_0];

#[test]
fn fixture_covers_every_type() {
    let cases = fixture();
    for t in TYPES {
        let of_t = cases_of(&cases, t, &[]);
        let mut ks: Vec<usize> = of_t.iter().map(|c| c.k).collect();
        ks.sort_unstable();
        ks.dedup();
        assert!(ks.len() >= 3, "{t}: k in {ks:?}");
        // the rows are not degenerate: most results are non-zero
        let nonzero = of_t.iter().filter(|c| c.generic != 0.0).count();
        assert!(nonzero >= of_t.len() - 3, "{t}: {nonzero} non-zero results");
    }
}

/// ggml's AVX2 code rounds differently from its generic code (lanes, FMAs) for the types that
/// have one, so the two bit-exact tests below check different things; q2_0 has none on x86.
#[test]
fn fixture_tells_the_paths_apart() {
    let cases = fixture();
    for t in TYPES {
        let differ = cases
            .iter()
            .filter(|c| c.t == t && c.avx2.to_bits() != c.generic.to_bits())
            .count();
        if t == DType::Q2_0 {
            assert_eq!(
                differ, 0,
                "{t}: llama.cpp's AVX2 build runs the generic code"
            );
        } else {
            assert!(
                differ >= 3,
                "{t}: avx2 and generic differ in {differ} cases"
            );
        }
    }
}

/// The AVX2 path returns exactly what llama.cpp's AVX2 build returns.
#[test]
fn avx2_is_bit_exact_with_ggml() {
    if !has_avx2() {
        eprintln!("no AVX2 here: the AVX2 path is not checked");
        return;
    }
    let n = assert_fixture_bit_exact(&fixture(), &[Isa::Avx2, Isa::AvxVnni, Isa::Avx512], |c| {
        c.avx2
    });
    assert!(n >= 2 * 15 * TYPES.len());
}

/// The scalar path returns exactly what ggml's generic C code returns when compiled without
/// FMA contraction.
#[test]
fn scalar_is_bit_exact_with_ggml_generic() {
    assert_fixture_bit_exact(&fixture(), &[Isa::Scalar], |c| c.generic);
}

// ---- tolerances against the exact dot product ----

/// The exact (f64) dot product of the dequantized rows and Σ|w_i·x_i|.
fn exact_dot(t: DType, w: &[u8], x: &[u8], k: usize) -> (f64, f64) {
    let (wd, xd) = (dequant(t, w, k), dequant(DType::Q8_0, x, k));
    let exact = wd.iter().zip(&xd).map(|(&a, &b)| a as f64 * b as f64).sum();
    let mag = wd
        .iter()
        .zip(&xd)
        .map(|(&a, &b)| (a as f64 * b as f64).abs())
        .sum();
    (exact, mag)
}

/// How far a kernel's result may be from the exact dot product of the dequantized rows.
///
/// Both use the same integers and scales (every weight dequantizes exactly: a small integer
/// times a power of two, or an f16 times -1..2; a q8_0 activation is d·q rounded once). The
/// kernels multiply scales (one rounding), scale each q8_0 block's or lane's integer sum (one
/// more) and add along the row (one per q8_0 block, or per block and lane and a final 8-lane
/// reduction for AVX2), each rounding off by at most 2^-24 of a value bounded by
/// mag = Σ|w_i·x_i|: so |error| ≤ (8·blocks + 16)·2^-23·mag, blocks counting q8_0 blocks.
/// Where a product of scales falls into f32's subnormal range (mxfp4's exponents below ~10 in
/// the fixture's random row) its rounding is absolute, at most 2^-150, times |Σ q·y| ≤
/// 32·12·127 per block.
fn tolerance(k: usize, mag: f64) -> f64 {
    let blocks = (k / 32) as f64;
    (8.0 * blocks + 16.0) * 2f64.powi(-23) * mag + blocks * 2f64.powi(-150) * (32.0 * 12.0 * 127.0)
}

/// ggml's own results (both builds) and ours are all near the exact dot product.
#[test]
fn fixture_results_match_exact_dot() {
    for c in fixture() {
        let (exact, mag) = exact_dot(c.t, &c.w, &c.x, c.k);
        let tol = tolerance(c.k, mag);
        let mut results = vec![
            ("ggml avx2", c.avx2),
            ("ggml generic", c.generic),
            ("scalar", vec_dot(Isa::Scalar, c.t, &c.w, &c.x, c.k)),
        ];
        if has_avx2() {
            results.push(("avx2", vec_dot(Isa::Avx2, c.t, &c.w, &c.x, c.k)));
        }
        for (who, got) in results {
            assert!(
                (got as f64 - exact).abs() <= tol,
                "{} k={} pattern {}: {who} {got:e} vs exact {exact:e} (tolerance {tol:e})",
                c.t,
                c.k,
                c.pattern
            );
        }
    }
}

/// Rows quantized here (tessera's quantizers, which match ggml's).
fn rows(t: DType, wf: &[f32], xf: &[f32]) -> (Vec<u8>, Vec<u8>) {
    let k = wf.len();
    let mut w = vec![0u8; t.row_size(k).unwrap()];
    let mut x = vec![0u8; DType::Q8_0.row_size(k).unwrap()];
    tessera_quants::quantize_row(t.id(), wf, &mut w, None).unwrap();
    quantize_activations(DType::Q8_0, xf, &mut x).unwrap();
    (w, x)
}

fn ks(t: DType) -> [usize; 3] {
    let bs = t.block_size();
    [bs, 3 * bs, 4096 + bs]
}

/// Both paths against the exact dot product, on every pattern.
#[test]
fn kernels_match_exact_dot() {
    for t in TYPES {
        for k in ks(t) {
            for p in 0..PATTERNS {
                let (wf, xf) = pattern(p, k, (p * 31 + k) as u64);
                let (w, x) = rows(t, &wf, &xf);
                let (exact, mag) = exact_dot(t, &w, &x, k);
                let tol = tolerance(k, mag);
                for isa in [Isa::Scalar, Isa::Avx2] {
                    let got = vec_dot(isa, t, &w, &x, k) as f64;
                    assert!(
                        (got - exact).abs() <= tol,
                        "{t} k={k} pattern {p} {isa:?}: {got} vs exact {exact} (tolerance {tol})"
                    );
                }
            }
        }
    }
}

/// Random block bytes (every code, sign bit and UE4M3 scale) with f16 scales near ±1, mxfp4
/// exponents near 127 and activations in q8_0's range: the AVX2 path sums the scalar path's
/// integers, so only the float grouping may differ, by at most (8·blocks + 16)·2^-24 of Σ|terms|
/// on each side.
#[test]
fn avx2_matches_scalar_on_random_blocks() {
    if !has_avx2() {
        eprintln!("no AVX2 here: the AVX2 path is not checked");
        return;
    }
    let mut differ = 0;
    for t in TYPES {
        for (seed, k) in [(1u64, 128usize), (2, 640), (3, 4096), (4, 1152)] {
            let nb = k / t.block_size();
            let ts = t.type_size();
            let mut w = rng_bytes(nb * ts, seed);
            let mut x = rng_bytes(k / 32 * 34, seed + 100);
            for blk in w.chunks_exact_mut(ts) {
                match t {
                    DType::MXFP4 => blk[0] = 118 + blk[0] % 20,
                    DType::Q1_0 | DType::Q2_0 => blk[1] = 0x3c | (blk[1] & 0x80), // ±1 .. 2
                    _ => {}
                }
            }
            for xb in x.chunks_exact_mut(34) {
                xb[1] = 0x20; // d ≈ 0.008
                for v in &mut xb[2..] {
                    if *v == 0x80 {
                        *v = 0x81; // q8_0 never holds -128
                    }
                }
            }
            let scalar = vec_dot(Isa::Scalar, t, &w, &x, k);
            let (exact, mag) = exact_dot(t, &w, &x, k);
            let tol = tolerance(k, mag);
            assert!(
                (scalar as f64 - exact).abs() <= tol,
                "{t} k={k}: scalar {scalar} vs exact {exact} (tolerance {tol})"
            );
            for isa in [Isa::Avx2, Isa::AvxVnni, Isa::Avx512] {
                let got = vec_dot(isa, t, &w, &x, k);
                differ += (got != scalar) as usize;
                assert!(
                    ((got - scalar) as f64).abs() <= tol,
                    "{t} k={k} {isa:?}: {got} vs scalar {scalar} (tolerance {tol})"
                );
            }
        }
    }
    // the two paths are really different code
    assert!(differ > 0);
}

#[test]
fn supported_types() {
    for t in DType::ALL {
        assert_eq!(qdot_fp::supported(t), TYPES.contains(&t), "{t}");
        if TYPES.contains(&t) {
            assert!(qdot::supported(t), "{t}");
            assert_eq!(vec_dot_type(t), DType::Q8_0, "{t}");
        }
    }
}

#[test]
#[should_panic(expected = "not whole")]
fn rejects_partial_blocks() {
    let w = vec![0u8; DType::Q1_0.type_size()];
    let x = vec![0u8; 4 * DType::Q8_0.type_size()];
    vec_dot(Isa::Scalar, DType::Q1_0, &w, &x, 64);
}

#[test]
#[should_panic(expected = "bytes")]
fn rejects_short_rows() {
    // one nvfp4 block meets two q8_0 blocks
    let w = vec![0u8; DType::NVFP4.type_size()];
    let x = vec![0u8; 2 * DType::Q8_0.type_size() - 1];
    qdot_fp::vec_dot(Isa::Avx2, DType::NVFP4, &w, &x, 1);
}

#[test]
#[should_panic(expected = "no integer kernel")]
fn rejects_unsupported_types() {
    let w = vec![0u8; DType::Q4_0.type_size()];
    let x = vec![0u8; DType::Q8_0.type_size()];
    qdot_fp::vec_dot(Isa::Scalar, DType::Q4_0, &w, &x, 1);
}

/// mxfp4's four-row mat-vec kernel (`matmul_quant::vec_dot4`) gives every row ggml's AVX2 bits:
/// each fixture row next to three other rows of its length (itself again where the fixture has
/// fewer), on every block count of the fixture (odd ones end in ggml's unfused last block), on
/// this CPU's instruction set and the AVX2 one, with and without prefetching; the scalar path
/// row by row as `vec_dot`.
#[test]
fn four_row_kernel_of_mxfp4_equals_ggml() {
    let cases = fixture();
    let of_t = cases_of(&cases, DType::MXFP4, &[32, 96, 256, 1056]);
    let checked = check_four_rows(DType::MXFP4, &of_t, &[0, 4096]);
    assert!(!has_avx2() || checked >= 4 * of_t.len());
}

/// nvfp4's two-row kernel (`qdot::vec_dot_rows`: row q with row q + n/2, an odd last row
/// alone) gives every row ggml's AVX2 bits: each fixture row at every position of 1 to 5 rows
/// (the others the fixture's rows of its length, one with every byte flipped), rows a little
/// more than a row apart, on this CPU's instruction set and the AVX2 one; every other row
/// equals `vec_dot` on it.
#[test]
fn row_pairs_of_nvfp4_equal_ggml() {
    if !has_avx2() {
        eprintln!("no AVX2 here: the two-row kernel is not checked");
        return;
    }
    let t = DType::NVFP4;
    let cases = fixture();
    let of_t = cases_of(&cases, t, &[]);
    let mut checked = 0;
    for (ci, c) in of_t.iter().enumerate() {
        let row = c.w.len();
        let stride = row + 36; // a gap of one block between rows
        let mut others: Vec<Vec<u8>> = of_t
            .iter()
            .cycle()
            .skip(ci + 1)
            .filter(|o| o.k == c.k)
            .take(3)
            .map(|o| o.w.clone())
            .collect();
        others.push(c.w.iter().map(|b| b ^ 0xa5).collect());
        for n in 1..=5usize {
            for pos in 0..n {
                let mut w = vec![0u8; (n - 1) * stride + row];
                let mut o = others.iter().cycle();
                for r in 0..n {
                    let src = if r == pos { &c.w } else { o.next().unwrap() };
                    w[r * stride..r * stride + row].copy_from_slice(src);
                }
                for isa in [Isa::Avx2, tessera_cpu::simd::isa()] {
                    let mut out = vec![f32::NAN; n];
                    qdot::vec_dot_rows(isa, t, &w, stride, &c.x, c.k, &mut out);
                    assert_eq!(
                        out[pos].to_bits(),
                        c.avx2.to_bits(),
                        "k={} pattern {} row {pos} of {n} {isa:?}: {} vs ggml {}",
                        c.k,
                        c.pattern,
                        out[pos],
                        c.avx2
                    );
                    for (r, &got) in out.iter().enumerate() {
                        let one = vec_dot(isa, t, &w[r * stride..r * stride + row], &c.x, c.k);
                        assert_eq!(got.to_bits(), one.to_bits(), "row {r} of {n} {isa:?}");
                    }
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 2 * 15 * of_t.len(), "{checked} checks");
}
