//! `tessera bench-ops`: micro-benchmarks of the CPU backend, each reported with the baseline it
//! is judged against, measured in the same run: f32 mul_mat against numpy (OpenBLAS), the thread
//! pool's cost per node, element-wise add against a plain memory copy, and a transformer layer
//! (time and heap allocations per execution).

use std::process::Command;
use std::time::Instant;

use tessera::{DType, Graph, Session, TensorId};
use tessera_cpu::CpuBackend;

use crate::alloc_count::allocations;

pub struct Opts {
    pub threads: Vec<usize>,
    pub reps: usize,
    pub numpy: bool,
    /// Sections to run (all when empty); names from [`SECTIONS`].
    pub only: Vec<String>,
    /// The quant section's types and (K, M) shapes (all of [`QUANT_TYPES`] / [`QUANT_SHAPES`]
    /// when empty), so that one cell can be timed alternately with another program; the types
    /// also pick the bandwidth section's (without them, [`BIG_MATVEC_TYPES`]).
    pub types: Vec<DType>,
    pub shapes: Vec<(usize, usize)>,
    /// The quant section's weights with interleaved rows where the type and this CPU have
    /// them (`tessera_cpu::interleaved_kernel`).
    pub interleave: bool,
    /// The quant section's q4_0, iq4_nl, q4_K, mxfp4 and q2_K weights with ggml's repack
    /// arithmetic (`tessera::RowLayout::Repacked8`).
    pub repack: bool,
    /// The bandwidth section's matrix and buffer size in MiB ([`bandwidth_bytes`] when `None`).
    pub matrix_mib: Option<usize>,
}

/// The sections of `bench-ops`, in the order they run.
pub const SECTIONS: [&str; 6] = ["matmul", "quant", "bandwidth", "pool", "add", "layer"];

impl Opts {
    fn wants(&self, section: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|s| s == section)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Times `f` `reps` times after one warm-up run; returns the median seconds.
fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    median(
        (0..reps)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

/// Like [`time`] for calls far shorter than a host hiccup: each repetition runs the call as
/// many times as fill about 20 ms and reports the mean call (the C program timing ggml's
/// mat-vec does the same).
fn time_short(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let t = Instant::now();
    f();
    let one = t.elapsed().as_secs_f64();
    let inner = if one > 0.0 {
        (0.02 / one) as usize + 1
    } else {
        1000
    };
    median(
        (0..reps)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..inner {
                    f();
                }
                t.elapsed().as_secs_f64() / inner as f64
            })
            .collect(),
    )
}

fn fill(s: &mut Session, id: TensorId, seed: u32) {
    let n = s.nelements(id);
    let mut x = seed.wrapping_mul(2654435761) | 1;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x as f32 / u32::MAX as f32) - 0.5
        })
        .collect();
    let t = s.graph().tensor(id).dtype;
    if t.is_quantized() && tessera_quants::requires_imatrix(t.id()) {
        // the i-quants that need an importance matrix get a uniform one (all columns alike)
        let k = s.graph().tensor(id).ne[0];
        let row = t.row_size(k).expect("whole blocks (checked by the caller)");
        let ones = vec![1f32; k];
        let mut bytes = vec![0u8; row * (n / k)];
        for (src, dst) in v.chunks(k).zip(bytes.chunks_mut(row)) {
            tessera_quants::quantize_row(t.id(), src, dst, Some(&ones)).expect("fill: quantize");
        }
        s.set_bytes(id, &bytes).expect("fill");
        return;
    }
    s.set_f32(id, &v).expect("fill");
}

/// The shapes of issue 3: (K, M, N) for a = [K, M], b = [K, N].
pub const MATMUL_SHAPES: [(usize, usize, usize); 3] =
    [(4096, 4096, 512), (576, 1536, 512), (1024, 1024, 1024)];

