//! Properties of generated rows over every op, mode and template: the op recounted from the
//! problem's stated dependencies equals the requested op, every gold solution is graph-perfect
//! against its own gold graph, and surface statistics stay within the reference's spread
//! (`tests/fixtures/interplay/rows`). Run with `--nocapture` to see the statistics side by side.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::LazyLock;

use regex::Regex;

use super::dataset::{Seen, Split, generate_rows};
use super::golden_tests::{fixture, golden_rows};
use super::graph::parse;
use super::row::Row;
use super::text::TaskText;

/// Rows per op in these tests (3,800 in all).
const PER_OP: usize = 200;

static GENERATED: LazyLock<Vec<Row>> = LazyLock::new(|| {
    let taken = Seen::default();
    (2..=20)
        .flat_map(|op| {
            generate_rows(Split::Test, 42, op, PER_OP, &taken, || {})
                .unwrap()
                .0
        })
        .collect()
});

/// What one problem sentence says about its subject.
#[derive(Debug, Clone, PartialEq)]
enum Statement {
    /// `<subject> equals …`: the named parents and whether a constant is involved.
    Equals {
        parents: Vec<String>,
        constant: bool,
    },
    /// `<subject> exists, and its number is greater than 0` (equation mode's unknown).
    Exists,
}

fn name_of(phrase: &str) -> String {
    let phrase = phrase
        .strip_prefix("the ")
        .or_else(|| phrase.strip_prefix("The "))
        .unwrap_or(phrase);
    phrase
        .strip_prefix("number of ")
        .unwrap_or(phrase)
        .to_owned()
}

fn parents_of(rhs: &str) -> Vec<String> {
    if let Some(list) = rhs.strip_prefix("the sum of ") {
        if let Some((head, last)) = list.split_once(", and ") {
            return head.split(", ").chain([last]).map(name_of).collect();
        }
        let (a, b) = list.split_once(" and ").expect("two summands");
        return vec![name_of(a), name_of(b)];
    }
    if let Some(pair) = rhs.strip_prefix("the difference between ") {
        let (a, b) = pair.split_once(" and ").expect("two operands");
        return vec![name_of(a), name_of(b)];
    }
    vec![name_of(rhs)]
}

static CONSTANT_FIRST: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^(\d+)(?: (plus|times) (.*))?$").unwrap());

fn statements(problem: &str) -> Vec<(String, Statement)> {
    problem
        .strip_suffix(". ")
        .unwrap()
        .split(". ")
        .map(|sentence| {
            if let Some(subject) =
                sentence.strip_suffix(" exists, and its number is greater than 0")
            {
                return (name_of(subject), Statement::Exists);
            }
            let (subject, rhs) = sentence.split_once(" equals ").expect("an equals sentence");
            let statement = match CONSTANT_FIRST.captures(rhs) {
                Some(c) => Statement::Equals {
                    parents: c.get(3).map(|r| parents_of(r.as_str())).unwrap_or_default(),
                    constant: true,
                },
                None => Statement::Equals {
                    parents: parents_of(rhs),
                    constant: false,
                },
            };
            (name_of(subject), statement)
        })
        .collect()
}

static DEFINE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"Define (.+?) as ([A-Za-z]); ").unwrap());

/// The op of a row recounted from its text: for every parameter the solution defines, the
/// parents its problem sentence names, plus one for a random constant; a total counts the items
/// of its category. `None` when a defined parameter has no sentence of its own (the reference
/// overwrites the sentence of an item whose second-to-last summand is the unknown).
fn recount_op(row: &Row) -> Option<usize> {
    let statements = statements(&row.problem);
    let mut by_subject: HashMap<&str, Vec<&Statement>> = HashMap::new();
    for (subject, statement) in &statements {
        by_subject.entry(subject).or_default().push(statement);
    }
    let defines: Vec<regex::Captures<'_>> = DEFINE.captures_iter(&row.solution).collect();
    let reverse = row.mode == "forwardreverse";
    let mut op = 0;
    for (i, define) in defines.iter().enumerate() {
        let (name, variable) = (&define[1], &define[2]);
        if let Some(category) = name.strip_prefix("total number of ") {
            let category = category.rsplit(" in ").next().unwrap();
            let items: HashSet<&str> = statements
                .iter()
                .map(|(s, _)| s.as_str())
                .filter(|s| {
                    !s.starts_with("total number of ") && s.rsplit(" in ").next() == Some(category)
                })
                .collect();
            op += items.len();
            continue;
        }
        if reverse && variable == "x" {
            op += 1; // the unknown: a leaf drawn from the RNG
            continue;
        }
        let mut own: Vec<&Statement> = by_subject
            .get(name)?
            .iter()
            .copied()
            .filter(|s| matches!(s, Statement::Equals { .. }))
            .collect();
        if reverse && i + 1 == defines.len() {
            // Equation mode states the last node's value (`equals <value>`); its own sentence
            // is the other one.
            let stated = own.iter().position(
                |s| matches!(s, Statement::Equals { parents, .. } if parents.is_empty()),
            )?;
            own.remove(stated);
        }
        if let Statement::Equals { parents, constant } = own.first()? {
            op += parents.len() + usize::from(*constant);
        }
    }
    Some(op)
}

