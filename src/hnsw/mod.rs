//! HNSW over MemTable vectors (DESIGN.md §8): [`Graph`] (one graph per
//! vector column of a MemTable, searched while it grows), its [`persist`]ed
//! form (next to an SSTable), the SIMD
//! [`kernel`]s it runs, the reference [`distance`]s, and [`dataset`], the
//! deterministic data with exact ground truth that tests and benchmarks
//! measure recall against.

#[cfg(any(test, feature = "testing"))]
pub mod dataset;
#[cfg(any(test, feature = "testing"))]
pub mod distance;
mod graph;
pub mod kernel;
pub mod persist;

pub use graph::Graph;
#[cfg(any(test, feature = "testing"))]
pub use graph::Hit;

use crate::schema::Metric;

/// The kernels behind [`Metric`]: defined here, beside them, so the
/// definition in `crate::schema` needs no SIMD.
impl Metric {
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
