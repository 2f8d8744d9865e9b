//! Python's conversions of the JSON values and paths the reference scripts handle: `int(v)`,
//! `str(v)` and `str(pathlib.Path(p))`.

use std::path::Path;

use serde_json::Value;

/// Python's `int(value)` for the JSON values the reference feeds it: ints, floats (truncated),
/// booleans and decimal strings. `None` where Python raises.
pub fn py_int(value: &Value) -> Option<i64> {
    match value {
        Value::Bool(b) => Some(i64::from(*b)),
        Value::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.is_finite())
                .map(|f| f.trunc() as i64)
        }),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// Python's `str(value)` for a JSON scalar (`10` → `"10"`, `null` → `"None"`, `true` → `"True"`).
pub fn py_str(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => "None".to_owned(),
        Some(Value::Bool(true)) => "True".to_owned(),
        Some(Value::Bool(false)) => "False".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(i) => i.to_string(),
            None => n
                .as_f64()
                .map_or_else(|| n.to_string(), super::pyjson::float_repr),
        },
        Some(other) => other.to_string(),
    }
}

/// `str(pathlib.Path(p))`: drops `.` components, repeated and trailing slashes.
pub fn py_path(path: &Path) -> String {
    let text = path.to_string_lossy();
    let absolute = text.starts_with('/');
    let parts: Vec<&str> = text
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    match (absolute, parts.is_empty()) {
        (true, _) => format!("/{}", parts.join("/")),
        (false, true) => ".".to_owned(),
        (false, false) => parts.join("/"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_conversions() {
        assert_eq!(py_int(&serde_json::json!(12)), Some(12));
        assert_eq!(py_int(&serde_json::json!(12.9)), Some(12));
        assert_eq!(py_int(&serde_json::json!(" 7 ")), Some(7));
        assert_eq!(py_int(&serde_json::json!("x")), None);
        assert_eq!(py_str(Some(&serde_json::json!(10))), "10");
        assert_eq!(py_str(Some(&serde_json::json!("10"))), "10");
        assert_eq!(py_str(None), "None");
        assert_eq!(py_path(Path::new("./scoring//")), "scoring");
        assert_eq!(py_path(Path::new("a/./b")), "a/b");
    }
}
