//! Python values for call-based tests and Python's `==` on them.
//!
//! LiveCodeBench's `grade_call_based` checks `prediction == json.loads(expected)` after turning a
//! returned tuple into a list. The harness sends the returned value out in a tagged encoding (ints
//! as digit strings, floats as `repr`, tuples and dicts marked), the expected output is parsed
//! here with `json.loads`' rules (ints without limit, `NaN`/`Infinity`, the last duplicate key
//! wins) and the two are compared with Python's semantics: `1 == 1.0 == True`, an int equals a
//! float only if the float is exactly that integer, a tuple never equals a list (only the
//! top-level tuple is converted), dicts compare by key set and values. A value of any other type
//! (a set, a custom class) is never equal: LiveCodeBench would call its `__eq__`, which a hostile
//! program can make always true.

/// A Python value that a test can return or expect.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Py {
    None,
    Bool(bool),
    /// Canonical decimal digits (`str(int)`).
    Int(String),
    Float(f64),
    Str(String),
    List(Vec<Py>),
    Tuple(Vec<Py>),
    Dict(Vec<(Py, Py)>),
    /// Any other type (its name); equal to nothing.
    Other(String),
}

/// Python's `a == b` for the values above.
pub(crate) fn py_eq(a: &Py, b: &Py) -> bool {
    use Py::*;
    if let (Some(x), Some(y)) = (a.number(), b.number()) {
        return x.eq(&y);
    }
    match (a, b) {
        (None, None) => true,
        (Str(x), Str(y)) => x == y,
        (List(x), List(y)) | (Tuple(x), Tuple(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| py_eq(p, q))
        }
        (Dict(x), Dict(y)) => {
            x.len() == y.len()
                && x.iter().all(|(k, v)| {
                    y.iter()
                        .find(|(k2, _)| py_eq(k, k2))
                        .is_some_and(|(_, v2)| py_eq(v, v2))
                })
        }
        _ => false,
    }
}

enum Number<'a> {
    Int(&'a str),
    Float(f64),
}

impl Number<'_> {
    fn eq(&self, other: &Number) -> bool {
        match (self, other) {
            (Number::Int(a), Number::Int(b)) => a == b,
            (Number::Float(a), Number::Float(b)) => a == b,
            (Number::Int(i), Number::Float(f)) | (Number::Float(f), Number::Int(i)) => {
                // exact: Python compares int and float without rounding either
                f.is_finite() && f.fract() == 0.0 && {
                    let s = format!("{f:.0}");
                    let s = if s == "-0" { "0".to_string() } else { s };
                    s == *i
                }
            }
        }
    }
}

impl Py {
    fn number(&self) -> Option<Number<'_>> {
        match self {
            Py::Bool(b) => Some(Number::Int(if *b { "1" } else { "0" })),
            Py::Int(s) => Some(Number::Int(s)),
            Py::Float(f) => Some(Number::Float(*f)),
            _ => None,
        }
    }
}

/// Decodes the harness's tagged encoding of a returned value.
pub(crate) fn decode_prediction(bytes: &[u8]) -> Result<Py, String> {
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    from_tagged(&v)
}

fn from_tagged(v: &serde_json::Value) -> Result<Py, String> {
    use serde_json::Value;
    Ok(match v {
        Value::Null => Py::None,
        Value::Bool(b) => Py::Bool(*b),
        Value::String(s) => Py::Str(s.clone()),
        Value::Array(items) => Py::List(items.iter().map(from_tagged).collect::<Result<_, _>>()?),
        Value::Number(_) => return Err("untagged number".into()),
        Value::Object(map) => {
            let (tag, inner) = map
                .iter()
                .next()
                .filter(|_| map.len() == 1)
                .ok_or("bad tag")?;
            match (tag.as_str(), inner) {
                ("i", Value::String(s)) => Py::Int(canonical_int(s).ok_or("bad int")?),
                ("f", Value::String(s)) => Py::Float(parse_py_float(s).ok_or("bad float")?),
                ("t", Value::Array(items)) => {
                    Py::Tuple(items.iter().map(from_tagged).collect::<Result<_, _>>()?)
                }
                ("d", Value::Array(pairs)) => Py::Dict(
                    pairs
                        .iter()
                        .map(|p| match p.as_array().map(Vec::as_slice) {
                            Some([k, v]) => Ok((from_tagged(k)?, from_tagged(v)?)),
                            _ => Err("bad dict item".to_string()),
                        })
                        .collect::<Result<_, _>>()?,
                ),
                ("o", Value::String(s)) => Py::Other(s.clone()),
                _ => return Err(format!("unknown tag {tag:?}")),
            }
        }
    })
}

/// `str(int(s))` for an optionally signed run of ASCII digits.
fn canonical_int(s: &str) -> Option<String> {
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let trimmed = digits.trim_start_matches('0');
    Some(match (trimmed.is_empty(), neg) {
        (true, _) => "0".to_string(),
        (false, true) => format!("-{trimmed}"),
        (false, false) => trimmed.to_string(),
    })
}

