//! The gradient all-reduce overlapped with the backward pass (PyTorch DDP's buckets, Megatron's
//! `overlap_grad_reduce`): the training loop's last micro-batch of an update goes backward one
//! decoder layer at a time ([`crate::model::checkpoint::gradients_with`]), and each layer's
//! gradients, whole as soon as its backward pass ends, are handed to a thread that sums them
//! over kiln's ring while the layers below are differentiated. When the update ends, the layers
//! not handed over go to the same thread, and the rest (the embedding, the final norm, an untied
//! `lm_head`) is summed by [`super::reduce_gradients`] as before. At most two buckets wait for
//! the thread: a backward pass faster than the ring waits for it rather than keeping every
//! layer's copy.
//!
//! Every replica sums the same buckets in the same order — each layer's parameters in name
//! order, cut at [`super::BUCKET`] values, last layer first, then the rest — whatever its own
//! backward pass handed over (a replica with no micro-batch in an update, or a loss of several
//! forward passes, sends its layers when the update ends), so the ring's calls always pair up.
//! Sums are f32 and divided (`Reduce::Mean`) after summing, as [`super::Replica::all_reduce_in`]
//! does: with two processes the results are the bits of the unoverlapped sums; with more, a
//! value's place in its bucket decides where the ring starts its sum, so the last bits may
//! differ.

use std::collections::{HashMap, HashSet};
use std::sync::mpsc::{Receiver, SyncSender, channel, sync_channel};

use burn::module::{AutodiffModule, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Tensor, TensorData};

use super::params::{PutGrads, Source, flatten};
use super::{Reduce, Replica, host_f32};
use crate::error::{Error, Result};

type Inner<AB> = <AB as AutodiffBackend>::InnerBackend;

/// One update's gradient sums running beside its backward pass (see the module docs); made by
/// [`Replica::overlap`], ended by [`Overlap::finish`].
pub struct Overlap<AB: AutodiffBackend> {
    world: usize,
    /// Which decoder layers were handed over.
    launched: Vec<bool>,
    /// Each bucket sent, in order: its parameters, lengths and dtypes.
    buckets: Vec<Vec<(ParamId, usize, DType)>>,
    to_ring: Option<SyncSender<Tensor<Inner<AB>, 1>>>,
    from_ring: Receiver<Result<Vec<f32>>>,
    device: burn::tensor::Device<Inner<AB>>,
    /// Values handed over during the backward pass.
    overlapped: usize,
}

impl Replica {
    /// An [`Overlap`] for one update of a model of `layers` decoder layers on `device`, where this
    /// replica's sums go through kiln's ring alone (one replica in each of several processes, no
    /// NCCL); `None` elsewhere (every replica of a run gets the same answer).
    pub fn overlap<AB: AutodiffBackend>(&self, layers: usize, device: &burn::tensor::Device<Inner<AB>>) -> Result<Option<Overlap<AB>>> {
        let Some(group) = self.shared.as_ref().and_then(|s| s.group.clone()) else { return Ok(None) };
        if self.local_size > 1 || super::collective() == super::Collective::Nccl || super::nccl_device::<Inner<AB>>(device).is_some() {
            return Ok(None);
        }
        let (to_ring, buckets) = sync_channel::<Tensor<Inner<AB>, 1>>(2);
        let (sums, from_ring) = channel();
        let local = self.local;
        std::thread::Builder::new()
            .name("kiln-grad-ring".into())
            .spawn(move || {
                for bucket in buckets {
                    // A device failure while reading the bucket is the run's error, named.
                    let sum = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        let mut data = host_f32(bucket);
                        group.all_reduce_sum(&mut data).map(|()| data)
                    }))
                    .unwrap_or_else(|payload| Err(super::replica_panic(local, payload)));
                    let failed = sum.is_err();
                    if sums.send(sum).is_err() || failed {
                        break;
                    }
                }
            })
            .map_err(|e| Error::Distributed(format!("cannot start the gradient all-reduce thread: {e}")))?;
        Ok(Some(Overlap {
            world: self.world,
            launched: vec![false; layers],
            buckets: Vec::new(),
            to_ring: Some(to_ring),
            from_ring,
            device: device.clone(),
            overlapped: 0,
        }))
    }
}

