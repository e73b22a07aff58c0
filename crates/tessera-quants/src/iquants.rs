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
//! Quantizers follow ggml's searches: signs are split off, magnitudes are quantized to levels
//! l (values 2l + 1) over a range of trial scales, points that fall off the grid are replaced
//! by their best neighbour from precomputed neighbour lists (built here at first use exactly as
//! ggml's `iq2xs_init_impl` / `iq3xs_init_impl` build them), and the block scales are then
//! quantized against the super-block scale. iq1_s / iq1_m solve the 3-level split exactly
//! over the sorted values. Every fudge factor and quirk of ggml is kept, because the bytes
//! must be identical.
//!
//! Rewritten from ggml's `ggml-quants.c` (MIT licence, © the ggml authors).

use crate::common::{c_max, make_qp_quants, GROUP_MAX_EPS};
use crate::f16::{f16_to_f32, f32_to_f16, nearest_int, rd_f16, rd_u16, rd_u32, wr_f16, wr_u16};
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

// ================================================================ quantizers

/// ggml's `best_index_int8`: index of the table value nearest to `x` (table sorted ascending;
/// on a tie the upper one).
fn best_index_int8(val: &[i8; 16], x: f32) -> usize {
    if x <= val[0] as f32 {
        return 0;
    }
    if x >= val[15] as f32 {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < val[mav] as f32 {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - (val[mu - 1] as f32) < val[mu] as f32 - x {
        mu - 1
    } else {
        mu
    }
}

/// ggml's `quantize_row_iq4_nl_impl` for one super-block of `n` (32 for iq4_nl, 256 for
/// iq4_xs) in blocks of 32. Writes the f16 scale at `b[0..2]`, the packed nibbles at
/// `b[q4_off..]` and, when there are several blocks, the 6-bit block scales at `b[2..8]`.
fn quantize_iq4_superblock(x: &[f32], b: &mut [u8], q4_off: usize, qw: Option<&[f32]>, ntry: i32) {
    let n = x.len();
    let values = &KVALUES_IQ4NL;
    let mut l_all = [0u8; QK_K];
    let mut scales = [0.0f32; QK_K / 32];
    let mut sigma2 = 0.0f32;
    for &v in x {
        sigma2 += v * v;
    }
    sigma2 *= 2.0 / n as f32;
    b[q4_off..q4_off + n / 2].fill(0);
    wr_f16(b, 0, 0.0);
    let mut max_scale = 0.0f32;
    let mut amax_scale = 0.0f32;
    for ib in 0..n / 32 {
        let xb = &x[32 * ib..32 * ib + 32];
        let lb = &mut l_all[32 * ib..32 * ib + 32];
        let weight: [f32; 32] = match qw {
            Some(q) => std::array::from_fn(|j| q[32 * ib + j] * (sigma2 + xb[j] * xb[j]).sqrt()),
            None => std::array::from_fn(|j| xb[j] * xb[j]),
        };
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in xb {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        if amax < GROUP_MAX_EPS {
            scales[ib] = 0.0;
            continue;
        }
        let v0 = values[0] as f32;
        let mut d = if ntry > 0 { -max / v0 } else { max / v0 };
        let mut id = 1.0 / d;
        let mut sumqx = 0.0f32;
        let mut sumq2 = 0.0f32;
        for j in 0..32 {
            let l = best_index_int8(values, id * xb[j]);
            lb[j] = l as u8;
            let q = values[l] as f32;
            let w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
        let mut best = d * sumqx;
        for itry in -ntry..=ntry {
            id = (itry + values[0] as i32) as f32 / max;
            sumqx = 0.0;
            sumq2 = 0.0;
            for j in 0..32 {
                let l = best_index_int8(values, id * xb[j]);
                let q = values[l] as f32;
                let w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        let abs_d = d.abs();
        if abs_d > amax_scale {
            amax_scale = abs_d;
            max_scale = d;
        }
    }
    if n > 32 {
        b[2..8].fill(0);
        let mut scales_h: u16 = 0;
        let d = -max_scale / 32.0;
        wr_f16(b, 0, d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for ib in 0..n / 32 {
            let mut l = nearest_int(id * scales[ib]).clamp(-32, 31);
            let dl = d * l as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for j in 0..32 {
                l_all[32 * ib + j] = best_index_int8(values, idl * x[32 * ib + j]) as u8;
            }
            l += 32;
            let l_l = (l & 0xF) as u8;
            let l_h = (l >> 4) as u16;
            if ib % 2 == 0 {
                b[4 + ib / 2] = l_l;
            } else {
                b[4 + ib / 2] |= l_l << 4;
            }
            scales_h |= l_h << (2 * (ib % 8));
        }
        wr_u16(b, 2, scales_h);
    } else {
        wr_f16(b, 0, scales[0]);
        if ntry > 0 {
            let id = if scales[0] != 0.0 {
                1.0 / scales[0]
            } else {
                0.0
            };
            for j in 0..n {
                l_all[j] = best_index_int8(values, id * x[j]) as u8;
            }
        }
    }
    for i in 0..n / 32 {
        for j in 0..16 {
            b[q4_off + 16 * i + j] = l_all[32 * i + j] | (l_all[32 * i + 16 + j] << 4);
        }
    }
}

/// iq4_nl as `ggml_quantize_chunk` does it (7 scale trials, weights x² without imatrix).
pub(crate) fn quantize_iq4_nl(x: &[f32], y: &mut [u8], imatrix: Option<&[f32]>) {
    for (ib, (xb, b)) in x.chunks_exact(32).zip(y.chunks_exact_mut(18)).enumerate() {
        let qw = imatrix.map(|w| &w[32 * ib..32 * ib + 32]);
        quantize_iq4_superblock(xb, b, 2, qw, 7);
    }
}

pub(crate) fn quantize_iq4_xs(x: &[f32], y: &mut [u8], imatrix: Option<&[f32]>) {
    for (ib, (xb, b)) in x
        .chunks_exact(QK_K)
        .zip(y.chunks_exact_mut(136))
        .enumerate()
    {
        let qw = imatrix.map(|w| &w[QK_K * ib..QK_K * ib + QK_K]);
        quantize_iq4_superblock(xb, b, 8, qw, 7);
    }
}

// ---------------------------------------------------------------- lattice search tables

/// A quantization lattice as ggml's `iq2xs_init_impl` / `iq3xs_init_impl` build it: the grid
/// points with coordinates 2l + 1, a map from every packed point (l₀ | l₁ << bits | ...) to its
/// grid index, and for points off the grid the list of grid points at the `nwant` smallest
/// distances (sorted by distance, then index).
struct Lattice {
    dim: usize,
    grid: Vec<[i8; 8]>,
    /// ≥ 0: grid index; < 0: −(offset + 1) into `neighbours`, where the count comes first.
    map: Vec<i32>,
    neighbours: Vec<u16>,
}

impl Lattice {
    fn build(kgrid: &[u16], dim: usize, bits: u32, kmap_size: usize, nwant: usize) -> Lattice {
        let mask = (1u16 << bits) - 1;
        let grid: Vec<[i8; 8]> = kgrid
            .iter()
            .map(|&g| {
                let mut p = [0i8; 8];
                for (i, c) in p.iter_mut().enumerate().take(dim) {
                    *c = (2 * ((g >> (bits as usize * i)) & mask) + 1) as i8;
                }
                p
            })
            .collect();
        let mut map = vec![-1i32; kmap_size];
        for (i, p) in grid.iter().enumerate() {
            let mut index = 0usize;
            for k in 0..dim {
                index |= (((p[k] - 1) / 2) as usize) << (bits as usize * k);
            }
            map[index] = i as i32;
        }
        let mut neighbours: Vec<u16> = Vec::new();
        let mut d2s = vec![0i32; grid.len()];
        let mut picked: Vec<(i32, u16)> = Vec::new();
        for i in 0..kmap_size {
            if map[i] >= 0 {
                continue;
            }
            let mut pos = [0i32; 8];
            for k in 0..dim {
                pos[k] = 2 * ((i >> (bits as usize * k)) as i32 & mask as i32) + 1;
            }
            // The nwant smallest distinct distances.
            let mut smallest: Vec<i32> = Vec::with_capacity(nwant + 1);
            for (j, p) in grid.iter().enumerate() {
                let mut d2 = 0;
                for k in 0..dim {
                    let t = p[k] as i32 - pos[k];
                    d2 += t * t;
                }
                d2s[j] = d2;
                if smallest.len() < nwant || d2 < smallest[smallest.len() - 1] {
                    if let Err(at) = smallest.binary_search(&d2) {
                        smallest.insert(at, d2);
                        smallest.truncate(nwant);
                    }
                }
            }
            let limit = smallest[smallest.len() - 1];
            picked.clear();
            picked.extend(
                d2s.iter()
                    .enumerate()
                    .filter(|(_, &d)| d <= limit)
                    .map(|(j, &d)| (d, j as u16)),
            );
            picked.sort_unstable();
            map[i] = -(neighbours.len() as i32 + 1);
            neighbours.push(picked.len() as u16);
            neighbours.extend(picked.iter().map(|&(_, j)| j));
        }
        Lattice {
            dim,
            grid,
            map,
            neighbours,
        }
    }

    /// The neighbour list of an off-grid point whose map entry is `m` (< 0).
    fn neighbours_of(&self, m: i32) -> &[u16] {
        let off = (-m - 1) as usize;
        let n = self.neighbours[off] as usize;
        &self.neighbours[off + 1..off + 1 + n]
    }

    /// ggml's `iq2_find_best_neighbour` / `iq3_find_best_neighbour`: the neighbour minimizing
    /// Σ w·(scale·q − x)²; writes its levels to `l_out` and returns its index.
    fn best_neighbour(
        &self,
        m: i32,
        xval: &[f32],
        weight: &[f32],
        scale: f32,
        l_out: &mut [i8],
    ) -> usize {
        let nb = self.neighbours_of(m);
        let mut best_d2 = f32::MAX;
        let mut grid_index = None;
        for &j in nb {
            let pg = &self.grid[j as usize];
            let mut d2 = 0.0f32;
            for i in 0..self.dim {
                let q = pg[i] as f32;
                let diff = scale * q - xval[i];
                d2 += weight[i] * diff * diff;
            }
            if d2 < best_d2 {
                best_d2 = d2;
                grid_index = Some(j as usize);
            }
        }
        // ggml aborts when nothing compares (NaN input); take the first neighbour instead.
        let gi = grid_index.unwrap_or(nb[0] as usize);
        self.levels(gi, l_out);
        gi
    }

    /// Writes the levels l = (coordinate − 1)/2 of grid point `gi`.
    fn levels(&self, gi: usize, l_out: &mut [i8]) {
        let pg = &self.grid[gi];
        for i in 0..self.dim {
            l_out[i] = (pg[i] - 1) / 2;
        }
    }

    /// Grid index of the packed point `u`, or `Err(map entry)` when it is off the grid.
    fn lookup(&self, u: usize) -> Result<usize, i32> {
        let m = self.map[u];
        if m >= 0 {
            Ok(m as usize)
        } else {
            Err(m)
        }
    }

    /// Packs `dim` levels into a map index.
    fn pack(&self, l: &[i8], bits: u32) -> usize {
        let mut u = 0usize;
        for i in 0..self.dim {
            u |= (l[i] as usize) << (bits as usize * i);
        }
        u
    }
}

use std::sync::OnceLock;

fn lattice_iq2xxs() -> &'static Lattice {
    static L: OnceLock<Lattice> = OnceLock::new();
    L.get_or_init(|| Lattice::build(&KGRID_2BIT_256, 8, 2, 43692, 2))
}
fn lattice_iq2xs() -> &'static Lattice {
    static L: OnceLock<Lattice> = OnceLock::new();
    L.get_or_init(|| Lattice::build(&KGRID_2BIT_512, 8, 2, 43692, 2))
}
fn lattice_iq2s() -> &'static Lattice {
    static L: OnceLock<Lattice> = OnceLock::new();
    L.get_or_init(|| Lattice::build(&KGRID_2BIT_1024, 8, 2, 43692, 1))
}
fn lattice_iq1s() -> &'static Lattice {
    static L: OnceLock<Lattice> = OnceLock::new();
    L.get_or_init(|| Lattice::build(&KGRID_1BIT_2048, 8, 2, 43692, 3))
}
fn lattice_iq3xxs() -> &'static Lattice {
    static L: OnceLock<Lattice> = OnceLock::new();
    L.get_or_init(|| Lattice::build(&KGRID_3BIT_256, 4, 3, 4096, 2))
}
fn lattice_iq3s() -> &'static Lattice {
    static L: OnceLock<Lattice> = OnceLock::new();
    L.get_or_init(|| Lattice::build(&KGRID_3BIT_512, 4, 3, 4096, 3))
}

// ---------------------------------------------------------------- shared pieces

/// Magnitudes and sign bits of 8 values. With `even_parity` (the formats that store 7 sign
/// bits), an odd number of negatives is made even by flipping the value of least weighted
/// square, as ggml does. Returns the sign byte (7 bits when `even_parity`).
fn split_signs(xb: &[f32], weight: &[f32], xval: &mut [f32], even_parity: bool) -> u8 {
    let mut nflip = 0;
    let mut s: u8 = 0;
    for i in 0..8 {
        if xb[i] >= 0.0 {
            xval[i] = xb[i];
        } else {
            xval[i] = -xb[i];
            nflip += 1;
            s |= 1 << i;
        }
    }
    if !even_parity {
        return s;
    }
    if nflip % 2 == 1 {
        let mut imin = 0;
        let mut min = weight[0] * xb[0] * xb[0];
        for i in 1..8 {
            let ax = weight[i] * xb[i] * xb[i];
            if ax < min {
                min = ax;
                imin = i;
            }
        }
        xval[imin] = -xval[imin];
        s ^= 1 << imin;
    }
    s & 127
}

/// Σ w·x·q and Σ w·q² with q = 2l + 1.
fn sums_odd(weight: &[f32], xval: &[f32], l: &[i8]) -> (f32, f32) {
    let mut sumqx = 0.0f32;
    let mut sumq2 = 0.0f32;
    for i in 0..l.len() {
        let w = weight[i];
        let q = (2 * l[i] as i32 + 1) as f32;
        sumqx += w * xval[i] * q;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

fn sum_sq(x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for &v in x {
        s += v * v;
    }
    s
}

/// Levels l = clamp(round((id·x − 1)/2), 0, kmax − 1) of `n` values.
fn odd_levels(id: f32, xval: &[f32], l_out: &mut [i8], kmax: i32) {
    for i in 0..l_out.len() {
        let l = nearest_int(0.5 * (id * xval[i] - 1.0));
        l_out[i] = l.clamp(0, kmax - 1) as i8;
    }
}

// ---------------------------------------------------------------- iq2_xxs

pub(crate) fn quantize_iq2_xxs(x: &[f32], y: &mut [u8], imatrix: Option<&[f32]>) {
    const KMAX: i32 = 3;
    let qw_row = imatrix.expect("iq2_xxs needs an importance matrix (checked by quantize_row)");
    let lat = lattice_iq2xxs();
    for (ibl, (xbl, b)) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(66)).enumerate() {
        wr_f16(b, 0, 0.0);
        let mut q2 = [0u32; 16];
        let mut scales = [0.0f32; 8];
        let mut max_scale = 0.0f32;
        let sigma2 = sum_sq(xbl) / QK_K as f32;
        for ib in 0..8 {
            let xb = &xbl[32 * ib..32 * ib + 32];
            let qw = &qw_row[QK_K * ibl + 32 * ib..];
            let weight: [f32; 32] =
                std::array::from_fn(|i| qw[i] * (sigma2 + xb[i] * xb[i]).sqrt());
            let waux: [f32; 32] = std::array::from_fn(|i| weight[i].sqrt());
            let mut xval = [0.0f32; 32];
            let mut block_signs = [0u8; 4];
            for k in 0..4 {
                block_signs[k] = split_signs(
                    &xb[8 * k..],
                    &weight[8 * k..],
                    &mut xval[8 * k..8 * k + 8],
                    true,
                );
            }
            let mut max = xval[0];
            for &v in &xval[1..] {
                max = c_max(max, v);
            }
            if max < GROUP_MAX_EPS {
                scales[ib] = 0.0;
                continue;
            }
            let mut lq = [0u8; 32];
            let mut scale = make_qp_quants(32, KMAX + 1, &xval, &mut lq, &weight);
            let mut l: [i8; 32] = std::array::from_fn(|i| lq[i] as i8);
            let eff_max = scale * KMAX as f32;
            if eff_max <= 0.0 {
                scales[ib] = 0.0;
                continue;
            }
            let mut best = 0.0f32;
            let mut laux = [0i8; 32];
            for is in -6i32..=6 {
                let id = ((2 * KMAX - 1) as f32 + is as f32 * 0.1) / eff_max;
                let this_scale = 1.0 / id;
                for k in 0..4 {
                    let la = &mut laux[8 * k..8 * k + 8];
                    odd_levels(id, &xval[8 * k..], la, KMAX);
                    let u = lat.pack(la, 2);
                    if let Err(m) = lat.lookup(u) {
                        lat.best_neighbour(m, &xval[8 * k..], &waux[8 * k..], this_scale, la);
                    }
                }
                let (sumqx, sumq2) = sums_odd(&weight, &xval, &laux);
                if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                    scale = sumqx / sumq2;
                    best = scale * sumqx;
                    l = laux;
                }
            }
            if scale > 0.0 {
                let id = 1.0 / scale;
                for k in 0..4 {
                    let mut lk = [0i8; 8];
                    odd_levels(id, &xval[8 * k..], &mut lk, KMAX);
                    let u = lat.pack(&lk, 2);
                    let gi = match lat.lookup(u) {
                        Ok(gi) => gi,
                        Err(m) => lat.best_neighbour(
                            m,
                            &xval[8 * k..],
                            &waux[8 * k..],
                            scale,
                            &mut l[8 * k..],
                        ),
                    };
                    lat.levels(gi, &mut l[8 * k..]);
                }
                let (sumqx, sumq2) = sums_odd(&weight, &xval, &l);
                if sumq2 > 0.0 {
                    scale = sumqx / sumq2;
                }
            }
            if scale < 0.0 {
                scale = -scale;
                for s in block_signs.iter_mut() {
                    *s = !*s & 127;
                }
            }
            for k in 0..4 {
                let u = lat.pack(&l[8 * k..], 2);
                // ggml aborts if the point is off the grid, which cannot happen here.
                let gi = lat.lookup(u).unwrap_or(0);
                q2[2 * ib] |= (gi as u32) << (8 * k);
                q2[2 * ib + 1] |= (block_signs[k] as u32) << (7 * k);
            }
            scales[ib] = scale;
            max_scale = c_max(max_scale, scale);
        }
        if max_scale == 0.0 {
            b[2..66].fill(0);
            continue;
        }
        let d = max_scale / 31.0;
        wr_f16(b, 0, d);
        let id = 1.0 / d;
        for ib in 0..8 {
            let l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 15);
            q2[2 * ib + 1] |= (l as u32) << 28;
        }
        for (i, q) in q2.iter().enumerate() {
            b[2 + 4 * i..6 + 4 * i].copy_from_slice(&q.to_le_bytes());
        }
    }
}

