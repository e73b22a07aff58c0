//! ggml's quantized block formats: block layouts, dequantizers and reference quantizers.
//!
//! Every algorithm here is a scalar Rust rewrite of the reference code in ggml
//! (<https://github.com/ggml-org/ggml>, MIT licence, © the ggml authors: `ggml-common.h`,
//! `ggml-quants.c`), written to agree with it bit for bit: the golden files that ggml itself
//! wrote (`quant-*.gguf`) are the test. Type ids are ggml's `enum ggml_type`.
//!
//! The entry points work on one row: `quantize_row` is what `ggml_quantize_chunk` does for a
//! row (the reference quantizer, or the importance-weighted search when an importance matrix is
//! given), `dequantize_row` is ggml's `to_float`.
//!
//! Besides the quantized types, `dequantize_row` / `quantize_row` also accept f16 (1) and bf16
//! (30), which ggml converts with the same entry points; `layout` only describes quantized types.

// Index loops mirror ggml's index arithmetic, which is what makes the bit-exactness reviewable.
#![allow(clippy::needless_range_loop)]

mod common;
mod f16;
mod fp4;
/// ggml's lattice grids and sign tables of the i-quants (`ggml-common.h`), shared with the CPU
/// kernels.
pub mod iq_grids;
mod iquants;
mod kquants;
mod legacy;
mod q1q2;
mod ternary;

pub use crate::f16::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

use std::fmt;

/// ggml's type ids (`enum ggml_type`) for the types this crate handles.
pub mod type_id {
    pub const F16: u32 = 1;
    pub const Q4_0: u32 = 2;
    pub const Q4_1: u32 = 3;
    pub const Q5_0: u32 = 6;
    pub const Q5_1: u32 = 7;
    pub const Q8_0: u32 = 8;
    pub const Q8_1: u32 = 9;
    pub const Q2_K: u32 = 10;
    pub const Q3_K: u32 = 11;
    pub const Q4_K: u32 = 12;
    pub const Q5_K: u32 = 13;
    pub const Q6_K: u32 = 14;
    pub const Q8_K: u32 = 15;
    pub const IQ2_XXS: u32 = 16;
    pub const IQ2_XS: u32 = 17;
    pub const IQ3_XXS: u32 = 18;
    pub const IQ1_S: u32 = 19;
    pub const IQ4_NL: u32 = 20;
    pub const IQ3_S: u32 = 21;
    pub const IQ2_S: u32 = 22;
    pub const IQ4_XS: u32 = 23;
    pub const IQ1_M: u32 = 29;
    pub const BF16: u32 = 30;
    pub const TQ1_0: u32 = 34;
    pub const TQ2_0: u32 = 35;
    pub const MXFP4: u32 = 39;
    pub const NVFP4: u32 = 40;
    pub const Q1_0: u32 = 41;
    pub const Q2_0: u32 = 42;
}

/// `block_size` elements are stored in `type_size` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub block_size: usize,
    pub type_size: usize,
}

/// Why a row could not be converted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QuantError {
    /// Not a type id of a quantized (or f16/bf16) ggml type.
    UnknownType(u32),
    /// The type is known but this direction is not implemented for it (e.g. quantizing q8_K
    /// from an importance matrix makes no sense; dequantizing is always implemented).
    Unsupported {
        type_name: &'static str,
        what: &'static str,
    },
    /// The row length is not a whole number of blocks.
    NotBlockMultiple {
        type_name: &'static str,
        len: usize,
        block_size: usize,
    },
    /// The byte buffer does not hold exactly the row.
    BufferSize {
        type_name: &'static str,
        expected: usize,
        actual: usize,
    },
    /// ggml refuses to quantize this type without an importance matrix.
    ImatrixRequired(&'static str),
    /// The importance matrix must have one weight per column of the row.
    ImatrixLength {
        type_name: &'static str,
        expected: usize,
        actual: usize,
    },
}

impl fmt::Display for QuantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuantError::UnknownType(id) => write!(f, "unknown or non-quantized ggml type id {id}"),
            QuantError::Unsupported { type_name, what } => {
                write!(f, "{type_name}: {what} is not supported")
            }
            QuantError::NotBlockMultiple { type_name, len, block_size } => write!(
                f,
                "{type_name}: row length {len} is not a multiple of the block size {block_size}"
            ),
            QuantError::BufferSize { type_name, expected, actual } => write!(
                f,
                "{type_name}: buffer holds {actual} bytes, the row needs exactly {expected}"
            ),
            QuantError::ImatrixRequired(t) => {
                write!(f, "{t}: quantizing requires an importance matrix")
            }
            QuantError::ImatrixLength { type_name, expected, actual } => write!(
                f,
                "{type_name}: importance matrix has {actual} weights, the row has {expected} columns"
            ),
        }
    }
}