fn numpy_gflops(threads: usize, reps: usize) -> Option<Vec<f64>> {
    let specs: Vec<String> = MATMUL_SHAPES
        .iter()
        .map(|&(k, m, n)| format!("{n},{k},{m}"))
        .collect();
    let out = Command::new("python3")
        .arg("-c")
        .arg(include_str!("numpy_matmul.py"))
        .arg(reps.to_string())
        .args(&specs)
        .env("OPENBLAS_NUM_THREADS", threads.to_string())
        .env("OMP_NUM_THREADS", threads.to_string())
        .env_remove("OPENBLAS_CORETYPE")
        .env_remove("OPENBLAS_L2_SIZE")
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!(
            "bench-ops: numpy baseline failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<f64> = text
        .lines()
        .filter_map(|l| l.split("\"gflops\": ").nth(1))
        .filter_map(|x| x.trim_end_matches('}').trim().parse().ok())
        .collect();
    (v.len() == MATMUL_SHAPES.len()).then_some(v)
}

fn bench_matmul(cpu: &CpuBackend, reps: usize) -> Vec<f64> {
    MATMUL_SHAPES
        .iter()
        .map(|&(k, m, n)| {
            let mut g = Graph::new();
            let a = g.new_f32(&[k, m]).unwrap();
            let b = g.new_f32(&[k, n]).unwrap();
            let y = g.mul_mat(a, b).unwrap();
            let mut s = Session::new(g, &[y]).unwrap();
            fill(&mut s, a, 1);
            fill(&mut s, b, 2);
            let t = time(reps, || s.compute(cpu).unwrap());
            2.0 * (k * m * n) as f64 / t / 1e9
        })
        .collect()
}

/// Seconds per node of a chain of `n` tiny nodes (scale of one float): the executor's dispatch
/// and barrier cost.
fn bench_tiny_nodes(cpu: &CpuBackend, reps: usize, n: usize) -> (f64, bool) {
    let mut g = Graph::new();
    let a = g.new_f32(&[1]).unwrap();
    let mut x = a;
    for _ in 0..n {
        x = g.scale(x, 1.0001).unwrap();
    }
    let mut s = Session::new(g, &[x]).unwrap();
    s.set_f32(a, &[1.0]).unwrap();
    let fast = tessera_cpu::ops::fast_path(s.graph(), s.graph().tensor(x));
    (time(reps, || s.compute(cpu).unwrap()) / n as f64, fast)
}

/// Seconds per barrier of the bare pool.
fn bench_barrier(threads: usize, reps: usize) -> f64 {
    let pool = tessera_cpu::ThreadPool::new(threads);
    let n = 10_000;
    time(reps, || {
        pool.run(|_| {
            for _ in 0..n {
                pool.barrier();
            }
        })
        .unwrap()
    }) / n as f64
}

/// GB/s of an element-wise add of `n` floats (two reads, one write) and of a plain copy of the
/// same number of floats (one read, one write).
fn bench_add(cpu: &CpuBackend, reps: usize, n: usize) -> (f64, f64) {
    let mut g = Graph::new();
    let a = g.new_f32(&[n]).unwrap();
    let b = g.new_f32(&[n]).unwrap();
    let y = g.add(a, b).unwrap();
    let mut s = Session::new(g, &[y]).unwrap();
    fill(&mut s, a, 3);
    fill(&mut s, b, 4);
    let t_add = time(reps, || s.compute(cpu).unwrap());
    let src = vec![1.5f32; n];
    let mut dst = vec![0f32; n];
    let t_copy = time(reps, || {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    });
    let bytes = (n * 4) as f64;
    (3.0 * bytes / t_add / 1e9, 2.0 * bytes / t_copy / 1e9)
}

/// A llama-style transformer layer at SmolLM2-135M sizes (576 dims, 9 heads of 64, 3 KV heads,
/// 1536 hidden) over `t` tokens, f32 weights. Returns the graph, its inputs and its output.
pub fn layer_graph(t: usize) -> (Graph, Vec<TensorId>, TensorId) {
    let (d, nh, nkv, hd, ff) = (576, 9, 3, 64, 1536);
    let mut g = Graph::new();
    let mut inputs = Vec::new();
    let w = |g: &mut Graph, dims: &[usize], inputs: &mut Vec<TensorId>| {
        let id = g.new_f32(dims).unwrap();
        inputs.push(id);
        id
    };
    let x = w(&mut g, &[d, t], &mut inputs);
    let attn_norm = w(&mut g, &[d], &mut inputs);
    let wq = w(&mut g, &[d, nh * hd], &mut inputs);
    let wk = w(&mut g, &[d, nkv * hd], &mut inputs);
    let wv = w(&mut g, &[d, nkv * hd], &mut inputs);
    let wo = w(&mut g, &[nh * hd, d], &mut inputs);
    let ffn_norm = w(&mut g, &[d], &mut inputs);
    let wg = w(&mut g, &[d, ff], &mut inputs);
    let wu = w(&mut g, &[d, ff], &mut inputs);
    let wd = w(&mut g, &[ff, d], &mut inputs);
    let pos = g.new_tensor(DType::I32, &[t]).unwrap();
    let mask = g.new_tensor(DType::F16, &[t, t]).unwrap();
    g.set_name(pos, "pos");
    g.set_name(mask, "mask");
    let l = (|| -> tessera::Result<TensorId> {
        let h = g.rms_norm(x, 1e-5)?;
        let h = g.mul(h, attn_norm)?;
        let q = g.mul_mat(wq, h)?;
        let q = g.reshape(q, &[hd, nh, t])?;
        let q = g.rope(q, pos, hd, 2)?;
        let q = g.permute(q, [0, 2, 1, 3])?; // [hd, t, nh]
        let k = g.mul_mat(wk, h)?;
        let k = g.reshape(k, &[hd, nkv, t])?;
        let k = g.rope(k, pos, hd, 2)?;
        let k = g.permute(k, [0, 2, 1, 3])?; // [hd, t, nkv]
        let v = g.mul_mat(wv, h)?;
        let v = g.reshape(v, &[hd, nkv, t])?;
        let v = g.permute(v, [1, 2, 0, 3])?; // [t, hd, nkv]
        let v = g.cont(v)?;
        let kq = g.mul_mat(k, q)?; // [t_kv, t, nh]
        let kq = g.soft_max_ext(kq, Some(mask), 1.0 / (hd as f32).sqrt(), 0.0)?;
        let kqv = g.mul_mat(v, kq)?; // [hd, t, nh]
        let kqv = g.permute(kqv, [0, 2, 1, 3])?; // [hd, nh, t]
        let kqv = g.cont(kqv)?;
        let kqv = g.reshape(kqv, &[nh * hd, t])?;
        let o = g.mul_mat(wo, kqv)?;
        let x2 = g.add(x, o)?;
        let h2 = g.rms_norm(x2, 1e-5)?;
        let h2 = g.mul(h2, ffn_norm)?;
        let gate = g.mul_mat(wg, h2)?;
        let up = g.mul_mat(wu, h2)?;
        let act = g.swiglu_split(gate, up)?;
        let down = g.mul_mat(wd, act)?;
        g.add(x2, down)
    })()
    .expect("layer graph");
    inputs.push(pos);
    inputs.push(mask);
    (g, inputs, l)
}

fn bench_layer(cpu: &CpuBackend, reps: usize, t: usize) -> (f64, usize, usize) {
    let (g, inputs, out) = layer_graph(t);
    let mut s = Session::new(g, &[out]).unwrap();
    for (i, &id) in inputs.iter().enumerate() {
        match s.graph().name(id) {
            "pos" => s.set_i32(id, &(0..t as i32).collect::<Vec<_>>()).unwrap(),
            "mask" => {
                let m: Vec<f32> = (0..t * t)
                    .map(|k| {
                        if k % t > k / t {
                            f32::NEG_INFINITY
                        } else {
                            0.0
                        }
                    })
                    .collect();
                s.set_f32(id, &m).unwrap();
            }
            _ => fill(&mut s, id, 10 + i as u32),
        }
    }
    let slow = s
        .plan()
        .nodes
        .iter()
        .filter(|&&id| !tessera_cpu::ops::fast_path(s.graph(), s.graph().tensor(id)))
        .count();
    s.compute(cpu).unwrap();
    let before = allocations();
    s.compute(cpu).unwrap();
    let allocs = allocations() - before;
    (time(reps, || s.compute(cpu).unwrap()), allocs, slow)
}

/// The layout of the quant section's `t` weights of `m` rows that `o` asks for.
fn quant_layout(o: &Opts, t: DType, m: usize) -> tessera::RowLayout {
    if !m.is_multiple_of(8) {
        tessera::RowLayout::Plain
    } else if o.repack && tessera::layout::repack_numerics(t) {
        tessera::RowLayout::Repacked8
    } else if o.interleave && tessera_cpu::interleaved_kernel(t) {
        tessera::RowLayout::Interleaved8
    } else {
        tessera::RowLayout::Plain
    }
}

/// GB/s of weights streamed and GFLOP/s of a quantized mul_mat [K×M]·[K×N].
fn bench_quant(
    cpu: &CpuBackend,
    reps: usize,
    t: DType,
    k: usize,
    m: usize,
    n: usize,
    layout: tessera::RowLayout,
) -> (f64, f64) {
    let mut g = Graph::new();
    let a = g.new_tensor(t, &[k, m]).unwrap();
    g.set_layout(a, layout).unwrap();
    let b = g.new_f32(&[k, n]).unwrap();
    let y = g.mul_mat(a, b).unwrap();
    let mut s = Session::new(g, &[y]).unwrap();
    fill(&mut s, a, 5);
    fill(&mut s, b, 6);
    let secs = if n == 1 {
        time_short(reps, || s.compute(cpu).unwrap())
    } else {
        time(reps, || s.compute(cpu).unwrap())
    };
    let bytes = t.row_size(k).unwrap_or(0) * m;
    (
        bytes as f64 / secs / 1e9,
        2.0 * (k * m * n) as f64 / secs / 1e9,
    )
}

/// One pass of the pool's threads over `buf`, each summing its share as `streams`
/// interleaved streams: GB/s read. The pass runs on the threads that compute the mat-vec it
/// is compared with (on a 2-vCPU Zen 4 VM one core read 23-24 GB/s and the other 25-27, so a
/// pass on a freshly spawned thread could measure another core than the kernel's).
fn read_pass(buf: &[u64], pool: &tessera_cpu::ThreadPool, streams: usize) -> f64 {
    fn sum(c: &[u64], streams: usize) -> u64 {
        let part = c.len() / streams / 8 * 8;
        let mut acc = [0u64; 8];
        for i in (0..part).step_by(8) {
            for s in 0..streams {
                let at = s * part + i;
                for (a, x) in acc.iter_mut().zip(&c[at..at + 8]) {
                    *a = a.wrapping_add(*x);
                }
            }
        }
        acc.iter()
            .chain(&c[streams * part..])
            .fold(0, |a, &x| a.wrapping_add(x))
    }
    let threads = pool.n_threads();
    let chunk = buf.len().div_ceil(threads);
    let total = std::sync::atomic::AtomicU64::new(0);
    let t = Instant::now();
    pool.run(|ith| {
        let c = &buf[(ith * chunk).min(buf.len())..((ith + 1) * chunk).min(buf.len())];
        let s = sum(std::hint::black_box(c), streams);
        total.fetch_add(s, std::sync::atomic::Ordering::Relaxed);
    })
    .expect("bandwidth read pass");
    let secs = t.elapsed().as_secs_f64();
    std::hint::black_box(total.into_inner());
    std::mem::size_of_val(buf) as f64 / secs / 1e9
}

/// A mat-vec over a `bytes`-sized matrix of type `t` (K = 16384; the rows repeat one random
/// 64-row block, which does not matter to a stream from memory), ready to compute: the
/// session, and the matrix's size in bytes.
fn big_matvec(t: DType, bytes: usize, layout: tessera::RowLayout) -> (Session, usize) {
    let k = 16384;
    let row = t.row_size(k).expect("row size");
    let m = (bytes / row).div_ceil(64) * 64;
    let mut g = Graph::new();
    let a = g.new_tensor(t, &[k, m]).unwrap();
    g.set_layout(a, layout).expect("layout");
    let b = g.new_f32(&[k, 1]).unwrap();
    let y = g.mul_mat(a, b).unwrap();
    let mut s = Session::new(g, &[y]).unwrap();
    {
        let mut g = Graph::new();
        let small = g.new_tensor(t, &[k, 64]).unwrap();
        let mut s2 = Session::new(g, &[small]).unwrap();
        fill(&mut s2, small, 7);
        let block = s2.get_bytes(small).expect("bytes");
        let mut all: Vec<u8> = Vec::with_capacity(row * m);
        while all.len() < row * m {
            let n = block.len().min(row * m - all.len());
            all.extend_from_slice(&block[..n]);
        }
        s.set_bytes(a, &all).expect("set bytes");
    }
    fill(&mut s, b, 8);
    (s, row * m)
}

/// Types of the large mat-vec beside the read bandwidth: the issue-4 table's seven.
pub const BIG_MATVEC_TYPES: [DType; 7] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q8_0,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
    DType::IQ4XS,
];

