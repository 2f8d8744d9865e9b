//! Criterion benches of the CPU kernels, each next to the plain burn ops it replaces, at the
//! 100M config's sizes (hidden 768, 12 heads on 2 KV heads of 64, MLP 3072; batch 8):
//! decode projection (8 rows; also with bf16 weights and the tied LM head), prefill GEMM (8 × 64 rows), attention (8 × 64 queries), RoPE,
//! RMSNorm, SwiGLU gating and one AdamW step of a 768 × 3072 weight; and a decoding step's
//! weight stream: every projection of the 12 layers (406 MB of distinct f32 weights, far more
//! than the caches) at batch 1 and 8, in GB/s of weights read, to set beside the machine's read
//! bandwidth measured at the same time (`python benches/memory_bandwidth.py`).
//!
//! `cargo bench --bench kernels` (`-- attention` for one group). The kernels dispatch on CPU
//! features at run time; `KILN_SIMD=avx2` or `plain` caps them to compare the paths.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kiln::backends::Cpu;
use kiln::model::fused::{self, KeyMask, elementwise::AdamWStep};
use kiln::model::proj;
use kiln::model::qwen2::attention_mask;
use burn::tensor::activation::silu;
use burn::tensor::module::{attention, linear};
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Distribution, Int, Tensor};

const D: usize = 768;
const FF: usize = 3072;
const HEADS: usize = 12;
const KV: usize = 2;
const HEAD: usize = 64;
const BATCH: usize = 8;
const SEQ: usize = 64;

fn normal<const N: usize>(shape: [usize; N]) -> Tensor<Cpu, N> {
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), &Default::default())
}

fn projections(c: &mut Criterion) {
    let w = normal([D, FF]) * 0.02;
    for (name, rows) in [("decode_projection_8x768x3072", 1), ("prefill_gemm_512x768x3072", SEQ)] {
        let x = normal([BATCH, rows, D]);
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Elements((2 * BATCH * rows * D * FF) as u64));
        g.bench_function("kiln", |b| b.iter(|| proj::project(x.clone(), w.clone(), None).into_data()));
        g.bench_function("burn", |b| b.iter(|| linear(x.clone(), w.clone(), None).into_data()));
        g.finish();
    }
}

/// The projections of one decoding step of the 100M config, as the model calls them (q, k and v
/// in one call, gate and up in one, o and down alone), each layer with weights of its own, at 1
/// and 8 rows; throughput in bytes of weights read. On the pool with its threads kept awake, as
/// generation runs ([`kiln::par::on_pool`]).
fn decode_weights(c: &mut Criterion) {
    use kiln::model::cpu_decode::{matmul, matmul_many};
    const LAYERS: usize = 12;
    const KV_DIM: usize = KV * HEAD;
    let w = |k: usize, n: usize| normal([k, n]) * 0.02;
    let layers: Vec<[Tensor<Cpu, 2>; 7]> = (0..LAYERS).map(|_| [w(D, D), w(D, KV_DIM), w(D, KV_DIM), w(D, D), w(D, FF), w(D, FF), w(FF, D)]).collect();
    let bytes = LAYERS * 4 * (2 * D * D + 2 * D * KV_DIM + 3 * D * FF);
    let mut g = c.benchmark_group("decode_weights_100M_12_layers");
    g.throughput(Throughput::Bytes(bytes as u64));
    g.sample_size(20);
    for rows in [1, 8] {
        let (x, h) = (normal([rows, D]), normal([rows, FF]));
        let step = || {
            for [q, k, v, o, gate, up, down] in &layers {
                let none = "the decoding kernel applies (Flex, AVX-512 or AVX2)";
                std::hint::black_box((matmul_many(&x, &[q, k, v]).expect(none), matmul(&x, o).expect(none)));
                std::hint::black_box((matmul_many(&x, &[gate, up]).expect(none), matmul(&h, down).expect(none)));
            }
        };
        g.bench_function(format!("kiln_{rows}_rows"), |b| b.iter(|| kiln::par::on_pool(|_| step(), |_: ()| {})));
    }
    g.finish();
}