impl std::error::Error for QuantError {}

type DequantFn = fn(&[u8], &mut [f32]);
type QuantFn = fn(&[f32], &mut [u8], Option<&[f32]>);

struct Format {
    id: u32,
    name: &'static str,
    block_size: usize,
    type_size: usize,
    dequant: DequantFn,
    quant: Option<QuantFn>,
    needs_imatrix: bool,
    quantized: bool,
}

const QK_K: usize = 256;

/// One row of the format table: id, name, block size, bytes per block, dequantizer, quantizer
/// (None: not implemented), whether ggml requires an importance matrix.
const fn q(
    id: u32,
    name: &'static str,
    block_size: usize,
    type_size: usize,
    dequant: DequantFn,
    quant: Option<QuantFn>,
    needs_imatrix: bool,
) -> Format {
    Format {
        id,
        name,
        block_size,
        type_size,
        dequant,
        quant,
        needs_imatrix,
        quantized: true,
    }
}

#[rustfmt::skip]
static FORMATS: &[Format] = &[
    Format { id: type_id::F16, name: "f16", block_size: 1, type_size: 2, dequant: f16::dequantize_f16,
             quant: Some(f16::quantize_f16), needs_imatrix: false, quantized: false },
    Format { id: type_id::BF16, name: "bf16", block_size: 1, type_size: 2, dequant: f16::dequantize_bf16,
             quant: Some(f16::quantize_bf16), needs_imatrix: false, quantized: false },
    q(type_id::Q4_0,    "q4_0",    32,   18,  legacy::dequantize_q4_0,    Some(legacy::quantize_q4_0),  false),
    q(type_id::Q4_1,    "q4_1",    32,   20,  legacy::dequantize_q4_1,    Some(legacy::quantize_q4_1),  false),
    q(type_id::Q5_0,    "q5_0",    32,   22,  legacy::dequantize_q5_0,    Some(legacy::quantize_q5_0),  false),
    q(type_id::Q5_1,    "q5_1",    32,   24,  legacy::dequantize_q5_1,    Some(legacy::quantize_q5_1),  false),
    q(type_id::Q8_0,    "q8_0",    32,   34,  legacy::dequantize_q8_0,    Some(legacy::quantize_q8_0),  false),
    q(type_id::Q8_1,    "q8_1",    32,   36,  legacy::dequantize_q8_1,    Some(legacy::quantize_q8_1),  false),
    q(type_id::Q2_K,    "q2_K",    QK_K, 84,  kquants::dequantize_q2_k,   Some(kquants::quantize_q2_k), false),
    q(type_id::Q3_K,    "q3_K",    QK_K, 110, kquants::dequantize_q3_k,   Some(kquants::quantize_q3_k), false),
    q(type_id::Q4_K,    "q4_K",    QK_K, 144, kquants::dequantize_q4_k,   Some(kquants::quantize_q4_k), false),
    q(type_id::Q5_K,    "q5_K",    QK_K, 176, kquants::dequantize_q5_k,   Some(kquants::quantize_q5_k), false),
    q(type_id::Q6_K,    "q6_K",    QK_K, 210, kquants::dequantize_q6_k,   Some(kquants::quantize_q6_k), false),
    q(type_id::Q8_K,    "q8_K",    QK_K, 292, kquants::dequantize_q8_k,   Some(kquants::quantize_q8_k), false),
    q(type_id::IQ2_XXS, "iq2_xxs", QK_K, 66,  iquants::dequantize_iq2_xxs, Some(iquants::quantize_iq2_xxs), true),
    q(type_id::IQ2_XS,  "iq2_xs",  QK_K, 74,  iquants::dequantize_iq2_xs,  Some(iquants::quantize_iq2_xs), true),
    q(type_id::IQ3_XXS, "iq3_xxs", QK_K, 98,  iquants::dequantize_iq3_xxs, Some(iquants::quantize_iq3_xxs), false),
    q(type_id::IQ1_S,   "iq1_s",   QK_K, 50,  iquants::dequantize_iq1_s,   Some(iquants::quantize_iq1_s), true),
    q(type_id::IQ4_NL,  "iq4_nl",  32,   18,  iquants::dequantize_iq4_nl,  Some(iquants::quantize_iq4_nl), false),
    q(type_id::IQ3_S,   "iq3_s",   QK_K, 110, iquants::dequantize_iq3_s,   Some(iquants::quantize_iq3_s), false),
    q(type_id::IQ2_S,   "iq2_s",   QK_K, 82,  iquants::dequantize_iq2_s,   Some(iquants::quantize_iq2_s), false),
    q(type_id::IQ4_XS,  "iq4_xs",  QK_K, 136, iquants::dequantize_iq4_xs,  Some(iquants::quantize_iq4_xs), false),
    q(type_id::IQ1_M,   "iq1_m",   QK_K, 56,  iquants::dequantize_iq1_m,   Some(iquants::quantize_iq1_m), false),
    q(type_id::TQ1_0,   "tq1_0",   QK_K, 54,  ternary::dequantize_tq1_0,  Some(ternary::quantize_tq1_0), false),
    q(type_id::TQ2_0,   "tq2_0",   QK_K, 66,  ternary::dequantize_tq2_0,  Some(ternary::quantize_tq2_0), false),
    q(type_id::MXFP4,   "mxfp4",   32,   17,  fp4::dequantize_mxfp4,      Some(fp4::quantize_mxfp4),     false),
    q(type_id::NVFP4,   "nvfp4",   64,   36,  fp4::dequantize_nvfp4,      Some(fp4::quantize_nvfp4),     false),
    q(type_id::Q1_0,    "q1_0",    128,  18,  q1q2::dequantize_q1_0,      Some(q1q2::quantize_q1_0),     false),
    q(type_id::Q2_0,    "q2_0",    64,   18,  q1q2::dequantize_q2_0,      Some(q1q2::quantize_q2_0),     false),
];

