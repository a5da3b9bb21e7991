//! [`LatencyHistogram`]: durations counted in buckets a quarter of a power
//! of two wide, lock-free, for percentiles of the WAL append latency.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Buckets: four per power of two of microseconds, up to 2^64.
const BUCKETS: usize = 256;

/// Counts of durations; a percentile is the upper bound of its bucket, at
/// most 25 % above the true value (exact below 4 µs).
#[derive(Debug)]
pub(crate) struct LatencyHistogram {
    counts: [AtomicU64; BUCKETS],
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// The bucket of `us` microseconds: `us` itself below 4, else the power of
/// two and the next two bits below it.
fn bucket(us: u64) -> usize {
    if us < 4 {
        return us as usize;
    }
    let power = 63 - us.leading_zeros() as usize;
    let quarter = ((us >> (power - 2)) & 3) as usize;
    4 * (power - 1) + quarter
}

/// The smallest duration, in microseconds, above every one in bucket `i`.
fn upper_bound(i: usize) -> u64 {
    if i < 4 {
        return i as u64 + 1;
    }
    let (power, quarter) = (i / 4 + 1, (i % 4) as u64);
    (5 + quarter).saturating_mul(1 << (power - 2))
}

impl LatencyHistogram {
    /// Counts one duration.
    pub(crate) fn record(&self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.counts[bucket(us)].fetch_add(1, Ordering::Relaxed);
    }

    /// The duration `q` (0 to 1) of the counted ones lie at or below, to
    /// within its bucket; zero if none was counted.
    pub(crate) fn quantile(&self, q: f64) -> Duration {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return Duration::ZERO;
        }
        let rank = ((total as f64 * q.clamp(0.0, 1.0)).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, n) in counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Duration::from_micros(upper_bound(i));
            }
        }
        Duration::from_micros(upper_bound(BUCKETS - 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_and_bound_their_values_within_a_quarter() {
        let mut last = 0;
        for us in (0..5000).chain([1 << 20, 123_456_789, u64::MAX / 3, u64::MAX]) {
            let b = bucket(us);
            assert!(b >= last && b < BUCKETS, "{us}: bucket {b} after {last}");
            last = b;
            let upper = upper_bound(b);
            assert!(upper > us || upper == u64::MAX, "{us} not below {upper}");
            assert!(
                upper as f64 <= (us as f64 * 1.25).max(us as f64 + 1.0),
                "{us}: {upper}"
            );
        }
    }

    #[test]
    fn quantiles_come_from_the_counted_durations() {
        let h = LatencyHistogram::default();
        assert_eq!(h.quantile(0.5), Duration::ZERO);
        for ms in 1..=100 {
            h.record(Duration::from_millis(ms));
        }
        let within = |got: Duration, want_ms: f64| {
            let got = got.as_secs_f64() * 1e3;
            assert!(
                got >= want_ms && got <= want_ms * 1.25,
                "{got} ms for {want_ms}"
            );
        };
        within(h.quantile(0.5), 50.0);
        within(h.quantile(0.99), 99.0);
        within(h.quantile(1.0), 100.0);
        within(h.quantile(0.0), 1.0);
    }
}
