//! Shared helpers: build a graph, run it on the reference and CPU backends, compare.

#![allow(dead_code)]

use tessera::{DType, Graph, ReferenceBackend, Session, TensorId};
use tessera_cpu::{CpuBackend, Isa};

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

/// Every backend configuration the tests compare with the reference: thread counts 1-3 and
/// every instruction set this CPU has (scalar always).
pub fn cpu_configs() -> Vec<CpuBackend> {
    let mut v = vec![
        CpuBackend::with_isa(1, Isa::Scalar),
        CpuBackend::with_isa(3, Isa::Scalar),
    ];
    let best = tessera_cpu::simd::isa();
    if best != Isa::Scalar {
        v.push(CpuBackend::with_isa(1, best));
        v.push(CpuBackend::with_isa(2, best));
        v.push(CpuBackend::with_isa(3, best));
    }
    if best >= Isa::AvxVnni && best != Isa::Neon && tessera_cpu::simd::avx_vnni_available() {
        // the VEX VNNI kernels, also where AVX-512 is preferred
        v.push(CpuBackend::with_isa(2, Isa::AvxVnni));
    }
    if best == Isa::Avx512 {
        // the float kernels AVX-512 replaces (bf16 mul_mat with AVX512_BF16) keep their
        // AVX2 path checked on such CPUs too
        v.push(CpuBackend::with_isa(2, Isa::Avx2));
    }
    v
}

/// Runs `out` of `g` with random inputs on the reference backend and every CPU configuration;
/// asserts the max error relative to the output's scale stays within `tol`, and that every CPU
/// configuration with the same ISA gives bit-identical results whatever its thread count.
pub fn check(g: Graph, inputs: &[TensorId], out: TensorId, rng: &mut Rng, tol: f64, what: &str) {
    let mut s = Session::new(g, &[out]).expect("plan");
    for &i in inputs {
        let t = s.graph().tensor(i).clone();
        let n = t.nelements();
        match t.dtype {
            DType::I32 => {
                let v: Vec<i32> = (0..n).map(|_| rng.below(t.ne[0].max(1)) as i32).collect();
                s.set_i32(i, &v).unwrap();
            }
            _ => {
                let v: Vec<f32> = (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect();
                s.set_f32(i, &v).unwrap();
            }
        }
    }
    s.compute(&ReferenceBackend).expect("reference");
    let want = s.get_f64(out).unwrap();
    let scale = want.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-30);
    let mut by_isa: Vec<(Isa, Vec<f32>)> = Vec::new();
    for cpu in cpu_configs() {
        s.compute(&cpu)
            .unwrap_or_else(|e| panic!("{what}: cpu {:?}/{}t: {e}", cpu.isa(), cpu.n_threads()));
        let got = s.get_f32(out).unwrap();
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            let err = (g as f64 - w).abs() / scale;
            assert!(
                err <= tol || (g.is_nan() && w.is_nan()),
                "{what}: cpu {:?}/{} threads: element {i}: got {g}, reference {w} (error {err:e} of scale {scale:e})",
                cpu.isa(),
                cpu.n_threads()
            );
        }
        if let Some((_, first)) = by_isa.iter().find(|(isa, _)| *isa == cpu.isa()) {
            assert!(
                first
                    .iter()
                    .zip(&got)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: results differ between thread counts on {:?}",
                cpu.isa()
            );
        } else {
            by_isa.push((cpu.isa(), got));
        }
    }
}

/// Runs y = mul_mat(a [k, m, 1], b [k, n, nb2]) with quantized weights of type `t` (random, a
/// few rows of wide spread; activations with outliers) on every CPU configuration and checks
/// every element, bit for bit, against `want(isa, weight row, quantized column)`.
pub fn check_quantized_product(
    t: DType,
    dims: (usize, usize, usize, usize),
    rng: &mut Rng,
    want: impl Fn(Isa, &[u8], &[u8]) -> f32,
) {
    check_quantized_product_edited(t, dims, rng, |_| {}, want)
}

