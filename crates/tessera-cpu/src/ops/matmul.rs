//! mul_mat for float weights: `dst[m, n] = Σ_k a[k, m] · b[k, n]` (ggml's `mul_mat(a, b) = b·aᵀ`).
//!
//! Two paths:
//! - **mat-vec** (up to `MV_MAX_N` columns of `b`, dense rows): every thread streams its
//!   contiguous range of `a`'s rows once and computes all the columns from each load (f16/bf16
//!   rows are converted in registers, never expanded in memory); one column takes four rows a
//!   call, prefetched 2 KiB ahead, with each row's bits unchanged (`avx2::dot_rows4`).
//! - **GEMM**: a cache-blocked product with packed panels, GotoBLAS style. A block of `a`
//!   (`MC` rows × `KC`) is packed into panels of `NR` rows interleaved by k — converting f16/bf16
//!   to f32 while packing — and a block of `b` (`NC` columns × `KC`) into panels of `MR`
//!   columns; a register micro-kernel computes an `MR × NR` tile of the output from one panel of
//!   each. Work is split over output tiles (both output dimensions and the broadcast batch dims).
//!
//! The AVX2 kernels define the arithmetic: AVX-512's GEMM (two panels in 16-lane registers)
//! and aarch64's NEON kernels (`neon`) compute it lane for lane, so every ISA but the portable
//! path gives the same bits. Quantized weights: `matmul_quant`.

use std::ops::Range;

use tessera::{DType, Result, Tensor};

use crate::exec::NodeCtx;
use crate::simd::Isa;

/// Output columns (of `b`) per micro-tile: broadcast operand.
pub const MR: usize = 6;
/// Output rows (of `a`) per micro-tile: the vector operand, two 8-lane registers.
pub const NR: usize = 16;
/// Depth of a packed block.
pub const KC: usize = 256;
/// Most rows of `a` a thread packs at once (a multiple of `NR`): the packed block (1 MiB at
/// `KC` = 256) lives in L2/L3 and is reused for every column block of `b`.
pub const MC: usize = 1024;
/// Columns of `b` per packed block (a multiple of `MR`): 192 KiB, fits L2 next to the
/// streaming panels of `a`.
pub const NC: usize = 192;
/// Up to this many columns of `b` use the mat-vec path.
pub const MV_MAX_N: usize = 4;

/// Whether out_prod runs on a dedicated kernel (`compute_out_prod`): an f32/f16/bf16 `a` and
/// an f32 `b` of any strides, a contiguous f32 destination (a quantized `a` has its own kernel,
/// `out_prod_quant`).
pub fn handles_out_prod(graph: &tessera::Graph, t: &Tensor) -> bool {
    if t.src.len() != 2 {
        return false;
    }
    let (a, b) = (graph.tensor(t.src[0]), graph.tensor(t.src[1]));
    matches!(a.dtype, DType::F32 | DType::F16 | DType::BF16)
        && b.dtype == DType::F32
        && t.dtype == DType::F32
        && t.is_contiguous()
}

/// out_prod: `dst[i, j] = Σ_k a[i, k] · b[j, k]`, `a` broadcast over dims 2 and 3 of `b`.
///
/// No work buffer (the node gets none): a thread packs, on its stack, a block of `a` (`OMC`
/// rows × `OKB` k, converted to f32, in panels of `OTM` rows) and a block of `b` (`ONB` columns
/// × `OKB` k); a register tile of `OTM` rows × `OTN` columns (AVX2 FMA, or plain Rust) sums
/// over the block's k in order, and block after block is added to the destination. Each value
/// is thus summed in a fixed order whatever the thread count or the split (jobs: broadcast
/// batches × row chunks × column ranges). In f32, like ggml; measured ≤ 4e-7 of the output's
/// largest magnitude against the f64 reference for K up to 4000 (the tests allow 1e-5).
pub fn compute_out_prod(ctx: &NodeCtx) -> Result<()> {
    /// Rows of `a` per register tile (two 8-lane registers).
    const OTM: usize = 16;
    /// Columns (rows of `b`) per register tile.
    const OTN: usize = 4;
    /// k per packed block.
    const OKB: usize = 128;
    /// Rows of `a` per job and packed block (a multiple of OTM).
    const OMC: usize = 64;
    /// Columns of `b` per packed block (a multiple of OTN).
    const ONB: usize = 64;

    /// The f32/f16/bf16 value at `p` as f32.
    ///
    /// # Safety
    /// `p` points at a readable value of `dtype`.
    #[inline(always)]
    unsafe fn ld(dtype: DType, p: *const u8) -> f32 {
        // SAFETY: the caller's contract; unaligned reads are allowed.
        unsafe {
            match dtype {
                DType::F32 => (p as *const f32).read_unaligned(),
                DType::F16 => half::f16::from_bits((p as *const u16).read_unaligned()).to_f32(),
                _ => f32::from_bits(((p as *const u16).read_unaligned() as u32) << 16),
            }
        }
    }

    /// `acc[c][r] = Σ_kk bp[kk·ONB + c] · ap[kk·OTM + r]`, kk in order.
    ///
    /// # Safety
    /// `ap` holds `kb·OTM` f32; `bp` `kb` rows of stride `ONB` with `OTN` readable values.
    unsafe fn tile(
        isa: Isa,
        kb: usize,
        ap: *const f32,
        bp: *const f32,
        acc: &mut [[f32; OTM]; OTN],
    ) {
        #[cfg(target_arch = "x86_64")]
        if isa >= Isa::Avx2 && isa != Isa::Neon {
            // SAFETY: Avx2 is chosen only when the CPU has AVX2 and FMA; the caller's contract.
            unsafe { tile_avx2(kb, ap, bp, acc) };
            return;
        }
        let _ = isa;
        *acc = [[0f32; OTM]; OTN];
        for kk in 0..kb {
            // SAFETY: kk < kb (caller's contract).
            let (av, bv) = unsafe {
                (
                    std::slice::from_raw_parts(ap.add(kk * OTM), OTM),
                    std::slice::from_raw_parts(bp.add(kk * ONB), OTN),
                )
            };
            for (row, &bc) in acc.iter_mut().zip(bv) {
                for (o, &x) in row.iter_mut().zip(av) {
                    *o += bc * x;
                }
            }
        }
    }

    /// # Safety
    /// AVX2 and FMA present; as `tile`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_avx2(kb: usize, ap: *const f32, bp: *const f32, acc: &mut [[f32; OTM]; OTN]) {
        use std::arch::x86_64::*;
        // SAFETY: reads stay inside kb·OTM values of ap and kb rows of bp. (Unrolled by hand
        // so that the accumulators stay in registers at any optimisation level.)
        unsafe {
            let (mut c00, mut c01) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let (mut c10, mut c11) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let (mut c20, mut c21) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let (mut c30, mut c31) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let (mut pa, mut pb) = (ap, bp);
            for _ in 0..kb {
                let a0 = _mm256_loadu_ps(pa);
                let a1 = _mm256_loadu_ps(pa.add(8));
                let b0 = _mm256_broadcast_ss(&*pb);
                c00 = _mm256_fmadd_ps(b0, a0, c00);
                c01 = _mm256_fmadd_ps(b0, a1, c01);
                let b1 = _mm256_broadcast_ss(&*pb.add(1));
                c10 = _mm256_fmadd_ps(b1, a0, c10);
                c11 = _mm256_fmadd_ps(b1, a1, c11);
                let b2 = _mm256_broadcast_ss(&*pb.add(2));
                c20 = _mm256_fmadd_ps(b2, a0, c20);
                c21 = _mm256_fmadd_ps(b2, a1, c21);
                let b3 = _mm256_broadcast_ss(&*pb.add(3));
                c30 = _mm256_fmadd_ps(b3, a0, c30);
                c31 = _mm256_fmadd_ps(b3, a1, c31);
                pa = pa.add(OTM);
                pb = pb.add(ONB);
            }
            let tiles = [(c00, c01), (c10, c11), (c20, c21), (c30, c31)];
            for (row, (lo, hi)) in acc.iter_mut().zip(tiles) {
                _mm256_storeu_ps(row.as_mut_ptr(), lo);
                _mm256_storeu_ps(row.as_mut_ptr().add(8), hi);
            }
        }
    }

    let (a, b, d) = (ctx.s(0), ctx.s(1), ctx.t);
    let (m, kdim, n) = (a.ne[0], a.ne[1], b.ne[0]);
    if b.ne[1] != kdim || d.ne != [m, n, b.ne[2], b.ne[3]] || a.ne[2] == 0 || a.ne[3] == 0 {
        return Err(ctx.err(format!(
            "a {:?}, b {:?} and dst {:?} do not fit out_prod",
            a.ne, b.ne, d.ne
        )));
    }
    let (r2, r3) = (b.ne[2] / a.ne[2], b.ne[3] / a.ne[3]);
    let batches = b.ne[2] * b.ne[3];
    let mchunks = m.div_ceil(OMC);
    if batches * mchunks * n == 0 {
        return Ok(());
    }
    // when batches × row chunks leave threads idle, split the columns too
    let nsplit = if batches * mchunks >= ctx.nth {
        1
    } else {
        ctx.nth
            .div_ceil(batches * mchunks)
            .min(n.div_ceil(OTN))
            .max(1)
    };
    let ncols = n.div_ceil(nsplit).next_multiple_of(OTN);
    let a_dense_f32 = a.dtype == DType::F32 && a.nb[0] == 4;
    let mut ap = [0f32; OMC * OKB];
    let mut bp = [0f32; OKB * ONB];
    let mut acc = [[0f32; OTM]; OTN];
    for job in ctx.share(batches * mchunks * nsplit) {
        let ns = job % nsplit;
        let mc = (job / nsplit) % mchunks;
        let bi = job / (nsplit * mchunks);
        let (i2, i3) = (bi % b.ne[2], bi / b.ne[2]);
        let a_base = (i2 / r2) * a.nb[2] + (i3 / r3) * a.nb[3];
        let b_base = i2 * b.nb[2] + i3 * b.nb[3];
        let d_base = i2 * d.nb[2] + i3 * d.nb[3];
        let (m0, m1) = (mc * OMC, ((mc + 1) * OMC).min(m));
        let (n0, n1) = ((ns * ncols).min(n), ((ns + 1) * ncols).min(n));
        if n0 >= n1 {
            continue;
        }
        let tiles = (m1 - m0).div_ceil(OTM);
        if kdim == 0 {
            for j in n0..n1 {
                for i in m0..m1 {
                    // SAFETY: dst[i, j] of this batch lies in the destination, this job's.
                    unsafe { *(ctx.dst.add(d_base + j * d.nb[1] + i * 4) as *mut f32) = 0.0 };
                }
            }
            continue;
        }
        let mut k0 = 0;
        while k0 < kdim {
            let kb = OKB.min(kdim - k0);
            // pack a[m0..m1, k0..k0+kb]: panel p holds rows m0 + p·OTM.. as [kk][OTM]
            for p in 0..tiles {
                let (r0, rows) = (m0 + p * OTM, OTM.min(m1 - m0 - p * OTM));
                for kk in 0..kb {
                    let panel = &mut ap[(p * OKB + kk) * OTM..(p * OKB + kk + 1) * OTM];
                    // SAFETY: a[r0.., k0 + kk] of this batch: `rows` values inside a's span.
                    unsafe {
                        let src = ctx.src[0].add(a_base + (k0 + kk) * a.nb[1] + r0 * a.nb[0]);
                        if a_dense_f32 {
                            std::ptr::copy_nonoverlapping(
                                src as *const f32,
                                panel.as_mut_ptr(),
                                rows,
                            );
                        } else {
                            for (r, o) in panel.iter_mut().enumerate().take(rows) {
                                *o = ld(a.dtype, src.add(r * a.nb[0]));
                            }
                        }
                    }
                    panel[rows..].fill(0.0);
                }
            }
            let mut jb0 = n0;
            while jb0 < n1 {
                let jbn = ONB.min(n1 - jb0);
                // pack b[jb0..jb0+jbn, k0..k0+kb] as [kk][ONB], zero up to a whole tile
                for kk in 0..kb {
                    let row = &mut bp[kk * ONB..(kk + 1) * ONB];
                    // SAFETY: b[jb0.., k0 + kk] of this batch: jbn values inside b's span.
                    unsafe {
                        let src = ctx.src[1].add(b_base + jb0 * b.nb[0] + (k0 + kk) * b.nb[1]);
                        if b.nb[0] == 4 {
                            std::ptr::copy_nonoverlapping(src as *const f32, row.as_mut_ptr(), jbn);
                        } else {
                            for (c, o) in row.iter_mut().enumerate().take(jbn) {
                                *o = (src.add(c * b.nb[0]) as *const f32).read_unaligned();
                            }
                        }
                    }
                    row[jbn..jbn.next_multiple_of(OTN)].fill(0.0);
                }
                for j0 in (0..jbn).step_by(OTN) {
                    let cols = OTN.min(jbn - j0);
                    for p in 0..tiles {
                        // SAFETY: panel p of ap holds kb·OTM values; bp kb rows of ONB with
                        // OTN readable from j0 (zero-filled up to a whole tile).
                        unsafe {
                            tile(
                                ctx.isa,
                                kb,
                                ap.as_ptr().add(p * OKB * OTM),
                                bp.as_ptr().add(j0),
                                &mut acc,
                            )
                        };
                        let i0 = m0 + p * OTM;
                        let rows = OTM.min(m1 - i0);
                        for (c, col) in acc.iter().enumerate().take(cols) {
                            // SAFETY: dst[i0..i0+rows, jb0+j0+c] of this batch lies in the
                            // destination and belongs to this job alone.
                            unsafe {
                                let out = ctx.dst.add(d_base + (jb0 + j0 + c) * d.nb[1] + i0 * 4)
                                    as *mut f32;
                                for (r, &v) in col.iter().enumerate().take(rows) {
                                    let o = out.add(r);
                                    *o = if k0 == 0 { v } else { *o + v };
                                }
                            }
                        }
                    }
                }
                jb0 += jbn;
            }
            k0 += kb;
        }
    }
    Ok(())
}

