//! `kiln data interplay`: generate Interplay task splits in the reference layout; `kiln data
//! decontaminate` ([`super::decontaminate`]).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use kiln::tasks::interplay::dataset::{Split, write_split};
use kiln::tasks::interplay::generator::op_max_for;

use super::progress;

#[derive(Debug, Args)]
pub struct DataArgs {
    #[command(subcommand)]
    command: DataCommand,
}

#[derive(Debug, Subcommand)]
enum DataCommand {
    /// Generate Interplay (GSM-Infinite "realistic") problems, one file per op.
    Interplay(InterplayArgs),
    /// 8-gram overlap between training rows and evaluation problems (OpenR1's decontamination
    /// rule): which rows share word 8-grams with which LiveCodeBench problems.
    #[cfg(feature = "code")]
    Decontaminate(super::decontaminate::DecontaminateArgs),
}

#[derive(Debug, Args)]
struct InterplayArgs {
    /// Ops to generate: a range `2-20`, a list `2,5,7`, or one op (each in 2..=20).
    #[arg(long, default_value = "2-20", value_parser = parse_ops)]
    ops: OpList,
    /// Rows per op (modes and templates are cycled, so each gets an equal share).
    #[arg(long)]
    per_op: usize,
    /// Seed; with the split and the op it determines every row.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output directory (the split is written to DIR/<split>/); rows of other splits already
    /// there are never repeated.
    #[arg(long)]
    out: PathBuf,
    /// test, val, heldout or train.
    #[arg(long, default_value = "test", value_parser = parse_split)]
    split: Split,
    /// Replace split files already there with other rows (without it they are an error, and
    /// identical ones are left as they are).
    #[arg(long)]
    overwrite: bool,
}

/// The ops of `--ops`, in the order given.
#[derive(Debug, Clone)]
struct OpList(Vec<u32>);

/// Parses `2-20`, `2,5,7` or `7`.
fn parse_ops(text: &str) -> Result<OpList> {
    let mut ops = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.trim().parse::<u32>()?, hi.trim().parse::<u32>()?),
            None => {
                let op = part.parse::<u32>().with_context(|| {
                    format!("not an op list: {text:?} (expected e.g. 2-20 or 2,5,7)")
                })?;
                (op, op)
            }
        };
        if lo > hi {
            bail!("empty op range {part:?}");
        }
        for op in lo..=hi {
            if op_max_for(op).is_none() {
                bail!("op {op} is outside 2..=20");
            }
            if !ops.contains(&op) {
                ops.push(op);
            }
        }
    }
    Ok(OpList(ops))
}

fn parse_split(text: &str) -> Result<Split> {
    Split::from_name(text)
        .with_context(|| format!("unknown split {text:?} (expected test, val, heldout or train)"))
}

pub fn run(args: DataArgs) -> Result<()> {
    match args.command {
        DataCommand::Interplay(args) => interplay(args),
        #[cfg(feature = "code")]
        DataCommand::Decontaminate(args) => super::decontaminate::run(args),
    }
}

fn interplay(args: InterplayArgs) -> Result<()> {
    if args.per_op == 0 {
        bail!("--per-op must be at least 1");
    }
    let Some(rows) = args.ops.0.len().checked_mul(args.per_op) else {
        bail!("--per-op {} for {} ops is more rows than can be counted", args.per_op, args.ops.0.len());
    };
    let bar = progress::with_eta(rows as u64, "rows");
    let start = Instant::now();
    let report = write_split(
        &args.out,
        args.split,
        &args.ops.0,
        args.per_op,
        args.seed,
        args.overwrite,
        || bar.inc(1),
    )?;
    bar.finish_and_clear();
    let seconds = start.elapsed().as_secs_f64();
    eprintln!(
        "wrote {} rows in {} files under {} ({} attempts, {:.1} s, {:.0} rows/s)",
        report.rows,
        report.files.len(),
        args.out.join(args.split.name()).display(),
        report.attempts,
        seconds,
        report.rows as f64 / seconds.max(1e-9)
    );
    Ok(())
}
