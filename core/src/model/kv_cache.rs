//! Key/value cache for incremental decoding.
//!
//! Each layer keeps `k` and `v` as `[batch, kv_heads, cached_len, head_dim]` (`[batch, cached_len,
//! kv_heads, head_dim]` on the fused CPU path, `model::fused`; after RoPE, before
//! the GQA expansion, so memory is `kv_heads`-wide, not `heads`-wide). The cache also keeps which
//! cached key positions are real tokens (left padding and finished rows are not).

use burn::tensor::{Int, Tensor, backend::Backend};

use crate::model::fused::{self, RowSpec};

/// Cached keys and values of one decoder layer: buffers with room to grow along the sequence
/// axis, of which the first `len` positions are filled. A decoding step writes its keys in
/// place (`slice_assign` on a buffer nothing else holds), so a token costs O(1) copies, not the
/// O(cached) of concatenating; a full buffer grows by half (amortised O(1) per token).
#[derive(Debug, Clone)]
pub struct LayerCache<B: Backend> {
    kv: Option<(Tensor<B, 4>, Tensor<B, 4>)>,
    /// Filled positions of `kv` along `seq_dim`.
    len: usize,
    /// The sequence axis of `kv` (see [`LayerCache::append_along`]).
    seq_dim: usize,
}

/// Positions a buffer grows by at least (and rounds its size up to).
const GROW: usize = 64;

/// Decoding on the GPU backends attends over the cached keys rounded up to a multiple of this
/// (the extra ones masked, [`LayerCache::append_padded`]): burn's kernels are compiled, and
/// autotuned, per shape, and their vector widths follow the key count's factors, so a key count
/// that grew by one at every token cost new kernels at every token (measured on lavapipe: about
/// 4 kernels, 4 s, per decoded token after the first). Rounded, the shapes change once per 64
/// tokens, for at most 63 masked keys per query.
pub const KEY_BUCKET: usize = GROW;

impl<B: Backend> LayerCache<B> {
    fn empty(seq_dim: usize) -> Self {
        Self { kv: None, len: 0, seq_dim }
    }

    /// A cache holding exactly `k` and `v` (no spare room).
    fn holding(kv: Option<(Tensor<B, 4>, Tensor<B, 4>)>, seq_dim: usize) -> Self {
        let len = kv.as_ref().map_or(0, |(k, _)| k.dims()[seq_dim]);
        Self { kv, len, seq_dim }
    }

    /// The filled part of the buffers (views, no copy).
    fn filled(&self) -> Option<(Tensor<B, 4>, Tensor<B, 4>)> {
        let (dim, len) = (self.seq_dim, self.len);
        self.kv.as_ref().map(|(k, v)| (k.clone().narrow(dim, 0, len), v.clone().narrow(dim, 0, len)))
    }

    /// Takes the filled keys and values out, sequence-major `[B, S, K, d]` whichever layout the
    /// cache keeps (`None` if never appended to), leaving the layer empty.
    pub(crate) fn take_seq_major(&mut self) -> Option<(Tensor<B, 4>, Tensor<B, 4>)> {
        let (k, v) = self.filled()?;
        *self = Self::empty(self.seq_dim);
        Some(match self.seq_dim {
            1 => (k, v),
            _ => (k.swap_dims(1, 2), v.swap_dims(1, 2)),
        })
    }

    /// Appends new keys/values `[batch, kv_heads, new, head_dim]` and returns the full ones.
    pub fn append(&mut self, k: Tensor<B, 4>, v: Tensor<B, 4>) -> (Tensor<B, 4>, Tensor<B, 4>) {
        self.append_along(k, v, 2)
    }

    /// Appends new keys/values along axis `dim` (the sequence axis of the layout in use: 2 for
    /// `[batch, kv_heads, seq, head_dim]`, 1 for the fused CPU path's `[batch, seq, kv_heads,
    /// head_dim]`) and returns the full ones (views of the buffers).
    pub fn append_along(&mut self, k: Tensor<B, 4>, v: Tensor<B, 4>, dim: usize) -> (Tensor<B, 4>, Tensor<B, 4>) {
        self.append_padded(k, v, dim, 0)
    }

