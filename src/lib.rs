//! kiln: an inference-and-training core for small and mid-size reasoning language models (the
//! Qwen2 family) on burn, usable as a library as much as through its `kiln` command line.
//!
//! This facade re-exports the backend-generic library ([`kiln_core`], whose documentation has
//! more examples) and adds backend selection by name ([`backends`]: `cpu`, `wgpu[:N]`,
//! `cuda[:N]`).
//!
//! # Quick start
//!
//! Load a Hugging Face model directory and sample from it on the CPU. (The hidden lines write a
//! directory: the tiny Qwen2 of kiln's minute-scale pipelines, random weights, the paper's
//! tokenizer.)
//!
//! ```
//! # #[cfg(all(feature = "cpu", feature = "tasks"))] fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use kiln::backends::Cpu;
//! use kiln::generate::{Engine, Sampler, SamplingParams};
//! use kiln::model::hf;
//! use kiln::tokenizer::Tokenizer;
//! # let tmp = tempfile::tempdir()?;
//! # let dir = tmp.path().join("model");
//! # kiln::tasks::interplay::tiny_model::write_tiny_model(&tmp.path().join("tiny"))?;
//! # let config = kiln::model::Qwen2Config::from_file(tmp.path().join("tiny/config.json"))?;
//! # let random = kiln::model::Qwen2::<Cpu>::random(&config, 0, &Default::default())?;
//! # hf::save(&random, &dir, hf::SaveDtype::F32, Some(&tmp.path().join("tiny")))?;
//!
//! let model = hf::load::<Cpu>(&dir, &Default::default())?;
//! let tokenizer = Tokenizer::from_file(&dir)?;
//! let prompt = tokenizer.encode("<question> How many adult owl does Pine Ridge have? </question> <solution>")?;
//! let params = SamplingParams { sampler: Sampler::greedy(), max_new_tokens: 8, ..SamplingParams::default() };
//! let samples = Engine::new(&model, Some(&tokenizer)).generate(&[prompt], &params, |_| {})?;
//! println!("{}", samples[0][0].text);
//! # Ok(()) }
//! # #[cfg(not(all(feature = "cpu", feature = "tasks")))] fn main() {}
//! ```
//!
//! To pick the device at run time, implement [`backends::Job`] (or [`backends::TrainJob`] for
//! training, which runs on `Autodiff<B>`) and hand it to [`backends::run`] with a
//! [`backends::DeviceSpec`] parsed from `"cpu"`, `"wgpu:1"` or `"cuda:0"`.
//! `examples/library.rs` is a whole program that uses kiln only as a library (no TOML, no
//! command line): generation, log-probs, a few training steps with its own objective, a
//! checkpoint and its reload.
//!
//! # Where things are
//!
//! | what | where |
//! |---|---|
//! | Qwen2 config, blocks and model | `core/src/model/config.rs`, `core/src/model/qwen2.rs` |
//! | Hugging Face load and save | `core/src/model/hf.rs` |
//! | log-probs of given sequences | `core/src/model/logprobs.rs` |
//! | tokenizer | `core/src/tokenizer.rs` |
//! | generation engine and sampler | `core/src/generate/engine.rs`, `core/src/generate/sampler.rs` |
//! | the training loop and objectives | `core/src/train/trainer.rs`, `core/src/train/objective.rs`, `core/src/rl/objective.rs` |
//! | AdamW and LR schedules | `core/src/train/adamw.rs`, `core/src/train/schedule.rs` |
//! | GRPO loss and advantages | `core/src/rl/loss.rs`, `core/src/rl/advantage.rs` |
//! | pass@k | `core/src/metrics/passk.rs` |
//! | the `Task` trait | `core/src/tasks/mod.rs` |
//! | Interplay generator and scorer | `core/src/tasks/interplay/` (`generator/`, `graph/`, `scoring.rs`, `rewards.rs`) |
//! | run configs and runs | `core/src/train/config/`, `core/src/train/run.rs`, `core/src/rl/run.rs` |
//! | checkpoint evaluation | `core/src/eval/` |
//! | the sandbox for model-written code | `sandbox/` (`kiln-sandbox`) |
//! | backends by name | `backends/src/lib.rs` |
//! | the command line | `src/cli/` |
//!
//! # Features
//!
//! `cpu` (the burn Flex backend), `tasks`, `eval` and `plot` are on by default; `wgpu` and `cuda`
//! add those backends. A program that embeds only the model, generation and training takes
//! `kiln = { version = "0.1", default-features = false, features = ["cpu"] }`; the `kiln`
//! binary and the examples need `tasks`, `eval` and `plot`.

pub use kiln_backends as backends;
pub use kiln_core::*;
