//! Scalar helpers shared by every format: half-precision conversions that match ggml bit for
//! bit, ggml's `nearest_int`, and little-endian field access.
//!
//! ggml converts f32 → f16 with the FP16 library's algorithm (round to nearest, ties to even,
//! overflow to infinity, NaN → a quiet NaN `0x7E00` carrying only the sign), f16 → f32 exactly;
//! f32 → bf16 rounds to nearest even and turns a NaN into a quiet NaN keeping the upper payload
//! bits; bf16 → f32 is exact. `half` does the same except for the payload of a NaN going to f16,
//! which is handled here.

use half::{bf16, f16};

/// f16 bits → f32, exact (as ggml's `GGML_FP16_TO_FP32`).
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    f16::from_bits(h).to_f32()
}

/// f32 → f16 bits, rounding to nearest even (as ggml's `GGML_FP32_TO_FP16`).
#[inline]
pub fn f32_to_f16(x: f32) -> u16 {
    if x.is_nan() {
        // ggml: sign | 0x7E00, whatever the payload.
        return ((x.to_bits() >> 16) as u16 & 0x8000) | 0x7E00;
    }
    f16::from_f32(x).to_bits()
}

/// bf16 bits → f32, exact.
#[inline]
pub fn bf16_to_f32(h: u16) -> f32 {
    bf16::from_bits(h).to_f32()
}

/// f32 → bf16 bits, rounding to nearest even; NaN becomes a quiet NaN (as ggml's
/// `GGML_FP32_TO_BF16`).
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    bf16::from_f32(x).to_bits()
}

/// ggml's `nearest_int`: rounds to nearest with ties to even by adding 1.5·2^23, valid for
/// |x| ≤ 2^22 (outside that range it gives the same garbage as ggml does).
#[inline]
pub fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0f32;
    (v.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// C's float → int conversion as x86-64 does it (`cvttss2si`): truncation toward zero, and
/// `i32::MIN` for NaN or an out-of-range value.
#[inline]
pub fn trunc_i32(x: f32) -> i32 {
    if x.is_nan() || !(-2_147_483_648.0..2_147_483_648.0).contains(&x) {
        i32::MIN
    } else {
        x as i32
    }
}

/// The f16 at byte offset `off` (little endian).
#[inline]
pub fn rd_f16(b: &[u8], off: usize) -> f32 {
    f16_to_f32(rd_u16(b, off))
}

#[inline]
pub fn rd_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

#[inline]
pub fn rd_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

#[inline]
pub fn wr_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

#[inline]
pub fn wr_f16(b: &mut [u8], off: usize, x: f32) {
    wr_u16(b, off, f32_to_f16(x));
}

/// Row conversions for the plain half types (block of one element).
pub(crate) fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(2).zip(dst.iter_mut()) {
        *y = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

pub(crate) fn quantize_f16(src: &[f32], dst: &mut [u8], _imatrix: Option<&[f32]>) {
    for (x, b) in src.iter().zip(dst.chunks_exact_mut(2)) {
        b.copy_from_slice(&f32_to_f16(*x).to_le_bytes());
    }
}

pub(crate) fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(2).zip(dst.iter_mut()) {
        *y = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

pub(crate) fn quantize_bf16(src: &[f32], dst: &mut [u8], _imatrix: Option<&[f32]>) {
    for (x, b) in src.iter().zip(dst.chunks_exact_mut(2)) {
        b.copy_from_slice(&f32_to_bf16(*x).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's FP16-library conversion, written out, as the oracle.
    fn ggml_fp32_to_fp16(f: f32) -> u16 {
        let scale_to_inf = f32::from_bits(0x7780_0000);
        let scale_to_zero = f32::from_bits(0x0880_0000);
        let mut base = (f.abs() * scale_to_inf) * scale_to_zero;
        let w = f.to_bits();
        let shl1_w = w.wrapping_add(w);
        let sign = w & 0x8000_0000;
        let mut bias = shl1_w & 0xFF00_0000;
        if bias < 0x7100_0000 {
            bias = 0x7100_0000;
        }
        base += f32::from_bits((bias >> 1) + 0x0780_0000);
        let bits = base.to_bits();
        let exp_bits = (bits >> 13) & 0x0000_7C00;
        let mantissa_bits = bits & 0x0000_0FFF;
        let nonsign = exp_bits + mantissa_bits;
        ((sign >> 16)
            | if shl1_w > 0xFF00_0000 {
                0x7E00
            } else {
                nonsign
            }) as u16
    }

    fn ggml_fp32_to_bf16(f: f32) -> u16 {
        let u = f.to_bits();
        if (u & 0x7fff_ffff) > 0x7f80_0000 {
            return ((u >> 16) | 64) as u16;
        }
        (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
    }

    #[test]
    fn f16_and_bf16_match_ggml_on_a_sweep_of_bit_patterns() {
        // Every 4099th pattern (a prime stride reaches all residues) plus the boundaries.
        let mut bits: u32 = 0;
        loop {
            let x = f32::from_bits(bits);
            assert_eq!(f32_to_f16(x), ggml_fp32_to_fp16(x), "f16 of {bits:#x}");
            assert_eq!(f32_to_bf16(x), ggml_fp32_to_bf16(x), "bf16 of {bits:#x}");
            match bits.checked_add(4099) {
                Some(b) => bits = b,
                None => break,
            }
        }
        for b in [
            0u32,
            0x8000_0000,
            0x7f80_0000,
            0xff80_0000,
            0x7fc0_0001,
            0x477f_f000,
            0x3380_0000,
        ] {
            let x = f32::from_bits(b);
            assert_eq!(f32_to_f16(x), ggml_fp32_to_fp16(x), "f16 of {b:#x}");
            assert_eq!(f32_to_bf16(x), ggml_fp32_to_bf16(x), "bf16 of {b:#x}");
        }
    }

    #[test]
    fn f16_to_f32_is_exact_for_all_halves() {
        for h in 0..=u16::MAX {
            let x = f16_to_f32(h);
            if x.is_nan() {
                assert!(f16::from_bits(h).is_nan());
            } else {
                assert_eq!(f32_to_f16(x), h);
            }
        }
    }

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-0.5), 0);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-3.7), -4);
        assert_eq!(nearest_int(7.49), 7);
    }
}
