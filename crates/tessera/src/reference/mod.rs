//! The reference backend: naive, scalar, f64 throughout, obviously correct. It is the oracle every
//! optimised kernel is tested against, so it trades all speed for clarity: each source is gathered
//! through its strides into a dense f64 array in logical order (dequantized where needed), the
//! op's reference kernel (in `ops/<family>.rs`) computes a dense f64 result, and the result is
//! scattered through the destination's strides (converted, or quantized, to its type).

use crate::alloc::Plan;
use crate::backend::{Backend, Memory};
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::op::Op;
use crate::ops;
use crate::shape::{nelements, rows_contiguous, Ne};
use crate::tensor::{Tensor, TensorId};
use crate::DType;

/// A dense f64 array in logical order (dim 0 innermost).
#[derive(Clone, Debug, PartialEq)]
pub struct Dense {
    pub ne: Ne,
    pub data: Vec<f64>,
}

impl Dense {
    pub fn zeros(ne: Ne) -> Dense {
        Dense {
            ne,
            data: vec![0.0; nelements(&ne)],
        }
    }

    pub fn filled(ne: Ne, v: f64) -> Dense {
        Dense {
            ne,
            data: vec![v; nelements(&ne)],
        }
    }

    #[inline]
    pub fn idx(&self, i0: usize, i1: usize, i2: usize, i3: usize) -> usize {
        ((i3 * self.ne[2] + i2) * self.ne[1] + i1) * self.ne[0] + i0
    }

    #[inline]
    pub fn at(&self, i0: usize, i1: usize, i2: usize, i3: usize) -> f64 {
        self.data[self.idx(i0, i1, i2, i3)]
    }

    #[inline]
    pub fn set(&mut self, i0: usize, i1: usize, i2: usize, i3: usize, v: f64) {
        let i = self.idx(i0, i1, i2, i3);
        self.data[i] = v;
    }

    /// Row `(i1, i2, i3)` as a slice of `ne[0]` values.
    pub fn row(&self, i1: usize, i2: usize, i3: usize) -> &[f64] {
        let s = self.idx(0, i1, i2, i3);
        &self.data[s..s + self.ne[0]]
    }

    pub fn row_mut(&mut self, i1: usize, i2: usize, i3: usize) -> &mut [f64] {
        let s = self.idx(0, i1, i2, i3);
        let n = self.ne[0];
        &mut self.data[s..s + n]
    }

    /// Calls `f(i0, i1, i2, i3)` for every index in logical order.
    pub fn for_each_index(ne: &Ne, mut f: impl FnMut(usize, usize, usize, usize)) {
        for i3 in 0..ne[3] {
            for i2 in 0..ne[2] {
                for i1 in 0..ne[1] {
                    for i0 in 0..ne[0] {
                        f(i0, i1, i2, i3);
                    }
                }
            }
        }
    }

    /// A new array of shape `ne` with `f(i0, i1, i2, i3)` at each index.
    pub fn from_fn(ne: Ne, mut f: impl FnMut(usize, usize, usize, usize) -> f64) -> Dense {
        let mut data = Vec::with_capacity(nelements(&ne));
        Dense::for_each_index(&ne, |i0, i1, i2, i3| data.push(f(i0, i1, i2, i3)));
        Dense { ne, data }
    }
}

fn read_scalar(dtype: DType, b: &[u8]) -> f64 {
    match dtype {
        DType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        DType::F16 => half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64(),
        DType::BF16 => half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64(),
        DType::F64 => f64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
        DType::I8 => b[0] as i8 as f64,
        DType::I16 => i16::from_le_bytes([b[0], b[1]]) as f64,
        DType::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        DType::I64 => i64::from_le_bytes(b[..8].try_into().expect("8 bytes")) as f64,
        q => unreachable!("read_scalar on quantized type {q}"),
    }
}

fn write_scalar(dtype: DType, v: f64, b: &mut [u8]) {
    match dtype {
        DType::F32 => b[..4].copy_from_slice(&(v as f32).to_le_bytes()),
        // ggml converts f32 -> f16/bf16 with round-to-nearest-even; go through f32 like it does.
        DType::F16 => {
            b[..2].copy_from_slice(&half::f16::from_f32(v as f32).to_bits().to_le_bytes())
        }
        DType::BF16 => {
            b[..2].copy_from_slice(&half::bf16::from_f32(v as f32).to_bits().to_le_bytes())
        }
        DType::F64 => b[..8].copy_from_slice(&v.to_le_bytes()),
        DType::I8 => b[0] = v as i8 as u8,
        DType::I16 => b[..2].copy_from_slice(&(v as i16).to_le_bytes()),
        DType::I32 => b[..4].copy_from_slice(&(v as i32).to_le_bytes()),
        DType::I64 => b[..8].copy_from_slice(&(v as i64).to_le_bytes()),
        q => unreachable!("write_scalar on quantized type {q}"),
    }
}

