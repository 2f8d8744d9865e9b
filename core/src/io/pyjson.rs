//! JSON written byte-for-byte like Python's `json.dumps`.
//!
//! The reference scripts write their artifacts with `json.dumps` (compact, `", "` / `": "`
//! separators) or `json.dump(..., indent=2)`, with or without `ensure_ascii`. Reproducing those
//! files exactly needs three things serde_json does not give: insertion-ordered objects, Python's
//! float `repr` (`1e-05`, `21.0`), and Python's escaping rules. [`Json`] is that small value type.

use std::fmt::Write as _;

/// An ordered JSON value, serialised like Python's `json` module.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    /// `null` (Python `None`).
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A Python `int`.
    Int(i64),
    /// A Python `float` (written with `repr`).
    Float(f64),
    /// A string.
    Str(String),
    /// A list.
    Array(Vec<Json>),
    /// A dict, in insertion order.
    Object(Vec<(String, Json)>),
}

/// How to lay the JSON out: `json.dumps(v)` is [`Style::COMPACT`], `json.dump(v, indent=2)` is
/// [`Style::INDENT2`]; `ensure_ascii` escapes every non-ASCII character (the Python default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    /// Spaces per nesting level, or `None` for one line.
    pub indent: Option<usize>,
    /// Escape non-ASCII characters (and DEL) as `\uXXXX`.
    pub ensure_ascii: bool,
}

impl Style {
    /// `json.dumps(value)`.
    pub const COMPACT: Style = Style {
        indent: None,
        ensure_ascii: true,
    };
    /// `json.dumps(value, ensure_ascii=False)`.
    pub const COMPACT_UTF8: Style = Style {
        indent: None,
        ensure_ascii: false,
    };
    /// `json.dump(value, f, indent=2)`.
    pub const INDENT2: Style = Style {
        indent: Some(2),
        ensure_ascii: true,
    };
    /// `json.dump(value, f, indent=2, ensure_ascii=False)`.
    pub const INDENT2_UTF8: Style = Style {
        indent: Some(2),
        ensure_ascii: false,
    };
}

impl Json {
    /// An object from `(key, value)` pairs, keeping their order.
    pub fn object<K: Into<String>>(pairs: impl IntoIterator<Item = (K, Json)>) -> Json {
        Json::Object(pairs.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    /// The value of `key` in an object (the first, as Python keeps one); `None` otherwise.
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(pairs) => pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The number of an `Int` or `Float`.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Json::Int(v) => Some(*v as f64),
            Json::Float(v) => Some(*v),
            _ => None,
        }
    }

    /// Serialises `self` in `style`.
    pub fn dumps(&self, style: Style) -> String {
        let mut out = String::new();
        write_value(&mut out, self, style, 0);
        out
    }
}

impl From<bool> for Json {
    fn from(v: bool) -> Self {
        Json::Bool(v)
    }
}

impl From<i64> for Json {
    fn from(v: i64) -> Self {
        Json::Int(v)
    }
}

impl From<usize> for Json {
    fn from(v: usize) -> Self {
        Json::Int(i64::try_from(v).expect("count fits in i64"))
    }
}

impl From<f64> for Json {
    fn from(v: f64) -> Self {
        Json::Float(v)
    }
}

impl From<&str> for Json {
    fn from(v: &str) -> Self {
        Json::Str(v.to_owned())
    }
}

impl From<String> for Json {
    fn from(v: String) -> Self {
        Json::Str(v)
    }
}

impl<T: Into<Json>> From<Option<T>> for Json {
    fn from(v: Option<T>) -> Self {
        v.map_or(Json::Null, Into::into)
    }
}

impl<T: Into<Json>> From<Vec<T>> for Json {
    fn from(v: Vec<T>) -> Self {
        Json::Array(v.into_iter().map(Into::into).collect())
    }
}

fn write_value(out: &mut String, value: &Json, style: Style, depth: usize) {
    match value {
        Json::Null => out.push_str("null"),
        Json::Bool(true) => out.push_str("true"),
        Json::Bool(false) => out.push_str("false"),
        Json::Int(v) => {
            let _ = write!(out, "{v}");
        }
        Json::Float(v) => out.push_str(&float_repr(*v)),
        Json::Str(s) => write_string(out, s, style.ensure_ascii),
        Json::Array(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                separator(out, style, depth + 1, i == 0);
                write_value(out, item, style, depth + 1);
            }
            close(out, style, depth);
            out.push(']');
        }
        Json::Object(pairs) => {
            if pairs.is_empty() {
                out.push_str("{}");
                return;
            }
            out.push('{');
            for (i, (key, item)) in pairs.iter().enumerate() {
                separator(out, style, depth + 1, i == 0);
                write_string(out, key, style.ensure_ascii);
                out.push_str(": ");
                write_value(out, item, style, depth + 1);
            }
            close(out, style, depth);
            out.push('}');
        }
    }
}

