//! Stop sequences (`stop`): text is held back while it may be the start of one, and
//! generation ends where one appears (the stop text itself is not returned, as OpenAI does).

/// Watches generated text for stop sequences.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    text: String,
    /// Bytes of `text` handed out.
    sent: usize,
}

/// What [`StopMatcher::push`] lets out.
#[derive(Debug, PartialEq, Eq)]
pub struct Released {
    pub text: String,
    /// A stop sequence appeared: generation ends here.
    pub stopped: bool,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            ..StopMatcher::default()
        }
    }

    /// Adds generated text; returns what can be shown now.
    pub fn push(&mut self, piece: &str) -> Released {
        self.text.push_str(piece);
        // Only a match that ends in the new text is new; search from where one could start.
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let mut from = self.sent.saturating_sub(longest);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        let found = self
            .stops
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|at| from + at))
            .min();
        if let Some(at) = found {
            let at = at.max(self.sent);
            let text = self.text[self.sent..at].to_string();
            self.sent = self.text.len();
            return Released {
                text,
                stopped: true,
            };
        }
        // Hold back the longest tail that begins a stop sequence.
        let hold = self
            .text
            .char_indices()
            .map(|(i, _)| i)
            .filter(|&i| i >= self.sent && self.text.len() - i < longest)
            .find(|&i| {
                let tail = &self.text[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.text.len());
        let text = self.text[self.sent..hold].to_string();
        self.sent = hold;
        Released {
            text,
            stopped: false,
        }
    }

    /// Generation ended without a stop sequence: whatever was held back.
    pub fn finish(&mut self) -> String {
        let rest = self.text[self.sent..].to_string();
        self.sent = self.text.len();
        rest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let r = m.push(p);
            out.push_str(&r.text);
            if r.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn a_stop_split_over_pieces_ends_the_text_before_it() {
        assert_eq!(
            run(&["END"], &["hello E", "N", "D more"]),
            ("hello ".into(), true)
        );
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), true));
    }

    #[test]
    fn a_near_miss_is_released_whole() {
        assert_eq!(
            run(&["END"], &["hello E", "N", "d"]),
            ("hello ENd".into(), false)
        );
        assert_eq!(run(&[], &["é", "ü"]), ("éü".into(), false));
        assert_eq!(run(&["ü!"], &["é", "ü"]), ("éü".into(), false));
    }

    #[test]
    fn held_text_is_not_released_early() {
        let mut m = StopMatcher::new(vec!["</s>".into()]);
        assert_eq!(m.push("ab<").text, "ab");
        assert_eq!(m.push("/").text, "");
        let r = m.push("x");
        assert_eq!((r.text.as_str(), r.stopped), ("</x", false));
    }
}
