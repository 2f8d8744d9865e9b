//! The facts about burn 0.21 that kiln's precision handling relies on (`model::dtype`,
//! `train::precision`). If a burn upgrade changes one of them, this test says which.
//!
//! One process: burn's device settings are global, so the test that fixes NdArray's default
//! dtype is the only user of NdArray here.

use burn::backend::{Autodiff, Flex, NdArray};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData, set_default_dtypes};

/// A device's default float dtype is fixed by its first tensor; setting it later is refused.
/// (kiln therefore never sets it: half-precision tensors are created with an explicit dtype.)
#[test]
fn default_float_dtype_is_fixed_at_first_use() {
    let device = Default::default();
    let first = Tensor::<NdArray, 1>::zeros([2], &device);
    assert_eq!(first.dtype(), DType::F32);
    let err = burn::tensor::backend::set_default_float_dtype::<NdArray>(&device, DType::F64).unwrap_err();
    assert!(err.to_string().contains("already been initialized"), "{err}");
    // NdArray has no half precision at all.
    assert!(!<NdArray as Backend>::supports_dtype(&device, DType::BF16));
    assert!(!<NdArray as Backend>::supports_dtype(&device, DType::F16));
    assert!(set_default_dtypes::<NdArray>(&device, DType::F16, DType::I32).is_err());
}

/// Flex stores bf16 and f16, creates tensors in an explicit dtype without touching the device
/// default, and computes matrix products of bf16 through f32.
#[test]
fn flex_has_half_precision_with_explicit_dtypes() {
    let device = Default::default();
    assert!(<Flex as Backend>::supports_dtype(&device, DType::BF16));
    assert!(<Flex as Backend>::supports_dtype(&device, DType::F16));
    let values = [1.0f32, 1.0 + 1.0 / 256.0, 3.0, -0.5];
    for dtype in [DType::BF16, DType::F16] {
        let x = Tensor::<Flex, 2>::from_data(TensorData::new(values.to_vec(), [2, 2]), (&device, dtype));
        assert_eq!(x.dtype(), dtype);
        // The default stays f32.
        assert_eq!(Tensor::<Flex, 1>::zeros([1], &device).dtype(), DType::F32);
        let y = x.clone().matmul(x.clone());
        assert_eq!(y.dtype(), dtype);
        let host = y.into_data().convert::<f32>().into_vec::<f32>().unwrap();
        // [[1, a], [3, -0.5]]² with a = 1 + 2^-8 (exact in f16, rounds to 1 in bf16).
        let a = if dtype == DType::BF16 { 1.0 } else { values[1] };
        let exact = [1.0 + 3.0 * a, a - 0.5 * a, 3.0 - 1.5, 3.0 * a + 0.25];
        for (got, want) in host.iter().zip(exact) {
            assert!((got - want).abs() <= 1e-2 * want.abs(), "{dtype:?}: {got} vs {want}");
        }
    }
    // A bf16 TensorData loads as bf16 without an f32 copy on the way.
    let data = TensorData::new(vec![half::bf16::from_f32(2.5); 3], [3]);
    let t = Tensor::<Flex, 1>::from_data(data, (&device, DType::BF16));
    assert_eq!(t.into_data().as_slice::<half::bf16>().unwrap(), &[half::bf16::from_f32(2.5); 3]);
}

/// Under autodiff, `cast` is differentiable: the gradient of a bf16 computation on a cast f32
/// leaf arrives at the leaf in f32 (the cast's backward casts it back).
#[test]
fn cast_passes_gradients_back_to_the_f32_master() {
    type B = Autodiff<Flex>;
    let device = Default::default();
    let master = Tensor::<B, 1>::from_data(TensorData::new(vec![1.0f32, 2.0, 3.0], [3]), &device).require_grad();
    let half = master.clone().cast(DType::BF16);
    assert_eq!(half.dtype(), DType::BF16);
    let loss = (half.clone() * half).sum().cast(DType::F32);
    let grads = loss.backward();
    let grad = master.grad(&grads).expect("the master has a gradient");
    assert_eq!(grad.dtype(), DType::F32);
    assert_eq!(grad.into_data().into_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);
}
