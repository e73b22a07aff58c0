//! What the integer dot-product tests share: the fixture format written by llama.cpp's own
//! `libggml-cpu` (see `tests/qdot.rs`), CPU feature detection, seeded rows and patterns.

#![allow(dead_code)]

use tessera::DType;
use tessera_cpu::ops::matmul_quant::vec_dot_type;
use tessera_cpu::ops::qdot::vec_dot;
use tessera_cpu::Isa;

pub const PATTERNS: usize = 12;

pub struct Case {
    pub t: DType,
    pub k: usize,
    pub pattern: u32,
    pub w: Vec<u8>,
    pub x: Vec<u8>,
    pub avx2: f32,
    pub generic: f32,
}

/// The cases of a fixture file (format in `tests/qdot.rs`).
pub fn parse_fixture(b: &[u8]) -> Vec<Case> {
    assert_eq!(&b[0..8], b"QDOTFIX1");
    let u32_at = |p: usize| u32::from_le_bytes(b[p..p + 4].try_into().unwrap());
    let count = u32_at(8) as usize;
    let mut p = 12;
    let mut cases = Vec::with_capacity(count);
    for _ in 0..count {
        let (id, k, pattern, wl, xl) = (
            u32_at(p),
            u32_at(p + 4) as usize,
            u32_at(p + 8),
            u32_at(p + 12) as usize,
            u32_at(p + 16) as usize,
        );
        p += 20;
        let w = b[p..p + wl].to_vec();
        let x = b[p + wl..p + wl + xl].to_vec();
        p += wl + xl;
        let avx2 = f32::from_bits(u32_at(p));
        let generic = f32::from_bits(u32_at(p + 4));
        p += 8;
        let t = DType::from_id(id).expect("known type");
        assert_eq!(w.len(), t.row_size(k).unwrap());
        assert_eq!(x.len(), vec_dot_type(t).row_size(k).unwrap());
        cases.push(Case {
            t,
            k,
            pattern,
            w,
            x,
            avx2,
            generic,
        });
    }
    assert_eq!(p, b.len());
    cases
}

pub fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

pub fn rng(seed: u64) -> impl FnMut() -> f32 {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        // roughly normal: sum of four uniforms, centred
        let u = |v: u64| (v & 0xffff) as f32 / 65536.0;
        (u(s) + u(s >> 16) + u(s >> 32) + u(s >> 48) - 2.0) * 1.7
    }
}

pub fn rng_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 32) as u8
        })
        .collect()
}

pub fn pattern(p: usize, k: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut g = rng(seed);
    let mut h = rng(seed ^ 0xabcdef);
    let alt = |i: usize, v: f32| if i.is_multiple_of(2) { v } else { -v };
    (0..k)
        .map(|i| {
            let (a, b) = (g(), h());
            match p {
                0 => (a, b),
                1 => (a * (2.0 * g()).exp(), b * (2.0 * h()).exp()), // mixed magnitudes
                2 => (0.0, b),                                       // zero weights
                3 => (a, 0.0),                                       // zero activations
                4 => (0.5, -1.25),                                   // constants
                5 => (a * 1e4, b * 1e-5),                            // huge × tiny
                6 => (a * 1e-6, b * 3e3),                            // tiny × huge
                7 => (alt(i, 3.0), alt(i, 1.0)),                     // alternating, same phase
                8 => (alt(i, 3.0), alt(i + 1, 1.0)),                 // opposite phase
                9 => (
                    if i == 37 { 100.0 } else { a },
                    if i == k - 5 { -80.0 } else { b },
                ), // outliers
                10 => ((a * 1.5).round().clamp(-1.0, 1.0) * 0.7, b), // ternary weights
                _ => (a + 4.0, b.abs() + 1.0),                       // all positive, offset
            }
        })
        .unzip()
}

pub fn dequant(t: DType, b: &[u8], k: usize) -> Vec<f32> {
    let mut v = vec![0f32; k];
    tessera_quants::dequantize_row(t.id(), b, &mut v).unwrap();
    v
}

