//! CPU mul_mat against the reference: f32/f16/bf16 weights, mat-vec and GEMM paths, odd sizes,
//! transposed (strided) operands, broadcasting over dims 2 and 3, any thread count and ISA.

mod common;
mod float_emu;

use common::*;
use tessera::{DType, Graph};

#[test]
fn mul_mat_matches_the_reference() {
    let mut rng = Rng::new(11);
    let sizes = [1usize, 3, 8, 17, 33, 64, 130];
    for case in 0..60 {
        let dt = rng.pick(&[DType::F32, DType::F16, DType::BF16]);
        let k = rng.pick(&sizes) + if case % 7 == 0 { 300 } else { 0 };
        let m = rng.pick(&sizes);
        let n = if case % 3 == 0 {
            1 + rng.below(4)
        } else {
            rng.pick(&sizes)
        };
        let (a2, a3) = (rng.pick(&[1usize, 2]), 1);
        let (b2, b3) = (a2 * rng.pick(&[1usize, 2]), a3 * rng.pick(&[1usize, 2]));
        let mut g = Graph::new();
        let a = g.new_tensor(dt, &[k, m, a2, a3]).unwrap();
        let b = g.new_f32(&[k, n, b2, b3]).unwrap();
        let y = g.mul_mat(a, b).unwrap();
        check(
            g,
            &[a, b],
            y,
            &mut rng,
            1e-5,
            &format!("mul_mat {dt} k={k} m={m} n={n} a2={a2} b2={b2} b3={b3}"),
        );
    }
}

/// The float kernels of this CPU's ISA (AVX2; AVX-512's GEMM) compute the AVX2 arithmetic
/// exactly as `float_emu` writes it out; `tests/neon.rs` holds the NEON kernels to the same.
#[test]
fn float_mul_mat_equals_the_emulated_avx2_arithmetic() {
    let isa = tessera_cpu::simd::isa();
    if isa == tessera_cpu::Isa::Scalar {
        eprintln!("float kernels not checked: TESSERA_ISA=scalar or no AVX2");
        return;
    }
    // 45 cases; on AMD with AVX512-BF16 the 15 bf16 ones take `vdpbf16ps`
    let checked = float_emu::check_float_mul_mat(isa);
    assert!(checked >= 30, "only {checked} cases checked");
}

#[test]
fn mul_mat_with_transposed_operands() {
    let mut rng = Rng::new(12);
    for (k, m, n) in [(5, 7, 9), (64, 17, 3), (33, 40, 20), (300, 50, 70)] {
        let mut g = Graph::new();
        let at = g.new_f32(&[m, k]).unwrap();
        let a = g.transpose(at).unwrap(); // [k, m] with k strided
        let bt = g.new_f32(&[n, k]).unwrap();
        let b = g.transpose(bt).unwrap();
        let y = g.mul_mat(a, b).unwrap();
        check(
            g,
            &[at, bt],
            y,
            &mut rng,
            1e-5,
            &format!("mul_mat transposed k={k} m={m} n={n}"),
        );
    }
}

#[test]
fn large_gemm_blocks_across_k() {
    let mut rng = Rng::new(13);
    let mut g = Graph::new();
    let a = g.new_tensor(DType::F16, &[600, 150]).unwrap();
    let b = g.new_f32(&[600, 200]).unwrap();
    let y = g.mul_mat(a, b).unwrap();
    check(g, &[a, b], y, &mut rng, 1e-5, "mul_mat 600x150x200 f16");
}

/// bf16 bits of random values in [-1, 1), with every 13th of large magnitude so that the
/// order of the f32 additions shows in the last bits.
fn bf16_row(rng: &mut Rng, k: usize) -> Vec<u16> {
    (0..k)
        .map(|i| {
            let s = if i % 13 == 4 { 300.0 } else { 1.0 };
            half::bf16::from_f32(s * rng.uniform(-1.0, 1.0)).to_bits()
        })
        .collect()
}

