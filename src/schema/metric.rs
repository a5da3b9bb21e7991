//! The distance of a vector column ([`Metric`]) and how its graphs are
//! built ([`HnswParams`]): table definitions hold both.

use serde::{Deserialize, Serialize};

/// Distance of a vector column; smaller is closer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    /// Euclidean distance (searched as its square, see
    /// [`Metric::reported`]).
    #[default]
    L2,
    /// 1 − cosine similarity (1 when either vector is zero).
    Cosine,
    /// Negative inner product.
    Dot,
}

impl Metric {
    /// The metric named `s` (`l2`/`euclidean`, `cosine`, `dot`), any case.
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "l2" | "euclidean" => Some(Metric::L2),
            "cosine" => Some(Metric::Cosine),
            "dot" => Some(Metric::Dot),
            _ => None,
        }
    }

    /// The distance users see for a [`Metric::distance`]: the Euclidean
    /// distance for `l2` (graphs compare squares, which order alike), the
    /// distance itself otherwise.
    pub fn reported(self, distance: f32) -> f32 {
        match self {
            Metric::L2 => distance.sqrt(),
            Metric::Cosine | Metric::Dot => distance,
        }
    }

    /// The metric's name, as [`Metric::parse`] reads it.
    pub fn name(self) -> &'static str {
        match self {
            Metric::L2 => "l2",
            Metric::Cosine => "cosine",
            Metric::Dot => "dot",
        }
    }
}

/// Why `vector` can be neither stored nor searched, if so: as the end of
/// "holds ...". Its values must be finite, and its squared length within
/// `f32`'s normal range, where distances computed in `f32` stay exact
/// enough to rank by: at most `f32::MAX / 4` (about 8.5e37; elements up to
/// about 3e17 in a 768-d vector), so that no distance between two such
/// vectors overflows to infinity (every row would tie, or rank as NaN);
/// and, unless every value is zero, at least `f32::MIN_POSITIVE` (about
/// 1.2e-38), so that no length underflows to zero (a cosine would see a
/// zero vector). Checked in `f64`, for every metric alike.
pub fn vector_fault(vector: &[f32]) -> Option<String> {
    if let Some(bad) = vector.iter().find(|v| !v.is_finite()) {
        return Some(match bad.is_nan() {
            true => "a non-finite value (NaN)".to_string(),
            false => format!("a value beyond the range of FLOAT ({bad})"),
        });
    }
    let squared: f64 = vector.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let (most, least) = (f64::from(f32::MAX) / 4.0, f64::from(f32::MIN_POSITIVE));
    if squared > most {
        Some(format!(
            "values too large for FLOAT distances (squared length {squared:.2e}, \
             at most {most:.2e}: scale the vector down)"
        ))
    } else if squared > 0.0 && squared < least {
        Some(format!(
            "values too small for FLOAT distances (squared length {squared:.2e}, \
             at least {least:.2e} unless all zeros: scale the vector up)"
        ))
    } else {
        None
    }
}

/// Build parameters of a graph.
///
/// A table accepts `m` in [`HnswParams::M`] and `ef_construction` in
/// [`HnswParams::EF_CONSTRUCTION`], at least
/// [`HnswParams::min_ef_construction`]`(m)`. Below those bounds the graph
/// falls apart: built with `m = 2, ef_construction = 1`, a search with a
/// candidate list as long as the graph reaches 0.2 % of 10,000 clustered
/// 128-d vectors; at the bounds it reaches at least 95 % of clustered,
/// low-rank and Gaussian ones (the graph's tests check both sides).
/// Whatever the graph, a search still returns every row it is asked for:
/// the read path searches a layer whose graph comes up short exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HnswParams {
    /// Links per node on the upper levels; level 0 has `2 * m`.
    pub m: usize,
    /// Candidate list size while inserting.
    pub ef_construction: usize,
}

impl HnswParams {
    /// The values `m` may take (the paper's advice starts at 5).
    pub const M: std::ops::RangeInclusive<usize> = 5..=256;
    /// The values `ef_construction` may take (see also
    /// [`HnswParams::min_ef_construction`]).
    pub const EF_CONSTRUCTION: std::ops::RangeInclusive<usize> = 32..=10_000;

    /// The smallest `ef_construction` that goes with `m`: twice `m` (as
    /// pgvector asks), so an insertion's candidate list can fill a level-0
    /// list of `2 * m` links, and never below [`HnswParams::EF_CONSTRUCTION`].
    pub fn min_ef_construction(m: usize) -> usize {
        (2 * m).max(*Self::EF_CONSTRUCTION.start())
    }

    /// The nearest parameters within the bounds above.
    pub fn clamped(self) -> Self {
        let m = self.m.clamp(*Self::M.start(), *Self::M.end());
        let ef_construction = self
            .ef_construction
            .clamp(Self::min_ef_construction(m), *Self::EF_CONSTRUCTION.end());
        Self { m, ef_construction }
    }
}

impl Default for HnswParams {
    fn default() -> Self {
        Self {
            m: 16,
            ef_construction: 100,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vector_is_refused_where_its_distances_would_leave_f32s_range() {
        for fine in [
            vec![0.0; 768],
            vec![1.0; 768],
            vec![3e17; 768],
            vec![1e-19; 2],
        ] {
            assert_eq!(vector_fault(&fine), None, "{}", fine[0]);
            // Every distance between two accepted vectors is finite.
            let negated: Vec<f32> = fine.iter().map(|v| -v).collect();
            for metric in [Metric::L2, Metric::Cosine, Metric::Dot] {
                assert!(metric.distance(&fine, &negated).is_finite(), "{metric:?}");
            }
        }
        let fault = |v: &[f32]| vector_fault(v).unwrap_or_default();
        assert!(fault(&[f32::NAN]).contains("non-finite value (NaN)"));
        assert!(fault(&[1.0, f32::INFINITY]).contains("beyond the range of FLOAT (inf)"));
        assert!(fault(&[3e37, 3e37]).contains("too large"));
        assert!(fault(&[4e17; 768]).contains("too large"));
        assert!(fault(&[1e-30, 0.0]).contains("too small"));
    }
}
