//! A Hugging Face model directory over HTTP: `config.json`, `model.safetensors` (or the shards
//! of `model.safetensors.index.json`), `tokenizer.json`, and the optional
//! `generation_config.json`, `special_tokens_map.json` and `tokenizer_config.json`.

use std::path::{Path, PathBuf};

use kiln_core::model::hf::{self, ModelBytes};
use kiln_core::tokenizer::Tokenizer;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

/// The files of a model directory, fetched.
pub struct ModelFiles {
    /// The directory's URL (names files in error messages).
    pub url: PathBuf,
    pub model: ModelBytes,
    pub tokenizer_json: Vec<u8>,
    pub special_tokens_map: Option<Vec<u8>>,
    pub tokenizer_config: Option<Vec<u8>>,
    /// Bytes fetched in all.
    pub bytes: usize,
}

impl ModelFiles {
    /// Fetches the model directory at `url` (with or without a final `/`).
    pub async fn fetch(url: &str) -> Result<Self, String> {
        let url = PathBuf::from(url.trim_end_matches('/'));
        let required = async |name: &str| fetch_file(&url.join(name)).await?.ok_or_else(|| format!("{}: not found (HTTP 404)", url.join(name).display()));
        let optional = async |name: &str| fetch_file(&url.join(name)).await;
        let config = required("config.json").await?;
        let safetensors = match optional(hf::SINGLE_FILE).await? {
            Some(bytes) => vec![(hf::SINGLE_FILE.to_string(), bytes)],
            None => {
                let index = optional(hf::INDEX_FILE).await?.ok_or_else(|| {
                    format!("{}: neither {} nor {} found", url.display(), hf::SINGLE_FILE, hf::INDEX_FILE)
                })?;
                let mut shards = Vec::new();
                for name in hf::shard_names(&url.join(hf::INDEX_FILE), &index).map_err(|e| e.to_string())? {
                    let bytes = required(&name).await?;
                    shards.push((name, bytes));
                }
                shards
            }
        };
        let model = ModelBytes { config, generation_config: optional("generation_config.json").await?, safetensors };
        let tokenizer_json = required("tokenizer.json").await?;
        let special_tokens_map = optional("special_tokens_map.json").await?;
        let tokenizer_config = optional("tokenizer_config.json").await?;
        let bytes = model.config.len()
            + model.generation_config.as_ref().map_or(0, Vec::len)
            + model.safetensors.iter().map(|(_, b)| b.len()).sum::<usize>()
            + tokenizer_json.len()
            + special_tokens_map.as_ref().map_or(0, Vec::len)
            + tokenizer_config.as_ref().map_or(0, Vec::len);
        Ok(Self { url, model, tokenizer_json, special_tokens_map, tokenizer_config, bytes })
    }

    /// The tokenizer of the directory.
    pub fn tokenizer(&self) -> Result<Tokenizer, String> {
        Tokenizer::from_bytes(
            self.url.join("tokenizer.json"),
            &self.tokenizer_json,
            self.special_tokens_map.as_deref(),
            self.tokenizer_config.as_deref(),
        )
        .map_err(|e| e.to_string())
    }
}

/// The body of `url`, `None` when the server answers 404.
async fn fetch_file(url: &Path) -> Result<Option<Vec<u8>>, String> {
    let name = url.display().to_string();
    let failed = |e: JsValue| format!("{name}: {}", js_message(&e));
    let window = web_sys::window().ok_or("no window")?;
    let response: web_sys::Response = JsFuture::from(window.fetch_with_str(&name)).await.map_err(failed)?.dyn_into().map_err(failed)?;
    if response.status() == 404 {
        return Ok(None);
    }
    if !response.ok() {
        return Err(format!("{name}: HTTP {} {}", response.status(), response.status_text()));
    }
    let buffer = JsFuture::from(response.array_buffer().map_err(failed)?).await.map_err(failed)?;
    Ok(Some(js_sys::Uint8Array::new(&buffer).to_vec()))
}

/// The message of a JavaScript error (or its string form).
pub fn js_message(value: &JsValue) -> String {
    match value.dyn_ref::<js_sys::Error>() {
        Some(error) => String::from(error.message()),
        None => value.as_string().unwrap_or_else(|| format!("{value:?}")),
    }
}
