//! The fused kernels against burn's plain ops: values on Flex, gradients under `Autodiff<Flex>`.

use burn::backend::Autodiff;
use burn::tensor::activation::softmax;
use burn::tensor::{Bool, Distribution, ElementConversion, Tensor, TensorData, backend::Backend};
use burn_flex::Flex;

use super::{KeyMask, attention, rms_norm, rope, swiglu, token_logprobs};
use burn::tensor::activation::silu;

type Ad = Autodiff<Flex>;

/// Attention written out with burn ops: K/V repeated per query head, a dense mask from the
/// visibility rule (query `t` is key `o + t`; it sees itself and the earlier real keys of its
/// document, a padding query any).
fn reference<B: Backend>(q: Tensor<B, 4>, k: Tensor<B, 4>, v: Tensor<B, 4>, mask: &KeyMask) -> Tensor<B, 4> {
    let [b, t, h, d] = q.dims();
    let [_, s, kv, _] = k.dims();
    let g = h / kv;
    let repeat = |x: Tensor<B, 4>| x.swap_dims(1, 2).unsqueeze_dim::<5>(2).expand([b, kv, g, s, d]).reshape([b, h, s, d]);
    let (k, v) = (repeat(k), repeat(v));
    let scores = q.swap_dims(1, 2).matmul(k.swap_dims(2, 3)) / (d as f64).sqrt(); // [b, h, t, s]
    let offset = s - t;
    let hidden: Vec<bool> = (0..b)
        .flat_map(|bi| (0..t).flat_map(move |ti| (0..s).map(move |j| (bi, ti, j))))
        .map(|(bi, ti, j)| {
            let (own, key) = (mask.valid[bi * s + offset + ti], mask.valid[bi * s + j]);
            !(j <= offset + ti && (j == offset + ti || (key != 0 && (own == 0 || key == own))))
        })
        .collect();
    let hidden = Tensor::<B, 4, Bool>::from_data(TensorData::new(hidden, [b, 1, t, s]), &scores.device()).expand([b, h, t, s]);
    softmax(scores.mask_fill(hidden, f32::NEG_INFINITY), 3).matmul(v).swap_dims(1, 2)
}

fn max_diff<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> f32 {
    (a - b).abs().max().into_scalar().elem::<f32>()
}

/// Random inputs: batch 3, `t` queries over `s` keys, 6 heads on 2 KV heads, d = 8; row 0 packs
/// three documents, row 1 has left padding, row 2 right padding after two packed documents.
fn case<B: Backend>(t: usize, s: usize) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>, KeyMask) {
    case_with_head_dim(t, s, 8)
}

/// [`case`] with heads of `d` values.
fn case_with_head_dim<B: Backend>(t: usize, s: usize, d: usize) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>, KeyMask) {
    let device = Default::default();
    let (b, h, kv) = (3, 6, 2);
    let n = Distribution::Normal(0.0, 1.0);
    let q = Tensor::random([b, t, h, d], n, &device);
    let k = Tensor::random([b, s, kv, d], n, &device);
    let v = Tensor::random([b, s, kv, d], n, &device);
    let valid: Vec<u32> = (0..b * s)
        .map(|i| match (i / s, i % s) {
            (1, j) => (j >= 2) as u32,
            (2, j) => if j < s - 3 { 1 + (2 * j >= s) as u32 } else { 0 },
            (_, j) => 1 + (3 * j / s) as u32,
        })
        .collect();
    (q, k, v, KeyMask { batch: b, keys: s, valid: valid.into() })
}

