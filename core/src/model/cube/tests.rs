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
}


