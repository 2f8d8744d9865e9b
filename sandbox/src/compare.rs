//! LiveCodeBench's comparison of what a program printed with the expected output
//! (`lcb_runner/evaluation/testing_util.py`, `grade_stdio` after the run):
//!
//! 1. `strip()` the whole text, `split("\n")`, `strip()` every line;
//! 2. the line counts must be equal;
//! 3. each line must be equal as a string, or else both lines must parse as whitespace-separated
//!    `Decimal`s and the two lists must be equal (`[Decimal(t) for t in line.split()]`).
//!
//! Done here, outside the sandbox, with Python's exact rules: its whitespace set (which includes
//! `\x1c`-`\x1f`, unlike Rust's), `Decimal`'s string grammar (underscores ignored, any Unicode
//! decimal digit, `Inf`/`Infinity`/`NaN`/`sNaN` in any case, the exponent bounds of the C
//! `decimal` module) and its equality (numeric, `0.50 == 0.5`, `1E+2 == 100`, `-0 == 0`, a NaN
//! equals nothing, and comparing a signalling NaN raises, which LiveCodeBench counts as a
//! runtime error).

use crate::unicode_tables::{ND_ZEROS, PY_WHITESPACE};

/// The result of a comparison as LiveCodeBench reaches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Comparison {
    /// Every line matched.
    Equal,
    /// A line count or a line differs (LiveCodeBench: wrong answer, -2).
    Mismatch,
    /// Python would have raised while comparing (a signalling NaN; LiveCodeBench: -4).
    Error,
}

/// Compares printed output with expected output the way `grade_stdio` does. The second value is
/// a short reason when they differ.
pub fn compare_stdout(prediction: &str, expected: &str) -> (Comparison, String) {
    let pred = stripped_lines(prediction);
    let gold = stripped_lines(expected);
    if pred.len() != gold.len() {
        let why = format!(
            "mismatched output length: {} lines, expected {}",
            pred.len(),
            gold.len()
        );
        return (Comparison::Mismatch, why);
    }
    for (i, (p, g)) in pred.iter().zip(&gold).enumerate() {
        if p == g {
            continue;
        }
        let why = || format!("line {i}: {} != {}", truncate(p, 120), truncate(g, 120));
        let (Some(pd), Some(gd)) = (decimal_line(p), decimal_line(g)) else {
            return (Comparison::Mismatch, why());
        };
        match decimal_lists_equal(&pd, &gd) {
            Some(true) => continue,
            Some(false) => return (Comparison::Mismatch, why()),
            None => {
                return (
                    Comparison::Error,
                    format!("{}: signalling NaN compared", why()),
                );
            }
        }
    }
    (Comparison::Equal, String::new())
}

/// Whether Python's `str.isspace()` holds for `c`.
pub(crate) fn is_py_space(c: char) -> bool {
    PY_WHITESPACE.contains(&c)
}

/// Python's `str.strip()` without arguments.
pub(crate) fn py_strip(s: &str) -> &str {
    s.trim_matches(is_py_space)
}

/// LCB `get_stripped_lines`: `[l.strip() for l in val.strip().split("\n")]`.
fn stripped_lines(val: &str) -> Vec<&str> {
    py_strip(val).split('\n').map(py_strip).collect()
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n).collect::<String>() + "…"
    }
}

/// LCB `convert_line_to_decimals`: `None` when a token is not a `Decimal`.
fn decimal_line(line: &str) -> Option<Vec<Decimal>> {
    line.split(is_py_space)
        .filter(|t| !t.is_empty())
        .map(Decimal::parse)
        .collect()
}

/// Python's `list == list` on `Decimal`s: `None` when it raises.
fn decimal_lists_equal(a: &[Decimal], b: &[Decimal]) -> Option<bool> {
    if a.len() != b.len() {
        return Some(false);
    }
    for (x, y) in a.iter().zip(b) {
        if !x.py_eq(y)? {
            return Some(false);
        }
    }
    Some(true)
}

