//! The code task: LiveCodeBench-style code generation (spec `code-sft.md` §8).
//!
//! - [`problem`], [`private`], [`release`]: `code_generation_lite` problem rows, their public and
//!   private tests (base64 → zlib → pickle → JSON), selection by release file or date window.
//! - [`prompt`]: the prompts `lcb-qwen`, `lighteval` and `generic`, byte for byte, rendered with
//!   the model's chat template where they are chat messages.
//! - [`sampling`]: LiveCodeBench's sampling defaults.
//! - [`extract`]: LiveCodeBench's and OpenR1's code extraction.
//! - [`summary`]: pass@k overall, per difficulty and per platform, and `no_code` counts.
//!
//! Running and grading programs is the sandbox's job, not this module's.

pub mod extract;
pub mod private;
pub mod problem;
pub mod prompt;
pub mod release;
pub mod sampling;
pub mod summary;

pub use extract::Extraction;
pub use problem::{ContestDate, Difficulty, Platform, Problem, TestCase, TestMode, TestType};
pub use prompt::{CodePrompt, PromptTemplate, code_prompt};
pub use release::{DateWindow, Release, Selection, load_problems};
pub use sampling::CodeSampling;
pub use summary::{CodeSummary, PassSummary, ProblemOutcome, SampleOutcome, summarize};
