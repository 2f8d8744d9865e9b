//! `kiln code grade`: grade completions of code problems in the sandbox, no model involved.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use kiln::io::{AtomicFile, jsonl_records};
use kiln::tasks::code::sandbox::{Protections, SKIPPABLE_LAYERS, Sandbox, SandboxOptions};
use kiln::tasks::code::summary::{PassSummary, ProblemCount, ProblemOutcome, SampleOutcome};
use kiln::tasks::code::task::limits;
use kiln::tasks::code::{CodeProblem, DEFAULT_KS, Extraction, GradeRecord, Submission, grade_submissions, read_code_problems, summarize};
use serde::Serialize;
use serde_json::{Value, json};

use super::progress;

#[derive(Debug, Args)]
pub struct CodeArgs {
    #[command(subcommand)]
    command: CodeCommand,
}

#[derive(Debug, Subcommand)]
enum CodeCommand {
    /// Grade completions on their problems' tests in the sandbox (LiveCodeBench's rules):
    /// one line per completion and a final summary line with pass@k.
    Grade(GradeArgs),
}

/// Options shared by the commands that run model-written programs.
#[derive(Debug, Clone, Args)]
pub struct SandboxArgs {
    /// Run programs even when the sandbox cannot contain them (DANGEROUS: only for code you
    /// trust).
    #[arg(long)]
    pub unsafe_no_sandbox: bool,
    /// Leave sandbox layers off as if the kernel lacked them (landlock, seccomp, user_namespace,
    /// net_namespace, scratch, uid, cgroup, pid_namespace); recorded with the protections. kiln
    /// still refuses when the layers left cannot contain a run.
    #[arg(long, value_name = "LAYER[,LAYER...]", value_delimiter = ',', value_parser = parse_layer)]
    pub sandbox_without: Vec<String>,
    /// Enforce Landlock as a kernel of this ABI (1-6) would, to see what an older kernel gets
    /// (recorded with the protections); kiln still refuses when the rest cannot contain a run.
    #[arg(long, value_name = "ABI")]
    pub sandbox_landlock_abi: Option<u32>,
    /// Per-test time limit in seconds, CPU and wall (LiveCodeBench: 6).
    #[arg(long, default_value_t = 6.0)]
    pub timeout: f64,
    /// How the program is found in a completion: lcb (between the last two fence lines) or
    /// openr1 (the last ```python block).
    #[arg(long, default_value = "lcb", value_parser = parse_extraction)]
    pub extraction: Extraction,
    /// Programs run in parallel (default: the number of cores).
    #[arg(long, default_value_t = 0)]
    pub slots: usize,
}

impl SandboxArgs {
    /// Probes the sandbox and prints its layers on stderr; refuses unconfined unless allowed.
    pub fn sandbox(&self) -> Result<Arc<Sandbox>> {
        let sandbox = Sandbox::new(SandboxOptions {
            allow_unsafe: self.unsafe_no_sandbox,
            skip_layers: self.sandbox_without.clone(),
            landlock_abi: self.sandbox_landlock_abi,
            slots: self.slots,
            ..SandboxOptions::default()
        })?;
        eprint!("{}", sandbox.protections());
        Ok(Arc::new(sandbox))
    }
}

pub(super) fn parse_layer(text: &str) -> Result<String> {
    if !SKIPPABLE_LAYERS.contains(&text) {
        bail!("unknown sandbox layer {text:?}: the layers that can be left off are {}", SKIPPABLE_LAYERS.join(", "));
    }
    Ok(text.to_owned())
}

fn parse_extraction(text: &str) -> Result<Extraction> {
    match text {
        "lcb" => Ok(Extraction::Lcb),
        "openr1" => Ok(Extraction::OpenR1),
        _ => bail!("unknown extraction {text:?}: use lcb or openr1"),
    }
}

#[derive(Debug, Args)]
struct GradeArgs {
    /// Problems: LiveCodeBench rows or code-problem rows (JSONL).
    #[arg(long)]
    problems: PathBuf,
    /// Completions: {"question_id", "completion"} or {"question_id", "completions": [...]} per line.
    #[arg(long)]
    completions: PathBuf,
    /// Output JSONL: one line per completion, then {"summary": {...}}.
    #[arg(long)]
    out: PathBuf,
    /// Replace an existing output file.
    #[arg(long)]
    overwrite: bool,
    #[command(flatten)]
    sandbox: SandboxArgs,
}

pub fn run(args: CodeArgs) -> Result<()> {
    match args.command {
        CodeCommand::Grade(args) => grade(args),
    }
}

