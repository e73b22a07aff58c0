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
        if pos + 1 < self.free.len() && self.free[pos].0 + self.free[pos].1 == self.free[pos + 1].0 {
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
                return Err(Error::Invalid(format!("plan: output {o} is not in the graph")));
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
                last_use[r] = if last_use[r] == UNREAD { p } else { last_use[r].max(p) };
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
            loc[id.index()] = Some(Loc { region: Region::Leaf(i), offset: 0 });
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
                loc[id.index()] = Some(Loc { region: base.region, offset: base.offset + v.offset });
            } else {
                let bytes = t.nbytes();
                unshared += bytes.next_multiple_of(ALIGN);
                let mut placed = false;
                if t.op.can_inplace() && t.is_contiguous() {
                    let s0 = t.src[0];
                    let st = graph.tensor(s0);
                    if st.view_of.is_none()
                        && last_use[s0.index()] == p
                        && matches!(loc[s0.index()], Some(Loc { region: Region::Arena, .. }))
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
                    loc[id.index()] = Some(Loc { region: Region::Arena, offset: off });
                    size_of[id.index()] = bytes;
                }
            }
            // free owners whose last reader this was
            for &s in t.src.iter().chain(t.view_of.as_ref().map(|v| &v.src)) {
                let (root, _) = graph.storage_root(s);
                let r = root.index();
                if last_use[r] == p && size_of[r] > 0 {
                    if let Some(Loc { region: Region::Arena, offset }) = loc[r] {
                        fl.release(offset, size_of[r]);
                        size_of[r] = 0;
                    }
                }
            }
            // a node nobody reads and nobody asked for is dead at once
            if last_use[id.index()] == UNREAD && size_of[id.index()] > 0 {
                if let Some(Loc { region: Region::Arena, offset }) = loc[id.index()] {
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
            Some(Loc { region: Region::Leaf(i), offset: 0 }) if self.leaves[i] == id => Some(i),
            _ => None,
        }
    }
}
