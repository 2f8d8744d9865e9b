//! The necessary dependency graph: the parameters the answer depends on, their topological
//! order, and the operations between them (`drawNecessary1/2/3`, `addingparameter`).

use super::params::{DepGraph, Id, Kind, Params, RNG};
use super::structure::Structure;
use super::{Mode, Rejection, Rngs};

/// `all_abstract_parameters`: one total per category and one instance per category–item
/// edge (the total's children). Returns `(abstracts, instances)`.
pub fn all_parameters(
    params: &mut Params,
    structure: &Structure,
) -> Result<(Vec<Id>, Vec<Id>), Rejection> {
    let (mut abstracts, mut instances) = (Vec::new(), Vec::new());
    for (c, category) in structure.names[0].iter().enumerate() {
        if structure.adjacent[c].is_empty() {
            return Err(Rejection::Invalid("a category has no items"));
        }
        let total = params.add(
            format!("{} in {category}", structure.total_name),
            Kind::Abstract,
        );
        abstracts.push(total);
        for &item in &structure.adjacent[c] {
            let inst = params.add(
                format!("{} in {category}", structure.names[1][item]),
                Kind::Instance,
            );
            params[total].edge_from.push(inst);
            params[inst].edge_to.push(total);
            instances.push(inst);
        }
    }
    Ok((abstracts, instances))
}

/// `drawNecessary1`: random totals while the graph has at most `n` operations (the first one
/// that does not fit is dropped from the candidates too), then `m − op − 1` random instances.
pub fn draw_necessary1(
    rngs: &mut Rngs,
    params: &Params,
    abstracts: &mut Vec<Id>,
    instances: &[Id],
    n: i64,
    m: i64,
) -> Result<DepGraph, Rejection> {
    let mut necessary = DepGraph::default();
    let mut trial = DepGraph::default();
    while !abstracts.is_empty() {
        let selected = abstracts.remove(rngs.py.randint(0, abstracts.len() as i64 - 1)? as usize);
        trial.add_abstract(params, selected);
        if trial.op(params) as i64 <= n {
            necessary.add_abstract(params, selected);
        } else {
            break;
        }
    }
    let extra = m - necessary.op(params) as i64;
    for _ in 1..extra.max(1) {
        let leftover: Vec<Id> = instances
            .iter()
            .copied()
            .filter(|i| !necessary.instances.contains(i))
            .collect();
        if !leftover.is_empty() {
            necessary
                .instances
                .push(leftover[rngs.py.randint(0, leftover.len() as i64 - 1)? as usize]);
        }
    }
    Ok(necessary)
}

/// `samplingwithbias(candidates, nextone)`: a `choices` draw with weights
/// `exp((is_abstract + in_nextone) · |N(0, 1)|)`.
fn sample_with_bias(
    rngs: &mut Rngs,
    params: &Params,
    candidates: &[Id],
    next_one: &[Id],
) -> Result<Id, Rejection> {
    let weights: Vec<f64> = candidates
        .iter()
        .map(|&c| {
            let g = rngs.py.gauss(0.0, 1.0);
            let factor =
                i32::from(params[c].kind == Kind::Abstract) + i32::from(next_one.contains(&c));
            (f64::from(factor) * g.abs()).exp()
        })
        .collect();
    Ok(candidates[rngs.py.choices(&weights)?])
}

/// `drawNecessary2`: builds the topological order from the end, adding edges when the order
/// would otherwise stall. In equation mode the last node is the first total found.
pub fn draw_necessary2(
    rngs: &mut Rngs,
    params: &mut Params,
    graph: &mut DepGraph,
    mode: Mode,
) -> Result<Vec<Id>, Rejection> {
    let mut topo: Vec<Id> = Vec::new();
    loop {
        let (next_one, next_two, _) = graph.next_one_two(params, &topo);
        let first = if topo.is_empty() {
            let total = next_two
                .iter()
                .copied()
                .find(|&p| params[p].name.contains("total"));
            match (mode, total) {
                (Mode::Reverse, Some(total)) => total,
                _ => next_two[rngs.py.randint(0, next_two.len() as i64 - 1)? as usize],
            }
        } else {
            let both: Vec<Id> = next_one
                .iter()
                .copied()
                .filter(|p| next_two.contains(p))
                .collect();
            both[rngs.py.randint(0, both.len() as i64 - 1)? as usize]
        };
        topo.insert(0, first);
        let (next_one, next_two, output) = graph.next_one_two(params, &topo);
        if output.is_empty() {
            break;
        }
        if !next_one.iter().any(|p| next_two.contains(p)) {
            if params[first].kind == Kind::Abstract {
                return Err(Rejection::Invalid("param0 is abstract"));
            }
            let parent = sample_with_bias(rngs, params, &next_two, &next_one)?;
            graph.add_edge(params, parent, first);
        } else if params[first].kind == Kind::Instance {
            let p0 = rngs.py.random();
            if rngs.py.random() < p0 {
                let parent = sample_with_bias(rngs, params, &output, &next_one)?;
                graph.add_edge(params, parent, first);
            }
        }
    }
    if graph
        .instances
        .iter()
        .any(|&i| params[i].edge_from.len() > 1)
    {
        return Err(Rejection::Invalid("an instance has more than one parent"));
    }
    Ok(topo)
}