/// bf16 weights (a bf16 model): the decode projection (row-major `[768, 3072]`) and the tied LM
/// head (the transpose of the `[vocab, 768]` embedding, vocab 2200 as in the 100M config), bf16
/// activations, 8 rows: kiln (the AVX512-BF16 kernel where the CPU has it, else the fallback),
/// burn's bf16 matmul, and kiln on f32 weights of the same shape for comparison.
fn bf16_projections(c: &mut Criterion) {
    use burn::tensor::DType::{BF16, F32};
    const VOCAB: usize = 2200;
    let w = (normal([D, FF]) * 0.02).cast(BF16);
    let head = (normal([VOCAB, D]) * 0.02).cast(BF16);
    let x = normal([BATCH, 1, D]).cast(BF16);
    for (name, w, n) in [("decode_projection_bf16_8x768x3072", w, FF), ("lm_head_bf16_8x768x2200_tied", head.transpose(), VOCAB)] {
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Elements((2 * BATCH * D * n) as u64));
        g.bench_function("kiln", |b| b.iter(|| proj::project(x.clone(), w.clone(), None).into_data()));
        g.bench_function("burn", |b| b.iter(|| linear(x.clone(), w.clone(), None).into_data()));
        let (x32, w32) = (x.clone().cast(F32), w.clone().cast(F32));
        g.bench_function("kiln_f32_weights", |b| b.iter(|| proj::project(x32.clone(), w32.clone(), None).into_data()));
        g.finish();
    }
}

/// The training step's projection products (the 100M config's MLP up projection at 8 × 256
/// tokens): f32 (burn's GEMM), burn's bf16 matmul (through f32), and kiln's bf16 products (f32
/// activations rounded to bf16, AVX512-BF16) with their two backward products.
fn training_products(c: &mut Criterion) {
    use burn::tensor::DType::BF16;
    const ROWS: usize = 8 * 256;
    let (x, w) = (normal([ROWS, D]), normal([D, FF]) * 0.02);
    let dy = normal([ROWS, FF]);
    let mut g = c.benchmark_group("train_gemm_2048x768x3072");
    g.throughput(Throughput::Elements((2 * ROWS * D * FF) as u64));
    g.bench_function("f32", |b| b.iter(|| x.clone().matmul(w.clone()).into_data()));
    let (xb, wb) = (x.clone().cast(BF16), w.clone().cast(BF16));
    g.bench_function("burn_bf16", |b| b.iter(|| xb.clone().matmul(wb.clone()).into_data()));
    if fused::bf16_products_available::<Cpu>() {
        g.bench_function("kiln_bf16_products", |b| b.iter(|| fused::bf16_products(x.clone(), w.clone()).unwrap().into_data()));
    } else {
        eprintln!("no AVX512-BF16 on this CPU: kiln's bf16 products are not measured");
    }
    g.finish();
    // Forward and both backward products (three GEMMs of the size above).
    type Ad = burn::backend::Autodiff<Cpu>;
    let (x, w, dy) = (Tensor::<Ad, 2>::from_inner(x), Tensor::<Ad, 2>::from_inner(w), Tensor::<Ad, 2>::from_inner(dy));
    let mut g = c.benchmark_group("train_gemm_2048x768x3072_fwd_bwd");
    g.throughput(Throughput::Elements((3 * 2 * ROWS * D * FF) as u64));
    let step = |product: &dyn Fn(Tensor<Ad, 2>, Tensor<Ad, 2>) -> Tensor<Ad, 2>| {
        let (x, w) = (x.clone().require_grad(), w.clone().require_grad());
        let grads = (product(x.clone(), w.clone()) * dy.clone()).sum().backward();
        (x.grad(&grads).unwrap().into_data(), w.grad(&grads).unwrap().into_data())
    };
    g.bench_function("f32", |b| b.iter(|| step(&|x, w| x.matmul(w))));
    if fused::bf16_products_available::<Ad>() {
        g.bench_function("kiln_bf16_products", |b| b.iter(|| step(&|x, w| fused::bf16_products(x, w).unwrap())));
    }
    g.finish();
}

