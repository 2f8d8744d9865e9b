//! Rollouts: `n` responses per prompt from the generation engine, stopping at EOS or
//! `max_response_length` (verl's vLLM rollout in the seed), each with the log-probs of the
//! distribution it was sampled from.

use burn::tensor::backend::Backend;

use super::prompts::Prompt;
use crate::error::Result;
use crate::generate::{Engine, FinishReason, Progress, Sampler, SamplingParams, StepTimes, StopCriteria};
use crate::model::{Dtype, Qwen2};
use crate::tokenizer::Tokenizer;

/// How responses are sampled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RolloutSettings {
    /// Responses per prompt (the GRPO group size).
    pub n: usize,
    pub sampler: Sampler,
    pub max_response_length: usize,
    /// Most sequences decoded together.
    pub batch_size: usize,
    /// Bytes the KV cache may take ([`crate::generate::Engine::kv_memory`]).
    pub kv_memory: Option<u64>,
    /// Tokens one prefill pass takes at most ([`crate::generate::Engine::max_prefill_tokens`]).
    pub max_prefill_tokens: usize,
    /// The policy samples in this dtype (`[model] dtype`; default: the dtype it computes in).
    pub dtype: Option<Dtype>,
}

/// One sampled response.
#[derive(Debug, Clone)]
pub struct Response {
    /// Index of its prompt in the step's batch (its GRPO group).
    pub group: usize,
    /// Generated ids, including the final EOS when it stopped.
    pub tokens: Vec<u32>,
    /// Per token: log-prob under the sampling distribution (the behaviour policy).
    pub sampler_logprobs: Vec<f32>,
    /// Per token: log-prob under the model's unmodified distribution, as the rollout engine
    /// computed it (in the rollout's dtype): truncated importance sampling compares it with the
    /// learner's for greedy rollouts (otherwise `sampler_logprobs`).
    pub raw_logprobs: Vec<f32>,
    /// The response decoded with special tokens (what the seed's reward manager scores).
    pub text: String,
    /// It hit `max_response_length` without EOS.
    pub truncated: bool,
}

/// Samples `settings.n` responses for each prompt with `seed`; prompt `i`'s responses come
/// consecutively (group `i`), as verl repeats a batch with `interleave=True`. `progress` sees
/// the engine's counts as completions finish. Also returns where the engine spent its time (its
/// decoding steps, prefill passes and KV-cache peak).
pub fn rollout<B: Backend>(
    model: &Qwen2<B>,
    tokenizer: &Tokenizer,
    eos_ids: &[u32],
    prompts: &[&Prompt],
    settings: &RolloutSettings,
    seed: u64,
    progress: impl FnMut(Progress),
) -> Result<(Vec<Response>, StepTimes)> {
    let mut engine = Engine::new(model, Some(tokenizer));
    engine.max_batch_size = settings.batch_size;
    engine.kv_memory = settings.kv_memory;
    engine.max_prefill_tokens = settings.max_prefill_tokens;
    let params = SamplingParams {
        n: settings.n,
        sampler: settings.sampler,
        max_new_tokens: settings.max_response_length,
        stop: StopCriteria { token_ids: eos_ids.to_vec(), strings: Vec::new(), ..StopCriteria::default() },
        ignore_eos: true, // `eos_ids` are the run's EOS ids
        seed,
        skip_special_tokens: false,
        penalties: Default::default(),
    };
    let ids: Vec<Vec<u32>> = prompts.iter().map(|p| p.ids.clone()).collect();
    let completions = engine.generate(&ids, &params, progress)?;
    let mut responses = Vec::with_capacity(prompts.len() * settings.n);
    for (group, samples) in completions.into_iter().enumerate() {
        for sample in samples {
            responses.push(Response {
                group,
                text: tokenizer.decode(&sample.token_ids, false)?,
                truncated: sample.finish_reason == FinishReason::Length,
                tokens: sample.token_ids,
                sampler_logprobs: sample.logprobs,
                raw_logprobs: sample.raw_logprobs,
            });
        }
    }
    Ok((responses, engine.step_times()))
}
