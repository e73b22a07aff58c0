//! Running a planned graph: every thread of the pool walks the node list; each node's work is
//! split by `(ith, nth)`; one barrier separates consecutive nodes. Nothing here allocates in the
//! steady state: pointers come from the memory's address table and the plan's locations, the
//! work buffer is grown once and reused.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use tessera::alloc::{Plan, Region};
use tessera::{Error, Graph, RawRegion, Result, Tensor, TensorId};

use crate::pool::ThreadPool;
use crate::simd::Isa;

/// Most sources a node has (flash_attn_ext: q, k, v, mask, sinks).
pub const MAX_SRC: usize = 6;

/// What a kernel gets: the node, raw pointers to its destination and sources, its share of the
/// work and the work buffer.
pub struct NodeCtx<'a> {
    pub graph: &'a Graph,
    pub id: TensorId,
    pub t: &'a Tensor,
    pub dst: *mut u8,
    pub src: [*const u8; MAX_SRC],
    pub ith: usize,
    pub nth: usize,
    /// Scratch shared by all threads of this node (kernels partition it by `ith`).
    pub wdata: *mut u8,
    pub wsize: usize,
    pub isa: Isa,
    /// Kernels must give every column of a batch the bits it gets alone (see
    /// `CpuBackend::batch_invariant`).
    pub batch_invariant: bool,
    pub pool: &'a ThreadPool,
    /// Internal barriers this thread has passed in this node.
    pub barriers_passed: Cell<usize>,
}

impl NodeCtx<'_> {
    /// Tensor of source `i`.
    pub fn s(&self, i: usize) -> &Tensor {
        self.graph.tensor(self.t.src[i])
    }

    /// An error found while computing this node, naming it.
    pub fn err(&self, msg: impl Into<String>) -> Error {
        Error::Compute {
            op: self.t.op.name(),
            node: format!("{} '{}'", self.id, self.t.name),
            msg: msg.into(),
        }
    }

    /// A barrier inside a node (between its phases). Every thread must pass the same number of
    /// them for a node — [`crate::ops::barriers`] declares how many — and when a kernel fails or
    /// panics half-way the executor passes the rest for it, so the other threads never wait
    /// for a thread that left.
    pub fn barrier(&self) {
        self.barriers_passed.set(self.barriers_passed.get() + 1);
        self.pool.barrier();
    }

    /// The contiguous range of `n` items this thread handles.
    pub fn share(&self, n: usize) -> std::ops::Range<usize> {
        split(n, self.ith, self.nth)
    }
}

/// Splits `0..n` into `nth` contiguous, nearly equal parts; returns part `ith`.
pub fn split(n: usize, ith: usize, nth: usize) -> std::ops::Range<usize> {
    let per = n / nth;
    let extra = n % nth;
    let start = ith * per + ith.min(extra);
    start..start + per + usize::from(ith < extra)
}

fn region(regions: &[RawRegion], r: Region) -> RawRegion {
    match r {
        Region::Arena => regions[0],
        Region::Leaf(i) => regions[1 + i],
    }
}

/// Checks, once per execution, that every tensor a node touches lies inside its region and that
/// every destination is writable — so kernels may trust their pointers.
pub fn validate(graph: &Graph, plan: &Plan, regions: &[RawRegion]) -> Result<()> {
    for &id in &plan.nodes {
        let t = graph.tensor(id);
        if t.op.is_view() {
            continue;
        }
        for &tid in std::iter::once(&id).chain(t.src.iter()) {
            let loc = plan.loc[tid.index()]
                .ok_or_else(|| Error::Invalid(format!("tensor {tid} is not placed by the plan")))?;
            let reg = region(regions, loc.region);
            let tt = graph.tensor(tid);
            if loc.offset + tt.nbytes() > reg.len {
                return Err(Error::Invalid(format!(
                    "tensor {tid} '{}' ({}) at offset {} runs past its buffer of {} bytes",
                    tt.name,
                    tt.describe(),
                    loc.offset,
                    reg.len
                )));
            }
            if tid == id && !reg.writable {
                return Err(Error::Invalid(format!(
                    "node {id} '{}' ({}) would write into read-only external memory",
                    t.name, t.op
                )));
            }
        }
        if t.src.len() > MAX_SRC {
            return Err(Error::Invalid(format!(
                "node {id} has {} sources, at most {MAX_SRC}",
                t.src.len()
            )));
        }
    }
    Ok(())
}

fn addr(plan: &Plan, regions: &[RawRegion], id: TensorId) -> usize {
    let loc = plan.loc[id.index()].expect("validated");
    region(regions, loc.region).addr + loc.offset
}

