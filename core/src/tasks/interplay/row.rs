//! One task row, in the reference's JSONL schema (`docs/interplay.md` §2.1).

use serde::Deserialize;

use crate::io::pyjson::{Json, Style};

/// A generated problem: `{problem, question, solution, op, id, template, mode, length, d}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Row {
    /// Shuffled problem sentences, each ending in `". "`.
    pub problem: String,
    /// The question sentence.
    pub question: String,
    /// The gold trace, ending in `Answer: <int>.`.
    pub solution: String,
    /// Number of operations.
    pub op: u32,
    /// Row identifier (the reference's is not unique; kiln writes `op<N>-<index>`).
    #[serde(default)]
    pub id: Option<String>,
    /// `crazy_zootopia`, `teachers_in_school` or `movie_festival_awards`.
    pub template: String,
    /// `normalforward` or `forwardreverse`.
    pub mode: String,
}

impl Row {
    /// The JSONL line (compact, UTF-8), with the reference's constant `length` and `d` fields.
    pub fn to_json_line(&self) -> String {
        Json::object([
            ("problem", Json::from(self.problem.as_str())),
            ("question", Json::from(self.question.as_str())),
            ("solution", Json::from(self.solution.as_str())),
            ("op", Json::Int(i64::from(self.op))),
            ("id", Json::from(self.id.clone())),
            ("template", Json::from(self.template.as_str())),
            ("mode", Json::from(self.mode.as_str())),
            ("length", Json::from("zero_context")),
            ("d", Json::Int(2)),
        ])
        .dumps(Style::COMPACT_UTF8)
    }
}

/// `solution.split("Answer: ")[-1].strip().rstrip(".")` (`eval_checkpoints.py`).
pub fn gold_answer(solution: &str) -> String {
    let tail = solution.rsplit("Answer: ").next().unwrap_or(solution);
    super::pystr::strip(tail).trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gold_answer_like_eval_checkpoints() {
        assert_eq!(gold_answer("Define a as b; so b = 3. Answer: 12."), "12");
        assert_eq!(gold_answer("no marker."), "no marker");
    }
}
