//! Pre-tokenizers of byte-level BPE: the regular expressions llama.cpp runs over the text before
//! BPE merging, written out as hand-made splitters.
//!
//! llama.cpp's `unicode_regex_split` applies a list of regular expressions in turn. The text
//! starts as one chunk; each expression splits every chunk into its matches *and* the text
//! between them (which become chunks of their own), and the next expression sees those chunks,
//! never looking across their borders. The expressions llama.cpp has custom code for (GPT-2's,
//! llama3's, qwen2's, qwen3.5's) are implemented here following that code; the simple ones it
//! runs through `std::regex` on a "collapsed" text (`\p{N}`, `[\p{P}\$\+<=>\^~\|]+`, `\p{N}+`,
//! `[0-9][0-9][0-9]`) are character-class runs. Chunks are ranges of char indices.

use super::unicode::{Class, Flags};

/// Char-index range `[start, end)` of one chunk.
pub(crate) type Chunk = (usize, usize);

/// One regular expression of a pre-tokenizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+` (GPT-2).
    Gpt2,
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    /// with `D = max_digits` (llama3: 3, qwen2: 1); with `marks`, `\p{L}` becomes `[\p{L}\p{M}]`
    /// in the letter run and `\p{M}` joins the excluded classes of the symbol run (qwen3.5).
    Llama3 { max_digits: usize, marks: bool },
    /// Each number character on its own: `\p{N}`.
    EachNumber,
    /// Runs of number characters: `\p{N}+`.
    NumberRuns,
    /// Runs of punctuation and `$+<=>^~|` (plus `` ` `` with `backtick`):
    /// `[\p{P}\$\+<=>\^~\|]+` (default) or ``[\p{P}\$\+<=>\^~\|`]+`` (falcon).
    PunctuationRuns { backtick: bool },
    /// `[0-9][0-9][0-9]`: ASCII digit triples, leftmost first.
    AsciiDigitTriples,
}

/// The pre-tokenizers of `tokenizer.ggml.pre` that are supported, with llama.cpp's options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PreTokenizer {
    /// llama.cpp's `LLAMA_VOCAB_PRE_TYPE_*`, lower case, for messages.
    pub kind: &'static str,
    pub steps: &'static [Step],
    /// Emit a word that is a whole vocabulary token as that token, without merging.
    pub ignore_merges: bool,
    /// Default of `add_bos` before `tokenizer.ggml.add_bos_token` overrides it.
    pub add_bos: bool,
}

const GPT2: &[Step] = &[Step::Gpt2];
const STARCODER: &[Step] = &[Step::EachNumber, Step::Gpt2];
const LLAMA3: &[Step] = &[Step::Llama3 {
    max_digits: 3,
    marks: false,
}];
const QWEN2: &[Step] = &[Step::Llama3 {
    max_digits: 1,
    marks: false,
}];
const QWEN35: &[Step] = &[Step::Llama3 {
    max_digits: 1,
    marks: true,
}];
const DEFAULT: &[Step] = &[
    Step::PunctuationRuns { backtick: false },
    Step::Gpt2,
    Step::NumberRuns,
    Step::AsciiDigitTriples,
];
const FALCON: &[Step] = &[
    Step::PunctuationRuns { backtick: true },
    Step::Gpt2,
    Step::AsciiDigitTriples,
];

/// `tokenizer.ggml.pre` values supported, grouped by the pre-tokenizer they select in llama.cpp.
pub(crate) const SUPPORTED: &[(&[&str], PreTokenizer)] = &[
    (
        &["default"],
        PreTokenizer {
            kind: "default",
            steps: DEFAULT,
            ignore_merges: false,
            add_bos: false,
        },
    ),
    (
        &[
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "exaone4",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
        ],
        PreTokenizer {
            kind: "gpt2",
            steps: GPT2,
            ignore_merges: false,
            add_bos: false,
        },
    ),
    (
        &[
            "starcoder",
            "refact",
            "command-r",
            "smollm",
            "codeshell",
            "exaone",
            "minerva-7b",
            "mellum2",
        ],
        PreTokenizer {
            kind: "starcoder",
            steps: STARCODER,
            ignore_merges: false,
            add_bos: false,
        },
    ),
    (
        &[
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ],
        PreTokenizer {
            kind: "llama3",
            steps: LLAMA3,
            ignore_merges: true,
            add_bos: true,
        },
    ),
    (
        &["dbrx", "smaug-bpe"],
        PreTokenizer {
            kind: "dbrx",
            steps: LLAMA3,
            ignore_merges: false,
            add_bos: false,
        },
    ),
    (
        &[
            "qwen2",
            "deepseek-r1-qwen",
            "kormo",
            "f2llmv2",
            "stablelm2",
            "hunyuan",
            "solar-open",
            "megrez",
            "grok-2",
        ],
        PreTokenizer {
            kind: "qwen2",
            steps: QWEN2,
            ignore_merges: false,
            add_bos: false,
        },
    ),
    (
        &["qwen35"],
        PreTokenizer {
            kind: "qwen35",
            steps: QWEN35,
            ignore_merges: false,
            add_bos: false,
        },
    ),
    (
        &["falcon"],
        PreTokenizer {
            kind: "falcon",
            steps: FALCON,
            ignore_merges: false,
            add_bos: false,
        },
    ),
];

