//! Problem sentences and the question (`generate_sentence`, `problem_in_text`,
//! `question_in_text`). Drawing a sentence also draws the random constants.

use super::params::{DepGraph, Id, Op, Params, RNG};
use super::{Rejection, Rngs};

/// `standard_name`: `the number of <name>`, or `the <name>` for totals and averages.
pub fn standard_name(name: &str, sentence_begins: bool) -> String {
    let prefix = if sentence_begins { "The " } else { "the " };
    let first = name.split(' ').next().unwrap_or("");
    if first == "average" || first == "total" {
        format!("{prefix}{name}")
    } else {
        format!("{prefix}number of {name}")
    }
}

/// `generate_sentence` for `item`. In equation mode (`unknown` set) the unknown's sentence
/// only says it exists — and so does any sentence whose second-to-last summand is the unknown,
/// because the reference's summand loop rebinds the variable it then compares.
fn sentence(
    rngs: &mut Rngs,
    params: &mut Params,
    item: Id,
    number_range: i64,
    unknown: Option<Id>,
) -> Result<String, Rejection> {
    let mut text = format!("{} equals", standard_name(&params[item].name, true));
    let mut pool = params[item].edge_from.clone();
    if let Some(at) = pool.iter().position(|&p| p == RNG) {
        let plus = rngs.py.random() < 0.5;
        let constant = if plus {
            rngs.py.randint(1, number_range - 1)?
        } else {
            rngs.py.randint(2, number_range - 1)?
        };
        text.push_str(&format!(" {constant}"));
        params[item].value = Some(constant);
        pool.remove(at);
        if !pool.is_empty() {
            params[item].rngv = Some(constant);
            params[item].rngnot = Some(if plus { Op::Plus } else { Op::Times });
            text.push_str(if plus { " plus" } else { " times" });
        }
    }
    let names: Vec<String> = pool
        .iter()
        .map(|&p| standard_name(&params[p].name, false))
        .collect();
    let mut compared = item;
    match pool.len() {
        0 => {
            if !params[item].edge_from.contains(&RNG) {
                let value = rngs.py.randint(1, number_range - 1)?;
                params[item].value = Some(value);
                text.push_str(&format!(" {value}"));
            }
        }
        1 => text.push_str(&format!(" {}", names[0])),
        2 => {
            if rngs.py.random() < 0.5 {
                text.push_str(&format!(" the sum of {} and {}", names[0], names[1]));
                params[item].notation = Some(Op::Plus);
            } else {
                text.push_str(&format!(
                    " the difference between {} and {}",
                    names[0], names[1]
                ));
                params[item].notation = Some(Op::Minus);
            }
        }
        n => {
            text.push_str(&format!(
                " the sum of {}, and {}",
                names[..n - 1].join(", "),
                names[n - 1]
            ));
            compared = pool[n - 2];
        }
    }
    if unknown == Some(compared) {
        let name = standard_name(&params[compared].name, true);
        text = if params[compared].name.split(' ').next() == Some("average") {
            format!("{name} is greater than 0")
        } else {
            format!("{name} exists, and its number is greater than 0")
        };
    }
    Ok(text)
}

/// `problem_in_text`: one sentence per instance parameter of the graph, in graph order.
pub fn problem_sentences(
    rngs: &mut Rngs,
    params: &mut Params,
    graph: &DepGraph,
    number_range: i64,
    unknown: Option<Id>,
) -> Result<Vec<String>, Rejection> {
    graph
        .instances
        .iter()
        .map(|&item| sentence(rngs, params, item, number_range, unknown))
        .collect()
}

/// `question_in_text`: `What is the <total>?` or `How many <item> does <category> have?`.
pub fn question(name: &str) -> String {
    if name.contains("average") || name.contains("total") {
        format!("What is the {name}?")
    } else {
        let category = name.rsplit(" in ").next().unwrap_or(name);
        let object = name.split(" in ").next().unwrap_or(name);
        format!("How many {object} does {category} have?")
    }
}
