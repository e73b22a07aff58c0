//! q4_0 and iq4_nl weights in `RowLayout::Repacked8` (`tessera::layout`; q4_K and q2_K: its
//! entry points hand those to `qgemv_repack_k` and `qgemv_repack_q2k`): the arithmetic of
//! ggml's CPU repack buffer (`CPU_REPACK`, llama.cpp's default on x86), so that a product's
//! results equal llama.cpp's default rather than its plain rows (`--no-repack`).
//!
//! ggml's x86 repack kernels (`gemv_q4_b32_8x8_q8_0_lut_avx`, `gemm_q4_b32_8x8_q8_0_lut_avx`
//! and their AVX-512 forms, for `block_q4_0x8` and `block_iq4_nlx8`) give each output (row,
//! column) one f32 accumulator, starting at zero, and for each 32-element block in order add
//! the block's exact integer dot product (the weights' values, n − 8 for q4_0 and the
//! codebook's for iq4_nl, times the column's q8_0 integers), converted to f32, times the
//! product of the two blocks' f16 scales, by one fused multiply-add. The product of two f16
//! values is exact in f32, the conversion of the integer too (|Σ| ≤ 32·127·127 < 2²⁴), so
//! the only roundings are the FMAs: the result depends on no lane layout, column count or
//! thread count. The activations are ggml's x86 `quantize_row_q8_0` (as for the plain rows:
//! `quantize_activations`; ggml's four-column `ggml_quantize_mat_q8_0_4x8` rounds the same).
//!
//! [`vec_dot_ref`] is that definition on a plain row; [`vec_dot8`] computes it for a group of
//! eight interleaved rows: on AVX-512 VNNI four rows' blocks to a 512-bit vector (two
//! `vpdpbusd` per half block, the eight integers gathered by two permutes and a narrowing),
//! on AVX2 two rows to a 256-bit vector (`vpmaddubsw` of the activations' magnitudes and the
//! weights with the activations' signs, exact for every q8_0 byte, then three `vphaddd`),
//! elsewhere block by block in scalar code. [`vec_dot8x4`] (four columns, mat-mat) and
//! [`vec_dot8_groups4`] (four groups, mat-vec) are the same arithmetic with shared work on
//! AVX-512 VNNI. Tests: `tests/qgemv_repack.rs` (ggml's own
//! results, and the kernels against [`vec_dot_ref`]).

use tessera::DType;
use tessera_quants::f16_to_f32;

use super::qdot::KVALUES_IQ4NL;
use super::qdot_fp::{e8m0_half, KVALUES_FP4};
use crate::simd::Isa;

/// Bytes of one q4_0 / iq4_nl block: an f16 scale and 16 bytes of nibbles.
const BLOCK: usize = 18;
/// Bytes of one q8_0 block: an f16 scale and 32 signed bytes.
const QBLOCK: usize = 34;

/// The value of nibble `n` of a `t` weight.
#[inline(always)]
fn value(t: DType, n: u8) -> i32 {
    match t {
        DType::IQ4NL => KVALUES_IQ4NL[n as usize] as i32,
        DType::MXFP4 => KVALUES_FP4[n as usize] as i32,
        _ => n as i32 - 8,
    }
}

/// The exact integer dot product of one weight block's 16 nibble bytes with one q8_0 block's
/// 32 integers (element j is the low nibble of byte j, element j + 16 its high nibble).
#[inline(always)]
fn block_isum(t: DType, qs: &[u8], y: &[u8]) -> i32 {
    let mut s = 0i32;
    for j in 0..16 {
        s += value(t, qs[j] & 0x0F) * (y[j] as i8) as i32;
        s += value(t, qs[j] >> 4) * (y[j + 16] as i8) as i32;
    }
    s
}

/// One step of ggml's repack accumulation: `acc + isum · (dw · dx)`, one rounding.
#[inline(always)]
fn step(acc: f32, isum: i32, dw: u16, dx: u16) -> f32 {
    (isum as f32).mul_add(f16_to_f32(dw) * f16_to_f32(dx), acc)
}

/// Bytes of one mxfp4 block: its e8m0 scale byte and 16 bytes of nibbles.
const MX_BLOCK: usize = 17;

/// The reference: one plain weight row (`k / 32` blocks of `t`: q4_0, iq4_nl or mxfp4)
/// against one q8_0 activation row, with ggml's repack arithmetic (see the module's
/// documentation; mxfp4's block scale is `GGML_E8M0_TO_FP32_HALF` of its first byte, which
/// multiplies the activations' f16 scale, rounded, before the FMA, as in ggml's template).
pub fn vec_dot_ref(t: DType, w: &[u8], x: &[u8], k: usize) -> f32 {
    assert!(
        matches!(t, DType::Q4_0 | DType::IQ4NL | DType::MXFP4),
        "no repack arithmetic on 32-element blocks for {t}"
    );
    let mut acc = 0f32;
    let wbytes = if t == DType::MXFP4 { MX_BLOCK } else { BLOCK };
    for (wb, xb) in w
        .chunks_exact(wbytes)
        .zip(x.chunks_exact(QBLOCK))
        .take(k / 32)
    {
        let dx = u16::from_le_bytes([xb[0], xb[1]]);
        acc = if t == DType::MXFP4 {
            let isum = block_isum(t, &wb[1..], &xb[2..]);
            (isum as f32).mul_add(e8m0_half(wb[0]) * f16_to_f32(dx), acc)
        } else {
            let isum = block_isum(t, &wb[2..], &xb[2..]);
            step(acc, isum, u16::from_le_bytes([wb[0], wb[1]]), dx)
        };
    }
    acc
}

/// mxfp4 with ggml's repack arithmetic on one group of eight rows (`g`: `tessera::layout`'s
/// interleaved order with a one-byte head, [`MX_GBLOCK`] bytes a block, as ggml repacks them
/// into `block_mxfp4x8`) against `C` activation rows, `out[c][r]`: for one column
/// [`mxfp4_group8`] (the mat-vec kernels), else the definition row by row
/// ([`mxfp4_group_ref`]; a mat-mat takes [`mx_transpose8`] and [`mxfp4_8x4_transposed`]
/// where they have kernels).
fn mxfp4_rows8<const C: usize>(isa: Isa, g: &[u8], x: [&[u8]; C], k: usize) -> [[f32; 8]; C] {
    #[cfg(target_arch = "x86_64")]
    if C == 1 && has_mx_gemv_kernel(isa) {
        let mut sums = vec![0u8; mx_sums_bytes(k)];
        mx_gemv_sums(x[0], k, &mut sums);
        let one = mxfp4_group8(isa, g, x[0], &sums, k);
        return std::array::from_fn(|_| one);
    }
    let _ = isa;
    x.map(|x| mxfp4_group_ref(g, x, k))
}

/// Bytes of one block of an interleaved group of eight mxfp4 rows: the eight exponent bytes,
/// then each row's 16 bytes of nibbles, row 0's first.
pub const MX_GBLOCK: usize = 8 * MX_BLOCK;

/// [`vec_dot_ref`] of each row of one interleaved mxfp4 group (see [`mxfp4_rows8`]) against
/// one q8_0 activation row: the definition, on the group's bytes.
pub fn mxfp4_group_ref(g: &[u8], x: &[u8], k: usize) -> [f32; 8] {
    let nb = k / 32;
    assert!(
        g.len() >= nb * MX_GBLOCK && x.len() >= nb * QBLOCK,
        "repack mxfp4 group: k={k}, a group of {} bytes, {} activation bytes",
        g.len(),
        x.len()
    );
    let mut acc = [0f32; 8];
    for (blk, xb) in g
        .chunks_exact(MX_GBLOCK)
        .zip(x.chunks_exact(QBLOCK))
        .take(nb)
    {
        let dx = f16_to_f32(u16::from_le_bytes([xb[0], xb[1]]));
        for (r, a) in acc.iter_mut().enumerate() {
            let isum = block_isum(DType::MXFP4, &blk[8 + 16 * r..24 + 16 * r], &xb[2..]);
            *a = (isum as f32).mul_add(e8m0_half(blk[r]) * dx, *a);
        }
    }
    acc
}

