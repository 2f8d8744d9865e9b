//! The batched generation engine: each prompt prefilled once (left-padded, in passes of at most
//! [`Engine::max_prefill_tokens`]), fanned out to its `n` samples (sharing its blocks in a paged
//! cache, copying its row of a batch-shaped one), then token-by-token decoding with a KV cache. Finished rows
//! are dropped from the batch once a quarter of it is done, so long tails do not pay for short
//! ones. Sequences stop at the model's and the tokenizer's EOS ids unless
//! [`SamplingParams::ignore_eos`] is set, at the request's own stop tokens and strings, and at the
//! length limit.
//!
//! Sampling: on the CPU backend from the host's logits, elsewhere on the device
//! ([`super::device_sampler`]: only the chosen ids and their log-probs are read back). Either
//! way the uniform of token `t` of sample `s` of prompt `p` is [`uniform`]`(seed, p, s, t)`, so a
//! sample depends neither on how prompts were batched nor on the backend.

use std::collections::{HashMap, VecDeque};

use burn::tensor::{Int, Tensor, TensorData, backend::Backend};
use serde::Serialize;

use super::device_sampler;
use super::processors::{Penalties, RowEdits};
use super::sampler::{Sampled, Sampler, uniform};
use super::stop::{FinishReason, StopCriteria, StopReason};
use crate::error::{Error, Result};
use crate::model::paged_kv::{BLOCK, PagedKv, SeqId};
use crate::model::{HostBatch, Inputs, KvCache, Qwen2};
use crate::tokenizer::Tokenizer;

/// How to sample a request.
#[derive(Debug, Clone)]
pub struct SamplingParams {
    /// Samples per prompt.
    pub n: usize,
    pub sampler: Sampler,
    pub max_new_tokens: usize,
    /// Stop tokens and strings, besides the model's EOS ids.
    pub stop: StopCriteria,
    /// Do not stop at the model's EOS ids (vLLM's `ignore_eos`); `stop` still applies.
    pub ignore_eos: bool,
    pub seed: u64,
    /// Drop special tokens from the returned text (vLLM's default is true; the paper's
    /// evaluation uses false because its tags are special tokens).
    pub skip_special_tokens: bool,
    /// vLLM's repetition, presence and frequency penalties (off by default).
    pub penalties: Penalties,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            n: 1,
            sampler: Sampler::default(),
            max_new_tokens: 256,
            stop: StopCriteria::default(),
            ignore_eos: false,
            seed: 0,
            skip_special_tokens: false,
            penalties: Penalties::default(),
        }
    }
}

/// One generated sample.
#[derive(Debug, Clone, Serialize)]
pub struct Completion {
    pub prompt_index: usize,
    pub sample_index: usize,
    /// Generated ids, including a final stop token or the tokens of a stop string.
    pub token_ids: Vec<u32>,
    /// Decoded text (empty without a tokenizer), stop token/string excluded.
    pub text: String,
    /// Per token: log-prob under the distribution sampled from (see [`Sampler`]).
    pub logprobs: Vec<f32>,
    /// Per token: log-prob under the model's unmodified distribution.
    pub raw_logprobs: Vec<f32>,
    pub finish_reason: FinishReason,
    pub stop_reason: Option<StopReason>,
}

/// Progress of a generation call, reported after every decoding step.
#[derive(Debug, Clone, Copy, Default)]
pub struct Progress {
    /// Tokens generated so far (all samples).
    pub tokens: usize,
    /// Samples finished so far.
    pub finished: usize,
    /// Samples in total (`prompts × n`).
    pub total: usize,
}

/// Where the decoding steps of the last [`Engine::generate`] call spent their time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTimes {
    /// Decoding steps (one token for every row of the batch).
    pub steps: usize,
    /// Wall time of those steps, seconds.
    pub total_s: f64,
    /// Of which the host waited for the device to hand back the sampled tokens. The rest is host
    /// work: stop checks, batch bookkeeping, building inputs and launching the next step's
    /// kernels. On the CPU backend everything is host work.
    pub wait_s: f64,
    /// The most bytes the paged KV cache's blocks in use took at once (0 for the batch-shaped
    /// cache).
    pub kv_bytes_peak: u64,
    /// Prefill passes (see [`Engine::max_prefill_tokens`]).
    pub prefills: usize,
    /// The most tokens one prefill pass took, padding included.
    pub prefill_tokens_max: usize,
}

impl StepTimes {
    /// Counts a step that began at `start` and restarts the clock.
    fn lap(&mut self, start: &mut std::time::Instant) {
        self.steps += 1;
        self.total_s += start.elapsed().as_secs_f64();
        *start = std::time::Instant::now();
    }

    /// Adds `other`'s counts and times to these (a rollout of several generation calls); the
    /// peaks are the larger of the two.
    pub fn add(&mut self, other: &StepTimes) {
        self.steps += other.steps;
        self.total_s += other.total_s;
        self.wait_s += other.wait_s;
        self.kv_bytes_peak = self.kv_bytes_peak.max(other.kv_bytes_peak);
        self.prefills += other.prefills;
        self.prefill_tokens_max = self.prefill_tokens_max.max(other.prefill_tokens_max);
    }

    /// The share of a step the host was busy rather than waiting on the device.
    pub fn host_share(&self) -> f64 {
        if self.total_s > 0.0 { 1.0 - self.wait_s / self.total_s } else { 0.0 }
    }
}