/// `addingparameter`: with two nodes in the order, add one more instance before or after.
pub fn add_parameter(
    rngs: &mut Rngs,
    params: &mut Params,
    graph: &mut DepGraph,
    topo: &mut Vec<Id>,
    instances: &[Id],
) {
    let candidate = graph
        .instances
        .iter()
        .chain(instances)
        .copied()
        .find(|p| !topo.contains(p));
    if let Some(item) = candidate {
        if rngs.py.random() < 0.5 {
            graph.add_edge(params, item, topo[0]);
            topo.insert(0, item);
        } else {
            graph.add_edge(params, topo[1], item);
            topo.push(item);
        }
    }
}

/// `is_topo`: no node depends on a later one.
pub fn is_topo(params: &Params, topo: &[Id]) -> bool {
    topo.iter().enumerate().all(|(i, &a)| {
        topo[i + 1..]
            .iter()
            .all(|&b| !params[b].edge_to.contains(&a))
            && topo[..i].iter().all(|&b| !params[b].edge_from.contains(&a))
    })
}

/// `drawNecessary3`: spreads operations until they sum to `s`, then gives every instance its
/// parents from the RNG and the nodes before it in the order.
pub fn draw_necessary3(
    rngs: &mut Rngs,
    params: &mut Params,
    graph: &mut DepGraph,
    topo: &[Id],
    s: i64,
) -> Result<(), Rejection> {
    for &p in graph.abstracts.iter().chain(&graph.instances) {
        params[p].c_op = params[p].edge_from.len() as i64;
    }
    for &p in &graph.instances {
        let position = topo
            .iter()
            .position(|&t| t == p)
            .ok_or(Rejection::Invalid("item should be in topo"))?;
        params[p].m_op = (position as i64).clamp(1, 3);
    }
    while graph
        .abstracts
        .iter()
        .chain(&graph.instances)
        .map(|&p| params[p].c_op)
        .sum::<i64>()
        < s
    {
        let open: Vec<Id> = graph
            .instances
            .iter()
            .copied()
            .filter(|&p| params[p].c_op < params[p].m_op)
            .collect();
        if open.is_empty() {
            return Err(Rejection::Invalid("no instance with cur_op < max_op"));
        }
        params[open[rngs.py.randint(0, open.len() as i64 - 1)? as usize]].c_op += 1;
    }
    for item in graph.instances.clone() {
        let position = topo.iter().position(|&t| t == item).expect("checked above");
        let mut pool: Vec<Id> = std::iter::once(RNG)
            .chain(topo[..position].iter().copied())
            .collect();
        let mut dep_num = if params[item].c_op == 1 {
            if rngs.py.random() < 0.5 { 1 } else { 2 }
        } else {
            params[item].c_op + 1
        };
        dep_num = dep_num.min(pool.len() as i64);
        let existing = pool
            .iter()
            .filter(|p| params[item].edge_from.contains(p))
            .count();
        if existing > 1 {
            return Err(Rejection::Invalid(
                "more than one existing parent in the pool",
            ));
        }
        if existing == 1 {
            // The reference removes the loop variable left over from its scan: the last element.
            pool.pop();
            dep_num -= 1;
        }
        if dep_num == pool.len() as i64 {
            for &parent in &pool {
                graph.add_edge(params, parent, item);
            }
        } else {
            if rngs.py.random() < 0.5 {
                graph.add_edge(params, RNG, item);
                dep_num -= 1;
            }
            pool.retain(|&p| p != RNG);
            for _ in 0..dep_num.max(0) {
                let parent = pool.remove(rngs.py.randint(0, pool.len() as i64 - 1)? as usize);
                graph.add_edge(params, parent, item);
            }
        }
    }
    Ok(())
}
