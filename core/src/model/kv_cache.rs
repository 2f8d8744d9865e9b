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
        Self { layers: vec![LayerCache { kv: None }; num_layers], key_valid: None }
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
            })
            .collect();
        let key_valid = self.key_valid.map(|m| m.select(0, rows));
        Self { layers, key_valid }
    }
}
