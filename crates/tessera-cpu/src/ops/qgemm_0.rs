//! Quantized mat-mat for q4_0, q4_1, q5_0, q5_1 and q8_0 weights against five or more columns (AVX2), each
//! element bit-identical to the one-column AVX2 kernel (`matmul_quant::vec_dot`, which is
//! ggml's x86 `vec_dot`); and for iq4_nl from two columns, with the arithmetic of ggml's x86
//! mat-mat for it (llamafile's tinyBLAS, one accumulator per lane, as for q8_0; ggml's one-column
//! `vec_dot` for iq4_nl alternates two accumulators and is not what llama.cpp computes for
//! batches). iq4_nl's codebook values are kept as q8_0's codes are: sign masks and magnitudes.
//! mxfp4 (E2M1 codes through ggml's `kvalues_fp4`, half the E8M0 scale) takes the same path
//! with ggml's one-column `vec_dot` arithmetic, which is also what llama.cpp computes for its
//! batches: even and odd blocks in two sets of lane accumulators (the kernel called on every
//! other block of a K chunk), added lane by lane before the horizontal sum, and an odd last
//! block's `d·Σ` added after it, unfused.
//!
//! ggml's AVX2 kernel for these types keeps an 8-lane f32 accumulator per (row, column): lane
//! i receives, for every 32-element block in order, `fma(d_w·d_x, f32(p_i), acc_i)` where p_i
//! is the exact integer dot product of the block's elements 4i..4i+3; at the end the lanes are
//! summed in ggml's `hsum_float_8` order (q4_1 and q5_1 then add their `Σ m_w·s_x`, accumulated by fused
//! multiply-adds). Those are the only float operations, so computing them per lane in any
//! arrangement gives ggml's bits.
//!
//! The arrangement here puts the eight columns of a group in the vector lanes: the activations
//! of eight columns are interleaved by four bytes, so one `vpmaddubsw` of a broadcast group of
//! four weights and `vpmaddwd` by ones gives p_i for eight columns at once, and eight
//! accumulators per weight row hold lane i of the eight columns. No horizontal work and no
//! per-pair scale shuffles remain in the inner loop: about five instructions per 32
//! multiply-adds (q8_0: six, its signs applied with an xor and a subtract). With VNNI one
//! `vpdpbusd` gives p_i, starting from the packed −bias·Σx of the lane (q4_0 / q5_0 codes carry
//! a bias of 8 / 16, q8_0 and iq4_nl values are stored + 128), then a conversion and an FMA:
//! three vector operations per 32 multiply-adds for every type but q4_1 / q5_1 (which add
//! their Σ m·s per block).
//!
//! Cache blocking: a window of column groups against every row, K in chunks of blocks; the
//! accumulators of (row, group) live in per-thread scratch between chunks. Up to three groups
//! (decoding a batch of sequences) each row is instead finished in one pass per group with its
//! accumulators in registers (1.5-1.8x at 8 columns: the per-chunk loads, stores and unpacked
//! scratch cost as much as the products when only one group shares them).
//!
//! On AVX-512 VNNI the cache-blocked loop takes pairs of groups instead ([`pack_half`],
//! [`PAIR_BYTES`]): the two groups' activations and scales interleaved by 32 bytes, so one
//! 512-bit `vpdpbusd`, conversion and FMA do lane i of sixteen columns. Every column goes
//! through the same integer sums and the same float operations in the same order as on
//! 256-bit registers, so the bits do not change; mat-mat is 1.2-1.35x faster for these types
//! (4096² and 576×1536 × 512 columns, 1 and 2 threads, on a Xeon with AVX-512: Intel's cores
//! issue the 512-bit operations on one port but do twice the work per instruction). There the
//! roles of the operands are swapped for the types with a bias: activations + 128 (unsigned)
//! times the weights' signed values, starting from −128·Σ of the lane's four weights (a
//! broadcast from the unpacked block, `avx2::to_signed`) instead of a 64-byte load of
//! −bias·Σx per `vpdpbusd`. The integers are the same; the packed pair block shrinks from
//! 1152 to 640 bytes, and q4_0/q5_0/q8_0/iq4_nl/mxfp4 4096²×512 went up 1.08-1.21x on one
//! thread of an Ice Lake Xeon (q4_1, whose block lost only unused bytes, 1.18x). Since then
//! the kernel takes two weight rows a call (`avx512::kernel2`, all types but mxfp4), so each
//! 64-byte activation load serves two `vpdpbusd`: another 1.16-1.28x on one thread and
//! 1.13-1.36x on two there (q4_0, q4_1, q8_0, iq4_nl; 4096² and 576×1536 × 512). Before the
//! swap, on the AMX Xeon, two rows a call had been 5-10 % slower. On a Zen 5 core, where
//! `vpdpbusd` and the FMA share two pipes, the conversion has two others and two 512-bit
//! loads issue a cycle, the five loads per (row pair, lane) bounded the loop; the start values
//! −128·Σ are now loaded once a block as two 128-bit halves and each lane's picked by an
//! in-lane `vpshufd` (on the conversion's pipes): q4_0, q5_0, q8_0, iq4_nl and mxfp4 mat-mat
//! 1.10-1.16x there, the same integers.

use tessera::DType;

use super::qdot::f16_at;

/// Columns packed together.
pub const GROUP: usize = 8;
/// Bytes of one packed (column group, 32-element block): the 32 activations of eight columns
/// interleaved by four (`[8][8][4]`), for q4_0 / q5_0 / q8_0 / iq4_nl minus the sums of four
/// times the codes' bias (`[8][8]` i32), the eight d (f32) and for q4_1 / q5_1 the eight s
/// (f32).
pub const PACKED: usize = 576;
const OFF_AUX: usize = 256;
const OFF_D: usize = 512;
const OFF_S: usize = 544;

/// Rows per chunk, column groups per window and blocks per K chunk: a chunk's rows are
/// unpacked once per K chunk (32 × 32 blocks of 96 bytes) for the whole window, and each
/// group's K chunk (32 × 576 bytes, in L1) then meets every row of the chunk, the accumulators
/// loaded and stored once per 256 multiply steps. Against 64 × 8 × 4 (a row's four blocks
/// against eight groups, accumulators reloaded every 32 steps): q4_1 1536×576×512 +12 % on two
/// threads, q4_0 4096² × 512 +20 %, the rest within +-2 % (same-process A/B, best of 12).
const RCH: usize = 32;
const GW: usize = 16;
const KC: usize = 32;

pub fn supported(t: DType) -> bool {
    matches!(
        t,
        DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::IQ4NL
            | DType::MXFP4
    )
}

/// mxfp4 keeps ggml's `vec_dot` order (llama.cpp's batched mxfp4 is one `vec_dot` per
/// column): even blocks into one accumulator, odd ones into a second, the two added before the
/// horizontal sum, and an odd last block added after it as `d·Σ` (not fused). Here the two
/// accumulators are two sets of lane accumulators per (row, group), the kernel taking every
/// other block, and the last block's `d·Σ` goes where q4_1 keeps its Σ m·s.
fn two_acc(t: DType) -> bool {
    t == DType::MXFP4
}

/// The activation format pairs with m (q8_1: q4_1, q5_1).
fn with_min(t: DType) -> bool {
    matches!(t, DType::Q4_1 | DType::Q5_1)
}

/// The offset the unsigned codes carry (value = code − bias): q4_0 8, q5_0 16; q8_0 and iq4_nl
/// 128 where the kernel multiplies with `vpdpbusd` (their signed values stored as value + 128,
/// so that no sign needs applying per product; the AVX2 kernel keeps ggml's signs and does not
/// read the sums).
fn bias(t: DType) -> i32 {
    match t {
        DType::Q4_0 => 8,
        DType::Q5_0 => 16,
        DType::Q8_0 | DType::IQ4NL | DType::MXFP4 => 128,
        _ => 0,
    }
}

/// Fewest columns per batch for this path: from five, one pass over the weights with the
/// columns in the lanes (a group padded with zero columns) beats the four-row tiles, which
/// unpack each weight block once per three columns (576x131072 q4_1, one thread: 6 columns
/// 22-27 ms there, 16 ms here; 4 columns about equal).
pub const MIN_COLS: usize = 5;

