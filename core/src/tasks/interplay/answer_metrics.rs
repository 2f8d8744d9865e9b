//! Answer-only metrics of a generations file: the `<checkpoint>_metrics.json` that
//! `eval_checkpoints.py` writes (`docs/interplay.md` §8.1): exact-match accuracy, mean response
//! length and the unbiased pass@k, for ID (op ≤ threshold), OOD and their union, per op and per
//! template.
//!
//! Loss fields are written as the reference writes them under `--skip-loss` (0.0 and `{}`)
//! unless teacher-forced losses are given ([`SplitLoss`]).

use std::collections::HashMap;
use std::path::Path;

use crate::metrics::exact::int_ratio_to_f64;
use crate::io::jsonl_records_reported;
use crate::io::python::py_str;
use crate::metrics::passk::pass_series;
use crate::io::pyjson::Json;
use crate::error::Result;

/// The templates `eval_checkpoints.py` groups by (its `--group-by-template` default).
pub const TEMPLATES: [&str; 3] = [
    "crazy_zootopia",
    "teachers_in_school",
    "movie_festival_awards",
];

/// The fields of one generation record the metrics use.
#[derive(Debug, Clone)]
pub struct Sample {
    /// `op` as a string.
    pub op: String,
    /// `__idx`, the prompt's position in its ID or OOD list.
    pub idx: i64,
    /// 0 or 1.
    pub exact_match: i64,
    /// Response length in tokens.
    pub resp_tokens: i64,
    /// The row template, if any.
    pub template: Option<String>,
}

/// Reads the samples of a generations file; a record lacking one of the fields is an error
/// naming file and line.
pub fn read_samples(path: &Path) -> Result<Vec<Sample>> {
    let mut samples = Vec::new();
    for record in jsonl_records_reported(path, "reading")? {
        let record = record?;
        samples.push(Sample {
            op: record
                .fields
                .get("op")
                .map_or_else(|| "unknown".to_owned(), |v| py_str(Some(v))),
            idx: record.int_field(path, "__idx")?,
            exact_match: record.int_field(path, "exact_match")?,
            resp_tokens: record.int_field(path, "resp_tokens")?,
            template: record
                .fields
                .get("template")
                .and_then(|t| t.as_str())
                .map(str::to_owned),
        });
    }
    Ok(samples)
}

/// Teacher-forced losses of one split: every example's mean token loss, summed overall and per
/// op (ops in first-seen order), as `eval_loss_per_op` accumulates them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SplitLoss {
    /// Sum of the per-example losses.
    pub sum: f64,
    /// Number of examples.
    pub count: u64,
    /// `(op, sum, count)` per op.
    pub per_op: Vec<(String, f64, u64)>,
}

impl SplitLoss {
    /// Adds one example of `op` whose mean token loss is `loss`.
    pub fn push(&mut self, op: &str, loss: f64) {
        self.sum += loss;
        self.count += 1;
        match self.per_op.iter_mut().find(|(o, _, _)| o == op) {
            Some((_, sum, count)) => {
                *sum += loss;
                *count += 1;
            }
            None => self.per_op.push((op.to_owned(), loss, 1)),
        }
    }

    /// `sum / count`, 0 without examples.
    fn mean(&self) -> f64 {
        if self.count == 0 { 0.0 } else { self.sum / self.count as f64 }
    }

    /// `per_op_avg_loss`.
    fn per_op_json(&self) -> Json {
        Json::Object(
            self.per_op
                .iter()
                .map(|(op, sum, count)| {
                    let mean = if *count == 0 { 0.0 } else { sum / *count as f64 };
                    (op.clone(), Json::Float(mean))
                })
                .collect(),
        )
    }

    /// `self` followed by `other`, ops merged (`merge_two_loss`).
    fn merged(&self, other: &SplitLoss) -> SplitLoss {
        let mut out = self.clone();
        out.sum += other.sum;
        out.count += other.count;
        for (op, sum, count) in &other.per_op {
            match out.per_op.iter_mut().find(|(o, _, _)| o == op) {
                Some((_, s, c)) => {
                    *s += sum;
                    *c += count;
                }
                None => out.per_op.push((op.clone(), *sum, *count)),
            }
        }
        out
    }
}

