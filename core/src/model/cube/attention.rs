//! Flash attention in CubeCL, forward and backward: the scores never exist as a tensor, so
//! attention's memory is that of its inputs and outputs (`O(T·d)` per head instead of `O(T·S)`).
//!
//! q `[B, H, T, d]`, k and v `[B, K, S, d]` (head-major, as the model's dense path lays them
//! out), GQA by grouping (query head `h` reads KV head `h / (H / K)`; K and V are never
//! repeated), the causal mask aligned bottom-right (query `i` is position `S − T + i`: decoding
//! from a cache), and the mask rule of [`crate::model::chunked_attention::chunk_mask`] from the
//! keys' labels `[B, S]` (0 padding, equal labels one packed document). Scores, softmax and
//! sums in f32 whatever the inputs' dtype; the log-sum-exp of each query row is saved for the
//! backward pass (FlashAttention-2's recomputation).
//!
//! One unit per query row (forward, `dq`) or key row (`dk`, `dv`), a cube of units sharing each
//! tile of the other side through shared memory; no cooperative matrices, so it runs on every
//! wgpu adapter (lavapipe, WebGPU) and on CUDA. Key tiles wholly after a query block's last
//! position are never read (causal block skipping). On wgpu a problem whose busiest unit would
//! loop more than [`WGPU_LOOP_BUDGET`] times is declined (lavapipe's limit, see there).

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::{BalancedCheckpointing, CheckpointStrategy, NoCheckpointing};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Int, Shape, Tensor};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::{BoolElement, CubeRuntime, tensor::CubeTensor};

use super::{Fused, custom, float, retype, wrap};
use crate::model::custom_op::{self, value};

/// Units per cube: query rows (forward, `dq`) or key rows (`dk`, `dv`).
const ROWS: usize = 32;

/// Rows of the other side per tile in shared memory: two tiles of `TILE · d` f32 stay at 8 KiB
/// for every head size (WebGPU guarantees 16 KiB).
fn tile(d: usize) -> usize {
    (1024 / d).max(1)
}

/// lavapipe (Mesa's llvmpipe) silently stops a shader's loops once an invocation has run about
/// 65,536 iterations in all (measured here: rows past 224 keys of head size 128 came out wrong;
/// llama.cpp's Vulkan tests met the same, ggml-org/llama.cpp#13813). On wgpu, whose adapter
/// cubecl does not name, the kernels take only problems whose units stay below this budget;
/// larger ones take the chunked form (burn's operations). CUDA has no such limit.
const WGPU_LOOP_BUDGET: usize = 60_000;

/// Loop iterations of the busiest unit of the forward kernel (and, for training, of the backward
/// kernels), over `keys` keys and `queries` queries per KV group of `group` heads.
fn loop_iterations(queries: usize, keys: usize, group: usize, d: usize, backward: bool) -> usize {
    let (tile, loads) = (tile(d), (tile(d) * d).div_ceil(ROWS) + tile(d).div_ceil(ROWS));
    let tiles = keys.div_ceil(tile);
    let forward = 2 * d + tiles * (loads + 2 * tile + d + 1) + keys * 2 * d;
    if !backward {
        return forward;
    }
    let dq = 3 * d + tiles * (loads + tile + 1) + keys * 3 * d;
    let dkv = 4 * d + group * queries.div_ceil(tile) * (loads + tile + 1) + group * queries * 4 * d;
    forward.max(dq).max(dkv)
}

/// Whether runtime `R` is wgpu's (see [`WGPU_LOOP_BUDGET`]).
fn loop_limited<R: CubeRuntime>() -> bool {
    std::any::type_name::<R>().contains("WgpuRuntime")
}

/// The head sizes the kernels take: any up to 256 (each compiled as its own kernel, the head
/// size a comptime constant; a unit keeps up to four head-sized rows in registers).
pub fn supports(head_dim: usize) -> bool {
    (1..=256).contains(&head_dim)
}

mod kernel {
    use cubecl::prelude::*;

    /// A masked score (finite, so that no arithmetic meets an infinity).
    pub const HIDDEN: f32 = -1.0e30;

    /// Whether the query at position `p` with label `ql` sees key `j` with label `kl`: a key up
    /// to its own position that carries its label, and itself always; a padding query (label 0)
    /// sees every real key before it.
    #[cube]
    fn visible(p: usize, ql: f32, j: usize, kl: f32) -> bool {
        let document = kl != 0.0 && (ql == 0.0 || kl == ql);
        j <= p && (j == p || document)
    }

