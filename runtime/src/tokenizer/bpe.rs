//! gpt2-style byte-level BPE: the words of the pre-tokenizer, byte-encoded, merged by rank.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use super::pretok::PreConfig;
use super::unicode::BYTE_TO_CHAR;
use super::vocab::Vocab;

/// No symbol: a string that is neither a token nor part of any merge.
const NONE: u32 = u32::MAX;

/// Multiplicative hash for the `(left, right)` merge keys: SipHash is needlessly slow here.
#[derive(Default)]
pub(crate) struct PairHasher(u64);

impl Hasher for PairHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type PairMap<V> = HashMap<u64, V, BuildHasherDefault<PairHasher>>;

#[inline]
fn key(left: u32, right: u32) -> u64 {
    (left as u64) << 32 | right as u64
}

/// Symbols are interned strings: ids below the vocabulary size are the tokens themselves,
/// ids above are strings that only occur in merges.
#[derive(Debug)]
pub(crate) struct Bpe {
    pub(crate) pre: PreConfig,
    n_tokens: u32,
    /// `(left, right)` → `(rank, merged symbol)`.
    merges: PairMap<(u32, u32)>,
    /// Symbol of each byte's one-char encoded string.
    byte_sym: [u32; 256],
    /// Token of each printable ASCII byte's one-char string: the last resort of a symbol that
    /// is not a token.
    ascii_token: [u32; 128],
}

impl Bpe {
    pub(crate) fn new(pre: PreConfig, n_tokens: usize, vocab: &Vocab, merges: &[String]) -> Bpe {
        let mut extra: HashMap<String, u32> = HashMap::new();
        let intern = |s: &str, extra: &mut HashMap<String, u32>| -> u32 {
            if let Some(id) = vocab.id(s) {
                return id;
            }
            let next = n_tokens as u32 + extra.len() as u32;
            *extra.entry(s.to_string()).or_insert(next)
        };
        let mut map: PairMap<(u32, u32)> = PairMap::default();
        map.reserve(merges.len());
        for (rank, line) in merges.iter().enumerate() {
            // "left right", split at the first space after the first byte (the left part may
            // itself be a space).
            let Some(pos) = line.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else {
                continue;
            };
            let (left, right) = (&line[..pos], &line[pos + 1..]);
            if right.is_empty() {
                continue;
            }
            let l = intern(left, &mut extra);
            let r = intern(right, &mut extra);
            let merged = intern(&format!("{left}{right}"), &mut extra);
            // The first rank of a repeated pair wins.
            map.entry(key(l, r)).or_insert((rank as u32, merged));
        }
        let mut byte_sym = [NONE; 256];
        for (b, sym) in byte_sym.iter_mut().enumerate() {
            let s = BYTE_TO_CHAR[b].to_string();
            *sym = vocab
                .id(&s)
                .or_else(|| extra.get(&s).copied())
                .unwrap_or(NONE);
        }
        let mut ascii_token = [NONE; 128];
        for (b, tok) in ascii_token.iter_mut().enumerate().take(0x7F).skip(0x21) {
            *tok = vocab.id(&(b as u8 as char).to_string()).unwrap_or(NONE);
        }
        Bpe {
            pre,
            n_tokens: n_tokens as u32,
            merges: map,
            byte_sym,
            ascii_token,
        }
    }

    /// Tokenizes a text fragment (no special tokens in it).
    pub(crate) fn tokenize(&self, text: &str, vocab: &Vocab, out: &mut Vec<u32>) {
        let mut work = Work::default();
        for word in self.pre.splitter.split(text) {
            if self.pre.ignore_merges {
                let encoded: String = word.bytes().map(|b| BYTE_TO_CHAR[b as usize]).collect();
                if let Some(id) = vocab.id(&encoded) {
                    out.push(id);
                    continue;
                }
            }
            self.merge_word(word.as_bytes(), &mut work, out);
        }
    }

    fn merge_word(&self, word: &[u8], w: &mut Work, out: &mut Vec<u32>) {
        let n = word.len();
        w.syms.clear();
        w.heap.clear();
        for (i, &b) in word.iter().enumerate() {
            w.syms.push(Sym {
                id: self.byte_sym[b as usize],
                len: 1,
                prev: if i == 0 { NONE } else { i as u32 - 1 },
                next: if i + 1 == n { NONE } else { i as u32 + 1 },
            });
        }
        for i in 1..n {
            self.push_pair(w, i as u32 - 1, i as u32);
        }
        while let Some(Reverse((_rank, left, right, lid, rid))) = w.heap.pop() {
            let (l, r) = (&w.syms[left as usize], &w.syms[right as usize]);
            // Skip pairs that an earlier merge changed.
            if l.len == 0 || r.len == 0 || l.next != right || l.id != lid || r.id != rid {
                continue;
            }
            let merged = self.merges[&key(lid, rid)].1;
            let (r_len, r_next) = (r.len, r.next);
            let l = &mut w.syms[left as usize];
            l.id = merged;
            l.len += r_len;
            l.next = r_next;
            let l_prev = l.prev;
            w.syms[right as usize].len = 0;
            if r_next != NONE {
                w.syms[r_next as usize].prev = left;
            }
            if l_prev != NONE {
                self.push_pair(w, l_prev, left);
            }
            if r_next != NONE {
                self.push_pair(w, left, r_next);
            }
        }
        let mut i = 0u32;
        while (i as usize) < n {
            let s = &w.syms[i as usize];
            if s.id < self.n_tokens {
                out.push(s.id);
            } else {
                // Not a token: its bytes one by one, where a one-char token exists.
                for &b in &word[i as usize..(i + s.len) as usize] {
                    if let Some(&t) = self.ascii_token.get(b as usize) {
                        if t != NONE {
                            out.push(t);
                        }
                    }
                }
            }
            i += s.len;
        }
    }

    #[inline]
    fn push_pair(&self, w: &mut Work, left: u32, right: u32) {
        let (lid, rid) = (w.syms[left as usize].id, w.syms[right as usize].id);
        if lid == NONE || rid == NONE {
            return;
        }
        if let Some(&(rank, _)) = self.merges.get(&key(lid, rid)) {
            // Lowest rank first, then leftmost.
            w.heap.push(Reverse((rank, left, right, lid, rid)));
        }
    }
}

#[derive(Clone, Copy)]
struct Sym {
    id: u32,
    /// Bytes of the word covered; 0 once merged into its left neighbour.
    len: u32,
    prev: u32,
    next: u32,
}

/// `(rank, left, right, left symbol, right symbol)` of a candidate merge.
type Candidate = (u32, u32, u32, u32, u32);

#[derive(Default)]
struct Work {
    syms: Vec<Sym>,
    heap: BinaryHeap<Reverse<Candidate>>,
}
