//! The lazy graph: builders add tensors (leaves and op nodes); nothing is computed until a
//! [`Session`](crate::Session) runs a planned graph on a backend.
//!
//! Builders for each op live beside the op in `ops/<family>.rs` (as `impl Graph` blocks); this
//! module holds what they share: tensor creation, flags and names, and error formatting.

mod dot;
mod order;

use crate::error::{Error, Result};
use crate::layout::RowLayout;
use crate::op::Op;
use crate::shape::{contiguous_nb, ne_from, Ne, MAX_DIMS};
use crate::tensor::{Flags, Tensor, TensorId, ViewOf};
use crate::DType;

#[derive(Clone, Debug, Default)]
pub struct Graph {
    tensors: Vec<Tensor>,
}

impl Graph {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of tensors (leaves, views and op nodes).
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    pub fn tensor(&self, id: TensorId) -> &Tensor {
        &self.tensors[id.index()]
    }

    pub fn ids(&self) -> impl Iterator<Item = TensorId> {
        (0..self.tensors.len() as u32).map(TensorId)
    }

    pub fn dtype(&self, id: TensorId) -> DType {
        self.tensor(id).dtype
    }

    pub fn ne(&self, id: TensorId) -> Ne {
        self.tensor(id).ne
    }

    /// A new leaf tensor (an input, weight or constant) of `dtype` with 1 to 4 dims.
    pub fn new_tensor(&mut self, dtype: DType, dims: &[usize]) -> Result<TensorId> {
        if dims.is_empty() || dims.len() > MAX_DIMS {
            return Err(Error::Invalid(format!(
                "new_tensor: {} dims given, 1 to 4 allowed",
                dims.len()
            )));
        }
        let ne = ne_from(dims);
        if !ne[0].is_multiple_of(dtype.block_size()) {
            return Err(Error::Invalid(format!(
                "new_tensor: row length {} is not a multiple of {}'s block size {}",
                ne[0],
                dtype,
                dtype.block_size()
            )));
        }
        Ok(self.push(Tensor {
            dtype,
            ne,
            nb: contiguous_nb(dtype, &ne),
            op: Op::Leaf,
            src: Vec::new(),
            view_of: None,
            name: String::new(),
            flags: Flags::default(),
            layout: Default::default(),
        }))
    }

    /// Shorthand for an f32 leaf.
    pub fn new_f32(&mut self, dims: &[usize]) -> Result<TensorId> {
        self.new_tensor(DType::F32, dims)
    }

    pub(crate) fn tensor_mut(&mut self, id: TensorId) -> &mut Tensor {
        &mut self.tensors[id.index()]
    }

    pub(crate) fn push(&mut self, t: Tensor) -> TensorId {
        let id = TensorId(self.tensors.len() as u32);
        self.tensors.push(t);
        id
    }

    /// Adds an op node with a contiguous result of `dtype` and shape `ne`.
    pub(crate) fn node(&mut self, op: Op, dtype: DType, ne: Ne, src: &[TensorId]) -> TensorId {
        self.push(Tensor {
            dtype,
            ne,
            nb: contiguous_nb(dtype, &ne),
            op,
            src: src.to_vec(),
            view_of: None,
            name: String::new(),
            flags: Flags::default(),
            layout: Default::default(),
        })
    }

    /// Adds a node that aliases `of`'s memory at `offset` with its own shape and strides.
    pub(crate) fn aliasing_node(
        &mut self,
        op: Op,
        dtype: DType,
        ne: Ne,
        nb: [usize; 4],
        src: &[TensorId],
        of: TensorId,
        offset: usize,
    ) -> TensorId {
        self.push(Tensor {
            dtype,
            ne,
            nb,
            op,
            src: src.to_vec(),
            view_of: Some(ViewOf { src: of, offset }),
            name: String::new(),
            flags: Flags::default(),
            layout: Default::default(),
        })
    }

    /// The tensor that owns the memory `id` lives in, and `id`'s byte offset inside it.
    pub fn storage_root(&self, id: TensorId) -> (TensorId, usize) {
        let mut cur = id;
        let mut off = 0;
        while let Some(v) = self.tensor(cur).view_of {
            off += v.offset;
            cur = v.src;
        }
        (cur, off)
    }

    pub fn set_name(&mut self, id: TensorId, name: impl Into<String>) -> TensorId {
        self.tensors[id.index()].name = name.into();
        id
    }

    pub fn name(&self, id: TensorId) -> &str {
        &self.tensor(id).name
    }

    /// The first tensor called `name`.
    pub fn find(&self, name: &str) -> Option<TensorId> {
        self.ids().find(|&id| self.tensor(id).name == name)
    }

    pub fn flags(&self, id: TensorId) -> Flags {
        self.tensor(id).flags
    }

    /// Marks a leaf as a trainable parameter.
    pub fn set_param(&mut self, id: TensorId) -> Result<()> {
        if self.tensor(id).op != Op::Leaf {
            return Err(Error::Invalid(format!(
                "set_param: tensor {} '{}' is the result of {}, only leaves can be params",
                id,
                self.name(id),
                self.tensor(id).op
            )));
        }
        if self.tensor(id).layout != RowLayout::Plain {
            return Err(Error::Invalid(format!(
                "set_param: tensor {} '{}' has interleaved rows, which no backward reads",
                id,
                self.name(id)
            )));
        }
        self.tensors[id.index()].flags.param = true;
        Ok(())
    }

