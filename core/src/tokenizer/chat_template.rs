//! Hugging Face chat templates: the Jinja `chat_template` of a model's `tokenizer_config.json`
//! (or its `chat_template.jinja`), rendered as `transformers`' `apply_chat_template(...,
//! tokenize=False)` renders it.
//!
//! The engine is `minijinja` set up like transformers' sandboxed Jinja environment
//! (`utils/chat_template_utils.py`): `trim_blocks` and `lstrip_blocks`, loop controls, Python
//! string/dict methods (`.strip()`, `.startswith()`, `.items()`, … from `minijinja-contrib`'s
//! pycompat), `raise_exception(msg)`, and a `tojson` filter that writes `json.dumps(x,
//! ensure_ascii=False)` (transformers overrides Jinja's HTML-escaping one). The template sees
//! `messages`, `tools` (if any), `add_generation_prompt` and the special-token strings
//! (`bos_token`, `eos_token`, `pad_token`, `unk_token`) as transformers passes them.
//!
//! `{% generation %}` blocks (TRL's `*_training.jinja` templates) render their contents, as
//! transformers renders them; the masks they mark are not read (assistant targets come from
//! [`crate::data::chat`]). Not supported: `strftime_now` (an error names it).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use minijinja::value::{Kwargs, Serde, Value, ValueKind};
use minijinja::{Environment, ErrorKind};
use serde::Serialize;
use serde_json::Value as Json;

use crate::error::{Error, Result};
use crate::io::pyjson::float_repr;

/// The name of the one template in a [`ChatTemplate`]'s environment.
const NAME: &str = "chat_template";

/// A model's chat template, parsed once, and the special tokens it may refer to.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    source: String,
    origin: PathBuf,
    special_tokens: Vec<(&'static str, String)>,
    /// The environment holding the compiled template (shared by clones).
    env: Arc<Environment<'static>>,
}

impl ChatTemplate {
    /// A template from its Jinja source; `origin` names it in errors. Fails if it does not parse.
    pub fn new(source: impl Into<String>, origin: impl Into<PathBuf>) -> Result<Self> {
        let source = source.into();
        let origin = origin.into();
        let mut env = environment();
        env.add_template_owned(NAME, plain_generation_blocks(&source)).map_err(|e| template_error(&origin, e))?;
        Ok(Self { source, origin, special_tokens: Vec::new(), env: Arc::new(env) })
    }

    /// The template of a model directory, as transformers finds it: `chat_template.jinja` if
    /// present, else `tokenizer_config.json`'s `chat_template` (a string, or a list of
    /// `{name, template}` of which `default` is used). `None` when the model has none. The
    /// special tokens named in `tokenizer_config.json` are passed to the template.
    pub fn from_model_dir(dir: &Path) -> Result<Option<Self>> {
        let config_path = dir.join("tokenizer_config.json");
        let config = read_tokenizer_config(dir)?;
        let jinja_path = dir.join("chat_template.jinja");
        let mut template = if jinja_path.is_file() {
            let source = std::fs::read_to_string(&jinja_path).map_err(|e| Error::io(&jinja_path, e))?;
            Self::new(source, jinja_path)?
        } else {
            let Some(value) = config.as_ref().and_then(|c| c.get("chat_template")) else { return Ok(None) };
            let source = match value {
                Json::String(s) => s.clone(),
                Json::Array(named) => named
                    .iter()
                    .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
                    .and_then(|t| t.get("template").and_then(Json::as_str))
                    .ok_or_else(|| Error::config(&config_path, "chat_template: a list without a \"default\" template"))?
                    .to_owned(),
                Json::Null => return Ok(None),
                _ => return Err(Error::config(&config_path, "chat_template: expected a string or a list of {name, template}")),
            };
            Self::new(source, &config_path)?
        };
        if let Some(config) = &config {
            template.special_tokens = special_tokens(config);
        }
        Ok(Some(template))
    }

    /// The template at `path`, as TRL's `chat_template_path` names one: a model directory (see
    /// [`ChatTemplate::from_model_dir`]; one without a template is an error) or a Jinja file,
    /// which sees the special tokens of `tokenizer_dir`'s `tokenizer_config.json`.
    pub fn from_path(path: &Path, tokenizer_dir: &Path) -> Result<Self> {
        if path.is_dir() {
            return Self::from_model_dir(path)?
                .ok_or_else(|| Error::config(path, "no chat template here (chat_template.jinja, or tokenizer_config.json's chat_template)"));
        }
        if !path.extension().is_some_and(|e| e == "jinja" || e == "j2") {
            return Err(Error::config(path, "a chat template is a model directory or a .jinja file (as TRL's chat_template_path)"));
        }
        let source = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let mut template = Self::new(source, path)?;
        if let Some(config) = read_tokenizer_config(tokenizer_dir)? {
            template.special_tokens = special_tokens(&config);
        }
        Ok(template)
    }