/// Does this node run on the float kernels here (rather than the fallback)?
pub fn handles(ctx_t: &Tensor, a: &Tensor, b: &Tensor) -> bool {
    matches!(a.dtype, DType::F32 | DType::F16 | DType::BF16)
        && b.dtype == DType::F32
        && ctx_t.dtype == DType::F32
        && ctx_t.is_contiguous()
}

/// Scratch bytes per thread for the GEMM path.
pub fn work_per_thread() -> usize {
    (MC * KC + NC * KC) * 4 + 64 // multiple of 64
}

/// Bytes of `b` converted to f32 rounded like `a`'s type (f16/bf16 weights only).
fn conv_size(a: &Tensor, b: &Tensor) -> usize {
    if a.dtype == DType::F32 {
        0
    } else {
        (b.nelements() * 4).next_multiple_of(64)
    }
}

fn uses_matvec(a: &Tensor, b: &Tensor) -> bool {
    b.ne[1] <= MV_MAX_N && a.nb[0] == a.dtype.type_size() && (b.nb[0] == 4 || a.dtype != DType::F32)
}

pub fn work_size(a: &Tensor, b: &Tensor, nth: usize) -> usize {
    conv_size(a, b)
        + if uses_matvec(a, b) {
            0
        } else {
            work_per_thread() * nth
        }
}

/// Reads element `i` of a row of `dtype` at `p` as f32.
#[inline(always)]
unsafe fn load_f(dtype: DType, p: *const u8, i: usize) -> f32 {
    // SAFETY: the caller guarantees `p` points at a row of at least `i + 1` elements.
    unsafe {
        match dtype {
            DType::F32 => *(p as *const f32).add(i),
            DType::F16 => half::f16::from_bits(*(p as *const u16).add(i)).to_f32(),
            DType::BF16 => f32::from_bits((*(p as *const u16).add(i) as u32) << 16),
            _ => unreachable!("float kernels only"),
        }
    }
}

