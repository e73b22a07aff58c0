//! The integer dot products of `ops::qdot`: bit-exact against ggml itself, close to the exact
//! dot product of the dequantized rows, and the AVX2 path close to the scalar one.
//!
//! `data/qdot_ggml.bin` was written by a small C program (not part of this repository) linked
//! against llama.cpp's `libggml-cpu`/`libggml-base` (the copy vendored by llama-cpp-python
//! 0.3.36, built by gcc 12 with `GGML_NATIVE` on an AVX2 machine without AVX-512 or AVX-VNNI).
//! For each type it holds weight rows quantized by `ggml_quantize_chunk` from float patterns
//! (random, mixed magnitudes, zeros, constants, huge × tiny, alternating signs, outliers,
//! ternary, offset) and activation rows quantized by the CPU backend's own `from_float`, plus
//! rows of random block bytes (every bit pattern of quants, scales and high bits); and for each
//! pair two results:
//! - `avx2`: `ggml_get_type_traits_cpu(type)->vec_dot` of that library, i.e. ggml's AVX2
//!   kernel as llama.cpp runs it;
//! - `generic`: ggml's `ggml_vec_dot_<type>_<vdt>_generic` from the same source
//!   (`ggml-cpu/quants.c`) compiled with `-ffp-contract=off` for plain x86-64 (no FMA), i.e. the
//!   C source's own order of float operations.
//!
//! Format (little-endian): `b"QDOTFIX1"`, u32 case count, then per case u32 type id, u32 k,
//! u32 pattern (100 = random bytes), u32 weight bytes, u32 activation bytes, the weight row,
//! the activation row, f32 `avx2`, f32 `generic`.

use tessera::DType;
use tessera_cpu::ops::matmul_quant::{quantize_activations, vec_dot_type};
use tessera_cpu::ops::qdot::{supported, vec_dot};
use tessera_cpu::Isa;

mod qdot_common;
use qdot_common::*;

fn fixture() -> Vec<Case> {
    parse_fixture(include_bytes!("data/qdot_ggml.bin"))
}

const TYPES: [DType; 11] = [
    DType::Q5_0,
    DType::Q5_1,
    DType::IQ4NL,
    DType::Q2K,
    DType::Q3K,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
    DType::IQ4XS,
    DType::TQ1_0,
    DType::TQ2_0,
];

#[test]
fn fixture_covers_every_type() {
    let cases = fixture();
    for t in TYPES {
        cases_of(&cases, t, &[]);
    }
}

/// The AVX2 path returns exactly what llama.cpp's AVX2 build returns, and so do the AVX-512
/// VNNI kernels (`Isa::Avx512`, where the CPU has VNNI; the AVX2 ones again elsewhere).
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

/// The four-row mat-vec kernels of q5_0, q5_1 and iq4_nl (`matmul_quant::vec_dot4`) give every
/// row ggml's AVX2 bits: each fixture row next to three other rows of its type and length, on
/// rows of 3, 8, 9 and 33 blocks (iq4_nl takes its blocks in pairs, an odd last one apart), on
/// this CPU's instruction set and the AVX2 one; the scalar path row by row as `vec_dot`.
#[test]
fn four_row_kernels_of_q5_and_iq4_nl_equal_ggml() {
    let cases = fixture();
    let mut checked = 0;
    for t in [DType::Q5_0, DType::Q5_1, DType::IQ4NL] {
        let of_t = cases_of(&cases, t, &[96, 256, 288, 1056]);
        checked += check_four_rows(t, &of_t, &[0, 64, 4096]);
    }
    assert!(!has_avx2() || checked >= 3 * 15 * 3);
}

/// The scalar path returns exactly what ggml's generic C code returns when compiled without
/// FMA contraction.
#[test]
fn scalar_is_bit_exact_with_ggml_generic() {
    assert_fixture_bit_exact(&fixture(), &[Isa::Scalar], |c| c.generic);
}

