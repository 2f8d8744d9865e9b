//! Subcommands of the `kiln` binary, one module each.

mod bench;
mod bench_all_reduce;
mod bench_matmul;
#[cfg(feature = "code")]
mod code;
#[cfg(feature = "code")]
mod code_study;
mod config;
mod data;
#[cfg(feature = "code")]
mod decontaminate;
mod dist;
mod eval;
#[cfg(feature = "code")]
mod eval_code;
mod generate;
mod init;
mod logprobs;
mod plan;
mod plot;
mod plot_train;
pub(crate) mod progress;
mod quickstart;
mod release;
mod rl;
mod step;
mod train;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// kiln: Qwen2-family inference and training on burn.
#[derive(Debug, Parser)]
#[command(name = "kiln", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The tiny end-to-end pipeline on the CPU: generate data, pre-train, evaluate.
    Quickstart(quickstart::QuickstartArgs),
    /// Sample completions from a model (batched, KV-cached).
    Generate(generate::GenerateArgs),
    /// Per-position next-token log-probs of given sequences (teacher scoring).
    Logprobs(logprobs::LogprobsArgs),
    /// Write a randomly initialised Hugging Face model directory from a config.json.
    Init(init::InitArgs),
    /// One AdamW step on given token sequences: the loss, the gradient norm and the model after
    /// it (parity checks against another trainer).
    Step(step::StepArgs),
    /// Measure prefill and decode throughput.
    Bench(bench::BenchArgs),
    /// Memory by part and FLOPs of a training step and of generation, from a config.json.
    Plan(plan::PlanArgs),
    /// Pre-train on an Interplay mixture (packed next-token loss) from a TOML config.
    Pretrain(train::TrainArgs),
    /// Supervised fine-tuning (completion-only loss on chat-templated rows) from a TOML config.
    Sft(train::TrainArgs),
    /// GRPO with verifiable rewards (verl's clipped surrogate, KL to the initial policy) from a TOML config.
    Rl(rl::RlArgs),
    /// On-policy distillation from a teacher (per-token reverse KL, KL to the initial student) from a TOML config.
    Opd(rl::RlArgs),
    /// Run configs: the effective TOML of one (`show`), or one imported from verl or TRL (`import`).
    Config(config::ConfigArgs),
    /// Generate task data.
    Data(data::DataArgs),
    /// Evaluate checkpoints (Interplay, code); score generations: answers, strict graphs, gold graphs.
    Eval(eval::EvalArgs),
    /// Charts (SVG) of evaluation results.
    Plot(plot::PlotArgs),
    /// The Interplay release as one recipe: pre-training, RL, OPD and evaluation of its batches.
    Release(release::ReleaseArgs),
    /// Code problems: grade completions by running them in the sandbox.
    #[cfg(feature = "code")]
    Code(code::CodeArgs),
}

impl Cli {
    pub fn run(self) -> Result<()> {
        match self.command {
            Command::Quickstart(args) => quickstart::run(args),
            Command::Generate(args) => generate::run(args),
            Command::Logprobs(args) => logprobs::run(args),
            Command::Init(args) => init::run(args),
            Command::Step(args) => step::run(args),
            Command::Bench(args) => bench::run(args),
            Command::Plan(args) => plan::run(args),
            Command::Pretrain(args) => train::run(train::Kind::Pretrain, args),
            Command::Sft(args) => train::run(train::Kind::Sft, args),
            Command::Rl(args) => rl::run(kiln::rl::Method::Grpo, args),
            Command::Opd(args) => rl::run(kiln::rl::Method::Opd, args),
            Command::Config(args) => config::run(args),
            Command::Data(args) => data::run(args),
            Command::Eval(args) => eval::run(args),
            Command::Plot(args) => plot::run(args),
            Command::Release(args) => release::run(args),
            #[cfg(feature = "code")]
            Command::Code(args) => code::run(args),
        }
    }
}

/// Refuses an existing output file unless `--overwrite` was passed.
pub(crate) fn refuse_existing(out: &std::path::Path, overwrite: bool) -> Result<()> {
    if out.exists() && !overwrite {
        anyhow::bail!("{} exists; pass --overwrite to replace it, or another --out", out.display());
    }
    Ok(())
}

/// Refuses an `--out` that is one of the command's `inputs` (or a file inside an input
/// directory): the report would replace what the command reads.
#[cfg(feature = "code")]
pub(crate) fn refuse_input_as_out(out: &std::path::Path, inputs: &[&std::path::Path]) -> Result<()> {
    // (A file not written yet: its directory, made absolute, and its name.)
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let written = match (out.canonicalize(), parent.canonicalize(), out.file_name()) {
        (Ok(path), _, _) => path,
        (Err(_), Ok(dir), Some(name)) => dir.join(name),
        _ => return Ok(()),
    };
    for input in inputs {
        let Ok(read) = input.canonicalize() else { continue };
        if written == read || (read.is_dir() && written.parent() == Some(read.as_path())) {
            anyhow::bail!("--out {} would replace the input {}: write the report elsewhere", out.display(), input.display());
        }
    }
    Ok(())
}

/// A count of at least 1.
pub(crate) fn positive(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("expected a whole number of at least 1, got {text:?}")),
    }
}

/// Parses `1,2,3` into token ids.
fn parse_ids(text: &str) -> Result<Vec<u32>> {
    text.split(',')
        .map(|s| s.trim().parse::<u32>().map_err(|_| anyhow::anyhow!("not a token id list: {text:?} (expected e.g. 1,2,3)")))
        .collect()
}

/// Runs `job` on a thread of rayon's pool when it trains on the CPU alone ([`kiln::par::on_pool`]:
/// the CPU kernels' parallel loops then wake only the pool's other threads, not also a thread
/// waiting outside the pool), else on this thread (GPU backends keep per-thread state; CPU
/// replicas have threads of their own). Training steps, alternating `kiln bench --train` runs on
/// an AMD EPYC (2 cores): the quickstart's model at 8 × 512 tokens 16,130–16,450 → 16,830–16,970
/// tokens/s (five pairs), the 100M config at 8 × 256 306 → 310–313 (two pairs).
fn on_cpu_pool<R: Send>(devices: &[kiln::backends::DeviceSpec], job: impl FnOnce() -> R + Send) -> R {
    if devices == [kiln::backends::DeviceSpec::Cpu] {
        kiln::par::on_pool(|_| job(), |_: ()| {})
    } else {
        job()
    }
}

/// Parses a device name for `--backend`.
fn parse_backend(text: &str) -> Result<kiln::backends::DeviceSpec> {
    Ok(text.parse()?)
}

/// `--top-k`: a count, 0 or vLLM's -1 for off.
pub(crate) fn parse_top_k(text: &str) -> std::result::Result<usize, String> {
    match text.trim() {
        "-1" => Ok(0),
        t => t.parse().map_err(|_| format!("{text:?} is not a count of tokens (0 or -1: off)")),
    }
}
