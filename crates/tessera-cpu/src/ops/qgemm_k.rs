//! Quantized mat-mat for the k-quants (q2_K … q6_K) and the codebook types (iq4_xs, iq2_xxs,
//! iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m) against eight or more columns, with the numerics
//! of ggml's tiled matmul (`ggml-cpu/tiled`, which ggml's CPU backend uses for exactly these
//! types whenever `b` has at least eight columns).
//!
//! For a weight row, an activation column (quantized to q8_K) and each 256-element block, ggml
//! forms exact integer sums — S1 = Σ_s scale_s · Σ_{e∈s} w_e·x_e over the sub-blocks s, and for
//! the types with mins S2 = Σ_s min_s · Σ_{e∈s} x_e — and then, block after block,
//!
//! ```text
//! res = d · f32(S1)              (one rounding)
//! res = res − dmin · f32(S2)     (fused; types with mins only)
//! acc = res · d_x + acc          (fused)
//! ```
//!
//! The integer sums are exact, so any order of computing them gives ggml's bits; only the float
//! steps above must be (and are) ggml's. [`dot_ref`] is that definition, one row and one column
//! at a time; the AVX2 kernel computes the same numbers for four rows × eight columns at once.
//!
//! The AVX2 kernel differs from ggml's in how it gets the integer sums, not in the sums: the
//! activations of eight columns are interleaved by four bytes, so one `vpmaddubsw` of a
//! broadcast group of four weights multiplies 32 weight·activation pairs of eight columns, and
//! the 16-bit products of several such steps are added before a `vpmaddwd` applies the
//! sub-block's scale (as many steps as the weight codes allow without overflow: 8 for 4-bit
//! codes, 4 for 5-bit, 2 for 6-bit). That takes 9–13 multiply instructions per weight block and
//! column where the one-column kernels take 16 and more.
//!
//! Bias-coded types (q6_K's codes are value + 32, q3_K's value + 4) are multiplied as unsigned
//! codes and corrected by `bias · Σ_s scale_s · Σ_{e∈s} x_e`, exact. The codebook and grid
//! types unpack to signed values (iq4_xs reaches ±127; the grids' odd scales and their 1/8 or
//! 1/4 factors are split as ggml's tiled unpacking does: the factor into `d`, 8·grid ± 1 for
//! iq1), so their activations are packed as the nibbles of x + 128, both 0..15, and
//! Σ w·x = 16·Σ w·high + Σ w·low − 128·Σ w.

// the unpacking follows the formats' index arithmetic, clearer as index loops
#![allow(clippy::needless_range_loop)]

use tessera::DType;

use super::qdot::{f16_at, k4_scales_mins, q3k_scales, words_to_bytes, KVALUES_IQ4NL};

const QK_K: usize = 256;
/// Bytes of one q8_K block: f32 scale, 256 i8, 16 i16 sums of 16.
const Q8K: usize = 4 + QK_K + 32;
/// Columns packed together.
pub const GROUP: usize = 8;
/// Bytes of one packed (column group, block) for weights of type `t`: the 256 activations of
/// eight columns interleaved by four (`[64][8][4]`; for iq4_xs twice, as the high and low
/// nibbles of x + 128), the eight columns' scales (f32), their sums of 16 in pairs
/// (`[8][8][2]` i16) and their sums of 32 in pairs (`[4][8][2]` i16).
pub fn packed_bytes(t: DType) -> usize {
    qx_bytes(t) + 32 + 256 + 128
}

fn qx_bytes(t: DType) -> usize {
    if signed(t) {
        4096
    } else {
        2048
    }
}

/// Offsets in a packed block of the scales, the sums of 16 and the sums of 32.
fn offsets(t: DType) -> (usize, usize, usize) {
    let q = qx_bytes(t);
    (q, q + 32, q + 288)
}

/// Weight types this path computes.
pub fn supported(t: DType) -> bool {
    matches!(
        t,
        DType::Q2K | DType::Q3K | DType::Q4K | DType::Q5K | DType::Q6K
    ) || signed(t)
}

/// Types whose unpacked codes are the signed weight values themselves (codebooks and grids);
/// their activations are packed as nibbles of x + 128.
fn signed(t: DType) -> bool {
    matches!(
        t,
        DType::IQ4XS
            | DType::IQ2XXS
            | DType::IQ2XS
            | DType::IQ2S
            | DType::IQ3XXS
            | DType::IQ3S
            | DType::IQ1S
            | DType::IQ1M
    )
}

/// Whether a mul_mat of `t` weights against `b` with `cols_per_batch` columns (`b.ne[1]`) takes
/// this path: ggml's threshold is eight columns.
pub fn applies(t: DType, cols_per_batch: usize) -> bool {
    supported(t) && cols_per_batch >= GROUP
}

/// Rows of weights unpacked at a time, and column groups accumulated at a time (per thread).
const RB: usize = 32;
const GC: usize = 64;
/// Floats between accumulator rows: `GC` groups of columns and one cache line more, so that
/// the rows (read column by column when the window is stored) do not share L1 sets as rows
/// 2 KiB apart would.
const ACC_STRIDE: usize = GC * GROUP + 16;

/// Bytes of per-thread scratch the driver needs for rows of `k` elements: the unpacked blocks
/// of `RB` whole rows and the accumulators of `RB` rows × `GC` groups.
pub fn scratch_size(k: usize) -> usize {
    RB * (k / QK_K).max(1) * std::mem::size_of::<WBlock>() + RB * ACC_STRIDE * 4 + 64
}

/// One weight block unpacked: a code per element (unsigned; iq4_xs: the signed codebook value's
/// bits), a scale per sub-block, pairs of i16 for `vpmaddwd` against the paired activation sums
/// (the mins for the types with mins, the scales for the bias-coded types) and the f32 scales.
#[repr(C, align(32))]
#[derive(Clone, Copy)]
pub(crate) struct WBlock {
    q: [u8; QK_K],
    sc: [i16; 16],
    pairs: [u32; 8],
    d: f32,
    dmin: f32,
    _pad: [u32; 6],
}

impl WBlock {
    const ZERO: WBlock = WBlock {
        q: [0; QK_K],
        sc: [0; 16],
        pairs: [0; 8],
        d: 0.0,
        dmin: 0.0,
        _pad: [0; 6],
    };
}

/// How a type's codes and scales combine.
#[derive(Clone, Copy)]
struct Fmt {
    has_min: bool,
    /// Sub-blocks of 16 elements (else 32).
    sub16: bool,
    /// Value = code − bias.
    bias: i32,
}

fn fmt(t: DType) -> Fmt {
    match t {
        DType::Q4K | DType::Q5K => Fmt {
            has_min: true,
            sub16: false,
            bias: 0,
        },
        DType::Q2K => Fmt {
            has_min: true,
            sub16: true,
            bias: 0,
        },
        DType::Q6K => Fmt {
            has_min: false,
            sub16: true,
            bias: 32,
        },
        DType::Q3K => Fmt {
            has_min: false,
            sub16: true,
            bias: 4,
        },
        _ => Fmt {
            has_min: false,
            sub16: matches!(t, DType::IQ2XS | DType::IQ2S | DType::IQ1M),
            bias: 0,
        },
    }
}

fn pair(a: i16, b: i16) -> u32 {
    (a as u16 as u32) | ((b as u16 as u32) << 16)
}

/// Unpacks one weight block of type `t` (the bytes at the start of `w`).
pub(crate) fn unpack(t: DType, w: &[u8], o: &mut WBlock) {
    if signed(t) && t != DType::IQ4XS {
        iq_grid_values(t, w, o);
    } else {
        scales(t, w, o);
        codes(t, w, o);
    }
    if signed(t) {
        signed_corr(t, o);
    }
}

/// For each sign byte, the eight byte masks of its bits (0xFF where a bit is set).
static SIGN_MASKS: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut s = 0;
    while s < 256 {
        let mut j = 0;
        while j < 8 {
            if s & (1 << j) != 0 {
                t[s] |= 0xff << (8 * j);
            }
            j += 1;
        }
        s += 1;
    }
    t
};

/// The eight bytes of `g`, those whose bit is set in `signs` negated (two's complement), as
/// one 64-bit operation: x ^ 0xFF + 1 per byte. No byte of the sign-carrying grids is 0 (their
/// values are 1..62; tested), so no negation carries into the next byte.
fn signed_bytes(g: u64, signs: u8) -> u64 {
    let m = SIGN_MASKS[signs as usize];
    (g ^ m).wrapping_add(m & 0x0101_0101_0101_0101)
}

