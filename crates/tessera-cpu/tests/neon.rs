//! The aarch64 NEON integer dot products (`ops::qdot_neon`) against ggml's generic code and
//! against the scalar path, bit for bit.
//!
//! These tests exist only on aarch64. On x86_64 machines they run under user-mode emulation:
//! `.ci/run` cross-builds this file for `aarch64-unknown-linux-gnu` and runs it with
//! `qemu-aarch64` twice, once as a CPU with the dot-product instruction SDOT (`-cpu max`) and
//! once as a baseline ARMv8.0 core (`-cpu cortex-a53`): the kernels that sum whole blocks take
//! SDOT where the CPU has it and `vmull_s8` where not, and both must give the scalar path's
//! bits.
#![cfg(target_arch = "aarch64")]

use tessera::DType;
use tessera_cpu::ops::matmul_quant::{self, vec_dot_type};
use tessera_cpu::ops::{qdot, qdot_neon};
use tessera_cpu::Isa;

mod common;
mod float_emu;
mod qdot_common;
use qdot_common::*;

/// The NEON float mul_mat (mat-vec one and four rows a call, GEMM, f16/bf16 rows widened,
/// activations rounded to the weights' type) gives the x86 AVX2 path's bits: the emulation
/// `tests/matmul.rs` holds the AVX2 kernels to natively.
#[test]
fn float_mul_mat_has_the_avx2_paths_bits() {
    assert_eq!(float_emu::check_float_mul_mat(Isa::Neon), 45);
}

/// The NEON rounding of activations to f16 (`fcvtn`) and bf16 keeps `half`'s bits.
#[test]
fn neon_rounding_keeps_halfs_bits() {
    float_emu::check_rounding(Isa::Neon, 50_000);
}

/// Every type with an integer kernel: the three of `matmul_quant`, the eleven of `qdot` with
/// their own NEON kernels, and the eleven lattice and small-float types whose generic code runs
/// on NEON integer sums.
const TYPES: [DType; 25] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q8_0,
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
    DType::IQ2XXS,
    DType::IQ2XS,
    DType::IQ2S,
    DType::IQ3XXS,
    DType::IQ3S,
    DType::IQ1S,
    DType::IQ1M,
    DType::MXFP4,
    DType::NVFP4,
    DType::Q1_0,
    DType::Q2_0,
];

fn dot(isa: Isa, t: DType, w: &[u8], x: &[u8], k: usize) -> f32 {
    if matches!(t, DType::Q4_0 | DType::Q4_1 | DType::Q8_0) {
        matmul_quant::vec_dot(isa, t, w, x, k)
    } else {
        qdot::vec_dot(isa, t, w, x, k)
    }
}

#[test]
fn the_process_runs_neon() {
    assert_eq!(tessera_cpu::simd::isa(), Isa::Neon);
    // dev/test-aarch64.sh runs this file on an emulated CPU with SDOT and on one without, and
    // says which, so that both kernel variants are known to have run
    if let Ok(v) = std::env::var("TESSERA_EXPECT_DOTPROD") {
        assert_eq!(
            qdot_neon::has_dotprod(),
            v == "1",
            "TESSERA_EXPECT_DOTPROD={v}"
        );
    }
    for t in TYPES {
        assert!(qdot_neon::covers(t), "{t}");
    }
}

/// The NEON path returns exactly what ggml's generic C code returns (the fixtures of
/// `tests/qdot.rs`, `qdot_iq2.rs`, `qdot_iq13.rs` and `qdot_fp.rs`: quantized patterns and
/// rows of random block bytes).
#[test]
fn neon_is_bit_exact_with_ggml_generic() {
    let cases = parse_fixture(include_bytes!("data/qdot_ggml.bin"));
    let n = assert_fixture_bit_exact(&cases, &[Isa::Neon], |c| c.generic);
    let covered = cases.iter().filter(|c| qdot_neon::covers(c.t)).count();
    assert!(
        covered >= 11 * 15,
        "{covered} fixture cases with a NEON kernel"
    );
    assert!(n >= covered);
    // and the fixtures of the lattice and small-float kernels
    for fixture in [
        &include_bytes!("data/qdot_ggml_iq2.bin")[..],
        &include_bytes!("data/qdot_ggml_iq13.bin")[..],
        &include_bytes!("data/qdot_ggml_fp.bin")[..],
    ] {
        let cases = parse_fixture(fixture);
        assert!(cases.len() >= 3 * 15, "{} cases", cases.len());
        assert!(cases.iter().all(|c| qdot_neon::covers(c.t)));
        assert_fixture_bit_exact(&cases, &[Isa::Neon], |c| c.generic);
    }
}

/// Sets the block scales of weight block `i` to small finite values, so that every other byte
/// can take any value in the edited rows below.
fn finite_scales(t: DType, blk: &mut [u8], i: usize) {
    let fields: &[usize] = match t {
        DType::Q4_1 | DType::Q5_1 | DType::Q4K | DType::Q5K => &[0, 2],
        DType::Q2K => &[80, 82],
        DType::Q3K => &[108],
        DType::Q6K => &[208],
        DType::TQ1_0 => &[52],
        DType::TQ2_0 => &[64],
        // an E8M0 byte, four UE4M3 bytes, the f16 in the top nibbles of four words
        DType::MXFP4 => return blk[0] = 125 + (i % 3) as u8,
        DType::NVFP4 => return blk[..4].copy_from_slice(&[0x38, 0x30, 0x40, 0x2f]),
        DType::IQ1M => {
            for (w, nibble) in [(49, 0), (51, 0), (53, 0), (55, 3)] {
                blk[w] = (blk[w] & 15) | nibble << 4;
            }
            return;
        }
        _ => &[0],
    };
    for (j, &at) in fields.iter().enumerate() {
        // 1.0, 1.5, 2.0, ...
        let h = half::f16::from_f32(1.0 + 0.5 * ((i + j) % 3) as f32);
        blk[at..at + 2].copy_from_slice(&h.to_bits().to_le_bytes());
    }
}

