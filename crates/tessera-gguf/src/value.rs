//! Metadata value types and values.

use std::fmt;

/// The type of a metadata value, with GGUF's on-disk ids (`enum gguf_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    /// Every value type, in id order.
    pub const ALL: [ValueType; 13] = [
        ValueType::U8,
        ValueType::I8,
        ValueType::U16,
        ValueType::I16,
        ValueType::U32,
        ValueType::I32,
        ValueType::F32,
        ValueType::Bool,
        ValueType::String,
        ValueType::Array,
        ValueType::U64,
        ValueType::I64,
        ValueType::F64,
    ];

    /// The type with on-disk id `id`, or `None` for an unknown id.
    pub fn from_id(id: u32) -> Option<ValueType> {
        ValueType::ALL.get(id as usize).copied()
    }

    /// The on-disk id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Short lowercase name: `u8`, `i32`, `f64`, `bool`, `string`, `array`.
    pub fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
            ValueType::String => "string",
            ValueType::Array => "array",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
        }
    }

    /// Bytes one value of this type takes on disk, for fixed-size types; `None` for strings
    /// and arrays.
    pub fn fixed_size(self) -> Option<usize> {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => Some(1),
            ValueType::U16 | ValueType::I16 => Some(2),
            ValueType::U32 | ValueType::I32 | ValueType::F32 => Some(4),
            ValueType::U64 | ValueType::I64 | ValueType::F64 => Some(8),
            ValueType::String | ValueType::Array => None,
        }
    }

    /// The fewest bytes one value of this type can take on disk (a string: its 8-byte length;
    /// an array: element type and count).
    pub(crate) fn min_size(self) -> usize {
        match self {
            ValueType::String => 8,
            ValueType::Array => 12,
            t => t.fixed_size().unwrap_or(1),
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value.
///
/// `Array` holds its element type (so that an empty array keeps it) and its elements, which are
/// all of that type; GGUF has no arrays of arrays.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// Element type, elements.
    Array(ValueType, Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// This value's type (`ValueType::Array` for arrays, whatever their element type).
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(..) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The string, if this is a `String`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// Any integer (signed or unsigned) that is `>= 0`, as `u64`.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer (signed or unsigned) that fits in `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => i64::try_from(v).ok(),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => None,
        }
    }

    /// Any number (integer or float) as `f64` (64-bit integers may round).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            Value::U64(v) => Some(v as f64),
            Value::I64(v) => Some(v as f64),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// The bool, if this is a `Bool`.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The elements, if this is an `Array`.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(_, v) => Some(v),
            _ => None,
        }
    }

    /// The element type, if this is an `Array`.
    pub fn array_type(&self) -> Option<ValueType> {
        match self {
            Value::Array(t, _) => Some(*t),
            _ => None,
        }
    }

    /// A type description: `u32`, `string`, or `[i32; 5]` for an array.
    pub fn type_description(&self) -> String {
        match self {
            Value::Array(t, v) => format!("[{t}; {}]", v.len()),
            v => v.value_type().name().to_string(),
        }
    }
}

/// Arrays with more elements than this are shortened by `Display`.
const DISPLAY_MAX_ELEMS: usize = 8;
/// Elements shown of a shortened array.
const DISPLAY_SHOWN_ELEMS: usize = 5;
/// Strings longer than this (in chars) are shortened by `Display`.
const DISPLAY_MAX_CHARS: usize = 200;

fn fmt_string(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    let n = s.chars().count();
    if n <= DISPLAY_MAX_CHARS {
        write!(f, "\"{}\"", s.escape_debug())
    } else {
        let head: String = s.chars().take(DISPLAY_MAX_CHARS).collect();
        write!(f, "\"{}\"... ({} bytes)", head.escape_debug(), s.len())
    }
}

/// Human-readable form, as `dump` prints it: strings quoted and escaped (long ones cut),
/// floats in their shortest exact form, arrays longer than 8 elements shortened to
/// `[a, b, c, d, e, ... (N total)]`.
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            // Debug prints the shortest round-tripping form, with an exponent for huge/tiny values.
            Value::F32(v) => write!(f, "{v:?}"),
            Value::F64(v) => write!(f, "{v:?}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(s) => fmt_string(f, s),
            Value::Array(_, v) => {
                let shown = if v.len() > DISPLAY_MAX_ELEMS {
                    DISPLAY_SHOWN_ELEMS
                } else {
                    v.len()
                };
                f.write_str("[")?;
                for (i, e) in v[..shown].iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{e}")?;
                }
                if shown < v.len() {
                    write!(f, ", ... ({} total)", v.len())?;
                }
                f.write_str("]")
            }
        }
    }
}

macro_rules! from_impl {
    ($($t:ty => $v:ident),* $(,)?) => {$(
        impl From<$t> for Value {
            fn from(x: $t) -> Value {
                Value::$v(x)
            }
        }
    )*};
}

from_impl!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, String => String, u64 => U64, i64 => I64, f64 => F64);

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::String(s.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for t in ValueType::ALL {
            assert_eq!(ValueType::from_id(t.id()), Some(t));
        }
        assert_eq!(ValueType::from_id(13), None);
        assert_eq!(ValueType::from_id(u32::MAX), None);
    }

    #[test]
    fn accessors() {
        assert_eq!(Value::I8(-1).as_u64(), None);
        assert_eq!(Value::I8(5).as_u64(), Some(5));
        assert_eq!(Value::U64(u64::MAX).as_u64(), Some(u64::MAX));
        assert_eq!(Value::U64(u64::MAX).as_i64(), None);
        assert_eq!(Value::I64(-7).as_i64(), Some(-7));
        assert_eq!(Value::U16(7).as_f64(), Some(7.0));
        assert_eq!(Value::F32(0.5).as_f64(), Some(0.5));
        assert_eq!(Value::Bool(true).as_f64(), None);
        assert_eq!(Value::Bool(true).as_bool(), Some(true));
        assert_eq!(Value::from("x").as_str(), Some("x"));
        assert_eq!(Value::U8(1).as_str(), None);
        let a = Value::Array(ValueType::U8, vec![Value::U8(1)]);
        assert_eq!(a.as_array(), Some(&[Value::U8(1)][..]));
        assert_eq!(a.value_type(), ValueType::Array);
        assert_eq!(a.array_type(), Some(ValueType::U8));
    }

    #[test]
    fn display() {
        assert_eq!(Value::from("a\"b\n").to_string(), r#""a\"b\n""#);
        assert_eq!(Value::F64(-2.5e300).to_string(), "-2.5e300");
        assert_eq!(Value::F32(3.25).to_string(), "3.25");
        let short = Value::Array(ValueType::I32, (1..=8).map(Value::I32).collect());
        assert_eq!(short.to_string(), "[1, 2, 3, 4, 5, 6, 7, 8]");
        let long = Value::Array(ValueType::I32, (1..=9).map(Value::I32).collect());
        assert_eq!(long.to_string(), "[1, 2, 3, 4, 5, ... (9 total)]");
        assert_eq!(long.type_description(), "[i32; 9]");
        let s = "x".repeat(300);
        assert!(Value::String(s).to_string().ends_with("... (300 bytes)"));
    }
}