/// The quantized shapes of issue 4: (K, M) for a = [K, M].
pub const QUANT_SHAPES: [(usize, usize); 3] = [(576, 1536), (1536, 576), (4096, 4096)];
pub const QUANT_TYPES: [DType; 7] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q8_0,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
    DType::IQ4XS,
];

pub fn run(o: &Opts) {
    println!(
        "tessera bench-ops — CPU backend, ISA {}",
        tessera_cpu::simd::isa().name()
    );
    if o.wants("matmul") {
        section_matmul(o);
    }
    if o.wants("quant") {
        section_quant(o);
    }
    if o.wants("bandwidth") {
        section_bandwidth(o);
    }
    if o.wants("pool") {
        section_pool(o);
    }
    if o.wants("add") {
        section_add(o);
    }
    if o.wants("layer") {
        section_layer(o);
    }
}

fn section_matmul(o: &Opts) {
    println!();
    println!("f32 mul_mat, GFLOP/s (a = [K, M], b = [K, N]; numpy: the same product, OpenBLAS)");
    println!("| shape K×M·K×N | threads | tessera | numpy | ratio |");
    println!("|---|---|---|---|---|");
    for &th in &o.threads {
        let cpu = CpuBackend::new(th);
        let ours = bench_matmul(&cpu, o.reps);
        let theirs = if o.numpy {
            numpy_gflops(th, o.reps)
        } else {
            None
        };
        for (i, &(k, m, n)) in MATMUL_SHAPES.iter().enumerate() {
            match &theirs {
                Some(np) => println!(
                    "| [{k}×{m}]·[{k}×{n}] | {th} | {:.1} | {:.1} | {:.2}× |",
                    ours[i],
                    np[i],
                    ours[i] / np[i]
                ),
                None => println!(
                    "| [{k}×{m}]·[{k}×{n}] | {th} | {:.1} | n/a | n/a |",
                    ours[i]
                ),
            }
        }
    }
}

