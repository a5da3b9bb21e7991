//! Exact distances between two vectors of equal length, smaller is closer
//! (the metrics of a vector column: squared Euclidean, 1 − cosine
//! similarity, negative inner product). Plain loops: the reference the
//! search kernels are checked against.

/// Squared Euclidean distance.
pub fn l2(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
}

/// Negative inner product.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    -a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>()
}

/// 1 − cosine similarity (1 when either vector is zero).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    let (na, nb) = (norm(a), norm(b));
    if na == 0.0 || nb == 0.0 {
        return 1.0;
    }
    1.0 + dot(a, b) / (na * nb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_agree_with_their_definitions() {
        let (a, b) = ([1.0, 2.0, 2.0], [2.0, 0.0, 1.0]);
        assert_eq!(l2(&a, &b), 1.0 + 4.0 + 1.0);
        assert_eq!(dot(&a, &b), -4.0);
        assert!((cosine(&a, &b) - (1.0 - 4.0 / (3.0 * 5f32.sqrt()))).abs() < 1e-6);
        assert!(cosine(&a, &a.map(|x| x * 3.0)).abs() < 1e-6);
        assert_eq!(cosine(&a, &[0.0; 3]), 1.0);
    }
}
