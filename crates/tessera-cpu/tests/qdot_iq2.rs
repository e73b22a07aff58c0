//! The integer dot products of `ops::qdot_iq2` (iq2_xxs, iq2_xs, iq2_s against q8_K):
//! bit-exact against ggml itself, close to the exact dot product of the dequantized rows, and
//! the AVX2 path close to the scalar one.
//!
//! `data/qdot_ggml_iq2.bin` was written by a small C program (not part of this repository)
//! linked against llama.cpp's `libggml-cpu`/`libggml-base` (the copy vendored by
//! llama-cpp-python 0.3.36, built by gcc with `GGML_NATIVE` on an AVX2 machine without AVX-512
//! or AVX-VNNI). For each type it holds weight rows quantized by `ggml_quantize_chunk` (with a
//! random positive importance matrix, which iq2_xxs and iq2_xs require) from float patterns
//! (random, mixed magnitudes, zeros, constants, huge × tiny, alternating signs, outliers,
//! ternary, offset) and activation rows quantized by the CPU backend's own q8_K `from_float`,
//! plus rows of random block bytes (every grid index, sign pattern, high bit and scale, with a
//! sane f16 `d`); and for each pair two results:
//! - `avx2`: `ggml_get_type_traits_cpu(type)->vec_dot` of that library, i.e. ggml's AVX2
//!   kernel as llama.cpp runs it;
//! - `generic`: ggml's `ggml_vec_dot_<type>_q8_K_generic` from the same source
//!   (`ggml-cpu/quants.c`) compiled with `-ffp-contract=off` for plain x86-64 (no FMA), i.e. the
//!   C source's own order of float operations.
//!
//! Format (little-endian): `b"QDOTFIX1"`, u32 case count, then per case u32 type id, u32 k,
//! u32 pattern (100 = random bytes), u32 weight bytes, u32 activation bytes, the weight row,
//! the activation row, f32 `avx2`, f32 `generic`.

use tessera::DType;
use tessera_cpu::ops::matmul_quant::quantize_activations;
use tessera_cpu::ops::qdot::vec_dot;
use tessera_cpu::ops::qdot_iq2::supported;
use tessera_cpu::Isa;

mod qdot_common;
use qdot_common::*;

fn fixture() -> Vec<Case> {
    parse_fixture(include_bytes!("data/qdot_ggml_iq2.bin"))
}

const TYPES: [DType; 3] = [DType::IQ2XXS, DType::IQ2XS, DType::IQ2S];

/// The exact (f64) dot product of the dequantized rows and Σ|w_i·x_i|, the size every rounding
/// of either path is relative to.
fn exact_and_mag(t: DType, w: &[u8], x: &[u8], k: usize) -> (f64, f64) {
    let (wd, xd) = (dequant(t, w, k), dequant(DType::Q8K, x, k));
    wd.iter().zip(&xd).fold((0.0, 0.0), |(e, m), (&a, &b)| {
        let p = a as f64 * b as f64;
        (e + p, m + p.abs())
    })
}

/// How far either path may be from the exact dot product of the dequantized rows.
///
/// Both use the same integers and the same f16/f32 scales and differ only in float rounding,
/// each rounding off by at most 2^-24 of a value bounded by `mag` = Σ|w_i·x_i|: the scalar path
/// rounds d = d_w·d_x, the block's integer sum, their product and the running sum (nb + 3
/// roundings of at most `mag`); the AVX2 path rounds d, each lane's integer sum, one FMA per
/// block into each lane and three levels of the horizontal sum (nb + 5); 1/8 is exact; the
/// dequantized rows round each weight (d·(2s+1)/8, then ·grid) and activation (d·q) once or
/// twice (3). So (nb + 8)·2^-24·mag bounds both; this allows twice that.
fn exact_tolerance(nb: usize, mag: f64) -> f64 {
    (nb as f64 + 8.0) * 2f64.powi(-23) * mag
}