fn section_quant(o: &Opts) {
    println!();
    println!(
        "quantized mul_mat: GB/s of weights streamed, GFLOP/s (mat-vec: 1 token; mat-mat: 512 tokens){}",
        match (o.repack, o.interleave) {
            (true, true) => "; q4_0, iq4_nl, q4_K, mxfp4 and q2_K with ggml's repack arithmetic, other rows interleaved by eight where the type and this CPU have it",
            (true, false) => "; q4_0, iq4_nl, q4_K, mxfp4 and q2_K with ggml's repack arithmetic",
            (false, true) => "; rows interleaved by eight where the type and this CPU have it",
            (false, false) => "",
        }
    );
    println!("| type | shape K×M | threads | mat-vec GB/s | mat-vec GFLOP/s | mat-mat GFLOP/s |");
    println!("|---|---|---|---|---|---|");
    let types = if o.types.is_empty() {
        &QUANT_TYPES[..]
    } else {
        &o.types[..]
    };
    let shapes = if o.shapes.is_empty() {
        &QUANT_SHAPES[..]
    } else {
        &o.shapes[..]
    };
    for &t in types {
        for &(k, m) in shapes {
            if k % t.block_size() != 0 {
                println!(
                    "| {t} | {k}×{m} | - | n/a: rows of {k} are not whole blocks of {} | | |",
                    t.block_size()
                );
                continue;
            }
            for &th in &o.threads {
                let cpu = CpuBackend::new(th);
                let (gbs, gf1) = bench_quant(&cpu, o.reps, t, k, m, 1, quant_layout(o, t, m));
                let (_, gf512) = bench_quant(&cpu, o.reps, t, k, m, 512, quant_layout(o, t, m));
                println!("| {t} | {k}×{m} | {th} | {gbs:.1} | {gf1:.1} | {gf512:.1} |");
            }
        }
    }
}