    /// Fills the key tile from key `start` on: k and v rows (from `kv`, the KV head's first
    /// element) and their labels (from `label_row`), the cube's units sharing the loads; keys
    /// past the end repeat the last (the mask hides them).
    #[cube]
    #[allow(clippy::too_many_arguments)]
    fn load_keys<F: Float>(
        k: &Tensor<F>,
        v: &Tensor<F>,
        labels: &Tensor<f32>,
        k_tile: &mut SharedMemory<f32>,
        v_tile: &mut SharedMemory<f32>,
        l_tile: &mut SharedMemory<f32>,
        start: usize,
        kv: usize,
        label_row: usize,
        s_len: usize,
        #[comptime] d: usize,
        #[comptime] rows: usize,
        #[comptime] tile: usize,
    ) {
        let mut e = UNIT_POS as usize;
        while e < tile * d {
            let j = min(start + e / d, s_len - 1);
            k_tile[e] = f32::cast_from(k[kv + j * d + e % d]);
            v_tile[e] = f32::cast_from(v[kv + j * d + e % d]);
            e += rows;
        }
        let mut e = UNIT_POS as usize;
        while e < tile {
            l_tile[e] = labels[label_row + min(start + e, s_len - 1)];
            e += rows;
        }
    }

    /// Forward: one unit per query row, key tiles shared by the cube. `out` like `q`; `lse`
    /// `[B, H, T, 1]`; `labels` `[B, 1, 1, S]`; `q` pre-scaled here by `scale`.
    #[cube(launch)]
    pub fn flash_forward<F: Float>(
        q: &Tensor<F>,
        k: &Tensor<F>,
        v: &Tensor<F>,
        labels: &Tensor<f32>,
        out: &mut Tensor<F>,
        lse: &mut Tensor<f32>,
        scale: f32,
        #[comptime] d: usize,
        #[comptime] rows: usize,
        #[comptime] tile: usize,
        #[define(F)] _dtype: StorageType,
    ) {
        let (heads, t_len) = (q.shape(1), q.shape(2));
        let (kv_heads, s_len) = (k.shape(1), k.shape(2));
        let b = CUBE_POS_Z as usize;
        let h = CUBE_POS_Y as usize;
        let kh = h / (heads / kv_heads);
        let block = CUBE_POS_X as usize * rows;
        let i = block + UNIT_POS as usize;
        let live = i < t_len;
        let offset = s_len - t_len;
        let p = offset + min(i, t_len - 1);
        let row = (b * heads + h) * t_len + min(i, t_len - 1);
        let kv = (b * kv_heads + kh) * s_len * d;
        let ql = labels[b * s_len + p];

        let mut qrow = Array::<f32>::new(d);
        let mut acc = Array::<f32>::new(d);
        for c in 0..d {
            qrow[c] = f32::cast_from(q[row * d + c]) * scale;
            acc[c] = 0.0;
        }
        let mut scores = Array::<f32>::new(tile);
        let mut k_tile = SharedMemory::<f32>::new(tile * d);
        let mut v_tile = SharedMemory::<f32>::new(tile * d);
        let mut l_tile = SharedMemory::<f32>::new(tile);
        let mut m = f32::new(HIDDEN);
        let mut l = 0.0f32;
        // Keys up to the block's last query position.
        let last = offset + min(block + rows, t_len) - 1;
        let mut start = 0usize;
        while start <= last {
            load_keys::<F>(k, v, labels, &mut k_tile, &mut v_tile, &mut l_tile, start, kv, b * s_len, s_len, d, rows, tile);
            sync_cube();
            let mut tile_max = f32::new(HIDDEN);
            for jj in 0..tile {
                let mut s = f32::new(HIDDEN);
                if visible(p, ql, start + jj, l_tile[jj]) {
                    let mut dot = 0.0f32;
                    for c in 0..d {
                        dot += qrow[c] * k_tile[jj * d + c];
                    }
                    s = dot;
                }
                scores[jj] = s;
                tile_max = max(tile_max, s);
            }
            let m_new = max(m, tile_max);
            let correction = (m - m_new).exp();
            l *= correction;
            for c in 0..d {
                acc[c] *= correction;
            }
            // (As a `select`: the same loop with the update under an `if` came out wrong on
            // lavapipe at 1,098 tokens, tests/packing.rs.)
            for jj in 0..tile {
                let weight = select(scores[jj] > HIDDEN, (scores[jj] - m_new).exp(), 0.0f32);
                l += weight;
                for c in 0..d {
                    acc[c] += weight * v_tile[jj * d + c];
                }
            }
            m = m_new;
            sync_cube();
            start += tile;
        }
        if live {
            for c in 0..d {
                out[row * d + c] = F::cast_from(acc[c] / l);
            }
            lse[row] = m + l.ln();
        }
    }

