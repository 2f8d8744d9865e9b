//! The Qwen2 model config: a serde view of Hugging Face's `config.json`.
//!
//! Unknown keys are kept (in [`Qwen2Config::extra`]) and written back on save, so a directory
//! loaded and saved by kiln still carries everything `transformers` put there.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// `config.json` of a `Qwen2ForCausalLM` (Qwen2, Qwen2.5, Qwen2.5-Coder, the paper's 100M model).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Qwen2Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Defaults to `num_attention_heads` (no GQA), as in `transformers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_key_value_heads: Option<usize>,
    /// Defaults to `hidden_size / num_attention_heads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    #[serde(default = "default_max_position_embeddings")]
    pub max_position_embeddings: usize,
    #[serde(default = "default_rms_norm_eps")]
    pub rms_norm_eps: f64,
    /// transformers < 5 writes `rope_theta` at the top level ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// ... transformers >= 5 writes `rope_parameters: {rope_theta, rope_type}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<RopeParameters>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default = "default_hidden_act")]
    pub hidden_act: String,
    #[serde(default)]
    pub use_sliding_window: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token_id: Option<TokenIds>,
    #[serde(default = "default_initializer_range")]
    pub initializer_range: f64,
    /// Every other key of `config.json`, preserved verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// RoPE settings as transformers >= 5 writes them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RopeParameters {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_type: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One token id or several (HF allows both for `eos_token_id`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    One(u32),
    Many(Vec<u32>),
}

fn default_max_position_embeddings() -> usize {
    32768
}
fn default_rms_norm_eps() -> f64 {
    1e-6
}
fn default_hidden_act() -> String {
    "silu".into()
}
fn default_initializer_range() -> f64 {
    0.02
}

