//! Parameters and the dependency graph (`DependencyGraph.py`).
//!
//! Parameters live in an arena and are referred to by index. In the reference they are Python
//! objects compared by `(name, type)`; at d = 2 every such pair is created once per attempt, so
//! index equality is the same relation.

use super::linear::Linear;

/// Index of a parameter in the arena.
pub type Id = usize;

/// The random-number source of every problem, always at index 0.
pub const RNG: Id = 0;

/// What a parameter is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A per-category total (`total number of adult animals in Pine Ridge`).
    Abstract,
    /// An item in a category (`adult owl in Pine Ridge`).
    Instance,
    /// The random-constant source.
    Rng,
}

/// `+` or `*` (after a constant) / `+` or `-` (between two parents).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Addition.
    Plus,
    /// Subtraction.
    Minus,
    /// Multiplication.
    Times,
}

/// A parameter node with the attributes the generator sets on it.
#[derive(Debug, Clone)]
pub struct Param {
    /// Its name.
    pub name: String,
    /// Its kind.
    pub kind: Kind,
    /// Parameters it depends on, in insertion order.
    pub edge_from: Vec<Id>,
    /// Parameters depending on it, in insertion order.
    pub edge_to: Vec<Id>,
    /// Operations assigned to it (`cur_op`).
    pub c_op: i64,
    /// Maximum operations it may take (`max_op`).
    pub m_op: i64,
    /// Solution variable letter.
    pub variable: Option<char>,
    /// Its value.
    pub value: Option<i64>,
    /// Between two parents: sum or difference.
    pub notation: Option<Op>,
    /// The random constant combined with its parents.
    pub rngv: Option<i64>,
    /// How the constant combines (`+` or `*`).
    pub rngnot: Option<Op>,
    /// Equation mode: its value as a linear expression in the unknown `x`.
    pub expr: Option<Linear>,
}

impl Param {
    fn new(name: String, kind: Kind) -> Self {
        Param {
            name,
            kind,
            edge_from: Vec::new(),
            edge_to: Vec::new(),
            c_op: 0,
            m_op: 0,
            variable: None,
            value: None,
            notation: None,
            rngv: None,
            rngnot: None,
            expr: None,
        }
    }
}

/// The arena of one attempt.
#[derive(Debug, Clone)]
pub struct Params(pub Vec<Param>);

impl Params {
    /// An arena holding only the RNG node.
    pub fn new() -> Self {
        Params(vec![Param::new("RNG".into(), Kind::Rng)])
    }

    /// Adds a parameter without edges.
    pub fn add(&mut self, name: String, kind: Kind) -> Id {
        self.0.push(Param::new(name, kind));
        self.0.len() - 1
    }
}

impl std::ops::Index<Id> for Params {
    type Output = Param;
    fn index(&self, id: Id) -> &Param {
        &self.0[id]
    }
}

impl std::ops::IndexMut<Id> for Params {
    fn index_mut(&mut self, id: Id) -> &mut Param {
        &mut self.0[id]
    }
}

/// `DependencyGraph`: which parameters are in the graph (edges live on the parameters).
#[derive(Debug, Clone, Default)]
pub struct DepGraph {
    /// Abstract parameters, in insertion order.
    pub abstracts: Vec<Id>,
    /// Instance parameters, in insertion order.
    pub instances: Vec<Id>,
}

impl DepGraph {
    /// `add_abstractparameter`: the abstract parameter and the instances it sums.
    pub fn add_abstract(&mut self, params: &Params, a: Id) {
        if !self.abstracts.contains(&a) && !params[a].edge_from.is_empty() {
            self.abstracts.push(a);
        }
        for &child in &params[a].edge_from {
            if params[child].kind == Kind::Instance && !self.instances.contains(&child) {
                self.instances.push(child);
            }
        }
    }

    /// `op()`: the number of edges into the graph's parameters.
    pub fn op(&self, params: &Params) -> usize {
        self.abstracts
            .iter()
            .chain(&self.instances)
            .map(|&p| params[p].edge_from.len())
            .sum()
    }

    /// `add_edge(from, to)`.
    pub fn add_edge(&mut self, params: &mut Params, from: Id, to: Id) {
        for node in [from, to] {
            match params[node].kind {
                Kind::Abstract
                    if !self.abstracts.contains(&node) && !params[node].edge_from.is_empty() =>
                {
                    self.abstracts.push(node)
                }
                Kind::Instance if !self.instances.contains(&node) => self.instances.push(node),
                _ => {}
            }
        }
        if !params[from].edge_to.contains(&to) {
            params[from].edge_to.push(to);
        }
        if !params[to].edge_from.contains(&from) {
            params[to].edge_from.push(from);
        }
    }

    /// `next_one_two(topo)`: the parameters not in `topo` (`output`), those of them feeding
    /// something in `topo` (`nextone`), and those feeding nothing outside `topo` (`nexttwo`).
    pub fn next_one_two(&self, params: &Params, topo: &[Id]) -> (Vec<Id>, Vec<Id>, Vec<Id>) {
        let output: Vec<Id> = self
            .abstracts
            .iter()
            .chain(&self.instances)
            .copied()
            .filter(|p| !topo.contains(p))
            .collect();
        let next_one = output
            .iter()
            .copied()
            .filter(|&c| topo.iter().any(|t| params[c].edge_to.contains(t)))
            .collect();
        let next_two = output
            .iter()
            .copied()
            .filter(|&c| !params[c].edge_to.iter().any(|t| output.contains(t)))
            .collect();
        (next_one, next_two, output)
    }
}