/// The teacher-forced losses of a checkpoint's ID and OOD rows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Losses {
    pub id: SplitLoss,
    pub ood: SplitLoss,
}

/// Keyed values in first-insertion order (a Python dict).
struct Ordered<V> {
    entries: Vec<(String, V)>,
    index: HashMap<String, usize>,
}

impl<V> Default for Ordered<V> {
    fn default() -> Self {
        Ordered {
            entries: Vec::new(),
            index: HashMap::new(),
        }
    }
}

impl<V: Default> Ordered<V> {
    fn new() -> Self {
        Self::default()
    }

    fn entry(&mut self, key: &str) -> &mut V {
        let i = match self.index.get(key) {
            Some(&i) => i,
            None => {
                self.index.insert(key.to_owned(), self.entries.len());
                self.entries.push((key.to_owned(), V::default()));
                self.entries.len() - 1
            }
        };
        &mut self.entries[i].1
    }
}

/// Per-op generation counts (`per_op` of the generation stats).
#[derive(Default, Clone, Copy)]
struct OpCounts {
    total: i64,
    correct: i64,
    resp_tokens: i64,
}

/// `(samples, successes)` per prompt key, per op.
type OpPassCounts = Ordered<Ordered<(u64, u64)>>;

/// `_aggregate_pass_counts`: `(samples, successes)` per prompt key, overall and per op.
fn pass_counts(samples: &[(String, &Sample)]) -> (Vec<(u64, u64)>, OpPassCounts) {
    let mut overall: Ordered<(u64, u64)> = Ordered::new();
    let mut per_op: OpPassCounts = Ordered::new();
    for (key, sample) in samples {
        let em = u64::from(sample.exact_match != 0);
        let c = overall.entry(key);
        *c = (c.0 + 1, c.1 + em);
        let c = per_op.entry(&sample.op).entry(key);
        *c = (c.0 + 1, c.1 + em);
    }
    (
        overall.entries.into_iter().map(|(_, c)| c).collect(),
        per_op,
    )
}

fn pass_json(series: &[(u64, f64)]) -> Json {
    Json::Object(
        series
            .iter()
            .map(|(k, v)| (format!("pass@{k}"), Json::Float(*v)))
            .collect(),
    )
}

fn per_op_pass(per_op: &OpPassCounts, sample_k: u64) -> Json {
    Json::Object(
        per_op
            .entries
            .iter()
            .map(|(op, counts)| {
                let counts: Vec<(u64, u64)> = counts.entries.iter().map(|(_, c)| *c).collect();
                (op.clone(), pass_json(&pass_series(&counts, Some(sample_k))))
            })
            .collect(),
    )
}

fn ratio(a: i64, b: i64) -> f64 {
    if b == 0 {
        0.0
    } else {
        int_ratio_to_f64(i128::from(a), i128::from(b)).expect("non-zero")
    }
}

fn op_map(per_op: &Ordered<OpCounts>, f: impl Fn(&OpCounts) -> f64) -> Json {
    Json::Object(
        per_op
            .entries
            .iter()
            .map(|(op, c)| (op.clone(), Json::Float(f(c))))
            .collect(),
    )
}

/// `_template_metrics(records, key_prefix)`.
fn template_metrics(samples: &[(String, &Sample)], sample_k: u64) -> Json {
    let (counts, per_op) = pass_counts(samples);
    let resp: i64 = samples.iter().map(|(_, s)| s.resp_tokens).sum();
    let correct: i64 = samples.iter().map(|(_, s)| s.exact_match).sum();
    let n = samples.len() as i64;
    Json::object([
        ("count", Json::Int(n)),
        ("correct", Json::Int(correct)),
        ("answer_accuracy", Json::Float(ratio(correct, n))),
        ("avg_response_len", Json::Float(ratio(resp, n))),
        ("resp_tokens_sum", Json::Int(resp)),
        (
            "pass_at_k",
            pass_json(&pass_series(&counts, Some(sample_k))),
        ),
        ("per_op_pass_at_k", per_op_pass(&per_op, sample_k)),
    ])
}

