//! Python's correctly rounded integer true division (`a / b` on ints, `float(Fraction(a, b))`),
//! used where the reference divides exact integers: pass@k ratios of binomials, fraction
//! answers, and `/` between integer literals in parsed solutions.

/// `a / b` rounded to the nearest `f64` (ties to even); `None` for `b == 0`.
pub fn int_ratio_to_f64(a: i128, b: i128) -> Option<f64> {
    if b == 0 {
        return None;
    }
    let negative = (a < 0) != (b < 0);
    let q = uint_ratio_to_f64(a.unsigned_abs(), b.unsigned_abs());
    Some(if negative { -q } else { q })
}

/// `a / b` for unsigned integers, correctly rounded; `b` must be non-zero.
pub fn uint_ratio_to_f64(a: u128, b: u128) -> f64 {
    assert!(b != 0, "division by zero");
    if a == 0 {
        return 0.0;
    }
    const EXACT: u128 = 1 << 53;
    if a <= EXACT && b <= EXACT {
        return a as f64 / b as f64;
    }
    // Long division until the quotient has 55 significant bits; the remainder is the sticky bit.
    let mut q = a / b;
    let mut r = a % b;
    let mut exp: i32 = 0;
    while bits(q) < 55 {
        let bit = r >= b - r;
        r = if bit { r - (b - r) } else { r << 1 };
        q = (q << 1) | u128::from(bit);
        exp -= 1;
    }
    let extra = bits(q) - 53;
    let mut mantissa = q >> extra;
    let rest = q & ((1u128 << extra) - 1);
    let half = 1u128 << (extra - 1);
    let sticky = r != 0;
    if rest > half || (rest == half && (sticky || mantissa & 1 == 1)) {
        mantissa += 1;
    }
    // `mantissa` has at most 54 bits, so it converts exactly; scaling by a power of two is exact.
    mantissa as f64 * 2f64.powi(exp + extra as i32)
}

fn bits(v: u128) -> u32 {
    128 - v.leading_zeros()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn correctly_rounded() {
        assert_eq!(int_ratio_to_f64(1, 3), Some(1.0 / 3.0));
        assert_eq!(int_ratio_to_f64(-7, 2), Some(-3.5));
        assert_eq!(int_ratio_to_f64(1, 0), None);
        // Python: 10**30 / 3 == 3.333333333333333e+29, (2**60 + 1) / 2**60 == 1.0
        assert_eq!(uint_ratio_to_f64(10u128.pow(30), 3), 3.333333333333333e29);
        assert_eq!(uint_ratio_to_f64((1 << 60) + 1, 1 << 60), 1.0);
        assert_eq!(uint_ratio_to_f64((1 << 54) + 3, 2), 9007199254740994.0);
    }
}