/// Recounts every row; returns how many could not be recounted.
fn check_recount(rows: &[Row]) -> usize {
    let mut hidden = 0;
    for row in rows {
        match recount_op(row) {
            Some(op) => assert_eq!(op, row.op as usize, "{row:?}"),
            None => hidden += 1,
        }
    }
    hidden
}

#[test]
fn op_recounted_from_the_problem_equals_the_requested_op() {
    let golden: Vec<Row> = golden_rows()
        .into_iter()
        .flat_map(|(_, rows)| rows)
        .collect();
    let (ours, theirs) = (check_recount(&GENERATED), check_recount(&golden));
    let (rate_ours, rate_theirs) = (
        ours as f64 / GENERATED.len() as f64,
        theirs as f64 / golden.len() as f64,
    );
    println!(
        "op recount: equal for every recountable row; {ours}/{} kiln rows and {theirs}/{} reference rows hide a \
         defined parameter's sentence ({:.1}% / {:.1}%)",
        GENERATED.len(),
        golden.len(),
        100.0 * rate_ours,
        100.0 * rate_theirs
    );
    assert!((rate_ours - rate_theirs).abs() < 0.05);
}

#[test]
fn every_gold_solution_is_perfect_against_its_own_gold_graph() {
    let mut cells: HashSet<(u32, &str, &str)> = HashSet::new();
    for row in GENERATED.iter() {
        let gold = parse(&row.solution).graph();
        let completion = TaskText::of(row).unwrap().completion;
        let output = completion.split("</answer>").next().unwrap();
        let report = gold.compare(&parse(output).graph(), 1e-6);
        assert!(
            report.is_perfect() && report.extra_in_pred.is_empty(),
            "{report:?} {row:?}"
        );
        cells.insert((row.op, row.mode.as_str(), row.template.as_str()));
    }
    assert_eq!(cells.len(), 19 * 2 * 3);
}

/// Per-op surface statistics of a set of rows.
#[derive(Debug, Default)]
struct Stats {
    rows: usize,
    prompt_tokens: Vec<usize>,
    completion_tokens: Vec<usize>,
    sentences: Vec<usize>,
    answers: Vec<i64>,
    total_questions: usize,
    forms: BTreeMap<&'static str, usize>,
}

fn form(statement: &Statement) -> &'static str {
    match statement {
        Statement::Exists => "exists",
        Statement::Equals { parents, constant } => match (parents.len(), constant) {
            (0, _) => "constant",
            (1, false) => "copy",
            (_, true) => "constant-op",
            (2, false) => "two",
            _ => "many",
        },
    }
}

fn stats(rows: &[Row], tokenizer: &crate::tokenizer::Tokenizer) -> BTreeMap<u32, Stats> {
    let mut out: BTreeMap<u32, Stats> = BTreeMap::new();
    for row in rows {
        let s = out.entry(row.op).or_default();
        let text = TaskText::of(row).unwrap();
        s.rows += 1;
        s.prompt_tokens
            .push(tokenizer.encode(&text.prompt).unwrap().len());
        s.completion_tokens
            .push(tokenizer.encode(&text.completion).unwrap().len());
        let statements = statements(&row.problem);
        s.sentences.push(statements.len());
        for (_, st) in &statements {
            *s.forms.entry(form(st)).or_default() += 1;
        }
        s.answers
            .push(super::row::gold_answer(&row.solution).parse().unwrap());
        s.total_questions += usize::from(row.question.starts_with("What is the total"));
    }
    out
}

