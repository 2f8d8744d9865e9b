//! What the training loop asks of the replicas: summed gradients, one start (rank 0's weights,
//! optimizer state and data cursor) and one metrics record per step.
//!
//! Tensors travel in the order of the parameters' Hugging Face names, never of burn's
//! `ParamId`s (random per process), so replicas need not share ids.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use serde_json::{Map, Value, json};

use super::{Reduce, ReduceDtype, Replica};
use crate::train::metrics;
use crate::error::{Error, Result};
use crate::train::adamw::{AdamW, Moments};
use crate::train::{Objective, Start};

type Inner<AB> = <AB as AutodiffBackend>::InnerBackend;

/// The gradients of one optimizer update summed (or averaged, `op`) over all replicas, in
/// `dtype` (`[train] grad_reduce_dtype`), but for the parameters in `done` (summed already, by
/// an [`super::Overlap`]). A parameter without a gradient counts as zeros.
pub fn reduce_gradients<AB: AutodiffBackend, M: AutodiffModule<AB>>(
    replica: &Replica,
    model: &M,
    names: &HashMap<ParamId, String>,
    mut grads: GradientsParams,
    op: Reduce,
    dtype: ReduceDtype,
    done: &HashSet<ParamId>,
) -> Result<GradientsParams> {
    if replica.is_single() {
        return Ok(grads);
    }
    let (summed, flat): (Vec<_>, Vec<_>) = flatten::<AB, M>(model, names, Source::Grads(&mut grads)).into_iter().partition(|f| done.contains(&f.1));
    let ids: Vec<ParamId> = flat.iter().map(|f| f.1).collect();
    let reduced = replica.all_reduce_many_in(flat.into_iter().map(|f| f.2).collect(), op, dtype)?;
    let by_id = ids.into_iter().zip(reduced).chain(summed.into_iter().map(|f| (f.1, f.2))).collect();
    let mut put = PutGrads { grads: &mut grads, by_id };
    model.visit(&mut put);
    Ok(grads)
}

/// Makes every replica start from rank 0's `start`: its weights, optimizer state, step and the
/// objective's data cursor (a node without rank 0's checkpoints gets them over the network).
pub fn sync_start<AB: AutodiffBackend, O: Objective<AB>>(replica: &Replica, start: Start<AB>, objective: &mut O) -> Result<Start<AB>> {
    if replica.is_single() {
        return Ok(start);
    }
    let Start { model, mut optimizer, step, loss_scale } = start;
    let header = replica.broadcast(json!({
        "step": step,
        "optimizer_step": optimizer.step,
        "data": objective.state(),
        "moments": !optimizer.moments.is_empty(),
        "loss_scale": loss_scale,
    }))?;
    let number = |key: &str| header[key].as_u64().ok_or_else(|| Error::Distributed(format!("rank 0 sent no {key} at the start")));
    let (step, optimizer_step) = (number("step")?, number("optimizer_step")?);
    if !replica.is_main() && step > 0 {
        objective.restore(&header["data"])?;
    }
    let names = model.param_names();
    let zeros = !replica.is_main();
    // Weights: rank 0 contributes them, the others zeros, so the sum is exactly rank 0's.
    let flat = flatten::<AB, _>(&model, &names, Source::Values { zeros });
    let shapes: Vec<(String, ParamId, usize)> = flat.iter().map(|f| (f.0.clone(), f.1, f.2.dims()[0])).collect();
    let reduced = replica.all_reduce_many(flat.into_iter().map(|f| f.2).collect(), Reduce::Sum)?;
    let model = model.map(&mut PutWeights { by_id: shapes.iter().map(|s| s.1).zip(reduced).collect() });

    optimizer.step = optimizer_step;
    if header["moments"].as_bool() == Some(true) {
        let device = model.device();
        let mut tensors = Vec::with_capacity(2 * shapes.len());
        for (name, _, numel) in &shapes {
            let moments = optimizer.moments.remove(name).filter(|_| !zeros);
            let (avg, sq) = match moments {
                Some(m) => (m.exp_avg, m.exp_avg_sq),
                None => (Tensor::zeros([*numel], &device), Tensor::zeros([*numel], &device)),
            };
            tensors.extend([avg, sq]);
        }
        let mut reduced = replica.all_reduce_many(tensors, Reduce::Sum)?.into_iter();
        for (name, _, _) in &shapes {
            let (exp_avg, exp_avg_sq) = (reduced.next().expect("two per parameter"), reduced.next().expect("two per parameter"));
            optimizer.moments.insert(name.clone(), Moments { exp_avg, exp_avg_sq });
        }
    }
    let loss_scale = serde_json::from_value(header["loss_scale"].clone())
        .map_err(|e| Error::Distributed(format!("rank 0 sent a bad loss scale: {e}")))?;
    Ok(Start { model, optimizer, step, loss_scale })
}