/// Whether a mul_mat of `t` against `cols_per_batch` columns may take this path (it runs only
/// on AVX2; other ISAs keep the one-column kernels, whose scalar order differs).
pub fn applies(t: DType, cols_per_batch: usize) -> bool {
    supported(t) && (cols_per_batch >= MIN_COLS || (t == DType::IQ4NL && cols_per_batch >= 2))
}

/// Whether this CPU and ISA run the path.
pub fn runs_on(isa: crate::simd::Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        matches!(
            isa,
            crate::simd::Isa::Avx2 | crate::simd::Isa::AvxVnni | crate::simd::Isa::Avx512
        ) && avx2::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// One unpacked weight block: the 32 codes in element order (q4: 0..15; q8_0 and iq4_nl: for
/// AVX2 the sign masks of the values, 0xff where negative, and their magnitudes in `aq`; for
/// VNNI the values + 128; for the AVX-512 pair kernel, types with a bias: the signed values,
/// and in `aq` eight i32, −128·Σ of each lane's four values), d and m as f32.
#[repr(C, align(32))]
#[derive(Clone, Copy)]
pub(crate) struct WBlock {
    q: [u8; 32],
    aq: [u8; 32],
    d: f32,
    m: f32,
    _pad: [u32; 6],
}

/// Bytes of per-thread scratch: the unpacked K chunk of a chunk of rows (RCH × KC blocks) and
/// the accumulators of those rows against a window of groups (nine vectors of eight f32 per
/// (row, group), twice for mxfp4): 384 KiB.
pub fn scratch_size() -> usize {
    RCH * KC * std::mem::size_of::<WBlock>() + 2 * RCH * GW * 9 * 32 + 64
}

/// Packs up to eight quantized columns (q8_0 or q8_1 rows of `nb` blocks; `None`: a zero
/// column) for weights of type `t` into `out` (`nb * PACKED` bytes).
pub fn pack_group(t: DType, cols: &[Option<&[u8]>; GROUP], nb: usize, out: &mut [u8]) {
    check_cols(t, cols, nb);
    assert!(out.len() >= nb * PACKED, "qgemm_0: packed group too short");
    for b in 0..nb {
        pack_block(t, cols, b, &mut out[b * PACKED..(b + 1) * PACKED], true);
    }
}

/// Bytes of one block of a pair of groups in the AVX-512 layout ([`pack_half`]): the two
/// groups' activations and scales interleaved by 32 bytes, so that one 512-bit load takes a
/// lane (or the scales) of sixteen columns: `[8][16][4]` activations (stored + 128 for the
/// types with a bias, see [`pack_half`]), then the sixteen d and the sixteen s (f32). No
/// −bias·Σx sums: the wide kernel takes its bias term from the weights instead.
pub const PAIR_BYTES: usize = 640;
const WIDE_OFF_D: usize = 512;
const WIDE_OFF_S: usize = 576;

/// Whether [`run`] under `isa` takes a batch of `cols_per_batch` columns as pairs of groups in
/// the AVX-512 layout (so the packing must be [`pack_half`]'s, with an even number of groups
/// per batch): on CPUs with AVX-512 VNNI, for the cache-blocked loop (more than
/// `FEW_GROUPS` groups). The kernel runs the AVX2 kernel's per-lane operations on sixteen
/// columns at once, so the results are the same bits.
pub fn wide(isa: crate::simd::Isa, cols_per_batch: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx2::available()
            && crate::ops::qdot::avx2::uses_vnni(isa)
            && cols_per_batch.div_ceil(GROUP) > FEW_GROUPS
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, cols_per_batch);
        false
    }
}

/// Packs up to eight quantized columns as half `half` (0 or 1) of a pair of groups in the
/// AVX-512 layout ([`PAIR_BYTES`] per block, `nb` blocks at `out`): the activation and scale
/// pieces of [`pack_group`]'s block (32 bytes each) at the first (half 0) or last (half 1) 32
/// bytes of every 64. For the types with a bias (q4_0, q5_0, q8_0, iq4_nl, mxfp4) the
/// activations are stored + 128, as unsigned bytes: the wide kernel multiplies them by the
/// weights' signed values and starts from −128·Σ of the four weights (exact integers, so the
/// same sums as x times the biased codes minus bias·Σx). The two halves of a pair may be
/// packed at the same time by two threads: each writes only its own bytes.
///
/// # Safety
/// `out` points at `nb * PAIR_BYTES` writable bytes, of which this half's are written by no
/// one else meanwhile.
///
/// # Panics
/// On `half >= 2` or a short column.
pub unsafe fn pack_half(
    t: DType,
    cols: &[Option<&[u8]>; GROUP],
    nb: usize,
    out: *mut u8,
    half: usize,
) {
    assert!(half < 2, "qgemm_0: half {half}");
    check_cols(t, cols, nb);
    let flip = if bias(t) != 0 { 0x80 } else { 0 };
    let mut blk = [0u8; PACKED];
    for b in 0..nb {
        pack_block(t, cols, b, &mut blk, false);
        // the eight activation pieces (+ 128 where the type has a bias), then d and s
        for q in (0..8).chain([OFF_D / 32, OFF_S / 32]) {
            let mut piece = [0u8; 32];
            for (o, &v) in piece.iter_mut().zip(&blk[32 * q..32 * q + 32]) {
                *o = if q < 8 { v ^ flip } else { v };
            }
            let at = match q {
                q if q < 8 => 64 * q,
                q if q == OFF_D / 32 => WIDE_OFF_D,
                _ => WIDE_OFF_S,
            };
            // SAFETY: block b's piece of this half lies inside `out` and is this half's
            // (caller).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    piece.as_ptr(),
                    out.add(b * PAIR_BYTES + at + 32 * half),
                    32,
                )
            };
        }
    }
}

fn check_cols(t: DType, cols: &[Option<&[u8]>; GROUP], nb: usize) {
    let bs = if with_min(t) { 36 } else { 34 };
    for col in cols.iter().flatten() {
        assert!(col.len() >= nb * bs, "qgemm_0: short activation column");
    }
}

/// Block `b` of the columns, packed into `o` (`PACKED` bytes; for q4_1 / q5_1 the unused
/// sums are left as they are; `aux`: write the −bias·Σx sums, which only the 256-bit layout
/// reads).
fn pack_block(t: DType, cols: &[Option<&[u8]>; GROUP], b: usize, o: &mut [u8], aux: bool) {
    let (bs, qs) = if with_min(t) { (36, 4) } else { (34, 2) };
    // (the AVX-512 pair layout keeps no −bias·Σx sums)
    let bias = if aux { bias(t) } else { 0 };
    for (c, col) in cols.iter().enumerate() {
        let x = col.map(|col| &col[b * bs..(b + 1) * bs]);
        for i in 0..8 {
            let at = 32 * i + 4 * c;
            match x {
                Some(x) => o[at..at + 4].copy_from_slice(&x[qs + 4 * i..qs + 4 * i + 4]),
                None => o[at..at + 4].fill(0),
            }
            if bias != 0 {
                let s: i32 = x.map_or(0, |x| {
                    x[qs + 4 * i..qs + 4 * i + 4]
                        .iter()
                        .map(|&v| -bias * v as i8 as i32)
                        .sum()
                });
                o[OFF_AUX + at..OFF_AUX + at + 4].copy_from_slice(&s.to_le_bytes());
            }
        }
        let (d, s) = x.map_or((0.0, 0.0), |x| {
            (f16_at(x, 0), if with_min(t) { f16_at(x, 2) } else { 0.0 })
        });
        o[OFF_D + 4 * c..OFF_D + 4 * c + 4].copy_from_slice(&d.to_le_bytes());
        o[OFF_S + 4 * c..OFF_S + 4 * c + 4].copy_from_slice(&s.to_le_bytes());
    }
}

pub use super::qgemm_k::Batch;

/// Whether [`run`] of `t` against `cols` columns per batch reads weights with interleaved rows
/// (`Batch::interleaved`) in place: its windowed paths unpack blocks one by one and find each
/// where the layout puts it; the few-column path reads whole rows and does not.
pub fn reads_interleaved(isa: crate::simd::Isa, t: DType, cols: usize) -> bool {
    let groups = if wide(isa, cols) {
        2 * cols.div_ceil(2 * GROUP)
    } else {
        cols.div_ceil(GROUP)
    };
    // (its blocks have one 16-byte run of quants each: not iq4_xs, which it does not take)
    tessera::layout::interleave_head(t).is_some_and(|h| t.type_size() == h + 16)
        && (wide(isa, cols) || groups > FEW_GROUPS || two_acc(t))
}