/// One split (ID or OOD): the samples sorted by `__idx` (stably) and their counts.
struct Split<'a> {
    name: &'static str,
    sorted: Vec<&'a Sample>,
    per_op: Ordered<OpCounts>,
    count: i64,
    correct: i64,
    resp_tokens: i64,
}

impl<'a> Split<'a> {
    fn new(name: &'static str, samples: Vec<&'a Sample>) -> Self {
        let mut per_op: Ordered<OpCounts> = Ordered::new();
        for s in &samples {
            let c = per_op.entry(&s.op);
            c.total += 1;
            c.correct += s.exact_match;
            c.resp_tokens += s.resp_tokens;
        }
        let count = samples.len() as i64;
        let correct = samples.iter().map(|s| s.exact_match).sum();
        let resp_tokens = samples.iter().map(|s| s.resp_tokens).sum();
        let mut sorted = samples;
        sorted.sort_by_key(|s| s.idx);
        Split {
            name,
            sorted,
            per_op,
            count,
            correct,
            resp_tokens,
        }
    }

    fn keyed(&self, prefix: &str) -> Vec<(String, &'a Sample)> {
        self.sorted
            .iter()
            .map(|s| (format!("{prefix}{}", s.idx), *s))
            .collect()
    }

    fn by_template(&self, template: &str) -> Vec<&'a Sample> {
        self.sorted
            .iter()
            .copied()
            .filter(|s| s.template.as_deref() == Some(template))
            .collect()
    }

    fn metrics(&self, sample_k: u64, loss: Option<&SplitLoss>) -> Json {
        let (counts, per_op) = pass_counts(&self.keyed(&format!("{}:", self.name)));
        let avg_len = if self.count == 0 {
            0.0
        } else {
            self.resp_tokens as f64 / self.count as f64
        };
        let per_template = TEMPLATES.iter().map(|t| {
            let samples: Vec<(String, &Sample)> = self
                .by_template(t)
                .into_iter()
                .map(|s| (format!("{}:{t}:{}", self.name, s.idx), s))
                .collect();
            (t.to_string(), template_metrics(&samples, sample_k))
        });
        Json::object([
            (
                "answer_accuracy",
                Json::Float(ratio(self.correct, self.count)),
            ),
            ("avg_response_len", Json::Float(avg_len)),
            ("avg_loss", Json::Float(loss.map_or(0.0, SplitLoss::mean))),
            ("count", Json::Int(self.count)),
            ("validation_metrics", Json::object::<String>([])),
            (
                "pass_at_k",
                pass_json(&pass_series(&counts, Some(sample_k))),
            ),
            ("per_op_pass_at_k", per_op_pass(&per_op, sample_k)),
            (
                "per_op_accuracy",
                op_map(&self.per_op, |c| ratio(c.correct, c.total)),
            ),
            (
                "per_op_avg_response_len",
                op_map(&self.per_op, |c| ratio(c.resp_tokens, c.total)),
            ),
            ("per_op_avg_loss", loss_per_op(loss)),
            (
                "per_op_length",
                op_map(&self.per_op, |c| ratio(c.resp_tokens, c.total)),
            ),
            ("per_op_loss", loss_per_op(loss)),
            ("per_template", Json::Object(per_template.collect())),
        ])
    }
}

fn loss_per_op(loss: Option<&SplitLoss>) -> Json {
    loss.map_or_else(|| Json::object::<String>([]), SplitLoss::per_op_json)
}