impl<AB: AutodiffBackend> Overlap<AB> {
    /// Hands decoder layer `layer` (`module`) over: its parameters' gradients in `grads` (this
    /// micro-batch's, whole) plus `earlier` (the update's earlier micro-batches', summed as
    /// burn's `GradientsAccumulator` sums them).
    pub fn launch<M: AutodiffModule<AB>>(&mut self, layer: usize, module: &M, names: &HashMap<ParamId, String>, grads: &GradientsParams, earlier: &GradientsParams) {
        self.overlapped += self.send_layer(layer, module, names, grads, Some(earlier));
    }

    /// Hands over the layers not handed over yet (their gradients in `grads`), last first, waits
    /// for every sum and puts them into `grads` (divided by the replicas for `Reduce::Mean`, in
    /// each gradient's dtype). Returns the parameters summed here (for
    /// [`super::reduce_gradients`] to leave out) and how many values were summed during the
    /// backward pass.
    pub fn finish<M: AutodiffModule<AB>>(mut self, layers: &[M], names: &HashMap<ParamId, String>, grads: &mut GradientsParams, op: Reduce) -> Result<(HashSet<ParamId>, usize)> {
        for (i, layer) in layers.iter().enumerate().rev() {
            if !self.launched[i] {
                self.send_layer(i, layer, names, grads, None);
            }
        }
        drop(self.to_ring.take());
        let mut sums: HashMap<ParamId, Tensor<Inner<AB>, 1>> = HashMap::new();
        for bucket in std::mem::take(&mut self.buckets) {
            let sum = self.from_ring.recv().map_err(|_| Error::Distributed("the gradient all-reduce thread stopped".into()))??;
            let n = sum.len();
            let sum = super::Replica::finish_reduce(Tensor::<Inner<AB>, 1>::from_data(TensorData::new(sum, [n]), &self.device), op, self.world);
            let mut start = 0;
            for (id, length, dtype) in bucket {
                sums.insert(id, crate::model::proj::to_dtype(sum.clone().slice(start..start + length), dtype));
                start += length;
            }
        }
        let done = sums.keys().copied().collect();
        let mut put = PutGrads { grads, by_id: sums };
        for layer in layers {
            layer.visit(&mut put);
        }
        Ok((done, self.overlapped))
    }

    /// Sends layer `layer`'s gradients (`grads` plus `earlier`, zeros for a parameter with none)
    /// in buckets; the number of values sent.
    fn send_layer<M: AutodiffModule<AB>>(&mut self, layer: usize, module: &M, names: &HashMap<ParamId, String>, grads: &GradientsParams, earlier: Option<&GradientsParams>) -> usize {
        self.launched[layer] = true;
        let flat = flatten::<AB, M>(module, names, Source::Sum { grads, earlier });
        let lengths: Vec<usize> = flat.iter().map(|f| f.2.dims()[0]).collect();
        let mut flat = flat.into_iter();
        for range in super::buckets(&lengths) {
            let bucket: Vec<_> = flat.by_ref().take(range.len()).collect();
            self.buckets.push(bucket.iter().map(|(_, id, t)| (*id, t.dims()[0], t.dtype())).collect());
            let all = Tensor::cat(bucket.into_iter().map(|f| crate::model::proj::to_dtype(f.2, DType::F32)).collect(), 0);
            // A closed channel means the thread stopped on an error, which `finish` reports.
            if let Some(to_ring) = &self.to_ring {
                let _ = to_ring.send(all);
            }
        }
        lengths.iter().sum()
    }
}