/// Offsets of the activation block's scale fields and where its codes start and end.
fn act_layout(vdt: DType) -> (&'static [usize], usize, usize) {
    match vdt {
        DType::Q8_0 => (&[0], 2, 34),
        DType::Q8_1 => (&[0, 2], 4, 36),
        DType::Q8K => (&[], 4, 260),
        _ => unreachable!("{vdt}"),
    }
}

/// Weight rows whose quants and sub-scales are all zero bits, all one bits, alternating bits,
/// 0x80 or 0x7f bytes (q8_0's -128 and 127) or random bytes, against activation codes of -128, 127, alternating ±127/-128 or random:
/// every extreme product at every position, where a 16-bit partial sum would overflow first.
/// The NEON result must equal the scalar one bit for bit.
#[test]
fn neon_equals_scalar_on_extreme_codes() {
    let mut checked = 0;
    for t in TYPES {
        let vdt = vec_dot_type(t);
        let k = 2 * vdt.block_size().max(t.block_size()) * if t.block_size() == 32 { 4 } else { 1 };
        let (ts, xs) = (t.row_size(k).unwrap(), vdt.row_size(k).unwrap());
        let (bw, bx) = (t.type_size(), vdt.type_size());
        for wfill in 0..7u64 {
            let mut w = match wfill {
                0 => vec![0u8; ts],
                1 => vec![0xffu8; ts],
                2 => vec![0x55u8; ts],
                3 => vec![0xaau8; ts],
                4 => vec![0x80u8; ts],
                5 => vec![0x7fu8; ts],
                _ => rng_bytes(ts, 7 + k as u64),
            };
            for (i, blk) in w.chunks_exact_mut(bw).enumerate() {
                finite_scales(t, blk, i);
            }
            for xfill in 0..4u64 {
                let mut x = rng_bytes(xs, 11 + wfill * 5 + xfill);
                let (fields, c0, c1) = act_layout(vdt);
                for (i, blk) in x.chunks_exact_mut(bx).enumerate() {
                    for &at in fields {
                        let h = half::f16::from_f32(0.25 + i as f32);
                        blk[at..at + 2].copy_from_slice(&h.to_bits().to_le_bytes());
                    }
                    if vdt == DType::Q8K {
                        blk[0..4].copy_from_slice(&(0.125f32 + i as f32).to_le_bytes());
                    }
                    for (e, b) in blk[c0..c1].iter_mut().enumerate() {
                        *b = match xfill {
                            0 => 0x80,
                            1 => 0x7f,
                            2 => [0x7f, 0x80][e % 2],
                            _ => *b,
                        };
                    }
                }
                let neon = dot(Isa::Neon, t, &w, &x, k);
                let scalar = dot(Isa::Scalar, t, &w, &x, k);
                assert!(neon.is_finite(), "{t} w{wfill} x{xfill}: {neon}");
                assert_eq!(
                    neon.to_bits(),
                    scalar.to_bits(),
                    "{t} k={k} weights {wfill} activations {xfill}: NEON {neon:e} vs scalar {scalar:e}"
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, TYPES.len() * 28);
}

/// Quantized float rows of several lengths, through the four-row and whole-row entry points as
/// the mat-vec paths call them: each result equals the scalar one.
#[test]
fn neon_rows_equal_scalar_rows() {
    for t in TYPES {
        let vdt = vec_dot_type(t);
        let bs = vdt.block_size().max(t.block_size());
        for nbk in [1usize, 3, 16] {
            let k = bs * nbk;
            let n_rows = 5;
            let mut w = vec![0u8; t.row_size(k).unwrap() * n_rows];
            let row = t.row_size(k).unwrap();
            for r in 0..n_rows {
                let (wf, _) = pattern(r % PATTERNS, k, 3 + r as u64);
                // the i-quants that need an importance matrix get a flat one
                let out = &mut w[r * row..(r + 1) * row];
                if tessera_quants::quantize_row(t.id(), &wf, out, None).is_err() {
                    let flat = vec![1f32; k];
                    tessera_quants::quantize_row(t.id(), &wf, out, Some(&flat)).unwrap();
                }
            }
            let (_, xf) = pattern(0, k, 99);
            let mut x = vec![0u8; vdt.row_size(k).unwrap()];
            matmul_quant::quantize_activations(vdt, &xf, &mut x).unwrap();
            let scalar: Vec<f32> = (0..n_rows)
                .map(|r| dot(Isa::Scalar, t, &w[r * row..(r + 1) * row], &x, k))
                .collect();
            let neon: Vec<f32> = (0..n_rows)
                .map(|r| dot(Isa::Neon, t, &w[r * row..(r + 1) * row], &x, k))
                .collect();
            assert_eq!(
                neon.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                scalar.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{t} k={k}: {neon:?} vs {scalar:?}"
            );
            if qdot::supported(t) {
                let mut out = vec![0f32; n_rows];
                qdot::vec_dot_rows(Isa::Neon, t, &w, row, &x, k, &mut out);
                assert_eq!(out, neon, "{t} k={k}: vec_dot_rows");
            } else {
                let rows4 = [0, 1, 2, 3].map(|r| &w[r * row..(r + 1) * row]);
                let four = matmul_quant::vec_dot4(Isa::Neon, t, rows4, &x, k, 0);
                assert_eq!(&four[..], &neon[..4], "{t} k={k}: vec_dot4");
            }
        }
    }
}
