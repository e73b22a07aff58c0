//! Element types, with ggml's `enum ggml_type` ids, names and block layouts.
//!
//! Every type is stored in blocks: `block_size` elements take `type_size` bytes. Plain types
//! (f32, f16, bf16, i32, ...) have a block of one element. Row lengths (`ne[0]`) of a quantized
//! tensor must be a multiple of the block size; byte strides (`nb`) then work for every type.

use std::fmt;

/// A tensor element type. The discriminant is ggml's type id (as written in GGUF files).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum DType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2K = 10,
    Q3K = 11,
    Q4K = 12,
    Q5K = 13,
    Q6K = 14,
    Q8K = 15,
    IQ2XXS = 16,
    IQ2XS = 17,
    IQ3XXS = 18,
    IQ1S = 19,
    IQ4NL = 20,
    IQ3S = 21,
    IQ2S = 22,
    IQ4XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
    NVFP4 = 40,
    Q1_0 = 41,
    Q2_0 = 42,
}

/// Static facts about a type: ggml's name, elements per block, bytes per block.
#[derive(Clone, Copy, Debug)]
pub struct TypeTraits {
    pub name: &'static str,
    pub block_size: usize,
    pub type_size: usize,
    pub quantized: bool,
}

const QK_K: usize = 256;

impl DType {
    /// Every type we know, in id order.
    pub const ALL: [DType; 35] = [
        DType::F32,
        DType::F16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q8_1,
        DType::Q2K,
        DType::Q3K,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
        DType::Q8K,
        DType::IQ2XXS,
        DType::IQ2XS,
        DType::IQ3XXS,
        DType::IQ1S,
        DType::IQ4NL,
        DType::IQ3S,
        DType::IQ2S,
        DType::IQ4XS,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F64,
        DType::IQ1M,
        DType::BF16,
        DType::TQ1_0,
        DType::TQ2_0,
        DType::MXFP4,
        DType::NVFP4,
        DType::Q1_0,
        DType::Q2_0,
    ];

    /// ggml's type id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The type with ggml's id `id`, or `None` for an id ggml does not (or no longer) use.
    pub fn from_id(id: u32) -> Option<DType> {
        DType::ALL.iter().copied().find(|t| t.id() == id)
    }

    /// The type named `name` (ggml's spelling, case-insensitive: `q4_K`, `Q4_K`, `bf16`).
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    pub fn traits(self) -> TypeTraits {
        use DType::*;
        let (name, block_size, type_size, quantized) = match self {
            F32 => ("f32", 1, 4, false),
            F16 => ("f16", 1, 2, false),
            BF16 => ("bf16", 1, 2, false),
            F64 => ("f64", 1, 8, false),
            I8 => ("i8", 1, 1, false),
            I16 => ("i16", 1, 2, false),
            I32 => ("i32", 1, 4, false),
            I64 => ("i64", 1, 8, false),
            Q4_0 => ("q4_0", 32, 2 + 16, true),
            Q4_1 => ("q4_1", 32, 2 + 2 + 16, true),
            Q5_0 => ("q5_0", 32, 2 + 4 + 16, true),
            Q5_1 => ("q5_1", 32, 2 + 2 + 4 + 16, true),
            Q8_0 => ("q8_0", 32, 2 + 32, true),
            Q8_1 => ("q8_1", 32, 2 + 2 + 32, true),
            Q2K => ("q2_K", QK_K, QK_K / 16 + QK_K / 4 + 2 + 2, true),
            Q3K => ("q3_K", QK_K, QK_K / 8 + QK_K / 4 + 12 + 2, true),
            Q4K => ("q4_K", QK_K, 2 + 2 + 12 + QK_K / 2, true),
            Q5K => ("q5_K", QK_K, 2 + 2 + 12 + QK_K / 8 + QK_K / 2, true),
            Q6K => ("q6_K", QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2, true),
            Q8K => ("q8_K", QK_K, 4 + QK_K + QK_K / 16 * 2, true),
            IQ2XXS => ("iq2_xxs", QK_K, 2 + QK_K / 8 * 2, true),
            IQ2XS => ("iq2_xs", QK_K, 2 + QK_K / 8 * 2 + QK_K / 32, true),
            IQ2S => ("iq2_s", QK_K, 2 + QK_K / 4 + QK_K / 16, true),
            IQ3XXS => ("iq3_xxs", QK_K, 2 + QK_K / 4 + QK_K / 8, true),
            IQ3S => ("iq3_s", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4, true),
            IQ1S => ("iq1_s", QK_K, 2 + QK_K / 8 + QK_K / 16, true),
            IQ1M => ("iq1_m", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32, true),
            IQ4NL => ("iq4_nl", 32, 2 + 16, true),
            IQ4XS => ("iq4_xs", QK_K, 2 + 2 + QK_K / 64 + QK_K / 2, true),
            TQ1_0 => (
                "tq1_0",
                QK_K,
                (QK_K - 4 * QK_K / 64) / 5 + 4 * QK_K / 64 / 4 + 2,
                true,
            ),
            TQ2_0 => ("tq2_0", QK_K, QK_K / 4 + 2, true),
            MXFP4 => ("mxfp4", 32, 1 + 16, true),
            NVFP4 => ("nvfp4", 64, 4 + 32, true),
            Q1_0 => ("q1_0", 128, 2 + 16, true),
            Q2_0 => ("q2_0", 64, 2 + 16, true),
        };
        TypeTraits {
            name,
            block_size,
            type_size,
            quantized,
        }
    }

