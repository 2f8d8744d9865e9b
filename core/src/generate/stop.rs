//! When a sequence stops: a stop token (EOS unless ignored, or user stop ids), a stop string
//! appearing in the decoded text, or the length limit; not before `min_tokens` tokens. Stop
//! strings are matched like vLLM: the returned text ends just before the occurrence (or after it,
//! with `include_in_output`); the token ids keep every sampled token.

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
    /// The tokenizer's EOS (vLLM's `eos_token_id`, checked before the stop ids): serialized as
    /// `null`, vLLM's `stop_reason` for it. The model's other EOS ids (`generation_config.json`'s)
    /// are stop ids, reported as [`StopReason::Token`], as vLLM reports them.
    Eos,
    /// A stop token id.
    Token(u32),
    /// A stop string.
    String(String),
}

impl StopReason {
    /// The reason `reason` is reported as when `eos` is the tokenizer's EOS: [`StopReason::Eos`]
    /// for that id (vLLM checks it first, unless `ignore_eos`).
    pub fn naming_eos(self, eos: Option<u32>) -> Self {
        match self {
            StopReason::Token(id) if Some(id) == eos => StopReason::Eos,
            other => other,
        }
    }
}

/// Stop conditions of one request.
#[derive(Debug, Clone, Default)]
pub struct StopCriteria {
    /// Token ids that end a sequence (EOS ids plus user stop ids); the token is kept in the ids
    /// and its text left out of the returned text (unless `include_in_output`).
    pub token_ids: Vec<u32>,
    /// Strings that end a sequence; excluded from the returned text (unless `include_in_output`).
    pub strings: Vec<String>,
    /// The returned text keeps the stop string, up to its end, or the stop token's text (vLLM's
    /// `include_stop_str_in_output`; special tokens still go with `skip_special_tokens`).
    pub include_in_output: bool,
    /// No sequence stops before this many tokens (vLLM's `min_tokens`): until then the stop ids
    /// and every EOS id (even with `ignore_eos`) are not sampled, and a stop string counts only
    /// where it ends in the text of a later token.
    pub min_tokens: usize,
}

impl StopCriteria {
    /// Stop strings as the eval commands and the code task's config take them: an empty one
    /// stands for none (`--stop ''`, `stop = [""]`), where the engine refuses it.
    pub fn strings_without_empty(strings: &[String]) -> Vec<String> {
        strings.iter().filter(|s| !s.is_empty()).cloned().collect()
    }

    /// The ids a sample may not draw while it has fewer than `min_tokens` tokens: the stop ids
    /// and `eos_ids` (vLLM's `_all_stop_token_ids`), sorted; empty without `min_tokens`.
    pub fn banned_before_min_tokens(&self, eos_ids: &[u32]) -> Vec<u32> {
        if self.min_tokens == 0 {
            return Vec::new();
        }
        let mut ids: Vec<u32> = self.token_ids.iter().chain(eos_ids).copied().collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Checks the newest token of `generated`. Stop strings are searched in the text of the last
    /// few tokens only, which suffices because the check runs after every token.
    pub fn check(&self, generated: &[u32], tokenizer: Option<&Tokenizer>, skip_special: bool) -> Result<Option<StopReason>> {
        let Some(&last) = generated.last() else { return Ok(None) };
        if generated.len() <= self.min_tokens {
            return Ok(None);
        }
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
            // With min_tokens, an occurrence within the first tokens' text does not count: the
            // one found must end in the newest token's (vLLM's `stop_check_offset`).
            let new_from = match self.min_tokens {
                0 => 0,
                _ => settled_len(&tokenizer.decode(&generated[start..generated.len() - 1], skip_special)?, &tail),
            };
            if let Some(s) = self.strings.iter().find(|s| occurrence_ending_after(&tail, s, new_from).is_some()) {
                return Ok(Some(StopReason::String(s.clone())));
            }
        }
        Ok(None)
    }

