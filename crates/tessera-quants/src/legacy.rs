//! The original ggml formats: q4_0, q4_1, q5_0, q5_1, q8_0, q8_1 (blocks of 32 elements).
//!
//! Block layouts (little endian, from ggml's `ggml-common.h`):
//! - q4_0 (18 bytes): `d: f16`, `qs: [u8; 16]`. Element j < 16 is the low nibble of qs[j],
//!   element j + 16 the high nibble; value = (q − 8)·d.
//! - q4_1 (20 bytes): `d: f16`, `m: f16`, `qs: [u8; 16]` (nibbles as q4_0); value = q·d + m.
//! - q5_0 (22 bytes): `d: f16`, `qh: [u8; 4]` (bit j = 5th bit of element j), `qs: [u8; 16]`
//!   (low 4 bits as q4_0); value = (q − 16)·d.
//! - q5_1 (24 bytes): `d: f16`, `m: f16`, `qh: [u8; 4]`, `qs: [u8; 16]`; value = q·d + m.
//! - q8_0 (34 bytes): `d: f16`, `qs: [i8; 32]`; value = q·d.
//! - q8_1 (36 bytes): `d: f16`, `s: f16` (= d·Σq), `qs: [i8; 32]`; an activation format for dot
//!   products (ggml has no `to_float` for it; ours returns q·d).
//!
//! Quantizers follow ggml's `quantize_row_*_ref` and, with an importance matrix, the
//! `quantize_row_*_impl` searches (credit: ggml, MIT licence).

use crate::common::c_max;
use crate::common::{make_qkx3_quants, make_qx_quants};
use crate::f16::{rd_f16, trunc_i32, wr_f16};

const QK: usize = 32;

// ---------------------------------------------------------------- dequantization

pub(crate) fn dequantize_q4_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(18).zip(dst.chunks_exact_mut(QK)) {
        let d = rd_f16(b, 0);
        for j in 0..16 {
            let q = b[2 + j];
            y[j] = ((q & 0x0F) as i32 - 8) as f32 * d;
            y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

pub(crate) fn dequantize_q4_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(20).zip(dst.chunks_exact_mut(QK)) {
        let d = rd_f16(b, 0);
        let m = rd_f16(b, 2);
        for j in 0..16 {
            let q = b[4 + j];
            y[j] = (q & 0x0F) as f32 * d + m;
            y[j + 16] = (q >> 4) as f32 * d + m;
        }
    }
}

fn q5_high(qh: u32, j: usize) -> (u8, u8) {
    let h0 = (((qh >> j) << 4) & 0x10) as u8;
    let h1 = ((qh >> (j + 12)) & 0x10) as u8;
    (h0, h1)
}

pub(crate) fn dequantize_q5_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(22).zip(dst.chunks_exact_mut(QK)) {
        let d = rd_f16(b, 0);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        for j in 0..16 {
            let q = b[6 + j];
            let (h0, h1) = q5_high(qh, j);
            y[j] = (((q & 0x0F) | h0) as i32 - 16) as f32 * d;
            y[j + 16] = (((q >> 4) | h1) as i32 - 16) as f32 * d;
        }
    }
}

pub(crate) fn dequantize_q5_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(24).zip(dst.chunks_exact_mut(QK)) {
        let d = rd_f16(b, 0);
        let m = rd_f16(b, 2);
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        for j in 0..16 {
            let q = b[8 + j];
            let (h0, h1) = q5_high(qh, j);
            y[j] = ((q & 0x0F) | h0) as f32 * d + m;
            y[j + 16] = ((q >> 4) | h1) as f32 * d + m;
        }
    }
}

pub(crate) fn dequantize_q8_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(34).zip(dst.chunks_exact_mut(QK)) {
        let d = rd_f16(b, 0);
        for j in 0..QK {
            y[j] = (b[2 + j] as i8) as f32 * d;
        }
    }
}

pub(crate) fn dequantize_q8_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(36).zip(dst.chunks_exact_mut(QK)) {
        let d = rd_f16(b, 0);
        for j in 0..QK {
            y[j] = (b[4 + j] as i8) as f32 * d;
        }
    }
}