/// The metrics JSON of `checkpoint` for `samples`. Samples whose op parses as an integer above
/// `id_op_threshold` are OOD, the rest ID; `sample_k` caps the ks (`--sample-k`).
pub fn answer_metrics(
    checkpoint: &str,
    samples: &[Sample],
    id_op_threshold: i64,
    sample_k: u64,
) -> Json {
    answer_metrics_with_loss(checkpoint, samples, id_op_threshold, sample_k, None)
}

/// [`answer_metrics`] with the `avg_loss` / `per_op_avg_loss` fields filled from `losses`.
pub fn answer_metrics_with_loss(
    checkpoint: &str,
    samples: &[Sample],
    id_op_threshold: i64,
    sample_k: u64,
    losses: Option<&Losses>,
) -> Json {
    let is_ood = |s: &Sample| {
        s.op.trim()
            .parse::<i64>()
            .is_ok_and(|op| op > id_op_threshold)
    };
    let id = Split::new("id", samples.iter().filter(|s| !is_ood(s)).collect());
    let ood = Split::new("ood", samples.iter().filter(|s| is_ood(s)).collect());

    let (id_counts, id_per_op) = pass_counts(&id.keyed("id:"));
    let (ood_counts, ood_per_op) = pass_counts(&ood.keyed("ood:"));
    let total_counts: Vec<(u64, u64)> = id_counts.iter().chain(&ood_counts).copied().collect();
    let mut total_per_op: OpPassCounts = Ordered::new();
    for (op, counts) in id_per_op.entries.iter().chain(&ood_per_op.entries) {
        let merged = total_per_op.entry(op);
        for (key, c) in &counts.entries {
            *merged.entry(key) = *c;
        }
    }
    let mut merged_ops: Ordered<OpCounts> = Ordered::new();
    for (op, c) in id.per_op.entries.iter().chain(&ood.per_op.entries) {
        let m = merged_ops.entry(op);
        m.total += c.total;
        m.correct += c.correct;
        m.resp_tokens += c.resp_tokens;
    }
    let total_template = TEMPLATES.iter().map(|t| {
        let samples: Vec<(String, &Sample)> = id
            .by_template(t)
            .into_iter()
            .map(|s| (format!("total:{t}:id_{}", s.idx), s))
            .chain(
                ood.by_template(t)
                    .into_iter()
                    .map(|s| (format!("total:{t}:ood_{}", s.idx), s)),
            )
            .collect();
        (t.to_string(), template_metrics(&samples, sample_k))
    });
    let total_loss = losses.map(|l| l.id.merged(&l.ood));
    Json::object([
        ("checkpoint", Json::from(checkpoint)),
        ("id", id.metrics(sample_k, losses.map(|l| &l.id))),
        ("ood", ood.metrics(sample_k, losses.map(|l| &l.ood))),
        (
            "total",
            Json::object([
                (
                    "answer_accuracy",
                    Json::Float(ratio(id.correct + ood.correct, id.count + ood.count)),
                ),
                ("avg_loss", Json::Float(total_loss.as_ref().map_or(0.0, SplitLoss::mean))),
                ("count", Json::Int(id.count + ood.count)),
                (
                    "validation_metrics",
                    Json::object([
                        ("id", Json::object::<String>([])),
                        ("ood", Json::object::<String>([])),
                    ]),
                ),
                (
                    "pass_at_k",
                    pass_json(&pass_series(&total_counts, Some(sample_k))),
                ),
                ("per_op_pass_at_k", per_op_pass(&total_per_op, sample_k)),
                (
                    "per_op_accuracy",
                    op_map(&merged_ops, |c| ratio(c.correct, c.total)),
                ),
                (
                    "per_op_avg_response_len",
                    op_map(&merged_ops, |c| ratio(c.resp_tokens, c.total)),
                ),
                ("per_op_avg_loss", loss_per_op(total_loss.as_ref())),
                (
                    "per_op_length",
                    op_map(&merged_ops, |c| ratio(c.resp_tokens, c.total)),
                ),
                ("per_op_loss", loss_per_op(total_loss.as_ref())),
                ("per_template", Json::Object(total_template.collect())),
            ]),
        ),
    ])
}
