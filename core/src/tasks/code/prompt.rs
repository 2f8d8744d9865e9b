//! Code-generation prompts, byte for byte as the references build them (spec code-sft.md §8.3).
//!
//! - `lcb-qwen`: LiveCodeBench's `LMStyle.CodeQwenInstruct` (`format_prompt_generation`), a raw
//!   string that spells out its own ChatML with the system text "You are a helpful assistant."
//!   (not Qwen2.5's default) — used as is, without the model's chat template.
//! - `lighteval`: lighteval's `lcb/main.py:prepare_prompt` as the single user message, rendered
//!   with the model's chat template (so Qwen2.5's default system prompt applies), as
//!   lighteval/OpenR1 run it with `--use-chat-template`.
//! - `generic`: LiveCodeBench's chat-API style (`OpenAIChat`): system `SYSTEM_MESSAGE_GENERIC`,
//!   user `get_generic_question_template_answer`, rendered with the model's chat template.
//!
//! All three end with the assistant header, ready for generation.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::problem::Problem;
use crate::data::chat::Message;
use crate::error::{Error, Result};
use crate::tokenizer::chat_template::ChatTemplate;

/// LiveCodeBench `PromptConstants.SYSTEM_MESSAGE_GENERIC`.
pub const SYSTEM_MESSAGE_GENERIC: &str = "You are an expert Python programmer. You will be given a question (problem specification) and will generate a correct Python program that matches the specification and passes all tests.";
/// LiveCodeBench `PromptConstants.SYSTEM_MESSAGE_CODEQWEN`.
pub const SYSTEM_MESSAGE_CODEQWEN: &str = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user";
/// LiveCodeBench `PromptConstants.FORMATTING_MESSAGE_WITH_STARTER_CODE`.
pub const FORMATTING_MESSAGE_WITH_STARTER_CODE: &str =
    "You will use the following starter code to write the solution to the problem and enclose your code within delimiters.";
/// LiveCodeBench `PromptConstants.FORMATTING_WITHOUT_STARTER_CODE`.
pub const FORMATTING_WITHOUT_STARTER_CODE: &str = "Read the inputs from stdin solve the problem and write the answer to stdout (do not directly test on the sample inputs). Enclose your code within delimiters as follows. Ensure that when the python program runs, it reads the inputs, runs the algorithm and writes output to STDOUT.";

const TASK_SENTENCE: &str = "You will be given a question (problem specification) and will generate a correct Python program that matches the specification and passes all tests.";

/// The named prompt templates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PromptTemplate {
    LcbQwen,
    Lighteval,
    Generic,
}

impl PromptTemplate {
    /// Every template, in a fixed order.
    pub const ALL: [PromptTemplate; 3] = [PromptTemplate::LcbQwen, PromptTemplate::Lighteval, PromptTemplate::Generic];

    /// The name used in configs and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            PromptTemplate::LcbQwen => "lcb-qwen",
            PromptTemplate::Lighteval => "lighteval",
            PromptTemplate::Generic => "generic",
        }
    }
}

impl fmt::Display for PromptTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PromptTemplate {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| Error::InvalidInput(format!("unknown prompt template {s:?}: use lcb-qwen, lighteval or generic")))
    }
}

/// A prompt before the chat template: finished text, or messages for the model's template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CodePrompt {
    Raw(String),
    Chat(Vec<Message>),
}

impl CodePrompt {
    /// The text to tokenize: a raw prompt as is, messages through `chat_template` with the
    /// generation prompt. Messages without a template are an error.
    pub fn render(&self, chat_template: Option<&ChatTemplate>) -> Result<String> {
        match (self, chat_template) {
            (CodePrompt::Raw(text), _) => Ok(text.clone()),
            (CodePrompt::Chat(messages), Some(template)) => template.render(messages, true),
            (CodePrompt::Chat(_), None) => Err(Error::InvalidInput(
                "this prompt template needs the model's chat template, and the model has none (use --prompt lcb-qwen)".into(),
            )),
        }
    }
}

/// The prompt of `problem` under `template`.
pub fn code_prompt(template: PromptTemplate, problem: &Problem) -> CodePrompt {
    code_prompt_parts(template, &problem.question_content, &problem.starter_code)
}

