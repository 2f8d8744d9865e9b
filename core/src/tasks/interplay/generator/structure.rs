//! The structure graph G_s (`drawStructure`, `StructureGraphThree.GraphStructure`): a layer of
//! categories, a layer of items, and category–item edges, named from a template.

use super::vocab::Template;
use super::{Rejection, Rngs};

/// A two-layer structure graph. Node `j` of layer `i` is `layers[i][j]`.
#[derive(Debug, Clone)]
pub struct Structure {
    /// Node names per layer.
    pub names: [Vec<&'static str>; 2],
    /// For each layer-0 node, its adjacent layer-1 nodes in the order the edges were drawn
    /// (the reference iterates a Python `set` of nodes here, whose order follows memory
    /// addresses; insertion order is the deterministic stand-in).
    pub adjacent: Vec<Vec<usize>>,
    /// The item layer's category name, e.g. `total number of adult animals`.
    pub total_name: &'static str,
}

/// `drawStructure(e, d=2, w0, w1, template)`.
pub fn draw_structure(
    rngs: &mut Rngs,
    e: i64,
    w0: usize,
    w1: usize,
    template: Template,
) -> Result<Structure, Rejection> {
    let mut l = [w0, w0];
    let p = rngs.py.random();
    while !(l[0] == w1 && l[1] == w1) {
        let e_minus = l[1] as i64;
        let e_plus = (l[0] * l[1]) as i64;
        let grow = if e_plus < e {
            true
        } else if e_minus == e {
            false
        } else {
            rngs.py.random() < p
        };
        if !grow {
            break;
        }
        let candidates: Vec<usize> = (0..2).filter(|&i| l[i] < w1).collect();
        if candidates.is_empty() {
            return Err(Rejection::Invalid("i_set is empty"));
        }
        let uniform = vec![1.0 / candidates.len() as f64; candidates.len()];
        l[candidates[rngs.np.choice_p(&uniform)]] += 1;
    }

    // Adjacency of every node of both layers, as (layer, index) in insertion order.
    let mut up: Vec<Vec<usize>> = vec![Vec::new(); l[1]];
    let mut down: Vec<Vec<usize>> = vec![Vec::new(); l[0]];
    let mut edges = 0i64;
    // construct_first: every item joins a random category.
    for (j, item_adj) in up.iter_mut().enumerate() {
        let c = rngs.np.randint(0, l[0] as i64)? as usize;
        item_adj.push(c);
        down[c].push(j);
        edges += 1;
    }
    // construct_second: random extra edges (unconnected categories first) up to e.
    let mut attempts = 0i64;
    while edges < e {
        attempts += 1;
        if attempts > e * 10 {
            return Err(Rejection::Invalid("countattempt > needed"));
        }
        rngs.py.randint(0, 0)?; // the layer index, always 0 with two layers
        let unconnected: Vec<usize> = (0..l[0]).filter(|&c| down[c].is_empty()).collect();
        let c = if unconnected.is_empty() {
            rngs.py.randint(0, l[0] as i64 - 1)? as usize
        } else {
            unconnected[rngs.py.randint(0, unconnected.len() as i64 - 1)? as usize]
        };
        let j = rngs.py.randint(0, l[1] as i64 - 1)? as usize;
        if up[j].contains(&c) {
            continue;
        }
        up[j].push(c);
        down[c].push(j);
        edges += 1;
    }

    // attachEnglish: one sub-list per layer, distinct names assigned from the end of a sample.
    let layers = template.layers();
    let mut names: [Vec<&'static str>; 2] = [Vec::new(), Vec::new()];
    for (i, layer) in layers.iter().enumerate() {
        let (_, list) =
            layer.sublists[rngs.py.randint(0, layer.sublists.len() as i64 - 1)? as usize];
        let mut picked: Vec<&'static str> = rngs
            .py
            .sample(list.len(), l[i])?
            .into_iter()
            .map(|k| list[k])
            .collect();
        names[i] = (0..l[i])
            .map(|_| picked.pop().expect("one name per node"))
            .collect();
    }
    Ok(Structure {
        names,
        adjacent: down,
        total_name: layers[1].category,
    })
}
