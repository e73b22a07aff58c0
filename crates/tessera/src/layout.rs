//! How a leaf's rows lie in memory: ggml's layout (row after row), or interleaved in groups
//! of eight rows for the CPU's eight-row mat-vec kernels.
//!
//! [`RowLayout::Interleaved8`] is this crate's own layout (not a GGUF one; files and the
//! reference always see ggml's rows): the rows go in groups of eight consecutive rows, and a
//! group holds, for each block position `i` in turn, the eight rows' block heads (the scale
//! fields: q4_0's and iq4_nl's f16 `d`, q4_1's f16 pair `d m`, q5_0's `d` and `qh`, q5_1's
//! `d m` and `qh`, mxfp4's exponent byte, iq4_xs's `d`, `scales_h` and `scales_l`), row 0's
//! first, then the eight rows' quants 16 bytes at a time: each row's first 16 bytes, row 0's
//! first, then each row's next 16 (q4_0, q4_1, q5_0, q5_1, iq4_nl and mxfp4 have 16;
//! iq4_xs 128, one run of eight rows' 16 bytes per 32-element sub-block). So a group's block
//! `i` is one run of `8 × block bytes` (144 for q4_0, 1088 for iq4_xs), the eight scales in
//! one load and four rows' quants in one 64-byte load, and the eight rows stream from memory
//! as one sequential run. q4_K, q5_K and q6_K keep each superblock whole (their "head" is the
//! whole block): a group's superblock `i` is the eight rows' superblocks `i` one after the
//! other (1152, 1408 and 1680 bytes), read by the same kernels as the plain rows, one
//! sequential stream instead of eight. It is the idea of ggml's CPU
//! "repack" buffers (`block_q4_0x8`), with a simpler arrangement of the quants (kept as
//! ggml's `qs`, byte for byte). The size is the plain size: only the order of the bytes
//! changes.
//!
//! [`RowLayout::Repacked8`] keeps the same bytes but asks for other arithmetic: that of ggml's
//! CPU "repack" buffer (`CPU_REPACK`, llama.cpp's default on x86 for q4_0, iq4_nl, q4_K and
//! mxfp4 weights with a multiple of eight rows), so that a product's results equal llama.cpp's default
//! rather than its `--no-repack` (ggml's plain rows, which every other layout reproduces).
//! For each row and column it adds one block at a time, in block order: the block's exact
//! integer dot product (32 weights × 32 q8_0 activations), converted to f32, times the product
//! of the two blocks' f16 scales (exact in f32), by one fused multiply-add into an f32
//! accumulator that starts at zero; the result is that accumulator, whatever the column count
//! or thread count. mxfp4 rows take the same steps, with the block scale ggml's
//! `GGML_E8M0_TO_FP32_HALF` of the block's exponent byte, whose product with the
//! activations' f16 scale is rounded (it can be subnormal) before the multiply-add, as in
//! ggml; their bytes are interleaved as above with a one-byte head (per block the eight
//! exponents, then the eight rows' 16 bytes of nibbles: 136 bytes, ggml's `block_mxfp4x8`
//! in a simpler order), as in [`RowLayout::Interleaved8`] mxfp4. q4_K rows take it too (ggml
//! repacks them on x86 as well), on their plain bytes, so the weights stay mapped (the mat-mat
//! kernel rearranges each group of eight rows on the way). Its rounding depends on the
//! column: ggml's four-column kernel adds one FMA per 64 weights, its one-column kernel one
//! per 256 (see `qgemv_repack_k` in `tessera-cpu`). q2_K rows too, on their plain bytes (ggml
//! repacks them where it is built with AVX-512): one FMA per 128 weights in the four-column
//! kernel, one per 256 in the one-column kernel (`qgemv_repack_q2k`).
//!
//! A graph sets either on a leaf with [`Graph::set_layout`](crate::Graph::set_layout); planning
//! refuses it unless every reader of the leaf is a `mul_mat` taking it as its first operand,
//! so no other kernel ever sees the interleaved bytes. `Session::set_bytes`/`get_bytes`/
//! `set_f32`/`get_f32` take and give ggml's rows; the reference backend reads it through
//! [`deinterleave8`].

use crate::error::{Error, Result};
use crate::DType;

/// The arrangement of a tensor's rows in memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RowLayout {
    /// ggml's: row after row, as in GGUF files.
    #[default]
    Plain,
    /// Groups of eight rows interleaved block by block (see the module's documentation).
    Interleaved8,
    /// The bytes of [`RowLayout::Interleaved8`] (q4_0, iq4_nl, mxfp4) or the plain rows
    /// (q4_K, q2_K), multiplied with the arithmetic of ggml's CPU repack buffer (see the module's
    /// documentation).
    Repacked8,
}

