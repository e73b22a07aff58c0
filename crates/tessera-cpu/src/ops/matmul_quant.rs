//! mul_mat with a quantized first operand, the way ggml's CPU backend computes it.
//!
//! First every column of `b` is quantized once per node to the activation format ggml pairs
//! with the weight type (`vec_dot_type`: q8_0, q8_1 or q8_K), all threads sharing the work,
//! followed by one barrier. Then each thread takes a contiguous range of weight rows and
//! computes their dot products with every column:
//! - q4_0 × q8_0, q4_1 × q8_1 and q8_0 × q8_0 have integer kernels here (scalar and AVX2:
//!   `vpmaddubsw` + `vpmaddwd`, block sums exact in integers, one f32 FMA per block), with
//!   four-row and 4×2 / 4×3 tile forms that share activation loads and scale conversions;
//! - every other type has its integer kernel in `qdot` (and `qdot_iq2`, `qdot_iq13`,
//!   `qdot_fp`), one row at a time; q5_0, q5_1, iq4_nl and mxfp4 also have a four-row form
//!   here for mat-vec (the same arithmetic per row);
//! - a type without one (none at present) would dequantize its weight row into the thread's
//!   scratch and take an f32 dot product with the *dequantized* activations.

use std::sync::atomic::{AtomicUsize, Ordering};

use tessera::{DType, Result, RowLayout, Tensor};

use super::qdot::prefetch_row;
use super::{qgemm_0, qgemm_k};
use crate::exec::NodeCtx;
use crate::simd::Isa;

/// The activation format ggml quantizes `b` to for weights of type `t`.
pub fn vec_dot_type(t: DType) -> DType {
    use DType::*;
    match t {
        Q4_1 | Q5_1 => Q8_1,
        Q2K | Q3K | Q4K | Q5K | Q6K | IQ2XXS | IQ2XS | IQ2S | IQ3XXS | IQ3S | IQ1S | IQ1M
        | IQ4XS | TQ1_0 | TQ2_0 => Q8K,
        _ => Q8_0,
    }
}

/// Weight types with an integer dot-product kernel (here or in `qdot`).
fn has_int_kernel(t: DType) -> bool {
    matches!(t, DType::Q4_0 | DType::Q4_1 | DType::Q8_0) || super::qdot::supported(t)
}

/// Up to this many columns per batch, the four-row types walk their rows as four far-apart
/// streams (`compute`); more columns take the cache-blocked loop (or `qgemm_0` from eight on).
const FAR_ROWS_MAX_COLS: usize = 7;

/// Row `q` (of `len`) of run `j` of a chunk's rows from `start` cut into runs of `len` rows,
/// for the multi-row mat-vec calls that take one row of each run: run j starts `skew[j]`
/// (j mod len, from [`run_skews`]) rows into its own rows and wraps around once, so that the
/// streams do not advance in lockstep at addresses a whole number of runs apart. (In
/// lockstep, a 4096×4096 q5_0 matrix, whose runs are 512 rows of 2816 bytes apart, a
/// multiple of 128 KiB, read at 10-12 GB/s on one thread of the Ice Lake Xeon against 15 GB/s
/// at 4096×4104 or 4160×4096; skewed, 15.3-15.4; q4_0 23.2-23.4 -> 25.2, q5_1 16.5-17.1 ->
/// 17.3-17.5, the same process alternated.) No division per row: with `j % len` in the loop
/// q2_K's 4096² mat-vec lost 3%.
#[inline(always)]
fn far_row(start: usize, len: usize, skew: &[usize], q: usize, j: usize) -> usize {
    let r = q + skew[j];
    start + j * len + if r >= len { r - len } else { r }
}

/// The skews of [`far_row`]'s `N` runs of `len` rows: j mod len.
fn run_skews<const N: usize>(len: usize) -> [usize; N] {
    std::array::from_fn(|j| j % len.max(1))
}

/// Rows per chunk handed out to the threads of the packed mat-mat paths.
const ROWS_PER_TAKE: usize = 32;

/// Types whose kernels live in this file (with the four-row variant).
fn local_kernel(t: DType) -> bool {
    matches!(t, DType::Q4_0 | DType::Q4_1 | DType::Q8_0)
}

/// Whether a mul_mat of `t` against `cols` columns per batch on `isa` rounds as ggml's x86
/// mat-mat does rather than as its one-column `vec_dot`, where the two differ: iq4_nl from two
/// columns on AVX2, where llama.cpp's x86 builds take llamafile's tinyBLAS, one f32
/// accumulator per lane (its `vec_dot` alternates two, block by block). Those elements come
/// from `qgemm_0` and equal [`vec_dot_scalar`]'s. (The portable path keeps ggml's generic
/// `vec_dot`, which is what ggml's builds without AVX compute for any number of columns.)
pub fn lanes_numerics(isa: Isa, t: DType, cols: usize) -> bool {
    t == DType::IQ4NL && cols >= 2 && qgemm_0::runs_on(isa)
}

/// Types whose one-row kernel lives in `qdot` but which also have a four-row form here (used
/// for mat-vec; more columns take `qgemm_0` or the one-row kernels).
fn four_row_only(t: DType) -> bool {
    matches!(t, DType::Q5_0 | DType::Q5_1 | DType::IQ4NL | DType::MXFP4)
}

pub fn handles(t: &Tensor, a: &Tensor, b: &Tensor) -> bool {
    a.dtype.is_quantized()
        && tessera_quants::layout(a.dtype.id()).is_some()
        && tessera_quants::can_quantize(vec_dot_type(a.dtype).id())
        && a.nb[0] == a.dtype.type_size()
        && b.dtype == DType::F32
        && t.dtype == DType::F32
        && t.is_contiguous()
        && a.ne[0].is_multiple_of(vec_dot_type(a.dtype).block_size())
}

struct Layout {
    /// Bytes of one quantized column of b.
    qrow: usize,
    /// Whether a packed mat-mat path applies — `qgemm_k` (ggml's tiled numerics) or `qgemm_0`
    /// (q4_0/q4_1/q8_0 on AVX2) — and where its packed column groups start.
    tiled: bool,
    group0: bool,
    packed_off: usize,
    /// Columns of b over all batches.
    cols: usize,
    /// Offset of the dequantized activations (generic path only), of the packed paths' shared
    /// row-chunk counter (64 bytes) and of per-thread scratch.
    deq_off: usize,
    counter_off: usize,
    scratch_off: usize,
    /// Per-thread scratch: one f32 row of K (the column being quantized, or a weight row);
    /// with interleaved weights also a group of eight rows, or after the packed paths' own
    /// scratch a chunk of rows.
    per_thread: usize,
}

/// Whether `a`'s rows are interleaved in groups of eight (`tessera::layout`).
fn interleaved(a: &Tensor) -> bool {
    a.layout != RowLayout::Plain
}

/// Whether `a`'s rows ask for ggml's repack arithmetic (`RowLayout::Repacked8`): then every
/// column takes the group loop with `qgemv_repack`'s kernels, whatever its count.
fn repacked(a: &Tensor) -> bool {
    a.layout == RowLayout::Repacked8
}

/// Up to this many columns per batch, interleaved q4_0/q4_1 weights take the eight-row group
/// loop even where the plain rows would take `qgemm_0` (which gives them the same bits).
/// Interleaved against plain, same process, medians of seven rounds: q4_1 576×1536 on two
/// threads 1.70× at 5 columns, 1.25× at 7, 1.01× at 8, 1.04× at 16, 1.05× at 24, 0.75× at
/// 32; q4_0 4096×4096 on one thread 2.91× at 5, 1.87× at 8, 1.90× at 16, 1.88× at 24, 1.03×
/// at 32, 0.87× at 48. Above it `qgemm_0`'s windowed paths unpack the interleaved blocks in
/// place (`Batch::interleaved`): 0.98-1.05× at 25 and 32 columns, 0.97-0.99× at 512 (with
/// each chunk of rows de-interleaved into scratch first instead: 0.87-0.99×, which is what
/// iq4_nl's few-column `qgemm_0` still does).
///
/// With the AVX2 interleaved kernels (`qgemv_avx2`, two rows to a vector; Intel Ice Lake, AVX2
/// forced, same process, medians of seven) the group loop wins wherever `qgemm_0` pads its
/// groups of eight columns: q4_1 576×1536 one thread 1.43× at 5 columns, 1.19× at 6, 1.09×
/// at 12; q4_0 576×1536 two threads 1.66× at 5, 1.41× at 12. At whole groups of eight it
/// loses a little to the plain rows (q4_1 0.89× at 8, 0.90× at 16, q4_0 4096×4096 one thread
/// 1.05-1.12× at 8-24), but handing those batches to `qgemm_0` with interleaved weights
/// loses more (0.81-0.86× at 8, 0.86-0.94× at 16), so the bound is the same.
const GROUP_LOOP_MAX_COLS: usize = 24;

/// Whether interleaved weights of `t` against `cols` columns per batch take the eight-row
/// group loop (every column with the one-column bits) rather than the packed paths, given
/// whether those run here (`packed`). The group loop is what every ISA without the packed
/// paths gives the plain rows: the one-column kernels' bits; `qgemm_0` gives q4_0/q4_1 the same
/// bits, so from few columns on the choice is by speed; iq4_nl's two-column-on numerics
/// (`lanes_numerics`) and ggml's tiled rounding (`qgemm_k`) are theirs alone.
fn group_loop(isa: Isa, t: DType, cols: usize, packed: bool, tiled: bool) -> bool {
    !packed || (cols <= GROUP_LOOP_MAX_COLS && !tiled && !lanes_numerics(isa, t, cols))
}

fn layout(a: &Tensor, b: &Tensor) -> Layout {
    let k = a.ne[0];
    let vdt = vec_dot_type(a.dtype);
    let qrow = vdt.row_size(k).unwrap_or(0);
    let cols = b.ne[1] * b.ne[2] * b.ne[3];
    let qbytes = (qrow * cols).next_multiple_of(64);
    let tiled = qgemm_k::applies(a.dtype, b.ne[1]) && !repacked(a);
    let group0 = qgemm_0::applies(a.dtype, b.ne[1]) && !repacked(a);
    let groups = b.ne[1].div_ceil(qgemm_k::GROUP) * b.ne[2] * b.ne[3];
    // qgemm_k's AVX-512 layout takes pairs of groups (its size is not known before the ISA)
    let pairs = b.ne[1].div_ceil(2 * qgemm_k::GROUP) * b.ne[2] * b.ne[3];
    let packed = if tiled {
        (groups * (k / 256) * qgemm_k::packed_bytes(a.dtype))
            .max(pairs * (k / 256) * qgemm_k::PAIR_BYTES)
            .next_multiple_of(64)
    } else if group0 {
        // (qgemm_0's AVX-512 layout takes pairs of groups too)
        (groups * (k / 32) * qgemm_0::PACKED)
            .max(pairs * (k / 32) * qgemm_0::PAIR_BYTES)
            .next_multiple_of(64)
    } else {
        0
    };
    let deq = if has_int_kernel(a.dtype) {
        0
    } else {
        (cols * k * 4).next_multiple_of(64)
    };
    let per_thread = if tiled {
        (k * 4).max(qgemm_k::scratch_size(k))
    } else if group0 {
        (k * 4).max(qgemm_0::scratch_size())
    } else {
        k * 4
    };
    let per_thread = if interleaved(a) {
        // a group for the group loop; for the packed paths a chunk of plain rows after their
        // own scratch
        let row = a.dtype.row_size(k).unwrap_or(0);
        // (repacked q4_K: the group rearranged for `qgemv_repack_k`'s mat-mat kernel)
        let group = if repacked(a) && a.dtype == DType::Q4K {
            super::qgemv_repack_k::transposed_bytes(k).max(8 * row)
        } else if repacked(a) && matches!(a.dtype, DType::MXFP4 | DType::Q4_0 | DType::IQ4NL) {
            super::qgemv_repack::mx_transposed_bytes(k).max(8 * row)
        } else {
            8 * row
        };
        (per_thread.next_multiple_of(64) + ROWS_PER_TAKE * row).max(group)
    } else {
        per_thread
    };
    Layout {
        qrow,
        tiled,
        group0,
        packed_off: qbytes,
        cols,
        deq_off: qbytes + packed,
        counter_off: qbytes + packed + deq,
        scratch_off: qbytes + packed + deq + 64,
        per_thread: per_thread.next_multiple_of(64),
    }
}

pub fn work_size(a: &Tensor, b: &Tensor, nth: usize) -> usize {
    let l = layout(a, b);
    l.scratch_off + l.per_thread * nth
}

