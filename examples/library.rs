//! kiln as a library, nothing else: no TOML, no command line, only the model, tokenizer,
//! generation and training APIs (it builds with `default-features = false, features = ["cpu"]`,
//! which `tests/embed.rs` checks from a crate outside the workspace).
//!
//! ```text
//! cargo run --release --example library [-- OUT_DIR]
//! ```
//!
//! 1. trains a byte-level BPE tokenizer on sums written out (`17 + 5 = 22.`),
//! 2. writes a randomly initialised small Qwen2 as a Hugging Face directory and loads it back,
//! 3. computes log-probs and samples from it,
//! 4. trains it for a few dozen steps with its own objective (loss on the answers only),
//!    checkpointing like `transformers`' Trainer, and
//! 5. reloads the final checkpoint and shows the answer log-probs it learnt.

use std::path::PathBuf;

use burn::backend::Autodiff;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use kiln::backends::Cpu;
use kiln::data::{Sample, TrainBatch, collate};
use kiln::generate::{Engine, Sampler, SamplingParams};
use kiln::model::hf::{self, SaveDtype};
use kiln::model::logprobs::{sequence_logprobs, token_logprobs};
use kiln::model::{Qwen2, Qwen2Config};
use kiln::tokenizer::Tokenizer;
use kiln::train::{AdamWConfig, Decay, LoopConfig, Objective, SavePolicy, Schedule, Start, train};
use rand::{Rng, SeedableRng};
use serde_json::{Map, Value, json};

/// Loss on the answer tokens only (after `=`), averaged over them: SFT in miniature.
struct AnswerLoss {
    samples: Vec<Sample>,
    batch: usize,
    cursor: usize,
    pad_id: u32,
}

impl<B: AutodiffBackend> Objective<B> for AnswerLoss {
    type Micro = TrainBatch<B>;

    fn updates(&mut self, model: &Qwen2<B>, _step: u64) -> kiln::Result<Vec<Vec<TrainBatch<B>>>> {
        let batch: Vec<Sample> = (0..self.batch).map(|i| self.samples[(self.cursor + i) % self.samples.len()].clone()).collect();
        self.cursor += self.batch;
        Ok(vec![vec![collate(&batch, self.pad_id, &model.device())?]])
    }

    fn loss(&mut self, model: &Qwen2<B>, batch: &TrainBatch<B>) -> kiln::Result<(Tensor<B, 1>, Map<String, Value>)> {
        let logprobs = token_logprobs(model.forward(&batch.inputs), batch.labels.clone());
        let loss = -(logprobs * batch.label_mask.clone().float()).sum() / batch.num_targets.max(1) as f64;
        let mut metrics = Map::new();
        metrics.insert("tokens".into(), json!(batch.num_tokens));
        Ok((loss, metrics))
    }

    fn state(&self) -> Value {
        json!({ "cursor": self.cursor })
    }

    fn restore(&mut self, state: &Value) -> kiln::Result<()> {
        self.cursor = state["cursor"].as_u64().unwrap_or(0) as usize;
        Ok(())
    }
}

fn sums(count: usize, seed: u64) -> Vec<String> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..count)
        .map(|_| {
            let (a, b) = (rng.random_range(0..50), rng.random_range(0..50));
            format!("{a} + {b} = {}.", a + b)
        })
        .collect()
}

