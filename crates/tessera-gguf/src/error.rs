//! The error type of the reader and the writer.

use tessera::DType;
use thiserror::Error;

use crate::ValueType;

/// Everything that can be wrong with a GGUF file (reading) or with what was given to the writer.
///
/// Every variant names the problem with the values and byte offsets involved. Offsets are from
/// the start of the file unless a field says otherwise (tensor `offset`s are relative to the
/// data section, as in the file).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file ends before `what` is complete.
    #[error(
        "file truncated: {what} at byte {offset} needs {needed} bytes, only {available} remain"
    )]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        available: u64,
    },
    /// The first four bytes are not `GGUF`.
    #[error("bad magic {found:02x?} at byte 0, expected \"GGUF\" (47 47 55 46)")]
    BadMagic { found: [u8; 4] },
    /// Only versions 2 and 3 are read (v1 used 32-bit counts and is obsolete).
    #[error("unsupported GGUF version {0}: versions 2 and 3 are supported{hint}",
        hint = if *.0 != 0 && .0 & 0xffff == 0 { " (a byte-swapped version: big-endian file?)" } else { "" })]
    UnsupportedVersion(u32),
    /// A count in the header cannot fit in the bytes that follow it.
    #[error("{what} {count} (at byte {offset}) is impossible: the {remaining} bytes that remain hold at most {max}")]
    CountTooLarge {
        what: &'static str,
        count: u64,
        max: u64,
        remaining: u64,
        offset: u64,
    },
    /// A metadata key is the empty string.
    #[error("metadata key #{index} at byte {offset} is empty")]
    EmptyKey { index: u64, offset: u64 },
    /// Two metadata entries have the same key.
    #[error("duplicate metadata key {key:?} (second one at byte {offset})")]
    DuplicateKey { key: String, offset: u64 },
    /// A value type id (of a value, or of an array's elements) that GGUF does not define.
    #[error("key {key:?}: unknown value type id {id} at byte {offset} (known: 0..=12)")]
    UnknownValueType { key: String, id: u32, offset: u64 },
    /// An array of arrays (GGUF does not allow them).
    #[error("key {key:?}: array of arrays at byte {offset} is not supported")]
    NestedArray { key: String, offset: u64 },
    /// The writer was given an array whose elements are not all of its element type.
    #[error("key {key:?}: array of {expected} has element {index} of type {found}")]
    ArrayTypeMismatch {
        key: String,
        index: usize,
        expected: ValueType,
        found: ValueType,
    },
    /// A bool byte other than 0 or 1.
    #[error("key {key:?}: bool byte at byte {offset} is {value}, must be 0 or 1")]
    InvalidBool { key: String, value: u8, offset: u64 },
    /// A string (key, value or tensor name) that is not valid UTF-8.
    #[error("{what}: string at byte {offset} is not valid UTF-8 (bad byte at string index {valid_up_to})")]
    InvalidUtf8 {
        what: String,
        offset: u64,
        valid_up_to: usize,
    },
    /// `general.alignment` is present but not a `u32`.
    #[error("general.alignment must be of type u32, found {found}")]
    AlignmentType { found: ValueType },
    /// `general.alignment` is zero or not a power of two.
    #[error("alignment {0} is not a nonzero power of two")]
    BadAlignment(u64),
    /// A tensor with more than 4 dimensions.
    #[error("tensor {tensor:?} has {n_dims} dimensions, at most 4 are supported")]
    TooManyDims { tensor: String, n_dims: u64 },
    /// A tensor with 0 dimensions.
    #[error("tensor {tensor:?} has 0 dimensions, at least 1 is required")]
    NoDims { tensor: String },
    /// A dimension that is negative when read as `int64_t` (as ggml does).
    #[error("tensor {tensor:?}: ne[{dim}] = {value} is negative")]
    NegativeDim {
        tensor: String,
        dim: usize,
        value: i64,
    },
    /// The element count or byte size of a tensor (or of the data section) overflows.
    #[error("tensor {tensor:?} of type {dtype} with shape {ne:?}: {what} overflows")]
    SizeOverflow {
        tensor: String,
        dtype: DType,
        ne: Vec<u64>,
        what: &'static str,
    },
    /// A tensor type id that ggml does not define (or no longer supports).
    #[error("tensor {tensor:?} has unknown type id {id}")]
    UnknownTensorType { tensor: String, id: u32 },
    /// `ne[0]` is not a whole number of the type's blocks.
    #[error("tensor {tensor:?} of type {dtype}: row length ne[0] = {ne0} is not a multiple of the block size {block}")]
    RowNotBlockMultiple {
        tensor: String,
        dtype: DType,
        ne0: u64,
        block: usize,
    },
    /// A tensor whose bytes are not inside the file.
    #[error("tensor {tensor:?}: bytes {offset}..{offset}+{size} (from the data section start) run past its end ({data_len} bytes)")]
    DataOutOfBounds {
        tensor: String,
        offset: u64,
        size: u64,
        data_len: u64,
    },
    /// A tensor offset that is not a multiple of the file's alignment.
    #[error("tensor {tensor:?}: offset {offset} is not a multiple of the alignment {alignment}")]
    Misaligned {
        tensor: String,
        offset: u64,
        alignment: usize,
    },
    /// Two tensors share bytes. Ranges are relative to the data section, end exclusive.
    #[error("tensors {a:?} (bytes {a_range:?}) and {b:?} (bytes {b_range:?}) overlap")]
    Overlap {
        a: String,
        a_range: std::ops::Range<u64>,
        b: String,
        b_range: std::ops::Range<u64>,
    },
    /// Two tensors have the same name.
    #[error("duplicate tensor name {0:?}")]
    DuplicateTensor(String),
    /// A streamed file's tensors are not written in the order, or with the sizes, declared.
    #[error("streaming GGUF writer: {0}")]
    StreamOrder(String),
    /// A tensor name longer than ggml accepts (`GGML_MAX_NAME - 1` = 63 bytes).
    #[error("tensor name {tensor:?} is {len} bytes long, at most {max} are allowed")]
    NameTooLong {
        tensor: String,
        len: usize,
        max: usize,
    },
    /// The writer was given data whose length does not match the tensor's type and shape.
    #[error(
        "tensor {tensor:?} of type {dtype} with shape {ne:?} needs {expected} bytes, got {actual}"
    )]
    DataSizeMismatch {
        tensor: String,
        dtype: DType,
        ne: Vec<usize>,
        expected: usize,
        actual: usize,
    },
    /// Reading or writing the file failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}
