//! The k-quants: q2_K, q3_K, q4_K, q5_K, q6_K (super-blocks of 256) and q8_K (the activation
//! format of their dot products).
//!
//! Block layouts (little endian, from ggml's `ggml-common.h`, QK_K = 256):
//! - q2_K (84 bytes): `scales: [u8; 16]` (low nibble: scale, high nibble: min of each group of
//!   16), `qs: [u8; 64]` (2-bit quants), `d: f16`, `dmin: f16`. In each half of 128 elements,
//!   byte l of the half's 32 bytes holds elements l, l+32, l+64, l+96 in bits 0-1, 2-3, 4-5,
//!   6-7. value = d·sc·q − dmin·m.
//! - q3_K (110 bytes): `hmask: [u8; 32]` (high bits), `qs: [u8; 64]` (low 2 bits, arranged as q2_K), `scales: [u8; 12]` (16 six-bit scales:
//!   low 4 bits in bytes 0-7 (nibbles), high 2 bits in bytes 8-11), `d: f16`.
//!   The high bit of element j is bit (j / 32) of hmask[j % 32]; value = d·(sc − 32)·(q − 4·!h).
//! - q4_K (144 bytes): `d: f16`, `dmin: f16`, `scales: [u8; 12]` (8 six-bit scales and 8
//!   six-bit mins, see `get_scale_min_k4`), `qs: [u8; 128]` (per 64 elements, 32 bytes: low
//!   nibbles the first 32, high nibbles the next 32). value = d·sc·q − dmin·m.
//! - q5_K (176 bytes): as q4_K with `qh: [u8; 32]` before `qs`: the 5th bit of element j of
//!   each 64-element chunk c is bit 2c (j < 32) or 2c+1 of qh[j % 32].
//! - q6_K (210 bytes): `ql: [u8; 128]` (low 4 bits), `qh: [u8; 64]` (high 2 bits),
//!   `scales: [i8; 16]`, `d: f16`; value = d·sc·(q − 32).
//! - q8_K (292 bytes): `d: f32`, `qs: [i8; 256]`, `bsums: [i16; 16]` (sums of 16 quants).
//!
//! Rewritten from ggml's `ggml-quants.c` (MIT licence, © the ggml authors).

use crate::common::{
    make_q3_quants, make_qkx2_quants, make_qkx3_quants, make_qp_quants, make_qx_quants,
    GROUP_MAX_EPS,
};
use crate::f16::{f32_to_f16, nearest_int, rd_f16, wr_f16, wr_u16};

const QK_K: usize = 256;

// ---------------------------------------------------------------- dequantization

pub(crate) fn dequantize_q2_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(84).zip(dst.chunks_exact_mut(QK_K)) {
        let scales = &b[0..16];
        let qs = &b[16..80];
        let d = rd_f16(b, 80);
        let min = rd_f16(b, 82);
        let mut is = 0;
        let mut yi = 0;
        for half in 0..2 {
            let q = &qs[32 * half..32 * half + 32];
            for shift in [0, 2, 4, 6] {
                for part in 0..2 {
                    let sc = scales[is];
                    is += 1;
                    let dl = d * (sc & 0xF) as f32;
                    let ml = min * (sc >> 4) as f32;
                    for l in 0..16 {
                        y[yi] = dl * ((q[l + 16 * part] >> shift) & 3) as f32 - ml;
                        yi += 1;
                    }
                }
            }
        }
    }
}

/// The 16 six-bit scales of a q3_K block (0..=63, to be offset by −32).
fn q3_k_scale(scales: &[u8], j: usize) -> i32 {
    let lo = if j < 8 {
        scales[j] & 0xF
    } else {
        scales[j - 8] >> 4
    };
    let hi = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    (lo | (hi << 4)) as i32
}