/// Runs every fixture case through `qdot::vec_dot` on each of `isas` and asserts the result
/// equals, bit for bit, the value ggml gave (`want`: the case's `avx2` or `generic` result);
/// returns the number of comparisons.
pub fn assert_fixture_bit_exact(cases: &[Case], isas: &[Isa], want: fn(&Case) -> f32) -> usize {
    let mut bad = Vec::new();
    let mut n = 0;
    for c in cases {
        for &isa in isas {
            let got = vec_dot(isa, c.t, &c.w, &c.x, c.k);
            n += 1;
            if got.to_bits() != want(c).to_bits() {
                bad.push(format!(
                    "{} k={} pattern {} {isa:?}: {got:e} vs ggml {:e}",
                    c.t,
                    c.k,
                    c.pattern,
                    want(c)
                ));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    n
}

/// The fixture's cases of type `t`, asserting that there are at least 15, at least 3 of them of
/// random block bytes (pattern 100), and one for each row length in `ks`.
pub fn cases_of<'a>(cases: &'a [Case], t: DType, ks: &[usize]) -> Vec<&'a Case> {
    let of_t: Vec<&Case> = cases.iter().filter(|c| c.t == t).collect();
    let random = of_t.iter().filter(|c| c.pattern == 100).count();
    assert!(
        of_t.len() >= 15 && random >= 3,
        "{t}: {} cases, {random} random",
        of_t.len()
    );
    for &k in ks {
        assert!(of_t.iter().any(|c| c.k == k), "{t}: no case of k={k}");
    }
    of_t
}

/// Asserts that ggml's two paths round differently on some case of `t`, so that each bit-exact
/// test pins down its own path's order of float operations.
pub fn assert_paths_differ(of_t: &[&Case], t: DType) {
    assert!(
        of_t.iter().any(|c| c.avx2.to_bits() != c.generic.to_bits()),
        "{t}: ggml's two paths agree on every case"
    );
}

/// The four-row mat-vec kernel (`matmul_quant::vec_dot4`) on every case of `of_t` (one type),
/// each case's row next to the three that follow it with its `k` (itself again where there are
/// fewer): every row's result equals `vec_dot`'s bits, on the scalar path, the AVX2 one and this
/// CPU's, for each prefetch distance in `pfs`; on the SIMD paths the case's row also equals
/// ggml's AVX2 result. Returns how many SIMD comparisons with ggml were made.
pub fn check_four_rows(t: DType, of_t: &[&Case], pfs: &[usize]) -> usize {
    use tessera_cpu::ops::matmul_quant::vec_dot4;
    let mut checked = 0;
    for (ci, c) in of_t.iter().enumerate() {
        let others: Vec<&&Case> = of_t
            .iter()
            .cycle()
            .skip(ci + 1)
            .filter(|o| o.k == c.k)
            .take(3)
            .collect();
        let rows = [&c.w[..], &others[0].w, &others[1].w, &others[2].w];
        for isa in [Isa::Scalar, Isa::Avx2, tessera_cpu::simd::isa()] {
            if isa != Isa::Scalar && !has_avx2() {
                continue;
            }
            for &pf in pfs {
                let four = vec_dot4(isa, t, rows, &c.x, c.k, pf);
                for (r, row) in rows.iter().enumerate() {
                    let one = vec_dot(isa, t, row, &c.x, c.k);
                    assert_eq!(
                        four[r].to_bits(),
                        one.to_bits(),
                        "{t} k={} pattern {} row {r} {isa:?}: {} vs vec_dot {one}",
                        c.k,
                        c.pattern,
                        four[r]
                    );
                }
                if isa != Isa::Scalar {
                    assert_eq!(four[0].to_bits(), c.avx2.to_bits(), "{t} k={} vs ggml", c.k);
                    checked += 1;
                }
            }
        }
    }
    checked
}
