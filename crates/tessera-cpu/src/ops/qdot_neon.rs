//! aarch64 NEON integer dot products for the quantized weight types, one weight row against one
//! activation row (q8_0, q8_1 or q8_K, as `matmul_quant::vec_dot_type` pairs them): kernels of
//! their own for q4_0, q4_1, q8_0, q5_0, q5_1, iq4_nl, q2_K … q6_K, iq4_xs, tq1_0 and tq2_0;
//! for the lattice i-quants (iq1/iq2/iq3) and the small-float types (mxfp4, nvfp4, q1_0, q2_0)
//! the NEON integer sums of [`NeonSums`] under those files' generic code.
//!
//! Each kernel returns exactly what the scalar path returns. q4_0, q4_1 and q8_0 follow ggml's
//! AVX2 arithmetic there (`matmul_quant::vec_dot_scalar`: eight lanes of 4-element sums, fused
//! multiply-adds, ggml's horizontal sum), the other types ggml's generic C code (`qdot.rs`). The
//! integer sums are exact whatever the grouping, so NEON forms them 16 lanes at a time, in the
//! lanes the float arithmetic needs: 4-element groups for the legacy types (SDOT's own
//! grouping), and where the generic code keeps eight integer lanes (q3_K … q6_K: element `e` in
//! lane `e mod 8`, each lane scaled into its own float lane) `vmull_s8` of 16 elements puts
//! elements `l` and `l + 8` into 16-bit lane `l` and `vmlal_n_s16` adds that lane times the
//! group's scale into 32-bit lane `l`. The per-block float arithmetic is then the scalar path's
//! own, operation for operation (fused where it fuses, never otherwise). So NEON results equal
//! llama.cpp's x86 AVX2 build for the legacy types and its generic build for the others (the
//! fixtures' `generic` column); ggml's own NEON kernels sum in another order and differ from
//! both in the last bits.
//!
//! Baseline NEON everywhere, SDOT (`dotprod`) where the CPU has it for the kernels that sum
//! whole blocks. The 16-bit partial sums never overflow: each kernel's comment gives the bound
//! of its products and how many share a lane.
//!
//! Tested under `qemu-aarch64` with and without SDOT (see the README, `tests/neon.rs`): against
//! the fixtures, and against the scalar path on rows of every extreme code.

// The `unsafe` blocks around register arithmetic date from a minimum Rust version (1.85)
// before intrinsics were safe inside `#[target_feature]` functions (1.87).
#![allow(unused_unsafe)]

use std::arch::aarch64::*;

use tessera::DType;

use super::qdot::{k4_scales_mins, q3k_scales, IntSums, KVALUES_IQ4NL};
use super::qdot_fp::KVALUES_FP4;

const QK_K: usize = 256;

/// Weight types with NEON integer sums: every type with an integer kernel (`matmul_quant`'s
/// three and `qdot`'s eleven with kernels here; the lattice i-quants and the small-float types
/// through [`NeonSums`]).
pub fn covers(t: DType) -> bool {
    use DType::*;
    let own = [
        Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, IQ4NL, Q2K, Q3K, Q4K, Q5K, Q6K, IQ4XS, TQ1_0, TQ2_0,
    ];
    own.contains(&t)
        || super::qdot_iq2::supported(t)
        || super::qdot_iq13::supported(t)
        || super::qdot_fp::supported(t)
}

#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: the caller's block holds two bytes at p.
    let b = unsafe { std::ptr::read_unaligned(p as *const [u8; 2]) };
    half::f16::from_bits(u16::from_le_bytes(b)).to_f32()
}

#[inline(always)]
unsafe fn f32_at(p: *const u8) -> f32 {
    // SAFETY: the caller's block holds four bytes at p.
    f32::from_le_bytes(unsafe { std::ptr::read_unaligned(p as *const [u8; 4]) })
}

#[inline(always)]
unsafe fn u8x16(p: *const u8) -> uint8x16_t {
    // SAFETY: the caller's block holds 16 bytes at p.
    unsafe { vld1q_u8(p) }
}

#[inline(always)]
unsafe fn i8x16(p: *const u8) -> int8x16_t {
    // SAFETY: the caller's block holds 16 bytes at p.
    unsafe { vld1q_s8(p as *const i8) }
}

#[inline(always)]
unsafe fn s8(v: uint8x16_t) -> int8x16_t {
    unsafe { vreinterpretq_s8_u8(v) }
}

/// 16-bit lane `l` = `a[l]·b[l] + a[l+8]·b[l+8]` (two products a lane: callers keep
/// `|a·b| ≤ 16383` or add fewer lanes together, as each says).
#[inline(always)]
unsafe fn mul16(a: int8x16_t, b: int8x16_t) -> int16x8_t {
    unsafe { vmlal_high_s8(vmull_s8(vget_low_s8(a), vget_low_s8(b)), a, b) }
}