pub fn compute(ctx: &NodeCtx) -> Result<()> {
    let (a, b, d) = (ctx.s(0), ctx.s(1), ctx.t);
    let (k, m, n) = (a.ne[0], a.ne[1], b.ne[1]);
    if k != b.ne[0] {
        return Err(ctx.err(format!("inner dims differ: a has {k}, b has {}", b.ne[0])));
    }
    let l = layout(a, b);
    if ctx.wsize < work_size(a, b, ctx.nth) {
        return Err(ctx.err(format!(
            "work buffer of {} bytes, {} needed",
            ctx.wsize,
            work_size(a, b, ctx.nth)
        )));
    }
    let vdt = vec_dot_type(a.dtype);
    let row_bytes = a.dtype.row_size(k).expect("validated");
    let inter = interleaved(a);
    let group0 = l.group0 && qgemm_0::runs_on(ctx.isa);
    // (qgemm_0 gives every column the one-column bits; qgemm_k, ggml's tiled rounding, does
    // not, so a batch-invariant execution keeps the one-column kernels for its types)
    let tiled = l.tiled && !ctx.batch_invariant;
    // interleaved weights: the group loop (below), or the packed paths, reading the blocks in
    // place where they can (`qgemm_0::reads_interleaved`), else each chunk of rows
    // de-interleaved on the way into this thread's scratch
    let use_groups =
        repacked(a) || (inter && group_loop(ctx.isa, a.dtype, n, tiled || group0, tiled));
    // SAFETY: this thread's scratch row lies inside the work buffer (size checked above) and is
    // used by this thread alone.
    let tmp = unsafe {
        std::slice::from_raw_parts_mut(
            ctx.wdata.add(l.scratch_off + ctx.ith * l.per_thread) as *mut f32,
            k,
        )
    };
    // Phase 1: quantize (and, for the generic path, dequantize back) every column of b.
    let quantize_col = |col: usize, tmp: &mut [f32]| -> Result<()> {
        let (i1, i2, i3) = (
            col % b.ne[1],
            (col / b.ne[1]) % b.ne[2],
            col / (b.ne[1] * b.ne[2]),
        );
        // SAFETY: the column lies inside b's validated span; the destination slices of the work
        // buffer belong to column `col`, which only this thread handles.
        unsafe {
            let src = ctx.src[1].add(i1 * b.nb[1] + i2 * b.nb[2] + i3 * b.nb[3]);
            // a contiguous column is read in place; a strided one is gathered first
            let x: &[f32] = if b.nb[0] == 4 && (src as usize).is_multiple_of(4) {
                std::slice::from_raw_parts(src as *const f32, k)
            } else {
                for (kk, t) in tmp.iter_mut().enumerate() {
                    *t = (src.add(kk * b.nb[0]) as *const f32).read_unaligned();
                }
                tmp
            };
            let q = std::slice::from_raw_parts_mut(ctx.wdata.add(col * l.qrow), l.qrow);
            quantize_activations(vdt, x, q).map_err(|e| ctx.err(e))?;
            if !has_int_kernel(a.dtype) {
                let deq = std::slice::from_raw_parts_mut(
                    (ctx.wdata.add(l.deq_off) as *mut f32).add(col * k),
                    k,
                );
                tessera_quants::dequantize_row(vdt.id(), q, deq)
                    .map_err(|e| ctx.err(e.to_string()))?;
            }
        }
        Ok(())
    };
    if (tiled || group0) && !use_groups {
        // whole groups of eight columns per thread: quantized, then packed for the kernel
        // (on AVX-512: as halves of pairs of groups, an even number per batch)
        let wide = if tiled {
            qgemm_k::wide(ctx.isa)
        } else {
            qgemm_0::wide(ctx.isa, b.ne[1])
        };
        let pair_bytes = if tiled {
            qgemm_k::PAIR_BYTES
        } else {
            qgemm_0::PAIR_BYTES
        };
        let gpb = if wide {
            2 * b.ne[1].div_ceil(2 * qgemm_k::GROUP)
        } else {
            b.ne[1].div_ceil(qgemm_k::GROUP)
        };
        let (nb, pb) = if tiled {
            (k / 256, qgemm_k::packed_bytes(a.dtype))
        } else {
            (k / 32, qgemm_0::PACKED)
        };
        for g in ctx.share(gpb * b.ne[2] * b.ne[3]) {
            let (batch, gi) = (g / gpb, g % gpb);
            let first = gi * qgemm_k::GROUP;
            let last = (first + qgemm_k::GROUP).min(b.ne[1]).max(first);
            for i1 in first..last {
                quantize_col(batch * b.ne[1] + i1, tmp)?;
            }
            // SAFETY: the quantized columns of this group were written just above by this
            // thread; the packed group's bytes belong to group g alone (in the AVX-512 layout:
            // its half of pair g / 2, the bytes `pack_half` writes for that half).
            unsafe {
                let cols: [Option<&[u8]>; qgemm_k::GROUP] = std::array::from_fn(|c| {
                    (first + c < last).then(|| {
                        std::slice::from_raw_parts(
                            ctx.wdata.add((batch * b.ne[1] + first + c) * l.qrow),
                            l.qrow,
                        )
                    })
                });
                if wide {
                    // group g is half g % 2 of pair g / 2; the two halves' bytes interleave
                    // by 32 and each thread writes only its own
                    let out = ctx.wdata.add(l.packed_off + g / 2 * nb * pair_bytes);
                    if tiled {
                        qgemm_k::pack_half(a.dtype, &cols, nb, out, g % 2);
                    } else {
                        qgemm_0::pack_half(a.dtype, &cols, nb, out, g % 2);
                    }
                    continue;
                }
                let out = std::slice::from_raw_parts_mut(
                    ctx.wdata.add(l.packed_off + g * nb * pb),
                    nb * pb,
                );
                if tiled {
                    qgemm_k::pack_group(a.dtype, &cols, nb, out);
                } else {
                    qgemm_0::pack_group(a.dtype, &cols, nb, out);
                }
            }
        }
        // SAFETY: the counter's 8 bytes lie inside the work buffer (64-byte aligned offset of
        // a 64-byte aligned buffer) and are only ever accessed atomically.
        let taken = unsafe { &*(ctx.wdata.add(l.counter_off) as *const AtomicUsize) };
        if ctx.ith == 0 {
            taken.store(0, Ordering::Relaxed);
        }
        ctx.barrier();
        // interleaved weights that the kernels read in place (else chunk by chunk as plain rows)
        let in_place = inter && !tiled && qgemm_0::reads_interleaved(ctx.isa, a.dtype, n);
        // Rows go out in chunks of ROWS_PER_TAKE from the shared counter, not as fixed halves:
        // a thread the host slows (this VM's vCPUs share their cores with other tenants) then
        // does fewer chunks instead of holding up the node. Which thread computes a row does
        // not change it.
        let per_batch = m.div_ceil(ROWS_PER_TAKE);
        let (r2, r3) = (b.ne[2] / a.ne[2], b.ne[3] / a.ne[3]);
        loop {
            let c = taken.fetch_add(1, Ordering::Relaxed);
            if c >= per_batch * b.ne[2] * b.ne[3] {
                break;
            }
            let (bi, ci) = (c / per_batch, c % per_batch);
            let (i3, i2) = (bi / b.ne[2], bi % b.ne[2]);
            let rows = ci * ROWS_PER_TAKE..((ci + 1) * ROWS_PER_TAKE).min(m);
            let g0 = bi * gpb;
            // SAFETY: the batch's weight rows, packed groups and result cells lie inside the
            // validated tensors and the work buffer; chunk c's rows are written by the thread
            // that took c only; its scratch is its own; qgemm_0 runs only where `runs_on` said so.
            unsafe {
                let scratch = ctx.wdata.add(l.scratch_off + ctx.ith * l.per_thread);
                let mut w = ctx.src[0].add((i2 / r2) * a.nb[2] + (i3 / r3) * a.nb[3]);
                let (mut rows, mut dst) = (rows, ctx.dst.add(i2 * d.nb[2] + i3 * d.nb[3]));
                if inter && !in_place {
                    // the chunk's groups (rows and chunks are whole groups of eight: m and
                    // ROWS_PER_TAKE are multiples of 8) as plain rows after the kernels'
                    // scratch; the kernels then take them as rows 0.. of a batch whose result
                    // starts at the chunk's first row
                    let own = l.per_thread - ROWS_PER_TAKE * row_bytes;
                    let n = rows.len() * row_bytes;
                    let src = std::slice::from_raw_parts(w.add(rows.start * a.nb[1]), n);
                    let plain = std::slice::from_raw_parts_mut(scratch.add(own), n);
                    tessera::layout::deinterleave8(a.dtype, row_bytes, src, plain)
                        .map_err(|e| ctx.err(e.to_string()))?;
                    w = plain.as_ptr();
                    dst = dst.add(4 * rows.start);
                    rows = 0..rows.len();
                }
                let batch = qgemm_k::Batch {
                    a: w,
                    a_nb1: a.nb[1],
                    packed: ctx.wdata.add(
                        l.packed_off
                            + if wide {
                                g0 / 2 * nb * pair_bytes
                            } else {
                                g0 * nb * pb
                            },
                    ),
                    groups: gpb,
                    cols: b.ne[1],
                    dst,
                    d_nb1: d.nb[1],
                    interleaved: in_place,
                };
                if tiled {
                    qgemm_k::run(ctx.isa, a.dtype, k, rows, &batch, scratch);
                } else {
                    #[cfg(target_arch = "x86_64")]
                    qgemm_0::run(ctx.isa, a.dtype, k, rows, &batch, scratch);
                }
            }
        }
        return Ok(());
    }
    // SAFETY: as for the packed paths above: 8 bytes of the work buffer at a 64-byte aligned
    // offset, only ever accessed atomically.
    let taken = unsafe { &*(ctx.wdata.add(l.counter_off) as *const AtomicUsize) };
    if ctx.ith == 0 {
        taken.store(0, Ordering::Relaxed);
    }
    for col in ctx.share(l.cols) {
        quantize_col(col, tmp)?;
    }
    ctx.barrier();
    // Phase 2: rows of a split across threads.
    let (r2, r3) = (b.ne[2] / a.ne[2], b.ne[3] / a.ne[3]);
    // batch bi = (i2, i3): its weight matrix's offset (broadcast over r2, r3), its result's
    // offset and its first column among the quantized columns
    let batch_at = |bi: usize| {
        let (i3, i2) = (bi / b.ne[2], bi % b.ne[2]);
        (
            (i2 / r2) * a.nb[2] + (i3 / r3) * a.nb[3],
            i2 * d.nb[2] + i3 * d.nb[3],
            bi * b.ne[1],
        )
    };
    // Rows go out in chunks from the shared counter, not as fixed halves: a thread the host
    // slows then computes fewer chunks instead of holding up the node, as in ggml's chunked
    // mul_mat. Mat-vec chunks are two per thread (whole groups of four rows; four per thread
    // cost SmolLM2's tg128 a few percent: shorter runs for the four-row streams), mat-mat
    // chunks are the cache blocks' row blocks. Which thread computes a row does not change it.
    let chunks = |chunk: usize| {
        let per_batch = m.div_ceil(chunk);
        let total = per_batch * b.ne[2] * b.ne[3];
        std::iter::from_fn(move || {
            let c = taken.fetch_add(1, Ordering::Relaxed);
            (c < total).then(|| {
                let (bi, ci) = (c / per_batch, c % per_batch);
                (batch_at(bi), ci * chunk..((ci + 1) * chunk).min(m))
            })
        })
    };
    if use_groups {
        // interleaved weights: whole groups of eight rows, two chunks a thread
        let chunk = if ctx.nth == 1 {
            m.max(8)
        } else {
            m.div_ceil(2 * ctx.nth).next_multiple_of(8)
        };
        // the activation row whose mxfp4 sums the thread's scratch holds (repacked mat-vec)
        let mut sums_of = usize::MAX;
        for ((a_off, d_off, col0), rows) in chunks(chunk) {
            // SAFETY: the chunk's groups lie in a's validated span (whole groups: m and the
            // chunk are multiples of 8); dst[rows, ..] of this batch is written by the thread
            // that took the chunk only; the quantized columns were finished before the
            // barrier; the thread's scratch is its own and holds a group.
            unsafe {
                let scratch = std::slice::from_raw_parts_mut(
                    ctx.wdata.add(l.scratch_off + ctx.ith * l.per_thread),
                    l.per_thread,
                );
                if n == 1
                    && repacked(a)
                    && a.dtype == DType::MXFP4
                    && super::qgemv_repack::has_mx_gemv_kernel(ctx.isa)
                {
                    // repacked mxfp4: the chunk's groups one after the other (interleaved, as
                    // ggml's repack buffer holds them: one sequential stream)
                    let x = std::slice::from_raw_parts(ctx.wdata.add(col0 * l.qrow), l.qrow);
                    // the activations' scales and sums, once a thread for each activation row
                    // (the group's scratch is free: the groups are read where they are, and
                    // only this branch runs for the node)
                    let sums = &mut scratch[..super::qgemv_repack::mx_sums_bytes(k)];
                    if sums_of != col0 {
                        super::qgemv_repack::mx_gemv_sums(x, k, sums);
                        sums_of = col0;
                    }
                    let sums = &*sums;
                    for r0 in rows.step_by(8) {
                        let g = std::slice::from_raw_parts(
                            ctx.src[0].add(a_off + r0 * a.nb[1]),
                            8 * row_bytes,
                        );
                        let v = super::qgemv_repack::mxfp4_group8(ctx.isa, g, x, sums, k);
                        for (i, y) in v.into_iter().enumerate() {
                            *(ctx.dst.add(d_off + (r0 + i) * 4) as *mut f32) = y;
                        }
                    }
                    continue;
                }
                let mut rows = rows;
                if n == 1 && repacked(a) && super::qgemv_repack::has_four_group_kernel(ctx.isa) {
                    // mat-vec with ggml's repack arithmetic: four groups a call, one from each
                    // quarter of the chunk's groups (four sequential streams from memory)
                    let quarter = rows.len() / 32;
                    let group = |r0: usize| {
                        std::slice::from_raw_parts(
                            ctx.src[0].add(a_off + r0 * a.nb[1]),
                            8 * row_bytes,
                        )
                    };
                    let x = std::slice::from_raw_parts(ctx.wdata.add(col0 * l.qrow), l.qrow);
                    for q in 0..quarter {
                        let r0: [usize; 4] =
                            std::array::from_fn(|j| rows.start + 8 * (q + j * quarter));
                        let v = super::qgemv_repack::vec_dot8_groups4(
                            ctx.isa,
                            a.dtype,
                            r0.map(group),
                            x,
                            k,
                        );
                        for (&r0, v) in r0.iter().zip(&v) {
                            for (i, &y) in v.iter().enumerate() {
                                *(ctx.dst.add(d_off + (r0 + i) * 4) as *mut f32) = y;
                            }
                        }
                    }
                    rows = rows.start + 32 * quarter..rows.end;
                }
                for r0 in rows.step_by(8) {
                    let g = std::slice::from_raw_parts(
                        ctx.src[0].add(a_off + r0 * a.nb[1]),
                        8 * row_bytes,
                    );
                    let qcol = |j: usize| {
                        std::slice::from_raw_parts(ctx.wdata.add((col0 + j) * l.qrow), l.qrow)
                    };
                    // ggml's repack arithmetic: four columns a call where a kernel takes them,
                    // and always for q4_K, whose rounding depends on it
                    let quads =
                        if repacked(a) && super::qgemv_repack::columns_in_fours(ctx.isa, a.dtype) {
                            n / 4
                        } else {
                            0
                        };
                    // repacked q4_K, mxfp4 (and q4_0/iq4_nl on AVX-512 VNNI): the group
                    // rearranged once for all its quads, one row a lane
                    // (`qgemv_repack_k::transpose8`, `qgemv_repack::transpose8_on`; the same
                    // bits)
                    let q4k = quads > 0
                        && repacked(a)
                        && a.dtype == DType::Q4K
                        && super::qgemv_repack_k::has_transposed_kernel(ctx.isa);
                    let mx = quads > 0
                        && repacked(a)
                        && super::qgemv_repack::has_transposed_kernel(ctx.isa, a.dtype);
                    if q4k {
                        super::qgemv_repack_k::transpose8(g, k, scratch);
                    } else if mx {
                        super::qgemv_repack::transpose8_on(ctx.isa, a.dtype, g, k, scratch);
                    }
                    for j4 in 0..quads {
                        let xs: [&[u8]; 4] = std::array::from_fn(|c| qcol(4 * j4 + c));
                        let v = if q4k {
                            super::qgemv_repack_k::vec_dot8x4_transposed(ctx.isa, scratch, xs, k)
                        } else if mx {
                            super::qgemv_repack::mxfp4_8x4_transposed(ctx.isa, scratch, xs, k)
                        } else {
                            super::qgemv_repack::vec_dot8x4(ctx.isa, a.dtype, g, xs, k)
                        };
                        for (c, col) in v.iter().enumerate() {
                            for (i, &y) in col.iter().enumerate() {
                                *(ctx.dst.add(d_off + (4 * j4 + c) * d.nb[1] + (r0 + i) * 4)
                                    as *mut f32) = y;
                            }
                        }
                    }
                    for j in 4 * quads..n {
                        let x = qcol(j);
                        let v = if repacked(a) {
                            super::qgemv_repack::vec_dot8(ctx.isa, a.dtype, g, x, k)
                        } else {
                            vec_dot8_interleaved(ctx.isa, a.dtype, g, x, k, scratch)
                        };
                        for (i, y) in v.into_iter().enumerate() {
                            *(ctx.dst.add(d_off + j * d.nb[1] + (r0 + i) * 4) as *mut f32) = y;
                        }
                    }
                }
            }
        }
        return Ok(());
    }
    let chunk = if ctx.nth == 1 {
        m.max(1)
    } else {
        m.div_ceil(2 * ctx.nth).next_multiple_of(4).max(4)
    };
    // prefetch distance for the four-row kernels: the next group of rows, and at least 4 KiB
    // (a single core streams from memory only with enough misses in flight: measured on tg128)
    let pf = (4 * a.nb[1]).max(4096);
    let ahead = 4096usize.div_ceil(a.nb[1].max(1)).max(1);
    if (n <= FAR_ROWS_MAX_COLS && local_kernel(a.dtype)) || (n == 1 && four_row_only(a.dtype)) {
        // Mat-vec and a few columns (decode, one per sequence): each four-row call takes its
        // rows from the four quarters of the chunk's rows (q, q + Q, q + 2Q, q + 3Q), so the
        // weights stream from memory as four long sequential runs. Four adjacent short rows
        // (SmolLM2's are 360-612 bytes) hop through memory in 1.5-2.5 KiB pieces that the
        // hardware prefetcher does not follow: a plain read of that pattern runs at 9-10 GB/s
        // on one core here, of four long runs at 16-17. Every element is computed by the same
        // kernel as in the blocked loop below, so no result changes.
        // Each row of a call is prefetched 2 KiB ahead: on a Zen 5 core a 4096-wide q8_0
        // matrix streams from memory at 37-38 GB/s on one thread (104-112 % of a plain read
        // pass) where 512 bytes ahead gave 25 (71-76 %; 1024: 29, 3072: 41), two threads
        // 48-49 against 41-49; the AVX2 kernels there: q4_1 26 against 20 GB/s on one thread.
        let pf_near = 2048;
        for ((a_off, d_off, col0), rows) in chunks(chunk) {
            let quarter = rows.len() / 4;
            // SAFETY: rows `rows` of this batch lie in a's validated span; dst[rows, ..] of
            // this batch is written by the thread that took the chunk only; the quantized
            // columns were finished before the barrier.
            unsafe {
                let row = |r: usize| {
                    std::slice::from_raw_parts(ctx.src[0].add(a_off + r * a.nb[1]), row_bytes)
                };
                let qcol = |j: usize| {
                    std::slice::from_raw_parts(ctx.wdata.add((col0 + j) * l.qrow), l.qrow)
                };
                let out = |j: usize, r: usize| ctx.dst.add(d_off + j * d.nb[1] + r * 4) as *mut f32;
                if n == 1 && eight_row_kernel(ctx.isa, a.dtype) {
                    // one column on AVX-512: eight rows a call, row q of each eighth of the
                    // chunk, eight long runs (q4_0, q4_1, iq4_nl from memory: 1.25-1.32x
                    // two adjacent rows of each quarter, as the four-row calls below take
                    // them; in L3 0.93-0.99x, in L2 even)
                    let e = rows.len() / 8;
                    let skew = run_skews::<8>(e);
                    for q in 0..e {
                        let im: [usize; 8] =
                            std::array::from_fn(|j| far_row(rows.start, e, &skew, q, j));
                        let v = vec_dot8(ctx.isa, a.dtype, im.map(row), qcol(0), k, pf_near);
                        for (&r, y) in im.iter().zip(v) {
                            *out(0, r) = y;
                        }
                    }
                    for r in rows.start + 8 * e..rows.end {
                        *out(0, r) = vec_dot(ctx.isa, a.dtype, row(r), qcol(0), k);
                    }
                    continue;
                }
                let skew = run_skews::<4>(quarter);
                for q in 0..quarter {
                    let im: [usize; 4] =
                        std::array::from_fn(|j| far_row(rows.start, quarter, &skew, q, j));
                    four_row_tiles(
                        ctx.isa,
                        a.dtype,
                        im.map(row),
                        0..n,
                        qcol,
                        k,
                        pf_near,
                        |j, i, y| *out(j, im[i]) = y,
                    );
                }
                for r in rows.start + 4 * quarter..rows.end {
                    for j in 0..n {
                        *out(j, r) = vec_dot(ctx.isa, a.dtype, row(r), qcol(j), k);
                    }
                }
            }
        }
        return Ok(());
    }
    if n == 1
        && matches!(ctx.isa, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512)
        && super::qdot::self_prefetching(a.dtype)
    {
        // Mat-vec of the one-row kernels that prefetch their own weights: all of a chunk's
        // rows in one call (one dispatch instead of one per row; same results); iq4_xs and
        // q2_K-q6_K on AVX-512 eight rows a call first (`qgemv_0`, the same bits).
        let eight = eight_row_kernel(ctx.isa, a.dtype);
        for ((a_off, d_off, col0), rows) in chunks(chunk) {
            // SAFETY: the quantized column was finished before the barrier.
            let x = unsafe { std::slice::from_raw_parts(ctx.wdata.add(col0 * l.qrow), l.qrow) };
            // rows `r` (not empty, inside `rows`) one at a time
            // SAFETY: rows of this batch inside `rows` lie in a's validated span, the last
            // one `row_bytes` long; dst[rows] of this batch (f32, contiguous) is written by
            // the thread that took the chunk only.
            let one_range = |r: std::ops::Range<usize>| unsafe {
                let w = std::slice::from_raw_parts(
                    ctx.src[0].add(a_off + r.start * a.nb[1]),
                    (r.len() - 1) * a.nb[1] + row_bytes,
                );
                let out = std::slice::from_raw_parts_mut(
                    (ctx.dst.add(d_off) as *mut f32).add(r.start),
                    r.len(),
                );
                super::qdot::vec_dot_rows(ctx.isa, a.dtype, w, a.nb[1], x, k, out);
            };
            if !eight {
                if !rows.is_empty() {
                    one_range(rows);
                }
                continue;
            }
            // eight rows a call, row q of each eighth of the chunk: the weights stream as
            // eight long sequential runs (the end of one call's row prefetches the next
            // call's). Eight adjacent rows instead hop through memory in row-long pieces, and
            // two adjacent rows of each quarter make runs the hardware prefetcher follows
            // poorly; for a 4096-wide q6_K matrix, one thread, against the one-row kernel:
            // 0.91-0.96x (adjacent) and 1.05-1.12x (quarters) from memory, 1.34-1.45x this
            // way; q4_K 1.34-1.36x.
            let e = rows.len() / 8;
            let skew = run_skews::<8>(e);
            for q in 0..e {
                let im: [usize; 8] = std::array::from_fn(|j| far_row(rows.start, e, &skew, q, j));
                // SAFETY: as for `one_range` (rows im are inside `rows`).
                unsafe {
                    let w: [&[u8]; 8] = im.map(|r| {
                        std::slice::from_raw_parts(ctx.src[0].add(a_off + r * a.nb[1]), row_bytes)
                    });
                    let v = vec_dot8(ctx.isa, a.dtype, w, x, k, 0);
                    for (&r, y) in im.iter().zip(v) {
                        *(ctx.dst.add(d_off) as *mut f32).add(r) = y;
                    }
                }
            }
            if rows.start + 8 * e < rows.end {
                one_range(rows.start + 8 * e..rows.end);
            }
        }
        return Ok(());
    }
    // block sizes: about 64 KiB of weight rows (a multiple of 4) against about 128 KiB of
    // quantized columns (a multiple of 3); the row blocks go out from the counter
    let rb = ((64 << 10) / row_bytes.max(1) / 4 * 4).max(4);
    let cb = ((128 << 10) / l.qrow.max(1) / 3 * 3).max(3);
    // the one-row integer kernels of `qdot`, columns outer over sub-blocks of about 16 KiB of
    // rows (the types with kernels that share work between rows or columns keep rows outer)
    // (and tq1_0, whose four-column tiles share only the weights' digits: four columns at a
    // time against the rows)
    let column_major = has_int_kernel(a.dtype)
        && super::qdot::supported(a.dtype)
        && (!super::qdot_tiles::supported(a.dtype) || a.dtype == DType::TQ1_0);
    let tiles4 = super::qdot_tiles::supported(a.dtype);
    let sub = ((16 << 10) / row_bytes.max(1)).max(1);
    let own_prefetch = matches!(ctx.isa, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512)
        && super::qdot::self_prefetching(a.dtype);
    for ((a_off, d_off, col0), rows) in chunks(rb) {
        // cache blocking: a block of rows (weights kept in L2) against a block of columns
        // (quantized activations kept in L2); each result is still computed by the same
        // kernel, so the blocking does not change it
        let (r0, r1) = (rows.start, rows.end);
        let mut c0 = 0;
        while c0 < n {
            let c1 = (c0 + cb).min(n);
            if column_major {
                // One column against a few rows at a time, all in L1: these kernels
                // share nothing between columns, and an activation row (q8_K: 292 bytes
                // a superblock) outweighs a weight row (tq2_0: 66), so the column stays
                // put while the rows go by, as ggml's 16×16 blocks do. Each result is
                // still `vec_dot` of its row and column.
                let mut s0 = r0;
                while s0 < r1 {
                    let s1 = (s0 + sub).min(r1);
                    // SAFETY: rows s0..s1 of a lie in its validated span; dst[s0..s1, ..]
                    // of this batch (f32, contiguous along rows) is written by this
                    // thread only; the quantized columns were finished before the
                    // barrier.
                    unsafe {
                        let w = std::slice::from_raw_parts(
                            ctx.src[0].add(a_off + s0 * a.nb[1]),
                            (s1 - s0 - 1) * a.nb[1] + row_bytes,
                        );
                        let qcol = |j: usize| {
                            std::slice::from_raw_parts(ctx.wdata.add((col0 + j) * l.qrow), l.qrow)
                        };
                        let mut j = c0;
                        while tiles4 && j + 4 <= c1 {
                            let x = [qcol(j), qcol(j + 1), qcol(j + 2), qcol(j + 3)];
                            for r in s0..s1 {
                                let wr = &w[(r - s0) * a.nb[1]..][..row_bytes];
                                let v = super::qdot_tiles::vec_dot_1x4(ctx.isa, a.dtype, wr, x, k);
                                for (c, &y) in v.iter().enumerate() {
                                    *(ctx.dst.add(d_off + (j + c) * d.nb[1] + r * 4) as *mut f32) =
                                        y;
                                }
                            }
                            j += 4;
                        }
                        if c0 == 0 && j == 0 && j < c1 && !own_prefetch {
                            // the first column, the row `ahead` rows on into the cache as
                            // each is computed (the kernels do not prefetch; whole groups of
                            // rows prefetched at once cost 10 % on L3-resident weights)
                            let out = std::slice::from_raw_parts_mut(
                                (ctx.dst.add(d_off) as *mut f32).add(s0),
                                s1 - s0,
                            );
                            super::qdot::vec_dot_rows_ahead(
                                ctx.isa,
                                a.dtype,
                                w,
                                a.nb[1],
                                qcol(0),
                                k,
                                out,
                                Some((ahead, r1 - s0)),
                            );
                            j += 1;
                        }
                        for j in j..c1 {
                            let out = std::slice::from_raw_parts_mut(
                                (ctx.dst.add(d_off + j * d.nb[1]) as *mut f32).add(s0),
                                s1 - s0,
                            );
                            super::qdot::vec_dot_rows(
                                ctx.isa,
                                a.dtype,
                                w,
                                a.nb[1],
                                qcol(j),
                                k,
                                out,
                            );
                        }
                    }
                    s0 = s1;
                }
                c0 = c1;
                continue;
            }
            let mut im = r0;
            while im < r1 {
                // four rows at a time share each activation load and the scale conversions (the
                // integer kernels compute every row exactly as the one-row kernel does, so the
                // split does not matter)
                let group = if local_kernel(a.dtype) && im + 4 <= r1 {
                    4
                } else {
                    1
                };
                // SAFETY: rows im..im+group of a lie in its validated span; dst[im.., ..] of this
                // batch is written by this thread only; the quantized columns were finished
                // before the barrier.
                unsafe {
                    let row = |r: usize| {
                        std::slice::from_raw_parts(ctx.src[0].add(a_off + r * a.nb[1]), row_bytes)
                    };
                    if group == 4 {
                        let ws = [row(im), row(im + 1), row(im + 2), row(im + 3)];
                        let qcol = |j: usize| {
                            std::slice::from_raw_parts(ctx.wdata.add((col0 + j) * l.qrow), l.qrow)
                        };
                        // three (then two) columns at a time share each unpacked weight block (each
                        // result computed exactly as the one-row, one-column kernel does)
                        four_row_tiles(ctx.isa, a.dtype, ws, c0..c1, qcol, k, pf, |j, i, y| {
                            *(ctx.dst.add(d_off + j * d.nb[1] + (im + i) * 4) as *mut f32) = y
                        });
                    } else {
                        let arow = row(im);
                        // the row `ahead` rows on, a few KiB away, into the cache while this one
                        // is computed (a single core streams from memory only with enough misses
                        // in flight; the one-row kernels have no prefetch of their own)
                        if c0 == 0 && im + ahead < r1 && !own_prefetch {
                            prefetch_row(ctx.src[0].add(a_off + (im + ahead) * a.nb[1]), row_bytes);
                        }
                        if !has_int_kernel(a.dtype) {
                            tessera_quants::dequantize_row(a.dtype.id(), arow, tmp)
                                .map_err(|e| ctx.err(e.to_string()))?;
                        }
                        let mut j0 = c0;
                        // four columns at a time share the weight row's unpacking
                        // (each result bit-identical to the one-column kernel's)
                        if super::qdot_tiles::supported(a.dtype) {
                            let qcol = |j: usize| {
                                std::slice::from_raw_parts(
                                    ctx.wdata.add((col0 + j) * l.qrow),
                                    l.qrow,
                                )
                            };
                            while j0 + 4 <= c1 {
                                let v = super::qdot_tiles::vec_dot_1x4(
                                    ctx.isa,
                                    a.dtype,
                                    arow,
                                    [qcol(j0), qcol(j0 + 1), qcol(j0 + 2), qcol(j0 + 3)],
                                    k,
                                );
                                for (c, &x) in v.iter().enumerate() {
                                    *(ctx.dst.add(d_off + (j0 + c) * d.nb[1] + im * 4)
                                        as *mut f32) = x;
                                }
                                j0 += 4;
                            }
                        }
                        for j in j0..c1 {
                            let col = col0 + j;
                            let v = if has_int_kernel(a.dtype) {
                                let q =
                                    std::slice::from_raw_parts(ctx.wdata.add(col * l.qrow), l.qrow);
                                vec_dot(ctx.isa, a.dtype, arow, q, k)
                            } else {
                                let act = std::slice::from_raw_parts(
                                    (ctx.wdata.add(l.deq_off) as *const f32).add(col * k),
                                    k,
                                );
                                dot_f32(ctx.isa, tmp, act)
                            };
                            *(ctx.dst.add(d_off + j * d.nb[1] + im * 4) as *mut f32) = v;
                        }
                    }
                }
                im += group;
            }
            c0 = c1;
        }
    }
    Ok(())
}

