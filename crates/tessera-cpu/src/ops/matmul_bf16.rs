//! mul_mat for bf16 weights on CPUs with AVX-512 BF16 (`vdpbf16ps`: 16 lanes, each adding two
//! bf16 products to an f32 accumulator per instruction). Used by `matmul` under `Isa::Avx512`
//! when the CPU also has AVX512_BF16 (Cooper Lake, Sapphire Rapids and later, Zen 4 and later);
//! elsewhere bf16 weights take the AVX2/FMA path, which widens them to f32.
//!
//! As in ggml (`ggml_vec_dot_bf16` and llamafile's tinyBLAS under `__AVX512BF16__`), the
//! activations are first rounded to bf16 (`matmul::compute` does that for every ISA) and each
//! pair of elements `(2j, 2j+1)` of a 32-element step lands in lane `j`, the odd product added
//! before the even one, each addition rounded to nearest even, with bf16 denormals read as zero
//! and denormal sums flushed to zero (the instruction's fixed rules; MXCSR is not consulted).
//! So a sum differs from the AVX2 path's in its last bits (a different order of f32 additions),
//! never in the products, which are exact in f32.
//!
//! The mat-vec (`dot_rows`, up to `MV_MAX_N` columns): two accumulators per column over
//! alternating 32-element steps (ggml's `c1`/`c2`), a masked last step, and a fixed reduction:
//! the two accumulators added, the 512-bit vector folded to 256 bits (low + high half) and then
//! to one value as the AVX2 path's `hsum` does. [`dot_emulated`] computes the same thing in
//! plain Rust, bit for bit; the tests compare the two. One column takes four rows a call
//! (`dot_rows4`: the column's pairs formed once, eight chains in flight, each row's bits
//! unchanged).
//!
//! The GEMM (`gemm`, more columns), on AMD CPUs only ([`gemm_available`]): `a`'s rows and
//! `b`'s columns packed as bf16 pairs (eight-by-eight transposes), a tile of 8 columns × 32 rows
//! in sixteen accumulators, one accumulator per output and `KC` block running through the
//! block's pairs in order, the blocks' sums added in f32 ([`gemm_dot_emulated`], bit for bit).
//!
//! Where it pays: on a Xeon with AVX512_BF16 (`tessera bench-ops --only quant --types bf16`,
//! three runs alternating with `TESSERA_ISA=avx2`) the mat-vec streams bf16 weights 1.5–2×
//! faster than the AVX2 path (1536×576 on one thread: 21–33 against 13–19 GB/s), but a GEMM
//! on `vdpbf16ps` ran at the AVX2 GEMM's 67 GFLOP/s on one thread, because that CPU retires one
//! `vdpbf16ps` every two cycles, while widening bf16 to f32 while packing and running the
//! AVX-512 f32 micro-kernel (`matmul::avx512`, two 512-bit FMAs a cycle) reaches 115: Intel's
//! bf16 GEMMs take that path. Zen 5 retires two 512-bit `vdpbf16ps` a cycle (measured: they
//! share the two FMA pipes), 64 products against the FMAs' 32: its bf16 GEMM reaches 460–520
//! GFLOP/s on one thread where the widened f32 path gave 185–220.

use tessera::{DType, Result, Tensor};

use super::matmul::{split_work, BView, KC, MC, NR};
use crate::exec::NodeCtx;
use crate::simd::Isa;

/// Output columns (of `b`) per tile of the `vdpbf16ps` GEMM: 8 columns × two 16-row panels
/// keep 16 accumulators in flight, enough for two instructions a cycle at their latency.
pub const GEMM_MR: usize = 8;

/// Whether bf16 weights take this module's kernels under `isa`: the CPU has AVX512_BF16 and
/// the backend runs AVX-512 (`TESSERA_ISA=avx2`, or `CpuBackend::with_isa(_, Isa::Avx2)`,
/// keeps the AVX2 path).
pub fn available(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        isa == Isa::Avx512
            && *HAS.get_or_init(|| {
                is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512dq")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512bf16")
            })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// Whether bf16 GEMMs (more than `MV_MAX_N` columns) take `gemm`: [`available`] and the CPU
