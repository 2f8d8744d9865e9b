//! `kiln eval score|answers|gold`: the reference's evaluation scripts on JSONL files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::{Args, Subcommand};
use kiln::tasks::interplay::answer_metrics::{answer_metrics, read_samples};
use kiln::tasks::interplay::files::write_atomic;
use kiln::tasks::interplay::gold::build_gold_dir;
use kiln::tasks::interplay::graph_passk::{DEFAULT_PASS_AT, aggregate};
use kiln::tasks::interplay::pyjson::Style;
use kiln::tasks::interplay::scoring::{ScoreOptions, score};

#[derive(Debug, Args)]
pub struct EvalArgs {
    #[command(subcommand)]
    command: EvalCommand,
}

#[derive(Debug, Subcommand)]
enum EvalCommand {
    /// Strict graph scoring of generations against gold graphs, then graph pass@k
    /// (score_dependency_graphs.py + aggregate_graph_pass_results.py).
    Score(ScoreArgs),
    /// Answer-only metrics: exact match, response length, unbiased pass@k (the
    /// `<checkpoint>_metrics.json` of eval_checkpoints.py).
    Answers(AnswersArgs),
    /// Gold dependency graphs of task rows (build_gold_dependency_graphs.py).
    Gold(GoldArgs),
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
}

#[derive(Debug, Args)]
struct GoldArgs {
    /// Directory of task-row JSONL files.
    #[arg(long)]
    rows: PathBuf,
    /// Output directory for `<stem>_graphs.jsonl`.
    #[arg(long)]
    out: PathBuf,
}

pub fn run(args: EvalArgs) -> Result<()> {
    match args.command {
        EvalCommand::Score(args) => score_cmd(args),
        EvalCommand::Answers(args) => answers(args),
        EvalCommand::Gold(args) => gold(args),
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
    let samples = read_samples(&args.generations)?;
    let sample_k = args.sample_k.unwrap_or_else(|| {
        let mut per_prompt: HashMap<(String, i64), u64> = HashMap::new();
        for s in &samples {
            *per_prompt.entry((s.op.clone(), s.idx)).or_default() += 1;
        }
        per_prompt.values().copied().max().unwrap_or(1)
    });
    let checkpoint = args
        .checkpoint
        .unwrap_or_else(|| checkpoint_name(&args.generations));
    let metrics = answer_metrics(&checkpoint, &samples, args.id_op_threshold, sample_k);
    let path = args.out.join(format!("{checkpoint}_metrics.json"));
    write_atomic(&path, &metrics.dumps(Style::INDENT2_UTF8))?;
    eprintln!(
        "wrote {} ({} samples, k up to {sample_k})",
        path.display(),
        samples.len()
    );
    Ok(())
}

fn gold(args: GoldArgs) -> Result<()> {
    for path in build_gold_dir(&args.rows, &args.out)? {
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