/// The grid types: scales, f32 scale and signed values (ggml's tiled decomposition: the
/// constant factors 0.125 or 0.25 go into `d`, the odd integer scales into `sc`, iq1's ±1/8
/// delta becomes value 8·grid ± 1).
fn iq_grid_values(t: DType, w: &[u8], o: &mut WBlock) {
    use tessera_quants::iq_grids::*;
    let u16_at = |at: usize| u16::from_le_bytes([w[at], w[at + 1]]);
    let u32_at = |at: usize| u32::from_le_bytes([w[at], w[at + 1], w[at + 2], w[at + 3]]);
    // eight grid bytes at once, those whose sign bit is set negated (`signed_bytes`)
    let put = |q: &mut [u8; QK_K], at: usize, g: u64, signs: u8| {
        q[at..at + 8].copy_from_slice(&signed_bytes(g, signs).to_le_bytes());
    };
    o.dmin = 0.0;
    match t {
        DType::IQ2XXS => {
            o.d = f16_at(w, 0) * 0.125;
            for ib in 0..8 {
                let (a0, a1) = (u32_at(2 + 8 * ib), u32_at(6 + 8 * ib));
                o.sc[ib] = (2 * (a1 >> 28) + 1) as i16;
                for l in 0..4 {
                    let g = IQ2XXS_GRID[((a0 >> (8 * l)) & 255) as usize];
                    let signs = KSIGNS_IQ2XS[((a1 >> (7 * l)) & 127) as usize];
                    put(&mut o.q, 32 * ib + 8 * l, g, signs);
                }
            }
        }
        DType::IQ2XS => {
            o.d = f16_at(w, 0) * 0.125;
            for ib in 0..8 {
                let sc = w[66 + ib];
                o.sc[2 * ib] = (2 * (sc & 15) + 1) as i16;
                o.sc[2 * ib + 1] = (2 * (sc >> 4) + 1) as i16;
                for l in 0..4 {
                    let q = u16_at(2 + 2 * (4 * ib + l));
                    let g = IQ2XS_GRID[(q & 511) as usize];
                    let signs = KSIGNS_IQ2XS[(q >> 9) as usize];
                    put(&mut o.q, 32 * ib + 8 * l, g, signs);
                }
            }
        }
        DType::IQ2S => {
            o.d = f16_at(w, 0) * 0.125;
            let (qs, signs, qh, scales) = (&w[2..34], &w[34..66], &w[66..74], &w[74..82]);
            for ib in 0..8 {
                o.sc[2 * ib] = (2 * (scales[ib] & 15) + 1) as i16;
                o.sc[2 * ib + 1] = (2 * (scales[ib] >> 4) + 1) as i16;
                for l in 0..4 {
                    let idx =
                        qs[4 * ib + l] as usize | (((qh[ib] as usize) << (8 - 2 * l)) & 0x300);
                    put(&mut o.q, 32 * ib + 8 * l, IQ2S_GRID[idx], signs[4 * ib + l]);
                }
            }
        }
        DType::IQ3XXS => {
            o.d = f16_at(w, 0) * 0.25;
            let qs = &w[2..66];
            for ib in 0..8 {
                let aux = u32_at(66 + 4 * ib);
                o.sc[ib] = (2 * (aux >> 28) + 1) as i16;
                for l in 0..4 {
                    let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                    let g1 = IQ3XXS_GRID[qs[8 * ib + 2 * l] as usize] as u64;
                    let g2 = IQ3XXS_GRID[qs[8 * ib + 2 * l + 1] as usize] as u64;
                    put(&mut o.q, 32 * ib + 8 * l, g1 | g2 << 32, signs);
                }
            }
        }
        DType::IQ3S => {
            o.d = f16_at(w, 0);
            let (qs, qh, signs, scales) = (&w[2..66], &w[66..74], &w[74..106], &w[106..110]);
            for ib in 0..8 {
                let sc = scales[ib / 2];
                let s = if ib % 2 == 0 { sc & 15 } else { sc >> 4 };
                o.sc[ib] = (1 + 2 * s) as i16;
                let h = qh[ib] as usize;
                for l in 0..4 {
                    let i1 = qs[8 * ib + 2 * l] as usize | ((h << (8 - 2 * l)) & 256);
                    let i2 = qs[8 * ib + 2 * l + 1] as usize | ((h << (7 - 2 * l)) & 256);
                    let g = IQ3S_GRID[i1] as u64 | (IQ3S_GRID[i2] as u64) << 32;
                    put(&mut o.q, 32 * ib + 8 * l, g, signs[4 * ib + l]);
                }
            }
        }
        DType::IQ1S => {
            o.d = f16_at(w, 0) * 0.125;
            let qs = &w[2..34];
            for ib in 0..8 {
                let qh = u16_at(34 + 2 * ib);
                o.sc[ib] = (2 * ((qh >> 12) & 7) + 1) as i16;
                let delta: i8 = if qh & 0x8000 != 0 { -1 } else { 1 };
                for l in 0..4 {
                    let idx = qs[4 * ib + l] as usize | ((((qh >> (3 * l)) & 7) as usize) << 8);
                    let g = IQ1S_GRID[idx].to_le_bytes();
                    for j in 0..8 {
                        o.q[32 * ib + 8 * l + j] = (8 * (g[j] as i8) + delta) as u8;
                    }
                }
            }
        }
        DType::IQ1M => {
            let (qs, qh) = (&w[0..32], &w[32..48]);
            let sc: [u16; 4] = std::array::from_fn(|i| u16_at(48 + 2 * i));
            let bits = (sc[0] >> 12)
                | ((sc[1] >> 8) & 0x00f0)
                | ((sc[2] >> 4) & 0x0f00)
                | (sc[3] & 0xf000);
            o.d = half::f16::from_bits(bits).to_f32() * 0.125;
            for ib in 0..8 {
                let s = sc[ib / 2] >> (6 * (ib % 2));
                o.sc[2 * ib] = (2 * (s & 7) + 1) as i16;
                o.sc[2 * ib + 1] = (2 * ((s >> 3) & 7) + 1) as i16;
                let (h0, h1) = (qh[2 * ib] as usize, qh[2 * ib + 1] as usize);
                let q = &qs[4 * ib..4 * ib + 4];
                let idx = [
                    q[0] as usize | ((h0 << 8) & 0x700),
                    q[1] as usize | ((h0 << 4) & 0x700),
                    q[2] as usize | ((h1 << 8) & 0x700),
                    q[3] as usize | ((h1 << 4) & 0x700),
                ];
                let dbits = [h0 & 0x08, h0 & 0x80, h1 & 0x08, h1 & 0x80];
                for l in 0..4 {
                    let g = IQ1S_GRID[idx[l]].to_le_bytes();
                    let delta: i8 = if dbits[l] != 0 { -1 } else { 1 };
                    for j in 0..8 {
                        o.q[32 * ib + 8 * l + j] = (8 * (g[j] as i8) + delta) as u8;
                    }
                }
            }
        }
        _ => unreachable!("qgemm_k: {t} is not a grid type"),
    }
}

/// The f32 scales, sub-block scales and pairs of a block.
fn scales(t: DType, w: &[u8], o: &mut WBlock) {
    match t {
        DType::Q4K | DType::Q5K => {
            o.d = f16_at(w, 0);
            o.dmin = f16_at(w, 2);
            let sm = words_to_bytes(k4_scales_mins(&w[4..16]));
            for s in 0..8 {
                o.sc[s] = sm[s] as i16;
            }
            for p in 0..4 {
                o.pairs[p] = pair(sm[8 + 2 * p] as i16, sm[9 + 2 * p] as i16);
            }
        }
        DType::Q6K => {
            o.d = f16_at(w, 208);
            o.dmin = 0.0;
            for s in 0..16 {
                o.sc[s] = w[192 + s] as i8 as i16;
            }
            for p in 0..8 {
                o.pairs[p] = pair(o.sc[2 * p], o.sc[2 * p + 1]);
            }
        }
        DType::Q3K => {
            o.d = f16_at(w, 108);
            o.dmin = 0.0;
            let sc = words_to_bytes(q3k_scales(&w[96..108]));
            for s in 0..16 {
                o.sc[s] = sc[s] as i16 - 32;
            }
            for p in 0..8 {
                o.pairs[p] = pair(o.sc[2 * p], o.sc[2 * p + 1]);
            }
        }
        DType::Q2K => {
            o.d = f16_at(w, 80);
            o.dmin = f16_at(w, 82);
            for s in 0..16 {
                o.sc[s] = (w[s] & 15) as i16;
            }
            for p in 0..8 {
                o.pairs[p] = pair((w[2 * p] >> 4) as i16, (w[2 * p + 1] >> 4) as i16);
            }
        }
        DType::IQ4XS => {
            o.d = f16_at(w, 0);
            o.dmin = 0.0;
            let sh = u16::from_le_bytes([w[2], w[3]]);
            for ib in 0..8 {
                let ls = ((w[4 + ib / 2] >> (4 * (ib % 2))) & 15)
                    | ((((sh >> (2 * ib)) & 3) as u8) << 4);
                o.sc[ib] = ls as i16 - 32;
            }
        }
        _ => unreachable!("qgemm_k: {t} is not supported (checked by the caller)"),
    }
}

