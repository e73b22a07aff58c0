//! GGUF files: a strict, zero-copy reader and a writer.
//!
//! GGUF (ggml's model file format) is a header (`GGUF`, version, tensor count, metadata count),
//! typed metadata key/value pairs, a table of tensor infos (name, dimensions, ggml type id,
//! offset), zero padding to the alignment (`general.alignment`, default 32), then the tensor data,
//! each tensor at an aligned offset from the start of that data section. Everything is
//! little-endian.
//!
//! [`GgufFile::open`] memory-maps a file and validates all of it except the tensor bytes
//! themselves: a malformed file gives a [`GgufError`] naming the problem, never a panic, and no
//! allocation is sized from a field before that field was checked against the bytes that remain.
//! Versions 2 and 3 are read (they share one layout). The checks, each with its own
//! [`GgufError`] variant:
//!
//! - magic `GGUF`; version 2 or 3; tensor and metadata counts that fit in the bytes that remain;
//! - every length (strings, arrays) within the bytes that remain; strings valid UTF-8;
//! - known value types, no arrays of arrays, bools 0 or 1, no empty or duplicate keys;
//! - `general.alignment`, when present, a `u32` that is a nonzero power of two;
//! - tensors: unique names of at most 63 bytes, 1 to 4 dimensions, no negative dimension, element
//!   and byte counts that do not overflow, a known ggml type id, `ne[0]` a multiple of the type's
//!   block size, an aligned offset, data inside the file, and no two tensors overlapping.
//!
//! Unlike ggml, tensors may be stored in any order and with gaps, as long as each is aligned,
//! inside the file and overlaps no other.
//!
//! [`GgufWriter`] writes version 3 files laid out exactly as ggml writes them.
//!
//! ```
//! use tessera::DType;
//! use tessera_gguf::{GgufFile, GgufWriter, Value};
//!
//! let mut w = GgufWriter::new();
//! w.add_kv("general.name", Value::from("tiny"));
//! w.add_tensor("x", DType::F32, &[2, 1], &[0u8; 8]).unwrap();
//! let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
//! assert_eq!(f.get("general.name").and_then(Value::as_str), Some("tiny"));
//! assert_eq!(f.tensor("x").unwrap().ne, [2, 1, 1, 1]);
//! assert_eq!(f.tensor_data(f.tensor("x").unwrap()), &[0u8; 8]);
//! ```

mod dump;
mod error;
mod reader;
mod value;
mod writer;

pub use dump::dump;
pub use error::GgufError;
pub use reader::{GgufFile, TensorInfo};
pub use value::{Value, ValueType};
pub use writer::{GgufStreamWriter, GgufWriter};

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The alignment used when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// The metadata key that sets the alignment (must be a `u32`).
pub const KEY_ALIGNMENT: &str = "general.alignment";
/// Longest tensor name ggml accepts, in bytes (`GGML_MAX_NAME - 1`).
pub const MAX_TENSOR_NAME_LEN: usize = 63;