impl PreTokenizer {
    /// The pre-tokenizer for a `tokenizer.ggml.pre` value; a missing value means `default`, as
    /// in llama.cpp.
    pub fn by_name(name: Option<&str>) -> Option<PreTokenizer> {
        let name = name.unwrap_or("default");
        SUPPORTED
            .iter()
            .find(|(names, _)| names.contains(&name))
            .map(|&(_, p)| p)
    }

    /// Comma-separated list of the supported names.
    pub fn supported_names() -> String {
        let names: Vec<&str> = SUPPORTED
            .iter()
            .flat_map(|(n, _)| n.iter().copied())
            .collect();
        names.join(", ")
    }

    /// Splits `text` into words (as `&str` slices of it, in order, covering all of it).
    pub fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let cps: Vec<char> = text.chars().collect();
        let chunks = split_chars(&cps, self.steps);
        // Char index -> byte offset.
        let mut byte_at = Vec::with_capacity(cps.len() + 1);
        byte_at.extend(text.char_indices().map(|(i, _)| i));
        byte_at.push(text.len());
        chunks
            .iter()
            .map(|&(a, b)| &text[byte_at[a]..byte_at[b]])
            .collect()
    }
}

/// Applies `steps` in turn to the whole of `cps`.
pub(crate) fn split_chars(cps: &[char], steps: &[Step]) -> Vec<Chunk> {
    let mut chunks = if cps.is_empty() {
        Vec::new()
    } else {
        vec![(0, cps.len())]
    };
    for &step in steps {
        let mut out = Vec::with_capacity(chunks.len() * 2);
        for &(a, b) in &chunks {
            match step {
                Step::Gpt2 => split_gpt2(cps, a, b, &mut out),
                Step::Llama3 { max_digits, marks } => {
                    split_llama3(cps, a, b, max_digits, marks, &mut out)
                }
                Step::EachNumber => {
                    split_class(cps, a, b, |c| Flags::of(c).number(), false, &mut out)
                }
                Step::NumberRuns => {
                    split_class(cps, a, b, |c| Flags::of(c).number(), true, &mut out)
                }
                Step::PunctuationRuns { backtick } => split_class(
                    cps,
                    a,
                    b,
                    |c| is_punctuation_like(c, backtick),
                    true,
                    &mut out,
                ),
                Step::AsciiDigitTriples => split_ascii_digit_triples(cps, a, b, &mut out),
            }
        }
        chunks = out;
    }
    chunks
}

/// `[\p{P}\$\+<=>\^~\|]` (and `` ` `` with `backtick`) as llama.cpp evaluates it: on its
/// collapsed text, where a non-ASCII whitespace character is never punctuation.
fn is_punctuation_like(c: char, backtick: bool) -> bool {
    matches!(c, '$' | '+' | '<' | '=' | '>' | '^' | '~' | '|')
        || (backtick && c == '`')
        || (Flags::of(c).class == Class::Punctuation && !Flags::of(c).whitespace)
}

/// Cursor over one chunk: positions outside `[a, b)` read as "nothing", like llama.cpp's
/// `OUT_OF_RANGE` code point with empty flags.
struct Cursor<'c> {
    cps: &'c [char],
    end: usize,
}

