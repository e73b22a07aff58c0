//! Running a planned graph: every thread of the pool walks the node list; each node's work is
//! split by `(ith, nth)`; one barrier separates consecutive nodes. Nothing here allocates in the
//! steady state: pointers come from the memory's address table and the plan's locations, the
//! work buffer is grown once and reused.

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
    pub pool: &'a ThreadPool,
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

/// Executes `plan` on `pool`. `kernel` computes one node's share.
#[allow(clippy::too_many_arguments)]
pub fn execute(
    graph: &Graph,
    plan: &Plan,
    regions: &[RawRegion],
    pool: &ThreadPool,
    isa: Isa,
    wdata: usize,
    wsize: usize,
    kernel: fn(&NodeCtx) -> Result<()>,
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
    let res = pool.run(|ith| {
        for &id in &plan.nodes {
            let t = graph.tensor(id);
            if t.op.is_view() {
                continue;
            }
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
                    isa,
                    pool,
                };
                match catch_unwind(AssertUnwindSafe(|| kernel(&ctx))) {
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
    use super::split;

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