/// The text before an item: `", "` between items on one line, `",\n" + indent` when indenting.
fn separator(out: &mut String, style: Style, depth: usize, first: bool) {
    match style.indent {
        None => {
            if !first {
                out.push_str(", ");
            }
        }
        Some(width) => {
            if !first {
                out.push(',');
            }
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', width * depth));
        }
    }
}

fn close(out: &mut String, style: Style, depth: usize) {
    if let Some(width) = style.indent {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', width * depth));
    }
}

fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7e) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest round-tripping digits, positional for exponents in
/// `[-4, 16)`, otherwise `d.ddde±XX`; `NaN` and `Infinity` as `json` writes them.
pub fn float_repr(v: f64) -> String {
    if v.is_nan() {
        return "NaN".to_owned();
    }
    if v.is_infinite() {
        return if v > 0.0 { "Infinity" } else { "-Infinity" }.to_owned();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0.0" } else { "0.0" }.to_owned();
    }
    // `{:e}` gives the shortest round-tripping digits, e.g. "-1.2345e-7".
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` always has an exponent");
    let exp: i32 = exp.parse().expect("integer exponent");
    let (sign, mantissa) = mantissa
        .strip_prefix('-')
        .map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let n = digits.len() as i32;
    let mut out = String::from(sign);
    if (-4..16).contains(&exp) {
        if exp < 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-exp - 1) as usize));
            out.push_str(&digits);
        } else if exp + 1 >= n {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', (exp + 1 - n) as usize));
            out.push_str(".0");
        } else {
            let point = (exp + 1) as usize;
            out.push_str(&digits[..point]);
            out.push('.');
            out.push_str(&digits[point..]);
        }
    } else {
        out.push_str(&digits[..1]);
        if n > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    out
}

/// Python's `json.loads` into an ordered [`Json`]: key order is kept (a repeated key keeps its
/// first position and takes the last value), numbers with a fraction or exponent are floats
/// (parsed with correct rounding, so [`float_repr`] gives back the text Python wrote), others
/// ints; `NaN` and `±Infinity` are accepted as Python accepts them. Errors give the byte offset.
pub fn parse(text: &str) -> Result<Json, String> {
    let mut parser = Parser { text, pos: 0 };
    let value = parser.value()?;
    parser.space();
    if parser.pos != text.len() {
        return Err(parser.error("extra data"));
    }
    Ok(value)
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn error(&self, what: &str) -> String {
        format!("{what} at byte {}", self.pos)
    }

    fn rest(&self) -> &str {
        &self.text[self.pos..]
    }

    fn space(&mut self) {
        let rest = self.rest();
        self.pos += rest.len() - rest.trim_start_matches([' ', '\t', '\n', '\r']).len();
    }

    fn eat(&mut self, token: &str) -> bool {
        let found = self.rest().starts_with(token);
        if found {
            self.pos += token.len();
        }
        found
    }

    fn value(&mut self) -> Result<Json, String> {
        self.space();
        for (token, value) in [
            ("null", Json::Null),
            ("true", Json::Bool(true)),
            ("false", Json::Bool(false)),
            ("NaN", Json::Float(f64::NAN)),
            ("Infinity", Json::Float(f64::INFINITY)),
            ("-Infinity", Json::Float(f64::NEG_INFINITY)),
        ] {
            if self.eat(token) {
                return Ok(value);
            }
        }
        match self.rest().chars().next() {
            Some('"') => self.string().map(Json::Str),
            Some('[') => {
                self.pos += 1;
                let mut items = Vec::new();
                self.space();
                if self.eat("]") {
                    return Ok(Json::Array(items));
                }
                loop {
                    items.push(self.value()?);
                    self.space();
                    if self.eat("]") {
                        return Ok(Json::Array(items));
                    }
                    if !self.eat(",") {
                        return Err(self.error("expected ',' or ']'"));
                    }
                }
            }
            Some('{') => {
                self.pos += 1;
                let mut pairs: Vec<(String, Json)> = Vec::new();
                self.space();
                if self.eat("}") {
                    return Ok(Json::Object(pairs));
                }
                loop {
                    self.space();
                    if !self.rest().starts_with('"') {
                        return Err(self.error("expected a string key"));
                    }
                    let key = self.string()?;
                    self.space();
                    if !self.eat(":") {
                        return Err(self.error("expected ':'"));
                    }
                    let value = self.value()?;
                    match pairs.iter_mut().find(|(k, _)| *k == key) {
                        Some((_, v)) => *v = value,
                        None => pairs.push((key, value)),
                    }
                    self.space();
                    if self.eat("}") {
                        return Ok(Json::Object(pairs));
                    }
                    if !self.eat(",") {
                        return Err(self.error("expected ',' or '}'"));
                    }
                }
            }
            Some(c) if c == '-' || c.is_ascii_digit() => self.number(),
            _ => Err(self.error("expected a JSON value")),
        }
    }

    fn number(&mut self) -> Result<Json, String> {
        let rest = self.rest();
        let len = rest.find(|c: char| !(c.is_ascii_digit() || matches!(c, '-' | '+' | '.' | 'e' | 'E'))).unwrap_or(rest.len());
        let token = &rest[..len];
        let is_float = token.contains(['.', 'e', 'E']);
        let value = if is_float {
            token.parse::<f64>().ok().map(Json::Float)
        } else {
            token.parse::<i64>().ok().map(Json::Int)
        };
        let value = value.ok_or_else(|| self.error("bad number"))?;
        self.pos += len;
        Ok(value)
    }

    fn string(&mut self) -> Result<String, String> {
        self.pos += 1; // the opening quote
        let mut out = String::new();
        loop {
            let rest = self.rest();
            let plain = rest.find(['"', '\\']).ok_or_else(|| self.error("unterminated string"))?;
            out.push_str(&rest[..plain]);
            self.pos += plain;
            if self.eat("\"") {
                return Ok(out);
            }
            self.pos += 1; // the backslash
            let escape = self.rest().chars().next().ok_or_else(|| self.error("unterminated string"))?;
            self.pos += 1;
            match escape {
                '"' => out.push('"'),
                '\\' => out.push('\\'),
                '/' => out.push('/'),
                'b' => out.push('\u{8}'),
                'f' => out.push('\u{c}'),
                'n' => out.push('\n'),
                'r' => out.push('\r'),
                't' => out.push('\t'),
                'u' => {
                    let first = self.hex4()?;
                    let code = if (0xd800..0xdc00).contains(&first) && self.rest().starts_with("\\u") {
                        let save = self.pos;
                        self.pos += 2;
                        let second = self.hex4()?;
                        if (0xdc00..0xe000).contains(&second) {
                            0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00)
                        } else {
                            self.pos = save;
                            first
                        }
                    } else {
                        first
                    };
                    // A lone surrogate has no UTF-8 form; Python keeps it, kiln substitutes.
                    out.push(char::from_u32(code).unwrap_or('\u{fffd}'));
                }
                _ => return Err(self.error("bad escape")),
            }
        }
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let digits = self.rest().get(..4).ok_or_else(|| self.error("bad \\u escape"))?;
        let code = u32::from_str_radix(digits, 16).map_err(|_| self.error("bad \\u escape"))?;
        self.pos += 4;
        Ok(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_round_trips_python_output() {
        let text = "{\n  \"b\": [1, 2.5, -0.0, 1e-05, null, true],\n  \"a\": {\"x\": \"\\u00e9\\ud83d\\ude00\\n\"},\n  \"c\": 0.36203703703703705, \"d\": NaN}";
        let value = parse(text).unwrap();
        assert_eq!(value.get("c"), Some(&Json::Float(0.36203703703703705)));
        assert_eq!(value.get("a").and_then(|a| a.get("x")), Some(&Json::from("é😀\n")));
        let back = value.dumps(Style::COMPACT);
        assert_eq!(back, "{\"b\": [1, 2.5, -0.0, 1e-05, null, true], \"a\": {\"x\": \"\\u00e9\\ud83d\\ude00\\n\"}, \"c\": 0.36203703703703705, \"d\": NaN}");
        assert_eq!(parse("{\"k\": 1, \"j\": 2, \"k\": 3}").unwrap(), Json::object([("k", Json::Int(3)), ("j", Json::Int(2))]));
        assert!(parse("[1, 2").unwrap_err().contains("byte"));
        assert!(parse("{} x").is_err());
    }

    #[test]
    fn floats_match_python_repr() {
        let cases = [
            (21.0, "21.0"),
            (0.1, "0.1"),
            (0.7458333333333336, "0.7458333333333336"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1.5e16, "1.5e+16"),
            (1e16, "1e+16"),
            (9999999999999998.0, "9999999999999998.0"),
            (123456.789, "123456.789"),
            (-2.5e-7, "-2.5e-07"),
            (1e300, "1e+300"),
            (-0.0, "-0.0"),
            (185.58662900188324, "185.58662900188324"),
        ];
        for (v, want) in cases {
            assert_eq!(float_repr(v), want, "{v:e}");
        }
    }

    #[test]
    fn layout_and_escaping_match_python() {
        let v = Json::object([
            ("a", Json::Int(1)),
            (
                "b",
                Json::Array(vec![Json::Float(2.0), Json::Null, Json::Bool(true)]),
            ),
            ("c", Json::object::<String>([])),
            ("d", Json::from("é\"\n\u{1}\u{7f}😀")),
        ]);
        assert_eq!(
            v.dumps(Style::COMPACT),
            r#"{"a": 1, "b": [2.0, null, true], "c": {}, "d": "\u00e9\"\n\u0001\u007f\ud83d\ude00"}"#
        );
        assert_eq!(
            v.dumps(Style::COMPACT_UTF8),
            "{\"a\": 1, \"b\": [2.0, null, true], \"c\": {}, \"d\": \"é\\\"\\n\\u0001\u{7f}😀\"}"
        );
        assert_eq!(
            Json::object([
                ("a", Json::Array(vec![Json::Int(1)])),
                ("b", Json::object::<String>([]))
            ])
            .dumps(Style::INDENT2),
            "{\n  \"a\": [\n    1\n  ],\n  \"b\": {}\n}"
        );
    }
}