// ---------------------------------------------------------------- iq2_xs and iq2_s

/// The shared search of iq2_xs and iq2_s over one group of 16: returns the scale and the two
/// grid indices; `block_signs` may be inverted.
fn search_iq2_16(
    lat: &Lattice,
    xval: &[f32; 16],
    weight: &[f32; 16],
    waux: &[f32; 16],
    block_signs: &mut [u8; 2],
    sign_mask: u8,
) -> (f32, [usize; 2]) {
    const KMAX: i32 = 3;
    let mut max = xval[0];
    for &v in &xval[1..] {
        max = c_max(max, v);
    }
    let mut l = [0i8; 16];
    let mut laux = [0i8; 16];
    let mut best = 0.0f32;
    let mut scale = max / (2 * KMAX - 1) as f32;
    let mut is_on_grid = [true; 2];
    let mut is_on_grid_aux = [true; 2];
    for is in -9i32..=9 {
        let id = ((2 * KMAX - 1) as f32 + is as f32 * 0.1) / max;
        let this_scale = 1.0 / id;
        for k in 0..2 {
            let la = &mut laux[8 * k..8 * k + 8];
            odd_levels(id, &xval[8 * k..], la, KMAX);
            let u = lat.pack(la, 2);
            is_on_grid_aux[k] = true;
            if let Err(m) = lat.lookup(u) {
                is_on_grid_aux[k] = false;
                lat.best_neighbour(m, &xval[8 * k..], &waux[8 * k..], this_scale, la);
            }
        }
        let (sumqx, sumq2) = sums_odd(weight, xval, &laux);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            l = laux;
            is_on_grid = is_on_grid_aux;
        }
    }
    let n_not_ongrid = is_on_grid.iter().filter(|g| !**g).count();
    if n_not_ongrid > 0 && scale > 0.0 {
        let id = 1.0 / scale;
        for k in 0..2 {
            if is_on_grid[k] {
                continue;
            }
            let lk = &mut l[8 * k..8 * k + 8];
            odd_levels(id, &xval[8 * k..], lk, KMAX);
            let u = lat.pack(lk, 2);
            if let Err(m) = lat.lookup(u) {
                lat.best_neighbour(m, &xval[8 * k..], &waux[8 * k..], scale, lk);
            }
        }
        let (sumqx, sumq2) = sums_odd(weight, xval, &l);
        if sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    if scale < 0.0 {
        scale = -scale;
        for s in block_signs.iter_mut() {
            *s = !*s & sign_mask;
        }
    }
    let gi = [0, 1].map(|k| lat.lookup(lat.pack(&l[8 * k..], 2)).unwrap_or(0));
    (scale, gi)
}