fn attention_bench(c: &mut Criterion) {
    let q = normal([BATCH, SEQ, HEADS, HEAD]);
    let k = normal([BATCH, SEQ, KV, HEAD]);
    let v = normal([BATCH, SEQ, KV, HEAD]);
    let mask = KeyMask { batch: BATCH, keys: SEQ, valid: vec![1u32; BATCH * SEQ].into() };
    let valid = Tensor::<Cpu, 2, Int>::ones([BATCH, SEQ], &Default::default());
    let dense = attention_mask(valid, SEQ, KV, HEADS / KV);
    let mut g = c.benchmark_group("attention_8x64_gqa12on2");
    g.throughput(Throughput::Elements((BATCH * SEQ) as u64));
    g.bench_function("kiln_fused", |b| b.iter(|| fused::attention(q.clone(), k.clone(), v.clone(), &mask).unwrap().into_data()));
    g.bench_function("burn_attention_op", |b| {
        b.iter(|| {
            let q = q.clone().swap_dims(1, 2).reshape([BATCH, KV, HEADS / KV * SEQ, HEAD]);
            let options = AttentionModuleOptions { scale: None, softcap: None, is_causal: false };
            attention(q, k.clone().swap_dims(1, 2), v.clone().swap_dims(1, 2), Some(dense.clone()), None, options).into_data()
        })
    });
    g.finish();
}

fn rowwise(c: &mut Criterion) {
    let x = normal([BATCH, SEQ, HEADS, HEAD]);
    let cos = normal([BATCH, 1, SEQ, HEAD]);
    let sin = normal([BATCH, 1, SEQ, HEAD]);
    let mut g = c.benchmark_group("rope_8x64x12x64");
    g.bench_function("kiln_fused", |b| b.iter(|| fused::rope(x.clone(), &cos, &sin).unwrap().into_data()));
    g.bench_function("burn_ops", |b| {
        b.iter(|| {
            let (c, s) = (cos.clone().reshape([BATCH, SEQ, 1, HEAD]), sin.clone().reshape([BATCH, SEQ, 1, HEAD]));
            let rotated = Tensor::cat(vec![x.clone().narrow(3, HEAD / 2, HEAD / 2).neg(), x.clone().narrow(3, 0, HEAD / 2)], 3);
            (x.clone() * c + rotated * s).into_data()
        })
    });
    g.finish();

    let h = normal([BATCH, SEQ, D]);
    let weight = normal([D]);
    let mut g = c.benchmark_group("rms_norm_8x64x768");
    g.bench_function("kiln_fused", |b| b.iter(|| fused::rms_norm(h.clone(), weight.clone(), 1e-6).unwrap().into_data()));
    g.bench_function("burn_ops", |b| {
        b.iter(|| {
            let inv = (h.clone().square().mean_dim(2) + 1e-6).sqrt().recip();
            (h.clone() * inv * weight.clone().unsqueeze()).into_data()
        })
    });
    g.finish();

    let gate = normal([BATCH, SEQ, FF]);
    let up = normal([BATCH, SEQ, FF]);
    let mut g = c.benchmark_group("swiglu_8x64x3072");
    g.bench_function("kiln_fused", |b| b.iter(|| fused::swiglu(gate.clone(), up.clone()).unwrap().into_data()));
    g.bench_function("burn_ops", |b| b.iter(|| (silu(gate.clone()) * up.clone()).into_data()));
    g.finish();
}

fn adamw(c: &mut Criterion) {
    let n = D * FF;
    let (p, grad, m) = (normal([n]), normal([n]), normal([n]));
    let v = normal([n]).abs();
    let step = AdamWStep {
        clip: Some(0.5),
        decay: Some(1.0 - 3e-4),
        w: 0.1,
        beta2: 0.999,
        one_minus_beta2: 1e-3,
        bias_correction2_sqrt: 0.1,
        eps: 1e-8,
        step_size: 3e-3,
    };
    let mut g = c.benchmark_group("adamw_step_768x3072");
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("kiln_fused", |b| {
        b.iter(|| fused::adamw(p.clone(), grad.clone(), Some((m.clone(), v.clone())), step).unwrap().0.into_data())
    });
    g.bench_function("burn_ops", |b| {
        b.iter(|| {
            let g = grad.clone().mul_scalar(0.5);
            let m = m.clone() + (g.clone() - m.clone()).mul_scalar(0.1);
            let v = v.clone().mul_scalar(0.999) + g.clone().mul_scalar(1e-3) * g;
            let denom = v.sqrt().div_scalar(0.1).add_scalar(1e-8);
            (p.clone().mul_scalar(1.0 - 3e-4) - (m / denom).mul_scalar(3e-3)).into_data()
        })
    });
    g.finish();
}

criterion_group!(benches, projections, decode_weights, bf16_projections, training_products, attention_bench, rowwise, adamw);
criterion_main!(benches);