// ---------------------------------------------------------------- reference quantizers

/// The element of largest magnitude (the first one on ties) and that magnitude.
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

fn quantize_q4_0_ref(x: &[f32], y: &mut [u8]) {
    for (x, b) in x.chunks_exact(QK).zip(y.chunks_exact_mut(18)) {
        let (_, max) = signed_absmax(x);
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_f16(b, 0, d);
        for j in 0..16 {
            // C: MIN(15, (int8_t)(x*id + 8.5f)).
            let q0 = (trunc_i32(x[j] * id + 8.5) as i8).min(15) as u8;
            let q1 = (trunc_i32(x[j + 16] * id + 8.5) as i8).min(15) as u8;
            b[2 + j] = q0 | (q1 << 4);
        }
    }
}

fn quantize_q4_1_ref(x: &[f32], y: &mut [u8]) {
    for (x, b) in x.chunks_exact(QK).zip(y.chunks_exact_mut(20)) {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_f16(b, 0, d);
        wr_f16(b, 2, min);
        for j in 0..16 {
            let q0 = (trunc_i32((x[j] - min) * id + 0.5) as i8).min(15) as u8;
            let q1 = (trunc_i32((x[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
            b[4 + j] = q0 | (q1 << 4);
        }
    }
}

/// Packs 32 five-bit values into a q5 block's `qh` (at `b[qh_off..]`) and `qs`.
fn pack_q5(l: &[u8; 32], b: &mut [u8], qh_off: usize) {
    let mut qh: u32 = 0;
    for j in 0..16 {
        let (q0, q1) = (l[j], l[j + 16]);
        b[qh_off + 4 + j] = (q0 & 0x0F) | ((q1 & 0x0F) << 4);
        qh |= (((q0 & 0x10) >> 4) as u32) << j;
        qh |= (((q1 & 0x10) >> 4) as u32) << (j + 16);
    }
    b[qh_off..qh_off + 4].copy_from_slice(&qh.to_le_bytes());
}

fn quantize_q5_0_ref(x: &[f32], y: &mut [u8]) {
    for (x, b) in x.chunks_exact(QK).zip(y.chunks_exact_mut(22)) {
        let (_, max) = signed_absmax(x);
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_f16(b, 0, d);
        let mut l = [0u8; 32];
        for j in 0..QK {
            l[j] = (trunc_i32(x[j] * id + 16.5) as i8).min(31) as u8;
        }
        pack_q5(&l, b, 2);
    }
}

fn quantize_q5_1_ref(x: &[f32], y: &mut [u8]) {
    for (x, b) in x.chunks_exact(QK).zip(y.chunks_exact_mut(24)) {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_f16(b, 0, d);
        wr_f16(b, 2, min);
        let mut l = [0u8; 32];
        for j in 0..QK {
            // C: (uint8_t)(x + 0.5f), no clamp.
            l[j] = trunc_i32((x[j] - min) * id + 0.5) as u8;
        }
        pack_q5(&l, b, 4);
    }
}

/// C's `roundf` stored into an `int8_t` (x86 truncates the int to its low byte).
fn round_i8(v: f32) -> i8 {
    trunc_i32(v.round()) as i8
}

fn quantize_q8_0_ref(x: &[f32], y: &mut [u8]) {
    for (x, b) in x.chunks_exact(QK).zip(y.chunks_exact_mut(34)) {
        let amax = x.iter().fold(0.0f32, |a, v| c_max(a, v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_f16(b, 0, d);
        for j in 0..QK {
            b[2 + j] = round_i8(x[j] * id) as u8;
        }
    }
}

pub(crate) fn quantize_q8_1(x: &[f32], y: &mut [u8], _imatrix: Option<&[f32]>) {
    for (x, b) in x.chunks_exact(QK).zip(y.chunks_exact_mut(36)) {
        let amax = x.iter().fold(0.0f32, |a, v| c_max(a, v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        wr_f16(b, 0, d);
        let mut sum: i32 = 0;
        for j in 0..QK {
            let q = round_i8(x[j] * id);
            b[4 + j] = q as u8;
            sum += q as i32;
        }
        wr_f16(b, 2, sum as f32 * d);
    }
}

// ---------------------------------------------------------------- with importance matrix

/// Mean of x² over the whole row (ggml's `sigma2` for the legacy types).
fn row_sigma2(x: &[f32]) -> f32 {
    let mut sum_x2 = 0.0f32;
    for &v in x {
        sum_x2 += v * v;
    }
    sum_x2 / x.len() as f32
}

fn block_weights(xb: &[f32], qw: &[f32], sigma2: f32) -> [f32; QK] {
    let mut w = [0.0f32; QK];
    for j in 0..QK {
        w[j] = qw[j] * (sigma2 + xb[j] * xb[j]).sqrt();
    }
    w
}

pub(crate) fn quantize_q4_0(x: &[f32], y: &mut [u8], imatrix: Option<&[f32]>) {
    let Some(qw) = imatrix else {
        return quantize_q4_0_ref(x, y);
    };
    let sigma2 = row_sigma2(x);
    for (ib, b) in y.chunks_exact_mut(18).enumerate() {
        let xb = &x[ib * QK..ib * QK + QK];
        let w = block_weights(xb, &qw[ib * QK..], sigma2);
        let mut l = [0i8; QK];
        let d = make_qx_quants(QK, 8, xb, &mut l, 1, Some(&w));
        wr_f16(b, 0, d);
        for j in 0..16 {
            b[2 + j] = (l[j] as u8) | ((l[j + 16] as u8) << 4);
        }
    }
}

pub(crate) fn quantize_q4_1(x: &[f32], y: &mut [u8], imatrix: Option<&[f32]>) {
    let Some(qw) = imatrix else {
        return quantize_q4_1_ref(x, y);
    };
    let sigma2 = row_sigma2(x);
    for (ib, b) in y.chunks_exact_mut(20).enumerate() {
        let xb = &x[ib * QK..ib * QK + QK];
        let w = block_weights(xb, &qw[ib * QK..], sigma2);
        let mut l = [0u8; QK];
        let (d, min) = make_qkx3_quants(QK, 15, xb, Some(&w), &mut l, -0.9, 0.05, 36, false);
        wr_f16(b, 0, d);
        wr_f16(b, 2, -min);
        for j in 0..16 {
            b[4 + j] = l[j] | (l[j + 16] << 4);
        }
    }
}

pub(crate) fn quantize_q5_0(x: &[f32], y: &mut [u8], imatrix: Option<&[f32]>) {
    let Some(qw) = imatrix else {
        return quantize_q5_0_ref(x, y);
    };
    let sigma2 = row_sigma2(x);
    for (ib, b) in y.chunks_exact_mut(22).enumerate() {
        let xb = &x[ib * QK..ib * QK + QK];
        let w = block_weights(xb, &qw[ib * QK..], sigma2);
        let mut l = [0i8; QK];
        let d = make_qx_quants(QK, 16, xb, &mut l, 1, Some(&w));
        wr_f16(b, 0, d);
        let lu: [u8; 32] = std::array::from_fn(|j| l[j] as u8);
        pack_q5(&lu, b, 2);
    }
}

pub(crate) fn quantize_q5_1(x: &[f32], y: &mut [u8], imatrix: Option<&[f32]>) {
    let Some(qw) = imatrix else {
        return quantize_q5_1_ref(x, y);
    };
    let sigma2 = row_sigma2(x);
    for (ib, b) in y.chunks_exact_mut(24).enumerate() {
        let xb = &x[ib * QK..ib * QK + QK];
        let w = block_weights(xb, &qw[ib * QK..], sigma2);
        let mut l = [0u8; QK];
        let (d, min) = make_qkx3_quants(QK, 31, xb, Some(&w), &mut l, -0.9, 0.05, 36, false);
        wr_f16(b, 0, d);
        wr_f16(b, 2, -min);
        pack_q5(&l, b, 4);
    }
}

/// q8_0 has no importance-weighted variant in ggml: the matrix is ignored.
pub(crate) fn quantize_q8_0(x: &[f32], y: &mut [u8], _imatrix: Option<&[f32]>) {
    quantize_q8_0_ref(x, y)
}
