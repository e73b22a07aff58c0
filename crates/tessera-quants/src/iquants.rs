//! The i-quants: iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m (lattice/grid codes on
//! super-blocks of 256) and the non-linear iq4_nl (block of 32) and iq4_xs (256).
//!
//! Block layouts (little endian, from ggml's `ggml-common.h`). Grids (`iq_grids.rs`) hold 8
//! (or 4) unsigned magnitudes per point, one per byte; signs come separately, as 7 stored bits
//! whose 8th is the parity (`KSIGNS_IQ2XS`) or as plain sign bytes.
//! - iq2_xxs (66 bytes): `d: f16`, `qs: [u16; 32]`. Per 32 elements, two u32 (a0, a1): bytes of
//!   a0 are 4 grid indices (8 elements each), a1 holds 4×7 sign bits and a 4-bit scale s in
//!   bits 28..32: value = d·(0.5 + s)/4 · grid · sign.
//! - iq2_xs (74 bytes): `d: f16`, `qs: [u16; 32]` (9-bit grid index | 7 sign bits << 9),
//!   `scales: [u8; 32/4]` (two 4-bit scales per 32: one per 16 elements); dl = d·(0.5 + s)/4.
//! - iq2_s (82 bytes): `d: f16`, `qs: [u8; 64]` (32 low bytes of 10-bit grid indices, then 32
//!   sign bytes), `qh: [u8; 8]` (the 2 high bits of each index), `scales: [u8; 8]`.
//! - iq3_xxs (98 bytes): `d: f16`, `qs: [u8; 96]`: 64 grid indices (4 elements each) then per
//!   32 elements a u32 of 4×7 sign bits and a 4-bit scale: dl = d·(0.5 + s)/2.
//! - iq3_s (110 bytes): `d: f16`, `qs: [u8; 64]` (low 8 bits of 9-bit indices), `qh: [u8; 8]`
//!   (their 9th bits), `signs: [u8; 32]`, `scales: [u8; 4]` (4-bit, dl = d·(1 + 2s)).
//! - iq1_s (50 bytes): `d: f16`, `qs: [u8; 32]`, `qh: [u16; 8]`. Per 32 elements, qh holds 4×3
//!   high bits of the 11-bit grid indices, a 3-bit scale (bits 12..15) and the sign of a
//!   shift δ = ±1/8 (bit 15): value = d·(2s + 1)·(grid + δ), grid values in {−1, 0, 1}.
//! - iq1_m (56 bytes): `qs: [u8; 32]`, `qh: [u8; 16]` (3 high index bits and a δ sign bit per
//!   8 elements), `scales: [u8; 8]`: four u16 holding 3-bit scales per 16 elements, and in
//!   their top nibbles the 16 bits of the f16 super-scale.
//! - iq4_nl (18 bytes): `d: f16`, `qs: [u8; 16]` (nibbles as q4_0) indexing `KVALUES_IQ4NL`.
//! - iq4_xs (136 bytes): `d: f16`, `scales_h: u16`, `scales_l: [u8; 4]` (6-bit scales per 32,
//!   offset by −32), `qs: [u8; 128]` (nibbles per 32 as iq4_nl).
//!
//! Rewritten from ggml's `ggml-quants.c` (MIT licence, © the ggml authors).

use crate::f16::{f16_to_f32, rd_f16, rd_u16, rd_u32};
use crate::iq_grids::*;

const QK_K: usize = 256;
pub(crate) const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];
const IQ1S_DELTA: f32 = 0.125;

#[inline]
fn grid_byte(g: u64, j: usize) -> u8 {
    (g >> (8 * j)) as u8
}

#[inline]
fn grid_byte32(g: u32, j: usize) -> u8 {
    (g >> (8 * j)) as u8
}

#[inline]
fn sign(signs: u8, j: usize) -> f32 {
    if signs & (1 << j) != 0 {
        -1.0
    } else {
        1.0
    }
}