/// The prompt of a question (and its starter code, `""` for none) under `template`.
pub fn code_prompt_parts(template: PromptTemplate, question: &str, starter_code: &str) -> CodePrompt {
    let message = |role: &str, content: String| Message { role: role.into(), content };
    // Python's truthiness of `question.starter_code`.
    let starter = Some(starter_code).filter(|s| !s.is_empty());
    match template {
        PromptTemplate::LcbQwen => CodePrompt::Raw(format!("{SYSTEM_MESSAGE_CODEQWEN}\n\n{}", codeqwen_question(question, starter))),
        PromptTemplate::Lighteval => CodePrompt::Chat(vec![message("user", lighteval_query(question, starter))]),
        PromptTemplate::Generic => CodePrompt::Chat(vec![
            message("system", SYSTEM_MESSAGE_GENERIC.into()),
            message("user", generic_question(question, starter)),
        ]),
    }
}

/// LiveCodeBench `get_codeqwen_question_template_answer`.
fn codeqwen_question(question: &str, starter: Option<&str>) -> String {
    let mut prompt = format!("{TASK_SENTENCE} You will NOT return anything except for the program.\n\n");
    prompt += &format!("Question: {question}\n\n");
    match starter {
        Some(code) => prompt += &format!("{FORMATTING_MESSAGE_WITH_STARTER_CODE}\n```python\n{code}\n```\n\n<|im_end|>\n"),
        None => prompt += &format!("{FORMATTING_WITHOUT_STARTER_CODE}\n```python\n# YOUR CODE HERE\n```\n\n<|im_end|>\n"),
    }
    prompt + "<|im_start|>assistant\n"
}

/// lighteval `prepare_prompt`.
fn lighteval_query(question: &str, starter: Option<&str>) -> String {
    let mut query = format!("{TASK_SENTENCE}\n\n");
    query += &format!("Question: {question}\n\n");
    match starter {
        Some(code) => query += &format!("{FORMATTING_MESSAGE_WITH_STARTER_CODE}\n```python\n{code}\n```\n\n"),
        None => query += &format!("{FORMATTING_WITHOUT_STARTER_CODE}\n```python\n# YOUR CODE HERE\n```\n\n"),
    }
    query
}

/// LiveCodeBench `get_generic_question_template_answer`.
fn generic_question(question: &str, starter: Option<&str>) -> String {
    let mut prompt = format!("### Question:\n{question}\n\n");
    match starter {
        Some(code) => prompt += &format!("### Format: {FORMATTING_MESSAGE_WITH_STARTER_CODE}\n```python\n{code}\n```\n\n"),
        None => prompt += &format!("### Format: {FORMATTING_WITHOUT_STARTER_CODE}\n```python\n# YOUR CODE HERE\n```\n\n"),
    }
    prompt + "### Answer: (use the provided format with backticks)\n\n"
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::tasks::code::release::{Release, Selection, load_problems};

    #[test]
    fn prompts_match_the_reference_code_byte_for_byte() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/code");
        let selection = Selection { release: Some(Release::parse("v5_v6").unwrap()), ..Default::default() };
        let problems = load_problems(&fixtures.join("lcb_mini"), &selection).unwrap();
        let qwen = ChatTemplate::from_model_dir(&fixtures.join("qwen2_5")).unwrap().unwrap();
        let cases = std::fs::read_to_string(fixtures.join("prompt_cases.jsonl")).unwrap();
        let mut checked = 0;
        for line in cases.lines() {
            let case: serde_json::Value = serde_json::from_str(line).unwrap();
            let problem = problems.iter().find(|p| p.question_id == case["question_id"]).unwrap();
            let template: PromptTemplate = case["template"].as_str().unwrap().parse().unwrap();
            let text = code_prompt(template, problem).render(Some(&qwen)).unwrap();
            assert_eq!(text, case["text"].as_str().unwrap(), "{} {}", problem.question_id, template);
            checked += 1;
        }
        assert_eq!(checked, 8 * 3);
        let chat = code_prompt(PromptTemplate::Generic, &problems[0]);
        assert!(chat.render(None).unwrap_err().to_string().contains("chat template"));
        assert!(code_prompt(PromptTemplate::LcbQwen, &problems[0]).render(None).is_ok(), "raw prompts need no template");
        assert!("lcb".parse::<PromptTemplate>().is_err());
    }
}
