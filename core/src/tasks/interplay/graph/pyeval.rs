//! `float(eval(s, {"__builtins__": {}}))` for the strings the solution parser lets through
//! (`^[0-9+\-*/().\s]+$`): Python's arithmetic on ints and floats with `+ - * / // **`,
//! unary signs and parentheses. Anything Python rejects (syntax errors such as `07` or `2 3`,
//! division by zero, calls like `2(3)`, complex results, overflow) gives `None`.
//!
//! Integers are exact up to `i128`; beyond that they continue as floats (Python's are unbounded),
//! which can only matter for model outputs with numbers above 10^38.

use crate::metrics::exact::int_ratio_to_f64;

/// Python's limit on nested parentheses (the tokenizer's `MAXLEVEL`).
const MAX_PAREN_DEPTH: usize = 200;
/// Guard against pathological nesting of unary operators.
const MAX_RECURSION: usize = 1000;

/// Evaluates `s` as Python would and converts the result with `float()`.
pub fn eval_float(s: &str) -> Option<f64> {
    let tokens = tokenize(s)?;
    let mut parser = Parser {
        tokens: &tokens,
        pos: 0,
        depth: 0,
    };
    let value = parser.expr()?;
    if parser.pos != tokens.len() {
        return None;
    }
    match value {
        Num::Int(i) => Some(i as f64),
        Num::Float(f) => Some(f),
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Tok {
    Int(Num),
    Float(f64),
    Plus,
    Minus,
    Star,
    Slash,
    DoubleSlash,
    Power,
    LParen,
    RParen,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Num {
    Int(i128),
    Float(f64),
}

fn tokenize(s: &str) -> Option<Vec<Tok>> {
    let chars: Vec<char> = s.chars().collect();
    let mut tokens = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            ' ' | '\t' | '\u{c}' => i += 1,
            '\n' | '\r' => {
                // A newline ends the logical line outside parentheses; only more blank lines
                // may follow.
                if depth == 0
                    && !chars[i..]
                        .iter()
                        .all(|c| matches!(c, ' ' | '\t' | '\u{c}' | '\n' | '\r'))
                {
                    return None;
                }
                i += 1;
            }
            '0'..='9' | '.' => {
                let (tok, next) = number(&chars, i)?;
                tokens.push(tok);
                i = next;
            }
            '+' => {
                tokens.push(Tok::Plus);
                i += 1;
            }
            '-' => {
                tokens.push(Tok::Minus);
                i += 1;
            }
            '*' => {
                if chars.get(i + 1) == Some(&'*') {
                    tokens.push(Tok::Power);
                    i += 2;
                } else {
                    tokens.push(Tok::Star);
                    i += 1;
                }
            }
            '/' => {
                if chars.get(i + 1) == Some(&'/') {
                    tokens.push(Tok::DoubleSlash);
                    i += 2;
                } else {
                    tokens.push(Tok::Slash);
                    i += 1;
                }
            }
            '(' => {
                depth += 1;
                if depth >= MAX_PAREN_DEPTH {
                    return None;
                }
                tokens.push(Tok::LParen);
                i += 1;
            }
            ')' => {
                depth = depth.checked_sub(1)?;
                tokens.push(Tok::RParen);
                i += 1;
            }
            _ => return None,
        }
    }
    Some(tokens)
}

/// One numeric literal starting at `start`: digits with an optional fraction, or a fraction
/// alone. Decimal integers other than zero may not start with `0` (Python's rule).
fn number(chars: &[char], start: usize) -> Option<(Tok, usize)> {
    let mut i = start;
    while i < chars.len() && chars[i].is_ascii_digit() {
        i += 1;
    }
    let int_digits: String = chars[start..i].iter().collect();
    if i < chars.len() && chars[i] == '.' {
        i += 1;
        let frac_start = i;
        while i < chars.len() && chars[i].is_ascii_digit() {
            i += 1;
        }
        if int_digits.is_empty() && frac_start == i {
            return None; // a lone "."
        }
        let text: String = chars[start..i].iter().collect();
        return Some((Tok::Float(text.parse().ok()?), i));
    }
    if int_digits.len() > 1 && int_digits.starts_with('0') && int_digits.chars().any(|c| c != '0') {
        return None; // "leading zeros in decimal integer literals are not permitted"
    }
    let tok = match int_digits.parse::<i128>() {
        Ok(v) => Tok::Int(Num::Int(v)),
        Err(_) => Tok::Int(Num::Float(int_digits.parse().ok()?)),
    };
    Some((tok, i))
}

struct Parser<'a> {
    tokens: &'a [Tok],
    pos: usize,
    depth: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<Tok> {
        self.tokens.get(self.pos).copied()
    }

    fn eat(&mut self, tok: Tok) -> bool {
        if self.peek() == Some(tok) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expr(&mut self) -> Option<Num> {
        let mut value = self.term()?;
        loop {
            if self.eat(Tok::Plus) {
                value = add(value, self.term()?);
            } else if self.eat(Tok::Minus) {
                value = sub(value, self.term()?);
            } else {
                return Some(value);
            }
        }
    }

    fn term(&mut self) -> Option<Num> {
        let mut value = self.factor()?;
        loop {
            if self.eat(Tok::Star) {
                value = mul(value, self.factor()?);
            } else if self.eat(Tok::Slash) {
                value = true_div(value, self.factor()?)?;
            } else if self.eat(Tok::DoubleSlash) {
                value = floor_div(value, self.factor()?)?;
            } else {
                return Some(value);
            }
        }
    }

    fn factor(&mut self) -> Option<Num> {
        self.depth += 1;
        if self.depth > MAX_RECURSION {
            return None;
        }
        let value = if self.eat(Tok::Plus) {
            self.factor()
        } else if self.eat(Tok::Minus) {
            self.factor().map(neg)
        } else {
            self.power()
        };
        self.depth -= 1;
        value
    }

    fn power(&mut self) -> Option<Num> {
        let base = self.atom()?;
        // `atom(...)` is a call: valid syntax, but a TypeError at run time.
        if self.peek() == Some(Tok::LParen) {
            return None;
        }
        if self.eat(Tok::Power) {
            let exponent = self.factor()?;
            return pow(base, exponent);
        }
        Some(base)
    }

    fn atom(&mut self) -> Option<Num> {
        match self.peek()? {
            Tok::Int(n) => {
                self.pos += 1;
                Some(n)
            }
            Tok::Float(f) => {
                self.pos += 1;
                Some(Num::Float(f))
            }
            Tok::LParen => {
                self.pos += 1;
                // `()` is an empty tuple, which float() rejects.
                let value = self.expr()?;
                self.eat(Tok::RParen).then_some(value)
            }
            _ => None,
        }
    }
}

fn to_float(n: Num) -> f64 {
    match n {
        Num::Int(i) => i as f64,
        Num::Float(f) => f,
    }
}

fn int_op(a: Num, b: Num, int: fn(i128, i128) -> Option<i128>, float: fn(f64, f64) -> f64) -> Num {
    match (a, b) {
        (Num::Int(x), Num::Int(y)) => {
            int(x, y).map_or_else(|| Num::Float(float(x as f64, y as f64)), Num::Int)
        }
        _ => Num::Float(float(to_float(a), to_float(b))),
    }
}

fn add(a: Num, b: Num) -> Num {
    int_op(a, b, i128::checked_add, |x, y| x + y)
}

fn sub(a: Num, b: Num) -> Num {
    int_op(a, b, i128::checked_sub, |x, y| x - y)
}

fn mul(a: Num, b: Num) -> Num {
    int_op(a, b, i128::checked_mul, |x, y| x * y)
}

fn neg(a: Num) -> Num {
    match a {
        Num::Int(i) => i.checked_neg().map_or(Num::Float(-(i as f64)), Num::Int),
        Num::Float(f) => Num::Float(-f),
    }
}

fn true_div(a: Num, b: Num) -> Option<Num> {
    match (a, b) {
        (Num::Int(x), Num::Int(y)) => int_ratio_to_f64(x, y).map(Num::Float),
        _ => {
            let (x, y) = (to_float(a), to_float(b));
            (y != 0.0).then(|| Num::Float(x / y))
        }
    }
}

fn floor_div(a: Num, b: Num) -> Option<Num> {
    match (a, b) {
        (Num::Int(_), Num::Int(0)) => None,
        (Num::Int(x), Num::Int(y)) => Some(match x.checked_div(y) {
            Some(q) if x % y != 0 && ((x < 0) != (y < 0)) => Num::Int(q - 1),
            Some(q) => Num::Int(q),
            None => Num::Float((x as f64 / y as f64).floor()),
        }),
        _ => float_floor_div(to_float(a), to_float(b)).map(Num::Float),
    }
}

/// CPython's `float_floor_div` (via `_float_div_mod`).
fn float_floor_div(vx: f64, wx: f64) -> Option<f64> {
    if wx == 0.0 {
        return None;
    }
    let m = vx % wx;
    let mut div = (vx - m) / wx;
    if m != 0.0 && ((wx < 0.0) != (m < 0.0)) {
        div -= 1.0;
    }
    Some(if div != 0.0 {
        let mut floordiv = div.floor();
        if div - floordiv > 0.5 {
            floordiv += 1.0;
        }
        floordiv
    } else {
        0f64.copysign(vx / wx)
    })
}

fn pow(base: Num, exponent: Num) -> Option<Num> {
    match (base, exponent) {
        (Num::Int(b), Num::Int(e)) if e >= 0 => {
            let exact = u32::try_from(e).ok().and_then(|e| b.checked_pow(e));
            match exact {
                Some(v) => Some(Num::Int(v)),
                None => float_pow(b as f64, e as f64).map(Num::Float),
            }
        }
        _ => float_pow(to_float(base), to_float(exponent)).map(Num::Float),
    }
}

/// CPython's `float_pow` for finite operands: `None` where it raises (zero to a negative
/// power, overflow) or returns a complex number (negative base, fractional exponent).
fn float_pow(iv: f64, iw: f64) -> Option<f64> {
    if iw == 0.0 {
        return Some(1.0);
    }
    if iv.is_nan() || iw.is_nan() || iv.is_infinite() || iw.is_infinite() {
        return Some(iv.powf(iw));
    }
    let iw_is_odd_int = iw.floor() == iw && (iw % 2.0).abs() == 1.0;
    if iv == 0.0 {
        if iw < 0.0 {
            return None;
        }
        return Some(if iw_is_odd_int { iv } else { 0.0 });
    }
    let (magnitude, negate) = if iv < 0.0 {
        if iw.floor() != iw {
            return None;
        }
        (-iv, iw_is_odd_int)
    } else {
        (iv, false)
    };
    if magnitude == 1.0 {
        return Some(if negate { -1.0 } else { 1.0 });
    }
    let result = magnitude.powf(iw);
    if result.is_infinite() {
        return None;
    }
    Some(if negate { -result } else { result })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_arithmetic() {
        let cases: &[(&str, Option<f64>)] = &[
            ("2 * 4", Some(8.0)),
            ("8 + 4.0", Some(12.0)),
            ("3 - 5", Some(-2.0)),
            ("7 / 2", Some(3.5)),
            ("7 // 2", Some(3.0)),
            ("-7 // 2", Some(-4.0)),
            ("-7.0 // 2", Some(-4.0)),
            ("2 ** 3 ** 2", Some(512.0)),
            ("-2 ** 2", Some(-4.0)),
            ("2 ** -1", Some(0.5)),
            ("(1 + 2) * 3", Some(9.0)),
            ("5 - -3.0", Some(8.0)),
            ("1 / 0", None),
            ("1 // 0", None),
            ("0 ** -1", None),
            ("(-8) ** 0.5", None),
            ("07", None),
            ("00", Some(0.0)),
            ("07.5", Some(7.5)),
            ("1.", Some(1.0)),
            (".5", Some(0.5)),
            ("2 3", None),
            ("2(3)", None),
            ("()", None),
            ("1.2.3", None),
            ("3 +", None),
            ("2 * * 3", None),
            ("(1 +\n 2)", Some(3.0)),
            ("1 +\n 2", None),
            ("10.0 ** 400", None),
            ("2 ** 200 / 2 ** 199", Some(2.0)),
            ("3 ** 2 ** -1", Some(3f64.powf(0.5))),
        ];
        for &(s, want) in cases {
            assert_eq!(eval_float(s), want, "{s:?}");
        }
    }
}