#[test]
fn attention_matches_burn_ops_for_prefill_and_cached_decoding() {
    // (1, 9) and (2, 12) take the streamed path for few query rows (3 and 6 rows of 3 heads),
    // for a head size of its own and the sizes it has compiled-in loops for.
    let cases = [(7, 7, 8), (1, 9, 8), (2, 12, 8), (1, 9, 32), (1, 40, 32), (2, 70, 64), (1, 33, 128), (3, 10, 8), (300, 300, 8)];
    for (t, s, d) in cases {
        let (q, k, v, mask) = case_with_head_dim::<Flex>(t, s, d);
        let fused = attention(q.clone(), k.clone(), v.clone(), &mask).expect("fused path on Flex");
        let err = max_diff(fused, reference(q.clone(), k.clone(), v.clone(), &mask));
        assert!(err < 2e-5, "t {t}, s {s}, d {d}: max |Δ| = {err:e}");
        // Keys and values as a KV cache holds them: the first `s` positions of a longer buffer
        // (read in place; batch rows `s + 5` positions apart, starting after an offset).
        let spare = |x: Tensor<Flex, 4>| {
            let ([b, _, kv, d], device) = (x.dims(), x.device());
            let pad = |n| Tensor::<Flex, 4>::random([b, n, kv, d], Distribution::Normal(0.0, 1.0), &device);
            Tensor::cat(vec![pad(2), x, pad(5)], 1).narrow(1, 2, s)
        };
        let fused = attention(q.clone(), spare(k.clone()), spare(v.clone()), &mask).expect("fused path on Flex");
        let err = max_diff(fused, reference(q, k, v, &mask));
        assert!(err < 2e-5, "in place, t {t}, s {s}, d {d}: max |Δ| = {err:e}");
    }
}

#[test]
fn attention_gradients_match_burn_autodiff() {
    for (t, s) in [(7, 7), (3, 10), (300, 300)] {
        let (q, k, v, mask) = case::<Ad>(t, s);
        let weights = Tensor::<Ad, 4>::random(q.dims(), Distribution::Normal(0.0, 1.0), &Default::default());
        let grads_of = |fused: bool| {
            let (q, k, v) = (q.clone().require_grad(), k.clone().require_grad(), v.clone().require_grad());
            let out = match fused {
                true => attention(q.clone(), k.clone(), v.clone(), &mask).expect("fused path under autodiff"),
                false => reference(q.clone(), k.clone(), v.clone(), &mask),
            };
            let grads = (out * weights.clone()).sum().backward();
            [q, k, v].map(|x| x.grad(&grads).expect("gradient"))
        };
        let (got, want) = (grads_of(true), grads_of(false));
        for (name, (g, w)) in ["q", "k", "v"].iter().zip(got.into_iter().zip(want)) {
            let err = max_diff(g, w);
            assert!(err < 5e-5, "t {t}, s {s}: d{name} max |Δ| = {err:e}");
        }
    }
}

fn normal<B: Backend, const D: usize>(shape: [usize; D]) -> Tensor<B, D> {
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), &Default::default())
}

/// Values of `fused` and `plain` on the same inputs, and their gradients through a random
/// weighting of the output, agree within `tol`.
fn check_op<const N: usize, const D: usize, const E: usize>(
    inputs: [Tensor<Ad, D>; N],
    fused: impl Fn([Tensor<Ad, D>; N]) -> Option<Tensor<Ad, E>>,
    plain: impl Fn([Tensor<Ad, D>; N]) -> Tensor<Ad, E>,
    tol: f32,
) {
    let run = |use_fused: bool| {
        let inputs = inputs.clone().map(|t| t.require_grad());
        let out = match use_fused {
            true => fused(inputs.clone()).expect("fused path under autodiff"),
            false => plain(inputs.clone()),
        };
        let grads = (out.clone() * weights_for(&out)).sum().backward();
        (out, inputs.map(|x| x.grad(&grads).expect("gradient")))
    };
    let ((got, got_grads), (want, want_grads)) = (run(true), run(false));
    let err = max_diff(got.inner(), want.inner());
    assert!(err < tol, "values: max |Δ| = {err:e}");
    for (i, (g, w)) in got_grads.into_iter().zip(want_grads).enumerate() {
        let err = max_diff(g, w);
        assert!(err < tol, "gradient of input {i}: max |Δ| = {err:e}");
    }
}

