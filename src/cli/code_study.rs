//! `kiln eval code compare A B`: the paired per-question comparison of two code evaluations
//! (the code-SFT study's significance check, spec code-sft.md §9), and, where both files record
//! every sample's verdict (kiln's generations or `kiln code grade` output, LiveCodeBench's
//! `*_eval_all.json`), the samples whose verdicts differ: kiln's grading of a run against
//! LiveCodeBench's grading of the same programs.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use kiln::io::write_atomic;
use kiln::tasks::code::lcb_files::{compare_samples, is_eval_all_file, read_sample_verdicts};
use kiln::tasks::code::study::{Bootstrap, compare, read_counts};

#[derive(Debug, Subcommand)]
pub enum CodeEvalCommand {
    /// Compare run B with run A question by question: per-question differences of pass@1,
    /// their mean with a paired standard error and a seeded bootstrap confidence interval; with
    /// per-sample files on both sides (e.g. kiln's generations and LiveCodeBench's
    /// `*_eval_all.json` of the same run), the samples whose verdicts differ.
    Compare(CompareArgs),
}

/// More bootstrap resamples than this are refused (each is a mean over the questions, all kept
/// for the percentiles; LiveCodeBench-style comparisons use 10,000).
const MAX_RESAMPLES: usize = 100_000_000;

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Run A (the baseline): a `<model>_code_summary.json`, a `<model>_code_generations.jsonl`,
    /// a `kiln code grade` output or LiveCodeBench's `*_eval_all.json`.
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
    /// Replace `--out` if it exists.
    #[arg(long)]
    overwrite: bool,
    /// Also compare sample by sample (on by default when A or B is LiveCodeBench's
    /// `*_eval_all.json`, skipped with a note where the two are not the same samples): the
    /// samples whose verdicts or extracted codes differ. Both files must record every sample
    /// (not a summary) of the same programs.
    #[arg(long)]
    samples: bool,
}

pub fn run(command: CodeEvalCommand) -> Result<()> {
    let CodeEvalCommand::Compare(args) = command;
    if args.resamples > MAX_RESAMPLES {
        bail!("--resamples must be at most {MAX_RESAMPLES} (got {})", args.resamples);
    }
    if let Some(out) = &args.out {
        super::refuse_input_as_out(out, &[&args.a, &args.b])?;
        super::refuse_existing(out, args.overwrite)?;
    }
    let (a_name, b_name) = (args.a.display().to_string(), args.b.display().to_string());
    let bootstrap = Bootstrap { resamples: args.resamples, seed: args.seed, level: args.level };
    let c = compare(&read_counts(&args.a)?, &read_counts(&args.b)?, bootstrap, &a_name, &b_name)?;
    let samples = if args.samples || is_eval_all_file(&args.a)? || is_eval_all_file(&args.b)? {
        match (read_sample_verdicts(&args.a)?, read_sample_verdicts(&args.b)?) {
            (Some(a), Some(b)) if args.samples => Some(compare_samples(&a, &b, &a_name, &b_name)?),
            // Chosen for the file kind, not asked for: two runs with other samples (another
            // model, other sample counts) still compare question by question.
            (Some(a), Some(b)) => match compare_samples(&a, &b, &a_name, &b_name) {
                Ok(s) => Some(s),
                Err(e) => {
                    eprintln!("note: samples not compared ({e}); --samples makes this an error");
                    None
                }
            },
            _ if args.samples => bail!("--samples needs every sample's verdict on both sides (generations, kiln code grade output or *_eval_all.json), not a summary file"),
            _ => None,
        }
    } else {
        None
    };
    println!("A {a_name}: {}", c.a);
    println!("B {b_name}: {}", c.b);
    println!("question\tA correct/n\tB correct/n\tB-A");
    for d in c.per_question.iter().filter(|d| d.diff != 0.0) {
        println!("{}\t{}/{}\t{}/{}\t{:+.4}", d.question_id, d.correct_a, d.n_a, d.correct_b, d.n_b, d.diff);
    }
    if let Some(s) = &samples {
        println!("sample\tA verdict\tB verdict\tcode");
        for d in &s.differences {
            let code = match d.same_code {
                Some(true) => "same",
                Some(false) => "differs",
                None => "-",
            };
            println!("{} #{}\t{}\t{}\t{code}", d.question_id, d.index, d.a, d.b);
        }
        let code = match (s.code_differs, s.code_compared) {
            (0, 0) => "code not recorded on both sides".to_owned(),
            (0, n) if n == s.samples => "the same code in every sample".to_owned(),
            (0, n) => format!("the same code in the {n} samples both record"),
            (n, _) => format!("DIFFERENT code in {n} samples (not the same programs there)"),
        };
        println!(
            "samples: {} of {} verdicts agree; A passes and B fails {}, B passes and A fails {}; {code}",
            s.agree, s.samples, s.only_a_passes, s.only_b_passes
        );
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
        let text = {
            let mut report = serde_json::json!({ "a": a_name, "b": b_name, "comparison": c });
            if let Some(s) = &samples {
                report["samples"] = serde_json::to_value(s)?;
            }
            serde_json::to_string_pretty(&report)?
        } + "\n";
        write_atomic(out, &text)?;
        eprintln!("wrote {}", out.display());
    }
    Ok(())
}
