//! The CubeCL table against the reference table (plain burn ops), on wgpu; `train::adamw`'s
//! tests check the AdamW kernel against `torch.optim.AdamW` on wgpu.

#[cfg(feature = "wgpu")]
pub(crate) mod wgpu {
    use burn::backend::Autodiff;
    use burn::tensor::backend::Backend;
    use burn::tensor::activation::softmax;
    use burn::tensor::{Distribution, Int, Tensor, TensorData};

    use crate::model::chunked_attention::chunk_mask;
    use crate::model::kernels::{kernels, reference};

    type Wgpu = burn::backend::Wgpu;

    /// wgpu's default adapter, cubecl configured as kiln configures it (`KILN_KERNEL_CACHE`
    /// keeps autotune results out of the clone); no adapter fails with the instruction.
    pub(crate) fn device() -> burn::backend::wgpu::WgpuDevice {
        kiln_backends::device::configure_kernels();
        let device = burn::backend::wgpu::WgpuDevice::DefaultDevice;
        let probe = std::panic::catch_unwind(|| Tensor::<Wgpu, 1>::zeros([1], &device).into_data());
        assert!(probe.is_ok(), "no wgpu adapter: install Mesa's lavapipe (apt-get install mesa-vulkan-drivers) or run the tests without `--features wgpu`");
        device
    }