/// Whether [`mxfp4_group8`] has a kernel of its own for `isa` (AVX-512 VNNI, AVX2).
pub fn has_mx_gemv_kernel(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    return isa != Isa::Scalar && super::qdot::avx2::available();
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// Bytes [`mx_gemv_sums`] writes for a row of `k` activations: eight a block.
pub fn mx_sums_bytes(k: usize) -> usize {
    k / 32 * 8
}

/// What [`mxfp4_group8`] needs of one q8_0 activation row (`k / 32` blocks) besides its
/// bytes, computed once for all its calls: per block the scale as f32 and the sum of the 32
/// integers as i32 (little-endian, eight bytes a block), so that a kernel's unsigned operand
/// (the codebook's values plus an offset) costs one subtraction a block instead of a second
/// pass over the activations.
pub fn mx_gemv_sums(x: &[u8], k: usize, out: &mut [u8]) {
    let nb = k / 32;
    assert!(
        x.len() >= nb * QBLOCK && out.len() >= mx_sums_bytes(k),
        "repack mxfp4 sums: k={k}, {} activation bytes, {} output bytes",
        x.len(),
        out.len()
    );
    for (xb, o) in x.chunks_exact(QBLOCK).zip(out.chunks_exact_mut(8)).take(nb) {
        let d = f16_to_f32(u16::from_le_bytes([xb[0], xb[1]]));
        let s: i32 = xb[2..].iter().map(|&v| v as i8 as i32).sum();
        o[..4].copy_from_slice(&d.to_le_bytes());
        o[4..].copy_from_slice(&s.to_le_bytes());
    }
}

/// One interleaved group of eight mxfp4 rows (`g`, see [`mxfp4_rows8`]) against one q8_0
/// activation row `x` (with its [`mx_gemv_sums`] in `sums`), each row as [`vec_dot_ref`]
/// gives it: AVX-512 VNNI or AVX2 where [`has_mx_gemv_kernel`], else [`mxfp4_group_ref`]. A
/// mat-vec reads its groups one after the other, one sequential stream.
pub fn mxfp4_group8(isa: Isa, g: &[u8], x: &[u8], sums: &[u8], k: usize) -> [f32; 8] {
    let nb = k / 32;
    assert!(
        g.len() >= nb * MX_GBLOCK && x.len() >= nb * QBLOCK && sums.len() >= mx_sums_bytes(k),
        "repack mxfp4: k={k}, a group of {} bytes, {} activation bytes, {} sum bytes",
        g.len(),
        x.len(),
        sums.len()
    );
    #[cfg(target_arch = "x86_64")]
    if has_mx_gemv_kernel(isa) {
        // SAFETY: `uses_vnni` says the CPU has AVX-512 F/BW/VL and VNNI, AVX2, FMA and F16C,
        // `has_mx_gemv_kernel` that it has AVX2, FMA and F16C; g holds nb blocks of eight
        // rows, x nb activation blocks and sums their eight bytes each (asserted above).
        return unsafe {
            let (g, x, sums) = (g.as_ptr(), x.as_ptr(), sums.as_ptr());
            if super::qdot::avx2::uses_vnni(isa) {
                avx512::mxfp4_gemv8(g, x, sums, nb)
            } else {
                avx2::mxfp4_gemv8(g, x, sums, nb)
            }
        };
    }
    let _ = (isa, sums);
    mxfp4_group_ref(g, x, k)
}

/// The eight rows of one interleaved group (`g`: `8 × k / 32` blocks of `t` in
/// `tessera::layout`'s order) against one q8_0 activation row, each as [`vec_dot_ref`] gives
/// it for that row (q4_K and q2_K: eight plain rows against a q8_K row, with their modules'
/// one-column rounding).
pub fn vec_dot8(isa: Isa, t: DType, g: &[u8], x: &[u8], k: usize) -> [f32; 8] {
    if t == DType::Q4K {
        return super::qgemv_repack_k::vec_dot8(isa, g, x, k);
    }
    if t == DType::Q2K {
        return super::qgemv_repack_q2k::vec_dot8(isa, g, x, k);
    }
    if t == DType::MXFP4 {
        return mxfp4_rows8(isa, g, [x], k)[0];
    }
    let nb = k / 32;
    assert!(
        tessera::layout::repack_numerics(t) && g.len() >= 8 * nb * BLOCK && x.len() >= nb * QBLOCK,
        "repack vec_dot8: {t}, k={k}, a group of {} bytes, {} activation bytes",
        g.len(),
        x.len()
    );
    #[cfg(target_arch = "x86_64")]
    if super::qdot::avx2::uses_vnni(isa) {
        // SAFETY: `uses_vnni` says the CPU has AVX-512 F/BW/VL, VNNI, AVX2, FMA and F16C;
        // g holds nb blocks of eight rows and x nb activation blocks (asserted above).
        return unsafe {
            avx512::vec_dot8(
                t == DType::IQ4NL,
                [g.as_ptr()],
                x.as_ptr(),
                nb,
                super::qgemv_0::interleaved_prefetch(),
            )[0]
        };
    }
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && super::qdot::avx2::available() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked); g and x as above.
        return unsafe {
            avx2::vec_dot8(
                t == DType::IQ4NL,
                [g.as_ptr()],
                [x.as_ptr()],
                nb,
                super::qgemv_0::interleaved_prefetch(),
            )[0][0]
        };
    }
    let _ = isa;
    let mut acc = [0f32; 8];
    for (b, xb) in x.chunks_exact(QBLOCK).take(nb).enumerate() {
        let blk = &g[b * 8 * BLOCK..(b + 1) * 8 * BLOCK];
        let dx = u16::from_le_bytes([xb[0], xb[1]]);
        for (r, a) in acc.iter_mut().enumerate() {
            let dw = u16::from_le_bytes([blk[2 * r], blk[2 * r + 1]]);
            let qs = &blk[16 + 16 * r..32 + 16 * r];
            *a = step(*a, block_isum(t, qs, &xb[2..]), dw, dx);
        }
    }
    acc
}

/// [`vec_dot8`] of four groups (`g`, each `8 × k / 32` blocks) against one activation row.
/// On AVX2 and AVX-512 VNNI the four advance block by block together, so that mat-vec reads the
/// weights as four sequential streams (taken a quarter of a thread's rows apart by
/// `matmul_quant`), which the hardware prefetcher keeps fed where one stream, even with
/// software prefetches, is not (SmolLM2 requantized to q4_0, tg128 on one thread of an AMX
/// Xeon: one group a call 112 tokens/s, against 155 for the plain rows).
pub fn vec_dot8_groups4(isa: Isa, t: DType, g: [&[u8]; 4], x: &[u8], k: usize) -> [[f32; 8]; 4] {
    #[cfg(target_arch = "x86_64")]
    if has_four_group_kernel(isa) && matches!(t, DType::Q4_0 | DType::IQ4NL) {
        let nb = k / 32;
        assert!(
            tessera::layout::repack_numerics(t)
                && g.iter().all(|g| g.len() >= 8 * nb * BLOCK)
                && x.len() >= nb * QBLOCK,
            "repack vec_dot8_groups4: {t}, k={k}, {} activation bytes",
            x.len()
        );
        let (iq4nl, g, pf) = (
            t == DType::IQ4NL,
            g.map(|g| g.as_ptr()),
            super::qgemv_0::interleaved_prefetch(),
        );
        // SAFETY: `uses_vnni` says the CPU has AVX-512 F/BW/VL, VNNI, AVX2, FMA and F16C,
        // `has_four_group_kernel` that it has AVX2, FMA and F16C; every g holds nb blocks of
        // eight rows and x nb activation blocks (asserted above).
        return unsafe {
            if super::qdot::avx2::uses_vnni(isa) {
                avx512::vec_dot8(iq4nl, g, x.as_ptr(), nb, pf)
            } else {
                avx2::vec_dot8::<4, 1>(iq4nl, g, [x.as_ptr()], nb, pf).map(|v| v[0])
            }
        };
    }
    g.map(|g| vec_dot8(isa, t, g, x, k))
}

