//! The x86 AVX2 float mul_mat's arithmetic written out in scalar code (`f32::mul_add` for
//! each fused multiply-add), and a check that a CPU path gives it bit for bit: `tests/matmul.rs`
//! holds the AVX2 and AVX-512 kernels to it natively, `tests/neon.rs` the aarch64 NEON kernels
//! under qemu, so the NEON path has the x86 path's bits.
// (each test file uses part of it)
#![allow(dead_code)]

use tessera::{DType, Graph, Session};
use tessera_cpu::ops::matmul::{round_slice, round_to};
use tessera_cpu::{CpuBackend, Isa};

// (the including test file declares `mod common`)
use super::common::Rng;

/// `avx2::dot_rows` / `dot_rows4` for one row and one column: two eight-lane accumulators
/// over 16 elements a step (then one step of 8), added lane by lane, summed as `hsum`
/// ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)), then the tail one product at a time, unfused.
pub fn dot_emulated(a: &[f32], b: &[f32]) -> f32 {
    let k = a.len();
    let (mut acc0, mut acc1) = ([0f32; 8], [0f32; 8]);
    let mut i = 0;
    while i + 16 <= k {
        for l in 0..8 {
            acc0[l] = a[i + l].mul_add(b[i + l], acc0[l]);
            acc1[l] = a[i + 8 + l].mul_add(b[i + 8 + l], acc1[l]);
        }
        i += 16;
    }
    while i + 8 <= k {
        for l in 0..8 {
            acc0[l] = a[i + l].mul_add(b[i + l], acc0[l]);
        }
        i += 8;
    }
    let v: Vec<f32> = (0..8).map(|l| acc0[l] + acc1[l]).collect();
    let s4: Vec<f32> = (0..4).map(|l| v[l] + v[l + 4]).collect();
    let mut s = (s4[0] + s4[2]) + (s4[1] + s4[3]);
    for t in i..k {
        s += a[t] * b[t];
    }
    s
}

/// The GEMM micro-kernels' element: a chain of fused multiply-adds over each block of 256
/// (`matmul::KC`) from zero, the blocks' sums added to the result in order.
pub fn gemm_emulated(a: &[f32], b: &[f32]) -> f32 {
    let mut out = 0f32;
    for (blk, (ac, bc)) in a.chunks(256).zip(b.chunks(256)).enumerate() {
        let mut v = 0f32;
        for (&x, &y) in ac.iter().zip(bc) {
            v = y.mul_add(x, v);
        }
        out = if blk == 0 { v } else { out + v };
    }
    out
}

/// Is this (type, columns) computed by the AVX2 arithmetic under `isa`? On AMD CPUs with
/// AVX512-BF16, bf16 weights take `vdpbf16ps` (checked against that instruction's emulation).
pub fn avx2_arithmetic(isa: Isa, dt: DType, n: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    if dt == DType::BF16 {
        use tessera_cpu::ops::matmul_bf16;
        let bf16 = if n <= 4 {
            matmul_bf16::available(isa)
        } else {
            matmul_bf16::gemm_available(isa)
        };
        if bf16 {
            return false;
        }
    }
    let _ = (dt, n);
    isa != Isa::Scalar
}