/// `acc` plus the 16 products `a·b`, four consecutive ones into each 32-bit lane: SDOT, the
/// Armv8.2 dot-product instruction. Only for functions compiled with `dotprod`.
#[inline(always)]
unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: register arithmetic; the callers run only where the CPU has `dotprod`.
    unsafe {
        std::arch::asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// `Σ a·b + Σ c·d` over two 16-lane pairs. With SDOT (`D`) the products go straight into
/// 32-bit lanes; without, into 16-bit lanes, four a lane (the callers keep `|product| ≤ 8191`)
/// or, `wide`, two a lane with each pair widened on its own (`|product| ≤ 16383`).
#[inline(always)]
unsafe fn sum32<const D: bool>(
    a: int8x16_t,
    b: int8x16_t,
    c: int8x16_t,
    d: int8x16_t,
    wide: bool,
) -> i32 {
    unsafe {
        if D {
            vaddvq_s32(sdot(sdot(vdupq_n_s32(0), a, b), c, d))
        } else if wide {
            vaddlvq_s16(mul16(a, b)) + vaddlvq_s16(mul16(c, d))
        } else {
            vaddlvq_s16(vaddq_s16(mul16(a, b), mul16(c, d)))
        }
    }
}

/// Whether this CPU has SDOT (`dotprod`), asked once. The kernels that sum whole blocks use it
/// when present; the eight-lane k-quant kernels (q3_K … q6_K) need element e in lane e mod 8,
/// which SDOT's groups of four do not give, and use `vmull_s8` everywhere.
pub fn has_dotprod() -> bool {
    static D: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *D.get_or_init(|| std::arch::is_aarch64_feature_detected!("dotprod"))
}

/// `acc[l] += s·p[l]`, 32-bit lanes 0..8 (lane `l` of the generic code's `aux32`).
#[inline(always)]
unsafe fn scale_add(acc: &mut [int32x4_t; 2], p: int16x8_t, s: i16) {
    unsafe {
        acc[0] = vmlal_n_s16(acc[0], vget_low_s16(p), s);
        acc[1] = vmlal_high_n_s16(acc[1], p, s);
    }
}

/// The 16 bits of `v` as 16 byte masks (0xff where the bit is set), bit j in byte j.
#[inline(always)]
unsafe fn bit_masks(v: u16) -> uint8x16_t {
    const BITS: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    unsafe {
        let b = vcombine_u8(vdup_n_u8(v as u8), vdup_n_u8((v >> 8) as u8));
        vtstq_u8(b, vld1q_u8(BITS.as_ptr()))
    }
}

/// Bytes shifted right by `n` (0..8) bits.
#[inline(always)]
unsafe fn shr(v: uint8x16_t, n: usize) -> uint8x16_t {
    unsafe { vshlq_u8(v, vdupq_n_s8(-(n as i8))) }
}

/// Adds the float lanes of one block: `sums[l] += d·aux[l]` (multiply, then add, per lane).
#[inline(always)]
unsafe fn add_scaled(sums: &mut [float32x4_t; 2], aux: [int32x4_t; 2], d: f32) {
    unsafe {
        sums[0] = vaddq_f32(sums[0], vmulq_n_f32(vcvtq_f32_s32(aux[0]), d));
        sums[1] = vaddq_f32(sums[1], vmulq_n_f32(vcvtq_f32_s32(aux[1]), d));
    }
}

/// `sumf + lane 0 + lane 1 + … + lane 7`, in that order.
#[inline(always)]
unsafe fn add_lanes(mut sumf: f32, sums: [float32x4_t; 2]) -> f32 {
    let mut l = [0f32; 8];
    // SAFETY: l holds eight floats.
    unsafe {
        vst1q_f32(l.as_mut_ptr(), sums[0]);
        vst1q_f32(l.as_mut_ptr().add(4), sums[1]);
    }
    for v in l {
        sumf += v;
    }
    sumf
}

/// q4_0, q4_1 and q8_0 against q8_0 / q8_1: ggml's AVX2 arithmetic, as
/// `matmul_quant::vec_dot_scalar` computes it (so the same bits as the x86 kernels).
///
/// # Safety
/// `w` and `x` hold `nb` blocks of their formats.
pub(crate) unsafe fn vec_dot_legacy(t: DType, w: &[u8], x: &[u8], nb: usize) -> f32 {
    // SAFETY: the caller's guarantee; SDOT only where the CPU has it.
    unsafe {
        if has_dotprod() {
            legacy_sdot(t, w, x, nb)
        } else {
            legacy_base(t, w, x, nb)
        }
    }
}

#[target_feature(enable = "neon,dotprod")]
unsafe fn legacy_sdot(t: DType, w: &[u8], x: &[u8], nb: usize) -> f32 {
    // SAFETY: the caller's guarantee, passed on.
    unsafe { legacy::<true>(t, w, x, nb) }
}

#[target_feature(enable = "neon")]
unsafe fn legacy_base(t: DType, w: &[u8], x: &[u8], nb: usize) -> f32 {
    // SAFETY: the caller's guarantee, passed on.
    unsafe { legacy::<false>(t, w, x, nb) }
}

/// The exact sums of elements 4l..4l+3 of `a·b` in lane l (0..4): SDOT's own grouping, or
/// `vmull_s8` products (exact in 16 bits) added in pairs, then pairs of pairs.
#[inline(always)]
unsafe fn lanes4<const D: bool>(a: int8x16_t, b: int8x16_t) -> int32x4_t {
    unsafe {
        if D {
            sdot(vdupq_n_s32(0), a, b)
        } else {
            let lo = vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)));
            let hi = vpaddlq_s16(vmull_high_s8(a, b));
            vpaddq_s32(lo, hi)
        }
    }
}

