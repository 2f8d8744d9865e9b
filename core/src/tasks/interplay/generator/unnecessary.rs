//! Distractors (`drawUnnecessary`): every remaining item of the structure graph joins the
//! problem with 1–4 random parents, from an independent list or from the graph so far.

use super::params::{DepGraph, Id, Kind, Params, RNG};
use super::{Rejection, Rngs};

/// `drawUnnecessary(G, remaining_abstracts, all_instances)`.
pub fn draw_unnecessary(
    rngs: &mut Rngs,
    params: &mut Params,
    graph: &mut DepGraph,
    abstracts: &[Id],
    instances: &[Id],
) -> Result<(), Rejection> {
    let mut remaining: Vec<Id> = instances
        .iter()
        .copied()
        .filter(|i| !graph.instances.contains(i))
        .collect();
    let mut independent: Vec<Id> = Vec::new();
    while !remaining.is_empty() {
        // Totals computable from parameters already in the graph.
        let computable = abstracts.iter().copied().filter(|&a| {
            params[a].edge_from.iter().any(|&c| match params[c].kind {
                Kind::Abstract => graph.abstracts.contains(&c),
                Kind::Instance => graph.instances.contains(&c),
                Kind::Rng => false,
            })
        });
        let known: Vec<Id> = graph
            .abstracts
            .iter()
            .chain(&graph.instances)
            .copied()
            .chain(computable)
            .collect();
        let selected = remaining.remove(rngs.py.randint(0, remaining.len() as i64 - 1)? as usize);
        graph.instances.push(selected);

        let mut pool = if rngs.py.random() < 0.5 {
            let pool = independent.iter().copied().chain([RNG]).collect();
            independent.push(selected);
            pool
        } else {
            known.into_iter().chain([RNG]).collect::<Vec<_>>()
        };
        let mut dep = 1usize;
        while dep < pool.len().min(4) {
            if rngs.py.random() < 0.5 {
                dep += 1;
            } else {
                break;
            }
        }
        let parents: Vec<Id> = if dep == pool.len() {
            pool
        } else {
            let mut parents = Vec::new();
            if rngs.py.random() < 0.5 {
                parents.push(RNG);
                dep -= 1;
            }
            pool.retain(|&p| p != RNG);
            parents.extend(
                rngs.py
                    .sample(pool.len(), dep)?
                    .into_iter()
                    .map(|k| pool[k]),
            );
            parents
        };
        for parent in parents {
            match params[parent].kind {
                Kind::Abstract if !graph.abstracts.contains(&parent) => {
                    graph.add_abstract(params, parent)
                }
                Kind::Instance if !graph.instances.contains(&parent) => {
                    graph.instances.push(parent)
                }
                _ => {}
            }
            graph.add_edge(params, parent, selected);
            remaining.retain(|&r| r != parent);
        }
        remaining.retain(|r| !graph.instances.contains(r));
    }
    Ok(())
}
