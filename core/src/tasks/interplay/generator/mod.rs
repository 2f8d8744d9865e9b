//! The problem generator (`docs/interplay.md` §2.2–2.4): `forward_generator.drawAll`
//! ("normalforward") and `reverse_generator.drawAllEquan` ("forwardreverse") at d = 2,
//! `number_range = 5`, no modulus, `ip_max = 20`, `force = True`, with the op → op_max schedule of
//! `generate_zero_context_medium.py`.
//!
//! [`draw_problem`] is one attempt of the reference with `oplist = [op]`: it consumes the same
//! random draws as the Python code and fails where the Python code raises, so with the same
//! streams it produces the same problems. The one exception is the reference's own
//! nondeterminism: it iterates a Python `set` of structure nodes, whose order follows memory
//! addresses, where kiln uses insertion order (with which Python gives byte-identical rows).
//! Callers retry failed attempts.

mod linear;
mod necessary;
mod params;
pub mod rng;
mod sentences;
mod skip;
mod solution;
mod structure;
mod unnecessary;
mod vocab;

use thiserror::Error;

use self::params::{DepGraph, Id, Kind, Params, RNG};
pub use self::rng::{NpRandom, PyRandom, RngError};
pub use self::vocab::Template;

/// Largest value a node on the solution path may take (`detectnegative`).
const MAX_VALUE: i64 = 1000;
/// `ip_max`.
const IP_MAX: i64 = 20;
/// `number_range`: constants are drawn from 1..=4.
const NUMBER_RANGE: i64 = 5;

/// The two generation modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// `normalforward`: compute the last node forward.
    Forward,
    /// `forwardreverse`: one leaf is the unknown `x`, the last node's value is given, and the
    /// solution solves a linear equation.
    Reverse,
}

impl Mode {
    /// Both modes, in the reference's order.
    pub const ALL: [Mode; 2] = [Mode::Forward, Mode::Reverse];

    /// The mode's name in rows (`mode` field).
    pub fn name(self) -> &'static str {
        match self {
            Mode::Forward => "normalforward",
            Mode::Reverse => "forwardreverse",
        }
    }
}

/// The two random streams the reference draws from: Python's `random` and NumPy's.
#[derive(Debug, Clone)]
pub struct Rngs {
    /// `random.*`.
    pub py: PyRandom,
    /// `np.random.*`.
    pub np: NpRandom,
}

impl Rngs {
    /// `random.seed(seed); np.random.seed(seed)`.
    pub fn seeded(seed: u32) -> Self {
        Rngs {
            py: PyRandom::new(u64::from(seed)),
            np: NpRandom::new(seed),
        }
    }
}

/// Why an attempt produced no problem (where the reference raises).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Rejection {
    /// A random draw Python refuses (empty range, oversized sample).
    #[error(transparent)]
    Rng(#[from] RngError),
    /// A step of the reference fails (an assertion or a `ValueError`).
    #[error("{0}")]
    Invalid(&'static str),
    /// The solution has a different number of operations than requested.
    #[error("the solution has {0} operations")]
    WrongOp(usize),
    /// A value on the solution path is negative, a non-total zero, or above 1000.
    #[error("a value on the solution path is out of range")]
    OutOfRange,
}

/// One generated problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Shuffled problem sentences, each followed by `". "`.
    pub problem: String,
    /// The question.
    pub question: String,
    /// The gold trace.
    pub solution: String,
    /// Number of operations of the solution.
    pub op: u32,
}

/// `OP_TO_OPMAX` of `generate_zero_context_medium.py`: the `op_max` (and `strictline`) used for
/// each target op, `None` outside 2..=20.
pub fn op_max_for(op: u32) -> Option<i64> {
    Some(match op {
        2 | 3 => 3,
        4 => 4,
        5 | 6 => 6,
        7..=9 => 10,
        10 | 11 => 15,
        12..=15 => 20,
        16..=18 => 25,
        19 | 20 => 30,
        _ => return None,
    })
}

/// `num_op(topo)`: dependency edges on the solution path, the RNG counted as a parent.
fn num_op(params: &Params, topo: &[Id]) -> usize {
    topo.iter().map(|&p| params[p].edge_from.len()).sum()
}

/// `detectnegative` / `detectoutlyer`.
fn out_of_range(params: &Params, topo: &[Id]) -> Result<bool, Rejection> {
    for &p in topo {
        let value = params[p]
            .value
            .ok_or(Rejection::Invalid("a value is None"))?;
        let name = &params[p].name;
        let zero_ok = name.contains("average") || name.contains("total") || name.contains("all");
        if value < 0 || (value == 0 && !zero_ok) || value > MAX_VALUE {
            return Ok(true);
        }
    }
    Ok(false)
}

