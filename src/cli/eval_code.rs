//! `kiln eval code`: sample a model on LiveCodeBench problems, grade every sample in the
//! sandbox, and write per-sample records and pass@k summaries (resumable).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Result, bail};
use burn::tensor::backend::Backend;
use clap::Args;
use kiln::backends::{DeviceSpec, Job};
use kiln::eval::{EvalEvent, EvalSettings, ModelEntry, evaluate, named_models};
use kiln::generate::Sampler;
use kiln::tasks::code::task::limits;
use kiln::tasks::code::{CodeEvaluation, CodeProblem, CodeSampling, DEFAULT_KS, DateWindow, PromptTemplate, Release, Selection, load_selected};
use kiln::tokenizer::chat_template::ChatTemplate;
use serde_json::json;

use super::code::SandboxArgs;
use super::progress;

#[derive(Debug, Args)]
pub struct CodeEvalArgs {
    /// The Hugging Face model directory to evaluate.
    #[arg(long)]
    model: PathBuf,
    /// LiveCodeBench problems: one JSONL file, or the directory of release files (with --release).
    #[arg(long)]
    problems: PathBuf,
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
    /// Keep only the k most likely tokens (0 disables).
    #[arg(long, default_value_t = 0)]
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
    /// Sequences decoded together.
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// Problems per shard (the unit of work kept on disk for resuming).
    #[arg(long, default_value_t = 8)]
    shard_prompts: usize,
    /// Re-evaluate a finished model (by default it is skipped).
    #[arg(long)]
    overwrite: bool,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    sandbox: SandboxArgs,
}

pub fn run(args: CodeEvalArgs) -> Result<()> {
    let template: PromptTemplate = args.template.parse()?;
    let release = args.release.as_deref().map(Release::parse).transpose()?;
    let selection = Selection { release, window: DateWindow::parse(args.from.as_deref(), args.to.as_deref())? };
    let mut selected = load_selected(&args.problems, &selection)?;
    selected.truncate(args.limit.unwrap_or(usize::MAX));
    let models = named_models(std::slice::from_ref(&args.model))?;
    let chat_template = match template {
        PromptTemplate::LcbQwen => None,
        _ => Some(ChatTemplate::from_model_dir(&args.model)?.ok_or_else(|| {
            anyhow::anyhow!("{}: the model has no chat template; --template {template} needs one (use lcb-qwen)", args.model.display())
        })?),
    };
    let problems: Vec<(CodeProblem, kiln::tasks::Source)> = selected.iter().map(|(p, s)| (CodeProblem::from_lcb(p), s.clone())).collect();
    let prompts = problems.iter().map(|(p, _)| p.prompt(template).render(chat_template.as_ref())).collect::<kiln::Result<Vec<_>>>()?;
    let stop: Vec<String> = args.stop.iter().filter(|s| !s.is_empty()).cloned().collect();
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
        "problems": args.problems, "release": args.release, "from": args.from, "to": args.to, "limit": args.limit,
        "template": template, "sampling": sampling,
    });
    let limits = limits(args.sandbox.timeout, true)?;
    let sandbox = args.sandbox.sandbox()?;
    let bar = progress::counter((problems.len() * args.n) as u64, "samples");
    let grading_bar = bar.clone();
    let evaluation = CodeEvaluation::new(problems, prompts, sandbox, limits, args.sandbox.extraction, DEFAULT_KS.to_vec(), settings_record)?
        .with_progress(move |done, of| grading_bar.set_message(format!("grading {done}/{of}")));
    let settings = EvalSettings {
        samples: args.n,
        sampler: Sampler { temperature: args.temperature, top_k: args.top_k, top_p: args.top_p },
        max_new_tokens: args.max_new_tokens,
        stop,
        seed: args.seed,
        id_op_threshold: None,
        shard_prompts: args.shard_prompts,
        batch_size: args.batch_size,
        loss: false,
        keep_generations: true,
        overwrite: args.overwrite,
        ..EvalSettings::default()
    };
    if settings.samples == 0 {
        bail!("--n must be at least 1");
    }
    eprintln!(
        "{} problems from {}, {} samples each ({} template) -> {}",
        evaluation.problems().len(),
        args.problems.display(),
        args.n,
        template,
        args.out.display()
    );
    kiln::backends::run(args.backend, CodeEvalJob { models, evaluation: Arc::new(evaluation), out: args.out, settings, bar })?
}

struct CodeEvalJob {
    models: Vec<ModelEntry>,
    evaluation: Arc<CodeEvaluation>,
    out: PathBuf,
    settings: EvalSettings,
    bar: indicatif::ProgressBar,
}

impl Job for CodeEvalJob {
    type Output = Result<()>;

    fn run<B: Backend>(self, device: B::Device) -> Result<()> {
        let bar = self.bar;
        let mut started = std::time::Instant::now();
        let mut resumed = 0;
        evaluate::<B>(&self.models, self.evaluation.as_ref(), &self.out, &self.settings, &device, |event| match event {
            EvalEvent::Model { name, .. } => eprintln!("{name}"),
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
                bar.set_message(format!("{rate:.2} samples/s, {:.0} tokens/s{eta}", new_tokens as f64 / seconds));
            }
            EvalEvent::Stage { name, stage } => {
                bar.finish_and_clear();
                eprintln!("  {name}: {stage}");
            }
            EvalEvent::Finished { name, summary } => {
                let f = |key: &str| summary.get(key).and_then(|v| v.as_f64());
                let overall = |key: &str| summary.get("overall").and_then(|o| o.get(key)).and_then(|v| v.as_f64()).unwrap_or(0.0);
                let pass = |k: &str| f(k).map_or("-".to_owned(), |v| format!("{v:.4}"));
                eprintln!(
                    "  {name}: pass@1 {} pass@5 {} ({} of {} samples accepted, {} without code)",
                    pass("pass@1"),
                    pass("pass@5"),
                    overall("correct"),
                    overall("samples"),
                    overall("no_code")
                );
            }
        })?;
        eprintln!("wrote {}", CodeEvaluation::summary_path(&self.out, &self.models[0].name).display());
        Ok(())
    }
}