/// Computes rows `rows` of one batch against all its columns.
///
/// # Safety
/// As `qgemm_k::run`: `b` describes valid memory (rows of `k` elements of `t`, `groups` packed
/// groups of `k / 32` blocks, result cells of the valid columns and these rows, written by
/// this caller only); `scratch` holds `scratch_size()` bytes of its own; the CPU has
/// AVX2 and FMA ([`runs_on`]).
#[cfg(target_arch = "x86_64")]
pub unsafe fn run(
    isa: crate::simd::Isa,
    t: DType,
    k: usize,
    rows: std::ops::Range<usize>,
    b: &Batch,
    scratch: *mut u8,
) {
    // AVX-512 VNNI (1) or AVX-VNNI (2): the same integer sums with `vpdpbusd`
    let vnni = if crate::ops::qdot::avx2::uses_vnni(isa) {
        1
    } else if crate::ops::qdot::avx2::uses_avx_vnni(isa) {
        2
    } else {
        0
    };
    let wide = wide(isa, b.cols);
    if !wide && b.groups <= FEW_GROUPS && !two_acc(t) {
        assert!(!b.interleaved, "run_few reads whole plain rows");
        // SAFETY: forwarded.
        unsafe { run_few(vnni, t, k, rows, b) };
        return;
    }
    let mut r0 = rows.start;
    while r0 < rows.end {
        let r1 = (r0 + RCH).min(rows.end);
        // SAFETY: forwarded; r0..r1 lies inside `rows`; in the wide case the batch is packed
        // as pairs ([`wide`], the caller's packing) and the CPU has AVX-512 VNNI.
        unsafe {
            if wide {
                run_chunk_wide(t, k, r0..r1, b, scratch)
            } else {
                run_chunk(vnni, t, k, r0..r1, b, scratch)
            }
        };
        r0 = r1;
    }
}

/// A thread's scratch ([`scratch_size`] bytes at `scratch`) as the unpacked weight blocks of a
/// chunk (RCH·KC, 64-byte aligned) and `floats` accumulators after them.
///
/// # Safety
/// `scratch` points at [`scratch_size`] bytes that are this thread's alone; `floats` ≤
/// 2·RCH·GW·72 (mxfp4's two sets).
#[cfg(target_arch = "x86_64")]
unsafe fn split_scratch<'a>(scratch: *mut u8, floats: usize) -> (&'a mut [WBlock], &'a mut [f32]) {
    debug_assert!(floats <= 2 * RCH * GW * 72);
    let al = scratch.align_offset(64);
    // SAFETY: the scratch holds RCH·KC WBlocks after aligning to 64, then 2·RCH·GW·9 vectors
    // of eight floats (`scratch_size`; caller).
    unsafe {
        let w = scratch.add(al) as *mut WBlock;
        let acc = scratch.add(al + RCH * KC * std::mem::size_of::<WBlock>()) as *mut f32;
        (
            std::slice::from_raw_parts_mut(w, RCH * KC),
            std::slice::from_raw_parts_mut(acc, floats),
        )
    }
}

/// The result lines of columns `c0..c0 + n`, rows `rows`, requested for writing before a
/// window's products, so that the stores at its end do not each wait for a line from memory.
///
/// # Safety
/// The columns are inside the batch's result.
#[cfg(target_arch = "x86_64")]
unsafe fn prefetch_window(b: &Batch, c0: usize, n: usize, rows: &std::ops::Range<usize>) {
    for c in c0..c0 + n {
        // SAFETY: column c's rows `rows` are inside the result (caller).
        unsafe {
            let col = b.dst.add(c * b.d_nb1 + 4 * rows.start);
            let mut off = 0;
            while off < 4 * rows.len() {
                avx2::prefetch_write(col.add(off));
                off += 64;
            }
        }
    }
}

/// Blocks `ks` of weight rows `rows`, unpacked into `wbs` (row by row, `ks.len()` each);
/// `wide`: for [`run_chunk_wide`]'s kernel (`avx2::to_signed`).
///
/// # Safety
/// The blocks lie inside the batch's weight rows; the CPU has AVX2 (and VNNI if `vnni`).
#[cfg(target_arch = "x86_64")]
unsafe fn unpack_chunk(
    t: DType,
    b: &Batch,
    rows: &std::ops::Range<usize>,
    ks: std::ops::Range<usize>,
    wbs: &mut [WBlock],
    vnni: bool,
    wide: bool,
) {
    let (kn, bsz) = (ks.len(), t.type_size());
    let head = tessera::layout::interleave_head(t).unwrap_or(0);
    for (ri, r) in rows.clone().enumerate() {
        for (j, wb) in wbs[ri * kn..(ri + 1) * kn].iter_mut().enumerate() {
            // SAFETY: block ks.start + j of row r lies inside the row (caller; interleaved:
            // inside its group, its head and its 16 quant bytes where the layout puts them).
            unsafe {
                let i = ks.start + j;
                let (w, qs) = if b.interleaved {
                    let g = b.a.add(r / 8 * 8 * b.a_nb1 + i * 8 * bsz);
                    (g.add(r % 8 * head), g.add(8 * head + r % 8 * (bsz - head)))
                } else {
                    let w = b.a.add(r * b.a_nb1 + i * bsz);
                    (w, w.add(avx2::quants_at(t)))
                };
                avx2::unpack_parts(t, w, qs, wb, vnni);
                if wide && bias(t) != 0 {
                    avx2::to_signed(t, wb);
                }
            }
        }
    }
}

/// [`run_chunk`] for a batch packed as pairs of groups ([`pack_half`]): windows of `GW / 2`
/// pairs, each (row, pair) with nine 16-float accumulators, the kernel on 512-bit registers;
/// every lane of every column goes through the same operations in the same order, so the
/// results are [`run_chunk`]'s.
#[cfg(target_arch = "x86_64")]
unsafe fn run_chunk_wide(
    t: DType,
    k: usize,
    rows: std::ops::Range<usize>,
    b: &Batch,
    scratch: *mut u8,
) {
    const PW: usize = GW / 2;
    let nb = k / 32;
    let nr = rows.len();
    let pairs = b.groups / 2;
    // (mxfp4: two sets of accumulators per (row, pair))
    let slot = if two_acc(t) { 288 } else { 144 };
    // SAFETY: nr ≤ RCH, and PW pairs hold as many floats as GW groups (caller).
    let (wbs, accs) = unsafe { split_scratch(scratch, nr * PW * slot) };
    let mut p0 = 0;
    while p0 < pairs {
        let pn = PW.min(pairs - p0);
        let valid = (b.cols - p0 * 2 * GROUP).min(pn * 2 * GROUP);
        // SAFETY: columns p0·16 .. + valid < cols (caller).
        unsafe { prefetch_window(b, p0 * 2 * GROUP, valid, &rows) };
        let mut k0 = 0;
        while k0 < nb {
            let kn = KC.min(nb - k0);
            // SAFETY: blocks k0..k0 + kn of the rows (caller).
            unsafe { unpack_chunk(t, b, &rows, k0..k0 + kn, wbs, true, true) };
            for q in 0..pn {
                // SAFETY: pair p0 + q < pairs, blocks k0..k0 + kn < nb (caller).
                let pk = unsafe { b.packed.add(((p0 + q) * nb + k0) * PAIR_BYTES) };
                if !two_acc(t) {
                    // two rows a call, sharing each activation load
                    let mut ri = 0;
                    while ri + 1 < nr {
                        // SAFETY: as below, for rows ri and ri + 1.
                        unsafe {
                            let a0 = accs.as_mut_ptr().add((ri * pn + q) * slot);
                            let a1 = accs.as_mut_ptr().add(((ri + 1) * pn + q) * slot);
                            let (w0, w1) = (
                                &wbs[ri * kn..(ri + 1) * kn],
                                &wbs[(ri + 1) * kn..(ri + 2) * kn],
                            );
                            if with_min(t) {
                                avx512::kernel2::<1>(w0, w1, pk, [a0, a1], k0 == 0);
                            } else {
                                avx512::kernel2::<0>(w0, w1, pk, [a0, a1], k0 == 0);
                            }
                        }
                        ri += 2;
                    }
                    if ri < nr {
                        // SAFETY: as below.
                        unsafe {
                            let acc = accs.as_mut_ptr().add((ri * pn + q) * slot);
                            avx512::kernel(t, &wbs[ri * kn..(ri + 1) * kn], 1, pk, acc, k0 == 0);
                        }
                    }
                    continue;
                }
                for ri in 0..nr {
                    let wr = &wbs[ri * kn..(ri + 1) * kn];
                    // SAFETY (this block and the calls below): the accumulators of (ri, q) are
                    // `slot` floats inside `accs`; the blocks passed are packed at the pointers
                    // passed; the CPU has AVX-512 VNNI (caller).
                    unsafe {
                        let acc = accs.as_mut_ptr().add((ri * pn + q) * slot);
                        if two_acc(t) {
                            // as in `run_chunk`
                            let tail = k0 + kn == nb && nb % 2 == 1;
                            let ke = if tail { kn - 1 } else { kn };
                            avx512::kernel(t, &wr[..ke], 2, pk, acc, k0 == 0);
                            let odd = wr.get(1..ke).unwrap_or(&[]);
                            avx512::kernel(t, odd, 2, pk.add(PAIR_BYTES), acc.add(144), k0 == 0);
                            if tail {
                                let pl = pk.add((kn - 1) * PAIR_BYTES);
                                avx512::tail(&wr[kn - 1], pl, acc.add(128));
                            }
                        } else {
                            avx512::kernel(t, wr, 1, pk, acc, k0 == 0);
                        }
                    }
                }
            }
            k0 += kn;
        }
        for q in 0..pn {
            for h in 0..2 {
                let vc = valid.saturating_sub((2 * q + h) * GROUP).min(GROUP);
                if vc == 0 {
                    continue;
                }
                // SAFETY: half h of the accumulators of (ri, q): 9 vectors of 8 floats, 16
                // apart, at (ri·pn + q)·144 + 8h inside `accs`; columns p0·16 + 16q + 8h + c <
                // cols for c < vc, and rows `rows` of them are this caller's.
                unsafe {
                    avx2::finish_store(
                        accs.as_ptr().add(q * slot + 8 * h),
                        16,
                        if two_acc(t) { 144 } else { 0 },
                        pn * slot,
                        nr,
                        with_min(t) || two_acc(t),
                        b.dst
                            .add((p0 * 2 * GROUP + (2 * q + h) * GROUP) * b.d_nb1 + 4 * rows.start),
                        b.d_nb1,
                        vc,
                    );
                }
            }
        }
        p0 += pn;
    }
}

