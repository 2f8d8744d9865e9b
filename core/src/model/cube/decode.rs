//! Flash-decoding in CubeCL over a paged KV cache ([`crate::model::paged_kv`]): one query
//! position per sequence, its keys read through the sequence's block table, split over the key
//! axis so that short batches still fill the device (FlashDecoding's split-K), GQA by grouping
//! (the `G` query heads of a KV head read its keys once).
//!
//! A cube per (split, KV head, sequence), one unit per element of the head (`d` units): the
//! units load a tile of keys and values into shared memory (16 KiB in all, what WebGPU
//! guarantees), compute the tile's `G · tile` scores and then their weights (a unit each), and
//! each unit keeps the running `(max, sum)` of the `G` heads and their weighted sums in its own
//! element of the head. Each split writes its unnormalised sums
//! and `(max, sum)`; the splits are merged by a few burn operations. Scores, softmax and sums in
//! f32 whatever the cache's dtype. No cooperative matrices: it runs on every wgpu adapter
//! (lavapipe, WebGPU) and on CUDA; a split's loops stay far below lavapipe's budget (see
//! `attention`'s `WGPU_LOOP_BUDGET`).

use burn::tensor::{DType, Int, Shape, Tensor};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::{BoolElement, CubeRuntime, tensor::CubeTensor};

use super::attention::{empty, supports};
use super::{Fused, custom, float, retype, wrap};
use crate::model::paged_kv::BLOCK;

/// Keys per split: a few blocks, so that a batch of short sequences still makes many cubes,
/// and a long sequence's splits are merged cheaply.
pub const SPLIT: usize = 2 * BLOCK;

/// f32 values of shared memory a cube may take: 16 KiB, what WebGPU guarantees.
const SHARED: usize = 4096;

/// Keys per tile in shared memory: at most one score per unit (`d` units for `G` heads), and
/// the group's queries, the tile's keys and values and its scores and weights within
/// [`SHARED`], each array counted as WebGPU does (rounded up to 16 bytes); `None` where not even
/// one key fits.
fn tile(d: usize, group: usize) -> Option<usize> {
    let size = |n: usize| n.next_multiple_of(4);
    let fits = |tile: usize| size(group * d) + 2 * size(tile * d) + 2 * size(tile * group) <= SHARED;
    (1..=d / group.max(1)).rev().find(|&tile| fits(tile))
}

mod kernel {
    use cubecl::prelude::*;

    /// A masked score (finite, so that no arithmetic meets an infinity).
    pub const HIDDEN: f32 = -1.0e30;

    /// q `[R, H, d]` (unscaled); `keys`, `values` `[N·block, K, d]`; `table` `[R, W, 1]` (the
    /// sequence's blocks, as f32); `lens` `[R, 1, 1]` (keys to read, f32). `acc` `[R, K, S, G·d]`
    /// (sums weighted by `exp(score − max)`), `stats` `[R, K, S, G·2]` (`max`, `sum`).
    #[cube(launch)]
    #[allow(clippy::too_many_arguments)]
    pub fn paged_decode<F: Float>(
        q: &Tensor<F>,
        keys: &Tensor<F>,
        values: &Tensor<F>,
        table: &Tensor<f32>,
        lens: &Tensor<f32>,
        acc_out: &mut Tensor<f32>,
        stats: &mut Tensor<f32>,
        scale: f32,
        #[comptime] d: usize,
        #[comptime] group: usize,
        #[comptime] tile: usize,
        #[comptime] split: usize,
        #[comptime] block: usize,
        #[define(F)] _dtype: StorageType,
    ) {
        let kv_heads = keys.shape(1);
        let width = table.shape(1);
        let splits = CUBE_COUNT_X as usize;
        let s = CUBE_POS_X as usize;
        let kh = CUBE_POS_Y as usize;
        let r = CUBE_POS_Z as usize;
        let u = UNIT_POS as usize;
        let len = u32::cast_from(lens[r]) as usize;
        let start = s * split;
        let end = min(start + split, len);

        let mut q_sh = SharedMemory::<f32>::new(group * d);
        let mut k_tile = SharedMemory::<f32>::new(tile * d);
        let mut v_tile = SharedMemory::<f32>::new(tile * d);
        let mut scores = SharedMemory::<f32>::new(tile * group);
        let mut weights = SharedMemory::<f32>::new(tile * group);
        let q_row = (r * kv_heads + kh) * group * d;
        let mut e = u;
        while e < group * d {
            q_sh[e] = f32::cast_from(q[q_row + e]) * scale;
            e += d;
        }
        let mut acc = Array::<f32>::new(group);
        let mut m = Array::<f32>::new(group);
        let mut l = Array::<f32>::new(group);
        for g in 0..group {
            acc[g] = 0.0;
            m[g] = f32::new(HIDDEN);
            l[g] = 0.0;
        }
        sync_cube();
        let mut t = start;
        while t < end {
            // The tile's keys and values (past the end: the last key again, masked below).
            let mut e = u;
            while e < tile * d {
                let p = min(t + e / d, end - 1);
                let slot = (u32::cast_from(table[r * width + p / block]) as usize) * block + p % block;
                let at = (slot * kv_heads + kh) * d + e % d;
                k_tile[e] = f32::cast_from(keys[at]);
                v_tile[e] = f32::cast_from(values[at]);
                e += d;
            }
            sync_cube();
            if u < tile * group {
                let (j, g) = (u / group, u % group);
                let mut dot = 0.0f32;
                for c in 0..d {
                    dot += q_sh[g * d + c] * k_tile[j * d + c];
                }
                scores[u] = select(t + j < end, dot, f32::new(HIDDEN));
            }
            sync_cube();
            // Every unit takes each head's new maximum (reads only); a unit per score then
            // takes its weight, once for the cube.
            let mut correction = Array::<f32>::new(group);
            let mut mine = f32::new(HIDDEN);
            for g in 0..group {
                let mut tile_max = f32::new(HIDDEN);
                for j in 0..tile {
                    tile_max = max(tile_max, scores[j * group + g]);
                }
                let m_new = max(m[g], tile_max);
                correction[g] = (m[g] - m_new).exp();
                m[g] = m_new;
                if u < tile * group && u % group == g {
                    mine = m_new;
                }
            }
            if u < tile * group {
                let score = scores[u];
                weights[u] = select(score > HIDDEN, (score - mine).exp(), 0.0f32);
            }
            sync_cube();
            for g in 0..group {
                let mut sum = l[g] * correction[g];
                let mut a = acc[g] * correction[g];
                for j in 0..tile {
                    let weight = weights[j * group + g];
                    sum += weight;
                    a += weight * v_tile[j * d + u];
                }
                l[g] = sum;
                acc[g] = a;
            }
            sync_cube();
            t += tile;
        }
        let part = (r * kv_heads + kh) * splits + s;
        for g in 0..group {
            acc_out[part * group * d + g * d + u] = acc[g];
        }
        if u < group {
            stats[part * group * 2 + u * 2] = m[u];
            stats[part * group * 2 + u * 2 + 1] = l[u];
        }
    }
}