/// The emulation of `vdpbf16ps` that the AVX-512 BF16 kernels are checked against follows the
/// instruction's rules: the odd element of a pair is added first, bf16 denormals count as
/// zero, denormal sums are flushed, and the result is the plain sum within f32 rounding.
#[test]
fn bf16_emulation_follows_the_instructions_rules() {
    use tessera_cpu::ops::matmul_bf16::dot_emulated;
    let bf = |v: f32| half::bf16::from_f32(v).to_bits();
    // the odd element first: an accumulator of 1 (element 0), then in the same lane two steps
    // later +2^-24 (odd) and -2^-24 (even): 1 + 2^-24 rounds to 1, minus 2^-24 gives
    // 1 - 2^-24; the even element first would give exactly 1
    let (a, b) = order_case();
    let want = 1.0 - 2f32.powi(-24);
    assert_eq!(dot_emulated(&a, &b), want);
    // a bf16 denormal counts as zero: 2^-130 · 2^100 would be 2^-30
    let den = f32::from_bits(1 << 16); // the smallest bf16 denormal's f32 value
    let a = [bf(den), 0];
    let b = [2f32.powi(100), 0.0];
    assert_eq!(dot_emulated(&a, &b), 0.0);
    // a product below f32's normal range is flushed
    let a = [bf(2f32.powi(-70)), 0];
    let b = [2f32.powi(-70), 0.0];
    assert_eq!(dot_emulated(&a, &b), 0.0);
    // otherwise the plain sum, to f32 rounding, for long rows
    let mut rng = Rng::new(31);
    for k in [1usize, 31, 32, 33, 64, 100, 257, 600] {
        let a = bf16_row(&mut rng, k);
        let b: Vec<f32> = bf16_row(&mut rng, k)
            .iter()
            .map(|&h| half::bf16::from_bits(h).to_f32())
            .collect();
        let exact: f64 = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| half::bf16::from_bits(x).to_f64() * y as f64)
            .sum();
        let mag: f64 = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| (half::bf16::from_bits(x).to_f64() * y as f64).abs())
            .sum();
        let v = dot_emulated(&a, &b);
        assert!(
            (v as f64 - exact).abs() <= 1e-6 * mag.max(1e-30),
            "k={k}: {v} vs {exact}"
        );
    }
}

/// 96 elements whose sum depends on `vdpbf16ps` adding a pair's odd product first (see
/// `bf16_emulation_follows_the_instructions_rules`).
fn order_case() -> (Vec<u16>, Vec<f32>) {
    let mut a = vec![0u16; 96];
    let mut b = vec![0f32; 96];
    let one = half::bf16::from_f32(1.0).to_bits();
    a[0] = one;
    b[0] = 1.0;
    a[64] = one;
    b[64] = -(2f32.powi(-24));
    a[65] = one;
    b[65] = 2f32.powi(-24);
    (a, b)
}

/// Whether this process must run the AVX-512 BF16 kernels: `TESSERA_EXPECT_BF16=1` (set where
/// the tests run on such a CPU) fails the run unless it does; otherwise the kernel checks below
/// run where the CPU has AVX512_BF16 and say so where it has not.
fn bf16_kernels_here() -> bool {
    let have = tessera_cpu::ops::matmul_bf16::available(tessera_cpu::Isa::Avx512)
        && tessera_cpu::simd::isa() == tessera_cpu::Isa::Avx512;
    if std::env::var("TESSERA_EXPECT_BF16").as_deref() == Ok("1") {
        assert!(
            have,
            "TESSERA_EXPECT_BF16=1 but the AVX-512 BF16 kernels are not chosen"
        );
    }
    if !have {
        eprintln!("AVX-512 BF16 kernels not checked: this CPU (or TESSERA_ISA) does not run them");
    }
    have
}