/// The size in bytes of the last-level (L3) cache this CPU reports (Linux sysfs), if any.
pub fn l3_bytes() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("index"))
        .filter(|e| std::fs::read_to_string(e.path().join("level")).is_ok_and(|l| l.trim() == "3"))
        .filter_map(|e| parse_cache_size(&std::fs::read_to_string(e.path().join("size")).ok()?))
        .max()
}

/// A sysfs cache size ("32768K", "260M", "1G", or plain bytes) in bytes.
pub fn parse_cache_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mult) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 1usize << 10),
        b'M' | b'm' => (&s[..s.len() - 1], 1 << 20),
        b'G' | b'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok()?.checked_mul(mult)
}

/// The memory this system has available (Linux `MemAvailable`), if it says.
pub fn mem_available() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The bandwidth section's default matrix and buffer size: 256 MiB, or four times the L3 that
/// the CPU reports where that is larger (server CPUs report 260–480 MiB L3s, and a matrix that
/// fits there measures the cache, not memory), rounded up to whole MiB; but at most a quarter
/// of the available memory (the section holds the buffer, the matrix and, while filling it, a
/// copy: three times the size), and at least 64 MiB. Returns the size and whether the memory
/// capped it.
pub fn bandwidth_bytes(l3: Option<usize>, available: Option<usize>) -> (usize, bool) {
    let want = l3.map_or(0, |l| l.saturating_mul(4)).max(256 << 20);
    let want = want.div_ceil(1 << 20) << 20;
    match available {
        Some(a) if want > a / 4 => (((a / 4) >> 20 << 20).max(64 << 20), true),
        _ => (want, false),
    }
}