/// [`check_quantized_product`] with the quantized weight bytes changed by `edit` first (codes
/// no quantizer writes: q8_0's −128, runs of zeros).
pub fn check_quantized_product_edited(
    t: DType,
    (k, m, n, nb2): (usize, usize, usize, usize),
    rng: &mut Rng,
    edit: impl Fn(&mut [u8]),
    want: impl Fn(Isa, &[u8], &[u8]) -> f32,
) {
    use tessera_cpu::ops::matmul_quant::{quantize_activations, vec_dot_type};
    let av: Vec<f32> = (0..k * m)
        .map(|i| {
            let s = if (i / k) % 5 == 3 { 40.0 } else { 1.0 };
            s * rng.uniform(-1.0, 1.0)
        })
        .collect();
    let bv: Vec<f32> = (0..k * n * nb2)
        .map(|i| {
            if i % 97 == 5 {
                25.0
            } else {
                rng.uniform(-1.0, 1.0)
            }
        })
        .collect();
    let wr = t.row_size(k).unwrap();
    let mut wq = vec![0u8; wr * m];
    // an importance matrix (the iq2/iq1 quantizers require one)
    let imatrix: Vec<f32> = (0..k).map(|i| 1.0 + (i % 7) as f32).collect();
    for (row, o) in av.chunks_exact(k).zip(wq.chunks_exact_mut(wr)) {
        tessera_quants::quantize_row(t.id(), row, o, Some(&imatrix)).unwrap();
    }
    edit(&mut wq);
    let vdt = vec_dot_type(t);
    let xr = vdt.row_size(k).unwrap();
    let mut xq = vec![0u8; xr * n * nb2];
    for (col, o) in bv.chunks_exact(k).zip(xq.chunks_exact_mut(xr)) {
        quantize_activations(vdt, col, o).unwrap();
    }
    let mut g = Graph::new();
    let a = g.new_tensor(t, &[k, m, 1]).unwrap();
    let b = g.new_f32(&[k, n, nb2]).unwrap();
    let y = g.mul_mat(a, b).unwrap();
    let mut s = Session::new(g, &[y]).unwrap();
    s.set_bytes(a, &wq).unwrap();
    s.set_f32(b, &bv).unwrap();
    for cpu in cpu_configs() {
        s.compute(&cpu).unwrap();
        let got = s.get_f32(y).unwrap();
        for col in 0..n * nb2 {
            for r in 0..m {
                let w = want(
                    cpu.isa(),
                    &wq[r * wr..(r + 1) * wr],
                    &xq[col * xr..(col + 1) * xr],
                );
                assert_eq!(
                    got[col * m + r].to_bits(),
                    w.to_bits(),
                    "{t} k={k} m={m} n={n}x{nb2}: row {r} column {col} is {} not {w} on {:?}/{}t",
                    got[col * m + r],
                    cpu.isa(),
                    cpu.n_threads()
                );
            }
        }
    }
}

/// One case of a mul_mat fixture written by ggml (`data/*_mm_ggml.bin`): weights of `t`
/// (K × M), K·N f32 activations, M·N f32 results.
pub struct QmmCase {
    pub t: DType,
    pub k: usize,
    pub m: usize,
    pub n: usize,
    pub w: Vec<u8>,
    pub b: Vec<f32>,
    pub want: Vec<f32>,
}

/// The cases of a mul_mat fixture. Format: b"QMMFIX01", u32 count, then per case u32 type,
/// K, M, N, the weights, K·N f32 of b, M·N f32 of y (all little-endian).
pub fn qmm_fixture(f: &[u8]) -> Vec<QmmCase> {
    assert_eq!(&f[..8], b"QMMFIX01");
    let u32_at = |p: usize| u32::from_le_bytes(f[p..p + 4].try_into().unwrap()) as usize;
    let f32s = |p: usize, n: usize| -> Vec<f32> {
        (0..n)
            .map(|i| f32::from_le_bytes(f[p + 4 * i..p + 4 * i + 4].try_into().unwrap()))
            .collect()
    };
    let (count, mut p) = (u32_at(8), 12);
    let mut cases = Vec::new();
    for _ in 0..count {
        let (id, k, m, n) = (u32_at(p), u32_at(p + 4), u32_at(p + 8), u32_at(p + 12));
        p += 16;
        let t = DType::from_id(id as u32).unwrap();
        let wbytes = t.row_size(k).unwrap() * m;
        let w = f[p..p + wbytes].to_vec();
        let b = f32s(p + wbytes, k * n);
        let want = f32s(p + wbytes + 4 * k * n, m * n);
        p += wbytes + 4 * k * n + 4 * m * n;
        cases.push(QmmCase {
            t,
            k,
            m,
            n,
            w,
            b,
            want,
        });
    }
    assert_eq!(p, f.len());
    cases
}

/// A random weight row of `t` (values in [-1, 1), quantized by ggml's reference quantizer) and
/// a random activation row quantized to q8_0 as mul_mat quantizes it, both of `k` elements.
pub fn random_row_and_q8_0(t: DType, k: usize, rng: &mut Rng) -> (Vec<u8>, Vec<u8>) {
    let wv: Vec<f32> = (0..k).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let xv: Vec<f32> = (0..k).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let mut w = vec![0u8; t.row_size(k).unwrap()];
    tessera_quants::quantize_row(t.id(), &wv, &mut w, None).unwrap();
    let mut x = vec![0u8; DType::Q8_0.row_size(k).unwrap()];
    tessera_cpu::ops::matmul_quant::quantize_activations(DType::Q8_0, &xv, &mut x).unwrap();
    (w, x)
}