pub fn compute(ctx: &NodeCtx) -> Result<()> {
    let (a, b0, d) = (ctx.s(0), ctx.s(1), ctx.t);
    let (k, m, n) = (a.ne[0], a.ne[1], b0.ne[1]);
    if k != b0.ne[0] {
        return Err(ctx.err(format!("inner dims differ: a has {k}, b has {}", b0.ne[0])));
    }
    let conv = conv_size(a, b0);
    if ctx.wsize < work_size(a, b0, ctx.nth) {
        return Err(ctx.err(format!(
            "work buffer of {} bytes, {} needed",
            ctx.wsize,
            work_size(a, b0, ctx.nth)
        )));
    }
    // With f16/bf16 weights ggml first converts b to the weights' type; so do we (rounding b
    // to that type, kept as f32 in the work buffer, contiguous), then all threads use it.
    let (bsrc, b) = if conv > 0 {
        let bc = BView {
            ne: b0.ne,
            nb: tessera::shape::contiguous_nb(DType::F32, &b0.ne),
        };
        let cols = b0.nrows();
        for col in ctx.share(cols) {
            let (i1, i2, i3) = (
                col % b0.ne[1],
                (col / b0.ne[1]) % b0.ne[2],
                col / (b0.ne[1] * b0.ne[2]),
            );
            // SAFETY: column `col` of b lies in its span (validated); the converted column is
            // this thread's own slice of the work buffer's first `conv` bytes.
            unsafe {
                let src = ctx.src[1].add(i1 * b0.nb[1] + i2 * b0.nb[2] + i3 * b0.nb[3]);
                let dst = (ctx.wdata as *mut f32).add(col * k);
                #[cfg(target_arch = "x86_64")]
                if b0.nb[0] == 4 && ctx.isa >= Isa::Avx2 && ctx.isa != Isa::Neon {
                    // Avx2 is chosen only when the CPU has AVX2 and F16C
                    avx2::round_row(a.dtype, src as *const f32, dst, k);
                    continue;
                }
                #[cfg(target_arch = "aarch64")]
                if b0.nb[0] == 4 && ctx.isa == Isa::Neon {
                    neon::round_row(a.dtype, src as *const f32, dst, k);
                    continue;
                }
                for kk in 0..k {
                    *dst.add(kk) = round_to(a.dtype, *(src.add(kk * b0.nb[0]) as *const f32));
                }
            }
        }
        ctx.barrier();
        (ctx.wdata as *const u8, bc)
    } else {
        (
            ctx.src[1],
            BView {
                ne: b0.ne,
                nb: b0.nb,
            },
        )
    };
    let b = &b;
    let (r2, r3) = (b.ne[2] / a.ne[2], b.ne[3] / a.ne[3]);
    let batches = b.ne[2] * b.ne[3];
    if uses_matvec(a, b0) {
        // rows of a split evenly across threads, for every batch
        let rows = ctx.share(m);
        for bi in 0..batches {
            let (i2, i3) = (bi % b.ne[2], bi / b.ne[2]);
            let a_off = (i2 / r2) * a.nb[2] + (i3 / r3) * a.nb[3];
            let b_off = i2 * b.nb[2] + i3 * b.nb[3];
            let d_off = i2 * d.nb[2] + i3 * d.nb[3];
            #[cfg_attr(
                not(any(target_arch = "x86_64", target_arch = "aarch64")),
                allow(unused_mut)
            )]
            let mut im = rows.start;
            // one column: four rows a call (`dot_rows4`, the same bits as one at a time)
            #[cfg(target_arch = "x86_64")]
            if n == 1 && a.dtype == DType::BF16 && super::matmul_bf16::available(ctx.isa) {
                while im + 4 <= rows.end {
                    // SAFETY: as below, for rows im..im + 4; `available` checked the CPU.
                    unsafe {
                        let ar: [*const u16; 4] = std::array::from_fn(|r| {
                            ctx.src[0].add(a_off + (im + r) * a.nb[1]) as *const u16
                        });
                        let bc = bsrc.add(b_off) as *const f32;
                        let v = super::matmul_bf16::dot_rows4(ar, bc, k);
                        for (r, y) in v.into_iter().enumerate() {
                            *(ctx.dst.add(d_off + (im + r) * 4) as *mut f32) = y;
                        }
                    }
                    im += 4;
                }
            }
            #[cfg(target_arch = "x86_64")]
            if n == 1
                && ctx.isa >= Isa::Avx2
                && ctx.isa != Isa::Neon
                && !(a.dtype == DType::BF16 && super::matmul_bf16::available(ctx.isa))
            {
                while im + 4 <= rows.end {
                    // SAFETY: as below, for rows im..im + 4; Avx2 is only chosen when the CPU
                    // has AVX2, FMA and F16C.
                    unsafe {
                        let ar: [*const u8; 4] =
                            std::array::from_fn(|r| ctx.src[0].add(a_off + (im + r) * a.nb[1]));
                        let bc = bsrc.add(b_off) as *const f32;
                        // the next call's rows start 4·nb1 bytes after these
                        let v = avx2::dot_rows4(a.dtype, ar, bc, k, 4 * a.nb[1]);
                        for (r, y) in v.into_iter().enumerate() {
                            *(ctx.dst.add(d_off + (im + r) * 4) as *mut f32) = y;
                        }
                    }
                    im += 4;
                }
            }
            #[cfg(target_arch = "aarch64")]
            if n == 1 && ctx.isa == Isa::Neon {
                while im + 4 <= rows.end {
                    // SAFETY: as below, for rows im..im + 4; Neon is chosen only where the CPU
                    // has it.
                    unsafe {
                        let ar: [*const u8; 4] =
                            std::array::from_fn(|r| ctx.src[0].add(a_off + (im + r) * a.nb[1]));
                        let bc = bsrc.add(b_off) as *const f32;
                        let v = neon::dot_rows4(a.dtype, ar, bc, k);
                        for (r, y) in v.into_iter().enumerate() {
                            *(ctx.dst.add(d_off + (im + r) * 4) as *mut f32) = y;
                        }
                    }
                    im += 4;
                }
            }
            for im in im..rows.end {
                // SAFETY: `exec::validate` checked every tensor's span; row `im` of `a` and
                // columns of `b` lie inside it; this thread alone writes `dst[im, ..]`.
                unsafe {
                    let arow = ctx.src[0].add(a_off + im * a.nb[1]);
                    let mut bcols = [std::ptr::null::<f32>(); MV_MAX_N];
                    for (j, c) in bcols.iter_mut().enumerate().take(n) {
                        *c = bsrc.add(b_off + j * b.nb[1]) as *const f32;
                    }
                    let mut out = [0f32; MV_MAX_N];
                    dot_rows(ctx.isa, a.dtype, arow, &bcols[..n], k, &mut out[..n]);
                    for (j, &v) in out.iter().enumerate().take(n) {
                        *(ctx.dst.add(d_off + j * d.nb[1] + im * 4) as *mut f32) = v;
                    }
                }
            }
        }
        return Ok(());
    }
    if a.dtype == DType::BF16 && super::matmul_bf16::gemm_available(ctx.isa) {
        return super::matmul_bf16::gemm(ctx, a, b, bsrc, conv, d, (k, m, n), (r2, r3));
    }
    gemm(ctx, a, b, bsrc, conv, d, (k, m, n), (r2, r3))
}

/// `v` rounded to `dtype` (f16, or bf16 for any other type) and widened back: what ggml's
/// conversion of the activations to the weights' type keeps.
#[inline(always)]
pub fn round_to(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::F16 => half::f16::from_f32(v).to_f32(),
        _ => half::bf16::from_f32(v).to_f32(),
    }
}

/// `round_to` over `src` into `dst` (equal lengths), eight at a time where the CPU has AVX2:
/// the same bits (for tests and benchmarks).
pub fn round_slice(isa: Isa, dtype: DType, src: &[f32], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "round_slice: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 && isa != Isa::Neon {
        // SAFETY: both slices hold `src.len()` f32; Avx2 is chosen only with AVX2 and F16C.
        unsafe { avx2::round_row(dtype, src.as_ptr(), dst.as_mut_ptr(), src.len()) };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon {
        // SAFETY: both slices hold `src.len()` f32; Neon is chosen only where the CPU has it.
        unsafe { neon::round_row(dtype, src.as_ptr(), dst.as_mut_ptr(), src.len()) };
        return;
    }
    let _ = isa;
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = round_to(dtype, s);
    }
}