pub(crate) fn quantize_iq2_xs(x: &[f32], y: &mut [u8], imatrix: Option<&[f32]>) {
    let qw_row = imatrix.expect("iq2_xs needs an importance matrix (checked by quantize_row)");
    let lat = lattice_iq2xs();
    for (ibl, (xbl, b)) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(74)).enumerate() {
        wr_f16(b, 0, 0.0);
        b[66..74].fill(0);
        let mut q2 = [0u16; 32];
        let mut scales = [0.0f32; 16];
        let mut max_scale = 0.0f32;
        let sigma2 = sum_sq(xbl) / QK_K as f32;
        for ib in 0..16 {
            let xb = &xbl[16 * ib..16 * ib + 16];
            let qw = &qw_row[QK_K * ibl + 16 * ib..];
            let weight: [f32; 16] =
                std::array::from_fn(|i| qw[i] * (sigma2 + xb[i] * xb[i]).sqrt());
            let waux: [f32; 16] = std::array::from_fn(|i| weight[i].sqrt());
            let mut xval = [0.0f32; 16];
            let mut block_signs = [0u8; 2];
            for k in 0..2 {
                block_signs[k] = split_signs(
                    &xb[8 * k..],
                    &weight[8 * k..],
                    &mut xval[8 * k..8 * k + 8],
                    true,
                );
            }
            let mut max = xval[0];
            for &v in &xval[1..] {
                max = c_max(max, v);
            }
            if max < GROUP_MAX_EPS {
                scales[ib] = 0.0;
                continue;
            }
            let (scale, gi) = search_iq2_16(lat, &xval, &weight, &waux, &mut block_signs, 127);
            for k in 0..2 {
                q2[2 * ib + k] = gi[k] as u16 | ((block_signs[k] as u16) << 9);
            }
            scales[ib] = scale;
            max_scale = c_max(max_scale, scale);
        }
        if max_scale == 0.0 {
            b[2..66].fill(0);
            continue;
        }
        let d = max_scale / 31.0;
        wr_f16(b, 0, d);
        let id = 1.0 / d;
        for ib in 0..16 {
            let l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 15) as u8;
            if ib % 2 == 0 {
                b[66 + ib / 2] = l;
            } else {
                b[66 + ib / 2] |= l << 4;
            }
        }
        for (i, q) in q2.iter().enumerate() {
            wr_u16(b, 2 + 2 * i, *q);
        }
    }
}