/// Columns `cols` of four weight rows `ws` in tiles of three, two and one columns (each
/// element computed as `vec_dot` computes it); `put(j, i, y)` stores column j's result for row
/// `i` of the four.
#[allow(clippy::too_many_arguments)]
fn four_row_tiles<'a>(
    isa: Isa,
    t: DType,
    ws: [&[u8]; 4],
    cols: std::ops::Range<usize>,
    qcol: impl Fn(usize) -> &'a [u8],
    k: usize,
    pf: usize,
    mut put: impl FnMut(usize, usize, f32),
) {
    let mut j = cols.start;
    while j + 3 <= cols.end {
        let v = vec_dot_4x3(isa, t, ws, [qcol(j), qcol(j + 1), qcol(j + 2)], k);
        for (c, col) in v.iter().enumerate() {
            for (i, &y) in col.iter().enumerate() {
                put(j + c, i, y);
            }
        }
        j += 3;
    }
    while j + 2 <= cols.end {
        let v = vec_dot_4x2(isa, t, ws, [qcol(j), qcol(j + 1)], k);
        for (c, col) in v.iter().enumerate() {
            for (i, &y) in col.iter().enumerate() {
                put(j + c, i, y);
            }
        }
        j += 2;
    }
    if j < cols.end {
        for (i, &y) in vec_dot4(isa, t, ws, qcol(j), k, pf).iter().enumerate() {
            put(j, i, y);
        }
    }
}