    /// [`LayerCache::append_along`], returning the first `keys` positions of the buffers when
    /// that is more than the filled ones (see [`KEY_BUCKET`]): the positions past the filled
    /// ones hold zeros, for keys the attention mask hides.
    pub fn append_padded(&mut self, k: Tensor<B, 4>, v: Tensor<B, 4>, dim: usize, keys: usize) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let (len, needed) = (self.len, self.len + k.dims()[dim]);
        let (kb, vb) = match self.kv.take() {
            None if keys <= needed => {
                *self = Self::holding(Some((k.clone(), v.clone())), dim);
                return (k, v);
            }
            // Nothing cached yet, but padded keys asked for: zeros of that room.
            None => {
                let zeros = |t: &Tensor<B, 4>| {
                    let mut shape = t.dims();
                    shape[dim] = keys.next_multiple_of(GROW);
                    Tensor::zeros(shape, (&t.device(), t.dtype()))
                };
                (zeros(&k), zeros(&v))
            }
            Some(kv) => kv,
        };
        let room = needed.max(keys);
        let (kb, vb) = if room > kb.dims()[dim] {
            let capacity = room.max(len + len / 2).next_multiple_of(GROW);
            (grow(kb, dim, len, capacity), grow(vb, dim, len, capacity))
        } else {
            (kb, vb)
        };
        let write = |buffer: Tensor<B, 4>, new: Tensor<B, 4>| crate::model::fused::assign(buffer, dim, len, new);
        self.kv = Some((write(kb, k), write(vb, v)));
        self.len = needed;
        match self.kv.as_ref() {
            Some((k, v)) if keys > needed => (k.clone().narrow(dim, 0, keys), v.clone().narrow(dim, 0, keys)),
            _ => self.filled().expect("just filled"),
        }
    }
}

