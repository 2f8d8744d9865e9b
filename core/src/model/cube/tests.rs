//! The CubeCL table against the reference table (plain burn ops), on wgpu; `train::adamw`'s
//! tests check the AdamW kernel against `torch.optim.AdamW` on wgpu.

#[cfg(feature = "wgpu")]
mod wgpu {
    use burn::backend::Autodiff;
    use burn::tensor::backend::Backend;
    use burn::tensor::{Distribution, Tensor};

    use crate::model::kernels::{kernels, reference};

    type Wgpu = burn::backend::Wgpu;

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
        assert_eq!(kernels::<Wgpu>().name, "cubecl");
        assert_eq!(kernels::<Autodiff<Wgpu>>().name, "cubecl");
    }

    /// RoPE forward, and its backward pass under autodiff: the gradient of `Σ rope(x)·w` for a
    /// random `w` (every element's weight differs, so a wrong partner or sign shows).
    #[test]
    fn rope_is_the_reference() {
        // head_dim 64 and 128, several heads, a batch whose tables differ per row.
        for [batch, seq, heads, d] in [[2, 7, 3, 64], [1, 5, 2, 128]] {
            let (x, cos, sin) = (normal::<Wgpu, 4>([batch, seq, heads, d]), normal([batch, 1, seq, d]), normal([batch, 1, seq, d]));
            close("forward", (kernels::<Wgpu>().rope)(x.clone(), &cos, &sin), (reference::<Wgpu>().rope)(x.clone(), &cos, &sin));

            type A = Autodiff<Wgpu>;
            let w = normal::<Wgpu, 4>([batch, seq, heads, d]);
            let grad = |rope: fn(Tensor<A, 4>, &Tensor<A, 4>, &Tensor<A, 4>) -> Tensor<A, 4>| {
                let x = Tensor::<A, 4>::from_inner(x.clone()).require_grad();
                let (cos, sin) = (Tensor::from_inner(cos.clone()), Tensor::from_inner(sin.clone()));
                let loss = (rope(x.clone(), &cos, &sin) * Tensor::from_inner(w.clone())).sum();
                x.grad(&loss.backward()).expect("x takes a gradient")
            };
            close("backward", grad(kernels::<A>().rope), grad(reference::<A>().rope));
        }
    }
}