/// A fixed pseudo-random weighting of the output (the same for both runs).
fn weights_for<const E: usize>(out: &Tensor<Ad, E>) -> Tensor<Ad, E> {
    let n = out.shape().num_elements();
    let values: Vec<f32> = (0..n).map(|i| ((i * 7919) % 113) as f32 / 56.0 - 1.0).collect();
    Tensor::from_data(TensorData::new(values, out.dims()), &Default::default())
}

#[test]
fn swiglu_matches_silu_times_up() {
    check_op([normal([3, 5, 37]), normal([3, 5, 37]) * 3.0], |[g, u]| swiglu(g, u), |[g, u]| silu(g) * u, 1e-5);
}

#[test]
fn rope_matches_rotate_half() {
    let (b, t, h, d) = (2, 5, 3, 8);
    let cos = normal::<Ad, 4>([b, 1, t, d]);
    let sin = normal::<Ad, 4>([b, 1, t, d]);
    let plain = |x: Tensor<Ad, 4>| {
        let (c, s) = (cos.clone().reshape([b, t, 1, d]), sin.clone().reshape([b, t, 1, d]));
        let rotated = Tensor::cat(vec![x.clone().narrow(3, d / 2, d / 2).neg(), x.clone().narrow(3, 0, d / 2)], 3);
        x * c + rotated * s
    };
    check_op([normal([b, t, h, d])], |[x]| rope(x, &cos, &sin), |[x]| plain(x), 1e-5);
}

#[test]
fn rms_norm_matches_the_formula() {
    let weight = normal::<Ad, 1>([48]);
    let plain = |x: Tensor<Ad, 3>, w: Tensor<Ad, 1>| {
        let inv = (x.clone().square().mean_dim(2) + 1e-6).sqrt().recip();
        x * inv * w.unsqueeze()
    };
    // The weight's gradient is checked through a rank-3 view of it.
    check_op(
        [normal([4, 3, 48]) * 2.0, weight.clone().reshape([1, 1, 48])],
        |[x, w]| rms_norm(x, w.reshape([48]), 1e-6),
        |[x, w]| plain(x, w.reshape([48])),
        2e-5,
    );
}

#[test]
fn token_logprobs_match_log_softmax_and_gather() {
    let (b, t, v) = (2, 3, 37);
    let targets: Vec<u32> = (0..b * t).map(|i| (i * 11 % v) as u32).collect();
    let ids: Tensor<Ad, 2, burn::tensor::Int> =
        Tensor::from_data(TensorData::new(targets.iter().map(|&x| x as i64).collect::<Vec<_>>(), [b, t]), &Default::default());
    let plain = |x: Tensor<Ad, 3>| burn::tensor::activation::log_softmax(x, 2).gather(2, ids.clone().unsqueeze_dim(2)).squeeze_dim::<2>(2);
    check_op([normal([b, t, v]) * 4.0], |[x]| token_logprobs(x, &targets), |[x]| plain(x), 2e-5);
}