/// The codes of a block, in element order.
fn codes(t: DType, w: &[u8], o: &mut WBlock) {
    #[cfg(target_arch = "x86_64")]
    if avx2::available() && matches!(t, DType::Q4K | DType::Q5K | DType::Q6K | DType::IQ4XS) {
        assert!(w.len() >= t.type_size(), "qgemm_k: short {t} block");
        // SAFETY: AVX2 present (checked); the block's bytes are readable (asserted).
        unsafe { avx2::unpack_codes(t, w.as_ptr(), &mut o.q) };
        return;
    }
    codes_scalar(t, w, &mut o.q);
}

pub(crate) fn codes_scalar(t: DType, w: &[u8], q: &mut [u8; QK_K]) {
    match t {
        DType::Q4K | DType::Q5K => {
            let qs = if t == DType::Q4K {
                &w[16..144]
            } else {
                &w[48..176]
            };
            for j in 0..4 {
                let (lo, hi) = q[64 * j..64 * j + 64].split_at_mut(32);
                for l in 0..32 {
                    let v = qs[32 * j + l];
                    lo[l] = v & 15;
                    hi[l] = v >> 4;
                }
            }
            if t == DType::Q5K {
                let qh = &w[16..48];
                for j in 0..4 {
                    for l in 0..32 {
                        q[64 * j + l] |= ((qh[l] >> (2 * j)) & 1) << 4;
                        q[64 * j + 32 + l] |= ((qh[l] >> (2 * j + 1)) & 1) << 4;
                    }
                }
            }
        }
        DType::Q6K => {
            let (ql, qh) = (&w[0..128], &w[128..192]);
            for n in 0..2 {
                let (ql, qh) = (&ql[64 * n..], &qh[32 * n..]);
                let q = &mut q[128 * n..128 * n + 128];
                for l in 0..32 {
                    q[l] = (ql[l] & 15) | ((qh[l] & 3) << 4);
                    q[32 + l] = (ql[32 + l] & 15) | (((qh[l] >> 2) & 3) << 4);
                    q[64 + l] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                    q[96 + l] = (ql[32 + l] >> 4) | (((qh[l] >> 6) & 3) << 4);
                }
            }
        }
        DType::Q3K => {
            let (hm, qs) = (&w[0..32], &w[32..96]);
            for n in 0..2 {
                for j in 0..4 {
                    for l in 0..32 {
                        let low = (qs[32 * n + l] >> (2 * j)) & 3;
                        let high = (hm[l] >> (4 * n + j)) & 1;
                        q[128 * n + 32 * j + l] = low | (high << 2);
                    }
                }
            }
        }
        DType::Q2K => {
            let qs = &w[16..80];
            for n in 0..2 {
                for j in 0..4 {
                    for l in 0..32 {
                        q[128 * n + 32 * j + l] = (qs[32 * n + l] >> (2 * j)) & 3;
                    }
                }
            }
        }
        DType::IQ4XS => {
            let qs = &w[8..136];
            for ib in 0..8 {
                for j in 0..16 {
                    let v = qs[16 * ib + j];
                    q[32 * ib + j] = KVALUES_IQ4NL[(v & 15) as usize] as u8;
                    q[32 * ib + 16 + j] = KVALUES_IQ4NL[(v >> 4) as usize] as u8;
                }
            }
        }
        _ => unreachable!("qgemm_k: {t} is not supported (checked by the caller)"),
    }
}

/// The signed types: the kernel multiplies x + 128, so 128 · Σ_s scale_s · Σ_{e∈s} w_e comes
/// off (kept in `pairs[0]`).
fn signed_corr(t: DType, o: &mut WBlock) {
    let sub = if fmt(t).sub16 { 16 } else { 32 };
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: AVX2 present.
        let corr = unsafe { avx2::scaled_sum(&o.q, &o.sc, sub == 16) };
        o.pairs[0] = (128 * corr) as u32;
        return;
    }
    let mut corr = 0i32;
    for s in 0..QK_K / sub {
        let ws: i32 = o.q[sub * s..sub * (s + 1)]
            .iter()
            .map(|&v| v as i8 as i32)
            .sum();
        corr += o.sc[s] as i32 * ws;
    }
    o.pairs[0] = (128 * corr) as u32;
}

/// ggml's tiled epilogue of one weight block, from its sub-blocks' integer dot products and
/// activation sums: S1 = Σ scale·dot (less the bias-code correction), S2 = Σ min·sum, then
/// d·S1 and, for the types with mins, − dmin·S2 fused into it.
fn block_res(
    f: Fmt,
    wb: &WBlock,
    nsub: usize,
    dot: impl Fn(usize) -> i32,
    xsum: impl Fn(usize) -> i32,
) -> f32 {
    let (mut s1, mut s2, mut corr) = (0i32, 0i32, 0i32);
    for s in 0..nsub {
        let x = xsum(s);
        s1 = s1.wrapping_add((wb.sc[s] as i32).wrapping_mul(dot(s)));
        corr = corr.wrapping_add(wb.sc[s] as i32 * x);
        if f.has_min {
            let p = wb.pairs[s / 2];
            let m = if s % 2 == 0 { p & 0xffff } else { p >> 16 } as i16 as i32;
            s2 = s2.wrapping_add(m * x);
        }
    }
    s1 = s1.wrapping_sub(f.bias.wrapping_mul(corr));
    let res = wb.d * s1 as f32;
    if f.has_min {
        (-wb.dmin).mul_add(s2 as f32, res)
    } else {
        res
    }
}

/// ggml's tiled result for one weight row `w` (`k` elements of `t`) and one q8_K column `x`:
/// the definition the kernels are tested against.
pub fn dot_ref(t: DType, w: &[u8], x: &[u8], k: usize) -> f32 {
    assert!(supported(t), "qgemm_k: {t} is not supported");
    assert!(
        k.is_multiple_of(QK_K),
        "qgemm_k: {k} is not a multiple of {QK_K}"
    );
    let f = fmt(t);
    let (nb, bsz) = (k / QK_K, t.type_size());
    let sub = if f.sub16 { 16 } else { 32 };
    let mut wb = WBlock::ZERO;
    let mut acc = 0f32;
    for b in 0..nb {
        unpack(t, &w[b * bsz..], &mut wb);
        let xb = &x[b * Q8K..(b + 1) * Q8K];
        let yd = f32::from_le_bytes([xb[0], xb[1], xb[2], xb[3]]);
        let bs16 = |j: usize| i16::from_le_bytes([xb[260 + 2 * j], xb[261 + 2 * j]]) as i32;
        let dot = |s: usize| -> i32 {
            (s * sub..(s + 1) * sub)
                .map(|e| {
                    let wv = if signed(t) {
                        wb.q[e] as i8 as i32
                    } else {
                        wb.q[e] as i32
                    };
                    wv * xb[4 + e] as i8 as i32
                })
                .sum()
        };
        let xsum = |s: usize| {
            if f.sub16 {
                bs16(s)
            } else {
                bs16(2 * s) + bs16(2 * s + 1)
            }
        };
        let res = block_res(f, &wb, QK_K / sub, dot, xsum);
        acc = res.mul_add(yd, acc);
    }
    acc
}