impl Qwen2Config {
    /// Reads and validates `config.json` (a file, or a model directory containing one).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let mut path = path.as_ref().to_path_buf();
        if path.is_dir() {
            path = path.join("config.json");
        }
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let config: Self = serde_json::from_str(&text).map_err(|e| Error::json(&path, None, e))?;
        config.validate().map_err(|message| Error::config(&path, message))?;
        Ok(config)
    }

    /// Writes `config.json` into `dir`.
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<()> {
        let path = dir.as_ref().join("config.json");
        let text = serde_json::to_string_pretty(self).map_err(|e| Error::json(&path, None, e))?;
        std::fs::write(&path, text + "\n").map_err(|e| Error::io(&path, e))
    }

    /// Checks that kiln can run this config; the message says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_kv_heads()),
            ("max_position_embeddings", self.max_position_embeddings),
            ("head_dim", self.head_dim()),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("`{name}` must be positive"));
        }
        if self.head_dim.is_none() && !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(format!(
                "`hidden_size` {} is not divisible by `num_attention_heads` {} (set `head_dim`)",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(format!("head dimension {} must be even for RoPE", self.head_dim()));
        }
        if !self.num_attention_heads.is_multiple_of(self.num_kv_heads()) {
            return Err(format!(
                "`num_attention_heads` {} is not a multiple of `num_key_value_heads` {}",
                self.num_attention_heads,
                self.num_kv_heads()
            ));
        }
        // A model of another architecture (Qwen3's q/k norms, Llama's missing biases) would be
        // run with Qwen2's layers.
        if let Some(kind) = self.extra.get("model_type").filter(|v| !v.is_null() && v.as_str() != Some("qwen2")) {
            return Err(format!("`model_type` {kind} is not supported (only \"qwen2\": Qwen2 and Qwen2.5 checkpoints)"));
        }
        if let Some(archs) = self.extra.get("architectures").and_then(Value::as_array)
            && !archs.is_empty()
            && !archs.iter().any(|a| a.as_str() == Some("Qwen2ForCausalLM"))
        {
            return Err(format!("`architectures` {} is not supported (only \"Qwen2ForCausalLM\")", Value::Array(archs.clone())));
        }
        // The projections' widths, whose products overflowed in the tensor list (the weights'
        // sizes are checked against memory where a model is built).
        let values = |a: usize, b: usize| a.checked_mul(b).filter(|n| *n as u64 <= 1 << 60);
        let products = [
            ("num_attention_heads × head_dim", values(self.num_attention_heads, self.head_dim())),
            ("num_key_value_heads × head_dim", values(self.num_kv_heads(), self.head_dim())),
        ];
        if let Some((name, _)) = products.iter().find(|(_, n)| n.is_none()) {
            return Err(format!("`{name}` is more than 2^60 values: not a model kiln can hold"));
        }
        if self.hidden_act != "silu" {
            return Err(format!("`hidden_act` {:?} is not supported (only \"silu\")", self.hidden_act));
        }
        if self.use_sliding_window {
            return Err("`use_sliding_window: true` is not supported".into());
        }
        if let Some(kind) = self.rope_parameters.as_ref().and_then(|r| r.rope_type.as_deref())
            && kind != "default"
        {
            return Err(format!("`rope_type` {kind:?} is not supported (only \"default\")"));
        }
        // transformers reads `rope_parameters.type` as `rope_type`, rotates only a part of each
        // head with `partial_rotary_factor`, and takes per-layer-type parameters: kiln's RoPE is
        // the default one over the whole head.
        if let Some(r) = &self.rope_parameters {
            // (`rope_type`, checked above, wins where both are given.)
            if let Some(kind) = r.extra.get("type").filter(|t| r.rope_type.is_none() && !t.is_null() && t.as_str() != Some("default")) {
                return Err(format!("`rope_parameters.type` {kind} is not supported (only \"default\")"));
            }
            if let Some((key, _)) = r.extra.iter().find(|(_, v)| v.is_object()) {
                return Err(format!("`rope_parameters.{key}`: RoPE parameters per layer type are not supported"));
            }
        }
        let partial = [self.extra.get("partial_rotary_factor"), self.rope_parameters.as_ref().and_then(|r| r.extra.get("partial_rotary_factor"))];
        if let Some(factor) = partial.into_iter().flatten().find(|f| !f.is_null() && f.as_f64() != Some(1.0)) {
            return Err(format!("`partial_rotary_factor` {factor} is not supported (RoPE over the whole head only)"));
        }
        match self.extra.get("rope_scaling") {
            None | Some(Value::Null) => {}
            Some(other) => return Err(format!("`rope_scaling` {other} is not supported")),
        }
        if !(self.rope_theta() > 0.0) {
            return Err("`rope_theta` must be positive".into());
        }
        // RoPE's cos and sin tables hold `max_position_embeddings × head_dim` f32 values each
        // (their memory is counted with the weights'); 2^32 values is 16 GiB a table.
        if (self.max_position_embeddings as u64).checked_mul(self.head_dim() as u64).is_none_or(|n| n > 1 << 32) {
            return Err(format!(
                "`max_position_embeddings` {} is too large: RoPE's tables would hold {} × {} values each (at most 2^32)",
                self.max_position_embeddings,
                self.max_position_embeddings,
                self.head_dim()
            ));
        }
        // Random initialisation draws from N(0, initializer_range) in f32.
        if !((self.initializer_range as f32).is_finite() && self.initializer_range >= 0.0) {
            return Err(format!("`initializer_range` {} must be a finite number >= 0", self.initializer_range));
        }
        Ok(())
    }

    /// Number of key/value heads (GQA groups).
    pub fn num_kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// RoPE base θ, wherever the file put it (transformers' default 10 000 when absent).
    pub fn rope_theta(&self) -> f64 {
        self.rope_parameters
            .as_ref()
            .and_then(|r| r.rope_theta)
            .or(self.rope_theta)
            .unwrap_or(10_000.0)
    }

    /// End-of-sequence token ids named by the config.
    pub fn eos_token_ids(&self) -> Vec<u32> {
        match &self.eos_token_id {
            None => Vec::new(),
            Some(TokenIds::One(id)) => vec![*id],
            Some(TokenIds::Many(ids)) => ids.clone(),
        }
    }

    /// Number of parameters of the model this config describes (summed from its tensor list,
    /// [`crate::model::weights::parameter_counts`]; saturating at `usize::MAX`).
    pub fn num_parameters(&self) -> usize {
        usize::try_from(crate::model::weights::parameter_counts(self).total).unwrap_or(usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> std::result::Result<Qwen2Config, String> {
        let c: Qwen2Config = serde_json::from_str(json).map_err(|e| e.to_string())?;
        c.validate()?;
        Ok(c)
    }

    #[test]
    fn paper_config_reads_and_counts_parameters() {
        let c = Qwen2Config::from_file(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/interplay/qwen2_100M/config.json"
        ))
        .unwrap();
        assert_eq!((c.hidden_size, c.num_kv_heads(), c.head_dim()), (768, 2, 64));
        assert_eq!(c.rope_theta(), 1e6);
        assert!(c.tie_word_embeddings);
        assert_eq!(c.eos_token_ids(), vec![3]);
        // 103M by the spec's arithmetic.
        assert_eq!(c.num_parameters() / 1_000_000, 103);
        // Unknown keys survive a round trip.
        let back: Value = serde_json::to_value(&c).unwrap();
        assert_eq!(back["max_window_layers"], 24);
        assert_eq!(back["torch_dtype"], "bfloat16");
        assert!(back.get("head_dim").is_none());
    }

    #[test]
    fn qwen25_coder_counts_1_54b_parameters() {
        let c = parse(r#"{"vocab_size":151936,"hidden_size":1536,"intermediate_size":8960,
            "num_hidden_layers":28,"num_attention_heads":12,"num_key_value_heads":2,
            "tie_word_embeddings":true,"rope_theta":1000000.0}"#)
        .unwrap();
        assert_eq!(c.num_parameters(), 1_543_714_304);
        // The committed config (spec code-sft §6.1) is this model: 338 tensors, no lm_head.
        let committed = Qwen2Config::from_file(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/configs/qwen2.5-coder-1.5b/config.json")).unwrap();
        assert_eq!(committed.num_parameters(), 1_543_714_304);
        assert_eq!((committed.head_dim(), committed.num_kv_heads(), committed.rope_theta()), (128, 2, 1e6));
        assert_eq!((committed.rms_norm_eps, committed.max_position_embeddings, committed.eos_token_ids()), (1e-6, 32768, vec![151645]));
        let tensors = crate::model::weights::expected_tensors(&committed);
        assert_eq!(tensors.len(), 338);
        assert!(tensors.iter().all(|t| t.name != "lm_head.weight"));
        // The counts are the tensor list's, summed by role: the tied embedding is the head's
        // matrix product; biases and norm scales are none.
        use crate::model::weights::{TensorRole, parameter_counts};
        let size = |role: Option<TensorRole>| -> u128 {
            tensors.iter().filter(|t| role.is_none_or(|r| t.role == r)).map(|t| t.shape.iter().product::<usize>() as u128).sum()
        };
        let counts = parameter_counts(&committed);
        assert_eq!(counts.total, size(None));
        assert_eq!(counts.matmul, size(Some(TensorRole::LinearWeight)) + size(Some(TensorRole::Embedding)));
        let untied = Qwen2Config { tie_word_embeddings: false, ..committed.clone() };
        let counts = parameter_counts(&untied);
        assert_eq!(counts.total, 1_543_714_304 + 151_936 * 1536, "an LM head of its own");
        assert_eq!(counts.matmul, size(Some(TensorRole::LinearWeight)) + 151_936 * 1536, "the embedding lookup is no product");
    }

    #[test]
    fn transformers5_rope_parameters_win() {
        let c = parse(r#"{"vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,
            "num_attention_heads":2,"rope_parameters":{"rope_theta":1234.0,"rope_type":"default"}}"#)
        .unwrap();
        assert_eq!(c.rope_theta(), 1234.0);
        assert_eq!(c.num_kv_heads(), 2);
    }

    #[test]
    fn missing_and_unsupported_keys_are_clear_errors() {
        let err = parse(r#"{"vocab_size":10,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2}"#)
            .unwrap_err();
        assert!(err.contains("missing field `hidden_size`"), "{err}");
        let err = parse(r#"{"vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,
            "num_attention_heads":3,"num_key_value_heads":2, "head_dim": 4}"#)
        .unwrap_err();
        assert!(err.contains("not a multiple"), "{err}");
        let err = parse(r#"{"vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,
            "num_attention_heads":2,"rope_scaling":{"type":"yarn","factor":4}}"#)
        .unwrap_err();
        assert!(err.contains("rope_scaling"), "{err}");
        let err = parse(r#"{"vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,
            "num_attention_heads":2,"head_dim":0}"#)
        .unwrap_err();
        assert!(err.contains("`head_dim` must be positive"), "{err}");
    }

    /// What transformers would run differently from kiln's Qwen2 is refused, not run with other
    /// maths: other architectures, RoPE variants under `rope_parameters`, a partial rotary
    /// factor; shapes whose products overflow.
    #[test]
    fn other_architectures_and_rope_variants_are_refused() {
        let base = r#"{"vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2"#;
        let with = |extra: &str| parse(&format!("{base},{extra}}}"));
        for (extra, expected) in [
            (r#""model_type":"qwen3""#, "`model_type` \"qwen3\" is not supported"),
            (r#""architectures":["LlamaForCausalLM"]"#, "`architectures` [\"LlamaForCausalLM\"] is not supported"),
            (r#""rope_parameters":{"type":"yarn","factor":4.0,"rope_theta":10000.0}"#, "`rope_parameters.type` \"yarn\""),
            (r#""rope_parameters":{"full_attention":{"rope_type":"yarn"}}"#, "`rope_parameters.full_attention`: RoPE parameters per layer type"),
            (r#""partial_rotary_factor":0.5"#, "`partial_rotary_factor` 0.5"),
            (r#""partial_rotary_factor":null,"rope_parameters":{"rope_theta":1e4,"partial_rotary_factor":0.25}"#, "`partial_rotary_factor` 0.25"),
            (r#""head_dim":4611686018427387904,"num_key_value_heads":1"#, "`num_attention_heads × head_dim` is more than 2^60"),
        ] {
            let err = with(extra).unwrap_err();
            assert!(err.contains(expected), "{extra}: {err}");
        }
        for fine in [
            r#""model_type":"qwen2","architectures":["Qwen2ForCausalLM"]"#,
            r#""architectures":[],"partial_rotary_factor":null"#,
            r#""rope_parameters":{"rope_type":"default","type":"linear"}"#,
            r#""partial_rotary_factor":1.0,"rope_parameters":{"rope_type":"default","type":"default"}"#,
        ] {
            assert!(with(fine).is_ok(), "{fine}");
        }
    }
}
