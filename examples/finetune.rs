//! Code SFT end to end on the CPU backend, with nothing downloaded, graded by running the code:
//!
//! 1. make small coding problems with tests — call-based ("write `alpha(x)` returning x plus
//!    7", called with JSON arguments) and stdin ("read n, print n times 7") — and ChatML rows
//!    whose assistant turn is a fenced solution,
//! 2. train a byte-level BPE tokenizer with Qwen's chat tokens on them,
//! 3. initialise a small Qwen2 and fine-tune it with `kiln sft`'s recipe (loss on the assistant
//!    turns only),
//! 4. before and after, sample a greedy answer to each held-out problem, extract its program
//!    (LiveCodeBench's rule) and RUN it on the problem's tests in kiln's sandbox (the code task,
//!    [`CodeTask`], that `[task] kind = "code"` uses in RL): pass@1 before and after.
//!
//! `cargo run --release --example finetune -- [OUT_DIR] [STEPS]` (defaults: a temp dir, 800).
//! Measured on 2 CPU cores shared with other builds (load 5-9): held-out pass@1 0/50 before,
//! 50/50 after 800 steps (280 s of SFT; sampling and grading the 50 answers: 6 s).

use std::path::PathBuf;

use burn::backend::Autodiff;
use kiln::backends::Cpu;
use kiln::data::chat::{Message, QWEN_DEFAULT_SYSTEM};
use kiln::generate::{Engine, Sampler, SamplingParams};
use kiln::model::hf::{self, SaveDtype};
use kiln::model::{Qwen2, Qwen2Config};
use kiln::tasks::code::sandbox::TestCase;
use kiln::tasks::code::{CodeProblem, CodeTask, CodeTaskConfig};
use kiln::tasks::{Item, Task};
use kiln::tokenizer::Tokenizer;
use kiln::train::RunConfig;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One problem: the request, a reference answer (a fenced program) and the tests.
struct Problem {
    request: String,
    answer: String,
    tests: Vec<TestCase>,
}

/// A small problem with a random name, constant and tests: a function (called with JSON
/// arguments, LiveCodeBench's call-based mode) or a program reading stdin.
fn problem(rng: &mut ChaCha8Rng) -> Problem {
    let k: i64 = rng.random_range(2..50);
    let names = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"];
    let name = names[rng.random_range(0..names.len())];
    let call = |input: String, output: String| TestCase::Call { fn_name: name.into(), input, output };
    let stdin = |input: i64, output: i64| TestCase::Stdin { input: format!("{input}\n"), output: format!("{output}\n") };
    let values = [3i64, 17, 120];
    let function = |arg: &str, body: String| format!("```python\ndef {name}({arg}):\n    {body}\n```");
    let (request, answer, tests) = match rng.random_range(0..6) {
        0 => (
            format!("Write a Python function `{name}(x)` that returns x plus {k}."),
            function("x", format!("return x + {k}")),
            values.iter().map(|v| call(v.to_string(), (v + k).to_string())).collect(),
        ),
        1 => (
            format!("Write a Python function `{name}(x)` that returns x times {k}."),
            function("x", format!("return x * {k}")),
            values.iter().map(|v| call(v.to_string(), (v * k).to_string())).collect(),
        ),
        2 => (
            format!("Write a Python function `{name}(xs)` that returns the items of xs greater than {k}."),
            function("xs", format!("return [x for x in xs if x > {k}]")),
            vec![call("[1, 60, 3, 49, 50]".into(), format!("{:?}", [1, 60, 3, 49, 50].iter().filter(|&&x| x > k).collect::<Vec<_>>()))],
        ),
        3 => (
            format!("Write a Python function `{name}(s)` that repeats the string s {k} times."),
            function("s", format!("return s * {k}")),
            vec![call("\"ab\"".into(), format!("\"{}\"", "ab".repeat(k as usize)))],
        ),
        4 => (
            format!("Write a Python program that reads an integer n from stdin and prints n plus {k}."),
            format!("```python\nn = int(input())\nprint(n + {k})\n```"),
            values.iter().map(|&v| stdin(v, v + k)).collect(),
        ),
        _ => (
            format!("Write a Python program that reads an integer n from stdin and prints n modulo {k}."),
            format!("```python\nn = int(input())\nprint(n % {k})\n```"),
            values.iter().map(|&v| stdin(v, v % k)).collect(),
        ),
    };
    Problem { request, answer, tests }
}

fn chat(problem: &Problem) -> Vec<Message> {
    vec![
        Message { role: "user".into(), content: problem.request.clone() },
        Message { role: "assistant".into(), content: problem.answer.clone() },
    ]
}

/// The prompt the model continues: ChatML with Qwen's default system prompt, as SFT renders it.
fn prompt(problem: &Problem) -> String {
    format!("<|im_start|>system\n{QWEN_DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n", problem.request)
}

/// Greedy answers to `items`, graded by running their programs on the tests in the sandbox:
/// how many pass, and the first answer.
fn pass_count(model: &Qwen2<Cpu>, tokenizer: &Tokenizer, task: &CodeTask, items: &[Item]) -> anyhow::Result<(usize, String)> {
    let prompts = items.iter().map(|item| tokenizer.encode(&item.prompt)).collect::<kiln::Result<Vec<_>>>()?;
    let params = SamplingParams { sampler: Sampler::greedy(), max_new_tokens: 64, ..Default::default() };
    let outputs = Engine::new(model, Some(tokenizer)).generate(&prompts, &params, |_| {})?;
    let batch: Vec<(&str, &Item)> = outputs.iter().zip(items).map(|(o, item)| (o[0].text.as_str(), item)).collect();
    let verdicts = task.evaluate_batch(&batch)?;
    Ok((verdicts.iter().filter(|v| **v == 1.0).count(), outputs[0][0].text.clone()))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let out = args.get(1).map(PathBuf::from).unwrap_or_else(|| std::env::temp_dir().join(format!("kiln-finetune-{}", std::process::id())));
    let steps: u64 = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(800);
    std::fs::create_dir_all(&out)?;

    // 1. Data: 2,000 training rows, 50 held-out problems (items of the code task: prompt and tests).
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let train: Vec<Problem> = (0..2000).map(|_| problem(&mut rng)).collect();
    let heldout: Vec<Problem> = (0..50).map(|_| problem(&mut rng)).collect();
    let items: Vec<Item> = heldout
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let problem = CodeProblem { id: format!("heldout-{i}"), question: p.request.clone(), starter_code: String::new(), tests: p.tests.clone(), difficulty: None, platform: None };
            problem.item(prompt(p), Default::default())
        })
        .collect();
    // The sandbox is probed once; its layers belong next to the results.
    let task = CodeTask::new(CodeTaskConfig::default())?;
    eprintln!("{}", task.sandbox().protections().summary());
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
    let (before, _) = pass_count(&initial, &tokenizer, &task, &items)?;

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
    let started = std::time::Instant::now();
    let (after, example) = pass_count(&tuned, &tokenizer, &task, &items)?;
    let graded_in = started.elapsed().as_secs_f64();
    println!("SFT: {} steps in {:.0}s, final loss {:.4}", summary.steps, summary.elapsed.as_secs_f64(), last.unwrap_or(f64::NAN));
    println!("held-out pass@1 (programs run on their tests in the sandbox): {before}/{n} before, {after}/{n} after ({graded_in:.1} s to sample and grade)", n = heldout.len());
    println!("request: {}\nanswer:\n{example}", heldout[0].request);
    println!("model: {} (loadable by transformers)", final_dir.display());
    Ok(())
}
