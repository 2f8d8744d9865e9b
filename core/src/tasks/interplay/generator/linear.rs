//! The symbolic side of equation mode: values as `a·x + b` with integer coefficients, printed
//! as SymPy prints them, and the step-by-step solution of `solver.py`.
//!
//! At d = 2 the reference only ever adds, subtracts and multiplies by constants, so every
//! expression SymPy builds is linear in `x`; this type reproduces its `str()` exactly.

use std::fmt;

/// `a·x + b`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Linear {
    /// Coefficient of `x`.
    pub a: i64,
    /// Constant term.
    pub b: i64,
}

impl Linear {
    /// The unknown `x`.
    pub const X: Linear = Linear { a: 1, b: 0 };

    /// A constant.
    pub fn constant(b: i64) -> Linear {
        Linear { a: 0, b }
    }

    /// `self + other` (`None` on overflow).
    pub fn add(self, other: Linear) -> Option<Linear> {
        Some(Linear {
            a: self.a.checked_add(other.a)?,
            b: self.b.checked_add(other.b)?,
        })
    }

    /// `self - other`.
    pub fn sub(self, other: Linear) -> Option<Linear> {
        Some(Linear {
            a: self.a.checked_sub(other.a)?,
            b: self.b.checked_sub(other.b)?,
        })
    }

    /// `c · self`.
    pub fn scale(self, c: i64) -> Option<Linear> {
        Some(Linear {
            a: self.a.checked_mul(c)?,
            b: self.b.checked_mul(c)?,
        })
    }
}

/// `c·x` as SymPy writes it (`x`, `-x`, `3*x`).
fn x_term(a: i64) -> String {
    match a {
        1 => "x".into(),
        -1 => "-x".into(),
        _ => format!("{a}*x"),
    }
}

impl fmt::Display for Linear {
    /// SymPy's `str`: the `x` term first, except that a negative `x` term follows a positive
    /// constant (`1 - 3*x`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b) = (self.a, self.b);
        match (a, b) {
            (0, b) => write!(f, "{b}"),
            (a, 0) => f.write_str(&x_term(a)),
            (a, b) if a < 0 && b > 0 => write!(f, "{b} - {}", x_term(-a)),
            (a, b) if b > 0 => write!(f, "{} + {b}", x_term(a)),
            (a, b) => write!(f, "{} - {}", x_term(a), b.unsigned_abs()),
        }
    }
}

/// `solve_linear_equation_from_string("<lhs> = <rhs>")` for `check_equation_order` =
/// first-order equations: the step sentences and the solution, or `None` when the equation is
/// not of first order (no `x` left) or the solution is not an integer (the reference then fails
/// its `assert specialparameter.value == solution`).
pub fn solve(lhs: Linear, rhs: i64) -> Option<(Vec<String>, i64)> {
    let moved = lhs.sub(Linear::constant(rhs))?;
    if moved.a == 0 {
        return None;
    }
    let (coeff, constant) = (moved.a, moved.b);
    let target = constant.checked_neg()?;
    if target % coeff != 0 {
        return None;
    }
    let solution = target / coeff;
    let steps = vec![
        format!("Simplifying the equation: {lhs} = {rhs}"),
        format!("Move all terms to one side: {moved} = 0"),
        format!("Isolate the term with x: {coeff}*x = {target}"),
        format!("Divide both sides by {coeff}: x = {target} / {coeff}"),
        format!("Solution: x = {solution}"),
    ];
    Some((steps, solution))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sympy_printing() {
        let cases = [
            ((-3, -5), "-3*x - 5"),
            ((-3, 1), "1 - 3*x"),
            ((-1, 7), "7 - x"),
            ((-1, -1), "-x - 1"),
            ((-2, 0), "-2*x"),
            ((0, -5), "-5"),
            ((0, 0), "0"),
            ((1, -5), "x - 5"),
            ((1, 0), "x"),
            ((1, 1), "x + 1"),
            ((2, 7), "2*x + 7"),
            ((3, -1), "3*x - 1"),
        ];
        for ((a, b), want) in cases {
            assert_eq!(Linear { a, b }.to_string(), want);
        }
    }

    #[test]
    fn solver_steps() {
        let (steps, x) = solve(Linear { a: 2, b: 3 }, 11).unwrap();
        assert_eq!(x, 4);
        assert_eq!(
            steps.join(". "),
            "Simplifying the equation: 2*x + 3 = 11. Move all terms to one side: 2*x - 8 = 0. Isolate the term with x: 2*x = 8. Divide both sides by 2: x = 8 / 2. Solution: x = 4"
        );
        assert!(solve(Linear::constant(4), 4).is_none());
        assert!(solve(Linear { a: 2, b: 0 }, 3).is_none());
    }
}
