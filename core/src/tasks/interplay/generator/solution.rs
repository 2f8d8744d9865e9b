//! The gold trace (`solution_in_text` of both generators): one `Define <name> as <V>; …` step
//! per node of the topological order, then `Answer: <value>.`; in equation mode the unknown is
//! `x`, values are carried as expressions in `x`, and the trace ends by solving for it.

use super::linear::{Linear, solve};
use super::params::{Id, Kind, Op, Params, RNG};
use super::sentences::standard_name;
use super::{Mode, Rejection, Rngs};

/// The solution text and, in equation mode, the sentence stating the last node's value.
pub struct Solution {
    /// The gold trace.
    pub text: String,
    /// Equation mode: `The <last node> equals <value>`, added to the problem.
    pub known_value_sentence: Option<String>,
}

/// Variable letters not yet used.
struct Letters(Vec<char>);

impl Letters {
    fn new(mode: Mode) -> Self {
        let skip_x = mode == Mode::Reverse;
        Letters(
            ('A'..='Z')
                .chain('a'..='z')
                .filter(|c| !(skip_x && (*c == 'X' || *c == 'x')))
                .collect(),
        )
    }

    /// `random.choice(ch)`, then `ch.remove(...)`.
    fn draw(&mut self, rngs: &mut Rngs) -> Result<char, Rejection> {
        let i = rngs.py.choice(self.0.len())?;
        Ok(self.0.remove(i))
    }
}

fn value(params: &Params, p: Id) -> Result<i64, Rejection> {
    params[p]
        .value
        .ok_or(Rejection::Invalid("a parent has no value"))
}

fn expr(params: &Params, p: Id) -> Result<Linear, Rejection> {
    params[p]
        .expr
        .ok_or(Rejection::Invalid("a parent has no expression"))
}

fn var(params: &Params, p: Id) -> Result<char, Rejection> {
    params[p]
        .variable
        .ok_or(Rejection::Invalid("a parent has no variable"))
}

const OVERFLOW: Rejection = Rejection::Invalid("integer overflow");

/// How one node's value is shown: the number (forward) or the expression in `x` (equation mode).
fn shown(params: &Params, p: Id, mode: Mode) -> Result<String, Rejection> {
    Ok(match mode {
        Mode::Forward => value(params, p)?.to_string(),
        Mode::Reverse => expr(params, p)?.to_string(),
    })
}

/// `solution_in_text(G, topo[, unknown])`.
pub fn solution_text(
    rngs: &mut Rngs,
    params: &mut Params,
    topo: &[Id],
    mode: Mode,
    unknown: Option<Id>,
) -> Result<Solution, Rejection> {
    let mut letters = Letters::new(mode);
    let mut text = String::from(if mode == Mode::Reverse {
        "The question is difficult, so we use equations to solve it. "
    } else {
        ""
    });
    for &item in topo {
        match params[item].kind {
            Kind::Instance => {
                instance_step(rngs, params, item, mode, unknown, &mut letters, &mut text)?
            }
            _ => total_step(rngs, params, item, mode, &mut letters, &mut text)?,
        }
    }
    let last = *topo.last().expect("non-empty order");
    if mode == Mode::Forward {
        text.push_str(&format!("Answer: {}.", value(params, last)?));
        return Ok(Solution {
            text,
            known_value_sentence: None,
        });
    }
    let known = value(params, last)?;
    let lhs = expr(params, last)?;
    let (steps, x) =
        solve(lhs, known).ok_or(Rejection::Invalid("equation too difficult to solve"))?;
    text.push_str(&format!(
        "We know {} = {known}, so we have {lhs} = {known} and we solve it through the following steps: {}. Answer: {x}.",
        var(params, last)?,
        steps.join(". ")
    ));
    if unknown.and_then(|u| params[u].value) != Some(x) {
        return Err(Rejection::Invalid(
            "the solution is not the unknown's value",
        ));
    }
    let sentence = format!("{} equals {known}", standard_name(&params[last].name, true));
    Ok(Solution {
        text,
        known_value_sentence: Some(sentence),
    })
}