/// ZeRO-1 (`[train] shard_optimizer`): the values each replica updates and keeps AdamW moments
/// for. The parameters, in name order, are laid end to end as one vector of `N` values, and
/// rank `r` owns `[r·N/world, (r+1)·N/world)` of it (DeepSpeed's partition of the flattened
/// parameters), so every replica holds `1 / world` of the optimizer state however the sizes
/// fall. AdamW acts on each value alone but for the global clipping norm, which every replica
/// computes from the full reduced gradients, so the updates are an unsharded run's.
#[derive(Debug, Clone, PartialEq)]
pub struct OptimizerShard {
    rank: usize,
    /// Where each replica's values start in the parameters laid end to end, and the total:
    /// replica `r` owns `bounds[r]..bounds[r + 1]`.
    bounds: Vec<usize>,
    /// Per parameter: this replica's range of its flattened values (maybe empty), and its size.
    owned: HashMap<String, (Range<usize>, usize)>,
}

impl OptimizerShard {
    /// The partition of `params` (`(name, values)`) over `world` replicas, seen from `rank`.
    pub fn new(params: &[(String, usize)], rank: usize, world: usize) -> Self {
        let mut order: Vec<&(String, usize)> = params.iter().collect();
        order.sort_by(|a, b| a.0.cmp(&b.0));
        let total: usize = order.iter().map(|p| p.1).sum();
        let world = world.max(1);
        let bounds: Vec<usize> = (0..=world).map(|r| ((r as u128 * total as u128) / world as u128) as usize).collect();
        let (mine_start, mine_end) = (bounds[rank], bounds[rank + 1]);
        let mut offset = 0;
        let mut owned = HashMap::with_capacity(params.len());
        for (name, numel) in order {
            let (start, end) = (mine_start.max(offset), mine_end.min(offset + numel));
            let range = if start < end { start - offset..end - offset } else { 0..0 };
            owned.insert(name.clone(), (range, *numel));
            offset += numel;
        }
        Self { rank, bounds, owned }
    }

    /// The shard of `model`'s parameters for `replica`.
    pub fn of_model<AB: AutodiffBackend, M: AutodiffModule<AB>>(model: &M, names: &HashMap<ParamId, String>, replica: &Replica) -> Self {
        let sizes: Vec<(String, usize)> = flatten::<AB, M>(model, names, Source::Values { zeros: false }).into_iter().map(|(name, _, flat)| (name, flat.dims()[0])).collect();
        Self::new(&sizes, replica.rank(), replica.world())
    }

    /// The values of parameter `name` (of `numel` values) this replica updates: a sub-range of
    /// `0..numel`, maybe empty (a parameter the partition does not know belongs to rank 0).
    pub fn range(&self, name: &str, numel: usize) -> Range<usize> {
        match self.owned.get(name) {
            Some((range, _)) => range.clone(),
            None if self.rank == 0 => 0..numel,
            None => 0..0,
        }
    }

    /// Values of optimizer state (two moments) this replica keeps.
    pub fn held_values(&self) -> usize {
        self.owned.values().map(|(range, _)| 2 * range.len()).sum()
    }

