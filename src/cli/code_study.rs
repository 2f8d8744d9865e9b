//! `kiln eval code compare A B`: the paired per-question comparison of two code evaluations
//! (the code-SFT study's significance check, spec code-sft.md §9).

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Subcommand};
use kiln::io::write_atomic;
use kiln::tasks::code::study::{Bootstrap, compare, read_counts};

#[derive(Debug, Subcommand)]
pub enum CodeEvalCommand {
    /// Compare run B with run A question by question: per-question differences of pass@1,
    /// their mean with a paired standard error and a seeded bootstrap confidence interval.
    Compare(CompareArgs),
}

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Run A (the baseline): a `<model>_code_summary.json`, a `<model>_code_generations.jsonl`
    /// or a `kiln code grade` output.
    a: PathBuf,
    /// Run B (the candidate), in any of these forms; it must cover the same questions.
    b: PathBuf,
    /// Bootstrap resamples of the questions.
    #[arg(long, default_value_t = 10_000)]
    resamples: usize,
    /// Seed of the bootstrap's SplitMix64 index stream.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Two-sided coverage of the interval.
    #[arg(long, default_value_t = 0.95)]
    level: f64,
    /// Write the comparison (with every question's counts and difference) to this JSON file.
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(command: CodeEvalCommand) -> Result<()> {
    let CodeEvalCommand::Compare(args) = command;
    let (a_name, b_name) = (args.a.display().to_string(), args.b.display().to_string());
    let bootstrap = Bootstrap { resamples: args.resamples, seed: args.seed, level: args.level };
    let c = compare(&read_counts(&args.a)?, &read_counts(&args.b)?, bootstrap, &a_name, &b_name)?;
    println!("A {a_name}: {}", c.a);
    println!("B {b_name}: {}", c.b);
    println!("question\tA correct/n\tB correct/n\tB-A");
    for d in c.per_question.iter().filter(|d| d.diff != 0.0) {
        println!("{}\t{}/{}\t{}/{}\t{:+.4}", d.question_id, d.correct_a, d.n_a, d.correct_b, d.n_b, d.diff);
    }
    let stderr = c.paired_stderr.map_or("-".into(), |s| format!("{s:.5}"));
    println!(
        "B - A: pass@1 {:+.6} ({:+} correct samples), paired stderr {stderr}, {:.0}% bootstrap CI [{:+.6}, {:+.6}] ({} resamples, seed {}); B better on {}, A better on {} of {} questions",
        c.mean_diff,
        c.correct_diff,
        100.0 * args.level,
        c.ci_low,
        c.ci_high,
        args.resamples,
        args.seed,
        c.b_better,
        c.a_better,
        c.per_question.len()
    );
    if let Some(out) = &args.out {
        let text = serde_json::to_string_pretty(&serde_json::json!({ "a": a_name, "b": b_name, "comparison": c }))? + "\n";
        write_atomic(out, &text)?;
        eprintln!("wrote {}", out.display());
    }
    Ok(())
}