    /// The Jinja source, as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The string of a special token the template sees (`bos_token`, `eos_token`, `pad_token`,
    /// `unk_token`), as its `tokenizer_config.json` names it.
    pub fn special_token(&self, key: &str) -> Option<&str> {
        self.special_tokens.iter().find(|(k, _)| *k == key).map(|(_, t)| t.as_str())
    }

    /// The file the template was read from (or the name given to [`ChatTemplate::new`]).
    pub fn origin(&self) -> &Path {
        &self.origin
    }

    /// Renders `messages` (anything serializing to a list of `{role, content, …}`), ending with
    /// the assistant header when `add_generation_prompt`.
    pub fn render<M: Serialize>(&self, messages: &[M], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// [`render`](Self::render) with tool schemas (`tools=` of `apply_chat_template`).
    pub fn render_with_tools<M: Serialize>(&self, messages: &[M], tools: Option<&Json>, add_generation_prompt: bool) -> Result<String> {
        let template = self.env.get_template(NAME).map_err(|e| self.error(e))?;
        let mut context = std::collections::BTreeMap::new();
        context.insert("messages", Value::from(Serde(messages)));
        context.insert("add_generation_prompt", Value::from(add_generation_prompt));
        if let Some(tools) = tools {
            context.insert("tools", Value::from(Serde(tools)));
        }
        for (key, token) in &self.special_tokens {
            context.insert(key, Value::from(token.as_str()));
        }
        template.render(Value::from(context)).map_err(|e| self.error(e))
    }

    fn error(&self, e: minijinja::Error) -> Error {
        template_error(&self.origin, e)
    }
}

/// An environment set up as transformers' sandboxed Jinja environment (see the module docs).
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    let mut syntax = minijinja::syntax::SyntaxConfig::builder();
    syntax.trim_blocks(true).lstrip_blocks(true);
    env.set_syntax(syntax.build().expect("default delimiters"));
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", tojson);
    env.add_function("raise_exception", |message: String| -> std::result::Result<Value, minijinja::Error> {
        Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
    });
    env.add_function("strftime_now", |_format: String| -> std::result::Result<Value, minijinja::Error> {
        Err(minijinja::Error::new(ErrorKind::InvalidOperation, "strftime_now is not supported by kiln's chat templates"))
    });
    env
}

/// A template's parse or render error, naming the file it came from.
fn template_error(origin: &Path, e: minijinja::Error) -> Error {
    let mut message = format!("chat template: {e}");
    if let Some(line) = e.line() {
        message.push_str(&format!(" (template line {line})"));
    }
    Error::Tokenizer { path: origin.to_path_buf(), message }
}

/// `{% generation %}` … `{% endgeneration %}` (transformers' extension marking assistant text)
/// as a block that renders its contents, its whitespace control (`{%-`, `-%}`) kept.
fn plain_generation_blocks(source: &str) -> String {
    static TAG: std::sync::LazyLock<regex::Regex> =
        std::sync::LazyLock::new(|| regex::Regex::new(r"\{%(-?)\s*(end)?generation\s*(-?)%\}").expect("a valid regex"));
    TAG.replace_all(source, |c: &regex::Captures| match c.get(2) {
        Some(_) => format!("{{%{} endif {}%}}", &c[1], &c[3]),
        None => format!("{{%{} if true {}%}}", &c[1], &c[3]),
    })
    .into_owned()
}

/// `dir`'s `tokenizer_config.json`, if it has one.
fn read_tokenizer_config(dir: &Path) -> Result<Option<Json>> {
    let path = dir.join("tokenizer_config.json");
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    Ok(Some(serde_json::from_str(&text).map_err(|e| Error::json(&path, None, e))?))
}

