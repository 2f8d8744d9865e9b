//! The model-facing text format (`docs/interplay.md` §2.5): `compose_text`, the prompt (up to and
//! including `<solution>`) and the completion ending in `[EOS]`.

use super::pystr::{first_line, strip};
use super::row::Row;

/// The end-of-sequence marker appended (without a space) to training text.
pub const EOS: &str = "[EOS]";

/// `utils/text_preprocess.py::compose_text`:
/// `<question> pq </question> <solution> body </solution> <answer> a </answer>`.
///
/// `None` where the reference returns `None` (all fields empty) or raises (a solution whose
/// `Answer:` is followed by nothing).
pub fn compose_text(problem: &str, question: &str, solution: &str) -> Option<String> {
    let (problem, question, solution) = (strip(problem), strip(question), strip(solution));
    if problem.is_empty() && question.is_empty() && solution.is_empty() {
        return None;
    }
    let (body, answer) = split_solution(solution)?;
    let pq = strip(&format!("{problem} {question}")).to_owned();
    let mut parts: Vec<&str> = Vec::new();
    if !pq.is_empty() {
        parts.extend(["<question>", &pq, "</question>"]);
    }
    if !body.is_empty() {
        parts.extend(["<solution>", body, "</solution>"]);
    }
    if !answer.is_empty() {
        parts.extend(["<answer>", answer, "</answer>"]);
    }
    let text = strip(&parts.join(" ")).to_owned();
    (!text.is_empty()).then_some(text)
}

/// `_split_solution`: body before the last `Answer:`, and the answer's first line without
/// trailing dots. `None` where Python raises (nothing after `Answer:`).
fn split_solution(solution: &str) -> Option<(&str, &str)> {
    if solution.is_empty() {
        return Some(("", ""));
    }
    match solution.rsplit_once("Answer:") {
        None => Some((strip(solution), "")),
        Some((pre, ans)) => {
            let answer = strip(first_line(strip(ans))?).trim_end_matches('.');
            Some((strip(pre), answer))
        }
    }
}

/// The three views of a row's text used for training and evaluation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskText {
    /// `compose_text(row) + "[EOS]"`: the pre-training / SFT text.
    pub text: String,
    /// `compose_text(row).split("<solution>")[0] + "<solution>"`: the RL and evaluation prompt.
    pub prompt: String,
    /// `text[len(prompt):]`: `" <body> </solution> <answer> a </answer>[EOS]"`.
    pub completion: String,
}

impl TaskText {
    /// The texts of `row`; `None` where [`compose_text`] gives none.
    pub fn of(row: &Row) -> Option<TaskText> {
        let composed = compose_text(&row.problem, &row.question, &row.solution)?;
        let prompt = prompt_of(&composed);
        let text = format!("{composed}{EOS}");
        let completion = text
            .get(prompt.len()..)
            .filter(|_| text.starts_with(&prompt))
            .unwrap_or("")
            .to_owned();
        Some(TaskText {
            text,
            prompt,
            completion,
        })
    }
}

/// `text.split("<solution>")[0] + "<solution>"`.
pub fn prompt_of(text: &str) -> String {
    let head = text.split("<solution>").next().unwrap_or("");
    format!("{head}<solution>")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_example() {
        let row = Row {
            problem: "The number of adult owl in Jefferson Circus equals 2. ".into(),
            question: "What is the total number of adult animals in Jefferson Circus?".into(),
            solution: "Define adult owl in Jefferson Circus as g; so g = 2. Define total number of adult animals in Jefferson Circus as O; so O = g = 2. Answer: 2.".into(),
            op: 2,
            id: None,
            template: "crazy_zootopia".into(),
            mode: "normalforward".into(),
        };
        let t = TaskText::of(&row).unwrap();
        assert_eq!(
            t.text,
            "<question> The number of adult owl in Jefferson Circus equals 2. What is the total number of adult animals in Jefferson Circus? </question> <solution> Define adult owl in Jefferson Circus as g; so g = 2. Define total number of adult animals in Jefferson Circus as O; so O = g = 2. </solution> <answer> 2 </answer>[EOS]"
        );
        assert!(t.prompt.ends_with("</question> <solution>"));
        assert_eq!(format!("{}{}", t.prompt, t.completion), t.text);
        assert!(t.completion.starts_with(" Define"));
        assert_eq!(compose_text("", "", ""), None);
        assert_eq!(compose_text("p", "q", "x Answer:"), None);
    }
}
