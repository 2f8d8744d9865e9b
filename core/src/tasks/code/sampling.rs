//! Sampling for code evaluation: LiveCodeBench's defaults (spec code-sft.md §8.4; LCB
//! `lcb_runner/runner/parser.py` and `vllm_runner.py`), each overridable.
//!
//! LiveCodeBench samples with vLLM: `n=10`, `temperature=0.2`, `top_p=0.95`,
//! **`max_tokens=2000`** (not 2048), `stop=["###"]`, no top-k, no repetition/frequency/presence
//! penalty, special tokens skipped in the text. A model's `generation_config.json` (Qwen2.5's
//! sets top_k 20 and a repetition penalty) is deliberately *not* applied. Note that the `###`
//! stop cuts an answer that opens with a markdown header ("### Approach") before its code.

use serde::{Deserialize, Serialize};

use crate::generate::{Sampler, SamplingParams, StopCriteria};

/// Code-evaluation sampling settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CodeSampling {
    /// Samples per problem.
    pub n: usize,
    pub temperature: f32,
    pub top_p: f32,
    /// 0 disables (vLLM's -1).
    pub top_k: usize,
    pub max_new_tokens: usize,
    /// Stop strings (the stop string is not part of the returned text).
    pub stop: Vec<String>,
    pub seed: u64,
}

impl Default for CodeSampling {
    fn default() -> Self {
        Self { n: 10, temperature: 0.2, top_p: 0.95, top_k: 0, max_new_tokens: 2000, stop: vec!["###".into()], seed: 0 }
    }
}

impl CodeSampling {
    /// The engine's parameters; `eos_ids` end a sample besides the model's own EOS ids (the
    /// tokenizer's EOS and, for chat models, `<|im_end|>`), as vLLM stops.
    pub fn params(&self, eos_ids: Vec<u32>) -> SamplingParams {
        SamplingParams {
            n: self.n,
            sampler: Sampler { temperature: self.temperature, top_k: self.top_k, top_p: self.top_p, min_p: 0.0 },
            max_new_tokens: self.max_new_tokens,
            stop: StopCriteria { token_ids: eos_ids, strings: self.stop.clone(), ..StopCriteria::default() },
            ignore_eos: false,
            seed: self.seed,
            skip_special_tokens: true,
            penalties: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_livecodebench_and_each_field_overrides() {
        let d = CodeSampling::default();
        assert_eq!((d.n, d.temperature, d.top_p, d.top_k, d.max_new_tokens), (10, 0.2, 0.95, 0, 2000));
        assert_eq!(d.stop, vec!["###".to_string()]);
        let o: CodeSampling = toml::from_str("n = 1\ntemperature = 0.0\nstop = []\nmax_new_tokens = 2048").unwrap();
        assert_eq!((o.n, o.temperature, o.top_p, o.max_new_tokens), (1, 0.0, 0.95, 2048));
        assert!(o.stop.is_empty());
        assert!(toml::from_str::<CodeSampling>("max_tokens = 5").is_err(), "unknown keys are errors");
        let p = d.params(vec![151645, 151643]);
        assert_eq!((p.n, p.max_new_tokens, p.sampler.top_p), (10, 2000, 0.95));
        assert_eq!(p.stop.strings, vec!["###".to_string()]);
        assert_eq!(p.stop.token_ids, vec![151645, 151643]);
    }
}
