//! `kiln eval code`: sample a model on LiveCodeBench problems, grade every sample in the
//! sandbox, and write per-sample records and pass@k summaries (resumable).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Result, bail};
use burn::tensor::backend::AutodiffBackend;
use clap::Args;
use kiln::backends::{DeviceSpec, ReplicaJob};
use kiln::dist::NodeSpec;
use kiln::eval::{EvalEvent, EvalSettings, ModelEntry, evaluate_on, named_models};
use kiln::model::Dtype;
use kiln::generate::Sampler;
use kiln::tasks::code::study::RunFigures;
use kiln::tasks::code::task::limits;
use kiln::tasks::code::{CodeEvaluation, CodeProblem, CodeSampling, DEFAULT_KS, DateWindow, PromptTemplate, Release, Selection, load_selected};
use kiln::tokenizer::chat_template::ChatTemplate;
use serde_json::json;

use super::code::SandboxArgs;
use super::dist::DistArgs;
use super::progress;

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct CodeEvalArgs {
    #[command(subcommand)]
    command: Option<super::code_study::CodeEvalCommand>,
    /// Hugging Face model directories to evaluate, one after the other (repeat or list several).
    #[arg(long = "model", alias = "models", num_args = 1.., required_unless_present = "run")]
    models: Vec<PathBuf>,
    /// A training run's output directory whose --checkpoints are evaluated.
    #[arg(long, requires = "checkpoints")]
    run: Option<PathBuf>,
    /// Steps of the --run checkpoints to evaluate, e.g. 60,120,841 (checkpoint-60, step60 or
    /// <run>_step60).
    #[arg(long, value_delimiter = ',', requires = "run")]
    checkpoints: Vec<u64>,
    /// LiveCodeBench problems: one JSONL file, or the directory of release files (with --release).
    #[arg(long, required = true)]
    problems: Option<PathBuf>,
    /// Release: v6 (= test6.jsonl, 175 problems), release_v6 (all 1,055), vA_vB, release_latest.
    #[arg(long)]
    release: Option<String>,
    /// Keep problems whose contest date is on or after this day (YYYY-MM-DD).
    #[arg(long)]
    from: Option<String>,
    /// Keep problems whose contest date is on or before this day (YYYY-MM-DD, midnight).
    #[arg(long)]
    to: Option<String>,
    /// Only the first N selected problems (a quick probe).
    #[arg(long)]
    limit: Option<usize>,
    /// The greedy probe: one greedy sample per problem on the N problems with the smallest
    /// sha256(question_id), graded on their public tests (the code-SFT study's 64-problem public
    /// probe: --probe 64).
    #[arg(long, conflicts_with = "limit")]
    probe: Option<usize>,
    /// Prompt: lcb-qwen (LiveCodeBench's CodeQwen ChatML), lighteval or generic (both through
    /// the model's chat template).
    #[arg(long, default_value = "lcb-qwen")]
    template: String,
    /// Samples per problem.
    #[arg(long, default_value_t = 10)]
    n: usize,
    #[arg(long, default_value_t = 0.2)]
    temperature: f32,
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Keep only the k most likely tokens (0, or vLLM's -1, disables).
    #[arg(long, default_value_t = 0, value_parser = super::parse_top_k, allow_negative_numbers = true)]
    top_k: usize,
    #[arg(long, default_value_t = 2000)]
    max_new_tokens: usize,
    /// Stop string (repeatable; LiveCodeBench: ###). `--stop ''` for none.
    #[arg(long, default_value = "###")]
    stop: Vec<String>,
    /// Base sampling seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Device: cpu, wgpu[:N], cuda[:N].
    #[arg(long, default_value = "cpu", value_parser = super::parse_backend)]
    backend: DeviceSpec,
    /// Sequences decoded together (per device).
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// GiB of KV cache per device: on a paged cache (the CPU in f32, wgpu, CUDA) a sample
    /// joins the batch only while the 64-position blocks it may need fit (`kiln generate
    /// --kv-memory`) [default: half the memory available]
    #[arg(long)]
    kv_memory: Option<f64>,
    /// The most tokens (padding included) one prefill pass takes: the prompts joining the batch
    /// are prefilled in groups within it (vLLM's --max-num-batched-tokens bounds its steps the
    /// same way)
    #[arg(long, default_value_t = kiln::generate::MAX_PREFILL_TOKENS, value_parser = super::positive)]
    max_prefill_tokens: usize,
    /// Weights and activations in f32, bf16 or f16 (attention and log-probs in f32).
    #[arg(long, default_value = "f32")]
    dtype: Dtype,
    /// Several devices (`--devices cuda:0,cuda:1`) and processes: problems sharded over them,
    /// files identical to a one-device run.
    #[command(flatten)]
    dist: DistArgs,
    /// Problems per shard (the unit of work kept on disk for resuming).
    #[arg(long, default_value_t = 8)]
    shard_prompts: usize,
    /// Re-evaluate a finished model (by default it is skipped).
    #[arg(long)]
    overwrite: bool,
    /// Output directory.
    #[arg(long, required = true)]
    out: Option<PathBuf>,
    #[command(flatten)]
    sandbox: SandboxArgs,
}

pub fn run(mut args: CodeEvalArgs) -> Result<()> {
    if let Some(command) = args.command {
        return super::code_study::run(command);
    }
    let (Some(problems_path), Some(out)) = (args.problems.clone(), args.out.clone()) else { bail!("--problems and --out are required") };
    let template: PromptTemplate = args.template.parse()?;
    let release = args.release.as_deref().map(Release::parse).transpose()?;
    let selection = Selection { release, window: DateWindow::parse(args.from.as_deref(), args.to.as_deref())? };
    let mut selected = load_selected(&problems_path, &selection)?;
    selected.truncate(args.limit.unwrap_or(usize::MAX));
    if let Some(count) = args.probe {
        selected = kiln::tasks::code::study::probe_subset(selected, |(p, _)| p.question_id.as_str(), count);
        (args.n, args.temperature, args.top_p, args.top_k) = (1, 0.0, 1.0, 0);
    }
    let mut paths = args.models.clone();
    if let Some(run) = &args.run {
        for &step in &args.checkpoints {
            paths.push(kiln::train::checkpoint::at_step(run, step)?);
        }
    }
    let models = named_models(&paths)?;
    let chat_template = match template {
        PromptTemplate::LcbQwen => None,
        // The models of one evaluation share a prompt: the first one's template renders it.
        _ => Some(ChatTemplate::from_model_dir(&paths[0])?.ok_or_else(|| {
            anyhow::anyhow!("{}: the model has no chat template; --template {template} needs one (use lcb-qwen)", paths[0].display())
        })?),
    };
    let public_only = args.probe.is_some();
    // Tests that cannot grade (none, or call tests that are not JSON; `--probe` keeps the
    // public ones) are the problem's error, named by file and line.
    let problems: Vec<(CodeProblem, kiln::tasks::Source)> = selected
        .iter()
        .map(|(p, s)| {
            let mut problem = CodeProblem::from_lcb(p);
            if public_only {
                problem.tests.truncate(p.public_tests.len());
            }
            problem.check_tests().map_err(|e| s.error(if public_only { format!("--probe (public tests only): {e}") } else { e }))?;
            Ok((problem, s.clone()))
        })
        .collect::<kiln::Result<_>>()?;
    let prompts = problems.iter().map(|(p, _)| p.prompt(template).render(chat_template.as_ref())).collect::<kiln::Result<Vec<_>>>()?;
    let stop = kiln::generate::StopCriteria::strings_without_empty(&args.stop);
    let sampling = CodeSampling {
        n: args.n,
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        max_new_tokens: args.max_new_tokens,
        stop: stop.clone(),
        seed: args.seed,
    };
    let settings_record = json!({
        "problems": problems_path, "release": args.release, "from": args.from, "to": args.to, "limit": args.limit,
        "template": template, "sampling": sampling, "skip_special_tokens": true,
        "probe": args.probe.map(|count| json!({ "problems": count, "rule": "smallest sha256(question_id)", "tests": "public" })),
    });
    let limits = limits(args.sandbox.timeout, true)?;
    let sandbox = args.sandbox.sandbox()?;
    let bar = progress::counter(problems.len().saturating_mul(args.n) as u64, "samples");
    let grading_bar = bar.clone();
    // The sampling rates and ETA stay on the bar while a shard is graded.
    let rates = Arc::new(std::sync::Mutex::new(String::new()));
    let grading_rates = rates.clone();
    let evaluation = CodeEvaluation::new(problems, prompts, sandbox, limits, args.sandbox.extraction, DEFAULT_KS.to_vec(), settings_record)?
        .with_progress(move |done, of| {
            let rates = grading_rates.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let sep = if rates.is_empty() { "" } else { "; " };
            grading_bar.set_message(format!("{rates}{sep}grading {done}/{of}"));
        });
    let settings = EvalSettings {
        samples: args.n,
        sampler: Sampler { temperature: args.temperature, top_k: args.top_k, top_p: args.top_p, min_p: 0.0 },
        max_new_tokens: args.max_new_tokens,
        stop,
        seed: args.seed,
        id_op_threshold: None,
        shard_prompts: args.shard_prompts,
        batch_size: args.batch_size,
        kv_memory: args.kv_memory.map(kiln::generate::gib_bytes),
        max_prefill_tokens: args.max_prefill_tokens,
        loss: false,
        keep_generations: true,
        overwrite: args.overwrite,
        dtype: args.dtype,
        ..EvalSettings::default()
    };
    if settings.samples == 0 {
        bail!("--n must be at least 1");
    }
    eprintln!(
        "{} problems from {}, {} samples each ({} template) -> {}",
        evaluation.problems().len(),
        problems_path.display(),
        args.n,
        template,
        out.display()
    );
    let devices = args.dist.devices(Some(args.backend), None)?;
    let nodes = args.dist.nodes()?;
    kiln::backends::run_replicas(&devices, CodeEvalJob { models, evaluation: Arc::new(evaluation), out, settings, bar, rates, nodes })?
}

struct CodeEvalJob {
    models: Vec<ModelEntry>,
    evaluation: Arc<CodeEvaluation>,
    out: PathBuf,
    settings: EvalSettings,
    bar: progress::Bar,
    /// The bar's last sampling message (rates, ETA), which grading messages keep.
    rates: Arc<std::sync::Mutex<String>>,
    nodes: Option<NodeSpec>,
}

impl ReplicaJob for CodeEvalJob {
    type Output = Result<()>;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Result<()> {
        let bar = self.bar;
        let nodes = self.nodes.as_ref();
        let mut started = std::time::Instant::now();
        let mut resumed = 0;
        evaluate_on::<B::InnerBackend>(&self.models, self.evaluation.as_ref(), &self.out, &self.settings, &devices, nodes, |event| match event {
            EvalEvent::Model { name, .. } => {
                // One bar per model: it starts over.
                (resumed, started) = (0, std::time::Instant::now());
                self.rates.lock().unwrap_or_else(|e| e.into_inner()).clear();
                bar.set_position(0);
                bar.suspend(|| eprintln!("{name}"));
            }
            EvalEvent::Skipped { name } => eprintln!("  {name}: finished already, skipped (--overwrite re-evaluates)"),
            EvalEvent::Generating { done, total, new_samples, new_tokens, .. } => {
                if new_samples == 0 && done > 0 && resumed == 0 {
                    resumed = done;
                    eprintln!("  resuming: {done} of {total} samples are graded on disk");
                }
                if new_samples == 0 {
                    started = std::time::Instant::now();
                }
                bar.set_position(done as u64);
                let seconds = started.elapsed().as_secs_f64().max(1e-9);
                let rate = new_samples as f64 / seconds;
                let eta = if rate > 0.0 { format!(", ETA {:.0} s", (total - done) as f64 / rate) } else { String::new() };
                let message = format!("{rate:.2} samples/s, {:.0} tokens/s{eta}", new_tokens as f64 / seconds);
                *self.rates.lock().unwrap_or_else(|e| e.into_inner()) = message.clone();
                bar.set_message(message);
            }
            EvalEvent::Stage { name, stage } => bar.suspend(|| eprintln!("  {name}: {stage}")),
            EvalEvent::Finished { name, .. } => {
                let path = CodeEvaluation::summary_path(&self.out, name);
                let line = kiln::tasks::code::study::read_counts(&path).map(|counts| RunFigures::of(&counts).to_string());
                bar.suspend(|| eprintln!("  {name}: {}", line.unwrap_or_else(|e| e.to_string())));
            }
        })?;
        bar.finish_and_clear();
        if let Some(spec) = nodes.filter(|n| n.node_rank > 0) {
            eprintln!("node {}: done; node 0 wrote the files", spec.node_rank);
            return Ok(());
        }
        eprintln!("wrote {}", self.out.join("summary.json").display());
        Ok(())
    }
}