pub(crate) fn dequantize_q3_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(110).zip(dst.chunks_exact_mut(QK_K)) {
        let hm = &b[0..32];
        let qs = &b[32..96];
        let scales = &b[96..108];
        let d_all = rd_f16(b, 108);
        let mut m: u8 = 1;
        let mut is = 0;
        let mut yi = 0;
        for half in 0..2 {
            let q = &qs[32 * half..32 * half + 32];
            for shift in [0, 2, 4, 6] {
                for part in 0..2 {
                    let dl = d_all * (q3_k_scale(scales, is) - 32) as f32;
                    is += 1;
                    for l in 0..16 {
                        let k = l + 16 * part;
                        let low = ((q[k] >> shift) & 3) as i32;
                        let sub = if hm[k] & m != 0 { 0 } else { 4 };
                        y[yi] = dl * (low - sub) as f32;
                        yi += 1;
                    }
                }
                m <<= 1;
            }
        }
    }
}

/// Scale and min `j` (0..8) of a q4_K / q5_K block's 12 packed bytes.
pub(crate) fn get_scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

pub(crate) fn dequantize_q4_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(144).zip(dst.chunks_exact_mut(QK_K)) {
        let d = rd_f16(b, 0);
        let min = rd_f16(b, 2);
        let scales = &b[4..16];
        let qs = &b[16..144];
        for c in 0..4 {
            let q = &qs[32 * c..32 * c + 32];
            let (sc1, m1) = get_scale_min_k4(2 * c, scales);
            let (sc2, m2) = get_scale_min_k4(2 * c + 1, scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            let y = &mut y[64 * c..64 * c + 64];
            for l in 0..32 {
                y[l] = d1 * (q[l] & 0xF) as f32 - m1;
                y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

pub(crate) fn dequantize_q5_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(176).zip(dst.chunks_exact_mut(QK_K)) {
        let d = rd_f16(b, 0);
        let min = rd_f16(b, 2);
        let scales = &b[4..16];
        let qh = &b[16..48];
        let qs = &b[48..176];
        for c in 0..4 {
            let ql = &qs[32 * c..32 * c + 32];
            let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
            let (sc1, m1) = get_scale_min_k4(2 * c, scales);
            let (sc2, m2) = get_scale_min_k4(2 * c + 1, scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            let y = &mut y[64 * c..64 * c + 64];
            for l in 0..32 {
                let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
                y[l] = d1 * ((ql[l] & 0xF) as i32 + h1) as f32 - m1;
                y[l + 32] = d2 * ((ql[l] >> 4) as i32 + h2) as f32 - m2;
            }
        }
    }
}

pub(crate) fn dequantize_q6_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(210).zip(dst.chunks_exact_mut(QK_K)) {
        let d = rd_f16(b, 208);
        for half in 0..2 {
            let ql = &b[64 * half..64 * half + 64];
            let qh = &b[128 + 32 * half..128 + 32 * half + 32];
            let sc = &b[192 + 8 * half..192 + 8 * half + 8];
            let y = &mut y[128 * half..128 * half + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
            }
        }
    }
}

pub(crate) fn dequantize_q8_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(292).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        for j in 0..QK_K {
            y[j] = d * (b[4 + j] as i8) as f32;
        }
    }
}

// ---------------------------------------------------------------- packing helpers

/// Packs 256 two-bit values as q2_K / q3_K do (per 128: byte l = l, l+32, l+64, l+96).
fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8]) {
    for j in (0..QK_K).step_by(128) {
        for k in 0..32 {
            qs[j / 4 + k] =
                l[j + k] | (l[j + k + 32] << 2) | (l[j + k + 64] << 4) | (l[j + k + 96] << 6);
        }
    }
}

/// Packs 8 six-bit scales and 8 six-bit mins into q4_K / q5_K's 12 bytes.
fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8], s: &mut [u8]) {
    for j in 0..8 {
        if j < 4 {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            s[j - 4] |= (ls[j] >> 4) << 6;
            s[j] |= (lm[j] >> 4) << 6;
        }
    }
}

/// Packs 16 six-bit q3_K scales (0..=63).
fn pack_q3_k_scales(ls: &[i32; 16], s: &mut [u8]) {
    s[..12].fill(0);
    for (j, &l) in ls.iter().enumerate() {
        if j < 8 {
            s[j] = (l & 0xF) as u8;
        } else {
            s[j - 8] |= ((l & 0xF) << 4) as u8;
        }
        let hi = l >> 4;
        s[j % 4 + 8] |= (hi << (2 * (j / 4))) as u8;
    }
}