/// The fused AdamW step is bit-identical to `train::adamw`'s chain of burn ops.
#[test]
fn adamw_step_is_bit_identical_to_burn_ops() {
    let (lr, wd, b1, b2, eps, clip, t) = (3e-3f64, 0.1f64, 0.9f64, 0.999f64, 1e-8f64, 0.37f64, 3i32);
    let n = 40_000;
    let [p, g, m] = [0, 1, 2].map(|_| normal::<Flex, 1>([n]));
    let v = normal::<Flex, 1>([n]).abs();
    let grad = g.clone().mul_scalar(clip);
    let exp_avg = m.clone() + (grad.clone() - m.clone()).mul_scalar(1.0 - b1);
    let exp_avg_sq = v.clone().mul_scalar(b2) + grad.clone().mul_scalar(1.0 - b2) * grad;
    let denom = exp_avg_sq.clone().sqrt().div_scalar((1.0 - b2.powi(t)).sqrt()).add_scalar(eps);
    let want = p.clone().mul_scalar(1.0 - lr * wd) - (exp_avg.clone() / denom).mul_scalar(lr / (1.0 - b1.powi(t)));
    let step = super::elementwise::AdamWStep {
        clip: Some(clip as f32),
        decay: Some((1.0 - lr * wd) as f32),
        w: (1.0 - b1) as f32,
        beta2: b2 as f32,
        one_minus_beta2: (1.0 - b2) as f32,
        bias_correction2_sqrt: (1.0 - b2.powi(t)).sqrt() as f32,
        eps: eps as f32,
        step_size: (lr / (1.0 - b1.powi(t))) as f32,
    };
    let (got, got_m, got_v) = super::adamw(p, g, Some((m, v)), step).expect("fused AdamW on Flex");
    for (a, b) in [(got, want), (got_m, exp_avg), (got_v, exp_avg_sq)] {
        assert_eq!(a.into_data().to_vec::<f32>().unwrap(), b.into_data().to_vec::<f32>().unwrap());
    }
}

/// On the fused path, prefill plus cached decoding of a left-padded batch gives the logits of one
/// full forward pass over the whole sequences (and the model does take the fused path).
#[test]
fn cached_decoding_with_fused_attention_equals_a_full_forward() {
    use crate::model::{HostBatch, Qwen2, Qwen2Config};
    let config: Qwen2Config = serde_json::from_str(
        r#"{"vocab_size": 97, "hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2,
            "num_attention_heads": 6, "num_key_value_heads": 2, "tie_word_embeddings": true,
            "max_position_embeddings": 64, "rope_theta": 10000.0, "initializer_range": 0.3}"#,
    )
    .unwrap();
    let device = Default::default();
    let model = Qwen2::<Flex>::random(&config, 7, &device).unwrap();
    assert!(super::available::<Flex>());
    let rows: Vec<Vec<u32>> = vec![(0..12).map(|t| (t * 5 + 1) % 97).collect(), (0..9).map(|t| (t * 11 + 3) % 97).collect()];
    let full = model.forward(&HostBatch::left_padded(&rows, 0).unwrap().to_device::<Flex>(&device));
    // The same sequences: a prefill of the first 6 (5 for the shorter row) tokens, then one
    // token at a time through the cache.
    let prefix: Vec<Vec<u32>> = rows.iter().map(|r| r[..r.len() - 6].to_vec()).collect();
    let mut cache = model.new_cache();
    let prefill = HostBatch::left_padded(&prefix, 0).unwrap();
    let _ = model.forward_hidden(&prefill.to_device::<Flex>(&device), Some(&mut cache));
    let mut seen: Vec<usize> = prefix.iter().map(Vec::len).collect();
    for step in 0..6 {
        let ids: Vec<u32> = rows.iter().zip(&seen).map(|(r, &n)| r[n]).collect();
        let batch = HostBatch { batch: 2, seq: 1, ids: ids.clone(), valid: vec![true; 2], documents: None };
        let mut inputs = batch.to_device::<Flex>(&device);
        let positions: Vec<i64> = seen.iter().map(|&n| n as i64).collect();
        inputs.positions = Tensor::from_data(TensorData::new(positions, [2, 1]), &device);
        let logits = model.logits(model.forward_hidden(&inputs, Some(&mut cache)));
        for (b, r) in rows.iter().enumerate() {
            // Row b's token `seen[b]` sits at column `pad + seen[b]` of the full left-padded pass.
            let column = 12 - r.len() + seen[b];
            let want = full.clone().narrow(0, b, 1).narrow(1, column, 1);
            let got = logits.clone().narrow(0, b, 1);
            let err = max_diff(got, want);
            assert!(err < 1e-4, "step {step}, row {b}: max |Δ logit| = {err:e}");
        }
        seen.iter_mut().for_each(|n| *n += 1);
    }
}

