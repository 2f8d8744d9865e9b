//! The code task behind the [`Task`] interface: items are problems ([`super::code_problem`]:
//! LiveCodeBench rows or code-problem rows) asked with a named prompt template; a response is
//! judged by extracting its program and running it on the problem's tests in the sandbox.
//!
//! `[task] kind = "code"` ([`CodeTaskConfig`]) chooses the prompt, the grading limits and the
//! extraction; `[reward] kind = "code"` the RL reward:
//!
//! ```toml
//! [task]
//! kind = "code"
//! template = "lcb-qwen"        # or "lighteval" / "generic" with chat_template = "<model dir>"
//! timeout_s = 6                # per test, for evaluation (LiveCodeBench's)
//! sandbox_without = []         # sandbox layers to leave off, e.g. ["net_namespace"] (testing)
//!
//! [reward]
//! kind = "code"
//! partial = false              # 1 when every test passes; true: the fraction of tests passed
//! per_test_timeout_s = 2       # shorter than evaluation's
//! extraction = "lcb"           # or "openr1": the last ```python block
//! max_tests = 20               # the first tests only (public ones first); all if absent
//! ```
//!
//! Lines are compared exactly as LiveCodeBench compares them ([`kiln_sandbox::compare_stdout`]:
//! equal line counts, each line equal as text or as `Decimal`s). Unlike OpenR1's reward, which
//! zips expected and printed lines and so passes a program that stops a line early, a missing
//! line is a wrong answer.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kiln_sandbox::{Graded, Limits, Sandbox, SandboxOptions, Verdict};
use serde::{Deserialize, Serialize};

use super::code_problem::{CodeGold, CodeProblem, read_code_problems};
use super::extract::Extraction;
use super::grade::{Submission, grade_submissions};
use super::prompt::PromptTemplate;
use crate::error::{Error, Result};
use crate::tasks::{Item, Items, Reward, RewardConfig, Task};
use crate::tokenizer::chat_template::ChatTemplate;

/// `[task] kind = "code"`: how problems are asked and responses judged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodeTaskConfig {
    /// The prompt ([`PromptTemplate`]; `lcb-qwen` spells out its own ChatML).
    #[serde(default = "lcb_qwen")]
    pub template: PromptTemplate,
    /// The chat template for `lighteval` and `generic`: a model directory (its
    /// `tokenizer_config.json` / `chat_template.jinja`) or a Jinja file. Relative to the config
    /// file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<PathBuf>,
    /// Per-test time limit (CPU and wall) when evaluating, seconds (LiveCodeBench: 6).
    #[serde(default = "six")]
    pub timeout_s: f64,
    /// How the program is found in a response.
    #[serde(default)]
    pub extraction: Extraction,
    /// Strings that end a response when decoding for evaluation (LiveCodeBench: `###`); `[""]`
    /// or `[]` for none.
    #[serde(default = "lcb_stop")]
    pub stop: Vec<String>,
    /// Run programs even when the sandbox cannot contain them (never by default).
    #[serde(default)]
    pub unsafe_no_sandbox: bool,
    /// Sandbox layers to leave off as if the kernel lacked them (`kiln_sandbox::SKIPPABLE_LAYERS`
    /// names; the CLI's `--sandbox-without`). The sandbox still refuses when the rest cannot
    /// contain a run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sandbox_without: Vec<String>,
    /// Enforce Landlock as a kernel of this ABI (1–6) would (the CLI's
    /// `--sandbox-landlock-abi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_landlock_abi: Option<u32>,
}

fn lcb_qwen() -> PromptTemplate {
    PromptTemplate::LcbQwen
}
fn six() -> f64 {
    6.0
}
fn lcb_stop() -> Vec<String> {
    vec!["###".into()]
}

impl Default for CodeTaskConfig {
    fn default() -> Self {
        Self { template: lcb_qwen(), chat_template: None, timeout_s: six(), extraction: Extraction::Lcb, stop: lcb_stop(), unsafe_no_sandbox: false, sandbox_without: Vec::new(), sandbox_landlock_abi: None }
    }
}

impl CodeTaskConfig {
    /// Makes `chat_template` relative to `base` (the config file's directory).
    pub fn resolve_paths(&mut self, base: &Path) {
        if let Some(path) = &mut self.chat_template
            && path.is_relative()
        {
            *path = base.join(&*path);
        }
    }
}