/// Largest adjusted exponent of the C `decimal` module's maximum context (`MAX_EMAX`).
const EMAX: i128 = 999_999_999_999_999_999;
/// Smallest exponent of a representable value: `MIN_EMIN - (MAX_PREC - 1)`.
const ETINY: i128 = -999_999_999_999_999_999 - (999_999_999_999_999_999 - 1);

/// A `decimal.Decimal` as far as equality needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decimal {
    /// `(-1)^neg * digits * 10^exp`; `digits` has no leading zeros and is empty for zero.
    Finite {
        neg: bool,
        digits: Vec<u8>,
        exp: i128,
    },
    Infinity {
        neg: bool,
    },
    NaN {
        signalling: bool,
    },
}

impl Decimal {
    /// `Decimal(s)` for a token without whitespace; `None` where Python raises `InvalidOperation`.
    pub(crate) fn parse(token: &str) -> Option<Decimal> {
        // The C decimal module drops '_' and reads every Unicode decimal digit as its ASCII digit.
        let mut s = String::with_capacity(token.len());
        for c in token.chars() {
            if c == '_' {
                continue;
            }
            match unicode_digit(c) {
                Some(d) => s.push(char::from(b'0' + d)),
                None if c.is_ascii() => s.push(c),
                None => return None,
            }
        }
        let (neg, body) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, &s[..]),
        };
        let lower = body.to_ascii_lowercase();
        if lower == "inf" || lower == "infinity" {
            return Some(Decimal::Infinity { neg });
        }
        for (prefix, signalling) in [("snan", true), ("nan", false)] {
            if let Some(payload) = lower.strip_prefix(prefix) {
                return payload
                    .bytes()
                    .all(|b| b.is_ascii_digit())
                    .then_some(Decimal::NaN { signalling });
            }
        }
        Self::parse_finite(neg, body.as_bytes())
    }

    fn parse_finite(neg: bool, b: &[u8]) -> Option<Decimal> {
        let (mantissa, exponent) = match b.iter().position(|&c| c == b'e' || c == b'E') {
            Some(i) => (&b[..i], Some(&b[i + 1..])),
            None => (b, None),
        };
        let (int_part, frac_part) = match mantissa.iter().position(|&c| c == b'.') {
            Some(i) => (&mantissa[..i], &mantissa[i + 1..]),
            None => (mantissa, &[][..]),
        };
        let all_digits = |p: &[u8]| p.iter().all(u8::is_ascii_digit);
        if int_part.len() + frac_part.len() == 0 || !all_digits(int_part) || !all_digits(frac_part)
        {
            return None;
        }
        let mut exp: i128 = match exponent {
            None => 0,
            Some(e) => {
                let (eneg, edigits) = match e.first() {
                    Some(b'-') => (true, &e[1..]),
                    Some(b'+') => (false, &e[1..]),
                    _ => (false, e),
                };
                if edigits.is_empty() || !all_digits(edigits) {
                    return None;
                }
                // saturate: anything this large is out of range either way
                let mut v: i128 = 0;
                for &d in edigits {
                    v = (v * 10 + i128::from(d - b'0')).min(1_000_000_000_000_000_000_000_000);
                }
                if eneg { -v } else { v }
            }
        };
        exp -= frac_part.len() as i128;
        let digits: Vec<u8> = int_part
            .iter()
            .chain(frac_part)
            .map(|d| d - b'0')
            .skip_while(|&d| d == 0)
            .collect();
        // Exactness in the maximum context: no overflow, no underflow, no clamping of a zero.
        let adjusted = exp + digits.len().max(1) as i128 - 1;
        if adjusted > EMAX || exp < ETINY {
            return None;
        }
        Some(Decimal::Finite { neg, digits, exp })
    }

    /// Python's `==` between two `Decimal`s; `None` where it raises (a signalling NaN).
    pub(crate) fn py_eq(&self, other: &Decimal) -> Option<bool> {
        use Decimal::*;
        match (self, other) {
            (NaN { signalling: true }, _) | (_, NaN { signalling: true }) => None,
            (NaN { .. }, _) | (_, NaN { .. }) => Some(false),
            (Infinity { neg: a }, Infinity { neg: b }) => Some(a == b),
            (Infinity { .. }, _) | (_, Infinity { .. }) => Some(false),
            (
                Finite {
                    neg: na,
                    digits: da,
                    exp: ea,
                },
                Finite {
                    neg: nb,
                    digits: db,
                    exp: eb,
                },
            ) => {
                if da.is_empty() || db.is_empty() {
                    return Some(da.is_empty() && db.is_empty());
                }
                let (da, ea) = normalize(da, *ea);
                let (db, eb) = normalize(db, *eb);
                Some(na == nb && da == db && ea == eb)
            }
        }
    }
}