/// Whether rows of `t` can take [`RowLayout::Repacked8`] (the types whose ggml repack kernels
/// this crate reproduces).
pub fn repack_numerics(t: DType) -> bool {
    matches!(
        t,
        DType::Q4_0 | DType::IQ4NL | DType::Q4K | DType::MXFP4 | DType::Q2K
    )
}

/// Whether a tensor of `t` in `layout` holds its bytes in another order than ggml's rows (so
/// that reading or writing it goes through [`interleave8`] / [`deinterleave8`]).
pub fn reorders(layout: RowLayout, t: DType) -> bool {
    match layout {
        RowLayout::Plain => false,
        RowLayout::Interleaved8 => true,
        // (q4_K and q2_K take ggml's repack arithmetic on their plain rows)
        RowLayout::Repacked8 => matches!(t, DType::Q4_0 | DType::IQ4NL | DType::MXFP4),
    }
}

/// Bytes at the start of each block of `t` that [`RowLayout::Interleaved8`] keeps together
/// (its scale fields); `None` for types that cannot be interleaved.
pub fn interleave_head(t: DType) -> Option<usize> {
    match t {
        DType::MXFP4 => Some(1),
        DType::Q4_0 | DType::IQ4NL => Some(2),
        DType::Q4_1 => Some(4),
        // d and qh; d, m and qh
        DType::Q5_0 => Some(6),
        DType::Q5_1 | DType::IQ4XS => Some(8),
        // whole superblocks: the group's superblock i is its eight rows' one after the other
        DType::Q4K | DType::Q5K | DType::Q6K => Some(t.type_size()),
        _ => None,
    }
}

fn geometry(t: DType, row_bytes: usize, len: usize) -> Result<(usize, usize, usize)> {
    let head = interleave_head(t)
        .ok_or_else(|| Error::Invalid(format!("interleave8: {t} has no interleaved layout")))?;
    let block = t.type_size();
    if row_bytes == 0 || !row_bytes.is_multiple_of(block) || !len.is_multiple_of(8 * row_bytes) {
        return Err(Error::Invalid(format!(
            "interleave8: {len} bytes of {t} rows of {row_bytes} bytes are not whole groups of \
             eight rows of whole {block}-byte blocks"
        )));
    }
    Ok((head, block, row_bytes / block))
}

/// Plain rows of `t` (`row_bytes` each, a multiple of eight rows) into the interleaved layout.
pub fn interleave8(t: DType, row_bytes: usize, plain: &[u8], out: &mut [u8]) -> Result<()> {
    regroup(t, row_bytes, plain, out, true)
}

/// The interleaved layout back into plain rows (the inverse of [`interleave8`]).
pub fn deinterleave8(t: DType, row_bytes: usize, packed: &[u8], out: &mut [u8]) -> Result<()> {
    regroup(t, row_bytes, packed, out, false)
}

/// Every byte of `src` to its place in the other layout: the interleaved one when `forward`.
fn regroup(t: DType, row_bytes: usize, src: &[u8], out: &mut [u8], forward: bool) -> Result<()> {
    let (head, block, _) = geometry(t, row_bytes, src.len())?;
    if out.len() != src.len() {
        return Err(Error::Invalid(format!(
            "{}interleave8: {} bytes in, room for {}",
            if forward { "" } else { "de" },
            src.len(),
            out.len()
        )));
    }
    // fixed sizes, so that every move is a load and a store (the mat-mat of interleaved
    // weights de-interleaves chunks of rows on the way)
    match (head, block, forward) {
        (2, 18, true) => regroup_as::<2, 18, true>(row_bytes, src, out),
        (2, 18, false) => regroup_as::<2, 18, false>(row_bytes, src, out),
        (4, 20, true) => regroup_as::<4, 20, true>(row_bytes, src, out),
        (4, 20, false) => regroup_as::<4, 20, false>(row_bytes, src, out),
        (8, 136, true) => regroup_as::<8, 136, true>(row_bytes, src, out),
        (8, 136, false) => regroup_as::<8, 136, false>(row_bytes, src, out),
        (6, 22, true) => regroup_as::<6, 22, true>(row_bytes, src, out),
        (6, 22, false) => regroup_as::<6, 22, false>(row_bytes, src, out),
        (8, 24, true) => regroup_as::<8, 24, true>(row_bytes, src, out),
        (8, 24, false) => regroup_as::<8, 24, false>(row_bytes, src, out),
        (1, 17, true) => regroup_as::<1, 17, true>(row_bytes, src, out),
        (1, 17, false) => regroup_as::<1, 17, false>(row_bytes, src, out),
        (144, 144, true) => regroup_as::<144, 144, true>(row_bytes, src, out),
        (144, 144, false) => regroup_as::<144, 144, false>(row_bytes, src, out),
        (176, 176, true) => regroup_as::<176, 176, true>(row_bytes, src, out),
        (176, 176, false) => regroup_as::<176, 176, false>(row_bytes, src, out),
        (210, 210, true) => regroup_as::<210, 210, true>(row_bytes, src, out),
        (210, 210, false) => regroup_as::<210, 210, false>(row_bytes, src, out),
        _ => unreachable!("{t}: a head of {head} bytes in {block}-byte blocks"),
    }
    Ok(())
}