/// Limits of one graded test: LiveCodeBench's, with `timeout_s` per test.
pub fn limits(timeout_s: f64, stop_at_first_failure: bool) -> Result<Limits> {
    // (Bounded: the sandbox adds a start-up grace to it and sets deadlines from the time now.)
    if !(timeout_s > 0.0 && timeout_s <= 1e9) {
        return Err(Error::InvalidInput(format!("a per-test time limit must be positive and at most 1e9 seconds, not {timeout_s}")));
    }
    Ok(Limits { per_test: Duration::from_secs_f64(timeout_s), stop_at_first_failure, ..Limits::default() })
}

/// The code task (see the module docs).
pub struct CodeTask {
    config: CodeTaskConfig,
    chat_template: Option<ChatTemplate>,
    limits: Limits,
    sandbox: Arc<Sandbox>,
}

impl CodeTask {
    /// The task of `config`, with a sandbox probed now (an error if it refuses to run).
    pub fn new(config: CodeTaskConfig) -> Result<Self> {
        let options = SandboxOptions {
            allow_unsafe: config.unsafe_no_sandbox,
            skip_layers: config.sandbox_without.clone(),
            landlock_abi: config.sandbox_landlock_abi,
            ..SandboxOptions::default()
        };
        Self::with_sandbox(config, Arc::new(Sandbox::new(options)?))
    }

    /// The task of `config` running programs in `sandbox`.
    pub fn with_sandbox(config: CodeTaskConfig, sandbox: Arc<Sandbox>) -> Result<Self> {
        // A Jinja file sees the special tokens of the directory it is in.
        let chat_template = match &config.chat_template {
            Some(path) => Some(ChatTemplate::from_path(path, path.parent().unwrap_or(path))?),
            None => None,
        };
        if config.template != PromptTemplate::LcbQwen && chat_template.is_none() {
            return Err(Error::InvalidInput(format!(
                "[task] template = \"{}\" renders messages with a chat template: set chat_template = \"<model dir>\"",
                config.template
            )));
        }
        let limits = limits(config.timeout_s, true)?;
        Ok(Self { config, chat_template, limits, sandbox })
    }

    /// The sandbox programs run in (its [`Sandbox::protections`] belong next to any results).
    pub fn sandbox(&self) -> &Arc<Sandbox> {
        &self.sandbox
    }

    /// The finished prompt text of `problem`.
    pub fn prompt_text(&self, problem: &CodeProblem) -> Result<String> {
        problem.prompt(self.config.template).render(self.chat_template.as_ref())
    }

    /// Grades `batch` under `limits`, each response's program found by `extraction`.
    fn grade(&self, batch: &[(&str, &Item)], limits: &Limits, extraction: Extraction, max_tests: Option<usize>) -> Result<Vec<Graded>> {
        let mut golds: Vec<CodeGold> = Vec::new();
        let mut index: HashMap<*const Item, usize> = HashMap::new();
        let mut which = Vec::with_capacity(batch.len());
        for (_, item) in batch {
            let key: *const Item = *item;
            let i = match index.get(&key) {
                Some(&i) => i,
                None => {
                    let mut gold = CodeGold::of(item)?;
                    gold.tests.truncate(max_tests.unwrap_or(usize::MAX));
                    golds.push(gold);
                    index.insert(key, golds.len() - 1);
                    golds.len() - 1
                }
            };
            which.push(i);
        }
        let submissions: Vec<Submission<'_>> =
            batch.iter().zip(&which).map(|((response, _), &i)| Submission { completion: response, tests: &golds[i].tests }).collect();
        Ok(grade_submissions(&self.sandbox, &submissions, limits, extraction, |_, _| {})?.into_iter().map(|s| s.graded).collect())
    }
}

impl Task for CodeTask {
    fn name(&self) -> &str {
        "code"
    }

    /// The sandbox's layers: what every verdict and code reward was graded under.
    fn environment(&self) -> Option<crate::tasks::TaskEnvironment> {
        let p = self.sandbox.protections();
        Some(crate::tasks::TaskEnvironment { summary: p.summary(), record: serde_json::json!({ "protections": p }) })
    }

