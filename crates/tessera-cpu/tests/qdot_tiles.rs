//! `ops::qdot_tiles`: one weight row against four activation columns must give, for every
//! column, exactly the bits of `qdot::vec_dot` for that column alone, on the AVX2 path and on
//! the fallback.

use tessera::DType;
use tessera_cpu::ops::matmul_quant::{quantize_activations, vec_dot_type};
use tessera_cpu::ops::qdot::vec_dot;
use tessera_cpu::ops::qdot_tiles::{supported, vec_dot_1x4};
use tessera_cpu::Isa;

/// The types with a real four-column kernel.
const TYPES: [DType; 7] = [
    DType::Q2K,
    DType::Q3K,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
    DType::IQ4XS,
    DType::TQ1_0,
];

const KS: [usize; 3] = [256, 512, 4096];

fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

/// Roughly normal floats (sum of four uniforms, centred).
fn normals(n: usize, seed: u64) -> Vec<f32> {
    let mut g = rng(seed);
    let u = |v: u64| (v & 0xffff) as f32 / 65536.0;
    (0..n)
        .map(|_| {
            let s = g();
            (u(s) + u(s >> 16) + u(s >> 32) + u(s >> 48) - 2.0) * 1.7
        })
        .collect()
}

/// Float weight rows of `k` values: random, mixed magnitudes, zeros, constants, outliers,
/// alternating signs.
fn patterns(k: usize, seed: u64) -> Vec<(&'static str, Vec<f32>)> {
    let r = normals(k, seed);
    let mixed = r
        .iter()
        .enumerate()
        .map(|(i, &v)| v * [1e-4, 1.0, 30.0, 1e3][(i / 7) % 4])
        .collect();
    let outliers = r
        .iter()
        .enumerate()
        .map(|(i, &v)| if i % 97 == 13 { v * 500.0 } else { v * 0.1 })
        .collect();
    let alternating = (0..k)
        .map(|i| if i % 2 == 0 { 0.75 } else { -1.25 })
        .collect();
    vec![
        ("random", r),
        ("mixed", mixed),
        ("zeros", vec![0.0; k]),
        ("constant", vec![0.37; k]),
        ("negative constant", vec![-2.5; k]),
        ("outliers", outliers),
        ("alternating", alternating),
    ]
}

fn quantize_weights(t: DType, wf: &[f32]) -> Vec<u8> {
    let mut w = vec![0u8; wf.len() / t.block_size() * t.type_size()];
    tessera_quants::quantize_row(t.id(), wf, &mut w, None).unwrap();
    w
}

/// Offsets of the f16 scales in one block of `t`.
fn f16_fields(t: DType) -> &'static [usize] {
    match t {
        DType::Q4K | DType::Q5K => &[0, 2],
        DType::Q2K => &[80, 82],
        DType::Q3K => &[108],
        DType::Q6K => &[208],
        DType::IQ4XS => &[0],
        DType::TQ1_0 => &[52],
        _ => unreachable!(),
    }
}

/// Random block bytes (every bit pattern of quants, scales and high bits) with f16 scales
/// between 1/16 and 2 (either sign).
fn random_blocks(t: DType, k: usize, seed: u64) -> Vec<u8> {
    let (nb, ts) = (k / t.block_size(), t.type_size());
    let mut g = rng(seed);
    let mut w: Vec<u8> = (0..nb * ts).map(|_| (g() >> 24) as u8).collect();
    for b in 0..nb {
        for &f in f16_fields(t) {
            // exponent 11..15 (2^-4 .. 2^0), any mantissa, any sign
            let hi = w[b * ts + f + 1];
            w[b * ts + f + 1] = (hi & 0x83) | ((11 + hi % 5) << 2);
        }
    }
    w
}

/// Four q8_K activation columns of `k` values from random floats (different scales per column).
fn columns(t: DType, k: usize, seed: u64) -> Vec<Vec<u8>> {
    let vdt = vec_dot_type(t);
    (0..4)
        .map(|c| {
            let scale = [1.0f32, 0.01, 37.0, 3e-3][c];
            let xf: Vec<f32> = normals(k, seed * 31 + c as u64)
                .into_iter()
                .map(|v| v * scale)
                .collect();
            let mut x = vec![0u8; k / vdt.block_size() * vdt.type_size()];
            quantize_activations(vdt, &xf, &mut x).unwrap();
            x
        })
        .collect()
}