fn check_span(t: &Tensor, bytes: &[u8]) -> Result<()> {
    if bytes.len() < t.nbytes() {
        return Err(Error::Invalid(format!(
            "tensor '{}' ({}) needs {} bytes, its memory has {}",
            t.name,
            t.describe(),
            t.nbytes(),
            bytes.len()
        )));
    }
    if t.dtype.is_quantized() && !rows_contiguous(t.dtype, &t.ne, &t.nb) {
        return Err(Error::Invalid(format!(
            "tensor '{}' ({}): rows of a quantized tensor must be contiguous",
            t.name,
            t.describe()
        )));
    }
    Ok(())
}

/// Reads tensor `t` (whose first byte is `bytes[0]`) into a dense f64 array.
pub fn gather(t: &Tensor, bytes: &[u8]) -> Result<Dense> {
    check_span(t, bytes)?;
    if crate::layout::reorders(t.layout, t.dtype) {
        // interleaved rows (contiguous by construction): ggml's rows first
        let mut plain = vec![0u8; t.nbytes()];
        crate::layout::deinterleave8(t.dtype, t.nb[1], &bytes[..t.nbytes()], &mut plain)?;
        let flat = Tensor {
            layout: crate::layout::RowLayout::Plain,
            ..t.clone()
        };
        return gather(&flat, &plain);
    }
    let ne = t.ne;
    let nb = t.nb;
    let mut data = Vec::with_capacity(nelements(&ne));
    if t.dtype.is_quantized() {
        let row_bytes = t.dtype.row_size(ne[0]).expect("validated at build time");
        let mut row = vec![0f32; ne[0]];
        for i3 in 0..ne[3] {
            for i2 in 0..ne[2] {
                for i1 in 0..ne[1] {
                    let o = i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
                    tessera_quants::dequantize_row(
                        t.dtype.id(),
                        &bytes[o..o + row_bytes],
                        &mut row,
                    )
                    .map_err(|e| Error::Invalid(format!("tensor '{}': {e}", t.name)))?;
                    data.extend(row.iter().map(|&v| v as f64));
                }
            }
        }
    } else {
        let ts = t.dtype.type_size();
        Dense::for_each_index(&ne, |i0, i1, i2, i3| {
            let o = i0 * nb[0] + i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
            data.push(read_scalar(t.dtype, &bytes[o..o + ts]));
        });
    }
    Ok(Dense { ne, data })
}

/// Writes `d` (logical order, `t`'s element count) through `t`'s strides into `bytes`.
pub fn scatter(t: &Tensor, d: &Dense, bytes: &mut [u8]) -> Result<()> {
    check_span(t, bytes)?;
    if d.data.len() != t.nelements() {
        return Err(Error::Invalid(format!(
            "internal: kernel for '{}' ({}) produced {} values",
            t.name,
            t.describe(),
            d.data.len()
        )));
    }
    let ne = t.ne;
    let nb = t.nb;
    if t.dtype.is_quantized() {
        let row_bytes = t.dtype.row_size(ne[0]).expect("validated at build time");
        let mut row = vec![0f32; ne[0]];
        let mut r = 0;
        for i3 in 0..ne[3] {
            for i2 in 0..ne[2] {
                for i1 in 0..ne[1] {
                    for (x, &v) in row.iter_mut().zip(&d.data[r * ne[0]..(r + 1) * ne[0]]) {
                        *x = v as f32;
                    }
                    r += 1;
                    let o = i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
                    tessera_quants::quantize_row(
                        t.dtype.id(),
                        &row,
                        &mut bytes[o..o + row_bytes],
                        None,
                    )
                    .map_err(|e| Error::Invalid(format!("tensor '{}': {e}", t.name)))?;
                }
            }
        }
    } else {
        let ts = t.dtype.type_size();
        let mut k = 0;
        Dense::for_each_index(&ne, |i0, i1, i2, i3| {
            let o = i0 * nb[0] + i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
            write_scalar(t.dtype, d.data[k], &mut bytes[o..o + ts]);
            k += 1;
        });
    }
    Ok(())
}

/// What a reference kernel knows about the node it computes.
pub struct NodeRef<'a> {
    pub id: TensorId,
    pub t: &'a Tensor,
    pub graph: &'a Graph,
}

impl NodeRef<'_> {
    /// The tensor of source `i`.
    pub fn src(&self, i: usize) -> &Tensor {
        self.graph.tensor(self.t.src[i])
    }

    /// An error found while computing this node.
    pub fn err(&self, msg: impl Into<String>) -> Error {
        Error::Compute {
            op: self.t.op.name(),
            node: format!("{} '{}'", self.id, self.t.name),
            msg: msg.into(),
        }
    }
}

