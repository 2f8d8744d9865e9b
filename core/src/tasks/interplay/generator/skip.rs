//! A shortcut for attempts whose op is already known to be wrong. The reference builds the
//! problem and solution texts before it checks the op; kiln skips building them but still makes
//! every random draw they would make, so the streams stay in step with the reference.

use super::params::{DepGraph, Id, Kind, Params, RNG};
use super::{Mode, NUMBER_RANGE, Rejection, Rngs};

/// The draws of `problem_in_text` and `solution_in_text`, without the texts.
pub fn skip_texts(
    rngs: &mut Rngs,
    params: &Params,
    graph: &DepGraph,
    topo: &[Id],
    mode: Mode,
    unknown: Option<Id>,
) -> Result<(), Rejection> {
    let split = |item: Id| {
        let edges = &params[item].edge_from;
        let rng_in = edges.contains(&RNG);
        (rng_in, edges.len() - usize::from(rng_in))
    };
    // One sentence per instance: the constant (kind, then value), sum-or-difference, leaf value.
    for &item in &graph.instances {
        let (rng_in, parents) = split(item);
        if rng_in {
            let low = if rngs.py.random() < 0.5 { 1 } else { 2 };
            rngs.py.randint(low, NUMBER_RANGE - 1)?;
        }
        match parents {
            2 => {
                rngs.py.random();
            }
            0 if !rng_in => {
                rngs.py.randint(1, NUMBER_RANGE - 1)?;
            }
            _ => {}
        }
    }
    // One variable letter per defined parameter and per intermediate result.
    let mut available = if mode == Mode::Reverse { 50 } else { 52 };
    for &item in topo {
        let letters = match params[item].kind {
            Kind::Instance => {
                let (rng_in, parents) = split(item);
                let own = match parents {
                    0 if unknown == Some(item) => 0,
                    0..=2 => 1,
                    n => n - 1,
                };
                own + usize::from(rng_in && parents > 0)
            }
            _ => params[item].edge_from.len().saturating_sub(1).max(1),
        };
        for _ in 0..letters {
            rngs.py.choice(available)?;
            available -= 1;
        }
    }
    Ok(())
}