/// `t` with its values rounded to bf16 (to nearest even), kept in f32, as a constant. (Not
/// burn-flex's cast: it goes through `half::bf16::from_f64`, which rounds some values just
/// above a tie down, ~6 in 10⁵ normal values.)
fn rounded<B: Backend, const D: usize>(t: &Tensor<B, D>) -> Tensor<B, D> {
    let data = t.clone().detach().into_data();
    let values: Vec<f32> = data.to_vec::<f32>().unwrap().into_iter().map(|v| half::bf16::from_f32(v).to_f32()).collect();
    Tensor::from_data(TensorData::new(values, data.shape.clone()), &t.device())
}

/// bf16 products on f32 operands, forward and both gradients, against burn's f32 products of
/// the rounded operands (what PyTorch's `bf16-products` fixture run computes); and on a CPU
/// without AVX512-BF16, that nothing claims them.
#[test]
fn bf16_products_are_the_products_of_the_rounded_operands() {
    if !super::cpu_bf16_products() {
        assert!(!super::bf16_products_available::<Flex>() && super::bf16_products::<Flex>(Tensor::zeros([2, 2], &Default::default()), Tensor::zeros([2, 2], &Default::default())).is_none());
        eprintln!("no AVX512-BF16 on this CPU: the bf16 products are declined (checked), their values untested here");
        return;
    }
    for transposed in [false, true] {
        check_products(super::bf16_products, rounded, transposed);
    }
}

/// `product(x, w)` of random `[37, 70] × [70, 45]` operands under autodiff, the output and both
/// gradients, against burn's matmul of the operands (and upstream gradient) as `operand` turns
/// them, within 1e-4; returns `x` on the inner backend. With `transposed`, `w` is the transpose
/// of a `[45, 70]` leaf (the tied head's layout), whose gradient is checked.
fn check_products(product: fn(Tensor<Ad, 2>, Tensor<Ad, 2>) -> Option<Tensor<Ad, 2>>, operand: fn(&Tensor<Ad, 2>) -> Tensor<Ad, 2>, transposed: bool) -> Tensor<Flex, 2> {
    let device = Default::default();
    let n = Distribution::Normal(0.0, 1.0);
    let (m, k, c) = (37, 70, 45);
    let x = Tensor::<Ad, 2>::random([m, k], n, &device).require_grad();
    let leaf = Tensor::<Ad, 2>::random(if transposed { [c, k] } else { [k, c] }, n, &device).require_grad();
    let w = if transposed { leaf.clone().transpose() } else { leaf.clone() };
    let upstream = Tensor::<Ad, 2>::random([m, c], n, &device);
    let y = product(x.clone(), w.clone()).expect("the product applies on Autodiff<Flex>");
    let want = operand(&x).matmul(operand(&w));
    let err = max_diff(y.clone().inner(), want.inner());
    assert!(err < 1e-4, "forward: max |Δ| = {err:e}");
    let grads = (y * upstream.clone()).sum().backward();
    let (dx, dleaf) = (x.grad(&grads).unwrap(), leaf.grad(&grads).unwrap());
    let dw = if transposed { dleaf.transpose() } else { dleaf };
    let (x, w, dy) = (operand(&x).inner(), operand(&w).inner(), operand(&upstream).inner());
    let err = max_diff(dx, dy.clone().matmul(w.transpose()));
    assert!(err < 1e-4, "dx: max |Δ| = {err:e}");
    let err = max_diff(dw, x.clone().transpose().matmul(dy));
    assert!(err < 1e-4, "dw: max |Δ| = {err:e}");
    x
}