/// is AMD's. Zen 5 retires two 512-bit `vdpbf16ps` a cycle (64 products, measured), twice the
/// products of its two FMAs; the Xeon measured earlier retired one every two cycles, a quarter
/// of its FMAs' products, so Intel CPUs keep widening to f32 (see the module doc).
pub fn gemm_available(isa: Isa) -> bool {
    available(isa) && crate::simd::amd()
}

/// The bf16 bits of `v` (an f32 the caller has already rounded to bf16: exact).
#[inline(always)]
fn bf16_bits(v: f32) -> u32 {
    v.to_bits() >> 16
}

/// `vdpbf16ps`'s value of a bf16 operand: denormals read as zero.
fn daz(bits: u16) -> f32 {
    let v = f32::from_bits((bits as u32) << 16);
    if v != 0.0 && v.abs() < f32::MIN_POSITIVE {
        0.0f32.copysign(v)
    } else {
        v
    }
}

/// One lane of `vdpbf16ps`: `acc + x·y` rounded to nearest even (the product of two bf16 is
/// exact in f32), a denormal result flushed to zero.
fn dp_step(acc: f32, x: u16, y: u16) -> f32 {
    let r = acc + daz(x) * daz(y);
    if r != 0.0 && r.abs() < f32::MIN_POSITIVE {
        0.0f32.copysign(r)
    } else {
        r
    }
}

/// The mat-vec kernel's value of `Σ_i a[i] · b[i]` computed in plain Rust with
/// `vdpbf16ps`'s rules and the kernel's order (see the module doc): what [`dot_rows`] returns,
/// bit for bit. `a` holds bf16 bits, `b` f32 values already rounded to bf16.
pub fn dot_emulated(a: &[u16], b: &[f32]) -> f32 {
    let k = a.len().min(b.len());
    let mut acc = [[0f32; 16]; 2];
    for (step, i0) in (0..k).step_by(32).enumerate() {
        let lanes = &mut acc[step % 2];
        let at = |i: usize| -> (u16, u16) {
            if i < k {
                (a[i], bf16_bits(b[i]) as u16)
            } else {
                (0, 0)
            }
        };
        for (j, l) in lanes.iter_mut().enumerate() {
            let (xo, yo) = at(i0 + 2 * j + 1);
            let (xe, ye) = at(i0 + 2 * j);
            *l = dp_step(dp_step(*l, xo, yo), xe, ye);
        }
    }
    let mut v = [0f32; 16];
    for (j, x) in v.iter_mut().enumerate() {
        *x = acc[0][j] + acc[1][j];
    }
    let mut h = [0f32; 8];
    for (j, x) in h.iter_mut().enumerate() {
        *x = v[j] + v[j + 8];
    }
    // the AVX2 `hsum`: 128-bit halves, then movehl, then the two last lanes
    let q = [h[0] + h[4], h[1] + h[5], h[2] + h[6], h[3] + h[7]];
    let p = [q[0] + q[2], q[1] + q[3]];
    p[0] + p[1]
}

/// The GEMM's value of `Σ_i a[i] · b[i]` (see `gemm`) computed in plain Rust, bit for bit:
/// for each block of `kc` elements (the packed depth, [`KC`]) one accumulator starts at zero
/// and takes the block's pairs `(2j, 2j+1)` in order with `vdpbf16ps`'s rules (odd product
/// first; a missing odd element of an odd-length block counts as +0), and the blocks' sums
/// are added up in order in plain f32. `a` holds bf16 bits, `b` f32 values already rounded to
/// bf16.
pub fn gemm_dot_emulated(a: &[u16], b: &[f32], kc: usize) -> f32 {
    let k = a.len().min(b.len());
    let mut c = 0f32;
    for (blk, k0) in (0..k).step_by(kc).enumerate() {
        let k1 = (k0 + kc).min(k);
        let mut acc = 0f32;
        for i in (k0..k1).step_by(2) {
            let (xo, yo) = if i + 1 < k1 {
                (a[i + 1], bf16_bits(b[i + 1]) as u16)
            } else {
                (0, 0)
            };
            acc = dp_step(dp_step(acc, xo, yo), a[i], bf16_bits(b[i]) as u16);
        }
        c = if blk == 0 { acc } else { c + acc };
    }
    c
}