fn check(isa: Isa, t: DType, what: &str, w: &[u8], x: &[Vec<u8>], k: usize) {
    let got = vec_dot_1x4(isa, t, w, [&x[0], &x[1], &x[2], &x[3]], k);
    for c in 0..4 {
        let want = vec_dot(isa, t, w, &x[c], k);
        assert_eq!(
            got[c].to_bits(),
            want.to_bits(),
            "{isa:?} {t} k={k} {what} column {c}: 1x4 {} vs vec_dot {want}",
            got[c]
        );
    }
}

/// Every weight row of every pattern and of random bytes against four columns; returns how
/// many rows were checked.
fn check_all(isa: Isa) -> usize {
    let mut rows = 0;
    for t in TYPES {
        for (s, k) in KS.into_iter().enumerate() {
            let seed = 1000 * s as u64 + t.id() as u64;
            let x = columns(t, k, seed);
            for (name, wf) in patterns(k, seed + 7) {
                check(isa, t, name, &quantize_weights(t, &wf), &x, k);
                rows += 1;
            }
            for r in 0..4 {
                let w = random_blocks(t, k, seed * 13 + r);
                check(isa, t, "random bytes", &w, &x, k);
                rows += 1;
            }
        }
    }
    rows
}

#[test]
fn avx2_1x4_matches_vec_dot_bit_for_bit() {
    // on a CPU without AVX2 both sides take the fallback; still equal
    let rows = check_all(Isa::Avx2);
    assert_eq!(rows, TYPES.len() * KS.len() * 11);
}

/// `Isa::Avx512`: the kernels compiled for AVX-512 VNNI where the CPU has it (the same integer
/// sums, so `vec_dot`'s bits), the AVX2 ones elsewhere.
#[test]
fn avx512_isa_matches_vec_dot_bit_for_bit() {
    let rows = check_all(Isa::Avx512);
    assert_eq!(rows, TYPES.len() * KS.len() * 11);
}

/// `Isa::AvxVnni`: the kernels compiled for AVX-VNNI where the CPU has it, the AVX2 ones
/// elsewhere; `vec_dot`'s bits either way.
#[test]
fn avx_vnni_isa_matches_vec_dot_bit_for_bit() {
    let rows = check_all(Isa::AvxVnni);
    assert_eq!(rows, TYPES.len() * KS.len() * 11);
}

#[test]
fn scalar_1x4_matches_vec_dot_bit_for_bit() {
    check_all(Isa::Scalar);
}

#[test]
fn other_types_fall_back() {
    for t in [DType::IQ4NL, DType::Q5_0] {
        let k = 512;
        let x = columns(t, k, 9);
        let w = quantize_weights(t, &normals(k, 10));
        check(Isa::Avx2, t, "random", &w, &x, k);
        check(Isa::Scalar, t, "random", &w, &x, k);
    }
}

#[test]
fn supported_exactly_for_the_kernels() {
    for t in DType::ALL {
        assert_eq!(supported(t), TYPES.contains(&t), "{t}");
    }
}

#[test]
#[should_panic(expected = "qdot_tiles")]
fn short_column_panics() {
    let t = DType::Q4K;
    let k = 512;
    let x = columns(t, k, 3);
    let w = quantize_weights(t, &normals(k, 4));
    let short = &x[2][..x[2].len() - 1];
    vec_dot_1x4(Isa::Avx2, t, &w, [&x[0], &x[1], short, &x[3]], k);
}

#[test]
#[should_panic(expected = "qdot_tiles")]
fn short_weight_row_panics() {
    let t = DType::Q6K;
    let k = 512;
    let x = columns(t, k, 3);
    let w = quantize_weights(t, &normals(k, 4));
    vec_dot_1x4(
        Isa::Avx2,
        t,
        &w[..w.len() - 1],
        [&x[0], &x[1], &x[2], &x[3]],
        k,
    );
}