    /// `dq`: one unit per query row, key tiles shared. `delta` `[B, H, T, 1]` is
    /// `Σ_c dout · out` of each row.
    #[cube(launch)]
    pub fn flash_backward_dq<F: Float>(
        q: &Tensor<F>,
        k: &Tensor<F>,
        v: &Tensor<F>,
        labels: &Tensor<f32>,
        dout: &Tensor<F>,
        lse: &Tensor<f32>,
        delta: &Tensor<f32>,
        dq: &mut Tensor<F>,
        scale: f32,
        #[comptime] d: usize,
        #[comptime] rows: usize,
        #[comptime] tile: usize,
        #[define(F)] _dtype: StorageType,
    ) {
        let (heads, t_len) = (q.shape(1), q.shape(2));
        let (kv_heads, s_len) = (k.shape(1), k.shape(2));
        let b = CUBE_POS_Z as usize;
        let h = CUBE_POS_Y as usize;
        let kh = h / (heads / kv_heads);
        let block = CUBE_POS_X as usize * rows;
        let i = block + UNIT_POS as usize;
        let live = i < t_len;
        let offset = s_len - t_len;
        let p = offset + min(i, t_len - 1);
        let row = (b * heads + h) * t_len + min(i, t_len - 1);
        let kv = (b * kv_heads + kh) * s_len * d;
        let ql = labels[b * s_len + p];
        let (row_lse, row_delta) = (lse[row], delta[row]);

        let mut qrow = Array::<f32>::new(d);
        let mut drow = Array::<f32>::new(d);
        let mut acc = Array::<f32>::new(d);
        for c in 0..d {
            qrow[c] = f32::cast_from(q[row * d + c]) * scale;
            drow[c] = f32::cast_from(dout[row * d + c]);
            acc[c] = 0.0;
        }
        let mut k_tile = SharedMemory::<f32>::new(tile * d);
        let mut v_tile = SharedMemory::<f32>::new(tile * d);
        let mut l_tile = SharedMemory::<f32>::new(tile);
        let last = offset + min(block + rows, t_len) - 1;
        let mut start = 0usize;
        while start <= last {
            load_keys::<F>(k, v, labels, &mut k_tile, &mut v_tile, &mut l_tile, start, kv, b * s_len, s_len, d, rows, tile);
            sync_cube();
            for jj in 0..tile {
                if visible(p, ql, start + jj, l_tile[jj]) {
                    let mut s = 0.0f32;
                    let mut dp = 0.0f32;
                    for c in 0..d {
                        s += qrow[c] * k_tile[jj * d + c];
                        dp += drow[c] * v_tile[jj * d + c];
                    }
                    let ds = (s - row_lse).exp() * (dp - row_delta);
                    for c in 0..d {
                        acc[c] += ds * k_tile[jj * d + c];
                    }
                }
            }
            sync_cube();
            start += tile;
        }
        if live {
            for c in 0..d {
                dq[row * d + c] = F::cast_from(acc[c] * scale);
            }
        }
    }

