//! The memory planner: given a graph and the outputs wanted, fixes the order of the nodes and
//! the byte offset of every intermediate inside one arena, reusing memory once its last reader
//! has run (and in place for element-wise ops where that is legal). Leaves get buffers of their
//! own (or are bound to external memory such as a memory-mapped GGUF file). A planned graph runs
//! any number of times without allocating.

use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::op::Op;
use crate::tensor::TensorId;

/// Alignment of every arena allocation (a cache line; enough for AVX-512 loads).
pub const ALIGN: usize = 64;

/// Which buffer a tensor's bytes live in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Region {
    /// The planned arena of intermediates.
    Arena,
    /// The buffer of leaf number `n` (index into [`Plan::leaves`]).
    Leaf(usize),
}

/// Where a tensor's first byte is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loc {
    pub region: Region,
    pub offset: usize,
}

#[derive(Clone, Debug)]
pub struct Plan {
    /// The requested outputs.
    pub outputs: Vec<TensorId>,
    /// Op nodes (views included: they compute nothing) in execution order.
    pub nodes: Vec<TensorId>,
    /// Leaves the nodes read, each with a buffer of its own.
    pub leaves: Vec<TensorId>,
    /// Per tensor id: where it lives (None for tensors this plan does not need).
    pub loc: Vec<Option<Loc>>,
    /// Bytes of the arena.
    pub arena_size: usize,
    /// (node, source) pairs where the node took its source's memory.
    pub inplace: Vec<(TensorId, TensorId)>,
    /// Sum of the sizes of all intermediates, as if none shared memory.
    pub unshared_size: usize,
}

#[derive(Default)]
struct FreeList {
    free: Vec<(usize, usize)>, // (offset, size), sorted by offset, merged
    end: usize,
}

impl FreeList {
    fn alloc(&mut self, size: usize) -> usize {
        let size = size.max(1).next_multiple_of(ALIGN);
        // best fit among free blocks
        let best = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, &(_, s))| s >= size)
            .min_by_key(|(_, &(_, s))| s)
            .map(|(i, _)| i);
        if let Some(i) = best {
            let (off, s) = self.free[i];
            if s == size {
                self.free.remove(i);
            } else {
                self.free[i] = (off + size, s - size);
            }
            return off;
        }
        // grow: reuse a free block at the very end if there is one
        if let Some(&(off, s)) = self.free.last() {
            if off + s == self.end {
                self.free.pop();
                self.end = off + size;
                return off;
            }
        }
        let off = self.end;
        self.end += size;
        off
    }

    fn release(&mut self, off: usize, size: usize) {
        let size = size.max(1).next_multiple_of(ALIGN);
        let pos = self.free.partition_point(|&(o, _)| o < off);
        self.free.insert(pos, (off, size));
        // merge with the next, then the previous
        if pos + 1 < self.free.len() && self.free[pos].0 + self.free[pos].1 == self.free[pos + 1].0
        {
            self.free[pos].1 += self.free[pos + 1].1;
            self.free.remove(pos + 1);
        }
        if pos > 0 && self.free[pos - 1].0 + self.free[pos - 1].1 == self.free[pos].0 {
            self.free[pos - 1].1 += self.free[pos].1;
            self.free.remove(pos);
        }
    }
}

