//! Buffers, the object-safe [`Backend`] trait, and [`Session`]: a graph planned once, its memory
//! allocated once, run any number of times on any backend.

use std::sync::Arc;

use crate::alloc::{Loc, Plan, Region, ALIGN};
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::layout::{deinterleave8, interleave8};
use crate::op::Op;
use crate::shape::{is_contiguous, nelements};
use crate::tensor::{Tensor, TensorId};
use crate::DType;

/// Read-only bytes owned elsewhere (a memory-mapped file, a shared weight buffer).
pub type ExternalBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// A block of bytes: owned (64-byte aligned, zero-initialised) or external and read-only.
pub struct Buffer {
    inner: Inner,
}

enum Inner {
    Owned {
        data: Vec<u8>,
        start: usize,
        len: usize,
    },
    External {
        data: ExternalBytes,
        offset: usize,
        len: usize,
    },
}

impl Buffer {
    /// `len` zero bytes starting on a 64-byte boundary.
    pub fn zeroed(len: usize) -> Buffer {
        let data = vec![0u8; len + ALIGN];
        let start = data.as_ptr().align_offset(ALIGN).min(ALIGN);
        Buffer {
            inner: Inner::Owned { data, start, len },
        }
    }

    /// `len` bytes of `data` from `offset`, read-only.
    pub fn external(data: ExternalBytes, offset: usize, len: usize) -> Result<Buffer> {
        let total = (*data).as_ref().len();
        if offset.checked_add(len).is_none_or(|end| end > total) {
            return Err(Error::Invalid(format!(
                "external buffer: bytes {offset}..{offset}+{len} run past its end ({total})"
            )));
        }
        Ok(Buffer {
            inner: Inner::External { data, offset, len },
        })
    }

    pub fn len(&self) -> usize {
        match &self.inner {
            Inner::Owned { len, .. } | Inner::External { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_external(&self) -> bool {
        matches!(self.inner, Inner::External { .. })
    }

    pub fn bytes(&self) -> &[u8] {
        match &self.inner {
            Inner::Owned { data, start, len } => &data[*start..*start + *len],
            Inner::External { data, offset, len } => &(**data).as_ref()[*offset..*offset + *len],
        }
    }

    /// Writable bytes; `None` for external (read-only) memory.
    pub fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        match &mut self.inner {
            Inner::Owned { data, start, len } => Some(&mut data[*start..*start + *len]),
            Inner::External { .. } => None,
        }
    }
}

/// The memory of a planned graph: the arena and one buffer per leaf.
pub struct Memory {
    arena: Buffer,
    leaves: Vec<Buffer>,
    /// Address table for backends that work with raw pointers: entry 0 is the arena, entry
    /// `1 + i` leaf `i`. Kept in step with the buffers by every method that changes them.
    regions: Vec<RawRegion>,
}

/// Where a buffer lives, for backends that hand pointers to their kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawRegion {
    /// Address of the first byte (exposed, so kernels may turn it back into a pointer).
    pub addr: usize,
    pub len: usize,
    /// False for external read-only memory.
    pub writable: bool,
}

impl Buffer {
    fn raw_region(&mut self) -> RawRegion {
        let len = self.len();
        match self.bytes_mut() {
            Some(b) => RawRegion {
                addr: b.as_mut_ptr() as usize,
                len,
                writable: true,
            },
            None => RawRegion {
                addr: self.bytes().as_ptr() as usize,
                len,
                writable: false,
            },
        }
    }
}

impl Memory {
    /// Memory made of an arena and the leaves' buffers.
    pub fn new(mut arena: Buffer, mut leaves: Vec<Buffer>) -> Memory {
        let mut regions = Vec::with_capacity(1 + leaves.len());
        regions.push(arena.raw_region());
        regions.extend(leaves.iter_mut().map(Buffer::raw_region));
        Memory {
            arena,
            leaves,
            regions,
        }
    }

    pub fn arena(&self) -> &Buffer {
        &self.arena
    }

    pub fn leaf(&self, i: usize) -> &Buffer {
        &self.leaves[i]
    }

    /// Replaces leaf `i`'s buffer.
    pub fn set_leaf(&mut self, i: usize, mut buf: Buffer) {
        self.regions[1 + i] = buf.raw_region();
        self.leaves[i] = buf;
    }

    /// The address table (arena first, then the leaves). Taking it needs `&mut self`: while the
    /// caller holds it, nothing else can read or write this memory, so a backend may write
    /// through the addresses of writable regions.
    pub fn regions(&mut self) -> &[RawRegion] {
        &self.regions
    }

