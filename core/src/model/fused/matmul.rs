//! f32 matrix products on the CPU through the `gemm` crate (the kernel burn-flex's matmul runs),
//! written into an output that is not zeroed first. burn-flex allocates every product's output
//! zeroed (`FlexTensor::empty`), a pass over `[m, n]` that the product then overwrites: at the
//! shapes of the 100M model's training step, 4.5% of the step's CPU time was that `memset`, and
//! the products alone ran ~10% faster without it (`kiln bench --matmul`, Intel Xeon, 2 cores).

/// A 2-D strided view of a matrix's values `V` (a slice, or `gemm_bf16::Values`): element
/// `(i, j)` at `values[i · row_stride + j · col_stride]`. Both CPU GEMMs take their operands so,
/// and a transpose is a swap of strides.
#[derive(Clone, Copy, Debug)]
pub struct Strided<V> {
    pub values: V,
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

impl<V> Strided<V> {
    /// A row-major `[rows, cols]` matrix.
    pub fn row_major(values: V, rows: usize, cols: usize) -> Self {
        Self { values, rows, cols, row_stride: cols, col_stride: 1 }
    }

    /// The transposed view (no copy).
    pub fn t(self) -> Self {
        Self { rows: self.cols, cols: self.rows, row_stride: self.col_stride, col_stride: self.row_stride, ..self }
    }

    /// The same view of other values (`Values::F32` of a slice, say).
    pub fn with<U>(self, values: impl FnOnce(V) -> U) -> Strided<U> {
        let Self { values: v, rows, cols, row_stride, col_stride } = self;
        Strided { values: values(v), rows, cols, row_stride, col_stride }
    }

    /// Whether the view stays inside `len` values.
    pub fn fits(&self, len: usize) -> bool {
        self.rows == 0 || self.cols == 0 || (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride < len
    }
}

/// An f32 operand of [`matmul`].
pub type View<'a> = Strided<&'a [f32]>;

/// Products below this many multiply-adds run on the calling thread (burn-flex's threshold).
const PARALLEL_ABOVE: usize = 192 * 192 * 192;

/// `a · b` as row-major `[a.rows, b.cols]`, summed in f32 by `gemm` (on rayon's pool for large
/// products).
///
/// # Panics
/// If the inner dimensions differ or a view reaches past its values.
pub fn matmul(a: View<'_>, b: View<'_>) -> Vec<f32> {
    assert_eq!(a.cols, b.rows, "inner dimensions");
    assert!(a.fits(a.values.len()) && b.fits(b.values.len()), "operand views reach past their values");
    let (m, n, k) = (a.rows, b.cols, a.cols);
    let mut c: Vec<f32> = super::simd::unwritten(m * n);
    if m == 0 || n == 0 {
        return c;
    }
    let parallelism = match m.saturating_mul(n).saturating_mul(k) >= PARALLEL_ABOVE {
        true => gemm::Parallelism::Rayon(0),
        false => gemm::Parallelism::None,
    };
    // SAFETY: the views fit their values (checked); `c` has room for `m · n` values, all of which
    // `gemm` writes (`read_dst` false: `dst` is not read, and with `k` = 0 it is set to zero).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.values.as_ptr(),
            a.col_stride as isize,
            a.row_stride as isize,
            b.values.as_ptr(),
            b.col_stride as isize,
            b.row_stride as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
        c.set_len(m * n);
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both layouts of both operands, edge sizes and an empty inner dimension (all zeros), against
    /// the product in f64.
    #[test]
    fn products_match_f64() {
        let values = |len: usize, seed: u32| -> Vec<f32> {
            (0..len).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32 / (1 << 24) as f32 - 0.5).collect()
        };
        for (m, n, k) in [(1, 1, 1), (13, 33, 3), (97, 300, 257), (200, 70, 513), (3, 4, 0)] {
            let (av, bv) = (values(m * k, 1), values(k * n, 2));
            for (a, b) in [
                (View::row_major(&av, m, k), View::row_major(&bv, k, n)),
                (View::row_major(&av, k, m).t(), View::row_major(&bv, n, k).t()),
            ] {
                let got = matmul(a, b);
                assert_eq!(got.len(), m * n);
                for i in 0..m {
                    for j in 0..n {
                        let want: f64 = (0..k).map(|l| a.values[i * a.row_stride + l * a.col_stride] as f64 * b.values[l * b.row_stride + j * b.col_stride] as f64).sum();
                        let g = got[i * n + j] as f64;
                        assert!((g - want).abs() <= 1e-5 * (k as f64).sqrt() + 1e-6 * want.abs(), "{m}x{n}x{k} at ({i}, {j}): {g} vs {want}");
                    }
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "reach past")]
    fn a_view_past_its_values_is_refused() {
        let v = [0.0f32; 6];
        matmul(View::row_major(&v, 2, 4), View::row_major(&v, 4, 1));
    }
}