fn mean<T: Copy + Into<f64>>(v: &[T]) -> f64 {
    v.iter().map(|&x| x.into()).sum::<f64>() / v.len() as f64
}

fn range<T: Copy + Ord + std::fmt::Display>(v: &[T]) -> String {
    format!("{}-{}", v.iter().min().unwrap(), v.iter().max().unwrap())
}

#[test]
fn surface_statistics_match_the_reference_rows() {
    let tokenizer = crate::tokenizer::Tokenizer::from_file(fixture("qwen2_100M")).unwrap();
    let golden: Vec<Row> = golden_rows()
        .into_iter()
        .flat_map(|(_, rows)| rows)
        .collect();
    let (ours, theirs) = (stats(&GENERATED, &tokenizer), stats(&golden, &tokenizer));
    println!(
        "op | prompt tokens mean (range) kiln / ref | completion tokens kiln / ref | sentences kiln / ref | answer mean (range) kiln / ref | total-questions % kiln / ref"
    );
    for (op, a) in &ours {
        let b = &theirs[op];
        let (ans_a, ans_b) = (
            a.answers.iter().map(|&x| x as f64).collect::<Vec<f64>>(),
            b.answers.iter().map(|&x| x as f64).collect::<Vec<f64>>(),
        );
        println!(
            "{op:2} | {:6.1} ({}) / {:6.1} ({}) | {:6.1} ({}) / {:6.1} ({}) | {:4.1} / {:4.1} | {:6.1} ({}) / {:6.1} ({}) | {:3.0} / {:3.0}",
            mean(
                &a.prompt_tokens
                    .iter()
                    .map(|&x| x as u32)
                    .collect::<Vec<_>>()
            ),
            range(&a.prompt_tokens),
            mean(
                &b.prompt_tokens
                    .iter()
                    .map(|&x| x as u32)
                    .collect::<Vec<_>>()
            ),
            range(&b.prompt_tokens),
            mean(
                &a.completion_tokens
                    .iter()
                    .map(|&x| x as u32)
                    .collect::<Vec<_>>()
            ),
            range(&a.completion_tokens),
            mean(
                &b.completion_tokens
                    .iter()
                    .map(|&x| x as u32)
                    .collect::<Vec<_>>()
            ),
            range(&b.completion_tokens),
            mean(&a.sentences.iter().map(|&x| x as u32).collect::<Vec<_>>()),
            mean(&b.sentences.iter().map(|&x| x as u32).collect::<Vec<_>>()),
            mean(&ans_a),
            range(&a.answers),
            mean(&ans_b),
            range(&b.answers),
            100.0 * a.total_questions as f64 / a.rows as f64,
            100.0 * b.total_questions as f64 / b.rows as f64,
        );
        // Loose bounds: the reference has 24 rows per op.
        let close = |x: f64, y: f64, rel: f64| (x - y).abs() <= rel * y;
        let m = |v: &[usize]| mean(&v.iter().map(|&x| x as u32).collect::<Vec<_>>());
        assert!(
            close(m(&a.prompt_tokens), m(&b.prompt_tokens), 0.3),
            "op {op} prompt tokens"
        );
        assert!(
            close(m(&a.completion_tokens), m(&b.completion_tokens), 0.2),
            "op {op} completion tokens"
        );
        assert!(
            close(m(&a.sentences), m(&b.sentences), 0.3),
            "op {op} sentences"
        );
        assert!(a.answers.iter().all(|&x| (0..=1000).contains(&x)));
    }
    let share = |s: &BTreeMap<u32, Stats>| {
        let mut forms: BTreeMap<&str, usize> = BTreeMap::new();
        for st in s.values() {
            for (k, v) in &st.forms {
                *forms.entry(k).or_default() += v;
            }
        }
        let total: usize = forms.values().sum();
        forms
            .into_iter()
            .map(|(k, v)| (k, v as f64 / total as f64))
            .collect::<BTreeMap<_, _>>()
    };
    let (fa, fb) = (share(&ours), share(&theirs));
    println!("sentence forms (share of all sentences) kiln / ref:");
    for (k, a) in &fa {
        let b = fb.get(k).copied().unwrap_or(0.0);
        println!("  {k:12} {:.3} / {:.3}", a, b);
        assert!((a - b).abs() < 0.05, "form {k}");
    }
}
