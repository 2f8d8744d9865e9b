//! Getting the program out of a completion (spec code-sft.md §8.5 and §7).
//!
//! - [`Extraction::Lcb`]: LiveCodeBench's `extract_code` (also lighteval's): split on `"\n"`,
//!   find the lines that *contain* "```", and return the lines strictly between the **last two**
//!   of them, or `""` with fewer than two. Any language tag or none; the last block wins; on a
//!   truncated output whose last block is unclosed, the prose between the last two fences is
//!   what comes out. A sample "has code" iff the result is non-empty.
//! - [`Extraction::OpenR1`]: OpenR1's reward-time `extract_code`: the last match of
//!   ```` ```python\n(.*?)``` ```` (dot matches newline), or `""`. It needs that exact tag and the
//!   newline: ```` ```py ````, ```` ```Python ```` and untagged blocks give nothing.

use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

/// The extraction rule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Extraction {
    /// LiveCodeBench / lighteval: between the last two fence lines (evaluation).
    #[default]
    Lcb,
    /// OpenR1 rewards: the last ```` ```python ```` block.
    OpenR1,
}

impl Extraction {
    /// The code of `completion`; `""` means no code.
    pub fn extract(self, completion: &str) -> String {
        match self {
            Extraction::Lcb => lcb_extract_code(completion),
            Extraction::OpenR1 => openr1_extract_code(completion),
        }
    }
}

/// LiveCodeBench `extract_code(model_output, lmstyle)` for chat styles.
pub fn lcb_extract_code(completion: &str) -> String {
    let lines: Vec<&str> = completion.split('\n').collect();
    let fences: Vec<usize> = lines.iter().enumerate().filter(|(_, l)| l.contains("```")).map(|(i, _)| i).collect();
    match fences[..] {
        [.., open, close] => lines[open + 1..close].join("\n"),
        _ => String::new(),
    }
}

/// OpenR1 `extract_code(completion, language="python")`.
pub fn openr1_extract_code(completion: &str) -> String {
    static PYTHON_BLOCK: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(?s)```python\n(.*?)```").expect("valid regex"));
    PYTHON_BLOCK
        .captures_iter(completion)
        .last()
        .map(|c| c[1].to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_rules_match_the_reference_implementations() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/code/extract_cases.jsonl");
        let text = std::fs::read_to_string(path).unwrap();
        let mut cases = 0;
        let mut disagreements = 0;
        for line in text.lines() {
            let case: serde_json::Value = serde_json::from_str(line).unwrap();
            let completion = case["completion"].as_str().unwrap();
            assert_eq!(Extraction::Lcb.extract(completion), case["lcb"].as_str().unwrap(), "LCB on {completion:?}");
            assert_eq!(Extraction::OpenR1.extract(completion), case["openr1"].as_str().unwrap(), "OpenR1 on {completion:?}");
            disagreements += (case["lcb"] != case["openr1"]) as usize;
            cases += 1;
        }
        assert_eq!(cases, 32);
        assert!(disagreements > 10, "the table exercises where the two rules differ");
    }

    #[test]
    fn the_truncated_last_block_yields_prose_under_lcb() {
        let completion = "```python\nprint(1)\n```\nThen explain.\n```python\nprint(2)";
        assert_eq!(lcb_extract_code(completion), "Then explain.");
        assert_eq!(openr1_extract_code(completion), "print(1)\n");
    }
}