/// The first `len` positions of `buffer` along `dim`, in a buffer of `capacity` positions.
fn grow<B: Backend>(buffer: Tensor<B, 4>, dim: usize, len: usize, capacity: usize) -> Tensor<B, 4> {
    let mut shape = buffer.dims();
    shape[dim] = capacity - len;
    let spare = Tensor::zeros(shape, (&buffer.device(), buffer.dtype()));
    Tensor::cat(vec![buffer.narrow(dim, 0, len), spare], dim)
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
        Self { layers: vec![LayerCache::empty(2); num_layers], key_valid: None }
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
        if let Some(host) = self.host_rows(&rows) {
            let specs: Vec<RowSpec> = host.iter().map(|&row| RowSpec { source: 0, row, from: 0, at: 0 }).collect();
            if let Some(layers) = Self::gathered(&[&self], &specs, self.len()) {
                let key_valid = self.key_valid.map(|m| m.select(0, rows));
                return Self { layers, key_valid };
            }
        }
        let layers = self
            .layers
            .into_iter()
            .map(|layer| {
                let kv = layer.filled().map(|(k, v)| (k.select(0, rows.clone()), v.select(0, rows.clone())));
                LayerCache::holding(kv, layer.seq_dim)
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
        let specs: Vec<RowSpec> = caches
            .iter()
            .enumerate()
            .flat_map(|(source, c)| {
                let rows = c.key_valid.as_ref().map_or(0, |m| m.dims()[0]);
                (0..rows).map(move |row| RowSpec { source, row, from: 0, at: len - c.len() })
            })
            .collect();
        if let Some(layers) = Self::gathered(&caches.iter().collect::<Vec<_>>(), &specs, len) {
            let key_valid: Option<Vec<_>> = caches.into_iter().map(|c| left_padded_mask(c.key_valid, len)).collect();
            return Self { layers, key_valid: key_valid.map(|m| Tensor::cat(m, 0)) };
        }
        let padded: Vec<Self> = caches.into_iter().map(|c| c.left_pad(len)).collect();
        let num_layers = padded.first().map_or(0, |c| c.layers.len());
        let layers = (0..num_layers)
            .map(|i| {
                let seq_dim = padded[0].layers[i].seq_dim;
                let kv: Option<Vec<_>> = padded.iter().map(|c| c.layers[i].filled()).collect();
                let kv = kv.map(|kv| {
                    let (k, v): (Vec<_>, Vec<_>) = kv.into_iter().unzip();
                    (Tensor::cat(k, 0), Tensor::cat(v, 0))
                });
                LayerCache::holding(kv, seq_dim)
            })
            .collect();
        let key_valid: Option<Vec<_>> = padded.into_iter().map(|c| c.key_valid).collect();
        Self { layers, key_valid: key_valid.map(|m| Tensor::cat(m, 0)) }
    }

    /// On the Flex backend, the layers of `sources` gathered row by row into new buffers with
    /// room for [`GROW`] more positions, one copy per layer ([`fused::gather_rows`]: the
    /// next decoding steps write in place, where burn's ops would copy the cache again to
    /// pad, concatenate and grow it). `len` is the result's filled length. `None` where that
    /// does not apply.
    fn gathered(sources: &[&Self], specs: &[RowSpec], len: usize) -> Option<Vec<LayerCache<B>>> {
        let capacity = (len + GROW).next_multiple_of(GROW);
        let num_layers = sources.first()?.layers.len();
        (0..num_layers)
            .map(|i| {
                let seq_dim = sources[0].layers[i].seq_dim;
                // The fused CPU path's `[batch, seq, kv_heads, head_dim]` layout only.
                if seq_dim != 1 || sources.iter().any(|c| c.layers[i].seq_dim != 1 || c.layers[i].len != c.len()) {
                    return None;
                }
                let (k, v): (Vec<_>, Vec<_>) = sources.iter().map(|c| c.layers[i].filled()).collect::<Option<Vec<_>>>()?.into_iter().unzip();
                let (k, v) = (fused::gather_rows(&k, specs, capacity)?, fused::gather_rows(&v, specs, capacity)?);
                Some(LayerCache { kv: Some((k, v)), len, seq_dim })
            })
            .collect()
    }

    /// `rows` on the host, when the Flex fast path may take them (reading them back is free there).
    fn host_rows(&self, rows: &Tensor<B, 1, Int>) -> Option<Vec<usize>> {
        if !fused::is_flex::<B>() {
            return None;
        }
        let host: Vec<i64> = rows.clone().into_data().convert::<i64>().into_vec().ok()?;
        host.into_iter().map(|r| usize::try_from(r).ok()).collect()
    }

    /// The cache with `len - self.len()` padding positions in front.
    fn left_pad(self, len: usize) -> Self {
        let extra = len - self.len();
        let valid = match (&self.key_valid, extra) {
            (Some(valid), 1..) => valid.clone(),
            _ => return self,
        };
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
                LayerCache::holding(layer.filled().map(|(k, v)| (pad(k), pad(v))), dim)
            })
            .collect();
        Self { layers, key_valid: left_padded_mask(Some(valid), len) }
    }

    /// Drops leading positions that are padding in every row (left behind by rows that left the
    /// batch), so the cache is no longer than its longest live sequence.
    pub fn trim(self) -> Self {
        let Some(valid) = self.key_valid.clone() else { return self };
        let [batch, len] = valid.dims();
        let start = first_kept(&valid);
        if start == 0 {
            return self;
        }
        let keep = len - start;
        let specs: Vec<RowSpec> = (0..batch).map(|row| RowSpec { source: 0, row, from: start, at: 0 }).collect();
        if let Some(layers) = Self::gathered(&[&self], &specs, keep) {
            return Self { layers, key_valid: Some(valid.narrow(1, start, keep)) };
        }
        let layers = self
            .layers
            .into_iter()
            .map(|l| LayerCache::holding(l.filled().map(|(k, v)| (k.narrow(l.seq_dim, start, keep), v.narrow(l.seq_dim, start, keep))), l.seq_dim))
            .collect();
        Self { layers, key_valid: Some(valid.narrow(1, start, keep)) }
    }

    /// [`KvCache::select_rows`] then [`KvCache::trim`]; in one copy on the Flex backend (used to
    /// drop a running batch's finished rows).
    pub fn select_and_trim(self, rows: Tensor<B, 1, Int>) -> Self {
        if let (Some(host), Some(valid)) = (self.host_rows(&rows), self.key_valid.clone()) {
            let valid = valid.select(0, rows.clone());
            let len = valid.dims()[1];
            let start = first_kept(&valid);
            let specs: Vec<RowSpec> = host.iter().map(|&row| RowSpec { source: 0, row, from: start, at: 0 }).collect();
            if let Some(layers) = Self::gathered(&[&self], &specs, len - start) {
                return Self { layers, key_valid: Some(valid.narrow(1, start, len - start)) };
            }
        }
        self.select_rows(rows).trim()
    }
}

/// A key mask `[batch, cached]` with `len - cached` padding positions in front.
fn left_padded_mask<B: Backend>(valid: Option<Tensor<B, 2, Int>>, len: usize) -> Option<Tensor<B, 2, Int>> {
    match valid {
        Some(valid) if len > valid.dims()[1] => {
            let [batch, cached] = valid.dims();
            let device = valid.device();
            Some(Tensor::cat(vec![Tensor::zeros([batch, len - cached], &device), valid], 1))
        }
        valid => valid,
    }
}