    /// Cuts whole moments (as loaded or gathered) down to this replica's ranges.
    pub fn drop_others<B: Backend>(&self, moments: &mut HashMap<String, Moments<B>>) {
        for (name, m) in std::mem::take(moments) {
            let Some((range, numel)) = self.owned.get(&name) else {
                moments.insert(name, m);
                continue;
            };
            if m.exp_avg.dims()[0] != *numel || range.len() == *numel {
                moments.insert(name, m);
            } else if !range.is_empty() {
                let cut = Moments { exp_avg: m.exp_avg.slice(range.clone()), exp_avg_sq: m.exp_avg_sq.slice(range.clone()) };
                moments.insert(name, cut);
            }
        }
    }
}

/// After an update where each replica stepped only its own values: every replica gets every
/// owner's new values ([`Replica::all_gather`], in the weights' dtype). The rounds follow the
/// partition, not the parameters: in round `k` every replica sends the `k`-th slice of its own
/// range (2^24 / world values), so every round's parts are even whatever the parameters' sizes,
/// and each link carries (world − 1)/world of the weights in all.
pub fn gather_owned_weights<AB: AutodiffBackend, M: AutodiffModule<AB>>(
    replica: &Replica,
    model: M,
    names: &HashMap<ParamId, String>,
    shard: &OptimizerShard,
) -> Result<M> {
    gather_owned_weights_by(replica, model, names, shard, super::BUCKET)
}

/// [`gather_owned_weights`] in rounds of `bucket` values (tests take small ones).
pub(super) fn gather_owned_weights_by<AB: AutodiffBackend, M: AutodiffModule<AB>>(
    replica: &Replica,
    model: M,
    names: &HashMap<ParamId, String>,
    shard: &OptimizerShard,
    bucket: usize,
) -> Result<M> {
    let flat = flatten::<AB, M>(&model, names, Source::Values { zeros: false });
    let sizes: Vec<usize> = flat.iter().map(|f| f.2.dims()[0]).collect();
    let Some((_, _, like)) = flat.first() else { return Ok(model) };
    let like = (like.device(), like.dtype());
    let own = |i: usize, range: Range<usize>| flat[i].2.clone().slice(range);
    let gathered = gather_by_partition(replica, &shard.bounds, &sizes, bucket, like, true, own)?;
    let by_id: HashMap<ParamId, Tensor<Inner<AB>, 1>> = flat.iter().zip(gathered).filter_map(|((_, id, _), value)| Some((*id, value?))).collect();
    drop(flat);
    Ok(model.map(&mut PutWeights { by_id }))
}