// ---- tolerance checks on rows quantized here ----

struct Rows {
    w: Vec<u8>,
    x: Vec<u8>,
    /// Σ|w_i·x_i| over the dequantized rows, with a min-type weight's two parts (d·scale·q and
    /// dmin·min) counted separately: the size the scalar path's roundings are relative to.
    mag: f64,
    /// Σ|o_i·x_i| for the types whose AVX2 kernel multiplies unsigned quants and takes a
    /// constant offset o off afterwards (q3_K's 4, q6_K's 32, tq1_0's and tq2_0's 1, times the
    /// scales): its integer lanes hold those terms too.
    mag_offset: f64,
    /// The exact dot product of the dequantized rows, except that for q5_1 it takes q8_1's
    /// stored activation sum `s` (an f16 of the f32 d·Σq) where the dequantized row has
    /// f16(d)·Σq, as ggml's kernel does (that gap is the quantization format's, not the
    /// kernel's: with d in f16's subnormal range it reaches several per cent of the min term).
    exact: f64,
}

/// Offsets in a weight block of the scale and of the min's scale, for the types with mins.
fn min_fields(t: DType) -> Option<(usize, usize)> {
    match t {
        DType::Q5_1 | DType::Q4K | DType::Q5K => Some((0, 2)),
        DType::Q2K => Some((80, 82)),
        _ => None,
    }
}

/// Byte ranges of a weight block that, zeroed, leave only the AVX2 kernel's offset: all quants
/// 0 (q3_K with its high bits clear: -4, q6_K: -32, ternary: -1).
fn offset_quants(t: DType) -> Option<std::ops::Range<usize>> {
    match t {
        DType::Q3K => Some(0..96),
        DType::Q6K => Some(0..192),
        DType::TQ1_0 => Some(0..52),
        DType::TQ2_0 => Some(0..64),
        _ => None,
    }
}

fn f16_at(b: &[u8], at: usize) -> f64 {
    tessera_quants::f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]])) as f64
}

fn rows(t: DType, wf: &[f32], xf: &[f32]) -> Rows {
    let k = wf.len();
    let vdt = vec_dot_type(t);
    let ts = t.type_size();
    let mut w = vec![0u8; t.row_size(k).unwrap()];
    let mut x = vec![0u8; vdt.row_size(k).unwrap()];
    tessera_quants::quantize_row(t.id(), wf, &mut w, None).unwrap();
    quantize_activations(vdt, xf, &mut x).unwrap();
    let wd = dequant(t, &w, k);
    let xd = dequant(vdt, &x, k);
    let mut exact: f64 = wd.iter().zip(&xd).map(|(&a, &b)| a as f64 * b as f64).sum();
    let dot_abs = |v: &[f32]| -> f64 {
        v.iter()
            .zip(&xd)
            .map(|(&a, &b)| (a as f64 * b as f64).abs())
            .sum()
    };
    // the weights with some bytes of every block zeroed, dequantized
    let edited = |range: std::ops::Range<usize>| {
        let mut b = w.clone();
        for blk in b.chunks_exact_mut(ts) {
            blk[range.clone()].fill(0);
        }
        dequant(t, &b, k)
    };
    let mag = match min_fields(t) {
        // the two parts of each weight: zero the min's scale, then the scale
        Some((d, dmin)) => dot_abs(&edited(dmin..dmin + 2)) + dot_abs(&edited(d..d + 2)),
        None => dot_abs(&wd),
    };
    let mag_offset = offset_quants(t).map_or(0.0, |r| dot_abs(&edited(r)));
    if t == DType::Q5_1 {
        for (wb, xb) in w.chunks_exact(ts).zip(x.chunks_exact(36)) {
            let sum_q: f64 = xb[4..].iter().map(|&q| q as i8 as f64).sum();
            exact += f16_at(wb, 2) * (f16_at(xb, 2) - f16_at(xb, 0) * sum_q);
        }
    }
    Rows {
        w,
        x,
        mag,
        mag_offset,
        exact,
    }
}