impl Plan {
    /// Plans everything `outputs` needs.
    pub fn new(graph: &Graph, outputs: &[TensorId]) -> Result<Plan> {
        for &o in outputs {
            if o.index() >= graph.len() {
                return Err(Error::Invalid(format!(
                    "plan: output {o} is not in the graph"
                )));
            }
        }
        let order = graph.topo_order(outputs);
        let n = graph.len();
        let mut leaves = Vec::new();
        let mut nodes = Vec::new();
        for &id in &order {
            if graph.tensor(id).op == Op::Leaf {
                leaves.push(id);
            } else {
                nodes.push(id);
            }
        }

        // An interleaved leaf (see `crate::layout`) is read by no kernel but mul_mat's for its
        // first operand: anything else (a view, a copy, get_rows) would see scrambled rows.
        // (Reading it back as an output is fine: `Session::get_bytes` de-interleaves.)
        for &id in &nodes {
            let t = graph.tensor(id);
            for (i, &s) in t
                .src
                .iter()
                .chain(t.view_of.as_ref().map(|v| &v.src))
                .enumerate()
            {
                let st = graph.tensor(s);
                let ok = i == 0 && matches!(t.op, Op::MulMat) && t.view_of.is_none();
                if st.layout != crate::layout::RowLayout::Plain && !ok {
                    return Err(Error::Invalid(format!(
                        "plan: tensor {s} '{}' ({}) has interleaved rows, which only mul_mat \
                         reads (as its first operand); node {id} '{}' ({}) reads it as source {i}",
                        st.name,
                        st.describe(),
                        t.name,
                        t.op
                    )));
                }
            }
        }

        // Last position (in `nodes`) at which each storage owner is read. Outputs and flagged
        // tensors are pinned: their memory is never given to anyone else.
        const PINNED: usize = usize::MAX;
        const UNREAD: usize = usize::MAX - 1;
        let mut last_use = vec![UNREAD; n];
        for (p, &id) in nodes.iter().enumerate() {
            let t = graph.tensor(id);
            for &s in t.src.iter().chain(t.view_of.as_ref().map(|v| &v.src)) {
                let (root, _) = graph.storage_root(s);
                let r = root.index();
                last_use[r] = if last_use[r] == UNREAD {
                    p
                } else {
                    last_use[r].max(p)
                };
            }
        }
        for &id in &order {
            let t = graph.tensor(id);
            if t.flags.output || t.flags.loss || t.flags.param || outputs.contains(&id) {
                let (root, _) = graph.storage_root(id);
                last_use[root.index()] = PINNED;
            }
        }

        let mut loc: Vec<Option<Loc>> = vec![None; n];
        for (i, &id) in leaves.iter().enumerate() {
            loc[id.index()] = Some(Loc {
                region: Region::Leaf(i),
                offset: 0,
            });
        }
        let mut fl = FreeList::default();
        let mut size_of = vec![0usize; n]; // arena bytes held by an owner
        let mut inplace = Vec::new();
        let mut unshared = 0usize;
        for (p, &id) in nodes.iter().enumerate() {
            let t = graph.tensor(id);
            if let Some(v) = t.view_of {
                let base = loc[v.src.index()].ok_or_else(|| {
                    Error::Invalid(format!("plan: {} reads {} before it is placed", id, v.src))
                })?;
                loc[id.index()] = Some(Loc {
                    region: base.region,
                    offset: base.offset + v.offset,
                });
            } else {
                let bytes = t.nbytes();
                unshared += bytes.next_multiple_of(ALIGN);
                let mut placed = false;
                if t.op.can_inplace() && t.is_contiguous() {
                    let s0 = t.src[0];
                    let st = graph.tensor(s0);
                    // another source reading s0's memory through a different view (a row of
                    // it, say) would see values this node already overwrote
                    let aliased = t.src[1..]
                        .iter()
                        .any(|&o| o != s0 && graph.storage_root(o).0 == s0);
                    if st.view_of.is_none()
                        && !aliased
                        && last_use[s0.index()] == p
                        && matches!(
                            loc[s0.index()],
                            Some(Loc {
                                region: Region::Arena,
                                ..
                            })
                        )
                        && st.dtype == t.dtype
                        && st.ne == t.ne
                        && st.is_contiguous()
                    {
                        loc[id.index()] = loc[s0.index()];
                        size_of[id.index()] = size_of[s0.index()];
                        size_of[s0.index()] = 0; // handed over, not freed
                        inplace.push((id, s0));
                        placed = true;
                    }
                }
                if !placed {
                    let off = fl.alloc(bytes);
                    loc[id.index()] = Some(Loc {
                        region: Region::Arena,
                        offset: off,
                    });
                    size_of[id.index()] = bytes;
                }
            }
            // free owners whose last reader this was
            for &s in t.src.iter().chain(t.view_of.as_ref().map(|v| &v.src)) {
                let (root, _) = graph.storage_root(s);
                let r = root.index();
                if last_use[r] == p && size_of[r] > 0 {
                    if let Some(Loc {
                        region: Region::Arena,
                        offset,
                    }) = loc[r]
                    {
                        fl.release(offset, size_of[r]);
                        size_of[r] = 0;
                    }
                }
            }
            // a node nobody reads and nobody asked for is dead at once
            if last_use[id.index()] == UNREAD && size_of[id.index()] > 0 {
                if let Some(Loc {
                    region: Region::Arena,
                    offset,
                }) = loc[id.index()]
                {
                    fl.release(offset, size_of[id.index()]);
                    size_of[id.index()] = 0;
                }
            }
        }
        Ok(Plan {
            outputs: outputs.to_vec(),
            nodes,
            leaves,
            loc,
            arena_size: fl.end,
            inplace,
            unshared_size: unshared,
        })
    }