impl Cursor<'_> {
    fn get(&self, pos: usize) -> Option<char> {
        if pos < self.end {
            Some(self.cps[pos])
        } else {
            None
        }
    }
    fn flags(&self, pos: usize) -> Option<Flags> {
        self.get(pos).map(Flags::of)
    }
    fn is(&self, pos: usize, pred: impl Fn(Flags) -> bool) -> bool {
        self.flags(pos).is_some_and(pred)
    }
    /// Length of the contraction (`'s 't 'm 'd 're 've 'll`) starting at `pos`, if any.
    fn contraction(&self, pos: usize, ignore_case: bool) -> Option<usize> {
        if self.get(pos) != Some('\'') {
            return None;
        }
        let lower = |c: Option<char>| {
            c.map(|c| {
                if ignore_case {
                    c.to_ascii_lowercase()
                } else {
                    c
                }
            })
        };
        let n1 = lower(self.get(pos + 1))?;
        if matches!(n1, 's' | 't' | 'm' | 'd') {
            return Some(2);
        }
        let n2 = lower(self.get(pos + 2))?;
        match (n1, n2) {
            ('r', 'e') | ('v', 'e') | ('l', 'l') => Some(3),
            _ => None,
        }
    }
    /// Whitespace run at `pos`: its length and the end of its last `\r`/`\n` (0 if none).
    fn whitespace_run(&self, pos: usize) -> (usize, usize) {
        let mut n = 0;
        let mut last_newline_end = 0;
        while self.is(pos + n, |f| f.whitespace) {
            if matches!(self.cps[pos + n], '\r' | '\n') {
                last_newline_end = pos + n + 1;
            }
            n += 1;
        }
        (n, last_newline_end)
    }
}

/// GPT-2's expression, as llama.cpp's `unicode_regex_split_custom_gpt2`.
fn split_gpt2(cps: &[char], a: usize, b: usize, out: &mut Vec<Chunk>) {
    let cur = Cursor { cps, end: b };
    let mut start = a;
    let mut pos = a;
    let mut emit = |end: usize, start: &mut usize| {
        if end > *start {
            out.push((*start, end));
        }
        *start = end;
    };
    while pos < b {
        let c = cps[pos];
        // 's|'t|'re|'ve|'m|'ll|'d
        if let Some(n) = cur.contraction(pos, false) {
            pos += n;
            emit(pos, &mut start);
            continue;
        }
        // The class tests look at the character after an optional leading space.
        let lead = if c == ' ' { pos + 1 } else { pos };
        let skip_space = (c == ' ') as usize;
        // <space>?\p{L}+
        if cur.is(lead, Flags::letter) {
            pos += skip_space;
            while cur.is(pos, Flags::letter) {
                pos += 1;
            }
            emit(pos, &mut start);
            continue;
        }
        // <space>?\p{N}+
        if cur.is(lead, Flags::number) {
            pos += skip_space;
            while cur.is(pos, Flags::number) {
                pos += 1;
            }
            emit(pos, &mut start);
            continue;
        }
        // <space>?[^\s\p{L}\p{N}]+
        let symbol = |f: Flags| !(f.whitespace || f.letter() || f.number());
        if cur.is(lead, symbol) {
            pos += skip_space;
            while cur.is(pos, symbol) {
                pos += 1;
            }
            emit(pos, &mut start);
            continue;
        }
        let (n_ws, _) = cur.whitespace_run(pos);
        // \s+(?!\S): all but the last whitespace when a non-whitespace follows in the chunk
        if n_ws > 1 && cur.get(pos + n_ws).is_some() {
            pos += n_ws - 1;
            emit(pos, &mut start);
            continue;
        }
        // \s+
        if n_ws > 0 {
            pos += n_ws;
            emit(pos, &mut start);
            continue;
        }
        // no match (unreachable: every character is one of the above)
        pos += 1;
        emit(pos, &mut start);
    }
}