    /// The text returned for `generated`: without a final stop token's text, cut before the
    /// occurrence of a matched stop string (the first after the first `min_tokens` tokens'
    /// text), and without a trailing incomplete character; with `include_in_output`, the stop
    /// token's text kept and the cut after the stop string.
    pub fn final_text(
        &self,
        generated: &[u32],
        reason: Option<&StopReason>,
        tokenizer: &Tokenizer,
        skip_special: bool,
    ) -> Result<String> {
        let ids = match reason {
            Some(StopReason::Token(_) | StopReason::Eos) if !self.include_in_output => &generated[..generated.len() - 1],
            _ => generated,
        };
        let mut text = tokenizer.decode(ids, skip_special)?;
        match reason {
            Some(StopReason::String(s)) => {
                let new_from = match self.min_tokens {
                    0 => 0,
                    n => settled_len(&tokenizer.decode(&generated[..n.min(generated.len())], skip_special)?, &text),
                };
                if let Some(at) = occurrence_ending_after(&text, s, new_from) {
                    text.truncate(if self.include_in_output { at + s.len() } else { at });
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

/// The length of the part of `before` (the text of fewer tokens) that `after` (the text with
/// the next ones) keeps: their common prefix, up to a character `before` had not completed.
fn settled_len(before: &str, after: &str) -> usize {
    before.char_indices().zip(after.chars()).find(|((_, a), b)| a != b).map_or(before.len().min(after.len()), |((i, _), _)| i)
}

/// Where the first occurrence of `pattern` (not empty) in `text` that ends after byte `from`
/// begins (vLLM's `output_text.find(stop_str, 1 - new_char_count - len(stop_str))`).
fn occurrence_ending_after(text: &str, pattern: &str, from: usize) -> Option<usize> {
    let mut start = (from + 1).saturating_sub(pattern.len()).min(text.len());
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].find(pattern).map(|at| start + at)
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
        let stop = StopCriteria { token_ids: vec![], strings: vec!["\n\n".into()], ..StopCriteria::default() };
        assert_eq!(stop.check(&generated, Some(&t), true).unwrap(), Some(StopReason::String("\n\n".into())));
        assert_eq!(stop.check(&generated, Some(&t), false).unwrap(), None, "kept, the special tokens separate the newlines");
        assert_eq!(stop.final_text(&generated, Some(&StopReason::String("\n\n".into())), &t, true).unwrap(), "word");
        // The newest token longer than the stop string, and a split character before it: the
        // window counts tokens left in the text, not bytes.
        let word = t.encode("word").unwrap();
        assert_eq!(word.len(), 1);
        let longer = [t.encode("line\n").unwrap(), vec![s1, s2], t.encode("\n").unwrap(), word].concat();
        let stop_w = StopCriteria { token_ids: vec![], strings: vec!["\n\nw".into()], ..StopCriteria::default() };
        assert_eq!(stop_w.check(&longer, Some(&t), true).unwrap(), Some(StopReason::String("\n\nw".into())), "{longer:?}");
        let euro = t.encode("€").unwrap();
        let split = [euro.clone(), vec![s1, s2], t.encode("b").unwrap()].concat();
        let stop_euro = StopCriteria { token_ids: vec![], strings: vec!["€b".into()], ..StopCriteria::default() };
        assert_eq!(stop_euro.check(&split, Some(&t), true).unwrap(), Some(StopReason::String("€b".into())));
    }

    /// min_tokens (vLLM's): no stop within the first tokens, and an occurrence of a stop string
    /// in their text does not count later; the cut is at the occurrence that stopped the
    /// sample. include_in_output keeps the stop string or the stop token's text.
    #[test]
    fn min_tokens_and_included_stops_follow_vllm() {
        let t = tokenizer();
        let word = |w: &str| t.encode(w).unwrap();
        let (line, nl) = (word("line"), word("\n"));
        assert_eq!((line.len(), nl.len()), (1, 1));
        // "line\nline\nline": stop "line" first occurs in token 1.
        let generated = [line.clone(), nl.clone(), line.clone(), nl.clone(), line.clone()].concat();
        let at = |n: usize, stop: &StopCriteria| (1..=n).find_map(|k| stop.check(&generated[..k], Some(&t), false).unwrap().map(|r| (k, r)));
        let plain = StopCriteria { strings: vec!["line".into()], ..StopCriteria::default() };
        assert_eq!(at(5, &plain), Some((1, StopReason::String("line".into()))));
        let later = StopCriteria { min_tokens: 2, ..plain.clone() };
        assert_eq!(at(5, &later), Some((3, StopReason::String("line".into()))), "the first occurrence lies within the first 2 tokens");
        let reason = Some(StopReason::String("line".into()));
        assert_eq!(later.final_text(&generated[..3], reason.as_ref(), &t, false).unwrap(), "line\n");
        let kept = StopCriteria { include_in_output: true, ..later.clone() };
        assert_eq!(kept.final_text(&generated[..3], reason.as_ref(), &t, false).unwrap(), "line\nline");
        // A stop string that begins in the first tokens' text and ends after it counts.
        let across = StopCriteria { strings: vec!["line\nl".into()], min_tokens: 2, ..StopCriteria::default() };
        assert_eq!(at(5, &across), Some((3, StopReason::String("line\nl".into()))));
        assert_eq!(across.final_text(&generated[..3], Some(&StopReason::String("line\nl".into())), &t, false).unwrap(), "");
        // Stop tokens: none before min_tokens; the token's text kept with include_in_output.
        let token = StopCriteria { token_ids: nl.clone(), min_tokens: 2, ..StopCriteria::default() };
        assert_eq!(at(5, &token), Some((4, StopReason::Token(nl[0]))));
        assert_eq!(token.final_text(&generated[..4], Some(&StopReason::Token(nl[0])), &t, false).unwrap(), "line\nline");
        let token_kept = StopCriteria { include_in_output: true, ..token };
        assert_eq!(token_kept.final_text(&generated[..4], Some(&StopReason::Eos), &t, false).unwrap(), "line\nline\n");
        assert_eq!(token_kept.banned_before_min_tokens(&[7, nl[0]]), {
            let mut ids = vec![7, nl[0]];
            ids.sort_unstable();
            ids
        });
        assert!(StopCriteria::default().banned_before_min_tokens(&[7]).is_empty(), "nothing banned without min_tokens");
    }

    /// The tokenizer's EOS is reported as vLLM reports it: `stop_reason` null.
    #[test]
    fn the_tokenizer_s_eos_has_no_stop_reason() {
        assert_eq!(StopReason::Token(5).naming_eos(Some(5)), StopReason::Eos);
        assert_eq!(StopReason::Token(6).naming_eos(Some(5)), StopReason::Token(6));
        assert_eq!(StopReason::Token(5).naming_eos(None), StopReason::Token(5));
        let json = |r: Option<StopReason>| serde_json::to_string(&r).unwrap();
        assert_eq!([json(Some(StopReason::Eos)), json(Some(StopReason::Token(6))), json(Some(StopReason::String("x".into())))], ["null", "6", "\"x\""]);
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
