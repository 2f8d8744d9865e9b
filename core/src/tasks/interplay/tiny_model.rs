//! The model of kiln's minute-scale pipelines (`kiln quickstart`, the RL and OPD examples): a
//! tiny Qwen2 (1.3M parameters) with the paper's tokenizer, written as a directory that
//! `kiln init` or a `[model] init = ".../config.json"` run config starts from.

use std::path::Path;

use crate::{Error, Result};

/// The tiny Qwen2's `config.json`: the paper's vocabulary, 4 layers of width 128, GQA 4:2.
pub const TINY_CONFIG: &str = r#"{
  "architectures": ["Qwen2ForCausalLM"],
  "model_type": "qwen2",
  "vocab_size": 2200,
  "hidden_size": 128,
  "intermediate_size": 512,
  "num_hidden_layers": 4,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "head_dim": 32,
  "max_position_embeddings": 1024,
  "rope_theta": 1000000.0,
  "rms_norm_eps": 1e-06,
  "tie_word_embeddings": true,
  "bos_token_id": 2,
  "eos_token_id": 3,
  "initializer_range": 0.02,
  "hidden_act": "silu",
  "torch_dtype": "float32"
}
"#;

/// The paper's tokenizer files (`model_configs/qwen2_100M/` of the reference repository), kept
/// in the crate's own data (`core/data/interplay/`, with their license).
pub const PAPER_TOKENIZER_FILES: [(&str, &str); 3] = [
    ("tokenizer.json", include_str!("../../../data/interplay/qwen2_100M/tokenizer.json")),
    ("tokenizer_config.json", include_str!("../../../data/interplay/qwen2_100M/tokenizer_config.json")),
    ("special_tokens_map.json", include_str!("../../../data/interplay/qwen2_100M/special_tokens_map.json")),
];

/// Writes [`TINY_CONFIG`] and the paper's tokenizer files into `dir` (created if missing). Files
/// already there with the same contents (an earlier run's) are left; see [`check_tiny_model`].
pub fn write_tiny_model(dir: &Path) -> Result<()> {
    check_tiny_model(dir)?;
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    for (name, text) in tiny_model_files() {
        let path = dir.join(name);
        if !path.exists() {
            crate::io::write_atomic(&path, text)?;
        }
    }
    Ok(())
}

/// Refuses a `dir` whose model files differ from [`write_tiny_model`]'s (another model's, which
/// it would replace); nothing there, or the same files, is fine.
pub fn check_tiny_model(dir: &Path) -> Result<()> {
    for (name, text) in tiny_model_files() {
        let path = dir.join(name);
        match std::fs::read_to_string(&path) {
            Ok(existing) if existing != text => {
                return Err(Error::InvalidInput(format!(
                    "{}: exists with other contents (another model's?), which the tiny model's would replace; choose another output directory",
                    path.display()
                )));
            }
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(Error::io(&path, e)),
            _ => {}
        }
    }
    Ok(())
}

fn tiny_model_files() -> impl Iterator<Item = (&'static str, &'static str)> {
    [("config.json", TINY_CONFIG)].into_iter().chain(PAPER_TOKENIZER_FILES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Qwen2Config;
    use crate::tokenizer::Tokenizer;

    /// The written directory is a model kiln can start from: every token of the task's text,
    /// special tokens included, fits the embedding. (The paper's tokenizer has one more entry,
    /// the unused `<special_token_4>` = 2200, than its config's `vocab_size`; so does the release.)
    #[test]
    fn writes_a_config_that_fits_the_paper_tokenizer() {
        let dir = tempfile::tempdir().unwrap();
        write_tiny_model(dir.path()).unwrap();
        let config = Qwen2Config::from_file(dir.path().join("config.json")).unwrap();
        let tokenizer = Tokenizer::from_file(dir.path()).unwrap();
        let text = "[BOS]<question>Each adult lion counts 3 times. What is it?</question>\
                    <solution>Define x as 2; so x = 2 + 1 = 3.</solution><answer>3</answer>[EOS][PAD]";
        let ids = tokenizer.encode(text).unwrap();
        assert!(ids.iter().all(|&id| (id as usize) < config.vocab_size), "{ids:?}");
        assert_eq!(tokenizer.eos_id(), Some(3));
        assert_eq!(config.eos_token_ids(), vec![3]);
    }

    /// The library's copy of the paper's tokenizer is the golden one of the test fixtures.
    #[test]
    fn library_tokenizer_files_are_the_fixture_files() {
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/interplay/qwen2_100M");
        for (name, text) in PAPER_TOKENIZER_FILES {
            assert_eq!(text, std::fs::read_to_string(fixtures.join(name)).unwrap(), "{name}");
        }
    }
}
