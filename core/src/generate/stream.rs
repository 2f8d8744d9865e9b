//! Token-by-token generation of one sample, driven by the caller: the stream holds the logits of
//! the next token on the device, the caller reads them back however it can and hands them to
//! [`Stream::accept`], which samples, checks the stop conditions and runs the next decoding step.
//!
//! This is what a host that cannot block on a read-back uses (WebGPU in the browser reads with
//! `into_data_async().await`), and what shows tokens as they come. A stream gives the same
//! tokens and log-probs as [`Engine::generate`](super::Engine::generate) for one prompt with
//! `n = 1` (its first sample: the same uniforms, EOS ids and stop rules; sampled on the host,
//! so log-probs equal the engine's to rounding where the engine samples on the device).

use burn::tensor::{Tensor, TensorData, backend::Backend};

use super::engine::{Completion, SamplingParams};
use super::processors::RowEdits;
use super::sampler::uniform;
use super::stop::{FinishReason, StopReason};
use crate::error::{Error, Result};
use crate::model::{HostBatch, Inputs, KvCache, Qwen2};
use crate::tokenizer::Tokenizer;

/// One sample being generated; see the module docs.
pub struct Stream<'a, B: Backend> {
    model: &'a Qwen2<B>,
    tokenizer: Option<&'a Tokenizer>,
    params: SamplingParams,
    cache: KvCache<B>,
    limit: usize,
    /// The next token's logits `[vocab]`, while the sample is not finished.
    next: Option<Tensor<B, 1>>,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    raw_logprobs: Vec<f32>,
    finished: Option<(FinishReason, Option<StopReason>)>,
    /// The model's and the tokenizer's EOS ids (not sampled before `min_tokens`).
    eos_ids: Vec<u32>,
    /// The prompt's ids (the repetition penalty's).
    prompt: Vec<u32>,
}

impl<'a, B: Backend> Stream<'a, B> {
    /// Checks the request as the engine does and runs the prefill of `prompt`; `params.n` is
    /// ignored (one sample). The sample stops at the model's and the tokenizer's EOS ids unless
    /// `params.ignore_eos`.
    pub fn new(model: &'a Qwen2<B>, tokenizer: Option<&'a Tokenizer>, prompt: &[u32], params: &SamplingParams) -> Result<Self> {
        super::engine::check_params(params, tokenizer.is_some())?;
        super::engine::check_prompt(model, prompt).map_err(|e| Error::InvalidInput(format!("prompt 0 {e}")))?;
        let (context, vocab) = (model.context_len(), model.config().vocab_size);
        let mut params = params.clone();
        let mut eos_ids = model.eos_token_ids().to_vec();
        eos_ids.extend(tokenizer.and_then(Tokenizer::eos_id));
        if !params.ignore_eos {
            params.stop.token_ids.extend(&eos_ids);
        }
        let mut stream = Self {
            model,
            tokenizer,
            cache: model.new_cache(),
            limit: params.max_new_tokens.min(context - prompt.len()),
            next: None,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            raw_logprobs: Vec::new(),
            finished: (params.max_new_tokens == 0).then_some((FinishReason::Length, None)),
            params,
            eos_ids,
            prompt: prompt.to_vec(),
        };
        if stream.finished.is_none() {
            let pad_id = tokenizer.and_then(Tokenizer::pad_id).unwrap_or(0);
            let prefill = HostBatch::left_padded(&[prompt.to_vec()], pad_id)?.to_device::<B>(&model.device());
            let hidden = model.forward_hidden(&prefill, Some(&mut stream.cache));
            let seq = hidden.dims()[1];
            stream.next = Some(model.logits(hidden.narrow(1, seq - 1, 1)).reshape([vocab]));
        }
        Ok(stream)
    }

    /// The next token's logits `[vocab]` on the device, to read back and pass to
    /// [`Stream::accept`]; `None` once the sample is finished.
    pub fn logits(&self) -> Option<Tensor<B, 1>> {
        self.next.clone()
    }

    /// Samples the next token from `logits` (the host values of [`Stream::logits`]), checks the
    /// stop conditions and, unless the sample is finished, runs the decoding step that makes the
    /// following logits. Returns the token.
    pub fn accept(&mut self, logits: &[f32]) -> Result<u32> {
        let vocab = self.model.config().vocab_size;
        if self.next.is_none() {
            return Err(Error::InvalidInput("the sample is finished".into()));
        }
        if logits.len() != vocab {
            return Err(Error::InvalidInput(format!("{} logits for a vocabulary of {vocab}", logits.len())));
        }
        // The engine's uniforms of prompt 0, sample 0.
        let banned = match self.tokens.len() < self.params.stop.min_tokens {
            true => self.params.stop.banned_before_min_tokens(&self.eos_ids),
            false => Vec::new(),
        };
        let edits = RowEdits { banned: &banned, penalties: self.params.penalties, prompt: &self.prompt, output: &self.tokens };
        let sampled = self.params.sampler.sample_edited(logits, uniform(self.params.seed, 0, 0, self.tokens.len()), &edits);
        if sampled.raw_logprob.is_nan() {
            return Err(super::engine::nan_logits(self.tokens.len() + 1, 0, 0));
        }
        self.next = None;
        self.tokens.push(sampled.token);
        self.logprobs.push(sampled.logprob);
        self.raw_logprobs.push(sampled.raw_logprob);
        if let Some(reason) = self.params.stop.check(&self.tokens, self.tokenizer, self.params.skip_special_tokens)? {
            let eos = self.tokenizer.and_then(Tokenizer::eos_id).filter(|_| !self.params.ignore_eos);
            self.finished = Some((FinishReason::Stop, Some(reason.naming_eos(eos))));
        } else if self.tokens.len() >= self.limit {
            self.finished = Some((FinishReason::Length, None));
        } else {
            let device = self.model.device();
            let position = (self.prompt.len() + self.tokens.len() - 1) as i64;
            let step = Inputs {
                ids: Tensor::from_data(TensorData::new(vec![sampled.token as i64], [1, 1]), &device),
                positions: Tensor::from_data(TensorData::new(vec![position], [1, 1]), &device),
                valid: Tensor::from_data(TensorData::new(vec![true], [1, 1]), &device),
                documents: None,
            };
            let hidden = self.model.forward_hidden(&step, Some(&mut self.cache));
            self.next = Some(self.model.logits(hidden).reshape([vocab]));
        }
        Ok(sampled.token)
    }

