//! q4_0, iq4_nl, q4_K, mxfp4 and q2_K weights with ggml's repack arithmetic
//! (`RowLayout::Repacked8`, `ops::qgemv_repack`, `ops::qgemv_repack_k`,
//! `ops::qgemv_repack_q2k`): mul_mat against ggml's own results from its CPU repack buffer,
//! the kernels against the scalar definitions (q4_K's and q2_K's two roundings on every path
//! of a product), and the errors for what the layout does not take.

mod common;

use common::*;
use tessera::{DType, Graph, RowLayout, Session};
use tessera_cpu::ops::matmul_quant::quantize_activations;
use tessera_cpu::ops::qgemv_repack as rp;
use tessera_cpu::ops::qgemv_repack::{
    mx_transpose8, mx_transpose8_scalar, mx_transposed_bytes, mxfp4_8x4_transposed, vec_dot8,
    vec_dot8_groups4, vec_dot8x4, vec_dot_ref,
};
use tessera_cpu::ops::qgemv_repack_k as rk;
use tessera_cpu::ops::qgemv_repack_q2k as q2;
use tessera_cpu::simd::Isa;

/// `data/q4_repack_mm_ggml.bin`, written by a small C program (not part of this repository)
/// linked against llama.cpp's `libggml-cpu` as vendored by llama-cpp-python 0.3.36 (gcc 12,
/// a native build on a Xeon with AVX-512 VNNI and AMX; a build for AVX2 alone, without
/// AVX-512, wrote the same bytes): weights quantized by
/// `ggml_quantize_chunk`, put in the `CPU_REPACK` buffer type (ggml reported `q4_0_8x8` and
/// `iq4_nl_8x8` repacking), f32 activations, the results of `ggml_mul_mat` computed by
/// `ggml_backend_graph_compute` (1 and 2 threads gave the same bytes; against the plain
/// buffer 1 of 8 to 167 of 256 results of each case differ). Format: `common::qmm_fixture`.
fn fixture() -> Vec<QmmCase> {
    qmm_fixture(include_bytes!("data/q4_repack_mm_ggml.bin"))
}

/// `data/q4k_repack_mm_ggml.bin`, written by a small C program (not part of this repository)
/// linked against llama.cpp's `libggml-cpu` as vendored by llama-cpp-python 0.3.36 (gcc 12;
/// a native build on a Xeon with AVX-512 VNNI and AMX and a build for AVX2 alone wrote the
/// same bytes): q4_K weights quantized by `ggml_quantize_chunk`, put in the `CPU_REPACK`
/// buffer type (ggml reported `q4_K_8x8` repacking), f32 activations, the results of
/// `ggml_mul_mat` computed by `ggml_backend_graph_compute` (1 and 2 threads gave the same
/// bytes; against the plain buffer 4 of 8 to 207 of 272 results of each case differ). Ten
/// cases: K 256-1536, 8-32 rows, 1-17 columns (whole fours, the rest, both), two of them with
/// every weight and activation near its maximum, so that a superblock's integer sum passes
/// 2²⁴. Format: `common::qmm_fixture`.
fn fixture_q4_k() -> Vec<QmmCase> {
    qmm_fixture(include_bytes!("data/q4k_repack_mm_ggml.bin"))
}

/// `data/mxfp4_repack_mm_ggml.bin`, written by a small C program (not part of this
/// repository) linked against llama.cpp's `libggml-cpu` as vendored by llama-cpp-python 0.3.36
/// (gcc 12, a native build on an AMD Zen 4 with AVX-512): mxfp4 weights put in the
/// `CPU_REPACK` buffer type (ggml reported `mxfp4_8x8` repacking), f32 activations, the results
/// of `ggml_mul_mat` computed by `ggml_backend_graph_compute` (1 and 2 threads gave the same
/// bytes; against the plain buffer 309 of 752 results differ). Twelve cases: K 32-2048, 8-32
/// rows, 1-17 columns; six with weights from `ggml_quantize_chunk`, six with random bytes,
/// three of them with scale bytes 0-5 and activations near 10⁻³, so that the products of the
/// two scales and the results are subnormal, and three with scale bytes 100-155. Format:
/// `common::qmm_fixture`.
fn fixture_mxfp4() -> Vec<QmmCase> {
    qmm_fixture(include_bytes!("data/mxfp4_repack_mm_ggml.bin"))
}

/// Runs `c` with repacked rows on every CPU configuration and asserts every result's bits
/// are `c.want`'s (`whose`: where those come from, for the message).
fn assert_every_config_gives(c: &QmmCase, whose: &str) {
    let (mut s, y) = mul_mat(c, RowLayout::Repacked8);
    for cpu in cpu_configs() {
        s.compute(&cpu).unwrap();
        let got = s.get_f32(y).unwrap();
        for (i, (g, w)) in got.iter().zip(&c.want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{} k={} m={} n={}: element {i} is {g}, {whose} {w}, on {:?}/{}t",
                c.t,
                c.k,
                c.m,
                c.n,
                cpu.isa(),
                cpu.n_threads()
            );
        }
    }
}