pub(crate) fn quantize_iq2_s(x: &[f32], y: &mut [u8], imatrix: Option<&[f32]>) {
    let lat = lattice_iq2s();
    for (ibl, (xbl, b)) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(82)).enumerate() {
        b.fill(0);
        wr_f16(b, 0, 0.0);
        let mut scales = [0.0f32; 16];
        let mut max_scale = 0.0f32;
        let sigma2 = 2.0 * sum_sq(xbl) / QK_K as f32;
        for ib in 0..16 {
            let xb = &xbl[16 * ib..16 * ib + 16];
            let weight: [f32; 16] = match imatrix {
                Some(w) => {
                    let qw = &w[QK_K * ibl + 16 * ib..];
                    std::array::from_fn(|i| qw[i] * (sigma2 + xb[i] * xb[i]).sqrt())
                }
                None => std::array::from_fn(|i| 0.25 * sigma2 + xb[i] * xb[i]),
            };
            let waux: [f32; 16] = std::array::from_fn(|i| weight[i].sqrt());
            let mut xval = [0.0f32; 16];
            let mut block_signs = [0u8; 2];
            for k in 0..2 {
                block_signs[k] = split_signs(
                    &xb[8 * k..],
                    &weight[8 * k..],
                    &mut xval[8 * k..8 * k + 8],
                    false,
                );
            }
            let mut max = xval[0];
            for &v in &xval[1..] {
                max = c_max(max, v);
            }
            if max < GROUP_MAX_EPS_IQ2_S {
                scales[ib] = 0.0;
                continue;
            }
            let (scale, gi) = search_iq2_16(lat, &xval, &weight, &waux, &mut block_signs, 0xFF);
            for k in 0..2 {
                let i8 = 2 * ib + k;
                b[2 + i8] = (gi[k] & 255) as u8;
                b[66 + i8 / 4] |= ((gi[k] >> 8) << (2 * (i8 % 4))) as u8;
                b[2 + 32 + i8] = block_signs[k];
            }
            scales[ib] = scale;
            max_scale = c_max(max_scale, scale);
        }
        if max_scale == 0.0 {
            continue;
        }
        let d = max_scale / 31.0;
        wr_f16(b, 0, d * 0.9875);
        let id = 1.0 / d;
        for ib in 0..16 {
            let l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 15) as u8;
            if ib % 2 == 0 {
                b[74 + ib / 2] = l;
            } else {
                b[74 + ib / 2] |= l << 4;
            }
        }
    }
}