/// The AVX-512 BF16 mat-vec kernel returns its emulation's bits, for every length (the masked
/// last step) and one to four columns. (An x86 kernel: not compiled elsewhere.)
#[cfg(target_arch = "x86_64")]
#[test]
fn bf16_matvec_kernel_equals_its_emulation() {
    if !bf16_kernels_here() {
        return;
    }
    use tessera_cpu::ops::matmul_bf16::{dot_emulated, dot_rows};
    let (a, b) = order_case();
    let mut out = [0f32; 1];
    // SAFETY: the CPU has AVX-512 BF16 (checked above); a and b hold 96 values.
    unsafe { dot_rows(a.as_ptr(), &[b.as_ptr()], 96, &mut out) };
    assert_eq!(
        out[0],
        1.0 - 2f32.powi(-24),
        "vdpbf16ps adds a pair's odd product first"
    );
    let mut rng = Rng::new(32);
    for k in (1..=130).chain([255, 256, 257, 1000, 4096]) {
        let a = bf16_row(&mut rng, k);
        let cols: Vec<Vec<f32>> = (0..4)
            .map(|_| {
                bf16_row(&mut rng, k)
                    .iter()
                    .map(|&h| half::bf16::from_bits(h).to_f32())
                    .collect()
            })
            .collect();
        for n in 1..=4 {
            let ptrs: Vec<*const f32> = cols[..n].iter().map(|c| c.as_ptr()).collect();
            let mut out = [0f32; 4];
            // SAFETY: the CPU has AVX-512 BF16 (checked above); a and every column hold k
            // values; out has n slots.
            unsafe { dot_rows(a.as_ptr(), &ptrs, k, &mut out[..n]) };
            for j in 0..n {
                let want = dot_emulated(&a, &cols[j]);
                assert_eq!(
                    out[j].to_bits(),
                    want.to_bits(),
                    "k={k} n={n} column {j}: kernel {} vs emulation {want}",
                    out[j]
                );
            }
        }
    }
}

/// The AVX-512 BF16 mat-vec's four-rows-a-call form (one column) gives each row
/// `dot_rows`'s bits, that is its emulation's. (An x86 kernel.)
#[cfg(target_arch = "x86_64")]
#[test]
fn bf16_four_rows_at_once_equal_their_emulation() {
    if !bf16_kernels_here() {
        return;
    }
    use tessera_cpu::ops::matmul_bf16::{dot_emulated, dot_rows4};
    let mut rng = Rng::new(43);
    for k in (1..=130).chain([255, 256, 257, 1000, 4096]) {
        let rows: Vec<Vec<u16>> = (0..4).map(|_| bf16_row(&mut rng, k)).collect();
        let col: Vec<f32> = bf16_row(&mut rng, k)
            .iter()
            .map(|&h| half::bf16::from_bits(h).to_f32())
            .collect();
        let ptrs: [*const u16; 4] = std::array::from_fn(|r| rows[r].as_ptr());
        // SAFETY: the CPU has AVX-512 BF16 (checked above); every row and the column hold k
        // values.
        let got = unsafe { dot_rows4(ptrs, col.as_ptr(), k) };
        for (r, row) in rows.iter().enumerate() {
            let want = dot_emulated(row, &col);
            assert_eq!(
                got[r].to_bits(),
                want.to_bits(),
                "k={k} row {r}: {} vs emulation {want}",
                got[r]
            );
        }
    }
}