fn ks(t: DType) -> [usize; 3] {
    if t.block_size() == 32 {
        [96, 256, 4096]
    } else {
        [256, 768, 4096]
    }
}

/// The scalar path against the exact (f64) dot product of the dequantized rows.
///
/// Both sides use the same quantized integers and the same f16/f32 scales; they differ only in
/// float rounding: ggml multiplies the two block scales, converts each block's (or lane's)
/// integer sum, multiplies and adds across the row, a handful of roundings per block and one
/// per block in the running sum, each off by at most 2^-24 of a value bounded by `mag`; the
/// dequantized rows round each weight (scale·sub-scale, ·q, − dmin·min) and activation once or
/// twice. So |error| ≤ (blocks + 16)·2^-23·mag, 2^-23 allowing two roundings per step (q5_1's
/// stored activation sums are accounted for in `exact`, see [`Rows`]).
#[test]
fn scalar_matches_exact_dot() {
    for t in TYPES {
        for k in ks(t) {
            let nb = (k / t.block_size()) as f64;
            for p in 0..PATTERNS {
                let (wf, xf) = pattern(p, k, (p * 31 + k) as u64);
                let r = rows(t, &wf, &xf);
                let got = vec_dot(Isa::Scalar, t, &r.w, &r.x, k) as f64;
                let tol = (nb + 16.0) * 2f64.powi(-23) * r.mag;
                assert!(
                    (got - r.exact).abs() <= tol,
                    "{t} k={k} pattern {p}: scalar {got} vs exact {} (tolerance {tol})",
                    r.exact
                );
            }
        }
    }
}

/// The AVX2 path against the scalar one: the same integer sums, grouped differently into
/// float lanes (8 per block, FMAs, a final 8-lane reduction), so each side's rounding is at
/// most (8·blocks + 16)·2^-24 of what its lanes hold (mag, plus mag_offset for the AVX2 kernels
/// that take an offset off inside the lanes) and they differ by at most the sum.
#[test]
fn avx2_matches_scalar() {
    if !has_avx2() {
        eprintln!("no AVX2 here: the AVX2 path is not checked");
        return;
    }
    for t in TYPES {
        for k in ks(t) {
            let nb = (k / t.block_size()) as f64;
            for p in 0..PATTERNS {
                let (wf, xf) = pattern(p, k, (p * 77 + k) as u64);
                let r = rows(t, &wf, &xf);
                let scalar = vec_dot(Isa::Scalar, t, &r.w, &r.x, k);
                for isa in [Isa::Avx2, Isa::AvxVnni, Isa::Avx512] {
                    let got = vec_dot(isa, t, &r.w, &r.x, k);
                    let tol = (8.0 * nb + 16.0) * 2f64.powi(-24) * (2.0 * r.mag + r.mag_offset);
                    assert!(
                        ((got - scalar) as f64).abs() <= tol,
                        "{t} k={k} pattern {p} {isa:?}: {got} vs scalar {scalar} (tolerance {tol})"
                    );
                }
            }
        }
    }
}

#[test]
fn supported_types() {
    // this file's types, plus those of the kernel files with their own fixtures
    use tessera_cpu::ops::{qdot_fp, qdot_iq13, qdot_iq2};
    for t in DType::ALL {
        let elsewhere = qdot_iq2::supported(t) || qdot_iq13::supported(t) || qdot_fp::supported(t);
        assert!(!(TYPES.contains(&t) && elsewhere), "{t} has two kernels");
        assert_eq!(supported(t), TYPES.contains(&t) || elsewhere, "{t}");
    }
    // every quantized weight type has an integer kernel: here, or (q4_0, q4_1, q8_0) in
    // matmul_quant; q8_1 and q8_K are only activation formats
    for t in DType::ALL {
        if t.is_quantized()
            && !matches!(
                t,
                DType::Q4_0 | DType::Q4_1 | DType::Q8_0 | DType::Q8_1 | DType::Q8K
            )
        {
            assert!(supported(t), "{t} has no integer kernel");
        }
    }
}

