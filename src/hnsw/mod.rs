//! HNSW over MemTable vectors (DESIGN.md §8): [`Graph`] (one graph per
//! vector column of a MemTable, searched while it grows), its [`persist`]ed
//! form (next to an SSTable), the SIMD
//! [`kernel`]s it runs, the reference [`distance`]s, and [`dataset`], the
//! deterministic data with exact ground truth that tests and benchmarks
//! measure recall against.

pub mod dataset;
pub mod distance;
mod graph;
pub mod kernel;
pub mod persist;

use serde::{Deserialize, Serialize};

pub use graph::{Graph, Hit};

/// Distance of a vector column; smaller is closer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    /// Squared Euclidean distance.
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

    /// The exact distance between `a` and `b` with the fastest kernel.
    pub fn distance(self, a: &[f32], b: &[f32]) -> f32 {
        let k = kernel::kernels();
        match self {
            Metric::L2 => (k.l2)(a, b),
            Metric::Dot => -(k.dot)(a, b),
            Metric::Cosine => {
                let norms = (k.dot)(a, a).sqrt() * (k.dot)(b, b).sqrt();
                if norms == 0.0 {
                    1.0
                } else {
                    1.0 - (k.dot)(a, b) / norms
                }
            }
        }
    }
}

/// Build parameters of a graph.
///
/// Valid ranges: `m` in [`HnswParams::M`], `ef_construction` in
/// [`HnswParams::EF_CONSTRUCTION`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HnswParams {
    /// Links per node on the upper levels; level 0 has `2 * m`.
    pub m: usize,
    /// Candidate list size while inserting.
    pub ef_construction: usize,
}

impl HnswParams {
    /// The values `m` may take.
    pub const M: std::ops::RangeInclusive<usize> = 2..=256;
    /// The values `ef_construction` may take.
    pub const EF_CONSTRUCTION: std::ops::RangeInclusive<usize> = 1..=10_000;
}

impl Default for HnswParams {
    fn default() -> Self {
        Self {
            m: 16,
            ef_construction: 100,
        }
    }
}
