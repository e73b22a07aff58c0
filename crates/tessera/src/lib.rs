//! Tessera core: tensors with ggml's semantics, typed lazy graphs, ggml's op set, the memory
//! planner and the reference backend (the oracle every other backend is tested against).
//!
//! ```
//! use tessera::{Graph, ReferenceBackend, Session};
//! let mut g = Graph::new();
//! let a = g.new_f32(&[3, 2]).unwrap();          // ne = [3, 2]: 2 rows of 3
//! let b = g.new_f32(&[3]).unwrap();             // broadcast over the rows
//! let c = g.add(a, b).unwrap();
//! let mut s = Session::new(g, &[c]).unwrap();   // planned and allocated once
//! s.set_f32(a, &[1., 2., 3., 4., 5., 6.]).unwrap();
//! s.set_f32(b, &[10., 20., 30.]).unwrap();
//! s.compute(&ReferenceBackend).unwrap();
//! assert_eq!(s.get_f32(c).unwrap(), vec![11., 22., 33., 14., 25., 36.]);
//! ```

pub mod alloc;
pub mod autodiff;
pub mod backend;
pub mod dtype;
pub mod error;
pub mod graph;
pub mod layout;
pub mod numerics;
pub mod op;
pub mod ops;
pub mod reference;
pub mod shape;
pub mod tensor;

pub use alloc::Plan;
pub use autodiff::Gradients;
pub use backend::{Backend, Buffer, ExternalBytes, Memory, RawRegion, Session};
pub use dtype::DType;
pub use error::{Error, Result};
pub use graph::Graph;
pub use layout::RowLayout;
pub use op::Op;
pub use reference::{decode, Dense, ReferenceBackend};
pub use tensor::{Flags, Tensor, TensorId};
