//! The CPU decoding fast path computes the same products as burn's GEMM, for every row count it
//! accepts and for shapes with remainders (k not a multiple of 16, n not a multiple of 3).

use burn::tensor::{Tensor, TensorData};
use kiln::backends::Cpu;
use kiln::model::cpu_decode::{MAX_ROWS, linear_weight, matmul};

fn values(len: usize, seed: usize) -> Vec<f32> {
    (0..len).map(|i| (((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.0 - 1.0) * 0.5).collect()
}

#[test]
fn fast_path_matches_gemm() {
    let device = Default::default();
    for (k, n) in [(64, 96), (67, 31), (768, 257)] {
        let hf = values(n * k, k + n); // [out = n, in = k], HF layout
        let Some(w) = linear_weight::<Cpu>(&hf, n, k, &device) else {
            eprintln!("fast path unavailable on this CPU (needs AVX-512); nothing to compare");
            return;
        };
        for m in [1, 3, 8, 9, MAX_ROWS] {
            let x = Tensor::<Cpu, 2>::from_data(TensorData::new(values(m * k, m), [m, k]), &device);
            let fast = matmul(&x, &w).expect("fast path applies");
            let reference = x.clone().matmul(w.clone());
            let (a, b) = (fast.into_data().to_vec::<f32>().unwrap(), reference.into_data().to_vec::<f32>().unwrap());
            let err = a.iter().zip(&b).map(|(p, q)| (p - q).abs()).fold(0.0f32, f32::max);
            assert!(err < 1e-4, "m={m} k={k} n={n}: max |Δ| = {err}");
        }
        let too_many = Tensor::<Cpu, 2>::zeros([MAX_ROWS + 1, k], &device);
        assert!(matmul(&too_many, &w).is_none(), "more than MAX_ROWS rows take the GEMM path");
    }
}