/// Quantizes one row of activations to `vdt` exactly as ggml's x86 CPU backend does (its
/// `from_float`). For q8_0 and q8_1 that is not the reference quantizer: the scale's inverse is
/// `127/max` rather than `1/(max/127)` and values round half to even (`_mm256_round_ps`), not
/// away from zero — tiny differences, but they decide knife-edge tokens when reproducing
/// llama.cpp. q8_K uses the reference quantizer, as ggml does.
pub fn quantize_activations(
    vdt: DType,
    x: &[f32],
    y: &mut [u8],
) -> std::result::Result<(), String> {
    let (qk, bs) = (32, vdt.type_size());
    match vdt {
        DType::Q8_0 | DType::Q8_1 => {
            if !x.len().is_multiple_of(qk) || y.len() != x.len() / qk * bs {
                return Err(format!("{vdt}: {} values into {} bytes", x.len(), y.len()));
            }
            let qs_at = if vdt == DType::Q8_0 { 2 } else { 4 };
            #[cfg(target_arch = "x86_64")]
            if crate::simd::isa() >= Isa::Avx2 && crate::simd::isa() != Isa::Neon {
                for (xb, yb) in x.chunks_exact(qk).zip(y.chunks_exact_mut(bs)) {
                    // SAFETY: AVX2/FMA/F16C present; 32 floats in, bs bytes out.
                    unsafe {
                        avx2::quantize_block_q8(xb.as_ptr(), yb.as_mut_ptr(), vdt == DType::Q8_1)
                    };
                }
                return Ok(());
            }
            for (xb, yb) in x.chunks_exact(qk).zip(y.chunks_exact_mut(bs)) {
                let max = xb.iter().fold(0f32, |m, &v| m.max(v.abs()));
                let d = max / 127.0;
                let id = if max != 0.0 { 127.0 / max } else { 0.0 };
                yb[0..2].copy_from_slice(&half::f16::from_f32(d).to_bits().to_le_bytes());
                let mut sum = 0i32;
                for (j, &v) in xb.iter().enumerate() {
                    let q = (v * id).round_ties_even() as i32;
                    sum += q;
                    yb[qs_at + j] = q as i8 as u8;
                }
                if vdt == DType::Q8_1 {
                    yb[2..4].copy_from_slice(
                        &half::f16::from_f32(d * sum as f32).to_bits().to_le_bytes(),
                    );
                }
            }
            Ok(())
        }
        DType::Q8K => {
            if !x.len().is_multiple_of(256) || y.len() != x.len() / 256 * 292 {
                return Err(format!("{vdt}: {} values into {} bytes", x.len(), y.len()));
            }
            #[cfg(target_arch = "x86_64")]
            if crate::simd::isa() >= Isa::Avx2 && crate::simd::isa() != Isa::Neon {
                for (xb, yb) in x.chunks_exact(256).zip(y.chunks_exact_mut(292)) {
                    // SAFETY: AVX2/FMA/F16C present; 256 floats in, 292 bytes out.
                    let done = unsafe { avx2::quantize_block_q8k(xb.as_ptr(), yb.as_mut_ptr()) };
                    if !done {
                        tessera_quants::quantize_row(vdt.id(), xb, yb, None)
                            .map_err(|e| e.to_string())?;
                    }
                }
                return Ok(());
            }
            tessera_quants::quantize_row(vdt.id(), x, y, None).map_err(|e| e.to_string())
        }
        _ => tessera_quants::quantize_row(vdt.id(), x, y, None).map_err(|e| e.to_string()),
    }
}

fn f16(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Whether `isa` asks for the AVX-512 VNNI kernels and this CPU has them.
#[cfg(target_arch = "x86_64")]
#[inline]
fn vnni(isa: Isa) -> bool {
    super::qdot::avx2::uses_vnni(isa)
}

/// Dot product of one weight row (q4_0, q4_1 or q8_0) with one activation row in its
/// `vec_dot_type`.
pub fn vec_dot(isa: Isa, t: DType, w: &[u8], x: &[u8], k: usize) -> f32 {
    if !local_kernel(t) {
        return super::qdot::vec_dot(isa, t, w, x, k);
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 && isa != Isa::Neon {
        // SAFETY: Avx2 is chosen only when the CPU has AVX2 and FMA (and the VNNI kernel only
        // with VNNI); the slices hold k/32 blocks of their formats (the callers' layouts).
        return unsafe {
            if vnni(isa) {
                avx2::vec_dot_vnni(t, w, x, k)
            } else if super::qdot::avx2::uses_avx_vnni(isa) {
                avx2::vec_dot_avxvnni(t, w, x, k)
            } else {
                avx2::vec_dot(t, w, x, k)
            }
        };
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon {
        let nb = k / 32;
        assert!(
            w.len() >= nb * t.type_size() && x.len() >= nb * vec_dot_type(t).type_size(),
            "vec_dot: rows of {} and {} bytes for {k} elements of {t}",
            w.len(),
            x.len()
        );
        // SAFETY: NEON is part of every AArch64 CPU; both rows hold nb blocks (asserted).
        return unsafe { super::qdot_neon::vec_dot_legacy(t, w, x, nb) };
    }
    let _ = isa;
    vec_dot_scalar(t, w, x, k)
}

/// Four weight rows against one activation row; each result is bit-identical to `vec_dot`'s.
/// Four-row kernels for q4_0, q4_1, q8_0, q5_0, q5_1, iq4_nl and mxfp4; other types (and ISAs)
/// take `vec_dot` row by row.
pub fn vec_dot4(isa: Isa, t: DType, w: [&[u8]; 4], x: &[u8], k: usize, pf: usize) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 && isa != Isa::Neon && (local_kernel(t) || four_row_only(t)) {
        // SAFETY: as in `vec_dot`; prefetching never faults, whatever the address.
        return unsafe {
            if vnni(isa) {
                avx2::vec_dot4_vnni(t, w, x, k, pf)
            } else if super::qdot::avx2::uses_avx_vnni(isa) {
                avx2::vec_dot4_avxvnni(t, w, x, k, pf)
            } else {
                avx2::vec_dot4(t, w, x, k, pf)
            }
        };
    }
    let _ = pf; // only the AVX2 kernel prefetches
    w.map(|r| vec_dot(isa, t, r, x, k))
}

/// Whether [`vec_dot8`] has an eight-row kernel for `t` on `isa` (rather than two four-row
/// calls).
fn eight_row_kernel(isa: Isa, t: DType) -> bool {
    #[cfg(target_arch = "x86_64")]
    return vnni(isa) && super::qgemv_0::supported(t);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, t);
        false
    }
}

/// Eight weight rows against one activation row, each result bit-identical to `vec_dot`'s:
/// the AVX-512 kernels of `qgemv_0` for q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4, iq4_xs and
/// q2_K-q6_K (prefetching `qgemv_0::PREFETCH` bytes ahead), two `vec_dot4` otherwise (`pf` bytes ahead;
/// types without four-row kernels row by row).
pub fn vec_dot8(isa: Isa, t: DType, w: [&[u8]; 8], x: &[u8], k: usize, pf: usize) -> [f32; 8] {
    #[cfg(target_arch = "x86_64")]
    if eight_row_kernel(isa, t) {
        // SAFETY: `eight_row_kernel` says the CPU has AVX-512 F/BW/VL and VNNI (and AVX2, FMA, F16C); the
        // rows and x hold k / (block size) blocks of their formats (the callers' layouts).
        return unsafe { super::qgemv_0::vec_dot8(t, w, x, k) };
    }
    let a = vec_dot4(isa, t, [w[0], w[1], w[2], w[3]], x, k, pf);
    let b = vec_dot4(isa, t, [w[4], w[5], w[6], w[7]], x, k, pf);
    [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
}

/// Whether `isa` has the eight-row kernels of interleaved rows of `t` (AVX-512 VNNI: every
/// type `tessera::layout` interleaves, q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4, iq4_xs, q4_K,
/// q5_K, q6_K; AVX2 and AVX-VNNI: q4_0, q4_1).
pub fn interleaved_kernel(isa: Isa, t: DType) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        match isa {
            Isa::Avx512 => eight_row_kernel(isa, t) && super::qgemv_0::supports_interleaved(t),
            Isa::Avx2 | Isa::AvxVnni => {
                super::qdot::avx2::available() && super::qgemv_avx2::supported(t)
            }
            _ => false,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, t);
        false
    }
}

/// [`vec_dot8`] of one group of eight interleaved rows (`g`, `tessera::layout`), each
/// result bit-identical to `vec_dot`'s: on AVX-512 VNNI the interleaved kernel of `qgemv_0`,
/// on AVX2 and AVX-VNNI `qgemv_avx2`'s (q4_0, q4_1), elsewhere the group's plain rows in
/// `scratch` (8 rows' bytes) and [`vec_dot8`].
pub fn vec_dot8_interleaved(
    isa: Isa,
    t: DType,
    g: &[u8],
    x: &[u8],
    k: usize,
    scratch: &mut [u8],
) -> [f32; 8] {
    let row = g.len() / 8;
    #[cfg(target_arch = "x86_64")]
    if interleaved_kernel(isa, t) {
        // SAFETY: the ISA has the kernel's features (`Isa::Avx512`: eight_row_kernel; the
        // others AVX2, FMA and F16C, AVX-VNNI for `AvxVnni`); g holds the group and x its
        // k / 32 activation blocks.
        return unsafe {
            match isa {
                Isa::Avx512 => super::qgemv_0::vec_dot8_interleaved(t, g, x, k),
                Isa::AvxVnni if super::qdot::avx2::uses_avx_vnni(isa) => {
                    super::qgemv_avx2::vec_dot8_interleaved_avxvnni(t, g, x, k)
                }
                _ => super::qgemv_avx2::vec_dot8_interleaved(t, g, x, k),
            }
        };
    }
    let plain = &mut scratch[..g.len()];
    tessera::layout::deinterleave8(t, row, g, plain).expect("a whole group of eight rows");
    let rows: [&[u8]; 8] = std::array::from_fn(|r| &plain[r * row..(r + 1) * row]);
    vec_dot8(isa, t, rows, x, k, 0)
}

/// Four weight rows against two activation rows: `out[c][r]`, each bit-identical to `vec_dot`.
pub fn vec_dot_4x2(isa: Isa, t: DType, w: [&[u8]; 4], x: [&[u8]; 2], k: usize) -> [[f32; 4]; 2] {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 && isa != Isa::Neon && local_kernel(t) {
        // SAFETY: as in `vec_dot`.
        return unsafe {
            if vnni(isa) {
                avx2::vec_dot_4xc_vnni::<2>(t, w, x, k)
            } else if super::qdot::avx2::uses_avx_vnni(isa) {
                avx2::vec_dot_4xc_avxvnni::<2>(t, w, x, k)
            } else {
                avx2::vec_dot_4xc::<2>(t, w, x, k)
            }
        };
    }
    x.map(|xc| w.map(|r| vec_dot(isa, t, r, xc, k)))
}