/// Up to this many column groups (24 columns: decoding a batch of sequences), each row is
/// finished in one pass with its accumulators in registers ([`run_few`]); more groups take the
/// windowed, cache-blocked loop, which reuses packed activations across rows.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const FEW_GROUPS: usize = 3;

/// Few column groups: row by row, every group of the row in turn, each over all of K with the
/// accumulators in registers and the weight blocks unpacked on the way (no per-chunk
/// accumulator loads and stores, no unpacked-block scratch). Same per-lane operations in the
/// same order as [`run_chunk`], so the same bits.
#[cfg(target_arch = "x86_64")]
unsafe fn run_few(vnni: u8, t: DType, k: usize, rows: std::ops::Range<usize>, b: &Batch) {
    let nb = k / 32;
    for r in rows {
        for g in 0..b.groups {
            // SAFETY: row r and group g lie inside the batch (caller); the columns written are
            // the group's valid ones, in row r, which this caller owns.
            unsafe {
                let (w, p) = (b.a.add(r * b.a_nb1), b.packed.add(g * nb * PACKED));
                let v = if vnni == 1 {
                    avx2::row_group_vnni(t, w, nb, p)
                } else if vnni == 2 {
                    avx2::row_group_avxvnni(t, w, nb, p)
                } else {
                    avx2::row_group(t, w, nb, p)
                };
                let valid = (b.cols - g * GROUP).min(GROUP);
                for (c, &y) in v.iter().enumerate().take(valid) {
                    *(b.dst.add((g * GROUP + c) * b.d_nb1 + 4 * r) as *mut f32) = y;
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
unsafe fn run_chunk(
    vnni: u8,
    t: DType,
    k: usize,
    rows: std::ops::Range<usize>,
    b: &Batch,
    scratch: *mut u8,
) {
    let nb = k / 32;
    let nr = rows.len();
    // (mxfp4: two sets of accumulators per (row, group))
    let slot = if two_acc(t) { 144 } else { 72 };
    // SAFETY: nr ≤ RCH (caller).
    let (wbs, accs) = unsafe { split_scratch(scratch, nr * GW * slot) };
    let mut g0 = 0;
    while g0 < b.groups {
        let gn = GW.min(b.groups - g0);
        // the window's result lines requested for writing now, so that the stores at its end
        // do not each wait for a line from memory
        let valid = (b.cols - g0 * GROUP).min(gn * GROUP);
        // SAFETY: columns g0·8 .. + valid < cols (caller).
        unsafe { prefetch_window(b, g0 * GROUP, valid, &rows) };
        let mut k0 = 0;
        while k0 < nb {
            let kn = KC.min(nb - k0);
            // the chunk's rows unpacked once for every group of the window
            // SAFETY: blocks k0..k0 + kn of the rows (caller).
            unsafe { unpack_chunk(t, b, &rows, k0..k0 + kn, wbs, vnni != 0, false) };
            // one group's K chunk (kn·576 bytes, in L1) against every row of the chunk
            for g in 0..gn {
                // SAFETY: group g0 + g < groups, blocks k0..k0 + kn < nb (caller).
                let pk = unsafe { b.packed.add(((g0 + g) * nb + k0) * PACKED) };
                for ri in 0..nr {
                    let wr = &wbs[ri * kn..(ri + 1) * kn];
                    // SAFETY: the accumulators of (ri, g) are `slot` floats inside `accs`.
                    let acc = unsafe { accs.as_mut_ptr().add((ri * gn + g) * slot) };
                    let kernel = |wr: &[WBlock], pk: *const u8, acc: *mut f32, step: usize| {
                        // SAFETY: wr's blocks (every step-th) are packed at pk, 72 floats at
                        // acc; the CPU runs the kernel `vnni` names (caller).
                        unsafe {
                            if vnni == 1 {
                                avx2::kernel_vnni(t, wr, step, pk, acc, k0 == 0);
                            } else if vnni == 2 {
                                avx2::kernel_avxvnni(t, wr, step, pk, acc, k0 == 0);
                            } else {
                                avx2::kernel(t, wr, step, pk, acc, k0 == 0);
                            }
                        }
                    };
                    if two_acc(t) {
                        // even blocks into the first set, odd ones into the second; K chunks
                        // are an even number of blocks, so parity within the chunk is global
                        let tail = k0 + kn == nb && nb % 2 == 1;
                        let ke = if tail { kn - 1 } else { kn };
                        kernel(&wr[..ke], pk, acc, 2);
                        // SAFETY: block 1 of the chunk, the second set: inside pk's and acc's
                        // (an empty slice reads nothing).
                        unsafe {
                            kernel(wr.get(1..ke).unwrap_or(&[]), pk.add(PACKED), acc.add(72), 2)
                        };
                        if tail {
                            // SAFETY: the chunk's last block packed at pk + (kn − 1)·PACKED; the
                            // first set's ninth vector at acc + 64.
                            unsafe {
                                avx2::tail(
                                    vnni,
                                    &wr[kn - 1],
                                    pk.add((kn - 1) * PACKED),
                                    acc.add(64),
                                )
                            };
                        }
                    } else {
                        kernel(wr, pk, acc, 1);
                    }
                }
            }
            k0 += kn;
        }
        // the lanes of each column summed in ggml's hsum order, then q4_1's Σ m·s; eight rows
        // at a time transposed in registers and written column by column (a column's rows are
        // contiguous in the result)
        for g in 0..gn {
            let vc = valid.saturating_sub(g * GROUP).min(GROUP);
            // SAFETY: the accumulators of (ri, g) for ri < nr lie inside `accs`, gn·slot floats
            // apart; columns g0·8 + g·8 + c < cols for c < vc, and rows `rows` of them are this
            // caller's.
            unsafe {
                avx2::finish_store(
                    accs.as_ptr().add(g * slot),
                    8,
                    if two_acc(t) { 72 } else { 0 },
                    gn * slot,
                    nr,
                    with_min(t) || two_acc(t),
                    b.dst
                        .add((g0 * GROUP + g * GROUP) * b.d_nb1 + 4 * rows.start),
                    b.d_nb1,
                    vc,
                );
            }
        }
        g0 += gn;
    }
}

#[cfg(target_arch = "x86_64")]
// the `unsafe` blocks around intrinsics date from a minimum Rust version before they were safe
#[allow(unused_unsafe)]
mod avx2 {
    use std::arch::x86_64::*;

    use tessera::DType;

    use super::{WBlock, OFF_AUX, OFF_D, OFF_S, PACKED};
    use crate::ops::qdot::avx2::dpbusd;

    pub use crate::ops::qdot::avx2::available;
    use crate::ops::qdot::avx2::{f16, transpose8};

    /// The eight columns' results from their accumulators: lanes summed in ggml's
    /// `hsum_float_8` order ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), then q4_1's Σ m·s.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn finish(acc: *const f32, q41: bool) -> [f32; 8] {
        // SAFETY: forwarded.
        unsafe {
            let mut out = [0f32; 8];
            _mm256_storeu_ps(out.as_mut_ptr(), finish_v(acc, 8, 0, q41));
            out
        }
    }

    /// `finish` for the accumulators of `nr` rows (`stride` floats apart from row to row, the
    /// nine vectors of a row `ls` floats apart: 8, or 16 for a half of a pair; `second`: where
    /// mxfp4's second set of eight lane vectors starts, added lane by lane first, or 0), stored
    /// to the first `vc` of the eight result columns at `dst` (`d_nb1` bytes apart, the rows
    /// contiguous f32): eight rows at a time transposed in registers, one store per column.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn finish_store(
        acc: *const f32,
        ls: usize,
        second: usize,
        stride: usize,
        nr: usize,
        q41: bool,
        dst: *mut u8,
        d_nb1: usize,
        vc: usize,
    ) {
        // SAFETY: 9 vectors of 8 readable floats, ls apart, at acc + ri·stride for ri < nr; nr writable f32 at
        // dst + c·d_nb1 for c < vc (caller).
        unsafe {
            let mut r0 = 0;
            while r0 < nr {
                let n8 = (nr - r0).min(8);
                // (plain loops, not closures: a closure would be compiled without AVX and
                // called, with a `vzeroupper` on every return)
                let mut v = [_mm256_setzero_ps(); 8];
                for (j, vj) in v.iter_mut().enumerate().take(n8) {
                    *vj = finish_v(acc.add((r0 + j) * stride), ls, second, q41);
                }
                let cols = transpose8(v);
                for (c, col) in cols.iter().enumerate().take(vc) {
                    let o = (dst.add(c * d_nb1) as *mut f32).add(r0);
                    if n8 == 8 {
                        _mm256_storeu_ps(o, *col);
                    } else {
                        let mut t = [0f32; 8];
                        _mm256_storeu_ps(t.as_mut_ptr(), *col);
                        std::ptr::copy_nonoverlapping(t.as_ptr(), o, n8);
                    }
                }
                r0 += n8;
            }
        }
    }

    /// Asks for the line at `p` ahead of writing it (a hint: never faults).
    #[inline(always)]
    pub unsafe fn prefetch_write(p: *const u8) {
        // SAFETY: prefetches do not fault.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) }
    }

    #[inline(always)]
    unsafe fn finish_v(acc: *const f32, ls: usize, second: usize, q41: bool) -> __m256 {
        // SAFETY: 9 vectors of 8 readable floats, ls apart, at acc, and 8 at acc + second if
        // second > 0 (caller).
        unsafe {
            let mut a = [_mm256_setzero_ps(); 9];
            for (i, ai) in a.iter_mut().enumerate() {
                let v = _mm256_loadu_ps(acc.add(ls * i));
                *ai = if second > 0 && i < 8 {
                    // ggml's _mm256_add_ps(accum1, accum2)
                    _mm256_add_ps(v, _mm256_loadu_ps(acc.add(second + ls * i)))
                } else {
                    v
                };
            }
            let r0 = _mm256_add_ps(a[0], a[4]);
            let r1 = _mm256_add_ps(a[1], a[5]);
            let r2 = _mm256_add_ps(a[2], a[6]);
            let r3 = _mm256_add_ps(a[3], a[7]);
            let mut v = _mm256_add_ps(_mm256_add_ps(r0, r2), _mm256_add_ps(r1, r3));
            if q41 {
                v = _mm256_add_ps(v, a[8]);
            }
            v
        }
    }

    /// One weight block at `w` unpacked; `vnni`: for a kernel with `vpdpbusd` (q8_0 and
    /// iq4_nl then as value + 128 in `q`, instead of sign masks and magnitudes).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn unpack(t: DType, w: *const u8, o: &mut WBlock, vnni: bool) {
        // SAFETY: forwarded (the block's quants at their offset).
        unsafe { unpack_parts(t, w, w.add(quants_at(t)), o, vnni) }
    }

    /// Where q4_0's, q4_1's, q5_0's, q5_1's, q8_0's, iq4_nl's and mxfp4's quants start in their
    /// block (0 for the others, whose blocks [`unpack_parts`] reads from `w` alone).
    pub fn quants_at(t: DType) -> usize {
        match t {
            DType::Q4_0 | DType::Q8_0 | DType::IQ4NL => 2,
            DType::Q4_1 => 4,
            DType::Q5_0 => 6,
            DType::Q5_1 => 8,
            DType::MXFP4 => 1,
            _ => 0,
        }
    }

    /// [`unpack`] of a block whose head (its scales, and q5's `qh`) is at `w` and, for q4_0,
    /// q4_1, q5_0, q5_1, q8_0, iq4_nl and mxfp4, whose quants are at `qs` (elsewhere with
    /// interleaved rows).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn unpack_parts(t: DType, w: *const u8, qs: *const u8, o: &mut WBlock, vnni: bool) {
        // SAFETY: one block of t at w, its quants at qs (caller).
        unsafe {
            let qp = o.q.as_mut_ptr() as *mut __m256i;
            match t {
                DType::Q4_0 | DType::Q4_1 => {
                    let q = _mm_loadu_si128(qs as *const __m128i);
                    let m4 = _mm_set1_epi8(15);
                    let lo = _mm_and_si128(q, m4);
                    let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), m4);
                    _mm256_storeu_si256(qp, _mm256_set_m128i(hi, lo));
                    o.d = f16(w);
                    o.m = if t == DType::Q4_1 { f16(w.add(2)) } else { 0.0 };
                }
                DType::Q5_0 | DType::Q5_1 => {
                    let qh = if t == DType::Q5_0 { 2 } else { 4 };
                    let q = _mm_loadu_si128(qs as *const __m128i);
                    let m4 = _mm_set1_epi8(15);
                    let lo = _mm_and_si128(q, m4);
                    let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), m4);
                    // the fifth bits: bit e of qh to byte e, as 16
                    let h = (w.add(qh) as *const i32).read_unaligned();
                    let spread = _mm256_shuffle_epi8(
                        _mm256_set1_epi32(h),
                        _mm256_set_epi64x(
                            0x0303_0303_0303_0303,
                            0x0202_0202_0202_0202,
                            0x0101_0101_0101_0101,
                            0,
                        ),
                    );
                    let sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
                    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel);
                    let fifth = _mm256_and_si256(set, _mm256_set1_epi8(16));
                    _mm256_storeu_si256(qp, _mm256_or_si256(_mm256_set_m128i(hi, lo), fifth));
                    o.d = f16(w);
                    o.m = if t == DType::Q5_1 { f16(w.add(2)) } else { 0.0 };
                }
                DType::Q8_0 | DType::IQ4NL => {
                    // signed values (iq4_nl: its codebook's), kept as sign masks and magnitudes
                    let q = if t == DType::Q8_0 {
                        _mm256_loadu_si256(qs as *const __m256i)
                    } else {
                        crate::ops::qdot::avx2::iq4_values(qs)
                    };
                    if vnni {
                        _mm256_storeu_si256(qp, _mm256_xor_si256(q, _mm256_set1_epi8(-128)));
                    } else {
                        _mm256_storeu_si256(qp, _mm256_cmpgt_epi8(_mm256_setzero_si256(), q));
                        let aq = o.aq.as_mut_ptr() as *mut __m256i;
                        _mm256_storeu_si256(aq, _mm256_sign_epi8(q, q));
                    }
                    o.d = f16(w);
                    o.m = 0.0;
                }
                DType::MXFP4 => {
                    // ggml's kvalues_fp4 (the E2M1 values doubled) and half the E8M0 scale,
                    // then as iq4_nl's values
                    let table = _mm_loadu_si128(
                        crate::ops::qdot_fp::KVALUES_FP4.as_ptr() as *const __m128i
                    );
                    let c = _mm_loadu_si128(qs as *const __m128i);
                    let m4 = _mm_set1_epi8(15);
                    let lo = _mm_shuffle_epi8(table, _mm_and_si128(c, m4));
                    let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16::<4>(c), m4));
                    let q = _mm256_set_m128i(hi, lo);
                    if vnni {
                        _mm256_storeu_si256(qp, _mm256_xor_si256(q, _mm256_set1_epi8(-128)));
                    } else {
                        _mm256_storeu_si256(qp, _mm256_cmpgt_epi8(_mm256_setzero_si256(), q));
                        let aq = o.aq.as_mut_ptr() as *mut __m256i;
                        _mm256_storeu_si256(aq, _mm256_sign_epi8(q, q));
                    }
                    o.d = crate::ops::qdot_fp::e8m0_half(*w);
                    o.m = 0.0;
                }
                _ => unreachable!("checked by supported"),
            }
        }
    }

    /// A block unpacked for VNNI (`unpack(.., true)`) of a type with a bias, rewritten for the
    /// AVX-512 pair kernel: the signed values in `q` (codes − bias; q8_0, iq4_nl and mxfp4
    /// back from value + 128) and −128 times the sum of each lane's four values in `aq`, eight
    /// i32 (the kernel multiplies activations + 128 by the values and starts from these).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn to_signed(t: DType, o: &mut WBlock) {
        // SAFETY: 32 bytes at each of q and aq.
        unsafe {
            let qp = o.q.as_mut_ptr() as *mut __m256i;
            let q = _mm256_loadu_si256(qp);
            let v = match t {
                DType::Q4_0 | DType::Q5_0 => {
                    _mm256_sub_epi8(q, _mm256_set1_epi8(super::bias(t) as i8))
                }
                _ => _mm256_xor_si256(q, _mm256_set1_epi8(-128)),
            };
            _mm256_storeu_si256(qp, v);
            // lane sums of four signed bytes (|Σ| ≤ 512: no saturation in the i16 pairs)
            let pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), v);
            let sums = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
            let start = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<7>(sums));
            _mm256_storeu_si256(o.aq.as_mut_ptr() as *mut __m256i, start);
        }
    }

    /// Calls `f::<T, V>(args)` with the kernel variant T of type `t`: 0 for the types whose codes
    /// carry a bias (q4_0, q5_0), 1 for q4_1, 2 for q8_0, 3 for q5_1.
    macro_rules! by_variant {
        ($t:expr, $f:ident($($arg:expr),*)) => {
            match $t {
                DType::Q4_0 | DType::Q5_0 => $f::<0, V>($($arg),*),
                DType::Q4_1 => $f::<1, V>($($arg),*),
                DType::Q8_0 | DType::IQ4NL | DType::MXFP4 => $f::<2, V>($($arg),*),
                DType::Q5_1 => $f::<3, V>($($arg),*),
                _ => unreachable!("checked by supported"),
            }
        };
    }

    /// One row (`nb` blocks of `t` at `w`) against one packed group of `nb` blocks at `p`,
    /// start to end: `kernel`'s arithmetic with the accumulators kept in registers, then
    /// `finish`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn row_group(t: DType, w: *const u8, nb: usize, p: *const u8) -> [f32; 8] {
        // SAFETY: forwarded.
        unsafe { row_group_in::<0>(t, w, nb, p) }
    }

    /// [`row_group`] with AVX-512 VNNI (the same integers, so the same results).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn row_group_vnni(t: DType, w: *const u8, nb: usize, p: *const u8) -> [f32; 8] {
        // SAFETY: forwarded.
        unsafe { row_group_in::<1>(t, w, nb, p) }
    }

    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    pub unsafe fn row_group_avxvnni(t: DType, w: *const u8, nb: usize, p: *const u8) -> [f32; 8] {
        // SAFETY: forwarded.
        unsafe { row_group_in::<2>(t, w, nb, p) }
    }

    #[inline(always)]
    unsafe fn row_group_in<const V: u8>(
        t: DType,
        w: *const u8,
        nb: usize,
        p: *const u8,
    ) -> [f32; 8] {
        // SAFETY: forwarded (nb blocks at w and p).
        unsafe { by_variant!(t, row_body(t, w, nb, p)) }
    }

    #[inline(always)]
    unsafe fn row_body<const T: u8, const V: u8>(
        t: DType,
        w: *const u8,
        nb: usize,
        p: *const u8,
    ) -> [f32; 8] {
        // SAFETY: as `row_group`.
        unsafe {
            let bsz = t.type_size();
            let mut acc = [0f32; 72];
            let mut wb = WBlock {
                q: [0; 32],
                aq: [0; 32],
                d: 0.0,
                m: 0.0,
                _pad: [0; 6],
            };
            let ones = _mm256_set1_epi16(1);
            let mut a = [_mm256_setzero_ps(); 8];
            let mut summs = _mm256_setzero_ps();
            for j in 0..nb {
                unpack(t, w.add(j * bsz), &mut wb, V != 0);
                block_step::<T, V>(&wb, p.add(j * PACKED), ones, &mut a, &mut summs);
            }
            for (i, ai) in a.iter().enumerate() {
                _mm256_storeu_ps(acc.as_mut_ptr().add(8 * i), *ai);
            }
            _mm256_storeu_ps(acc.as_mut_ptr().add(64), summs);
            finish(acc.as_ptr(), T == 1 || T == 3)
        }
    }

    /// One weight block against one packed block (at `pb`): the block's scale products, q4_1's
    /// and q5_1's Σ m·s, then the eight lanes — the per-block step of both `kernel` and
    /// `row_group`.
    #[inline(always)]
    unsafe fn block_step<const T: u8, const V: u8>(
        wb: &WBlock,
        pb: *const u8,
        ones: __m256i,
        a: &mut [__m256; 8],
        summs: &mut __m256,
    ) {
        // SAFETY: one packed block at pb (caller).
        unsafe {
            let xd = _mm256_loadu_ps(pb.add(OFF_D) as *const f32);
            let dd = _mm256_mul_ps(_mm256_set1_ps(wb.d), xd);
            if T == 1 || T == 3 {
                let xs = _mm256_loadu_ps(pb.add(OFF_S) as *const f32);
                *summs = _mm256_fmadd_ps(_mm256_set1_ps(wb.m), xs, *summs);
            }
            for (i, ai) in a.iter_mut().enumerate() {
                *ai = lane_step::<T, V>(wb, pb, i, dd, ones, *ai);
            }
        }
    }

    /// Lane `i` of one block for the eight columns: the exact integer sum of the lane's four
    /// products per column, then one FMA into the lane's accumulator.
    #[inline(always)]
    unsafe fn lane_step<const T: u8, const V: u8>(
        wb: &WBlock,
        pb: *const u8,
        i: usize,
        dd: __m256,
        ones: __m256i,
        ai: __m256,
    ) -> __m256 {
        // SAFETY: one packed block at pb (caller).
        unsafe {
            // (q5_1's kernel multiplies in the other order; the fused product is the same)
            _mm256_fmadd_ps(
                dd,
                _mm256_cvtepi32_ps(lane_ints::<T, V>(wb, pb, i, ones)),
                ai,
            )
        }
    }

    /// The exact integer sums of lane `i`'s four products for the eight columns.
    #[inline(always)]
    unsafe fn lane_ints<const T: u8, const V: u8>(
        wb: &WBlock,
        pb: *const u8,
        i: usize,
        ones: __m256i,
    ) -> __m256i {
        // SAFETY: one packed block at pb (caller).
        unsafe {
            let x = _mm256_loadu_si256(pb.add(32 * i) as *const __m256i);
            let wv = _mm256_set1_epi32((wb.q.as_ptr().add(4 * i) as *const i32).read_unaligned());
            // −bias·Σx of the lane's four activations per column (q4_0, q5_0; q8_0 and iq4_nl
            // with VNNI)
            let aux = || _mm256_loadu_si256(pb.add(OFF_AUX + 32 * i) as *const __m256i);
            if V != 0 {
                // q4_0 / q5_0 (T 0), and q8_0 / iq4_nl (T 2) stored as w + 128: from the
                // packed −bias·Σ x, Σ (w + bias)·x − bias·Σ x = Σ w·x exactly. For q8_0 that is
                // one instruction where ggml's |w|·sign(x, w) takes three, with the same p_i
                // wherever x ≠ −128, which q8_0's quantizer never writes (w = −128 is exact in
                // both).
                let start = if T == 0 || T == 2 {
                    aux()
                } else {
                    _mm256_setzero_si256()
                };
                dpbusd::<V>(start, wv, x)
            } else if T == 2 {
                // ggml's |w|·sign(x, w) with the sign applied as (x ^ m) − m, m the weights'
                // sign masks (`wv` here): two simple ALU operations instead of `vpsignb`, which
                // competes with the multiplies here (2.3 against 2.5-2.8 cycles a lane step in
                // L1, same process). w = 0 gives |w| = 0 either way; x = −128 stays −128 in both.
                let aw =
                    _mm256_set1_epi32((wb.aq.as_ptr().add(4 * i) as *const i32).read_unaligned());
                let sx = _mm256_sub_epi8(_mm256_xor_si256(x, wv), wv);
                _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones)
            } else {
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, x), ones);
                if T == 0 {
                    _mm256_add_epi32(p, aux())
                } else {
                    p
                }
            }
        }
    }

    /// Blocks 0, step, 2·step, … of `wbs` (one row's) against one packed group's matching
    /// blocks (block j at `p + j·PACKED`), accumulated into the nine vectors at `acc` (eight
    /// lanes of ggml's accumulator, then q4_1's Σ m·s); `fresh`: the accumulators start from
    /// zero (the first K chunk) instead of from `acc`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn kernel(
        t: DType,
        wbs: &[WBlock],
        step: usize,
        p: *const u8,
        acc: *mut f32,
        fresh: bool,
    ) {
        // SAFETY: forwarded.
        unsafe { kernel_in::<0>(t, wbs, step, p, acc, fresh) }
    }

    /// [`kernel`] with AVX-512 VNNI (the same integers, so the same results).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn kernel_vnni(
        t: DType,
        wbs: &[WBlock],
        step: usize,
        p: *const u8,
        acc: *mut f32,
        fresh: bool,
    ) {
        // SAFETY: forwarded.
        unsafe { kernel_in::<1>(t, wbs, step, p, acc, fresh) }
    }

    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    pub unsafe fn kernel_avxvnni(
        t: DType,
        wbs: &[WBlock],
        step: usize,
        p: *const u8,
        acc: *mut f32,
        fresh: bool,
    ) {
        // SAFETY: forwarded.
        unsafe { kernel_in::<2>(t, wbs, step, p, acc, fresh) }
    }

    #[inline(always)]
    unsafe fn kernel_in<const V: u8>(
        t: DType,
        wbs: &[WBlock],
        step: usize,
        p: *const u8,
        acc: *mut f32,
        fresh: bool,
    ) {
        // SAFETY: forwarded (the blocks taken from wbs packed at p; 72 floats at acc).
        unsafe { by_variant!(t, body(wbs, step, p, acc, fresh)) }
    }

    /// mxfp4's odd last block (`wb`, packed at `p`) for the eight columns: `d·Σ` of its 32
    /// products, rounded once, stored as the eight floats at `out` (ggml's `sumf += d *
    /// (sumi1 + sumi2)`, added after the horizontal sum). `vnni` as for the kernels.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn tail(vnni: u8, wb: &WBlock, p: *const u8, out: *mut f32) {
        // SAFETY: forwarded; the VNNI variants only where the caller found the instructions.
        unsafe {
            match vnni {
                1 => tail_vnni(wb, p, out),
                2 => tail_avxvnni(wb, p, out),
                _ => tail_in::<0>(wb, p, out),
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn tail_vnni(wb: &WBlock, p: *const u8, out: *mut f32) {
        // SAFETY: forwarded.
        unsafe { tail_in::<1>(wb, p, out) }
    }

    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    unsafe fn tail_avxvnni(wb: &WBlock, p: *const u8, out: *mut f32) {
        // SAFETY: forwarded.
        unsafe { tail_in::<2>(wb, p, out) }
    }

    #[inline(always)]
    unsafe fn tail_in<const V: u8>(wb: &WBlock, p: *const u8, out: *mut f32) {
        // SAFETY: one packed block at p, 8 writable floats at out (caller).
        unsafe {
            let ones = _mm256_set1_epi16(1);
            let mut sum = _mm256_setzero_si256();
            for i in 0..8 {
                sum = _mm256_add_epi32(sum, lane_ints::<2, V>(wb, p, i, ones));
            }
            let xd = _mm256_loadu_ps(p.add(OFF_D) as *const f32);
            let dd = _mm256_mul_ps(_mm256_set1_ps(wb.d), xd);
            _mm256_storeu_ps(out, _mm256_mul_ps(dd, _mm256_cvtepi32_ps(sum)));
        }
    }

    #[inline(always)]
    unsafe fn body<const T: u8, const V: u8>(
        wbs: &[WBlock],
        step: usize,
        p: *const u8,
        acc: *mut f32,
        fresh: bool,
    ) {
        // SAFETY: as `kernel`.
        unsafe {
            let ones = _mm256_set1_epi16(1);
            let load = |i: usize| {
                if fresh {
                    _mm256_setzero_ps()
                } else {
                    _mm256_loadu_ps(acc.add(8 * i))
                }
            };
            let mut a: [__m256; 8] = std::array::from_fn(load);
            let mut summs = load(8);
            for j in (0..wbs.len()).step_by(step) {
                block_step::<T, V>(&wbs[j], p.add(j * PACKED), ones, &mut a, &mut summs);
            }
            for (i, ai) in a.iter().enumerate() {
                _mm256_storeu_ps(acc.add(8 * i), *ai);
            }
            _mm256_storeu_ps(acc.add(64), summs);
        }
    }
}

/// The kernel of [`run_chunk_wide`]: `avx2::kernel`'s VNNI arithmetic on a pair of groups,
/// sixteen columns to a 512-bit register (the two groups' 32-byte pieces side by side).
#[cfg(target_arch = "x86_64")]
// the `unsafe` blocks around intrinsics date from a minimum Rust version before they were safe
#[allow(unused_unsafe)]
mod avx512 {
    use std::arch::x86_64::*;

    use tessera::DType;

    use super::{WBlock, PAIR_BYTES, WIDE_OFF_D, WIDE_OFF_S};

    /// Lane `i` of a block's 32 weight bytes (or of its eight i32 in `aq`), in all 16 lanes.
    #[inline(always)]
    unsafe fn bcast(b: &[u8; 32], i: usize) -> __m512i {
        // SAFETY: i < 8, so the four bytes lie inside b.
        unsafe { _mm512_set1_epi32((b.as_ptr().add(4 * i) as *const i32).read_unaligned()) }
    }

    /// The 16 bytes at `p` in all four 128-bit lanes (`vbroadcasti32x4`), a load the compiler
    /// cannot see through: it would otherwise fold each lane shuffle of the result back into a
    /// broadcast load of its own.
    ///
    /// # Safety
    /// 16 readable bytes at `p`; the CPU has AVX-512 F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn bcast128(p: *const u8) -> __m512i {
        let v: __m512i;
        // SAFETY: reads the 16 bytes at p (caller), registers otherwise.
        unsafe {
            std::arch::asm!(
                "vbroadcasti32x4 {v}, xmmword ptr [{p}]",
                v = out(zmm_reg) v,
                p = in(reg) p,
                options(pure, readonly, nostack, preserves_flags),
            )
        };
        v
    }

    /// Dword `j` (< 4) of every 128-bit lane of `v`, in all of that lane's dwords.
    #[inline(always)]
    unsafe fn lane(v: __m512i, j: usize) -> __m512i {
        // SAFETY: the caller's target features (AVX-512 F).
        unsafe {
            match j {
                0 => _mm512_shuffle_epi32::<0x00>(v),
                1 => _mm512_shuffle_epi32::<0x55>(v),
                2 => _mm512_shuffle_epi32::<0xAA>(v),
                _ => _mm512_shuffle_epi32::<0xFF>(v),
            }
        }
    }

    /// Blocks 0, step, 2·step, … of `wbs` (one row's) against one packed pair's matching
    /// blocks (block j at `p + j·PAIR_BYTES`), accumulated into the nine 16-float vectors at
    /// `acc`; `fresh`: starting from zero instead of from `acc`.
    ///
    /// # Safety
    /// The blocks taken are packed at `p`, 144 floats at `acc`; the CPU has AVX-512 F/BW/VL
    /// and VNNI.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn kernel(
        t: DType,
        wbs: &[WBlock],
        step: usize,
        p: *const u8,
        acc: *mut f32,
        fresh: bool,
    ) {
        // SAFETY: forwarded.
        unsafe {
            match t {
                DType::Q4_0 | DType::Q5_0 => body::<0>(wbs, step, p, acc, fresh),
                DType::Q4_1 => body::<1>(wbs, step, p, acc, fresh),
                DType::Q8_0 | DType::IQ4NL | DType::MXFP4 => body::<2>(wbs, step, p, acc, fresh),
                DType::Q5_1 => body::<3>(wbs, step, p, acc, fresh),
                _ => unreachable!("checked by supported"),
            }
        }
    }

    /// [`kernel`] (step 1) for two rows' blocks `w0`, `w1` (of equal length) at once, into
    /// their accumulators `acc`: each activation load serves both rows; every lane of every
    /// column goes through the same operations as in `kernel`. `T`: 1 for q4_1 / q5_1 (codes
    /// unsigned, Σ m·s), 0 for the types with a bias (q4_0, q5_0, q8_0, iq4_nl).
    ///
    /// # Safety
    /// As `kernel`, for both rows.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn kernel2<const T: u8>(
        w0: &[WBlock],
        w1: &[WBlock],
        p: *const u8,
        acc: [*mut f32; 2],
        fresh: bool,
    ) {
        // SAFETY: as documented.
        unsafe {
            let load = |r: usize, i: usize| {
                if fresh {
                    _mm512_setzero_ps()
                } else {
                    _mm512_loadu_ps(acc[r].add(16 * i))
                }
            };
            let mut a0: [__m512; 8] = std::array::from_fn(|i| load(0, i));
            let mut a1: [__m512; 8] = std::array::from_fn(|i| load(1, i));
            let mut s0 = load(0, 8);
            let mut s1 = load(1, 8);
            let n = w0.len().min(w1.len());
            for j in 0..n {
                let (b0, b1) = (&w0[j], &w1[j]);
                let pb = p.add(j * PAIR_BYTES);
                let xd = _mm512_loadu_ps(pb.add(WIDE_OFF_D) as *const f32);
                let dd0 = _mm512_mul_ps(_mm512_set1_ps(b0.d), xd);
                let dd1 = _mm512_mul_ps(_mm512_set1_ps(b1.d), xd);
                if T == 1 {
                    let xs = _mm512_loadu_ps(pb.add(WIDE_OFF_S) as *const f32);
                    s0 = _mm512_fmadd_ps(_mm512_set1_ps(b0.m), xs, s0);
                    s1 = _mm512_fmadd_ps(_mm512_set1_ps(b1.m), xs, s1);
                }
                // the start values: each row's eight lane sums as two 128-bit halves in all
                // four lanes, lane i picked by an in-lane `vpshufd` (Zen 5 runs it beside the
                // conversions, off the two pipes `vpdpbusd` and the FMA share) instead of a
                // broadcast load per lane: 5 -> 3.5 loads per (row pair, lane), which bounded the
                // loop there
                let halves =
                    |b: &WBlock| [bcast128(b.aq.as_ptr()), bcast128(b.aq.as_ptr().add(16))];
                let (h0, h1) = if T == 0 {
                    (halves(b0), halves(b1))
                } else {
                    let z = _mm512_setzero_si512();
                    ([z, z], [z, z])
                };
                for i in 0..8 {
                    let x = _mm512_loadu_si512(pb.add(64 * i) as *const _);
                    let (p0, p1) = if T == 0 {
                        (
                            _mm512_dpbusd_epi32(lane(h0[i / 4], i % 4), x, bcast(&b0.q, i)),
                            _mm512_dpbusd_epi32(lane(h1[i / 4], i % 4), x, bcast(&b1.q, i)),
                        )
                    } else {
                        let z = _mm512_setzero_si512();
                        (
                            _mm512_dpbusd_epi32(z, bcast(&b0.q, i), x),
                            _mm512_dpbusd_epi32(z, bcast(&b1.q, i), x),
                        )
                    };
                    a0[i] = _mm512_fmadd_ps(dd0, _mm512_cvtepi32_ps(p0), a0[i]);
                    a1[i] = _mm512_fmadd_ps(dd1, _mm512_cvtepi32_ps(p1), a1[i]);
                }
            }
            for i in 0..8 {
                _mm512_storeu_ps(acc[0].add(16 * i), a0[i]);
                _mm512_storeu_ps(acc[1].add(16 * i), a1[i]);
            }
            _mm512_storeu_ps(acc[0].add(128), s0);
            _mm512_storeu_ps(acc[1].add(128), s1);
        }
    }

    /// `avx2::tail` for a pair of groups: mxfp4's odd last block `d·Σ`, sixteen columns, at
    /// `out`.
    ///
    /// # Safety
    /// One pair block at `p`, 16 writable floats at `out`; the CPU has AVX-512 F/BW/VL and
    /// VNNI.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn tail(wb: &WBlock, p: *const u8, out: *mut f32) {
        // SAFETY: as documented.
        unsafe {
            let mut sum = _mm512_setzero_si512();
            for i in 0..8 {
                let x = _mm512_loadu_si512(p.add(64 * i) as *const _);
                let s = _mm512_dpbusd_epi32(bcast(&wb.aq, i), x, bcast(&wb.q, i));
                sum = _mm512_add_epi32(sum, s);
            }
            let xd = _mm512_loadu_ps(p.add(WIDE_OFF_D) as *const f32);
            let dd = _mm512_mul_ps(_mm512_set1_ps(wb.d), xd);
            _mm512_storeu_ps(out, _mm512_mul_ps(dd, _mm512_cvtepi32_ps(sum)));
        }
    }

    #[inline(always)]
    unsafe fn body<const T: u8>(
        wbs: &[WBlock],
        step: usize,
        p: *const u8,
        acc: *mut f32,
        fresh: bool,
    ) {
        // SAFETY: as `kernel`.
        unsafe {
            let load = |i: usize| {
                if fresh {
                    _mm512_setzero_ps()
                } else {
                    _mm512_loadu_ps(acc.add(16 * i))
                }
            };
            let mut a: [__m512; 8] = std::array::from_fn(load);
            let mut summs = load(8);
            for j in (0..wbs.len()).step_by(step) {
                let wb = &wbs[j];
                let pb = p.add(j * PAIR_BYTES);
                // the same float steps as the AVX2 kernel's `block_step` and `lane_step`
                // (VNNI), on the same integers
                let xd = _mm512_loadu_ps(pb.add(WIDE_OFF_D) as *const f32);
                let dd = _mm512_mul_ps(_mm512_set1_ps(wb.d), xd);
                if T == 1 || T == 3 {
                    let xs = _mm512_loadu_ps(pb.add(WIDE_OFF_S) as *const f32);
                    summs = _mm512_fmadd_ps(_mm512_set1_ps(wb.m), xs, summs);
                }
                // the start values' halves, as in `kernel2`
                let h = if T == 0 || T == 2 {
                    [bcast128(wb.aq.as_ptr()), bcast128(wb.aq.as_ptr().add(16))]
                } else {
                    [_mm512_setzero_si512(); 2]
                };
                for (i, ai) in a.iter_mut().enumerate() {
                    let x = _mm512_loadu_si512(pb.add(64 * i) as *const _);
                    let s = if T == 0 || T == 2 {
                        // (x + 128)·v from −128·Σv: Σx·v, the integer the codes' bias gives
                        _mm512_dpbusd_epi32(lane(h[i / 4], i % 4), x, bcast(&wb.q, i))
                    } else {
                        // unsigned codes times signed activations, as on 256 bits
                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), bcast(&wb.q, i), x)
                    };
                    *ai = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(s), *ai);
                }
            }
            for (i, ai) in a.iter().enumerate() {
                _mm512_storeu_ps(acc.add(16 * i), *ai);
            }
            _mm512_storeu_ps(acc.add(128), summs);
        }
    }
}