/// The completions of a file: `(question_id, completion)` in order, each id known.
fn read_completions(path: &Path, known: &HashMap<&str, usize>) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for record in jsonl_records(path)? {
        let record = record?;
        let at = |message: String| kiln::Error::data(path, Some(record.line), message);
        let id = match record.fields.get("question_id") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            _ => return Err(at("no string \"question_id\"".into()).into()),
        };
        if !known.contains_key(id.as_str()) {
            return Err(at(format!("question_id {id:?} is not among the problems")).into());
        }
        let texts: Vec<String> = match (record.fields.get("completion"), record.fields.get("completions")) {
            (Some(Value::String(c)), None) => vec![c.clone()],
            (None, Some(Value::Array(list))) => list
                .iter()
                .map(|c| c.as_str().map(str::to_owned).ok_or_else(|| at("\"completions\" must be a list of strings".into())))
                .collect::<kiln::Result<_>>()?,
            _ => return Err(at("needs a string \"completion\" or a list \"completions\" (not both)".into()).into()),
        };
        out.extend(texts.into_iter().map(|t| (id.clone(), t)));
    }
    Ok(out)
}

/// The summary line: overall figures (`pass@1` first), groups, per-problem counts, how programs
/// were graded and the sandbox's layers.
#[derive(Serialize)]
struct GradeSummary<'a> {
    #[serde(flatten)]
    overall: &'a PassSummary,
    by_difficulty: &'a BTreeMap<String, PassSummary>,
    by_platform: &'a BTreeMap<String, PassSummary>,
    per_problem: &'a [ProblemCount],
    grading: Value,
    protections: &'a Protections,
}

#[derive(Serialize)]
struct SummaryLine<'a> {
    summary: GradeSummary<'a>,
}

fn grade(args: GradeArgs) -> Result<()> {
    super::refuse_existing(&args.out, args.overwrite)?;
    super::refuse_input_as_out(&args.out, &[&args.problems, &args.completions])?;
    let problems: Vec<CodeProblem> = read_code_problems(&args.problems)?.into_iter().map(|(p, _)| p).collect();
    let position: HashMap<&str, usize> = problems.iter().enumerate().map(|(i, p)| (p.id.as_str(), i)).collect();
    let completions = read_completions(&args.completions, &position)?;
    let limits = limits(args.sandbox.timeout, true)?;
    let sandbox = args.sandbox.sandbox()?;
    let submissions: Vec<Submission<'_>> =
        completions.iter().map(|(id, text)| Submission { completion: text, tests: &problems[position[id.as_str()]].tests }).collect();
    eprintln!("grading {} completions of {} problems on {} slots", submissions.len(), problems.len(), sandbox.slots());
    let bar = progress::with_eta(submissions.len() as u64, "completions");
    let graded = grade_submissions(&sandbox, &submissions, &limits, args.sandbox.extraction, |_, _| bar.inc(1))?;
    bar.finish_and_clear();

    let mut outcomes: Vec<Option<ProblemOutcome>> = vec![None; problems.len()];
    let mut file = AtomicFile::create(&args.out)?;
    for ((id, _), sample) in completions.iter().zip(&graded) {
        let p = position[id.as_str()];
        let outcome = outcomes[p].get_or_insert_with(|| ProblemOutcome {
            question_id: id.clone(),
            difficulty: problems[p].difficulty.clone(),
            platform: problems[p].platform.clone(),
            samples: Vec::new(),
        });
        let index = outcome.samples.len();
        outcome.samples.push(SampleOutcome { verdict: sample.graded.verdict });
        file.write_line(&serde_json::to_string(&GradeRecord::new(id, index, &sample.graded))?)?;
    }
    let outcomes: Vec<ProblemOutcome> = outcomes.into_iter().flatten().collect();
    let summary = summarize(&outcomes, &DEFAULT_KS);
    let record = GradeSummary {
        overall: &summary.overall,
        by_difficulty: &summary.by_difficulty,
        by_platform: &summary.by_platform,
        per_problem: &summary.per_problem,
        grading: json!({ "per_test_timeout_s": args.sandbox.timeout, "extraction": args.sandbox.extraction }),
        protections: sandbox.protections(),
    };
    file.write_line(&serde_json::to_string(&SummaryLine { summary: record })?)?;
    file.commit()?;
    let o = &summary.overall;
    let pass1 = o.pass_at(1).map_or("-".to_owned(), |v| format!("{v:.4}"));
    eprintln!(
        "pass@1 {pass1}: {} of {} completions accepted, {} without code; wrote {}",
        o.correct,
        o.samples,
        o.no_code,
        args.out.display()
    );
    Ok(())
}