/// Time per op with `TESSERA_PROFILE=1`: each node's wall time (its kernel on every thread and
/// the barrier after it), summed per op and source types over the whole process;
/// `TESSERA_PROFILE=2` also splits by source shapes (`~` marks a strided source).
pub mod profile {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    use std::time::Duration;

    use tessera::{Graph, Tensor};

    static ON: OnceLock<bool> = OnceLock::new();
    static TIMES: Mutex<Option<HashMap<String, (Duration, u64)>>> = Mutex::new(None);

    fn detailed() -> bool {
        std::env::var_os("TESSERA_PROFILE").is_some_and(|v| v == "2")
    }

    pub fn enabled() -> bool {
        *ON.get_or_init(|| std::env::var_os("TESSERA_PROFILE").is_some_and(|v| v != "0"))
    }

    pub(crate) fn record(graph: &Graph, t: &Tensor, d: Duration) {
        let types: Vec<String> = t.src.iter().map(|&s| graph.dtype(s).to_string()).collect();
        let fast = if crate::ops::fast_path(graph, t) {
            ""
        } else {
            " [fallback]"
        };
        let mut key = format!("{}({}){fast}", t.op, types.join(","));
        if detailed() {
            // TESSERA_PROFILE=2: the shapes too (and whether a source is strided)
            let shapes: Vec<String> = t
                .src
                .iter()
                .map(|&s| {
                    let st = graph.tensor(s);
                    let mark = if st.is_contiguous() { "" } else { "~" };
                    format!(
                        "{mark}{:?}",
                        &st.ne[..tessera::shape::n_dims(&st.ne).max(2)]
                    )
                })
                .collect();
            key += &format!(" {}", shapes.join(" "));
        }
        let mut m = TIMES.lock().unwrap_or_else(|p| p.into_inner());
        let e = m.get_or_insert_with(HashMap::new).entry(key).or_default();
        e.0 += d;
        e.1 += 1;
    }

    /// The table of time per op, most expensive first (empty when profiling is off).
    pub fn report() -> String {
        let m = TIMES.lock().unwrap_or_else(|p| p.into_inner());
        let Some(m) = m.as_ref() else {
            return String::new();
        };
        let total: Duration = m.values().map(|v| v.0).sum();
        let mut v: Vec<_> = m.iter().collect();
        v.sort_by_key(|b| std::cmp::Reverse(b.1 .0));
        let mut s = format!(
            "{:<48} {:>10} {:>8} {:>6}\n",
            "op(source types)", "ms", "nodes", "%"
        );
        for (k, (d, n)) in v {
            s += &format!(
                "{:<48} {:>10.1} {:>8} {:>6.1}\n",
                k,
                d.as_secs_f64() * 1e3,
                n,
                100.0 * d.as_secs_f64() / total.as_secs_f64().max(1e-12)
            );
        }
        s
    }
}

/// What every kernel of an execution is told: the instruction set, and whether results must
/// not depend on the batch a column is in.
#[derive(Clone, Copy, Debug)]
pub struct ExecOptions {
    pub isa: Isa,
    pub batch_invariant: bool,
}