/// `out[j] = Σ_i a[i] · b_j[i]` for one row of `a` against up to `MV_MAX_N` columns.
///
/// # Safety
/// `a` points at `k` elements of `dtype`; each `b[j]` at `k` f32.
unsafe fn dot_rows(
    isa: Isa,
    dtype: DType,
    a: *const u8,
    b: &[*const f32],
    k: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if dtype == DType::BF16 && super::matmul_bf16::available(isa) {
        // SAFETY: `available` checked the CPU; the caller's guarantees.
        unsafe { super::matmul_bf16::dot_rows(a as *const u16, b, k, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 && isa != Isa::Neon {
        // SAFETY: Avx2 is only chosen when the CPU has AVX2, FMA and F16C.
        unsafe { avx2::dot_rows(dtype, a, b, k, out) };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon {
        // SAFETY: Neon is chosen only where the CPU has it; the caller's guarantees.
        unsafe { neon::dot_rows(dtype, a, b, k, out) };
        return;
    }
    let _ = isa;
    for (j, o) in out.iter_mut().enumerate() {
        let mut acc = [0f32; 8];
        let mut i = 0;
        while i + 8 <= k {
            for l in 0..8 {
                // SAFETY: i + l < k.
                acc[l] += unsafe { load_f(dtype, a, i + l) * *b[j].add(i + l) };
            }
            i += 8;
        }
        let mut s: f32 = acc.iter().sum();
        while i < k {
            // SAFETY: i < k.
            s += unsafe { load_f(dtype, a, i) * *b[j].add(i) };
            i += 1;
        }
        *o = s;
    }
}

/// The shape and byte strides of `b` as the kernels read it (a plain copy: cloning the
/// `Tensor` would allocate on every run).
#[derive(Clone, Copy)]
pub(crate) struct BView {
    pub(crate) ne: [usize; 4],
    pub(crate) nb: [usize; 4],
}

/// How the GEMM splits its work: output tiles of `mchunk` rows of `a` × `nsplit` column ranges
/// of `b`, for every broadcast batch.
pub(crate) struct Split {
    pub(crate) mchunk: usize,
    pub(crate) mchunks: usize,
    pub(crate) nsplit: usize,
}

/// Where one job of a [`Split`] works: byte offsets of its broadcast batch in `a`, `b` and
/// `dst`, its rows of `a` and its columns of `b`.
pub(crate) type JobSpan = (usize, usize, usize, Range<usize>, Range<usize>);

impl Split {
    /// Job `job` (of `batches · mchunks · nsplit`), its column ranges rounded to `mr`.
    pub(crate) fn span(
        &self,
        job: usize,
        mr: usize,
        (a, b, d): (&Tensor, &BView, &Tensor),
        (m, n): (usize, usize),
        (r2, r3): (usize, usize),
    ) -> JobSpan {
        let ns_i = job % self.nsplit;
        let mc_i = (job / self.nsplit) % self.mchunks;
        let bi = job / (self.nsplit * self.mchunks);
        let (i2, i3) = (bi % b.ne[2], bi / b.ne[2]);
        let ncols = n.div_ceil(self.nsplit).next_multiple_of(mr);
        (
            (i2 / r2) * a.nb[2] + (i3 / r3) * a.nb[3],
            i2 * b.nb[2] + i3 * b.nb[3],
            i2 * d.nb[2] + i3 * d.nb[3],
            mc_i * self.mchunk..((mc_i + 1) * self.mchunk).min(m),
            (ns_i * ncols).min(n)..((ns_i + 1) * ncols).min(n),
        )
    }
}

pub(crate) fn split_work(m: usize, n: usize, batches: usize, nth: usize) -> Split {
    // A thread packs its rows of a and every column of b it multiplies them with. When b has
    // more columns than a has rows (training's activations: many tokens, few features) and the
    // batches do not keep every thread busy, split b's columns instead of a's rows, so that no
    // two threads pack the same part of the bigger operand. The sums over k are formed in the
    // same order either way.
    if batches < nth && n > m {
        let mchunk = m.next_multiple_of(NR).clamp(NR, MC);
        let mchunks = m.div_ceil(mchunk);
        let nsplit = nth.div_ceil(batches * mchunks).min(n.div_ceil(MR)).max(1);
        return Split {
            mchunk,
            mchunks,
            nsplit,
        };
    }
    // rows of a per chunk: at most MC, and small enough that every thread gets one
    let per_thread = m.div_ceil(nth).next_multiple_of(NR);
    let mchunk = per_thread.clamp(NR, MC);
    let mchunks = m.div_ceil(mchunk);
    // when batches × chunks leave threads idle, split the columns of b too
    let nsplit = if batches * mchunks >= nth {
        1
    } else {
        nth.div_ceil(batches * mchunks).min(n.div_ceil(MR)).max(1)
    };
    Split {
        mchunk,
        mchunks,
        nsplit,
    }
}

#[allow(clippy::too_many_arguments)]
fn gemm(
    ctx: &NodeCtx,
    a: &Tensor,
    b: &BView,
    bsrc: *const u8,
    scratch_off: usize,
    d: &Tensor,
    (k, m, n): (usize, usize, usize),
    (r2, r3): (usize, usize),
) -> Result<()> {
    let batches = b.ne[2] * b.ne[3];
    let sp = split_work(m, n, batches, ctx.nth);
    let jobs = batches * sp.mchunks * sp.nsplit;
    let per = work_per_thread();
    // SAFETY: each thread owns bytes [off + ith*per, off + (ith+1)*per) of the work buffer
    // (`compute` checked its size); the buffer is 64-byte aligned and `per` a multiple of 64.
    let (ap, bp) = unsafe {
        let base = ctx.wdata.add(scratch_off + ctx.ith * per) as *mut f32;
        (
            std::slice::from_raw_parts_mut(base, MC * KC),
            std::slice::from_raw_parts_mut(base.add(MC * KC), NC * KC),
        )
    };
    let mut row = [0f32; KC];
    let wide = cfg!(target_arch = "x86_64") && ctx.isa == Isa::Avx512;
    for job in ctx.share(jobs) {
        let (a_base, b_base, d_base, rows_a, cols_b) =
            sp.span(job, MR, (a, b, d), (m, n), (r2, r3));
        let ((m0, m1), (nj0, nj1)) = ((rows_a.start, rows_a.end), (cols_b.start, cols_b.end));
        let mut k0 = 0;
        while k0 < k {
            let kc = KC.min(k - k0);
            // pack a[m0..m1, k0..k0+kc] into panels of NR rows, k-major inside a panel
            for (p, mp) in (m0..m1).step_by(NR).enumerate() {
                let panel = &mut ap[p * NR * kc..(p + 1) * NR * kc];
                if a.dtype == DType::F32 && a.nb[1] == 4 && mp + NR <= m1 {
                    // a transposed view (rows adjacent in memory): a panel's NR values of one
                    // k are contiguous, so copy them instead of gathering each row
                    for kk in 0..kc {
                        // SAFETY: elements (mp..mp+NR, k0+kk) of `a` in this batch lie in its
                        // span (validated); with nb[1] == 4 they are NR consecutive f32.
                        unsafe {
                            let src =
                                ctx.src[0].add(a_base + mp * 4 + (k0 + kk) * a.nb[0]) as *const f32;
                            std::ptr::copy_nonoverlapping(src, panel.as_mut_ptr().add(kk * NR), NR);
                        }
                    }
                    continue;
                }
                for r in 0..NR {
                    let im = mp + r;
                    if im < m1 {
                        // SAFETY: row `im` of `a` in this batch has `k` elements at stride nb0.
                        unsafe {
                            let src = ctx.src[0].add(a_base + im * a.nb[1]);
                            load_row(ctx.isa, a.dtype, src, a.nb[0], k0, &mut row[..kc]);
                        }
                        for (kk, &v) in row[..kc].iter().enumerate() {
                            panel[kk * NR + r] = v;
                        }
                    } else {
                        for kk in 0..kc {
                            panel[kk * NR + r] = 0.0;
                        }
                    }
                }
            }
            let accumulate = k0 > 0;
            let mut n0 = nj0;
            while n0 < nj1 {
                let n1 = (n0 + NC).min(nj1);
                // pack b[n0..n1, k0..k0+kc] into panels of MR columns
                for (q, nq) in (n0..n1).step_by(MR).enumerate() {
                    let panel = &mut bp[q * MR * kc..(q + 1) * MR * kc];
                    if b.nb[1] == 4 && nq + MR <= n1 {
                        // b transposed (columns adjacent): MR consecutive f32 per k
                        for kk in 0..kc {
                            // SAFETY: elements (k0+kk, nq..nq+MR) of `b` in this batch lie in
                            // its span; with nb[1] == 4 they are MR consecutive f32.
                            unsafe {
                                let src =
                                    bsrc.add(b_base + nq * 4 + (k0 + kk) * b.nb[0]) as *const f32;
                                std::ptr::copy_nonoverlapping(
                                    src,
                                    panel.as_mut_ptr().add(kk * MR),
                                    MR,
                                );
                            }
                        }
                        continue;
                    }
                    for r in 0..MR {
                        let jn = nq + r;
                        if jn < n1 {
                            // SAFETY: column `jn` of `b` in this batch has `k` f32 at stride nb0.
                            unsafe {
                                let col = bsrc.add(b_base + jn * b.nb[1]);
                                load_row(ctx.isa, DType::F32, col, b.nb[0], k0, &mut row[..kc]);
                            }
                            for (kk, &v) in row[..kc].iter().enumerate() {
                                panel[kk * MR + r] = v;
                            }
                        } else {
                            for kk in 0..kc {
                                panel[kk * MR + r] = 0.0;
                            }
                        }
                    }
                }
                let npanels = (m1 - m0).div_ceil(NR);
                let mut p = 0;
                while p < npanels {
                    let mp = m0 + p * NR;
                    // AVX-512: two panels at once in 16-lane registers (the same sums)
                    let pair = wide && p + 1 < npanels;
                    let width = if pair { 2 } else { 1 };
                    let apanel = &ap[p * NR * kc..(p + width) * NR * kc];
                    let cols = (width * NR).min(m1 - mp);
                    for (q, nq) in (n0..n1).step_by(MR).enumerate() {
                        let bpanel = &bp[q * MR * kc..(q + 1) * MR * kc];
                        let rows = MR.min(n1 - nq);
                        // SAFETY: the tile dst[nq..nq+rows, mp..mp+cols] lies inside `dst` and
                        // belongs to this job alone; `pair` only under Isa::Avx512.
                        unsafe {
                            let c = ctx.dst.add(d_base + nq * d.nb[1] + mp * 4) as *mut f32;
                            let ldc = d.nb[1] / 4;
                            if pair {
                                #[cfg(target_arch = "x86_64")]
                                avx512::kernel_6x32(
                                    kc,
                                    apanel.as_ptr(),
                                    bpanel.as_ptr(),
                                    c,
                                    ldc,
                                    rows,
                                    cols,
                                    accumulate,
                                );
                            } else {
                                micro_kernel(
                                    ctx.isa, kc, apanel, bpanel, c, ldc, rows, cols, accumulate,
                                );
                            }
                        }
                    }
                    p += width;
                }
                n0 = n1;
            }
            k0 += kc;
        }
    }
    Ok(())
}

/// Reads `out.len()` elements starting at element `k0` of a row of `dtype` with element stride
/// `stride` bytes, as f32 (F16C for dense f16 rows).
///
/// # Safety
/// The row holds at least `k0 + out.len()` elements at that stride.
unsafe fn load_row(
    isa: Isa,
    dtype: DType,
    row: *const u8,
    stride: usize,
    k0: usize,
    out: &mut [f32],
) {
    let dense = stride == dtype.type_size();
    #[cfg(target_arch = "x86_64")]
    if dense && isa >= Isa::Avx2 && isa != Isa::Neon && dtype != DType::F32 {
        // SAFETY: the caller's guarantee; Avx2 implies F16C.
        unsafe { avx2::convert_row(dtype, row, k0, out) };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if dense && isa == Isa::Neon && dtype != DType::F32 {
        // SAFETY: the caller's guarantee; Neon is chosen only where the CPU has it.
        unsafe { neon::convert_row(dtype, row, k0, out) };
        return;
    }
    let _ = isa;
    // SAFETY: the caller's guarantee.
    unsafe {
        if dense && dtype == DType::F32 {
            std::ptr::copy_nonoverlapping((row as *const f32).add(k0), out.as_mut_ptr(), out.len());
        } else {
            for (i, o) in out.iter_mut().enumerate() {
                *o = load_f(dtype, row.add((k0 + i) * stride), 0);
            }
        }
    }
}

/// `C[r][j] (+)= Σ_k bp[k][r] · ap[k][j]` for an `MR × NR` tile, of which `rows × cols` are kept.
///
/// # Safety
/// `c` points at a tile with row stride `ldc` floats holding at least `rows × cols` elements.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn micro_kernel(
    isa: Isa,
    kc: usize,
    ap: &[f32],
    bp: &[f32],
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
    accumulate: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 && isa != Isa::Neon {
        // SAFETY: Avx2 is chosen only when the CPU has AVX2 and FMA; the caller's guarantees.
        unsafe { avx2::kernel_6x16(kc, ap.as_ptr(), bp.as_ptr(), c, ldc, rows, cols, accumulate) };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon {
        // SAFETY: Neon is chosen only where the CPU has it; the caller's guarantees.
        unsafe { neon::kernel_6x16(kc, ap.as_ptr(), bp.as_ptr(), c, ldc, rows, cols, accumulate) };
        return;
    }
    let _ = isa;
    let mut acc = [[0f32; NR]; MR];
    for kk in 0..kc {
        let av = &ap[kk * NR..kk * NR + NR];
        for r in 0..MR {
            let bv = bp[kk * MR + r];
            for j in 0..NR {
                acc[r][j] += bv * av[j];
            }
        }
    }
    for (r, row) in acc.iter().enumerate().take(rows) {
        for (j, &v) in row.iter().enumerate().take(cols) {
            // SAFETY: r < rows, j < cols.
            unsafe {
                let p = c.add(r * ldc + j);
                *p = if accumulate { *p + v } else { v };
            }
        }
    }
}

/// The `rows × cols` corner of an `MR × NR` tile (row-major in `tile`) stored to `c` (row
/// stride `ldc` floats), or added to what is there: a micro-kernel's partial tile.
///
/// # Safety
/// `c` holds `rows × cols` elements at that stride.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
#[inline(always)]
unsafe fn store_part(
    tile: &[f32; MR * NR],
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
    accumulate: bool,
) {
    for r in 0..rows {
        for j in 0..cols {
            // SAFETY: r < rows, j < cols (caller).
            unsafe {
                let p = c.add(r * ldc + j);
                let v = tile[r * NR + j];
                *p = if accumulate { *p + v } else { v };
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{MR, MV_MAX_N, NR};
    use std::arch::x86_64::*;
    use tessera::DType;

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        // SAFETY: plain register arithmetic, AVX enabled by the caller.
        unsafe {
            let lo = _mm256_castps256_ps128(v);
            let hi = _mm256_extractf128_ps(v, 1);
            let s = _mm_add_ps(lo, hi);
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
            _mm_cvtss_f32(s)
        }
    }

    /// Eight elements of a row of `dtype` at element `i`, as f32.
    #[inline(always)]
    unsafe fn load8(dtype: DType, a: *const u8, i: usize) -> __m256 {
        // SAFETY: the caller guarantees 8 readable elements at `i`.
        unsafe {
            match dtype {
                DType::F32 => _mm256_loadu_ps((a as *const f32).add(i)),
                DType::F16 => {
                    _mm256_cvtph_ps(_mm_loadu_si128((a as *const u16).add(i) as *const __m128i))
                }
                _ => {
                    let h = _mm_loadu_si128((a as *const u16).add(i) as *const __m128i);
                    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                }
            }
        }
    }

    /// Converts `out.len()` f16/bf16 elements from element `k0` of a dense row.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn convert_row(dtype: DType, row: *const u8, k0: usize, out: &mut [f32]) {
        // SAFETY: the row holds k0 + out.len() elements (caller's contract).
        unsafe {
            let mut i = 0;
            while i + 8 <= out.len() {
                _mm256_storeu_ps(out.as_mut_ptr().add(i), load8(dtype, row, k0 + i));
                i += 8;
            }
            for (j, o) in out.iter_mut().enumerate().skip(i) {
                *o = super::load_f(dtype, row, k0 + j);
            }
        }
    }

    /// `dst[i] = src[i]` rounded to `dtype` (f16 or bf16) and widened back to f32: the bits of
    /// [`super::round_to`], eight at a time (F16C's round to nearest even for f16; for bf16
    /// half's rule in integers: add 0x7FFF plus the kept part's lowest bit, a NaN quieted).
    ///
    /// # Safety
    /// `src` and `dst` hold `k` f32; the CPU has AVX2 and F16C.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn round_row(dtype: DType, src: *const f32, dst: *mut f32, k: usize) {
        // SAFETY: loads and stores below k (the caller's contract).
        unsafe {
            let mut i = 0;
            if dtype == DType::F16 {
                while i + 8 <= k {
                    let h =
                        _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.add(i)));
                    _mm256_storeu_ps(dst.add(i), _mm256_cvtph_ps(h));
                    i += 8;
                }
            } else {
                let one = _mm256_set1_epi32(1);
                let bias = _mm256_set1_epi32(0x7fff);
                let high = _mm256_set1_epi32(0xffff_0000u32 as i32);
                let abs = _mm256_set1_epi32(0x7fff_ffff);
                let inf = _mm256_set1_epi32(0x7f80_0000);
                let quiet = _mm256_set1_epi32(0x0040_0000);
                while i + 8 <= k {
                    let x = _mm256_loadu_si256(src.add(i) as *const __m256i);
                    let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(x), one);
                    let r = _mm256_add_epi32(x, _mm256_add_epi32(bias, lsb));
                    let r = _mm256_and_si256(r, high);
                    // |x| above infinity's bits: a NaN (both sides non-negative as i32)
                    let nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs), inf);
                    let q = _mm256_or_si256(_mm256_and_si256(x, high), quiet);
                    let v = _mm256_blendv_epi8(r, q, nan);
                    _mm256_storeu_si256(dst.add(i) as *mut __m256i, v);
                    i += 8;
                }
            }
            for j in i..k {
                *dst.add(j) = super::round_to(dtype, *src.add(j));
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_rows(
        dtype: DType,
        a: *const u8,
        b: &[*const f32],
        k: usize,
        out: &mut [f32],
    ) {
        let n = b.len();
        // SAFETY: `a` has k elements and each b[j] k floats (caller's contract); loads stay
        // below k.
        unsafe {
            let mut acc0 = [_mm256_setzero_ps(); MV_MAX_N];
            let mut acc1 = [_mm256_setzero_ps(); MV_MAX_N];
            let mut i = 0;
            while i + 16 <= k {
                let x0 = load8(dtype, a, i);
                let x1 = load8(dtype, a, i + 8);
                for j in 0..n {
                    acc0[j] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(b[j].add(i)), acc0[j]);
                    acc1[j] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(b[j].add(i + 8)), acc1[j]);
                }
                i += 16;
            }
            while i + 8 <= k {
                let x0 = load8(dtype, a, i);
                for j in 0..n {
                    acc0[j] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(b[j].add(i)), acc0[j]);
                }
                i += 8;
            }
            for j in 0..n {
                let mut s = hsum(_mm256_add_ps(acc0[j], acc1[j]));
                for t in i..k {
                    s += super::load_f(dtype, a, t) * *b[j].add(t);
                }
                out[j] = s;
            }
        }
    }

    /// [`dot_rows`] of four rows of `a` against one column, each result bit-identical to
    /// `dot_rows`'s (the same two eight-lane accumulators per row, the same tail): one row's
    /// accumulators form a single chain of FMAs, so one row at a time runs at the FMA's
    /// latency (16 elements per 4 cycles, about 32 GB/s of f16 on a 4 GHz core); four rows
    /// give four independent chains and share the column's loads. Each row is prefetched 2 KiB
    /// ahead (four rows 8 KiB apart otherwise streamed at 26-31 GB/s from memory on a Zen 5
    /// core, 41-42 with it), and within 2 KiB of its end the row `next` bytes further on (the
    /// next call's rows, so that they do not start cold: f16 from memory 27-34 -> 33-36 GB/s
    /// on one Zen 5 thread, more the shorter the rows). A prefetch is only a hint: `next` may
    /// point anywhere.
    ///
    /// # Safety
    /// Every `a[r]` has k elements of `dtype`, `b` k floats; the CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_rows4(
        dtype: DType,
        a: [*const u8; 4],
        b: *const f32,
        k: usize,
        next: usize,
    ) -> [f32; 4] {
        // SAFETY: forwarded.
        unsafe {
            match dtype {
                DType::F32 => rows4::<0>(a, b, k, next),
                DType::F16 => rows4::<1>(a, b, k, next),
                _ => rows4::<2>(a, b, k, next),
            }
        }
    }

    /// [`dot_rows4`] for one element type (`T`: 0 f32, 1 f16, 2 bf16, as [`load8`] reads them).
    #[inline(always)]
    unsafe fn rows4<const T: u8>(
        a: [*const u8; 4],
        b: *const f32,
        k: usize,
        next: usize,
    ) -> [f32; 4] {
        let dtype = match T {
            0 => DType::F32,
            1 => DType::F16,
            _ => DType::BF16,
        };
        const PF: usize = 2048;
        let es: usize = if T == 0 { 4 } else { 2 };
        // SAFETY: as `dot_rows4`; loads stay below k.
        unsafe {
            let mut acc0 = [_mm256_setzero_ps(); 4];
            let mut acc1 = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i + 16 <= k {
                let (b0, b1) = (_mm256_loadu_ps(b.add(i)), _mm256_loadu_ps(b.add(i + 8)));
                if i % (64 / es) == 0 {
                    // past a row's end, the same place in the row `next` bytes on (the next
                    // call's), so that those rows start prefetched too
                    let ahead = es * i + PF;
                    let at = if ahead < es * k {
                        ahead
                    } else {
                        next.wrapping_add(ahead - es * k)
                    };
                    for &ar in &a {
                        _mm_prefetch::<_MM_HINT_T0>(ar.wrapping_add(at) as *const i8);
                    }
                }
                for r in 0..4 {
                    acc0[r] = _mm256_fmadd_ps(load8(dtype, a[r], i), b0, acc0[r]);
                    acc1[r] = _mm256_fmadd_ps(load8(dtype, a[r], i + 8), b1, acc1[r]);
                }
                i += 16;
            }
            while i + 8 <= k {
                let b0 = _mm256_loadu_ps(b.add(i));
                for r in 0..4 {
                    acc0[r] = _mm256_fmadd_ps(load8(dtype, a[r], i), b0, acc0[r]);
                }
                i += 8;
            }
            let mut out = [0f32; 4];
            for r in 0..4 {
                let mut s = hsum(_mm256_add_ps(acc0[r], acc1[r]));
                for t in i..k {
                    s += super::load_f(dtype, a[r], t) * *b.add(t);
                }
                out[r] = s;
            }
            out
        }
    }

    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn kernel_6x16(
        kc: usize,
        ap: *const f32,
        bp: *const f32,
        c: *mut f32,
        ldc: usize,
        rows: usize,
        cols: usize,
        accumulate: bool,
    ) {
        // SAFETY: ap holds kc*NR floats, bp kc*MR (packed panels); c the caller's tile.
        unsafe {
            let mut c00 = _mm256_setzero_ps();
            let mut c01 = _mm256_setzero_ps();
            let mut c10 = _mm256_setzero_ps();
            let mut c11 = _mm256_setzero_ps();
            let mut c20 = _mm256_setzero_ps();
            let mut c21 = _mm256_setzero_ps();
            let mut c30 = _mm256_setzero_ps();
            let mut c31 = _mm256_setzero_ps();
            let mut c40 = _mm256_setzero_ps();
            let mut c41 = _mm256_setzero_ps();
            let mut c50 = _mm256_setzero_ps();
            let mut c51 = _mm256_setzero_ps();
            let mut pa = ap;
            let mut pb = bp;
            for _ in 0..kc {
                // the b panel streams from L2: fetch a few iterations ahead
                _mm_prefetch(pb.add(MR * 8) as *const i8, _MM_HINT_T0);
                let a0 = _mm256_loadu_ps(pa);
                let a1 = _mm256_loadu_ps(pa.add(8));
                let b0 = _mm256_broadcast_ss(&*pb);
                c00 = _mm256_fmadd_ps(b0, a0, c00);
                c01 = _mm256_fmadd_ps(b0, a1, c01);
                let b1 = _mm256_broadcast_ss(&*pb.add(1));
                c10 = _mm256_fmadd_ps(b1, a0, c10);
                c11 = _mm256_fmadd_ps(b1, a1, c11);
                let b2 = _mm256_broadcast_ss(&*pb.add(2));
                c20 = _mm256_fmadd_ps(b2, a0, c20);
                c21 = _mm256_fmadd_ps(b2, a1, c21);
                let b3 = _mm256_broadcast_ss(&*pb.add(3));
                c30 = _mm256_fmadd_ps(b3, a0, c30);
                c31 = _mm256_fmadd_ps(b3, a1, c31);
                let b4 = _mm256_broadcast_ss(&*pb.add(4));
                c40 = _mm256_fmadd_ps(b4, a0, c40);
                c41 = _mm256_fmadd_ps(b4, a1, c41);
                let b5 = _mm256_broadcast_ss(&*pb.add(5));
                c50 = _mm256_fmadd_ps(b5, a0, c50);
                c51 = _mm256_fmadd_ps(b5, a1, c51);
                pa = pa.add(NR);
                pb = pb.add(MR);
            }
            let acc = [
                [c00, c01],
                [c10, c11],
                [c20, c21],
                [c30, c31],
                [c40, c41],
                [c50, c51],
            ];
            if rows == MR && cols == NR {
                for (r, pair) in acc.iter().enumerate() {
                    let p = c.add(r * ldc);
                    let (mut v0, mut v1) = (pair[0], pair[1]);
                    if accumulate {
                        v0 = _mm256_add_ps(v0, _mm256_loadu_ps(p));
                        v1 = _mm256_add_ps(v1, _mm256_loadu_ps(p.add(8)));
                    }
                    _mm256_storeu_ps(p, v0);
                    _mm256_storeu_ps(p.add(8), v1);
                }
            } else {
                let mut tile = [0f32; MR * NR];
                for (r, pair) in acc.iter().enumerate() {
                    _mm256_storeu_ps(tile.as_mut_ptr().add(r * NR), pair[0]);
                    _mm256_storeu_ps(tile.as_mut_ptr().add(r * NR + 8), pair[1]);
                }
                super::store_part(&tile, c, ldc, rows, cols, accumulate);
            }
        }
    }
}

