//! Completion-only SFT end to end on the CPU backend, with nothing downloaded:
//!
//! 1. make code-style ChatML rows (a user asks for a small Python function, the assistant
//!    answers with a fenced code block),
//! 2. train a byte-level BPE tokenizer with Qwen's chat tokens on them,
//! 3. initialise a small Qwen2 and fine-tune it with `kiln sft`'s recipe (loss on the assistant
//!    turns only),
//! 4. compare greedy answers on held-out requests before and after.
//!
//! `cargo run --release --example finetune -- [OUT_DIR] [STEPS]` (defaults: a temp dir, 800).
//! Measured on 2 CPU cores: 0/50 held-out answers exact before, 50/50 after 1,000 steps (3 min).

use std::path::PathBuf;

use burn::backend::Autodiff;
use kiln::backends::Cpu;
use kiln::data::chat::{Message, QWEN_DEFAULT_SYSTEM};
use kiln::generate::{Engine, Sampler, SamplingParams};
use kiln::model::hf::{self, SaveDtype};
use kiln::model::{Qwen2, Qwen2Config};
use kiln::tokenizer::Tokenizer;
use kiln::train::RunConfig;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One request and its reference answer.
struct Task {
    request: String,
    answer: String,
}

/// Small Python functions with random names and constants.
fn task(rng: &mut ChaCha8Rng) -> Task {
    let k: u32 = rng.random_range(2..50);
    let names = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"];
    let name = names[rng.random_range(0..names.len())];
    let (request, body) = match rng.random_range(0..5) {
        0 => (format!("Write a Python function `{name}(x)` that returns x plus {k}."), format!("return x + {k}")),
        1 => (format!("Write a Python function `{name}(x)` that returns x times {k}."), format!("return x * {k}")),
        2 => (format!("Write a Python function `{name}(xs)` that returns the items of xs greater than {k}."), format!("return [x for x in xs if x > {k}]")),
        3 => (format!("Write a Python function `{name}(s)` that repeats the string s {k} times."), format!("return s * {k}")),
        _ => (format!("Write a Python function `{name}(x)` that returns x modulo {k}."), format!("return x % {k}")),
    };
    let answer = format!("```python\ndef {name}({}):\n    {body}\n```", body_arg(&request));
    Task { request, answer }
}

/// The argument name used in a request (`x`, `xs` or `s`).
fn body_arg(request: &str) -> &'static str {
    if request.contains("(xs)") {
        "xs"
    } else if request.contains("(s)") {
        "s"
    } else {
        "x"
    }
}

fn chat(task: &Task) -> Vec<Message> {
    vec![
        Message { role: "user".into(), content: task.request.clone() },
        Message { role: "assistant".into(), content: task.answer.clone() },
    ]
}