pub(crate) fn dequantize_iq2_xxs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(66).zip(dst.chunks_exact_mut(QK_K)) {
        let d = rd_f16(b, 0);
        for ib32 in 0..8 {
            let a0 = rd_u32(b, 2 + 8 * ib32);
            let a1 = rd_u32(b, 2 + 8 * ib32 + 4);
            let db = d * (0.5 + (a1 >> 28) as f32) * 0.25;
            for l in 0..4 {
                let g = IQ2XXS_GRID[((a0 >> (8 * l)) & 0xFF) as usize];
                let signs = KSIGNS_IQ2XS[((a1 >> (7 * l)) & 127) as usize];
                let y = &mut y[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8];
                for j in 0..8 {
                    y[j] = db * grid_byte(g, j) as f32 * sign(signs, j);
                }
            }
        }
    }
}

pub(crate) fn dequantize_iq2_xs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(74).zip(dst.chunks_exact_mut(QK_K)) {
        let d = rd_f16(b, 0);
        for ib32 in 0..8 {
            let sc = b[66 + ib32];
            let db = [
                d * (0.5 + (sc & 0xF) as f32) * 0.25,
                d * (0.5 + (sc >> 4) as f32) * 0.25,
            ];
            for l in 0..4 {
                let q = rd_u16(b, 2 + 2 * (4 * ib32 + l));
                let g = IQ2XS_GRID[(q & 511) as usize];
                let signs = KSIGNS_IQ2XS[(q >> 9) as usize];
                let y = &mut y[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8];
                for j in 0..8 {
                    y[j] = db[l / 2] * grid_byte(g, j) as f32 * sign(signs, j);
                }
            }
        }
    }
}

pub(crate) fn dequantize_iq2_s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(82).zip(dst.chunks_exact_mut(QK_K)) {
        let d = rd_f16(b, 0);
        let qs = &b[2..34];
        let signs = &b[34..66];
        let qh = &b[66..74];
        let scales = &b[74..82];
        for ib32 in 0..8 {
            let sc = scales[ib32];
            let db = [
                d * (0.5 + (sc & 0xF) as f32) * 0.25,
                d * (0.5 + (sc >> 4) as f32) * 0.25,
            ];
            for l in 0..4 {
                let dl = db[l / 2];
                let idx =
                    qs[4 * ib32 + l] as usize | (((qh[ib32] as usize) << (8 - 2 * l)) & 0x300);
                let g = IQ2S_GRID[idx];
                let s = signs[4 * ib32 + l];
                let y = &mut y[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8];
                for j in 0..8 {
                    y[j] = dl * grid_byte(g, j) as f32 * sign(s, j);
                }
            }
        }
    }
}

pub(crate) fn dequantize_iq3_xxs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(98).zip(dst.chunks_exact_mut(QK_K)) {
        let d = rd_f16(b, 0);
        let qs = &b[2..66];
        for ib32 in 0..8 {
            let aux = rd_u32(b, 66 + 4 * ib32);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
            for l in 0..4 {
                let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                let g1 = IQ3XXS_GRID[qs[8 * ib32 + 2 * l] as usize];
                let g2 = IQ3XXS_GRID[qs[8 * ib32 + 2 * l + 1] as usize];
                let y = &mut y[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8];
                for j in 0..4 {
                    y[j] = db * grid_byte32(g1, j) as f32 * sign(signs, j);
                    y[j + 4] = db * grid_byte32(g2, j) as f32 * sign(signs, j + 4);
                }
            }
        }
    }
}

pub(crate) fn dequantize_iq3_s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(110).zip(dst.chunks_exact_mut(QK_K)) {
        let d = rd_f16(b, 0);
        let qs = &b[2..66];
        let qh = &b[66..74];
        let signs = &b[74..106];
        let scales = &b[106..110];
        for ib32 in 0..8 {
            let sc = scales[ib32 / 2];
            let s = if ib32 % 2 == 0 { sc & 0xF } else { sc >> 4 };
            let db = d * (1 + 2 * s as i32) as f32;
            let h = qh[ib32] as usize;
            for l in 0..4 {
                let i1 = qs[8 * ib32 + 2 * l] as usize | ((h << (8 - 2 * l)) & 256);
                let i2 = qs[8 * ib32 + 2 * l + 1] as usize | ((h << (7 - 2 * l)) & 256);
                let (g1, g2) = (IQ3S_GRID[i1], IQ3S_GRID[i2]);
                let sg = signs[4 * ib32 + l];
                let y = &mut y[32 * ib32 + 8 * l..32 * ib32 + 8 * l + 8];
                for j in 0..4 {
                    y[j] = db * grid_byte32(g1, j) as f32 * sign(sg, j);
                    y[j + 4] = db * grid_byte32(g2, j) as f32 * sign(sg, j + 4);
                }
            }
        }
    }
}