/// Whether a mat-mat of `t` rows in `Repacked8` must give its columns in whole fours from the
/// first to [`vec_dot8x4`] (else only where that has a kernel of its own): q4_K and q2_K,
/// whose four-column rounding is not their one-column rounding (`qgemv_repack_k`,
/// `qgemv_repack_q2k`), as in ggml.
pub fn columns_in_fours(isa: Isa, t: DType) -> bool {
    matches!(t, DType::Q4K | DType::Q2K) || has_four_column_kernel(isa)
}

/// Whether [`vec_dot8x4`] has a kernel of its own for `isa` (else it is four [`vec_dot8`]).
pub fn has_four_column_kernel(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    return isa != Isa::Scalar && super::qdot::avx2::available();
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// Whether [`vec_dot8_groups4`] has a kernel of its own for `isa` (AVX2 and AVX-512 VNNI;
/// else it is four [`vec_dot8`]).
pub fn has_four_group_kernel(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    return has_four_column_kernel(isa);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// [`vec_dot8`] of one group against four activation rows: `out[c][r]`, each bit-identical
/// to `vec_dot8`'s. On AVX2 and AVX-512 VNNI the group's nibbles are unpacked once per block
/// for the four columns; on AVX-512 two columns' integers also share the last step of the
/// reduction and one 512-bit conversion and FMA (mat-mat 512 columns, one thread: 1.3-1.5×
/// four `vec_dot8` calls on AVX-512, 1.2× on AVX2; README).
pub fn vec_dot8x4(isa: Isa, t: DType, g: &[u8], x: [&[u8]; 4], k: usize) -> [[f32; 8]; 4] {
    if t == DType::Q4K {
        return super::qgemv_repack_k::vec_dot8x4(isa, g, x, k);
    }
    if t == DType::Q2K {
        return super::qgemv_repack_q2k::vec_dot8x4(isa, g, x, k);
    }
    if has_transposed_kernel(isa, t) {
        let mut tr = vec![0u8; mx_transposed_bytes(k)];
        transpose8_on(isa, t, g, k, &mut tr);
        return mxfp4_8x4_transposed(isa, &tr, x, k);
    }
    if t == DType::MXFP4 {
        return mxfp4_rows8(isa, g, x, k);
    }
    #[cfg(target_arch = "x86_64")]
    if has_four_column_kernel(isa) {
        let nb = k / 32;
        assert!(
            tessera::layout::repack_numerics(t)
                && g.len() >= 8 * nb * BLOCK
                && x.iter().all(|x| x.len() >= nb * QBLOCK),
            "repack vec_dot8x4: {t}, k={k}, a group of {} bytes",
            g.len()
        );
        let (iq4nl, x, pf) = (t == DType::IQ4NL, x.map(|x| x.as_ptr()), 0);
        // SAFETY: `uses_vnni` says the CPU has AVX-512 F/BW/VL, VNNI, AVX2, FMA and F16C,
        // `has_four_column_kernel` that it has AVX2, FMA and F16C; g holds nb blocks of
        // eight rows and each x nb activation blocks (asserted above).
        return unsafe {
            if super::qdot::avx2::uses_vnni(isa) {
                avx512::vec_dot8x4(iq4nl, g.as_ptr(), x, nb)
            } else {
                avx2::vec_dot8::<1, 4>(iq4nl, [g.as_ptr()], x, nb, pf)[0]
            }
        };
    }
    x.map(|x| vec_dot8(isa, t, g, x, k))
}

/// Bytes of one block of eight mxfp4 rows in [`mx_transpose8`]'s layout, where 32-bit lane
/// 2r + c of every 64-byte vector belongs to row r (and, in the kernel, to the c-th column of
/// a pair): the rows' block scales `GGML_E8M0_TO_FP32_HALF(e)` as f32 (64 bytes), −128 times
/// the sum of each row's 32 codebook values as i32 (64), and for each step s of four elements
/// (4s..4s + 4 of the block) the rows' four values as i8 (8 × 64).
pub const MX_TBLOCK: usize = 640;

/// Bytes [`mx_transpose8`] writes for rows of `k` weights.
pub fn mx_transposed_bytes(k: usize) -> usize {
    k / 32 * MX_TBLOCK
}

/// Whether a mat-mat of `t` rows in `Repacked8` rearranges each group ([`transpose8_on`]) for
/// [`mxfp4_8x4_transposed`]: mxfp4 on AVX-512 VNNI and AVX2, q4_0 and iq4_nl on AVX-512 VNNI
/// (the AVX2 kernel sums values of at most 12 in magnitude in 16 bits). On the Zen 4, q4_0
/// mat-mat 512 columns, one thread: 118-126 GFLOP/s with [`vec_dot8x4`]'s kernel (0.88-0.91×
/// ggml's repack kernels), more this way (README).
pub fn has_transposed_kernel(isa: Isa, t: DType) -> bool {
    match t {
        DType::MXFP4 => has_mx_transposed_kernel(isa),
        DType::Q4_0 | DType::IQ4NL => {
            #[cfg(target_arch = "x86_64")]
            return super::qdot::avx2::uses_vnni(isa);
            #[cfg(not(target_arch = "x86_64"))]
            false
        }
        _ => false,
    }
}

/// Whether [`mxfp4_8x4_transposed`] runs here (AVX-512 VNNI, AVX2); else mat-mat keeps
/// [`vec_dot8x4`]'s scalar path on the group.
pub fn has_mx_transposed_kernel(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    return isa != Isa::Scalar && super::qdot::avx2::available();
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// Bytes of one block of an interleaved group of eight rows of `t` (q4_0, iq4_nl: eight f16
/// scales then the rows' 16 nibble bytes; mxfp4: eight exponent bytes then the same).
fn group_block(t: DType) -> usize {
    if t == DType::MXFP4 {
        MX_GBLOCK
    } else {
        8 * BLOCK
    }
}

/// The block count of [`transpose8_on`]'s arguments, checked.
fn mx_transpose_sizes(t: DType, g: &[u8], k: usize, out: &[u8]) -> usize {
    let nb = k / 32;
    assert!(
        matches!(t, DType::Q4_0 | DType::IQ4NL | DType::MXFP4)
            && k.is_multiple_of(32)
            && g.len() >= nb * group_block(t)
            && out.len() >= nb * MX_TBLOCK,
        "repack {t} transpose8: k={k}, a group of {} bytes, room for {}",
        g.len(),
        out.len()
    );
    nb
}

/// One interleaved group of eight mxfp4 rows (`g`, see [`mxfp4_rows8`]) rearranged for
/// [`mxfp4_8x4_transposed`] (see [`MX_TBLOCK`]): one row a lane, as ggml's `block_mxfp4x8`
/// kernels keep them, each row twice so that a vector takes two columns; a mat-mat does it
/// once per group for all its columns.
pub fn mx_transpose8(g: &[u8], k: usize, out: &mut [u8]) {
    mx_transpose8_on(crate::simd::isa(), g, k, out)
}

/// [`mx_transpose8`] with the SIMD of `isa` (AVX-512, AVX2, or the scalar definition): the
/// same bytes on every one.
pub fn mx_transpose8_on(isa: Isa, g: &[u8], k: usize, out: &mut [u8]) {
    transpose8_on(isa, DType::MXFP4, g, k, out)
}

/// [`mx_transpose8`]'s layout for an interleaved group of eight rows of `t` (q4_0, iq4_nl or
/// mxfp4: the block scale as f32, the f16 `d` of q4_0/iq4_nl or mxfp4's
/// `GGML_E8M0_TO_FP32_HALF`, and the values n − 8, the iq4_nl codebook's or mxfp4's) with the
/// SIMD of `isa` (AVX-512 for the three, AVX2 for mxfp4, or the scalar definition): the same
/// bytes on every one.
pub fn transpose8_on(isa: Isa, t: DType, g: &[u8], k: usize, out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if super::qdot::avx2::uses_vnni(isa) {
        let nb = mx_transpose_sizes(t, g, k, out);
        // SAFETY: the CPU has AVX-512 F/BW/VL and VNNI, AVX2 and F16C (`uses_vnni`); g holds
        // nb blocks of eight rows and out nb transposed blocks (asserted above).
        unsafe { avx512::transpose8(t, g.as_ptr(), nb, out.as_mut_ptr()) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if t == DType::MXFP4 && isa != Isa::Scalar && super::qdot::avx2::available() {
        let nb = mx_transpose_sizes(t, g, k, out);
        // SAFETY: the CPU has AVX2, FMA and F16C (checked); g holds nb blocks of eight rows
        // and out nb transposed blocks (asserted by `mx_transpose_sizes`).
        unsafe { avx2::mx_transpose8(g.as_ptr(), nb, out.as_mut_ptr()) };
        return;
    }
    let _ = isa;
    transpose8_scalar(t, g, k, out);
}

/// [`mx_transpose8`] in scalar code: the definition of its layout (public for the tests,
/// which check the SIMD version against it).
pub fn mx_transpose8_scalar(g: &[u8], k: usize, out: &mut [u8]) {
    transpose8_scalar(DType::MXFP4, g, k, out)
}

/// [`transpose8_on`]'s definition in scalar code, for `t` (q4_0, iq4_nl or mxfp4).
pub fn transpose8_scalar(t: DType, g: &[u8], k: usize, out: &mut [u8]) {
    let nb = mx_transpose_sizes(t, g, k, out);
    let gblock = group_block(t);
    let head = gblock - 128;
    for b in 0..nb {
        let o = &mut out[b * MX_TBLOCK..(b + 1) * MX_TBLOCK];
        let blk = &g[b * gblock..(b + 1) * gblock];
        for r in 0..8 {
            let qs = &blk[head + 16 * r..head + 16 + 16 * r];
            // element j < 16 is byte j's low nibble, element j + 16 its high nibble
            let v: [i8; 32] = std::array::from_fn(|j| {
                let q = qs[j % 16];
                value(t, if j < 16 { q & 15 } else { q >> 4 }) as i8
            });
            let n = -128 * v.iter().map(|&a| a as i32).sum::<i32>();
            let scale = match t {
                DType::MXFP4 => e8m0_half(blk[r]),
                _ => f16_to_f32(u16::from_le_bytes([blk[2 * r], blk[2 * r + 1]])),
            };
            for lane in [2 * r, 2 * r + 1] {
                o[4 * lane..4 * lane + 4].copy_from_slice(&scale.to_le_bytes());
                o[64 + 4 * lane..68 + 4 * lane].copy_from_slice(&n.to_le_bytes());
                for s in 0..8 {
                    let at = 128 + 64 * s + 4 * lane;
                    for (o, &v) in o[at..at + 4].iter_mut().zip(&v[4 * s..4 * s + 4]) {
                        *o = v as u8;
                    }
                }
            }
        }
    }
}

/// mxfp4's codebook + 12 and + 128 (unsigned), for the mat-vec kernels' `vpshufb`.
#[cfg(target_arch = "x86_64")]
const MX_BOOK_12: [u8; 16] = book_plus(12);
#[cfg(target_arch = "x86_64")]
const MX_BOOK_128: [u8; 16] = book_plus(128);

#[cfg(target_arch = "x86_64")]
const fn book_plus(off: i16) -> [u8; 16] {
    let mut b = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        b[i] = (KVALUES_FP4[i] as i16 + off) as u8;
        i += 1;
    }
    b
}

/// Block `b`'s scale and integer sum from [`mx_gemv_sums`]' bytes at `sums`.
///
/// # Safety
/// Eight readable bytes at `sums + 8·b`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn block_sums(sums: *const u8, b: usize) -> (f32, i32) {
    // SAFETY: eight readable bytes (caller).
    unsafe {
        let p = sums.add(8 * b);
        (
            (p as *const f32).read_unaligned(),
            (p.add(4) as *const i32).read_unaligned(),
        )
    }
}

/// Blocks of activations the transposed mxfp4 kernels lay out at a time.
#[cfg(target_arch = "x86_64")]
const MX_CHUNK: usize = 8;

/// Four q8_0 columns as the transposed mxfp4 kernels take them, `MX_CHUNK` blocks at a time:
/// per block and pair of columns, the two columns' four bytes of each step side by side
/// (+128, at 8s), and the four columns' scales as f32.
#[cfg(target_arch = "x86_64")]
#[repr(C, align(64))]
struct MxColumns {
    xs: [[[u8; 64]; 2]; MX_CHUNK],
    dx: [[f32; 4]; MX_CHUNK],
}

#[cfg(target_arch = "x86_64")]
impl Default for MxColumns {
    fn default() -> Self {
        MxColumns {
            xs: [[[0; 64]; 2]; MX_CHUNK],
            dx: [[0.0; 4]; MX_CHUNK],
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl MxColumns {
    /// The f16 scales of the four q8_0 blocks at `xb` as f32, for block `i` of the chunk.
    ///
    /// # Safety
    /// The CPU has F16C (the callers' target features); two readable bytes at every `xb`.
    #[inline(always)]
    unsafe fn scales(&mut self, i: usize, xb: [*const u8; 4]) {
        use std::arch::x86_64::*;
        // SAFETY: as above.
        unsafe {
            let mut h = 0u64;
            for (c, &p) in xb.iter().enumerate() {
                h |= ((p as *const u16).read_unaligned() as u64) << (16 * c);
            }
            _mm_storeu_ps(
                self.dx[i].as_mut_ptr(),
                _mm_cvtph_ps(_mm_cvtsi64_si128(h as i64)),
            );
        }
    }
}

/// [`vec_dot8x4`] from eight rows in [`mx_transpose8`]'s layout (`t`; [`transpose8_on`]'s
/// for q4_0 and iq4_nl too, where [`has_transposed_kernel`] says so): the same bits, ggml's
/// repack arithmetic for each (row, column).
pub fn mxfp4_8x4_transposed(isa: Isa, t: &[u8], x: [&[u8]; 4], k: usize) -> [[f32; 8]; 4] {
    let nb = k / 32;
    assert!(
        has_mx_transposed_kernel(isa)
            && k.is_multiple_of(32)
            && t.len() >= nb * MX_TBLOCK
            && x.iter().all(|x| x.len() >= nb * QBLOCK),
        "repack mxfp4 vec_dot8x4_transposed: {isa:?}, k={k}, {} transposed bytes",
        t.len()
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `uses_vnni` says the CPU has AVX-512 F/BW/VL and VNNI, AVX2, FMA and F16C,
    // `has_mx_transposed_kernel` that it has AVX2, FMA and F16C; t holds nb transposed
    // blocks and every x nb q8_0 blocks (asserted above).
    return unsafe {
        let (t, x) = (t.as_ptr(), x.map(|x| x.as_ptr()));
        if super::qdot::avx2::uses_vnni(isa) {
            avx512::mxfp4_gemm_transposed(t, x, nb)
        } else {
            avx2::mxfp4_gemm_transposed(t, x, nb)
        }
    };
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("no transposed mxfp4 kernel off x86")
}

/// Five lines (two blocks of a group) `pf` bytes after `blk` into L2: a group is one
/// sequential run, which Intel's hardware prefetcher does not follow from memory (see
/// `qgemv_0::interleaved_prefetch`; SmolLM2 requantized to q4_0, tg128 on one thread of an
/// AMX Xeon: 91-97 tokens/s without, 103-113 with, against 155 for the plain rows).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_group(blk: *const u8, pf: usize) {
    for line in 0..5 {
        let p = blk.wrapping_add(pf + 64 * line);
        // SAFETY: a prefetch is a hint that never faults, whatever the address.
        unsafe { std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T1) };
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{BLOCK, KVALUES_IQ4NL, QBLOCK};
    use tessera::DType;

    /// The constants of the kernels below.
    struct Consts {
        mask: __m512i,
        /// iq4_nl's codebook + 128, as unsigned bytes, in every 128-bit lane.
        book: __m512i,
        /// C (8 for q4_0, 128 as the unsigned byte 0x80 for iq4_nl) in every byte.
        bias: __m512i,
        /// Even and odd dwords of (a, b).
        even: __m512i,
        odd: __m512i,
        iq4nl: bool,
    }

    impl Consts {
        #[inline(always)]
        unsafe fn new(iq4nl: bool) -> Consts {
            let mut book = [0u8; 16];
            for (o, &v) in book.iter_mut().zip(KVALUES_IQ4NL.iter()) {
                *o = (v as i16 + 128) as u8;
            }
            // SAFETY: AVX-512 F/BW (the callers' target features); 16 readable bytes.
            unsafe {
                Consts {
                    mask: _mm512_set1_epi8(0x0F),
                    book: _mm512_broadcast_i32x4(_mm_loadu_si128(book.as_ptr() as *const __m128i)),
                    bias: _mm512_set1_epi8(if iq4nl { -128 } else { 8 }),
                    even: _mm512_set_epi32(
                        30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0,
                    ),
                    odd: _mm512_set_epi32(
                        31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1,
                    ),
                    iq4nl,
                }
            }
        }

        /// The unsigned operands of one block of the group at `blk`: the low and high
        /// nibbles of rows 0-3 and of rows 4-7 (row r's 16 bytes in 128-bit lane r % 4),
        /// as they are (q4_0) or as codebook values + 128 (iq4_nl).
        #[inline(always)]
        unsafe fn nibbles(&self, blk: *const u8) -> [__m512i; 4] {
            // SAFETY: the block's 128 bytes of quants are readable (caller); AVX-512 F/BW.
            unsafe {
                let q0 = _mm512_loadu_si512(blk.add(16) as *const _);
                let q1 = _mm512_loadu_si512(blk.add(80) as *const _);
                let n = [
                    _mm512_and_si512(q0, self.mask),
                    _mm512_and_si512(_mm512_srli_epi16::<4>(q0), self.mask),
                    _mm512_and_si512(q1, self.mask),
                    _mm512_and_si512(_mm512_srli_epi16::<4>(q1), self.mask),
                ];
                if self.iq4nl {
                    n.map(|v| _mm512_shuffle_epi8(self.book, v))
                } else {
                    n
                }
            }
        }

        /// One activation block (`xb`) against the group's block (`n`): the exact integer
        /// sums of each row's four lanes, from −C·Σy of the lane's activations, summed in
        /// pairs: row r's two halves in lanes 2r and 2r + 1.
        #[inline(always)]
        unsafe fn pair_sums(&self, n: &[__m512i; 4], xb: *const u8) -> __m512i {
            // SAFETY: the block's 32 activation bytes are readable (caller); AVX-512 VNNI.
            unsafe {
                let ylo = _mm512_broadcast_i32x4(_mm_loadu_si128(xb.add(2) as *const __m128i));
                let yhi = _mm512_broadcast_i32x4(_mm_loadu_si128(xb.add(18) as *const __m128i));
                let zero = _mm512_setzero_si512();
                let c =
                    _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, self.bias, ylo), self.bias, yhi);
                let s0 = _mm512_sub_epi32(
                    _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, n[0], ylo), n[1], yhi),
                    c,
                );
                let s1 = _mm512_sub_epi32(
                    _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, n[2], ylo), n[3], yhi),
                    c,
                );
                _mm512_add_epi32(
                    _mm512_permutex2var_epi32(s0, self.even, s1),
                    _mm512_permutex2var_epi32(s0, self.odd, s1),
                )
            }
        }
    }

    /// The f16 scale of the q8_0 block at `xb`.
    #[inline(always)]
    unsafe fn scale(xb: *const u8) -> f32 {
        // SAFETY: two readable bytes (caller).
        unsafe { super::f16_to_f32(u16::from_le_bytes([*xb, *xb.add(1)])) }
    }

    /// [`super::vec_dot8`] on AVX-512 VNNI. Per block: the low nibbles of rows 0-3 (4-7) in
    /// one vector, row r's 16 bytes in 128-bit lane r, the high nibbles in another; the
    /// unsigned operand of `vpdpbusd` is the nibble (q4_0) or codebook value + 128 (iq4_nl),
    /// so each lane starts from −8·Σy (−128·Σy) of its four activations; the four lanes of a
    /// row are then summed exactly (two permutes, an add, a shift, an add, a narrowing) into
    /// the row's block integer, converted, and fused-multiply-added with the scale product.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL and VNNI, AVX2, FMA and F16C; `g` points at `nb` blocks of
    /// eight interleaved rows (`8 × 18` bytes each), `x` at `nb` q8_0 blocks.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn vec_dot8<const G: usize>(
        iq4nl: bool,
        g: [*const u8; G],
        x: *const u8,
        nb: usize,
        pf: usize,
    ) -> [[f32; 8]; G] {
        // SAFETY: the target features above.
        let k = unsafe { Consts::new(iq4nl) };
        let mut acc = [_mm256_setzero_ps(); G];
        for b in 0..nb {
            // SAFETY: block b of every group and of x are readable (caller).
            unsafe {
                let xb = x.add(b * QBLOCK);
                let dx = _mm256_set1_ps(scale(xb));
                for (a, &g) in acc.iter_mut().zip(&g) {
                    let blk = g.add(b * 8 * BLOCK);
                    if pf != 0 && b % 2 == 0 {
                        super::prefetch_group(blk, pf);
                    }
                    let p = k.pair_sums(&k.nibbles(blk), xb);
                    let p = _mm512_add_epi32(p, _mm512_srli_epi64::<32>(p));
                    let isum = _mm512_cvtepi64_epi32(p);
                    let dw = _mm256_cvtph_ps(_mm_loadu_si128(blk as *const __m128i));
                    *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, dx), *a);
                }
            }
        }
        let mut out = [[0f32; 8]; G];
        for (o, a) in out.iter_mut().zip(&acc) {
            // SAFETY: 32 writable bytes.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr(), *a) };
        }
        out
    }

    /// ggml's repack arithmetic for one interleaved group of eight mxfp4 rows against one
    /// q8_0 column (mat-vec): per block rows 0-3 and 4-7 in two vectors (one 64-byte load
    /// each, row r's 16 bytes in 128-bit lane r % 4), their nibbles mapped to the codebook's
    /// values + 128 (unsigned), two `vpdpbusd` a vector (low nibbles with activations 0-15,
    /// high ones with 16-31), the four lanes of each row summed exactly (two permutes, an
    /// add, a shift, an add, a narrowing) into the row's block integer less 128·Σy (from
    /// `sums`), then one conversion and one FMA with the rounded product of the scales (the
    /// eight exponents one 8-byte load).
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL and VNNI, AVX2, FMA and F16C; `nb` blocks of the group at
    /// `g`, `nb` q8_0 blocks at `x` and their `super::mx_gemv_sums` at `sums`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn mxfp4_gemv8(g: *const u8, x: *const u8, sums: *const u8, nb: usize) -> [f32; 8] {
        // SAFETY: every load lies inside the group, the activation blocks and their sums
        // (caller); the target features above; prefetches never fault.
        unsafe {
            let book = _mm512_broadcast_i32x4(_mm_loadu_si128(
                super::MX_BOOK_128.as_ptr() as *const __m128i
            ));
            let m4 = _mm512_set1_epi8(15);
            let zero = _mm512_setzero_si512();
            let even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
            let odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
            let mut acc = _mm256_setzero_ps();
            for b in 0..nb {
                let gb = g.add(b * super::MX_GBLOCK);
                let xb = x.add(b * QBLOCK);
                let ylo = _mm512_broadcast_i32x4(_mm_loadu_si128(xb.add(2) as *const __m128i));
                let yhi = _mm512_broadcast_i32x4(_mm_loadu_si128(xb.add(18) as *const __m128i));
                let dots: [__m512i; 2] = std::array::from_fn(|h| {
                    let z = _mm512_loadu_si512(gb.add(8 + 64 * h) as *const _);
                    let lo = _mm512_shuffle_epi8(book, _mm512_and_si512(z, m4));
                    let hi =
                        _mm512_shuffle_epi8(book, _mm512_and_si512(_mm512_srli_epi16::<4>(z), m4));
                    _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, lo, ylo), hi, yhi)
                });
                let p = _mm512_add_epi32(
                    _mm512_permutex2var_epi32(dots[0], even, dots[1]),
                    _mm512_permutex2var_epi32(dots[0], odd, dots[1]),
                );
                let p = _mm512_add_epi32(p, _mm512_srli_epi64::<32>(p));
                let (dx, sy) = super::block_sums(sums, b);
                let isum = _mm256_sub_epi32(_mm512_cvtepi64_epi32(p), _mm256_set1_epi32(sy << 7));
                let e = super::super::qgemv_0::e8m0_half_at(gb);
                acc = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(isum),
                    _mm256_mul_ps(e, _mm256_set1_ps(dx)),
                    acc,
                );
            }
            let mut out = [0f32; 8];
            _mm256_storeu_ps(out.as_mut_ptr(), acc);
            out
        }
    }

    /// [`super::mx_transpose8`] on AVX-512: per block rows 0-3 and 4-7 in two vectors (row
    /// r's 16 bytes in 128-bit lane r % 4), their nibbles mapped to the codebook's values, one
    /// two-source permute a step to put each row's four values in lanes 2r and 2r + 1, the
    /// values' sums by `vpdpbusd` with ones, the scales as `super::super::qgemv_0::e8m0_half_at`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL and VNNI, AVX2 and F16C; `nb` blocks of an interleaved
    /// group of eight rows at `g`; `nb * MX_TBLOCK` writable bytes at `out`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn transpose8(t: DType, g: *const u8, nb: usize, out: *mut u8) {
        // SAFETY: every load lies inside the group, every store inside out (caller); the
        // target features above.
        unsafe {
            // the values of the sixteen codes
            let mut values = [0i8; 16];
            for (n, v) in values.iter_mut().enumerate() {
                *v = super::value(t, n as u8) as i8;
            }
            let book = _mm512_broadcast_i32x4(_mm_loadu_si128(values.as_ptr() as *const __m128i));
            let (gblock, head) = (super::group_block(t), super::group_block(t) - 128);
            let m4 = _mm512_set1_epi8(15);
            let ones = _mm512_set1_epi8(1);
            let twice = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
            let step: [__m512i; 4] = std::array::from_fn(|s| {
                let s = s as i32;
                _mm512_setr_epi32(
                    s,
                    s,
                    4 + s,
                    4 + s,
                    8 + s,
                    8 + s,
                    12 + s,
                    12 + s,
                    16 + s,
                    16 + s,
                    20 + s,
                    20 + s,
                    24 + s,
                    24 + s,
                    28 + s,
                    28 + s,
                )
            });
            for b in 0..nb {
                let gb = g.add(b * gblock);
                // rows 4h..4h + 4, row r's 16 bytes in 128-bit lane r % 4
                let quads = |h: usize| _mm512_loadu_si512(gb.add(head + 64 * h) as *const _);
                let (a, c) = (quads(0), quads(1));
                let lo = |v: __m512i| _mm512_shuffle_epi8(book, _mm512_and_si512(v, m4));
                let hi = |v: __m512i| {
                    _mm512_shuffle_epi8(book, _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4))
                };
                let halves = [(lo(a), lo(c)), (hi(a), hi(c))];
                let o = out.add(b * super::MX_TBLOCK);
                let mut sum = _mm512_setzero_si512();
                for s in 0..8 {
                    let (p, q) = halves[s / 4];
                    let w = _mm512_permutex2var_epi32(p, step[s % 4], q);
                    _mm512_storeu_si512(o.add(128 + 64 * s) as *mut _, w);
                    sum = _mm512_dpbusd_epi32(sum, ones, w);
                }
                let n = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<7>(sum));
                _mm512_storeu_si512(o.add(64) as *mut _, n);
                let e = if t == DType::MXFP4 {
                    super::super::qgemv_0::e8m0_half_at(gb)
                } else {
                    _mm256_cvtph_ps(_mm_loadu_si128(gb as *const __m128i))
                };
                let e = _mm512_permutexvar_ps(twice, _mm512_castps256_ps512(e));
                _mm512_storeu_ps(o as *mut f32, e);
            }
        }
    }

    /// [`super::mxfp4_8x4_transposed`] on AVX-512 VNNI. Lane 2r + c of a vector is row r
    /// against column c of a pair (two pairs, two accumulators). Per block, each step of four
    /// elements is one `vpdpbusd` a pair: the activations' four bytes + 128 (unsigned) of
    /// both columns broadcast against the rows' signed values, from −128·Σ(values) so that
    /// the sum is the exact integer; then one conversion and one FMA with the rounded product
    /// of the scales, as ggml's kernel. The activations of a chunk of blocks are first laid
    /// out as those broadcasts (two columns' dwords side by side) on the stack.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL and VNNI, AVX2, FMA and F16C; `t` points at `nb` blocks of
    /// `super::mx_transpose8`'s layout, every `x` at `nb` q8_0 blocks.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn mxfp4_gemm_transposed(
        t: *const u8,
        x: [*const u8; 4],
        nb: usize,
    ) -> [[f32; 8]; 4] {
        const CH: usize = super::MX_CHUNK;
        let mut ch = super::MxColumns::default();
        // SAFETY: every load lies inside t's nb blocks, the activation blocks and `ch`
        // (caller); the target features above.
        unsafe {
            let flip = _mm512_set1_epi8(-128);
            let pairs = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
            let mut acc = [_mm512_setzero_ps(); 2];
            let mut b0 = 0;
            while b0 < nb {
                let len = CH.min(nb - b0);
                for i in 0..len {
                    let b = b0 + i;
                    let xb = x.map(|x| x.add(b * QBLOCK));
                    for h in 0..2 {
                        let ya = _mm512_castsi256_si512(_mm256_loadu_si256(
                            xb[2 * h].add(2) as *const __m256i
                        ));
                        let yb = _mm512_castsi256_si512(_mm256_loadu_si256(
                            xb[2 * h + 1].add(2) as *const __m256i
                        ));
                        let v = _mm512_xor_si512(_mm512_permutex2var_epi32(ya, pairs, yb), flip);
                        _mm512_store_si512(ch.xs[i][h].as_mut_ptr() as *mut _, v);
                    }
                    ch.scales(i, xb);
                }
                for i in 0..len {
                    let tb = t.add((b0 + i) * super::MX_TBLOCK);
                    let e = _mm512_loadu_ps(tb as *const f32);
                    let n = _mm512_loadu_si512(tb.add(64) as *const _);
                    let mut sums = [n, n];
                    for s in 0..8 {
                        let w = _mm512_loadu_si512(tb.add(128 + 64 * s) as *const _);
                        for (h, sum) in sums.iter_mut().enumerate() {
                            let y = _mm512_set1_epi64(
                                (ch.xs[i][h].as_ptr().add(8 * s) as *const i64).read(),
                            );
                            *sum = _mm512_dpbusd_epi32(*sum, y, w);
                        }
                    }
                    for (h, (a, sum)) in acc.iter_mut().zip(sums).enumerate() {
                        let dx = _mm512_castpd_ps(_mm512_set1_pd(
                            (ch.dx[i].as_ptr().add(2 * h) as *const f64).read_unaligned(),
                        ));
                        *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(e, dx), *a);
                    }
                }
                b0 += len;
            }
            let mut lanes = [[0f32; 16]; 2];
            for (l, a) in lanes.iter_mut().zip(&acc) {
                _mm512_storeu_ps(l.as_mut_ptr(), *a);
            }
            std::array::from_fn(|c| std::array::from_fn(|r| lanes[c / 2][2 * r + c % 2]))
        }
    }

    /// [`super::vec_dot8x4`] on AVX-512 VNNI: per block the nibbles of the eight rows split
    /// (and mapped) once; per column the integers of [`vec_dot8`] up to the pair sums, then
    /// two columns' last step of the reduction at once (their rows in the two 256-bit
    /// halves), and one conversion and FMA for the pair: the same operations on every lane
    /// as [`vec_dot8`].
    ///
    /// # Safety
    /// As for [`vec_dot8`], with four activation rows.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn vec_dot8x4(
        iq4nl: bool,
        g: *const u8,
        x: [*const u8; 4],
        nb: usize,
    ) -> [[f32; 8]; 4] {
        // SAFETY: the target features above.
        let k = unsafe { Consts::new(iq4nl) };
        let mut acc = [_mm512_setzero_ps(); 2];
        for b in 0..nb {
            // SAFETY: block b of the group and of every x are readable (caller).
            unsafe {
                let blk = g.add(b * 8 * BLOCK);
                let n = k.nibbles(blk);
                let heads = _mm_loadu_si128(blk as *const __m128i);
                let dw = _mm512_cvtph_ps(_mm256_broadcastsi128_si256(heads));
                for (h, a) in acc.iter_mut().enumerate() {
                    let (xa, xb) = (x[2 * h].add(b * QBLOCK), x[2 * h + 1].add(b * QBLOCK));
                    let (pa, pb) = (k.pair_sums(&n, xa), k.pair_sums(&n, xb));
                    // column 2h's rows in lanes 0..8, column 2h + 1's in 8..16
                    let isum = _mm512_add_epi32(
                        _mm512_permutex2var_epi32(pa, k.even, pb),
                        _mm512_permutex2var_epi32(pa, k.odd, pb),
                    );
                    let dx = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                        _mm512_castps_pd(_mm512_set1_ps(scale(xa))),
                        _mm256_castps_pd(_mm256_set1_ps(scale(xb))),
                    ));
                    *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, dx), *a);
                }
            }
        }
        let mut out = [[0f32; 8]; 4];
        for (h, a) in acc.iter().enumerate() {
            // SAFETY: 32 writable bytes each.
            unsafe {
                _mm256_storeu_ps(out[2 * h].as_mut_ptr(), _mm512_castps512_ps256(*a));
                _mm256_storeu_ps(
                    out[2 * h + 1].as_mut_ptr(),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(*a))),
                );
            }
        }
        out
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{BLOCK, KVALUES_IQ4NL, QBLOCK};

    /// ggml's repack arithmetic for one interleaved group of eight mxfp4 rows against one
    /// q8_0 column on AVX2: per block rows 2j and 2j + 1 in one vector (one 32-byte load:
    /// their 16 nibble bytes in the two 128-bit lanes), mapped to the codebook's values + 12
    /// (unsigned, at most 24); `vpmaddubsw` with the activations (low nibbles with 0-15, high
    /// ones with 16-31: each i16 at most 2·24·128, the two added at most 12,288), `vphaddw`
    /// of two such vectors (at most 24,576, still exact), `vpmaddwd` by ones and one
    /// `vphaddd` to each row's integer in the order 0 2 4 6 | 1 3 5 7, less 12·Σy (from
    /// `sums`), then one conversion and FMA with the rounded product of the scales (the
    /// eight exponents one 8-byte load, put in that order by one `vpshufb`).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `nb` blocks of the group at `g`, `nb` q8_0 blocks at
    /// `x` and their `super::mx_gemv_sums` at `sums`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn mxfp4_gemv8(g: *const u8, x: *const u8, sums: *const u8, nb: usize) -> [f32; 8] {
        // SAFETY: every load lies inside the group, the activation blocks and their sums
        // (caller); the target features above.
        unsafe {
            let book = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                super::MX_BOOK_12.as_ptr() as *const __m128i
            ));
            let m4 = _mm256_set1_epi8(15);
            let ones = _mm256_set1_epi16(1);
            // the exponents in the reduction's order
            let order = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, -1, -1, -1, -1, -1, -1, -1, -1);
            let mut acc = _mm256_setzero_ps();
            for b in 0..nb {
                let gb = g.add(b * super::MX_GBLOCK);
                let xb = x.add(b * QBLOCK);
                let ylo = _mm256_broadcastsi128_si256(_mm_loadu_si128(xb.add(2) as *const __m128i));
                let yhi =
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(xb.add(18) as *const __m128i));
                let pair = |j: usize| {
                    let q = _mm256_loadu_si256(gb.add(8 + 32 * j) as *const __m256i);
                    let lo = _mm256_shuffle_epi8(book, _mm256_and_si256(q, m4));
                    let hi =
                        _mm256_shuffle_epi8(book, _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4));
                    _mm256_add_epi16(_mm256_maddubs_epi16(lo, ylo), _mm256_maddubs_epi16(hi, yhi))
                };
                let isum = _mm256_hadd_epi32(
                    _mm256_madd_epi16(_mm256_hadd_epi16(pair(0), pair(1)), ones),
                    _mm256_madd_epi16(_mm256_hadd_epi16(pair(2), pair(3)), ones),
                );
                let (dx, sy) = super::block_sums(sums, b);
                let isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(12 * sy));
                let e = super::super::qgemv_0::e8m0_half_lanes(_mm256_cvtepu8_epi32(
                    _mm_shuffle_epi8(_mm_loadl_epi64(gb as *const __m128i), order),
                ));
                acc = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(isum),
                    _mm256_mul_ps(e, _mm256_set1_ps(dx)),
                    acc,
                );
            }
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
            let mut out = [0f32; 8];
            for (i, r) in [0, 2, 4, 6, 1, 3, 5, 7].into_iter().enumerate() {
                out[r] = lanes[i];
            }
            out
        }
    }

    /// [`super::mx_transpose8`] on AVX2: per block rows 2j and 2j + 1 in one vector (their 16
    /// bytes in the two 128-bit lanes), their nibbles mapped to the codebook's values; each
    /// 32-byte half of a step from two such vectors by two permutes and a blend; the rows'
    /// sums by `vpmaddubsw` with ones (every i16 at most 8·2·12), the scales as
    /// `super::super::qgemv_0::e8m0_half_at`.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `nb` blocks of an interleaved group of eight rows at
    /// `g`; `nb * MX_TBLOCK` writable bytes at `out`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn mx_transpose8(g: *const u8, nb: usize, out: *mut u8) {
        // SAFETY: every load lies inside the group, every store inside out (caller); the
        // target features above.
        unsafe {
            let book = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                super::KVALUES_FP4.as_ptr() as *const __m128i
            ));
            let m4 = _mm256_set1_epi8(15);
            let ones8 = _mm256_set1_epi8(1);
            let ones16 = _mm256_set1_epi16(1);
            for b in 0..nb {
                let gb = g.add(b * super::MX_GBLOCK);
                let o = out.add(b * super::MX_TBLOCK);
                // [lo, hi][pair j]: rows 2j, 2j + 1 (one 32-byte load)
                let q: [__m256i; 4] = std::array::from_fn(|j| {
                    _mm256_loadu_si256(gb.add(8 + 32 * j) as *const __m256i)
                });
                let v = [
                    q.map(|q| _mm256_shuffle_epi8(book, _mm256_and_si256(q, m4))),
                    q.map(|q| {
                        _mm256_shuffle_epi8(book, _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4))
                    }),
                ];
                for half in 0..2 {
                    let mut sum = _mm256_setzero_si256();
                    for s in 0..8 {
                        let d = (s % 4) as i32;
                        let idx = _mm256_setr_epi32(d, d, 4 + d, 4 + d, d, d, 4 + d, 4 + d);
                        let (a, c) = (v[s / 4][2 * half], v[s / 4][2 * half + 1]);
                        let w = _mm256_blend_epi32::<0xF0>(
                            _mm256_permutevar8x32_epi32(a, idx),
                            _mm256_permutevar8x32_epi32(c, idx),
                        );
                        _mm256_storeu_si256(o.add(128 + 64 * s + 32 * half) as *mut __m256i, w);
                        sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(ones8, w));
                    }
                    let sum = _mm256_madd_epi16(sum, ones16);
                    let n = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<7>(sum));
                    _mm256_storeu_si256(o.add(64 + 32 * half) as *mut __m256i, n);
                }
                let e = super::super::qgemv_0::e8m0_half_at(gb);
                let lo = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
                let hi = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
                _mm256_storeu_ps(o as *mut f32, _mm256_permutevar8x32_ps(e, lo));
                _mm256_storeu_ps(o.add(32) as *mut f32, _mm256_permutevar8x32_ps(e, hi));
            }
        }
    }

    /// [`super::mxfp4_8x4_transposed`] on AVX2: the lanes of the AVX-512 kernel, rows 0-3
    /// in one 256-bit half and rows 4-7 in the other; each four elements `vpmaddubsw` of the
    /// two columns' activations + 128 (unsigned, at most 255) with the rows' values (|v| ≤
    /// 12), pair sums at most 2·255·12 = 6120, four steps added as i16 (at most 24,480: no
    /// overflow), then `vpmaddwd` by ones into the i32 sum that starts at −128·Σ(values): the
    /// block's exact integer, converted and fused-multiply-added with the rounded product of
    /// the scales.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `t` points at `nb` blocks of `super::mx_transpose8`'s
    /// layout, every `x` at `nb` q8_0 blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn mxfp4_gemm_transposed(
        t: *const u8,
        x: [*const u8; 4],
        nb: usize,
    ) -> [[f32; 8]; 4] {
        const CH: usize = super::MX_CHUNK;
        let mut ch = super::MxColumns::default();
        // SAFETY: every load lies inside t's nb blocks, the activation blocks and `ch`
        // (caller); the target features above.
        unsafe {
            let flip = _mm256_set1_epi8(-128);
            let ones = _mm256_set1_epi16(1);
            // [pair][rows 0-3, 4-7]
            let mut acc = [[_mm256_setzero_ps(); 2]; 2];
            let mut b0 = 0;
            while b0 < nb {
                let len = CH.min(nb - b0);
                for i in 0..len {
                    let b = b0 + i;
                    let xb = x.map(|x| x.add(b * QBLOCK));
                    for h in 0..2 {
                        let ya = _mm256_loadu_si256(xb[2 * h].add(2) as *const __m256i);
                        let yb = _mm256_loadu_si256(xb[2 * h + 1].add(2) as *const __m256i);
                        // dwords a0 b0 a1 b1 | a4 b4 a5 b5 and a2 b2 a3 b3 | a6 b6 a7 b7
                        let (lo, hi) =
                            (_mm256_unpacklo_epi32(ya, yb), _mm256_unpackhi_epi32(ya, yb));
                        let o = ch.xs[i][h].as_mut_ptr() as *mut __m256i;
                        _mm256_store_si256(
                            o,
                            _mm256_xor_si256(_mm256_permute2x128_si256::<0x20>(lo, hi), flip),
                        );
                        _mm256_store_si256(
                            o.add(1),
                            _mm256_xor_si256(_mm256_permute2x128_si256::<0x31>(lo, hi), flip),
                        );
                    }
                    ch.scales(i, xb);
                }
                for i in 0..len {
                    let tb = t.add((b0 + i) * super::MX_TBLOCK);
                    for (h, acc) in acc.iter_mut().enumerate() {
                        let dx = _mm256_castpd_ps(_mm256_set1_pd(
                            (ch.dx[i].as_ptr().add(2 * h) as *const f64).read_unaligned(),
                        ));
                        for (q, a) in acc.iter_mut().enumerate() {
                            let mut sum = _mm256_loadu_si256(tb.add(64 + 32 * q) as *const __m256i);
                            for g in 0..2 {
                                let mut p = _mm256_setzero_si256();
                                for s in 4 * g..4 * g + 4 {
                                    let y = _mm256_set1_epi64x(
                                        (ch.xs[i][h].as_ptr().add(8 * s) as *const i64).read(),
                                    );
                                    let w = _mm256_loadu_si256(
                                        tb.add(128 + 64 * s + 32 * q) as *const __m256i
                                    );
                                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(y, w));
                                }
                                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, ones));
                            }
                            let e = _mm256_loadu_ps(tb.add(32 * q) as *const f32);
                            *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(e, dx), *a);
                        }
                    }
                }
                b0 += len;
            }
            let mut lanes = [[0f32; 16]; 2];
            for (l, a) in lanes.iter_mut().zip(&acc) {
                _mm256_storeu_ps(l.as_mut_ptr(), a[0]);
                _mm256_storeu_ps(l.as_mut_ptr().add(8), a[1]);
            }
            std::array::from_fn(|c| std::array::from_fn(|r| lanes[c / 2][2 * r + c % 2]))
        }
    }

    /// [`super::vec_dot8`] on AVX2. Per block: rows 2h and 2h + 1 in one vector (their 16
    /// nibble bytes in the two 128-bit lanes), low and high nibbles split and mapped to their
    /// signed values (n − 8, or the codebook); `vpmaddubsw` takes the activations' magnitudes
    /// (unsigned, so −128 too) and the values with the activations' signs (|v| ≤ 127, so no
    /// negation overflows), every pair sum at most 2·128·127 < 2¹⁵, exact; `vpmaddwd` by ones
    /// to four i32 lanes per row, and three `vphaddd` to one integer per row, in the order
    /// 0 2 4 6 | 1 3 5 7 (the scales are permuted to match and the accumulator back at the
    /// end).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `g` points at `nb` blocks of eight interleaved rows
    /// (`8 × 18` bytes each), `x` at `nb` q8_0 blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot8<const G: usize, const C: usize>(
        iq4nl: bool,
        g: [*const u8; G],
        x: [*const u8; C],
        nb: usize,
        pf: usize,
    ) -> [[[f32; 8]; C]; G] {
        let mask = _mm256_set1_epi8(0x0F);
        let mut book = [0i8; 16];
        for (n, o) in book.iter_mut().enumerate() {
            *o = if iq4nl { KVALUES_IQ4NL[n] } else { n as i8 - 8 };
        }
        // SAFETY: 16 readable bytes.
        let book = unsafe {
            _mm256_broadcastsi128_si256(_mm_loadu_si128(book.as_ptr() as *const __m128i))
        };
        let ones = _mm256_set1_epi16(1);
        // lanes 0 2 4 6 | 1 3 5 7 of the reduction, and back
        let order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
        let back = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let mut acc = [[_mm256_setzero_ps(); C]; G];
        for b in 0..nb {
            for (acc, &g) in acc.iter_mut().zip(&g) {
                // SAFETY: block b of every group and of every x are readable (caller).
                unsafe {
                    let blk = g.add(b * 8 * BLOCK);
                    if pf != 0 && b % 2 == 0 {
                        super::prefetch_group(blk, pf);
                    }
                    // the signed values of rows 2h and 2h + 1, low and high nibbles, once for all
                    // columns
                    let w: [(__m256i, __m256i); 4] = std::array::from_fn(|h| {
                        let q = _mm256_loadu_si256(blk.add(16 + 32 * h) as *const __m256i);
                        (
                            _mm256_shuffle_epi8(book, _mm256_and_si256(q, mask)),
                            _mm256_shuffle_epi8(
                                book,
                                _mm256_and_si256(_mm256_srli_epi16::<4>(q), mask),
                            ),
                        )
                    });
                    let dw = _mm256_permutevar8x32_ps(
                        _mm256_cvtph_ps(_mm_loadu_si128(blk as *const __m128i)),
                        order,
                    );
                    for (a, &x) in acc.iter_mut().zip(&x) {
                        let xb = x.add(b * QBLOCK);
                        let ylo = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                            xb.add(2) as *const __m128i
                        ));
                        let yhi = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                            xb.add(18) as *const __m128i
                        ));
                        let (alo, ahi) = (_mm256_abs_epi8(ylo), _mm256_abs_epi8(yhi));
                        let pair = |h: usize| {
                            let (lo, hi) = w[h];
                            let plo = _mm256_maddubs_epi16(alo, _mm256_sign_epi8(lo, ylo));
                            let phi = _mm256_maddubs_epi16(ahi, _mm256_sign_epi8(hi, yhi));
                            _mm256_add_epi32(
                                _mm256_madd_epi16(plo, ones),
                                _mm256_madd_epi16(phi, ones),
                            )
                        };
                        let isum = _mm256_hadd_epi32(
                            _mm256_hadd_epi32(pair(0), pair(1)),
                            _mm256_hadd_epi32(pair(2), pair(3)),
                        );
                        let dx = _mm256_set1_ps(super::f16_to_f32(u16::from_le_bytes([
                            *xb,
                            *xb.add(1),
                        ])));
                        *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, dx), *a);
                    }
                }
            }
        }
        let mut out = [[[0f32; 8]; C]; G];
        for (o, a) in out.iter_mut().flatten().zip(acc.iter().flatten()) {
            // SAFETY: 32 writable bytes.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr(), _mm256_permutevar8x32_ps(*a, back)) };
        }
        out
    }
}
