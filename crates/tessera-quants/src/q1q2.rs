//! Low-bit formats q1_0 (1 bit, block of 128) and q2_0 (2 bits, block of 64).
//!
//! Block layouts (little endian, from ggml's `ggml-common.h`):
//! - q1_0 (18 bytes): `d: f16`, `qs: [u8; 16]`; bit j % 8 of qs[j / 8] is the sign of element
//!   j: value = +d when set, −d when clear. The reference quantizer sets d = mean |x|.
//! - q2_0 (18 bytes): `d: f16`, `qs: [u8; 16]`; bits 2(j % 4)..+2 of qs[j / 4] hold q ∈ 0..4
//!   for element j: value = (q − 1)·d (−d, 0, d, 2d). The reference quantizer sets d = max |x|.
//!
//! Neither has an importance-weighted quantizer in ggml (the matrix is ignored).
//! Rewritten from ggml's `ggml-quants.c` (MIT licence, © the ggml authors).

use crate::f16::{rd_f16, trunc_i32, wr_f16};

pub(crate) fn dequantize_q1_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(18).zip(dst.chunks_exact_mut(128)) {
        let d = rd_f16(b, 0);
        let neg_d = -d;
        for j in 0..128 {
            let bit = (b[2 + j / 8] >> (j % 8)) & 1;
            y[j] = if bit != 0 { d } else { neg_d };
        }
    }
}

pub(crate) fn dequantize_q2_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(18).zip(dst.chunks_exact_mut(64)) {
        let d = rd_f16(b, 0);
        for j in 0..64 {
            let q = (b[2 + j / 4] >> (2 * (j % 4))) & 3;
            y[j] = (q as i32 - 1) as f32 * d;
        }
    }
}

pub(crate) fn quantize_q1_0(x: &[f32], y: &mut [u8], _imatrix: Option<&[f32]>) {
    for (x, b) in x.chunks_exact(128).zip(y.chunks_exact_mut(18)) {
        let mut sum_abs = 0.0f32;
        for &v in x {
            sum_abs += v.abs();
        }
        wr_f16(b, 0, sum_abs / 128.0);
        b[2..18].fill(0);
        for (j, &v) in x.iter().enumerate() {
            if v >= 0.0 {
                b[2 + j / 8] |= 1 << (j % 8);
            }
        }
    }
}

pub(crate) fn quantize_q2_0(x: &[f32], y: &mut [u8], _imatrix: Option<&[f32]>) {
    for (x, b) in x.chunks_exact(64).zip(y.chunks_exact_mut(18)) {
        let mut amax = 0.0f32;
        for &v in x {
            let a = v.abs();
            if a > amax {
                amax = a;
            }
        }
        let d = amax;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        wr_f16(b, 0, d);
        b[2..18].fill(0);
        for (j, &w) in x.iter().enumerate() {
            // C: (int)roundf(w*id) + 1, clamped to 0..=3.
            let q = trunc_i32((w * id).round()).wrapping_add(1).clamp(0, 3);
            b[2 + j / 4] |= (q as u8) << (2 * (j % 4));
        }
    }
}
