//! Key/value cache for incremental decoding.
//!
//! Each layer keeps `k` and `v` as `[batch, kv_heads, cached_len, head_dim]` (`[batch, cached_len,
//! kv_heads, head_dim]` on the fused CPU path, `model::fused`; after RoPE, before
//! the GQA expansion, so memory is `kv_heads`-wide, not `heads`-wide). The cache also keeps which
//! cached key positions are real tokens (left padding and finished rows are not).

use burn::tensor::{Int, Tensor, backend::Backend};

/// Cached keys and values of one decoder layer.
#[derive(Debug, Clone)]
pub struct LayerCache<B: Backend> {
    kv: Option<(Tensor<B, 4>, Tensor<B, 4>)>,
    /// The sequence axis of `kv` (see [`LayerCache::append_along`]).
    seq_dim: usize,
}

impl<B: Backend> LayerCache<B> {
    /// Appends new keys/values `[batch, kv_heads, new, head_dim]` and returns the full ones.
    pub fn append(&mut self, k: Tensor<B, 4>, v: Tensor<B, 4>) -> (Tensor<B, 4>, Tensor<B, 4>) {
        self.append_along(k, v, 2)
    }

    /// Appends new keys/values along axis `dim` (the sequence axis of the layout in use: 2 for
    /// `[batch, kv_heads, seq, head_dim]`, 1 for the fused CPU path's `[batch, seq, kv_heads,
    /// head_dim]`) and returns the full ones.
    pub fn append_along(&mut self, k: Tensor<B, 4>, v: Tensor<B, 4>, dim: usize) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let (k, v) = match self.kv.take() {
            None => (k, v),
            Some((k0, v0)) => (Tensor::cat(vec![k0, k], dim), Tensor::cat(vec![v0, v], dim)),
        };
        self.kv = Some((k.clone(), v.clone()));
        self.seq_dim = dim;
        (k, v)
    }
}

/// The cache of a whole model.
#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    pub(crate) layers: Vec<LayerCache<B>>,
    /// `[batch, cached_len]`: 1 where the cached position is a real token, 0 for padding.
    pub(crate) key_valid: Option<Tensor<B, 2, Int>>,
}

impl<B: Backend> KvCache<B> {
    /// An empty cache for a model with `num_layers` decoder layers.
    pub fn new(num_layers: usize) -> Self {
        Self { layers: vec![LayerCache { kv: None, seq_dim: 2 }; num_layers], key_valid: None }
    }

    /// Number of cached positions.
    pub fn len(&self) -> usize {
        self.key_valid.as_ref().map_or(0, |m| m.dims()[1])
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps (and possibly repeats) batch rows: row `i` of the result is row `rows[i]` of `self`.
    /// Used to fan one prefill out to `n` samples and to drop finished rows.
    pub fn select_rows(self, rows: Tensor<B, 1, Int>) -> Self {
        let layers = self
            .layers
            .into_iter()
            .map(|layer| LayerCache {
                kv: layer
                    .kv
                    .map(|(k, v)| (k.select(0, rows.clone()), v.select(0, rows.clone()))),
                seq_dim: layer.seq_dim,
            })
            .collect();
        let key_valid = self.key_valid.map(|m| m.select(0, rows));
        Self { layers, key_valid }
    }
}

impl<B: Backend> KvCache<B> {
    /// Stacks caches of the same model along the batch: shorter ones are left-padded with
    /// positions marked as padding (zero keys and values that no query sees), so every row keeps
    /// its own positions. Used to add newly prefilled sequences to a running batch.
    pub fn stack(caches: Vec<Self>) -> Self {
        let len = caches.iter().map(Self::len).max().unwrap_or(0);
        let padded: Vec<Self> = caches.into_iter().map(|c| c.left_pad(len)).collect();
        let num_layers = padded.first().map_or(0, |c| c.layers.len());
        let layers = (0..num_layers)
            .map(|i| {
                let seq_dim = padded[0].layers[i].seq_dim;
                let kv: Option<Vec<_>> = padded.iter().map(|c| c.layers[i].kv.clone()).collect();
                let kv = kv.map(|kv| {
                    let (k, v): (Vec<_>, Vec<_>) = kv.into_iter().unzip();
                    (Tensor::cat(k, 0), Tensor::cat(v, 0))
                });
                LayerCache { kv, seq_dim }
            })
            .collect();
        let key_valid: Option<Vec<_>> = padded.into_iter().map(|c| c.key_valid).collect();
        Self { layers, key_valid: key_valid.map(|m| Tensor::cat(m, 0)) }
    }

    /// The cache with `len - self.len()` padding positions in front.
    fn left_pad(self, len: usize) -> Self {
        let extra = len - self.len();
        let valid = match (&self.key_valid, extra) {
            (Some(valid), 1..) => valid.clone(),
            _ => return self,
        };
        let [batch, _] = valid.dims();
        let device = valid.device();
        let layers = self
            .layers
            .into_iter()
            .map(|layer| {
                let dim = layer.seq_dim;
                let pad = |t: Tensor<B, 4>| {
                    let mut shape = t.dims();
                    shape[dim] = extra;
                    Tensor::cat(vec![Tensor::zeros(shape, &device), t], dim)
                };
                LayerCache { kv: layer.kv.map(|(k, v)| (pad(k), pad(v))), seq_dim: dim }
            })
            .collect();
        let valid = Tensor::cat(vec![Tensor::zeros([batch, extra], &device), valid], 1);
        Self { layers, key_valid: Some(valid) }
    }

    /// Drops leading positions that are padding in every row (left behind by rows that left the
    /// batch), so the cache is no longer than its longest live sequence.
    pub fn trim(self) -> Self {
        let Some(valid) = self.key_valid.clone() else { return self };
        let [batch, len] = valid.dims();
        let host: Vec<i64> = valid.clone().into_data().convert::<i64>().into_vec().expect("int mask");
        let start = (0..len).find(|&j| (0..batch).any(|b| host[b * len + j] != 0)).unwrap_or(len.saturating_sub(1));
        if start == 0 {
            return self;
        }
        let keep = len - start;
        let layers = self
            .layers
            .into_iter()
            .map(|l| LayerCache { kv: l.kv.map(|(k, v)| (k.narrow(l.seq_dim, start, keep), v.narrow(l.seq_dim, start, keep))), seq_dim: l.seq_dim })
            .collect();
        Self { layers, key_valid: Some(valid.narrow(1, start, keep)) }
    }
}