/// Greedy answers to `tasks`, and how many match the reference exactly.
fn accuracy(model: &Qwen2<Cpu>, tokenizer: &Tokenizer, tasks: &[Task]) -> anyhow::Result<(usize, String)> {
    let prompts = tasks
        .iter()
        .map(|t| {
            let text = format!(
                "<|im_start|>system\n{QWEN_DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
                t.request
            );
            tokenizer.encode(&text)
        })
        .collect::<kiln::Result<Vec<_>>>()?;
    let params = SamplingParams {
        sampler: Sampler::greedy(),
        max_new_tokens: 64,
        ..Default::default()
    };
    let outputs = Engine::new(model, Some(tokenizer)).generate(&prompts, &params, |_| {})?;
    let correct = outputs.iter().zip(tasks).filter(|(o, t)| o[0].text == t.answer).count();
    Ok((correct, outputs[0][0].text.clone()))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let out = args.get(1).map(PathBuf::from).unwrap_or_else(|| std::env::temp_dir().join(format!("kiln-finetune-{}", std::process::id())));
    let steps: u64 = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(800);
    std::fs::create_dir_all(&out)?;

    // 1. Data: 2,000 training rows, 50 held-out requests.
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let train: Vec<Task> = (0..2000).map(|_| task(&mut rng)).collect();
    let heldout: Vec<Task> = (0..50).map(|_| task(&mut rng)).collect();
    let rows: String = train.iter().map(|t| serde_json::json!({ "messages": chat(t) }).to_string() + "\n").collect();
    std::fs::write(out.join("sft.jsonl"), rows)?;

    // 2. Tokenizer with Qwen's chat tokens.
    let corpus = train.iter().map(|t| format!("{QWEN_DEFAULT_SYSTEM}\n{}\n{}", t.request, t.answer)).collect::<Vec<_>>();
    let tokenizer = Tokenizer::train_byte_level_bpe(corpus.into_iter(), 600, &["<|endoftext|>", "<|im_start|>", "<|im_end|>"])?
        .with_special_tokens("<|im_end|>", "<|endoftext|>")?;
    let model_dir = out.join("init");
    std::fs::create_dir_all(&model_dir)?;
    tokenizer.save(&model_dir)?;

    // 3. A small Qwen2 (tied embeddings, GQA), saved as the starting checkpoint.
    let config: Qwen2Config = serde_json::from_value(serde_json::json!({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "vocab_size": tokenizer.vocab_size(), "hidden_size": 128, "intermediate_size": 384,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
        "tie_word_embeddings": true, "max_position_embeddings": 256, "rope_theta": 10000.0,
        "eos_token_id": tokenizer.eos_id(),
    }))?;
    let device = Default::default();
    let initial: Qwen2<Cpu> = Qwen2::random(&config, 0, &device)?;
    let init = model_dir.join("model");
    if !init.exists() {
        hf::save(&initial, &init, SaveDtype::F32, Some(&model_dir))?;
    }
    let (before, _) = accuracy(&initial, &tokenizer, &heldout)?;

    // 4. SFT with the same recipe as `kiln sft --config …`.
    let run_toml = format!(
        r#"
[model]
from = "init/model"

[data]
sft = "sft.jsonl"
max_length = 192

[train]
steps = {steps}
micro_batch = 16
lr = 3e-3
schedule = "cosine_with_min_lr"
min_lr_rate = 0.1
warmup_ratio = 0.05
max_grad_norm = 1.0

[output]
dir = "sft"
save_steps = 0.5
"#
    );
    let config_path = out.join("sft.toml");
    std::fs::write(&config_path, &run_toml)?;
    let run = RunConfig::from_toml(&config_path, &run_toml)?;
    let mut last = None;
    let summary = kiln::train::run::<Autodiff<Cpu>>(
        &run,
        &device,
        true,
        |data| eprintln!("data: {}", data["data"]["sft"]),
        |record| {
            let step = record["step"].as_u64().unwrap_or(0);
            if step % 25 == 0 {
                eprintln!("step {step:>4}  loss {:.4}  {:.0} tok/s", record["loss"].as_f64().unwrap_or(f64::NAN), record["tokens_per_s"].as_f64().unwrap_or(0.0));
            }
            last = record["loss"].as_f64();
        },
    )?;
    let final_dir = summary.checkpoints.last().cloned().unwrap_or_else(|| out.join(format!("sft/checkpoint-{steps}")));
    let tuned = hf::load::<Cpu>(&final_dir, &device)?;
    let (after, example) = accuracy(&tuned, &tokenizer, &heldout)?;
    println!("SFT: {} steps in {:.0}s, final loss {:.4}", summary.steps, summary.elapsed.as_secs_f64(), last.unwrap_or(f64::NAN));
    println!("held-out exact answers: {before}/{} before, {after}/{} after", heldout.len(), heldout.len());
    println!("request: {}\nanswer:\n{example}", heldout[0].request);
    println!("model: {} (loadable by transformers)", final_dir.display());
    Ok(())
}