/// Splits q3_K's 3-bit values into the high-bit mask and the low 2 bits.
fn pack_q3_k_quants(l: &mut [u8; QK_K], b: &mut [u8]) {
    b[0..32].fill(0);
    let mut m = 0;
    let mut hm: u8 = 1;
    for j in 0..QK_K {
        if l[j] > 3 {
            b[m] |= hm;
            l[j] -= 4;
        }
        m += 1;
        if m == QK_K / 8 {
            m = 0;
            hm <<= 1;
        }
    }
    pack_2bit(l, &mut b[32..96]);
}

fn pack_q5_k_quants(l: &[u8; QK_K], qh: &mut [u8], ql: &mut [u8]) {
    qh[..32].fill(0);
    let (mut m1, mut m2) = (1u8, 2u8);
    for c in 0..4 {
        let n = 64 * c;
        for j in 0..32 {
            let mut l1 = l[n + j];
            if l1 > 15 {
                l1 -= 16;
                qh[j] |= m1;
            }
            let mut l2 = l[n + j + 32];
            if l2 > 15 {
                l2 -= 16;
                qh[j] |= m2;
            }
            ql[32 * c + j] = l1 | (l2 << 4);
        }
        m1 <<= 2;
        m2 <<= 2;
    }
}

fn pack_q6_k_quants(l: &[u8; QK_K], b: &mut [u8]) {
    for half in 0..2 {
        let j = 128 * half;
        for k in 0..32 {
            let q1 = l[j + k] & 0xF;
            let q2 = l[j + k + 32] & 0xF;
            let q3 = l[j + k + 64] & 0xF;
            let q4 = l[j + k + 96] & 0xF;
            b[64 * half + k] = q1 | (q3 << 4);
            b[64 * half + k + 32] = q2 | (q4 << 4);
            b[128 + 32 * half + k] = (l[j + k] >> 4)
                | ((l[j + k + 32] >> 4) << 2)
                | ((l[j + k + 64] >> 4) << 4)
                | ((l[j + k + 96] >> 4) << 6);
        }
    }
}

// ---------------------------------------------------------------- q2_K

fn quantize_q2_k_ref(x: &[f32], y: &mut [u8]) {
    const Q4SCALE: f32 = 15.0;
    for (x, b) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(84)) {
        let mut l = [0u8; QK_K];
        let mut mins = [0.0f32; 16];
        let mut scales = [0.0f32; 16];
        let mut max_scale = 0.0f32;
        let mut max_min = 0.0f32;
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            let weights: [f32; 16] = std::array::from_fn(|i| xs[i].abs());
            let (s, m) =
                make_qkx2_quants(16, 3, xs, &weights, &mut l[16 * j..], -0.5, 0.1, 15, true);
            scales[j] = s;
            mins[j] = m;
            if s > max_scale {
                max_scale = s;
            }
            if m > max_min {
                max_min = m;
            }
        }
        let mut sc = [0u8; 16];
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for j in 0..16 {
                sc[j] = nearest_int(iscale * scales[j]) as u8;
            }
            wr_f16(b, 80, max_scale / Q4SCALE);
        } else {
            wr_f16(b, 80, 0.0);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for j in 0..16 {
                let lm = nearest_int(iscale * mins[j]);
                sc[j] |= (lm << 4) as u8;
            }
            wr_f16(b, 82, max_min / Q4SCALE);
        } else {
            wr_f16(b, 82, 0.0);
        }
        b[0..16].copy_from_slice(&sc);
        let dd = rd_f16(b, 80);
        let dmin = rd_f16(b, 82);
        for j in 0..16 {
            let d = dd * (sc[j] & 0xF) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = dmin * (sc[j] >> 4) as f32;
            for ii in 0..16 {
                let q = nearest_int((x[16 * j + ii] + dm) / d);
                l[16 * j + ii] = q.clamp(0, 3) as u8;
            }
        }
        pack_2bit(&l, &mut b[16..80]);
    }
}