fn mul_mat(c: &QmmCase, layout: RowLayout) -> (Session, tessera::TensorId) {
    let mut g = Graph::new();
    let a = g.new_tensor(c.t, &[c.k, c.m]).unwrap();
    let b = g.new_f32(&[c.k, c.n]).unwrap();
    g.set_layout(a, layout).unwrap();
    let y = g.mul_mat(a, b).unwrap();
    let mut s = Session::new(g, &[y]).unwrap();
    s.set_bytes(a, &c.w).unwrap();
    s.set_f32(b, &c.b).unwrap();
    (s, y)
}

/// Asserts that more than `1 / part` of the cases' results have other bits in the plain
/// layout than `want` (so that the fixture tells the two arithmetics apart).
fn assert_plain_differs(cases: &[QmmCase], part: usize) {
    let (differ, total) = plain_results_differing(cases);
    assert!(
        differ * part > total,
        "only {differ} of {total} plain results differ"
    );
}

/// How many of the cases' results the plain layout gives with other bits than `want`, of
/// how many.
fn plain_results_differing(cases: &[QmmCase]) -> (usize, usize) {
    let (mut differ, mut total) = (0, 0);
    for c in cases {
        let (mut s, y) = mul_mat(c, RowLayout::Plain);
        s.compute(&tessera_cpu::CpuBackend::new(1)).unwrap();
        let got = s.get_f32(y).unwrap();
        differ += got
            .iter()
            .zip(&c.want)
            .filter(|(g, w)| g.to_bits() != w.to_bits())
            .count();
        total += got.len();
    }
    (differ, total)
}

/// Every result bit for bit as ggml's repack buffer gives it, on every ISA (the scalar one
/// too) and thread count, for one to nine columns; the plain layout differs from it (so the
/// fixture tells the two arithmetics apart).
#[test]
fn repacked_rows_equal_ggml_repack_mul_mat() {
    let cases = fixture();
    let mut seen = (false, false);
    for c in &cases {
        seen.0 |= c.t == DType::Q4_0;
        seen.1 |= c.t == DType::IQ4NL;
        assert_every_config_gives(c, "ggml's repack gives");
    }
    assert!(seen.0 && seen.1 && cases.len() >= 10);
    assert_plain_differs(&cases, 3);
}