const GROUP_MAX_EPS_IQ3_XXS: f32 = 1e-8;
const GROUP_MAX_EPS_IQ2_S: f32 = 1e-8;
const GROUP_MAX_EPS_IQ1_M: f32 = 1e-7;
const GROUP_MAX_EPS_IQ1_S: f32 = 1e-12;

// ---------------------------------------------------------------- iq3_xxs and iq3_s

/// The search of iq3_xxs / iq3_s over one block of 32 (eight groups of 4 on the D4-like
/// lattice). `is_range`: scale trials ±is_range·0.2; `recheck_all`: iq3_s re-quantizes every
/// group after the search, iq3_xxs only the off-grid ones. Returns the scale and grid indices.
fn search_iq3_32(
    lat: &Lattice,
    xval: &[f32; 32],
    weight: &[f32; 32],
    waux: &[f32; 32],
    is_range: i32,
    iq3s: bool,
) -> (f32, [usize; 8]) {
    const KMAX: i32 = 8;
    let mut max = xval[0];
    for &v in &xval[1..] {
        max = c_max(max, v);
    }
    let mut l = [0i8; 32];
    let mut laux = [0i8; 32];
    let mut best = 0.0f32;
    let mut scale = max / (2 * KMAX - 1) as f32;
    let mut is_on_grid = [!iq3s; 8];
    let mut is_on_grid_aux = [true; 8];
    for is in -is_range..=is_range {
        let id = ((2 * KMAX - 1) as f32 + is as f32 * 0.2) / max;
        let this_scale = 1.0 / id;
        for k in 0..8 {
            let la = &mut laux[4 * k..4 * k + 4];
            odd_levels(id, &xval[4 * k..], la, KMAX);
            let u = lat.pack(la, 3);
            is_on_grid_aux[k] = true;
            if let Err(m) = lat.lookup(u) {
                is_on_grid_aux[k] = false;
                lat.best_neighbour(m, &xval[4 * k..], &waux[4 * k..], this_scale, la);
            }
        }
        let (sumqx, sumq2) = sums_odd(weight, xval, &laux);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            l = laux;
            is_on_grid = is_on_grid_aux;
        }
    }
    let n_not_ongrid = is_on_grid.iter().filter(|g| !**g).count();
    if n_not_ongrid > 0 && scale > 0.0 {
        let id = 1.0 / scale;
        for k in 0..8 {
            if !iq3s && is_on_grid[k] {
                continue;
            }
            let mut lk = [0i8; 4];
            odd_levels(id, &xval[4 * k..], &mut lk, KMAX);
            let u = lat.pack(&lk, 3);
            let gi = match lat.lookup(u) {
                Ok(gi) => gi,
                Err(m) => {
                    lat.best_neighbour(m, &xval[4 * k..], &waux[4 * k..], scale, &mut l[4 * k..])
                }
            };
            lat.levels(gi, &mut l[4 * k..]);
        }
        let (sumqx, sumq2) = sums_odd(weight, xval, &l);
        if sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    let gi = std::array::from_fn(|k| lat.lookup(lat.pack(&l[4 * k..], 3)).unwrap_or(0));
    (scale, gi)
}

fn block_weights_32(xb: &[f32], qw: Option<&[f32]>, sigma2: f32) -> [f32; 32] {
    match qw {
        Some(q) => std::array::from_fn(|i| q[i] * (sigma2 + xb[i] * xb[i]).sqrt()),
        None => std::array::from_fn(|i| xb[i] * xb[i]),
    }
}

