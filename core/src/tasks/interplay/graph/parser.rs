//! `SolutionParser.parse` and `build_graph`.

use std::collections::{BTreeSet, HashMap};
use std::sync::LazyLock;

use regex::Regex;

use super::pyeval::eval_float;
use super::{Graph, Node};
use crate::io::pyjson::float_repr;
use crate::tasks::interplay::pystr::{
    SPACE_CLASS as S, collapse_whitespace, is_space, parse_float, strip,
};

static ASSIGNMENT: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(&format!(r"([A-Za-z]){S}*={S}*([^.;]+)")).expect("valid regex"));
static NUMBER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"[-+]?\d+(?:\.\d+)?").expect("valid regex"));
static DEFINE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"(?is)Define{S}+(.*?){S}+(?:as|a){S}+(?:[A-Za-z]+{S}+)*([A-Za-z]);"
    ))
    .expect("valid regex")
});
static DEFINE_WORD: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(&format!(r"(?i)\bDefine{S}+")).expect("valid regex"));
static TAG: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"<[^>]+>").expect("valid regex"));
static ANSWER_TAG: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(r"(?i)<answer>{S}*([-+]?\d+(?:\.\d+)?)")).expect("valid regex")
});
static ANSWER_MARKER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(r"Answer:{S}*([-+]?\d+(?:\.\d+)?)")).expect("valid regex")
});

/// One `Define … as X; …` step.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Normalised parameter name.
    pub name: String,
    /// The variable letter.
    pub variable: String,
    /// Names of the parameters the step's assignments to its variable read.
    pub dependencies: BTreeSet<String>,
    /// The parsed value.
    pub value: Option<f64>,
    /// Right-most sides of the assignments to the step's own variable.
    pub expressions: Vec<String>,
}

/// `ParsedSolution`.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// One entry per `Define` match, duplicates kept.
    pub steps: Vec<Step>,
    /// The stated answer (`<answer> N`, else `Answer: N`).
    pub answer: Option<f64>,
    /// Text before the first `Define`.
    pub preamble: String,
}

impl Parsed {
    /// `build_graph`: one node per step name (a later step with the same name replaces the
    /// earlier one in place).
    pub fn graph(&self) -> Graph {
        let mut graph = Graph {
            answer: self.answer,
            ..Graph::default()
        };
        for step in &self.steps {
            graph.insert(Node {
                name: step.name.clone(),
                variable: Some(step.variable.clone()),
                value: step.value,
                dependencies: step.dependencies.clone(),
            });
        }
        graph
    }
}

/// `SolutionParser().parse(raw)`.
pub fn parse(raw: &str) -> Parsed {
    let answer = extract_answer(raw);
    let cleaned = TAG.replace_all(raw, "");
    let cleaned = strip(&cleaned);
    let Some(first) = DEFINE.find(cleaned) else {
        return Parsed {
            steps: Vec::new(),
            answer,
            preamble: cleaned.to_owned(),
        };
    };
    let preamble = strip(&cleaned[..first.start()]).to_owned();
    let body = &cleaned[first.start()..];
    let matches: Vec<regex::Captures<'_>> = DEFINE.captures_iter(body).collect();

    let mut state = State::default();
    let mut steps = Vec::with_capacity(matches.len());
    for (i, m) in matches.iter().enumerate() {
        let whole = m.get(0).expect("group 0");
        let name = normalize_name(&collapse_whitespace(&m[1]));
        let variable = strip(&m[2]).to_owned();
        let end = matches
            .get(i + 1)
            .map_or(body.len(), |next| next.get(0).expect("group 0").start());
        let raw_body = strip_answer_tail(strip(&body[whole.end()..end]));
        steps.push(state.process_step(name, variable, raw_body));
    }

    // Post-pass over a live dict of final values.
    for step in &mut steps {
        if step.value.is_none() {
            step.value = step
                .expressions
                .iter()
                .rev()
                .find_map(|e| state.evaluate(e, &HashMap::new()));
        }
        if step.value.is_none() {
            step.value = state.values.get(&step.variable).copied();
        }
        if let Some(v) = step.value {
            state.values.insert(step.variable.clone(), v);
        }
    }
    Parsed {
        steps,
        answer,
        preamble,
    }
}

/// Parser state across the steps of one solution.
#[derive(Default)]
struct State {
    /// Variable → parameter name, for steps already processed.
    var_to_param: HashMap<String, String>,
    /// Known values of parameters and intermediates.
    values: HashMap<String, f64>,
}

impl State {
    fn process_step(&mut self, name: String, variable: String, raw_body: &str) -> Step {
        let mut step = Step {
            name,
            variable,
            dependencies: BTreeSet::new(),
            value: None,
            expressions: Vec::new(),
        };
        let mut inter_deps: HashMap<String, BTreeSet<String>> = HashMap::new();
        let mut inter_values: HashMap<String, f64> = HashMap::new();
        let mut last: Option<f64> = None;
        for m in ASSIGNMENT.captures_iter(raw_body) {
            let target = m[1].to_owned();
            let expr = strip(&m[2]);
            let expr_eval = strip(expr.rsplit('=').next().unwrap_or(expr));
            let deps = self.collect_dependencies(expr, &inter_deps);
            if target == step.variable {
                step.dependencies.extend(deps);
                if !expr_eval.is_empty() {
                    step.expressions.push(expr_eval.to_owned());
                }
            } else {
                inter_deps.entry(target.clone()).or_default().extend(deps);
            }
            let value = self
                .evaluate(expr_eval, &inter_values)
                .or_else(|| last_number(&m[0]));
            if let Some(v) = value {
                inter_values.insert(target.clone(), v);
                self.values.insert(target.clone(), v);
                if target == step.variable {
                    last = Some(v);
                }
            }
        }
        if last.is_none() {
            last = last_number(raw_body);
            if let Some(v) = last {
                self.values.insert(step.variable.clone(), v);
            }
        }
        step.value = last;
        self.var_to_param
            .insert(step.variable.clone(), step.name.clone());
        step
    }