/// ggml's AVX2 arithmetic for q4_0, q4_1 and q8_0 (`matmul_quant::vec_dot_scalar`): eight lanes
/// of 4-element integer sums per block, each fused-multiply-added with the block's scale product
/// into its float lane, q4_1's min terms in a fused scalar chain, ggml's horizontal sum.
#[inline(always)]
unsafe fn legacy<const D: bool>(t: DType, w: &[u8], x: &[u8], nb: usize) -> f32 {
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut summs = 0f32;
    // SAFETY: every load below stays inside block i of its row, i < nb.
    unsafe {
        let m4 = vdupq_n_u8(15);
        let mut acc = [vdupq_n_f32(0.0); 2];
        for i in 0..nb {
            // the block's 32 weights (elements 0..16, 16..32), its activations, the scale product
            let (a, y, d) = match t {
                DType::Q4_0 | DType::Q4_1 => {
                    let (ws, xs) = if t == DType::Q4_0 { (18, 34) } else { (20, 36) };
                    let (wb, xb) = (wp.add(i * ws), xp.add(i * xs));
                    let v = u8x16(wb.add(ws - 16));
                    let (mut lo, mut hi) = (s8(vandq_u8(v, m4)), s8(vshrq_n_u8::<4>(v)));
                    if t == DType::Q4_0 {
                        lo = vsubq_s8(lo, vdupq_n_s8(8));
                        hi = vsubq_s8(hi, vdupq_n_s8(8));
                    } else {
                        // gcc fuses ggml's `summs += m·s`
                        summs = f16_at(wb.add(2)).mul_add(f16_at(xb.add(2)), summs);
                    }
                    ([lo, hi], xb.add(xs - 32), f16_at(wb) * f16_at(xb))
                }
                DType::Q8_0 => {
                    let (wb, xb) = (wp.add(i * 34), xp.add(i * 34));
                    let a = [i8x16(wb.add(2)), i8x16(wb.add(18))];
                    (a, xb.add(2), f16_at(wb) * f16_at(xb))
                }
                _ => unreachable!("no NEON legacy kernel for {t}"),
            };
            let dv = vdupq_n_f32(d);
            for (h, acc) in acc.iter_mut().enumerate() {
                let l = lanes4::<D>(a[h], i8x16(y.add(16 * h)));
                *acc = vfmaq_f32(*acc, vcvtq_f32_s32(l), dv);
            }
        }
        // ggml's hsum_float_8: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))
        let mut r = [0f32; 4];
        vst1q_f32(r.as_mut_ptr(), vaddq_f32(acc[0], acc[1]));
        (r[0] + r[2]) + (r[1] + r[3]) + summs
    }
}

/// The types of `qdot` (against q8_0, q8_1 or q8_K); `None` for a type without a NEON kernel.
///
/// # Safety
/// `w` and `x` hold `nb` blocks of their formats.
pub(crate) unsafe fn vec_dot(t: DType, w: &[u8], x: &[u8], nb: usize) -> Option<f32> {
    // SAFETY: the caller's guarantee; SDOT only where the CPU has it.
    unsafe {
        if has_dotprod() {
            qdot_sdot(t, w, x, nb)
        } else {
            qdot_base(t, w, x, nb)
        }
    }
}

