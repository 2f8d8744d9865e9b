//! `tokenizer.json` through the `tokenizers` crate (no network features), plus the special
//! tokens named in `tokenizer_config.json` / `special_tokens_map.json`.
//!
//! Encoding never adds special tokens: the paper's format and ChatML both spell them out in
//! the text, exactly as the reference encodes with `add_special_tokens=False`.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};

/// A loaded tokenizer.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    eos_token: Option<String>,
    pad_token: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("path", &self.path).finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json` (a file, or a model directory holding one and its configs).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let (file, dir) = if path.is_dir() {
            (path.join("tokenizer.json"), Some(path.to_path_buf()))
        } else {
            (path.to_path_buf(), path.parent().map(Path::to_path_buf))
        };
        let inner = tokenizers::Tokenizer::from_file(&file)
            .map_err(|e| Error::Tokenizer { path: file.clone(), message: e.to_string() })?;
        let mut tokenizer = Self { inner, path: file, eos_token: None, pad_token: None };
        if let Some(dir) = dir {
            for name in ["special_tokens_map.json", "tokenizer_config.json"] {
                tokenizer.read_special_tokens(&dir.join(name))?;
            }
        }
        Ok(tokenizer)
    }

    fn read_special_tokens(&mut self, path: &Path) -> Result<()> {
        if !path.is_file() {
            return Ok(());
        }
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let json: Value = serde_json::from_str(&text).map_err(|e| Error::json(path, None, e))?;
        let token = |key: &str| match json.get(key) {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Object(o)) => o.get("content").and_then(Value::as_str).map(String::from),
            _ => None,
        };
        self.eos_token = self.eos_token.take().or_else(|| token("eos_token"));
        self.pad_token = self.pad_token.take().or_else(|| token("pad_token"));
        Ok(())
    }

    /// Token ids of `text`, without adding any special token.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self.inner.encode(text, false).map_err(|e| self.error(e))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Text of `ids`; with `skip_special_tokens`, special tokens are dropped as in `transformers`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner.decode(ids, skip_special_tokens).map_err(|e| self.error(e))
    }

    /// The id of `token`, if it is in the vocabulary.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The end-of-sequence token id named by the tokenizer configs.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_token.as_deref().and_then(|t| self.token_id(t))
    }

    /// The padding token id named by the tokenizer configs.
    pub fn pad_id(&self) -> Option<u32> {
        self.pad_token.as_deref().and_then(|t| self.token_id(t))
    }

    /// Path of the `tokenizer.json` this was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn error(&self, e: impl std::fmt::Display) -> Error {
        Error::Tokenizer { path: self.path.clone(), message: e.to_string() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paper() -> Tokenizer {
        Tokenizer::from_file(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/interplay/qwen2_100M")).unwrap()
    }

    #[test]
    fn spec_test_vector() {
        let t = paper();
        assert_eq!(t.encode("so x = 12 + 345.").unwrap(), vec![92, 88, 323, 344, 501, 267, 1155, 23]);
        assert_eq!((t.eos_id(), t.pad_id()), (Some(3), Some(1)));
        assert_eq!(t.token_id("<solution>"), Some(6));
    }

    #[test]
    fn every_reference_row_encodes_and_decodes_exactly() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/interplay/text.jsonl");
        let t = paper();
        let text = std::fs::read_to_string(path).unwrap();
        let mut rows = 0;
        for line in text.lines() {
            let row: Value = serde_json::from_str(line).unwrap();
            let expected: Vec<u32> =
                row["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
            let ids = t.encode(row["text"].as_str().unwrap()).unwrap();
            assert_eq!(ids, expected, "row op={} line_index={}", row["op"], row["line_index"]);
            assert_eq!(t.decode(&ids, false).unwrap(), row["text"].as_str().unwrap());
            rows += 1;
        }
        assert_eq!(rows, 456);
    }

    #[test]
    fn missing_file_names_the_path() {
        let err = Tokenizer::from_file("/nonexistent/tokenizer.json").unwrap_err().to_string();
        assert!(err.contains("/nonexistent/tokenizer.json"), "{err}");
    }
}
