//! Deterministic vector data with exact ground truth, for recall tests and
//! benchmarks (the same seed gives the same vectors on every machine):
//!
//! - [`Shape::Clustered`]: points around `clusters` Gaussian centres — the
//!   kind of data embeddings are, where a good HNSW reaches recall ≈ 1;
//! - [`Shape::LowRank`]: points in a random `rank`-dimensional subspace plus
//!   a little noise (high intrinsic structure, low intrinsic dimension);
//! - [`Shape::Gaussian`]: pure Gaussian noise, the stress case no HNSW
//!   searches well at high dimension (PEERS.md: recall 0.18 at 1024-d).
//!
//! Vectors are row-major `f32`s; [`exact_neighbours`] is the brute-force
//! top-k every recall figure is measured against.

use std::sync::Arc;

use datafusion::arrow::array::{FixedSizeListArray, Float32Array};
use datafusion::arrow::datatypes::{DataType, Field};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// How generated vectors are distributed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Shape {
    /// Around `clusters` centres drawn from N(0, 1); each point is its
    /// centre plus N(0, `spread`²) per coordinate.
    Clustered {
        /// Number of centres.
        clusters: usize,
        /// Standard deviation around a centre.
        spread: f32,
    },
    /// `z · W + noise`, `z` ~ N(0, 1) of length `rank`, `W` a fixed random
    /// `rank × dim` matrix, noise N(0, 0.01²).
    LowRank {
        /// Dimension of the latent space.
        rank: usize,
    },
    /// N(0, 1) in every coordinate.
    Gaussian,
}