    /// `dk` and `dv`: one unit per key row of one KV head, summed over the group's query heads
    /// (no atomics); query tiles (q, dout, lse, delta, labels) shared. Query tiles wholly
    /// before the block's first key are never read.
    #[cube(launch)]
    pub fn flash_backward_dkv<F: Float>(
        q: &Tensor<F>,
        k: &Tensor<F>,
        v: &Tensor<F>,
        labels: &Tensor<f32>,
        dout: &Tensor<F>,
        lse: &Tensor<f32>,
        delta: &Tensor<f32>,
        dk: &mut Tensor<F>,
        dv: &mut Tensor<F>,
        scale: f32,
        #[comptime] d: usize,
        #[comptime] rows: usize,
        #[comptime] tile: usize,
        #[define(F)] _dtype: StorageType,
    ) {
        let (heads, t_len) = (q.shape(1), q.shape(2));
        let (kv_heads, s_len) = (k.shape(1), k.shape(2));
        let group = heads / kv_heads;
        let b = CUBE_POS_Z as usize;
        let kh = CUBE_POS_Y as usize;
        let block = CUBE_POS_X as usize * rows;
        let j = block + UNIT_POS as usize;
        let live = j < s_len;
        let jc = min(j, s_len - 1);
        let offset = s_len - t_len;
        let key = ((b * kv_heads + kh) * s_len + jc) * d;
        let kl = labels[b * s_len + jc];

        let mut krow = Array::<f32>::new(d);
        let mut vrow = Array::<f32>::new(d);
        let mut dk_acc = Array::<f32>::new(d);
        let mut dv_acc = Array::<f32>::new(d);
        for c in 0..d {
            krow[c] = f32::cast_from(k[key + c]) * scale;
            vrow[c] = f32::cast_from(v[key + c]);
            dk_acc[c] = 0.0;
            dv_acc[c] = 0.0;
        }
        let mut q_tile = SharedMemory::<f32>::new(tile * d);
        let mut d_tile = SharedMemory::<f32>::new(tile * d);
        let mut lse_tile = SharedMemory::<f32>::new(tile);
        let mut delta_tile = SharedMemory::<f32>::new(tile);
        let mut l_tile = SharedMemory::<f32>::new(tile);
        // The first query whose position reaches the block's first key, rounded down to a tile.
        let first = select(block > offset, block - offset, 0usize) / tile * tile;
        for g in 0..group {
            let rows_base = (b * heads + kh * group + g) * t_len;
            let mut start = first;
            while start < t_len {
                let mut e = UNIT_POS as usize;
                while e < tile * d {
                    let i = min(start + e / d, t_len - 1);
                    q_tile[e] = f32::cast_from(q[(rows_base + i) * d + e % d]);
                    d_tile[e] = f32::cast_from(dout[(rows_base + i) * d + e % d]);
                    e += rows;
                }
                let mut e = UNIT_POS as usize;
                while e < tile {
                    let i = min(start + e, t_len - 1);
                    lse_tile[e] = lse[rows_base + i];
                    delta_tile[e] = delta[rows_base + i];
                    l_tile[e] = labels[b * s_len + offset + i];
                    e += rows;
                }
                sync_cube();
                for ii in 0..tile {
                    if start + ii < t_len && visible(offset + start + ii, l_tile[ii], jc, kl) {
                        let mut s = 0.0f32;
                        let mut dp = 0.0f32;
                        for c in 0..d {
                            s += q_tile[ii * d + c] * krow[c];
                            dp += d_tile[ii * d + c] * vrow[c];
                        }
                        let weight = (s - lse_tile[ii]).exp();
                        let ds = weight * (dp - delta_tile[ii]);
                        for c in 0..d {
                            dv_acc[c] += weight * d_tile[ii * d + c];
                            dk_acc[c] += ds * q_tile[ii * d + c];
                        }
                    }
                }
                sync_cube();
                start += tile;
            }
        }
        if live {
            for c in 0..d {
                dk[key + c] = F::cast_from(dk_acc[c] * scale);
                dv[key + c] = F::cast_from(dv_acc[c]);
            }
        }
    }
}

fn cube_count(blocks: usize, heads: usize, batch: usize) -> cubecl::CubeCount {
    cubecl::CubeCount::Static(blocks as u32, heads as u32, batch as u32)
}

/// An uninitialised contiguous tensor on `like`'s device.
pub(super) fn empty<R: CubeRuntime>(like: &CubeTensor<R>, shape: Shape, dtype: DType) -> CubeTensor<R> {
    empty_device_contiguous_dtype(like.client.clone(), like.device.clone(), shape, dtype)
}