/// Four weight rows against three activation rows (see `vec_dot_4x2`).
pub fn vec_dot_4x3(isa: Isa, t: DType, w: [&[u8]; 4], x: [&[u8]; 3], k: usize) -> [[f32; 4]; 3] {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 && isa != Isa::Neon && local_kernel(t) {
        // SAFETY: as in `vec_dot`.
        return unsafe {
            if vnni(isa) {
                avx2::vec_dot_4xc_vnni::<3>(t, w, x, k)
            } else if super::qdot::avx2::uses_avx_vnni(isa) {
                avx2::vec_dot_4xc_avxvnni::<3>(t, w, x, k)
            } else {
                avx2::vec_dot_4xc::<3>(t, w, x, k)
            }
        };
    }
    x.map(|xc| w.map(|r| vec_dot(isa, t, r, xc, k)))
}

/// ggml's `hsum_float_8`: `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`.
#[inline]
pub(crate) fn hsum8(l: [f32; 8]) -> f32 {
    let r = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// The portable integer dot products of q4_0, q4_1 and q8_0, in the arithmetic of ggml's AVX2
/// kernels (what llama.cpp runs on x86): per block the exact integer sums of elements 4l..4l+3
/// in eight lanes l (AVX2's `maddubs` + `madd`), each lane converted and fused-multiply-added
/// with the block's scale product into its own float lane, q4_1's min terms in a fused scalar
/// chain, and ggml's eight-lane horizontal sum at the end. So every ISA gives the AVX2 kernel's
/// bits (tested on x86 against it; NEON forms the same lanes), and the portable path's tokens are
/// llama.cpp's on x86 (the activations' codes are within ±127, where ggml's sign trick is exact).
///
/// Also iq4_nl in the arithmetic of ggml's x86 mat-mat for two or more columns (llamafile's
/// tinyBLAS, which llama.cpp's x86 builds use): the same eight lanes and one accumulator per
/// lane, what `qgemm_0` computes for it (its one-column `vec_dot` alternates two accumulators;
/// see [`lanes_numerics`]).
pub fn vec_dot_scalar(t: DType, w: &[u8], x: &[u8], k: usize) -> f32 {
    let nb = k / 32;
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for i in 0..nb {
        let (q, y, d): ([i32; 32], &[u8], f32) = match t {
            DType::Q4_0 | DType::Q4_1 => {
                let (ws, xs, off) = if t == DType::Q4_0 {
                    (18, 34, 8)
                } else {
                    (20, 36, 0)
                };
                let (wb, xb) = (&w[i * ws..(i + 1) * ws], &x[i * xs..(i + 1) * xs]);
                let qs = &wb[ws - 16..];
                let q = std::array::from_fn(|e| {
                    let b = qs[e % 16];
                    (if e < 16 { b & 15 } else { b >> 4 }) as i32 - off
                });
                if t == DType::Q4_1 {
                    // gcc fuses ggml's `summs += m·s`
                    summs = f16(wb, 2).mul_add(f16(xb, 2), summs);
                }
                (q, &xb[xs - 32..], f16(wb, 0) * f16(xb, 0))
            }
            DType::Q8_0 => {
                let (wb, xb) = (&w[i * 34..i * 34 + 34], &x[i * 34..i * 34 + 34]);
                let q = std::array::from_fn(|e| wb[2 + e] as i8 as i32);
                (q, &xb[2..34], f16(wb, 0) * f16(xb, 0))
            }
            DType::IQ4NL => {
                let (wb, xb) = (&w[i * 18..i * 18 + 18], &x[i * 34..i * 34 + 34]);
                let q = std::array::from_fn(|e| {
                    let b = wb[2 + e % 16];
                    let n = if e < 16 { b & 15 } else { b >> 4 };
                    super::qdot::KVALUES_IQ4NL[n as usize] as i32
                });
                (q, &xb[2..34], f16(wb, 0) * f16(xb, 0))
            }
            _ => unreachable!("no integer kernel for {t}"),
        };
        let mut lanes = [0i32; 8];
        for (e, (&qe, &ye)) in q.iter().zip(y).enumerate() {
            lanes[e / 4] += qe * ye as i8 as i32;
        }
        for (a, &l) in acc.iter_mut().zip(&lanes) {
            *a = d.mul_add(l as f32, *a);
        }
    }
    hsum8(acc) + summs
}

fn dot_f32(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 && isa != Isa::Neon {
        // SAFETY: AVX2+FMA present; equal lengths.
        return unsafe { avx2::dot_f32(a, b) };
    }
    let _ = isa;
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += a[c * 8 + l] * b[c * 8 + l];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in chunks * 8..a.len() {
        s += a[i] * b[i];
    }
    s
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;
    use tessera::DType;

    use crate::ops::qdot::avx2::{
        bits_to_bytes, dot4, dot4_i8, iq4_nl_odd_block, iq4_values, mxfp4_odd_block, nibbles,
    };
    use crate::ops::qdot_fp::{e8m0_half, KVALUES_FP4};

    /// 16 bytes of E2M1 codes as 32 values through ggml's `kvalues_fp4` (low nibbles to bytes
    /// 0..16, high nibbles to 16..32).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn fp4_values(p: *const u8) -> __m256i {
        // SAFETY: 16 readable bytes at p (caller); the table is 16 bytes.
        unsafe {
            let values = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                KVALUES_FP4.as_ptr() as *const __m128i
            ));
            _mm256_shuffle_epi8(values, nibbles(p))
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum(v: __m256) -> f32 {
        // register arithmetic only
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
    }

    /// One f16 at `p` as f32, with F16C (no call, no feature check).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn f16(p: *const u8) -> f32 {
        // SAFETY: two readable bytes at p; F16C is enabled in every caller.
        unsafe { crate::ops::qdot::avx2::f16(p) }
    }

    /// Σ x·y of 32 signed bytes each, as 8 i32 lanes → f32.
    #[inline(always)]
    unsafe fn dot_i8<const V: u8>(x: __m256i, y: __m256i) -> __m256 {
        // SAFETY: register arithmetic only.
        unsafe { _mm256_cvtepi32_ps(dot4_i8::<V>(x, y)) }
    }

    // Each kernel has a body generic over `V` (VNNI's `vpdpbusd` for AVX2's `vpmaddubsw` +
    // `vpmaddwd`: the same integers) and two entry points compiled for AVX2 and for AVX-512
    // VNNI; the callers check the CPU's features.

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot(t: DType, w: &[u8], x: &[u8], k: usize) -> f32 {
        // SAFETY: forwarded.
        unsafe { vec_dot_in::<0>(t, w, x, k) }
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn vec_dot_vnni(t: DType, w: &[u8], x: &[u8], k: usize) -> f32 {
        // SAFETY: forwarded.
        unsafe { vec_dot_in::<1>(t, w, x, k) }
    }

    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    pub unsafe fn vec_dot_avxvnni(t: DType, w: &[u8], x: &[u8], k: usize) -> f32 {
        // SAFETY: forwarded.
        unsafe { vec_dot_in::<2>(t, w, x, k) }
    }

    #[inline(always)]
    unsafe fn vec_dot_in<const V: u8>(t: DType, w: &[u8], x: &[u8], k: usize) -> f32 {
        let nb = k / 32;
        let (wp, xp) = (w.as_ptr(), x.as_ptr());
        // SAFETY: w and x hold nb blocks of their formats.
        unsafe {
            let mut acc = _mm256_setzero_ps();
            match t {
                DType::Q4_0 => {
                    for i in 0..nb {
                        let (wb, xb) = (wp.add(i * 18), xp.add(i * 34));
                        let d = _mm256_set1_ps(f16(wb) * f16(xb));
                        let q = _mm256_sub_epi8(nibbles(wb.add(2)), _mm256_set1_epi8(8));
                        let y = _mm256_loadu_si256(xb.add(2) as *const __m256i);
                        acc = _mm256_fmadd_ps(d, dot_i8::<V>(q, y), acc);
                    }
                    hsum(acc)
                }
                DType::Q4_1 => {
                    let mut summs = 0f32;
                    for i in 0..nb {
                        let (wb, xb) = (wp.add(i * 20), xp.add(i * 36));
                        summs = f16(wb.add(2)).mul_add(f16(xb.add(2)), summs); // fused, as GCC builds ggml's
                        let d = _mm256_set1_ps(f16(wb) * f16(xb));
                        let q = nibbles(wb.add(4));
                        let y = _mm256_loadu_si256(xb.add(4) as *const __m256i);
                        let p = dot4::<V>(q, y);
                        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
                    }
                    hsum(acc) + summs
                }
                DType::Q8_0 => {
                    for i in 0..nb {
                        let (wb, xb) = (wp.add(i * 34), xp.add(i * 34));
                        let d = _mm256_set1_ps(f16(wb) * f16(xb));
                        let q = _mm256_loadu_si256(wb.add(2) as *const __m256i);
                        let y = _mm256_loadu_si256(xb.add(2) as *const __m256i);
                        acc = _mm256_fmadd_ps(d, dot_i8::<V>(q, y), acc);
                    }
                    hsum(acc)
                }
                _ => unreachable!("no integer kernel for {t}"),
            }
        }
    }

    /// The four bytes at each of four addresses, as the four i32 lanes of one vector.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn gather4_i32(p: [*const u8; 4]) -> __m128i {
        // SAFETY: four readable bytes at every address.
        unsafe {
            _mm_setr_epi32(
                (p[0] as *const i32).read_unaligned(),
                (p[1] as *const i32).read_unaligned(),
                (p[2] as *const i32).read_unaligned(),
                (p[3] as *const i32).read_unaligned(),
            )
        }
    }

    /// The two bytes at each of four addresses, as the low four u16 lanes of one vector.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn gather4_u16(p: [*const u8; 4]) -> __m128i {
        // SAFETY: two readable bytes at every address.
        unsafe {
            let r = |i: usize| (p[i] as *const i16).read_unaligned();
            _mm_setr_epi16(r(0), r(1), r(2), r(3), 0, 0, 0, 0)
        }
    }

    /// Lane `i` of `v` in every lane.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn lane(v: __m256, i: i32) -> __m256 {
        // register arithmetic only
        _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(i))
    }

    /// `vec_dot` for four rows at once. Every row gets exactly `vec_dot`'s integer block sums
    /// and float operations in the same order (so the results are identical); what is shared is
    /// the activation block, the scale conversions (four rows' f16 scales in one instruction)
    /// and, for q8_0, the absolute values of the activations. `pf`: how far ahead (bytes) of
    /// each row's current block to prefetch.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot4(t: DType, w: [&[u8]; 4], x: &[u8], k: usize, pf: usize) -> [f32; 4] {
        // SAFETY: forwarded.
        unsafe { vec_dot4_in::<0>(t, w, x, k, pf) }
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn vec_dot4_vnni(
        t: DType,
        w: [&[u8]; 4],
        x: &[u8],
        k: usize,
        pf: usize,
    ) -> [f32; 4] {
        // SAFETY: forwarded.
        unsafe { vec_dot4_in::<1>(t, w, x, k, pf) }
    }

    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    pub unsafe fn vec_dot4_avxvnni(
        t: DType,
        w: [&[u8]; 4],
        x: &[u8],
        k: usize,
        pf: usize,
    ) -> [f32; 4] {
        // SAFETY: forwarded.
        unsafe { vec_dot4_in::<2>(t, w, x, k, pf) }
    }

    #[inline(always)]
    unsafe fn vec_dot4_in<const V: u8>(
        t: DType,
        w: [&[u8]; 4],
        x: &[u8],
        k: usize,
        pf: usize,
    ) -> [f32; 4] {
        let nb = k / 32;
        let xp = x.as_ptr();
        let wp = w.map(|r| r.as_ptr());
        // SAFETY: every row and x hold nb blocks of their formats; prefetches never fault.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); 4];
            match t {
                // Σ(n-8)·y = Σ n·y - Σ 8·y, lane by lane: the same integers as vec_dot
                DType::Q4_0 => rows4_offset::<V>(wp, xp, nb, 18, 8, pf, |wb| nibbles(wb.add(2))),
                DType::Q4_1 => rows4_with_min::<V>(wp, xp, nb, 20, pf, |wb| nibbles(wb.add(4))),
                // q5_0, q5_1 and iq4_nl: the one-row kernels of `qdot` (ggml's), four rows at
                // a time, each row's integers and float operations unchanged. q5_0's values
                // u - 16 with u = nibble + 16·fifth bit (0..31): Σ(u-16)·y = Σ u·y - Σ 16·y,
                // ggml's integers (its sign trick is exact for the activations' codes, within
                // ±127) with no sign operations per row
                DType::Q5_0 => rows4_offset::<V>(wp, xp, nb, 22, 16, pf, |wb| {
                    let hi = _mm256_and_si256(bits_to_bytes(wb.add(2)), _mm256_set1_epi8(16));
                    _mm256_or_si256(nibbles(wb.add(6)), hi)
                }),
                DType::Q5_1 => rows4_with_min::<V>(wp, xp, nb, 24, pf, |wb| {
                    let hi = _mm256_and_si256(bits_to_bytes(wb.add(4)), _mm256_set1_epi8(16));
                    _mm256_or_si256(nibbles(wb.add(8)), hi)
                }),
                // iq4_nl and mxfp4: ggml's pairs of blocks, even ones into acc and odd ones
                // into acc2, an odd last block apart
                DType::IQ4NL => rows4_two_acc::<V>(
                    wp,
                    xp,
                    nb,
                    18,
                    pf,
                    |wb| _mm_cvtph_ps(gather4_u16(wb)),
                    |wb| iq4_values(wb.add(2)),
                    |wb, xb| iq4_nl_odd_block(wb, xb),
                ),
                // E2M1 codes through ggml's kvalues_fp4 (values doubled) and half the E8M0
                // scale, as ggml's mxfp4 `vec_dot`
                DType::MXFP4 => rows4_two_acc::<V>(
                    wp,
                    xp,
                    nb,
                    17,
                    pf,
                    |wb| {
                        _mm_setr_ps(
                            e8m0_half(*wb[0]),
                            e8m0_half(*wb[1]),
                            e8m0_half(*wb[2]),
                            e8m0_half(*wb[3]),
                        )
                    },
                    |wb| fp4_values(wb.add(1)),
                    |wb, xb| mxfp4_odd_block(wb, xb),
                ),
                DType::Q8_0 => {
                    for i in 0..nb {
                        let xb = xp.add(i * 34);
                        let y = _mm256_loadu_si256(xb.add(2) as *const __m256i);
                        let wb: [*const u8; 4] = std::array::from_fn(|r| wp[r].add(i * 34));
                        let d = _mm256_castps128_ps256(_mm_mul_ps(
                            _mm_cvtph_ps(gather4_u16(wb)),
                            _mm_set1_ps(f16(xb)),
                        ));
                        for r in 0..4 {
                            _mm_prefetch(wb[r].add(pf) as *const i8, _MM_HINT_T0);
                            let q = _mm256_loadu_si256(wb[r].add(2) as *const __m256i);
                            // ggml's Σ|w|·(y·sgn w), exact for w = −128 too (|y| ≤ 127;
                            // |y|·(w·sgn y) is not: −(−128) does not fit a byte)
                            let p = dot4_i8::<V>(q, y);
                            acc[r] =
                                _mm256_fmadd_ps(lane(d, r as i32), _mm256_cvtepi32_ps(p), acc[r]);
                        }
                    }
                    acc.map(|a| hsum(a))
                }
                _ => unreachable!("no integer kernel for {t}"),
            }
        }
    }

    /// Four rows of a type whose 32 codes per block are `codes(block)` - `off` (q4_0, q5_0)
    /// against q8_0 activations: Σ codes·y - Σ off·y per lane (the activation's part once for
    /// the four rows), times the block's scale product, one FMA per block and row.
    #[inline(always)]
    unsafe fn rows4_offset<const V: u8>(
        wp: [*const u8; 4],
        xp: *const u8,
        nb: usize,
        block: usize,
        off: i8,
        pf: usize,
        codes: impl Fn(*const u8) -> __m256i,
    ) -> [f32; 4] {
        // SAFETY: nb blocks of `block` bytes behind every row and nb q8_0 blocks behind xp
        // (caller); prefetches never fault.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); 4];
            for i in 0..nb {
                let xb = xp.add(i * 34);
                let y = _mm256_loadu_si256(xb.add(2) as *const __m256i);
                let yo = dot4::<V>(_mm256_set1_epi8(off), y);
                let wb: [*const u8; 4] = std::array::from_fn(|r| wp[r].add(i * block));
                let d = _mm256_castps128_ps256(_mm_mul_ps(
                    _mm_cvtph_ps(gather4_u16(wb)),
                    _mm_set1_ps(f16(xb)),
                ));
                for r in 0..4 {
                    _mm_prefetch(wb[r].add(pf) as *const i8, _MM_HINT_T0);
                    let p = dot4::<V>(codes(wb[r]), y);
                    let p = _mm256_cvtepi32_ps(_mm256_sub_epi32(p, yo));
                    acc[r] = _mm256_fmadd_ps(lane(d, r as i32), p, acc[r]);
                }
            }
            acc.map(|a| hsum(a))
        }
    }

    /// Four rows of iq4_nl or mxfp4 (blocks of `block` bytes; `scales`: the four rows' weight
    /// scales of a block as f32, `values`: a block's 32 signed values, `odd`: an odd last
    /// block's `d·Σ` as ggml's generic tail computes it) as ggml's x86 `vec_dot` does them:
    /// blocks in pairs, the even one into one accumulator and the odd one into another, the
    /// two added before the horizontal sum, an odd last block added after it.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows4_two_acc<const V: u8>(
        wp: [*const u8; 4],
        xp: *const u8,
        nb: usize,
        block: usize,
        pf: usize,
        scales: impl Fn([*const u8; 4]) -> __m128,
        values: impl Fn(*const u8) -> __m256i,
        odd: impl Fn(*const u8, *const u8) -> f32,
    ) -> [f32; 4] {
        // SAFETY: nb blocks of `block` bytes behind every row and nb q8_0 blocks behind xp
        // (caller); prefetches never fault.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut acc2 = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i + 1 < nb {
                for (h, acc) in [&mut acc, &mut acc2].into_iter().enumerate() {
                    let xb = xp.add((i + h) * 34);
                    let y = _mm256_loadu_si256(xb.add(2) as *const __m256i);
                    let wb: [*const u8; 4] = std::array::from_fn(|r| wp[r].add((i + h) * block));
                    let d = _mm256_castps128_ps256(_mm_mul_ps(_mm_set1_ps(f16(xb)), scales(wb)));
                    for r in 0..4 {
                        if h == 0 {
                            _mm_prefetch(wb[r].add(pf) as *const i8, _MM_HINT_T0);
                        }
                        let p = _mm256_cvtepi32_ps(dot4_i8::<V>(values(wb[r]), y));
                        acc[r] = _mm256_fmadd_ps(lane(d, r as i32), p, acc[r]);
                    }
                }
                i += 2;
            }
            std::array::from_fn(|r| {
                let mut sumf = hsum(_mm256_add_ps(acc[r], acc2[r]));
                if i < nb {
                    sumf += odd(wp[r].add(i * block), xp.add(i * 34));
                }
                sumf
            })
        }
    }

    /// Four rows of a type with a scale and a min per block of 32 unsigned `codes(block)`
    /// (q4_1, q5_1) against q8_1 activations: ggml's Σ codes·y times `d·dy` and its fused
    /// running Σ m·s, the four rows' (d, m) pairs converted in one instruction.
    #[inline(always)]
    unsafe fn rows4_with_min<const V: u8>(
        wp: [*const u8; 4],
        xp: *const u8,
        nb: usize,
        block: usize,
        pf: usize,
        codes: impl Fn(*const u8) -> __m256i,
    ) -> [f32; 4] {
        // SAFETY: nb blocks of `block` bytes behind every row and nb q8_1 blocks behind xp
        // (caller); prefetches never fault.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); 4];
            // lanes (2r, 2r+1) hold row r's running Σ m·s (odd lanes are the ones used)
            let mut summs = _mm256_setzero_ps();
            for i in 0..nb {
                let xb = xp.add(i * 36);
                let y = _mm256_loadu_si256(xb.add(4) as *const __m256i);
                // [dx sx] of the activation block in every pair of lanes
                let xs = _mm_cvtph_ps(_mm_cvtsi32_si128((xb as *const i32).read_unaligned()));
                let xs = _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(xs)));
                let wb: [*const u8; 4] = std::array::from_fn(|r| wp[r].add(i * block));
                // [d0 m0 d1 m1 d2 m2 d3 m3]: the adjacent f16 pairs of four rows
                let dm = _mm256_cvtph_ps(gather4_i32(wb));
                summs = _mm256_fmadd_ps(dm, xs, summs); // fused, as GCC builds ggml's
                let d = _mm256_mul_ps(dm, xs);
                for r in 0..4 {
                    _mm_prefetch(wb[r].add(pf) as *const i8, _MM_HINT_T0);
                    let p = dot4::<V>(codes(wb[r]), y);
                    acc[r] = _mm256_fmadd_ps(lane(d, 2 * r as i32), _mm256_cvtepi32_ps(p), acc[r]);
                }
            }
            let mut s = [0f32; 8];
            _mm256_storeu_ps(s.as_mut_ptr(), summs);
            [
                hsum(acc[0]) + s[1],
                hsum(acc[1]) + s[3],
                hsum(acc[2]) + s[5],
                hsum(acc[3]) + s[7],
            ]
        }
    }

    /// `vec_dot` for four rows × `C` activation columns, every result computed with the same
    /// integer block sums and float operations, in the same order, as `vec_dot` (so the values
    /// are identical); each weight block is unpacked once for all columns and the four rows'
    /// scales are converted with one instruction.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot_4xc<const C: usize>(
        t: DType,
        w: [&[u8]; 4],
        x: [&[u8]; C],
        k: usize,
    ) -> [[f32; 4]; C] {
        // SAFETY: forwarded.
        unsafe { vec_dot_4xc_in::<C, 0>(t, w, x, k) }
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn vec_dot_4xc_vnni<const C: usize>(
        t: DType,
        w: [&[u8]; 4],
        x: [&[u8]; C],
        k: usize,
    ) -> [[f32; 4]; C] {
        // SAFETY: forwarded.
        unsafe { vec_dot_4xc_in::<C, 1>(t, w, x, k) }
    }

    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    pub unsafe fn vec_dot_4xc_avxvnni<const C: usize>(
        t: DType,
        w: [&[u8]; 4],
        x: [&[u8]; C],
        k: usize,
    ) -> [[f32; 4]; C] {
        // SAFETY: forwarded.
        unsafe { vec_dot_4xc_in::<C, 2>(t, w, x, k) }
    }

    #[inline(always)]
    unsafe fn vec_dot_4xc_in<const C: usize, const V: u8>(
        t: DType,
        w: [&[u8]; 4],
        x: [&[u8]; C],
        k: usize,
    ) -> [[f32; 4]; C] {
        let nb = k / 32;
        let xp = x.map(|c| c.as_ptr());
        let wp = w.map(|r| r.as_ptr());
        // SAFETY: every row and column hold nb blocks of their formats.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 4]; C];
            match t {
                DType::Q4_1 => {
                    // lanes (2r, 2r+1) of summs[c]: row r's running Σ m·s (odd lanes used)
                    let mut summs = [_mm256_setzero_ps(); C];
                    for i in 0..nb {
                        let wb: [*const u8; 4] = std::array::from_fn(|r| wp[r].add(i * 20));
                        let dm = _mm256_cvtph_ps(gather4_i32(wb));
                        let q: [__m256i; 4] = std::array::from_fn(|r| nibbles(wb[r].add(4)));
                        for c in 0..C {
                            let xb = xp[c].add(i * 36);
                            let y = _mm256_loadu_si256(xb.add(4) as *const __m256i);
                            let xs = _mm_cvtph_ps(_mm_cvtsi32_si128(
                                (xb as *const i32).read_unaligned(),
                            ));
                            let xs = _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(xs)));
                            summs[c] = _mm256_fmadd_ps(dm, xs, summs[c]); // fused, as GCC builds ggml's
                            let d = _mm256_mul_ps(dm, xs);
                            for r in 0..4 {
                                let p = dot4::<V>(q[r], y);
                                acc[c][r] = _mm256_fmadd_ps(
                                    lane(d, 2 * r as i32),
                                    _mm256_cvtepi32_ps(p),
                                    acc[c][r],
                                );
                            }
                        }
                    }
                    std::array::from_fn(|c| {
                        let mut s = [0f32; 8];
                        _mm256_storeu_ps(s.as_mut_ptr(), summs[c]);
                        std::array::from_fn(|r| hsum(acc[c][r]) + s[2 * r + 1])
                    })
                }
                DType::Q4_0 => {
                    for i in 0..nb {
                        let wb: [*const u8; 4] = std::array::from_fn(|r| wp[r].add(i * 18));
                        let dw = _mm_cvtph_ps(gather4_u16(wb));
                        let q: [__m256i; 4] = std::array::from_fn(|r| nibbles(wb[r].add(2)));
                        for c in 0..C {
                            let xb = xp[c].add(i * 34);
                            let y = _mm256_loadu_si256(xb.add(2) as *const __m256i);
                            // Σ(n-8)·y = Σ n·y - Σ 8·y, lane by lane: vec_dot's integers
                            let y8 = dot4::<V>(_mm256_set1_epi8(8), y);
                            let d = _mm256_castps128_ps256(_mm_mul_ps(dw, _mm_set1_ps(f16(xb))));
                            for r in 0..4 {
                                let p = dot4::<V>(q[r], y);
                                let p = _mm256_cvtepi32_ps(_mm256_sub_epi32(p, y8));
                                acc[c][r] = _mm256_fmadd_ps(lane(d, r as i32), p, acc[c][r]);
                            }
                        }
                    }
                    std::array::from_fn(|c| std::array::from_fn(|r| hsum(acc[c][r])))
                }
                DType::Q8_0 => {
                    for i in 0..nb {
                        let wb: [*const u8; 4] = std::array::from_fn(|r| wp[r].add(i * 34));
                        let dw = _mm_cvtph_ps(gather4_u16(wb));
                        let q: [__m256i; 4] = std::array::from_fn(|r| {
                            _mm256_loadu_si256(wb[r].add(2) as *const __m256i)
                        });
                        // ggml's Σ|w|·(y·sgn w) (exact for w = −128 too), |w| once per block
                        let aq = q.map(|v| _mm256_sign_epi8(v, v));
                        for c in 0..C {
                            let xb = xp[c].add(i * 34);
                            let y = _mm256_loadu_si256(xb.add(2) as *const __m256i);
                            let d = _mm256_castps128_ps256(_mm_mul_ps(dw, _mm_set1_ps(f16(xb))));
                            for r in 0..4 {
                                let p = dot4::<V>(aq[r], _mm256_sign_epi8(y, q[r]));
                                acc[c][r] = _mm256_fmadd_ps(
                                    lane(d, r as i32),
                                    _mm256_cvtepi32_ps(p),
                                    acc[c][r],
                                );
                            }
                        }
                    }
                    std::array::from_fn(|c| std::array::from_fn(|r| hsum(acc[c][r])))
                }
                _ => unreachable!("no integer kernel for {t}"),
            }
        }
    }

    /// One q8_K block (256 floats → 292 bytes) exactly as ggml's reference quantizer, which
    /// ggml's x86 backend uses: the element of largest magnitude (the first such) sets
    /// `iscale = −127/max`, values round half to even (`nearest_int` is that for |v| < 2²²),
    /// sums of 16, `d = 1/iscale`. Returns false, writing nothing, when the block holds a NaN
    /// or an infinity or the scale overflows: the scalar code defines those bytes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn quantize_block_q8k(x: *const f32, y: *mut u8) -> bool {
        // SAFETY: 256 readable floats at x; 292 writable bytes at y (caller).
        unsafe {
            let sign = _mm256_set1_ps(-0.0);
            let v: [__m256; 32] = std::array::from_fn(|j| _mm256_loadu_ps(x.add(8 * j)));
            let mut m = _mm256_andnot_ps(sign, v[0]);
            let mut unord = _mm256_cmp_ps::<_CMP_UNORD_Q>(v[0], v[0]);
            for vi in &v[1..] {
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *vi));
                unord = _mm256_or_ps(unord, _mm256_cmp_ps::<_CMP_UNORD_Q>(*vi, *vi));
            }
            if _mm256_movemask_ps(unord) != 0 {
                return false;
            }
            let m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
            let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
            if amax == 0.0 || !amax.is_finite() {
                return false;
            }
            // the first element whose magnitude is amax
            let am = _mm256_set1_ps(amax);
            let mut max = 0f32;
            for (j, vi) in v.iter().enumerate() {
                let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(
                    _mm256_andnot_ps(sign, *vi),
                    am,
                ));
                if hit != 0 {
                    max = *x.add(8 * j + hit.trailing_zeros() as usize);
                    break;
                }
            }
            let iscale = -127.0f32 / max;
            if !iscale.is_finite() {
                return false;
            }
            let mul = _mm256_set1_ps(iscale);
            let ones = _mm256_set1_epi8(1);
            let ones16 = _mm256_set1_epi16(1);
            let mut sums = [[0i32; 2]; 8];
            for c in 0..8 {
                let q: [__m256i; 4] =
                    std::array::from_fn(|j| _mm256_cvtps_epi32(_mm256_mul_ps(v[4 * c + j], mul)));
                let p01 = _mm256_packs_epi32(q[0], q[1]);
                let p23 = _mm256_packs_epi32(q[2], q[3]);
                let p = _mm256_packs_epi16(p01, p23);
                let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
                _mm256_storeu_si256(y.add(4 + 32 * c) as *mut __m256i, p);
                // sums of 16: pairs, then quads (i32), then two horizontal adds per half
                let quads = _mm256_madd_epi16(_mm256_maddubs_epi16(ones, p), ones16);
                let h = _mm256_hadd_epi32(quads, quads);
                let h = _mm256_hadd_epi32(h, h);
                sums[c] = [_mm256_extract_epi32::<0>(h), _mm256_extract_epi32::<4>(h)];
            }
            for (c, [lo, hi]) in sums.iter().enumerate() {
                (y.add(260 + 4 * c) as *mut i16).write_unaligned(*lo as i16);
                (y.add(262 + 4 * c) as *mut i16).write_unaligned(*hi as i16);
            }
            (y as *mut f32).write_unaligned(1.0 / iscale);
            true
        }
    }

    /// One block of 32 activations to q8_0 (or q8_1 with its sum), as ggml's AVX2
    /// `quantize_row_q8_0/1` does; the same bytes as `quantize_activations`' scalar form.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn quantize_block_q8(x: *const f32, y: *mut u8, q8_1: bool) {
        // SAFETY: 32 readable floats at x; 34 (q8_0) or 36 (q8_1) writable bytes at y.
        unsafe {
            let v = [
                _mm256_loadu_ps(x),
                _mm256_loadu_ps(x.add(8)),
                _mm256_loadu_ps(x.add(16)),
                _mm256_loadu_ps(x.add(24)),
            ];
            let sign = _mm256_set1_ps(-0.0);
            let mut m = _mm256_andnot_ps(sign, v[0]);
            for vi in &v[1..] {
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *vi));
            }
            let m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
            let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            let max = _mm_cvtss_f32(m4);
            let d = max / 127.0;
            let id = if max != 0.0 { 127.0 / max } else { 0.0 };
            let dh =
                _mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(d), _MM_FROUND_TO_NEAREST_INT), 0) as u16;
            (y as *mut u16).write_unaligned(dh);
            let mul = _mm256_set1_ps(id);
            let q: [__m256i; 4] = std::array::from_fn(|j| {
                _mm256_cvtps_epi32(_mm256_round_ps(
                    _mm256_mul_ps(v[j], mul),
                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
                ))
            });
            if q8_1 {
                let s =
                    _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
                let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
                let s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0b01_00_11_10));
                let s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0b10_11_00_01));
                let sum = _mm_cvtsi128_si32(s4);
                let sh = _mm_extract_epi16(
                    _mm_cvtps_ph(_mm_set_ss(d * sum as f32), _MM_FROUND_TO_NEAREST_INT),
                    0,
                ) as u16;
                (y.add(2) as *mut u16).write_unaligned(sh);
            }
            let p01 = _mm256_packs_epi32(q[0], q[1]);
            let p23 = _mm256_packs_epi32(q[2], q[3]);
            let p = _mm256_packs_epi16(p01, p23);
            let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(y.add(if q8_1 { 4 } else { 2 }) as *mut __m256i, p);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        // SAFETY: loads stay below n.
        unsafe {
            let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut i = 0;
            while i + 16 <= n {
                s0 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(a.as_ptr().add(i)),
                    _mm256_loadu_ps(b.as_ptr().add(i)),
                    s0,
                );
                s1 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(a.as_ptr().add(i + 8)),
                    _mm256_loadu_ps(b.as_ptr().add(i + 8)),
                    s1,
                );
                i += 16;
            }
            let mut s = hsum(_mm256_add_ps(s0, s1));
            while i < n {
                s += a[i] * b[i];
                i += 1;
            }
            s
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rng_vals(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
            })
            .collect()
    }

    /// The AVX2 activation quantizer writes the scalar form's bytes.
    #[test]
    fn activation_quantizers_agree() {
        #[cfg(target_arch = "x86_64")]
        if crate::simd::isa() >= Isa::Avx2 {
            for seed in 1..40u64 {
                let mut x = rng_vals(64, seed);
                if seed % 5 == 0 {
                    x.iter_mut()
                        .for_each(|v| *v = (*v * 8.0).round() / 8.0 * 127.0); // exact halves
                }
                if seed % 7 == 0 {
                    x[..32].fill(0.0);
                }
                for vdt in [DType::Q8_0, DType::Q8_1] {
                    let bs = vdt.type_size();
                    let mut scalar = vec![0u8; 2 * bs];
                    let qs = if vdt == DType::Q8_0 { 2 } else { 4 };
                    for (xb, yb) in x.chunks_exact(32).zip(scalar.chunks_exact_mut(bs)) {
                        let max = xb.iter().fold(0f32, |m, &v| m.max(v.abs()));
                        let (d, id) = (max / 127.0, if max != 0.0 { 127.0 / max } else { 0.0 });
                        yb[0..2].copy_from_slice(&half::f16::from_f32(d).to_bits().to_le_bytes());
                        let mut sum = 0i32;
                        for (j, &v) in xb.iter().enumerate() {
                            let q = (v * id).round_ties_even() as i32;
                            sum += q;
                            yb[qs + j] = q as i8 as u8;
                        }
                        if vdt == DType::Q8_1 {
                            yb[2..4].copy_from_slice(
                                &half::f16::from_f32(d * sum as f32).to_bits().to_le_bytes(),
                            );
                        }
                    }
                    let mut simd = vec![0u8; 2 * bs];
                    quantize_activations(vdt, &x, &mut simd).unwrap();
                    assert_eq!(simd, scalar, "{vdt} seed {seed}");
                }
            }
        }
    }

    /// The AVX2 q8_K quantizer writes the reference quantizer's bytes (ggml's, which its x86
    /// backend uses): random blocks, exact halves (ties), ties for the largest magnitude with
    /// either sign first, zeros, tiny scales, NaN and infinities (those take the scalar code).
    #[test]
    fn q8k_quantizer_matches_the_reference() {
        for seed in 1..60u64 {
            let mut x = rng_vals(512, seed);
            match seed % 8 {
                1 => x
                    .iter_mut()
                    .for_each(|v| *v = (*v * 8.0).round() / 8.0 * 127.0),
                2 => {
                    x[3] = -2.0;
                    x[200] = 2.0; // equal magnitude later: the first one sets the sign
                }
                3 => x[..256].fill(0.0),
                4 => x.iter_mut().for_each(|v| *v *= 1e-38),
                5 => x[77] = f32::NAN,
                6 => x[300] = f32::INFINITY,
                7 => x[5] = f32::NEG_INFINITY,
                _ => {}
            }
            let mut want = vec![0u8; 2 * 292];
            tessera_quants::quantize_row(DType::Q8K.id(), &x, &mut want, None).unwrap();
            let mut got = vec![0u8; 2 * 292];
            quantize_activations(DType::Q8K, &x, &mut got).unwrap();
            assert_eq!(got, want, "seed {seed}");
        }
    }

    /// The SIMD integer kernels give the scalar ones' bits (both are ggml's AVX2 arithmetic), on
    /// random and adversarial rows (all equal, extremes, zeros).
    #[test]
    fn simd_dot_products_match_scalar() {
        let k = 32 * 37;
        for t in [DType::Q4_0, DType::Q4_1, DType::Q8_0] {
            let vdt = vec_dot_type(t);
            for case in 0..6 {
                let (wv, xv) = match case {
                    0 => (rng_vals(k, 3), rng_vals(k, 4)),
                    1 => (vec![1.0; k], vec![-1.0; k]),
                    2 => (vec![0.0; k], rng_vals(k, 5)),
                    3 => (
                        rng_vals(k, 6).iter().map(|v| v * 1e4).collect(),
                        rng_vals(k, 7),
                    ),
                    4 => (rng_vals(k, 8), vec![127.0; k]),
                    _ => (
                        (0..k)
                            .map(|i| if i % 2 == 0 { 3.0 } else { -3.0 })
                            .collect(),
                        rng_vals(k, 9),
                    ),
                };
                let mut w = vec![0u8; t.row_size(k).unwrap()];
                let mut x = vec![0u8; vdt.row_size(k).unwrap()];
                tessera_quants::quantize_row(t.id(), &wv, &mut w, None).unwrap();
                tessera_quants::quantize_row(vdt.id(), &xv, &mut x, None).unwrap();
                let want = vec_dot_scalar(t, &w, &x, k);
                // the same dot from dequantized values in f64
                let mut wd = vec![0f32; k];
                let mut xd = vec![0f32; k];
                tessera_quants::dequantize_row(t.id(), &w, &mut wd).unwrap();
                tessera_quants::dequantize_row(vdt.id(), &x, &mut xd).unwrap();
                let exact: f64 = wd.iter().zip(&xd).map(|(&a, &b)| a as f64 * b as f64).sum();
                let scale: f64 = wd
                    .iter()
                    .zip(&xd)
                    .map(|(&a, &b)| (a as f64 * b as f64).abs())
                    .sum::<f64>()
                    .max(1e-30);
                // q8_1 stores s = d·Σq in f16, as ggml does: the min term is only f16-accurate
                let tol = if t == DType::Q4_1 { 1e-3 } else { 1e-5 };
                assert!(
                    ((want as f64) - exact).abs() / scale < tol,
                    "{t} case {case}: scalar {want} vs exact {exact}"
                );
                let got = vec_dot(crate::simd::isa(), t, &w, &x, k);
                // four different rows (this one, its negation, and two random ones)
                let others: Vec<Vec<u8>> = [
                    wv.iter().map(|v| -v).collect::<Vec<f32>>(),
                    rng_vals(k, 100 + case),
                    rng_vals(k, 200 + case).iter().map(|v| v * 3.0).collect(),
                ]
                .iter()
                .map(|v| {
                    let mut q = vec![0u8; t.row_size(k).unwrap()];
                    tessera_quants::quantize_row(t.id(), v, &mut q, None).unwrap();
                    q
                })
                .collect();
                let rows = [&w[..], &others[0], &others[1], &others[2]];
                let tile = vec_dot_4x3(crate::simd::isa(), t, rows, [&x, &x, &x], k);
                for (r, row) in rows.iter().enumerate() {
                    let one = vec_dot(crate::simd::isa(), t, row, &x, k);
                    assert!(
                        tile.iter().all(|c| c[r].to_bits() == one.to_bits()),
                        "{t} case {case} row {r}: 4x3 {tile:?} vs vec_dot {one}"
                    );
                }
                for pf in [0, 64, 4096] {
                    let four = vec_dot4(crate::simd::isa(), t, rows, &x, k, pf);
                    for (r, row) in rows.iter().enumerate() {
                        let one = vec_dot(crate::simd::isa(), t, row, &x, k);
                        assert_eq!(
                            four[r].to_bits(),
                            one.to_bits(),
                            "{t} case {case} row {r}: vec_dot4 {} vs vec_dot {one}",
                            four[r]
                        );
                    }
                }
                let four = vec_dot4(crate::simd::isa(), t, [&w, &w, &w, &w], &x, k, 4096);
                let tile = vec_dot_4x2(crate::simd::isa(), t, [&w, &w, &w, &w], [&x, &x], k);
                let tile3 = vec_dot_4x3(crate::simd::isa(), t, [&w, &w, &w, &w], [&x, &x, &x], k);
                assert!(
                    tile3.iter().flatten().all(|v| v.to_bits() == got.to_bits()),
                    "{t}: 4x3 {tile3:?} vs {got}"
                );
                assert!(
                    tile.iter().flatten().all(|v| v.to_bits() == got.to_bits()),
                    "{t}: 4x2 {tile:?} vs {got}"
                );
                assert!(
                    four.iter().all(|v| v.to_bits() == got.to_bits()),
                    "{t}: vec_dot4 {four:?} vs {got}"
                );
                // the portable kernels compute ggml's AVX2 arithmetic: the same bits
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{t} case {case}: simd {got} vs scalar {want}"
                );
            }
        }
    }

    /// The eight-row mat-vec kernels (AVX-512's `qgemv_0` where the CPU has it, two four-row
    /// calls elsewhere) give every row `vec_dot`'s bits: weights straight from random bytes
    /// (every code) and from the quantizer, activations at ±127 and random, block counts odd
    /// and even (iq4_nl's odd last block), scales at f16's extremes (its largest, its smallest
    /// subnormal, zeros, infinities, NaN: any NaN for a NaN), every instruction set this CPU
    /// runs.
    #[test]
    fn eight_row_kernel_equals_vec_dot() {
        const EXTREME: [f32; 9] = [
            65504.0,
            -65504.0,
            5.960_464_5e-8,
            -5.960_464_5e-8,
            0.0,
            -0.0,
            1.0,
            f32::INFINITY,
            f32::NAN,
        ];
        // case 3: finite extremes only (the results finite), case 4: infinities and NaN too
        let extreme = |case: usize, r: u64| EXTREME[(r % if case == 3 { 7 } else { 9 }) as usize];
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let isas: Vec<Isa> = [Isa::Scalar, Isa::Avx2, Isa::AvxVnni, Isa::Avx512]
            .into_iter()
            .filter(|&i| {
                i == Isa::Scalar || (crate::simd::isa() >= i && crate::simd::isa() != Isa::Neon)
            })
            .chain([crate::simd::isa()])
            .collect();
        for t in [
            DType::Q4_0,
            DType::Q4_1,
            DType::IQ4NL,
            DType::MXFP4,
            DType::Q8_0,
            DType::Q5_0,
            DType::Q5_1,
            DType::IQ4XS,
            DType::Q4K,
            DType::Q5K,
            DType::Q6K,
            DType::Q2K,
            DType::Q3K,
        ] {
            let vdt = vec_dot_type(t);
            // where the block's f16 scale d lies (and its f16 min, 2 bytes on, where it has one)
            let d_at = match t {
                DType::Q6K => 208,
                DType::Q2K => 80,
                DType::Q3K => 108,
                _ => 0,
            };
            let (ws, xs) = (t.type_size(), vdt.type_size());
            for nb in [1usize, 2, 3, 8, 16, 17, 37] {
                let k = t.block_size() * nb;
                for case in 0..5 {
                    let rows: Vec<Vec<u8>> = (0..8)
                        .map(|r| {
                            if case == 2 {
                                let v: Vec<f32> = (0..k)
                                    .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
                                    .collect();
                                let mut q = vec![0u8; t.row_size(k).unwrap()];
                                tessera_quants::quantize_row(t.id(), &v, &mut q, None).unwrap();
                                return q;
                            }
                            let mut w: Vec<u8> = (0..nb * ws).map(|_| next() as u8).collect();
                            for b in 0..nb {
                                if t == DType::MXFP4 {
                                    // an e8m0 scale byte, 2^-128 (subnormal) .. 2^12
                                    w[b * ws] = (next() % 141) as u8;
                                    continue;
                                }
                                let d = if case >= 3 {
                                    extreme(case, next())
                                } else {
                                    (0.01 + (next() % 1000) as f32 / 500.0)
                                        * if (r + b) % 3 == 0 { -1.0 } else { 1.0 }
                                };
                                w[b * ws + d_at..b * ws + d_at + 2].copy_from_slice(
                                    &half::f16::from_f32(d).to_bits().to_le_bytes(),
                                );
                                if matches!(
                                    t,
                                    DType::Q4_1
                                        | DType::Q5_1
                                        | DType::Q4K
                                        | DType::Q5K
                                        | DType::Q2K
                                ) {
                                    let m = (next() % 1000) as f32 / 300.0 - 1.5;
                                    w[b * ws + d_at + 2..b * ws + d_at + 4].copy_from_slice(
                                        &half::f16::from_f32(m).to_bits().to_le_bytes(),
                                    );
                                }
                            }
                            w
                        })
                        .collect();
                    let mut x = vec![0u8; nb * xs];
                    // q8_K: f32 d, 256 values, 16 group sums; q8_0/q8_1: f16 d (and s), 32
                    let (qoff, qn) = if vdt == DType::Q8K {
                        (4, 256)
                    } else {
                        (xs - 32, 32)
                    };
                    for b in 0..nb {
                        let blk = &mut x[b * xs..(b + 1) * xs];
                        let d = if case >= 3 {
                            extreme(case, next())
                        } else {
                            0.001 + (next() % 1000) as f32 / 7000.0
                        };
                        if vdt == DType::Q8K {
                            blk[0..4].copy_from_slice(&d.to_le_bytes());
                        } else {
                            blk[0..2]
                                .copy_from_slice(&half::f16::from_f32(d).to_bits().to_le_bytes());
                        }
                        let mut sum = 0i32;
                        for (j, y) in blk[qoff..qoff + qn].iter_mut().enumerate() {
                            let v = match case {
                                0 | 3 | 4 => ((next() % 255) as i32) - 127,
                                _ if j % 2 == 0 => 127,
                                _ => -127,
                            };
                            sum += v;
                            *y = v as i8 as u8;
                        }
                        if vdt == DType::Q8K {
                            for g in 0..16 {
                                let gs: i32 =
                                    (0..16).map(|e| blk[4 + 16 * g + e] as i8 as i32).sum();
                                blk[260 + 2 * g..262 + 2 * g]
                                    .copy_from_slice(&(gs as i16).to_le_bytes());
                            }
                        } else if qoff == 4 {
                            blk[2..4].copy_from_slice(
                                &half::f16::from_f32(d * sum as f32).to_bits().to_le_bytes(),
                            );
                        }
                    }
                    let w8: [&[u8]; 8] = std::array::from_fn(|r| &rows[r][..]);
                    // the same rows interleaved (`tessera::layout`), where the type has it
                    let group = tessera::layout::interleave_head(t).map(|_| {
                        let plain = rows.concat();
                        let mut g = vec![0u8; plain.len()];
                        tessera::layout::interleave8(t, nb * ws, &plain, &mut g).unwrap();
                        g
                    });
                    for &isa in &isas {
                        let got = vec_dot8(isa, t, w8, &x, k, 512);
                        // iq4_xs: the kernel for CPUs without VBMI too, on one that has it
                        #[cfg(target_arch = "x86_64")]
                        let without_vbmi =
                            (t == DType::IQ4XS && eight_row_kernel(isa, t)).then(|| {
                                let g = group.as_ref().expect("iq4_xs interleaves");
                                // SAFETY: `eight_row_kernel` says the CPU has AVX-512 VNNI (and
                                // what `vec_dot8` asks); nb superblocks in every row, in the
                                // group and in x.
                                unsafe {
                                    use crate::ops::qgemv_0 as q;
                                    [
                                        q::iq4_xs8_without_vbmi(w8, &x, k),
                                        q::iq4_xs8_interleaved_without_vbmi(g, &x, k),
                                    ]
                                }
                            });
                        #[cfg(not(target_arch = "x86_64"))]
                        let without_vbmi: Option<[[f32; 8]; 2]> = None;
                        // q2_K, q3_K (plain rows only), q5_K, q6_K: the kernel for CPUs without
                        // GFNI too, on one that has it
                        #[cfg(target_arch = "x86_64")]
                        if matches!(t, DType::Q2K | DType::Q3K) && eight_row_kernel(isa, t) {
                            // SAFETY: as above; nb superblocks in every row and in x.
                            let v = unsafe {
                                use crate::ops::qgemv_0 as q;
                                if t == DType::Q2K {
                                    q::q2_k8_without_gfni(w8, &x, k)
                                } else {
                                    q::q3_k8_without_gfni(w8, &x, k)
                                }
                            };
                            for (r, (v, g)) in v.iter().zip(got).enumerate() {
                                assert!(
                                    v.to_bits() == g.to_bits() || (v.is_nan() && g.is_nan()),
                                    "{t} nb {nb} case {case} row {r} {isa:?}: without GFNI {v} \
                                     vs {g}"
                                );
                            }
                        }
                        #[cfg(target_arch = "x86_64")]
                        if matches!(t, DType::Q5K | DType::Q6K) && eight_row_kernel(isa, t) {
                            let g = group.as_ref().expect("q5_K and q6_K interleave");
                            // SAFETY: as above; nb superblocks in every row, the group and x.
                            let v = unsafe {
                                use crate::ops::qgemv_0 as q;
                                if t == DType::Q5K {
                                    [
                                        q::q5_k8_without_gfni(w8, &x, k),
                                        q::q5_k8_interleaved_without_gfni(g, &x, k),
                                    ]
                                } else {
                                    [
                                        q::q6_k8_without_gfni(w8, &x, k),
                                        q::q6_k8_interleaved_without_gfni(g, &x, k),
                                    ]
                                }
                            };
                            for (r, (v, &g)) in
                                v.iter().flatten().zip(got.iter().cycle()).enumerate()
                            {
                                assert!(
                                    v.to_bits() == g.to_bits() || (v.is_nan() && g.is_nan()),
                                    "{t} nb {nb} case {case} row {r} {isa:?}: without GFNI {v} \
                                     vs {g}"
                                );
                            }
                        }
                        let mut scratch = vec![0u8; 8 * nb * ws];
                        let inter = group
                            .as_ref()
                            .map(|g| vec_dot8_interleaved(isa, t, g, &x, k, &mut scratch));
                        for (r, row) in w8.iter().enumerate() {
                            let one = vec_dot(isa, t, row, &x, k);
                            // (a NaN's sign and payload depend on which operand of an
                            // add or FMA the compiler put first: any NaN is the same NaN)
                            let same = |v: f32| {
                                v.to_bits() == one.to_bits() || (v.is_nan() && one.is_nan())
                            };
                            assert!(
                                same(got[r]),
                                "{t} nb {nb} case {case} row {r} {isa:?}: vec_dot8 {} vs vec_dot {one}",
                                got[r]
                            );
                            if let Some(v) = inter {
                                assert!(
                                    same(v[r]),
                                    "{t} nb {nb} case {case} row {r} {isa:?}: interleaved {} vs vec_dot {one}",
                                    v[r]
                                );
                            }
                            let kinds = ["", " interleaved"];
                            for (v, how) in without_vbmi.iter().flatten().zip(kinds) {
                                assert!(
                                    same(v[r]),
                                    "{t} nb {nb} case {case} row {r} {isa:?}: without VBMI{how} {} vs vec_dot {one}",
                                    v[r]
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// q8_0/q4_0/q4_1 weights straight from bytes (every code, −128 included, which no ggml
    /// quantizer writes but a file may hold) against activations at ±127 and random: every
    /// entry point and instruction set gives the scalar kernel's bits, and the scalar kernel is
    /// the exact integer dot (ggml's |w|·sign(y, w) is exact for w = −128 as long as |y| ≤ 127).
    #[test]
    fn extreme_codes_agree_on_every_kernel() {
        let k = 256;
        let nb = k / 32;
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let isas: Vec<Isa> = [Isa::Avx2, Isa::AvxVnni, Isa::Avx512]
            .into_iter()
            .filter(|&i| crate::simd::isa() >= i && crate::simd::isa() != Isa::Neon)
            .chain([crate::simd::isa()])
            .collect();
        for t in [DType::Q4_0, DType::Q4_1, DType::Q8_0] {
            let (ws, qoff) = match t {
                DType::Q4_0 => (18, 2),
                DType::Q4_1 => (20, 4),
                _ => (34, 2),
            };
            let vdt = vec_dot_type(t);
            let (xs, xoff) = if vdt == DType::Q8_1 { (36, 4) } else { (34, 2) };
            for case in 0..4 {
                let mut rows: Vec<Vec<u8>> = Vec::new();
                for r in 0..4 {
                    let mut w = vec![0u8; nb * ws];
                    for b in 0..nb {
                        let blk = &mut w[b * ws..(b + 1) * ws];
                        blk[0..2].copy_from_slice(
                            &half::f16::from_f32(0.5 + r as f32).to_bits().to_le_bytes(),
                        );
                        if qoff == 4 {
                            blk[2..4].copy_from_slice(
                                &half::f16::from_f32(-0.25).to_bits().to_le_bytes(),
                            );
                        }
                        for (j, q) in blk[qoff..].iter_mut().enumerate() {
                            *q = match (case + r) % 4 {
                                0 => 0x80, // −128 (q8_0), nibbles 0 and 8
                                1 => {
                                    if j % 2 == 0 {
                                        0x80
                                    } else {
                                        0x7f
                                    }
                                }
                                2 => 0xff,
                                _ => next() as u8,
                            };
                        }
                    }
                    rows.push(w);
                }
                let mut x = vec![0u8; nb * xs];
                for b in 0..nb {
                    let blk = &mut x[b * xs..(b + 1) * xs];
                    blk[0..2].copy_from_slice(&half::f16::from_f32(0.125).to_bits().to_le_bytes());
                    if xoff == 4 {
                        blk[2..4]
                            .copy_from_slice(&half::f16::from_f32(3.0).to_bits().to_le_bytes());
                    }
                    for (j, y) in blk[xoff..].iter_mut().enumerate() {
                        *y = match case {
                            0 => (-127i8) as u8,
                            1 => {
                                if j % 3 == 0 {
                                    127
                                } else {
                                    (-127i8) as u8
                                }
                            }
                            _ => ((next() % 255) as i32 - 127) as i8 as u8,
                        };
                    }
                }
                let w4 = [&rows[0][..], &rows[1][..], &rows[2][..], &rows[3][..]];
                for (r, w) in w4.iter().enumerate() {
                    // the scalar kernel against the exact sums, block by block
                    let want = vec_dot_scalar(t, w, &x, k);
                    let mut exact = 0f64;
                    for b in 0..nb {
                        let (wb, xb) = (&w[b * ws..(b + 1) * ws], &x[b * xs..(b + 1) * xs]);
                        let sum: i64 = (0..32)
                            .map(|e| {
                                let q = if t == DType::Q8_0 {
                                    wb[qoff + e] as i8 as i64
                                } else {
                                    let v = wb[qoff + e % 16];
                                    let n = if e < 16 { v & 15 } else { v >> 4 } as i64;
                                    if t == DType::Q4_0 {
                                        n - 8
                                    } else {
                                        n
                                    }
                                };
                                q * xb[xoff + e] as i8 as i64
                            })
                            .sum();
                        exact += f16(wb, 0) as f64 * f16(xb, 0) as f64 * sum as f64;
                        if t == DType::Q4_1 {
                            exact += f16(wb, 2) as f64 * f16(xb, 2) as f64;
                        }
                    }
                    assert!(
                        (want as f64 - exact).abs() <= 1e-5 * exact.abs().max(1.0),
                        "{t} case {case} row {r}: scalar {want} vs exact {exact}"
                    );
                    for &isa in &isas {
                        let one = vec_dot(isa, t, w, &x, k);
                        let four = vec_dot4(isa, t, w4, &x, k, 64);
                        let two = vec_dot_4x2(isa, t, w4, [&x, &x], k);
                        let three = vec_dot_4x3(isa, t, w4, [&x, &x, &x], k);
                        for (what, v) in [
                            ("vec_dot", one),
                            ("vec_dot4", four[r]),
                            ("4x2", two[1][r]),
                            ("4x3", three[2][r]),
                        ] {
                            assert_eq!(
                                v.to_bits(),
                                want.to_bits(),
                                "{t} case {case} row {r} {isa:?} {what}: {v} vs scalar {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}