    fn region(&self, r: Region) -> &Buffer {
        match r {
            Region::Arena => &self.arena,
            Region::Leaf(i) => &self.leaves[i],
        }
    }

    /// The bytes of tensor `id`, from its first byte to one past its last.
    pub fn tensor_bytes(&self, graph: &Graph, plan: &Plan, id: TensorId) -> Result<&[u8]> {
        let loc = locate(plan, id)?;
        let len = graph.tensor(id).nbytes();
        let buf = self.region(loc.region).bytes();
        buf.get(loc.offset..loc.offset + len).ok_or_else(|| {
            Error::Invalid(format!(
                "tensor {id} '{}': bytes {}..{} lie outside its buffer of {} bytes",
                graph.name(id),
                loc.offset,
                loc.offset + len,
                buf.len()
            ))
        })
    }

    /// Writable bytes of tensor `id`; an error for tensors in read-only (external) memory.
    pub fn tensor_bytes_mut(
        &mut self,
        graph: &Graph,
        plan: &Plan,
        id: TensorId,
    ) -> Result<&mut [u8]> {
        let loc = locate(plan, id)?;
        let len = graph.tensor(id).nbytes();
        let buf = match loc.region {
            Region::Arena => &mut self.arena,
            Region::Leaf(i) => &mut self.leaves[i],
        };
        let total = buf.len();
        let bytes = buf.bytes_mut().ok_or_else(|| {
            Error::Invalid(format!(
                "tensor {id} '{}' lives in read-only external memory and cannot be written",
                graph.name(id)
            ))
        })?;
        bytes.get_mut(loc.offset..loc.offset + len).ok_or_else(|| {
            Error::Invalid(format!(
                "tensor {id}: bytes {}..{} lie outside its buffer of {total} bytes",
                loc.offset,
                loc.offset + len
            ))
        })
    }
}

fn locate(plan: &Plan, id: TensorId) -> Result<Loc> {
    plan.loc
        .get(id.index())
        .copied()
        .flatten()
        .ok_or_else(|| Error::Invalid(format!("tensor {id} is not part of this planned graph")))
}

/// A compute backend. Object-safe: sessions hold `&dyn Backend`.
pub trait Backend {
    fn name(&self) -> &str;

    /// Whether this backend can run `op` with sources of types `src` producing `dst`.
    fn supports(&self, op: &Op, src: &[DType], dst: DType) -> bool;

    /// Runs every node of `plan` in order.
    fn compute(&self, graph: &Graph, plan: &Plan, mem: &mut Memory) -> Result<()>;
}

/// A graph, its plan and its memory. Build once, set inputs, `compute`, read outputs; again.
pub struct Session {
    graph: Graph,
    plan: Plan,
    mem: Memory,
}

impl Session {
    /// Plans `graph` for `outputs` and allocates the arena and the leaves' buffers.
    pub fn new(graph: Graph, outputs: &[TensorId]) -> Result<Session> {
        Session::with_buffers(graph, outputs, &mut |_, _| None)
    }