/// Packs up to eight q8_K columns (`None`: a zero column) of `nb` blocks into `out`
/// (`nb * packed_bytes(t)` bytes), block after block, for weights of type `t`.
pub fn pack_group(t: DType, cols: &[Option<&[u8]>; GROUP], nb: usize, out: &mut [u8]) {
    let pb = packed_bytes(t);
    let (od, o16, o32) = offsets(t);
    let nibbles = signed(t);
    assert!(out.len() >= nb * pb, "qgemm_k: packed group too short");
    for col in cols.iter().flatten() {
        assert!(col.len() >= nb * Q8K, "qgemm_k: short q8_K column");
    }
    #[cfg(target_arch = "x86_64")]
    let simd = avx2::available();
    #[cfg(not(target_arch = "x86_64"))]
    let simd = false;
    for b in 0..nb {
        let o = &mut out[b * pb..(b + 1) * pb];
        #[cfg(target_arch = "x86_64")]
        if simd {
            let src = cols.map(|c| c.map(|c| c[b * Q8K + 4..].as_ptr()));
            // SAFETY: AVX2 present; each present column holds this block's 256 values (its
            // length was asserted); `o` holds the packed block.
            unsafe { avx2::interleave(&src, nibbles, o) };
        }
        for (c, col) in cols.iter().enumerate() {
            let Some(col) = col else {
                if !simd {
                    for k4 in 0..qx_bytes(t) / 32 {
                        o[32 * k4 + 4 * c..32 * k4 + 4 * c + 4].fill(0);
                    }
                }
                o[od + 4 * c..od + 4 * c + 4].fill(0);
                for p in 0..8 {
                    o[o16 + 32 * p + 4 * c..o16 + 32 * p + 4 * c + 4].fill(0);
                }
                for p in 0..4 {
                    o[o32 + 32 * p + 4 * c..o32 + 32 * p + 4 * c + 4].fill(0);
                }
                continue;
            };
            let xb = &col[b * Q8K..(b + 1) * Q8K];
            for k4 in 0..if simd { 0 } else { 64 } {
                let x = &xb[4 + 4 * k4..8 + 4 * k4];
                if nibbles {
                    // x + 128 = 16·high + low, both 0..15
                    for e in 0..4 {
                        let u = (x[e] as i8 as i32 + 128) as u8;
                        o[32 * k4 + 4 * c + e] = u >> 4;
                        o[2048 + 32 * k4 + 4 * c + e] = u & 15;
                    }
                } else {
                    o[32 * k4 + 4 * c..32 * k4 + 4 * c + 4].copy_from_slice(x);
                }
            }
            o[od + 4 * c..od + 4 * c + 4].copy_from_slice(&xb[0..4]);
            let bs = |j: usize| i16::from_le_bytes([xb[260 + 2 * j], xb[261 + 2 * j]]);
            for p in 0..8 {
                let at = o16 + 32 * p + 4 * c;
                o[at..at + 2].copy_from_slice(&bs(2 * p).to_le_bytes());
                o[at + 2..at + 4].copy_from_slice(&bs(2 * p + 1).to_le_bytes());
            }
            for p in 0..4 {
                let at = o32 + 32 * p + 4 * c;
                let s32 = |s: usize| bs(2 * s) + bs(2 * s + 1);
                o[at..at + 2].copy_from_slice(&s32(2 * p).to_le_bytes());
                o[at + 2..at + 4].copy_from_slice(&s32(2 * p + 1).to_le_bytes());
            }
        }
    }
}

/// Bytes of one packed (pair of groups, block) in the AVX-512 layout: the 256 activations of
/// sixteen columns interleaved by four (`[64][16][4]`; x + 128 for the signed types), their
/// scales (`[16]` f32), sums of 16 in pairs (`[8][16][2]` i16) and sums of 32 in pairs
/// (`[4][16][2]` i16). Group `2P` fills the first 32 bytes of each 64, group `2P + 1` the rest.
pub const PAIR_BYTES: usize = 4096 + 64 + 512 + 256;
// (their offsets, written by the x86 packing only)
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const PAIR_D: usize = 4096;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const PAIR_BS16: usize = 4096 + 64;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const PAIR_BS32: usize = 4096 + 64 + 512;