fn instance_step(
    rngs: &mut Rngs,
    params: &mut Params,
    item: Id,
    mode: Mode,
    unknown: Option<Id>,
    letters: &mut Letters,
    text: &mut String,
) -> Result<(), Rejection> {
    let pool: Vec<Id> = params[item]
        .edge_from
        .iter()
        .copied()
        .filter(|&p| p != RNG)
        .collect();
    let rng_in = params[item].edge_from.contains(&RNG);
    let so = if rng_in { "" } else { "so " };
    let mut step = String::new();
    match pool.len() {
        0 if mode == Mode::Reverse && unknown == Some(item) => {
            params[item].variable = Some('x');
            params[item].expr = Some(Linear::X);
            step.push_str("we don't know its value yet but will find it out later");
        }
        0 => {
            let c = letters.draw(rngs)?;
            params[item].variable = Some(c);
            params[item].expr = params[item].value.map(Linear::constant);
            step.push_str(&format!("so {c} = {}", shown(params, item, mode)?));
        }
        1 => {
            let c = letters.draw(rngs)?;
            let parent = pool[0];
            params[item].variable = Some(c);
            params[item].value = params[parent].value;
            params[item].expr = params[parent].expr;
            step.push_str(&format!(
                "{so}{c} = {} = {}",
                var(params, parent)?,
                shown(params, item, mode)?
            ));
        }
        2 => {
            let c = letters.draw(rngs)?;
            params[item].variable = Some(c);
            let (a, b) = (pool[0], pool[1]);
            let (va, vb) = (value(params, a)?, value(params, b)?);
            step.push_str(&format!("{so}{c} = "));
            let (symbol, v) = match params[item].notation {
                Some(Op::Plus) => ('+', va.checked_add(vb).ok_or(OVERFLOW)?),
                Some(Op::Minus) => ('-', va.checked_sub(vb).ok_or(OVERFLOW)?),
                _ => return Err(Rejection::Invalid("notation not recognised")),
            };
            params[item].value = Some(v);
            match mode {
                Mode::Forward => step.push_str(&format!(
                    "{} {symbol} {} = {va} {symbol} {vb} = {v}",
                    var(params, a)?,
                    var(params, b)?
                )),
                Mode::Reverse => {
                    let (ea, eb) = (expr(params, a)?, expr(params, b)?);
                    let e = if symbol == '+' {
                        ea.add(eb)
                    } else {
                        ea.sub(eb)
                    }
                    .ok_or(OVERFLOW)?;
                    params[item].expr = Some(e);
                    let shown_parents = if symbol == '+' {
                        format!("{ea} + {eb}")
                    } else {
                        format!("({ea}) - ({eb})")
                    };
                    step.push_str(&format!(
                        "{} {symbol} {} = {shown_parents} = {e}",
                        var(params, a)?,
                        var(params, b)?
                    ));
                }
            }
        }
        n => {
            for &p in &pool {
                value(params, p)?;
            }
            for idx in 1..n {
                let c = letters.draw(rngs)?;
                let (left, right) = if idx == 1 {
                    (pool[0], pool[1])
                } else {
                    (item, pool[idx])
                };
                let (left_var, left_shown) = (var(params, left)?, shown(params, left, mode)?);
                let sum = value(params, left)?
                    .checked_add(value(params, pool[idx])?)
                    .ok_or(OVERFLOW)?;
                let sum_expr = match mode {
                    Mode::Forward => None,
                    Mode::Reverse => Some(
                        expr(params, left)?
                            .add(expr(params, pool[idx])?)
                            .ok_or(OVERFLOW)?,
                    ),
                };
                if idx == n - 1 && !rng_in {
                    step.push_str("so ");
                }
                let right_shown = shown(params, right, mode)?;
                let sum_shown = sum_expr.map_or_else(|| sum.to_string(), |e| e.to_string());
                let end = if idx == n - 1 { "" } else { "; " };
                step.push_str(&format!(
                    "{c} = {left_var} + {} = {left_shown} + {right_shown} = {sum_shown}{end}",
                    var(params, right)?
                ));
                params[item].variable = Some(c);
                params[item].value = Some(sum);
                params[item].expr = sum_expr;
            }
        }
    }
    let constant = params[item].rngv;
    match (rng_in, params[item].rngnot, constant) {
        (true, Some(op), Some(k)) => {
            let c = letters.draw(rngs)?;
            let v = value(params, item)?;
            let (symbol, result) = match op {
                Op::Plus => ('+', k.checked_add(v)),
                _ => ('*', k.checked_mul(v)),
            };
            let result = result.ok_or(OVERFLOW)?;
            let old_var = var(params, item)?;
            match mode {
                Mode::Forward => step.push_str(&format!(
                    "; so {c} = {k} {symbol} {old_var} = {k} {symbol} {v} = {result}. "
                )),
                Mode::Reverse => {
                    let e = expr(params, item)?;
                    let new = if symbol == '+' {
                        e.add(Linear::constant(k))
                    } else {
                        e.scale(k)
                    }
                    .ok_or(OVERFLOW)?;
                    let shown_parts = if symbol == '+' {
                        format!("{k} + {e}")
                    } else {
                        format!("({k}) * ({e})")
                    };
                    step.push_str(&format!(
                        "; so {c} = {k} {symbol} {old_var} = {shown_parts} = {new}. "
                    ));
                    params[item].expr = Some(new);
                }
            }
            params[item].value = Some(result);
            params[item].variable = Some(c);
            text.push_str(&format!("Define {} as {c}; {step}", params[item].name));
        }
        _ => text.push_str(&format!(
            "Define {} as {}; {step}. ",
            params[item].name,
            var(params, item)?
        )),
    }
    Ok(())
}

