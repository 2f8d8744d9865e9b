//! Answer extraction and answer-only exact match (`docs/interplay.md` §8.1, §6.4).

use std::sync::LazyLock;

use regex::Regex;

use crate::metrics::exact::int_ratio_to_f64;
use super::pystr::{SPACE_CLASS, ascii_digits, is_digit, parse_float, strip};

static ANSWER_TAGS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?is)<answer>(.*?)</answer>").expect("valid regex"));
static ANSWER_MARKER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(&format!(r"(?i)Answer:{SPACE_CLASS}*(.*)")).expect("valid regex"));
static FRACTION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"^([+-]?\d+){SPACE_CLASS}*/{SPACE_CLASS}*([+-]?\d+)$"
    ))
    .expect("valid regex")
});
static DECIMAL: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[+-]?(?:\d+\.?\d*|\d*\.\d+)$").expect("valid regex"));

/// `extract_answer_flexible` of `eval_checkpoints.py` (= `extract_answer` of `verl/reward_fn.py`):
/// the text inside the first `<answer>…</answer>`, else the text after the last `<answer>` up to
/// a `<`, a newline or the end; stripped. Empty if there is no `<answer>` at all.
pub fn extract_tagged_answer(text: &str) -> String {
    tagged_answer(text).unwrap_or_default()
}

/// `extract_answer_flexible` of `verl/dataset.py` (the pure-outcome RL reward): like
/// [`extract_tagged_answer`], then falling back to the text after the first `Answer:` (any case)
/// up to a newline or `<`.
pub fn extract_answer_with_marker(text: &str) -> String {
    if let Some(answer) = tagged_answer(text) {
        return answer;
    }
    match ANSWER_MARKER.captures(text) {
        Some(m) => {
            let segment = strip(&m[1]);
            let end = segment.find(['\n', '<']).unwrap_or(segment.len());
            strip(&segment[..end]).to_owned()
        }
        None => String::new(),
    }
}

/// The two `<answer>` steps shared by both extractors; `None` when neither applies.
fn tagged_answer(text: &str) -> Option<String> {
    if let Some(m) = ANSWER_TAGS.captures(text) {
        return Some(strip(&m[1]).to_owned());
    }
    // `text.lower().rfind("<answer>")` indexes the lower-cased text (in characters) and slices the
    // original with it, so we do the same.
    let lower = text.to_lowercase();
    let byte_pos = lower.rfind("<answer>")?;
    let char_pos = lower[..byte_pos].chars().count() + "<answer>".len();
    let tail: String = text.chars().skip(char_pos).collect();
    let end = tail.find(['<', '\n']).unwrap_or(tail.len());
    Some(strip(&tail[..end]).to_owned())
}

/// The inline `_parse_numeric` of `eval_generation_vllm`: `a/b` fractions, digits with commas,
/// plain decimals; `None` otherwise (there is no "last number" fallback).
pub fn parse_numeric(s: &str) -> Option<f64> {
    let t = strip(s).trim_end_matches('.');
    if t.is_empty() {
        return None;
    }
    if let Some(m) = FRACTION.captures(t) {
        let (num, den) = (
            ascii_digits(&m[1]).into_owned(),
            ascii_digits(&m[2]).into_owned(),
        );
        return match (num.parse::<i128>(), den.parse::<i128>()) {
            (Ok(a), Ok(b)) => int_ratio_to_f64(a, b),
            // Beyond i128: Python is exact, we round each side first.
            _ => match (parse_float(&num), parse_float(&den)) {
                (Some(_), Some(0.0)) => None,
                (Some(a), Some(b)) => Some(a / b),
                _ => None,
            },
        };
    }
    let without_commas = remove_digit_commas(t);
    if DECIMAL.is_match(&without_commas) {
        return parse_float(&without_commas);
    }
    None
}

/// `re.sub(r"(?<=\d),(?=\d)", "", t)`.
fn remove_digit_commas(t: &str) -> String {
    let chars: Vec<char> = t.chars().collect();
    let mut out = String::with_capacity(t.len());
    for (i, &c) in chars.iter().enumerate() {
        let between_digits = c == ','
            && i > 0
            && i + 1 < chars.len()
            && is_digit(chars[i - 1])
            && is_digit(chars[i + 1]);
        if !between_digits {
            out.push(c);
        }
    }
    out
}

/// Answer exact match as `eval_generation_vllm` computes it: numeric equality within
/// `1e-8·max(1,|a|,|b|)` when both sides parse, otherwise string equality after `rstrip(".")`;
/// always 0 for an empty gold answer.
pub fn exact_match(pred: &str, gold: &str) -> bool {
    if gold.is_empty() {
        return false;
    }
    match (parse_numeric(pred), parse_numeric(gold)) {
        (Some(a), Some(b)) => (a - b).abs() <= 1e-8 * 1f64.max(a.abs()).max(b.abs()),
        _ => pred.trim_end_matches('.') == gold.trim_end_matches('.'),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extraction() {
        assert_eq!(
            extract_tagged_answer(" x </solution> <answer> 12 </answer>"),
            "12"
        );
        assert_eq!(extract_tagged_answer(" x </solution> <answer> 12 "), "12");
        assert_eq!(extract_tagged_answer("<ANSWER>7<b"), "7");
        assert_eq!(extract_tagged_answer("<answer> 3\n4"), "3");
        assert_eq!(extract_tagged_answer("Answer: 5."), "");
        assert_eq!(
            extract_answer_with_marker("so x = 2. Answer: 5.\nmore"),
            "5."
        );
        assert_eq!(
            extract_answer_with_marker("<answer> 4 </answer> Answer: 5"),
            "4"
        );
        // Python slices the original text with an index into the lower-cased one.
        assert_eq!(extract_tagged_answer("İ<answer>12"), "2");
    }

    #[test]
    fn numeric_match() {
        assert!(exact_match("12", "12"));
        assert!(exact_match("12.0", "12"));
        assert!(exact_match("24/2", "12"));
        assert!(exact_match("1,200", "1200"));
        assert!(!exact_match("13", "12"));
        assert!(exact_match("abc.", "abc"));
        assert!(!exact_match("", ""));
        assert!(exact_match("1/0", "1/0"));
        assert_eq!(parse_numeric("3 / 4"), Some(0.75));
        assert_eq!(parse_numeric(".5"), Some(0.5));
        assert_eq!(parse_numeric("12 apples"), None);
    }
}
