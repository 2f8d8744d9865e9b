//! `tokenizer.json` through the `tokenizers` crate (no network features), plus the special
//! tokens named in `tokenizer_config.json` / `special_tokens_map.json`.
//!
//! Encoding adds no special tokens: the paper's format and chat templates spell them out in the
//! text, exactly as the references encode with `add_special_tokens=False`. Raw text given to
//! `kiln generate` and `kiln logprobs` gets the tokenizer's own ones, as vLLM's and
//! transformers' defaults do ([`Tokenizer::encode_adding_special_tokens`]).
//!
//! [`chat_template`] renders the model's Hugging Face chat template.

#[cfg(feature = "code")]
pub mod chat_template;

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

    /// Loads a tokenizer as [`Tokenizer::from_file`] does, from the bytes of `tokenizer.json` and
    /// of the directory's `special_tokens_map.json` and `tokenizer_config.json` where it has them
    /// (the browser fetches them); `path` names `tokenizer.json` in error messages.
    pub fn from_bytes(
        path: impl AsRef<Path>,
        tokenizer_json: &[u8],
        special_tokens_map: Option<&[u8]>,
        tokenizer_config: Option<&[u8]>,
    ) -> Result<Self> {
        let file = path.as_ref().to_path_buf();
        let inner = tokenizers::Tokenizer::from_bytes(tokenizer_json)
            .map_err(|e| Error::Tokenizer { path: file.clone(), message: e.to_string() })?;
        let mut tokenizer = Self { inner, path: file.clone(), eos_token: None, pad_token: None };
        let dir = file.parent().map(Path::to_path_buf).unwrap_or_default();
        for (name, bytes) in [("special_tokens_map.json", special_tokens_map), ("tokenizer_config.json", tokenizer_config)] {
            if let Some(bytes) = bytes {
                tokenizer.special_tokens_from(&dir.join(name), bytes)?;
            }
        }
        Ok(tokenizer)
    }

    fn read_special_tokens(&mut self, path: &Path) -> Result<()> {
        if !path.is_file() {
            return Ok(());
        }
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        self.special_tokens_from(path, &bytes)
    }

    /// Takes the EOS and padding tokens of a `special_tokens_map.json` or `tokenizer_config.json`
    /// (`bytes`, read from `path`) where none is named yet.
    fn special_tokens_from(&mut self, path: &Path, bytes: &[u8]) -> Result<()> {
        let json: Value = serde_json::from_slice(bytes).map_err(|e| Error::json(path, None, e))?;
        let token = |key: &str| match json.get(key) {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Object(o)) => o.get("content").and_then(Value::as_str).map(String::from),
            _ => None,
        };
        self.eos_token = self.eos_token.take().or_else(|| token("eos_token"));
        self.pad_token = self.pad_token.take().or_else(|| token("pad_token"));
        Ok(())
    }

    /// Whether `decode(…, skip_special_tokens = true)` leaves `id` out (a special added token).
    pub fn is_special(&self, id: u32) -> bool {
        self.inner.id_to_token(id).is_some_and(|token| self.inner.get_added_vocabulary().is_special_token(&token))
    }

    /// Token ids of `text`, without adding any special token.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        // tokenizers' `encode_fast`: the ids of its `encode`, without tracking offsets.
        let encoding = self.inner.encode_fast(text, false).map_err(|e| self.error(e))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Token ids of `text` with the special tokens the tokenizer adds to a text of its own (its
    /// `tokenizer.json` post-processor): transformers' `tokenizer(text)` and vLLM's
    /// `LLM.generate(text)`. A BOS for DeepSeek-R1-Distill's tokenizer; nothing for Qwen2's and
    /// Qwen2.5's, which add none. (Text a chat template rendered already holds its special
    /// tokens: [`Tokenizer::encode`].)
    pub fn encode_adding_special_tokens(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self.inner.encode_fast(text, true).map_err(|e| self.error(e))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Token ids of `text` with each token's byte span in `text` (no special tokens added).
    pub fn encode_with_offsets(&self, text: &str) -> Result<(Vec<u32>, Vec<(usize, usize)>)> {
        let encoding = self.inner.encode(text, false).map_err(|e| self.error(e))?;
        Ok((encoding.get_ids().to_vec(), encoding.get_offsets().to_vec()))
    }

    /// Trains a byte-level BPE tokenizer (GPT-2 pre-tokenization, as Qwen's) of about
    /// `vocab_size` entries on `texts`, with `special` tokens first (ids 0, 1, …).
    pub fn train_byte_level_bpe<I: Iterator<Item = String> + Send>(texts: I, vocab_size: usize, special: &[&str]) -> Result<Self> {
        use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
        use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
        use tokenizers::pre_tokenizers::byte_level::ByteLevel;
        use tokenizers::{AddedToken, TokenizerBuilder};
        let error = |e: tokenizers::Error| Error::Tokenizer { path: "<trained>".into(), message: e.to_string() };
        let mut trainer = BpeTrainerBuilder::new()
            .vocab_size(vocab_size)
            .min_frequency(2)
            .show_progress(false)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .special_tokens(special.iter().map(|s| AddedToken::from(s.to_string(), true)).collect())
            .build();
        let mut inner: tokenizers::TokenizerImpl<BPE, tokenizers::NormalizerWrapper, ByteLevel, tokenizers::PostProcessorWrapper, ByteLevelDecoder> =
            TokenizerBuilder::new()
                .with_model(BPE::default())
                .with_pre_tokenizer(Some(ByteLevel::new(false, true, true)))
                .with_decoder(Some(ByteLevelDecoder::default()))
                .build()
                .map_err(error)?;
        inner.train(&mut trainer, texts).map_err(error)?;
        inner.add_special_tokens(special.iter().map(|s| AddedToken::from(s.to_string(), true)).collect::<Vec<_>>()).map_err(error)?;
        let json = inner.to_string(false).map_err(error)?;
        let inner: tokenizers::Tokenizer = json.parse().map_err(error)?;
        Ok(Self { inner, path: "<trained>".into(), eos_token: None, pad_token: None })
    }

    /// Writes `tokenizer.json` (and the special-token names, if any) into `dir`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join("tokenizer.json");
        self.inner.save(&path, false).map_err(|e| Error::Tokenizer { path: path.clone(), message: e.to_string() })?;
        let special = serde_json::json!({ "eos_token": self.eos_token, "pad_token": self.pad_token });
        let special_path = dir.join("special_tokens_map.json");
        std::fs::write(&special_path, serde_json::to_string_pretty(&special).expect("json")).map_err(|e| Error::io(&special_path, e))
    }

    /// Names the end-of-sequence and padding tokens (which must be in the vocabulary).
    pub fn with_special_tokens(mut self, eos: &str, pad: &str) -> Result<Self> {
        for token in [eos, pad] {
            if self.token_id(token).is_none() {
                return Err(self.error(format!("{token:?} is not in the vocabulary")));
            }
        }
        self.eos_token = Some(eos.into());
        self.pad_token = Some(pad.into());
        Ok(self)
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

    /// The end-of-sequence token named by the tokenizer configs.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// The end-of-sequence token id named by the tokenizer configs.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_token.as_deref().and_then(|t| self.token_id(t))
    }

    /// The padding token id named by the tokenizer configs.
    pub fn pad_id(&self) -> Option<u32> {
        self.pad_token.as_deref().and_then(|t| self.token_id(t))
    }

    #[cfg(feature = "code")]
    /// The chat template of the model directory this was loaded from (see
    /// [`chat_template::ChatTemplate::from_model_dir`]); `None` when it has none. Read on demand,
    /// so a tokenizer whose template kiln cannot parse still encodes.
    pub fn chat_template(&self) -> Result<Option<chat_template::ChatTemplate>> {
        match self.path.parent() {
            Some(dir) if self.path.is_file() => {
                let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
                chat_template::ChatTemplate::from_model_dir(dir)
            }
            _ => Ok(None),
        }
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

    /// transformers' `tokenizer(text)` and `tokenizer(text, add_special_tokens=False)` with a
    /// tokenizer that adds a BOS (DeepSeek-R1-Distill's post-processor; `make_bos_tokenizer.py`),
    /// and the paper's, which adds nothing.
    #[test]
    fn special_tokens_are_added_as_transformers_adds_them() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/bos_tokenizer");
        let t = Tokenizer::from_file(dir).unwrap();
        let cases: Value = serde_json::from_str(&std::fs::read_to_string(format!("{dir}/cases.json")).unwrap()).unwrap();
        let ids = |v: &Value| -> Vec<u32> { v.as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as u32).collect() };
        for case in cases["cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            assert_eq!(t.encode_adding_special_tokens(text).unwrap(), ids(&case["with_special_tokens"]), "{text:?}");
            assert_eq!(t.encode(text).unwrap(), ids(&case["without_special_tokens"]), "{text:?}");
        }
        assert_eq!(cases["cases"].as_array().unwrap().len(), 4);
        assert_eq!(paper().encode_adding_special_tokens("so x = 12 + 345.").unwrap(), paper().encode("so x = 12 + 345.").unwrap());
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
    fn from_bytes_is_from_file() {
        let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/interplay/qwen2_100M"));
        let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
        let (map, config) = (read("special_tokens_map.json"), read("tokenizer_config.json"));
        let t = Tokenizer::from_bytes("http://host/m/tokenizer.json", &read("tokenizer.json"), Some(&map), Some(&config)).unwrap();
        let file = paper();
        let text = "so x = 12 + 345. [EOS]";
        assert_eq!(t.encode(text).unwrap(), file.encode(text).unwrap());
        assert_eq!((t.eos_id(), t.pad_id()), (file.eos_id(), file.pad_id()));
        let err = Tokenizer::from_bytes("http://host/m/tokenizer.json", b"{", None, None).unwrap_err().to_string();
        assert!(err.contains("http://host/m/tokenizer.json"), "{err}");
        let err = Tokenizer::from_bytes("http://host/m/tokenizer.json", &read("tokenizer.json"), Some(b"[1"), None).unwrap_err().to_string();
        assert!(err.contains("http://host/m/special_tokens_map.json"), "{err}");
    }

    #[test]
    fn missing_file_names_the_path() {
        let err = Tokenizer::from_file("/nonexistent/tokenizer.json").unwrap_err().to_string();
        assert!(err.contains("/nonexistent/tokenizer.json"), "{err}");
    }
}