/// Random rows and adversarial ones (extreme and special f16 scales, codes at both ends):
/// each ISA's eight-row kernel gives, row by row, what the scalar definition gives.
#[test]
fn kernels_equal_the_definition() {
    let mut rng = Rng::new(0x5eed_4a11);
    let isas = isas();
    let scales = [
        0x7bff, // 65504
        0xfbff, // -65504
        0x0001, // smallest subnormal
        0x8400, // -2^-14
        0x0000, 0x3c00, 0x7c00, // inf
        0x7e00, // nan
    ];
    let mut checked = 0;
    for case in 0..60 {
        let t = if case % 2 == 0 {
            DType::Q4_0
        } else {
            DType::IQ4NL
        };
        let k = 32 * (1 + rng.below(40));
        let row = t.row_size(k).unwrap();
        let (mut plain, mut x) = rows8_and_q8_0(t, k, &mut rng);
        if case >= 30 {
            // adversarial: all codes 0 or 15, activations ±127, extreme scales
            for (i, b) in plain.iter_mut().enumerate() {
                if i % 18 >= 2 {
                    *b = [0x00, 0xff, 0x0f, 0xf0][rng.below(4)];
                }
            }
            for (i, b) in x.iter_mut().enumerate() {
                if i % 34 >= 2 {
                    *b = if rng.below(2) == 0 {
                        127
                    } else {
                        (-127i8) as u8
                    };
                }
            }
            let finite = case < 45;
            for blk in plain.chunks_exact_mut(18).chain(x.chunks_exact_mut(34)) {
                if rng.below(3) == 0 {
                    let h: u16 = scales[rng.below(if finite { 6 } else { 8 })];
                    blk[..2].copy_from_slice(&h.to_le_bytes());
                }
            }
        }
        let mut g = vec![0u8; plain.len()];
        tessera::layout::interleave8(t, row, &plain, &mut g).unwrap();
        // three more columns for the four-column kernel: x's blocks in another order
        let nb = k / 32;
        let others = other_columns(&x, nb);
        for &isa in &isas {
            let four = vec_dot8x4(isa, t, &g, [&x, &others[0], &others[1], &others[2]], k);
            for (c, xc) in [&x, &others[0], &others[1], &others[2]].iter().enumerate() {
                let want = vec_dot8(Isa::Scalar, t, &g, xc, k);
                for r in 0..8 {
                    assert!(
                        four[c][r].to_bits() == want[r].to_bits()
                            || (four[c][r].is_nan() && want[r].is_nan()),
                        "{t} k={k} case {case} column {c} row {r} on {isa:?}: four columns \
                         give {}, one {}",
                        four[c][r],
                        want[r]
                    );
                }
            }
            let got = vec_dot8(isa, t, &g, &x, k);
            for r in 0..8 {
                let want = vec_dot_ref(t, &plain[r * row..(r + 1) * row], &x, k);
                assert!(
                    got[r].to_bits() == want.to_bits() || (got[r].is_nan() && want.is_nan()),
                    "{t} k={k} case {case} row {r} on {isa:?}: {} vs the definition's {want}",
                    got[r]
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 480 * isas.len());
}

/// mul_mat of repacked rows, for row counts whose mat-vec takes four groups a call (one from
/// each quarter of a thread's rows) and the groups left over, and for 1-6 columns (four a
/// call and the rest): every result is the definition's for its row and quantized column, on
/// every ISA and thread count. The four-group kernel alone, too.
#[test]
fn every_path_of_a_product_gives_the_definition() {
    let mut rng = Rng::new(0x9e9e);
    for (t, k, m, n) in [
        (DType::Q4_0, 288, 32, 1),
        (DType::IQ4NL, 288, 72, 1),
        (DType::Q4_0, 64, 136, 1),
        (DType::IQ4NL, 96, 264, 1),
        (DType::Q4_0, 160, 40, 6),
        (DType::IQ4NL, 64, 48, 4),
    ] {
        let row = t.row_size(k).unwrap();
        let wv: Vec<f32> = (0..k * m).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let mut w = vec![0u8; row * m];
        for r in 0..m {
            tessera_quants::quantize_row(
                t.id(),
                &wv[r * k..(r + 1) * k],
                &mut w[r * row..(r + 1) * row],
                None,
            )
            .unwrap();
        }
        let b: Vec<f32> = (0..k * n).map(|_| rng.uniform(-2.0, 2.0)).collect();
        let qrow = DType::Q8_0.row_size(k).unwrap();
        let mut xq = vec![0u8; qrow * n];
        for j in 0..n {
            quantize_activations(
                DType::Q8_0,
                &b[j * k..(j + 1) * k],
                &mut xq[j * qrow..(j + 1) * qrow],
            )
            .unwrap();
        }
        let want: Vec<f32> = (0..n)
            .flat_map(|j| {
                let (w, xq) = (&w, &xq);
                (0..m).map(move |r| {
                    vec_dot_ref(
                        t,
                        &w[r * row..(r + 1) * row],
                        &xq[j * qrow..(j + 1) * qrow],
                        k,
                    )
                })
            })
            .collect();
        let c = QmmCase {
            t,
            k,
            m,
            n,
            w: w.clone(),
            b,
            want,
        };
        assert_every_config_gives(&c, "the definition gives");
        // the four-group kernel on four groups of this matrix
        if m >= 32 {
            let mut g = vec![0u8; w.len()];
            tessera::layout::interleave8(t, row, &w, &mut g).unwrap();
            let grp = |i: usize| &g[i * 8 * row..(i + 1) * 8 * row];
            let best = tessera_cpu::simd::isa();
            let avx2 = (best > Isa::Avx2 && best != Isa::Neon).then_some(Isa::Avx2);
            for isa in [Isa::Scalar, best].into_iter().chain(avx2) {
                let four =
                    vec_dot8_groups4(isa, t, [grp(0), grp(3), grp(1), grp(2)], &xq[..qrow], k);
                for (gi, v) in [0, 3, 1, 2].iter().zip(&four) {
                    for (i, y) in v.iter().enumerate() {
                        assert_eq!(
                            y.to_bits(),
                            c.want[8 * gi + i].to_bits(),
                            "{t} group {gi} row {i} on {isa:?}"
                        );
                    }
                }
            }
        }
    }
}

/// The definition against an f64 dot product of the dequantized values: the arithmetic is a
/// sum, within an f32 rounding per block.
#[test]
fn the_definition_is_a_dot_product() {
    let mut rng = Rng::new(77);
    for t in [DType::Q4_0, DType::IQ4NL, DType::MXFP4] {
        let k = 256;
        let (w, x) = random_row_and_q8_0(t, k, &mut rng);
        let (mut wd, mut xd) = (vec![0f32; k], vec![0f32; k]);
        tessera_quants::dequantize_row(t.id(), &w, &mut wd).unwrap();
        tessera_quants::dequantize_row(DType::Q8_0.id(), &x, &mut xd).unwrap();
        let exact: f64 = wd.iter().zip(&xd).map(|(&a, &b)| a as f64 * b as f64).sum();
        let got = vec_dot_ref(t, &w, &x, k) as f64;
        assert!(
            (got - exact).abs() <= 1e-5 * exact.abs().max(1.0),
            "{t}: {got} vs {exact}"
        );
    }
}

/// What the layout does not take is an error naming the tensor and the reason: q4_1 and q5_K
/// rows (ggml's repack arithmetic is reproduced for q4_0, iq4_nl, q4_K, mxfp4 and q2_K only),
/// a row count that is not whole groups of eight, q2_K rows interleaved (it takes the repack
/// arithmetic on its plain rows, and has no interleaved layout), and a product the kernels do not cover (an f16 second operand),
/// which would otherwise run the fallback's other arithmetic.
#[test]
fn what_the_layout_does_not_take_is_an_error() {
    let refused = |t: DType, ne: [usize; 2], layout: RowLayout| {
        let mut g = Graph::new();
        let a = g.new_tensor(t, &ne).unwrap();
        g.set_layout(a, layout).unwrap_err().to_string()
    };
    let e = refused(DType::Q4_1, [64, 8], RowLayout::Repacked8);
    assert!(e.contains("q4_1") && e.contains("repack"), "{e}");
    let e = refused(DType::Q5K, [256, 8], RowLayout::Repacked8);
    assert!(e.contains("q5_K") && e.contains("repack"), "{e}");
    for (t, k) in [(DType::Q4_0, 64), (DType::Q4K, 256), (DType::Q2K, 256)] {
        let e = refused(t, [k, 12], RowLayout::Repacked8);
        assert!(e.contains("12 rows"), "{e}");
    }
    let e = refused(DType::Q2K, [256, 8], RowLayout::Interleaved8);
    assert!(e.contains("q2_K") && e.contains("interleaved"), "{e}");

    for (t, k) in [(DType::Q4_0, 64), (DType::Q4K, 256), (DType::Q2K, 256)] {
        let mut g = Graph::new();
        let a = g.new_tensor(t, &[k, 8]).unwrap();
        let b = g.new_tensor(DType::F16, &[k, 2]).unwrap();
        g.set_layout(a, RowLayout::Repacked8).unwrap();
        let y = g.mul_mat(a, b).unwrap();
        let mut s = Session::new(g, &[y]).unwrap();
        s.set_bytes(a, &vec![0x11u8; 8 * t.row_size(k).unwrap()])
            .unwrap();
        s.set_f32(b, &vec![0.5; 2 * k]).unwrap();
        let e = s
            .compute(&tessera_cpu::CpuBackend::new(1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("Repacked8") && e.contains(&t.to_string()), "{e}");
    }
}

/// Every result bit for bit as ggml's repack buffer gives it, on every ISA (the scalar one
/// too) and thread count; the plain layout differs from it in many results.
#[test]
fn repacked_q4_k_rows_equal_ggml_repack_mul_mat() {
    assert_plain_rows_give(&fixture_q4_k(), DType::Q4K, 10, 2);
}

/// The cases (at least `count`, all of `t`, whose rows stay plain in `Repacked8`): every
/// result bit for bit as ggml's repack buffer gives it, on every ISA and thread count; what
/// was set is what is read; and more than `1 / part` of the results differ with the plain
/// layout.
fn assert_plain_rows_give(cases: &[QmmCase], t: DType, count: usize, part: usize) {
    assert!(cases.len() >= count && cases.iter().all(|c| c.t == t));
    for c in cases {
        assert_every_config_gives(c, "ggml's repack gives");
        // the layout keeps ggml's rows: what was set is what is read
        let mut g = Graph::new();
        let a = g.new_tensor(c.t, &[c.k, c.m]).unwrap();
        g.set_layout(a, RowLayout::Repacked8).unwrap();
        let mut s = Session::new(g, &[a]).unwrap();
        s.set_bytes(a, &c.w).unwrap();
        assert_eq!(s.get_bytes(a).unwrap(), c.w);
    }
    assert_plain_differs(cases, part);
}

/// Eight random rows of `t` (values in [-2, 2), quantized by ggml's reference quantizer, one
/// after the other) and a random activation row quantized to q8_0 as mul_mat quantizes it.
fn rows8_and_q8_0(t: DType, k: usize, rng: &mut Rng) -> (Vec<u8>, Vec<u8>) {
    let row = t.row_size(k).unwrap();
    let mut plain = vec![0u8; 8 * row];
    for r in 0..8 {
        let v: Vec<f32> = (0..k).map(|_| rng.uniform(-2.0, 2.0)).collect();
        tessera_quants::quantize_row(t.id(), &v, &mut plain[r * row..(r + 1) * row], None).unwrap();
    }
    let xv: Vec<f32> = (0..k).map(|_| rng.uniform(-3.0, 3.0)).collect();
    let mut x = vec![0u8; DType::Q8_0.row_size(k).unwrap()];
    quantize_activations(DType::Q8_0, &xv, &mut x).unwrap();
    (plain, x)
}

/// Three more q8_0 columns for the four-column kernels: `x`'s `nb` blocks in other orders.
fn other_columns(x: &[u8], nb: usize) -> Vec<Vec<u8>> {
    (1..4)
        .map(|c| {
            (0..nb)
                .flat_map(|b| x[(b * c + c) % nb * 34..][..34].to_vec())
                .collect()
        })
        .collect()
}

/// The scalar ISA, this CPU's best, and AVX2 on a CPU that prefers another.
fn isas() -> Vec<Isa> {
    let mut isas = vec![Isa::Scalar];
    let best = tessera_cpu::simd::isa();
    if best != Isa::Scalar {
        isas.push(best);
    }
    if best > Isa::Avx2 && best != Isa::Neon {
        isas.push(Isa::Avx2);
    }
    isas
}

fn quantized(t: DType, v: &[f32]) -> Vec<u8> {
    let k = v.len();
    let mut q = vec![0u8; t.row_size(k).unwrap()];
    if t == DType::Q8K {
        quantize_activations(t, v, &mut q).unwrap();
    } else {
        tessera_quants::quantize_row(t.id(), v, &mut q, None).unwrap();
    }
    q
}

/// Eight rows against four columns (a kernel's entry point).
type FourColumns = fn(Isa, &[u8], [&[u8]; 4], usize) -> [[f32; 8]; 4];

/// A superblock type whose repack arithmetic has two roundings (q4_K, q2_K): where its
/// fields are and its entry points.
struct KRepack {
    t: DType,
    block: usize,
    /// the f16 `d` and `dmin` offsets in a block
    d_at: [usize; 2],
    /// the scale bytes and the code bytes of a block
    scales: std::ops::Range<usize>,
    codes: std::ops::Range<usize>,
    /// code byte values to fill a block with (codes at both ends)
    fills: &'static [u8],
    def: fn(&[u8], &[u8], usize, bool) -> f32,
    one: fn(Isa, &[u8], &[u8], usize) -> [f32; 8],
    four: FourColumns,
}

const Q4K: KRepack = KRepack {
    t: DType::Q4K,
    block: rk::BLOCK,
    d_at: [0, 2],
    scales: 4..16,
    codes: 16..144,
    fills: &[0x00, 0xff, 0xf0],
    def: rk::vec_dot_ref,
    one: rk::vec_dot8,
    four: rk::vec_dot8x4,
};

const Q2K: KRepack = KRepack {
    t: DType::Q2K,
    block: q2::BLOCK,
    d_at: [80, 82],
    scales: 0..16,
    codes: 16..80,
    fills: &[0x00, 0xff, 0xf0, 0x1b],
    def: q2::vec_dot_ref,
    one: q2::vec_dot8,
    four: q2::vec_dot8x4,
};

/// Random rows and adversarial ones (extreme and special f16 scales, every scale and min at
/// its largest, codes at both ends, activations at ±127): each ISA's eight-row kernels (and
/// `more`, another kernel's four columns where it runs) give, row by row and column by
/// column, what the definition gives with their rounding.
fn k_kernels_equal_the_definition(
    q: &KRepack,
    seed: u64,
    more: impl Fn(Isa, &[u8], [&[u8]; 4], usize) -> Option<[[f32; 8]; 4]>,
) {
    let mut rng = Rng::new(seed);
    let f16s = [
        0x7bffu16, 0xfbff, 0x0001, 0x8400, 0x0000, 0x3c00, 0x7c00, 0x7e00,
    ];
    let mut checked = 0;
    for case in 0..24 {
        let k = 256 * (1 + case % 3);
        let row = q.t.row_size(k).unwrap();
        let mut g = Vec::with_capacity(8 * row);
        for r in 0..8 {
            let v: Vec<f32> = (0..k)
                .map(|_| rng.uniform(-1.0, 1.0) * (1 + r) as f32)
                .collect();
            let mut w = quantized(q.t, &v);
            if case % 2 == 1 {
                for b in w.chunks_exact_mut(q.block) {
                    if rng.below(2) == 0 {
                        for at in q.d_at {
                            b[at..at + 2].copy_from_slice(&rng.pick(&f16s).to_le_bytes());
                        }
                    }
                    if rng.below(3) == 0 {
                        b[q.scales.clone()].fill(0xff); // every scale and min at its largest
                    }
                    if rng.below(3) == 0 {
                        let n = rng.pick(q.fills);
                        b[q.codes.clone()].fill(n);
                    }
                }
            }
            g.extend_from_slice(&w);
        }
        let xs: Vec<Vec<u8>> = (0..4)
            .map(|c| {
                let v: Vec<f32> = (0..k)
                    .map(|i| {
                        if case % 2 == 1 && c == 0 {
                            if i % 3 == 0 {
                                -1.0
                            } else {
                                1.0
                            }
                        } else {
                            rng.uniform(-2.0, 2.0)
                        }
                    })
                    .collect();
                quantized(DType::Q8K, &v)
            })
            .collect();
        assert_eq!(xs[0].len(), k / 256 * DType::Q8K.type_size());
        for isa in isas() {
            let xs4: [&[u8]; 4] = std::array::from_fn(|c| &xs[c][..]);
            let four = (q.four)(isa, &g, xs4, k);
            let more = more(isa, &g, xs4, k);
            for (c, x) in xs.iter().enumerate() {
                let one = (q.one)(isa, &g, x, k);
                for r in 0..8 {
                    let w = &g[r * row..(r + 1) * row];
                    let m = more.map(|t| (t[c][r], true));
                    for (got, quad) in [(one[r], false), (four[c][r], true)].into_iter().chain(m) {
                        let want = (q.def)(w, x, k, quad);
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{} case {case} column {c} row {r} quad {quad} on {isa:?}: {got} vs \
                             {want}",
                            q.t
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked >= 24 * 4 * 8 * 2);
}

#[test]
fn q4_k_kernels_equal_the_definition() {
    // and the mat-mat kernel on the rows rearranged one a lane, where it runs
    k_kernels_equal_the_definition(&Q4K, 0x4b5e_ed01, |isa, g, xs4, k| {
        rk::has_transposed_kernel(isa).then(|| {
            let mut t = vec![0u8; rk::transposed_bytes(k)];
            rk::transpose8(g, k, &mut t);
            rk::vec_dot8x4_transposed(isa, &t, xs4, k)
        })
    });
}

#[test]
fn q2_k_kernels_equal_the_definition() {
    k_kernels_equal_the_definition(&Q2K, 0x2b5e_ed02, |_, _, _, _| None);
}

/// mul_mat of repacked rows for 1-7 columns and several row counts: the columns in whole
/// fours from the first take the four-column rounding, the rest the one-column rounding, on
/// every ISA and thread count; and the two roundings differ somewhere (so the assignment is
/// tested).
fn every_path_gives_the_definition(q: &KRepack, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut roundings_differ = false;
    for (k, m, n) in [
        (256, 8, 1),
        (512, 40, 1),
        (768, 16, 3),
        (256, 24, 4),
        (512, 16, 7),
    ] {
        let row = q.t.row_size(k).unwrap();
        let wv: Vec<f32> = (0..k * m).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let w: Vec<u8> = wv.chunks(k).flat_map(|r| quantized(q.t, r)).collect();
        let b: Vec<f32> = (0..k * n).map(|_| rng.uniform(-2.0, 2.0)).collect();
        let xq: Vec<Vec<u8>> = b.chunks(k).map(|c| quantized(DType::Q8K, c)).collect();
        let quads = n - n % 4;
        let want: Vec<f32> = (0..n)
            .flat_map(|j| {
                let (w, xq) = (&w, &xq);
                (0..m).map(move |r| (q.def)(&w[r * row..(r + 1) * row], &xq[j], k, j < quads))
            })
            .collect();
        for x in &xq {
            for wr in w.chunks_exact(row) {
                roundings_differ |=
                    (q.def)(wr, x, k, true).to_bits() != (q.def)(wr, x, k, false).to_bits();
            }
        }
        let c = QmmCase {
            t: q.t,
            k,
            m,
            n,
            w,
            b,
            want,
        };
        assert_every_config_gives(&c, "the definition gives");
    }
    assert!(roundings_differ);
}

#[test]
fn every_path_of_a_q4_k_product_gives_the_definition() {
    every_path_gives_the_definition(&Q4K, 0x4b4b);
}

#[test]
fn every_path_of_a_q2_k_product_gives_the_definition() {
    every_path_gives_the_definition(&Q2K, 0x2b2b);
}

/// The definition against an f64 dot product of the dequantized values, for both roundings.
fn definition_is_a_dot_product(q: &KRepack, seed: u64) {
    let mut rng = Rng::new(seed);
    let k = 1024;
    let v: Vec<f32> = (0..k).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let xv: Vec<f32> = (0..k).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let (w, x) = (quantized(q.t, &v), quantized(DType::Q8K, &xv));
    let (mut wd, mut xd) = (vec![0f32; k], vec![0f32; k]);
    tessera_quants::dequantize_row(q.t.id(), &w, &mut wd).unwrap();
    tessera_quants::dequantize_row(DType::Q8K.id(), &x, &mut xd).unwrap();
    let exact: f64 = wd.iter().zip(&xd).map(|(&a, &b)| a as f64 * b as f64).sum();
    for quad in [false, true] {
        let got = (q.def)(&w, &x, k, quad) as f64;
        assert!(
            (got - exact).abs() <= 1e-4 * exact.abs().max(1.0),
            "{} quad {quad}: {got} vs {exact}",
            q.t
        );
    }
}

#[test]
fn the_q4_k_definition_is_a_dot_product() {
    definition_is_a_dot_product(&Q4K, 78);
}

#[test]
fn the_q2_k_definition_is_a_dot_product() {
    definition_is_a_dot_product(&Q2K, 79);
}

/// mxfp4: every result bit for bit as ggml's repack buffer gives it, on every ISA (the scalar
/// one too) and thread count, subnormal products of the scales included; the plain layout
/// differs from it in many results on x86, in a few on the portable path.
#[test]
fn repacked_mxfp4_rows_equal_ggml_repack_mul_mat() {
    let cases = fixture_mxfp4();
    assert!(cases.len() >= 12 && cases.iter().all(|c| c.t == DType::MXFP4));
    for c in &cases {
        assert_every_config_gives(c, "ggml's repack gives");
    }
    // x86's plain kernels keep eight lane sums per block; the portable path (ggml's generic
    // C) multiplies each block's sum by the rounded product of the scales and adds it, which
    // only the last rounding of each block tells from the repack FMA (5 of 752 differ)
    #[cfg(target_arch = "x86_64")]
    assert_plain_differs(&cases, 3);
    #[cfg(not(target_arch = "x86_64"))]
    assert_plain_differs(&cases, 200);
}

/// Eight plain mxfp4 rows of `k` weights as the repack layout holds them (interleaved with a
/// one-byte head, `tessera::layout::interleave_head`).
fn mx_group(plain: &[u8], k: usize) -> Vec<u8> {
    group_of(DType::MXFP4, plain, k)
}

fn group_of(t: DType, plain: &[u8], k: usize) -> Vec<u8> {
    let row = t.row_size(k).unwrap();
    let mut g = vec![0u8; plain.len()];
    tessera::layout::interleave8(t, row, plain, &mut g).unwrap();
    g
}

/// The rearranged rows of mat-mat (`transpose8_on`; mxfp4's `mx_transpose8`): the SIMD
/// versions write the scalar definition's bytes for random bytes (every code, every scale
/// byte; q4_0 and iq4_nl: every f16 scale but NaNs and infinities), and the four-column kernel
/// on them gives, bit for bit, the one-column kernel's results on the group (which
/// `mxfp4_kernels_equal_the_definition` and `kernels_equal_the_definition` tie to the
/// definition), for mxfp4, q4_0 and iq4_nl.
#[test]
fn transposed_rows_keep_the_bits() {
    let mut rng = Rng::new(0x6d78_7470);
    let mut kernels = 0;
    let mut want = 0;
    for t in [DType::MXFP4, DType::Q4_0, DType::IQ4NL] {
        for case in 0..24 {
            let k = 32 * (1 + rng.below(70));
            let (mut plain, x) = rows8_and_q8_0(t, k, &mut rng);
            if case % 2 == 1 {
                for b in plain.iter_mut() {
                    *b = rng.below(256) as u8;
                }
                if t != DType::MXFP4 {
                    // finite f16 scales (exponent below 31)
                    for blk in plain.chunks_exact_mut(18) {
                        blk[1] &= 0xBB;
                    }
                }
            }
            let g = group_of(t, &plain, k);
            let mut scalar = vec![0x5Au8; mx_transposed_bytes(k)];
            rp::transpose8_scalar(t, &g, k, &mut scalar);
            if t == DType::MXFP4 {
                let mut old = vec![0x3Cu8; mx_transposed_bytes(k)];
                mx_transpose8_scalar(&g, k, &mut old);
                assert!(old == scalar);
                let mut simd = vec![0xA5u8; mx_transposed_bytes(k)];
                mx_transpose8(&g, k, &mut simd);
                assert!(
                    simd == scalar,
                    "k={k} case {case}: the transposed bytes differ"
                );
            }
            for &isa in &isas() {
                let mut on = vec![0xC3u8; mx_transposed_bytes(k)];
                rp::transpose8_on(isa, t, &g, k, &mut on);
                assert!(
                    on == scalar,
                    "{t} k={k} case {case} on {isa:?}: the transposed bytes differ"
                );
            }
            let others = other_columns(&x, k / 32);
            let xs = [&x[..], &others[0], &others[1], &others[2]];
            for &isa in &isas() {
                if !rp::has_transposed_kernel(isa, t) {
                    continue;
                }
                let four = mxfp4_8x4_transposed(isa, &scalar, xs, k);
                let via = vec_dot8x4(isa, t, &g, xs, k);
                for (c, xc) in xs.iter().enumerate() {
                    let one = vec_dot8(isa, t, &g, xc, k);
                    assert!(
                        (0..8).all(|r| four[c][r].to_bits() == one[r].to_bits()
                            && via[c][r].to_bits() == one[r].to_bits()),
                        "{t} k={k} case {case} column {c} on {isa:?}: {:?} vs {:?}",
                        four[c],
                        one
                    );
                }
                kernels += 1;
            }
        }
        // every kernel this CPU has for t ran in every case
        want += 24
            * isas()
                .iter()
                .filter(|&&i| rp::has_transposed_kernel(i, t))
                .count();
    }
    assert_eq!(kernels, want);
    #[cfg(target_arch = "x86_64")]
    assert!(want > 0 || !std::arch::is_x86_feature_detected!("avx2"));
}

/// mxfp4's eight-row kernel on a group, random and adversarial (every code, activations at
/// ±127 and −128, scale bytes from 0 (a subnormal 2^-128) to 254 (2^126), extreme f16 activation
/// scales): on every ISA, row by row the definition's bits, and the four-column and four-group
/// entry points those of one column and one group.
#[test]
fn mxfp4_kernels_equal_the_definition() {
    let t = DType::MXFP4;
    let mut rng = Rng::new(0x3f4_e8e0);
    let mut checked = 0;
    for case in 0..40 {
        let k = 32 * (1 + rng.below(40));
        let row = t.row_size(k).unwrap();
        let (mut plain, mut x) = rows8_and_q8_0(t, k, &mut rng);
        if case >= 20 {
            for (i, b) in plain.iter_mut().enumerate() {
                *b = if i % 17 == 0 {
                    // the scale byte: low (subnormal products), middle or high
                    [rng.below(6), 100 + rng.below(56), 200 + rng.below(55)][rng.below(3)] as u8
                } else {
                    rng.below(256) as u8
                };
            }
            for (i, b) in x.iter_mut().enumerate() {
                if i % 34 >= 2 && rng.below(2) == 0 {
                    *b = [127u8, (-127i8) as u8, (-128i8) as u8][rng.below(3)];
                }
            }
            for blk in x.chunks_exact_mut(34) {
                if rng.below(4) == 0 {
                    let h: u16 = [0x7bff, 0x0001, 0x8400, 0x0000][rng.below(4)];
                    blk[..2].copy_from_slice(&h.to_le_bytes());
                }
            }
        }
        let nb = k / 32;
        let others = other_columns(&x, nb);
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        let g = mx_group(&plain, k);
        for &isa in &isas() {
            let got = vec_dot8(isa, t, &g, &x, k);
            for r in 0..8 {
                let want = vec_dot_ref(t, &plain[r * row..(r + 1) * row], &x, k);
                assert!(
                    same(got[r], want),
                    "k={k} case {case} row {r} on {isa:?}: {} vs the definition's {want}",
                    got[r]
                );
                checked += 1;
            }
            let xs = [&x[..], &others[0], &others[1], &others[2]];
            let four = vec_dot8x4(isa, t, &g, xs, k);
            for (c, xc) in xs.iter().enumerate() {
                let one = vec_dot8(isa, t, &g, xc, k);
                assert!(
                    (0..8).all(|r| same(four[c][r], one[r])),
                    "case {case} column {c}"
                );
            }
            let groups = vec_dot8_groups4(isa, t, [&g; 4], &x, k);
            assert!(groups.iter().all(|g| (0..8).all(|r| same(g[r], got[r]))));
        }
    }
    assert!(checked >= 320 * isas().len());
}

/// `data/q2k_repack_mm_ggml.bin`, written by a small C program (not part of this repository)
/// linked against llama.cpp's `libggml-cpu` as vendored by llama-cpp-python 0.3.36 (gcc 12, a
/// native build on an AMD Zen 4 with AVX-512, where ggml repacks q2_K; a build for AVX2 alone
/// does not): q2_K weights put in the `CPU_REPACK` buffer type (ggml reported `q2_K_8x8`
/// repacking), f32 activations, the results of `ggml_mul_mat` computed by
/// `ggml_backend_graph_compute` (1 and 2 threads gave the same bytes; the plain layout gives
/// other bits in 633 of the 936 results). Fourteen cases: K
/// 256-1536, 8-32 rows, 1-17 columns (whole fours, the rest, both); five with weights from
/// `ggml_quantize_chunk`, four with random bytes (and f16 scales within ±0.05), two with every
/// code 3 and every scale and min 15 against activations of ±1 (each q8_K value ±127), one
/// with subnormal f16 scales against activations near 10⁻³. Format: `common::qmm_fixture`.
fn fixture_q2_k() -> Vec<QmmCase> {
    qmm_fixture(include_bytes!("data/q2k_repack_mm_ggml.bin"))
}

/// q2_K: every result bit for bit as ggml's repack buffer gives it, on every ISA (the scalar
/// one too) and thread count; the plain layout differs from it in many results.
#[test]
fn repacked_q2_k_rows_equal_ggml_repack_mul_mat() {
    assert_plain_rows_give(&fixture_q2_k(), DType::Q2K, 14, 4);
}
