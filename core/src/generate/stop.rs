//! When a sequence stops: a stop token (EOS unless ignored, or user stop ids), a stop string
//! appearing in the decoded text, or the length limit. Stop strings are matched like vLLM: the
//! returned text ends just before the first occurrence; the token ids keep every sampled token.

use serde::Serialize;

use crate::error::Result;
use crate::tokenizer::Tokenizer;

/// Why a sequence finished (vLLM's `finish_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// A stop token or stop string was produced.
    Stop,
    /// `max_new_tokens` (or the model's context) was reached.
    Length,
}

/// What exactly stopped a sequence (vLLM's `stop_reason`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum StopReason {
    Token(u32),
    String(String),
}

/// Stop conditions of one request.
#[derive(Debug, Clone, Default)]
pub struct StopCriteria {
    /// Token ids that end a sequence (EOS ids plus user stop ids); the token is kept in the ids
    /// and its text left out of the returned text.
    pub token_ids: Vec<u32>,
    /// Strings that end a sequence; excluded from the returned text.
    pub strings: Vec<String>,
}

impl StopCriteria {
    /// Stop strings as the eval commands and the code task's config take them: an empty one
    /// stands for none (`--stop ''`, `stop = [""]`), where the engine refuses it.
    pub fn strings_without_empty(strings: &[String]) -> Vec<String> {
        strings.iter().filter(|s| !s.is_empty()).cloned().collect()
    }

    /// Checks the newest token of `generated`. Stop strings are searched in the text of the last
    /// few tokens only, which suffices because the check runs after every token.
    pub fn check(&self, generated: &[u32], tokenizer: Option<&Tokenizer>, skip_special: bool) -> Result<Option<StopReason>> {
        let Some(&last) = generated.last() else { return Ok(None) };
        if self.token_ids.contains(&last) {
            return Ok(Some(StopReason::Token(last)));
        }
        if let (Some(tokenizer), false) = (tokenizer, self.strings.is_empty()) {
            // Every token decodes to at least one byte, so a stop string of n bytes that ends in
            // the newest token lies within its last n tokens (+1 for a split UTF-8 character).
            let window = self.strings.iter().map(String::len).max().unwrap_or(0) + 1;
            let tail = tokenizer.decode(&generated[generated.len().saturating_sub(window)..], skip_special)?;
            if let Some(s) = self.strings.iter().find(|s| tail.contains(s.as_str())) {
                return Ok(Some(StopReason::String(s.clone())));
            }
        }
        Ok(None)
    }

    /// The text returned for `generated`: without a final stop token's text and cut before the
    /// first occurrence of a matched stop string.
    pub fn final_text(
        &self,
        generated: &[u32],
        reason: Option<&StopReason>,
        tokenizer: &Tokenizer,
        skip_special: bool,
    ) -> Result<String> {
        let ids = match reason {
            Some(StopReason::Token(_)) => &generated[..generated.len() - 1],
            _ => generated,
        };
        let mut text = tokenizer.decode(ids, skip_special)?;
        if let Some(StopReason::String(s)) = reason
            && let Some(at) = text.find(s.as_str())
        {
            text.truncate(at);
        }
        Ok(text)
    }
}

/// The end-of-sequence ids of a model directory: `config.json`'s and `generation_config.json`'s
/// `eos_token_id` ([`crate::model::hf::eos_token_ids`]) and the tokenizer's `eos_token`. An
/// [`super::Engine`] over a model loaded from `dir` and this tokenizer stops at these by default.
pub fn model_eos_ids(
    dir: &std::path::Path,
    config: &crate::model::Qwen2Config,
    tokenizer: Option<&Tokenizer>,
) -> Result<Vec<u32>> {
    let mut ids = crate::model::hf::eos_token_ids(dir, config)?;
    ids.extend(tokenizer.and_then(Tokenizer::eos_id));
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}
