//! The integer dot products of `ops::qdot_iq13` (iq3_xxs, iq3_s, iq1_s, iq1_m against q8_K):
//! bit-exact against ggml itself, close to the exact dot product of the dequantized rows, and
//! the AVX2 path close to the scalar one.
//!
//! `data/qdot_ggml_iq13.bin` was written by a small C program (not part of this repository)
//! linked against llama.cpp's `libggml-cpu`/`libggml-base` (the copy vendored by
//! llama-cpp-python 0.3.36, built by gcc 12 with `GGML_NATIVE` on an AVX2 + BMI2 machine
//! without AVX-512). For each type it holds weight rows quantized by `ggml_quantize_chunk` from
//! float patterns (random, mixed magnitudes, zeros, constants, huge × tiny, alternating signs,
//! outliers, ternary, offset; with a random positive importance matrix for iq1_s and for the odd
//! patterns of the others) at k = 256, 512 and 1024, activation rows quantized by the CPU
//! backend's own q8_K `from_float`, plus rows of random block bytes (every bit pattern of grid
//! indices, signs, scales and shifts; pattern 100) and, for iq1_s and iq1_m, random block bytes
//! with every shift +1/8 against activations in 0..127 (pattern 101: the shift terms dominate,
//! which makes the result depend on how their per-block products accumulate); and for each pair
//! two results:
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
use tessera_cpu::Isa;

mod qdot_common;
use qdot_common::*;

fn fixture() -> Vec<Case> {
    parse_fixture(include_bytes!("data/qdot_ggml_iq13.bin"))
}

const TYPES: [DType; 4] = [DType::IQ3XXS, DType::IQ3S, DType::IQ1S, DType::IQ1M];

/// Bytes of one q8_K block.
const Q8_K_SIZE: usize = 292;

