//! The fast CPU backend: a persistent thread pool that walks the planned node list with one
//! barrier per node, kernels chosen once per process from the CPU's features (AVX2/FMA/F16C,
//! AVX-512, NEON, with a portable fallback), and a work buffer that is grown once and reused, so
//! running a planned graph again allocates nothing.
//!
//! ```
//! use tessera::{Graph, Session};
//! use tessera_cpu::CpuBackend;
//! let cpu = CpuBackend::new(2);
//! let mut g = Graph::new();
//! let a = g.new_f32(&[4, 2]).unwrap();
//! let y = g.silu(a).unwrap();
//! let mut s = Session::new(g, &[y]).unwrap();
//! s.set_f32(a, &[0., 1., 2., 3., -1., -2., -3., -4.]).unwrap();
//! s.compute(&cpu).unwrap();
//! assert!((s.get_f32(y).unwrap()[1] - 0.7310586).abs() < 1e-6);
//! ```

pub mod exec;
pub mod ops;
pub mod pool;
pub mod simd;

use std::sync::Mutex;

use tessera::alloc::Plan;
use tessera::{Backend, Buffer, DType, Graph, Memory, Op, Result};

pub use pool::ThreadPool;
pub use simd::Isa;

/// The CPU backend. Create it once and reuse it: its threads and work buffer persist.
pub struct CpuBackend {
    pool: ThreadPool,
    isa: Isa,
    batch_invariant: bool,
    scratch: Mutex<Buffer>,
}

/// Physical cores are what matter for these kernels; without a portable way to count them we
/// take the logical count (on SMT machines pass the thread count explicitly).
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Whether this CPU (its best ISA) has eight-row mat-vec kernels that read weights of type `t`
/// with interleaved rows (`tessera::layout`) in place: where it has not, such weights still
/// work everywhere, through a plain copy of each group of eight rows, so interleave only where
/// this says so. (AVX2 and AVX-VNNI also have kernels for interleaved q4_0/q4_1, faster than
/// the plain rows' in cache, 1.2-1.3×, but from memory only even with them on Intel Ice Lake
/// and not measured on AMD: a graph may choose the layout there, this does not ask for it.)
pub fn interleaved_kernel(t: DType) -> bool {
    simd::isa() == simd::Isa::Avx512 && ops::matmul_quant::interleaved_kernel(simd::isa(), t)
}

/// The weight types that `tessera run --repack` computes with ggml's repack arithmetic
/// (`tessera::RowLayout::Repacked8`): those that llama.cpp built for AVX2 puts in its CPU
/// repack buffer (q4_0, iq4_nl, q4_K, mxfp4), since every other result of tessera's is that
/// build's arithmetic. Not q2_K, whose repack arithmetic tessera has too
/// (`ops::qgemv_repack_q2k`) but which ggml repacks only when built with AVX-512, a build whose
/// other numerics differ (its f16 dot products, for one): with it a q2_K model's results would
/// equal neither build's.
pub fn repacked_by_run(t: DType) -> bool {
    tessera::layout::repack_numerics(t) && t != DType::Q2K
}