    fn items(&self, path: &Path) -> Result<Items> {
        let items = read_code_problems(path)?
            .into_iter()
            .map(|(problem, source)| {
                let prompt = self.prompt_text(&problem).map_err(|e| source.error(e.to_string()))?;
                Ok(problem.item(prompt, source))
            })
            .collect::<Vec<Result<Item>>>();
        Ok(Box::new(items.into_iter()))
    }

    /// 1 when the program passes every test under the evaluation limits, else 0 (also when the
    /// item is not a code item).
    fn evaluate(&self, response: &str, item: &Item) -> f64 {
        self.evaluate_batch(&[(response, item)]).map_or(0.0, |v| v[0])
    }

    /// Grades the responses in parallel over the sandbox's slots.
    fn evaluate_batch(&self, batch: &[(&str, &Item)]) -> Result<Vec<f64>> {
        let graded = self.grade(batch, &self.limits, self.config.extraction, None)?;
        Ok(graded.iter().map(|g| f64::from(u8::from(g.verdict == Verdict::Accepted))).collect())
    }

    /// `outcome`: the evaluation verdict; `code`: see the module docs.
    fn reward(&self, config: &RewardConfig) -> Result<Box<dyn Reward>> {
        let (partial, timeout_s, extraction, max_tests) = match config {
            RewardConfig::Outcome => (false, self.config.timeout_s, self.config.extraction, None),
            RewardConfig::Code { partial, per_test_timeout_s, extraction, max_tests } => (*partial, *per_test_timeout_s, *extraction, *max_tests),
            other => return Err(Error::InvalidInput(format!("the code task has no {:?} reward (use kind = \"code\")", other.kind()))),
        };
        let limits = limits(timeout_s, !partial)?;
        Ok(Box::new(CodeReward { task: self.clone_shared(), partial, limits, extraction, max_tests }))
    }

    fn stop_strings(&self) -> Vec<String> {
        crate::generate::StopCriteria::strings_without_empty(&self.config.stop)
    }
}

impl CodeTask {
    /// A task sharing this one's sandbox and template.
    fn clone_shared(&self) -> CodeTask {
        CodeTask { config: self.config.clone(), chat_template: self.chat_template.clone(), limits: self.limits.clone(), sandbox: self.sandbox.clone() }
    }
}

/// The code reward: all tests pass (1 or 0), or the fraction passed (`partial`).
struct CodeReward {
    task: CodeTask,
    partial: bool,
    limits: Limits,
    extraction: Extraction,
    max_tests: Option<usize>,
}

impl CodeReward {
    fn value(&self, graded: &Graded) -> f64 {
        match (self.partial, graded.total) {
            (true, total) if total > 0 => graded.passed as f64 / total as f64,
            _ => f64::from(u8::from(graded.verdict == Verdict::Accepted)),
        }
    }
}

impl Reward for CodeReward {
    fn score(&self, response: &str, item: &Item) -> f64 {
        self.score_batch(&[(response, item)]).map_or(0.0, |v| v[0])
    }