pub(crate) fn quantize_iq3_xxs(x: &[f32], y: &mut [u8], imatrix: Option<&[f32]>) {
    let lat = lattice_iq3xxs();
    for (ibl, (xbl, b)) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(98)).enumerate() {
        wr_f16(b, 0, 0.0);
        let mut q3 = [0u8; 64];
        let mut scales_and_signs = [0u32; 8];
        let mut scales = [0.0f32; 8];
        let mut max_scale = 0.0f32;
        let sigma2 = 2.0 * sum_sq(xbl) / QK_K as f32;
        for ib in 0..8 {
            let xb = &xbl[32 * ib..32 * ib + 32];
            let weight = block_weights_32(xb, imatrix.map(|w| &w[QK_K * ibl + 32 * ib..]), sigma2);
            let waux: [f32; 32] = std::array::from_fn(|i| weight[i].sqrt());
            let mut xval = [0.0f32; 32];
            let mut block_signs = [0u8; 4];
            for k in 0..4 {
                block_signs[k] = split_signs(
                    &xb[8 * k..],
                    &weight[8 * k..],
                    &mut xval[8 * k..8 * k + 8],
                    true,
                );
            }
            let mut max = xval[0];
            for &v in &xval[1..] {
                max = c_max(max, v);
            }
            if max < GROUP_MAX_EPS_IQ3_XXS {
                scales[ib] = 0.0;
                continue;
            }
            let (mut scale, gi) = search_iq3_32(lat, &xval, &weight, &waux, 15, false);
            if scale < 0.0 {
                scale = -scale;
                for s in block_signs.iter_mut() {
                    *s = !*s & 127;
                }
            }
            for k in 0..8 {
                q3[8 * ib + k] = gi[k] as u8;
            }
            scales_and_signs[ib] = block_signs[0] as u32
                | ((block_signs[1] as u32) << 7)
                | ((block_signs[2] as u32) << 14)
                | ((block_signs[3] as u32) << 21);
            scales[ib] = scale;
            max_scale = c_max(max_scale, scale);
        }
        if max_scale == 0.0 {
            b[2..98].fill(0);
            continue;
        }
        let d = max_scale / 31.0;
        wr_f16(b, 0, d * 1.0125);
        let id = 1.0 / d;
        for ib in 0..8 {
            let l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 15);
            scales_and_signs[ib] |= (l as u32) << 28;
        }
        b[2..66].copy_from_slice(&q3);
        for (i, s) in scales_and_signs.iter().enumerate() {
            b[66 + 4 * i..70 + 4 * i].copy_from_slice(&s.to_le_bytes());
        }
    }
}

pub(crate) fn quantize_iq3_s(x: &[f32], y: &mut [u8], imatrix: Option<&[f32]>) {
    let lat = lattice_iq3s();
    for (ibl, (xbl, b)) in x
        .chunks_exact(QK_K)
        .zip(y.chunks_exact_mut(110))
        .enumerate()
    {
        b.fill(0);
        wr_f16(b, 0, 0.0);
        let mut scales = [0.0f32; 8];
        let mut max_scale = 0.0f32;
        let sigma2 = 2.0 * sum_sq(xbl) / QK_K as f32;
        // ggml advances its qs and signs pointers only for blocks that are not all zero.
        let mut qs_pos = 2;
        let mut signs_pos = 74;
        for ib in 0..8 {
            let xb = &xbl[32 * ib..32 * ib + 32];
            let weight = block_weights_32(xb, imatrix.map(|w| &w[QK_K * ibl + 32 * ib..]), sigma2);
            let waux: [f32; 32] = std::array::from_fn(|i| weight[i].sqrt());
            let mut xval = [0.0f32; 32];
            let mut block_signs = [0u8; 4];
            for k in 0..4 {
                block_signs[k] = split_signs(
                    &xb[8 * k..],
                    &weight[8 * k..],
                    &mut xval[8 * k..8 * k + 8],
                    false,
                );
            }
            let mut max = xval[0];
            for &v in &xval[1..] {
                max = c_max(max, v);
            }
            if max == 0.0 {
                scales[ib] = 0.0;
                continue;
            }
            let (mut scale, gi) = search_iq3_32(lat, &xval, &weight, &waux, 9, true);
            if scale < 0.0 {
                scale = -scale;
                for s in block_signs.iter_mut() {
                    *s = !*s;
                }
            }
            for k in 0..8 {
                b[qs_pos + k] = (gi[k] & 255) as u8;
                let j = ib * 8 + k;
                b[66 + j / 8] |= ((gi[k] >> 8) << (j % 8)) as u8;
            }
            qs_pos += 8;
            b[signs_pos..signs_pos + 4].copy_from_slice(&block_signs);
            signs_pos += 4;
            scales[ib] = scale;
            max_scale = c_max(max_scale, scale);
        }
        if max_scale == 0.0 {
            continue;
        }
        let d = max_scale / 31.0;
        wr_f16(b, 0, d * 1.033);
        let id = 1.0 / d;
        for ib in (0..8).step_by(2) {
            let l1 = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 15);
            let l2 = nearest_int(0.5 * (id * scales[ib + 1] - 1.0)).clamp(0, 15);
            b[106 + ib / 2] = (l1 | (l2 << 4)) as u8;
        }
    }
}

// ---------------------------------------------------------------- iq1_s and iq1_m

const X_P: [f32; 3] = [-1.0 + IQ1S_DELTA, IQ1S_DELTA, 1.0 + IQ1S_DELTA];
const X_M: [f32; 3] = [-1.0 - IQ1S_DELTA, -IQ1S_DELTA, 1.0 - IQ1S_DELTA];

/// ggml's `iq1_find_best_neighbour2`: the neighbour minimizing Σ w·(scale·xg[l] − x)².
fn iq1_best_neighbour(
    lat: &Lattice,
    m: i32,
    xval: &[f32],
    weight: &[f32],
    scale: f32,
    xg: &[f32; 3],
    l_out: &mut [i8],
) -> usize {
    let d2_of = |gi: usize| {
        let pg = &lat.grid[gi];
        let mut d2 = 0.0f32;
        for i in 0..8 {
            let q = xg[((pg[i] - 1) / 2) as usize];
            let w = weight[i];
            let diff = scale * q - xval[i];
            d2 += w * diff * diff;
        }
        d2
    };
    let mut best = f32::MAX;
    let mut grid_index = None;
    for &j in lat.neighbours_of(m) {
        let d2 = d2_of(j as usize);
        if d2 < best {
            best = d2;
            grid_index = Some(j as usize);
        }
    }
    if grid_index.is_none() {
        // Only reachable with non-finite input (ggml then scans the whole grid, reading an
        // out-of-bounds value; we scan it correctly).
        for gi in 0..lat.grid.len() {
            let d2 = d2_of(gi);
            if d2 < best {
                best = d2;
                grid_index = Some(gi);
            }
        }
    }
    let gi = grid_index.unwrap_or(0);
    lat.levels(gi, l_out);
    gi
}

