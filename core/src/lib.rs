//! kiln-core: the backend-generic library behind kiln — the Qwen2 model family with Hugging Face
//! checkpoints, batched generation, one training loop for pre-training, SFT, GRPO and on-policy
//! distillation, and the Interplay reasoning task with the reference's evaluation. Everything is
//! generic over burn's [`Backend`](burn::tensor::backend::Backend); the `kiln` crate adds backend
//! selection by name and the command-line interface.
//!
//! # Quick start
//!
//! Load a Hugging Face model directory (`config.json`, `model.safetensors`, `tokenizer.json`) and
//! sample from it. (The hidden lines write such a directory: the tiny Qwen2 of kiln's
//! minute-scale pipelines, with random weights and the paper's tokenizer.)
//!
//! ```
//! # #[cfg(feature = "tasks")] fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use burn::backend::Flex;
//! use kiln_core::generate::{Engine, Sampler, SamplingParams};
//! use kiln_core::model::hf;
//! use kiln_core::tokenizer::Tokenizer;
//! # let tmp = tempfile::tempdir()?;
//! # let dir = tmp.path().join("model");
//! # kiln_core::tasks::interplay::tiny_model::write_tiny_model(&tmp.path().join("tiny"))?;
//! # let config = kiln_core::model::Qwen2Config::from_file(tmp.path().join("tiny/config.json"))?;
//! # let random = kiln_core::model::Qwen2::<Flex>::random(&config, 0, &Default::default())?;
//! # hf::save(&random, &dir, hf::SaveDtype::F32, Some(&tmp.path().join("tiny")))?;
//!
//! let device = Default::default();
//! let model = hf::load::<Flex>(&dir, &device)?;
//! let tokenizer = Tokenizer::from_file(&dir)?;
//! let prompt = tokenizer.encode("<question> How many adult owl does Pine Ridge have? </question> <solution>")?;
//!
//! // Two samples at temperature 0.7; generation stops at the model's EOS or after 16 tokens.
//! let params = SamplingParams {
//!     n: 2,
//!     sampler: Sampler { temperature: 0.7, ..Sampler::default() },
//!     max_new_tokens: 16,
//!     seed: 1,
//!     ..SamplingParams::default()
//! };
//! let samples = Engine::new(&model, Some(&tokenizer)).generate(&[prompt], &params, |_| {})?;
//! for sample in &samples[0] {
//!     println!("{:?} {}", sample.finish_reason, sample.text);
//!     assert!(!sample.token_ids.is_empty() && sample.token_ids.len() <= 16);
//! }
//! # Ok(()) }
//! # #[cfg(not(feature = "tasks"))] fn main() {}
//! ```
//!
//! More: [log-probs](#log-probs-of-given-sequences), [training with your own
//! objective](#training-with-your-own-objective), [scoring an Interplay
//! completion](#scoring-an-interplay-completion); `examples/library.rs` in the repository is a
//! whole program that uses kiln only as a library.
//!
//! # Where things are
//!
//! | what | where (under `core/src/` unless said) |
//! |---|---|
//! | Qwen2: config (= HF `config.json`), RMSNorm, attention, MLP, decoder block, the model | [`model::config`] `model/config.rs`, [`model::qwen2`] `model/qwen2.rs` |
//! | construction by tensor name; projections (weight layout and matmul, the CPU decode kernel) | `model/weights.rs`, [`model::proj`] `model/proj.rs`, `model/cpu_decode.rs` |
//! | RoPE, KV cache, padded inputs | `model/rope.rs`, `model/kv_cache.rs`, [`model::inputs`] `model/inputs.rs` |
//! | the kernel seam: one table of kernels per backend (the CPU's fused kernels or the burn-ops reference) | [`model::kernels`] `model/kernels.rs` |
//! | Hugging Face load and save (safetensors, sharded, bf16/f16) | [`model::hf`] `model/hf.rs` |
//! | log-probs of given sequences | [`model::logprobs`] `model/logprobs.rs` |
//! | tokenizer (`tokenizer.json`) | [`tokenizer`] `tokenizer.rs` |
//! | generation engine, sampler (host and device), stop conditions | [`generate::engine`] `generate/engine.rs`, [`generate::sampler`] `generate/sampler.rs`, [`generate::device_sampler`] `generate/device_sampler.rs`, `generate/stop.rs` |
//! | the training loop, checkpoints, metrics | [`train::trainer`] `train/trainer.rs`, [`train::checkpoint`] `train/checkpoint.rs`, `train/metrics.rs` |
//! | objectives: the trait, next-token loss (pre-training, SFT) | [`train::objective`] `train/objective.rs` |
//! | AdamW (HF Trainer's groups, clipping), LR schedules | [`train::adamw`] `train/adamw.rs`, [`train::schedule`] `train/schedule.rs` |
//! | samples, batches, packing, mixtures, chat rows | [`data`] `data/` |
//! | GRPO loss (clipped surrogate, KL terms) and advantages (GRPO, OPD) | [`rl::loss`] `rl/loss.rs`, [`rl::advantage`] `rl/advantage.rs` |
//! | the policy-gradient objective, rollouts, validation | `rl/objective.rs`, `rl/rollout.rs`, `rl/validate.rs` (feature `tasks`) |
//! | pass@k (unbiased and ordered) | [`metrics::passk`] `metrics/passk.rs` |
//! | the [`Task`](crate::tasks::Task) trait (rows → prompts; response → verdict, reward) | `tasks/mod.rs` (feature `tasks`) |
//! | Interplay generator | `tasks/interplay/generator/`, `tasks/interplay/dataset.rs` (feature `tasks`) |
//! | Interplay scorer: answers, solution graphs, strict scoring, rewards | `tasks/interplay/answer.rs`, `tasks/interplay/graph/`, `tasks/interplay/scoring.rs`, `tasks/interplay/rewards.rs` (feature `tasks`) |
//! | run configs (TOML) and the pre-training / SFT / RL runs | `train/config/`, `train/run.rs`, `rl/run.rs` (feature `tasks`) |
//! | checkpoint evaluation | `eval/` (feature `eval`) |
//! | precision: dtypes, `[train] precision` (mixed, pure, loss scaling); memory and FLOPs from a config (`kiln plan`) | [`model::dtype`] `model/dtype.rs`, [`train::precision`] `train/precision.rs`, [`plan`] `plan.rs` |
//! | data parallel: replicas over burn-collective in one process, a TCP ring between processes, sharded evaluation | [`dist`] `dist/` |
//! | files: JSONL, atomic writes, Python-compatible JSON | [`io`] `io/` |
//! | SVG charts | `plot.rs` (feature `plot`) |
//! | the sandbox for model-written code | `sandbox/src/lib.rs` (the `kiln-sandbox` crate) |
//! | the code task: LiveCodeBench problems, prompts, extraction, grading in the sandbox, pass@k, the code reward, `kiln eval code`'s files | `tasks/code/` (feature `code`) |
//! | SFT rows from Parquet or JSONL with named columns, the held-out split; HF chat templates | `data/sft_source.rs`, `io/parquet.rs`, `tokenizer/chat_template.rs` (feature `code` for Parquet and templates) |
//!
//! The specification of the Interplay task and its evaluation is `docs/interplay.md`; the
//! release layout kiln writes and evaluates is `docs/release-layout.md`.
//!
//! # Features
//!
//! `tasks`, `eval` and `plot` are on by default. A program that only needs the model, the
//! tokenizer, generation and the training loop takes
//! `kiln-core = { version = "0.1", default-features = false }` (add `flex` for the fast CPU
//! decoding path) and does not build the Interplay task, its scorer, the TOML runs, evaluation,
//! SVG charts, nor `regex` and `plotters`.
//!
//! # Log-probs of given sequences
//!
//! ```
//! # #[cfg(feature = "tasks")] fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # use burn::backend::Flex;
//! # let tmp = tempfile::tempdir()?;
//! # let dir = tmp.path().join("model");
//! # kiln_core::tasks::interplay::tiny_model::write_tiny_model(&tmp.path().join("tiny"))?;
//! # let config = kiln_core::model::Qwen2Config::from_file(tmp.path().join("tiny/config.json"))?;
//! # let random = kiln_core::model::Qwen2::<Flex>::random(&config, 0, &Default::default())?;
//! # kiln_core::model::hf::save(&random, &dir, kiln_core::model::hf::SaveDtype::F32, Some(&tmp.path().join("tiny")))?;
//! use kiln_core::model::{hf, logprobs::sequence_logprobs};
//! use kiln_core::tokenizer::Tokenizer;
//!
//! let model = hf::load::<Flex>(&dir, &Default::default())?;
//! let ids = Tokenizer::from_file(&dir)?.encode("<question> What is it? </question> <solution>")?;
//! // [None, log p(ids[1] | ids[..1]), ...]: one entry per token, in chunks of 256 positions.
//! let logprobs = sequence_logprobs(&model, &[ids.clone()], 256)?.remove(0);
//! assert_eq!(logprobs.len(), ids.len());
//! assert!(logprobs[0].is_none() && logprobs[1..].iter().all(|lp| lp.is_some_and(|lp| lp <= 0.0)));
//!
//! // Ids the model cannot read are an error naming the sequence, not a panic.
//! assert!(sequence_logprobs(&model, &[vec![1, 999_999]], 256).is_err());
//! # Ok(()) }
//! # #[cfg(not(feature = "tasks"))] fn main() {}
//! ```
//!
//! # Training with your own objective
//!
//! The loop ([`train::train`]) asks an [`Objective`](train::Objective) for each step's
//! micro-batches and their losses; it owns AdamW, the schedule, clipping, accumulation, metrics
//! and checkpoints (Hugging Face directories with the optimizer state, resumable). No TOML is
//! involved:
//!
//! ```
//! # #[cfg(feature = "tasks")] fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use burn::backend::{Autodiff, Flex};
//! use burn::tensor::{Tensor, backend::AutodiffBackend};
//! use kiln_core::data::{Sample, TrainBatch, collate};
//! use kiln_core::model::{Qwen2, Qwen2Config, logprobs::token_logprobs};
//! use kiln_core::train::{LoopConfig, Objective, Start, train};
//! use serde_json::{Map, Value};
//! # let tmp = tempfile::tempdir()?;
//! # kiln_core::tasks::interplay::tiny_model::write_tiny_model(&tmp.path().join("tiny"))?;
//! # let config_json = tmp.path().join("tiny/config.json");
//!
//! /// Teaches the model one sequence by heart.
//! struct Memorise(Vec<u32>);
//!
//! impl<B: AutodiffBackend> Objective<B> for Memorise {
//!     type Micro = TrainBatch<B>;
//!
//!     fn updates(&mut self, model: &Qwen2<B>, _step: u64) -> kiln_core::Result<Vec<Vec<TrainBatch<B>>>> {
//!         // One optimizer update of one micro-batch (pad id 1).
//!         Ok(vec![vec![collate(&[Sample::all_targets(self.0.clone())], 1, &model.device())?]])
//!     }
//!
//!     fn loss(&mut self, model: &Qwen2<B>, batch: &TrainBatch<B>) -> kiln_core::Result<(Tensor<B, 1>, Map<String, Value>)> {
//!         let logprobs = token_logprobs(model.forward(&batch.inputs), batch.labels.clone());
//!         let loss = -(logprobs * batch.label_mask.clone().float()).sum() / batch.num_targets as f64;
//!         Ok((loss, Map::new()))
//!     }
//!
//!     fn state(&self) -> Value {
//!         Value::Null // nothing to restore: every step sees the same data
//!     }
//!
//!     fn restore(&mut self, _state: &Value) -> kiln_core::Result<()> {
//!         Ok(())
//!     }
//! }
//!
//! let steps = 4;
//! // a constant lr of 1e-2, AdamW's defaults, f32, a checkpoint after the last step
//! let config = LoopConfig::new(tmp.path().join("run"), steps, 1e-2);
//! type B = Autodiff<Flex>;
//! let device = Default::default();
//! let mut objective = Memorise((4..40).collect());
//! let start = Start::<B>::new(&config, false, &mut objective, &device, || {
//!     Qwen2::random(&Qwen2Config::from_file(&config_json)?, 0, &device)
//! })?;
//! let mut losses = Vec::new();
//! let (_model, summary) = train(start, &mut objective, &config, |_| Ok(Map::new()), |record| {
//!     losses.push(record["loss"].as_f64().unwrap());
//! })?;
//! assert!(losses[steps as usize - 1] < losses[0], "{losses:?}");
//! assert!(summary.checkpoints[0].join("model.safetensors").is_file());
//! # Ok(()) }
//! # #[cfg(not(feature = "tasks"))] fn main() {}
//! ```
//!
//! # Scoring an Interplay completion
//!
//! Generate a problem, take its gold completion as a model would write it, and score it the
//! reference's ways: the RL outcome reward (exact answer string), answer exact match as the
//! evaluation counts it, and the strict reasoning-graph comparison (`docs/interplay.md` §6.4,
//! §8.1–8.4).
//!
//! ```
//! # #[cfg(feature = "tasks")] fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use kiln_core::tasks::interplay::answer::{exact_match, extract_tagged_answer};
//! use kiln_core::tasks::interplay::dataset::{Seen, Split, generate_rows};
//! use kiln_core::tasks::interplay::graph::parse;
//! use kiln_core::tasks::interplay::rewards::{outcome_reward, rl_gold_answer};
//! use kiln_core::tasks::interplay::row::gold_answer;
//! use kiln_core::tasks::interplay::text::TaskText;
//!
//! // Two op-3 problems (seed 7): forward mode, then equation mode.
//! let (rows, _attempts) = generate_rows(Split::Test, 7, 3, 2, &Seen::default(), || {})?;
//! let row = &rows[0];
//! let text = TaskText::of(row).expect("a complete row");
//! assert!(text.prompt.ends_with("<solution>"));
//!
//! // The evaluation's text stops before `</answer>`; the RL response keeps it and `[EOS]`.
//! let response = text.completion.clone();
//! let sample = response.split("</answer>").next().unwrap();
//!
//! assert_eq!(outcome_reward(&response, &rl_gold_answer(&row.solution)), 1.0);
//! assert!(exact_match(&extract_tagged_answer(sample), &gold_answer(&row.solution)));
//! let comparison = parse(&row.solution).graph().compare(&parse(sample).graph(), 1e-6);
//! assert!(comparison.is_perfect(), "{comparison:?}");
//!
//! // A wrong final answer fails all three.
//! let wrong = sample.replace(&format!("<answer> {}", gold_answer(&row.solution)), "<answer> 999");
//! assert_eq!(outcome_reward(&wrong, &rl_gold_answer(&row.solution)), 0.0);
//! assert!(!parse(&row.solution).graph().compare(&parse(&wrong).graph(), 1e-6).is_perfect());
//! # Ok(()) }
//! # #[cfg(not(feature = "tasks"))] fn main() {}
//! ```

#[cfg(feature = "tasks")]
pub mod config_import;
pub mod data;
pub mod dist;
pub mod error;
#[cfg(feature = "eval")]
pub mod eval;
pub mod generate;
pub mod io;
pub mod metrics;
pub mod model;
pub mod par;
pub mod plan;
pub mod progress;
#[cfg(feature = "plot")]
pub mod plot;
#[cfg(feature = "eval")]
pub mod release;
pub mod rl;
#[cfg(feature = "tasks")]
pub mod tasks;
pub mod train;
pub mod tokenizer;

pub use error::{Error, Result};