    /// Index into [`Plan::leaves`] of a leaf, if this plan uses it.
    pub fn leaf_index(&self, id: TensorId) -> Option<usize> {
        match self.loc.get(id.index()).copied().flatten() {
            Some(Loc {
                region: Region::Leaf(i),
                offset: 0,
            }) if self.leaves[i] == id => Some(i),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::testutil::Rng;
    use crate::ops::unary::UnaryOp;
    use crate::*;

    #[test]
    fn a_chain_of_element_wise_ops_runs_in_place() {
        let mut g = Graph::new();
        let a = g.new_f32(&[1000]).unwrap();
        let mut x = g.scale(a, 1.0).unwrap();
        for _ in 0..10 {
            x = g.unary(x, UnaryOp::Neg).unwrap();
        }
        let plan = Plan::new(&g, &[x]).unwrap();
        assert_eq!(plan.nodes.len(), 11);
        assert_eq!(
            plan.inplace.len(),
            10,
            "every neg takes its source's memory"
        );
        assert_eq!(plan.arena_size, 4000usize.next_multiple_of(super::ALIGN));
        assert!(plan.unshared_size >= 11 * 4000);
    }

    #[test]
    fn memory_is_reused_after_the_last_reader_and_outputs_are_kept() {
        // y1 = exp(a); y2 = y1 * 2 (an output); then three more ops that can reuse y1's memory
        let mut g = Graph::new();
        let a = g.new_f32(&[256]).unwrap();
        let y1 = g.exp(a).unwrap();
        let y2 = g.scale(y1, 2.0).unwrap();
        g.set_output(y2);
        let t1 = g.add(y2, a).unwrap();
        let t2 = g.mul(t1, a).unwrap();
        let t3 = g.sub(t2, y2).unwrap();
        let plan = Plan::new(&g, &[t3]).unwrap();
        let loc = |id: TensorId| plan.loc[id.index()].unwrap();
        // y2 is an output: nobody may take its memory
        for t in [t1, t2, t3] {
            assert_ne!(loc(t), loc(y2));
        }
        let mut s = Session::new(g, &[t3]).unwrap();
        let av: Vec<f32> = (0..256).map(|i| i as f32 / 100.0).collect();
        s.set_f32(a, &av).unwrap();
        s.compute(&ReferenceBackend).unwrap();
        let y2v = s.get_f32(y2).unwrap();
        let t3v = s.get_f32(t3).unwrap();
        for i in 0..256 {
            let a = av[i] as f64;
            let y2 = 2.0 * a.exp();
            assert!((y2v[i] as f64 - y2).abs() < 1e-5 * y2, "y2[{i}]");
            let t3 = (y2 + a) * a - y2;
            assert!(
                (t3v[i] as f64 - t3).abs() < 1e-4 * (1.0 + t3.abs()),
                "t3[{i}]"
            );
        }
    }

    #[test]
    fn no_in_place_when_another_source_views_the_first() {
        // add(x, first row of x broadcast): writing x in place would change the row being read
        let mut g = Graph::new();
        let a = g.new_f32(&[4, 3]).unwrap();
        let x = g.exp(a).unwrap();
        let row = g.view(x, &[4, 1], &[16], 16).unwrap();
        let y = g.add(x, row).unwrap();
        let plan = Plan::new(&g, &[y]).unwrap();
        assert!(
            plan.inplace.iter().all(|&(n, _)| n != y),
            "{:?}",
            plan.inplace
        );
        let xx = g.add(x, x).unwrap(); // the same tensor twice is fine element-wise
        let plan = Plan::new(&g, &[xx]).unwrap();
        assert!(plan.inplace.contains(&(xx, x)));
    }

    #[test]
    fn a_view_keeps_its_source_alive() {
        let mut g = Graph::new();
        let a = g.new_f32(&[8, 4]).unwrap();
        let x = g.exp(a).unwrap();
        let v = g.view(x, &[8, 2], &[32], 64).unwrap(); // rows 2..4 of x
        let y = g.neg(a).unwrap(); // would reuse x's memory if the view were ignored
        let y2 = g.sqr(y).unwrap();
        let yv = g.view(y2, &[8, 2], &[32], 0).unwrap();
        let z = g.add(v, yv).unwrap();
        let av: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) / 8.0).collect();
        let got = crate::ops::testutil::run1(g, &[(a, av.clone())], z);
        for r in 0..2 {
            for c in 0..8 {
                let want = (av[(r + 2) * 8 + c] as f64).exp() + (av[r * 8 + c] as f64).powi(2);
                assert!((got[r * 8 + c] as f64 - want).abs() < 1e-5 * want.abs().max(1.0));
            }
        }
    }

