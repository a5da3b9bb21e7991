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
