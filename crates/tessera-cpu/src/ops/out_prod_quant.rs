//! out_prod with a quantized `a`: `dst[i, j] = Σ_m a[i, m] · b[j, m]`, where `a` is [K, M]
//! (M rows of K elements, each row a sequence of quantized blocks), `b` f32 [N, M] of any
//! strides, `dst` f32 [K, N] contiguous, and `a` broadcast over dims 2 and 3 of `b`. This is the
//! gradient of `mul_mat(W, x)` w.r.t. `x` for a frozen quantized weight `W` (LoRA fine-tuning).
//!
//! The weight is never expanded. Threads split the output rows K into block-aligned ranges (and,
//! when the blocks do not divide evenly among the threads, the columns N too). For `KC` rows m
//! at a time, a thread dequantizes only its range of those rows — with
//! `tessera_quants::dequantize_row`, the reference's decoder, so the values multiplied are the
//! reference's — into panels of `NR` elements interleaved by m in its slice of the work buffer,
//! packs the matching block of `b` (`KC` × up to `NC` columns) into panels of `MR` columns, and
//! runs the GEMM's register micro-kernel (`matmul::micro_kernel`: AVX2 FMA, or plain Rust), which
//! sums the block's m in order and adds that sum to the destination. Each output value is thus
//! summed in one fixed order whatever the thread count or the split: results are bit-identical
//! for any number of threads.

use tessera::{DType, Graph, Result, Tensor};

use super::matmul::{micro_kernel, MR, NR};
use crate::exec::{split, NodeCtx};

/// Most elements of a row dequantized at once (whole blocks; one block when blocks are larger).
const CW: usize = 256;
/// Largest block this kernel takes (ggml's QK_K): a chunk never exceeds `CW.max(MAX_BLOCK)`.
const MAX_BLOCK: usize = 256;
/// Rows of `a` (the summed dimension) per packed block.
const KC: usize = 128;
/// Columns of `b` per packed block (a multiple of `MR`).
const NC: usize = 192;

/// Widest chunk of output rows, in elements.
const CW_MAX: usize = if CW > MAX_BLOCK { CW } else { MAX_BLOCK };

/// Whether this kernel covers the node: a quantized `a` that `tessera_quants` decodes, with
/// dense blocks in each row; an f32 `b` of any strides; a contiguous f32 destination.
pub fn handles(graph: &Graph, t: &Tensor) -> bool {
    if t.src.len() != 2 {
        return false;
    }
    let (a, b) = (graph.tensor(t.src[0]), graph.tensor(t.src[1]));
    a.dtype.is_quantized()
        && tessera_quants::layout(a.dtype.id()).is_some_and(|l| {
            l.block_size == a.dtype.block_size()
                && l.block_size <= MAX_BLOCK
                && l.type_size == a.dtype.type_size()
        })
        && a.nb[0] == a.dtype.type_size()
        && b.dtype == DType::F32
        && t.dtype == DType::F32
        && t.is_contiguous()
}

/// Scratch bytes per thread: the dequantized panels of `a`, the packed block of `b`, one row.
fn work_per_thread() -> usize {
    ((CW_MAX * KC + NC * KC + CW_MAX) * 4).next_multiple_of(64)
}

pub fn work_size(nth: usize) -> usize {
    work_per_thread() * nth
}

/// Into how many column ranges the columns are split so that `units` (batches × blocks of
/// output rows) × ranges divides evenly among `nth` threads. Every range dequantizes its rows
/// of `a` again, so columns are split only when the blocks alone would leave threads idle or
/// unbalanced by more than 1/16.
fn column_splits(units: usize, n: usize, nth: usize) -> usize {
    if nth == 1 || units >= 16 * nth {
        return 1;
    }
    let gcd = |mut x: usize, mut y: usize| {
        while y != 0 {
            (x, y) = (y, x % y);
        }
        x
    };
    (nth / gcd(units, nth)).min(n.div_ceil(2 * MR)).max(1)
}

/// Where one chunk's data lives: byte offsets of its batch in `a`, `b` and `dst`.
struct Bases {
    a: usize,
    b: usize,
    d: usize,
}

