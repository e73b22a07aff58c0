//! Tessera core: tensors with ggml's semantics, typed lazy graphs, ggml's op set, the memory
//! planner and the reference backend (the oracle every other backend is tested against).

pub mod dtype;
pub mod error;

pub use dtype::DType;
pub use error::{Error, Result};
