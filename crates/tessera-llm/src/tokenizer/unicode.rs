//! Unicode character classes (as llama.cpp's `unicode_cpt_flags` uses them) and the GPT-2
//! byte-to-unicode alphabet of byte-level BPE.

use super::unicode_data::{CLASS_RANGES, WHITESPACE};

pub(super) use super::unicode_data::UNICODE_VERSION;

/// First letter of a code point's Unicode general category.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// C*: control, format, surrogate, private use and unassigned code points.
    Other,
    /// L*
    Letter,
    /// N*
    Number,
    /// M*
    Mark,
    /// P*
    Punctuation,
    /// S*
    Symbol,
    /// Z*
    Separator,
}

impl Class {
    fn from_code(code: u32) -> Class {
        match code {
            1 => Class::Letter,
            2 => Class::Number,
            3 => Class::Mark,
            4 => Class::Punctuation,
            5 => Class::Symbol,
            6 => Class::Separator,
            _ => Class::Other,
        }
    }
}

/// Class codes of the ASCII range, looked up without a search.
static ASCII_CLASS: [u8; 128] = {
    let mut t = [0u8; 128];
    let mut i = 0;
    while i < CLASS_RANGES.len() && (CLASS_RANGES[i] >> 3) < 128 {
        let end = if i + 1 < CLASS_RANGES.len() && (CLASS_RANGES[i + 1] >> 3) < 128 {
            CLASS_RANGES[i + 1] >> 3
        } else {
            128
        };
        let mut cp = CLASS_RANGES[i] >> 3;
        while cp < end {
            t[cp as usize] = (CLASS_RANGES[i] & 7) as u8;
            cp += 1;
        }
        i += 1;
    }
    t
};

/// The general-category class of `c`.
pub(crate) fn class(c: char) -> Class {
    let cp = c as u32;
    if cp < 128 {
        return Class::from_code(ASCII_CLASS[cp as usize] as u32);
    }
    // Index of the last range starting at or before `cp` (the first range starts at 0).
    let i = CLASS_RANGES.partition_point(|&w| (w >> 3) <= cp);
    Class::from_code(CLASS_RANGES[i - 1] & 7)
}

/// Unicode White_Space (llama.cpp's `is_whitespace`, regex `\s`).
pub(crate) fn is_whitespace(c: char) -> bool {
    let cp = c as u32;
    if cp < 0x80 {
        return matches!(cp, 0x09..=0x0D | 0x20);
    }
    WHITESPACE.binary_search(&cp).is_ok()
}

/// The classes and whitespace flag of one code point; what llama.cpp's splitters test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Flags {
    pub class: Class,
    pub whitespace: bool,
}

impl Flags {
    pub fn of(c: char) -> Flags {
        Flags {
            class: class(c),
            whitespace: is_whitespace(c),
        }
    }
    pub fn letter(self) -> bool {
        self.class == Class::Letter
    }
    pub fn number(self) -> bool {
        self.class == Class::Number
    }
    pub fn mark(self) -> bool {
        self.class == Class::Mark
    }
}

/// GPT-2's byte-to-unicode table: printable Latin-1 bytes stand for themselves, the other 68
/// bytes are mapped, in order, to U+0100..U+0143.
pub(crate) struct ByteAlphabet {
    to_char: [char; 256],
    /// Indexed by code point, for code points below 0x144; `u16::MAX` where no byte maps there.
    to_byte: [u16; 0x144],
}

impl ByteAlphabet {
    /// The (shared) table.
    pub fn get() -> &'static ByteAlphabet {
        static TABLE: std::sync::OnceLock<ByteAlphabet> = std::sync::OnceLock::new();
        TABLE.get_or_init(ByteAlphabet::new)
    }

    pub fn new() -> ByteAlphabet {
        let mut to_char = ['\0'; 256];
        let mut to_byte = [u16::MAX; 0x144];
        let mut n = 0u32;
        for b in 0..=255u32 {
            let printable = (0x21..=0x7E).contains(&b)
                || (0xA1..=0xAC).contains(&b)
                || (0xAE..=0xFF).contains(&b);
            let cp = if printable {
                b
            } else {
                n += 1;
                0x100 + n - 1
            };
            to_char[b as usize] = char::from_u32(cp).expect("valid code point");
            to_byte[cp as usize] = b as u16;
        }
        ByteAlphabet { to_char, to_byte }
    }

    /// The character standing for byte `b`.
    pub fn char_of(&self, b: u8) -> char {
        self.to_char[b as usize]
    }

    /// The byte that `c` stands for, if it is in the alphabet.
    pub fn byte_of(&self, c: char) -> Option<u8> {
        match self.to_byte.get(c as usize) {
            Some(&b) if b != u16::MAX => Some(b as u8),
            _ => None,
        }
    }

    /// `s`'s UTF-8 bytes, each replaced by its character.
    pub fn encode(&self, s: &str, out: &mut String) {
        out.clear();
        for &b in s.as_bytes() {
            out.push(self.char_of(b));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(class('a'), Class::Letter);
        assert_eq!(class('Z'), Class::Letter);
        assert_eq!(class('7'), Class::Number);
        assert_eq!(class('½'), Class::Number);
        assert_eq!(class('٣'), Class::Number);
        assert_eq!(class('\''), Class::Punctuation);
        assert_eq!(class('$'), Class::Symbol);
        assert_eq!(class('€'), Class::Symbol);
        assert_eq!(class(' '), Class::Separator);
        assert_eq!(class('\u{3000}'), Class::Separator);
        assert_eq!(class('\n'), Class::Other);
        assert_eq!(class('\u{0301}'), Class::Mark);
        assert_eq!(class('世'), Class::Letter);
        assert_eq!(class('🦙'), Class::Symbol);
        assert_eq!(class('\u{E000}'), Class::Other);
        assert_eq!(class('\u{10FFFF}'), Class::Other);
        assert_eq!(class('\u{0}'), Class::Other);
    }

    #[test]
    fn ascii_table_matches_ranges() {
        for cp in 0..128u32 {
            let i = CLASS_RANGES.partition_point(|&w| (w >> 3) <= cp);
            assert_eq!(
                ASCII_CLASS[cp as usize] as u32,
                CLASS_RANGES[i - 1] & 7,
                "{cp}"
            );
        }
    }

    #[test]
    fn whitespace() {
        for c in [
            '\t', '\n', '\u{b}', '\u{c}', '\r', ' ', '\u{85}', '\u{a0}', '\u{3000}',
        ] {
            assert!(is_whitespace(c), "{c:?}");
        }
        for c in ['a', '\u{1c}', '\u{1f}', '\u{200b}', '_', '\u{0}'] {
            assert!(!is_whitespace(c), "{c:?}");
        }
    }

    #[test]
    fn byte_alphabet_round_trips() {
        let a = ByteAlphabet::new();
        assert_eq!(a.char_of(b' '), 'Ġ');
        assert_eq!(a.char_of(b'\n'), 'Ċ');
        assert_eq!(a.char_of(b'a'), 'a');
        assert_eq!(a.char_of(0xAD), 'Ń');
        for b in 0..=255u8 {
            assert_eq!(a.byte_of(a.char_of(b)), Some(b));
        }
        assert_eq!(a.byte_of('世'), None);
        assert_eq!(a.byte_of(' '), None);
    }
}
