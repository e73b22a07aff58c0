//! Byte-level BPE merging of one pre-tokenized word (llama.cpp's `llm_tokenizer_bpe_session`).
//!
//! The word (already mapped to GPT-2's byte alphabet) starts as one symbol per character. All
//! adjacent pairs that have a merge rule go into a priority queue ordered by (rank, position of
//! the left symbol); the best pair is merged, its stale entries are skipped when they come up,
//! and the new neighbours are queued. Symbols are slices of the word, so looking a symbol up is
//! a hash lookup of a `&str`, without allocation. Merge rules are keyed by the ids of their two
//! sides: vocabulary ids, and ids past the vocabulary for the rare merge side that is not a
//! token, so that such rules still apply as they do in llama.cpp (which keys them by strings).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// Merge rules of a `gpt2` vocabulary.
pub(crate) struct Merges {
    /// (left piece id, right piece id) -> rank (index in `tokenizer.ggml.merges`; the first
    /// occurrence of a pair wins).
    ranks: HashMap<(u32, u32), u32>,
    /// Merge sides that are not vocabulary tokens -> ids from `n_vocab` up.
    extra_pieces: HashMap<String, u32>,
}

impl Merges {
    /// Parses merge rules `"left right"` (split at the first space after the first byte, as
    /// llama.cpp does; a rule without one can never apply and is skipped).
    pub fn new<'m>(
        rules: impl Iterator<Item = &'m str>,
        token_to_id: &HashMap<String, u32>,
        n_vocab: usize,
    ) -> Merges {
        let mut ranks = HashMap::new();
        let mut extra_pieces: HashMap<String, u32> = HashMap::new();
        for (rank, rule) in rules.enumerate() {
            let Some(pos) = rule.as_bytes().iter().skip(1).position(|&b| b == b' ') else {
                continue;
            };
            let (left, right) = (&rule[..pos + 1], &rule[pos + 2..]);
            if left.is_empty() || right.is_empty() {
                continue;
            }
            let mut id_of = |s: &str| -> u32 {
                if let Some(&id) = token_to_id.get(s) {
                    return id;
                }
                let next = (n_vocab + extra_pieces.len()) as u32;
                *extra_pieces.entry(s.to_string()).or_insert(next)
            };
            let key = (id_of(left), id_of(right));
            ranks.entry(key).or_insert(rank as u32);
        }
        Merges {
            ranks,
            extra_pieces,
        }
    }

    pub fn len(&self) -> usize {
        self.ranks.len()
    }

    fn piece_id(&self, s: &str, token_to_id: &HashMap<String, u32>) -> Option<u32> {
        token_to_id
            .get(s)
            .or_else(|| self.extra_pieces.get(s))
            .copied()
    }

    /// Appends the tokens of `word` (in the byte alphabet) to `out`. A final symbol that is not
    /// a token is emitted byte by byte where those bytes are (one-byte) tokens, and dropped
    /// otherwise, as llama.cpp does.
    pub fn encode_word(
        &self,
        word: &str,
        token_to_id: &HashMap<String, u32>,
        ignore_merges: bool,
        out: &mut Vec<u32>,
    ) {
        if word.is_empty() {
            return;
        }
        if ignore_merges {
            if let Some(&id) = token_to_id.get(word) {
                out.push(id);
                return;
            }
        }
        let mut syms: Vec<Symbol> = Vec::with_capacity(word.len());
        for (i, (start, c)) in word.char_indices().enumerate() {
            syms.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: i as isize - 1,
                next: i as isize + 1,
            });
        }
        let n = syms.len();
        syms[n - 1].next = -1;

        // (rank, left index, left length, right length): lowest rank first, then leftmost.
        let mut queue: BinaryHeap<Reverse<(u32, usize, usize, usize)>> = BinaryHeap::new();
        let text = |s: &Symbol| &word[s.start..s.start + s.len];
        let try_add = |queue: &mut BinaryHeap<_>, syms: &[Symbol], left: isize, right: isize| {
            if left < 0 || right < 0 {
                return;
            }
            let (l, r) = (&syms[left as usize], &syms[right as usize]);
            let Some(lid) = self.piece_id(text(l), token_to_id) else {
                return;
            };
            let Some(rid) = self.piece_id(text(r), token_to_id) else {
                return;
            };
            if let Some(&rank) = self.ranks.get(&(lid, rid)) {
                queue.push(Reverse((rank, left as usize, l.len, r.len)));
            }
        };
        for i in 1..n {
            try_add(&mut queue, &syms, i as isize - 1, i as isize);
        }
        while let Some(Reverse((_, left, left_len, right_len))) = queue.pop() {
            let right = syms[left].next;
            // Stale entry: one side has been merged since (llama.cpp compares the texts; the
            // sides only ever grow, so comparing lengths is the same test).
            if right < 0 || syms[left].len != left_len || syms[right as usize].len != right_len {
                continue;
            }
            let right = right as usize;
            syms[left].len += right_len;
            syms[right].len = 0;
            let next = syms[right].next;
            syms[left].next = next;
            if next >= 0 {
                syms[next as usize].prev = left as isize;
            }
            let prev = syms[left].prev;
            try_add(&mut queue, &syms, prev, left as isize);
            try_add(&mut queue, &syms, left as isize, next);
        }

        let mut i = 0isize;
        while i >= 0 {
            let s = &syms[i as usize];
            let piece = text(s);
            match token_to_id.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for b in piece.bytes() {
                        if b.is_ascii() {
                            let mut buf = [0u8; 1];
                            let one = (b as char).encode_utf8(&mut buf);
                            if let Some(&id) = token_to_id.get(&*one) {
                                out.push(id);
                            }
                        }
                    }
                }
            }
            i = s.next;
        }
    }
}