    fn score_batch(&self, batch: &[(&str, &Item)]) -> Result<Vec<f64>> {
        let graded = self.task.grade(batch, &self.limits, self.extraction, self.max_tests)?;
        Ok(graded.iter().map(|g| self.value(g)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::TaskConfig;
    use crate::tasks::code::code_problem::CodeProblem;

    /// Prints 1 … n, one per line.
    const COUNT: &str = r#"{"id": "count", "question": "Print 1 to n.", "difficulty": "easy",
        "tests": [{"input": "1\n", "output": "1\n"}, {"input": "2\n", "output": "1\n2\n"}, {"input": "3\n", "output": "1\n2\n3\n"}]}"#;

    fn fenced(code: &str) -> String {
        format!("Here it is:\n```python\n{code}\n```\n")
    }

    fn task() -> CodeTask {
        CodeTask::new(CodeTaskConfig::default()).unwrap()
    }

    fn reward(task: &CodeTask, toml_text: &str) -> Box<dyn Reward> {
        task.reward(&toml::from_str(toml_text).unwrap()).unwrap()
    }

    #[test]
    fn rewards_all_pass_partial_and_a_missing_last_line() {
        let task = task();
        let item = CodeProblem::parse(COUNT).unwrap().item("p".into(), Default::default());
        let right = fenced("n = int(input())\nfor i in range(1, n + 1):\n    print(i)");
        let two_of_three = fenced("n = int(input())\nfor i in range(1, min(n, 2) + 1):\n    print(i)");
        let last_line_missing = fenced("n = int(input())\nfor i in range(1, n):\n    print(i)");
        let no_code = "print(1)".to_owned();
        let responses = [right.as_str(), &two_of_three, &last_line_missing, &no_code];
        let batch: Vec<(&str, &Item)> = responses.iter().map(|r| (*r, &item)).collect();

        let all_pass = reward(&task, "kind = \"code\"");
        assert_eq!(all_pass.score_batch(&batch).unwrap(), [1.0, 0.0, 0.0, 0.0]);
        let partial = reward(&task, "kind = \"code\"\npartial = true\nper_test_timeout_s = 1.5");
        // The program that stops a line early passes no test: line counts must agree (OpenR1's
        // `zip` would pass it on every test).
        assert_eq!(partial.score_batch(&batch).unwrap(), [1.0, 2.0 / 3.0, 0.0, 0.0]);
        assert_eq!(partial.score(&two_of_three, &item), 2.0 / 3.0);
        let first_two = reward(&task, "kind = \"code\"\npartial = true\nmax_tests = 2");
        assert_eq!(first_two.score(&two_of_three, &item), 1.0, "only the first two tests count");
        let openr1 = reward(&task, "kind = \"code\"\nextraction = \"openr1\"");
        let untagged = right.replace("```python", "```");
        assert_eq!(openr1.score_batch(&[(&right, &item), (&untagged, &item)]).unwrap(), [1.0, 0.0]);

        // The outcome reward (RL validation) is the evaluation verdict.
        let outcome = task.reward(&RewardConfig::Outcome).unwrap();
        assert_eq!(outcome.score_batch(&batch).unwrap(), task.evaluate_batch(&batch).unwrap());
        assert_eq!(task.evaluate(&right, &item), 1.0);
        let process = RewardConfig::Process { answer_weight: 1.0, step_weight: 0.0, zero_on_process_mismatch: false, value_tolerance: 0.0 };
        assert!(task.reward(&process).is_err());
        assert!(task.reward(&toml::from_str("kind = \"code\"\nper_test_timeout_s = 0").unwrap()).is_err());
    }

    #[test]
    fn task_configs_parse_and_check_their_chat_template() {
        let config: TaskConfig = toml::from_str("kind = \"code\"\ntimeout_s = 3\nstop = []").unwrap();
        let TaskConfig::Code(code) = &config else { panic!("{config:?}") };
        assert_eq!((code.template, code.timeout_s, code.stop.len(), code.extraction), (PromptTemplate::LcbQwen, 3.0, 0, Extraction::Lcb));
        assert!(toml::from_str::<TaskConfig>("kind = \"code\"\ntempate = \"generic\"").unwrap_err().to_string().contains("tempate"));
        assert_eq!(toml::from_str::<TaskConfig>("kind = \"interplay\"").unwrap(), TaskConfig::Interplay);

        let mut generic: TaskConfig = toml::from_str("kind = \"code\"\ntemplate = \"generic\"\nchat_template = \"qwen2_5\"").unwrap();
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/code");
        generic.resolve_paths(&fixtures);
        let task = generic.build().unwrap();
        let items = crate::tasks::load_items(task.as_ref(), &[fixtures.join("lcb_mini/test6.jsonl")], None).unwrap();
        assert_eq!(items.len(), 5);
        assert!(items[0].prompt.starts_with("<|im_start|>system\nYou are an expert Python programmer."), "{}", items[0].prompt);
        assert_eq!(task.stop_strings(), ["###"]);
        // `stop = [""]` is none, as `kiln eval code --stop ''` (the engine refuses an empty one).
        let none: TaskConfig = toml::from_str("kind = \"code\"\nstop = [\"\"]").unwrap();
        assert!(none.build().unwrap().stop_strings().is_empty());
        let e = CodeTask::new(CodeTaskConfig { template: PromptTemplate::Lighteval, ..Default::default() }).err().unwrap().to_string();
        assert!(e.contains("chat_template"), "{e}");
    }
}