#[target_feature(enable = "neon,dotprod")]
unsafe fn qdot_sdot(t: DType, w: &[u8], x: &[u8], nb: usize) -> Option<f32> {
    // SAFETY: the caller's guarantee, passed on.
    unsafe { qdot_kernels::<true>(t, w, x, nb) }
}

#[target_feature(enable = "neon")]
unsafe fn qdot_base(t: DType, w: &[u8], x: &[u8], nb: usize) -> Option<f32> {
    // SAFETY: the caller's guarantee, passed on.
    unsafe { qdot_kernels::<false>(t, w, x, nb) }
}

#[inline(always)]
unsafe fn qdot_kernels<const D: bool>(t: DType, w: &[u8], x: &[u8], nb: usize) -> Option<f32> {
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    // SAFETY: the caller's guarantee, passed on.
    unsafe {
        Some(match t {
            DType::Q5_0 => q5::<D>(wp, xp, nb, false),
            DType::Q5_1 => q5::<D>(wp, xp, nb, true),
            DType::IQ4NL => iq4_nl::<D>(wp, xp, nb),
            DType::Q2K => q2_k::<D>(wp, xp, nb),
            DType::Q3K => q3_k(wp, xp, nb),
            DType::Q4K => q4_k(wp, xp, nb, false),
            DType::Q5K => q4_k(wp, xp, nb, true),
            DType::Q6K => q6_k(wp, xp, nb),
            DType::IQ4XS => iq4_xs::<D>(wp, xp, nb),
            DType::TQ1_0 => tq1_0::<D>(wp, xp, nb),
            DType::TQ2_0 => tq2_0::<D>(wp, xp, nb),
            _ => return None,
        })
    }
}

/// q5_0 against q8_0, or q5_1 against q8_1 (`one`).
#[inline(always)]
unsafe fn q5<const D: bool>(wp: *const u8, xp: *const u8, nb: usize, one: bool) -> f32 {
    let (wsize, xsize, qh_at) = if one { (24, 36, 4) } else { (22, 34, 2) };
    let mut sumf = 0f32;
    // SAFETY: the loads stay inside block i of each row (i < nb).
    unsafe {
        let (m4, b4) = (vdupq_n_u8(15), vdupq_n_u8(16));
        for i in 0..nb {
            let (wb, xb) = (wp.add(i * wsize), xp.add(i * xsize));
            let qh = u32::from_le_bytes(std::ptr::read_unaligned(wb.add(qh_at) as *const [u8; 4]));
            let v = u8x16(wb.add(qh_at + 4));
            let lo = vorrq_u8(vandq_u8(v, m4), vandq_u8(bit_masks(qh as u16), b4));
            let hi = vorrq_u8(
                vshrq_n_u8::<4>(v),
                vandq_u8(bit_masks((qh >> 16) as u16), b4),
            );
            let (lo, hi) = if one {
                (s8(lo), s8(hi))
            } else {
                (vsubq_s8(s8(lo), s8(b4)), vsubq_s8(s8(hi), s8(b4)))
            };
            let y = xb.add(if one { 4 } else { 2 });
            // |product| ≤ 31·128
            let s = sum32::<D>(lo, i8x16(y), hi, i8x16(y.add(16)), false);
            let scaled = (f16_at(wb) * f16_at(xb)) * s as f32;
            if one {
                sumf += scaled + f16_at(wb.add(2)) * f16_at(xb.add(2));
            } else {
                sumf += scaled;
            }
        }
    }
    sumf
}

/// One 16-byte lookup of 16 nibbles in ggml's iq4 codebook.
#[inline(always)]
unsafe fn iq4(kv: int8x16_t, nibbles: uint8x16_t) -> int8x16_t {
    unsafe { vqtbl1q_s8(kv, nibbles) }
}

/// Σ of 32 products of iq4 values with q8 codes (|product| ≤ 127·128).
#[inline(always)]
unsafe fn iq4_block<const D: bool>(kv: int8x16_t, q: *const u8, y: *const u8) -> i32 {
    unsafe {
        let v = u8x16(q);
        let lo = iq4(kv, vandq_u8(v, vdupq_n_u8(15)));
        let hi = iq4(kv, vshrq_n_u8::<4>(v));
        sum32::<D>(lo, i8x16(y), hi, i8x16(y.add(16)), true)
    }
}

#[inline(always)]
unsafe fn iq4_nl<const D: bool>(wp: *const u8, xp: *const u8, nb: usize) -> f32 {
    let mut sumf = 0f32;
    // SAFETY: the loads stay inside block i of each row (i < nb).
    unsafe {
        let kv = vld1q_s8(KVALUES_IQ4NL.as_ptr());
        for i in 0..nb {
            let (wb, xb) = (wp.add(i * 18), xp.add(i * 34));
            let d = f16_at(xb) * f16_at(wb);
            sumf += d * iq4_block::<D>(kv, wb.add(2), xb.add(2)) as f32;
        }
    }
    sumf
}