/// A sum as a sample whose targets are the tokens after ` =`.
fn answer_sample(tokenizer: &Tokenizer, text: &str) -> kiln::Result<Sample> {
    let (question, _) = text.split_once('=').expect("a sum");
    let prompt_len = tokenizer.encode(&format!("{question}="))?.len();
    let ids = tokenizer.encode(text)?;
    let targets = (0..ids.len()).map(|i| i >= prompt_len).collect();
    Ok(Sample { ids, targets })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::args().nth(1).map(PathBuf::from).unwrap_or_else(|| std::env::temp_dir().join("kiln-library-example"));
    if out.exists() {
        std::fs::remove_dir_all(&out)?;
    }
    std::fs::create_dir_all(&out)?;

    // 1. Tokenizer.
    let corpus = sums(2000, 1);
    let tokenizer = Tokenizer::train_byte_level_bpe(corpus.iter().cloned(), 300, &["<|endoftext|>"])?
        .with_special_tokens("<|endoftext|>", "<|endoftext|>")?;
    let tokenizer_dir = out.join("tokenizer");
    std::fs::create_dir_all(&tokenizer_dir)?;
    tokenizer.save(&tokenizer_dir)?;

    // 2. A small Qwen2 (tied embeddings, GQA 4:2), saved and loaded as an HF directory.
    let config: Qwen2Config = serde_json::from_value(json!({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "vocab_size": tokenizer.vocab_size(), "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "tie_word_embeddings": true, "max_position_embeddings": 64, "rope_theta": 10000.0,
        "eos_token_id": tokenizer.eos_id(),
    }))?;
    let device = Default::default();
    let initial: Qwen2<Cpu> = Qwen2::random(&config, 0, &device)?;
    let init_dir = out.join("init");
    hf::save(&initial, &init_dir, SaveDtype::F32, Some(&tokenizer_dir))?;
    let model = hf::load::<Cpu>(&init_dir, &device)?;
    println!("model: {} parameters in {}", config.num_parameters(), init_dir.display());

    // 3. Log-probs and sampling.
    let probe = "17 + 5 = 22.";
    let answer_logprob = |model: &Qwen2<Cpu>| -> kiln::Result<f32> {
        let sample = answer_sample(&tokenizer, probe)?;
        let logprobs = sequence_logprobs(model, std::slice::from_ref(&sample.ids), 64)?.remove(0);
        Ok(logprobs.iter().zip(&sample.targets).filter(|(_, t)| **t).filter_map(|(lp, _)| *lp).sum())
    };
    println!("log p(answer of {probe:?}) before training: {:.3}", answer_logprob(&model)?);
    let prompt = tokenizer.encode("17 + 5 =")?;
    let params = SamplingParams { n: 2, sampler: Sampler { temperature: 1.0, top_k: 20, ..Sampler::default() }, max_new_tokens: 6, seed: 3, ..SamplingParams::default() };
    for sample in &Engine::new(&model, Some(&tokenizer)).generate(std::slice::from_ref(&prompt), &params, |_| {})?[0] {
        println!("sample before training: {:?}", sample.text);
    }

    // 4. Training with our own objective, straight through the loop.
    let samples = corpus.iter().map(|t| answer_sample(&tokenizer, t)).collect::<kiln::Result<Vec<_>>>()?;
    let steps = 60;
    let loop_config = LoopConfig {
        schedule: Schedule { warmup_steps: 5, total_steps: steps, decay: Decay::Cosine },
        optimizer: AdamWConfig { weight_decay: 0.01, ..AdamWConfig::with_lr(3e-3) },
        save: SavePolicy { every: Some(0.5), ..SavePolicy::default() },
        companions: Some(tokenizer_dir.clone()),
        run_config: json!({ "example": "library" }),
        ..LoopConfig::new(out.join("run"), steps, 3e-3)
    };
    let pad_id = tokenizer.pad_id().unwrap_or(0);
    let mut objective = AnswerLoss { samples, batch: 16, cursor: 0, pad_id };
    let start = Start::<Autodiff<Cpu>>::new(&loop_config, false, &mut objective, &device, || hf::load(&init_dir, &device))?;
    let mut losses = Vec::new();
    let (_, summary) = train(start, &mut objective, &loop_config, |_| Ok(Map::new()), |record| {
        losses.extend(record["loss"].as_f64());
    })?;
    let (first, last) = (losses[..5].iter().sum::<f64>() / 5.0, losses[losses.len() - 5..].iter().sum::<f64>() / 5.0);
    println!("trained: {summary}");
    println!("answer loss: {first:.3} (first 5 steps) -> {last:.3} (last 5)");

    // 5. The final checkpoint is an HF directory (with optimizer state to resume from).
    let final_dir = summary.checkpoints.last().expect("a checkpoint after the last step");
    let tuned = hf::load::<Cpu>(final_dir, &device)?;
    println!("log p(answer of {probe:?}) after training: {:.3}", answer_logprob(&tuned)?);
    let greedy = SamplingParams { sampler: Sampler::greedy(), max_new_tokens: 6, ..SamplingParams::default() };
    println!("greedy after training: {:?}", Engine::new(&tuned, Some(&tokenizer)).generate(&[prompt], &greedy, |_| {})?[0][0].text);
    if last >= first {
        return Err(format!("the answer loss did not fall: {first:.3} -> {last:.3}").into());
    }
    println!("ok");
    Ok(())
}
