//! `kiln eval interplay|score|answers|gold`: evaluating checkpoints, and the reference's
//! evaluation scripts on JSONL files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use burn::tensor::backend::AutodiffBackend;
use kiln::backends::{DeviceSpec, ReplicaJob};
use kiln::dist::NodeSpec;
use kiln::eval::{EvalEvent, EvalSettings, ModelEntry, evaluate_on, named_models, release_models};
use kiln::generate::Sampler;
use kiln::model::Dtype;
use kiln::tasks::interplay::answer_metrics::{answer_metrics, read_samples};
use kiln::tasks::interplay::eval::EvalData;
use kiln::io::write_atomic;
use kiln::tasks::interplay::gold::{GOLD_SUFFIX, build_gold_dir, jsonl_files};
use kiln::tasks::interplay::graph_passk::{DEFAULT_PASS_AT, aggregate};
use kiln::io::pyjson::Style;
use kiln::tasks::interplay::scoring::{ScoreOptions, score};

use super::dist::DistArgs;
use super::progress;

#[derive(Debug, Args)]
pub struct EvalArgs {
    #[command(subcommand)]
    command: EvalCommand,
}

#[derive(Debug, Subcommand)]
enum EvalCommand {
    /// Evaluate checkpoints on the Interplay task: sample, score answers and reasoning graphs,
    /// and write the reference's metrics, results and summary files (eval_checkpoints.py).
    Interplay(InterplayArgs),
    /// Strict graph scoring of generations against gold graphs, then graph pass@k
    /// (score_dependency_graphs.py + aggregate_graph_pass_results.py).
    Score(ScoreArgs),
    /// Answer-only metrics: exact match, response length, unbiased pass@k (the
    /// `<checkpoint>_metrics.json` of eval_checkpoints.py).
    Answers(AnswersArgs),
    /// Gold dependency graphs of task rows (build_gold_dependency_graphs.py).
    Gold(GoldArgs),
    /// Evaluate a model on LiveCodeBench problems: sample, run every program on the tests in
    /// the sandbox, write per-sample records and pass@k (overall, per difficulty and platform).
    #[cfg(feature = "code")]
    Code(Box<super::eval_code::CodeEvalArgs>),
}

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("checkpoints").required(true))]
struct InterplayArgs {
    /// Hugging Face model directories to evaluate.
    #[arg(long, num_args = 1.., group = "checkpoints")]
    models: Vec<PathBuf>,
    /// A release root: evaluates pretrain/**, rl/** and opd_refkl/** checkpoints.
    #[arg(long, group = "checkpoints")]
    release: Option<PathBuf>,
    /// Directory of per-op task files (e.g. the test split, op{N}-1k.jsonl).
    #[arg(long)]
    data: PathBuf,
    /// Output directory (default with --release: ROOT/evals).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Samples per prompt (pass@k up to this k).
    #[arg(long, default_value_t = 128)]
    samples: usize,
    #[arg(long, default_value_t = 0.7)]
    temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep only the k most likely tokens (0, or vLLM's -1, disables).
    #[arg(long, default_value_t = 0, value_parser = super::parse_top_k, allow_negative_numbers = true)]
    top_k: usize,
    /// Keep only tokens at least this fraction as likely as the most likely one (0 disables).
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long, default_value_t = 1024)]
    max_new_tokens: usize,
    /// Stop string (repeatable), excluded from the text as vLLM does. `--stop ''` for none.
    #[arg(long, default_value = "</answer>")]
    stop: Vec<String>,
    /// Base sampling seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Ops up to this are in-distribution; a negative value puts every op in ID.
    #[arg(long, default_value_t = 10, allow_negative_numbers = true)]
    id_op_threshold: i64,
    /// Device: cpu, wgpu[:N], cuda[:N] (see --devices for several).
    #[arg(long, default_value = "cpu", value_parser = super::parse_backend)]
    backend: DeviceSpec,
    /// Several devices (`--devices cuda:0,cuda:1`), and several processes with --nnodes,
    /// --node-rank, --master-addr: the shards are dealt out, one engine per device, and node 0
    /// writes files identical to a one-device run's.
    #[command(flatten)]
    dist: DistArgs,
    /// Sequences decoded together (per device).
    #[arg(long, default_value_t = 256)]
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
    /// Prompts per shard (the unit of work kept on disk for resuming).
    #[arg(long, default_value_t = 32)]
    shard_prompts: usize,
    /// Also compute the teacher-forced loss per op (the avg_loss fields).
    #[arg(long)]
    loss: bool,
    /// Keep <model>_{id,ood}_generations.jsonl.
    #[arg(long)]
    keep_generations: bool,
    /// Re-evaluate models that are finished (by default they are skipped).
    #[arg(long)]
    overwrite: bool,
}