fn quantize_q2_k_impl(x: &[f32], y: &mut [u8], qw_row: &[f32]) {
    for (ib, (x, b)) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(84)).enumerate() {
        let mut l = [0u8; QK_K];
        let mut mins = [0.0f32; 16];
        let mut scales = [0.0f32; 16];
        let mut sw = [0.0f32; 16];
        let mut sumx2 = 0.0f32;
        for &v in x {
            sumx2 += v * v;
        }
        let sigma2 = sumx2 / QK_K as f32;
        for j in 0..16 {
            let qw = &qw_row[QK_K * ib + 16 * j..];
            let xs = &x[16 * j..16 * j + 16];
            let weight: [f32; 16] =
                std::array::from_fn(|i| qw[i] * (sigma2 + xs[i] * xs[i]).sqrt());
            for w in weight {
                sw[j] += w;
            }
            let (s, m) = make_qkx3_quants(
                16,
                3,
                xs,
                Some(&weight),
                &mut l[16 * j..],
                -0.9,
                0.05,
                36,
                false,
            );
            scales[j] = s;
            mins[j] = m;
        }
        let mut ls = [0u8; 16];
        let mut lm = [0u8; 16];
        let dm = make_qp_quants(16, 15, &scales, &mut ls, &sw);
        let mm = make_qp_quants(16, 15, &mins, &mut lm, &sw);
        wr_f16(b, 80, dm);
        wr_f16(b, 82, mm);
        let dm = rd_f16(b, 80);
        let mm = rd_f16(b, 82);
        for j in 0..16 {
            b[j] = ls[j] | (lm[j] << 4);
        }
        for j in 0..16 {
            let d = dm * (b[j] & 0xF) as f32;
            if d == 0.0 {
                continue;
            }
            let m = mm * (b[j] >> 4) as f32;
            for ii in 0..16 {
                let q = nearest_int((x[16 * j + ii] + m) / d);
                l[16 * j + ii] = q.clamp(0, 3) as u8;
            }
        }
        pack_2bit(&l, &mut b[16..80]);
    }
}

pub(crate) fn quantize_q2_k(x: &[f32], y: &mut [u8], imatrix: Option<&[f32]>) {
    match imatrix {
        Some(qw) => quantize_q2_k_impl(x, y, qw),
        None => quantize_q2_k_ref(x, y),
    }
}

// ---------------------------------------------------------------- q3_K

/// Requantizes with the stored (f16) super-scale and the packed scales, then packs the quants.
fn finish_q3_k(x: &[f32], b: &mut [u8], l: &mut [i8; QK_K]) {
    let d_all = rd_f16(b, 108);
    for j in 0..16 {
        let sc = q3_k_scale(&b[96..108], j) as i8 as i32 - 32;
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let q = nearest_int(x[16 * j + ii] / d).clamp(-4, 3);
            l[16 * j + ii] = (q + 4) as i8;
        }
    }
    let mut lu: [u8; QK_K] = std::array::from_fn(|i| l[i] as u8);
    pack_q3_k_quants(&mut lu, b);
}

fn quantize_q3_k_ref(x: &[f32], y: &mut [u8]) {
    for (x, b) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(110)) {
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; 16];
        let mut max_scale = 0.0f32;
        let mut amax = 0.0f32;
        for j in 0..16 {
            scales[j] = make_q3_quants(16, 4, &x[16 * j..], &mut l[16 * j..], true);
            let scale = scales[j].abs();
            if scale > amax {
                amax = scale;
                max_scale = scales[j];
            }
        }
        if max_scale != 0.0 {
            let iscale = -32.0f32 / max_scale;
            let mut ls = [0i32; 16];
            for j in 0..16 {
                // C: int8_t l = nearest_int(...); l = MAX(-32, MIN(31, l)) + 32;
                let v = nearest_int(iscale * scales[j]) as i8 as i32;
                ls[j] = v.clamp(-32, 31) + 32;
            }
            pack_q3_k_scales(&ls, &mut b[96..108]);
            wr_f16(b, 108, 1.0 / iscale);
        } else {
            b[96..108].fill(0);
            wr_f16(b, 108, 0.0);
        }
        finish_q3_k(x, b, &mut l);
    }
}