/// Generates from a model; see the module docs.
pub struct Engine<'a, B: Backend> {
    model: &'a Qwen2<B>,
    tokenizer: Option<&'a Tokenizer>,
    pad_id: u32,
    /// Where sequences stop unless [`SamplingParams::ignore_eos`]: the model's EOS ids
    /// ([`Qwen2::eos_token_ids`]) and the tokenizer's, as vLLM does.
    pub eos_ids: Vec<u32>,
    /// Largest number of sequences decoded together.
    pub max_batch_size: usize,
    /// Decode from a paged KV cache where the model offers one ([`Qwen2::new_paged_kv`]: the
    /// CPU's fused path, wgpu, CUDA); `false` keeps the batch-shaped cache everywhere (for comparison: `kiln
    /// bench --dense-kv`, or `KILN_KV_CACHE=dense` for any command). Default: true.
    pub paged: bool,
    /// Bytes the KV cache may take (`kiln generate --kv-memory`): the paged cache admits a
    /// sample only when the blocks it may still need fit ([`Engine::blocks_for`]); the
    /// batch-shaped one decodes at most [`Engine::rows_within`] rows. `None`: the paged cache
    /// takes at most half the memory available when a call starts (`MemAvailable` for blocks in
    /// host memory, a CUDA device's free memory for blocks there, as vLLM sizes its cache; the
    /// rest is left to the prefill's activations; on wgpu, which reports none, only its largest
    /// buffer bounds them), the batch-shaped one only [`Engine::max_batch_size`].
    pub kv_memory: Option<u64>,
    /// The most tokens (padding included) one prefill pass takes: the prompts joining the batch
    /// are prefilled in groups within it, shortest first (a longer prompt alone), so the
    /// prefill's activations stay bounded however large the batch, as vLLM's
    /// `max_num_batched_tokens` bounds a step's. Default: [`MAX_PREFILL_TOKENS`].
    pub max_prefill_tokens: usize,
    times: std::sync::Mutex<StepTimes>,
}

/// [`Engine::max_prefill_tokens`]'s default: vLLM's `max_num_batched_tokens` default (8,192);
/// a prefill of this many tokens keeps a GPU's matrix units busy and, in the 1.5B model, takes
/// about 1 GiB of activations in bf16.
pub const MAX_PREFILL_TOKENS: usize = 8192;

/// Per-sample decoding state.
struct Sequence {
    prompt_index: usize,
    sample_index: usize,
    prompt_len: usize,
    limit: usize,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    raw_logprobs: Vec<f32>,
    finished: Option<(FinishReason, Option<StopReason>)>,
}

impl<'a, B: Backend> Engine<'a, B> {
    /// An engine over `model`; `tokenizer` is needed for stop strings and returned text.
    pub fn new(model: &'a Qwen2<B>, tokenizer: Option<&'a Tokenizer>) -> Self {
        // Padding never reaches a result (its keys are masked; a finished row's next token is
        // dropped) but is looked up in the embedding: a tokenizer's pad id outside the model's
        // vocabulary (a `[PAD]` added without resizing the model) pads with id 0 instead.
        let vocab = model.config().vocab_size;
        let pad_id = tokenizer.and_then(Tokenizer::pad_id).filter(|&id| (id as usize) < vocab).unwrap_or(0);
        let mut eos_ids = model.eos_token_ids().to_vec();
        eos_ids.extend(tokenizer.and_then(Tokenizer::eos_id));
        eos_ids.sort_unstable();
        eos_ids.dedup();
        Self { model, tokenizer, pad_id, eos_ids, max_batch_size: 64, paged: std::env::var("KILN_KV_CACHE").map_or(true, |v| v != "dense"), kv_memory: None, max_prefill_tokens: MAX_PREFILL_TOKENS, times: Default::default() }
    }

    /// Bytes of KV cache one cached position of one sequence takes: keys and values of every
    /// layer, in the dtype activations are computed in.
    pub fn kv_bytes_per_position(&self) -> u64 {
        let c = self.model.config();
        (2 * c.num_hidden_layers * c.num_kv_heads() * c.head_dim() * self.model.activation_dtype().size()) as u64
    }

    /// Whether [`Engine::generate`] decodes from a paged KV cache (see [`Engine::paged`]).
    pub fn pages_kv(&self) -> bool {
        self.paged && self.model.new_paged_kv().is_some()
    }

    /// Blocks of a paged cache one sample of a `prompt`-token prompt with `new` new tokens may
    /// take at most, unshared: its prompt's blocks, and the blocks from the prompt's last full
    /// one to its end (the prompt's last block, shared, is copied when the sample first writes),
    /// `prompt + new − 1` positions (the last token sampled is never cached).
    pub const fn blocks_for(prompt: usize, new: usize) -> usize {
        prompt.div_ceil(BLOCK) + (prompt + new.saturating_sub(1)).div_ceil(BLOCK) - prompt / BLOCK
    }

    /// The most sequences of `positions` positions (prompt and new tokens) whose KV cache fits
    /// `bytes`, counting the half a full buffer may grow by at once (on the paged cache, whole
    /// blocks and a copy of a prompt's last one, none shared: at least [`Engine::blocks_for`]);
    /// at least 1 if one fits.
    pub fn rows_within(&self, bytes: u64, positions: usize) -> Result<usize> {
        let per_row = match self.model.new_paged_kv().filter(|_| self.paged) {
            Some(pages) => pages.block_bytes() * (positions.div_ceil(BLOCK) + 1) as u64,
            None => self.kv_bytes_per_position() * (positions + positions / 2) as u64,
        };
        Self::fit(bytes, per_row, positions)
    }

    /// How many of `per_row` bytes `bytes` holds; an error if not one (`positions` long).
    fn fit(bytes: u64, per_row: u64, positions: usize) -> Result<usize> {
        match bytes / per_row.max(1) {
            0 => Err(Error::InvalidInput(format!(
                "{} of KV cache does not hold one sequence of {positions} positions ({} needed)",
                kiln_backends::device::bytes_text(bytes as f64),
                kiln_backends::device::bytes_text(per_row as f64)
            ))),
            rows => Ok(rows as usize),
        }
    }

