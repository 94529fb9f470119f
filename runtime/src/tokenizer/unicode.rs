//! Codepoint classes (as llama.cpp's pre-tokenizers see them) and the GPT-2 byte↔char map.

use super::unicode_data::CATEGORY_RANGES;

/// Unassigned codepoint (general category Cn).
#[cfg_attr(not(test), allow(dead_code))] // named for the tests
pub(crate) const CAT_UNDEFINED: u16 = 0x01;
/// `\p{N}`.
pub(crate) const CAT_NUMBER: u16 = 0x02;
/// `\p{L}`.
pub(crate) const CAT_LETTER: u16 = 0x04;
/// `\p{Z}`.
#[cfg_attr(not(test), allow(dead_code))] // named for the tests
pub(crate) const CAT_SEPARATOR: u16 = 0x08;
/// `\p{M}`.
pub(crate) const CAT_MARK: u16 = 0x10;
/// `\p{P}`.
pub(crate) const CAT_PUNCT: u16 = 0x20;
/// `\p{S}`.
pub(crate) const CAT_SYMBOL: u16 = 0x40;
/// `\p{C}` other than unassigned.
#[cfg_attr(not(test), allow(dead_code))] // named for the tests
pub(crate) const CAT_CONTROL: u16 = 0x80;
/// Unicode `White_Space`, on top of the category bit.
pub(crate) const WHITESPACE: u16 = 0x100;

/// Class bits of a codepoint. Never 0: 0 is kept for "outside the text" in the splitters.
#[inline]
pub(crate) fn flags(c: char) -> u16 {
    let cp = c as u32;
    if cp < 128 {
        return ASCII_FLAGS[cp as usize];
    }
    category(cp) | if is_white_space(cp) { WHITESPACE } else { 0 }
}

#[inline]
fn category(cp: u32) -> u16 {
    // The table starts at 0, so the partition point is at least 1.
    let i = CATEGORY_RANGES.partition_point(|&(start, _)| start <= cp);
    CATEGORY_RANGES[i - 1].1 as u16
}

#[inline]
fn is_white_space(cp: u32) -> bool {
    matches!(
        cp,
        0x09..=0x0D
            | 0x20
            | 0x85
            | 0xA0
            | 0x1680
            | 0x2000..=0x200A
            | 0x2028
            | 0x2029
            | 0x202F
            | 0x205F
            | 0x3000
    )
}

static ASCII_FLAGS: [u16; 128] = ascii_flags();

const fn ascii_flags() -> [u16; 128] {
    let mut out = [0u16; 128];
    let mut cp = 0u32;
    while cp < 128 {
        // Linear scan: the first ranges of the table cover ASCII.
        let mut i = 0;
        while i + 1 < CATEGORY_RANGES.len() && CATEGORY_RANGES[i + 1].0 <= cp {
            i += 1;
        }
        let ws = matches!(cp, 0x09..=0x0D | 0x20);
        out[cp as usize] = CATEGORY_RANGES[i].1 as u16 | if ws { WHITESPACE } else { 0 };
        cp += 1;
    }
    out
}

/// GPT-2's reversible byte → printable char map: printable Latin-1 bytes map to themselves, the
/// other 68 bytes to U+0100.. in byte order.
pub(crate) static BYTE_TO_CHAR: [char; 256] = byte_to_char();

const fn is_printable_byte(b: u32) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

const fn byte_to_char() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut next = 256u32;
    let mut b = 0u32;
    while b < 256 {
        let cp = if is_printable_byte(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        out[b as usize] = match char::from_u32(cp) {
            Some(c) => c,
            None => '\0',
        };
        b += 1;
    }
    out
}

/// Inverse of [`BYTE_TO_CHAR`].
#[inline]
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    match CHAR_TO_BYTE.get(c as usize) {
        Some(&b) if b <= 0xFF => Some(b as u8),
        _ => None,
    }
}

/// Indexed by codepoint (the map's image lies below U+0144); `0xFFFF` marks no byte.
static CHAR_TO_BYTE: [u16; 0x144] = char_to_byte_table();

const fn char_to_byte_table() -> [u16; 0x144] {
    let map = byte_to_char();
    let mut out = [0xFFFFu16; 0x144];
    let mut b = 0;
    while b < 256 {
        out[map[b] as usize] = b as u16;
        b += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_a_bijection() {
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(BYTE_TO_CHAR[b as usize]), Some(b));
        }
        assert_eq!(BYTE_TO_CHAR[b' ' as usize], 'Ġ');
        assert_eq!(BYTE_TO_CHAR[b'\n' as usize], 'Ċ');
        assert_eq!(BYTE_TO_CHAR[b'a' as usize], 'a');
        assert_eq!(char_to_byte('Ā'), Some(0));
        assert_eq!(char_to_byte('\u{0144}'), None);
    }

    #[test]
    fn classes() {
        assert_eq!(flags('a'), CAT_LETTER);
        assert_eq!(flags('7'), CAT_NUMBER);
        assert_eq!(flags(' '), CAT_SEPARATOR | WHITESPACE);
        assert_eq!(flags('\n'), CAT_CONTROL | WHITESPACE);
        assert_eq!(flags('$'), CAT_SYMBOL);
        assert_eq!(flags('!'), CAT_PUNCT);
        assert_eq!(flags('é'), CAT_LETTER);
        assert_eq!(flags('\u{301}'), CAT_MARK);
        assert_eq!(flags('½'), CAT_NUMBER);
        assert_eq!(flags('\u{3000}'), CAT_SEPARATOR | WHITESPACE);
        assert_eq!(flags('\u{85}'), CAT_CONTROL | WHITESPACE);
        assert_eq!(flags('🦙'), CAT_SYMBOL);
        assert_eq!(flags('\u{E000}'), CAT_CONTROL); // private use
        assert_eq!(flags('\u{378}'), CAT_UNDEFINED);
        // Assigned in Unicode 15.1 (CJK extension I): must be a letter, as in llama.cpp.
        assert_eq!(flags('\u{2EBF0}'), CAT_LETTER);
        assert_eq!(flags('\u{10FFFF}'), CAT_UNDEFINED);
    }
}