#[test]
fn fixture_covers_every_type() {
    let cases = fixture();
    for t in TYPES {
        let of_t = cases_of(&cases, t, &[256, 512, 1024]);
        assert_paths_differ(&of_t, t);
        // and the rows are not degenerate
        assert!(of_t.iter().filter(|c| c.avx2 != 0.0).count() >= 10, "{t}");
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
    assert!(n > 0);
}

/// The scalar path returns exactly what ggml's generic C code returns when compiled without
/// FMA contraction.
#[test]
fn scalar_is_bit_exact_with_ggml_generic() {
    assert_fixture_bit_exact(&fixture(), &[Isa::Scalar], |c| c.generic);
}

// ---- tolerance checks on rows quantized here ----

/// The exact (f64) dot product of the dequantized rows and Σ|w_i·x_i|, the size the kernels'
/// roundings are relative to. iq1's weights are d·s·(g + δ) with g in -1..1 and δ = ±1/8, and
/// the kernels sum the g and δ parts separately: their partial sums are bounded by
/// Σ(|g| + |δ|)·|x| ≤ 9/7·Σ|g + δ|·|x| (as |g + δ| ≥ 7/8 and |g| + |δ| ≤ 9/8 where g ≠ 0), so
/// that factor goes into the magnitude for iq1_s and iq1_m.
fn exact_and_mag(t: DType, w: &[u8], x: &[u8], k: usize) -> (f64, f64) {
    let wd = dequant(t, w, k);
    let xd = dequant(DType::Q8K, x, k);
    let exact: f64 = wd.iter().zip(&xd).map(|(&a, &b)| a as f64 * b as f64).sum();
    let mag: f64 = wd
        .iter()
        .zip(&xd)
        .map(|(&a, &b)| (a as f64 * b as f64).abs())
        .sum();
    let factor = if matches!(t, DType::IQ1S | DType::IQ1M) {
        9.0 / 7.0
    } else {
        1.0
    };
    (exact, factor * mag)
}

/// Weight row of type `t` and q8_K row quantized here (iq1_s with an importance matrix, as
/// ggml requires; the others with one on odd patterns).
fn rows(t: DType, p: usize, wf: &[f32], xf: &[f32]) -> (Vec<u8>, Vec<u8>) {
    let k = wf.len();
    let mut w = vec![0u8; t.row_size(k).unwrap()];
    let mut x = vec![0u8; DType::Q8K.row_size(k).unwrap()];
    let mut g = rng(p as u64 + 977);
    let imatrix: Vec<f32> = (0..k).map(|_| 0.05 + g().abs()).collect();
    let im = (t == DType::IQ1S || p % 2 == 1).then_some(&imatrix[..]);
    tessera_quants::quantize_row(t.id(), wf, &mut w, im).unwrap();
    quantize_activations(DType::Q8K, xf, &mut x).unwrap();
    (w, x)
}

/// The scalar path against the exact (f64) dot product of the dequantized rows.
///
/// Both sides use the same quantized integers and the same f16/f32 scales (the dequantized
/// weights d·(sub-scale)·grid are exact in f32: few enough mantissa bits); they differ only in
/// float rounding: ggml multiplies the two block scales, converts the block's integer sum,
/// multiplies and adds across the row, a handful of roundings per block and one per block in
/// the running sum, each off by at most 2^-24 of a value bounded by `mag`; the dequantized
/// activations round once each. So |error| ≤ (blocks + 16)·2^-23·mag.
#[test]
fn scalar_matches_exact_dot() {
    for t in TYPES {
        for k in [256, 768, 4096] {
            let nb = (k / 256) as f64;
            for p in 0..PATTERNS {
                let (wf, xf) = pattern(p, k, (p * 31 + k) as u64);
                let (w, x) = rows(t, p, &wf, &xf);
                let (exact, mag) = exact_and_mag(t, &w, &x, k);
                let got = vec_dot(Isa::Scalar, t, &w, &x, k) as f64;
                let tol = (nb + 16.0) * 2f64.powi(-23) * mag;
                assert!(
                    (got - exact).abs() <= tol,
                    "{t} k={k} pattern {p}: scalar {got} vs exact {exact} (tolerance {tol})"
                );
            }
        }
    }
}

/// The AVX2 path against the scalar one: the same integer sums, grouped differently into
/// float lanes (8 per block, FMAs, a final 8-lane reduction), so each side's rounding is at
/// most (8·blocks + 16)·2^-24 of what its lanes hold (bounded by mag) and they differ by at
/// most the sum.
fn check_avx2_vs_scalar(t: DType, w: &[u8], x: &[u8], k: usize, what: &str) {
    let nb = (k / 256) as f64;
    let (_, mag) = exact_and_mag(t, w, x, k);
    let scalar = vec_dot(Isa::Scalar, t, w, x, k);
    for isa in [Isa::Avx2, Isa::AvxVnni, Isa::Avx512] {
        let got = vec_dot(isa, t, w, x, k);
        let tol = (8.0 * nb + 16.0) * 2f64.powi(-24) * 2.0 * mag;
        assert!(
            ((got - scalar) as f64).abs() <= tol,
            "{t} k={k} {what} {isa:?}: {got} vs scalar {scalar} (tolerance {tol})"
        );
    }
}

#[test]
fn avx2_matches_scalar() {
    if !has_avx2() {
        eprintln!("no AVX2 here: the AVX2 path is not checked");
        return;
    }
    for t in TYPES {
        for k in [256, 768, 4096] {
            for p in 0..PATTERNS {
                let (wf, xf) = pattern(p, k, (p * 77 + k) as u64);
                let (w, x) = rows(t, p, &wf, &xf);
                check_avx2_vs_scalar(t, &w, &x, k, &format!("pattern {p}"));
            }
        }
    }
}

/// Random block bytes (every grid index, sign, scale and shift bit) with super-scales in
/// 1..2 and activations in q8's range (-127..127, the group sums consistent).
#[test]
fn avx2_matches_scalar_on_random_blocks() {
    if !has_avx2() {
        eprintln!("no AVX2 here: the AVX2 path is not checked");
        return;
    }
    for t in TYPES {
        for (seed, k) in [(1u64, 256usize), (2, 512), (3, 2816)] {
            let (nb, ts) = (k / 256, t.type_size());
            let mut w = rng_bytes(nb * ts, seed);
            let mut x = rng_bytes(nb * Q8_K_SIZE, seed + 100);
            for wb in w.chunks_exact_mut(ts) {
                if t == DType::IQ1M {
                    // f16 bits 0x3cXX: the top nibbles of the four scale words, low first
                    let bits = 0x3c00 | wb[48] as u16;
                    for j in 0..4 {
                        let at = 49 + 2 * j;
                        wb[at] = (wb[at] & 0x0f) | ((((bits >> (4 * j)) & 15) as u8) << 4);
                    }
                } else {
                    wb[1] = 0x3c;
                }
            }
            for xb in x.chunks_exact_mut(Q8_K_SIZE) {
                xb[0..4].copy_from_slice(&0.01f32.to_le_bytes());
                for v in &mut xb[4..260] {
                    if *v == 0x80 {
                        *v = 0x81; // q8 never holds -128
                    }
                }
                for g in 0..16 {
                    let s: i32 = xb[4 + 16 * g..][..16].iter().map(|&v| v as i8 as i32).sum();
                    let at = 260 + 2 * g;
                    xb[at..at + 2].copy_from_slice(&(s as i16).to_le_bytes());
                }
            }
            check_avx2_vs_scalar(t, &w, &x, k, &format!("seed {seed}"));
        }
    }
}

/// With unit scales and small activations every float operation of both paths is exact, so
/// they must agree to the bit with each other and with the exact dot of the dequantized rows:
/// this checks the integer work (grid lookups, signs, scales, shifts, lanes) on its own, over
/// random block bytes in which iq3_xxs's sign fields run through all 128 sign patterns.
#[test]
fn integer_sums_are_exact() {
    let k = 8 * 256;
    for t in TYPES {
        let ts = t.type_size();
        let mut w = rng_bytes(8 * ts, 7);
        let mut x = rng_bytes(8 * Q8_K_SIZE, 8);
        for (b, wb) in w.chunks_exact_mut(ts).enumerate() {
            match t {
                DType::IQ1M => {
                    // f16 1.0 = 0x3c00 in the top nibbles of the four scale words
                    for (j, nib) in [0u8, 0, 0xc, 3].into_iter().enumerate() {
                        wb[49 + 2 * j] = (wb[49 + 2 * j] & 0x0f) | (nib << 4);
                    }
                }
                _ => wb[0..2].copy_from_slice(&0x3c00u16.to_le_bytes()),
            }
            if t == DType::IQ3XXS {
                // sub-block ib's four 7-bit sign indices, keeping its random 4-bit scale
                for ib in 0..8 {
                    let at = 66 + 4 * ib;
                    let aux = u32::from_le_bytes(wb[at..at + 4].try_into().unwrap());
                    let mut v = aux & 0xf000_0000;
                    for l in 0..4 {
                        v |= (((32 * b + 4 * ib + l) % 128) as u32) << (7 * l);
                    }
                    wb[at..at + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        for xb in x.chunks_exact_mut(Q8_K_SIZE) {
            xb[0..4].copy_from_slice(&1f32.to_le_bytes());
            for v in &mut xb[4..260] {
                *v = ((*v % 7) as i8 - 3) as u8; // -3..3: every sum stays below 2^24
            }
            for g in 0..16 {
                let s: i32 = xb[4 + 16 * g..][..16].iter().map(|&v| v as i8 as i32).sum();
                let at = 260 + 2 * g;
                xb[at..at + 2].copy_from_slice(&(s as i16).to_le_bytes());
            }
        }
        let (exact, _) = exact_and_mag(t, &w, &x, k);
        let scalar = vec_dot(Isa::Scalar, t, &w, &x, k);
        assert_eq!(scalar as f64, exact, "{t}: scalar");
        assert!(exact.abs() > 10.0, "{t}: degenerate rows ({exact})");
        if has_avx2() {
            for isa in [Isa::Avx2, Isa::AvxVnni, Isa::Avx512] {
                let got = vec_dot(isa, t, &w, &x, k);
                assert_eq!(
                    got.to_bits(),
                    scalar.to_bits(),
                    "{t} {isa:?}: {got} vs {scalar}"
                );
            }
        }
    }
}

#[test]
fn supported_types() {
    for t in DType::ALL {
        assert_eq!(
            tessera_cpu::ops::qdot_iq13::supported(t),
            TYPES.contains(&t),
            "{t}"
        );
    }
    for t in TYPES {
        assert!(tessera_cpu::ops::qdot::supported(t), "{t}");
    }
}

#[test]
#[should_panic(expected = "bytes")]
fn rejects_short_rows() {
    let w = vec![0u8; DType::IQ3S.type_size()];
    let x = vec![0u8; Q8_K_SIZE - 1];
    vec_dot(Isa::Avx2, DType::IQ3S, &w, &x, 256);
}