pub fn compute(ctx: &NodeCtx) -> Result<()> {
    let (a, b, d) = (ctx.s(0), ctx.s(1), ctx.t);
    let (k, m, n) = (a.ne[0], a.ne[1], b.ne[0]);
    let blck = a.dtype.block_size();
    if b.ne[1] != m
        || d.ne != [k, n, b.ne[2], b.ne[3]]
        || a.ne[2] == 0
        || a.ne[3] == 0
        || b.ne[2] % a.ne[2] != 0
        || b.ne[3] % a.ne[3] != 0
        || k % blck != 0
    {
        return Err(ctx.err(format!(
            "a {} {:?}, b {:?} and dst {:?} do not fit out_prod",
            a.dtype, a.ne, b.ne, d.ne
        )));
    }
    let per = work_per_thread();
    if ctx.wsize < per * ctx.nth {
        return Err(ctx.err(format!(
            "work buffer of {} bytes, {} needed",
            ctx.wsize,
            per * ctx.nth
        )));
    }
    let (r2, r3) = (b.ne[2] / a.ne[2], b.ne[3] / a.ne[3]);
    let nblk = k / blck;
    let units = b.ne[2] * b.ne[3] * nblk;
    if units * n == 0 {
        return Ok(());
    }
    let nsplit = column_splits(units, n, ctx.nth);
    let ncols = n.div_ceil(nsplit).next_multiple_of(MR);
    // most blocks per chunk
    let max_blocks = (CW / blck).max(1);
    // SAFETY: this thread alone uses bytes [ith·per, (ith+1)·per) of the work buffer (its size
    // was checked above); the buffer is 64-byte aligned and `per` a multiple of 64, and the
    // three slices below are disjoint and fit in `per` bytes.
    let (ap, bp, row) = unsafe {
        let base = ctx.wdata.add(ctx.ith * per) as *mut f32;
        (
            std::slice::from_raw_parts_mut(base, CW_MAX * KC),
            std::slice::from_raw_parts_mut(base.add(CW_MAX * KC), NC * KC),
            std::slice::from_raw_parts_mut(base.add(CW_MAX * KC + NC * KC), CW_MAX),
        )
    };
    // jobs: (column range, batch, block of output rows), blocks innermost; this thread takes
    // a contiguous range and handles each run of blocks of one batch and column range in
    // chunks of nearly equal width
    let jobs = ctx.share(units * nsplit);
    let mut j = jobs.start;
    while j < jobs.end {
        let (cs, u) = (j / units, j % units);
        let (bi, blk0) = (u / nblk, u % nblk);
        let run = (jobs.end - j).min(nblk - blk0);
        j += run;
        let (nj0, nj1) = ((cs * ncols).min(n), ((cs + 1) * ncols).min(n));
        if nj0 >= nj1 {
            continue;
        }
        let (i2, i3) = (bi % b.ne[2], bi / b.ne[2]);
        let bases = Bases {
            a: (i2 / r2) * a.nb[2] + (i3 / r3) * a.nb[3],
            b: i2 * b.nb[2] + i3 * b.nb[3],
            d: i2 * d.nb[2] + i3 * d.nb[3],
        };
        let chunks = run.div_ceil(max_blocks);
        for c in 0..chunks {
            let blocks = split(run, c, chunks);
            let (i0, i1) = ((blk0 + blocks.start) * blck, (blk0 + blocks.end) * blck);
            chunk(ctx, &bases, (i0, i1), (nj0, nj1), ap, bp, row)?;
        }
    }
    Ok(())
}

