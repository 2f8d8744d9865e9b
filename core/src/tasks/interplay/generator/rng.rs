//! The two random streams of the reference generator, reproduced draw for draw: CPython's
//! `random` module and NumPy's legacy `RandomState`, both Mersenne Twister (MT19937) based.
//!
//! Matching them exactly (same seed → same draws as Python) lets the port be checked against
//! the reference row by row; kiln's own seeding scheme is built on top (see `dataset`).

use thiserror::Error;

/// A draw Python would refuse (it raises, and the generator counts the attempt as rejected).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum RngError {
    /// `randrange`/`randint` on an empty range, or `choice` on an empty sequence.
    #[error("empty range")]
    EmptyRange,
    /// `sample` with `k` larger than the population.
    #[error("sample larger than population")]
    SampleTooLarge,
    /// `choices` with weights summing to zero or to a non-finite total.
    #[error("invalid weights")]
    InvalidWeights,
}

const N: usize = 624;
const M: usize = 397;

/// MT19937 with both of its seeding procedures.
#[derive(Clone)]
pub struct Mt19937 {
    state: [u32; N],
    index: usize,
}

impl std::fmt::Debug for Mt19937 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mt19937")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl Mt19937 {
    /// `init_genrand(seed)` (NumPy's `RandomState.seed(int)`).
    pub fn from_u32(seed: u32) -> Self {
        let mut state = [0u32; N];
        state[0] = seed;
        for i in 1..N {
            state[i] = 1_812_433_253u32
                .wrapping_mul(state[i - 1] ^ (state[i - 1] >> 30))
                .wrapping_add(i as u32);
        }
        Self { state, index: N }
    }

    /// `init_by_array(key)` (CPython's `random.seed(int)`).
    pub fn from_key(key: &[u32]) -> Self {
        let mut mt = Self::from_u32(19_650_218);
        let s = &mut mt.state;
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..N.max(key.len()) {
            s[i] = (s[i] ^ (s[i - 1] ^ (s[i - 1] >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                s[0] = s[N - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..N - 1 {
            s[i] = (s[i] ^ (s[i - 1] ^ (s[i - 1] >> 30)).wrapping_mul(1_566_083_941))
                .wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                s[0] = s[N - 1];
                i = 1;
            }
        }
        s[0] = 0x8000_0000;
        mt
    }

    /// The next 32-bit output.
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    fn twist(&mut self) {
        const UPPER: u32 = 0x8000_0000;
        const LOWER: u32 = 0x7fff_ffff;
        const MATRIX_A: u32 = 0x9908_b0df;
        for k in 0..N {
            let y = (self.state[k] & UPPER) | (self.state[(k + 1) % N] & LOWER);
            let mag = if y & 1 == 1 { MATRIX_A } else { 0 };
            self.state[k] = self.state[(k + M) % N] ^ (y >> 1) ^ mag;
        }
        self.index = 0;
    }

    /// A double in [0, 1) from 53 random bits (`genrand_res53`, shared by CPython and NumPy).
    pub fn next_f64(&mut self) -> f64 {
        let a = self.next_u32() >> 5;
        let b = self.next_u32() >> 6;
        (f64::from(a) * 67_108_864.0 + f64::from(b)) / 9_007_199_254_740_992.0
    }
}

/// CPython 3.11's `random.Random`.
#[derive(Debug, Clone)]
pub struct PyRandom {
    mt: Mt19937,
    gauss_next: Option<f64>,
}

impl PyRandom {
    /// `random.seed(seed)` for a non-negative integer seed.
    pub fn new(seed: u64) -> Self {
        let key: Vec<u32> = if seed >> 32 == 0 {
            vec![seed as u32]
        } else {
            vec![seed as u32, (seed >> 32) as u32]
        };
        Self {
            mt: Mt19937::from_key(&key),
            gauss_next: None,
        }
    }

    /// `random()`.
    pub fn random(&mut self) -> f64 {
        self.mt.next_f64()
    }

    /// `getrandbits(k)` for `k ≤ 64`.
    fn getrandbits(&mut self, k: u32) -> u64 {
        match k {
            0 => 0,
            1..=32 => u64::from(self.mt.next_u32() >> (32 - k)),
            _ => {
                let low = u64::from(self.mt.next_u32());
                let high = u64::from(self.mt.next_u32() >> (64 - k));
                low | (high << 32)
            }
        }
    }

    /// `_randbelow(n)` for `n > 0`: rejection sampling on `n.bit_length()` bits.
    pub fn randbelow(&mut self, n: u64) -> u64 {
        let k = 64 - n.leading_zeros();
        loop {
            let r = self.getrandbits(k);
            if r < n {
                return r;
            }
        }
    }

    /// `randint(a, b)`, inclusive.
    pub fn randint(&mut self, a: i64, b: i64) -> Result<i64, RngError> {
        let width = b + 1 - a;
        if width <= 0 {
            return Err(RngError::EmptyRange);
        }
        Ok(a + self.randbelow(width as u64) as i64)
    }

    /// The index `choice(seq)` would pick from a sequence of `len` items.
    pub fn choice(&mut self, len: usize) -> Result<usize, RngError> {
        if len == 0 {
            return Err(RngError::EmptyRange);
        }
        Ok(self.randbelow(len as u64) as usize)
    }

    /// `shuffle(x)`.
    pub fn shuffle<T>(&mut self, x: &mut [T]) {
        for i in (1..x.len()).rev() {
            let j = self.randbelow(i as u64 + 1) as usize;
            x.swap(i, j);
        }
    }

    /// The indices (into the population) `sample(population, k)` returns, in order.
    pub fn sample(&mut self, n: usize, k: usize) -> Result<Vec<usize>, RngError> {
        if k > n {
            return Err(RngError::SampleTooLarge);
        }
        let mut setsize = 21usize;
        if k > 5 {
            setsize += 4usize.pow(((k * 3) as f64).log(4.0).ceil() as u32);
        }
        let mut result = Vec::with_capacity(k);
        if n <= setsize {
            let mut pool: Vec<usize> = (0..n).collect();
            for i in 0..k {
                let j = self.randbelow((n - i) as u64) as usize;
                result.push(pool[j]);
                pool[j] = pool[n - i - 1];
            }
        } else {
            let mut selected = std::collections::HashSet::with_capacity(k);
            for _ in 0..k {
                let mut j = self.randbelow(n as u64) as usize;
                while selected.contains(&j) {
                    j = self.randbelow(n as u64) as usize;
                }
                selected.insert(j);
                result.push(j);
            }
        }
        Ok(result)
    }

    /// `gauss(mu, sigma)`: Box–Muller, caching the second value.
    pub fn gauss(&mut self, mu: f64, sigma: f64) -> f64 {
        let z = match self.gauss_next.take() {
            Some(z) => z,
            None => {
                let x2pi = self.random() * std::f64::consts::TAU;
                let g2rad = (-2.0 * (1.0 - self.random()).ln()).sqrt();
                self.gauss_next = Some(x2pi.sin() * g2rad);
                x2pi.cos() * g2rad
            }
        };
        mu + z * sigma
    }

    /// The index `choices(population, weights)[0]` picks.
    pub fn choices(&mut self, weights: &[f64]) -> Result<usize, RngError> {
        let cumulative: Vec<f64> = weights
            .iter()
            .scan(0.0, |acc, w| {
                *acc += w;
                Some(*acc)
            })
            .collect();
        let total = *cumulative.last().ok_or(RngError::EmptyRange)?;
        if total <= 0.0 || !total.is_finite() {
            return Err(RngError::InvalidWeights);
        }
        let x = self.random() * total;
        let hi = weights.len() - 1;
        // bisect_right(cumulative, x, 0, hi)
        Ok(cumulative[..hi].partition_point(|&c| c <= x))
    }
}

/// NumPy's legacy `RandomState` (what `np.random.*` uses).
#[derive(Debug, Clone)]
pub struct NpRandom {
    mt: Mt19937,
}

impl NpRandom {
    /// `np.random.seed(seed)`.
    pub fn new(seed: u32) -> Self {
        Self {
            mt: Mt19937::from_u32(seed),
        }
    }

    /// `random_sample()`.
    pub fn random_sample(&mut self) -> f64 {
        self.mt.next_f64()
    }

    /// `randint(low, high)`: `[low, high)` by masked rejection; no draw when the range has one value.
    pub fn randint(&mut self, low: i64, high: i64) -> Result<i64, RngError> {
        if high <= low {
            return Err(RngError::EmptyRange);
        }
        let range = (high - 1 - low) as u64;
        if range == 0 {
            return Ok(low);
        }
        assert!(
            range <= u64::from(u32::MAX),
            "ranges above 2^32 are not used"
        );
        let mask = u32::MAX >> (range as u32).leading_zeros();
        loop {
            let v = self.mt.next_u32() & mask;
            if u64::from(v) <= range {
                return Ok(low + i64::from(v));
            }
        }
    }

    /// `choice(len(p), p=p)`: inverse CDF over `p.cumsum() / p.cumsum()[-1]` (`searchsorted`
    /// right) of one uniform draw.
    pub fn choice_p(&mut self, p: &[f64]) -> usize {
        let mut cdf: Vec<f64> = p
            .iter()
            .scan(0.0, |acc, w| {
                *acc += w;
                Some(*acc)
            })
            .collect();
        let last = *cdf.last().expect("non-empty probabilities");
        for c in &mut cdf {
            *c /= last;
        }
        let u = self.random_sample();
        cdf.partition_point(|&c| c <= u)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values printed by CPython 3.11 / NumPy 2.4 for the same calls.
    #[test]
    fn matches_python_and_numpy() {
        let mut py = PyRandom::new(1234);
        assert_eq!(py.random(), 0.9664535356921388);
        assert_eq!(py.randint(1, 100).unwrap(), 57);
        let mut np = NpRandom::new(1234);
        assert_eq!(np.random_sample(), 0.1915194503788923);
        assert_eq!(np.randint(0, 10).unwrap(), 6);

        let mut r = PyRandom::new((1 << 40) + 5);
        assert_eq!(r.random(), 0.5043802970418443);
        assert_eq!(r.gauss(0.0, 1.0), -0.26599670041490253);
        assert_eq!(r.gauss(0.0, 1.0), 2.2651413745246916);
        assert_eq!(r.sample(30, 4).unwrap(), vec![16, 24, 26, 25]);
        assert_eq!(r.sample(5, 3).unwrap(), vec![0, 1, 4]);
        assert_eq!(r.choices(&[0.5, 1.0, 2.0]).unwrap(), 2);
        let mut x: Vec<u32> = (0..10).collect();
        r.shuffle(&mut x);
        assert_eq!(x, vec![6, 4, 7, 0, 8, 5, 1, 9, 3, 2]);

        let mut rs = NpRandom::new(77);
        assert_eq!(rs.choice_p(&[0.1, 0.2, 0.3, 0.2, 0.2]), 4);
        assert_eq!(rs.randint(0, 3).unwrap(), 0);
        assert_eq!(rs.randint(5, 6).unwrap(), 5);
        assert_eq!(rs.randint(0, 7).unwrap(), 4);
    }
}