/// Values laid end to end in name order (parameter `i` has `sizes[i]`), of which replica `r`
/// holds `bounds[r]..bounds[r + 1]`, all-gathered in rounds of about `bucket` values: in round
/// `k` every replica sends the `k`-th slice of its range (`own(i, range)`: its values of
/// parameter `i` at `range` of that parameter), so every round's parts are even. Returns every
/// parameter's values in `like`'s dtype (`None` for a parameter of no values), each written
/// round by round into its own buffer (so they hold the model once more, plus one round in
/// flight, and a parameter's later updates touch only its own buffer), or nothing when `keep`
/// is false (the replica takes part for the others).
fn gather_by_partition<B: Backend>(
    replica: &Replica,
    bounds: &[usize],
    sizes: &[usize],
    bucket: usize,
    like: (B::Device, burn::tensor::DType),
    keep: bool,
    own: impl Fn(usize, Range<usize>) -> Tensor<B, 1>,
) -> Result<Vec<Option<Tensor<B, 1>>>> {
    let total: usize = sizes.iter().sum();
    if Some(&total) != bounds.last() || bounds.len() != replica.world() + 1 {
        return Err(Error::Distributed(format!("ZeRO-1: the model has {total} values, its optimizer's partition {bounds:?} (for {} replicas)", replica.world())));
    }
    // Where each parameter starts in the whole.
    let starts: Vec<usize> = sizes.iter().scan(0, |end, size| Some(std::mem::replace(end, *end + size))).collect();
    let (device, dtype) = like;
    let zeros = |n: usize| crate::model::proj::to_dtype(Tensor::<B, 1>::zeros([n], &device), dtype);
    let (rank, slice) = (replica.rank(), bucket.div_ceil(replica.world()).max(1));
    let longest = bounds.windows(2).map(|b| b[1] - b[0]).max().unwrap_or_default();
    // Written in place (each buffer is this function's alone).
    let mut out: Vec<Option<Tensor<B, 1>>> = sizes.iter().map(|&size| (keep && size > 0).then(|| zeros(size))).collect();
    for round in 0..longest.div_ceil(slice) {
        let ranges: Vec<Range<usize>> = bounds
            .windows(2)
            .map(|b| {
                let start = (b[0] + round * slice).min(b[1]);
                start..(start + slice).min(b[1])
            })
            .collect();
        let parts: Vec<usize> = ranges.iter().map(Range::len).collect();
        // This replica's slice in its place among the others' (zeros until gathered).
        let (before, after): (usize, usize) = (parts[..rank].iter().sum(), parts[rank + 1..].iter().sum());
        let mut data: Vec<Tensor<B, 1>> = Vec::new();
        if before > 0 {
            data.push(zeros(before));
        }
        for (i, range) in overlaps(&starts, sizes, &ranges[rank]) {
            data.push(crate::model::proj::to_dtype(own(i, range.start - starts[i]..range.end - starts[i]), dtype));
        }
        if after > 0 {
            data.push(zeros(after));
        }
        let gathered = replica.all_gather(Tensor::cat(data, 0), &parts)?;
        if !keep {
            continue;
        }
        let mut at = 0;
        for range in &ranges {
            for (i, part) in overlaps(&starts, sizes, range) {
                let from = at + part.start - range.start;
                let value = gathered.clone().slice(from..from + part.len());
                out[i] = out[i].take().map(|param| write_into(param, part.start - starts[i], value));
            }
            at += range.len();
        }
    }
    Ok(if keep { out } else { Vec::new() })
}

/// `buffer[start..start + value's length] = value`, in `buffer`'s own memory where it can be
/// (burn-flex's `slice_assign` copies the whole buffer first, which for a parameter written in
/// many pieces would copy it once per piece; see [`crate::model::fused::assign`]).
fn write_into<B: Backend>(buffer: Tensor<B, 1>, start: usize, value: Tensor<B, 1>) -> Tensor<B, 1> {
    let (n, len) = (buffer.dims()[0], value.dims()[0]);
    crate::model::fused::assign(buffer.reshape([1, 1, n, 1]), 2, start, value.reshape([1, 1, len, 1])).reshape([n])
}

/// The parameters (starting at `starts`, of `sizes` values) that overlap `range` of the whole:
/// `(index, the overlap in the whole)`, in order.
fn overlaps(starts: &[usize], sizes: &[usize], range: &Range<usize>) -> Vec<(usize, Range<usize>)> {
    let first = starts.partition_point(|&start| start <= range.start).saturating_sub(1);
    (first..starts.len())
        .take_while(|&i| starts[i] < range.end)
        .filter_map(|i| {
            let (lo, hi) = (range.start.max(starts[i]), range.end.min(starts[i] + sizes[i]));
            (lo < hi).then_some((i, lo..hi))
        })
        .collect()
}

/// Before a checkpoint of a sharded run (`optimizer.shard`; otherwise nothing): rank 0 gets
/// every parameter's whole moments (each owner sends its range, all-gathered in rounds as
/// [`gather_owned_weights`] does, in the weights' dtype), so the checkpoint holds an unsharded
/// run's optimizer state; the other replicas keep their own ranges and hold at most one round
/// (2^24 values) more while it is gathered. Nothing to do before the first update.
pub fn gather_owned_moments<AB: AutodiffBackend, M: AutodiffModule<AB>>(
    replica: &Replica,
    model: &M,
    names: &HashMap<ParamId, String>,
    optimizer: &mut AdamW<Inner<AB>>,
) -> Result<()> {
    gather_owned_moments_by(replica, model, names, optimizer, super::BUCKET)
}

