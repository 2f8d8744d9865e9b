//! The code task: LiveCodeBench-style code generation (spec `code-sft.md` §8), graded by running
//! the programs in kiln's sandbox ([`kiln_sandbox`]).
//!
//! - [`problem`], [`private`], [`release`]: `code_generation_lite` problem rows, their public and
//!   private tests (base64 → zlib → pickle → JSON), selection by release file or date window.
//! - [`code_problem`]: problems as the task grades them, from LiveCodeBench rows or plain
//!   code-problem rows (for RL data and problems made in place).
//! - [`prompt`]: the prompts `lcb-qwen`, `lighteval` and `generic`, byte for byte, rendered with
//!   the model's chat template where they are chat messages.
//! - [`sampling`]: LiveCodeBench's sampling defaults.
//! - [`extract`]: LiveCodeBench's and OpenR1's code extraction.
//! - [`grade`]: extracting and running completions in the sandbox, and the graded lines.
//! - [`task`]: [`CodeTask`] behind the [`Task`](crate::tasks::Task) interface, and the code
//!   reward for RL (`[reward] kind = "code"`).
//! - [`evaluation`]: `kiln eval code`'s files ([`CodeEvaluation`], driven by
//!   [`crate::eval::evaluate`]).
//! - [`summary`]: pass@k overall, per difficulty and per platform, per-problem counts, and
//!   `no_code` counts.
//! - [`lcb_files`]: LiveCodeBench's own files: the custom evaluator's input (written by
//!   `kiln eval code`) and its `_eval_all.json` (read by `kiln eval code compare`).
//! - [`decontaminate`]: 8-gram overlap of training rows with evaluation problems.
//! - [`study`]: the code-SFT study's statistics: standard errors across problems and paired
//!   comparisons of two runs with a bootstrap interval.

pub mod code_problem;
pub mod decontaminate;
pub mod evaluation;
pub mod extract;
pub mod grade;
pub mod lcb_files;
pub mod private;
pub mod problem;
pub mod prompt;
pub mod release;
pub mod sampling;
pub mod study;
pub mod summary;
pub mod task;

pub use code_problem::{CodeGold, CodeProblem, read_code_problems};
pub use evaluation::CodeEvaluation;
pub use extract::Extraction;
pub use grade::{GradeRecord, GradedSample, Submission, TestRecord, grade_submissions};
pub use kiln_sandbox as sandbox;
pub use problem::{ContestDate, Difficulty, Platform, Problem, TestCase, TestMode, TestType};
pub use prompt::{CodePrompt, PromptTemplate, code_prompt, code_prompt_parts};
pub use release::{DateWindow, Release, Selection, load_problems, load_selected};
pub use sampling::CodeSampling;
pub use summary::{CodeSummary, DEFAULT_KS, PassSummary, ProblemOutcome, SampleOutcome, summarize};
pub use task::{CodeTask, CodeTaskConfig};