/// Executes `plan` on `pool`. `kernel` computes one node's share.
#[allow(clippy::too_many_arguments)]
pub fn execute(
    graph: &Graph,
    plan: &Plan,
    regions: &[RawRegion],
    pool: &ThreadPool,
    opts: ExecOptions,
    wdata: usize,
    wsize: usize,
    kernel: fn(&NodeCtx) -> Result<()>,
    barriers: fn(&NodeCtx) -> usize,
) -> Result<()> {
    validate(graph, plan, regions)?;
    let failed = AtomicBool::new(false);
    let error: Mutex<Option<Error>> = Mutex::new(None);
    let nth = pool.n_threads();
    let record = |e: Error| {
        failed.store(true, Ordering::Release);
        let mut slot = error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(e);
        }
    };
    let profiling = profile::enabled();
    let res = pool.run(|ith| {
        for &id in &plan.nodes {
            let t = graph.tensor(id);
            if t.op.is_view() {
                continue;
            }
            let started = (profiling && ith == 0).then(std::time::Instant::now);
            if !failed.load(Ordering::Acquire) {
                let mut src = [std::ptr::null::<u8>(); MAX_SRC];
                for (k, &s) in t.src.iter().enumerate() {
                    src[k] = addr(plan, regions, s) as *const u8;
                }
                let ctx = NodeCtx {
                    graph,
                    id,
                    t,
                    dst: addr(plan, regions, id) as *mut u8,
                    src,
                    ith,
                    nth,
                    wdata: wdata as *mut u8,
                    wsize,
                    isa: opts.isa,
                    batch_invariant: opts.batch_invariant,
                    pool,
                    barriers_passed: Cell::new(0),
                };
                let outcome = catch_unwind(AssertUnwindSafe(|| kernel(&ctx)));
                if !matches!(outcome, Ok(Ok(()))) {
                    // pass the barriers the other threads still expect in this node
                    let want = barriers(&ctx);
                    while ctx.barriers_passed.get() < want {
                        ctx.barrier();
                    }
                }
                match outcome {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => record(e),
                    Err(p) => {
                        let msg = p
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| p.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "a panic".into());
                        record(ctx.err(format!("kernel panicked on thread {ith}: {msg}")));
                    }
                }
            }
            pool.barrier();
            if let Some(t0) = started {
                profile::record(graph, t, t0.elapsed());
            }
        }
    });
    if let Err(msg) = res {
        return Err(Error::Invalid(format!(
            "cpu backend: a worker panicked outside any kernel: {msg}"
        )));
    }
    match error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera::Session;

    fn chain(n: usize) -> (Session, TensorId, TensorId) {
        let mut g = Graph::new();
        let a = g.new_f32(&[8]).unwrap();
        let mut x = a;
        for _ in 0..n {
            x = g.scale(x, 2.0).unwrap();
        }
        let s = Session::new(g, &[x]).unwrap();
        (s, a, x)
    }

    /// Runs `kernel` over a session's plan on `pool`, the way the backend does.
    fn run_with(
        s: &mut Session,
        pool: &ThreadPool,
        kernel: fn(&NodeCtx) -> Result<()>,
    ) -> Result<()> {
        let (graph, plan) = (s.graph().clone(), s.plan().clone());
        let mem = s.memory_mut();
        execute(
            &graph,
            &plan,
            mem.regions(),
            pool,
            ExecOptions {
                isa: Isa::Scalar,
                batch_invariant: false,
            },
            0,
            0,
            kernel,
            |_| 0,
        )
    }

    fn panic_on_third(ctx: &NodeCtx) -> Result<()> {
        if ctx.id.0 == 3 && ctx.ith == ctx.nth - 1 {
            panic!("deliberate failure");
        }
        Ok(())
    }

    fn fail_on_second(ctx: &NodeCtx) -> Result<()> {
        if ctx.id.0 == 2 {
            return Err(ctx.err("deliberate error"));
        }
        Ok(())
    }

    fn nothing(_: &NodeCtx) -> Result<()> {
        Ok(())
    }

    #[test]
    fn a_panicking_kernel_is_an_error_naming_the_node_and_the_pool_survives() {
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads);
            let (mut s, _, _) = chain(5);
            let e = run_with(&mut s, &pool, panic_on_third)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("#3") && e.contains("scale") && e.contains("deliberate failure"),
                "{e}"
            );
            let e = run_with(&mut s, &pool, fail_on_second)
                .unwrap_err()
                .to_string();
            assert!(e.contains("#2") && e.contains("deliberate error"), "{e}");
            run_with(&mut s, &pool, nothing).unwrap();
        }
    }

    #[test]
    fn empty_and_single_node_graphs_run() {
        let pool = ThreadPool::new(2);
        let (mut s, _, _) = chain(0); // the output is the leaf itself: no nodes
        assert!(s.plan().nodes.is_empty());
        run_with(&mut s, &pool, nothing).unwrap();
        let (mut s, a, x) = chain(1);
        let cpu = crate::CpuBackend::new(2);
        s.set_f32(a, &[1.0; 8]).unwrap();
        s.compute(&cpu).unwrap();
        assert_eq!(s.get_f32(x).unwrap(), vec![2.0; 8]);
    }

    #[test]
    fn one_backend_serves_several_caller_threads_in_turn() {
        let cpu = std::sync::Arc::new(crate::CpuBackend::new(2));
        let handles: Vec<_> = (0..3)
            .map(|t| {
                let cpu = std::sync::Arc::clone(&cpu);
                std::thread::spawn(move || {
                    let (mut s, a, x) = chain(4);
                    for i in 0..20 {
                        let v = (t * 100 + i) as f32;
                        s.set_f32(a, &[v; 8]).unwrap();
                        s.compute(&*cpu).unwrap();
                        assert_eq!(s.get_f32(x).unwrap(), vec![v * 16.0; 8]);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn split_covers_everything_once() {
        for n in [0, 1, 2, 7, 100] {
            for nth in 1..5 {
                let mut next = 0;
                for ith in 0..nth {
                    let r = split(n, ith, nth);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }
}