/// `mul_mat` of f32/f16/bf16 weights under `isa`, 1 to 3 threads, against the emulated AVX2
/// arithmetic bit for bit: mat-vec (one column: four rows a call and the rest one at a time;
/// two to four columns), GEMM with partial tiles and several K blocks, lengths with every kind
/// of tail. Returns how many (type, shape) cases it checked.
pub fn check_float_mul_mat(isa: Isa) -> usize {
    let mut rng = Rng::new(77);
    let mut checked = 0;
    let shapes = [
        (1usize, 5usize, 1usize),
        (7, 6, 1),
        (8, 9, 1),
        (16, 4, 1),
        (17, 11, 1),
        (33, 7, 1),
        (300, 13, 1),
        (40, 5, 2),
        (23, 6, 3),
        (70, 9, 4),
        (9, 17, 5),
        (64, 16, 6),
        (300, 21, 13),
        (530, 35, 7),
        (48, 40, 20),
    ];
    for dt in [DType::F32, DType::F16, DType::BF16] {
        for &(k, m, n) in &shapes {
            if !avx2_arithmetic(isa, dt, n) {
                continue;
            }
            let av: Vec<f32> = (0..k * m)
                .map(|_| {
                    let v = rng.uniform(-1.0, 1.0);
                    if dt == DType::F32 {
                        v
                    } else {
                        round_to(dt, v)
                    }
                })
                .collect();
            let bv: Vec<f32> = (0..k * n).map(|_| rng.uniform(-1.0, 1.0)).collect();
            // ggml converts the activations to the weights' type first
            let br: Vec<f32> = if dt == DType::F32 {
                bv.clone()
            } else {
                bv.iter().map(|&v| round_to(dt, v)).collect()
            };
            let mut g = Graph::new();
            let a = g.new_tensor(dt, &[k, m]).unwrap();
            let b = g.new_f32(&[k, n]).unwrap();
            let y = g.mul_mat(a, b).unwrap();
            let mut s = Session::new(g, &[y]).unwrap();
            s.set_f32(a, &av).unwrap();
            s.set_f32(b, &bv).unwrap();
            for th in 1..=3 {
                s.compute(&CpuBackend::with_isa(th, isa)).unwrap();
                let got = s.get_f32(y).unwrap();
                for j in 0..n {
                    for i in 0..m {
                        let (ar, bc) = (&av[i * k..(i + 1) * k], &br[j * k..(j + 1) * k]);
                        let want = if n <= 4 {
                            dot_emulated(ar, bc)
                        } else {
                            gemm_emulated(ar, bc)
                        };
                        let g = got[j * m + i];
                        assert_eq!(
                            g.to_bits(),
                            want.to_bits(),
                            "{dt} {isa:?} k={k} m={m} n={n} {th} threads: [{i}, {j}] {g} vs emulated {want}"
                        );
                    }
                }
            }
            checked += 1;
        }
    }
    checked
}

/// `round_slice` under `isa` (eight at a time: F16C or `fcvtn` for f16, integer arithmetic for
/// bf16) keeps `half`'s bits for every kind of value: ties, carries into the exponent, overflow
/// to infinity, f32 and f16 denormals, infinities, quiet and signalling NaNs with their
/// payloads, and `random` random bit patterns; lengths that leave a tail of one to seven.
pub fn check_rounding(isa: Isa, random: usize) {
    let mut vals: Vec<f32> = [
        0x0000_0000u32,
        0x8000_0000,
        0x7f80_0000,
        0xff80_0000,
        0x7fc0_0000,
        0xffc0_0001,
        0x7f80_0001,
        0x7fa0_0000,
        0x7fff_ffff,
        0x0000_0001,
        0x007f_ffff,
        0x3f80_8000,
        0x3f81_8000,
        0x3f80_8001,
        0x7f7f_ffff,
        0x477f_e000,
        0x477f_f000,
        0x3380_0000,
        0x3300_0000,
        0x3300_0001,
        0x387f_c000,
        0x3f80_1000,
        0x3f80_3000,
    ]
    .iter()
    .map(|&b| f32::from_bits(b))
    .collect();
    let mut rng = Rng::new(41);
    for _ in 0..random {
        vals.push(f32::from_bits(rng.next_u64() as u32));
    }
    for dt in [DType::F16, DType::BF16] {
        for len in [vals.len(), vals.len() - 3, 7, 1] {
            for start in [0, 5] {
                check_rounded(isa, dt, &vals[start..start + len - start.min(len - 1)]);
            }
        }
    }
}

fn check_rounded(isa: Isa, dt: DType, src: &[f32]) {
    let mut got = vec![0f32; src.len()];
    round_slice(isa, dt, src, &mut got);
    for (i, (&g, &x)) in got.iter().zip(src).enumerate() {
        let want = round_to(dt, x);
        assert_eq!(
            g.to_bits(),
            want.to_bits(),
            "{dt} {isa:?} element {i}: {:#010x} rounded to {:#010x}, half gives {:#010x}",
            x.to_bits(),
            g.to_bits(),
            want.to_bits()
        );
    }
}