/// A total: the sum of its items.
fn total_step(
    rngs: &mut Rngs,
    params: &mut Params,
    item: Id,
    mode: Mode,
    letters: &mut Letters,
    text: &mut String,
) -> Result<(), Rejection> {
    let factors = params[item].edge_from.clone();
    if factors.is_empty() {
        return Err(Rejection::Invalid("a total without items"));
    }
    if factors.iter().any(|&f| params[f].kind != Kind::Instance) {
        // A total depending on a total needs a `per` pairing, which only exists at d = 3.
        return Err(Rejection::Invalid(
            "we have to find a pair for a abstract parameter",
        ));
    }
    let mut step = String::new();
    if factors.len() == 1 {
        let f = factors[0];
        value(params, f)?;
        let c = letters.draw(rngs)?;
        step.push_str(&format!(
            "so {c} = {} = {}; ",
            var(params, f)?,
            shown(params, f, mode)?
        ));
        params[item].value = params[f].value;
        params[item].expr = params[f].expr;
        params[item].variable = Some(c);
    } else {
        for (i, &f) in factors.iter().enumerate() {
            let fv = value(params, f)?;
            if params[item].variable.is_none() {
                params[item].variable = Some(var(params, f)?);
                params[item].value = Some(fv);
                params[item].expr = params[f].expr;
                continue;
            }
            let c = letters.draw(rngs)?;
            if i == factors.len() - 1 {
                step.push_str("so ");
            }
            let sum = value(params, item)?.checked_add(fv).ok_or(OVERFLOW)?;
            let sum_expr = match mode {
                Mode::Forward => None,
                Mode::Reverse => Some(expr(params, item)?.add(expr(params, f)?).ok_or(OVERFLOW)?),
            };
            let sum_shown = sum_expr.map_or_else(|| sum.to_string(), |e| e.to_string());
            step.push_str(&format!(
                "{c} = {} + {} = {} + {} = {sum_shown}; ",
                var(params, item)?,
                var(params, f)?,
                shown(params, item, mode)?,
                shown(params, f, mode)?
            ));
            params[item].value = Some(sum);
            params[item].expr = sum_expr;
            params[item].variable = Some(c);
        }
    }
    step.truncate(step.len().saturating_sub(2));
    text.push_str(&format!(
        "Define {} as {}; {step}. ",
        params[item].name,
        var(params, item)?
    ));
    Ok(())
}