/// [`gather_owned_moments`] in rounds of `bucket` values (tests take small ones).
pub(super) fn gather_owned_moments_by<AB: AutodiffBackend, M: AutodiffModule<AB>>(
    replica: &Replica,
    model: &M,
    names: &HashMap<ParamId, String>,
    optimizer: &mut AdamW<Inner<AB>>,
    bucket: usize,
) -> Result<()> {
    let AdamW { shard: Some(shard), moments, step, .. } = optimizer else { return Ok(()) };
    if *step == 0 {
        return Ok(());
    }
    let flat = flatten::<AB, M>(model, names, Source::Values { zeros: false });
    let sizes: Vec<usize> = flat.iter().map(|f| f.2.dims()[0]).collect();
    let Some((_, _, like)) = flat.first() else { return Ok(()) };
    let like = (like.device(), like.dtype());
    // A replica's moments of a parameter cover its range of it (see `OptimizerShard::drop_others`).
    for (name, numel) in flat.iter().map(|f| &f.0).zip(&sizes) {
        let (held, owned) = (moments.get(name).map(|m| m.exp_avg.dims()[0]), shard.range(name, *numel).len());
        if held.is_some_and(|held| held != owned) {
            return Err(Error::Distributed(format!("ZeRO-1: replica {} holds {} moment values of {name}, its range {owned}", replica.rank(), held.unwrap_or_default())));
        }
    }
    let main = replica.is_main();
    let mut wholes: Vec<Vec<Option<Tensor<Inner<AB>, 1>>>> = Vec::with_capacity(2);
    for which in 0..2 {
        // This replica's values of parameter `i` at `range` (zeros for a parameter it never
        // updated).
        let own = |i: usize, range: Range<usize>| {
            let (name, numel) = (&flat[i].0, sizes[i]);
            let start = shard.range(name, numel).start;
            match moments.get(name) {
                Some(m) => [&m.exp_avg, &m.exp_avg_sq][which].clone().slice(range.start - start..range.end - start),
                None => crate::model::proj::to_dtype(Tensor::zeros([range.len()], &like.0), like.1),
            }
        };
        wholes.push(gather_by_partition(replica, &shard.bounds, &sizes, bucket, like.clone(), main, own)?);
    }
    // Rank 0: every parameter's whole moments (the others got none).
    let [avg, sq] = <[_; 2]>::try_from(wholes).expect("two moments");
    for ((name, _, _), (avg, sq)) in flat.iter().zip(avg.into_iter().zip(sq)) {
        if let (Some(exp_avg), Some(exp_avg_sq)) = (avg, sq) {
            moments.insert(name.clone(), Moments { exp_avg, exp_avg_sq });
        }
    }
    Ok(())
}

/// One metrics record from every replica's: `loss` by the objective's reduction, counts
/// (`tokens`, `targets`, `prompts`, `responses`, `rollout_tokens`) and throughputs (`*_per_s`)
/// summed, `*_max`/`*_min` by max/min, durations (`*_s`) by the slowest, everything else
/// averaged; values that are not numbers are rank 0's.
pub fn reduce_records(records: Vec<Value>, loss: Reduce) -> Map<String, Value> {
    let mut records = records.into_iter().map(|r| if let Value::Object(m) = r { m } else { Map::new() });
    let Some(first) = records.next() else { return Map::new() };
    let rest: Vec<Map<String, Value>> = records.collect();
    let n = 1 + rest.len();
    let mut out = Map::new();
    for (key, value) in first {
        let Some(own) = value.as_f64() else {
            out.insert(key, value);
            continue;
        };
        let values = std::iter::once(own).chain(rest.iter().filter_map(|r| r.get(&key).and_then(Value::as_f64)));
        let summed = metrics::SUMMED.iter().any(|m| m.key() == key);
        let reduced = if (key == metrics::LOSS.key() && loss == Reduce::Sum) || summed || key.ends_with("_per_s") {
            values.sum::<f64>()
        } else if key.ends_with("_max") || key.ends_with("_s") {
            values.fold(f64::NEG_INFINITY, f64::max)
        } else if key.ends_with("_min") {
            values.fold(f64::INFINITY, f64::min)
        } else {
            values.sum::<f64>() / n as f64
        };
        out.insert(key, json!(reduced));
    }
    out
}

