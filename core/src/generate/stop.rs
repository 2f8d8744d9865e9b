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
            // the newest token lies within its last n tokens (+1 for a split UTF-8 character),
            // not counting the skipped special tokens, which decode to nothing.
            let wanted = self.strings.iter().map(String::len).max().unwrap_or(0) + 1;
            let (mut start, mut counted) = (generated.len(), 0);
            while start > 0 && counted < wanted {
                start -= 1;
                counted += !(skip_special && tokenizer.is_special(generated[start])) as usize;
            }
            let tail = tokenizer.decode(&generated[start..], skip_special)?;
            if let Some(s) = self.strings.iter().find(|s| tail.contains(s.as_str())) {
                return Ok(Some(StopReason::String(s.clone())));
            }
        }
        Ok(None)
    }

    /// The text returned for `generated`: without a final stop token's text, cut before the
    /// first occurrence of a matched stop string, and without a trailing incomplete character.
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
        match reason {
            Some(StopReason::String(s)) => {
                if let Some(at) = text.find(s.as_str()) {
                    text.truncate(at);
                }
            }
            // A character whose bytes the last tokens did not complete decodes to U+FFFD: left
            // out, as vLLM's incremental detokenizer holds back text ending in one and never
            // emits it. (Before a stop string vLLM has emitted it with the stop string's text.)
            _ => text.truncate(text.trim_end_matches('\u{FFFD}').len()),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> Tokenizer {
        let corpus = (0..50).map(|i| format!("line {i}\nword {i}"));
        Tokenizer::train_byte_level_bpe(corpus, 300, &["<|endoftext|>", "<s1>", "<s2>"]).unwrap()
    }

    /// Skipped special tokens inside a stop string: the window of the last tokens held only one
    /// "\n" of "\n" <s1> <s2> "\n", and generation went on (vLLM's detokenizer stops).
    #[test]
    fn stop_strings_are_found_across_skipped_special_tokens() {
        let t = tokenizer();
        let (nl, s1, s2) = (t.encode("\n").unwrap(), t.token_id("<s1>").unwrap(), t.token_id("<s2>").unwrap());
        assert_eq!(nl.len(), 1);
        let generated = [t.encode("word").unwrap(), nl.clone(), vec![s1, s2], nl].concat();
        let stop = StopCriteria { token_ids: vec![], strings: vec!["\n\n".into()] };
        assert_eq!(stop.check(&generated, Some(&t), true).unwrap(), Some(StopReason::String("\n\n".into())));
        assert_eq!(stop.check(&generated, Some(&t), false).unwrap(), None, "kept, the special tokens separate the newlines");
        assert_eq!(stop.final_text(&generated, Some(&StopReason::String("\n\n".into())), &t, true).unwrap(), "word");
        // The newest token longer than the stop string, and a split character before it: the
        // window counts tokens left in the text, not bytes.
        let word = t.encode("word").unwrap();
        assert_eq!(word.len(), 1);
        let longer = [t.encode("line\n").unwrap(), vec![s1, s2], t.encode("\n").unwrap(), word].concat();
        let stop_w = StopCriteria { token_ids: vec![], strings: vec!["\n\nw".into()] };
        assert_eq!(stop_w.check(&longer, Some(&t), true).unwrap(), Some(StopReason::String("\n\nw".into())), "{longer:?}");
        let euro = t.encode("€").unwrap();
        let split = [euro.clone(), vec![s1, s2], t.encode("b").unwrap()].concat();
        let stop_euro = StopCriteria { token_ids: vec![], strings: vec!["€b".into()] };
        assert_eq!(stop_euro.check(&split, Some(&t), true).unwrap(), Some(StopReason::String("€b".into())));
    }

    /// A length-capped sample that ends inside a character: its replacement is left out.
    #[test]
    fn a_final_incomplete_character_is_left_out() {
        let t = tokenizer();
        let euro = t.encode("€").unwrap();
        assert_eq!(euro.len(), 3, "three byte tokens");
        let generated = [t.encode("word").unwrap(), euro[..2].to_vec()].concat();
        let stop = StopCriteria::default();
        assert!(t.decode(&generated, false).unwrap().ends_with('\u{FFFD}'));
        assert_eq!(stop.final_text(&generated, None, &t, false).unwrap(), "word");
        let whole = [t.encode("word").unwrap(), euro.clone()].concat();
        assert_eq!(stop.final_text(&whole, None, &t, false).unwrap(), "word€");
        // Before a stop string vLLM has emitted the replacement with the stop string's text.
        let before_stop = [t.encode("word").unwrap(), euro[..2].to_vec(), t.encode("\n\n").unwrap()].concat();
        let text = stop.final_text(&before_stop, Some(&StopReason::String("\n\n".into())), &t, false).unwrap();
        assert!(text.starts_with("word") && text.ends_with('\u{FFFD}'), "{text:?}");
    }
}
