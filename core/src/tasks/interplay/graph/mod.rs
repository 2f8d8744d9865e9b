//! Solution → dependency graph → comparison (`docs/interplay.md` §8.2–8.3): a port of
//! `utils/solution_dependency_graph.py`, quirks included, since gold and predicted graphs are
//! built by the same parser and its quirks are part of the metric.

mod parser;
mod pyeval;

use std::collections::{BTreeSet, HashMap, VecDeque};

use serde_json::Value;

pub use parser::{Parsed, Step, parse};

/// One parameter of a dependency graph.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Parameter name, e.g. `adult owl in Pine Ridge` (the comparison key).
    pub name: String,
    /// The variable letter the solution used (ignored by the comparison).
    pub variable: Option<String>,
    /// Parsed value.
    pub value: Option<f64>,
    /// Names of the parameters this one depends on.
    pub dependencies: BTreeSet<String>,
}

/// `DependencyGraphData`: nodes by name in insertion order (a later node with the same name
/// replaces the earlier one in place, like a Python dict) and the final answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Graph {
    nodes: Vec<Node>,
    index: HashMap<String, usize>,
    /// The answer the solution states.
    pub answer: Option<f64>,
}

/// What `DependencyGraphData.compare` reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Comparison {
    /// Gold node names absent from the prediction (sorted).
    pub missing_in_pred: Vec<String>,
    /// Predicted node names absent from the gold (sorted).
    pub extra_in_pred: Vec<String>,
    /// `(name, gold, pred)` of shared nodes whose values differ by more than the tolerance or
    /// where exactly one side is missing.
    pub value_mismatches: Vec<(String, Option<f64>, Option<f64>)>,
    /// Shared nodes whose dependency name sets differ.
    pub dependency_mismatches: Vec<String>,
    /// `(gold, pred)` when the answers differ.
    pub answer_mismatch: Option<(Option<f64>, Option<f64>)>,
}

impl Comparison {
    /// The strict rule of `score_dependency_graphs.py`: no value, dependency or answer mismatch
    /// and no missing gold node; extra predicted nodes are allowed.
    pub fn is_perfect(&self) -> bool {
        self.value_mismatches.is_empty()
            && self.dependency_mismatches.is_empty()
            && self.answer_mismatch.is_none()
            && self.missing_in_pred.is_empty()
    }
}

impl Graph {
    /// Inserts `node`, replacing (in place) a node of the same name.
    pub fn insert(&mut self, node: Node) {
        match self.index.get(&node.name) {
            Some(&i) => self.nodes[i] = node,
            None => {
                self.index.insert(node.name.clone(), self.nodes.len());
                self.nodes.push(node);
            }
        }
    }

    /// The node called `name`.
    pub fn get(&self, name: &str) -> Option<&Node> {
        self.index.get(name).map(|&i| &self.nodes[i])
    }

    /// The nodes in insertion order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// `DependencyGraphData.from_json` of a gold `graph` object. Values are read as Python's
    /// `float(value)` would (numbers, booleans, numeric strings); anything else is `None`.
    pub fn from_json(payload: &serde_json::Map<String, Value>) -> Result<Graph, String> {
        let mut graph = Graph {
            answer: payload.get("answer").and_then(json_number),
            ..Graph::default()
        };
        let nodes = match payload.get("nodes") {
            None => return Ok(graph),
            Some(Value::Array(nodes)) => nodes,
            Some(_) => return Err("graph \"nodes\" is not a list".into()),
        };
        for node in nodes {
            let name = match node.get("name") {
                Some(Value::String(name)) => name.clone(),
                _ => return Err("a graph node has no string \"name\"".into()),
            };
            let dependencies = match node.get("dependencies") {
                None => BTreeSet::new(),
                Some(Value::Array(deps)) => {
                    deps.iter().map(|d| crate::io::python::py_str(Some(d))).collect()
                }
                Some(_) => return Err(format!("dependencies of node {name:?} are not a list")),
            };
            let variable = node
                .get("variable")
                .and_then(Value::as_str)
                .map(str::to_owned);
            let value = node.get("value").and_then(json_number);
            graph.insert(Node {
                name,
                variable,
                value,
                dependencies,
            });
        }
        Ok(graph)
    }

    /// `DependencyGraphData.compare(other, value_tolerance)`.
    pub fn compare(&self, pred: &Graph, tolerance: f64) -> Comparison {
        let gold_names: BTreeSet<&str> = self.nodes.iter().map(|n| n.name.as_str()).collect();
        let pred_names: BTreeSet<&str> = pred.nodes.iter().map(|n| n.name.as_str()).collect();
        let mut report = Comparison {
            missing_in_pred: gold_names
                .difference(&pred_names)
                .map(|s| s.to_string())
                .collect(),
            extra_in_pred: pred_names
                .difference(&gold_names)
                .map(|s| s.to_string())
                .collect(),
            ..Comparison::default()
        };
        for name in gold_names.intersection(&pred_names) {
            let (gold, pred_node) = (
                self.get(name).expect("shared"),
                pred.get(name).expect("shared"),
            );
            if values_differ(gold.value, pred_node.value, tolerance) {
                report
                    .value_mismatches
                    .push((name.to_string(), gold.value, pred_node.value));
            }
            if gold.dependencies != pred_node.dependencies {
                report.dependency_mismatches.push(name.to_string());
            }
        }
        if values_differ(self.answer, pred.answer, tolerance) {
            report.answer_mismatch = Some((self.answer, pred.answer));
        }
        report
    }

    /// A topological order of the node names (Kahn's algorithm over dependencies inside the
    /// graph), or `None` on a cycle. Any valid order may differ from the reference's, which
    /// depends on Python's set iteration order.
    pub fn topological_order(&self) -> Option<Vec<String>> {
        let mut indegree: Vec<usize> = vec![0; self.nodes.len()];
        let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); self.nodes.len()];
        for (i, node) in self.nodes.iter().enumerate() {
            for dep in &node.dependencies {
                if let Some(&d) = self.index.get(dep) {
                    indegree[i] += 1;
                    dependents[d].push(i);
                }
            }
        }
        let mut queue: VecDeque<usize> = (0..self.nodes.len())
            .filter(|&i| indegree[i] == 0)
            .collect();
        let mut order = Vec::with_capacity(self.nodes.len());
        while let Some(current) = queue.pop_front() {
            order.push(self.nodes[current].name.clone());
            for &follower in &dependents[current] {
                indegree[follower] -= 1;
                if indegree[follower] == 0 {
                    queue.push_back(follower);
                }
            }
        }
        (order.len() == self.nodes.len()).then_some(order)
    }
}

/// `abs(a - b) > tol`, or exactly one side missing (NaN compares as equal, as in Python).
fn values_differ(gold: Option<f64>, pred: Option<f64>, tolerance: f64) -> bool {
    match (gold, pred) {
        (Some(g), Some(p)) => (g - p).abs() > tolerance,
        (None, None) => false,
        _ => true,
    }
}

/// Python's `float(value)` for a JSON value, `None` where it raises or the value is null.
fn json_number(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::Bool(b) => Some(f64::from(u8::from(*b))),
        Value::String(s) => super::pystr::strip(s).parse().ok(),
        _ => None,
    }
}