    /// Every ASCII letter of `expr` (letters inside words included) that names an earlier step
    /// or an intermediate contributes its parameters.
    fn collect_dependencies(
        &self,
        expr: &str,
        inter_deps: &HashMap<String, BTreeSet<String>>,
    ) -> BTreeSet<String> {
        let mut deps = BTreeSet::new();
        for letter in expr.chars().filter(char::is_ascii_alphabetic) {
            let key = letter.to_string();
            if let Some(param) = self.var_to_param.get(&key) {
                deps.insert(param.clone());
            }
            if let Some(inner) = inter_deps.get(&key) {
                deps.extend(inner.iter().cloned());
            }
        }
        deps
    }

    /// `_evaluate_expression`: substitute every letter by its known value (`None` if one is
    /// unknown) and evaluate the result as Python arithmetic.
    fn evaluate(&self, expr: &str, inter_values: &HashMap<String, f64>) -> Option<f64> {
        let lookup = |letter: char| {
            let key = letter.to_string();
            inter_values
                .get(&key)
                .or_else(|| self.values.get(&key))
                .copied()
        };
        let chars: Vec<char> = expr.chars().collect();
        if chars
            .iter()
            .any(|&c| c.is_ascii_alphabetic() && lookup(c).is_none())
        {
            return None;
        }
        // Non-ASCII text can never evaluate: it either fails the allowed-characters check or is
        // whitespace Python's tokenizer rejects.
        if !expr.is_ascii() {
            return None;
        }
        let word = |i: usize| {
            chars
                .get(i)
                .is_some_and(|c| c.is_ascii_alphanumeric() || *c == '_')
        };
        let mut substituted = String::with_capacity(expr.len() + 8);
        for (i, &c) in chars.iter().enumerate() {
            let standalone = c.is_ascii_alphabetic() && !(i > 0 && word(i - 1)) && !word(i + 1);
            match lookup(c).filter(|_| standalone) {
                Some(v) => substituted.push_str(&float_repr(v)),
                None => substituted.push(c),
            }
        }
        let substituted = strip(&substituted);
        let allowed = |c: char| c.is_ascii_digit() || "+-*/(). ".contains(c) || is_space(c);
        if substituted.is_empty() || !substituted.chars().all(allowed) {
            return None;
        }
        eval_float(substituted)
    }
}

/// `_normalize_parameter_name`.
fn normalize_name(name: &str) -> String {
    let cleaned = collapse_whitespace(name).replace('\u{fffd}', "");
    let cleaned = cleaned.trim_matches([' ', '.', ';']);
    let tail = DEFINE_WORD
        .find_iter(cleaned)
        .last()
        .map_or(cleaned, |m| &cleaned[m.end()..]);
    tail.trim_matches([' ', '.', ';']).to_owned()
}

/// `_strip_answer_tail`: cut at the first `Answer:`.
fn strip_answer_tail(body: &str) -> &str {
    strip(body.find("Answer:").map_or(body, |i| &body[..i]))
}

/// `_extract_last_number`.
fn last_number(text: &str) -> Option<f64> {
    NUMBER
        .find_iter(text)
        .last()
        .and_then(|m| parse_float(m.as_str()))
}

/// `_extract_answer`.
fn extract_answer(solution: &str) -> Option<f64> {
    let m = ANSWER_TAG
        .captures(solution)
        .or_else(|| ANSWER_MARKER.captures(solution))?;
    parse_float(&m[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_solution() {
        let p = parse(
            "Define adult wolf in Maple Creek as q; so q = 4. Define adult deer in Maple Creek as e; d = q = 4; so e = 2 * d = 2 * 4 = 8. Define total number of adult animals in Maple Creek as W; so W = e + q = 8 + 4 = 12. </solution> <answer> 12",
        );
        assert_eq!(p.answer, Some(12.0));
        let names: Vec<_> = p
            .steps
            .iter()
            .map(|s| (s.name.as_str(), s.value, s.dependencies.len()))
            .collect();
        assert_eq!(
            names,
            vec![
                ("adult wolf in Maple Creek", Some(4.0), 0),
                ("adult deer in Maple Creek", Some(8.0), 1),
                (
                    "total number of adult animals in Maple Creek",
                    Some(12.0),
                    2
                )
            ]
        );
    }

    #[test]
    fn names_and_fallbacks() {
        assert_eq!(
            normalize_name("x. Define adult owl in X ."),
            "adult owl in X"
        );
        let p = parse("Define a b as c; so c = 1 / 0. Answer: 3");
        assert_eq!(p.steps[0].value, Some(0.0));
        assert_eq!(p.answer, Some(3.0));
        let p = parse("no steps here");
        assert!(p.steps.is_empty());
        assert_eq!(p.preamble, "no steps here");
    }
}