/// mul_mat of bf16 weights under `Isa::Avx512` with AVX512_BF16: the mat-vec path (one to
/// four columns, broadcast batches, 1–3 threads) stores exactly its emulation's values.
#[test]
fn bf16_mul_mat_equals_the_emulated_instruction() {
    if !bf16_kernels_here() {
        return;
    }
    use tessera::Session;
    use tessera_cpu::ops::matmul_bf16::dot_emulated;
    let mut rng = Rng::new(33);
    for (k, m, n, b2) in [
        (64, 32, 3, 1),
        (33, 40, 1, 2),
        (577, 45, 4, 1),
        (1030, 33, 2, 2),
    ] {
        let mut g = Graph::new();
        let a = g.new_tensor(DType::BF16, &[k, m, 1, 1]).unwrap();
        let b = g.new_f32(&[k, n, b2, 1]).unwrap();
        let y = g.mul_mat(a, b).unwrap();
        let mut s = Session::new(g, &[y]).unwrap();
        let av: Vec<f32> = bf16_row(&mut rng, k * m)
            .iter()
            .map(|&h| half::bf16::from_bits(h).to_f32())
            .collect();
        let bv: Vec<f32> = (0..k * n * b2)
            .map(|i| if i % 17 == 3 { 150.0 } else { 1.0 } * rng.uniform(-1.0, 1.0))
            .collect();
        s.set_f32(a, &av).unwrap();
        s.set_f32(b, &bv).unwrap();
        let ab: Vec<u16> = av
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_bits())
            .collect();
        for th in 1..=3 {
            let cpu = tessera_cpu::CpuBackend::with_isa(th, tessera_cpu::Isa::Avx512);
            s.compute(&cpu).unwrap();
            let got = s.get_f32(y).unwrap();
            for col in 0..n * b2 {
                let bc: Vec<f32> = bv[col * k..(col + 1) * k]
                    .iter()
                    .map(|&v| half::bf16::from_f32(v).to_f32())
                    .collect();
                for row in 0..m {
                    let want = dot_emulated(&ab[row * k..(row + 1) * k], &bc);
                    let v = got[col * m + row];
                    assert_eq!(
                        v.to_bits(),
                        want.to_bits(),
                        "k={k} m={m} n={n} b2={b2} {th} threads: [{col}, {row}] {v} vs {want}"
                    );
                }
            }
        }
    }
}

/// The activations' rounding to the weights' type eight at a time (`round_slice` on AVX2:
/// F16C for f16, integer arithmetic for bf16) keeps `half`'s bits for every kind of value:
/// ties, carries into the exponent, overflow to infinity, f32 and f16 denormals, infinities,
/// quiet and signalling NaNs with their payloads, and random bit patterns; lengths that leave
/// a tail of one to seven.
#[test]
fn rounding_activations_eight_at_a_time_keeps_halfs_bits() {
    use tessera_cpu::Isa;
    let isa = tessera_cpu::simd::isa();
    assert!(isa >= Isa::Avx2 || !cfg!(target_arch = "x86_64") || isa == Isa::Scalar);
    float_emu::check_rounding(isa, 200_000);
}

/// Rows of bf16 pairs as the `vdpbf16ps` GEMM packs them: `panels` panels of 16 rows, pair
/// `p` of row `r` of panel `w` at `(w·kp + p)·16 + r`.
#[cfg(target_arch = "x86_64")]
fn pack_pairs(rows: &[Vec<u16>], width: usize, kp: usize) -> Vec<u32> {
    let mut out = vec![0u32; rows.len().div_ceil(width) * width * kp];
    for (r, row) in rows.iter().enumerate() {
        let (w, rr) = (r / width, r % width);
        for p in 0..kp {
            let at = |i: usize| row.get(i).copied().unwrap_or(0) as u32;
            out[(w * kp + p) * width + rr] = at(2 * p) | (at(2 * p + 1) << 16);
        }
    }
    out
}