/// bf16 inference products (row-major and transposed weights) against burn's bf16 matmul (which
/// sums the same exact products in f32 and rounds once): equal up to one bf16 rounding step.
#[test]
fn bf16_matmul_matches_burns_bf16_product() {
    use burn::tensor::DType::BF16;
    if !super::cpu_bf16_products() {
        assert!(super::bf16_matmul::<Flex>(Tensor::<Flex, 2>::zeros([2, 2], &Default::default()).cast(BF16), Tensor::<Flex, 2>::zeros([2, 2], &Default::default()).cast(BF16)).is_none());
        eprintln!("no AVX512-BF16 on this CPU: bf16_matmul declines (checked)");
        return;
    }
    let n = Distribution::Normal(0.0, 1.0);
    let x = Tensor::<Flex, 2>::random([40, 70], n, &Default::default()).cast(BF16);
    let w = Tensor::<Flex, 2>::random([70, 33], n, &Default::default()).cast(BF16);
    let wt = Tensor::<Flex, 2>::random([33, 70], n, &Default::default()).cast(BF16).transpose();
    for w in [w, wt] {
        let ours = super::bf16_matmul(x.clone(), w.clone()).expect("bf16 on Flex");
        assert_eq!(ours.dtype(), BF16);
        let want = x.clone().matmul(w).cast(burn::tensor::DType::F32);
        let ours = ours.cast(burn::tensor::DType::F32);
        let bound = want.clone().abs().max().into_scalar().elem::<f32>() / 128.0;
        let err = max_diff(ours, want);
        assert!(err <= bound, "max |Δ| = {err:e} > {bound:e}");
    }
    assert!(super::bf16_matmul(x.clone().cast(burn::tensor::DType::F32), x.transpose()).is_none(), "f32 activations are not bf16_matmul's");
}


/// A KV cache's write: in the buffer's own memory when nothing else holds it, values as
/// `slice_assign` writes them; a shared buffer is given back untouched.
#[test]
fn write_in_place_writes_the_slice_or_gives_back() {
    let device = Default::default();
    let n = Distribution::Normal(0.0, 1.0);
    for dim in [1, 2] {
        let buffer = Tensor::<Flex, 4>::random([3, 7, 5, 4], n, &device);
        let mut shape = [3, 7, 5, 4];
        shape[dim] = 2;
        let value = Tensor::<Flex, 4>::random(shape, n, &device);
        let mut range = [0..3, 0..7, 0..5, 0..4];
        range[dim] = 3..5;
        let want = buffer.clone().slice_assign(range.clone(), value.clone());
        let shared = buffer.clone();
        let (back, _) = super::write_in_place(buffer, dim, 3, value.clone()).expect_err("the buffer is shared");
        assert_eq!(max_diff(back, shared), 0.0, "a shared buffer is left as it was");
        // `want` with the slice zeroed: a fresh buffer only this test holds.
        let zeroed = want.clone().slice_assign(range, value.clone() * 0.0);
        assert!(max_diff(zeroed.clone(), want.clone()) > 0.0);
        let written = super::write_in_place(zeroed, dim, 3, value).expect("a dense buffer nothing else holds");
        assert_eq!(max_diff(written, want), 0.0, "dim {dim}");
    }
}

/// f32 products without the zeroed output, forward and both gradients under autodiff, against
/// burn's matmul; a transposed (strided) operand is declined under autodiff and read in place
/// without it.
#[test]
fn f32_products_match_burns_matmul() {
    let x = check_products(super::f32_products, |t| t.clone(), false);
    check_products(super::f32_products, |t| t.clone(), true);
    let n = Distribution::Normal(0.0, 1.0);
    // Columns 0..45 of a [70, 90] weight: neither it nor its transpose is dense.
    let wide = Tensor::<Ad, 2>::random([70, 90], n, &Default::default()).require_grad();
    assert!(super::f32_products(Tensor::<Ad, 2>::from_inner(x.clone()).require_grad(), wide.slice([0..70, 0..45])).is_none(), "another strided operand under autodiff is burn's");
    let wt = Tensor::<Flex, 2>::random([45, 70], n, &Default::default());
    let y = super::f32_products(x.clone(), wt.clone().transpose()).expect("any strides on Flex");
    let err = max_diff(y, x.matmul(wt.transpose()));
    assert!(err < 1e-4, "transposed weight: max |Δ| = {err:e}");
}