/// Sorts (value, index) pairs by value, keeping the original order on ties: ggml uses glibc's
/// `qsort`, a merge sort, which is stable.
/// (−0 and +0 compare equal, as in C; NaNs, which ggml's comparator cannot order, go to the
/// ends so that the order stays total.)
fn sorted_order(xb: &[f32]) -> Vec<usize> {
    let key = |v: f32| if v == 0.0 { 0.0f32 } else { v };
    let mut idx: Vec<usize> = (0..xb.len()).collect();
    idx.sort_by(|&a, &b| key(xb[a]).total_cmp(&key(xb[b])));
    idx
}

pub(crate) fn quantize_iq1_s(x: &[f32], y: &mut [u8], imatrix: Option<&[f32]>) {
    const BS: usize = 32;
    let qw_row = imatrix.expect("iq1_s needs an importance matrix (checked by quantize_row)");
    let lat = lattice_iq1s();
    for (ibl, (xbl, b)) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(50)).enumerate() {
        wr_f16(b, 0, 0.0);
        b[2..50].fill(0);
        let mut qh = [0u16; 8];
        let mut scales = [0.0f32; 8];
        let mut shifts = [0i8; 8];
        let mut max_scale = 0.0f32;
        let sigma2 = 2.0 * sum_sq(xbl) / QK_K as f32;
        for ib in 0..QK_K / BS {
            let xb = &xbl[BS * ib..BS * ib + BS];
            let qw = &qw_row[QK_K * ibl + BS * ib..];
            let weight: [f32; BS] =
                std::array::from_fn(|i| qw[i] * (sigma2 + xb[i] * xb[i]).sqrt());
            let mut max = xb[0].abs();
            for &v in &xb[1..] {
                max = c_max(max, v.abs());
            }
            if max < GROUP_MAX_EPS_IQ1_S {
                scales[ib] = 0.0;
                shifts[ib] = 1;
                continue;
            }
            let idx = sorted_order(xb);
            let mut sumx = [0.0f32; BS + 1];
            let mut sumw = [0.0f32; BS + 1];
            for j in 0..BS {
                let i = idx[j];
                sumx[j + 1] = sumx[j] + weight[i] * xb[i];
                sumw[j + 1] = sumw[j] + weight[i];
            }
            let mut best_score = -f32::MAX;
            let mut scale = max;
            let (mut besti1, mut besti2, mut best_shift) = (-1i32, -1i32, 0i32);
            for i1 in 0..=BS {
                for i2 in i1..=BS {
                    for (xs, shift) in [(&X_P, 1), (&X_M, -1)] {
                        let sumqx = (sumx[i1] - sumx[0]) * xs[0]
                            + (sumx[i2] - sumx[i1]) * xs[1]
                            + (sumx[BS] - sumx[i2]) * xs[2];
                        let sumq2 = (sumw[i1] - sumw[0]) * xs[0] * xs[0]
                            + (sumw[i2] - sumw[i1]) * xs[1] * xs[1]
                            + (sumw[BS] - sumw[i2]) * xs[2] * xs[2];
                        if sumq2 > 0.0 && sumqx * sumqx > best_score * sumq2 {
                            scale = sumqx / sumq2;
                            best_score = scale * sumqx;
                            besti1 = i1 as i32;
                            besti2 = i2 as i32;
                            best_shift = shift;
                        }
                    }
                }
            }
            if besti1 < 0 || besti2 < 0 || best_shift == 0 {
                scales[ib] = 0.0;
                shifts[ib] = 1;
                continue;
            }
            let mut l = [0i8; BS];
            for (j, &i) in idx.iter().enumerate() {
                l[i] = if (j as i32) < besti1 {
                    0
                } else if (j as i32) < besti2 {
                    1
                } else {
                    2
                };
            }
            if scale < 0.0 {
                for v in l.iter_mut() {
                    *v = 2 - *v;
                }
                scale = -scale;
                best_shift = -best_shift;
            }
            let xx = if best_shift == 1 { &X_P } else { &X_M };
            let mut all_on_grid = true;
            let mut index = [0usize; BS / 8];
            for k in 0..BS / 8 {
                let u = lat.pack(&l[8 * k..], 2);
                index[k] = match lat.lookup(u) {
                    Ok(gi) => gi,
                    Err(m) => {
                        all_on_grid = false;
                        iq1_best_neighbour(
                            lat,
                            m,
                            &xb[8 * k..],
                            &weight[8 * k..],
                            scale,
                            xx,
                            &mut l[8 * k..],
                        )
                    }
                };
            }
            if !all_on_grid {
                let mut sumqx = 0.0f32;
                let mut sumq2 = 0.0f32;
                for k in 0..BS / 8 {
                    let pg = &lat.grid[index[k]];
                    for j in 0..8 {
                        let w = weight[8 * k + j];
                        let q = xx[((pg[j] - 1) / 2) as usize];
                        sumqx += w * q * xb[8 * k + j];
                        sumq2 += w * q * q;
                    }
                }
                if sumqx > 0.0 && sumq2 > 0.0 {
                    scale = sumqx / sumq2;
                }
            }
            let mut h: u16 = 0;
            for k in 0..BS / 8 {
                b[2 + (BS / 8) * ib + k] = (index[k] & 255) as u8;
                h |= ((index[k] >> 8) as u16) << (3 * k);
            }
            qh[ib] = h;
            scales[ib] = scale;
            shifts[ib] = best_shift as i8;
            max_scale = c_max(max_scale, scale);
        }
        if max_scale != 0.0 {
            let d = max_scale / 15.0;
            wr_f16(b, 0, d * 1.125);
            let id = 1.0 / d;
            for ib in 0..QK_K / BS {
                let mut l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7);
                if shifts[ib] == -1 {
                    l |= 8;
                }
                qh[ib] |= (l << 12) as u16;
            }
        }
        for (i, h) in qh.iter().enumerate() {
            wr_u16(b, 34 + 2 * i, *h);
        }
    }
}