/// Computes one node from its gathered sources.
pub fn run_node(n: &NodeRef, src: &[Dense]) -> Result<Dense> {
    match &n.t.op {
        Op::Leaf | Op::View | Op::Reshape | Op::Permute { .. } | Op::Transpose => {
            Err(n.err("views and leaves have nothing to compute"))
        }
        Op::Cont | Op::Cpy => ops::view::reference(n, src),
        Op::Add | Op::Sub | Op::Mul | Op::Div | Op::Add1 | Op::Acc(_) | Op::Set(_) => {
            ops::binary::reference(n, src)
        }
        Op::Scale { .. } | Op::Unary(_) | Op::LeakyRelu { .. } | Op::Clamp { .. } => {
            ops::unary::reference(n, src)
        }
        Op::Glu { .. } => ops::glu::reference(n, src),
        Op::Sum
        | Op::SumRows
        | Op::Mean
        | Op::Argmax
        | Op::CountEqual
        | Op::Cumsum
        | Op::Repeat
        | Op::RepeatBack
        | Op::Concat { .. } => ops::reduce::reference(n, src),
        Op::Argsort { .. } | Op::TopK { .. } => ops::sort::reference(n, src),
        Op::Norm { .. } | Op::RmsNorm { .. } | Op::L2Norm { .. } | Op::GroupNorm { .. } => {
            ops::norm::reference(n, src)
        }
        Op::SoftMax { .. } | Op::DiagMaskInf { .. } | Op::DiagMaskZero { .. } => {
            ops::softmax::reference(n, src)
        }
        Op::Rope(_) => ops::rope::reference(n, src),
        Op::GetRows | Op::SetRows => ops::rows::reference(n, src),
        Op::MulMat | Op::OutProd => ops::matmul::reference(n, src),
        Op::FlashAttnExt(_) => ops::attention::reference(n, src),
        Op::CrossEntropyLoss => ops::loss::reference(n, src),
        Op::OptStepAdamw | Op::OptStepSgd => ops::optim::reference(n, src),
        Op::Conv2d(_) | Op::Im2col(_) | Op::Pool2d(_) => ops::conv::reference(n, src),
        Op::Pad { .. }
        | Op::Upscale { .. }
        | Op::Arange { .. }
        | Op::TimestepEmbedding { .. }
        | Op::Fill { .. }
        | Op::UpscaleBack { .. } => ops::misc::reference(n, src),
        Op::UnaryBack(_) => ops::unary::reference(n, src),
        Op::NormBack(_) => ops::norm::reference(n, src),
        Op::GetRowsBack => ops::rows::reference(n, src),
        Op::Conv2dBack { .. } | Op::Im2colBack(_) | Op::Pool2dBack(_) => {
            ops::conv::reference(n, src)
        }
    }
}

/// The reference backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReferenceBackend;

impl Backend for ReferenceBackend {
    fn name(&self) -> &str {
        "reference"
    }

    fn supports(&self, op: &Op, src: &[DType], dst: DType) -> bool {
        // Quantized data is read through the dequantizer and written through the quantizer;
        // everything else is converted to and from f64.
        let readable = |t: DType| !t.is_quantized() || tessera_quants::layout(t.id()).is_some();
        let writable = |t: DType| !t.is_quantized() || tessera_quants::can_quantize(t.id());
        let _ = op;
        src.iter().all(|&t| readable(t)) && writable(dst)
    }

    fn compute(&self, graph: &Graph, plan: &Plan, mem: &mut Memory) -> Result<()> {
        for &id in &plan.nodes {
            let t = graph.tensor(id);
            if t.op.is_view() {
                continue;
            }
            let mut src = Vec::with_capacity(t.src.len());
            for &s in &t.src {
                src.push(gather(graph.tensor(s), mem.tensor_bytes(graph, plan, s)?)?);
            }
            let out = run_node(&NodeRef { id, t, graph }, &src)?;
            if out.ne != t.ne {
                return Err(Error::Invalid(format!(
                    "internal: reference kernel of {} (node {id}) produced shape {:?}, node has {:?}",
                    t.op, out.ne, t.ne
                )));
            }
            scatter(t, &out, mem.tensor_bytes_mut(graph, plan, id)?)?;
        }
        Ok(())
    }
}

/// Values of contiguous data of `dtype` and shape `dims` (1 to 4 dims) as f64 in logical order.
pub fn decode(dtype: DType, dims: &[usize], bytes: &[u8]) -> Result<Vec<f64>> {
    if dims.is_empty() || dims.len() > 4 {
        return Err(Error::Invalid(format!(
            "decode: {} dims given, 1 to 4 allowed",
            dims.len()
        )));
    }
    let ne = crate::shape::ne_from(dims);
    if !ne[0].is_multiple_of(dtype.block_size()) {
        return Err(Error::Invalid(format!(
            "decode: row length {} is not a multiple of {}'s block size {}",
            ne[0],
            dtype,
            dtype.block_size()
        )));
    }
    let t = Tensor {
        dtype,
        ne,
        nb: crate::shape::contiguous_nb(dtype, &ne),
        op: Op::Leaf,
        src: Vec::new(),
        view_of: None,
        name: String::new(),
        flags: Default::default(),
        layout: Default::default(),
    };
    Ok(gather(&t, bytes)?.data)
}