/// `(out, lse)` of the forward kernel on CubeCL tensors.
fn launch_forward<R: CubeRuntime>(inputs: [CubeTensor<R>; 4], scale: f32) -> Vec<CubeTensor<R>> {
    let [q, k, v, labels] = inputs.map(into_contiguous);
    let [batch, heads, queries, d] = q.meta.shape().dims::<4>();
    let out = empty(&q, q.meta.shape().clone(), q.dtype);
    let lse = empty(&q, Shape::new([batch, heads, queries, 1]), DType::F32);
    let client = q.client.clone();
    let dtype = q.dtype;
    kernel::flash_forward::launch::<R>(
        &client,
        cube_count(queries.div_ceil(ROWS), heads, batch),
        cubecl::CubeDim::new_1d(ROWS as u32),
        q.into_tensor_arg(),
        k.into_tensor_arg(),
        v.into_tensor_arg(),
        labels.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        lse.clone().into_tensor_arg(),
        scale,
        d,
        ROWS,
        tile(d),
        dtype.into(),
    );
    vec![out, lse]
}

/// `(dq, dk, dv)` of the backward kernels.
fn launch_backward<R: CubeRuntime>(inputs: [CubeTensor<R>; 7], scale: f32) -> Vec<CubeTensor<R>> {
    let [q, k, v, labels, dout, lse, delta] = inputs.map(into_contiguous);
    let [batch, heads, queries, d] = q.meta.shape().dims::<4>();
    let [_, kv_heads, keys, _] = k.meta.shape().dims::<4>();
    let dq = empty(&q, q.meta.shape().clone(), q.dtype);
    let dk = empty(&k, k.meta.shape().clone(), k.dtype);
    let dv = empty(&v, v.meta.shape().clone(), v.dtype);
    let client = q.client.clone();
    let dtype = q.dtype;
    kernel::flash_backward_dq::launch::<R>(
        &client,
        cube_count(queries.div_ceil(ROWS), heads, batch),
        cubecl::CubeDim::new_1d(ROWS as u32),
        q.clone().into_tensor_arg(),
        k.clone().into_tensor_arg(),
        v.clone().into_tensor_arg(),
        labels.clone().into_tensor_arg(),
        dout.clone().into_tensor_arg(),
        lse.clone().into_tensor_arg(),
        delta.clone().into_tensor_arg(),
        dq.clone().into_tensor_arg(),
        scale,
        d,
        ROWS,
        tile(d),
        dtype.into(),
    );
    kernel::flash_backward_dkv::launch::<R>(
        &client,
        cube_count(keys.div_ceil(ROWS), kv_heads, batch),
        cubecl::CubeDim::new_1d(ROWS as u32),
        q.into_tensor_arg(),
        k.into_tensor_arg(),
        v.into_tensor_arg(),
        labels.into_tensor_arg(),
        dout.into_tensor_arg(),
        lse.into_tensor_arg(),
        delta.into_tensor_arg(),
        dk.clone().into_tensor_arg(),
        dv.clone().into_tensor_arg(),
        scale,
        d,
        ROWS,
        tile(d),
        dtype.into(),
    );
    vec![dq, dk, dv]
}

type T4<R, BT> = Tensor<Fused<R, BT>, 4>;

/// The forward pass on `Fused<R, BT>`: `(out, lse)`.
fn forward<R: CubeRuntime, BT: BoolElement>(q: T4<R, BT>, k: T4<R, BT>, v: T4<R, BT>, labels: T4<R, BT>) -> (T4<R, BT>, T4<R, BT>) {
    let [batch, heads, queries, d] = q.dims();
    let scale = 1.0 / (d as f32).sqrt();
    let shapes = [(q.shape(), q.dtype()), (Shape::new([batch, heads, queries, 1]), DType::F32)];
    let mut outputs = custom::<R, BT, 4>("flash_attention", vec![q, k, v, labels], &shapes, move |inputs| {
        launch_forward(inputs.try_into().expect("four inputs"), scale)
    });
    let lse = wrap(outputs.pop().expect("lse"));
    (wrap(outputs.pop().expect("out")), lse)
}

/// What the backward pass needs: the inputs, the labels, the output and its log-sum-exp.
struct Saved<R: CubeRuntime, BT: BoolElement> {
    q: T4<R, BT>,
    k: T4<R, BT>,
    v: T4<R, BT>,
    labels: T4<R, BT>,
    out: T4<R, BT>,
    lse: T4<R, BT>,
}

impl<R: CubeRuntime, BT: BoolElement> Clone for Saved<R, BT> {
    fn clone(&self) -> Self {
        let Self { q, k, v, labels, out, lse } = self;
        Self { q: q.clone(), k: k.clone(), v: v.clone(), labels: labels.clone(), out: out.clone(), lse: lse.clone() }
    }
}