#[derive(Debug, Args)]
struct ScoreArgs {
    /// Directory of `*_graphs.jsonl` gold files (from `kiln eval gold`).
    #[arg(long)]
    gold: PathBuf,
    /// A generations JSONL file, or a directory searched for `*generations.jsonl`.
    #[arg(long)]
    generations: PathBuf,
    /// Results directory: `<name>.graph_results.jsonl`, `<name>_score_report.jsonl`, `results.json`.
    #[arg(long)]
    out: PathBuf,
    /// Field holding the generated solution.
    #[arg(long, default_value = "gen_solution_answer")]
    solution_key: String,
    /// Tolerance for value and answer comparisons.
    #[arg(long, default_value_t = 1e-6)]
    tolerance: f64,
    /// Rescore files whose graph results exist and rewrite `results.json` (by default both are
    /// kept, as the reference keeps them).
    #[arg(long)]
    overwrite: bool,
}

#[derive(Debug, Args)]
struct AnswersArgs {
    /// Generations JSONL (fields op, __idx, exact_match, resp_tokens, template).
    #[arg(long)]
    generations: PathBuf,
    /// Output directory for `<checkpoint>_metrics.json`.
    #[arg(long)]
    out: PathBuf,
    /// Checkpoint name (default: the file name without `_generations.jsonl`).
    #[arg(long)]
    checkpoint: Option<String>,
    /// Largest k (`--sample-k` of the run; default: the most samples any prompt has).
    #[arg(long)]
    sample_k: Option<u64>,
    /// Ops up to this are in-distribution, the rest out-of-distribution.
    #[arg(long, default_value_t = 10)]
    id_op_threshold: i64,
    /// Replace an existing `<checkpoint>_metrics.json` (`kiln eval interplay` writes the same
    /// file, and skips the models that have one).
    #[arg(long)]
    overwrite: bool,
}

#[derive(Debug, Args)]
struct GoldArgs {
    /// Directory of task-row JSONL files.
    #[arg(long)]
    rows: PathBuf,
    /// Output directory for `<stem>_graphs.jsonl` (not the rows' own directory).
    #[arg(long)]
    out: PathBuf,
    /// Replace existing `<stem>_graphs.jsonl` files.
    #[arg(long)]
    overwrite: bool,
}

pub fn run(args: EvalArgs) -> Result<()> {
    match args.command {
        EvalCommand::Interplay(args) => interplay(args),
        EvalCommand::Score(args) => score_cmd(args),
        EvalCommand::Answers(args) => answers(args),
        EvalCommand::Gold(args) => gold(args),
        #[cfg(feature = "code")]
        EvalCommand::Code(args) => super::eval_code::run(*args),
    }
}