/// The special-token strings of a `tokenizer_config.json` (a string, or an added-token object's
/// `content`) that transformers passes to templates.
fn special_tokens(config: &Json) -> Vec<(&'static str, String)> {
    let token = |key: &str| match config.get(key) {
        Some(Json::String(s)) => Some(s.clone()),
        Some(Json::Object(o)) => o.get("content").and_then(Json::as_str).map(String::from),
        _ => None,
    };
    ["bos_token", "eos_token", "pad_token", "unk_token"].into_iter().filter_map(|key| Some((key, token(key)?))).collect()
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=indent, sort_keys=sort_keys)`.
fn tojson(value: &Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(value, indent, sort_keys.unwrap_or(false), 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

fn write_json(value: &Value, indent: Option<usize>, sort_keys: bool, level: usize, out: &mut String) -> std::result::Result<(), minijinja::Error> {
    let newline = |out: &mut String, level: usize| {
        if let Some(width) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(width * level));
        }
    };
    let item_separator = if indent.is_some() { "," } else { ", " };
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number if value.is_integer() => out.push_str(&value.to_string()),
        ValueKind::Number => out.push_str(&float_repr(f64::try_from(value.clone())?)),
        ValueKind::String => out.push_str(&serde_json::to_string(value.as_str().unwrap_or_default()).expect("a string serializes")),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_separator);
                }
                newline(out, level + 1);
                write_json(item, indent, sort_keys, level + 1, out)?;
            }
            newline(out, level);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if sort_keys {
                keys.sort();
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_separator);
                }
                newline(out, level + 1);
                let name = key.as_str().map(String::from).unwrap_or_else(|| key.to_string());
                out.push_str(&serde_json::to_string(&name).expect("a string serializes"));
                out.push_str(": ");
                write_json(&value.get_item(key)?, indent, sort_keys, level + 1, out)?;
            }
            newline(out, level);
            out.push('}');
        }
        _ => return Err(minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: cannot serialize a {}", value.kind()))),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/code").join(name)
    }

    #[test]
    fn renders_qwen2_5_exactly_as_transformers() {
        let template = ChatTemplate::from_model_dir(&fixture("qwen2_5")).unwrap().expect("the fixture has a template");
        let text = std::fs::read_to_string(fixture("chat_template_cases.jsonl")).unwrap();
        let mut cases = 0;
        for (i, line) in text.lines().enumerate() {
            let case: Json = serde_json::from_str(line).unwrap();
            let messages = case["messages"].as_array().unwrap();
            let rendered = template
                .render_with_tools(messages, case.get("tools"), case["add_generation_prompt"].as_bool().unwrap())
                .unwrap_or_else(|e| panic!("case {}: {e}", i + 1));
            assert_eq!(rendered, case["text"].as_str().unwrap(), "case {} differs from transformers", i + 1);
            cases += 1;
        }
        assert_eq!(cases, 13);
    }

    #[test]
    fn template_errors_name_the_file() {
        let err = ChatTemplate::new("{% if %}", "/m/tokenizer_config.json").unwrap_err().to_string();
        assert!(err.contains("/m/tokenizer_config.json") && err.contains("chat template"), "{err}");
        let raising = ChatTemplate::new("{{ raise_exception('only user turns') }}", "t.jinja").unwrap();
        let err = raising.render::<Json>(&[], false).unwrap_err().to_string();
        assert!(err.contains("only user turns"), "{err}");
    }

    #[test]
    fn tojson_writes_python_json_dumps() {
        let t = ChatTemplate::new("{{ x | tojson }}|{{ x | tojson(indent=2) }}", "t").unwrap();
        let env = environment();
        let x = serde_json::json!({"a": [1, 2.5, 1e-05, true, null], "b": "ü\"\n", "c": {}});
        let out = env.render_str(t.source(), minijinja::context! { x => Value::from(Serde(&x)) }).unwrap();
        // json.dumps(x, ensure_ascii=False) and json.dumps(x, ensure_ascii=False, indent=2)
        let compact = r#"{"a": [1, 2.5, 1e-05, true, null], "b": "ü\"\n", "c": {}}"#;
        let indented = "{\n  \"a\": [\n    1,\n    2.5,\n    1e-05,\n    true,\n    null\n  ],\n  \"b\": \"ü\\\"\\n\",\n  \"c\": {}\n}";
        assert_eq!(out, format!("{compact}|{indented}"));
    }

    #[test]
    fn a_directory_without_a_template_has_none() {
        let dir = tempfile::tempdir().unwrap();
        assert!(ChatTemplate::from_model_dir(dir.path()).unwrap().is_none());
        std::fs::write(dir.path().join("chat_template.jinja"), "{{ messages[0].content }}!").unwrap();
        let t = ChatTemplate::from_model_dir(dir.path()).unwrap().unwrap();
        assert_eq!(t.render(&[serde_json::json!({"role": "user", "content": "hi"})], false).unwrap(), "hi!");
    }
}