/// The AVX-512 micro-kernel: two adjacent panels of `a` (32 rows) against one panel of `b`,
/// each output's sum formed by the same chain of fused multiply-adds as `avx2::kernel_6x16`,
/// so the results are the AVX2 kernel's bit for bit, at twice the width.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{MR, NR};
    use std::arch::x86_64::*;

    /// `C[r][j] (+)= Σ_k bp[k][r] · a[k][j]` for an `MR × 2·NR` tile, where the first `NR`
    /// columns come from the panel at `ap` and the next `NR` from the one after it
    /// (`ap + NR·kc`); `rows × cols` of the tile are kept.
    ///
    /// # Safety
    /// The CPU has AVX-512F (`Isa::Avx512`); `ap` holds two panels of `kc·NR` floats, `bp`
    /// one of `kc·MR`; `c` a tile with row stride `ldc` floats holding `rows × cols` elements.
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn kernel_6x32(
        kc: usize,
        ap: *const f32,
        bp: *const f32,
        c: *mut f32,
        ldc: usize,
        rows: usize,
        cols: usize,
        accumulate: bool,
    ) {
        // SAFETY: the caller's guarantees; stores are masked to `cols`.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 2]; MR];
            let mut pa0 = ap;
            let mut pa1 = ap.add(kc * NR);
            let mut pb = bp;
            for _ in 0..kc {
                _mm_prefetch::<_MM_HINT_T0>(pb.add(MR * 8) as *const i8);
                let a0 = _mm512_loadu_ps(pa0);
                let a1 = _mm512_loadu_ps(pa1);
                for (r, pair) in acc.iter_mut().enumerate() {
                    let b = _mm512_set1_ps(*pb.add(r));
                    pair[0] = _mm512_fmadd_ps(b, a0, pair[0]);
                    pair[1] = _mm512_fmadd_ps(b, a1, pair[1]);
                }
                pa0 = pa0.add(NR);
                pa1 = pa1.add(NR);
                pb = pb.add(MR);
            }
            let m0: u16 = if cols >= 16 {
                u16::MAX
            } else {
                (1u16 << cols) - 1
            };
            let m1: u16 = if cols >= 32 {
                u16::MAX
            } else if cols > 16 {
                (1u16 << (cols - 16)) - 1
            } else {
                0
            };
            for (r, pair) in acc.iter().enumerate().take(rows) {
                let p = c.add(r * ldc);
                let (mut v0, mut v1) = (pair[0], pair[1]);
                if accumulate {
                    v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, p));
                    v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, p.add(16)));
                }
                _mm512_mask_storeu_ps(p, m0, v0);
                _mm512_mask_storeu_ps(p.add(16), m1, v1);
            }
        }
    }
}