/// The pair of bf16 elements `(k0 + 2j, k0 + 2j + 1)` as `vdpbf16ps` reads it: the even one
/// in the low 16 bits; past `k` a zero.
///
/// # Safety
/// `row` holds `k` elements of `dtype` (bf16 bits, or f32 values rounded to bf16) at stride
/// `stride` bytes.
#[inline(always)]
unsafe fn pair(dtype: DType, row: *const u8, stride: usize, i: usize, k: usize) -> u32 {
    let mut v = 0u32;
    for (h, e) in [i, i + 1].into_iter().enumerate() {
        if e < k {
            // SAFETY: element `e < k` of the row (the caller's guarantee).
            let bits = unsafe {
                let p = row.add(e * stride);
                match dtype {
                    DType::BF16 => (p as *const u16).read_unaligned() as u32,
                    _ => bf16_bits((p as *const f32).read_unaligned()),
                }
            };
            v |= bits << (16 * h);
        }
    }
    v
}

/// Packs `width` rows (bf16) or columns (f32 rounded to bf16) of `kc` elements at element
/// stride `stride` bytes into pair-major form, element by element: pair `j` of line `r` at
/// `panel[j·width + r]`; lines `at` gives no pointer for are zeros.
///
/// # Safety
/// Every pointer `at` gives holds `kc` elements of `dtype` at that stride.
unsafe fn pack_strided(
    panel: &mut [u32],
    width: usize,
    kc: usize,
    dtype: DType,
    stride: usize,
    at: impl Fn(usize) -> Option<*const u8>,
) {
    for r in 0..width {
        let line = at(r);
        for j in 0..kc.div_ceil(2) {
            panel[j * width + r] = match line {
                // SAFETY: the caller's guarantee.
                Some(p) => unsafe { pair(dtype, p, stride, 2 * j, kc) },
                None => 0,
            };
        }
    }
}