#[inline(always)]
unsafe fn iq4_xs<const D: bool>(wp: *const u8, xp: *const u8, nb: usize) -> f32 {
    let mut sumf = 0f32;
    // SAFETY: the loads stay inside superblock i of each row (i < nb).
    unsafe {
        let kv = vld1q_s8(KVALUES_IQ4NL.as_ptr());
        for i in 0..nb {
            let (wb, xb) = (wp.add(i * 136), xp.add(i * 292));
            let d4d8 = f16_at(wb) * f32_at(xb);
            let mut h = u16::from_le_bytes([*wb.add(2), *wb.add(3)]) as u32;
            for ib in 0..QK_K / 32 {
                let sl = *wb.add(4 + ib / 2) as u32;
                let ls = if ib % 2 == 0 {
                    (sl & 15) | ((h << 4) & 0x30)
                } else {
                    let v = (sl >> 4) | ((h << 2) & 0x30);
                    h >>= 4;
                    v
                };
                let dl = d4d8 * (ls as i32 - 32) as f32;
                let s = iq4_block::<D>(kv, wb.add(8 + 16 * ib), xb.add(4 + 32 * ib));
                sumf += dl * s as f32;
            }
        }
    }
    sumf
}

/// q8_K's 16 group sums times per-group factors `f(j)`.
#[inline(always)]
unsafe fn bsums_dot(xb: *const u8, f: impl Fn(usize) -> i32) -> i32 {
    let mut s = 0i32;
    for j in 0..16 {
        // SAFETY: a q8_K block holds its 16 sums at 4 + 256.
        let b = unsafe { std::ptr::read_unaligned(xb.add(4 + QK_K + 2 * j) as *const [u8; 2]) };
        s += i16::from_le_bytes(b) as i32 * f(j);
    }
    s
}

#[inline(always)]
unsafe fn q2_k<const D: bool>(wp: *const u8, xp: *const u8, nb: usize) -> f32 {
    let mut sumf = 0f32;
    // SAFETY: the loads stay inside superblock i of each row (i < nb).
    unsafe {
        let m3 = vdupq_n_u8(3);
        for i in 0..nb {
            let (wb, xb) = (wp.add(i * 84), xp.add(i * 292));
            let (sc, q2, q8) = (wb, wb.add(16), xb.add(4));
            let summs = bsums_dot(xb, |j| (*sc.add(j) >> 4) as i32);
            let yd = f32_at(xb);
            let dall = yd * f16_at(wb.add(80));
            let dmin = yd * f16_at(wb.add(82));
            let mut acc = [vdupq_n_s32(0); 2];
            for h in 0..2 {
                for j in 0..4 {
                    for half in 0..2 {
                        let a = vandq_u8(shr(u8x16(q2.add(h * 32 + half * 16)), 2 * j), m3);
                        let y = i8x16(q8.add(h * 128 + j * 32 + half * 16));
                        // |product| ≤ 3·128: two a 16-bit lane without SDOT
                        let d = (*sc.add(h * 8 + j * 2 + half) & 15) as i16;
                        if D {
                            let p = sdot(vdupq_n_s32(0), s8(a), y);
                            acc[0] = vmlaq_n_s32(acc[0], p, d as i32);
                        } else {
                            scale_add(&mut acc, mul16(s8(a), y), d);
                        }
                    }
                }
            }
            let isum = vaddvq_s32(vaddq_s32(acc[0], acc[1]));
            sumf += dall * isum as f32 - dmin * summs as f32;
        }
    }
    sumf
}

unsafe fn q3_k(wp: *const u8, xp: *const u8, nb: usize) -> f32 {
    let mut sums = [unsafe { vdupq_n_f32(0.0) }; 2];
    // SAFETY: the loads stay inside superblock i of each row (i < nb).
    unsafe {
        let (m3, four) = (vdupq_n_u8(3), vdupq_n_u8(4));
        for i in 0..nb {
            let (wb, xb) = (wp.add(i * 110), xp.add(i * 292));
            let (q3, q8) = (wb.add(32), xb.add(4));
            let hm = [u8x16(wb), u8x16(wb.add(16))];
            let sc = words_bytes(q3k_scales(std::slice::from_raw_parts(wb.add(96), 12)));
            let mut acc = [vdupq_n_s32(0); 2];
            for h in 0..2 {
                for shift in 0..4 {
                    let m = vdupq_n_u8(1 << (h * 4 + shift));
                    for c in 0..2 {
                        let low = vandq_u8(shr(u8x16(q3.add(h * 32 + 16 * c)), 2 * shift), m3);
                        let sub = vbicq_u8(four, vtstq_u8(hm[c], m));
                        let a = vsubq_s8(s8(low), s8(sub));
                        let y = i8x16(q8.add(h * 128 + shift * 32 + 16 * c));
                        // |product| ≤ 4·128: two a lane
                        let s = sc[8 * h + 2 * shift + c] as i16 - 32;
                        scale_add(&mut acc, mul16(a, y), s);
                    }
                }
            }
            add_scaled(&mut sums, acc, f16_at(wb.add(108)) * f32_at(xb));
        }
        add_lanes(0.0, sums)
    }
}