/// The aarch64 NEON float kernels: the AVX2 kernels' arithmetic lane for lane (an eight-lane
/// f32 accumulator is two four-lane registers; `vfmaq_f32` is the same fused multiply-add per
/// lane as `_mm256_fmadd_ps`; f16 widens through `fcvtl`, bf16 by a 16-bit shift, both exact;
/// the horizontal sums and tails in the AVX2 kernels' order), so every result has the x86
/// AVX2 path's bits (`tests/neon.rs` under qemu-aarch64 against the emulation that
/// `tests/matmul.rs` checks the AVX2 path against natively). No row prefetches: those were
/// tuned on x86 cores, and no aarch64 machine was available to measure one.
#[cfg(target_arch = "aarch64")]
// the `unsafe` blocks around intrinsics date from a minimum Rust version before they were safe
#[allow(unused_unsafe)]
mod neon {
    use super::{MR, MV_MAX_N, NR};
    use std::arch::aarch64::*;
    use tessera::DType;

    /// Eight f16 (bits) widened to f32: exact, as F16C's `vcvtph2ps` (`fcvtl`/`fcvtl2`; Rust's
    /// f16 vector types are not stable).
    #[inline(always)]
    unsafe fn widen_f16(h: uint16x8_t) -> [float32x4_t; 2] {
        let (lo, hi): (float32x4_t, float32x4_t);
        // SAFETY: register arithmetic; `out` registers do not overlap the input.
        unsafe {
            std::arch::asm!(
                "fcvtl {lo:v}.4s, {h:v}.4h",
                "fcvtl2 {hi:v}.4s, {h:v}.8h",
                h = in(vreg) h,
                lo = out(vreg) lo,
                hi = out(vreg) hi,
                options(pure, nomem, nostack, preserves_flags),
            )
        };
        [lo, hi]
    }

