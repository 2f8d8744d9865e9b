//! The fused kernels against burn's plain ops: values on Flex, gradients under `Autodiff<Flex>`.

use burn::backend::Autodiff;
use burn::tensor::activation::softmax;
use burn::tensor::{Bool, Distribution, ElementConversion, Tensor, TensorData, backend::Backend};
use burn_flex::Flex;

use super::{KeyMask, attention};

type Ad = Autodiff<Flex>;

/// Attention written out with burn ops: K/V repeated per query head, a dense mask from the
/// visibility rule (query `t` is key `o + t`; it sees earlier real keys and itself).
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
        .map(|(bi, ti, j)| !(j <= offset + ti && (mask.valid[bi * s + j] != 0 || j == offset + ti)))
        .collect();
    let hidden = Tensor::<B, 4, Bool>::from_data(TensorData::new(hidden, [b, 1, t, s]), &scores.device()).expand([b, h, t, s]);
    softmax(scores.mask_fill(hidden, f32::NEG_INFINITY), 3).matmul(v).swap_dims(1, 2)
}

fn max_diff<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> f32 {
    (a - b).abs().max().into_scalar().elem::<f32>()
}

/// Random inputs: batch 3, `t` queries over `s` keys, 6 heads on 2 KV heads, d = 8; row 1 has
/// left padding, row 2 right padding.
fn case<B: Backend>(t: usize, s: usize) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>, KeyMask) {
    let device = Default::default();
    let (b, h, kv, d) = (3, 6, 2, 8);
    let n = Distribution::Normal(0.0, 1.0);
    let q = Tensor::random([b, t, h, d], n, &device);
    let k = Tensor::random([b, s, kv, d], n, &device);
    let v = Tensor::random([b, s, kv, d], n, &device);
    let valid: Vec<u8> = (0..b * s)
        .map(|i| match i / s {
            1 => (i % s >= 2) as u8,
            2 => (i % s < s - 3) as u8,
            _ => 1,
        })
        .collect();
    (q, k, v, KeyMask { batch: b, keys: s, valid: valid.into() })
}

#[test]
fn attention_matches_burn_ops_for_prefill_and_cached_decoding() {
    for (t, s) in [(7, 7), (1, 9), (3, 10), (300, 300)] {
        let (q, k, v, mask) = case::<Flex>(t, s);
        let fused = attention(q.clone(), k.clone(), v.clone(), &mask).expect("fused path on Flex");
        let err = max_diff(fused, reference(q, k, v, &mask));
        assert!(err < 2e-5, "t {t}, s {s}: max |Δ| = {err:e}");
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