pub(crate) fn dequantize_iq1_s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(50).zip(dst.chunks_exact_mut(QK_K)) {
        let d = rd_f16(b, 0);
        let qs = &b[2..34];
        for ib in 0..8 {
            let qh = rd_u16(b, 34 + 2 * ib);
            let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
            let delta = if qh & 0x8000 != 0 {
                -IQ1S_DELTA
            } else {
                IQ1S_DELTA
            };
            for l in 0..4 {
                let idx = qs[4 * ib + l] as usize | ((((qh >> (3 * l)) & 7) as usize) << 8);
                let g = IQ1S_GRID[idx];
                let y = &mut y[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                for j in 0..8 {
                    y[j] = dl * (grid_byte(g, j) as i8 as f32 + delta);
                }
            }
        }
    }
}

pub(crate) fn dequantize_iq1_m(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(56).zip(dst.chunks_exact_mut(QK_K)) {
        let qs = &b[0..32];
        let qh = &b[32..48];
        let sc: [u16; 4] = std::array::from_fn(|i| rd_u16(b, 48 + 2 * i));
        let scale =
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000);
        let d = f16_to_f32(scale);
        for ib in 0..8 {
            let s = sc[ib / 2] >> (6 * (ib % 2));
            let dl1 = d * (2 * (s & 7) + 1) as f32;
            let dl2 = d * (2 * ((s >> 3) & 7) + 1) as f32;
            let (h0, h1) = (qh[2 * ib] as usize, qh[2 * ib + 1] as usize);
            let q = &qs[4 * ib..4 * ib + 4];
            let idx = [
                q[0] as usize | ((h0 << 8) & 0x700),
                q[1] as usize | ((h0 << 4) & 0x700),
                q[2] as usize | ((h1 << 8) & 0x700),
                q[3] as usize | ((h1 << 4) & 0x700),
            ];
            let delta = [
                if h0 & 0x08 != 0 {
                    -IQ1S_DELTA
                } else {
                    IQ1S_DELTA
                },
                if h0 & 0x80 != 0 {
                    -IQ1S_DELTA
                } else {
                    IQ1S_DELTA
                },
                if h1 & 0x08 != 0 {
                    -IQ1S_DELTA
                } else {
                    IQ1S_DELTA
                },
                if h1 & 0x80 != 0 {
                    -IQ1S_DELTA
                } else {
                    IQ1S_DELTA
                },
            ];
            for l in 0..4 {
                let dl = if l < 2 { dl1 } else { dl2 };
                let g = IQ1S_GRID[idx[l]];
                let y = &mut y[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                for j in 0..8 {
                    y[j] = dl * (grid_byte(g, j) as i8 as f32 + delta[l]);
                }
            }
        }
    }
}

pub(crate) fn dequantize_iq4_nl(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(18).zip(dst.chunks_exact_mut(32)) {
        let d = rd_f16(b, 0);
        for j in 0..16 {
            let q = b[2 + j];
            y[j] = d * KVALUES_IQ4NL[(q & 0xF) as usize] as f32;
            y[j + 16] = d * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
        }
    }
}

pub(crate) fn dequantize_iq4_xs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(136).zip(dst.chunks_exact_mut(QK_K)) {
        let d = rd_f16(b, 0);
        let scales_h = rd_u16(b, 2);
        for ib in 0..8 {
            let ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) as i32
                | ((((scales_h >> (2 * ib)) & 3) as i32) << 4);
            let dl = d * (ls - 32) as f32;
            let qs = &b[8 + 16 * ib..8 + 16 * ib + 16];
            let y = &mut y[32 * ib..32 * ib + 32];
            for j in 0..16 {
                y[j] = dl * KVALUES_IQ4NL[(qs[j] & 0xF) as usize] as f32;
                y[j + 16] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
            }
        }
    }
}