    /// Eight f32 rounded to f16 (to nearest, ties to even: F16C's `vcvtps2ph` with
    /// `_MM_FROUND_TO_NEAREST_INT`, and `half`) and widened back.
    #[inline(always)]
    unsafe fn round_f16(v: [float32x4_t; 2]) -> [float32x4_t; 2] {
        let h: uint16x8_t;
        // SAFETY: register arithmetic (FPCR's rounding mode is Linux's default, to nearest).
        unsafe {
            std::arch::asm!(
                "fcvtn {h:v}.4h, {lo:v}.4s",
                "fcvtn2 {h:v}.8h, {hi:v}.4s",
                lo = in(vreg) v[0],
                hi = in(vreg) v[1],
                h = out(vreg) h,
                options(pure, nomem, nostack, preserves_flags),
            );
            widen_f16(h)
        }
    }

    /// Eight elements of a row of `dtype` at element `i`, as f32.
    #[inline(always)]
    unsafe fn load8(dtype: DType, a: *const u8, i: usize) -> [float32x4_t; 2] {
        // SAFETY: the caller guarantees 8 readable elements at `i`.
        unsafe {
            match dtype {
                DType::F32 => {
                    let p = (a as *const f32).add(i);
                    [vld1q_f32(p), vld1q_f32(p.add(4))]
                }
                DType::F16 => widen_f16(vld1q_u16((a as *const u16).add(i))),
                _ => {
                    let h = vld1q_u16((a as *const u16).add(i));
                    [
                        vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(h))),
                        vreinterpretq_f32_u32(vshll_high_n_u16::<16>(h)),
                    ]
                }
            }
        }
    }

    /// `avx2::hsum` of the eight lanes `v`: ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)).
    #[inline(always)]
    unsafe fn hsum(v: [float32x4_t; 2]) -> f32 {
        // SAFETY: register arithmetic.
        unsafe {
            let s = vaddq_f32(v[0], v[1]);
            let t = vadd_f32(vget_low_f32(s), vget_high_f32(s));
            vget_lane_f32::<0>(t) + vget_lane_f32::<1>(t)
        }
    }

    /// `acc += x · b[0..8]`, lane by lane, fused.
    #[inline(always)]
    unsafe fn fma8(acc: &mut [float32x4_t; 2], x: [float32x4_t; 2], b: *const f32) {
        // SAFETY: 8 readable floats at b (caller).
        unsafe {
            acc[0] = vfmaq_f32(acc[0], x[0], vld1q_f32(b));
            acc[1] = vfmaq_f32(acc[1], x[1], vld1q_f32(b.add(4)));
        }
    }

    /// The eight-lane sum of a row's two accumulators, then its tail from element `i`, as
    /// `avx2::dot_rows` ends.
    #[inline(always)]
    unsafe fn finish(
        dtype: DType,
        acc0: [float32x4_t; 2],
        acc1: [float32x4_t; 2],
        a: *const u8,
        b: *const f32,
        i: usize,
        k: usize,
    ) -> f32 {
        // SAFETY: elements i..k of a and b (caller).
        unsafe {
            let mut s = hsum([vaddq_f32(acc0[0], acc1[0]), vaddq_f32(acc0[1], acc1[1])]);
            for t in i..k {
                s += super::load_f(dtype, a, t) * *b.add(t);
            }
            s
        }
    }

    /// `avx2::dot_rows`: one row of `a` against up to `MV_MAX_N` columns, the same bits.
    ///
    /// # Safety
    /// `a` has k elements of `dtype`, each `b[j]` k floats.
    pub unsafe fn dot_rows(
        dtype: DType,
        a: *const u8,
        b: &[*const f32],
        k: usize,
        out: &mut [f32],
    ) {
        let n = b.len();
        // SAFETY: loads stay below k (the caller's contract).
        unsafe {
            let z = [vdupq_n_f32(0.0); 2];
            let mut acc0 = [z; MV_MAX_N];
            let mut acc1 = [z; MV_MAX_N];
            let mut i = 0;
            while i + 16 <= k {
                let (x0, x1) = (load8(dtype, a, i), load8(dtype, a, i + 8));
                for j in 0..n {
                    fma8(&mut acc0[j], x0, b[j].add(i));
                    fma8(&mut acc1[j], x1, b[j].add(i + 8));
                }
                i += 16;
            }
            while i + 8 <= k {
                let x0 = load8(dtype, a, i);
                for j in 0..n {
                    fma8(&mut acc0[j], x0, b[j].add(i));
                }
                i += 8;
            }
            for j in 0..n {
                out[j] = finish(dtype, acc0[j], acc1[j], a, b[j], i, k);
            }
        }
    }

    /// [`dot_rows`] of four rows against one column (four independent chains, the column's
    /// loads shared), each row's bits those of `dot_rows`.
    ///
    /// # Safety
    /// Every `a[r]` has k elements of `dtype`, `b` k floats.
    pub unsafe fn dot_rows4(dtype: DType, a: [*const u8; 4], b: *const f32, k: usize) -> [f32; 4] {
        // SAFETY: forwarded.
        unsafe {
            match dtype {
                DType::F32 => rows4::<0>(a, b, k),
                DType::F16 => rows4::<1>(a, b, k),
                _ => rows4::<2>(a, b, k),
            }
        }
    }

    /// [`dot_rows4`] for one element type (`T`: 0 f32, 1 f16, 2 bf16).
    #[inline(always)]
    unsafe fn rows4<const T: u8>(a: [*const u8; 4], b: *const f32, k: usize) -> [f32; 4] {
        let dtype = match T {
            0 => DType::F32,
            1 => DType::F16,
            _ => DType::BF16,
        };
        // SAFETY: as `dot_rows4`; loads stay below k.
        unsafe {
            let z = [vdupq_n_f32(0.0); 2];
            let mut acc0 = [z; 4];
            let mut acc1 = [z; 4];
            let mut i = 0;
            while i + 16 <= k {
                for r in 0..4 {
                    fma8(&mut acc0[r], load8(dtype, a[r], i), b.add(i));
                    fma8(&mut acc1[r], load8(dtype, a[r], i + 8), b.add(i + 8));
                }
                i += 16;
            }
            while i + 8 <= k {
                for r in 0..4 {
                    fma8(&mut acc0[r], load8(dtype, a[r], i), b.add(i));
                }
                i += 8;
            }
            std::array::from_fn(|r| finish(dtype, acc0[r], acc1[r], a[r], b, i, k))
        }
    }

    /// `avx2::convert_row`: `out.len()` f16/bf16 elements from element `k0` of a dense row.
    ///
    /// # Safety
    /// The row holds k0 + out.len() elements.
    pub unsafe fn convert_row(dtype: DType, row: *const u8, k0: usize, out: &mut [f32]) {
        // SAFETY: loads and stores below out.len() (the caller's contract).
        unsafe {
            let mut i = 0;
            while i + 8 <= out.len() {
                let v = load8(dtype, row, k0 + i);
                vst1q_f32(out.as_mut_ptr().add(i), v[0]);
                vst1q_f32(out.as_mut_ptr().add(i + 4), v[1]);
                i += 8;
            }
            for (j, o) in out.iter_mut().enumerate().skip(i) {
                *o = super::load_f(dtype, row, k0 + j);
            }
        }
    }

    /// `avx2::round_row`: `k` f32 rounded to f16 (`fcvtn`) or to bf16 (`half`'s integer rule:
    /// to nearest even, a NaN quieted) and widened back: `round_to`'s bits.
    ///
    /// # Safety
    /// `src` and `dst` hold `k` f32.
    pub unsafe fn round_row(dtype: DType, src: *const f32, dst: *mut f32, k: usize) {
        // SAFETY: loads and stores below k (the caller's contract).
        unsafe {
            let mut i = 0;
            if dtype == DType::F16 {
                while i + 8 <= k {
                    let v = round_f16([vld1q_f32(src.add(i)), vld1q_f32(src.add(i + 4))]);
                    vst1q_f32(dst.add(i), v[0]);
                    vst1q_f32(dst.add(i + 4), v[1]);
                    i += 8;
                }
            } else {
                let one = vdupq_n_u32(1);
                let bias = vdupq_n_u32(0x7fff);
                let high = vdupq_n_u32(0xffff_0000);
                let quiet = vdupq_n_u32(0x0040_0000);
                let abs = vdupq_n_u32(0x7fff_ffff);
                let inf = vdupq_n_u32(0x7f80_0000);
                while i + 4 <= k {
                    let x = vld1q_u32(src.add(i) as *const u32);
                    let lsb = vandq_u32(vshrq_n_u32::<16>(x), one);
                    let r = vandq_u32(vaddq_u32(x, vaddq_u32(bias, lsb)), high);
                    // |x| above infinity's bits: a NaN
                    let nan = vcgtq_u32(vandq_u32(x, abs), inf);
                    let q = vorrq_u32(vandq_u32(x, high), quiet);
                    vst1q_u32(dst.add(i) as *mut u32, vbslq_u32(nan, q, r));
                    i += 4;
                }
            }
            for j in i..k {
                *dst.add(j) = super::round_to(dtype, *src.add(j));
            }
        }
    }

    /// `avx2::kernel_6x16`: `C[r][j] (+)= Σ_k bp[k][r] · ap[k][j]` for an `MR × NR` tile, each
    /// element the same chain of fused multiply-adds, so the same bits.
    ///
    /// # Safety
    /// ap holds kc·NR floats, bp kc·MR; `c` a tile with row stride `ldc` floats holding at
    /// least `rows × cols` elements.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn kernel_6x16(
        kc: usize,
        ap: *const f32,
        bp: *const f32,
        c: *mut f32,
        ldc: usize,
        rows: usize,
        cols: usize,
        accumulate: bool,
    ) {
        // SAFETY: as documented.
        unsafe {
            let mut acc = [[vdupq_n_f32(0.0); NR / 4]; MR];
            let (mut pa, mut pb) = (ap, bp);
            for _ in 0..kc {
                let av: [float32x4_t; NR / 4] = [
                    vld1q_f32(pa),
                    vld1q_f32(pa.add(4)),
                    vld1q_f32(pa.add(8)),
                    vld1q_f32(pa.add(12)),
                ];
                for (r, row) in acc.iter_mut().enumerate() {
                    let bv = vld1q_dup_f32(pb.add(r));
                    for (cq, &aq) in row.iter_mut().zip(&av) {
                        *cq = vfmaq_f32(*cq, bv, aq);
                    }
                }
                pa = pa.add(NR);
                pb = pb.add(MR);
            }
            if rows == MR && cols == NR {
                for (r, row) in acc.iter().enumerate() {
                    let p = c.add(r * ldc);
                    for (q, &v) in row.iter().enumerate() {
                        let v = if accumulate {
                            vaddq_f32(v, vld1q_f32(p.add(4 * q)))
                        } else {
                            v
                        };
                        vst1q_f32(p.add(4 * q), v);
                    }
                }
            } else {
                let mut tile = [0f32; MR * NR];
                for (r, row) in acc.iter().enumerate() {
                    for (q, &v) in row.iter().enumerate() {
                        vst1q_f32(tile.as_mut_ptr().add(r * NR + 4 * q), v);
                    }
                }
                super::store_part(&tile, c, ldc, rows, cols, accumulate);
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::avx2;
    use tessera::DType;

    /// `avx2::dot_rows4` gives every row `avx2::dot_rows`'s bits, for f32, f16 and bf16 rows
    /// of every length (the 16-element loop, the eight-element step, the scalar tail).
    #[test]
    fn four_rows_at_once_equal_one_row_at_a_time() {
        if !(is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c"))
        {
            eprintln!("four_rows_at_once_equal_one_row_at_a_time: no AVX2/FMA/F16C here");
            return;
        }
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
        };
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for k in (1..=70).chain([127, 128, 129, 255, 256, 257, 1000, 4096]) {
                let rows: Vec<Vec<u8>> = (0..4)
                    .map(|_| {
                        (0..k)
                            .flat_map(|_| {
                                let v = next();
                                match dtype {
                                    DType::F32 => v.to_le_bytes().to_vec(),
                                    DType::F16 => half::f16::from_f32(v).to_le_bytes().to_vec(),
                                    _ => half::bf16::from_f32(v).to_le_bytes().to_vec(),
                                }
                            })
                            .collect()
                    })
                    .collect();
                let b: Vec<f32> = (0..k).map(|_| next()).collect();
                let ptrs: [*const u8; 4] = std::array::from_fn(|r| rows[r].as_ptr());
                // SAFETY: the CPU has AVX2, FMA and F16C (checked above); every row holds k
                // elements of dtype and b k floats.
                let four = unsafe { avx2::dot_rows4(dtype, ptrs, b.as_ptr(), k, 0) };
                for (r, &got) in four.iter().enumerate() {
                    let mut one = [0f32];
                    // SAFETY: as above.
                    unsafe { avx2::dot_rows(dtype, ptrs[r], &[b.as_ptr()], k, &mut one) };
                    assert_eq!(
                        got.to_bits(),
                        one[0].to_bits(),
                        "{dtype:?} k={k} row {r}: four rows {got}, one row {}",
                        one[0]
                    );
                }
            }
        }
    }
}
