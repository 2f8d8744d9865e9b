//! Interplay as a [`Task`]: rows of the reference's JSONL schema (`docs/interplay.md` §2.1) become
//! items whose prompt is `compose_text(row)` up to and including `<solution>` and whose reference
//! text is `compose_text(row) + "[EOS]"`; responses are judged by answer exact match
//! (`eval_checkpoints.py`) and rewarded by the seed's outcome or process-verified rewards (§6.4).
//!
//! Rows are read as `load_eval_rows` reads them: `problem` and `question` may be missing or
//! null, `solution` must be a string and `op` an integer; a row that composes to no text is an
//! error naming the file and line.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::answer::{exact_match, extract_tagged_answer};
use super::rewards::{ProcessRewardConfig, outcome_reward, process_reward, rl_gold_answer};
use super::row::gold_answer;
use super::text::{EOS, compose_text, prompt_of};
use crate::error::{Error, Result};
use crate::io::{Record, jsonl_files, jsonl_records};
use crate::tasks::{Item, Items, Reward, RewardConfig, Source, Task};

/// The Interplay reasoning task.
#[derive(Debug, Clone, Copy, Default)]
pub struct InterplayTask;

/// `gold` of an Interplay item: the solution, its answers and the row's template.
fn gold_of<'a>(item: &'a Item, key: &str) -> &'a str {
    item.gold.get(key).and_then(Value::as_str).unwrap_or("")
}

/// The gold solution of an Interplay item.
pub fn solution(item: &Item) -> &str {
    gold_of(item, "solution")
}

/// `solution.split("Answer: ")[-1].strip().rstrip(".")`: the answer evaluation compares with.
pub fn answer(item: &Item) -> &str {
    gold_of(item, "answer")
}

/// The RL ground truth: the answer extracted from the solution's `Answer:` line.
pub fn rl_answer(item: &Item) -> &str {
    gold_of(item, "rl_answer")
}

/// The row's template, if it has one.
pub fn template(item: &Item) -> Option<&str> {
    item.gold.get("template").and_then(Value::as_str)
}

/// One row as an item.
fn item(file: &Path, record: &Record) -> Result<Item> {
    let source = Source { file: file.to_path_buf(), line: record.line };
    let text_field = |key: &str| match record.fields.get(key) {
        None | Some(Value::Null) => Ok(""),
        Some(Value::String(s)) => Ok(s.as_str()),
        Some(_) => Err(source.error(format!("field {key:?} is not a string"))),
    };
    let solution = match record.fields.get("solution") {
        Some(Value::String(s)) => s.as_str(),
        Some(_) => return Err(source.error("field \"solution\" is not a string")),
        None => return Err(source.error("missing field \"solution\"")),
    };
    let op = record.int_field(file, "op")?;
    let text = compose_text(text_field("problem")?, text_field("question")?, solution)
        .ok_or_else(|| source.error("the row has no text (empty fields, or nothing after \"Answer:\")"))?;
    let id = match record.fields.get("id") {
        Some(Value::String(id)) if !id.is_empty() => id.clone(),
        _ => format!("{}:{}", file.file_name().unwrap_or_default().to_string_lossy(), record.line),
    };
    let template = record.fields.get("template").and_then(Value::as_str);
    Ok(Item {
        id,
        group: format!("op{op}"),
        level: Some(op),
        prompt: prompt_of(&text),
        reference: Some(format!("{text}{EOS}")),
        gold: json!({
            "solution": solution,
            "answer": gold_answer(solution),
            "rl_answer": rl_gold_answer(solution),
            "template": template,
        }),
        source,
    })
}

impl Task for InterplayTask {
    fn name(&self) -> &str {
        "interplay"
    }

    fn items(&self, path: &Path) -> Result<Items> {
        let file = path.to_path_buf();
        Ok(Box::new(jsonl_records(path)?.map(move |record| item(&file, &record?))))
    }

    /// Answer exact match: the tagged answer against the gold answer (`eval_checkpoints.py`).
    fn evaluate(&self, response: &str, item: &Item) -> f64 {
        f64::from(u8::from(exact_match(&extract_tagged_answer(response), answer(item))))
    }

    fn reward(&self, config: &RewardConfig) -> Result<Box<dyn Reward>> {
        Ok(match *config {
            RewardConfig::Outcome => Box::new(OutcomeReward),
            RewardConfig::Process { answer_weight, step_weight, zero_on_process_mismatch, value_tolerance } => {
                // (A NaN or infinite weight made every correct answer's reward NaN, and its
                // group's advantages with it.)
                let numbers = [("answer_weight", answer_weight), ("step_weight", step_weight), ("value_tolerance", value_tolerance)];
                if let Some((key, value)) = numbers.into_iter().find(|(_, v)| !(v.is_finite() && *v >= 0.0)) {
                    return Err(crate::error::Error::InvalidInput(format!("[reward] {key} must be a finite number >= 0 (got {value})")));
                }
                Box::new(ProcessVerifiedReward(ProcessRewardConfig {
                    answer_weight,
                    step_weight,
                    value_tolerance,
                    zero_on_process_mismatch,
                }))
            }
            #[cfg(feature = "code")]
            RewardConfig::Code { .. } => {
                return Err(crate::error::Error::InvalidInput("Interplay has no code reward (use kind = \"outcome\" or \"process\")".into()));
            }
        })
    }

    /// Generation for evaluation stops at `</answer>` (the reference's vLLM stop string).
    fn stop_strings(&self) -> Vec<String> {
        vec!["</answer>".to_owned()]
    }