fn quantize_q3_k_impl(x: &[f32], y: &mut [u8], qw_row: &[f32]) {
    for (ib, (x, b)) in x
        .chunks_exact(QK_K)
        .zip(y.chunks_exact_mut(110))
        .enumerate()
    {
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; 16];
        let mut sw = [0.0f32; 16];
        let mut sumx2 = 0.0f32;
        for &v in x {
            sumx2 += v * v;
        }
        let sigma2 = 2.0 * sumx2 / QK_K as f32;
        for j in 0..16 {
            let qw = &qw_row[QK_K * ib + 16 * j..];
            let xs = &x[16 * j..16 * j + 16];
            let weight: [f32; 16] =
                std::array::from_fn(|i| qw[i] * (sigma2 + xs[i] * xs[i]).sqrt());
            let mut sumw = 0.0f32;
            for w in weight {
                sumw += w;
            }
            sw[j] = sumw;
            scales[j] = make_qx_quants(16, 4, xs, &mut l[16 * j..], 1, Some(&weight));
        }
        let mut ls8 = [0i8; 16];
        let d_block = make_qx_quants(16, 32, &scales, &mut ls8, 1, Some(&sw));
        let ls: [i32; 16] = std::array::from_fn(|j| ls8[j] as i32);
        pack_q3_k_scales(&ls, &mut b[96..108]);
        wr_f16(b, 108, d_block);
        finish_q3_k(x, b, &mut l);
    }
}

pub(crate) fn quantize_q3_k(x: &[f32], y: &mut [u8], imatrix: Option<&[f32]>) {
    match imatrix {
        Some(qw) => quantize_q3_k_impl(x, y, qw),
        None => quantize_q3_k_ref(x, y),
    }
}

// ---------------------------------------------------------------- q4_K / q5_K

/// Shared tail of q4_K / q5_K: requantize every group of 32 with the stored scales.
fn requantize_k4(x: &[f32], b: &[u8], l: &mut [u8; QK_K], nmax: i32) {
    let d_all = rd_f16(b, 0);
    let dmin = rd_f16(b, 2);
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, &b[4..16]);
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin * m as f32;
        for ii in 0..32 {
            let q = nearest_int((x[32 * j + ii] + dm) / d);
            l[32 * j + ii] = q.clamp(0, nmax) as u8;
        }
    }
}

/// The reference (no importance) scale search of q4_K (nmax 15) and q5_K (nmax 31).
fn scales_k4_ref(x: &[f32], b: &mut [u8], l: &mut [u8; QK_K], nmax: i32, rmin: f32, nstep: i32) {
    let mut mins = [0.0f32; 8];
    let mut scales = [0.0f32; 8];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|i| av_x + xs[i].abs());
        let (s, m) = make_qkx2_quants(
            32,
            nmax,
            xs,
            &weights,
            &mut l[32 * j..],
            rmin,
            0.1,
            nstep,
            false,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..8 {
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    pack_scale_min_k4(&ls, &lm, &mut b[4..16]);
    wr_f16(b, 0, max_scale / 63.0);
    wr_f16(b, 2, max_min / 63.0);
}

/// The importance-weighted scale search of q4_K and q5_K.
fn scales_k4_impl(x: &[f32], b: &mut [u8], l: &mut [u8; QK_K], nmax: i32, qw: &[f32]) {
    let mut sum_x2 = 0.0f32;
    for &v in x {
        sum_x2 += v * v;
    }
    let sigma2 = 2.0 * sum_x2 / QK_K as f32;
    let mut mins = [0.0f32; 8];
    let mut scales = [0.0f32; 8];
    let mut sw = [0.0f32; 8];
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let q = &qw[32 * j..];
        let weights: [f32; 32] = std::array::from_fn(|i| q[i] * (sigma2 + xs[i] * xs[i]).sqrt());
        let mut sumw = 0.0f32;
        for w in weights {
            sumw += w;
        }
        sw[j] = sumw;
        let (s, m) = make_qkx3_quants(
            32,
            nmax,
            xs,
            Some(&weights),
            &mut l[32 * j..],
            -0.9,
            0.05,
            36,
            false,
        );
        scales[j] = s;
        mins[j] = m;
    }
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    let d_block = make_qp_quants(8, 63, &scales, &mut ls, &sw);
    let m_block = make_qp_quants(8, 63, &mins, &mut lm, &sw);
    for j in 0..8 {
        ls[j] = ls[j].min(63);
        lm[j] = lm[j].min(63);
    }
    pack_scale_min_k4(&ls, &lm, &mut b[4..16]);
    wr_f16(b, 0, d_block);
    wr_f16(b, 2, m_block);
}