/// `n` vectors of `dim` floats, row-major. The structure (cluster centres,
/// subspace) depends on `seed` only, so data and queries drawn with the same
/// seed and different `stream`s share it: use stream 0 for the data and
/// stream 1 for queries.
pub fn vectors(shape: Shape, n: usize, dim: usize, seed: u64, stream: u64) -> Vec<f32> {
    let mut structure = StdRng::seed_from_u64(seed);
    let mut rng =
        StdRng::seed_from_u64(seed ^ (stream.wrapping_add(1)).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut out = Vec::with_capacity(n * dim);
    match shape {
        Shape::Clustered { clusters, spread } => {
            let centres: Vec<f32> = (0..clusters.max(1) * dim)
                .map(|_| normal(&mut structure))
                .collect();
            for _ in 0..n {
                let c = rng.random_range(0..clusters.max(1));
                let centre = &centres[c * dim..(c + 1) * dim];
                out.extend(centre.iter().map(|x| x + spread * normal(&mut rng)));
            }
        }
        Shape::LowRank { rank } => {
            let rank = rank.max(1);
            let w: Vec<f32> = (0..rank * dim).map(|_| normal(&mut structure)).collect();
            let scale = 1.0 / (rank as f32).sqrt();
            for _ in 0..n {
                let z: Vec<f32> = (0..rank).map(|_| normal(&mut rng)).collect();
                for d in 0..dim {
                    let x: f32 = (0..rank).map(|r| z[r] * w[r * dim + d]).sum();
                    out.push(x * scale + 0.01 * normal(&mut rng));
                }
            }
        }
        Shape::Gaussian => out.extend((0..n * dim).map(|_| normal(&mut rng))),
    }
    out
}

/// A draw from N(0, 1) (Box–Muller).
fn normal(rng: &mut StdRng) -> f32 {
    let u1: f64 = 1.0 - rng.random::<f64>(); // (0, 1]: ln is finite
    let u2: f64 = rng.random();
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

/// Row-major vectors as the Arrow column a `FLOAT[dim]` table stores
/// (`FixedSizeList<Float32>`, no nulls).
pub fn to_array(data: &[f32], dim: usize) -> FixedSizeListArray {
    FixedSizeListArray::new(
        Arc::new(Field::new("item", DataType::Float32, true)),
        dim as i32,
        Arc::new(Float32Array::from(data.to_vec())),
        None,
    )
}

/// For each query (row-major, `dim` floats each), the indices of its `k`
/// nearest rows of `data` by `distance`, nearest first; ties go to the
/// lower index. Exact (brute force).
pub fn exact_neighbours(
    data: &[f32],
    queries: &[f32],
    dim: usize,
    k: usize,
    distance: fn(&[f32], &[f32]) -> f32,
) -> Vec<Vec<u32>> {
    queries
        .chunks_exact(dim)
        .map(|q| {
            let mut scored: Vec<(f32, u32)> = data
                .chunks_exact(dim)
                .enumerate()
                .map(|(i, v)| (distance(q, v), i as u32))
                .collect();
            let k = k.min(scored.len());
            if k == 0 {
                return Vec::new();
            }
            let by = |a: &(f32, u32), b: &(f32, u32)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
            scored.select_nth_unstable_by(k - 1, by);
            scored.truncate(k);
            scored.sort_unstable_by(by);
            scored.into_iter().map(|(_, i)| i).collect()
        })
        .collect()
}

/// Recall@k of `found` against `truth` (both per query): the share of true
/// neighbours found, over all queries.
pub fn recall(found: &[Vec<u32>], truth: &[Vec<u32>]) -> f64 {
    let (mut hit, mut all) = (0usize, 0usize);
    for (f, t) in found.iter().zip(truth) {
        let t: std::collections::HashSet<u32> = t.iter().copied().collect();
        hit += f.iter().filter(|i| t.contains(i)).count();
        all += t.len();
    }
    if all == 0 {
        1.0
    } else {
        hit as f64 / all as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hnsw::distance::l2;

    #[test]
    fn same_seed_same_vectors_and_queries_share_the_structure() {
        let shape = Shape::Clustered {
            clusters: 4,
            spread: 0.05,
        };
        let a = vectors(shape, 50, 16, 7, 0);
        assert_eq!(a, vectors(shape, 50, 16, 7, 0));
        assert_ne!(a, vectors(shape, 50, 16, 8, 0));
        let queries = vectors(shape, 10, 16, 7, 1);
        assert_ne!(&queries[..16], &a[..16]);
        // A query lies close to some data point (same centres): within a
        // few spreads, far below the distance between random centres.
        for q in queries.chunks_exact(16) {
            let nearest = a
                .chunks_exact(16)
                .map(|v| l2(q, v))
                .fold(f32::INFINITY, f32::min);
            assert!(nearest < 16.0 * 4.0 * 0.05 * 0.05 * 4.0, "{nearest}");
        }
        for shape in [Shape::LowRank { rank: 4 }, Shape::Gaussian] {
            let v = vectors(shape, 20, 32, 3, 0);
            assert_eq!(v.len(), 20 * 32);
            assert!(v.iter().all(|x| x.is_finite()));
            assert_eq!(v, vectors(shape, 20, 32, 3, 0));
        }
    }

    #[test]
    fn exact_neighbours_are_the_nearest_in_order() {
        let data = vectors(Shape::Gaussian, 300, 8, 1, 0);
        let queries = vectors(Shape::Gaussian, 5, 8, 1, 1);
        let truth = exact_neighbours(&data, &queries, 8, 10, l2);
        for (q, ids) in queries.chunks_exact(8).zip(&truth) {
            assert_eq!(ids.len(), 10);
            let d: Vec<f32> = ids
                .iter()
                .map(|&i| l2(q, &data[i as usize * 8..][..8]))
                .collect();
            assert!(d.windows(2).all(|w| w[0] <= w[1]), "not nearest first");
            // Nothing outside the top 10 is nearer than the 10th.
            let worst = d[9];
            let closer = data.chunks_exact(8).filter(|v| l2(q, v) < worst).count();
            assert_eq!(closer, 9);
        }
        assert_eq!(recall(&truth, &truth), 1.0);
        let half: Vec<Vec<u32>> = truth.iter().map(|t| t[..5].to_vec()).collect();
        assert_eq!(recall(&half, &truth), 0.5);
    }
}
