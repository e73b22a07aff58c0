//! 4-bit floating-point microscaling formats: mxfp4 (OCP MX, block of 32, E8M0 scale) and
//! nvfp4 (NVIDIA, block of 64 with four 16-element sub-blocks, UE4M3 scales).
//!
//! Both store E2M1 values as 4-bit codes; ggml decodes them through `kvalues_fp4`, the E2M1
//! values doubled (0, 0.5, 1, 1.5, 2, 3, 4, 6 → 0, 1, 2, 3, 4, 6, 8, 12, with bit 3 the sign),
//! and halves the scale to compensate.
//!
//! Block layouts (from ggml's `ggml-common.h`):
//! - mxfp4 (17 bytes): `e: u8` (E8M0 exponent: scale 2^(e−127)), `qs: [u8; 16]`: element j < 16
//!   is the low nibble of qs[j], element j + 16 the high nibble. value = kvalues[q]·2^(e−128).
//! - nvfp4 (36 bytes): `d: [u8; 4]` (UE4M3 scale of each sub-block of 16), `qs: [u8; 32]`:
//!   sub-block s uses qs[8s..8s+8], low nibbles for its elements 0..8, high nibbles for 8..16.
//!   value = kvalues[q]·ue4m3(d[s])/2.
//!
//! Rewritten from ggml's `ggml-quants.c` and `ggml-impl.h` (MIT licence, © the ggml authors).

use crate::f16::trunc_i32;

const KVALUES_FP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// 2^(x−128) (half of the E8M0 value), as ggml's `GGML_E8M0_TO_FP32_HALF`.
fn e8m0_to_f32_half(x: u8) -> f32 {
    let bits: u32 = if x < 2 {
        0x0020_0000 << x
    } else {
        ((x - 1) as u32) << 23
    };
    f32::from_bits(bits)
}

/// 2^e for an exponent in the normal range.
fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// Half of the UE4M3 value (bias 7, 3 mantissa bits; 0 and 0x7F decode to 0), as ggml's
/// `ggml_ue4m3_to_fp32`. Bit 7 is ignored.
pub(crate) fn ue4m3_to_f32_half(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let exp = ((x >> 3) & 0xF) as i32;
    let man = (x & 0x7) as i32;
    let raw = if exp == 0 {
        man as f32 * pow2(-9)
    } else {
        (1.0 + man as f32 / 8.0) * pow2(exp - 7)
    };
    raw * 0.5
}

/// f32 → UE4M3 as ggml's `ggml_fp32_to_ue4m3`: clamps to 448, rounds the mantissa half up.
pub(crate) fn f32_to_ue4m3(x: f32) -> u8 {
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    if !(x > 0.0) {
        return 0;
    }
    let x = if x > 448.0 { 448.0 } else { x };
    let bits = x.to_bits();
    let fp32_exp = ((bits >> 23) & 0xFF) as i32 - 127;
    let fp32_man = ((bits >> 20) & 0x7) as i32;
    let mut exp = fp32_exp + 7;
    if exp <= 0 {
        // Subnormal: value = man·2^−9.
        let man = ((x * 512.0 + 0.5) as i32).min(7);
        if man < 1 {
            return 0;
        }
        return man as u8;
    }
    if exp >= 15 {
        return 0x7E;
    }
    let round_bit = ((bits >> 19) & 1) as i32;
    let mut man = fp32_man + round_bit;
    if man > 7 {
        man = 0;
        exp += 1;
        if exp >= 15 {
            return 0x7E;
        }
    }
    ((exp << 3) | man) as u8
}

pub(crate) fn dequantize_mxfp4(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(17).zip(dst.chunks_exact_mut(32)) {
        let d = e8m0_to_f32_half(b[0]);
        for j in 0..16 {
            let q = b[1 + j];
            y[j] = KVALUES_FP4[(q & 0x0F) as usize] as f32 * d;
            y[j + 16] = KVALUES_FP4[(q >> 4) as usize] as f32 * d;
        }
    }
}

pub(crate) fn dequantize_nvfp4(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(36).zip(dst.chunks_exact_mut(64)) {
        for s in 0..4 {
            let d = ue4m3_to_f32_half(b[s]);
            let yb = &mut y[16 * s..16 * s + 16];
            for j in 0..8 {
                let q = b[4 + 8 * s + j];
                yb[j] = KVALUES_FP4[(q & 0x0F) as usize] as f32 * d;
                yb[j + 8] = KVALUES_FP4[(q >> 4) as usize] as f32 * d;
            }
        }
    }
}

/// The code whose value times `e` is nearest to `x` (the first one on ties), as ggml's
/// `best_index_mxfp4`.
fn best_index(x: f32, e: f32) -> u8 {
    let mut best_index = 0;
    let mut best_err = (KVALUES_FP4[0] as f32 * e - x).abs();
    for (i, &k) in KVALUES_FP4.iter().enumerate().skip(1) {
        let err = (k as f32 * e - x).abs();
        if err < best_err {
            best_index = i;
            best_err = err;
        }
    }
    best_index as u8
}

pub(crate) fn quantize_mxfp4(x: &[f32], y: &mut [u8], _imatrix: Option<&[f32]>) {
    for (x, b) in x.chunks_exact(32).zip(y.chunks_exact_mut(17)) {
        let mut amax = 0.0f32;
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
            }
        }
        // C: (uint8_t)(floorf(log2f(amax)) - 2 + 127), a float converted to an 8-bit integer
        // (through a 32-bit conversion on x86-64, which matters only for absurd inputs).
        let e: u8 = if amax > 0.0 {
            trunc_i32(amax.log2().floor() - 2.0 + 127.0) as u8
        } else {
            0
        };
        let d = e8m0_to_f32_half(e);
        b[0] = e;
        for j in 0..16 {
            b[1 + j] = best_index(x[j], d) | (best_index(x[j + 16], d) << 4);
        }
    }
}

pub(crate) fn quantize_nvfp4(x: &[f32], y: &mut [u8], _imatrix: Option<&[f32]>) {
    for (x, b) in x.chunks_exact(64).zip(y.chunks_exact_mut(36)) {
        for s in 0..4 {
            let xb = &x[16 * s..16 * s + 16];
            let mut amax = 0.0f32;
            for &v in xb {
                if amax < v.abs() {
                    amax = v.abs();
                }
            }
            let ue = f32_to_ue4m3(amax / 6.0);
            b[s] = ue;
            let d = ue4m3_to_f32_half(ue);
            for j in 0..8 {
                b[4 + 8 * s + j] = best_index(xb[j], d) | (best_index(xb[j + 8], d) << 4);
            }
        }
    }
}
