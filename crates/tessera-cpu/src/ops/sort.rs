//! CPU kernels of the `sort` family: argsort (ascending or descending) and top_k, on f32 rows
//! with any strides; i32 results, contiguous.
//!
//! Order, as the reference: stable (equal values keep index order, -0.0 equals 0.0) and NaNs
//! last in index order in both directions. Each value is mapped to a 32-bit key whose unsigned
//! order is that order (NaN → `u32::MAX`), and the key is joined with its index into one u64
//! `key << 32 | index`: any sort of these u64 (`sort_unstable`, in place, no allocation) is then
//! the stable sort. top_k selects the k smallest u64 first (`select_nth_unstable`) and sorts
//! only those. Scratch: `ne0` u64 per thread in the work buffer. Rows are split across
//! threads; the results are exact.

use tessera::op::SortOrder;
use tessera::{DType, Graph, Op, Result, Tensor};

use crate::exec::NodeCtx;

/// Whether this family's kernels handle node `t` (types, layout); otherwise the fallback runs.
pub fn handles(graph: &Graph, t: &Tensor) -> bool {
    let a = graph.tensor(t.src[0]);
    matches!(t.op, Op::Argsort { .. } | Op::TopK { .. })
        && a.dtype == DType::F32
        && t.dtype == DType::I32
        && t.is_contiguous()
        && a.ne[0] <= u32::MAX as usize
}

fn per_thread(graph: &Graph, t: &Tensor) -> usize {
    (graph.tensor(t.src[0]).ne[0] * 8).next_multiple_of(64)
}

/// Scratch bytes node `t` needs with `nth` threads.
pub fn work_size(graph: &Graph, t: &Tensor, nth: usize) -> usize {
    nth * per_thread(graph, t)
}

/// The unsigned key of `x` whose order is the sort order: -0.0 as 0.0, NaN greatest.
#[inline(always)]
fn key(x: f32, desc: bool) -> u32 {
    if x.is_nan() {
        return u32::MAX;
    }
    let b = if x == 0.0 { 0 } else { x.to_bits() };
    let k = if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    };
    // descending: reverse the numbers; !k never reaches u32::MAX (k = 0 only for NaN bits)
    if desc {
        !k
    } else {
        k
    }
}

pub fn compute(ctx: &NodeCtx) -> Result<()> {
    let (a, d) = (ctx.s(0), ctx.t);
    let (desc, keep) = match d.op {
        Op::Argsort { order } => (order == SortOrder::Desc, a.ne[0]),
        Op::TopK { k } => (true, k),
        _ => return Err(ctx.err("not a sort op")),
    };
    let n = a.ne[0];
    if keep > n || d.ne[0] != keep {
        return Err(ctx.err(format!("keeps {keep} of rows of {n}")));
    }
    let per = per_thread(ctx.graph, d);
    if ctx.wsize < per * ctx.nth {
        return Err(ctx.err(format!(
            "work buffer of {} bytes, {} needed",
            ctx.wsize,
            per * ctx.nth
        )));
    }
    if n == 0 || keep == 0 {
        return Ok(());
    }
    // SAFETY: `ctx.wsize` covers nth slices of `per` bytes (64-byte multiples of an aligned
    // buffer); slice ith is this thread's alone.
    let keys =
        unsafe { std::slice::from_raw_parts_mut(ctx.wdata.add(ctx.ith * per) as *mut u64, n) };
    for r in ctx.share(a.nrows()) {
        // SAFETY: row r of the source holds n f32 at stride nb0 (validated span).
        let row = unsafe { ctx.src[0].add(crate::ops::reduce::row_offset(a, r)) };
        for (i, kv) in keys.iter_mut().enumerate() {
            // SAFETY: i < n.
            let x = unsafe { (row.add(i * a.nb[0]) as *const f32).read_unaligned() };
            *kv = (key(x, desc) as u64) << 32 | i as u64;
        }
        if keep < n {
            keys.select_nth_unstable(keep - 1);
            keys[..keep].sort_unstable();
        } else {
            keys.sort_unstable();
        }
        // SAFETY: destination row r (dense, `keep` i32) is this thread's.
        unsafe {
            let dst = ctx.dst.add(crate::ops::reduce::row_offset(d, r)) as *mut i32;
            for (j, &kv) in keys[..keep].iter().enumerate() {
                *dst.add(j) = kv as u32 as i32;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::key;

    #[test]
    fn keys_order_like_the_reference() {
        let vals = [
            f32::NEG_INFINITY,
            -3.5,
            -1e-40,
            -0.0,
            0.0,
            1e-40,
            2.0,
            f32::INFINITY,
        ];
        for w in vals.windows(2) {
            let (x, y) = (w[0], w[1]);
            if x == y {
                assert_eq!(key(x, false), key(y, false));
                assert_eq!(key(x, true), key(y, true));
            } else {
                assert!(key(x, false) < key(y, false), "{x} {y}");
                assert!(key(x, true) > key(y, true), "{x} {y}");
            }
        }
        for &v in &vals {
            assert!(key(v, false) < key(f32::NAN, false));
            assert!(key(v, true) < key(f32::NAN, true));
            assert!(key(v, true) < key(-f32::NAN, true));
        }
    }
}