pub(crate) fn quantize_iq1_m(x: &[f32], y: &mut [u8], imatrix: Option<&[f32]>) {
    const BS: usize = 16;
    const MASKS: [u8; 4] = [0x00, 0x80, 0x08, 0x88];
    let lat = lattice_iq1s();
    let weights_of = |xb: &[f32], ibl: usize, ib: usize, sigma2: f32| -> [f32; BS] {
        match imatrix {
            Some(w) => {
                let qw = &w[QK_K * ibl + BS * ib..];
                std::array::from_fn(|i| qw[i] * (sigma2 + xb[i] * xb[i]).sqrt())
            }
            None => std::array::from_fn(|i| xb[i] * xb[i]),
        }
    };
    // The value table of the first and second group of 8 for each shift combination k.
    let tables = |k: i32| -> [&[f32; 3]; 2] {
        [
            if k < 2 { &X_P } else { &X_M },
            if k % 2 == 0 { &X_P } else { &X_M },
        ]
    };
    for (ibl, (xbl, b)) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(56)).enumerate() {
        b.fill(0);
        let mut scales = [0.0f32; QK_K / BS];
        let mut shifts = [0i32; QK_K / BS];
        let mut max_scale = 0.0f32;
        let sigma2 = 2.0 * sum_sq(xbl) / QK_K as f32;
        for ib in 0..QK_K / BS {
            let xb = &xbl[BS * ib..BS * ib + BS];
            let weight = weights_of(xb, ibl, ib, sigma2);
            let mut max = xb[0].abs();
            for &v in &xb[1..] {
                max = c_max(max, v.abs());
            }
            if max < GROUP_MAX_EPS_IQ1_M {
                scales[ib] = 0.0;
                shifts[ib] = 0;
                continue;
            }
            let idx = sorted_order(xb);
            let mut best_score = -f32::MAX;
            let mut scale = max;
            let (mut besti1, mut besti2, mut best_k) = (-1i32, -1i32, -1i32);
            for i1 in 0..=BS {
                for i2 in i1..=BS {
                    let mut sumqx = [0.0f32; 4];
                    let mut sumq2 = [0.0f32; 4];
                    for (j, &i) in idx.iter().enumerate() {
                        let g = if j < i1 {
                            0
                        } else if j < i2 {
                            1
                        } else {
                            2
                        };
                        let (p, m) = (X_P[g], X_M[g]);
                        // Which sums get the "+" table: k = 0, 1 for the first half, 0, 2 for
                        // the second (ggml's order of accumulation is kept).
                        let order: [(usize, f32); 4] = if i < BS / 2 {
                            [(0, p), (1, p), (2, m), (3, m)]
                        } else {
                            [(0, p), (2, p), (1, m), (3, m)]
                        };
                        for (k, v) in order {
                            sumqx[k] += weight[i] * v * xb[i];
                        }
                        for (k, v) in order {
                            sumq2[k] += weight[i] * v * v;
                        }
                    }
                    for k in 0..4 {
                        if sumq2[k] > 0.0 && sumqx[k] * sumqx[k] > best_score * sumq2[k] {
                            scale = sumqx[k] / sumq2[k];
                            best_score = scale * sumqx[k];
                            besti1 = i1 as i32;
                            besti2 = i2 as i32;
                            best_k = k as i32;
                        }
                    }
                }
            }
            if besti1 < 0 || besti2 < 0 || best_k < 0 {
                scales[ib] = 0.0;
                shifts[ib] = 0;
                continue;
            }
            let mut l = [0i8; BS];
            for (j, &i) in idx.iter().enumerate() {
                l[i] = if (j as i32) < besti1 {
                    0
                } else if (j as i32) < besti2 {
                    1
                } else {
                    2
                };
            }
            if scale < 0.0 {
                for v in l.iter_mut() {
                    *v = 2 - *v;
                }
                scale = -scale;
                best_k = 3 - best_k;
            }
            let xxs = tables(best_k);
            let mut all_on_grid = true;
            let mut index = [0usize; 2];
            for k in 0..2 {
                let u = lat.pack(&l[8 * k..], 2);
                index[k] = match lat.lookup(u) {
                    Ok(gi) => gi,
                    Err(m) => {
                        all_on_grid = false;
                        iq1_best_neighbour(
                            lat,
                            m,
                            &xb[8 * k..],
                            &weight[8 * k..],
                            scale,
                            xxs[k],
                            &mut l[8 * k..],
                        )
                    }
                };
            }
            if !all_on_grid {
                let mut sumqx = 0.0f32;
                let mut sumq2 = 0.0f32;
                for k in 0..2 {
                    let pg = &lat.grid[index[k]];
                    for j in 0..8 {
                        let w = weight[8 * k + j];
                        let q = xxs[k][((pg[j] - 1) / 2) as usize];
                        sumqx += w * q * xb[8 * k + j];
                        sumq2 += w * q * q;
                    }
                }
                if sumqx > 0.0 && sumq2 > 0.0 {
                    scale = sumqx / sumq2;
                }
            }
            b[2 * ib] = (index[0] & 255) as u8;
            b[2 * ib + 1] = (index[1] & 255) as u8;
            b[32 + ib] = ((index[0] >> 8) | ((index[1] >> 8) << 4)) as u8;
            scales[ib] = scale;
            shifts[ib] = best_k;
            max_scale = c_max(max_scale, scale);
        }
        if max_scale == 0.0 {
            continue;
        }
        let mut sc = [0u16; 4];
        let mut d = max_scale / 15.0;
        let id = 1.0 / d;
        let mut sumqx = 0.0f32;
        let mut sumq2 = 0.0f32;
        for ib in 0..QK_K / BS {
            let l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7);
            sc[ib / 4] |= (l << (3 * (ib % 4))) as u16;
            b[32 + ib] |= MASKS[shifts[ib] as usize];
            let xb = &xbl[BS * ib..BS * ib + BS];
            let weight = weights_of(xb, ibl, ib, sigma2);
            let xxs = tables(shifts[ib]);
            let qh = b[32 + ib] as usize;
            for k in 0..2 {
                let gi = b[2 * ib + k] as usize + ((qh << (8 - 4 * k)) & 0x700);
                let pg = &lat.grid[gi];
                for j in 0..8 {
                    let w = weight[8 * k + j];
                    let q = xxs[k][((pg[j] - 1) / 2) as usize] * (2 * l + 1) as f32;
                    sumqx += w * q * xb[8 * k + j];
                    sumq2 += w * q * q;
                }
            }
        }
        if sumq2 > 0.0 {
            d = sumqx / sumq2;
        }
        let s = f32_to_f16(d * 1.1125);
        sc[0] |= (s & 0x000f) << 12;
        sc[1] |= (s & 0x00f0) << 8;
        sc[2] |= (s & 0x0f00) << 4;
        sc[3] |= s & 0xf000;
        for (i, v) in sc.iter().enumerate() {
            wr_u16(b, 48 + 2 * i, *v);
        }
    }
}