/// Whether the model commands interleave weights of type `t` unless told otherwise: where
/// [`interleaved_kernel`] says so and the layout measured a gain, which is on AMD's AVX-512
/// cores (Zen 4: tg128 1.13× on one thread; an mxfp4 file's 1.09-1.17×, its mat-vec
/// 1.4-1.5×). On Intel's (an Ice Lake server core) decoding
/// measured no gain, even with the kernels' L2 prefetch (tg128 0.83–1.20× the plain rows,
/// alternated), against the cost of the copy at load time, so there it is an opt-in
/// (`tessera run --interleave`). iq4_xs joined the AMD default on 2026-12-07: its
/// interleaved kernel is 1.24-1.28× the plain rows' with the matrix in L3 on Zen 4, and from
/// memory, one thread, six runs pairing both layouts with the read bandwidth of the same run,
/// 81-90 % of it (median 85 %) against the plain rows' 75-83 % (76.5 %), higher in every run
/// (earlier sessions, on a noisier host, had measured it no faster). q4_K and q5_K joined
/// it later that day (their superblocks whole, one after the other: one stream instead of
/// eight): one thread, six runs pairing both layouts, q4_K 82-94 % of the read bandwidth
/// against the plain rows' 79-93 % (never lower in a run), q5_K 84-99 % against 77-87 %
/// (6-13 points higher in every run). Not q6_K, which the same runs gave 78-92 % against the
/// plain rows' 81-92 %, 0-6 points lower: it keeps its plain rows unless asked
/// (`--interleave`). q5_0 and q5_1 joined in the fourth session that day (heads d + qh and
/// d m + qh, quants as q4_0's): their mat-vec 1.21-1.35× the plain rows' in cache and, from
/// memory, 7-18 points more of the read bandwidth on one thread in each of three runs (q5_0
/// 74-83 % against 63-70 %), 2-14 on two.
pub fn interleave_by_default(t: DType) -> bool {
    simd::amd() && interleaved_kernel(t) && t != DType::Q6K
}

impl CpuBackend {
    /// A backend running on `n_threads` threads (the caller included) with the best ISA.
    pub fn new(n_threads: usize) -> CpuBackend {
        Self::with_isa(n_threads, simd::isa())
    }

    /// Like `new`, but using at most `isa` (a narrower path, to test each kernel family on
    /// one machine). Asking for more than the CPU has gives what it has.
    pub fn with_isa(n_threads: usize, isa: Isa) -> CpuBackend {
        let best = simd::isa();
        let isa = match (isa, best) {
            // AVX-VNNI is not part of AVX-512 (Ice Lake and Tiger Lake lack it)
            (Isa::AvxVnni, Isa::Avx512) if !simd::avx_vnni_available() => Isa::Avx2,
            (want, have) if want > have || (want == Isa::Neon) != (have == Isa::Neon) => {
                if want == Isa::Scalar {
                    Isa::Scalar
                } else {
                    have
                }
            }
            (want, _) => want,
        };
        CpuBackend {
            pool: ThreadPool::new(n_threads),
            isa,
            batch_invariant: false,
            scratch: Mutex::new(Buffer::zeroed(0)),
        }
    }

    /// Whether a column's result must not depend on the batch it is in. ggml itself computes
    /// the k-quant and codebook mat-mat with a different rounding from eight columns on (its
    /// tiled kernel), which this backend reproduces by default; a batch of unrelated
    /// sequences (the server's) asks for the one-column rounding everywhere instead, so that a
    /// request's tokens never depend on what shares its batch.
    pub fn batch_invariant(mut self, on: bool) -> CpuBackend {
        self.batch_invariant = on;
        self
    }

    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// The threads this backend computes on (the caller is thread 0), for work that must run
    /// where its kernels run: the bandwidth benchmark reads its buffer on them, so that a
    /// read pass and a mat-vec share the cores they are compared on.
    pub fn pool(&self) -> &ThreadPool {
        &self.pool
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }
}

impl Default for CpuBackend {
    fn default() -> Self {
        CpuBackend::new(default_threads())
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }

    fn supports(&self, op: &Op, src: &[DType], dst: DType) -> bool {
        ops::supports(op, src, dst)
    }

    fn compute(&self, graph: &Graph, plan: &Plan, mem: &mut Memory) -> Result<()> {
        let nth = self.pool.n_threads();
        let need = plan
            .nodes
            .iter()
            .map(|&id| ops::work_size(graph, graph.tensor(id), nth))
            .max()
            .unwrap_or(0);
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        if scratch.len() < need {
            *scratch = Buffer::zeroed(need);
        }
        let wsize = scratch.len();
        let wdata = scratch.bytes_mut().expect("owned buffer").as_mut_ptr() as usize;
        exec::execute(
            graph,
            plan,
            mem.regions(),
            &self.pool,
            exec::ExecOptions {
                isa: self.isa,
                batch_invariant: self.batch_invariant,
            },
            wdata,
            wsize,
            ops::compute,
            ops::barriers,
        )
    }
}