    /// Sets how a leaf's rows lie in memory (see [`crate::layout`]). The interleaved layout
    /// takes a contiguous q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4, iq4_xs, q4_K, q5_K or q6_K
    /// leaf with a multiple of eight rows that is not a param (the repacked one q4_0, iq4_nl,
    /// q4_K, mxfp4 or q2_K); planning then checks that only `mul_mat` reads it, as its first
    /// operand.
    pub fn set_layout(&mut self, id: TensorId, layout: RowLayout) -> Result<()> {
        let t = self.tensor(id);
        if layout != RowLayout::Plain {
            let why = if t.op != Op::Leaf {
                Some(format!("it is the result of {}", t.op))
            } else if layout == RowLayout::Repacked8 && !crate::layout::repack_numerics(t.dtype) {
                Some(
                    "only q4_0, iq4_nl, q4_K, mxfp4 and q2_K rows have ggml's repack arithmetic"
                        .to_string(),
                )
            } else if layout == RowLayout::Interleaved8
                && crate::layout::interleave_head(t.dtype).is_none()
            {
                Some(
                    "only q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4, iq4_xs, q4_K, q5_K and q6_K rows \
                     can be interleaved"
                        .to_string(),
                )
            } else if !t.is_contiguous() {
                Some("it is not contiguous".to_string())
            } else if !t.nrows().is_multiple_of(8) || !t.ne[1].is_multiple_of(8) {
                Some(format!("{} rows are not whole groups of eight", t.ne[1]))
            } else if t.flags.param {
                Some("it is a trainable param".to_string())
            } else {
                None
            };
            if let Some(why) = why {
                return Err(Error::Invalid(format!(
                    "set_layout: tensor {id} '{}' ({}) cannot be interleaved: {why}",
                    t.name,
                    t.describe()
                )));
            }
        }
        self.tensors[id.index()].layout = layout;
        Ok(())
    }

    /// Marks the scalar loss.
    pub fn set_loss(&mut self, id: TensorId) -> Result<()> {
        let t = self.tensor(id);
        if t.nelements() != 1 || t.dtype != DType::F32 {
            return Err(Error::Invalid(format!(
                "set_loss: the loss must be an f32 scalar, tensor {} '{}' is {}",
                id,
                t.name,
                t.describe()
            )));
        }
        self.tensors[id.index()].flags.loss = true;
        self.tensors[id.index()].flags.output = true;
        Ok(())
    }

    pub fn set_input(&mut self, id: TensorId) {
        self.tensors[id.index()].flags.input = true;
    }

    /// Marks a result the caller reads after a run: its memory is kept and never reused.
    pub fn set_output(&mut self, id: TensorId) {
        self.tensors[id.index()].flags.output = true;
    }

    /// `a: f32 [4, 3, 1, 1], b: f16 [4, 1, 1, 1]` for error messages.
    pub(crate) fn describe_inputs(&self, src: &[TensorId]) -> String {
        const NAMES: [&str; 6] = ["a", "b", "c", "d", "e", "f"];
        src.iter()
            .enumerate()
            .map(|(i, &s)| {
                format!(
                    "{}: {}",
                    NAMES.get(i).unwrap_or(&"x"),
                    self.tensor(s).describe()
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// A shape/type error from builder `op` on inputs `src`.
    pub(crate) fn shape_err(
        &self,
        op: &'static str,
        msg: impl Into<String>,
        src: &[TensorId],
    ) -> Error {
        Error::Shape {
            op,
            msg: msg.into(),
            inputs: self.describe_inputs(src),
        }
    }

    /// Checks that `id` exists in this graph.
    pub(crate) fn check_id(&self, op: &'static str, id: TensorId) -> Result<()> {
        if id.index() >= self.tensors.len() {
            return Err(Error::Shape {
                op,
                msg: format!("tensor {id} does not belong to this graph"),
                inputs: String::new(),
            });
        }
        Ok(())
    }

    /// Checks ids and that each source has one of `allowed` types.
    pub(crate) fn check_types(
        &self,
        op: &'static str,
        src: &[TensorId],
        allowed: &[&[DType]],
    ) -> Result<()> {
        for &s in src {
            self.check_id(op, s)?;
        }
        for (i, (&s, ok)) in src.iter().zip(allowed).enumerate() {
            let t = self.dtype(s);
            if !ok.contains(&t) {
                let names: Vec<&str> = ok.iter().map(|d| d.name()).collect();
                return Err(self.shape_err(
                    op,
                    format!(
                        "input {} has type {}, expected one of {}",
                        i,
                        t,
                        names.join("/")
                    ),
                    src,
                ));
            }
        }
        Ok(())
    }
}

/// Float types most ops accept.
pub(crate) const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];
pub(crate) const F32_ONLY: &[DType] = &[DType::F32];
pub(crate) const I32_ONLY: &[DType] = &[DType::I32];
