//! `kiln data decontaminate --rows SFT.parquet --problems LCB.jsonl`: the 8-gram overlap of
//! training rows with evaluation problems ([`kiln::tasks::code::decontaminate`] documents the
//! tokenisation).

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;
use kiln::io::write_atomic;
use kiln::tasks::code::decontaminate::{NGRAM, overlap, read_text_rows};
use kiln::tasks::code::{DateWindow, Release, Selection, load_problems};

#[derive(Debug, Args)]
pub struct DecontaminateArgs {
    /// Training rows: a .parquet or .jsonl file, a directory of them, or a `train-*.parquet` pattern.
    #[arg(long)]
    rows: PathBuf,
    /// The column holding a row's problem text: a string, or a list of messages (user turns).
    #[arg(long, default_value = "prompt")]
    column: String,
    /// A column naming rows in the report (default: file and row).
    #[arg(long)]
    id_column: Option<String>,
    /// LiveCodeBench problems: a JSONL file, or the directory of release files (with --release).
    #[arg(long)]
    problems: PathBuf,
    /// Release: v6 (= test6.jsonl), release_v6, v4_v5, ….
    #[arg(long)]
    release: Option<String>,
    /// Words per n-gram.
    #[arg(long, default_value_t = NGRAM)]
    ngram: usize,
    /// Write the full report (every overlapping row, its problems and shared n-gram counts) here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Replace an existing --out file.
    #[arg(long)]
    overwrite: bool,
}

pub fn run(args: DecontaminateArgs) -> Result<()> {
    if args.ngram == 0 {
        bail!("--ngram must be at least 1");
    }
    if let Some(out) = &args.out {
        super::refuse_input_as_out(out, &[&args.rows, &args.problems])?;
        super::refuse_existing(out, args.overwrite)?;
    }
    let release = args.release.as_deref().map(Release::parse).transpose()?;
    let problems = load_problems(&args.problems, &Selection { release, window: DateWindow::default() })?;
    let problems: Vec<(String, String)> = problems.into_iter().map(|p| (p.question_id, p.question_content)).collect();
    let rows = read_text_rows(&args.rows, &args.column, args.id_column.as_deref())?;
    let report = overlap(&rows, &problems, args.ngram);
    for o in &report.overlaps {
        let problems: Vec<String> = o.problems.iter().map(|(id, n)| format!("{id} ({n})")).collect();
        println!("{}\t{}\t{:?}", o.row, problems.join(", "), o.example);
    }
    println!(
        "{} of {} rows share a word {}-gram with {} of {} problems",
        report.contaminated_rows,
        report.rows,
        args.ngram,
        report.contaminated_problems.len(),
        report.problems
    );
    if let Some(out) = &args.out {
        write_atomic(out, &(serde_json::to_string_pretty(&report)? + "\n"))?;
        eprintln!("wrote {}", out.display());
    }
    Ok(())
}
