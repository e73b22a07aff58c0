//! One error type for the core. Every variant names what went wrong in terms a user can act on:
//! the op, the shapes and types of its inputs, the offending index.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum Error {
    /// A builder was given inputs whose shapes or types the op does not accept.
    #[error("{op}: {msg} (inputs: {inputs})")]
    Shape {
        op: &'static str,
        msg: String,
        /// Shapes and types of every input, e.g. `a: f32 [4, 3, 1, 1], b: f16 [5, 3, 1, 1]`.
        inputs: String,
    },
    /// A backend cannot run an op on these types.
    #[error("{backend}: op {op} is not supported for {types}")]
    Unsupported {
        backend: String,
        op: String,
        types: String,
    },
    /// A value found only at compute time is out of range (e.g. a `get_rows` index).
    #[error("{op} (node {node}): {msg}")]
    Compute {
        op: &'static str,
        node: String,
        msg: String,
    },
    /// Autodiff needs a gradient through an op that has none (argmax, step, …) or through an
    /// input of an op that is not differentiable in it (indices, masks, …).
    #[error("{op} (node {node}) is not differentiable with respect to input {input}: {why}")]
    NotDifferentiable {
        op: &'static str,
        node: String,
        input: usize,
        why: String,
    },
    /// Anything about graphs, data or planning that is not a shape error.
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