struct Symbol {
    /// Byte offset in the word.
    start: usize,
    /// Length in bytes; 0 once merged into its left neighbour.
    len: usize,
    prev: isize,
    next: isize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(tokens: &[&str]) -> HashMap<String, u32> {
        tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), i as u32))
            .collect()
    }

    #[test]
    fn merges_by_rank_then_leftmost() {
        let v = vocab(&["a", "b", "c", "ab", "bc", "abc", "aa", "aaa"]);
        // "b c" outranks "a b": "abc" -> a + bc (no "a bc" rule) -> [a, bc]
        let m = Merges::new(["b c", "a b"].into_iter(), &v, v.len());
        let mut out = Vec::new();
        m.encode_word("abc", &v, false, &mut out);
        assert_eq!(out, [0, 4]);
        // equal ranks resolve leftmost first: "aaa" with "a a" -> [aa, a]
        let m = Merges::new(["a a"].into_iter(), &v, v.len());
        let mut out = Vec::new();
        m.encode_word("aaa", &v, false, &mut out);
        assert_eq!(out, [6, 0]);
        // ignore_merges takes a whole-word token as is
        let mut out = Vec::new();
        m.encode_word("aaa", &v, true, &mut out);
        assert_eq!(out, [7]);
    }

    #[test]
    fn merge_sides_outside_the_vocabulary_still_apply() {
        // "x y" makes "xy", which is not a token; "xy z" then makes the token "xyz"
        let v = vocab(&["x", "y", "z", "xyz"]);
        let m = Merges::new(["x y", "xy z", "bogus"].into_iter(), &v, v.len());
        assert_eq!(m.len(), 2);
        let mut out = Vec::new();
        m.encode_word("xyz", &v, false, &mut out);
        assert_eq!(out, [3]);
        // a leftover non-token symbol falls back to its one-byte tokens
        let mut out = Vec::new();
        m.encode_word("xy", &v, false, &mut out);
        assert_eq!(out, [0, 1]);
    }
}