    /// Where the decoding steps of the last [`Engine::generate`] call spent their time.
    pub fn step_times(&self) -> StepTimes {
        *self.times.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_times(&self, times: StepTimes) {
        *self.times.lock().unwrap_or_else(|e| e.into_inner()) = times;
    }

    /// Samples `params.n` completions for every prompt; `result[i]` holds prompt `i`'s samples.
    pub fn generate(
        &self,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
        mut progress: impl FnMut(Progress),
    ) -> Result<Vec<Vec<Completion>>> {
        if params.n == 0 {
            return Err(Error::InvalidInput("n must be at least 1".into()));
        }
        check_params(params, self.tokenizer.is_some())?;
        let context = self.model.context_len();
        for (i, prompt) in prompts.iter().enumerate() {
            check_prompt(self.model, prompt).map_err(|e| Error::InvalidInput(format!("prompt {i} {e}")))?;
        }
        // Sequences stop at the EOS ids too, unless those are ignored.
        let mut params = params.clone();
        if !params.ignore_eos {
            params.stop.token_ids.extend(&self.eos_ids);
        }
        // Similar lengths batch together with less padding; results go back by index.
        let mut order: Vec<usize> = (0..prompts.len()).collect();
        order.sort_by_key(|&i| prompts[i].len());
        let n = params.n;
        let mut sequences: Vec<Sequence> = Vec::new();
        let total = prompts.len().checked_mul(n);
        if total.is_none_or(|total| sequences.try_reserve_exact(total).is_err()) {
            return Err(Error::InvalidInput(format!("{} prompts × n {n} samples do not fit in memory", prompts.len())));
        }
        for (prompt_index, prompt) in prompts.iter().enumerate() {
            for sample_index in 0..n {
                sequences.push(Sequence {
                    prompt_index,
                    sample_index,
                    prompt_len: prompt.len(),
                    limit: params.max_new_tokens.min(context - prompt.len()),
                    tokens: Vec::new(),
                    logprobs: Vec::new(),
                    raw_logprobs: Vec::new(),
                    finished: (params.max_new_tokens == 0).then_some((FinishReason::Length, None)),
                });
            }
        }
        self.set_times(StepTimes::default());
        if params.max_new_tokens > 0 {
            let mut state = Progress { total: sequences.len(), ..Progress::default() };
            // On the CPU, on a thread of the pool the kernels' parallel loops use (see
            // `on_pool`); other backends keep the caller's thread (cubecl picks a stream by
            // thread, and the device guard is per thread).
            let mut run = |send: &mut dyn FnMut(Progress)| self.run(&order, prompts, &params, &mut sequences, &mut state, send);
            if crate::model::fused::is_flex::<B>() {
                crate::par::on_pool(run, &mut progress)?;
            } else {
                run(&mut progress)?;
            }
        }

        let mut results: Vec<Vec<Completion>> = vec![Vec::new(); prompts.len()];
        for seq in sequences {
            let (finish_reason, stop_reason) = seq.finished.expect("every sequence finishes");
            let text = match self.tokenizer {
                Some(t) => params.stop.final_text(&seq.tokens, stop_reason.as_ref(), t, params.skip_special_tokens)?,
                None => String::new(),
            };
            results[seq.prompt_index].push(Completion {
                prompt_index: seq.prompt_index,
                sample_index: seq.sample_index,
                token_ids: seq.tokens,
                text,
                logprobs: seq.logprobs,
                raw_logprobs: seq.raw_logprobs,
                finish_reason,
                stop_reason,
            });
        }
        Ok(results)
    }

    /// Continuous batching: up to `max_batch_size` sequences decode together; as rows finish,
    /// waiting samples take their places (their prompts prefilled once, in order of length, and
    /// fanned out to their samples), so the batch stays full until the work runs out.
    fn run(
        &self,
        order: &[usize],
        prompts: &[Vec<u32>],
        params: &SamplingParams,
        sequences: &mut [Sequence],
        state: &mut Progress,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<()> {
        let model = self.model;
        let device = model.device();
        let vocab = model.config().vocab_size;
        let n = params.n;
        // The tokenizer's EOS stops with no stop reason (vLLM's), unless ignored.
        let eos = self.tokenizer.and_then(Tokenizer::eos_id).filter(|_| !params.ignore_eos);
        let mut capacity = self.max_batch_size.max(1);
        let mut pages = if self.paged { model.new_paged_kv() } else { None };
        // A KV memory bound: in blocks where they are paged (one sample of the longest prompt
        // must fit), else in rows.
        let lengths = prompts.iter().map(|p| (p.len(), params.max_new_tokens.min(model.context_len() - p.len())));
        // Unset: half the memory available now (the host's for blocks in host memory, a CUDA
        // device's for blocks there), and never more than a device's largest buffer holds (one
        // layer's keys are one buffer).
        let default = pages.as_ref().and_then(|p| match p.is_on_device() {
            false => crate::model::weights::available_memory(),
            true => crate::dist::device_free_memory::<B>(&device),
        });
        // Each bound with what it is, for the error line (nothing where --kv-memory gave it).
        let default = default.map(|bytes| (bytes / 2, Some("half the memory available now")));
        // A bound from memory (--kv-memory, or the memory available), not only a buffer's size.
        let memory_bound = self.kv_memory.is_some() || default.is_some();
        let buffer = pages.as_ref().and_then(|p| Some((p.max_blocks()? as u64 * p.block_bytes(), Some("what the device's largest buffer holds"))));
        let kv_memory = match (self.kv_memory.map(|bytes| (bytes, None)).or(default), buffer) {
            (Some(a), Some(b)) => Some(if b.0 < a.0 { b } else { a }),
            (a, b) => a.or(b),
        };
        // The sample taking the most blocks: (prompt, new tokens).
        let (prompt, new) = lengths.clone().max_by_key(|&(p, new)| (Self::blocks_for(p, new), p + new)).unwrap_or((0, 0));
        let block_limit = match (kv_memory, pages.as_ref()) {
            (Some((bytes, what)), Some(pages)) => {
                Self::fit(bytes, pages.block_bytes() * Self::blocks_for(prompt, new) as u64, prompt + new).map_err(|e| match what {
                    None => e,
                    Some(what) => Error::InvalidInput(format!("{e} ({what}; shorten the sequences or free memory)")),
                })?;
                Some((bytes / pages.block_bytes()) as usize)
            }
            (Some((bytes, _)), None) => {
                capacity = capacity.min(self.rows_within(bytes, lengths.map(|(p, new)| p + new).max().unwrap_or(0))?);
                None
            }
            (None, _) => None,
        };
        // Device blocks for the whole batch at its longest, within a memory bound: allocated
        // once. Bounded only by the largest buffer (wgpu, no --kv-memory), they grow as needed.
        if let (Some(pages), Some(limit), true) = (pages.as_mut().filter(|p| p.is_on_device()), block_limit, memory_bound) {
            pages.preallocate(limit.min(capacity.saturating_mul(Self::blocks_for(prompt, new))));
        }
        // Samples not yet started, prompt by prompt: (prompt index, next sample, samples left).
        let mut waiting: VecDeque<(usize, usize, usize)> = order.iter().map(|&p| (p, 0, n)).collect();
        let mut prefilled = Prefilled::default();
        let mut batch: Option<Running<B>> = None;
        let mut times = StepTimes::default();
        let mut step_start = std::time::Instant::now();
        loop {
            // Refill free rows once enough are free (or the batch is empty, or all that waits fits).
            let rows = batch.as_ref().map_or(0, |b| b.slots.len());
            let free = capacity.saturating_sub(rows);
            let left: usize = waiting.iter().map(|w| w.2).sum();
            if free > 0 && left > 0 && (rows == 0 || free >= refill_at(capacity) || left <= free) {
                // Blocks not yet promised: the limit, less those in use and those the running
                // sequences may still take (to their longest, the last token not cached).
                let spare = block_limit.zip(pages.as_ref()).map(|(limit, pages)| {
                    let promised: usize = match batch.as_ref().map(|b| (&b.rows, &b.slots)) {
                        Some((Rows::Paged(seqs), slots)) => {
                            seqs.iter().zip(slots).map(|(&id, &s)| pages.blocks_to_grow(id, sequences[s].prompt_len + sequences[s].limit - 1)).sum()
                        }
                        _ => 0,
                    };
                    limit.saturating_sub(pages.blocks_in_use() + promised)
                });
                match (self.admit(&mut waiting, free, prompts, &mut prefilled, params, spare, pages.as_mut(), &mut times)?, batch.take()) {
                    (Some(joining), None) => batch = Some(joining),
                    (Some(joining), Some(running)) => batch = Some(Running::join(running, joining)),
                    (None, running) => batch = running,
                }
                if let Some(pages) = pages.as_ref() {
                    times.kv_bytes_peak = times.kv_bytes_peak.max(pages.bytes_in_use());
                }
                if batch.is_none() {
                    return Err(Error::InvalidInput("the KV cache's memory holds no waiting sample (raise --kv-memory)".into()));
                }
            }
            let Some(running) = batch.as_mut() else { break };

            let (picked, waited) = self.sample(&running.logits, &running.slots, sequences, prompts, params);
            times.wait_s += waited;
            // Samples read back after a device failure are not used.
            if let Some(err) = kiln_backends::device::fault() {
                return Err(err.into());
            }
            let mut newly_finished = 0;
            for (&s, sampled) in running.slots.iter().zip(picked) {
                let seq = &mut sequences[s];
                if seq.finished.is_some() {
                    continue;
                }
                // (On a device, a row with no token to sample can also come back as an id outside
                // the vocabulary.)
                if sampled.raw_logprob.is_nan() || sampled.logprob.is_nan() || sampled.token as usize >= self.model.config().vocab_size {
                    return Err(nan_logits(seq.tokens.len() + 1, s / params.n, s % params.n));
                }
                seq.tokens.push(sampled.token);
                seq.logprobs.push(sampled.logprob);
                seq.raw_logprobs.push(sampled.raw_logprob);
                state.tokens += 1;
                if let Some(reason) = params.stop.check(&seq.tokens, self.tokenizer, params.skip_special_tokens)? {
                    seq.finished = Some((FinishReason::Stop, Some(reason.naming_eos(eos))));
                } else if seq.tokens.len() >= seq.limit {
                    seq.finished = Some((FinishReason::Length, None));
                }
                newly_finished += seq.finished.is_some() as usize;
            }
            state.finished += newly_finished;
            progress(*state);

            // Finished rows leave the batch once a quarter of it is done, or when waiting
            // samples could take their places (they decode padding until then).
            let active: Vec<usize> = (0..running.slots.len()).filter(|&r| sequences[running.slots[r]].finished.is_none()).collect();
            let done = running.slots.len() - active.len();
            let free_after = capacity.saturating_sub(active.len());
            if active.is_empty() {
                if let (Some(pages), Rows::Paged(seqs)) = (pages.as_mut(), &running.rows) {
                    seqs.iter().for_each(|&s| pages.release(s));
                }
                batch = None;
                times.lap(&mut step_start);
                self.set_times(times);
                continue;
            }
            match (&mut running.rows, pages.as_mut()) {
                // A paged sequence leaves as soon as it finishes: its blocks go back, nothing is copied.
                (Rows::Paged(seqs), Some(pages)) if done > 0 => {
                    (0..seqs.len()).filter(|&r| sequences[running.slots[r]].finished.is_some()).for_each(|r| pages.release(seqs[r]));
                    *seqs = active.iter().map(|&r| seqs[r]).collect();
                    running.slots = active.iter().map(|&r| running.slots[r]).collect();
                }
                (Rows::Dense(cache), _) if done * 4 >= running.slots.len() || (left > 0 && done > 0 && free_after >= refill_at(capacity).min(left)) => {
                    let taken = std::mem::replace(cache, KvCache::new(0));
                    *cache = taken.select_and_trim(index_tensor::<B>(&active, &device));
                    running.slots = active.iter().map(|&r| running.slots[r]).collect();
                }
                _ => {}
            }
            let step = self.decode_inputs(&running.slots, sequences, &device);
            let hidden = match (&mut running.rows, pages.as_mut()) {
                (Rows::Paged(seqs), Some(pages)) => {
                    let hidden = model.decode_paged(&step, pages, seqs);
                    times.kv_bytes_peak = times.kv_bytes_peak.max(pages.bytes_in_use());
                    hidden
                }
                (Rows::Dense(cache), _) => model.forward_hidden(&step, Some(cache)),
                (Rows::Paged(_), None) => unreachable!("paged rows come from a paged cache"),
            };
            running.logits = model.logits(hidden).reshape([running.slots.len(), vocab]);
            times.lap(&mut step_start);
            self.set_times(times);
        }
        Ok(())
    }

    /// One token for every row of `logits` `[rows, V]` (rows already finished get one too, unused):
    /// sampled from the host's copy on the CPU backend (its tensors are host memory), on the
    /// device elsewhere.
    /// Also returns the seconds spent waiting for the device's answer.
    fn sample(&self, logits: &Tensor<B, 2>, slots: &[usize], sequences: &[Sequence], prompts: &[Vec<u32>], params: &SamplingParams) -> (Vec<Sampled>, f64) {
        let u: Vec<f32> = slots
            .iter()
            .map(|&s| {
                let seq = &sequences[s];
                uniform(params.seed, seq.prompt_index, seq.sample_index, seq.tokens.len())
            })
            .collect();
        // Rows short of min_tokens may not draw a stop id or an EOS; the penalties see each
        // row's prompt and output.
        let banned = params.stop.banned_before_min_tokens(&self.eos_ids);
        let edits: Vec<RowEdits> = slots
            .iter()
            .map(|&s| {
                let seq = &sequences[s];
                let short = seq.tokens.len() < params.stop.min_tokens;
                RowEdits { banned: if short { &banned } else { &[] }, penalties: params.penalties, prompt: &prompts[seq.prompt_index], output: &seq.tokens }
            })
            .collect();
        if !crate::model::kernels::kernels::<B>().host_memory {
            let picked = device_sampler::sample(logits.clone(), &params.sampler, &u, Some(&edits));
            let start = std::time::Instant::now();
            let picked = device_sampler::read(picked);
            return (picked, start.elapsed().as_secs_f64());
        }
        let vocab = logits.dims()[1];
        let host: Vec<f32> = logits.clone().into_data().convert::<f32>().into_vec().expect("f32 logits");
        // Rows sample independently (f64 softmax over the vocabulary, the step's one serial
        // part): on every core, in row order.
        let rows: Vec<(&[f32], f32, RowEdits)> = host.chunks_exact(vocab).zip(u).zip(edits).map(|((row, u), edits)| (row, u, edits)).collect();
        (crate::par::map_in_order(&rows, |(row, u, edits)| params.sampler.sample_edited(row, *u, edits)), 0.0)
    }

    /// Takes up to `free` waiting samples (whole prompts' worth where possible) and, on a
    /// paged cache with a memory bound, as many as `spare` blocks can hold at their longest
    /// ([`Engine::blocks_for`], a prompt's blocks counted once); prefills the prompts not
    /// prefilled yet (in passes of at most [`Engine::max_prefill_tokens`]), and returns the batch
    /// of their rows (`None`: none fit).
    #[allow(clippy::too_many_arguments)]
    fn admit(
        &self,
        waiting: &mut VecDeque<(usize, usize, usize)>,
        free: usize,
        prompts: &[Vec<u32>],
        prefilled: &mut Prefilled<B>,
        params: &SamplingParams,
        mut spare: Option<usize>,
        mut pages: Option<&mut PagedKv<B>>,
        times: &mut StepTimes,
    ) -> Result<Option<Running<B>>> {
        let n = params.n;
        let mut take: Vec<(usize, usize, usize)> = Vec::new(); // (prompt, first sample, count)
        let mut room = free;
        while room > 0 {
            let Some(front) = waiting.front_mut() else { break };
            let mut count = front.2.min(room);
            if let Some(spare) = spare.as_mut() {
                let len = prompts[front.0].len();
                let new = params.max_new_tokens.min(self.model.context_len() - len);
                let prompt_blocks = if prefilled.entries.contains_key(&front.0) { 0 } else { len.div_ceil(BLOCK) };
                let per_sample = Self::blocks_for(len, new) - len.div_ceil(BLOCK);
                count = count.min(spare.saturating_sub(prompt_blocks) / per_sample.max(1));
                if count == 0 {
                    break;
                }
                *spare -= prompt_blocks + count * per_sample;
            }
            take.push((front.0, front.1, count));
            room -= count;
            front.1 += count;
            front.2 -= count;
            if front.2 == 0 {
                waiting.pop_front();
            }
        }
        let new: Vec<usize> = take.iter().map(|t| t.0).filter(|p| !prefilled.entries.contains_key(p)).collect();
        let mut rest = new.as_slice();
        while !rest.is_empty() {
            let group = prefill_group(rest.iter().map(|&p| prompts[p].len()), self.max_prefill_tokens);
            let tokens = self.prefill(&rest[..group], prompts, prefilled, pages.as_deref_mut())?;
            times.prefills += 1;
            times.prefill_tokens_max = times.prefill_tokens_max.max(tokens);
            rest = &rest[group..];
        }
        let mut parts = Vec::with_capacity(take.len());
        for &(p, first, count) in &take {
            let (rows, logits) = prefilled.entries.get(&p).expect("prefilled above").clone();
            let last = first + count == n;
            if last {
                prefilled.entries.remove(&p);
            }
            let fan_out = index_tensor::<B>(&vec![0; count], &self.model.device());
            let rows = match (rows, pages.as_deref_mut()) {
                // The samples share the prompt's blocks; the prompt's own hold ends with its last sample.
                (Rows::Paged(prompt), Some(pages)) => {
                    let seqs = (0..count).map(|_| pages.fork(prompt[0])).collect();
                    if last {
                        pages.release(prompt[0]);
                    }
                    Rows::Paged(seqs)
                }
                (Rows::Dense(cache), _) => Rows::Dense(cache.select_rows(fan_out.clone())),
                (Rows::Paged(_), None) => unreachable!("paged rows come from a paged cache"),
            };
            parts.push(Running { rows, logits: logits.select(0, fan_out), slots: (first..first + count).map(|s| p * n + s).collect() });
        }
        Ok(parts.into_iter().reduce(Running::join))
    }

    /// Prefills prompts `new` (indices into `prompts`) in one pass, their keys and values
    /// written into `pages` where the cache is paged, and records each prompt's rows and
    /// next-token logits in `prefilled`; returns the tokens the pass took, padding included.
    fn prefill(&self, new: &[usize], prompts: &[Vec<u32>], prefilled: &mut Prefilled<B>, pages: Option<&mut PagedKv<B>>) -> Result<usize> {
        let rows: Vec<Vec<u32>> = new.iter().map(|&p| prompts[p].clone()).collect();
        let device = self.model.device();
        let inputs = HostBatch::left_padded(&rows, self.pad_id)?.to_device::<B>(&device);
        let (hidden, rows): (_, Vec<Rows<B>>) = match pages {
            // Each prompt's positions (its left padding left out) written into its blocks
            // by the prefill, a layer at a time.
            Some(pages) => {
                let seqs: Vec<SeqId> = new.iter().map(|&p| pages.insert(prompts[p].len())).collect();
                let hidden = self.model.prefill_paged(&inputs, pages, &seqs);
                (hidden, seqs.into_iter().map(|s| Rows::Paged(vec![s])).collect())
            }
            None => {
                let mut cache = self.model.new_cache();
                let hidden = self.model.forward_hidden(&inputs, Some(&mut cache));
                (hidden, (0..new.len()).map(|i| Rows::Dense(cache.clone().select_rows(index_tensor::<B>(&[i], &device)))).collect())
            }
        };
        let [batch, seq, _] = hidden.dims();
        let logits = self.model.logits(hidden.narrow(1, seq - 1, 1)).reshape([batch, self.model.config().vocab_size]);
        for ((i, &p), rows) in new.iter().enumerate().zip(rows) {
            prefilled.entries.insert(p, (rows, logits.clone().select(0, index_tensor::<B>(&[i], &device))));
        }
        Ok(batch * seq)
    }

    /// The `[rows, 1]` step input: each live row feeds its last token at its next position;
    /// finished rows feed padding that nothing attends to.
    fn decode_inputs(&self, slots: &[usize], sequences: &[Sequence], device: &B::Device) -> Inputs<B> {
        let mut ids = Vec::with_capacity(slots.len());
        let mut positions = Vec::with_capacity(slots.len());
        let mut valid = Vec::with_capacity(slots.len());
        for &s in slots {
            let seq = &sequences[s];
            let live = seq.finished.is_none();
            ids.push(if live { *seq.tokens.last().expect("sampled") as i64 } else { self.pad_id as i64 });
            positions.push(if live { (seq.prompt_len + seq.tokens.len() - 1) as i64 } else { 0 });
            valid.push(live);
        }
        let shape = [slots.len(), 1];
        Inputs {
            ids: Tensor::from_data(TensorData::new(ids, shape), device),
            positions: Tensor::from_data(TensorData::new(positions, shape), device),
            valid: Tensor::from_data(TensorData::new(valid, shape), device),
            documents: None,
        }
    }
}

/// `gib` GiB in bytes (the `kv_memory` settings are given in GiB).
pub fn gib_bytes(gib: f64) -> u64 {
    (gib * (1u64 << 30) as f64) as u64
}

/// Free rows at which a running batch takes in waiting samples: an eighth of it, so a refill
/// (a prefill, and on the batch-shaped cache a copy of it) is paid for by several rows at once.
fn refill_at(capacity: usize) -> usize {
    (capacity / 8).max(1)
}

/// Why `model` cannot continue `prompt`, if it cannot: it is empty, fills the context, or holds
/// an id outside the vocabulary (said of the prompt: "has 9 tokens; …").
pub fn check_prompt<B: Backend>(model: &Qwen2<B>, prompt: &[u32]) -> std::result::Result<(), String> {
    let context = model.context_len();
    if prompt.is_empty() {
        return Err("is empty".into());
    }
    if prompt.len() >= context {
        return Err(format!("has {} tokens; the model's context is {context}", prompt.len()));
    }
    let vocab = model.config().vocab_size;
    match prompt.iter().find(|&&t| t as usize >= vocab) {
        Some(bad) => Err(format!("has token id {bad} >= vocab_size {vocab}")),
        None => Ok(()),
    }
}

/// The sampling knobs and stop strings of a request, as the engine and [`super::Stream`] check
/// them.
pub(crate) fn check_params(params: &SamplingParams, has_tokenizer: bool) -> Result<()> {
    params.sampler.check()?;
    params.penalties.check()?;
    if params.stop.min_tokens > params.max_new_tokens {
        // (vLLM's refusal)
        return Err(Error::InvalidInput(format!(
            "min_tokens ({}) must be at most max_new_tokens ({})",
            params.stop.min_tokens, params.max_new_tokens
        )));
    }
    if !params.stop.strings.is_empty() && !has_tokenizer {
        return Err(Error::InvalidInput("stop strings need a tokenizer".into()));
    }
    if params.stop.strings.iter().any(String::is_empty) {
        // vLLM refuses it too: the empty string is in every text, so every sample would stop at
        // its first token, with no text.
        return Err(Error::InvalidInput("a stop string cannot be empty".into()));
    }
    Ok(())
}

/// The error of a sample whose next-token logits are NaN (no token can be sampled: the raw
/// log-prob of the one picked is NaN) at its `token`-th token (from 1).
pub(crate) fn nan_logits(token: usize, prompt: usize, sample: usize) -> Error {
    Error::InvalidInput(format!(
        "the model's next-token logits are NaN at token {token} of prompt {prompt}'s sample {sample}: its weights hold NaN or infinity, or its dtype overflowed (f16: try bf16 or f32)"
    ))
}

/// How many of the prompts of `lengths`, from the first, one prefill pass takes: as many as fit
/// `max_tokens` padded to the longest of them, at least one (the engine hands them shortest
/// first, so that few pad tokens are spent).
pub fn prefill_group(lengths: impl Iterator<Item = usize>, max_tokens: usize) -> usize {
    let mut longest = 0;
    let mut count = 0;
    for len in lengths {
        longest = longest.max(len);
        if count > 0 && longest * (count + 1) > max_tokens {
            break;
        }
        count += 1;
    }
    count
}

/// Prompts prefilled whose samples have not all started: prompt → (its cache row, its logits).
struct Prefilled<B: Backend> {
    entries: HashMap<usize, (Rows<B>, Tensor<B, 2>)>,
}

impl<B: Backend> Default for Prefilled<B> {
    fn default() -> Self {
        Self { entries: HashMap::new() }
    }
}

/// The rows decoding together: their cache, the logits of their next token, and which
/// sequence each row holds.
struct Running<B: Backend> {
    rows: Rows<B>,
    logits: Tensor<B, 2>,
    slots: Vec<usize>,
}

/// Where rows keep their keys and values: a batch-shaped cache, or sequences of a paged one.
#[derive(Clone)]
enum Rows<B: Backend> {
    Dense(KvCache<B>),
    Paged(Vec<SeqId>),
}

impl<B: Backend> Running<B> {
    fn join(a: Self, b: Self) -> Self {
        let mut slots = a.slots;
        slots.extend(b.slots);
        let rows = match (a.rows, b.rows) {
            (Rows::Dense(a), Rows::Dense(b)) => Rows::Dense(KvCache::stack(vec![a, b])),
            (Rows::Paged(mut a), Rows::Paged(b)) => {
                a.extend(b);
                Rows::Paged(a)
            }
            _ => unreachable!("one generation call keeps one kind of cache"),
        };
        Self { rows, logits: Tensor::cat(vec![a.logits, b.logits], 0), slots }
    }
}

fn index_tensor<B: Backend>(indices: &[usize], device: &B::Device) -> Tensor<B, 1, Int> {
    let data: Vec<i64> = indices.iter().map(|&i| i as i64).collect();
    Tensor::from_data(TensorData::new(data, [indices.len()]), device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    /// A random f32 model of `[vocab, hidden, intermediate, layers, heads, KV heads, positions]`.
    fn random_model(sizes: [usize; 7], seed: u64) -> Qwen2<Flex> {
        let [v, h, i, l, a, k, p] = sizes;
        let config = serde_json::from_str(&format!(
            r#"{{"vocab_size": {v}, "hidden_size": {h}, "intermediate_size": {i}, "num_hidden_layers": {l},
                "num_attention_heads": {a}, "num_key_value_heads": {k}, "max_position_embeddings": {p}}}"#
        ))
        .unwrap();
        Qwen2::<Flex>::random(&config, seed, &Default::default()).unwrap()
    }

    #[test]
    fn step_times_count_every_decoding_step() {
        let model = random_model([40, 16, 24, 1, 2, 1, 64], 1);
        let engine = Engine::new(&model, None);
        let params = SamplingParams { n: 3, max_new_tokens: 9, ignore_eos: true, ..SamplingParams::default() };
        engine.generate(&[vec![1, 2, 3], vec![4, 5]], &params, |_| {}).unwrap();
        let times = engine.step_times();
        // Six rows decode together: one step per token.
        assert_eq!(times.steps, 9);
        assert!(times.total_s > 0.0 && times.wait_s <= times.total_s);
        assert!((0.0..=1.0).contains(&times.host_share()));
        // A new call starts the count again.
        engine.generate(&[vec![1]], &SamplingParams { max_new_tokens: 2, ignore_eos: true, ..params }, |_| {}).unwrap();
        assert_eq!(engine.step_times().steps, 2);
    }

    /// A model whose logits are NaN (weights holding NaN, or an overflowing dtype) is one error
    /// naming the prompt and sample, greedy or sampled, instead of a panic or token 0 forever.
    #[test]
    fn nan_logits_are_an_error() {
        struct Poison;
        impl burn::module::ModuleMapper<Flex> for Poison {
            fn map_float<const D: usize>(&mut self, param: burn::module::Param<Tensor<Flex, D>>) -> burn::module::Param<Tensor<Flex, D>> {
                param.map(|t| t.mul_scalar(f32::NAN))
            }
        }
        use burn::module::Module;
        let model = random_model([40, 16, 24, 1, 2, 1, 64], 1).map(&mut Poison);
        for temperature in [0.0, 1.0] {
            let params = SamplingParams { n: 2, max_new_tokens: 4, sampler: Sampler { temperature, ..Sampler::default() }, ..SamplingParams::default() };
            let err = Engine::new(&model, None).generate(&[vec![1, 2, 3]], &params, |_| {}).unwrap_err().to_string();
            assert!(err.contains("logits are NaN at token 1 of prompt 0's sample 0"), "temperature {temperature}: {err}");
        }
    }

    /// Sequences decoded from the paged cache (prompts' blocks shared by their samples, rows
    /// leaving as they finish) are the batch-shaped cache's: the same tokens, and log-probs to
    /// float noise (the batch's rows change at other steps, so the products run on other shapes).
    #[test]
    fn paged_and_batch_shaped_caches_generate_the_same() {
        let model = random_model([50, 64, 96, 2, 4, 2, 512], 7);
        assert!(model.new_paged_kv().is_some_and(|p| !p.is_on_device()), "the Flex backend in f32 decodes from a paged cache in host memory");
        paged_matches_batch_shaped(&model, 1e-4, MAX_PREFILL_TOKENS);
    }

    /// The same on wgpu, whose blocks live in device memory (scattered into pools allocated for
    /// the batch, copied on write there, read by the flash-decoding kernel), the prompts
    /// prefilled in passes of at most 130 tokens (scattered into the pools pass by pass).
    #[cfg(feature = "wgpu")]
    #[test]
    fn device_paged_and_batch_shaped_caches_generate_the_same() {
        type Wgpu = burn::backend::Wgpu;
        let device = crate::model::cube::tests::wgpu::device();
        let config = random_model([50, 64, 96, 2, 4, 2, 512], 7).config().clone();
        let model = Qwen2::<Wgpu>::random(&config, 7, &device).unwrap();
        let block = model.new_paged_kv().filter(|p| p.is_on_device()).expect("wgpu decodes from a paged cache on the device").block_bytes();
        let peak = paged_matches_batch_shaped(&model, 1e-3, 130);
        assert!(peak > 8 * block, "the batch's sequences held their blocks on the device: {peak} bytes at most");
    }

    /// The peak bytes of the paged cache's blocks.
    fn paged_matches_batch_shaped<B: Backend>(model: &Qwen2<B>, tolerance: f32, max_prefill_tokens: usize) -> u64 {
        // Prompts across block edges (64 positions), 3 samples each, stop tokens that end
        // samples at different steps (none before the third token: min_tokens, masked in the
        // sampler), and more samples than the batch holds at once.
        let prompts: Vec<Vec<u32>> = [1usize, 63, 64, 65, 130].iter().map(|&len| (0..len).map(|i| (i * 7 % 49 + 1) as u32).collect()).collect();
        let params = SamplingParams {
            n: 3,
            max_new_tokens: 80,
            sampler: Sampler { temperature: 1.0, top_p: 0.9, ..Sampler::default() },
            stop: StopCriteria { token_ids: vec![3, 17], min_tokens: 3, ..StopCriteria::default() },
            seed: 11,
            ..SamplingParams::default()
        };
        let run = |paged: bool| {
            let mut engine = Engine::new(model, None);
            engine.paged = paged;
            engine.max_batch_size = 8;
            engine.max_prefill_tokens = max_prefill_tokens;
            let out = engine.generate(&prompts, &params, |_| {}).unwrap();
            (out, engine.step_times().kv_bytes_peak)
        };
        let ((paged, peak), (dense, _)) = (run(true), run(false));
        assert!(peak > 0, "the paged cache was used");
        let lengths: Vec<usize> = paged.iter().flatten().map(|c| c.token_ids.len()).collect();
        assert!(paged.iter().flatten().all(|c| c.token_ids[..3].iter().all(|t| ![3, 17].contains(t))), "no stop id within min_tokens");
        assert!(lengths.iter().any(|&l| l < 80) && lengths.iter().any(|&l| l > 64), "samples end at several steps: {lengths:?}");
        for (p, d) in paged.iter().flatten().zip(dense.iter().flatten()) {
            assert_eq!(p.token_ids, d.token_ids, "prompt {} sample {}", p.prompt_index, p.sample_index);
            for (a, b) in p.logprobs.iter().zip(&d.logprobs) {
                assert!((a - b).abs() <= tolerance, "prompt {} sample {}: {a} vs {b}", p.prompt_index, p.sample_index);
            }
        }
        peak
    }

    #[test]
    fn prefill_groups_fit_the_token_bound() {
        // Padded to the group's longest prompt; a prompt longer than the bound goes alone.
        assert_eq!(prefill_group([10, 20, 30, 40].into_iter(), 60), 2);
        assert_eq!(prefill_group([30, 30].into_iter(), 60), 2);
        assert_eq!(prefill_group([30, 31].into_iter(), 60), 1);
        assert_eq!(prefill_group([100, 100].into_iter(), 60), 1);
        assert_eq!(prefill_group([5; 9].into_iter(), 8192), 9);
    }

    /// Prompts prefilled in several passes (`max_prefill_tokens`) give the samples of one pass,
    /// on the paged cache and the batch-shaped one; no pass takes more tokens than the bound.
    #[test]
    fn prefill_in_groups_changes_no_sample() {
        let model = random_model([50, 64, 96, 2, 4, 2, 512], 7);
        let prompts: Vec<Vec<u32>> = [1usize, 63, 64, 65, 130, 20].iter().map(|&len| (0..len).map(|i| (i * 5 % 47 + 2) as u32).collect()).collect();
        let params = SamplingParams { n: 2, max_new_tokens: 12, sampler: Sampler { temperature: 1.0, ..Sampler::default() }, seed: 3, ..SamplingParams::default() };
        for paged in [true, false] {
            let run = |max_prefill_tokens: usize| {
                let mut engine = Engine::new(&model, None);
                (engine.paged, engine.max_prefill_tokens) = (paged, max_prefill_tokens);
                (engine.generate(&prompts, &params, |_| {}).unwrap(), engine.step_times())
            };
            let ((one, one_pass), (groups, passes)) = (run(MAX_PREFILL_TOKENS), run(130));
            assert_eq!((one_pass.prefills, one_pass.prefill_tokens_max), (1, 6 * 130), "paged {paged}: the twelve samples fit the batch: one pass");
            // Shortest first, padded to each group's longest: [1, 20], [63, 64], [65], [130].
            assert_eq!((passes.prefills, passes.prefill_tokens_max), (4, 130), "paged {paged}");
            for (a, b) in one.iter().flatten().zip(groups.iter().flatten()) {
                assert_eq!(a.token_ids, b.token_ids, "paged {paged}: prompt {} sample {}", a.prompt_index, a.sample_index);
                for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
                    assert!((x - y).abs() <= 1e-4, "paged {paged}: prompt {}: {x} vs {y}", a.prompt_index);
                }
            }
        }
    }