#[test]
#[should_panic(expected = "not whole")]
fn rejects_partial_blocks() {
    let w = vec![0u8; DType::Q4K.type_size()];
    let x = vec![0u8; DType::Q8K.type_size()];
    vec_dot(Isa::Scalar, DType::Q4K, &w, &x, 128);
}

#[test]
#[should_panic(expected = "bytes")]
fn rejects_short_rows() {
    let w = vec![0u8; DType::Q6K.type_size()];
    let x = vec![0u8; DType::Q8K.type_size() - 1];
    vec_dot(Isa::Avx2, DType::Q6K, &w, &x, 256);
}

#[test]
#[should_panic(expected = "no integer kernel")]
fn rejects_unsupported_types() {
    let w = vec![0u8; DType::Q4_0.type_size()];
    let x = vec![0u8; DType::Q8_0.type_size()];
    vec_dot(Isa::Scalar, DType::Q4_0, &w, &x, 32);
}

/// `vec_dot_rows` (one dispatch for many rows, as a mat-vec calls it) gives each row exactly
/// `vec_dot`'s bits, for rows packed back to back and rows further apart (a view), on both ISAs.
#[test]
fn vec_dot_rows_equals_vec_dot_on_every_row() {
    for (ti, &t) in TYPES.iter().enumerate() {
        rows_against_vec_dot(t, 512, 100 + ti as u64, 9, true);
    }
}

/// The same for long rows of the types whose mat-vec takes something from the activations once
/// for all rows (q4_K/q5_K: pair sums of up to 256 blocks, iq4_xs: magnitudes of up to 56):
/// rows within those limits and rows past them (the kernels then take it block by block).
#[test]
fn vec_dot_rows_equals_vec_dot_on_long_rows() {
    for (ti, &t) in [DType::Q4K, DType::Q5K, DType::IQ4XS].iter().enumerate() {
        for (ki, blocks) in [56, 57, 256, 257].into_iter().enumerate() {
            // three rows back to back: quantizing them is most of the test's time
            rows_against_vec_dot(t, 256 * blocks, 200 + 10 * ti as u64 + ki as u64, 3, false);
        }
    }
}

/// `n` rows of `k` elements of `t` packed back to back (and, with `view`, 7 bytes apart too)
/// through `vec_dot_rows` against `vec_dot` on each row.
fn rows_against_vec_dot(t: DType, k: usize, seed: u64, n: usize, view: bool) {
    use tessera_cpu::ops::qdot::vec_dot_rows;
    let row = t.row_size(k).unwrap();
    let vdt = vec_dot_type(t);
    let mut next = rng(seed);
    let xv: Vec<f32> = (0..k).map(|_| next()).collect();
    let mut x = vec![0u8; vdt.row_size(k).unwrap()];
    quantize_activations(vdt, &xv, &mut x).unwrap();
    let strides = if view { vec![row, row + 7] } else { vec![row] };
    for stride in strides {
        let mut w = vec![0u8; (n - 1) * stride + row];
        for r in 0..n {
            let wv: Vec<f32> = (0..k).map(|_| next()).collect();
            tessera_quants::quantize_row(t.id(), &wv, &mut w[r * stride..r * stride + row], None)
                .unwrap();
        }
        for isa in [Isa::Scalar, tessera_cpu::simd::isa()] {
            let mut out = vec![0f32; n];
            vec_dot_rows(isa, t, &w, stride, &x, k, &mut out);
            for (r, &o) in out.iter().enumerate() {
                let want = vec_dot(isa, t, &w[r * stride..r * stride + row], &x, k);
                assert_eq!(
                    o.to_bits(),
                    want.to_bits(),
                    "{t} k={k} row {r} stride {stride} {isa:?}"
                );
            }
        }
    }
}