fn format(type_id: u32) -> Option<&'static Format> {
    FORMATS.iter().find(|f| f.id == type_id)
}

/// Block layout of a quantized type (`None` for an unknown or non-quantized id).
pub fn layout(type_id: u32) -> Option<Layout> {
    format(type_id).filter(|f| f.quantized).map(|f| Layout {
        block_size: f.block_size,
        type_size: f.type_size,
    })
}

/// ggml's name of a type this crate handles (`q4_K`, `iq2_xxs`, `f16`, ...).
pub fn type_name(type_id: u32) -> Option<&'static str> {
    format(type_id).map(|f| f.name)
}

/// Whether `quantize_row` is implemented for this type (with or without importance matrix,
/// as ggml accepts it).
pub fn can_quantize(type_id: u32) -> bool {
    format(type_id).is_some_and(|f| f.quant.is_some())
}

/// Whether ggml refuses to quantize this type without an importance matrix (iq2_xxs, iq2_xs,
/// iq1_s).
pub fn requires_imatrix(type_id: u32) -> bool {
    format(type_id).is_some_and(|f| f.needs_imatrix)
}

fn check_len(f: &Format, n: usize, bytes: usize) -> Result<(), QuantError> {
    if !n.is_multiple_of(f.block_size) {
        return Err(QuantError::NotBlockMultiple {
            type_name: f.name,
            len: n,
            block_size: f.block_size,
        });
    }
    let expected = n / f.block_size * f.type_size;
    if bytes != expected {
        return Err(QuantError::BufferSize {
            type_name: f.name,
            expected,
            actual: bytes,
        });
    }
    Ok(())
}

/// Decodes one row: `dst.len()` elements from exactly `dst.len() / block_size * type_size`
/// bytes of `src` (ggml's `to_float`).
pub fn dequantize_row(type_id: u32, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let f = format(type_id).ok_or(QuantError::UnknownType(type_id))?;
    check_len(f, dst.len(), src.len())?;
    (f.dequant)(src, dst);
    Ok(())
}

/// Encodes one row as `ggml_quantize_chunk` does: the reference quantizer without `imatrix`,
/// the importance-weighted search with it (`imatrix` has one weight per column; types that do
/// not use one ignore it). `dst` must be exactly the row's size in bytes.
pub fn quantize_row(
    type_id: u32,
    src: &[f32],
    dst: &mut [u8],
    imatrix: Option<&[f32]>,
) -> Result<(), QuantError> {
    let f = format(type_id).ok_or(QuantError::UnknownType(type_id))?;
    check_len(f, src.len(), dst.len())?;
    if let Some(w) = imatrix {
        if w.len() != src.len() {
            return Err(QuantError::ImatrixLength {
                type_name: f.name,
                expected: src.len(),
                actual: w.len(),
            });
        }
    } else if f.needs_imatrix {
        return Err(QuantError::ImatrixRequired(f.name));
    }
    let quant = f.quant.ok_or(QuantError::Unsupported {
        type_name: f.name,
        what: "quantization",
    })?;
    quant(src, dst, imatrix);
    Ok(())
}