#[test]
fn fixture_covers_every_type() {
    let cases = fixture();
    for t in TYPES {
        let of_t = cases_of(&cases, t, &[256, 512, 1024]);
        assert_paths_differ(&of_t, t);
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
    assert!(n >= 90);
}

/// The scalar path returns exactly what ggml's generic C code returns when compiled without
/// FMA contraction.
#[test]
fn scalar_is_bit_exact_with_ggml_generic() {
    assert_fixture_bit_exact(&fixture(), &[Isa::Scalar], |c| c.generic);
}

/// ggml's own results, and both paths here, are close to the exact dot product of the
/// dequantized rows (which also checks `tessera_quants`' dequantization against the kernels).
#[test]
fn fixture_matches_exact_dot() {
    for c in fixture() {
        let (exact, mag) = exact_and_mag(c.t, &c.w, &c.x, c.k);
        let tol = exact_tolerance(c.k / 256, mag);
        let mut results = vec![("ggml avx2", c.avx2), ("ggml generic", c.generic)];
        results.push(("scalar", vec_dot(Isa::Scalar, c.t, &c.w, &c.x, c.k)));
        if has_avx2() {
            results.push(("avx2", vec_dot(Isa::Avx2, c.t, &c.w, &c.x, c.k)));
        }
        for (what, got) in results {
            assert!(
                (got as f64 - exact).abs() <= tol,
                "{} k={} pattern {}: {what} {got} vs exact {exact} (tolerance {tol})",
                c.t,
                c.k,
                c.pattern
            );
        }
    }
}

// ---- tolerance checks on rows made here ----

/// Weight and activation rows of `k` values for pattern `p`.
fn pattern(p: usize, k: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut g = rng(seed);
    let mut h = rng(seed ^ 0xabcdef);
    let alt = |i: usize, v: f32| if i.is_multiple_of(2) { v } else { -v };
    (0..k)
        .map(|i| {
            let (a, b) = (g(), h());
            match p {
                0 => (a, b),
                1 => (a * (2.0 * g()).exp(), b * (2.0 * h()).exp()), // mixed magnitudes
                2 => (0.0, b),                                       // zero weights
                3 => (a, 0.0),                                       // zero activations
                4 => (0.5, -1.25),                                   // constants
                5 => (a * 1e4, b * 1e-5),                            // huge × tiny
                6 => (a * 1e-3, b * 3e3),                            // tiny × huge
                7 => (alt(i, 3.0), alt(i, 1.0)),                     // alternating, same phase
                8 => (alt(i, 3.0), alt(i + 1, 1.0)),                 // opposite phase
                9 => (
                    if i == 37 { 100.0 } else { a },
                    if i == k - 5 { -80.0 } else { b },
                ), // outliers
                10 => ((a * 1.5).round().clamp(-1.0, 1.0) * 0.7, b), // ternary weights
                _ => (a + 4.0, b.abs() + 1.0),                       // all positive, offset
            }
        })
        .unzip()
}

/// A weight row quantized here (with a positive importance matrix) and a q8_K activation row.
fn quantized_rows(t: DType, p: usize, k: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let (wf, xf) = pattern(p, k, seed);
    let mut g = rng(seed ^ 0x1234);
    let imatrix: Vec<f32> = (0..k).map(|_| 0.1 + g() * g()).collect();
    let mut w = vec![0u8; t.row_size(k).unwrap()];
    let mut x = vec![0u8; DType::Q8K.row_size(k).unwrap()];
    tessera_quants::quantize_row(t.id(), &wf, &mut w, Some(&imatrix)).unwrap();
    quantize_activations(DType::Q8K, &xf, &mut x).unwrap();
    (w, x)
}

/// Random block bytes (every grid index, sign pattern, high bit and scale) with f16 `d` in
/// [1, 2) and q8_K activations in q8's range (-127..127, d = 0.01, group sums consistent).
fn random_rows(t: DType, k: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let nb = k / 256;
    let (ts, xs) = (t.type_size(), DType::Q8K.type_size());
    let mut w = rng_bytes(nb * ts, seed);
    let mut x = rng_bytes(nb * xs, seed + 100);
    for b in 0..nb {
        w[b * ts + 1] = 0x3c;
        let xb = &mut x[b * xs..(b + 1) * xs];
        xb[0..4].copy_from_slice(&0.01f32.to_le_bytes());
        for v in &mut xb[4..260] {
            if *v == 0x80 {
                *v = 0x81; // q8_K never holds -128
            }
        }
        for g in 0..16 {
            let s: i32 = xb[4 + 16 * g..][..16].iter().map(|&v| v as i8 as i32).sum();
            let at = 260 + 2 * g;
            xb[at..at + 2].copy_from_slice(&(s as i16).to_le_bytes());
        }
    }
    (w, x)
}

/// Every pair of rows the tolerance tests use: each pattern at three lengths, and random
/// block bytes.
fn all_rows(t: DType) -> Vec<(String, usize, Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    for k in [256, 768, 4096] {
        for p in 0..PATTERNS {
            let (w, x) = quantized_rows(t, p, k, (p * 31 + k) as u64);
            out.push((format!("pattern {p}"), k, w, x));
        }
    }
    for (seed, k) in [(1u64, 256usize), (2, 512), (3, 2816)] {
        let (w, x) = random_rows(t, k, seed);
        out.push((format!("random bytes {seed}"), k, w, x));
    }
    out
}

/// The scalar path against the exact (f64) dot product of the dequantized rows (see
/// [`exact_tolerance`]).
#[test]
fn scalar_matches_exact_dot() {
    for t in TYPES {
        for (what, k, w, x) in all_rows(t) {
            let (exact, mag) = exact_and_mag(t, &w, &x, k);
            let got = vec_dot(Isa::Scalar, t, &w, &x, k) as f64;
            let tol = exact_tolerance(k / 256, mag);
            assert!(
                (got - exact).abs() <= tol,
                "{t} k={k} {what}: scalar {got} vs exact {exact} (tolerance {tol})"
            );
        }
    }
}

/// The AVX2 path against the exact dot product and against the scalar path: the same integer
/// sums grouped differently into floats, so the two differ by at most the sum of their
/// roundings, (nb + 3 + nb + 5)·2^-24·mag (see [`exact_tolerance`]).
#[test]
fn avx2_matches_scalar() {
    if !has_avx2() {
        eprintln!("no AVX2 here: the AVX2 path is not checked");
        return;
    }
    let mut differ = 0;
    for t in TYPES {
        for (what, k, w, x) in all_rows(t) {
            let nb = (k / 256) as f64;
            let (exact, mag) = exact_and_mag(t, &w, &x, k);
            let scalar = vec_dot(Isa::Scalar, t, &w, &x, k);
            for isa in [Isa::Avx2, Isa::AvxVnni, Isa::Avx512] {
                let got = vec_dot(isa, t, &w, &x, k);
                let tol = (2.0 * nb + 8.0) * 2f64.powi(-24) * mag;
                assert!(
                    ((got - scalar) as f64).abs() <= tol,
                    "{t} k={k} {what} {isa:?}: {got} vs scalar {scalar} (tolerance {tol})"
                );
                let tol = exact_tolerance(k / 256, mag);
                assert!(
                    (got as f64 - exact).abs() <= tol,
                    "{t} k={k} {what} {isa:?}: {got} vs exact {exact} (tolerance {tol})"
                );
                differ += (got.to_bits() != scalar.to_bits()) as usize;
            }
        }
    }
    // the two paths really are different float orders
    assert!(differ > 0);
}

/// A wrong sign, grid point or scale anywhere in a block moves the result by far more than the
/// tolerance: flipping one bit of each field of a random block changes both paths' results.
#[test]
fn every_field_matters() {
    for t in TYPES {
        let (w, x) = random_rows(t, 256, 7);
        // (byte, bit) of: a grid index, a sign, a scale, and for iq2_s a high index bit
        let fields: &[(usize, u8)] = match t {
            DType::IQ2XXS => &[(2, 0), (6, 0), (9, 7)],
            DType::IQ2XS => &[(2, 0), (3, 2), (66, 0), (66, 4)],
            _ => &[(2, 0), (34, 0), (66, 0), (74, 0), (74, 4)],
        };
        let mut isas = vec![Isa::Scalar];
        if has_avx2() {
            isas.push(Isa::Avx2);
        }
        for isa in isas {
            let base = vec_dot(isa, t, &w, &x, 256);
            for &(byte, bit) in fields {
                let mut w2 = w.clone();
                w2[byte] ^= 1 << bit;
                let (exact, mag) = exact_and_mag(t, &w2, &x, 256);
                let got = vec_dot(isa, t, &w2, &x, 256);
                assert!(
                    (got as f64 - exact).abs() <= exact_tolerance(1, mag),
                    "{t} {isa:?} byte {byte} bit {bit}: {got} vs exact {exact}"
                );
                assert_ne!(got, base, "{t} {isa:?}: byte {byte} bit {bit} ignored");
            }
        }
    }
}

#[test]
fn supported_types() {
    for t in DType::ALL {
        assert_eq!(supported(t), TYPES.contains(&t), "{t}");
        if TYPES.contains(&t) {
            assert!(tessera_cpu::ops::qdot::supported(t), "{t}");
        }
    }
}

#[test]
#[should_panic(expected = "not whole")]
fn rejects_partial_blocks() {
    let w = vec![0u8; DType::IQ2S.type_size()];
    let x = vec![0u8; DType::Q8K.type_size()];
    vec_dot(Isa::Scalar, DType::IQ2S, &w, &x, 128);
}

#[test]
#[should_panic(expected = "bytes")]
fn rejects_short_rows() {
    let w = vec![0u8; DType::IQ2XS.type_size()];
    let x = vec![0u8; DType::Q8K.type_size() - 1];
    vec_dot(Isa::Avx2, DType::IQ2XS, &w, &x, 256);
}
