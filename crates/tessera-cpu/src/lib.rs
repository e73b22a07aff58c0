//! The fast CPU backend.

pub mod pool;

pub use pool::ThreadPool;