/// [`regroup`] for blocks of `BLOCK` bytes with a `HEAD`-byte head (checked by the caller:
/// whole groups of eight rows of whole blocks, `out` as long as `src`).
fn regroup_as<const HEAD: usize, const BLOCK: usize, const FORWARD: bool>(
    row_bytes: usize,
    src: &[u8],
    out: &mut [u8],
) {
    const CHUNK: usize = 16;
    const { assert!((BLOCK - HEAD).is_multiple_of(CHUNK)) };
    let nb = row_bytes / BLOCK;
    for (g, dst) in src
        .chunks_exact(8 * row_bytes)
        .zip(out.chunks_exact_mut(8 * row_bytes))
    {
        for i in 0..nb {
            for r in 0..8 {
                // row r's block i: its head and its quants, plain and interleaved
                let p = r * row_bytes + i * BLOCK;
                let h = i * 8 * BLOCK + r * HEAD;
                let (a, b) = if FORWARD { (p, h) } else { (h, p) };
                dst[b..b + HEAD].copy_from_slice(&g[a..a + HEAD]);
                for c in 0..(BLOCK - HEAD) / CHUNK {
                    let pc = p + HEAD + c * CHUNK;
                    let q = i * 8 * BLOCK + 8 * HEAD + (8 * c + r) * CHUNK;
                    let (a, b) = if FORWARD { (pc, q) } else { (q, pc) };
                    dst[b..b + CHUNK].copy_from_slice(&g[a..a + CHUNK]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleave_round_trips_and_puts_heads_first() {
        for (t, nb) in [
            (DType::Q4_0, 3),
            (DType::Q4_1, 1),
            (DType::Q5_0, 3),
            (DType::Q5_1, 2),
            (DType::IQ4NL, 5),
            (DType::IQ4XS, 2),
            (DType::MXFP4, 3),
            (DType::Q4K, 3),
            (DType::Q5K, 2),
            (DType::Q6K, 2),
        ] {
            let block = t.type_size();
            let head = interleave_head(t).unwrap();
            let row = nb * block;
            let plain: Vec<u8> = (0..16 * row).map(|i| (i * 7 + i / 251) as u8).collect();
            let mut packed = vec![0u8; plain.len()];
            interleave8(t, row, &plain, &mut packed).unwrap();
            assert_ne!(packed, plain);
            // group 1, block 2 (or the last), row 5: its head and its quants
            let (g, i, r) = (1, nb - 1, 5);
            let src = &plain[(8 * g + r) * row + i * block..][..block];
            let grp = &packed[8 * g * row + i * 8 * block..][..8 * block];
            assert_eq!(&grp[r * head..(r + 1) * head], &src[..head]);
            // (q4_K, q5_K, q6_K: the whole superblock is the head)
            assert_eq!(
                head == block,
                t.block_size() == 256 && t != DType::IQ4XS,
                "{t}"
            );
            // its quants 16 bytes at a time, each after the other rows' 16 before it
            for c in 0..(block - head) / 16 {
                assert_eq!(
                    &grp[8 * head + (8 * c + r) * 16..][..16],
                    &src[head + 16 * c..][..16],
                    "{t} chunk {c}"
                );
            }
            let mut back = vec![0u8; plain.len()];
            deinterleave8(t, row, &packed, &mut back).unwrap();
            assert_eq!(back, plain);
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let row = 18;
        let e = interleave8(DType::Q4_0, row, &[0; 7 * 18], &mut [0; 7 * 18]).unwrap_err();
        assert!(e.to_string().contains("groups of eight rows"), "{e}");
        let e = interleave8(DType::Q8_0, 34, &[0; 8 * 34], &mut [0; 8 * 34]).unwrap_err();
        assert!(e.to_string().contains("q8_0"), "{e}");
    }
}