    /// Random element-wise DAGs: the planned graph (with reuse) gives the same values as the
    /// same graph with every node kept (no reuse at all).
    #[test]
    fn random_graphs_give_the_same_results_with_and_without_reuse() {
        let mut rng = Rng::new(7);
        for trial in 0..40 {
            let mut g = Graph::new();
            let n = 1 + rng.below(40);
            let a = g.new_f32(&[n, 3]).unwrap();
            let b = g.new_f32(&[n, 1]).unwrap();
            let mut pool = vec![a, b];
            for _ in 0..(3 + rng.below(25)) {
                let x = pool[rng.below(pool.len())];
                let y = pool[rng.below(pool.len())];
                let full = |g: &Graph, t: TensorId| g.ne(t)[1] == 3;
                let node = match rng.below(5) {
                    0 if full(&g, x) => g.add(x, y).unwrap(),
                    1 if full(&g, x) => g.mul(x, y).unwrap(),
                    2 => g.unary(x, UnaryOp::Tanh).unwrap(),
                    3 => g.scale_bias(x, 0.5, 0.25).unwrap(),
                    _ => g.unary(x, UnaryOp::Sin).unwrap(),
                };
                pool.push(node);
            }
            let last = *pool.last().unwrap();
            let with_a = g.add(a, last).unwrap();
            let out = g.add(with_a, b).unwrap(); // every input is read
            pool.push(with_a);
            pool.push(out);
            let av: Vec<f32> = rng.vec(n * 3, -1.0, 1.0);
            let bv: Vec<f32> = rng.vec(n, -1.0, 1.0);
            let mut keep_all = g.clone();
            for &t in &pool {
                if keep_all.tensor(t).op != Op::Leaf {
                    keep_all.set_output(t);
                }
            }
            let p_reuse = Plan::new(&g, &[out]).unwrap();
            let p_all = Plan::new(&keep_all, &[out]).unwrap();
            assert!(p_reuse.arena_size <= p_all.arena_size, "trial {trial}");
            let run = |g: Graph| {
                let mut s = Session::new(g, &[out]).unwrap();
                s.set_f32(a, &av).unwrap();
                s.set_f32(b, &bv).unwrap();
                s.compute(&ReferenceBackend).unwrap();
                s.get_f32(out).unwrap()
            };
            assert_eq!(run(g), run(keep_all), "trial {trial}");
        }
    }

    #[test]
    fn running_again_reuses_the_same_memory() {
        let mut g = Graph::new();
        let a = g.new_f32(&[64]).unwrap();
        let y = g.sqr(a).unwrap();
        let mut s = Session::new(g, &[y]).unwrap();
        let arena = s.memory().arena().bytes().as_ptr();
        for k in 0..3 {
            let v: Vec<f32> = (0..64).map(|i| (i + k) as f32).collect();
            s.set_f32(a, &v).unwrap();
            s.compute(&ReferenceBackend).unwrap();
            let want: Vec<f32> = v.iter().map(|x| x * x).collect();
            assert_eq!(s.get_f32(y).unwrap(), want);
            assert_eq!(s.memory().arena().bytes().as_ptr(), arena);
        }
    }

    #[test]
    fn the_dot_dump_names_ops_and_shapes() {
        let mut g = Graph::new();
        let a = g.new_f32(&[4, 2]).unwrap();
        g.set_name(a, "x");
        g.set_param(a).unwrap();
        let y = g.unary(a, UnaryOp::Relu).unwrap();
        let d = g.to_dot(&[y]);
        assert!(d.starts_with("digraph"));
        assert!(d.contains("x\\nleaf f32 [4, 2, 1, 1]"), "{d}");
        assert!(d.contains("relu f32 [4, 2, 1, 1]"), "{d}");
        assert!(d.contains("n0 -> n1"), "{d}");
    }
}
