//! The score report of `score_dependency_graphs.py`: per-file and aggregate counters, and
//! per-template counters that, like Python's `defaultdict(int)`, list keys in the order they
//! were first incremented.

use crate::io::pyjson::Json;

/// The counters of one scored file, in the reference's key order.
pub const COUNTERS: [&str; 11] = [
    "total",
    "missing_solution",
    "missing_gold",
    "parse_fail",
    "perfect",
    "value_mismatch",
    "dependency_mismatch",
    "answer_mismatch",
    "extra_nodes",
    "missing_nodes",
    "perfect_with_extra",
];

/// Counters in first-increment order (Python's `defaultdict(int)`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters(Vec<(String, i64)>);

impl Counters {
    /// Adds `by` to `key`.
    pub fn add(&mut self, key: &str, by: i64) {
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v += by,
            None => self.0.push((key.to_owned(), by)),
        }
    }

    /// The counters in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, i64)> {
        self.0.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// The value of `key` (0 when never incremented).
    pub fn get(&self, key: &str) -> i64 {
        self.0.iter().find(|(k, _)| k == key).map_or(0, |(_, v)| *v)
    }

    /// The counters as a JSON object, in order.
    pub fn to_json(&self) -> Json {
        Json::Object(
            self.0
                .iter()
                .map(|(k, v)| (k.clone(), Json::Int(*v)))
                .collect(),
        )
    }
}

/// Per-template counters, templates in first-seen order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TemplateStats(Vec<(String, Counters)>);

impl TemplateStats {
    /// Adds `by` to `key` of `template`.
    pub fn add(&mut self, template: &str, key: &str, by: i64) {
        let i = match self.0.iter().position(|(t, _)| t == template) {
            Some(i) => i,
            None => {
                self.0.push((template.to_owned(), Counters::default()));
                self.0.len() - 1
            }
        };
        self.0[i].1.add(key, by);
    }

    /// Merges `other` into `self` (in `other`'s order).
    pub fn merge(&mut self, other: &TemplateStats) {
        for (template, counters) in &other.0 {
            for (key, v) in &counters.0 {
                self.add(template, key, *v);
            }
        }
    }

    /// The per-template counters as a JSON object, in order.
    pub fn to_json(&self) -> Json {
        Json::Object(
            self.0
                .iter()
                .map(|(t, c)| (t.clone(), c.to_json()))
                .collect(),
        )
    }
}

/// The result of scoring one generations file.
#[derive(Debug, Clone)]
pub struct FileReport {
    /// `str(generated_file)`.
    pub file: String,
    /// The counters of [`COUNTERS`].
    pub counters: Counters,
    /// Whether an existing results file made the scorer skip this file.
    pub skipped: bool,
    /// Gold graphs no sample of this file matched.
    pub unused_gold_entries: i64,
    /// Per-template counters.
    pub template_stats: TemplateStats,
    /// `str(results_path)`.
    pub results_path: String,
}

impl FileReport {
    /// The `per_file` entry of the score report.
    pub fn to_json(&self) -> Json {
        let mut fields = vec![("file".to_owned(), Json::from(self.file.as_str()))];
        fields.extend(
            COUNTERS
                .iter()
                .map(|k| (k.to_string(), Json::Int(self.counters.get(k)))),
        );
        if self.skipped {
            fields.push(("skipped".into(), Json::Bool(true)));
        } else {
            fields.push((
                "unused_gold_entries".into(),
                Json::Int(self.unused_gold_entries),
            ));
            fields.push(("template_stats".into(), self.template_stats.to_json()));
        }
        fields.push((
            "results_path".into(),
            Json::from(self.results_path.as_str()),
        ));
        Json::Object(fields)
    }
}