    /// Like [`new`](Session::new), but `provide` may hand over the buffer of any leaf (a
    /// memory-mapped weight, a cache moved in from another session, or an empty placeholder
    /// to be filled by [`put_buffer`](Session::put_buffer)); leaves it returns `None` for get
    /// zeroed memory. Nothing is allocated for a provided leaf — with large weights that
    /// matters: the allocator may hand out heap memory it must clear, which stays resident.
    pub fn with_buffers(
        graph: Graph,
        outputs: &[TensorId],
        provide: &mut dyn FnMut(TensorId, &Tensor) -> Option<Buffer>,
    ) -> Result<Session> {
        let plan = Plan::new(&graph, outputs)?;
        let leaves = plan
            .leaves
            .iter()
            .map(|&l| {
                let t = graph.tensor(l);
                provide(l, t).unwrap_or_else(|| Buffer::zeroed(t.nbytes()))
            })
            .collect();
        let mem = Memory::new(Buffer::zeroed(plan.arena_size), leaves);
        Ok(Session { graph, plan, mem })
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn memory(&self) -> &Memory {
        &self.mem
    }

    /// Mutable access to the memory, for backends driven by hand (tests, tools).
    pub fn memory_mut(&mut self) -> &mut Memory {
        &mut self.mem
    }

    fn leaf(&self, id: TensorId) -> Result<usize> {
        self.plan.leaf_index(id).ok_or_else(|| {
            Error::Invalid(format!(
                "tensor {id} '{}' is not a leaf of this planned graph (only leaves take data)",
                self.graph.name(id)
            ))
        })
    }

    /// Copies raw bytes (ggml's layout of the leaf's type, contiguous) into a leaf.
    pub fn set_bytes(&mut self, id: TensorId, bytes: &[u8]) -> Result<()> {
        let i = self.leaf(id)?;
        let t = self.graph.tensor(id);
        let want = t.nbytes();
        if bytes.len() != want {
            return Err(Error::Invalid(format!(
                "set_bytes: tensor {id} '{}' ({}) takes {want} bytes, got {}",
                t.name,
                t.describe(),
                bytes.len()
            )));
        }
        let dst = self.mem.leaves[i].bytes_mut().ok_or_else(|| {
            Error::Invalid(format!(
                "set_bytes: tensor {id} is bound to read-only external memory"
            ))
        })?;
        if !crate::layout::reorders(t.layout, t.dtype) {
            dst.copy_from_slice(bytes);
            Ok(())
        } else {
            interleave8(t.dtype, t.nb[1], bytes, dst)
        }
    }

    /// Sets a leaf from f32 values in logical order, converting to its type (f32, f16, bf16,
    /// i32, or a quantized type with a quantizer).
    pub fn set_f32(&mut self, id: TensorId, values: &[f32]) -> Result<()> {
        let t = self.graph.tensor(id).clone();
        if values.len() != t.nelements() {
            return Err(Error::Invalid(format!(
                "set_f32: tensor {id} '{}' ({}) has {} elements, got {}",
                t.name,
                t.describe(),
                t.nelements(),
                values.len()
            )));
        }
        let dense = crate::reference::Dense {
            ne: t.ne,
            data: values.iter().map(|&v| v as f64).collect(),
        };
        let i = self.leaf(id)?;
        let dst = self.mem.leaves[i].bytes_mut().ok_or_else(|| {
            Error::Invalid(format!(
                "set_f32: tensor {id} is bound to read-only external memory"
            ))
        })?;
        if !crate::layout::reorders(t.layout, t.dtype) {
            return crate::reference::scatter(&t, &dense, dst);
        }
        let mut plain = vec![0u8; dst.len()];
        crate::reference::scatter(&t, &dense, &mut plain)?;
        interleave8(t.dtype, t.nb[1], &plain, dst)
    }

    /// Sets an i32 leaf.
    pub fn set_i32(&mut self, id: TensorId, values: &[i32]) -> Result<()> {
        let t = self.graph.tensor(id);
        if t.dtype != DType::I32 {
            return Err(Error::Invalid(format!(
                "set_i32: tensor {id} '{}' is {}, not i32",
                t.name,
                t.describe()
            )));
        }
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.set_bytes(id, &bytes)
    }

    /// Points a leaf at external read-only bytes (e.g. a tensor inside a memory-mapped GGUF
    /// file): no copy is made. The bytes are taken as the leaf's layout has them: for a leaf
    /// with interleaved rows (`crate::layout`) they must be interleaved already (as
    /// `layout::interleave8` writes them); the same holds for buffers given to
    /// [`with_buffers`](Session::with_buffers) and [`put_buffer`](Session::put_buffer).
    pub fn bind_external(
        &mut self,
        id: TensorId,
        data: ExternalBytes,
        offset: usize,
    ) -> Result<()> {
        let i = self.leaf(id)?;
        let t = self.graph.tensor(id);
        if !is_contiguous(t.dtype, &t.ne, &t.nb) {
            return Err(Error::Invalid(format!(
                "bind_external: tensor {id} is not contiguous"
            )));
        }
        let buf = Buffer::external(data, offset, t.nbytes())?;
        self.mem.set_leaf(i, buf);
        Ok(())
    }

    /// Takes a leaf's buffer out of the session (leaving an empty one: computing fails with an
    /// error until a buffer is put back). With [`put_buffer`](Session::put_buffer) this moves
    /// state such as a KV cache between sessions planned for different batch shapes, without
    /// copying it.
    pub fn take_buffer(&mut self, id: TensorId) -> Result<Buffer> {
        let i = self.leaf(id)?;
        let old = std::mem::replace(&mut self.mem.leaves[i], Buffer::zeroed(0));
        self.mem.set_leaf(i, Buffer::zeroed(0));
        Ok(old)
    }

    /// Puts a buffer (from [`take_buffer`](Session::take_buffer) or [`Buffer::zeroed`]) into a
    /// leaf; it must hold at least the leaf's bytes.
    pub fn put_buffer(&mut self, id: TensorId, buf: Buffer) -> Result<()> {
        let i = self.leaf(id)?;
        let t = self.graph.tensor(id);
        if buf.len() < t.nbytes() {
            return Err(Error::Invalid(format!(
                "put_buffer: tensor {id} '{}' ({}) needs {} bytes, the buffer has {}",
                t.name,
                t.describe(),
                t.nbytes(),
                buf.len()
            )));
        }
        self.mem.set_leaf(i, buf);
        Ok(())
    }

    /// The values of any planned tensor as f32 in logical order (converted or dequantized).
    pub fn get_f32(&self, id: TensorId) -> Result<Vec<f32>> {
        Ok(self.get_f64(id)?.into_iter().map(|v| v as f32).collect())
    }

    /// Copies a contiguous f32 tensor into `out` (resized to fit) without going through f64:
    /// the fast way to read logits.
    pub fn read_f32_into(&self, id: TensorId, out: &mut Vec<f32>) -> Result<()> {
        let t = self.graph.tensor(id);
        if t.dtype != DType::F32 || !t.is_contiguous() {
            return Err(Error::Invalid(format!(
                "read_f32_into: tensor {id} '{}' is {}, not a contiguous f32 tensor",
                t.name,
                t.describe()
            )));
        }
        let bytes = self.mem.tensor_bytes(&self.graph, &self.plan, id)?;
        out.clear();
        out.extend(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        );
        Ok(())
    }

    /// The values of any planned tensor as f64 in logical order.
    pub fn get_f64(&self, id: TensorId) -> Result<Vec<f64>> {
        let t = self.graph.tensor(id);
        let bytes = self.mem.tensor_bytes(&self.graph, &self.plan, id)?;
        Ok(crate::reference::gather(t, bytes)?.data)
    }

    /// Contiguous raw bytes of a tensor in its own type (strided views are compacted).
    pub fn get_bytes(&self, id: TensorId) -> Result<Vec<u8>> {
        let t: &Tensor = self.graph.tensor(id);
        let bytes = self.mem.tensor_bytes(&self.graph, &self.plan, id)?;
        if crate::layout::reorders(t.layout, t.dtype) {
            let mut plain = vec![0u8; bytes.len()];
            deinterleave8(t.dtype, t.nb[1], bytes, &mut plain)?;
            return Ok(plain);
        }
        if t.is_contiguous() {
            return Ok(bytes.to_vec());
        }
        let row = t.dtype.row_size(t.ne[0]).unwrap_or(0);
        let mut out = Vec::with_capacity(row * t.nrows());
        for i3 in 0..t.ne[3] {
            for i2 in 0..t.ne[2] {
                for i1 in 0..t.ne[1] {
                    let base = i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
                    if crate::shape::rows_contiguous(t.dtype, &t.ne, &t.nb) {
                        out.extend_from_slice(&bytes[base..base + row]);
                    } else {
                        let ts = t.dtype.type_size();
                        for i0 in 0..t.ne[0] {
                            let o = base + i0 * t.nb[0];
                            out.extend_from_slice(&bytes[o..o + ts]);
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Checks that `backend` supports every node, naming the first it does not.
    pub fn check_support(&self, backend: &dyn Backend) -> Result<()> {
        for &id in &self.plan.nodes {
            let t = self.graph.tensor(id);
            // on the stack: running a planned graph must not allocate
            let mut types = [DType::F32; 8];
            let n = t.src.len().min(types.len());
            for (slot, &s) in types.iter_mut().zip(&t.src) {
                *slot = self.graph.dtype(s);
            }
            if !backend.supports(&t.op, &types[..n], t.dtype) {
                return Err(Error::Unsupported {
                    backend: backend.name().to_string(),
                    op: format!("{} (node {} '{}')", t.op, id, t.name),
                    types: format!(
                        "sources [{}] -> {}",
                        t.src
                            .iter()
                            .map(|&s| self.graph.tensor(s).describe())
                            .collect::<Vec<_>>()
                            .join(", "),
                        t.describe()
                    ),
                });
            }
        }
        Ok(())
    }

    /// Runs the planned graph on `backend`.
    pub fn compute(&mut self, backend: &dyn Backend) -> Result<()> {
        self.check_support(backend)?;
        backend.compute(&self.graph, &self.plan, &mut self.mem)
    }

    /// Number of elements of a tensor (convenience for callers sizing inputs).
    pub fn nelements(&self, id: TensorId) -> usize {
        nelements(&self.graph.tensor(id).ne)
    }
}
