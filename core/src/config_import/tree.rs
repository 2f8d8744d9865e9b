//! A source config as a tree of values (`serde_json::Value`): YAML and JSON files read into it,
//! dotted keys, Hydra-style overrides, OmegaConf interpolations.

use std::path::Path;

use serde_json::{Map, Value};
use yaml_rust2::{Yaml, YamlLoader};

use crate::error::{Error, Result};

/// Reads a YAML (or JSON, a subset of YAML) document into a tree.
pub fn parse_yaml(path: &Path, text: &str) -> Result<Value> {
    let docs = YamlLoader::load_from_str(text).map_err(|e| Error::data(path, Some(e.marker().line()), e.info().to_string()))?;
    Ok(docs.into_iter().next().map(from_yaml).unwrap_or(Value::Object(Map::new())))
}

/// Reads a `.json` file with serde_json, anything else as YAML.
pub fn parse_file(path: &Path, text: &str) -> Result<Value> {
    let tree = if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(text).map_err(|e| Error::json(path, None, e))?
    } else {
        parse_yaml(path, text)?
    };
    match tree {
        Value::Object(_) => Ok(tree),
        Value::Null => Ok(Value::Object(Map::new())),
        _ => Err(Error::data(path, None, "expected a mapping of keys to values at the top")),
    }
}

fn from_yaml(yaml: Yaml) -> Value {
    match yaml {
        Yaml::Real(s) => s.parse::<f64>().ok().and_then(|f| serde_json::Number::from_f64(f).map(Value::Number)).unwrap_or(Value::String(s)),
        Yaml::Integer(i) => Value::from(i),
        Yaml::String(s) => Value::String(s),
        Yaml::Boolean(b) => Value::Bool(b),
        Yaml::Array(items) => Value::Array(items.into_iter().map(from_yaml).collect()),
        Yaml::Hash(hash) => Value::Object(
            hash.into_iter()
                .map(|(k, v)| {
                    let key = match k {
                        Yaml::String(s) | Yaml::Real(s) => s,
                        Yaml::Integer(i) => i.to_string(),
                        Yaml::Boolean(b) => b.to_string(),
                        _ => String::from("~"),
                    };
                    (key, from_yaml(v))
                })
                .collect(),
        ),
        Yaml::Null | Yaml::BadValue | Yaml::Alias(_) => Value::Null,
    }
}

/// A value written on the command line (`key=value`): YAML's reading of it (`1e-6`, `True`,
/// `[a, b]`, `'text'`), or the text itself.
pub fn parse_value(text: &str) -> Value {
    if text.is_empty() {
        return Value::String(String::new());
    }
    match YamlLoader::load_from_str(text) {
        Ok(docs) if docs.len() == 1 => match from_yaml(docs.into_iter().next().unwrap_or(Yaml::Null)) {
            Value::Object(_) => Value::String(text.to_owned()),
            // YAML 1.2 reads `True` and `False` as strings; Hydra (YAML 1.1) as booleans.
            Value::String(s) if s == "True" || s == "False" => Value::Bool(s == "True"),
            value => value,
        },
        _ => Value::String(text.to_owned()),
    }
}

/// The value at `dotted` (`a.b.c`).
pub fn get<'a>(root: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted.split('.').try_fold(root, |node, key| node.as_object()?.get(key))
}

/// Sets `dotted` to `value`, creating mappings on the way; an error if a non-mapping is in
/// the way.
pub fn set(root: &mut Value, dotted: &str, value: Value) -> std::result::Result<(), String> {
    let mut node = root;
    let keys: Vec<&str> = dotted.split('.').collect();
    for (i, key) in keys.iter().enumerate() {
        let map = node.as_object_mut().ok_or_else(|| format!("{} is not a mapping", keys[..i].join(".")))?;
        if i + 1 == keys.len() {
            map.insert((*key).to_owned(), value);
            return Ok(());
        }
        node = map.entry((*key).to_owned()).or_insert_with(|| Value::Object(Map::new()));
    }
    Ok(())
}

/// Removes `dotted`; whether it was there.
pub fn remove(root: &mut Value, dotted: &str) -> bool {
    let (parent, last) = match dotted.rsplit_once('.') {
        Some((parent, last)) => (parent, last),
        None => ("", dotted),
    };
    let node = if parent.is_empty() { Some(root) } else { parent.split('.').try_fold(root, |node, key| node.as_object_mut()?.get_mut(key)) };
    node.and_then(Value::as_object_mut).is_some_and(|m| m.remove(last).is_some())
}

/// Every leaf of the tree (scalars, lists, empty mappings) with its dotted key, in order.
pub fn leaves(root: &Value) -> Vec<(String, Value)> {
    fn walk(node: &Value, prefix: &str, out: &mut Vec<(String, Value)>) {
        match node {
            Value::Object(map) if !map.is_empty() => {
                for (k, v) in map {
                    let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                    walk(v, &key, out);
                }
            }
            _ => out.push((prefix.to_owned(), node.clone())),
        }
    }
    let mut out = Vec::new();
    walk(root, "", &mut out);
    out
}

/// `over` laid over `base`, mapping by mapping (Hydra's merge).
pub fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(existing) if existing.is_object() && v.is_object() => merge(existing, v),
                    _ => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