/// Drops trailing zeros of a non-zero coefficient, moving them into the exponent.
fn normalize(digits: &[u8], exp: i128) -> (&[u8], i128) {
    let keep = digits.iter().rposition(|&d| d != 0).map_or(0, |i| i + 1);
    (&digits[..keep], exp + (digits.len() - keep) as i128)
}

/// The value of a Unicode decimal digit (category Nd), as Python reads it.
fn unicode_digit(c: char) -> Option<u8> {
    let cp = u32::from(c);
    let i = ND_ZEROS.partition_point(|&z| z <= cp);
    let zero = ND_ZEROS[..i].last()?;
    (cp - zero < 10).then(|| (cp - zero) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(s: &str) -> Option<Decimal> {
        Decimal::parse(s)
    }

    #[test]
    fn decimal_grammar_follows_python() {
        // Each case was checked against Python 3.11's decimal.Decimal.
        for ok in [
            "1_0",
            "_1",
            "1_",
            "1__0",
            "1._5",
            "1e_1",
            "NaN1_2",
            "Inf",
            "inFinity",
            "nan",
            "sNaN5",
            "+.5",
            "5.",
            "1e+5",
            "-0",
            "+0.0e-10",
            "\u{661}\u{662}",
            "\u{ff11}",
            "1e\u{663}",
            "1e999999999999999999",
            "0.1e1000000000000000000",
            "1e-1000000000000000100",
            "0.000001e-999999999999999999",
            "N_aN",
            "-nan",
            "+Inf",
        ] {
            assert!(dec(ok).is_some(), "{ok:?} should parse");
        }
        for bad in [
            "infinit",
            ".",
            "e5",
            "1e",
            "0x10",
            "1e1000000000000000000",
            "10e999999999999999999",
            "1e-9999999999999999999",
            "0e99999999999999999999",
            "1e9223372036854775807",
            "_",
            "nan-1",
            "1.2.3",
            "\u{b2}",
            "100e999999999999999998",
            "1 2",
            "",
        ] {
            assert!(dec(bad).is_none(), "{bad:?} should not parse");
        }
        assert_eq!(dec("\u{663}.\u{665}"), dec("3.5"));
    }

    #[test]
    fn decimal_equality_follows_python() {
        let eq = |a: &str, b: &str| dec(a).unwrap().py_eq(&dec(b).unwrap());
        assert_eq!(eq("0.50", "0.5"), Some(true));
        assert_eq!(eq("1E+2", "100"), Some(true));
        assert_eq!(eq("-0", "0.000"), Some(true));
        assert_eq!(eq("1", "-1"), Some(false));
        assert_eq!(eq("Inf", "Infinity"), Some(true));
        assert_eq!(eq("-Inf", "Inf"), Some(false));
        assert_eq!(eq("NaN", "NaN"), Some(false));
        assert_eq!(eq("sNaN", "1"), None);
        assert_eq!(eq("0.1", "0.10000000000000001"), Some(false));
        assert_eq!(eq("50000000000000000", "50000000000000001"), Some(false));
    }

    #[test]
    fn python_whitespace_includes_separators() {
        assert_eq!(py_strip("\x1c a \x1f"), "a");
        assert!(!is_py_space('\u{200b}'));
        assert_eq!(
            decimal_line("1\x1e2"),
            Some(vec![dec("1").unwrap(), dec("2").unwrap()])
        );
    }
}