/// `dst[i0..i1, nj0..nj1] = Σ_m a[i0..i1, m] · b[nj0..nj1, m]` for one batch.
fn chunk(
    ctx: &NodeCtx,
    base: &Bases,
    (i0, i1): (usize, usize),
    (nj0, nj1): (usize, usize),
    ap: &mut [f32],
    bp: &mut [f32],
    row: &mut [f32],
) -> Result<()> {
    let (a, b, d) = (ctx.s(0), ctx.s(1), ctx.t);
    let m = a.ne[1];
    let (blck, bsize) = (a.dtype.block_size(), a.dtype.type_size());
    let w = i1 - i0;
    let panels = w.div_ceil(NR);
    let ldc = d.nb[1] / 4;
    if m == 0 {
        for jn in nj0..nj1 {
            // SAFETY: dst[i0..i1, jn] of this batch lies in the destination and belongs to
            // this thread alone.
            unsafe {
                let out = ctx.dst.add(base.d + jn * d.nb[1] + i0 * 4) as *mut f32;
                std::slice::from_raw_parts_mut(out, w).fill(0.0);
            }
        }
        return Ok(());
    }
    let row = &mut row[..w];
    let mut k0 = 0;
    while k0 < m {
        let kc = KC.min(m - k0);
        // dequantize a[i0..i1, k0..k0+kc] into panels of NR elements: panel p holds
        // [kk][NR] at p·NR·kc, zero past the chunk's end
        for kk in 0..kc {
            // SAFETY: row k0 + kk of `a` in this batch holds blocks i0/blck..i1/blck of
            // `bsize` bytes each, densely (handles() checked nb[0]), inside a's validated span.
            let src = unsafe {
                std::slice::from_raw_parts(
                    ctx.src[0].add(base.a + (k0 + kk) * a.nb[1] + i0 / blck * bsize),
                    w / blck * bsize,
                )
            };
            tessera_quants::dequantize_row(a.dtype.id(), src, row)
                .map_err(|e| ctx.err(format!("row {}: {e}", k0 + kk)))?;
            for (p, vals) in row.chunks(NR).enumerate() {
                let o = &mut ap[p * NR * kc + kk * NR..p * NR * kc + (kk + 1) * NR];
                o[..vals.len()].copy_from_slice(vals);
                o[vals.len()..].fill(0.0);
            }
        }
        let mut n0 = nj0;
        while n0 < nj1 {
            let n1 = (n0 + NC).min(nj1);
            // pack b[n0..n1, k0..k0+kc] into panels of MR columns: panel q holds [kk][MR] at
            // q·MR·kc, zero past n1
            for (q, nq) in (n0..n1).step_by(MR).enumerate() {
                let panel = &mut bp[q * MR * kc..(q + 1) * MR * kc];
                let cols = MR.min(n1 - nq);
                for (kk, o) in panel.chunks_exact_mut(MR).enumerate() {
                    // SAFETY: b[nq..nq+cols, k0+kk] of this batch lies inside b's span.
                    unsafe {
                        let src = ctx.src[1].add(base.b + nq * b.nb[0] + (k0 + kk) * b.nb[1]);
                        for (r, v) in o.iter_mut().enumerate().take(cols) {
                            *v = (src.add(r * b.nb[0]) as *const f32).read_unaligned();
                        }
                    }
                    o[cols..].fill(0.0);
                }
            }
            for p in 0..panels {
                let apanel = &ap[p * NR * kc..(p + 1) * NR * kc];
                let ip = i0 + p * NR;
                let cols = NR.min(i1 - ip);
                for (q, nq) in (n0..n1).step_by(MR).enumerate() {
                    let bpanel = &bp[q * MR * kc..(q + 1) * MR * kc];
                    // SAFETY: the tile dst[ip..ip+cols, nq..nq+rows] of this batch lies inside
                    // the destination (row stride ldc floats) and belongs to this thread alone.
                    unsafe {
                        let c = ctx.dst.add(base.d + nq * d.nb[1] + ip * 4) as *mut f32;
                        micro_kernel(
                            ctx.isa,
                            kc,
                            apanel,
                            bpanel,
                            c,
                            ldc,
                            MR.min(n1 - nq),
                            cols,
                            k0 > 0,
                        );
                    }
                }
            }
            n0 = n1;
        }
        k0 += kc;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_splits_balance_the_threads() {
        // enough blocks: no split
        assert_eq!(column_splits(18, 512, 1), 1);
        assert_eq!(column_splits(18, 512, 2), 1);
        assert_eq!(column_splits(64, 512, 4), 1);
        // 18 blocks on 16 threads: 8 column ranges make 144 jobs, 9 each
        assert_eq!(column_splits(18, 512, 16), 8);
        // one block on 3 threads: 3 column ranges, unless there are too few columns
        assert_eq!(column_splits(1, 512, 3), 3);
        assert_eq!(column_splits(1, 5, 3), 1);
        // work per thread stays a multiple of 64 bytes (the buffer's alignment)
        assert_eq!(work_per_thread() % 64, 0);
    }
}