/// The bf16 GEMM on `vdpbf16ps` ([`gemm_available`]): `matmul::compute`'s GEMM with `a`'s rows
/// and `b`'s columns (already rounded to bf16) packed as bf16 pairs, a `GEMM_MR × 2·NR` tile
/// per kernel call (`NR` when a block has one panel left). The work split, blocking and
/// padding follow `matmul::gemm`; every output is [`gemm_dot_emulated`] of its row and column,
/// so the result does not depend on the thread count.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
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
    let per = super::matmul::work_per_thread();
    let kp_max = KC / 2;
    let nc = super::matmul::NC.next_multiple_of(GEMM_MR);
    debug_assert!((MC * kp_max + nc * kp_max) * 4 <= per);
    // SAFETY: each thread owns bytes [off + ith*per, off + (ith+1)*per) of the work buffer
    // (`matmul::compute` checked its size; it holds MC·KC + NC·KC f32, more than the pairs
    // need); the buffer is 64-byte aligned and `per` a multiple of 64.
    let (ap, bp) = unsafe {
        let base = ctx.wdata.add(scratch_off + ctx.ith * per) as *mut u32;
        (
            std::slice::from_raw_parts_mut(base, MC * kp_max),
            std::slice::from_raw_parts_mut(base.add(MC * kp_max), nc * kp_max),
        )
    };
    for job in ctx.share(jobs) {
        let (a_base, b_base, d_base, rows_a, cols_b) =
            sp.span(job, GEMM_MR, (a, b, d), (m, n), (r2, r3));
        let (m0, m1) = (rows_a.start, rows_a.end);
        let (nj0, nj1) = (cols_b.start, cols_b.end);
        let mut k0 = 0;
        while k0 < k {
            let kc = KC.min(k - k0);
            let kp = kc.div_ceil(2);
            // a[m0..m1, k0..k0+kc] as panels of NR rows, pair-major inside a panel
            for (p, mp) in (m0..m1).step_by(NR).enumerate() {
                let panel = &mut ap[p * NR * kp..(p + 1) * NR * kp];
                #[cfg(target_arch = "x86_64")]
                if a.nb[0] == 2 {
                    let row = |r: usize| {
                        // SAFETY: rows below m1 lie in `a`'s span (validated): pointer
                        // arithmetic only, the kernel reads `kc` elements of each.
                        (mp + r < m1).then(|| unsafe {
                            ctx.src[0].add(a_base + (mp + r) * a.nb[1] + k0 * 2) as *const u16
                        })
                    };
                    let rows: [Option<*const u16>; NR] = std::array::from_fn(row);
                    // SAFETY: each present row holds `kc` bf16 from k0; the panel has NR·kp
                    // slots; `gemm_available` checked the CPU.
                    unsafe { x86::pack_rows::<NR>(&rows, kc, panel.as_mut_ptr()) };
                    continue;
                }
                // SAFETY: row `mp + r` below m1 of `a` in this batch has `k` bf16 at stride
                // nb0 (pointer arithmetic only here).
                let row = |r: usize| {
                    (mp + r < m1).then(|| unsafe {
                        ctx.src[0].add(a_base + (mp + r) * a.nb[1] + k0 * a.nb[0])
                    })
                };
                // SAFETY: as above, `kc` elements from k0.
                unsafe { pack_strided(panel, NR, kc, DType::BF16, a.nb[0], row) };
            }
            let accumulate = k0 > 0;
            let mut n0 = nj0;
            while n0 < nj1 {
                let n1 = (n0 + nc).min(nj1);
                // b[n0..n1, k0..k0+kc] as panels of GEMM_MR columns
                for (q, nq) in (n0..n1).step_by(GEMM_MR).enumerate() {
                    let panel = &mut bp[q * GEMM_MR * kp..(q + 1) * GEMM_MR * kp];
                    #[cfg(target_arch = "x86_64")]
                    if b.nb[0] == 4 {
                        let col = |r: usize| {
                            // SAFETY: columns below n1 lie in `b`'s span: pointer arithmetic
                            // only, the kernel reads `kc` f32 of each.
                            (nq + r < n1).then(|| unsafe {
                                bsrc.add(b_base + (nq + r) * b.nb[1] + k0 * 4) as *const f32
                            })
                        };
                        let cols: [Option<*const f32>; GEMM_MR] = std::array::from_fn(col);
                        // SAFETY: each present column holds `kc` f32 from k0; the panel has
                        // GEMM_MR·kp slots; `gemm_available` checked the CPU.
                        unsafe { x86::pack_columns(&cols, kc, panel.as_mut_ptr()) };
                        continue;
                    }
                    // SAFETY: column `nq + r` below n1 of `b` in this batch has `k` f32 at
                    // stride nb0 (pointer arithmetic only here).
                    let col = |r: usize| {
                        (nq + r < n1).then(|| unsafe {
                            bsrc.add(b_base + (nq + r) * b.nb[1] + k0 * b.nb[0])
                        })
                    };
                    // SAFETY: as above, `kc` elements from k0.
                    unsafe { pack_strided(panel, GEMM_MR, kc, DType::F32, b.nb[0], col) };
                }
                let npanels = (m1 - m0).div_ceil(NR);
                let mut p = 0;
                while p < npanels {
                    let mp = m0 + p * NR;
                    let width = if p + 1 < npanels { 2 } else { 1 };
                    let apanel = &ap[p * NR * kp..(p + width) * NR * kp];
                    let cols = (width * NR).min(m1 - mp);
                    for (q, nq) in (n0..n1).step_by(GEMM_MR).enumerate() {
                        let bpanel = &bp[q * GEMM_MR * kp..(q + 1) * GEMM_MR * kp];
                        let rows = GEMM_MR.min(n1 - nq);
                        // SAFETY: the tile dst[nq..nq+rows, mp..mp+cols] lies inside `dst` and
                        // belongs to this job alone; `gemm_available` checked the CPU.
                        #[cfg(target_arch = "x86_64")]
                        unsafe {
                            let c = ctx.dst.add(d_base + nq * d.nb[1] + mp * 4) as *mut f32;
                            let ldc = d.nb[1] / 4;
                            let (pa, pb) = (apanel.as_ptr(), bpanel.as_ptr());
                            if width == 2 {
                                x86::gemm_kernel::<2>(kp, pa, pb, c, ldc, rows, cols, accumulate);
                            } else {
                                x86::gemm_kernel::<1>(kp, pa, pb, c, ldc, rows, cols, accumulate);
                            }
                        }
                        #[cfg(not(target_arch = "x86_64"))]
                        let _ = (apanel, bpanel, rows, cols, d_base, accumulate);
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

#[cfg(target_arch = "x86_64")]
pub use x86::{dot_rows, dot_rows4, gemm_kernel};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use crate::ops::matmul::MV_MAX_N;
    use std::arch::x86_64::*;

    /// 32 bf16 values in a register as `vdpbf16ps` reads them.
    #[inline(always)]
    unsafe fn bh(v: __m512i) -> __m512bh {
        // SAFETY: both are 512 bits of plain data.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
    }

    /// The kernel's fixed reduction of two accumulators (see the module doc).
    #[inline(always)]
    unsafe fn reduce(a: __m512, b: __m512) -> f32 {
        // SAFETY: register arithmetic; the caller enabled AVX-512F.
        unsafe {
            let v = _mm512_add_ps(a, b);
            let h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps::<1>(v));
            let lo = _mm256_castps256_ps128(h);
            let hi = _mm256_extractf128_ps::<1>(h);
            let s = _mm_add_ps(lo, hi);
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
            _mm_cvtss_f32(s)
        }
    }

    /// Transposes eight rows of eight 32-bit values: `out[j]` holds element `j` of every row.
    #[inline(always)]
    unsafe fn transpose8(r: [__m256i; 8]) -> [__m256i; 8] {
        // SAFETY: register shuffles; the caller enabled AVX2.
        unsafe {
            let t0 = _mm256_unpacklo_epi32(r[0], r[1]);
            let t1 = _mm256_unpackhi_epi32(r[0], r[1]);
            let t2 = _mm256_unpacklo_epi32(r[2], r[3]);
            let t3 = _mm256_unpackhi_epi32(r[2], r[3]);
            let t4 = _mm256_unpacklo_epi32(r[4], r[5]);
            let t5 = _mm256_unpackhi_epi32(r[4], r[5]);
            let t6 = _mm256_unpacklo_epi32(r[6], r[7]);
            let t7 = _mm256_unpackhi_epi32(r[6], r[7]);
            let u0 = _mm256_unpacklo_epi64(t0, t2);
            let u1 = _mm256_unpackhi_epi64(t0, t2);
            let u2 = _mm256_unpacklo_epi64(t1, t3);
            let u3 = _mm256_unpackhi_epi64(t1, t3);
            let u4 = _mm256_unpacklo_epi64(t4, t6);
            let u5 = _mm256_unpackhi_epi64(t4, t6);
            let u6 = _mm256_unpacklo_epi64(t5, t7);
            let u7 = _mm256_unpackhi_epi64(t5, t7);
            [
                _mm256_permute2x128_si256::<0x20>(u0, u4),
                _mm256_permute2x128_si256::<0x20>(u1, u5),
                _mm256_permute2x128_si256::<0x20>(u2, u6),
                _mm256_permute2x128_si256::<0x20>(u3, u7),
                _mm256_permute2x128_si256::<0x31>(u0, u4),
                _mm256_permute2x128_si256::<0x31>(u1, u5),
                _mm256_permute2x128_si256::<0x31>(u2, u6),
                _mm256_permute2x128_si256::<0x31>(u3, u7),
            ]
        }
    }

    /// Packs `R` (a multiple of 8) dense bf16 rows of `kc` elements into `R`-row pair-major
    /// form: pair `j` of row `r` at `panel[j·R + r]`, pairs past `kc` and absent rows zero —
    /// what [`super::pair`] gives element by element, eight pairs of eight rows at a time.
    ///
    /// # Safety
    /// Every present row holds `kc` bf16; `panel` has `R·⌈kc/2⌉` slots; AVX-512 F/BW.
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    pub unsafe fn pack_rows<const R: usize>(
        rows: &[Option<*const u16>; R],
        kc: usize,
        panel: *mut u32,
    ) {
        let kp = kc.div_ceil(2);
        let full = kc / 16; // chunks of eight whole pairs
                            // SAFETY: loads below kc of present rows; stores below R·kp.
        unsafe {
            for g in 0..R / 8 {
                for c in 0..full {
                    let v: [__m256i; 8] = std::array::from_fn(|r| match rows[g * 8 + r] {
                        Some(p) => _mm256_loadu_si256(p.add(16 * c) as *const __m256i),
                        None => _mm256_setzero_si256(),
                    });
                    for (j, t) in transpose8(v).into_iter().enumerate() {
                        _mm256_storeu_si256(panel.add((8 * c + j) * R + 8 * g) as *mut __m256i, t);
                    }
                }
            }
            for (r, row) in rows.iter().enumerate() {
                for j in 8 * full..kp {
                    *panel.add(j * R + r) = match row {
                        Some(p) => super::pair(tessera::DType::BF16, *p as *const u8, 2, 2 * j, kc),
                        None => 0,
                    };
                }
            }
        }
    }

    /// Packs `GEMM_MR` (8) dense f32 columns holding bf16-rounded values into pair-major form:
    /// pair `j` of column `r` at `panel[j·8 + r]` (the bf16 bits of elements 2j and 2j+1),
    /// zeros past `kc` and for absent columns; [`super::pair`]'s values, eight pairs at a time.
    ///
    /// # Safety
    /// Every present column holds `kc` f32; `panel` has `8·⌈kc/2⌉` slots; AVX-512 F/BW.
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    pub unsafe fn pack_columns(
        cols: &[Option<*const f32>; super::GEMM_MR],
        kc: usize,
        panel: *mut u32,
    ) {
        const { assert!(super::GEMM_MR == 8) };
        let kp = kc.div_ceil(2);
        let full = kc / 16;
        // SAFETY: loads below kc of present columns; stores below 8·kp.
        unsafe {
            for c in 0..full {
                let v: [__m256i; 8] = std::array::from_fn(|r| match cols[r] {
                    // the high halves of sixteen f32, in order: eight pairs
                    Some(p) => _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(_mm512_loadu_si512(
                        p.add(16 * c) as *const _,
                    ))),
                    None => _mm256_setzero_si256(),
                });
                for (j, t) in transpose8(v).into_iter().enumerate() {
                    _mm256_storeu_si256(panel.add((8 * c + j) * 8) as *mut __m256i, t);
                }
            }
            for (r, col) in cols.iter().enumerate() {
                for j in 8 * full..kp {
                    *panel.add(j * 8 + r) = match col {
                        Some(p) => super::pair(tessera::DType::F32, *p as *const u8, 4, 2 * j, kc),
                        None => 0,
                    };
                }
            }
        }
    }

    /// `gemm`'s micro-kernel: `C[r][j] (+)= Σ_p bp[p][r] · ap[p][j]` over `kp` bf16
    /// pairs for a `GEMM_MR × (W·NR)` tile, `W` panels of `NR` rows each (`W` = 1 or 2); `rows
    /// × cols` of it kept.
    ///
    /// # Safety
    /// The CPU has AVX-512 BF16 ([`super::available`]); `ap` holds `W` panels of `kp·NR`
    /// pairs, `bp` `kp·GEMM_MR` pairs; `c` a tile with row stride `ldc` floats holding `rows ×
    /// cols` elements.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm_kernel<const W: usize>(
        kp: usize,
        ap: *const u32,
        bp: *const u32,
        c: *mut f32,
        ldc: usize,
        rows: usize,
        cols: usize,
        accumulate: bool,
    ) {
        use super::{GEMM_MR, NR};
        // SAFETY: the caller's guarantees; stores are masked to `cols`.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); W]; GEMM_MR];
            let mut pa = ap;
            let mut pb = bp;
            for _ in 0..kp {
                let mut x = [_mm512_setzero_si512(); W];
                for (w, x) in x.iter_mut().enumerate() {
                    *x = _mm512_loadu_si512(pa.add(w * kp * NR) as *const _);
                }
                for (r, row) in acc.iter_mut().enumerate() {
                    let y = bh(_mm512_set1_epi32(*pb.add(r) as i32));
                    for w in 0..W {
                        row[w] = _mm512_dpbf16_ps(row[w], bh(x[w]), y);
                    }
                }
                pa = pa.add(NR);
                pb = pb.add(GEMM_MR);
            }
            for (r, row) in acc.iter().enumerate().take(rows) {
                let p = c.add(r * ldc);
                for (w, &v) in row.iter().enumerate() {
                    let lo = w * NR;
                    let mask: u16 = if cols >= lo + NR {
                        u16::MAX
                    } else if cols > lo {
                        (1u16 << (cols - lo)) - 1
                    } else {
                        0
                    };
                    let mut v = v;
                    if accumulate {
                        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, p.add(lo)));
                    }
                    _mm512_mask_storeu_ps(p.add(lo), mask, v);
                }
            }
        }
    }

    /// `out[j] = Σ_i a[i] · b_j[i]` for one bf16 row against up to `MV_MAX_N` f32 columns
    /// holding bf16-rounded values; equals [`super::dot_emulated`] bit for bit.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/DQ and BF16 ([`super::available`]); `a` points at `k` bf16
    /// values and each `b[j]` at `k` f32; `out.len() == b.len() <= MV_MAX_N`.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")]
    pub unsafe fn dot_rows(a: *const u16, b: &[*const f32], k: usize, out: &mut [f32]) {
        // SAFETY: the caller's guarantees, passed on; the column count picks the body.
        unsafe {
            match b.len() {
                1 => rows::<1>(a, b, k, out),
                2 => rows::<2>(a, b, k, out),
                3 => rows::<3>(a, b, k, out),
                _ => rows::<MV_MAX_N>(a, b, k, out),
            }
        }
    }

    /// [`dot_rows`] of four rows against one column: each row's operations and order are
    /// `dot_rows`'s (so its bits), the column's bf16 pairs formed once for the four rows and
    /// eight chains of `vdpbf16ps` in flight instead of two.
    ///
    /// # Safety
    /// As [`dot_rows`], for each of the four rows, with one column.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")]
    pub unsafe fn dot_rows4(a: [*const u16; 4], b: *const f32, k: usize) -> [f32; 4] {
        // SAFETY: full loads stay below k; the last step's loads are masked to the elements
        // below k (masked-off lanes are neither read nor faulted on).
        unsafe {
            let col = |i: usize| {
                _mm512_cvtne2ps_pbh(_mm512_loadu_ps(b.add(i + 16)), _mm512_loadu_ps(b.add(i)))
            };
            let row = |r: usize, i: usize| bh(_mm512_loadu_si512(a[r].add(i) as *const _));
            let mut acc0 = [_mm512_setzero_ps(); 4];
            let mut acc1 = [_mm512_setzero_ps(); 4];
            let mut i = 0;
            while i + 64 <= k {
                let (y0, y1) = (col(i), col(i + 32));
                for r in 0..4 {
                    acc0[r] = _mm512_dpbf16_ps(acc0[r], row(r, i), y0);
                    acc1[r] = _mm512_dpbf16_ps(acc1[r], row(r, i + 32), y1);
                }
                i += 64;
            }
            if i + 32 <= k {
                let y0 = col(i);
                for (r, acc) in acc0.iter_mut().enumerate() {
                    *acc = _mm512_dpbf16_ps(*acc, row(r, i), y0);
                }
                i += 32;
            }
            if i < k {
                let m32: u32 = (1u32 << (k - i)) - 1; // k - i < 32
                let lo = _mm512_maskz_loadu_ps(m32 as u16, b.add(i));
                let hi = _mm512_maskz_loadu_ps((m32 >> 16) as u16, b.add(i + 16));
                let y = _mm512_cvtne2ps_pbh(hi, lo);
                let odd = (i / 32) % 2 == 1;
                for r in 0..4 {
                    let x = bh(_mm512_maskz_loadu_epi16(m32, a[r].add(i) as *const i16));
                    let acc = if odd { &mut acc1[r] } else { &mut acc0[r] };
                    *acc = _mm512_dpbf16_ps(*acc, x, y);
                }
            }
            std::array::from_fn(|r| reduce(acc0[r], acc1[r]))
        }
    }

    /// [`dot_rows`] for exactly `N` columns (the accumulators then live in registers).
    #[inline(always)]
    unsafe fn rows<const N: usize>(a: *const u16, b: &[*const f32], k: usize, out: &mut [f32]) {
        /// Step `i` of column `j`: 32 elements of `b[j]` as bf16 pairs.
        #[inline(always)]
        unsafe fn col(b: *const f32, i: usize) -> __m512bh {
            // SAFETY: the caller reads 32 elements below k.
            unsafe {
                _mm512_cvtne2ps_pbh(_mm512_loadu_ps(b.add(i + 16)), _mm512_loadu_ps(b.add(i)))
            }
        }
        // SAFETY: full loads stay below k; the last step's loads are masked to the elements
        // below k (masked-off lanes are neither read nor faulted on).
        unsafe {
            let mut acc0 = [_mm512_setzero_ps(); N];
            let mut acc1 = [_mm512_setzero_ps(); N];
            let mut i = 0;
            // steps alternate between the two accumulators: even steps in acc0, odd in acc1
            while i + 64 <= k {
                let x0 = bh(_mm512_loadu_si512(a.add(i) as *const _));
                let x1 = bh(_mm512_loadu_si512(a.add(i + 32) as *const _));
                for j in 0..N {
                    acc0[j] = _mm512_dpbf16_ps(acc0[j], x0, col(b[j], i));
                    acc1[j] = _mm512_dpbf16_ps(acc1[j], x1, col(b[j], i + 32));
                }
                i += 64;
            }
            if i + 32 <= k {
                let x0 = bh(_mm512_loadu_si512(a.add(i) as *const _));
                for j in 0..N {
                    acc0[j] = _mm512_dpbf16_ps(acc0[j], x0, col(b[j], i));
                }
                i += 32;
            }
            if i < k {
                let r = k - i;
                let m32: u32 = (1u32 << r) - 1; // r < 32
                let x = bh(_mm512_maskz_loadu_epi16(m32, a.add(i) as *const i16));
                let odd = (i / 32) % 2 == 1;
                for j in 0..N {
                    let lo = _mm512_maskz_loadu_ps(m32 as u16, b[j].add(i));
                    let hi = _mm512_maskz_loadu_ps((m32 >> 16) as u16, b[j].add(i + 16));
                    let y = _mm512_cvtne2ps_pbh(hi, lo);
                    if odd {
                        acc1[j] = _mm512_dpbf16_ps(acc1[j], x, y);
                    } else {
                        acc0[j] = _mm512_dpbf16_ps(acc0[j], x, y);
                    }
                }
            }
            for j in 0..N {
                out[j] = reduce(acc0[j], acc1[j]);
            }
        }
    }
}
