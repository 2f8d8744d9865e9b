//! `kiln bench --matmul`: the CPU's f32 matrix products at one training step's shapes, timed
//! one shape at a time (compare `benches/torch_matmul.py`, which times `torch.mm` at the same
//! shapes and layouts). Every projection of the model appears three times, as the step runs
//! it: forward `x · W`, `dx = dy · Wᵀ` and `dW = xᵀ · dy`, with `x` `[batch·seq, in]`. Each
//! shape is timed for the product kiln's training step runs (`kiln::model::fused::f32_matmul`:
//! the `gemm` crate into an output it does not zero first) and for burn-flex's matmul (the same
//! kernel, output zeroed first), on the same operands, best of `--repeats` after a warm-up; the
//! last line weighs the shapes by how often a step runs them.

use std::time::Instant;

use anyhow::Result;
use burn::tensor::{Distribution, Tensor};
use kiln::backends::Cpu;
use kiln::model::Qwen2Config;
use serde_json::json;

/// One product of the step: `[m, k] · [k, n]`, how the operands lie, and how often a step runs it.
struct Shape {
    name: String,
    m: usize,
    k: usize,
    n: usize,
    /// `a` is the transpose of a row-major `[k, m]`.
    a_t: bool,
    /// `b` is the transpose of a row-major `[n, k]`.
    b_t: bool,
    per_step: usize,
}

/// The products of one training step of `config` at `rows` = batch · seq tokens.
fn shapes(config: &Qwen2Config, rows: usize) -> Vec<Shape> {
    let (h, ff, kv) = (config.hidden_size, config.intermediate_size, config.num_kv_heads() * config.head_dim());
    let layers = config.num_hidden_layers;
    let q = config.num_attention_heads * config.head_dim();
    let projections = [("q", h, q, layers), ("k+v", h, kv, 2 * layers), ("o", q, h, layers), ("gate+up", h, ff, 2 * layers), ("down", ff, h, layers), ("head", h, config.vocab_size, 1)];
    let mut out = Vec::new();
    for (name, input, output, count) in projections {
        let shape = |pass: &str, m, k, n, a_t, b_t| Shape { name: format!("{name} {pass}"), m, k, n, a_t, b_t, per_step: count };
        out.push(shape("forward", rows, input, output, false, false));
        out.push(shape("dx", rows, output, input, false, true));
        out.push(shape("dW", input, rows, output, true, false));
    }
    out
}

pub fn run(config: &Qwen2Config, rows: usize, repeats: usize, cpu: &str) -> Result<()> {
    let device = Default::default();
    let (mut kiln_s, mut burn_s, mut flops) = (0.0, 0.0, 0.0);
    for s in shapes(config, rows) {
        let operand = |rows: usize, cols: usize, transposed: bool| -> Tensor<Cpu, 2> {
            match transposed {
                true => Tensor::random([cols, rows], Distribution::Normal(0.0, 1.0), &device).transpose(),
                false => Tensor::random([rows, cols], Distribution::Normal(0.0, 1.0), &device),
            }
        };
        let (a, b) = (operand(s.m, s.k, s.a_t), operand(s.k, s.n, s.b_t));
        let best = |f: &dyn Fn() -> Tensor<Cpu, 2>| {
            f(); // warm-up: packing buffers, page faults
            (0..repeats)
                .map(|_| {
                    let start = Instant::now();
                    let c = f();
                    let _ = c.into_data();
                    start.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min)
        };
        let burn = best(&|| a.clone().matmul(b.clone()));
        let kiln = best(&|| kiln::model::fused::f32_matmul(a.clone(), b.clone()).expect("f32 operands on Flex"));
        let gflop = 2.0 * (s.m * s.k * s.n) as f64 / 1e9;
        println!(
            "{}",
            json!({"engine": "kiln", "mode": "matmul", "cpu": cpu, "shape": s.name, "m": s.m, "k": s.k, "n": s.n,
                   "a_transposed": s.a_t, "b_transposed": s.b_t, "per_step": s.per_step,
                   "kiln_gflops": gflop / kiln, "burn_gflops": gflop / burn})
        );
        kiln_s += kiln * s.per_step as f64;
        burn_s += burn * s.per_step as f64;
        flops += gflop * s.per_step as f64;
    }
    println!(
        "{}",
        json!({"engine": "kiln", "mode": "matmul", "cpu": cpu, "shape": "step", "rows": rows,
               "kiln_s": kiln_s, "burn_s": burn_s, "kiln_gflops": flops / kiln_s, "burn_gflops": flops / burn_s})
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shapes are every projection of the model, each three times (forward, dx, dW): their
    /// flops are then 6 · rows per weight, 6 · rows · (the model's parameters less norms and
    /// biases), the tied head counted once, as the embedding it is.
    #[test]
    fn the_shapes_are_every_projection_three_times() {
        let config = Qwen2Config::from_file(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/interplay/qwen2_100M/config.json")).unwrap();
        let rows = 2048;
        let shapes = shapes(&config, rows);
        assert_eq!(shapes.len(), 18);
        let flops: usize = shapes.iter().map(|s| 2 * s.m * s.k * s.n * s.per_step).sum();
        let (h, layers, kv) = (config.hidden_size, config.num_hidden_layers, config.num_kv_heads() * config.head_dim());
        let norms = (2 * layers + 1) * h;
        let biases = layers * (h + 2 * kv);
        assert_eq!(flops, 6 * rows * (config.num_parameters() - norms - biases));
        for s in &shapes {
            // Each backward product has the forward product's operands, transposed where read.
            assert!(s.m == rows || s.k == rows, "{}: one side is the tokens", s.name);
            assert_eq!(s.a_t, s.name.ends_with("dW"), "{}", s.name);
            assert_eq!(s.b_t, s.name.ends_with("dx"), "{}", s.name);
        }
    }
}