/// A float from Python's `repr` (`inf`, `-inf`, `nan` included).
fn parse_py_float(s: &str) -> Option<f64> {
    match s {
        "inf" => Some(f64::INFINITY),
        "-inf" => Some(f64::NEG_INFINITY),
        "nan" | "-nan" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
}

/// `json.loads(text)` as Python's json module reads it.
pub(crate) fn parse_json(text: &str) -> Result<Py, String> {
    let mut p = Parser {
        s: text.as_bytes(),
        i: 0,
    };
    p.ws();
    let v = p.value(0)?;
    p.ws();
    if p.i != p.s.len() {
        return Err(format!("extra data at byte {}", p.i));
    }
    Ok(v)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn err<T>(&self, what: &str) -> Result<T, String> {
        Err(format!("{what} at byte {}", self.i))
    }

    fn eat(&mut self, lit: &str) -> bool {
        let ok = self.s[self.i..].starts_with(lit.as_bytes());
        if ok {
            self.i += lit.len();
        }
        ok
    }

    fn value(&mut self, depth: usize) -> Result<Py, String> {
        if depth > 1000 {
            return self.err("nesting too deep");
        }
        match self.s.get(self.i) {
            None => self.err("expecting value"),
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => Ok(Py::Str(self.string()?)),
            _ if self.eat("null") => Ok(Py::None),
            _ if self.eat("true") => Ok(Py::Bool(true)),
            _ if self.eat("false") => Ok(Py::Bool(false)),
            _ if self.eat("NaN") => Ok(Py::Float(f64::NAN)),
            _ if self.eat("Infinity") => Ok(Py::Float(f64::INFINITY)),
            _ if self.eat("-Infinity") => Ok(Py::Float(f64::NEG_INFINITY)),
            _ => self.number(),
        }
    }

    /// Python's NUMBER_RE: `(-?(?:0|[1-9]\d*))(\.\d+)?([eE][-+]?\d+)?`.
    fn number(&mut self) -> Result<Py, String> {
        let start = self.i;
        let digits = |p: &mut Self| {
            let s = p.i;
            while p.i < p.s.len() && p.s[p.i].is_ascii_digit() {
                p.i += 1;
            }
            p.i - s
        };
        self.eat("-");
        match self.s.get(self.i) {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                digits(self);
            }
            _ => return Err(format!("expecting value at byte {start}")),
        }
        let int_end = self.i;
        let mut float = false;
        if self.s.get(self.i) == Some(&b'.') {
            let save = self.i;
            self.i += 1;
            if digits(self) == 0 {
                self.i = save;
            } else {
                float = true;
            }
        }
        if matches!(self.s.get(self.i), Some(b'e' | b'E')) {
            let save = self.i;
            self.i += 1;
            if matches!(self.s.get(self.i), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if digits(self) == 0 {
                self.i = save;
            } else {
                float = true;
            }
        }
        let text = std::str::from_utf8(&self.s[start..self.i]).expect("ascii");
        if float {
            Ok(Py::Float(
                text.parse()
                    .map_err(|_| format!("bad number at byte {start}"))?,
            ))
        } else {
            Ok(Py::Int(
                canonical_int(&text[..int_end - start]).expect("digits"),
            ))
        }
    }

    fn string(&mut self) -> Result<String, String> {
        self.i += 1; // opening quote
        let mut out = String::new();
        let mut units: Vec<u16> = Vec::new(); // \u escapes, joined into surrogate pairs
        loop {
            let Some(&c) = self.s.get(self.i) else {
                return self.err("unterminated string");
            };
            if c != b'\\' && !units.is_empty() {
                out.extend(char::decode_utf16(units.drain(..)).map(|r| r.unwrap_or('\u{fffd}')));
            }
            match c {
                b'"' => {
                    self.i += 1;
                    return Ok(out);
                }
                0..=0x1f => return self.err("invalid control character"),
                b'\\' => {
                    let esc = *self.s.get(self.i + 1).ok_or("unterminated string")?;
                    self.i += 2;
                    if esc == b'u' {
                        let hex = self.s.get(self.i..self.i + 4).ok_or("bad \\u escape")?;
                        let hex = std::str::from_utf8(hex).map_err(|_| "bad \\u escape")?;
                        units.push(u16::from_str_radix(hex, 16).map_err(|_| "bad \\u escape")?);
                        self.i += 4;
                        continue;
                    }
                    if !units.is_empty() {
                        out.extend(
                            char::decode_utf16(units.drain(..)).map(|r| r.unwrap_or('\u{fffd}')),
                        );
                    }
                    out.push(match esc {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        _ => return self.err("invalid escape"),
                    });
                }
                _ => {
                    // copy one UTF-8 encoded character
                    let len = match c {
                        0xf0.. => 4,
                        0xe0.. => 3,
                        0xc0.. => 2,
                        _ => 1,
                    };
                    let bytes = self.s.get(self.i..self.i + len).ok_or("bad utf-8")?;
                    out.push_str(std::str::from_utf8(bytes).map_err(|_| "bad utf-8")?);
                    self.i += len;
                }
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Py, String> {
        self.i += 1;
        let mut items = Vec::new();
        self.ws();
        if self.eat("]") {
            return Ok(Py::List(items));
        }
        loop {
            self.ws();
            items.push(self.value(depth + 1)?);
            self.ws();
            if self.eat("]") {
                return Ok(Py::List(items));
            }
            if !self.eat(",") {
                return self.err("expecting ',' delimiter");
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Py, String> {
        self.i += 1;
        let mut items: Vec<(Py, Py)> = Vec::new();
        self.ws();
        if self.eat("}") {
            return Ok(Py::Dict(items));
        }
        loop {
            self.ws();
            if self.s.get(self.i) != Some(&b'"') {
                return self.err("expecting property name");
            }
            let key = Py::Str(self.string()?);
            self.ws();
            if !self.eat(":") {
                return self.err("expecting ':' delimiter");
            }
            self.ws();
            let value = self.value(depth + 1)?;
            match items.iter_mut().find(|(k, _)| *k == key) {
                Some(slot) => slot.1 = value, // the last duplicate key wins
                None => items.push((key, value)),
            }
            self.ws();
            if self.eat("}") {
                return Ok(Py::Dict(items));
            }
            if !self.eat(",") {
                return self.err("expecting ',' delimiter");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn j(s: &str) -> Py {
        parse_json(s).unwrap()
    }

    #[test]
    fn json_follows_python() {
        assert_eq!(
            j("123456789012345678901234567890"),
            Py::Int("123456789012345678901234567890".into())
        );
        assert_eq!(j("-0"), Py::Int("0".into()));
        assert_eq!(j("1.0"), Py::Float(1.0));
        assert_eq!(j("1e400"), Py::Float(f64::INFINITY));
        assert_eq!(
            j(" [1, \"a\\u00e9\\ud83d\\ude00\", null] "),
            Py::List(vec![Py::Int("1".into()), Py::Str("aé😀".into()), Py::None])
        );
        assert_eq!(
            j("{\"a\": 1, \"a\": 2}"),
            Py::Dict(vec![(Py::Str("a".into()), Py::Int("2".into()))])
        );
        assert!(matches!(j("NaN"), Py::Float(f) if f.is_nan()));
        for bad in ["01", "[1,]", "1.", "\"a\nb\"", "{1: 2}", "tru", "[1] x", ""] {
            assert!(parse_json(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn equality_follows_python() {
        let int = |s: &str| Py::Int(s.into());
        assert!(py_eq(&int("1"), &Py::Float(1.0)));
        assert!(py_eq(&Py::Bool(true), &int("1")));
        assert!(!py_eq(
            &int("9007199254740993"),
            &Py::Float(9007199254740992.0)
        ));
        // str(int(1e300)) in Python
        let big = "1000000000000000052504760255204420248704468581108159154915854115511802457988908195786371375080447864043704443832883878176942523235360430575644792184786706982848387200926575803737830233794788090059368953234970799945081119038967640880074652742780142494579258788820056842838115669472196386865459400540160";
        assert!(py_eq(&int(big), &Py::Float(1e300)));
        assert!(py_eq(&int("0"), &Py::Float(-0.0)));
        assert!(!py_eq(&Py::Float(f64::NAN), &Py::Float(f64::NAN)));
        assert!(!py_eq(
            &Py::Tuple(vec![int("1")]),
            &Py::List(vec![int("1")])
        ));
        assert!(!py_eq(&Py::Str("1".into()), &int("1")));
        assert!(!py_eq(&Py::Other("set".into()), &Py::Other("set".into())));
        let d1 = Py::Dict(vec![
            (Py::Str("a".into()), int("1")),
            (Py::Str("b".into()), int("2")),
        ]);
        let d2 = Py::Dict(vec![
            (Py::Str("b".into()), Py::Float(2.0)),
            (Py::Str("a".into()), int("1")),
        ]);
        assert!(py_eq(&d1, &d2));
    }

    #[test]
    fn tagged_prediction_decodes() {
        let p = decode_prediction(br#"[{"i":"-12"},{"f":"0.5"},"s",{"t":[true,null]},{"d":[[{"i":"1"},{"f":"inf"}]]},{"o":"set"}]"#).unwrap();
        assert_eq!(
            p,
            Py::List(vec![
                Py::Int("-12".into()),
                Py::Float(0.5),
                Py::Str("s".into()),
                Py::Tuple(vec![Py::Bool(true), Py::None]),
                Py::Dict(vec![(Py::Int("1".into()), Py::Float(f64::INFINITY))]),
                Py::Other("set".into()),
            ])
        );
        assert!(decode_prediction(b"[1]").is_err());
    }
}