    /// Whether the sample is finished.
    pub fn is_finished(&self) -> bool {
        self.finished.is_some()
    }

    /// The tokens generated so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The finished sample, as the engine returns it (text empty without a tokenizer).
    pub fn finish(self) -> Result<Completion> {
        let (finish_reason, stop_reason) = self.finished.ok_or_else(|| Error::InvalidInput("the sample is not finished".into()))?;
        let text = match self.tokenizer {
            Some(t) => self.params.stop.final_text(&self.tokens, stop_reason.as_ref(), t, self.params.skip_special_tokens)?,
            None => String::new(),
        };
        Ok(Completion {
            prompt_index: 0,
            sample_index: 0,
            token_ids: self.tokens,
            text,
            logprobs: self.logprobs,
            raw_logprobs: self.raw_logprobs,
            finish_reason,
            stop_reason,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{Engine, Sampler, StopCriteria};
    use burn::backend::Flex;

    fn model() -> Qwen2<Flex> {
        let config = serde_json::from_str(
            r#"{"vocab_size": 40, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 24,
                "eos_token_id": 7}"#,
        )
        .unwrap();
        Qwen2::random(&config, 3, &Default::default()).unwrap()
    }

    /// Reads the logits synchronously, as a native host would.
    fn run(model: &Qwen2<Flex>, prompt: &[u32], params: &SamplingParams) -> Completion {
        let mut stream = Stream::new(model, None, prompt, params).unwrap();
        while let Some(logits) = stream.logits() {
            let host = logits.into_data().convert::<f32>().into_vec::<f32>().unwrap();
            let token = stream.accept(&host).unwrap();
            assert_eq!(stream.tokens().last(), Some(&token));
        }
        assert!(stream.is_finished());
        stream.finish().unwrap()
    }

    #[test]
    fn a_stream_is_the_engines_first_sample() {
        let model = model();
        let prompt = [1, 5, 9, 2];
        let sampled = Sampler { temperature: 1.3, top_p: 0.95, ..Sampler::default() };
        let cases = [
            SamplingParams { sampler: Sampler::greedy(), max_new_tokens: 12, ..SamplingParams::default() },
            SamplingParams { sampler: sampled, max_new_tokens: 12, seed: 4, ..SamplingParams::default() },
            // Runs into the context (24) and stops at a user stop id, or EOS if it comes first.
            SamplingParams { sampler: sampled, max_new_tokens: 50, seed: 9, stop: StopCriteria { token_ids: vec![11], strings: vec![], ..StopCriteria::default() }, ..SamplingParams::default() },
            SamplingParams { sampler: sampled, max_new_tokens: 50, seed: 2, ignore_eos: true, ..SamplingParams::default() },
            SamplingParams { max_new_tokens: 0, ..SamplingParams::default() },
        ];
        for (i, params) in cases.iter().enumerate() {
            let engine = Engine::new(&model, None).generate(&[prompt.to_vec()], params, |_| {}).unwrap().remove(0).remove(0);
            let stream = run(&model, &prompt, params);
            assert_eq!(stream.token_ids, engine.token_ids, "case {i}");
            // The stream samples on the host; the engine too where the fused CPU kernels are
            // built (`flex`), else in burn ops (f32 sums): the same tokens, log-probs to rounding.
            let close = |a: &[f32], b: &[f32]| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-5 * (1.0 + x.abs()));
            assert!(close(&stream.logprobs, &engine.logprobs), "case {i}: {:?} vs {:?}", stream.logprobs, engine.logprobs);
            assert!(close(&stream.raw_logprobs, &engine.raw_logprobs), "case {i}: {:?} vs {:?}", stream.raw_logprobs, engine.raw_logprobs);
            #[cfg(feature = "flex")]
            assert_eq!((&stream.logprobs, &stream.raw_logprobs), (&engine.logprobs, &engine.raw_logprobs), "case {i}");
            assert_eq!((stream.finish_reason, &stream.stop_reason), (engine.finish_reason, &engine.stop_reason), "case {i}");
        }
    }

    #[test]
    fn bad_requests_are_errors() {
        let model = model();
        let params = SamplingParams::default();
        for prompt in [vec![], vec![1, 40], vec![1; 24]] {
            assert!(Stream::new(&model, None, &prompt, &params).is_err(), "{prompt:?}");
        }
        let mut stream = Stream::new(&model, None, &[1, 2], &params).unwrap();
        assert!(stream.accept(&[0.0; 3]).unwrap_err().to_string().contains("vocabulary of 40"));
        assert!(Stream::new(&model, None, &[1, 2], &SamplingParams { max_new_tokens: 0, ..params }).unwrap().accept(&[0.0; 40]).is_err());
    }
}