/// The first position that is a real token in some row of `valid` `[batch, len]` (the last one if
/// none is): the positions before it are padding in every row.
fn first_kept<B: Backend>(valid: &Tensor<B, 2, Int>) -> usize {
    let [batch, len] = valid.dims();
    let host: Vec<i64> = valid.clone().into_data().convert::<i64>().into_vec().expect("int mask");
    (0..len).find(|&j| (0..batch).any(|b| host[b * len + j] != 0)).unwrap_or(len.saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::{Distribution, TensorData};

    fn chunk(shape: [usize; 4]) -> Tensor<Flex, 4> {
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), &Default::default())
    }

    #[test]
    fn appending_in_place_equals_concatenating() {
        for dim in [1, 2] {
            let mut cache = LayerCache::<Flex>::empty(dim);
            let (mut all_k, mut all_v): (Vec<Tensor<Flex, 4>>, Vec<Tensor<Flex, 4>>) = (vec![], vec![]);
            let mut grows = 0;
            let mut capacity = 0;
            // A prefill of 5, then 300 decoding steps of one position.
            for step in 0..301 {
                let new = if step == 0 { 5 } else { 1 };
                let mut shape = [2, 3, 2, 4];
                shape[dim] = new;
                let (k, v) = (chunk(shape), chunk(shape));
                all_k.push(k.clone());
                all_v.push(v.clone());
                let (got_k, got_v) = cache.append_along(k, v, dim);
                let (want_k, want_v) = (Tensor::cat(all_k.clone(), dim), Tensor::cat(all_v.clone(), dim));
                assert_eq!(got_k.dims(), want_k.dims());
                got_k.into_data().assert_eq(&want_k.into_data(), true);
                got_v.into_data().assert_eq(&want_v.into_data(), true);
                let now = cache.kv.as_ref().unwrap().0.dims()[dim];
                grows += (now != capacity) as usize;
                capacity = now;
            }
            // 305 positions: 5 exact, then 64, 128, 192, 320 (by half, in steps of 64).
            assert_eq!((capacity, grows), (320, 5), "dim {dim}");
        }
    }

    #[test]
    fn rows_selected_and_stacked_keep_only_filled_positions() {
        let mut a = KvCache::<Flex>::new(1);
        let device = Default::default();
        a.layers[0].append(chunk([2, 1, 3, 2]), chunk([2, 1, 3, 2]));
        a.layers[0].append(chunk([2, 1, 1, 2]), chunk([2, 1, 1, 2])); // grows to 64 positions
        a.key_valid = Some(Tensor::from_data(TensorData::new(vec![1i64; 8], [2, 4]), &device));
        let one = a.clone().select_rows(Tensor::from_data(TensorData::new(vec![1i64, 1, 0], [3]), &device));
        assert_eq!(one.layers[0].filled().unwrap().0.dims(), [3, 1, 4, 2]);
        let stacked = KvCache::stack(vec![one, a]);
        assert_eq!(stacked.layers[0].filled().unwrap().0.dims(), [5, 1, 4, 2]);
        assert_eq!(stacked.len(), 4);
    }

    /// The Flex fast path of `select_rows`, `stack` and `trim` (one copy into buffers with room
    /// to grow, `[batch, seq, kv_heads, head_dim]` layers) gives burn's ops' values.
    #[test]
    fn gathered_rows_equal_selecting_padding_and_narrowing() {
        let device = Default::default();
        let index = |rows: &[i64]| Tensor::<Flex, 1, Int>::from_data(TensorData::new(rows.to_vec(), [rows.len()]), &device);
        let cache = |batch: usize, len: usize, valid: Vec<i64>| {
            let mut c = KvCache::<Flex>::new(2);
            for layer in &mut c.layers {
                layer.append_along(chunk([batch, len, 2, 4]), chunk([batch, len, 2, 4]), 1);
            }
            c.key_valid = Some(Tensor::from_data(TensorData::new(valid, [batch, len]), &device));
            c
        };
        let filled = |c: &KvCache<Flex>| c.layers.iter().map(|l| l.filled().unwrap()).collect::<Vec<_>>();
        let same = |got: Vec<(Tensor<Flex, 4>, Tensor<Flex, 4>)>, want: Vec<(Tensor<Flex, 4>, Tensor<Flex, 4>)>| {
            for ((k, v), (wk, wv)) in got.into_iter().zip(want) {
                k.into_data().assert_eq(&wk.into_data(), true);
                v.into_data().assert_eq(&wv.into_data(), true);
            }
        };
        let a = cache(2, 5, vec![0, 1, 1, 1, 1, 0, 0, 1, 1, 1]);
        let b = cache(1, 3, vec![1, 1, 1]);

        let selected = a.clone().select_rows(index(&[1, 1, 0]));
        same(filled(&selected), filled(&a).into_iter().map(|(k, v)| (k.select(0, index(&[1, 1, 0])), v.select(0, index(&[1, 1, 0])))).collect());
        // Flex's row gather leaves room to grow; plain burn ops select the filled positions only.
        let fast = fused::is_flex::<Flex>();
        let room = selected.layers[0].kv.as_ref().unwrap().0.dims()[1];
        assert!(if fast { room > 5 } else { room == 5 }, "capacity {room} after selecting (fast path: {fast})");

        let stacked = KvCache::stack(vec![a.clone(), b.clone()]);
        let pad = |t: Tensor<Flex, 4>| Tensor::cat(vec![Tensor::zeros([1, 2, 2, 4], &device), t], 1);
        let want = filled(&a).into_iter().zip(filled(&b)).map(|((ka, va), (kb, vb))| (Tensor::cat(vec![ka, pad(kb)], 0), Tensor::cat(vec![va, pad(vb)], 0)));
        same(filled(&stacked), want.collect());
        let valid: Vec<i64> = stacked.key_valid.clone().unwrap().into_data().convert::<i64>().to_vec().unwrap();
        assert_eq!(valid, [0, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1]);

        // Rows 1 and 1 of `a`: positions 0 and 1 are padding in both.
        let kept = a.clone().select_and_trim(index(&[1, 1]));
        assert_eq!(kept.len(), 3);
        same(filled(&kept), filled(&a).into_iter().map(|(k, v)| (k.select(0, index(&[1, 1])).narrow(1, 2, 3), v.select(0, index(&[1, 1])).narrow(1, 2, 3))).collect());

        // Position 0 is padding in both rows of `a`.
        let mut trimmed = a.clone().trim();
        assert_eq!(trimmed.len(), 4);
        same(filled(&trimmed), filled(&a).into_iter().map(|(k, v)| (k.narrow(1, 1, 4), v.narrow(1, 1, 4))).collect());
        // On the fast path the next position is written into the gathered buffer, not a grown copy.
        let capacity = trimmed.layers[0].kv.as_ref().unwrap().0.dims()[1];
        trimmed.layers[0].append_along(chunk([2, 1, 2, 4]), chunk([2, 1, 2, 4]), 1);
        // (Plain burn ops trimmed to the filled positions, so the append grows the buffer.)
        let grown = trimmed.layers[0].kv.as_ref().unwrap().0.dims()[1];
        assert!(if fast { grown == capacity } else { grown > capacity }, "capacity {capacity} → {grown} (fast path: {fast})");
        assert_eq!(trimmed.layers[0].len, 5);
    }

    #[test]
    fn padded_keys_are_the_filled_ones_then_zeros() {
        let mut cache = LayerCache::<Flex>::empty(2);
        let (prompt, next) = (chunk([2, 1, 5, 3]), chunk([2, 1, 1, 3]));
        // The prefill fills exactly; a decoding step asks for keys up to the next bucket.
        cache.append_padded(prompt.clone(), prompt.clone(), 2, 5);
        let (k, v) = cache.append_padded(next.clone(), next.clone(), 2, KEY_BUCKET);
        assert_eq!((k.dims(), v.dims(), cache.len), ([2, 1, KEY_BUCKET, 3], [2, 1, KEY_BUCKET, 3], 6));
        let filled = Tensor::cat(vec![prompt, next], 2);
        k.clone().narrow(2, 0, 6).into_data().assert_eq(&filled.into_data(), true);
        let rest: Vec<f32> = k.narrow(2, 6, KEY_BUCKET - 6).into_data().to_vec().unwrap();
        assert!(rest.iter().all(|&x| x == 0.0), "positions past the filled ones are zeros");
        // Asking for fewer keys than are filled returns the filled ones.
        let (k, _) = cache.append_padded(chunk([2, 1, 1, 3]), chunk([2, 1, 1, 3]), 2, 0);
        assert_eq!(k.dims(), [2, 1, 7, 3]);
        // From an empty cache too.
        let mut empty = LayerCache::<Flex>::empty(2);
        let (k, _) = empty.append_padded(chunk([1, 2, 3, 4]), chunk([1, 2, 3, 4]), 2, 8);
        assert_eq!((k.dims(), empty.len), ([1, 2, 8, 4], 3));
    }
}