    pub fn name(self) -> &'static str {
        self.traits().name
    }
    pub fn block_size(self) -> usize {
        self.traits().block_size
    }
    pub fn type_size(self) -> usize {
        self.traits().type_size
    }
    pub fn is_quantized(self) -> bool {
        self.traits().quantized
    }
    /// f32, f16, bf16 or f64.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }
    pub fn is_int(self) -> bool {
        matches!(self, DType::I8 | DType::I16 | DType::I32 | DType::I64)
    }

    /// Bytes taken by `n` elements (one row of `n`), or `None` when `n` is not a whole number of
    /// blocks or the size overflows.
    pub fn row_size(self, n: usize) -> Option<usize> {
        let t = self.traits();
        if !n.is_multiple_of(t.block_size) {
            return None;
        }
        (n / t.block_size).checked_mul(t.type_size)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_names_are_unique() {
        for t in DType::ALL {
            assert_eq!(DType::from_id(t.id()), Some(t));
            assert_eq!(DType::from_name(t.name()), Some(t));
        }
        for bad in [4u32, 5, 31, 32, 33, 36, 37, 38, 43, 1000] {
            assert_eq!(DType::from_id(bad), None, "id {bad}");
        }
    }

    #[test]
    fn block_sizes_match_ggml() {
        // Sizes from ggml-common.h's static asserts.
        assert_eq!(DType::Q4_0.type_size(), 18);
        assert_eq!(DType::Q4_1.type_size(), 20);
        assert_eq!(DType::Q5_0.type_size(), 22);
        assert_eq!(DType::Q5_1.type_size(), 24);
        assert_eq!(DType::Q8_0.type_size(), 34);
        assert_eq!(DType::Q8_1.type_size(), 36);
        assert_eq!(DType::Q2K.type_size(), 84);
        assert_eq!(DType::Q3K.type_size(), 110);
        assert_eq!(DType::Q4K.type_size(), 144);
        assert_eq!(DType::Q5K.type_size(), 176);
        assert_eq!(DType::Q6K.type_size(), 210);
        assert_eq!(DType::Q8K.type_size(), 292);
        assert_eq!(DType::IQ4XS.type_size(), 136);
        assert_eq!(DType::TQ1_0.type_size(), 54);
        assert_eq!(DType::TQ2_0.type_size(), 66);
        assert_eq!(DType::Q4_0.row_size(64), Some(36));
        assert_eq!(DType::Q4_0.row_size(33), None);
    }
}