/// `oneparameterquery`: the last instance on the path with no parent but the RNG.
fn unknown_of(params: &Params, topo: &[Id]) -> Result<Id, Rejection> {
    topo.iter()
        .rev()
        .copied()
        .find(|&p| {
            params[p].kind == Kind::Instance
                && (params[p].edge_from.is_empty() || params[p].edge_from == [RNG])
        })
        .ok_or(Rejection::Invalid("no parameter is found"))
}

/// The sizes of `drawAll`/`drawAllEquan` for `force = True`: `(s, n, m, w0, w1, e)`.
fn sizes(
    rngs: &mut Rngs,
    mode: Mode,
    op_max: i64,
) -> Result<(i64, i64, i64, usize, usize, i64), Rejection> {
    let s = (op_max + 1) / 2; // `strictline` halves op_max; `force` then fixes s to it
    rngs.py.randint(1, s)?;
    rngs.py.randint(1, s)?;
    let n = rngs.py.randint(1, s)?.max(rngs.py.randint(1, s)?);
    let m = rngs.py.randint(n, s)?;
    let rel = (s - 1) as f64 / (IP_MAX - 1) as f64;
    let weights: Vec<f64> = [0.1, 0.3, 0.5, 0.7, 0.9]
        .iter()
        .map(|c| (-(rel - c).powf(2.0)).exp())
        .collect();
    let sum: f64 = weights.iter().sum();
    let p: Vec<f64> = weights.iter().map(|w| w / sum).collect();
    let mut t0 = rngs.np.choice_p(&p) + 1;
    let mut t1 = rngs.np.choice_p(&p) + 1;
    if s <= 5 {
        (t0, t1) = match mode {
            Mode::Forward => (t0.max(2), t1.max(2)),
            Mode::Reverse => (t0.min(3), t1.min(3)),
        };
    }
    let (w0, w1) = (t0.min(t1), t0.max(t1));
    let a = rngs.py.randint(w0 as i64, IP_MAX)?;
    let b = rngs.py.randint(w0 as i64, IP_MAX)?;
    let e = a.min(b).min((w1 * w1) as i64);
    Ok((s, n, m, w0, w1, e))
}

/// One attempt of `drawAll` (forward) or `drawAllEquan` (reverse) with the parameters of
/// `generate_zero_context_medium.py` and `oplist = [op]`.
pub fn draw_problem(
    rngs: &mut Rngs,
    mode: Mode,
    template: Template,
    op: u32,
) -> Result<Problem, Rejection> {
    let strictline = op_max_for(op).ok_or(Rejection::Invalid("op outside 2..=20"))?;
    let (s, n, m, w0, w1, e) = sizes(rngs, mode, strictline)?;
    let structure = structure::draw_structure(rngs, e, w0, w1, template)?;
    let mut params = Params::new();
    let (mut abstracts, instances) = necessary::all_parameters(&mut params, &structure)?;
    let mut graph: DepGraph =
        necessary::draw_necessary1(rngs, &params, &mut abstracts, &instances, n, m)?;
    let mut topo = necessary::draw_necessary2(rngs, &mut params, &mut graph, mode)?;
    if topo.len() == 2 && rngs.py.random() < 0.5 {
        necessary::add_parameter(rngs, &mut params, &mut graph, &mut topo, &instances);
    }
    if !necessary::is_topo(&params, &topo) {
        return Err(Rejection::Invalid("not a topological order"));
    }
    necessary::draw_necessary3(rngs, &mut params, &mut graph, &topo, s)?;
    unnecessary::draw_unnecessary(rngs, &mut params, &mut graph, &abstracts, &instances)?;

    let unknown = match mode {
        Mode::Forward => None,
        Mode::Reverse => Some(unknown_of(&params, &topo)?),
    };
    // The op is fixed by now; the reference only checks it after writing the texts.
    let ops = num_op(&params, &topo);
    if ops != op as usize {
        skip::skip_texts(rngs, &params, &graph, &topo, mode, unknown)?;
        return Err(Rejection::WrongOp(ops));
    }
    let mut sentences =
        sentences::problem_sentences(rngs, &mut params, &graph, NUMBER_RANGE, unknown)?;
    let asked = unknown.unwrap_or(*topo.last().expect("non-empty order"));
    let question = sentences::question(&params[asked].name);
    let solution = solution::solution_text(rngs, &mut params, &topo, mode, unknown)?;
    sentences.extend(solution.known_value_sentence);
    if out_of_range(&params, &topo)? {
        return Err(Rejection::OutOfRange);
    }
    // `ops > strictline` cannot happen once `ops == op <= strictline`.
    rngs.py.shuffle(&mut sentences);
    let problem: String = sentences.iter().map(|s| format!("{s}. ")).collect();
    Ok(Problem {
        problem,
        question,
        solution: solution.text,
        op,
    })
}
