//! Compact string tables for the vocabulary: every text in one buffer, found by id through an
//! offset table and by text through an open-addressing index of ids.
//!
//! A 49k-token vocabulary held as `Vec<String>` plus a `HashMap<String, u32>` plus a
//! `Vec<Vec<u8>>` of rendered pieces is mostly per-string allocations; with these tables (and
//! the GGUF's arrays no longer copied to build them) a SmolLM2 run under a budget peaks 7 MiB
//! lower, memory the neuron cache gets instead (`docs/benchmarks-journal.md`).

/// Byte strings in one buffer, by index.
#[derive(Clone, Debug, Default)]
pub(crate) struct ByteTable {
    bytes: Vec<u8>,
    /// `ends[i]`: end of string `i` in `bytes` (it starts at `ends[i - 1]`, or 0).
    ends: Vec<usize>,
}

impl ByteTable {
    pub(crate) fn with_capacity(strings: usize, bytes: usize) -> ByteTable {
        ByteTable {
            bytes: Vec::with_capacity(bytes),
            ends: Vec::with_capacity(strings),
        }
    }

    pub(crate) fn push(&mut self, s: &[u8]) {
        self.bytes.extend_from_slice(s);
        self.ends.push(self.bytes.len());
    }

    pub(crate) fn get(&self, i: usize) -> Option<&[u8]> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        Some(&self.bytes[start..end])
    }
}

/// Token texts by id, and ids by text (a text given to several ids maps to the last, as
/// llama.cpp's map does).
#[derive(Clone, Debug)]
pub(crate) struct Vocab {
    text: String,
    ends: Vec<usize>,
    /// Open addressing with linear probing: `id + 1` of the text hashing here, 0 when empty.
    /// At most half full, so probes stay short.
    index: Vec<u32>,
}

impl Vocab {
    /// The texts of tokens `0, 1, …` (fewer than `u32::MAX` of them).
    pub(crate) fn new<S: AsRef<str>>(tokens: impl ExactSizeIterator<Item = S>) -> Vocab {
        let n = tokens.len();
        debug_assert!(n < u32::MAX as usize);
        let mut text = String::new();
        let mut ends = Vec::with_capacity(n);
        for t in tokens {
            text.push_str(t.as_ref());
            ends.push(text.len());
        }
        text.shrink_to_fit();
        let slots = (2 * n).next_power_of_two().max(2);
        let mut vocab = Vocab {
            text,
            ends,
            index: vec![0; slots],
        };
        for id in 0..n as u32 {
            let slot = vocab.find_slot(vocab.text_of(id));
            // A repeated text: the later id replaces the earlier one.
            vocab.index[slot] = id + 1;
        }
        vocab
    }

    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// Bytes of all the texts together.
    pub(crate) fn text_bytes(&self) -> usize {
        self.text.len()
    }

    /// The text of token `id`.
    pub(crate) fn text(&self, id: u32) -> Option<&str> {
        ((id as usize) < self.ends.len()).then(|| self.text_of(id))
    }

    fn text_of(&self, id: u32) -> &str {
        let i = id as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.text[start..self.ends[i]]
    }

    /// The id of a token text.
    pub(crate) fn id(&self, text: &str) -> Option<u32> {
        match self.index[self.find_slot(text)] {
            0 => None,
            v => Some(v - 1),
        }
    }

    /// The slot holding `text`, or the empty slot where it would go.
    fn find_slot(&self, text: &str) -> usize {
        let mask = self.index.len() - 1;
        let mut slot = fnv1a(text.as_bytes()) as usize & mask;
        loop {
            match self.index[slot] {
                0 => return slot,
                v if self.text_of(v - 1) == text => return slot,
                _ => slot = (slot + 1) & mask,
            }
        }
    }

    /// Every `(text, id)` the index maps (one per distinct text), in slot order.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&str, u32)> + '_ {
        self.index
            .iter()
            .filter(|&&v| v != 0)
            .map(|&v| (self.text_of(v - 1), v - 1))
    }
}

/// 64-bit FNV-1a: short keys, no need for a keyed hash (the vocabulary is fixed at load and a
/// hostile one can at worst make its own lookups slower).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// The tables answer exactly as a `Vec<String>` and a `HashMap` of the last ids would.
        #[test]
        fn matches_a_map(tokens in prop::collection::vec("[a-c▁é]{0,4}", 0..200), probe in "[a-c▁é]{0,4}") {
            let vocab = Vocab::new(tokens.iter());
            let mut map = HashMap::new();
            for (i, t) in tokens.iter().enumerate() {
                map.insert(t.clone(), i as u32);
            }
            prop_assert_eq!(vocab.len(), tokens.len());
            for (i, t) in tokens.iter().enumerate() {
                prop_assert_eq!(vocab.text(i as u32), Some(t.as_str()));
                prop_assert_eq!(vocab.id(t), map.get(t).copied());
            }
            prop_assert_eq!(vocab.text(tokens.len() as u32), None);
            prop_assert_eq!(vocab.id(&probe), map.get(&probe).copied());
            let mut entries: Vec<(String, u32)> =
                vocab.entries().map(|(t, i)| (t.to_owned(), i)).collect();
            entries.sort();
            let mut expected: Vec<(String, u32)> = map.into_iter().collect();
            expected.sort();
            prop_assert_eq!(entries, expected);

            let mut table = ByteTable::default();
            for t in &tokens {
                table.push(t.as_bytes());
            }
            for (i, t) in tokens.iter().enumerate() {
                prop_assert_eq!(table.get(i), Some(t.as_bytes()));
            }
            prop_assert_eq!(table.get(tokens.len()), None);
        }
    }
}