    #[test]
    fn kv_memory_bounds_the_batch() {
        let model = random_model([40, 16, 24, 3, 4, 2, 128], 1);
        let mut engine = Engine::new(&model, None);
        // Keys and values, 3 layers, 2 KV heads of 4, f32: 192 bytes a position.
        assert_eq!(engine.kv_bytes_per_position(), 2 * 3 * 2 * 4 * 4);
        // The paged cache: blocks of 64 positions, 12,288 bytes.
        let block = 64 * 192;
        // At most: whole blocks and a copy of the prompt's last one.
        assert_eq!(engine.rows_within(10 * block + block - 1, 20).unwrap(), 5);
        assert_eq!(engine.rows_within(10 * block, 65).unwrap(), 3);
        // The last token is not cached: 64 + 65 new tokens fill two blocks exactly.
        assert_eq!((Engine::<Flex>::blocks_for(10, 60), Engine::<Flex>::blocks_for(64, 66), Engine::<Flex>::blocks_for(64, 65)), (3, 3, 2));
        // The batch-shaped one: 20 positions and the half a buffer may grow by, 5,760 bytes.
        engine.paged = false;
        assert_eq!(engine.rows_within(10 * 5760 + 5759, 20).unwrap(), 10);
        let err = engine.rows_within(5759, 20).unwrap_err().to_string();
        assert!(err.contains("does not hold one sequence of 20 positions"), "{err}");

        // A 10-token prompt, 4 samples of 60 tokens: a sample may take the prompt's block, its
        // own copy of it and one more block. Three blocks hold one sample at a time (4 × 60
        // steps), nine hold all four at once (60 steps); the tokens are the same.
        engine.paged = true;
        let params = SamplingParams { n: 4, max_new_tokens: 60, ignore_eos: true, sampler: Sampler { temperature: 1.0, ..Sampler::default() }, ..SamplingParams::default() };
        let mut run = |blocks: Option<u64>| {
            engine.kv_memory = blocks.map(|b| b * block);
            let out = engine.generate(&[(1..=10).collect()], &params, |_| {}).map(|out| out.into_iter().flatten().map(|c| c.token_ids).collect::<Vec<_>>());
            (out, engine.step_times())
        };
        let free = run(None).0.unwrap();
        let (three, times) = run(Some(3));
        assert_eq!((three.unwrap(), times.steps), (free.clone(), 4 * 60));
        assert!(times.kv_bytes_peak <= 3 * block && times.kv_bytes_peak >= 2 * block, "{}", times.kv_bytes_peak);
        let (nine, times) = run(Some(9));
        assert_eq!((nine.unwrap(), times.steps), (free, 60));
        let err = run(Some(2)).0.unwrap_err().to_string();
        assert!(err.contains("does not hold one sequence of 70 positions"), "{err}");
    }
}