fn interplay(args: InterplayArgs) -> Result<()> {
    let (models, out) = match (&args.release, &args.out) {
        (Some(root), out) => (release_models(root)?, out.clone().unwrap_or_else(|| root.join("evals"))),
        (None, Some(out)) => (named_models(&args.models)?, out.clone()),
        (None, None) => bail!("--out is required with --models"),
    };
    let threshold = (args.id_op_threshold >= 0).then_some(args.id_op_threshold);
    let data = EvalData::load(&args.data, threshold)?;
    let settings = EvalSettings {
        samples: args.samples,
        sampler: Sampler { temperature: args.temperature, top_k: args.top_k, top_p: args.top_p, min_p: args.min_p },
        max_new_tokens: args.max_new_tokens,
        stop: kiln::generate::StopCriteria::strings_without_empty(&args.stop),
        seed: args.seed,
        id_op_threshold: threshold,
        shard_prompts: args.shard_prompts,
        batch_size: args.batch_size,
        kv_memory: args.kv_memory.map(kiln::generate::gib_bytes),
        max_prefill_tokens: args.max_prefill_tokens,
        loss: args.loss,
        keep_generations: args.keep_generations,
        overwrite: args.overwrite,
        dtype: args.dtype,
        ..EvalSettings::default()
    };
    let devices = args.dist.devices(Some(args.backend), None)?;
    let nodes = args.dist.nodes()?;
    let node = nodes.as_ref().map_or(0, |n| n.node_rank);
    if node == 0 {
        let on = match (devices.len(), &nodes) {
            (1, None) => devices[0].to_string(),
            (d, None) => format!("{d} devices"),
            (d, Some(n)) => format!("{d} devices x {} nodes", n.nnodes),
        };
        eprintln!(
            "{} models, {} ID + {} OOD prompts from {}, {} samples each, on {on} -> {}",
            models.len(),
            data.id.len(),
            data.ood.len(),
            data.dir.display(),
            settings.samples,
            out.display()
        );
    }
    kiln::backends::run_replicas(&devices, EvalJob { models, data, out, settings, nodes })?
}

struct EvalJob {
    models: Vec<ModelEntry>,
    data: EvalData,
    out: PathBuf,
    settings: EvalSettings,
    nodes: Option<NodeSpec>,
}

impl ReplicaJob for EvalJob {
    type Output = Result<()>;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Result<()> {
        let mut bar: Option<progress::Bar> = None;
        let mut started = std::time::Instant::now();
        let nodes = self.nodes.as_ref();
        let outcomes = evaluate_on::<B::InnerBackend>(&self.models, &self.data, &self.out, &self.settings, &devices, nodes, |event| match event {
            EvalEvent::Model { index, count, name } => eprintln!("[{}/{count}] {name}", index + 1),
            EvalEvent::Skipped { name } => eprintln!("  {name}: finished already, skipped (--overwrite re-evaluates)"),
            EvalEvent::Generating { done, total, new_samples, new_tokens, .. } => {
                let bar = bar.get_or_insert_with(|| {
                    started = std::time::Instant::now();
                    if done > 0 {
                        eprintln!("  resuming: {done} of {total} samples are on disk");
                    }
                    progress::counter(total as u64, "samples")
                });
                let seconds = started.elapsed().as_secs_f64().max(1e-9);
                // The rates count this run's samples only (not those resumed from disk); on a
                // terminal the time left from them too (without one, the plain line has it).
                let rate = new_samples as f64 / seconds;
                let left = std::time::Duration::try_from_secs_f64(total.saturating_sub(done) as f64 / rate).ok().filter(|_| bar.on_terminal());
                let eta = left.map(|d| format!(", ETA {}", progress::clock(d))).unwrap_or_default();
                bar.set_message(format!("{rate:.1} samples/s, {:.0} tokens/s{eta}", new_tokens as f64 / seconds));
                bar.set_position(done as u64);
            }
            EvalEvent::Stage { name, stage } => {
                if let Some(bar) = bar.take() {
                    bar.finish_and_clear();
                    let seconds = started.elapsed().as_secs_f64();
                    eprintln!("  generated in {seconds:.1} s: {}", bar.message());
                }
                eprintln!("  {name}: {stage}");
            }
            EvalEvent::Finished { name, summary } => {
                let f = |key: &str| summary.get(key).and_then(|v| v.as_f64()).unwrap_or(0.0);
                eprintln!(
                    "  {name}: ID acc={:.4} resp_len={:.1} | OOD acc={:.4} resp_len={:.1} | total acc={:.4}",
                    f("id_acc"),
                    f("id_avg_resp_len"),
                    f("ood_acc"),
                    f("ood_avg_resp_len"),
                    f("total_acc")
                );
            }
        })?;
        if let Some(spec) = nodes.filter(|n| n.node_rank > 0) {
            eprintln!("node {}: done; node 0 wrote the files", spec.node_rank);
            return Ok(());
        }
        let evaluated = outcomes.iter().filter(|o| !o.skipped).count();
        eprintln!(
            "{evaluated} evaluated, {} skipped; wrote {}",
            outcomes.len() - evaluated,
            self.out.join("summary.csv").display()
        );
        Ok(())
    }
}

