//! SentencePiece-style BPE by token scores (llama.cpp's `llm_tokenizer_spm_session`).
//!
//! The text (spaces already escaped to `▁`) starts as one symbol per character. Every adjacent
//! pair whose concatenation is a token goes into a priority queue ordered by that token's score
//! (highest first, then leftmost); the best pair is merged, stale entries are skipped, and the
//! new neighbours are queued. A final symbol that is not a token is emitted as byte tokens
//! (`<0xXX>`).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

struct Symbol {
    start: usize,
    len: usize,
    prev: isize,
    next: isize,
}

struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Greater = popped first: higher score, then smaller left index. Scores compare as
    /// llama.cpp's `<` does (NaN and ±0 as equal).
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Appends the tokens of `text` to `out`. `score(id)` gives a token's score; `byte_token(b)`
/// the token for a byte no token covers (if there is one).
pub(crate) fn encode(
    text: &str,
    token_to_id: &HashMap<String, u32>,
    score: impl Fn(u32) -> f32,
    byte_token: impl Fn(u8) -> Option<u32>,
    out: &mut Vec<u32>,
) {
    if text.is_empty() {
        return;
    }
    let mut syms: Vec<Symbol> = Vec::with_capacity(text.len());
    for (i, (start, c)) in text.char_indices().enumerate() {
        syms.push(Symbol {
            start,
            len: c.len_utf8(),
            prev: i as isize - 1,
            next: i as isize + 1,
        });
    }
    let n = syms.len();
    syms[n - 1].next = -1;

    let mut queue = BinaryHeap::new();
    let try_add = |queue: &mut BinaryHeap<Bigram>, syms: &[Symbol], left: isize, right: isize| {
        if left < 0 || right < 0 {
            return;
        }
        let (l, r) = (&syms[left as usize], &syms[right as usize]);
        let size = l.len + r.len;
        let piece = &text[l.start..l.start + size];
        if let Some(&id) = token_to_id.get(piece) {
            queue.push(Bigram {
                score: score(id),
                left: left as usize,
                right: right as usize,
                size,
            });
        }
    };
    for i in 1..n {
        try_add(&mut queue, &syms, i as isize - 1, i as isize);
    }
    while let Some(b) = queue.pop() {
        let (l, r) = (syms[b.left].len, syms[b.right].len);
        if l == 0 || r == 0 || l + r != b.size {
            continue;
        }
        syms[b.left].len += r;
        syms[b.right].len = 0;
        let next = syms[b.right].next;
        syms[b.left].next = next;
        if next >= 0 {
            syms[next as usize].prev = b.left as isize;
        }
        let prev = syms[b.left].prev;
        try_add(&mut queue, &syms, prev, b.left as isize);
        try_add(&mut queue, &syms, b.left as isize, next);
    }

    let mut i = 0isize;
    while i >= 0 {
        let s = &syms[i as usize];
        let piece = &text[s.start..s.start + s.len];
        match token_to_id.get(piece) {
            Some(&id) => out.push(id),
            None => out.extend(piece.bytes().filter_map(&byte_token)),
        }
        i = s.next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_by_score() {
        let toks = ["▁", "a", "b", "c", "ab", "bc", "▁a", "<0x78>"];
        let scores = [-1.0, -1.0, -1.0, -1.0, -2.0, -1.5, -3.0, 0.0];
        let v: HashMap<String, u32> = toks
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), i as u32))
            .collect();
        let byte_token = |b: u8| v.get(&format!("<0x{b:02X}>")).copied();
        let mut out = Vec::new();
        // "bc" (-1.5) beats "ab" (-2); then "▁a" (-3) merges
        encode("▁abc", &v, |id| scores[id as usize], byte_token, &mut out);
        assert_eq!(out, [6, 5]);
        // unknown characters fall back to byte tokens (only 'x' has one here)
        let mut out = Vec::new();
        encode("ax", &v, |id| scores[id as usize], byte_token, &mut out);
        assert_eq!(out, [1, 7]);
    }
}