/// Four little-endian words as 16 bytes.
#[inline(always)]
fn words_bytes(w: [u32; 4]) -> [u8; 16] {
    let mut b = [0u8; 16];
    for (i, v) in w.iter().enumerate() {
        b[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }
    b
}

/// q4_K, and q5_K when `fifth` (its high bits at 16..48, quants at 48..176).
unsafe fn q4_k(wp: *const u8, xp: *const u8, nb: usize, fifth: bool) -> f32 {
    let ts = if fifth { 176 } else { 144 };
    let mut sums = [unsafe { vdupq_n_f32(0.0) }; 2];
    let mut sumf = 0f32;
    // SAFETY: the loads stay inside superblock i of each row (i < nb).
    unsafe {
        let (m4, b4) = (vdupq_n_u8(15), vdupq_n_u8(16));
        for i in 0..nb {
            let (wb, xb) = (wp.add(i * ts), xp.add(i * 292));
            let qs = wb.add(if fifth { 48 } else { 16 });
            let q8 = xb.add(4);
            let sm = words_bytes(k4_scales_mins(std::slice::from_raw_parts(wb.add(4), 12)));
            let sumi = bsums_dot(xb, |j| sm[8 + j / 2] as i32);
            let hm = [u8x16(wb.add(16)), u8x16(wb.add(32))];
            let mut acc = [vdupq_n_s32(0); 2];
            for j in 0..4 {
                let v = [u8x16(qs.add(32 * j)), u8x16(qs.add(32 * j + 16))];
                let mut lo = [vandq_u8(v[0], m4), vandq_u8(v[1], m4)];
                let mut hi = [vshrq_n_u8::<4>(v[0]), vshrq_n_u8::<4>(v[1])];
                if fifth {
                    let (ml, mh) = (vdupq_n_u8(1 << (2 * j)), vdupq_n_u8(2 << (2 * j)));
                    for c in 0..2 {
                        lo[c] = vorrq_u8(lo[c], vandq_u8(vtstq_u8(hm[c], ml), b4));
                        hi[c] = vorrq_u8(hi[c], vandq_u8(vtstq_u8(hm[c], mh), b4));
                    }
                }
                let y = q8.add(64 * j);
                // |product| ≤ 31·128: four a lane
                let pl = vaddq_s16(
                    mul16(s8(lo[0]), i8x16(y)),
                    mul16(s8(lo[1]), i8x16(y.add(16))),
                );
                let ph = vaddq_s16(
                    mul16(s8(hi[0]), i8x16(y.add(32))),
                    mul16(s8(hi[1]), i8x16(y.add(48))),
                );
                scale_add(&mut acc, pl, sm[2 * j] as i16);
                scale_add(&mut acc, ph, sm[2 * j + 1] as i16);
            }
            let yd = f32_at(xb);
            add_scaled(&mut sums, acc, f16_at(wb) * yd);
            let dmin = f16_at(wb.add(2)) * yd;
            sumf -= dmin * sumi as f32;
        }
        add_lanes(sumf, sums)
    }
}

unsafe fn q6_k(wp: *const u8, xp: *const u8, nb: usize) -> f32 {
    let mut sums = [unsafe { vdupq_n_f32(0.0) }; 2];
    // SAFETY: the loads stay inside superblock i of each row (i < nb).
    unsafe {
        let (m4, m30, m3, b32) = (
            vdupq_n_u8(15),
            vdupq_n_u8(0x30),
            vdupq_n_u8(3),
            vdupq_n_s8(32),
        );
        for i in 0..nb {
            let (wb, xb) = (wp.add(i * 210), xp.add(i * 292));
            let (ql, qh, sc, q8) = (wb, wb.add(128), wb.add(192) as *const i8, xb.add(4));
            let mut acc = [vdupq_n_s32(0); 2];
            for h in 0..2 {
                for c in 0..2 {
                    let hb = u8x16(qh.add(h * 32 + 16 * c));
                    let l0 = u8x16(ql.add(h * 64 + 16 * c));
                    let l1 = u8x16(ql.add(h * 64 + 32 + 16 * c));
                    let a = [
                        vorrq_u8(vandq_u8(l0, m4), vshlq_n_u8::<4>(vandq_u8(hb, m3))),
                        vorrq_u8(vandq_u8(l1, m4), vandq_u8(vshlq_n_u8::<2>(hb), m30)),
                        vorrq_u8(vshrq_n_u8::<4>(l0), vandq_u8(hb, m30)),
                        vorrq_u8(vshrq_n_u8::<4>(l1), vandq_u8(vshrq_n_u8::<2>(hb), m30)),
                    ];
                    for (q, &aq) in a.iter().enumerate() {
                        let e = h * 128 + 32 * q + 16 * c;
                        // |product| ≤ 32·128: two a lane
                        let p = mul16(vsubq_s8(s8(aq), b32), i8x16(q8.add(e)));
                        scale_add(&mut acc, p, *sc.add(e / 16) as i16);
                    }
                }
            }
            add_scaled(&mut sums, acc, f16_at(wb.add(208)) * f32_at(xb));
        }
        add_lanes(0.0, sums)
    }
}

/// Base-3 digits of 16 tq1_0 bytes: `((b·3^l mod 256)·3) >> 8`, minus one.
#[inline(always)]
unsafe fn trits(b: uint8x16_t, pow3: u8) -> int8x16_t {
    unsafe {
        let t = vmulq_u8(b, vdupq_n_u8(pow3));
        let three = vdup_n_u8(3);
        let lo = vshrn_n_u16::<8>(vmull_u8(vget_low_u8(t), three));
        let hi = vshrn_n_u16::<8>(vmull_high_u8(t, vdupq_n_u8(3)));
        vsubq_s8(s8(vcombine_u8(lo, hi)), vdupq_n_s8(1))
    }
}

#[inline(always)]
unsafe fn tq1_0<const D: bool>(wp: *const u8, xp: *const u8, nb: usize) -> f32 {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    let mut sumf = 0f32;
    // SAFETY: the loads stay inside superblock i of each row (i < nb).
    unsafe {
        for i in 0..nb {
            let (wb, xb) = (wp.add(i * 54), xp.add(i * 292));
            let q8 = xb.add(4);
            // |product| ≤ 128: without SDOT the 16-bit lanes take 15 blocks of two before
            // widening
            let (mut p, mut p32) = (vdupq_n_s16(0), vdupq_n_s32(0));
            let mut add = |t: int8x16_t, y: int8x16_t| {
                if D {
                    p32 = sdot(p32, t, y);
                } else {
                    p = vaddq_s16(p, mul16(t, y));
                }
            };
            for (l, &pw) in POW3.iter().enumerate() {
                for c in 0..2 {
                    add(
                        trits(u8x16(wb.add(16 * c)), pw),
                        i8x16(q8.add(l * 32 + 16 * c)),
                    );
                }
                add(trits(u8x16(wb.add(32)), pw), i8x16(q8.add(160 + l * 16)));
            }
            let mut sum = vaddlvq_s16(p) + vaddvq_s32(p32);
            for (l, &pw) in POW3[..4].iter().enumerate() {
                for j in 0..4 {
                    let b = *wb.add(48 + j);
                    let t = ((b.wrapping_mul(pw) as u16 * 3) >> 8) as i32 - 1;
                    sum += t * *q8.add(240 + l * 4 + j) as i8 as i32;
                }
            }
            sumf += sum as f32 * (f16_at(wb.add(52)) * f32_at(xb));
        }
    }
    sumf
}

#[inline(always)]
unsafe fn tq2_0<const D: bool>(wp: *const u8, xp: *const u8, nb: usize) -> f32 {
    let mut sumf = 0f32;
    // SAFETY: the loads stay inside superblock i of each row (i < nb).
    unsafe {
        let (m3, one) = (vdupq_n_u8(3), vdupq_n_s8(1));
        for i in 0..nb {
            let (wb, xb) = (wp.add(i * 66), xp.add(i * 292));
            let q8 = xb.add(4);
            // |product| ≤ 128: without SDOT sixteen blocks of two a lane stay below 2^13
            let (mut p, mut p32) = (vdupq_n_s16(0), vdupq_n_s32(0));
            for j in [0, 32] {
                for l in 0..4 {
                    for c in 0..2 {
                        let v = vandq_u8(shr(u8x16(wb.add(j + 16 * c)), 2 * l), m3);
                        let (v, y) = (vsubq_s8(s8(v), one), i8x16(q8.add(j * 4 + l * 32 + 16 * c)));
                        if D {
                            p32 = sdot(p32, v, y);
                        } else {
                            p = vaddq_s16(p, mul16(v, y));
                        }
                    }
                }
            }
            let d = f32_at(xb) * f16_at(wb.add(64));
            sumf += (vaddlvq_s16(p) + vaddvq_s32(p32)) as f32 * d;
        }
    }
    sumf
}

/// [`IntSums`] with NEON: the lattice and small-float types (`qdot_iq2`, `qdot_iq13`,
/// `qdot_fp`) run their generic code with these sums (the same integers, so the same results).
pub(crate) struct NeonSums;

impl IntSums for NeonSums {
    fn dot32(g: [u64; 4], s: [u8; 4], q8: &[u8]) -> [i32; 2] {
        assert!(q8.len() >= 32, "dot32: {} activations", q8.len());
        let mut out = [0i32; 2];
        // SAFETY: NEON is part of every AArch64 CPU; q8 holds 32 bytes (asserted).
        unsafe {
            for (h, o) in out.iter_mut().enumerate() {
                let gv = vcombine_s8(vcreate_s8(g[2 * h]), vcreate_s8(g[2 * h + 1]));
                let m = s8(bit_masks(s[2 * h] as u16 | (s[2 * h + 1] as u16) << 8));
                // (g ^ m) − m: −g where the mask is set (|g| ≤ 127)
                let v = vsubq_s8(veorq_s8(gv, m), m);
                // |product| ≤ 127·128: two a lane
                *o = vaddlvq_s16(mul16(v, i8x16(q8.as_ptr().add(16 * h))));
            }
        }
        out
    }

    fn fp4_sums(q: &[u8], y: &[u8]) -> (i32, i32) {
        let n = q.len();
        assert!(
            (n == 8 || n == 16) && y.len() >= 2 * n,
            "fp4_sums: {n} codes, {} activations",
            y.len()
        );
        // SAFETY: NEON is part of every AArch64 CPU; q holds n and y 2n bytes (asserted).
        unsafe {
            let kv = vld1q_s8(KVALUES_FP4.as_ptr());
            // |product| ≤ 12·128
            if n == 16 {
                let v = u8x16(q.as_ptr());
                let lo = vqtbl1q_s8(kv, vandq_u8(v, vdupq_n_u8(15)));
                let hi = vqtbl1q_s8(kv, vshrq_n_u8::<4>(v));
                let (y0, y1) = (i8x16(y.as_ptr()), i8x16(y.as_ptr().add(16)));
                (vaddlvq_s16(mul16(lo, y0)), vaddlvq_s16(mul16(hi, y1)))
            } else {
                let v = vld1_u8(q.as_ptr());
                let lo = vqtbl1_s8(kv, vand_u8(v, vdup_n_u8(15)));
                let hi = vqtbl1_s8(kv, vshr_n_u8::<4>(v));
                let y0 = vld1_s8(y.as_ptr() as *const i8);
                let y1 = vld1_s8(y.as_ptr().add(8) as *const i8);
                (vaddlvq_s16(vmull_s8(lo, y0)), vaddlvq_s16(vmull_s8(hi, y1)))
            }
        }
    }

    fn q2_sum(qs: &[u8], y: &[u8]) -> i32 {
        assert!(qs.len() >= 8 && y.len() >= 32, "q2_sum: short rows");
        // byte e/4 for elements e = 0..16 and 16..32, then the code's bit offset 2(e mod 4)
        const SPREAD: [[u8; 16]; 2] = [
            [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3],
            [4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7],
        ];
        const SHIFTS: [i8; 16] = [0, -2, -4, -6, 0, -2, -4, -6, 0, -2, -4, -6, 0, -2, -4, -6];
        // SAFETY: NEON is part of every AArch64 CPU; qs holds 8 and y 32 bytes (asserted).
        unsafe {
            let v = vcombine_u8(vld1_u8(qs.as_ptr()), vdup_n_u8(0));
            let shifts = vld1q_s8(SHIFTS.as_ptr());
            let mut p = vdupq_n_s16(0);
            for (h, spread) in SPREAD.iter().enumerate() {
                let b = vqtbl1q_u8(v, vld1q_u8(spread.as_ptr()));
                let c = vandq_u8(vshlq_u8(b, shifts), vdupq_n_u8(3));
                let q = vsubq_s8(s8(c), vdupq_n_s8(1));
                // |product| ≤ 2·128: four a lane
                p = vaddq_s16(p, mul16(q, i8x16(y.as_ptr().add(16 * h))));
            }
            vaddlvq_s16(p)
        }
    }
}
