//! Ternary formats for BitNet b1.58 / TriLM weights: tq1_0 and tq2_0 (super-blocks of 256).
//!
//! Block layouts (little endian, from ggml's `ggml-common.h`):
//! - tq1_0 (54 bytes): `qs: [u8; 48]`, `qh: [u8; 4]`, `d: f16`. Values are trits t ∈ {0,1,2}
//!   (= −1, 0, +1 times d). A byte holds 5 trits (4 for qh) as a fixed-point fraction: the
//!   byte is ⌈(Σ tₖ·3^(4−k))·256/243⌉, and trit n is ⌊((byte·3ⁿ) mod 256)·3 / 256⌋.
//!   Elements 0..160: trit n of qs[m] (m < 32) is element 32n + m; elements 160..240: trit n of
//!   qs[32 + m] (m < 16) is element 160 + 16n + m; elements 240..256: trit n of qh[j] is element
//!   240 + 4n + j.
//! - tq2_0 (66 bytes): `qs: [u8; 64]`, `d: f16`; 2 bits per element: in each 32-byte half,
//!   bits 2l..2l+1 of byte m are element 128·half + 32l + m, value (q − 1)·d.
//!
//! Rewritten from ggml's `ggml-quants.c` (MIT licence, © the ggml authors).

use crate::common::c_max;
use crate::f16::{rd_f16, wr_f16};

const QK_K: usize = 256;
const POW3: [u8; 6] = [1, 3, 9, 27, 81, 243];

#[inline]
fn trit(byte: u8, n: usize) -> i32 {
    let q = byte.wrapping_mul(POW3[n]);
    ((q as u16 * 3) >> 8) as i32
}

pub(crate) fn dequantize_tq1_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(54).zip(dst.chunks_exact_mut(QK_K)) {
        let d = rd_f16(b, 52);
        let mut yi = 0;
        for n in 0..5 {
            for m in 0..32 {
                y[yi] = (trit(b[m], n) - 1) as f32 * d;
                yi += 1;
            }
        }
        for n in 0..5 {
            for m in 0..16 {
                y[yi] = (trit(b[32 + m], n) - 1) as f32 * d;
                yi += 1;
            }
        }
        for n in 0..4 {
            for j in 0..4 {
                y[yi] = (trit(b[48 + j], n) - 1) as f32 * d;
                yi += 1;
            }
        }
    }
}

pub(crate) fn dequantize_tq2_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(66).zip(dst.chunks_exact_mut(QK_K)) {
        let d = rd_f16(b, 64);
        let mut yi = 0;
        for j in (0..64).step_by(32) {
            for l in 0..4 {
                for m in 0..32 {
                    let q = ((b[j + m] >> (2 * l)) & 3) as i32;
                    y[yi] = (q - 1) as f32 * d;
                    yi += 1;
                }
            }
        }
    }
}

/// Absolute maximum and its inverse (0 for an all-zero block).
fn scale_of(x: &[f32]) -> (f32, f32) {
    let amax = x.iter().fold(0.0f32, |a, v| c_max(a, v.abs()));
    let id = if amax != 0.0 { 1.0 / amax } else { 0.0 };
    (amax, id)
}

/// C's `int xi = lroundf(x·id) + 1` (0, 1 or 2 for sane input). Out of range, glibc's
/// `lroundf` gives `LONG_MIN` on x86-64 and the sum is truncated to an int; kept so that even
/// non-finite input gives ggml's bytes rather than a panic.
#[inline]
fn tern(v: f32, id: f32) -> i32 {
    let r = (v * id).round();
    let l: i64 = if r.is_nan() || !(-9.223_372e18..9.223_372e18).contains(&r) {
        i64::MIN
    } else {
        r as i64
    };
    l.wrapping_add(1) as i32
}

/// Packs 5 (or 4 then ×3) trits into a byte as ggml does: ceiling of q·256/243.
#[inline]
fn pack_trits(q: u8) -> u8 {
    (q as u16 * 256).div_ceil(243) as u8
}

pub(crate) fn quantize_tq1_0(x: &[f32], y: &mut [u8], _imatrix: Option<&[f32]>) {
    for (x, b) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(54)) {
        let (d, id) = scale_of(x);
        wr_f16(b, 52, d);
        for m in 0..32 {
            let mut q: u8 = 0;
            for n in 0..5 {
                q = q
                    .wrapping_mul(3)
                    .wrapping_add(tern(x[m + 32 * n], id) as u8);
            }
            b[m] = pack_trits(q);
        }
        let x2 = &x[160..];
        for m in 0..16 {
            let mut q: u8 = 0;
            for n in 0..5 {
                q = q
                    .wrapping_mul(3)
                    .wrapping_add(tern(x2[m + 16 * n], id) as u8);
            }
            b[32 + m] = pack_trits(q);
        }
        let x3 = &x[240..];
        for j in 0..4 {
            let mut q: u8 = 0;
            for m in 0..4 {
                q = q
                    .wrapping_mul(3)
                    .wrapping_add(tern(x3[j + 4 * m], id) as u8);
            }
            q = q.wrapping_mul(3);
            b[48 + j] = pack_trits(q);
        }
    }
}

pub(crate) fn quantize_tq2_0(x: &[f32], y: &mut [u8], _imatrix: Option<&[f32]>) {
    for (x, b) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(66)) {
        let (d, id) = scale_of(x);
        wr_f16(b, 64, d);
        for j in (0..64).step_by(32) {
            let xs = &x[4 * j..];
            for m in 0..32 {
                let mut q: u8 = 0;
                for n in 0..4 {
                    let xi = tern(xs[m + 32 * n], id);
                    q = q.wrapping_add(((xi & 3) << (2 * n)) as u8);
                }
                b[j + m] = q;
            }
        }
    }
}
