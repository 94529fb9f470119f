//! SentencePiece (llama.cpp's "SPM"): characters merged pairwise by the score of the token they
//! form, best first; whatever is left that is not a token falls back to byte tokens.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::vocab::Vocab;

const NONE: u32 = u32::MAX;

pub(crate) struct Spm<'a> {
    pub(crate) vocab: &'a Vocab,
    pub(crate) scores: &'a [f32],
    /// Token of each byte (`<0xXX>`, else the one-byte string), `NONE` if there is none.
    pub(crate) byte_token: &'a [u32; 256],
    pub(crate) unk: Option<u32>,
}

struct Sym {
    start: u32,
    /// Bytes covered; 0 once merged into its left neighbour.
    len: u32,
    prev: u32,
    next: u32,
}

struct Pair {
    score: f32,
    left: u32,
    right: u32,
    /// Bytes of the merged text: a pair is stale if its symbols no longer add up to it.
    size: u32,
}

impl PartialEq for Pair {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Pair {}
impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pair {
    /// Max-heap order: highest score first, then leftmost.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl Spm<'_> {
    /// Tokenizes `text`, whose spaces are already escaped as `▁`.
    pub(crate) fn tokenize(&self, text: &str, out: &mut Vec<u32>) {
        let mut syms: Vec<Sym> = Vec::with_capacity(text.len());
        for (i, c) in text.char_indices() {
            let idx = syms.len() as u32;
            syms.push(Sym {
                start: i as u32,
                len: c.len_utf8() as u32,
                prev: if idx == 0 { NONE } else { idx - 1 },
                next: if i + c.len_utf8() == text.len() {
                    NONE
                } else {
                    idx + 1
                },
            });
        }
        let mut heap = BinaryHeap::new();
        for i in 1..syms.len() as u32 {
            self.push_pair(text, &syms, i - 1, i, &mut heap);
        }
        while let Some(p) = heap.pop() {
            let (l, r) = (&syms[p.left as usize], &syms[p.right as usize]);
            if l.len == 0 || r.len == 0 || l.len + r.len != p.size {
                continue;
            }
            let r_next = r.next;
            let l = &mut syms[p.left as usize];
            l.len = p.size;
            l.next = r_next;
            let l_prev = l.prev;
            syms[p.right as usize].len = 0;
            if r_next != NONE {
                syms[r_next as usize].prev = p.left;
            }
            if l_prev != NONE {
                self.push_pair(text, &syms, l_prev, p.left, &mut heap);
            }
            if r_next != NONE {
                self.push_pair(text, &syms, p.left, r_next, &mut heap);
            }
        }
        let mut i = 0;
        while i != NONE && (i as usize) < syms.len() {
            let s = &syms[i as usize];
            let piece = &text[s.start as usize..(s.start + s.len) as usize];
            match self.vocab.id(piece) {
                Some(id) => out.push(id),
                None => {
                    for b in piece.bytes() {
                        match self.byte_token[b as usize] {
                            NONE => out.extend(self.unk),
                            t => out.push(t),
                        }
                    }
                }
            }
            i = s.next;
        }
    }

    fn push_pair(
        &self,
        text: &str,
        syms: &[Sym],
        left: u32,
        right: u32,
        heap: &mut BinaryHeap<Pair>,
    ) {
        let (l, r) = (&syms[left as usize], &syms[right as usize]);
        let merged = &text[l.start as usize..(r.start + r.len) as usize];
        if let Some(id) = self.vocab.id(merged) {
            let score = self.scores.get(id as usize).copied().unwrap_or(0.0);
            heap.push(Pair {
                score,
                left,
                right,
                size: merged.len() as u32,
            });
        }
    }
}