/// The llama3 family's expression, as llama.cpp's `unicode_regex_split_custom_llama3`
/// (`max_digits` 3), `_qwen2` (1) and `_qwen35` (1, `marks`).
fn split_llama3(
    cps: &[char],
    a: usize,
    b: usize,
    max_digits: usize,
    marks: bool,
    out: &mut Vec<Chunk>,
) {
    let cur = Cursor { cps, end: b };
    let mut start = a;
    let mut pos = a;
    let mut emit = |end: usize, start: &mut usize| {
        if end > *start {
            out.push((*start, end));
        }
        *start = end;
    };
    let word = |f: Flags| f.letter() || (marks && f.mark());
    let symbol = |f: Flags| !(f.whitespace || f.letter() || f.number() || (marks && f.mark()));
    while pos < b {
        let c = cps[pos];
        let flags = Flags::of(c);
        // (?i:'s|'t|'re|'ve|'m|'ll|'d)
        if let Some(n) = cur.contraction(pos, true) {
            pos += n;
            emit(pos, &mut start);
            continue;
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if !(c == '\r' || c == '\n' || flags.number()) && (word(flags) || cur.is(pos + 1, word)) {
            pos += 1;
            while cur.is(pos, word) {
                pos += 1;
            }
            emit(pos, &mut start);
            continue;
        }
        // \p{N}{1,max_digits}
        if flags.number() {
            let mut group = pos;
            while cur.is(pos, Flags::number) {
                pos += 1;
                if pos - group >= max_digits {
                    emit(pos, &mut start);
                    group = pos;
                }
            }
            emit(pos, &mut start);
            continue;
        }
        // <space>?[^\s\p{L}\p{N}]+[\r\n]*
        let lead = if c == ' ' {
            cur.flags(pos + 1)
        } else {
            Some(flags)
        };
        // (llama.cpp tests the class of the character after the space, or the empty flags past
        // the chunk's end, which pass; the run itself then stops at the end)
        if lead.is_none_or(symbol) {
            pos += (c == ' ') as usize;
            while cur.is(pos, symbol) {
                pos += 1;
            }
            while matches!(cur.get(pos), Some('\r' | '\n')) {
                pos += 1;
            }
            emit(pos, &mut start);
            continue;
        }
        let (n_ws, last_newline_end) = cur.whitespace_run(pos);
        // \s*[\r\n]+
        if last_newline_end > 0 {
            pos = last_newline_end;
            emit(pos, &mut start);
            continue;
        }
        // \s+(?!\S)
        if n_ws > 1 && cur.get(pos + n_ws).is_some() {
            pos += n_ws - 1;
            emit(pos, &mut start);
            continue;
        }
        // \s+
        if n_ws > 0 {
            pos += n_ws;
            emit(pos, &mut start);
            continue;
        }
        // no match (unreachable)
        pos += 1;
        emit(pos, &mut start);
    }
}

/// Splits `[a, b)` into characters matching `pred` (maximal runs if `runs`, else one chunk per
/// character) and the runs of other characters between them.
fn split_class(
    cps: &[char],
    a: usize,
    b: usize,
    pred: impl Fn(char) -> bool,
    runs: bool,
    out: &mut Vec<Chunk>,
) {
    let mut pos = a;
    while pos < b {
        let start = pos;
        if pred(cps[pos]) {
            pos += 1;
            if runs {
                while pos < b && pred(cps[pos]) {
                    pos += 1;
                }
            }
        } else {
            while pos < b && !pred(cps[pos]) {
                pos += 1;
            }
        }
        out.push((start, pos));
    }
}

/// `[0-9][0-9][0-9]`: leftmost non-overlapping ASCII digit triples, and the text between them.
fn split_ascii_digit_triples(cps: &[char], a: usize, b: usize, out: &mut Vec<Chunk>) {
    let triple_at = |p: usize| p + 3 <= b && cps[p..p + 3].iter().all(|c| c.is_ascii_digit());
    let mut gap_start = a;
    let mut pos = a;
    while pos < b {
        if triple_at(pos) {
            if pos > gap_start {
                out.push((gap_start, pos));
            }
            out.push((pos, pos + 3));
            pos += 3;
            gap_start = pos;
        } else {
            pos += 1;
        }
    }
    if b > gap_start {
        out.push((gap_start, b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(steps: &'static [Step], text: &str) -> Vec<String> {
        let p = PreTokenizer {
            kind: "test",
            steps,
            ignore_merges: false,
            add_bos: false,
        };
        p.split(text).into_iter().map(String::from).collect()
    }

    #[test]
    fn gpt2_words_and_spaces() {
        assert_eq!(
            split(GPT2, "Hello world, it's 2024!"),
            ["Hello", " world", ",", " it", "'s", " 2024", "!"]
        );
        // \s+(?!\S): a run of spaces before a word leaves its last space to the word
        assert_eq!(split(GPT2, "a   b"), ["a", "  ", " b"]);
        // trailing whitespace stays one chunk
        assert_eq!(split(GPT2, "a   "), ["a", "   "]);
        assert_eq!(split(GPT2, " "), [" "]);
        // newlines are whitespace like any other; a single one before a word is its own chunk
        assert_eq!(split(GPT2, "a\n\nb"), ["a", "\n", "\n", "b"]);
        assert_eq!(split(GPT2, "a \nb"), ["a", " ", "\n", "b"]);
        // contractions are case-sensitive in GPT-2's expression
        assert_eq!(split(GPT2, "IT'S"), ["IT", "'", "S"]);
        assert_eq!(split(GPT2, "we'll've"), ["we", "'ll", "'ve"]);
        assert_eq!(split(GPT2, " ++x"), [" ++", "x"]);
        assert_eq!(split(GPT2, "Führer 3½"), ["Führer", " 3½"]);
        assert_eq!(split(GPT2, "🦙🦙 x"), ["🦙🦙", " x"]);
        assert!(split(GPT2, "").is_empty());
    }

    #[test]
    fn starcoder_isolates_digits() {
        // smollm, starcoder, refact, command-r: \p{N} first, then GPT-2's expression per chunk
        assert_eq!(
            split(STARCODER, "abc 1234x"),
            ["abc", " ", "1", "2", "3", "4", "x"]
        );
        assert_eq!(split(STARCODER, "a  1"), ["a", "  ", "1"]);
        assert_eq!(split(STARCODER, "x²"), ["x", "²"]);
    }

    #[test]
    fn llama3_expression() {
        assert_eq!(
            split(LLAMA3, "Hello world, IT'S 12345!"),
            ["Hello", " world", ",", " IT", "'S", " ", "123", "45", "!"]
        );
        // one non-letter, non-number, non-newline character joins the following letters
        assert_eq!(split(LLAMA3, "(hello)"), ["(hello", ")"]);
        assert_eq!(split(LLAMA3, "\tword"), ["\tword"]);
        // whitespace runs ending in newlines; \s+(?!\S)
        assert_eq!(split(LLAMA3, "a \n\n b"), ["a", " \n\n", " b"]);
        assert_eq!(split(LLAMA3, "a    b"), ["a", "   ", " b"]);
        assert_eq!(split(LLAMA3, "x  "), ["x", "  "]);
        // punctuation run takes trailing newlines
        assert_eq!(split(LLAMA3, "end.\n\nNext"), ["end", ".\n\n", "Next"]);
        assert_eq!(split(LLAMA3, " ?!"), [" ?!"]);
        assert_eq!(split(LLAMA3, "x "), ["x", " "]);
        assert_eq!(split(LLAMA3, "1234567"), ["123", "456", "7"]);
    }

    #[test]
    fn qwen2_single_digits_and_qwen35_marks() {
        assert_eq!(split(QWEN2, "ab 123"), ["ab", " ", "1", "2", "3"]);
        // a combining mark splits a letter run in qwen2, joins it in qwen3.5
        let s = "cafe\u{301}s";
        assert_eq!(split(QWEN2, s), ["cafe", "\u{301}s"]);
        assert_eq!(split(QWEN35, s), [s]);
    }

    #[test]
    fn default_and_falcon_steps() {
        // default: punctuation runs first, then GPT-2, number runs, ASCII digit triples
        assert_eq!(
            split(DEFAULT, "it's 12345 $x"),
            ["it", "'", "s", " ", "123", "45", " ", "$", "x"]
        );
        assert_eq!(split(FALCON, "a`b 1234"), ["a", "`", "b", " ", "123", "4"]);
    }

    #[test]
    fn class_and_triples() {
        let cps: Vec<char> = "ab12c3".chars().collect();
        let mut out = Vec::new();
        split_class(&cps, 0, cps.len(), |c| c.is_ascii_digit(), false, &mut out);
        assert_eq!(out, [(0, 2), (2, 3), (3, 4), (4, 5), (5, 6)]);
        let cps: Vec<char> = "x1234567y".chars().collect();
        let mut out = Vec::new();
        split_ascii_digit_triples(&cps, 0, cps.len(), &mut out);
        assert_eq!(out, [(0, 1), (1, 4), (4, 7), (7, 9)]);
    }
}