/// How an override is applied (Hydra's grammar).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverrideMode {
    /// `key=value`: the key must exist.
    Set,
    /// `+key=value`: the key must not exist.
    Add,
    /// `++key=value`: either.
    Force,
    /// `~key`: removed.
    Delete,
}

/// A `[+|++|~]dotted.key=value` override.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    pub mode: OverrideMode,
    pub key: String,
    pub value: Value,
}

impl Override {
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        let (mode, rest) = if let Some(rest) = text.strip_prefix("++") {
            (OverrideMode::Force, rest)
        } else if let Some(rest) = text.strip_prefix('+') {
            (OverrideMode::Add, rest)
        } else if let Some(rest) = text.strip_prefix('~') {
            (OverrideMode::Delete, rest)
        } else {
            (OverrideMode::Set, text)
        };
        let (key, value) = match (rest.split_once('='), mode) {
            (Some((key, value)), _) => (key.trim(), parse_value(value.trim())),
            (None, OverrideMode::Delete) => (rest.trim(), Value::Null),
            (None, _) => return Err(format!("override {text:?} is not key=value")),
        };
        if key.is_empty() || key.split('.').any(str::is_empty) {
            return Err(format!("override {text:?} has no valid dotted key"));
        }
        Ok(Self { mode, key: key.to_owned(), value })
    }

    /// Applies the override to `root`, Hydra's way.
    pub fn apply(&self, root: &mut Value) -> std::result::Result<(), String> {
        let exists = get(root, &self.key).is_some();
        match self.mode {
            OverrideMode::Set if !exists => {
                Err(format!("could not override '{k}': no such key in the config (use +{k}=… to add it)", k = self.key))
            }
            OverrideMode::Add if exists => {
                Err(format!("could not append '{k}': the key is already in the config (use {k}=… or ++{k}=…)", k = self.key))
            }
            OverrideMode::Delete => {
                remove(root, &self.key);
                Ok(())
            }
            _ => set(root, &self.key, self.value.clone()),
        }
    }
}

/// `value` with OmegaConf interpolations resolved against `root`: `${a.b}`,
/// `${oc.select:a.b,default}` (and the same inside text). Unresolvable ones stay as written.
pub fn resolve(root: &Value, value: &Value) -> Value {
    resolve_depth(root, value, 0)
}

fn resolve_depth(root: &Value, value: &Value, depth: usize) -> Value {
    let Value::String(text) = value else { return value.clone() };
    if depth > 16 || !text.contains("${") {
        return value.clone();
    }
    let trimmed = text.trim();
    if trimmed.starts_with("${") && trimmed.ends_with('}') && trimmed[2..].find('}') == Some(trimmed.len() - 3) {
        return interpolate(root, &trimmed[2..trimmed.len() - 1], depth).unwrap_or_else(|| value.clone());
    }
    // Interpolations inside text become text.
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find("${") {
        let Some(len) = rest[start..].find('}') else { break };
        out += &rest[..start];
        match interpolate(root, &rest[start + 2..start + len], depth) {
            Some(Value::String(s)) => out += &s,
            Some(Value::Null) | None => out += &rest[start..start + len + 1],
            Some(other) => out += &other.to_string(),
        }
        rest = &rest[start + len + 1..];
    }
    out += rest;
    Value::String(out)
}

fn interpolate(root: &Value, inner: &str, depth: usize) -> Option<Value> {
    let inner = inner.trim();
    if let Some(args) = inner.strip_prefix("oc.select:") {
        let (key, default) = match args.split_once(',') {
            Some((key, default)) => (key.trim(), Some(parse_value(default.trim()))),
            None => (args.trim(), None),
        };
        return match get(root, key) {
            Some(found) => Some(resolve_depth(root, found, depth + 1)),
            None => default.or(Some(Value::Null)),
        };
    }
    if inner.starts_with('.') || inner.contains(':') {
        return None;
    }
    get(root, inner).map(|found| resolve_depth(root, found, depth + 1))
}

/// The text of a scalar for messages.
pub fn show(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_follow_hydra() {
        let mut root = parse_yaml(Path::new("x.yaml"), "a:\n  b: 1\n  c: ${a.b}\n  d: ${oc.select:a.e,7}\n  p: x/${a.b}/y\n").unwrap();
        assert_eq!(resolve(&root, get(&root, "a.c").unwrap()), Value::from(1));
        assert_eq!(resolve(&root, get(&root, "a.d").unwrap()), Value::from(7));
        assert_eq!(resolve(&root, get(&root, "a.p").unwrap()), Value::from("x/1/y"));
        Override::parse("a.b=1e-6").unwrap().apply(&mut root).unwrap();
        assert_eq!(get(&root, "a.b"), Some(&Value::from(1e-6)));
        assert!(Override::parse("a.z=1").unwrap().apply(&mut root).unwrap_err().contains("+a.z"));
        assert!(Override::parse("+a.b=1").unwrap().apply(&mut root).is_err());
        Override::parse("+a.z=True").unwrap().apply(&mut root).unwrap();
        assert_eq!(get(&root, "a.z"), Some(&Value::Bool(true)));
        Override::parse("++a.b='error'").unwrap().apply(&mut root).unwrap();
        assert_eq!(get(&root, "a.b"), Some(&Value::from("error")));
        assert_eq!(parse_value("[console,wandb]"), serde_json::json!(["console", "wandb"]));
    }
}
