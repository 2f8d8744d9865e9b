//! Metrics over samples: the unbiased and the ordered pass@k estimators ([`passk`]), with
//! Python's correctly rounded integer division for exact ratios ([`exact`]).

pub mod exact;
pub mod passk;

pub use passk::{pass_probability, pass_series};