pub(crate) fn quantize_q4_k(x: &[f32], y: &mut [u8], imatrix: Option<&[f32]>) {
    for (ib, (x, b)) in x
        .chunks_exact(QK_K)
        .zip(y.chunks_exact_mut(144))
        .enumerate()
    {
        let mut l = [0u8; QK_K];
        match imatrix {
            Some(qw) => scales_k4_impl(x, b, &mut l, 15, &qw[QK_K * ib..]),
            None => scales_k4_ref(x, b, &mut l, 15, -1.0, 20),
        }
        requantize_k4(x, b, &mut l, 15);
        for c in 0..4 {
            for k in 0..32 {
                b[16 + 32 * c + k] = l[64 * c + k] | (l[64 * c + k + 32] << 4);
            }
        }
    }
}

pub(crate) fn quantize_q5_k(x: &[f32], y: &mut [u8], imatrix: Option<&[f32]>) {
    for (ib, (x, b)) in x
        .chunks_exact(QK_K)
        .zip(y.chunks_exact_mut(176))
        .enumerate()
    {
        let mut l = [0u8; QK_K];
        match imatrix {
            Some(qw) => scales_k4_impl(x, b, &mut l, 31, &qw[QK_K * ib..]),
            None => scales_k4_ref(x, b, &mut l, 31, -0.5, 15),
        }
        requantize_k4(x, b, &mut l, 31);
        let (qh, ql) = b[16..176].split_at_mut(32);
        pack_q5_k_quants(&l, qh, ql);
    }
}

// ---------------------------------------------------------------- q6_K

pub(crate) fn quantize_q6_k(x: &[f32], y: &mut [u8], imatrix: Option<&[f32]>) {
    for (ib, (x, b)) in x
        .chunks_exact(QK_K)
        .zip(y.chunks_exact_mut(210))
        .enumerate()
    {
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; 16];
        let mut max_scale = 0.0f32;
        let mut max_abs_scale = 0.0f32;
        for j in 0..16 {
            let qw = imatrix.map(|w| &w[QK_K * ib + 16 * j..QK_K * ib + 16 * j + 16]);
            let scale = make_qx_quants(16, 32, &x[16 * j..], &mut l[16 * j..], 1, qw);
            scales[j] = scale;
            let abs_scale = scale.abs();
            if abs_scale > max_abs_scale {
                max_abs_scale = abs_scale;
                max_scale = scale;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            b.fill(0);
            wr_u16(b, 208, f32_to_f16(0.0));
            continue;
        }
        let iscale = -128.0f32 / max_scale;
        wr_f16(b, 208, 1.0 / iscale);
        for j in 0..16 {
            b[192 + j] = nearest_int(iscale * scales[j]).min(127) as i8 as u8;
        }
        let d_all = rd_f16(b, 208);
        for j in 0..16 {
            let d = d_all * (b[192 + j] as i8) as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
                l[16 * j + ii] = (q + 32) as i8;
            }
        }
        let lu: [u8; QK_K] = std::array::from_fn(|i| l[i] as u8);
        pack_q6_k_quants(&lu, b);
    }
}

// ---------------------------------------------------------------- q8_K

pub(crate) fn quantize_q8_k(x: &[f32], y: &mut [u8], _imatrix: Option<&[f32]>) {
    for (x, b) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(292)) {
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &v in x {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        if amax == 0.0 {
            // ggml sets d and qs to zero and leaves bsums as they were; we zero them too.
            b.fill(0);
            continue;
        }
        let iscale = -127.0f32 / max;
        for j in 0..QK_K {
            let v = nearest_int(iscale * x[j]);
            b[4 + j] = v.min(127) as i8 as u8;
        }
        for j in 0..16 {
            let mut sum: i32 = 0;
            for ii in 0..16 {
                sum += (b[4 + 16 * j + ii] as i8) as i32;
            }
            b[260 + 2 * j..262 + 2 * j].copy_from_slice(&(sum as i16).to_le_bytes());
        }
        b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}