/// The kernel on CubeCL tensors: `[acc, stats]`.
fn launch<R: CubeRuntime>(inputs: [CubeTensor<R>; 5], splits: usize) -> Vec<CubeTensor<R>> {
    let [q, keys, values, table, lens] = inputs.map(into_contiguous);
    let [rows, heads, d] = q.meta.shape().dims::<3>();
    let kv_heads = keys.meta.shape().dims::<3>()[1];
    let group = heads / kv_heads;
    let acc = empty(&q, Shape::new([rows, kv_heads, splits, group * d]), DType::F32);
    let stats = empty(&q, Shape::new([rows, kv_heads, splits, group * 2]), DType::F32);
    let (client, dtype) = (q.client.clone(), q.dtype);
    kernel::paged_decode::launch::<R>(
        &client,
        cubecl::CubeCount::Static(splits as u32, kv_heads as u32, rows as u32),
        cubecl::CubeDim::new_1d(d as u32),
        q.into_tensor_arg(),
        keys.into_tensor_arg(),
        values.into_tensor_arg(),
        table.into_tensor_arg(),
        lens.into_tensor_arg(),
        acc.clone().into_tensor_arg(),
        stats.clone().into_tensor_arg(),
        1.0 / (d as f32).sqrt(),
        d,
        group,
        tile(d, group).expect("paged_decode() checked the tile fits"),
        SPLIT,
        BLOCK,
        dtype.into(),
    );
    vec![acc, stats]
}

/// [`crate::model::kernels::Kernels::paged_decode`] on `Fused<R, BT>`: q `[R, H, d]`, the
/// pools `[N·BLOCK, K, d]`, the block tables `[R, W]`, the keys to read `[R]`; `[R, H, d]` in
/// q's dtype. `None` where it does not apply (another backend, dtype or head size; a group of
/// query heads too large for a tile in 16 KiB of shared memory), and the caller takes the
/// reference.
pub fn paged_decode<B: burn::tensor::backend::Backend, R: CubeRuntime, BT: BoolElement>(
    q: Tensor<B, 3>,
    keys: Tensor<B, 3>,
    values: Tensor<B, 3>,
    table: Tensor<B, 2, Int>,
    lens: Tensor<B, 1, Int>,
    max_len: usize,
) -> Option<Tensor<B, 3>> {
    let [rows, heads, d] = q.dims();
    let [_, kv_heads, kd] = keys.dims();
    let same = q.dtype() == keys.dtype() && keys.dtype() == values.dtype();
    if !float(q.dtype()) || !same || !supports(d) || kd != d || kv_heads == 0 || heads % kv_heads != 0 || tile(d, heads / kv_heads).is_none() || max_len == 0 {
        return None;
    }
    let (group, width, dtype) = (heads / kv_heads, table.dims()[1], q.dtype());
    let splits = max_len.div_ceil(SPLIT);
    let table = table.float().cast(DType::F32).reshape([rows, width, 1]);
    let lens = lens.float().cast(DType::F32).reshape([rows, 1, 1]);
    let inputs = vec![retype::<B, Fused<R, BT>, 3>(q)?, retype(keys)?, retype(values)?, retype(table)?, retype(lens)?];
    let shapes = [(Shape::new([rows, kv_heads, splits, group * d]), DType::F32), (Shape::new([rows, kv_heads, splits, group * 2]), DType::F32)];
    let mut outputs = custom::<R, BT, 3>("paged_decode", inputs, &shapes, move |inputs| launch(inputs.try_into().expect("five inputs"), splits));
    let stats: Tensor<Fused<R, BT>, 4> = wrap(outputs.pop().expect("stats"));
    let acc: Tensor<Fused<R, BT>, 4> = wrap(outputs.pop().expect("acc"));
    // Merge the splits: each rescaled by exp(its max − the overall max).
    let acc = acc.reshape([rows, kv_heads, splits, group, d]);
    let stats = stats.reshape([rows, kv_heads, splits, group, 2]);
    let (m, l) = (stats.clone().narrow(4, 0, 1), stats.narrow(4, 1, 1));
    let weight = (m.clone() - m.max_dim(2)).exp(); // [R, K, S, G, 1]
    let out = (acc * weight.clone()).sum_dim(2) / (l * weight).sum_dim(2); // [R, K, 1, G, d]
    let out = crate::model::proj::to_dtype(out.reshape([rows, heads, d]), dtype);
    retype(out)
}