/// The `vdpbf16ps` GEMM micro-kernel returns its emulation's bits: one and two panels, every
/// pair count from 1 to 40 and 128 (odd lengths padded with zero), partial tiles, and the
/// accumulating form (a second block added to what the tile holds). (An x86 kernel.)
#[cfg(target_arch = "x86_64")]
#[test]
fn bf16_gemm_kernel_equals_its_emulation() {
    if !bf16_kernels_here() {
        return;
    }
    use tessera_cpu::ops::matmul_bf16::{gemm_dot_emulated, gemm_kernel, GEMM_MR};
    let mut rng = Rng::new(41);
    for kp in (1..=40).chain([128]) {
        for w in [1usize, 2] {
            let k = 2 * kp - (kp % 2); // odd lengths for odd pair counts
            let arows: Vec<Vec<u16>> = (0..16 * w).map(|_| bf16_row(&mut rng, k)).collect();
            let bcols: Vec<Vec<u16>> = (0..GEMM_MR).map(|_| bf16_row(&mut rng, k)).collect();
            let ap = pack_pairs(&arows, 16, kp);
            let bp = pack_pairs(&bcols, GEMM_MR, kp);
            let bf: Vec<Vec<f32>> = bcols
                .iter()
                .map(|c| {
                    c.iter()
                        .map(|&h| half::bf16::from_bits(h).to_f32())
                        .collect()
                })
                .collect();
            let (rows, cols) = (GEMM_MR - kp % 3, 16 * w - kp % 5);
            let ldc = 40;
            let mut c = vec![7.0f32; GEMM_MR * ldc];
            for accumulate in [false, true] {
                // SAFETY: the CPU has AVX-512 BF16 (checked above); ap holds w panels of
                // kp·16 pairs, bp kp·GEMM_MR; c holds GEMM_MR rows of ldc ≥ cols floats.
                unsafe {
                    let (pa, pb, pc) = (ap.as_ptr(), bp.as_ptr(), c.as_mut_ptr());
                    if w == 2 {
                        gemm_kernel::<2>(kp, pa, pb, pc, ldc, rows, cols, accumulate);
                    } else {
                        gemm_kernel::<1>(kp, pa, pb, pc, ldc, rows, cols, accumulate);
                    }
                }
                for r in 0..GEMM_MR {
                    for j in 0..ldc {
                        let got = c[r * ldc + j];
                        let want = if r < rows && j < cols {
                            let one = gemm_dot_emulated(&arows[j], &bf[r], 2 * kp);
                            if accumulate {
                                one + one
                            } else {
                                one
                            }
                        } else {
                            7.0
                        };
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "kp={kp} w={w} accumulate={accumulate} [{r}][{j}]: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

/// mul_mat of bf16 weights with more than four columns, where the `vdpbf16ps` GEMM is chosen
/// (AMD CPUs with AVX512_BF16): every output is its emulation's value, bit for bit, for
/// several KC blocks with an odd last one, partial and odd panel counts, split columns, a
/// transposed (strided) `a`, broadcast batches and 1–3 threads.
#[test]
fn bf16_gemm_equals_the_emulated_instruction() {
    use tessera::Session;
    use tessera_cpu::ops::matmul_bf16::{gemm_available, gemm_dot_emulated};
    use tessera_cpu::Isa;
    if !bf16_kernels_here() {
        return;
    }
    if !gemm_available(Isa::Avx512) {
        eprintln!("the vdpbf16ps GEMM is not chosen on this CPU (not AMD's): not checked");
        return;
    }
    let mut rng = Rng::new(42);
    for (k, m, n, b2, transposed) in [
        (257, 33, 13, 1, false),
        (64, 100, 7, 2, false),
        (600, 48, 5, 1, true),
        (1030, 70, 9, 1, false),
        (40, 8, 200, 1, false),
        (513, 120, 30, 2, true),
    ] {
        let mut g = Graph::new();
        let (src, a) = if transposed {
            let at = g.new_tensor(DType::BF16, &[m, k, 1, 1]).unwrap();
            (at, g.transpose(at).unwrap())
        } else {
            let a = g.new_tensor(DType::BF16, &[k, m, 1, 1]).unwrap();
            (a, a)
        };
        let b = g.new_f32(&[k, n, b2, 1]).unwrap();
        let y = g.mul_mat(a, b).unwrap();
        let mut s = Session::new(g, &[y]).unwrap();
        // a[row][i] as bf16 bits, set through the source tensor's own layout
        let ab: Vec<Vec<u16>> = (0..m).map(|_| bf16_row(&mut rng, k)).collect();
        let src_vals: Vec<f32> = if transposed {
            (0..k * m)
                .map(|e| half::bf16::from_bits(ab[e % m][e / m]).to_f32())
                .collect()
        } else {
            (0..k * m)
                .map(|e| half::bf16::from_bits(ab[e / k][e % k]).to_f32())
                .collect()
        };
        let bv: Vec<f32> = (0..k * n * b2)
            .map(|i| if i % 17 == 3 { 150.0 } else { 1.0 } * rng.uniform(-1.0, 1.0))
            .collect();
        s.set_f32(src, &src_vals).unwrap();
        s.set_f32(b, &bv).unwrap();
        for th in 1..=3 {
            let cpu = tessera_cpu::CpuBackend::with_isa(th, Isa::Avx512);
            s.compute(&cpu).unwrap();
            let got = s.get_f32(y).unwrap();
            for col in 0..n * b2 {
                let bc: Vec<f32> = bv[col * k..(col + 1) * k]
                    .iter()
                    .map(|&v| half::bf16::from_f32(v).to_f32())
                    .collect();
                for (row, arow) in ab.iter().enumerate() {
                    let want = gemm_dot_emulated(arow, &bc, tessera_cpu::ops::matmul::KC);
                    let v = got[col * m + row];
                    assert_eq!(
                        v.to_bits(),
                        want.to_bits(),
                        "k={k} m={m} n={n} b2={b2} transposed={transposed} {th} threads: \
                         [{col}, {row}] {v} vs {want}"
                    );
                }
            }
        }
    }
}

/// The AVX-512 GEMM micro-kernel (two panels of `a` in 16-lane registers) forms every sum with
/// the AVX2 kernel's chain of fused multiply-adds: f32, f16 and bf16 weights, partial tiles,
/// odd panel counts, several KC blocks and split columns give the AVX2 path's bits.
#[test]
fn avx512_gemm_equals_the_avx2_gemm_bit_for_bit() {
    use tessera::Session;
    use tessera_cpu::{CpuBackend, Isa};
    if tessera_cpu::simd::isa() != Isa::Avx512 {
        eprintln!("AVX-512 GEMM not checked: this CPU (or TESSERA_ISA) does not run it");
        return;
    }
    let mut rng = Rng::new(34);
    for (dt, k, m, n) in [
        (DType::F32, 300, 70, 9),
        (DType::F16, 600, 150, 20),
        (DType::BF16, 257, 33, 13),
        (DType::BF16, 64, 100, 7),
        (DType::F32, 1030, 48, 5),
        (DType::F32, 40, 8, 200),
    ] {
        if dt == DType::BF16 && tessera_cpu::ops::matmul_bf16::gemm_available(Isa::Avx512) {
            // this CPU's bf16 GEMM is `vdpbf16ps`'s, checked against its emulation instead
            // (`bf16_gemm_equals_the_emulated_instruction`)
            continue;
        }
        let mut g = Graph::new();
        let a = g.new_tensor(dt, &[k, m]).unwrap();
        let b = g.new_f32(&[k, n]).unwrap();
        let y = g.mul_mat(a, b).unwrap();
        let mut s = Session::new(g, &[y]).unwrap();
        let av: Vec<f32> = (0..k * m).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let bv: Vec<f32> = (0..k * n).map(|_| rng.uniform(-1.0, 1.0)).collect();
        s.set_f32(a, &av).unwrap();
        s.set_f32(b, &bv).unwrap();
        s.compute(&CpuBackend::with_isa(1, Isa::Avx2)).unwrap();
        let want = s.get_f32(y).unwrap();
        for th in 1..=3 {
            s.compute(&CpuBackend::with_isa(th, Isa::Avx512)).unwrap();
            let got = s.get_f32(y).unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{dt} k={k} m={m} n={n} {th} threads: element {i}: {g} vs AVX2 {w}"
                );
            }
        }
    }
}
