//! The CPU decoding kernel computes the same products as burn's GEMM, for every row count it
//! accepts, for shapes with remainders (k not a multiple of 16 or of the parts it is split into,
//! n not a multiple of 3 or 48), and for both weight layouts: row-major `[in, out]` (every
//! projection) and the transposed view of a row-major `[out, in]` (the tied LM head, a view of the
//! embedding). A projection reaches the kernel when loaded for inference and, under
//! `Autodiff<Flex>`, after `.valid()`, before and after an optimizer-style update.
//!
//! bf16 weights: on CPUs with AVX512-BF16 the bf16 kernel computes the f32 products of the
//! bf16-rounded inputs (both layouts, 1..=MAX_ROWS rows, odd k and n) and a bf16 projection takes it;
//! elsewhere (or under `KILN_SIMD=avx512` or lower) it declines and projections still compute the
//! same products through burn.

use burn::backend::Autodiff;
use burn::module::{AutodiffModule, Param};
use burn::tensor::{Tensor, TensorData};
use kiln::backends::Cpu;
use kiln::model::Proj;
use burn::tensor::DType;
use kiln::model::cpu_decode::{MAX_ROWS, available, bf16_available, matmul};
use kiln::model::proj;

fn values(len: usize, seed: usize) -> Vec<f32> {
    (0..len).map(|i| (((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.0 - 1.0) * 0.5).collect()
}

/// `[out, in]` → `[in, out]`, row-major.
fn transposed(hf: &[f32], out_dim: usize, in_dim: usize) -> Vec<f32> {
    let mut t = vec![0.0; hf.len()];
    for o in 0..out_dim {
        for i in 0..in_dim {
            t[i * out_dim + o] = hf[o * in_dim + i];
        }
    }
    t
}

fn max_diff(a: Tensor<Cpu, 2>, b: Tensor<Cpu, 2>) -> f32 {
    let (a, b) = (a.into_data().to_vec::<f32>().unwrap(), b.into_data().to_vec::<f32>().unwrap());
    assert_eq!(a.len(), b.len());
    a.iter().zip(&b).map(|(p, q)| (p - q).abs()).fold(0.0f32, f32::max)
}

/// Whether the kernel runs here. Without it the tests fail (they would check nothing), except
/// when `KILN_SIMD=plain` turned it off on purpose: then the kernel must decline.
fn require_kernel() -> bool {
    if available::<Cpu>() {
        return true;
    }
    if std::env::var("KILN_SIMD").as_deref() == Ok("plain") {
        let x = Tensor::<Cpu, 2>::ones([2, 8], &Default::default());
        assert!(matmul(&x, &Tensor::ones([8, 4], &Default::default())).is_none(), "KILN_SIMD=plain: the kernel declines");
        return false;
    }
    panic!("the decoding kernel needs x86-64 with AVX2 and FMA or AVX-512; run these tests on such a CPU (or with KILN_SIMD=plain to check that it declines)");
}

#[test]
fn kernel_matches_gemm_in_both_layouts() {
    if !require_kernel() {
        return;
    }
    let device = Default::default();
    for (k, n) in [(64, 96), (67, 31), (768, 257), (300, 50)] {
        let hf = values(n * k, k + n); // [out = n, in = k]
        let hf_layout = Tensor::<Cpu, 2>::from_data(TensorData::new(hf.clone(), [n, k]), &device).transpose();
        let row_major = Tensor::<Cpu, 2>::from_data(TensorData::new(transposed(&hf, n, k), [k, n]), &device);
        for (layout, w) in [("transposed [out, in]", &hf_layout), ("row-major [in, out]", &row_major)] {
            for m in [1, 3, 8, 9, MAX_ROWS] {
                let x = Tensor::<Cpu, 2>::from_data(TensorData::new(values(m * k, m), [m, k]), &device);
                let fast = matmul(&x, w).unwrap_or_else(|| panic!("{layout}: the kernel applies"));
                let err = max_diff(fast, x.clone().matmul(w.clone()));
                assert!(err < 1e-4, "{layout} m={m} k={k} n={n}: max |Δ| = {err}");
            }
            let too_many = Tensor::<Cpu, 2>::zeros([MAX_ROWS + 1, k], &device);
            assert!(matmul(&too_many, w).is_none(), "more than MAX_ROWS rows take the GEMM path");
        }
        let sliced = row_major.clone().narrow(0, 1, k - 1);
        let x = Tensor::<Cpu, 2>::ones([2, k - 1], &device);
        assert!(matmul(&x, &sliced).is_none(), "a weight with an offset is not read by the kernel");
    }
}

#[test]
fn projections_take_the_kernel_for_inference_and_after_training() {
    if !require_kernel() {
        return;
    }
    type Train = Autodiff<Cpu>;
    let device = Default::default();
    let (k, n) = (67, 45);
    let hf = TensorData::new(values(n * k, 1), [n, k]);
    let bias = TensorData::new(values(n, 2), [n]);
    let x = Tensor::<Cpu, 2>::from_data(TensorData::new(values(3 * k, 3), [3, k]), &device);

    let inference = Proj::<Cpu>::from_hf(hf.clone(), Some(bias.clone()), &device);
    let reference = x.clone().matmul(inference.weight.val()) + inference.bias.as_ref().unwrap().val().unsqueeze();
    let y = inference.forward(x.clone().unsqueeze()).squeeze_dim::<2>(0);
    assert!(max_diff(y, reference.clone()) < 1e-4);
    assert!(matmul(&x, &inference.weight.val()).is_some(), "a loaded model's weights are read by the kernel");

    let training = Proj::<Train>::from_hf(hf, Some(bias), &device);
    let valid = training.valid();
    assert!(matmul(&x, &valid.weight.val()).is_some(), "an Autodiff model's weights reach the kernel after .valid()");
    assert!(max_diff(valid.forward(x.clone().unsqueeze()).squeeze_dim::<2>(0), reference) < 1e-4);

    // An optimizer update leaves a contiguous [in, out] weight (AdamW reshapes to 1-D and back).
    let (id, tensor, _) = training.weight.consume();
    let updated = Tensor::<Train, 1>::from_inner(tensor.inner().reshape([k * n]).mul_scalar(0.5)).reshape([k, n]);
    let stepped = Proj { weight: Param::initialized(id, updated), bias: training.bias, products: None }.valid();
    assert!(matmul(&x, &stepped.weight.val()).is_some(), "an updated weight still reaches the kernel");
}

#[test]
fn projections_of_one_input_together_equal_each_alone() {
    if !require_kernel() {
        return;
    }
    let device = Default::default();
    // a layer's q, k and v (with biases, k and v narrower), and odd sizes; rows 1, 8 and MAX_ROWS
    let k = 200;
    let make = |n: usize, seed: usize, bias: bool| {
        let b = bias.then(|| TensorData::new(values(n, seed + 1), [n]));
        Proj::<Cpu>::from_hf(TensorData::new(values(n * k, seed), [n, k]), b, &device)
    };
    let (q, kp, v) = (make(96, 1, true), make(32, 2, true), make(33, 3, false));
    for m in [1, 8, MAX_ROWS] {
        let x = Tensor::<Cpu, 3>::from_data(TensorData::new(values(m * k, m), [m, 1, k]), &device);
        let flat = x.clone().flatten::<2>(0, 1);
        let many = kiln::model::cpu_decode::matmul_many(&flat, &[&q.weight.val(), &kp.weight.val(), &v.weight.val()]);
        assert_eq!(many.map(|ys| ys.len()), Some(3), "m={m}: the kernel takes all three weights");
        let together = proj::project_all(x.clone(), [&q, &kp, &v]);
        for (p, y) in [&q, &kp, &v].into_iter().zip(together) {
            let alone = p.forward(x.clone());
            assert_eq!(y.dims(), alone.dims());
            assert_eq!(y.into_data().to_vec::<f32>().unwrap(), alone.into_data().to_vec::<f32>().unwrap(), "m={m}: bitwise the same");
        }
    }
    let other_k = make(16, 4, false);
    let bad = Proj::<Cpu>::from_hf(TensorData::new(values(16 * 8, 5), [16, 8]), None, &device);
    let x = Tensor::<Cpu, 2>::ones([2, k], &device);
    assert!(kiln::model::cpu_decode::matmul_many(&x, &[&other_k.weight.val(), &bad.weight.val()]).is_none(), "weights of another inner size are declined");
}

/// `values` rounded to bf16 (burn's cast: round to nearest even).
fn rounded(values: &[f32]) -> Vec<f32> {
    let data = TensorData::new(values.to_vec(), [values.len()]).convert_dtype(DType::BF16);
    data.convert_dtype(DType::F32).to_vec::<f32>().unwrap()
}

fn tensor(values: &[f32], shape: [usize; 2], dtype: DType) -> Tensor<Cpu, 2> {
    Tensor::<Cpu, 2>::from_data(TensorData::new(values.to_vec(), shape), &Default::default()).cast(dtype)
}

/// `got` (`[m, n]`) against the f64 products of `x` `[m, k]` and `w` `[k, n]` (row-major): each
/// output within `1e-5 · Σ|x·w|` (f32 accumulation), plus half a bf16 spacing when `got` is bf16.
fn check(got: Tensor<Cpu, 2>, x: &[f32], w: &[f32], [m, k, n]: [usize; 3], what: &str) {
    let bf16_out = got.dtype() == DType::BF16;
    let got = got.cast(DType::F32).into_data().to_vec::<f32>().unwrap();
    assert_eq!(got.len(), m * n, "{what}");
    for r in 0..m {
        for j in 0..n {
            let (mut dot, mut mag) = (0.0f64, 0.0f64);
            for i in 0..k {
                let p = x[r * k + i] as f64 * w[i * n + j] as f64;
                dot += p;
                mag += p.abs();
            }
            let tol = 1e-5 * mag + 1e-30 + if bf16_out { dot.abs() / 256.0 } else { 0.0 };
            let err = (got[r * n + j] as f64 - dot).abs();
            assert!(err <= tol, "{what}: y[{r}, {j}] = {} vs {dot} (|Δ| {err:e} > {tol:e})", got[r * n + j]);
        }
    }
}

#[test]
fn bf16_weights_take_the_bf16_kernel_where_the_cpu_has_it() {
    let kernel = bf16_available::<Cpu>();
    if !kernel {
        eprintln!("no AVX512-BF16 here (or capped by KILN_SIMD): checking that bf16 weights take the fallback");
    }
    for (k, n) in [(64, 96), (67, 31), (768, 257), (300, 50), (1, 5), (33, 65), (130, 129)] {
        let hf = rounded(&values(n * k, k + n)); // [out = n, in = k], bf16 values
        let w = transposed(&hf, n, k); // [k, n]
        let hf_layout = tensor(&hf, [n, k], DType::BF16).transpose();
        let row_major = tensor(&w, [k, n], DType::BF16);
        for (layout, wt) in [("transposed [out, in]", &hf_layout), ("row-major [in, out]", &row_major)] {
            assert_eq!(wt.dtype(), DType::BF16);
            for m in 1..=MAX_ROWS {
                let x = values(m * k, m);
                let xr = rounded(&x);
                for dtype in [DType::F32, DType::BF16] {
                    let what = format!("{layout} {dtype:?} input m={m} k={k} n={n}");
                    let xt = tensor(&x, [m, k], dtype);
                    match matmul(&xt, wt) {
                        Some(y) => {
                            assert!(kernel, "{what}: declined without the bf16 kernel");
                            assert_eq!(y.dtype(), dtype, "{what}: output in the input's dtype");
                            check(y, &xr, &w, [m, k, n], &what);
                        }
                        None => assert!(!kernel, "{what}: the bf16 kernel applies"),
                    }
                }
                // A bf16 projection (the model's path), kernel or fallback alike.
                let y = proj::project(tensor(&x, [m, k], DType::BF16).unsqueeze(), wt.clone(), None).squeeze_dim::<2>(0);
                assert_eq!(y.dtype(), DType::BF16);
                check(y, &xr, &w, [m, k, n], &format!("{layout} project m={m} k={k} n={n}"));
            }
            let too_many = tensor(&vec![0.0; (MAX_ROWS + 1) * k], [MAX_ROWS + 1, k], DType::BF16);
            assert!(matmul(&too_many, wt).is_none(), "more than MAX_ROWS rows take the GEMM path");
        }
        if k > 1 {
            let sliced = row_major.clone().narrow(0, 1, k - 1);
            let x = tensor(&vec![1.0; 2 * (k - 1)], [2, k - 1], DType::BF16);
            assert!(matmul(&x, &sliced).is_none(), "a weight with an offset is not read by the kernel");
        }
    }
}

#[test]
fn bf16_projections_with_a_bias_take_the_kernel() {
    let device = Default::default();
    let (k, n) = (67, 45);
    let hf = rounded(&values(n * k, 1));
    let bias = rounded(&values(n, 2));
    let layer = Proj::<Cpu>::from_hf(
        TensorData::new(hf.clone(), [n, k]).convert_dtype(DType::BF16),
        Some(TensorData::new(bias.clone(), [n]).convert_dtype(DType::BF16)),
        &device,
    );
    assert_eq!(layer.weight.val().dtype(), DType::BF16, "a bf16 checkpoint gives bf16 weights");
    let x = tensor(&values(3 * k, 3), [3, k], DType::BF16);
    assert_eq!(matmul(&x, &layer.weight.val()).is_some(), bf16_available::<Cpu>());
    let y = layer.forward(x.clone().unsqueeze()).squeeze_dim::<2>(0);
    let reference = x.cast(DType::F32).matmul(tensor(&transposed(&hf, n, k), [k, n], DType::F32)) + tensor(&bias, [1, n], DType::F32);
    assert_eq!(y.dtype(), DType::BF16);
    // bf16 output: the product and the bias add each round to bf16 (half a spacing, 2⁻⁹ relative).
    let (y, reference) = (y.cast(DType::F32).into_data().to_vec::<f32>().unwrap(), reference.into_data().to_vec::<f32>().unwrap());
    for (got, want) in y.iter().zip(&reference) {
        assert!((got - want).abs() <= want.abs() / 128.0 + 1e-3, "{got} vs {want}");
    }
}