impl<R: CubeRuntime, BT: BoolElement> std::fmt::Debug for Saved<R, BT> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "flash attention state, q {:?}, k {:?}", self.q.dims(), self.k.dims())
    }
}

/// `(dq, dk, dv)` from the output's gradient.
fn backward<R: CubeRuntime, BT: BoolElement>(s: Saved<R, BT>, dout: T4<R, BT>) -> [T4<R, BT>; 3] {
    let d = s.q.dims()[3];
    let scale = 1.0 / (d as f32).sqrt();
    let delta = (dout.clone().cast(DType::F32) * s.out.cast(DType::F32)).sum_dim(3);
    let shapes = [(s.q.shape(), s.q.dtype()), (s.k.shape(), s.k.dtype()), (s.v.shape(), s.v.dtype())];
    let outputs = custom::<R, BT, 4>("flash_attention_backward", vec![s.q, s.k, s.v, s.labels, dout.cast(shapes[0].1), s.lse, delta], &shapes, move |inputs| {
        launch_backward(inputs.try_into().expect("seven inputs"), scale)
    });
    let [dq, dk, dv]: [_; 3] = outputs.try_into().expect("three gradients");
    [wrap(dq), wrap(dk), wrap(dv)]
}

#[derive(Debug)]
struct FlashBackward;

impl<R: CubeRuntime, BT: BoolElement> Backward<Fused<R, BT>, 3> for FlashBackward {
    type State = Saved<R, BT>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        custom_op::backward::<Fused<R, BT>, _, 3, 4, 4>(ops, grads, |saved, grad, _| backward(saved, grad).map(Some));
    }
}

/// [`crate::model::kernels::Kernels::flash_attention`] on `Fused<R, BT>`, plain or under
/// autodiff (the backward kernels recorded); `None` where it does not apply (another backend,
/// dtype or head size, or inputs of mixed dtypes).
pub fn attention<B: Backend, R: CubeRuntime, BT: BoolElement>(q: Tensor<B, 4>, k: Tensor<B, 4>, v: Tensor<B, 4>, key_valid: &Tensor<B, 2, Int>) -> Option<Tensor<B, 4>> {
    let [batch, heads, queries, d] = q.dims();
    let [kb, kv_heads, keys, kd] = k.dims();
    let same = q.dtype() == k.dtype() && k.dtype() == v.dtype() && v.dims() == k.dims();
    if !float(q.dtype()) || !same || !supports(d) || kd != d || kb != batch || kv_heads == 0 || heads % kv_heads != 0 || keys < queries || key_valid.dims() != [batch, keys] {
        return None;
    }
    let plain = retype::<B, Fused<R, BT>, 4>(q.clone());
    if loop_limited::<R>() && loop_iterations(queries, keys, heads / kv_heads, d, plain.is_none()) > WGPU_LOOP_BUDGET {
        return None;
    }
    let labels = key_valid.clone().float().cast(DType::F32).reshape([batch, 1, 1, keys]);
    if let Some(q) = plain {
        let (out, _) = forward(q, retype(k)?, retype(v)?, retype(labels)?);
        return retype(out);
    }
    tracked::<B, R, BT, NoCheckpointing>(&q, &k, &v, &labels).or_else(|| tracked::<B, R, BT, BalancedCheckpointing>(&q, &k, &v, &labels))
}

fn tracked<B: Backend, R: CubeRuntime, BT: BoolElement, C: CheckpointStrategy>(q: &Tensor<B, 4>, k: &Tensor<B, 4>, v: &Tensor<B, 4>, labels: &Tensor<B, 4>) -> Option<Tensor<B, 4>> {
    type Ad<R, BT, C> = Autodiff<Fused<R, BT>, C>;
    let ad = |t: &Tensor<B, 4>| retype::<B, Ad<R, BT, C>, 4>(t.clone());
    let inputs = [custom_op::tracked(ad(q)?)?, custom_op::tracked(ad(k)?)?, custom_op::tracked(ad(v)?)?];
    let labels = ad(labels)?.inner();
    let (q, k, v) = (value(&inputs[0]), value(&inputs[1]), value(&inputs[2]));
    let (out, lse) = forward(q.clone(), k.clone(), v.clone(), labels.clone());
    let saved = || Saved { q, k, v, labels, out: out.clone(), lse };
    retype(custom_op::record::<Ad<R, BT, C>, FlashBackward, 3, 4>(FlashBackward, &inputs, saved, out.clone())?)
}