/// Whether [`run`] under `isa` takes pairs of groups in the AVX-512 layout (so the packing
/// must be [`pack_half`]'s, with an even number of groups per batch).
pub fn wide(isa: crate::simd::Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx2::available() && crate::ops::qdot::avx2::uses_vnni(isa) && avx512_dq()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// Packs up to eight q8_K columns as half `half` (0 or 1) of a pair of groups in the AVX-512
/// layout ([`PAIR_BYTES`] per block, `nb` blocks at `out`), for weights of type `t`. The two
/// halves of a pair may be packed at the same time by two threads: each writes only its own
/// bytes (the first or last 32 of every 64, and its columns' scales and sums).
///
/// # Safety
/// `out` points at `nb * PAIR_BYTES` writable bytes, of which this half's are written by no
/// one else meanwhile; `half < 2`.
///
/// # Panics
/// Where the CPU lacks AVX2 (the layout is only used with AVX-512), or on a short column.
pub unsafe fn pack_half(
    t: DType,
    cols: &[Option<&[u8]>; GROUP],
    nb: usize,
    out: *mut u8,
    half: usize,
) {
    assert!(half < 2, "qgemm_k: half {half}");
    for col in cols.iter().flatten() {
        assert!(col.len() >= nb * Q8K, "qgemm_k: short q8_K column");
    }
    #[cfg(target_arch = "x86_64")]
    {
        assert!(
            avx2::available(),
            "qgemm_k: the AVX-512 layout without AVX2"
        );
        let form = if signed(t) { 2 } else { 0 };
        for b in 0..nb {
            // SAFETY: block b of the pair lies inside `out` (caller).
            let o = unsafe { out.add(b * PAIR_BYTES) };
            // four bytes of column c at `base + 64 q` (this half's)
            let put = |base: usize, q: usize, c: usize, v: [u8; 4]| {
                // SAFETY: inside the pair block; this half's bytes (caller).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        v.as_ptr(),
                        o.add(base + 64 * q + 32 * half + 4 * c),
                        4,
                    )
                }
            };
            let src = cols.map(|c| c.map(|c| c[b * Q8K + 4..].as_ptr()));
            // SAFETY: AVX2 present; each present column holds this block's 256 values (its
            // length was asserted); this half's step bytes of the block are the caller's.
            unsafe { avx2::interleave_to(&src, form, o, 64, 32 * half) };
            for (c, col) in cols.iter().enumerate() {
                let Some(col) = col else {
                    put(PAIR_D, 0, c, [0; 4]);
                    for q in 0..8 {
                        put(PAIR_BS16, q, c, [0; 4]);
                    }
                    for q in 0..4 {
                        put(PAIR_BS32, q, c, [0; 4]);
                    }
                    continue;
                };
                let xb = &col[b * Q8K..(b + 1) * Q8K];
                put(PAIR_D, 0, c, [xb[0], xb[1], xb[2], xb[3]]);
                let bs = |j: usize| i16::from_le_bytes([xb[260 + 2 * j], xb[261 + 2 * j]]);
                let two = |a: i16, b: i16| {
                    let (a, b) = (a.to_le_bytes(), b.to_le_bytes());
                    [a[0], a[1], b[0], b[1]]
                };
                for q in 0..8 {
                    put(PAIR_BS16, q, c, two(bs(2 * q), bs(2 * q + 1)));
                }
                let s32 = |s: usize| bs(2 * s) + bs(2 * s + 1);
                for q in 0..4 {
                    put(PAIR_BS32, q, c, two(s32(2 * q), s32(2 * q + 1)));
                }
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (t, cols, nb, out, half);
        panic!("qgemm_k: the AVX-512 layout off x86_64");
    }
}

/// Where one batch of a mul_mat lives, for [`run`].
pub struct Batch {
    /// First weight row of the batch, and the bytes between rows.
    pub a: *const u8,
    pub a_nb1: usize,
    /// The batch's packed column groups (`groups * nb * packed_bytes(t)` bytes).
    pub packed: *const u8,
    pub groups: usize,
    /// Valid columns (the last group may be padded).
    pub cols: usize,
    /// Result column 0, row 0, and the bytes between result columns (rows are f32, contiguous).
    pub dst: *mut u8,
    pub d_nb1: usize,
    /// The rows are interleaved by eight (`tessera::layout`), `a` the batch's first group:
    /// only `qgemm_0`'s windowed paths read them so (`qgemm_0::reads_interleaved`).
    pub interleaved: bool,
}

/// Computes rows `rows` of one batch against all its columns with ggml's tiled numerics.
///
/// # Safety
/// `b` describes valid memory: every row in `rows` of `k` elements of `t` at `a + r * a_nb1`,
/// `groups` packed groups of `k / 256` blocks at `packed`, and result cells
/// `dst + c * d_nb1 + 4 * r` for every valid column `c` and row `r` in `rows`, written by this
/// caller only; `scratch` holds [`scratch_size`] bytes used by this caller only.
pub unsafe fn run(
    isa: crate::simd::Isa,
    t: DType,
    k: usize,
    rows: std::ops::Range<usize>,
    b: &Batch,
    scratch: *mut u8,
) {
    let nb = k / QK_K;
    let bsz = t.type_size();
    let pb = packed_bytes(t);
    let al = scratch.align_offset(32);
    // SAFETY: the scratch holds RB·nb WBlocks after aligning to 32 and then RB·ACC_STRIDE
    // f32 (`scratch_size(k)`, caller).
    let (wbs, accs) = unsafe {
        let w = scratch.add(al) as *mut WBlock;
        let acc = scratch.add(al + RB * nb * std::mem::size_of::<WBlock>()) as *mut f32;
        (
            std::slice::from_raw_parts_mut(w, RB * nb),
            std::slice::from_raw_parts_mut(acc, RB * ACC_STRIDE),
        )
    };
    #[cfg(target_arch = "x86_64")]
    let simd = matches!(
        isa,
        crate::simd::Isa::Avx2 | crate::simd::Isa::AvxVnni | crate::simd::Isa::Avx512
    ) && avx2::available();
    #[cfg(target_arch = "x86_64")]
    let vnni = crate::ops::qdot::avx2::uses_vnni(isa);
    #[cfg(target_arch = "x86_64")]
    let avx_vnni = crate::ops::qdot::avx2::uses_avx_vnni(isa);
    // two groups at once in 512-bit registers, packed by `pack_half`
    #[cfg(target_arch = "x86_64")]
    let wide = wide(isa);
    #[cfg(target_arch = "x86_64")]
    assert!(
        !wide || b.groups.is_multiple_of(2),
        "qgemm_k: an odd number of groups in the AVX-512 layout"
    );
    #[cfg(not(target_arch = "x86_64"))]
    let simd = {
        let _ = isa;
        false
    };
    let stride = ACC_STRIDE;
    // AVX-512: as many pairs of groups at a time as keep their packed blocks of the whole row
    // within 1 MiB (L2), so that every window of rows finds them there (64 groups of a
    // 4096-long row would be 2.5 MiB): 1.1-1.2x at K = 4096
    #[cfg(target_arch = "x86_64")]
    let gc = if wide {
        (((1 << 20) / (nb * PAIR_BYTES)).clamp(1, GC / 2)) * 2
    } else {
        GC
    };
    #[cfg(not(target_arch = "x86_64"))]
    let gc = GC;
    // Every block of a window of RB rows is unpacked once, then multiplied against the column
    // windows one after another: the grid types' unpacking (table lookups and signs) costs as
    // much as a window's products, and K = 4096 makes three windows on AVX-512.
    let mut r0 = rows.start;
    while r0 < rows.end {
        let rn = RB.min(rows.end - r0);
        for blk in 0..nb {
            for (r, wb) in wbs[blk * RB..blk * RB + rn].iter_mut().enumerate() {
                // SAFETY: row r0 + r is in `rows`; block blk lies inside its k elements.
                let w = unsafe {
                    std::slice::from_raw_parts(b.a.add((r0 + r) * b.a_nb1 + blk * bsz), bsz)
                };
                unpack(t, w, wb);
            }
        }
        let mut g0 = 0;
        while g0 < b.groups {
            let gn = gc.min(b.groups - g0);
            for acc in accs[..rn * stride].iter_mut() {
                *acc = 0.0;
            }
            for blk in 0..nb {
                let wbs = &wbs[blk * RB..blk * RB + rn];
                let mut g = 0;
                while g < gn {
                    // SAFETY: group g0 + g < groups, block blk < nb (caller's packed layout).
                    let pk = unsafe { b.packed.add(((g0 + g) * nb + blk) * pb) };
                    let acc = &mut accs[g * GROUP..];
                    #[cfg(target_arch = "x86_64")]
                    if wide {
                        // SAFETY: AVX-512 VNNI present (`wide`); the caller packed pairs of
                        // groups (an even count) in that layout; accumulator columns
                        // g·8 .. g·8 + 16 lie in each row.
                        unsafe {
                            let pp = b.packed.add(((g0 + g) / 2 * nb + blk) * PAIR_BYTES);
                            avx512::block2(t, wbs, pp, acc, stride);
                        }
                        g += 2;
                        continue;
                    }
                    if simd {
                        #[cfg(target_arch = "x86_64")]
                        // SAFETY: AVX2/FMA present (checked), VNNI where its kernel runs; pk
                        // is one packed block; the accumulator rows are inside `accs`.
                        unsafe {
                            if vnni {
                                avx2::block_vnni(t, wbs, pk, acc, stride)
                            } else if avx_vnni {
                                avx2::block_avxvnni(t, wbs, pk, acc, stride)
                            } else {
                                avx2::block(t, wbs, pk, acc, stride)
                            }
                        };
                    } else {
                        // SAFETY: pk points at one packed block (caller).
                        let p = unsafe { std::slice::from_raw_parts(pk, pb) };
                        scalar_block(t, wbs, p, acc, stride);
                    }
                    g += 1;
                }
            }
            // store the window: result (column c, row r), column by column so that each
            // column's rows are written contiguously (row by row, every store would go to
            // another column: another page, and for d_nb1 a multiple of 4 KiB the same L1 set)
            let valid = (b.cols - g0 * GROUP).min(gn * GROUP);
            for c in 0..valid {
                // SAFETY: column g0·8 + c < cols and rows r0 .. r0 + rn in `rows` (caller).
                let col = unsafe {
                    std::slice::from_raw_parts_mut(
                        b.dst.add((g0 * GROUP + c) * b.d_nb1 + 4 * r0) as *mut f32,
                        rn,
                    )
                };
                for (r, y) in col.iter_mut().enumerate() {
                    *y = accs[r * stride + c];
                }
            }
            g0 += gn;
        }
        r0 += rn;
    }
}

/// Whether the CPU has AVX-512 DQ (asked once).
#[cfg(target_arch = "x86_64")]
fn avx512_dq() -> bool {
    static DQ: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DQ.get_or_init(|| is_x86_feature_detected!("avx512dq"))
}

/// The scalar form of one block for every row in `wbs` against one packed group: the same
/// sums and float steps as [`dot_ref`].
fn scalar_block(t: DType, wbs: &[WBlock], p: &[u8], acc: &mut [f32], stride: usize) {
    let f = fmt(t);
    let sub = if f.sub16 { 16 } else { 32 };
    let nsub = QK_K / sub;
    let (od, o16, o32) = offsets(t);
    let i16_at = |at: usize| i16::from_le_bytes([p[at], p[at + 1]]) as i32;
    // the eight columns de-interleaved (contiguous, so the dot products below vectorize on any
    // target), their sums per sub-block and their scales
    let mut xs = [[0i16; QK_K]; GROUP];
    let mut xsum = [[0i32; 16]; GROUP];
    let mut yd = [0f32; GROUP];
    for (c, x) in xs.iter_mut().enumerate() {
        for (e, v) in x.iter_mut().enumerate() {
            let at = 32 * (e / 4) + 4 * c + e % 4;
            *v = if signed(t) {
                16 * p[at] as i16 + p[2048 + at] as i16 - 128
            } else {
                p[at] as i8 as i16
            };
        }
        for (s, xs) in xsum[c].iter_mut().enumerate().take(nsub) {
            let base = if f.sub16 { o16 } else { o32 };
            *xs = i16_at(base + 32 * (s / 2) + 4 * c + 2 * (s % 2));
        }
        yd[c] = f32::from_le_bytes([
            p[od + 4 * c],
            p[od + 4 * c + 1],
            p[od + 4 * c + 2],
            p[od + 4 * c + 3],
        ]);
    }
    let mut w = [0i16; QK_K];
    for (r, wb) in wbs.iter().enumerate() {
        for (v, &q) in w.iter_mut().zip(&wb.q) {
            *v = if signed(t) { q as i8 as i16 } else { q as i16 };
        }
        for c in 0..GROUP {
            let dot = |s: usize| -> i32 {
                w[s * sub..(s + 1) * sub]
                    .iter()
                    .zip(&xs[c][s * sub..(s + 1) * sub])
                    .map(|(&a, &b)| a as i32 * b as i32)
                    .sum()
            };
            let res = block_res(f, wb, nsub, dot, |s| xsum[c][s]);
            let a = &mut acc[r * stride + c];
            *a = res.mul_add(yd[c], *a);
        }
    }
}

#[cfg(target_arch = "x86_64")]
// the `unsafe` blocks around intrinsics date from a minimum Rust version before they were safe
#[allow(unused_unsafe)]
mod avx2 {
    use std::arch::x86_64::*;

    use tessera::DType;

    use super::{WBlock, GROUP, KVALUES_IQ4NL};

    /// Offsets in a packed block of the non-iq4_xs types (`super::offsets`).
    const OFF_D: usize = 2048;
    const OFF_BS16: usize = 2080;
    const OFF_BS32: usize = 2336;

    pub fn available() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    /// The 256 activations of up to eight columns (`None`: zeros) interleaved by four bytes
    /// (`[64][8][4]`), or for `nibbles` the high then the low nibbles of x + 128 likewise:
    /// an 8×8 transpose of 32-bit words per 32 bytes of each column.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn interleave(cols: &[Option<*const u8>; 8], nibbles: bool, o: &mut [u8]) {
        assert!(o.len() >= if nibbles { 4096 } else { 2048 });
        // SAFETY: forwarded; `o` holds the bytes written (asserted).
        unsafe { interleave_to(cols, if nibbles { 1 } else { 0 }, o.as_mut_ptr(), 32, 0) }
    }

    /// [`interleave`] with the 32 bytes of each step `stride` bytes apart, from byte `off`
    /// of `op`; `form` 0: the bytes, 1: the nibbles of x + 128 (high ones first, low ones 2048
    /// bytes on), 2: x + 128 as bytes.
    ///
    /// # Safety
    /// AVX2 present; every present column has 256 readable bytes; the 32 bytes of each of the
    /// 64 steps (and for nibbles the 2048 bytes after) are writable at `op` and written by no
    /// one else meanwhile.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn interleave_to(
        cols: &[Option<*const u8>; 8],
        form: u8,
        op: *mut u8,
        stride: usize,
        off: usize,
    ) {
        let nibbles = form == 1;
        // SAFETY: the caller's guarantees.
        unsafe {
            let m4 = _mm256_set1_epi8(15);
            let flip = _mm256_set1_epi8(-128);
            for t in 0..8 {
                let r: [__m256i; 8] = std::array::from_fn(|c| match cols[c] {
                    Some(p) => _mm256_loadu_si256(p.add(32 * t) as *const __m256i),
                    None => _mm256_setzero_si256(),
                });
                // word j of every column
                let w = crate::ops::qdot::avx2::transpose8(r.map(|v| _mm256_castsi256_ps(v)))
                    .map(|v| _mm256_castps_si256(v));
                for (j, v) in w.iter().enumerate() {
                    let at = off + stride * (8 * t + j);
                    if form == 2 {
                        _mm256_storeu_si256(op.add(at) as *mut __m256i, _mm256_xor_si256(*v, flip));
                    } else if nibbles {
                        // a missing column packs as x = 0 (its d is 0, its results dropped)
                        let u = _mm256_xor_si256(*v, flip);
                        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(u), m4);
                        _mm256_storeu_si256(op.add(at) as *mut __m256i, hi);
                        _mm256_storeu_si256(
                            op.add(2048 + at) as *mut __m256i,
                            _mm256_and_si256(u, m4),
                        );
                    } else {
                        _mm256_storeu_si256(op.add(at) as *mut __m256i, *v);
                    }
                }
            }
        }
    }

    /// Σ_s sc[s] · Σ_{e∈s} q[e] over the sub-blocks (of 16 elements if `sub16`, else 32) of
    /// signed values `q` (as `super::signed_corr`'s loop).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scaled_sum(q: &[u8; 256], sc: &[i16; 16], sub16: bool) -> i32 {
        // SAFETY: the loads stay inside `q`.
        unsafe {
            let ones = _mm256_set1_epi8(1);
            let mut acc = _mm256_setzero_si256();
            for j in 0..8 {
                let v = _mm256_loadu_si256(q.as_ptr().add(32 * j) as *const __m256i);
                // pairs of values as i16 (1·a + 1·b, exact), then times the scales as i32
                let p = _mm256_maddubs_epi16(ones, v);
                let s = if sub16 {
                    _mm256_setr_m128i(_mm_set1_epi16(sc[2 * j]), _mm_set1_epi16(sc[2 * j + 1]))
                } else {
                    _mm256_set1_epi16(sc[j])
                };
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, s));
            }
            let h = _mm_add_epi32(
                _mm256_castsi256_si128(acc),
                _mm256_extracti128_si256::<1>(acc),
            );
            let h = _mm_add_epi32(h, _mm_shuffle_epi32::<0b01_00_11_10>(h));
            let h = _mm_add_epi32(h, _mm_shuffle_epi32::<0b10_11_00_01>(h));
            _mm_cvtsi128_si32(h)
        }
    }

    /// The codes of one q4_K, q5_K, q6_K or iq4_xs block at `w` (as `codes_scalar`).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn unpack_codes(t: DType, w: *const u8, q: &mut [u8; 256]) {
        // SAFETY: one block of t at w (caller); 256 bytes at q.
        unsafe {
            let m4 = _mm256_set1_epi8(15);
            let qp = q.as_mut_ptr();
            let st = |at: usize, v: __m256i| _mm256_storeu_si256(qp.add(at) as *mut __m256i, v);
            let ld = |at: usize| _mm256_loadu_si256(w.add(at) as *const __m256i);
            match t {
                DType::Q4K | DType::Q5K => {
                    let qs = if t == DType::Q4K { 16 } else { 48 };
                    let qh = ld(16);
                    let one = _mm256_set1_epi8(1);
                    for j in 0..4 {
                        let v = ld(qs + 32 * j);
                        let mut lo = _mm256_and_si256(v, m4);
                        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                        if t == DType::Q5K {
                            let sh = _mm_cvtsi32_si128(2 * j as i32);
                            let b0 = _mm256_and_si256(_mm256_srl_epi16(qh, sh), one);
                            let sh1 = _mm_cvtsi32_si128(2 * j as i32 + 1);
                            let b1 = _mm256_and_si256(_mm256_srl_epi16(qh, sh1), one);
                            lo = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(b0));
                            hi = _mm256_or_si256(hi, _mm256_slli_epi16::<4>(b1));
                        }
                        st(64 * j, lo);
                        st(64 * j + 32, hi);
                    }
                }
                DType::Q6K => {
                    let m3 = _mm256_set1_epi8(3);
                    for n in 0..2 {
                        let (l0, l1, h) = (ld(64 * n), ld(64 * n + 32), ld(128 + 32 * n));
                        let hb = |s: i32| {
                            let v = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(s)), m3);
                            _mm256_slli_epi16::<4>(v)
                        };
                        st(128 * n, _mm256_or_si256(_mm256_and_si256(l0, m4), hb(0)));
                        st(
                            128 * n + 32,
                            _mm256_or_si256(_mm256_and_si256(l1, m4), hb(2)),
                        );
                        let l0h = _mm256_and_si256(_mm256_srli_epi16::<4>(l0), m4);
                        let l1h = _mm256_and_si256(_mm256_srli_epi16::<4>(l1), m4);
                        st(128 * n + 64, _mm256_or_si256(l0h, hb(4)));
                        st(128 * n + 96, _mm256_or_si256(l1h, hb(6)));
                    }
                }
                DType::IQ4XS => {
                    let values = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
                    let m4 = _mm_set1_epi8(15);
                    for ib in 0..8 {
                        let v = _mm_loadu_si128(w.add(8 + 16 * ib) as *const __m128i);
                        let lo = _mm_shuffle_epi8(values, _mm_and_si128(v, m4));
                        let hi =
                            _mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16::<4>(v), m4));
                        _mm_storeu_si128(qp.add(32 * ib) as *mut __m128i, lo);
                        _mm_storeu_si128(qp.add(32 * ib + 16) as *mut __m128i, hi);
                    }
                }
                _ => unreachable!("checked by the caller"),
            }
        }
    }

    /// One block of every row in `wbs` against one packed group, four rows at a time.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn block(t: DType, wbs: &[WBlock], p: *const u8, acc: &mut [f32], stride: usize) {
        // SAFETY: forwarded.
        unsafe { block_in(t, wbs, p, acc, stride) }
    }

    /// [`block`] compiled for AVX-512 VNNI: the compiler folds each `vpmaddwd` of a scale
    /// and the `vpaddd` after it into one `vpdpwssd` (the same integers, so the same results).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn block_vnni(
        t: DType,
        wbs: &[WBlock],
        p: *const u8,
        acc: &mut [f32],
        stride: usize,
    ) {
        // SAFETY: forwarded.
        unsafe { block_in(t, wbs, p, acc, stride) }
    }

    /// [`block`] compiled for AVX-VNNI (the VEX `vpdpwssd`; the same results).
    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    pub unsafe fn block_avxvnni(
        t: DType,
        wbs: &[WBlock],
        p: *const u8,
        acc: &mut [f32],
        stride: usize,
    ) {
        // SAFETY: forwarded.
        unsafe { block_in(t, wbs, p, acc, stride) }
    }

    #[inline(always)]
    unsafe fn block_in(t: DType, wbs: &[WBlock], p: *const u8, acc: &mut [f32], stride: usize) {
        let mut r = 0;
        // SAFETY: p is one packed block (caller); the accumulator rows r..r+R, columns 0..8 lie
        // inside `acc` (rows < wbs.len(), row stride `stride` ≥ 8).
        unsafe {
            while r < wbs.len() {
                let a = acc.as_mut_ptr().add(r * stride);
                if r + 4 <= wbs.len() {
                    let w = [&wbs[r], &wbs[r + 1], &wbs[r + 2], &wbs[r + 3]];
                    dispatch::<4>(t, w, p, a, stride);
                    r += 4;
                } else {
                    dispatch::<1>(t, [&wbs[r]], p, a, stride);
                    r += 1;
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn dispatch<const R: usize>(
        t: DType,
        w: [&WBlock; R],
        p: *const u8,
        acc: *mut f32,
        stride: usize,
    ) {
        // SAFETY: forwarded from `block`.
        unsafe {
            match t {
                DType::Q4K => codes::<R, 8, false, true, 0>(w, p, acc, stride),
                DType::Q5K => codes::<R, 4, false, true, 0>(w, p, acc, stride),
                DType::Q6K => codes::<R, 2, true, false, 32>(w, p, acc, stride),
                DType::Q3K => codes::<R, 4, true, false, 4>(w, p, acc, stride),
                DType::Q2K => codes::<R, 4, true, true, 0>(w, p, acc, stride),
                DType::IQ4XS | DType::IQ2XXS | DType::IQ3XXS | DType::IQ3S | DType::IQ1S => {
                    nibbles::<R, false>(w, p, acc, stride)
                }
                DType::IQ2XS | DType::IQ2S | DType::IQ1M => nibbles::<R, true>(w, p, acc, stride),
                _ => unreachable!("checked by supported"),
            }
        }
    }

    /// Unsigned codes: `SPM` four-element steps are summed in 16 bits before each `vpmaddwd`
    /// with the sub-block's scale (`SPM` × 2 × max code × 127 < 32768 for the codes of the
    /// types using it).
    #[inline(always)]
    unsafe fn codes<
        const R: usize,
        const SPM: usize,
        const SUB16: bool,
        const HAS_MIN: bool,
        const BIAS: i32,
    >(
        w: [&WBlock; R],
        p: *const u8,
        acc: *mut f32,
        stride: usize,
    ) {
        let steps_per_sub = if SUB16 { 4 } else { 8 };
        let nsub = 64 / steps_per_sub;
        // SAFETY: p points at one packed block; every read below is inside it or inside the
        // weight blocks; acc rows 0..R, columns 0..8 are writable (caller).
        unsafe {
            let mut s1 = [_mm256_setzero_si256(); R];
            for s in 0..nsub {
                for m in 0..steps_per_sub / SPM {
                    let mut a16 = [_mm256_setzero_si256(); R];
                    for st in 0..SPM {
                        let k4 = s * steps_per_sub + m * SPM + st;
                        let x = _mm256_loadu_si256(p.add(32 * k4) as *const __m256i);
                        for r in 0..R {
                            let wv = _mm256_set1_epi32(
                                (w[r].q.as_ptr().add(4 * k4) as *const i32).read_unaligned(),
                            );
                            a16[r] = _mm256_add_epi16(a16[r], _mm256_maddubs_epi16(wv, x));
                        }
                    }
                    for r in 0..R {
                        let sc = _mm256_set1_epi16(w[r].sc[s]);
                        s1[r] = _mm256_add_epi32(s1[r], _mm256_madd_epi16(a16[r], sc));
                    }
                }
            }
            let yd = _mm256_loadu_ps(p.add(OFF_D) as *const f32);
            for r in 0..R {
                let mut s1r = s1[r];
                let mut s2 = _mm256_setzero_si256();
                if HAS_MIN || BIAS != 0 {
                    // Σ_s (min or scale)_s · Σ_{e∈s} x_e, two sub-blocks per vpmaddwd
                    let (off, np) = if SUB16 { (OFF_BS16, 8) } else { (OFF_BS32, 4) };
                    for q in 0..np {
                        let bs = _mm256_loadu_si256(p.add(off + 32 * q) as *const __m256i);
                        let pr = _mm256_set1_epi32(w[r].pairs[q] as i32);
                        s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(pr, bs));
                    }
                }
                if BIAS != 0 {
                    s1r = _mm256_sub_epi32(s1r, _mm256_mullo_epi32(s2, _mm256_set1_epi32(BIAS)));
                }
                let mut res = _mm256_mul_ps(_mm256_set1_ps(w[r].d), _mm256_cvtepi32_ps(s1r));
                if HAS_MIN {
                    res = _mm256_fnmadd_ps(_mm256_set1_ps(w[r].dmin), _mm256_cvtepi32_ps(s2), res);
                }
                let a = acc.add(r * stride);
                _mm256_storeu_ps(a, _mm256_fmadd_ps(res, yd, _mm256_loadu_ps(a)));
            }
        }
    }

    /// iq4_xs: signed codebook values up to ±127 against x + 128 split into nibbles (both
    /// 0..15, packed that way), so eight steps add up in 16 bits as for 4-bit codes:
    /// Σ w·x = 16·Σ w·high + Σ w·low − 128·Σ w, the last term from the unpacked block.
    #[inline(always)]
    unsafe fn nibbles<const R: usize, const SUB16: bool>(
        w: [&WBlock; R],
        p: *const u8,
        acc: *mut f32,
        stride: usize,
    ) {
        let steps = if SUB16 { 4 } else { 8 };
        // SAFETY: as in `codes` (the packed block holds 4096 bytes of nibbles first).
        unsafe {
            let mut s1 = [_mm256_setzero_si256(); R];
            for s in 0..64 / steps {
                let mut ah = [_mm256_setzero_si256(); R];
                let mut al = [_mm256_setzero_si256(); R];
                for st in 0..steps {
                    let k4 = steps * s + st;
                    let xh = _mm256_loadu_si256(p.add(32 * k4) as *const __m256i);
                    let xl = _mm256_loadu_si256(p.add(2048 + 32 * k4) as *const __m256i);
                    for r in 0..R {
                        let wv = _mm256_set1_epi32(
                            (w[r].q.as_ptr().add(4 * k4) as *const i32).read_unaligned(),
                        );
                        ah[r] = _mm256_add_epi16(ah[r], _mm256_maddubs_epi16(xh, wv));
                        al[r] = _mm256_add_epi16(al[r], _mm256_maddubs_epi16(xl, wv));
                    }
                }
                for r in 0..R {
                    let sc = w[r].sc[s];
                    let h = _mm256_madd_epi16(ah[r], _mm256_set1_epi16(16 * sc));
                    let l = _mm256_madd_epi16(al[r], _mm256_set1_epi16(sc));
                    s1[r] = _mm256_add_epi32(s1[r], _mm256_add_epi32(h, l));
                }
            }
            let yd = _mm256_loadu_ps(p.add(4096) as *const f32);
            for r in 0..R {
                let s1r = _mm256_sub_epi32(s1[r], _mm256_set1_epi32(w[r].pairs[0] as i32));
                let res = _mm256_mul_ps(_mm256_set1_ps(w[r].d), _mm256_cvtepi32_ps(s1r));
                let a = acc.add(r * stride);
                _mm256_storeu_ps(a, _mm256_fmadd_ps(res, yd, _mm256_loadu_ps(a)));
            }
        }
    }

    const _: () = assert!(GROUP == 8);
}

/// AVX-512 VNNI: two packed groups (16 columns) in the lanes of 512-bit registers, `vpdpbusd`
/// summing four products straight into 32 bits. Sub-block by sub-block, the exact integer dot
/// products are scaled by `vpmulld` (as ggml's VNNI tiled kernel does), so S1 and S2 — and
/// with them every float step of [`super::dot_ref`] — are the AVX2 kernel's. The signed types
/// multiply x + 128 (packed so by [`pack_half`]) by the signed values and take
/// `128 · Σ_s scale_s · Σ_{e∈s} w_e` off, as the AVX2 kernel does.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use tessera::DType;

    use super::WBlock;

    use super::{PAIR_BS16, PAIR_BS32, PAIR_D};

    /// 64 bytes at `p`.
    #[inline(always)]
    unsafe fn ld(p: *const u8) -> __m512i {
        // SAFETY: 64 readable bytes at p (caller).
        unsafe { _mm512_loadu_si512(p as *const _) }
    }

    /// One block of every row in `wbs` against the pair of groups packed at `p`
    /// (`super::pack_half`'s layout; columns 0..16 of the accumulator rows), eight rows at a
    /// time.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/DQ/VL and VNNI; `p` points at one packed pair block (of type
    /// `t`); the accumulator rows `0..wbs.len()` (stride `stride` ≥ 16) hold 16 floats each.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")]
    pub unsafe fn block2(t: DType, wbs: &[WBlock], p: *const u8, acc: &mut [f32], stride: usize) {
        let mut r = 0;
        // SAFETY: the caller's guarantees; rows r..r+R are inside `wbs` and `acc`.
        unsafe {
            while r < wbs.len() {
                let a = acc.as_mut_ptr().add(r * stride);
                if r + 8 <= wbs.len() {
                    dispatch::<8>(t, &wbs[r..r + 8], p, a, stride);
                    r += 8;
                } else if r + 4 <= wbs.len() {
                    dispatch::<4>(t, &wbs[r..r + 4], p, a, stride);
                    r += 4;
                } else {
                    dispatch::<1>(t, &wbs[r..r + 1], p, a, stride);
                    r += 1;
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn dispatch<const R: usize>(
        t: DType,
        w: &[WBlock],
        p: *const u8,
        acc: *mut f32,
        stride: usize,
    ) {
        let w: [&WBlock; R] = std::array::from_fn(|i| &w[i]);
        // SAFETY: forwarded from `block2`.
        unsafe {
            match t {
                DType::Q4K | DType::Q5K => body::<R, false, true, 0>(w, p, acc, stride),
                DType::Q6K => body::<R, true, false, 32>(w, p, acc, stride),
                DType::Q3K => body::<R, true, false, 4>(w, p, acc, stride),
                DType::Q2K => body::<R, true, true, 0>(w, p, acc, stride),
                DType::IQ4XS | DType::IQ2XXS | DType::IQ3XXS | DType::IQ3S | DType::IQ1S => {
                    body::<R, false, false, -1>(w, p, acc, stride)
                }
                DType::IQ2XS | DType::IQ2S | DType::IQ1M => {
                    body::<R, true, false, -1>(w, p, acc, stride)
                }
                _ => unreachable!("checked by supported"),
            }
        }
    }

    /// `BIAS` ≥ 0: unsigned codes with that bias against the activations; `BIAS` = −1: the
    /// signed types (x + 128 against the signed values, `pairs[0]` taken off).
    #[inline(always)]
    unsafe fn body<const R: usize, const SUB16: bool, const HAS_MIN: bool, const BIAS: i32>(
        w: [&WBlock; R],
        p: *const u8,
        acc: *mut f32,
        stride: usize,
    ) {
        let sgn = BIAS < 0;
        let steps = if SUB16 { 4 } else { 8 };
        // SAFETY: every read is inside the packed blocks or the weight blocks; acc rows 0..R,
        // columns 0..16 are writable (caller).
        unsafe {
            let mut s1 = [_mm512_setzero_si512(); R];
            for s in 0..64 / steps {
                let mut a32 = [_mm512_setzero_si512(); R];
                for st in 0..steps {
                    let k4 = steps * s + st;
                    let x = ld(p.add(64 * k4));
                    for r in 0..R {
                        let wv = _mm512_set1_epi32(
                            (w[r].q.as_ptr().add(4 * k4) as *const i32).read_unaligned(),
                        );
                        a32[r] = if sgn {
                            _mm512_dpbusd_epi32(a32[r], x, wv)
                        } else {
                            _mm512_dpbusd_epi32(a32[r], wv, x)
                        };
                    }
                }
                for r in 0..R {
                    let sc = _mm512_set1_epi32(w[r].sc[s] as i32);
                    s1[r] = _mm512_add_epi32(s1[r], _mm512_mullo_epi32(a32[r], sc));
                }
            }
            let yd = _mm512_castsi512_ps(ld(p.add(PAIR_D)));
            for r in 0..R {
                let mut s1r = s1[r];
                let mut s2 = _mm512_setzero_si512();
                if HAS_MIN || BIAS > 0 {
                    // Σ_s (min or scale)_s · Σ_{e∈s} x_e, two sub-blocks per vpmaddwd
                    let (off, np) = if SUB16 {
                        (PAIR_BS16, 8)
                    } else {
                        (PAIR_BS32, 4)
                    };
                    for q in 0..np {
                        let bs = ld(p.add(off + 64 * q));
                        let pr = _mm512_set1_epi32(w[r].pairs[q] as i32);
                        s2 = _mm512_add_epi32(s2, _mm512_madd_epi16(pr, bs));
                    }
                }
                if BIAS > 0 {
                    s1r = _mm512_sub_epi32(s1r, _mm512_mullo_epi32(s2, _mm512_set1_epi32(BIAS)));
                }
                if sgn {
                    s1r = _mm512_sub_epi32(s1r, _mm512_set1_epi32(w[r].pairs[0] as i32));
                }
                let mut res = _mm512_mul_ps(_mm512_set1_ps(w[r].d), _mm512_cvtepi32_ps(s1r));
                if HAS_MIN {
                    res = _mm512_fnmadd_ps(_mm512_set1_ps(w[r].dmin), _mm512_cvtepi32_ps(s2), res);
                }
                let a = acc.add(r * stride);
                _mm512_storeu_ps(a, _mm512_fmadd_ps(res, yd, _mm512_loadu_ps(a)));
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// `signed_bytes` negates exactly the flagged bytes of every entry of the grids it is used
    /// on, for every sign byte (it relies on no grid byte being 0).
    #[test]
    fn signed_bytes_negates_the_flagged_bytes_of_every_grid_entry() {
        use tessera_quants::iq_grids::*;
        let grids = IQ2XXS_GRID
            .iter()
            .chain(&IQ2XS_GRID)
            .chain(&IQ2S_GRID)
            .copied()
            .chain(
                IQ3XXS_GRID
                    .iter()
                    .zip(IQ3XXS_GRID.iter().rev())
                    .map(|(&a, &b)| a as u64 | (b as u64) << 32),
            )
            .chain(
                IQ3S_GRID
                    .iter()
                    .zip(IQ3S_GRID.iter().rev())
                    .map(|(&a, &b)| a as u64 | (b as u64) << 32),
            );
        let mut n = 0;
        for g in grids {
            for s in 0..=255u8 {
                let got = signed_bytes(g, s).to_le_bytes();
                for (j, (&v, &y)) in g.to_le_bytes().iter().zip(&got).enumerate() {
                    let want = if s & (1 << j) != 0 {
                        (v as i8).wrapping_neg() as u8
                    } else {
                        v
                    };
                    assert_eq!(y, want, "grid {g:#018x} signs {s:#04x} byte {j}");
                }
            }
            n += 1;
        }
        assert_eq!(n, 256 + 512 + 1024 + 256 + 512);
    }

    /// The AVX2 sum behind the signed types' correction equals its scalar loop, for sub-blocks
    /// of 16 and of 32, on random and extreme values and scales.
    #[test]
    fn simd_scaled_sum_equals_the_loop() {
        if !avx2::available() {
            return;
        }
        let mut x = 0x1234_5678u32;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        for case in 0..200 {
            let q: [u8; QK_K] = std::array::from_fn(|_| match case % 3 {
                0 => 0x80,
                1 => 0x7f,
                _ => next() as u8,
            });
            let sc: [i16; 16] = std::array::from_fn(|_| (next() % 255) as i16 - 127);
            for sub16 in [false, true] {
                let sub = if sub16 { 16 } else { 32 };
                let want: i32 = (0..QK_K / sub)
                    .map(|s| {
                        let ws: i32 = q[sub * s..sub * (s + 1)]
                            .iter()
                            .map(|&v| v as i8 as i32)
                            .sum();
                        sc[s] as i32 * ws
                    })
                    .sum();
                // SAFETY: AVX2 present (checked).
                let got = unsafe { avx2::scaled_sum(&q, &sc, sub16) };
                assert_eq!(got, want, "case {case} sub16 {sub16}");
            }
        }
    }

    /// The AVX2 code unpacking equals the scalar one on random block bytes (every bit pattern
    /// of the quantized fields, not just quantizer output).
    #[test]
    fn simd_codes_equal_scalar_codes() {
        #[cfg(target_arch = "x86_64")]
        if avx2::available() {
            let mut x = 0x9e37_79b9u32;
            for t in [DType::Q4K, DType::Q5K, DType::Q6K, DType::IQ4XS] {
                for _ in 0..50 {
                    let w: Vec<u8> = (0..t.type_size())
                        .map(|_| {
                            x ^= x << 13;
                            x ^= x >> 17;
                            x ^= x << 5;
                            x as u8
                        })
                        .collect();
                    let mut a = [0u8; QK_K];
                    let mut b = [0u8; QK_K];
                    codes_scalar(t, &w, &mut a);
                    // SAFETY: AVX2 present; w holds one block.
                    unsafe { avx2::unpack_codes(t, w.as_ptr(), &mut b) };
                    assert_eq!(a, b, "{t}");
                }
            }
        }
    }
}
