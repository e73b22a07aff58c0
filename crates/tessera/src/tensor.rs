//! Tensor metadata. A tensor is a description (type, shape, strides, the op that makes it, its
//! sources) over memory that the planner assigns later; it holds no data itself.

use crate::layout::RowLayout;
use crate::op::Op;
use crate::shape::{fmt_ne, Nb, Ne};
use crate::DType;

/// Index of a tensor in its [`Graph`](crate::Graph).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub u32);

impl TensorId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl std::fmt::Display for TensorId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// ggml's tensor flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flags {
    /// A trainable parameter: autodiff builds its gradient.
    pub param: bool,
    /// The scalar loss that autodiff differentiates.
    pub loss: bool,
    /// Set by the caller before every run.
    pub input: bool,
    /// Read by the caller after a run: its memory is never reused.
    pub output: bool,
}

/// Storage aliasing: this tensor's bytes start `offset` bytes into `src`'s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ViewOf {
    pub src: TensorId,
    pub offset: usize,
}

#[derive(Clone, Debug)]
pub struct Tensor {
    pub dtype: DType,
    pub ne: Ne,
    pub nb: Nb,
    pub op: Op,
    pub src: Vec<TensorId>,
    /// Set for views, reshapes, permutes and for ops that write into another tensor's memory
    /// (`cpy`, `set_rows`): the tensor has no storage of its own.
    pub view_of: Option<ViewOf>,
    pub name: String,
    pub flags: Flags,
    /// How the rows lie in memory (only leaves set it; see [`crate::layout`]).
    pub layout: RowLayout,
}

impl Tensor {
    pub fn nelements(&self) -> usize {
        crate::shape::nelements(&self.ne)
    }
    pub fn nrows(&self) -> usize {
        crate::shape::nrows(&self.ne)
    }
    pub fn is_contiguous(&self) -> bool {
        crate::shape::is_contiguous(self.dtype, &self.ne, &self.nb)
    }
    /// Bytes from the first to one past the last byte of the tensor.
    pub fn nbytes(&self) -> usize {
        crate::shape::nbytes(self.dtype, &self.ne, &self.nb)
    }
    /// `f32 [4, 3, 1, 1]`, plus ` (strides …)` when not contiguous.
    pub fn describe(&self) -> String {
        let mut s = format!("{} {}", self.dtype, fmt_ne(&self.ne));
        if !self.is_contiguous() {
            s += &format!(" nb={:?}", self.nb);
        }
        s
    }
}