pub(super) enum Source<'a> {
    /// Take each parameter's gradient out of these (zeros where there is none).
    Grads(&'a mut GradientsParams),
    /// Each parameter's gradient in `grads` plus its gradient in `earlier` (an update's earlier
    /// micro-batches', added as burn's `GradientsAccumulator` adds them), left in place (zeros
    /// where neither has one).
    Sum { grads: &'a GradientsParams, earlier: Option<&'a GradientsParams> },
    /// The parameters' values, or zeros of their size.
    Values { zeros: bool },
}

/// Every parameter of `model` as `(name, id, flat tensor)` from `source`, in name order (the
/// order the replicas agree on).
pub(super) fn flatten<AB: AutodiffBackend, M: AutodiffModule<AB>>(model: &M, names: &HashMap<ParamId, String>, source: Source<'_>) -> Vec<(String, ParamId, Tensor<Inner<AB>, 1>)> {
    let mut visitor = Flatten::<Inner<AB>> { names, source, out: Vec::new() };
    model.visit(&mut visitor);
    let mut flat = visitor.out;
    flat.sort_by(|a, b| a.0.cmp(&b.0));
    flat
}

/// Every parameter as `(name, id, flat tensor)`.
struct Flatten<'a, B: Backend> {
    names: &'a HashMap<ParamId, String>,
    source: Source<'a>,
    out: Vec<(String, ParamId, Tensor<B, 1>)>,
}

impl<AB: AutodiffBackend> ModuleVisitor<AB> for Flatten<'_, AB::InnerBackend> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AB, D>>) {
        let value = param.val().inner();
        let numel = value.dims().iter().product::<usize>();
        let name = self.names.get(&param.id).cloned().unwrap_or_else(|| format!("param-{}", param.id));
        let flat = match &mut self.source {
            // Zeros in the parameter's dtype: every replica must send one dtype (bf16-pure
            // weights are bf16), and a replica gets back the dtype it sent.
            Source::Grads(grads) => match grads.remove::<AB::InnerBackend, D>(param.id) {
                Some(grad) => grad.reshape([numel]),
                None => value.reshape([numel]).zeros_like(),
            },
            Source::Sum { grads, earlier } => match (earlier.and_then(|e| e.get::<AB::InnerBackend, D>(param.id)), grads.get::<AB::InnerBackend, D>(param.id)) {
                (Some(earlier), Some(grad)) => earlier.add(grad).reshape([numel]),
                (Some(one), None) | (None, Some(one)) => one.reshape([numel]),
                (None, None) => value.reshape([numel]).zeros_like(),
            },
            Source::Values { zeros: true } => value.reshape([numel]).zeros_like(),
            Source::Values { zeros: false } => value.reshape([numel]),
        };
        self.out.push((name, param.id, flat));
    }
}

/// Puts flat gradients back in their parameters' shapes (replacing what `grads` held).
pub(super) struct PutGrads<'a, B: Backend> {
    pub grads: &'a mut GradientsParams,
    pub by_id: HashMap<ParamId, Tensor<B, 1>>,
}

impl<AB: AutodiffBackend> ModuleVisitor<AB> for PutGrads<'_, AB::InnerBackend> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AB, D>>) {
        if let Some(flat) = self.by_id.remove(&param.id) {
            self.grads.register::<AB::InnerBackend, D>(param.id, flat.reshape(param.val().dims()));
        }
    }
}

struct PutWeights<B: Backend> {
    by_id: HashMap<ParamId, Tensor<B, 1>>,
}

impl<AB: AutodiffBackend> ModuleMapper<AB> for PutWeights<AB::InnerBackend> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<AB, D>>) -> Param<Tensor<AB, D>> {
        let (id, tensor, mapper) = param.consume();
        let Some(flat) = self.by_id.remove(&id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let value = Tensor::from_inner(flat.reshape(tensor.dims())).require_grad();
        Param::from_mapped_value(id, value, mapper)
    }
}
