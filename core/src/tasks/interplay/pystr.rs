//! Python `str` semantics the reference code relies on: what `strip()` and `split()` treat as
//! whitespace, what `\s` and `\d` match in its regexes, and `float()` of any Unicode digits.

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::Regex;

/// Python's `\s` for `str` patterns (= `str.isspace`): Unicode White_Space plus U+001C..U+001F.
pub const SPACE_CLASS: &str = r"[\s\x1c-\x1f]";

/// `str.isspace()` for one character.
pub fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `s.strip()`.
pub fn strip(s: &str) -> &str {
    s.trim_matches(is_space)
}

/// `s.split()` (runs of whitespace, no empty parts).
pub fn split_whitespace(s: &str) -> impl Iterator<Item = &str> {
    s.split(is_space).filter(|part| !part.is_empty())
}

/// `" ".join(s.split())`.
pub fn collapse_whitespace(s: &str) -> String {
    split_whitespace(s).collect::<Vec<_>>().join(" ")
}

/// The first line of `s` as `s.splitlines()[0]` gives it (`None` for an empty string).
pub fn first_line(s: &str) -> Option<&str> {
    if s.is_empty() {
        return None;
    }
    let end = s
        .find([
            '\n', '\r', '\u{b}', '\u{c}', '\u{1c}', '\u{1d}', '\u{1e}', '\u{85}', '\u{2028}',
            '\u{2029}',
        ])
        .unwrap_or(s.len());
    Some(&s[..end])
}

static DECIMAL_DIGIT: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^\d$").expect("valid regex"));

/// Python's `\d` (Unicode category Nd) for one character.
pub fn is_digit(c: char) -> bool {
    c.is_ascii_digit() || (!c.is_ascii() && is_decimal_digit(c))
}

fn is_decimal_digit(c: char) -> bool {
    let mut buf = [0u8; 4];
    DECIMAL_DIGIT.is_match(c.encode_utf8(&mut buf))
}

/// The value of a Unicode decimal digit (category Nd). Unicode assigns these in contiguous runs
/// of ten starting at zero, so the value is the distance to the start of the run, modulo ten.
fn digit_value(c: char) -> Option<u32> {
    if c.is_ascii_digit() {
        return Some(c as u32 - '0' as u32);
    }
    if !is_decimal_digit(c) {
        return None;
    }
    let mut start = c as u32;
    while let Some(prev) = start.checked_sub(1).and_then(char::from_u32) {
        if !is_decimal_digit(prev) {
            break;
        }
        start -= 1;
    }
    Some((c as u32 - start) % 10)
}

/// Replaces non-ASCII decimal digits by ASCII ones, as Python's `int()`/`float()` read them.
pub fn ascii_digits(s: &str) -> Cow<'_, str> {
    if s.is_ascii() {
        return Cow::Borrowed(s);
    }
    Cow::Owned(
        s.chars()
            .map(|c| match digit_value(c) {
                Some(v) if !c.is_ascii() => char::from_digit(v, 10).expect("digit below ten"),
                _ => c,
            })
            .collect(),
    )
}

/// Python's `float(s)` for text matched by a `[-+]?\d+(\.\d+)?`-style regex.
pub fn parse_float(s: &str) -> Option<f64> {
    ascii_digits(s).parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_string_semantics() {
        assert_eq!(strip("\u{1f} a b\u{a0}\n"), "a b");
        assert_eq!(collapse_whitespace(" a \t b\n c "), "a b c");
        assert_eq!(first_line("12.\nrest"), Some("12."));
        assert_eq!(first_line(""), None);
        assert_eq!(parse_float("٣.5"), Some(3.5));
        assert_eq!(parse_float("-12"), Some(-12.0));
        assert_eq!(ascii_digits("𝟗𝟘"), "90");
    }
}