fn score_cmd(args: ScoreArgs) -> Result<()> {
    let options = ScoreOptions {
        solution_key: args.solution_key,
        tolerance: args.tolerance,
        overwrite: args.overwrite,
    };
    let summary = score(&args.gold, &args.generations, &args.out, &options)?;
    let n = |key: &str| summary.aggregate.get(key);
    eprintln!(
        "scored {} samples: {} perfect, {} missing solution, {} missing gold ({} files, {} skipped)",
        n("total"),
        n("perfect"),
        n("missing_solution"),
        n("missing_gold"),
        n("files"),
        n("skipped")
    );
    for path in aggregate(&args.out, &DEFAULT_PASS_AT, args.overwrite)? {
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// `<stem>` of `<stem>_generations.jsonl` (also without `_id`/`_ood`).
fn checkpoint_name(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name.strip_suffix(".jsonl").unwrap_or(&name);
    let stem = stem.strip_suffix("_generations").unwrap_or(stem);
    let stem = stem
        .strip_suffix("_id")
        .or_else(|| stem.strip_suffix("_ood"))
        .unwrap_or(stem);
    stem.to_owned()
}

fn answers(args: AnswersArgs) -> Result<()> {
    let checkpoint = args.checkpoint.clone().unwrap_or_else(|| checkpoint_name(&args.generations));
    let path = args.out.join(format!("{checkpoint}_metrics.json"));
    super::refuse_existing(&path, args.overwrite)?;
    let samples = read_samples(&args.generations)?;
    let sample_k = args.sample_k.unwrap_or_else(|| {
        let mut per_prompt: HashMap<(String, i64), u64> = HashMap::new();
        for s in &samples {
            *per_prompt.entry((s.op.clone(), s.idx)).or_default() += 1;
        }
        per_prompt.values().copied().max().unwrap_or(1)
    });
    let metrics = answer_metrics(&checkpoint, &samples, args.id_op_threshold, sample_k);
    write_atomic(&path, &metrics.dumps(Style::INDENT2_UTF8))?;
    eprintln!(
        "wrote {} ({} samples, k up to {sample_k})",
        path.display(),
        samples.len()
    );
    Ok(())
}

fn gold(args: GoldArgs) -> Result<()> {
    // Gold files among the rows would be read as rows (`kiln eval interplay --data`).
    if let (Ok(rows), Ok(out)) = (args.rows.canonicalize(), args.out.canonicalize())
        && rows == out
    {
        bail!("--out {} is the rows directory: write the gold graphs elsewhere", args.out.display());
    }
    for rows in jsonl_files(&args.rows)? {
        let stem = rows.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        super::refuse_existing(&args.out.join(format!("{stem}{GOLD_SUFFIX}")), args.overwrite)?;
    }
    for path in build_gold_dir(&args.rows, &args.out)? {
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
