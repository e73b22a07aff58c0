//! CPU mul_mat against the reference: f32/f16/bf16 weights, mat-vec and GEMM paths, odd sizes,
//! transposed (strided) operands, broadcasting over dims 2 and 3, any thread count and ISA.

mod common;

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