fn section_bandwidth(o: &Opts) {
    let l3 = l3_bytes();
    let (bytes, capped) = match o.matrix_mib {
        Some(mib) => (mib << 20, false),
        None => bandwidth_bytes(l3, mem_available()),
    };
    if capped {
        eprintln!(
            "note: bench-ops bandwidth: the matrix is cut to {} MiB, a quarter of the available memory (--matrix-mib sets it)",
            bytes >> 20
        );
    }
    // pairs of one read pass (the best of 1, 4 and 8 streams) and one mat-vec, back to back
    let pairs = o.reps.max(9);
    let against = match l3 {
        Some(l) => format!(
            "{:.1}x the {} MiB L3 this CPU reports",
            bytes as f64 / l as f64,
            l >> 20
        ),
        None => "this CPU reports no L3 size".to_string(),
    };
    println!();
    println!(
        "mat-vec of a {} MiB matrix ({against}) vs the read bandwidth from memory over a buffer of the same size, GB/s ({pairs} pairs of a read pass and a mat-vec, back to back; medians)",
        bytes >> 20
    );
    println!("| threads | read bandwidth | type | mat-vec GB/s | share of bandwidth (range over pairs) |");
    println!("|---|---|---|---|---|");
    let buf: Vec<u64> = (0..(bytes / 8) as u64).collect();
    for &th in &o.threads {
        let cpu = CpuBackend::new(th);
        // each type with ggml's rows, then those with an interleaved layout that this CPU
        // has the eight-row kernels for with their rows interleaved (`tessera::layout`)
        let types = if o.types.is_empty() {
            &BIG_MATVEC_TYPES[..]
        } else {
            &o.types[..]
        }
        .iter();
        let cases = types
            .clone()
            .map(|&t| (t, tessera::RowLayout::Plain))
            .chain(
                types
                    .filter(|&&t| tessera_cpu::interleaved_kernel(t))
                    .map(|&t| (t, tessera::RowLayout::Interleaved8)),
            );
        for (t, layout) in cases {
            // Each mat-vec is paired with a read pass just before it, so a host slowdown,
            // which here lasts seconds, shows in both halves of a pair.
            let (mut s, mbytes) = big_matvec(t, bytes, layout);
            s.compute(&cpu).unwrap();
            read_pass(&buf, cpu.pool(), 8);
            let (mut bw, mut mv, mut share) = (vec![], vec![], vec![]);
            for _ in 0..pairs {
                let r = [1, 4, 8]
                    .iter()
                    .map(|&streams| read_pass(&buf, cpu.pool(), streams))
                    .fold(0.0, f64::max);
                let t0 = Instant::now();
                s.compute(&cpu).unwrap();
                let m = mbytes as f64 / t0.elapsed().as_secs_f64() / 1e9;
                bw.push(r);
                mv.push(m);
                share.push(m / r);
            }
            let lo = share.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = share.iter().copied().fold(0.0, f64::max);
            let name = if layout == tessera::RowLayout::Plain {
                t.to_string()
            } else {
                format!("{t}, interleaved rows")
            };
            println!(
                "| {th} | {:.1} | {name} | {:.1} | {:.0} % ({:.0}–{:.0}) |",
                median(bw),
                median(mv),
                100.0 * median(share),
                100.0 * lo,
                100.0 * hi
            );
        }
    }
}

