//! ggml's tiled CPU flash attention (`ggml_compute_forward_flash_attn_ext_tiled`), used in the
//! ggml-precision mode for batches of at least 64 queries with f32 or f16 K and V — what ggml
//! itself runs for prompt processing, so a prompt's KV cache and outputs are llama.cpp's.
//!
//! A tile of up to 64 query rows of one head against tiles of 64 kv rows: `KQ = Q·Kᵀ` as a small
//! register-blocked GEMM (every score a sequential f32 FMA chain over D, as ggml's `simd_gemm`
//! forms it), scale / soft-cap / mask, the per-row online softmax with ggml's vector `exp` and
//! its summation order, and `VKQ += P·V` (a sequential FMA chain over the kv rows). Each row's
//! result is independent of the tiling, so it equals the reference's row-by-row form
//! (`tessera::ops::attention`, `reference_ggml_tiled`) bit for bit, for any thread count.

use tessera::ops::attention::{ggml_fa_tile_softmax, GGML_FA_TILE as T};

use crate::ops::softmax::MaskRow;

/// One tile's job: `rows` consecutive queries of one head.
pub(super) struct Tile {
    /// Query row `i` is at `q + i·q_nb1` (f32).
    pub q: *const u8,
    pub q_nb1: usize,
    /// First K / V rows of the kv head and their row strides; `kv_f16`: both f16 (else f32).
    pub k: *const u8,
    pub k_nb1: usize,
    pub v: *const u8,
    pub v_nb1: usize,
    pub kv_f16: bool,
    /// Mask row of query `i`: `mask.ptr + i·mask_nb1`.
    pub mask: Option<MaskRow>,
    pub mask_nb1: usize,
    pub slope: f32,
    /// `scale / softcap` when soft-capping, else `scale`.
    pub scale: f32,
    pub softcap: f32,
    pub dk: usize,
    pub dv: usize,
    pub n_kv: usize,
    pub rows: usize,
    /// Output row of query `i`: `out + i·out_nb` (dv f32).
    pub out: *mut u8,
    pub out_nb: usize,
}

/// f32 scratch one thread needs for tiles of `dk`, `dv`.
pub(super) fn scratch_floats(dk: usize, dv: usize) -> usize {
    // Q [T][dk], Kᵀ [dk][T], KQ [T][T], V [T][dv], VKQ [T][dv]
    T * dk + dk * T + T * T + 2 * T * dv
}

/// Whether the SIMD form applies (vectors of 8 along D and Dv).
pub(super) fn simd_shape(dk: usize, dv: usize) -> bool {
    dk.is_multiple_of(8) && dv.is_multiple_of(8)
}

/// Element `i` of a K/V row as f32.
#[inline(always)]
unsafe fn ld(f16: bool, p: *const u8, i: usize) -> f32 {
    // SAFETY: the caller's contract (i inside the row).
    unsafe {
        if f16 {
            half::f16::from_bits(*(p as *const u16).add(i)).to_f32()
        } else {
            *(p as *const f32).add(i)
        }
    }
}