    /// `op{N}-<count>.jsonl` (or `op{N}.jsonl`) of `dir` for each op of `ops`, in that order.
    fn files(&self, dir: Option<&Path>, ops: &[u32], files: &[PathBuf]) -> Result<Vec<PathBuf>> {
        match (dir, ops) {
            (Some(dir), []) => jsonl_files(dir),
            (Some(dir), ops) => op_files(dir, ops),
            (None, _) => Ok(files.to_vec()),
        }
    }

    /// Ops 2–10 are in-distribution, as in the release (its pre-training mixtures' range).
    fn id_max_level(&self) -> Option<i64> {
        Some(i64::from(ID_MAX_OP))
    }
}

/// The release's in-distribution ops end here ([`Task::id_max_level`]).
pub const ID_MAX_OP: u32 = 10;

/// The files `op{N}-….jsonl` (or `op{N}.jsonl`) of `dir` for each op of `ops`, in that order.
pub fn op_files(dir: &Path, ops: &[u32]) -> Result<Vec<PathBuf>> {
    let files = jsonl_files(dir)?;
    ops.iter()
        .map(|op| {
            let matches = |p: &&PathBuf| {
                let name = p.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
                name == format!("op{op}.jsonl") || name.starts_with(&format!("op{op}-"))
            };
            let found: Vec<&PathBuf> = files.iter().filter(matches).collect();
            match found.as_slice() {
                [one] => Ok((*one).clone()),
                [] => Err(Error::data(dir, None, format!("no file for op {op} (expected op{op}-<count>.jsonl)"))),
                _ => Err(Error::data(dir, None, format!("several files for op {op}: {found:?}"))),
            }
        })
        .collect()
}

/// 1 when the extracted answer equals the gold answer as a string, else 0
/// (`verl/dataset.py::compute_score`).
#[derive(Debug, Clone, Copy)]
pub struct OutcomeReward;

impl Reward for OutcomeReward {
    fn score(&self, response: &str, item: &Item) -> f64 {
        outcome_reward(response, rl_answer(item))
    }
}

/// Outcome and reasoning-graph agreement, gated on the answer
/// (`verl/reward_fn.py::compute_score_with_step_process`).
#[derive(Debug, Clone, Copy)]
pub struct ProcessVerifiedReward(pub ProcessRewardConfig);

impl Reward for ProcessVerifiedReward {
    fn score(&self, response: &str, item: &Item) -> f64 {
        process_reward(response, rl_answer(item), Some(solution(item)), &self.0).score
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn rows() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/interplay/rows")
    }

    #[test]
    fn items_carry_the_prompt_reference_and_gold_of_each_row() {
        let task = InterplayTask;
        let items: Vec<Item> = task.items(&rows().join("op2.jsonl")).unwrap().take(3).collect::<Result<_>>().unwrap();
        let first = &items[0];
        assert_eq!((first.group.as_str(), first.level, first.source.line), ("op2", Some(2), 1));
        assert!(first.prompt.starts_with("<question> ") && first.prompt.ends_with("</question> <solution>"));
        let reference = first.reference.as_deref().unwrap();
        assert!(reference.starts_with(&first.prompt) && reference.ends_with("</answer>[EOS]"));
        assert_eq!(answer(first), gold_answer(solution(first)));
        assert!(!answer(first).is_empty());
        // The gold completion is a correct response, and a wrong answer is not.
        let completion = &reference[first.prompt.len()..];
        assert_eq!(task.evaluate(completion, first), 1.0);
        assert_eq!(task.evaluate(" </solution> <answer> -1 </answer>", first), 0.0);
        for config in [RewardConfig::Outcome, RewardConfig::Process { answer_weight: 1.0, step_weight: 0.0, zero_on_process_mismatch: true, value_tolerance: 1e-6 }] {
            assert_eq!(task.reward(&config).unwrap().score(completion, first), 1.0, "{config:?}");
        }
        for (answer_weight, step_weight, value_tolerance) in [(f64::NAN, 0.5, 0.0), (0.5, f64::INFINITY, 0.0), (0.5, 0.5, -1.0)] {
            let config = RewardConfig::Process { answer_weight, step_weight, zero_on_process_mismatch: false, value_tolerance };
            assert!(task.reward(&config).is_err_and(|e| e.to_string().contains("must be a finite number >= 0")), "{config:?}");
        }
        let ids: std::collections::HashSet<&str> = items.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids.len(), 3, "ids are distinct: {ids:?}");
    }

    #[test]
    fn bad_rows_name_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("op2-1.jsonl");
        for (contents, expected) in [
            ("{\"op\": 2, \"problem\": 1, \"solution\": \"Answer: 3.\"}\n", "line 1: field \"problem\" is not a string"),
            ("\n{\"op\": 2}\n", "line 2: missing field \"solution\""),
            ("{\"op\": \"two\", \"solution\": \"Answer: 3.\"}\n", "line 1: field \"op\" is not an integer"),
            ("{\"op\": 2, \"solution\": \"x Answer:\"}\n", "line 1: the row has no text"),
        ] {
            std::fs::write(&path, contents).unwrap();
            let e = InterplayTask.items(&path).unwrap().find_map(Result::err).unwrap().to_string();
            assert!(e.contains("op2-1.jsonl") && e.contains(expected), "{e}");
        }
        // Missing problem and question read as empty, as `load_eval_rows` reads them.
        std::fs::write(&path, "{\"op\": 2, \"solution\": \"so a = 3. Answer: 3.\", \"id\": \"x\"}\n").unwrap();
        let item = InterplayTask.items(&path).unwrap().next().unwrap().unwrap();
        assert_eq!((item.id.as_str(), item.prompt.as_str()), ("x", "<solution>"));
        assert_eq!(template(&item), None);
    }
}
