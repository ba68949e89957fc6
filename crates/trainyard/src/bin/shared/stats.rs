//! Figures the benchmarks print.

/// The `p`-th quantile (0 to 1) of `sorted`, nearest rank.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}