    fn normal<B: Backend, const D: usize>(shape: [usize; D]) -> Tensor<B, D> {
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), &Default::default())
    }

    fn close<B: Backend, const D: usize>(what: &str, a: Tensor<B, D>, b: Tensor<B, D>) {
        let (a, b) = (a.into_data().to_vec::<f32>().unwrap(), b.into_data().to_vec::<f32>().unwrap());
        assert_eq!(a.len(), b.len());
        let err = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        let scale = b.iter().map(|y| y.abs()).fold(1.0f32, f32::max);
        assert!(err <= 1e-5 * scale, "{what}: max error {err} (scale {scale})");
    }

    #[test]
    fn wgpu_takes_the_cubecl_table() {
        device();
        assert_eq!(kernels::<Wgpu>().name, "cubecl");
        assert_eq!(kernels::<Autodiff<Wgpu>>().name, "cubecl");
    }

    /// RoPE forward, and its backward pass under autodiff: the gradient of `Σ rope(x)·w` for a
    /// random `w` (every element's weight differs, so a wrong partner or sign shows).
    #[test]
    fn rope_is_the_reference() {
        device();
        // head_dim 64 and 128, several heads, a batch whose tables differ per row.
        for [batch, seq, heads, d] in [[2, 7, 3, 64], [1, 5, 2, 128]] {
            let (x, cos, sin) = (normal::<Wgpu, 4>([batch, seq, heads, d]), normal([batch, 1, seq, d]), normal([batch, 1, seq, d]));
            close("forward", (kernels::<Wgpu>().rope)(x.clone(), &cos, &sin), (reference::<Wgpu>().rope)(x.clone(), &cos, &sin));

            type A = Autodiff<Wgpu>;
            let w = normal::<Wgpu, 4>([batch, seq, heads, d]);
            type Rope = fn(Tensor<A, 4>, &Tensor<A, 4>, &Tensor<A, 4>) -> Tensor<A, 4>;
            let grad = |rope: Rope| {
                let x = Tensor::<A, 4>::from_inner(x.clone()).require_grad();
                let (cos, sin) = (Tensor::from_inner(cos.clone()), Tensor::from_inner(sin.clone()));
                let loss = (rope(x.clone(), &cos, &sin) * Tensor::from_inner(w.clone())).sum();
                x.grad(&loss.backward()).expect("x takes a gradient")
            };
            close("backward", grad(kernels::<A>().rope), grad(reference::<A>().rope));
        }
    }

    /// Attention as plain burn ops: scores, [`chunk_mask`] (the mask the dense path uses,
    /// checked against transformers by the parity tests), softmax, the weighted sum.
    fn dense<B: Backend>(q: Tensor<B, 4>, k: Tensor<B, 4>, v: Tensor<B, 4>, labels: &Tensor<B, 2, Int>) -> Tensor<B, 4> {
        let [batch, heads, queries, d] = q.dims();
        let kv_heads = k.dims()[1];
        let group = heads / kv_heads;
        let q = q.reshape([batch, kv_heads, group * queries, d]);
        let scores = q.matmul(k.swap_dims(2, 3)) / (d as f32).sqrt();
        let mask = chunk_mask(labels, queries, 0, queries, kv_heads, group);
        softmax(scores.mask_fill(mask, f32::NEG_INFINITY), 3).matmul(v).reshape([batch, heads, queries, d])
    }

    /// Flash attention against [`dense`], forward and the gradients of `Σ out·w` for q, k and
    /// v: GQA (4 query heads over 2 KV heads, 6 over 1), head sizes 64, 128, 12 (the test models')
    /// and 32 over 300 keys (ten tiles), lengths off
    /// the kernels' block sizes, a left-padded row and a row of three packed documents, and
    /// decoding (5 queries over 40 keys, the causal mask aligned bottom-right).
    #[test]
    fn flash_attention_is_dense_attention() {
        type A = Autodiff<Wgpu>;
        let device = device();
        let flash = kernels::<A>().flash_attention.expect("wgpu's table has flash attention");
        for (heads, kv_heads, queries, keys, d) in [(4, 2, 37, 37, 64), (6, 1, 12, 12, 128), (4, 2, 5, 40, 64), (4, 2, 21, 21, 12), (1, 1, 300, 300, 32)] {
            let batch = 2;
            // Row 0: documents 1, 2, 3 packed; row 1: three padding keys, then one document.
            let labels: Vec<i64> = (0..keys).map(|j| (j * 3 / keys) as i64 + 1).chain((0..keys).map(|j| i64::from(j >= 3))).collect();
            let labels = Tensor::<A, 2, Int>::from_data(TensorData::new(labels, [batch, keys]), &device);
            let (q, k, v) = (normal::<Wgpu, 4>([batch, heads, queries, d]), normal::<Wgpu, 4>([batch, kv_heads, keys, d]), normal::<Wgpu, 4>([batch, kv_heads, keys, d]));
            let w = normal::<Wgpu, 4>([batch, heads, queries, d]);
            let run = |attend: &dyn Fn(Tensor<A, 4>, Tensor<A, 4>, Tensor<A, 4>) -> Tensor<A, 4>| {
                let (q, k, v) = (Tensor::<A, 4>::from_inner(q.clone()).require_grad(), Tensor::<A, 4>::from_inner(k.clone()).require_grad(), Tensor::<A, 4>::from_inner(v.clone()).require_grad());
                let out = attend(q.clone(), k.clone(), v.clone());
                let grads = (out.clone() * Tensor::from_inner(w.clone())).sum().backward();
                [out.inner(), q.grad(&grads).unwrap(), k.grad(&grads).unwrap(), v.grad(&grads).unwrap()]
            };
            let ours = run(&|q, k, v| flash(q, k, v, &labels).expect("flash attention takes these"));
            let expected = run(&|q, k, v| dense(q, k, v, &labels));
            let case = format!("H {heads}, K {kv_heads}, T {queries}, S {keys}, d {d}");
            for (what, (a, b)) in ["out", "dq", "dk", "dv"].iter().zip(ours.into_iter().zip(expected)) {
                close(&format!("{case}: {what}"), a, b);
            }
            // Without autodiff (inference): the same forward kernel.
            let plain = kernels::<Wgpu>().flash_attention.unwrap()(q.clone(), k.clone(), v.clone(), &labels.clone().inner()).unwrap();
            close(&format!("{case}: inference"), plain, dense(q, k, v, &labels.inner()));
        }
    }

    /// On wgpu a problem past lavapipe's loop limit is declined (the model then takes the
    /// chunked form), in inference and, with its larger backward kernels, in training.
    #[test]
    fn flash_attention_declines_past_the_loop_budget() {
        let device = device();
        let (q, k) = (normal::<Wgpu, 4>([1, 1, 300, 128]), normal::<Wgpu, 4>([1, 1, 300, 128]));
        let labels = Tensor::<Wgpu, 2, Int>::ones([1, 300], &device);
        assert!(kernels::<Wgpu>().flash_attention.unwrap()(q.clone(), k.clone(), k.clone(), &labels).is_none());
        let (q, k) = (normal::<Wgpu, 4>([1, 1, 180, 128]), normal::<Wgpu, 4>([1, 1, 180, 128]));
        let labels = Tensor::<Wgpu, 2, Int>::ones([1, 180], &device);
        assert!(kernels::<Wgpu>().flash_attention.unwrap()(q.clone(), k.clone(), k.clone(), &labels).is_some());
        let ad = |t: &Tensor<Wgpu, 4>| Tensor::<Autodiff<Wgpu>, 4>::from_inner(t.clone()).require_grad();
        let labels = Tensor::<Autodiff<Wgpu>, 2, Int>::from_inner(labels);
        assert!(kernels::<Autodiff<Wgpu>>().flash_attention.unwrap()(ad(&q), ad(&k), ad(&k), &labels).is_none());
    }

    /// Flash-decoding over a paged cache (and the reference it falls back to) against [`dense`]
    /// over each row's keys laid out contiguously: rows of 1, 63, 64, 65 and 300 keys (block
    /// edges; up to three splits), the blocks scattered through the pool in another order, GQA
    /// 3:1, 6:1 and 1:1, head sizes 64, 128 and 12; f32, then f16 inputs. A group whose queries
    /// alone fill the 16 KiB of shared memory is declined (the reference takes it).
    #[test]
    fn paged_decode_is_dense_attention() {
        use crate::model::paged_kv::{BLOCK, decode_reference};
        use burn::tensor::DType;
        let device = device();
        let decode = kernels::<Wgpu>().paged_decode.expect("wgpu's table has flash-decoding");
        let lens = [1usize, 63, 64, 65, 300];
        let (rows, keys) = (lens.len(), 300usize);
        let width = keys.div_ceil(BLOCK);
        let blocks = rows * width;
        // Row r's block i is block (r·width + i)·7 mod 25 of the pool (7 and 25 coprime).
        let block_of = |r: usize, i: usize| (r * width + i) * 7 % blocks;
        for (heads, kv_heads, d) in [(6, 2, 64), (6, 1, 128), (2, 2, 128), (2, 2, 12)] {
            let host = |n: usize, seed: u32| -> Vec<f32> { (0..n).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 / 1000.0 - 1.0).collect() };
            // Contiguous keys [R, K, S, d], each row's at the end (left padding).
            let (k, v, q) = (host(rows * kv_heads * keys * d, 1), host(rows * kv_heads * keys * d, 2), host(rows * heads * d, 3));
            let (mut k_pool, mut v_pool) = (vec![0.0f32; blocks * BLOCK * kv_heads * d], vec![0.0f32; blocks * BLOCK * kv_heads * d]);
            let mut table = vec![0i64; rows * width];
            for (r, &len) in lens.iter().enumerate() {
                for i in 0..len.div_ceil(BLOCK) {
                    table[r * width + i] = block_of(r, i) as i64;
                }
                for p in 0..len {
                    let slot = block_of(r, p / BLOCK) * BLOCK + p % BLOCK;
                    for kh in 0..kv_heads {
                        let from = ((r * kv_heads + kh) * keys + keys - len + p) * d;
                        let to = (slot * kv_heads + kh) * d;
                        k_pool[to..to + d].copy_from_slice(&k[from..from + d]);
                        v_pool[to..to + d].copy_from_slice(&v[from..from + d]);
                    }
                }
            }
            let labels: Vec<i64> = lens.iter().flat_map(|&len| (0..keys).map(move |j| i64::from(j >= keys - len))).collect();
            let labels = Tensor::<Wgpu, 2, Int>::from_data(TensorData::new(labels, [rows, keys]), &device);
            fn t<const D: usize>(data: Vec<f32>, shape: [usize; D]) -> Tensor<Wgpu, D> {
                Tensor::from_data(TensorData::new(data, shape), &super::wgpu::device())
            }
            let want = dense(t(q.clone(), [rows, heads, 1, d]), t(k, [rows, kv_heads, keys, d]), t(v, [rows, kv_heads, keys, d]), &labels).reshape([rows, heads, d]);
            let table = Tensor::<Wgpu, 2, Int>::from_data(TensorData::new(table, [rows, width]), &device);
            let lens_t = Tensor::<Wgpu, 1, Int>::from_data(TensorData::new(lens.map(|l| l as i64).to_vec(), [rows]), &device);
            let (q, kp, vp): (Tensor<Wgpu, 3>, Tensor<Wgpu, 3>, Tensor<Wgpu, 3>) = (t(q, [rows, heads, d]), t(k_pool, [blocks * BLOCK, kv_heads, d]), t(v_pool, [blocks * BLOCK, kv_heads, d]));
            let case = format!("H {heads}, K {kv_heads}, d {d}");
            let ours = decode(q.clone(), kp.clone(), vp.clone(), table.clone(), lens_t.clone(), keys).expect("flash-decoding takes these");
            close(&format!("{case}: kernel"), ours, want.clone());
            close(&format!("{case}: reference"), decode_reference(q.clone(), kp.clone(), vp.clone(), table.clone(), lens_t.clone()), want.clone());
            // f16 inputs: the same, within f16's rounding of the inputs and the output.
            let half = |t: &Tensor<Wgpu, 3>| t.clone().cast(DType::F16);
            let ours = decode(half(&q), half(&kp), half(&vp), table.clone(), lens_t.clone(), keys).expect("f16 too");
            assert_eq!(ours.dtype(), DType::F16);
            let (a, b) = (ours.cast(DType::F32).into_data().to_vec::<f32>().unwrap(), want.into_data().to_vec::<f32>().unwrap());
            let err = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
            assert!(err < 5e-3, "{case}: f16 max error {err}");
        }
        let zeros = |n: usize| Tensor::<Wgpu, 3>::zeros([64, n, 256], &device);
        let one = |v: i64| Tensor::<Wgpu, 1, Int>::from_data(TensorData::new(vec![v], [1]), &device);
        assert!(decode(Tensor::zeros([1, 16, 256], &device), zeros(1), zeros(1), one(0).reshape([1, 1]), one(1), 1).is_none());
    }

    /// A paged cache in device memory, step by step against attention computed on the host over
    /// each sequence's own keys: twelve sequences from empty (the pools grow from 8 blocks to
    /// 16, then 24, keeping what they hold), one of them forked mid-block (its next write copies
    /// the shared block), 70 steps (blocks of 64 positions: each sequence takes a second one),
    /// GQA 2:1.
    #[test]
    fn device_paged_cache_decodes_each_sequence_over_its_own_keys() {
        use crate::model::paged_kv::PagedKv;
        let device = device();
        let (heads, kv_heads, d) = (4, 2, 8);
        let mut cache = PagedKv::<Wgpu>::on_device(1, kv_heads, d, burn::tensor::DType::F32, &device);
        let mut seqs: Vec<_> = (0..11).map(|_| cache.insert(0)).collect();
        // Each sequence's keys and values so far, per position `[K·d]`.
        let mut host: Vec<(Vec<Vec<f32>>, Vec<Vec<f32>>)> = vec![(Vec::new(), Vec::new()); 11];
        let value = |i: usize, salt: usize| ((i.wrapping_mul(2654435761) + salt) % 2001) as f32 / 1000.0 - 1.0;
        for step in 0..70 {
            if step == 10 {
                seqs.push(cache.fork(seqs[0]));
                host.push(host[0].clone());
            }
            let rows = seqs.len();
            cache.reserve(&seqs);
            let q: Vec<f32> = (0..rows * heads * d).map(|i| value(i, step * 7 + 1)).collect();
            let k: Vec<f32> = (0..rows * kv_heads * d).map(|i| value(i, step * 7 + 2)).collect();
            let v: Vec<f32> = (0..rows * kv_heads * d).map(|i| value(i, step * 7 + 3 + rows)).collect();
            let t = |x: &Vec<f32>, n: usize| Tensor::<Wgpu, 3>::from_data(TensorData::new(x.clone(), [rows, n, d]), &device);
            let out = cache.write_and_attend(0, t(&q, heads), t(&k, kv_heads), t(&v, kv_heads)).into_data().to_vec::<f32>().unwrap();
            cache.advance(&seqs);
            for (r, (keys, values)) in host.iter_mut().enumerate() {
                keys.push(k[r * kv_heads * d..][..kv_heads * d].to_vec());
                values.push(v[r * kv_heads * d..][..kv_heads * d].to_vec());
                for h in 0..heads {
                    let kh = h / (heads / kv_heads);
                    let qh = &q[(r * heads + h) * d..][..d];
                    let scores: Vec<f32> = keys.iter().map(|key| qh.iter().zip(&key[kh * d..][..d]).map(|(a, b)| a * b).sum::<f32>() / (d as f32).sqrt()).collect();
                    let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let weights: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
                    let sum: f32 = weights.iter().sum();
                    for c in 0..d {
                        let want: f32 = weights.iter().zip(values.iter()).map(|(w, val)| w * val[kh * d + c]).sum::<f32>() / sum;
                        let got = out[(r * heads + h) * d + c];
                        assert!((got - want).abs() < 1e-5, "step {step}, sequence {r}, head {h}: {got} vs {want}");
                    }
                }
            }
        }
        // 70 positions: two blocks each, the fork's first its own copy of the block it shared.
        assert_eq!(cache.blocks_in_use(), 12 * 2);
    }
}