/// The portable form, one query row at a time (the same arithmetic as the SIMD form).
///
/// # Safety
/// The pointers of `t` cover the rows, kv rows and mask entries described; `scratch` holds
/// `T + dv` f32.
pub(super) unsafe fn run_scalar(t: &Tile, scratch: *mut f32) {
    // SAFETY: every access is inside the rows the caller's contract describes.
    unsafe {
        let sc = std::slice::from_raw_parts_mut(scratch, T);
        let acc = std::slice::from_raw_parts_mut(scratch.add(T), t.dv);
        for r in 0..t.rows {
            let q = t.q.add(r * t.q_nb1) as *const f32;
            let (mut s_sum, mut m_max) = (0f32, f32::NEG_INFINITY);
            acc.fill(0.0);
            for ic in (0..t.n_kv).step_by(T) {
                let kv_tile = T.min(t.n_kv - ic);
                for (j, s) in sc.iter_mut().enumerate() {
                    if j >= kv_tile {
                        *s = f32::NEG_INFINITY;
                        continue;
                    }
                    let kr = t.k.add((ic + j) * t.k_nb1);
                    let mut dot = 0f32;
                    for i in 0..t.dk {
                        dot = (*q.add(i)).mul_add(ld(t.kv_f16, kr, i), dot);
                    }
                    let mut x = dot * t.scale;
                    if t.softcap != 0.0 {
                        x = x.tanh() * t.softcap;
                    }
                    if let Some(m) = t.mask {
                        let mr = MaskRow {
                            ptr: m.ptr.add(r * t.mask_nb1),
                            f16: m.f16,
                        };
                        x += t.slope * mr.at(ic + j);
                    }
                    *s = x;
                }
                let sc: &mut [f32; T] = sc.try_into().expect("a tile of scores");
                if !ggml_fa_tile_softmax(sc, &mut m_max, &mut s_sum, acc) {
                    continue;
                }
                for (j, &pj) in sc[..kv_tile].iter().enumerate() {
                    let vr = t.v.add((ic + j) * t.v_nb1);
                    for (i, a) in acc.iter_mut().enumerate() {
                        *a = ld(t.kv_f16, vr, i).mul_add(pj, *a);
                    }
                }
            }
            let inv = if s_sum == 0.0 { 0.0 } else { 1.0 / s_sum };
            let out = t.out.add(r * t.out_nb) as *mut f32;
            for (i, &a) in acc.iter().enumerate() {
                *out.add(i) = a * inv;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use super::{Tile, T};
    use crate::ops::ggml_math::avx2::expf8;
    use crate::ops::qdot::avx2::transpose8;
    use std::arch::x86_64::*;

    /// The operands of `C[m][n] += A[m][k] · B[k][n]`: row-major, with their row strides.
    #[derive(Clone, Copy)]
    struct Gemm {
        c: *mut f32,
        ldc: usize,
        a: *const f32,
        lda: usize,
        b: *const f32,
        ldb: usize,
        k: usize,
    }

    impl Gemm {
        /// The same product from row `i` and column `j` of C on.
        #[inline(always)]
        unsafe fn at(self, i: usize, j: usize) -> Gemm {
            // SAFETY: the caller keeps (i, j) inside C (and A's rows, B's columns).
            unsafe {
                Gemm {
                    c: self.c.add(i * self.ldc + j),
                    a: self.a.add(i * self.lda),
                    b: self.b.add(j),
                    ..self
                }
            }
        }
    }

    /// One block of `R` rows and `V`·8 columns: every element a sequential FMA chain over k
    /// (ggml's `simd_gemm_ukernel`).
    #[inline(always)]
    unsafe fn ukernel<const R: usize, const V: usize>(g: Gemm) {
        // SAFETY: the caller's contract (R rows of C and A, k rows of B, V·8 columns).
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); V]; R];
            for (i, row) in acc.iter_mut().enumerate() {
                for (j, x) in row.iter_mut().enumerate() {
                    *x = _mm256_loadu_ps(g.c.add(i * g.ldc + j * 8));
                }
            }
            for kk in 0..g.k {
                let bv: [__m256; V] =
                    std::array::from_fn(|j| _mm256_loadu_ps(g.b.add(kk * g.ldb + j * 8)));
                for (i, row) in acc.iter_mut().enumerate() {
                    let p = _mm256_set1_ps(*g.a.add(i * g.lda + kk));
                    for (j, x) in row.iter_mut().enumerate() {
                        *x = _mm256_fmadd_ps(bv[j], p, *x);
                    }
                }
            }
            for (i, row) in acc.iter().enumerate() {
                for (j, x) in row.iter().enumerate() {
                    _mm256_storeu_ps(g.c.add(i * g.ldc + j * 8), *x);
                }
            }
        }
    }

    /// `R` rows of C (n a multiple of 8): blocks of 16 columns, then one of 8.
    #[inline(always)]
    unsafe fn rows<const R: usize>(g: Gemm, n: usize) {
        // SAFETY: forwarded.
        unsafe {
            let mut j = 0;
            while j + 16 <= n {
                ukernel::<R, 2>(g.at(0, j));
                j += 16;
            }
            if j < n {
                ukernel::<R, 1>(g.at(0, j));
            }
        }
    }

    /// `C[m][n] += A[m][k] · B[k][n]`, n a multiple of 8.
    #[inline(always)]
    unsafe fn gemm(g: Gemm, m: usize, n: usize) {
        // SAFETY: forwarded, row block by row block.
        unsafe {
            let mut i = 0;
            while i + 6 <= m {
                rows::<6>(g.at(i, 0), n);
                i += 6;
            }
            let g = g.at(i, 0);
            match m - i {
                5 => rows::<5>(g, n),
                4 => rows::<4>(g, n),
                3 => rows::<3>(g, n),
                2 => rows::<2>(g, n),
                1 => rows::<1>(g, n),
                _ => {}
            }
        }
    }

    /// 8 K/V values at `p` (f16 or f32) as f32.
    #[inline(always)]
    unsafe fn ld8(f16: bool, p: *const u8) -> __m256 {
        // SAFETY: 8 readable elements at p.
        unsafe {
            if f16 {
                _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
            } else {
                _mm256_loadu_ps(p as *const f32)
            }
        }
    }

    /// ggml's horizontal sum of 8 lanes in `ggml_vec_soft_max_f32`: (hi + lo), then lanes
    /// 0+2 and 1+3, then those two.
    #[inline(always)]
    unsafe fn hsum8(v: __m256) -> f32 {
        // register arithmetic only
        let s = _mm_add_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// # Safety
    /// As `run_scalar`, with `scratch` holding `scratch_floats(dk, dv)` f32; dk and dv are
    /// multiples of 8; the CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::ops::attention) unsafe fn run(t: &Tile, scratch: *mut f32) {
        // SAFETY: every access is inside the rows, kv rows and mask entries of the caller's
        // contract, or inside the scratch layout below.
        unsafe {
            let (dk, dv, rows) = (t.dk, t.dv, t.rows);
            let qs = scratch; // [T][dk]
            let kt = qs.add(T * dk); // [dk][T]
            let kq = kt.add(dk * T); // [T][T]
            let vs = kq.add(T * T); // [T][dv]
            let acc = vs.add(T * dv); // [T][dv]
            for r in 0..rows {
                std::ptr::copy_nonoverlapping(
                    t.q.add(r * t.q_nb1) as *const f32,
                    qs.add(r * dk),
                    dk,
                );
            }
            std::ptr::write_bytes(acc, 0, rows * dv);
            let mut m_max = [f32::NEG_INFINITY; T];
            let mut s_sum = [0f32; T];
            let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
            let esz = if t.kv_f16 { 2 } else { 4 };
            let runs = t.slope > 0.0 && t.slope.is_finite();
            for ic in (0..t.n_kv).step_by(T) {
                let kv_tile = T.min(t.n_kv - ic);
                // the tile is skipped when the mask excludes all of it for every row
                if let Some(m) = t.mask {
                    let mut any = false;
                    'rows: for r in 0..rows {
                        let mp = m.ptr.add(r * t.mask_nb1);
                        let mr = super::MaskRow {
                            ptr: mp,
                            f16: m.f16,
                        };
                        let mut j = 0;
                        // whole runs of 16 -inf entries by their bits (for a finite positive
                        // slope, slope · -inf is -inf): the tiles past a causal diagonal
                        if runs {
                            while j + 16 <= kv_tile && mr.neg_inf_run16(ic + j) {
                                j += 16;
                            }
                        }
                        while j < kv_tile {
                            if t.slope * mr.at(ic + j) != f32::NEG_INFINITY {
                                any = true;
                                break 'rows;
                            }
                            j += 1;
                        }
                    }
                    if !any {
                        continue;
                    }
                }
                // Kᵀ of the tile, 8×8 blocks (missing kv rows as zeros)
                let kv8 = kv_tile.next_multiple_of(8);
                for j0 in (0..kv8).step_by(8) {
                    for d0 in (0..dk).step_by(8) {
                        let blk: [__m256; 8] = std::array::from_fn(|jj| {
                            if j0 + jj < kv_tile {
                                ld8(t.kv_f16, t.k.add((ic + j0 + jj) * t.k_nb1 + d0 * esz))
                            } else {
                                _mm256_setzero_ps()
                            }
                        });
                        let tr = transpose8(blk);
                        for (dd, v) in tr.iter().enumerate() {
                            _mm256_storeu_ps(kt.add((d0 + dd) * T + j0), *v);
                        }
                    }
                }
                // KQ = Q·Kᵀ over the tile's columns (multiples of 8)
                std::ptr::write_bytes(kq, 0, rows * T);
                gemm(
                    Gemm {
                        c: kq,
                        ldc: T,
                        a: qs,
                        lda: dk,
                        b: kt,
                        ldb: T,
                        k: dk,
                    },
                    rows,
                    kv8,
                );
                let scale = _mm256_set1_ps(t.scale);
                let softcap = _mm256_set1_ps(t.softcap);
                let slope = _mm256_set1_ps(t.slope);
                for r in 0..rows {
                    let row = kq.add(r * T);
                    let mrow = t.mask.map(|m| m.ptr.add(r * t.mask_nb1));
                    for j0 in (0..T).step_by(8) {
                        if j0 >= kv_tile {
                            _mm256_storeu_ps(row.add(j0), ninf);
                            continue;
                        }
                        let mut x = _mm256_mul_ps(_mm256_loadu_ps(row.add(j0)), scale);
                        if t.softcap != 0.0 {
                            let mut l = [0f32; 8];
                            _mm256_storeu_ps(l.as_mut_ptr(), x);
                            for e in l.iter_mut() {
                                *e = e.tanh();
                            }
                            x = _mm256_mul_ps(_mm256_loadu_ps(l.as_ptr()), softcap);
                        }
                        let n = (kv_tile - j0).min(8);
                        if let (Some(mp), Some(m)) = (mrow, t.mask) {
                            let mv = if n == 8 {
                                if m.f16 {
                                    _mm256_cvtph_ps(_mm_loadu_si128(
                                        (mp as *const u16).add(ic + j0) as *const __m128i,
                                    ))
                                } else {
                                    _mm256_loadu_ps((mp as *const f32).add(ic + j0))
                                }
                            } else {
                                let mr = super::MaskRow {
                                    ptr: mp,
                                    f16: m.f16,
                                };
                                let l: [f32; 8] = std::array::from_fn(|e| {
                                    if e < n {
                                        mr.at(ic + j0 + e)
                                    } else {
                                        0.0
                                    }
                                });
                                _mm256_loadu_ps(l.as_ptr())
                            };
                            x = _mm256_add_ps(x, _mm256_mul_ps(slope, mv));
                        }
                        if n < 8 {
                            // the padding columns of a last, partial tile
                            let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                            let keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lane);
                            x = _mm256_blendv_ps(ninf, x, _mm256_castsi256_ps(keep));
                        }
                        _mm256_storeu_ps(row.add(j0), x);
                    }
                    // the row's online softmax over this tile
                    let mut mx = ninf;
                    for j0 in (0..T).step_by(8) {
                        mx = _mm256_max_ps(mx, _mm256_loadu_ps(row.add(j0)));
                    }
                    let mut l = [0f32; 8];
                    _mm256_storeu_ps(l.as_mut_ptr(), mx);
                    let tile_max = l.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
                    if tile_max == f32::NEG_INFINITY {
                        std::ptr::write_bytes(row, 0, T);
                        continue;
                    }
                    let m_new = m_max[r].max(tile_max);
                    if m_new > m_max[r] {
                        let ms = (m_max[r] - m_new).exp();
                        let msv = _mm256_set1_ps(ms);
                        let a = acc.add(r * dv);
                        for d0 in (0..dv).step_by(8) {
                            _mm256_storeu_ps(
                                a.add(d0),
                                _mm256_mul_ps(_mm256_loadu_ps(a.add(d0)), msv),
                            );
                        }
                        s_sum[r] *= ms;
                    }
                    m_max[r] = m_new;
                    let mv = _mm256_set1_ps(m_new);
                    let mut sum = 0f64;
                    for j0 in (0..T).step_by(8) {
                        let p = expf8(_mm256_sub_ps(_mm256_loadu_ps(row.add(j0)), mv));
                        _mm256_storeu_ps(row.add(j0), p);
                        sum += hsum8(p) as f64;
                    }
                    s_sum[r] = (s_sum[r] as f64 + sum) as f32;
                }
                // V of the tile as f32, then VKQ += P·V over the tile's rows
                for j in 0..kv_tile {
                    let src = t.v.add((ic + j) * t.v_nb1);
                    for d0 in (0..dv).step_by(8) {
                        _mm256_storeu_ps(vs.add(j * dv + d0), ld8(t.kv_f16, src.add(d0 * esz)));
                    }
                }
                gemm(
                    Gemm {
                        c: acc,
                        ldc: dv,
                        a: kq,
                        lda: T,
                        b: vs,
                        ldb: dv,
                        k: kv_tile,
                    },
                    rows,
                    dv,
                );
            }
            for r in 0..rows {
                let inv = if s_sum[r] == 0.0 { 0.0 } else { 1.0 / s_sum[r] };
                let iv = _mm256_set1_ps(inv);
                let a = acc.add(r * dv);
                let out = t.out.add(r * t.out_nb) as *mut f32;
                for d0 in (0..dv).step_by(8) {
                    _mm256_storeu_ps(out.add(d0), _mm256_mul_ps(_mm256_loadu_ps(a.add(d0)), iv));
                }
            }
        }
    }
}