fn section_pool(o: &Opts) {
    println!();
    println!("thread pool");
    println!("| threads | bare barrier (ns) | per node, chain of 1000 tiny nodes (ns) |");
    println!("|---|---|---|");
    for &th in &o.threads {
        let cpu = CpuBackend::new(th);
        let (per_node, fast) = bench_tiny_nodes(&cpu, o.reps, 1000);
        println!(
            "| {th} | {:.0} | {:.0}{} |",
            bench_barrier(th, o.reps) * 1e9,
            per_node * 1e9,
            if fast {
                ""
            } else {
                " (scale runs on the fallback kernel)"
            }
        );
    }
}

fn section_add(o: &Opts) {
    println!();
    println!(
        "element-wise add of 16M floats vs a plain copy of 16M floats (GB/s, bytes read + written)"
    );
    println!("| threads | add | copy | ratio |");
    println!("|---|---|---|---|");
    for &th in &o.threads {
        let cpu = CpuBackend::new(th);
        let (add, copy) = bench_add(&cpu, o.reps, 16 << 20);
        println!("| {th} | {add:.1} | {copy:.1} | {:.2} |", add / copy);
    }
}

fn section_layer(o: &Opts) {
    println!();
    println!("transformer layer (SmolLM2-135M sizes, 64 tokens, f32 weights)");
    println!(
        "| threads | ms per execution | heap allocations per execution | nodes on the fallback |"
    );
    println!("|---|---|---|---|");
    for &th in &o.threads {
        let cpu = CpuBackend::new(th);
        let (t, allocs, slow) = bench_layer(&cpu, o.reps, 64);
        println!("| {th} | {:.2} | {allocs} | {slow} |", t * 1e3);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_cache_size("32768K\n"), Some(32 << 20));
        assert_eq!(parse_cache_size("266240K"), Some(260 << 20));
        assert_eq!(parse_cache_size("300M"), Some(300 << 20));
        assert_eq!(parse_cache_size("1G"), Some(1 << 30));
        assert_eq!(parse_cache_size("4096"), Some(4096));
        assert_eq!(parse_cache_size(""), None);
        assert_eq!(parse_cache_size("big"), None);
    }

    #[test]
    fn bandwidth_matrix_outgrows_a_large_l3() {
        // a 32 MiB L3 (Zen 4 CCD) or none keeps 256 MiB; a server L3 gets four times its size
        let plenty = Some(64 << 30);
        assert_eq!(bandwidth_bytes(None, plenty), (256 << 20, false));
        assert_eq!(bandwidth_bytes(Some(32 << 20), None), (256 << 20, false));
        assert_eq!(
            bandwidth_bytes(Some(260 << 20), plenty),
            (1040 << 20, false)
        );
        assert_eq!(
            bandwidth_bytes(Some((300 << 20) + 1), plenty),
            (1201 << 20, false)
        );
        // three copies must fit: a quarter of the available memory at most, 64 MiB at least
        assert_eq!(
            bandwidth_bytes(Some(1 << 30), Some(8 << 30)),
            (2 << 30, true)
        );
        assert_eq!(
            bandwidth_bytes(None, Some((800 << 20) + 12345)),
            (200 << 20, true)
        );
        assert_eq!(bandwidth_bytes(None, Some(100 << 20)), (64 << 20, true));
    }
}
