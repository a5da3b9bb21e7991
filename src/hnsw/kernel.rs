//! The distance kernels the graph and exact search run: squared L2 and
//! inner product over `f32`, with SIMD chosen once at run time (AVX2 + FMA
//! on x86-64 when the CPU has it, NEON on AArch64, plain loops elsewhere).
//!
//! Each kernel keeps four independent accumulators so the FMA latency is
//! hidden; results differ from [`super::distance`] (the reference) only by
//! float rounding order, which the tests bound.

use std::sync::OnceLock;

/// A kernel over two slices of equal length.
pub type Kernel = fn(&[f32], &[f32]) -> f32;

/// A kernel from one query to four vectors at once (the query is loaded
/// once per step for all four).
pub type Kernel4 = fn(&[f32], [&[f32]; 4]) -> [f32; 4];

/// The kernels for this CPU.
#[derive(Debug, Clone, Copy)]
pub struct Kernels {
    /// Squared Euclidean distance.
    pub l2: Kernel,
    /// Inner product (not negated).
    pub dot: Kernel,
    /// Squared Euclidean distances from one query to four vectors.
    pub l2_x4: Kernel4,
    /// Inner products of one query with four vectors.
    pub dot_x4: Kernel4,
    /// What was chosen, for benchmarks and logs.
    pub name: &'static str,
}

/// The best kernels this CPU runs, detected once.
pub fn kernels() -> &'static Kernels {
    static CHOSEN: OnceLock<Kernels> = OnceLock::new();
    CHOSEN.get_or_init(|| {
        let chosen = choose();
        log::debug!("distance kernels: {}", chosen.name);
        chosen
    })
}

/// The fastest kernels this CPU runs.
fn choose() -> Kernels {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        return Kernels {
            l2: avx2::l2,
            dot: avx2::dot,
            l2_x4: avx2::l2_x4,
            dot_x4: avx2::dot_x4,
            name: "avx2+fma",
        };
    }
    #[cfg(target_arch = "aarch64")]
    return Kernels {
        l2: neon::l2,
        dot: neon::dot,
        l2_x4: |q, v| v.map(|v| neon::l2(q, v)),
        dot_x4: |q, v| v.map(|v| neon::dot(q, v)),
        name: "neon",
    };
    #[allow(unreachable_code)]
    portable()
}

/// Plain loops with four accumulators (what the compiler vectorizes for the
/// baseline target).
pub fn portable() -> Kernels {
    Kernels {
        l2: portable_l2,
        dot: portable_dot,
        l2_x4: |q, v| v.map(|v| portable_l2(q, v)),
        dot_x4: |q, v| v.map(|v| portable_dot(q, v)),
        name: "portable",
    }
}

fn portable_l2(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| (x - y) * (x - y))
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            let d = x[i] - y[i];
            acc[i] += d * d;
        }
    }
    acc.iter().sum::<f32>() + tail
}

fn portable_dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// Eight floats from `p`, unaligned. Not `_mm256_loadu_ps`: that
    /// copies through `copy_nonoverlapping`, whose precondition check runs
    /// in builds with debug assertions (tests, benches on the dev profile)
    /// and made the kernels three times slower there.
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        #[repr(C, packed)]
        struct Unaligned(__m256);
        // SAFETY: the caller passes a pointer to 8 readable floats; a
        // packed struct has alignment 1.
        unsafe { (*(p as *const Unaligned)).0 }
    }

    /// Sum of the eight lanes.
    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        let half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let pairs = _mm_add_ps(half, _mm_movehl_ps(half, half));
        _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)))
    }

    /// Squared L2 (`L2`) or inner product of `a` and `b`, four
    /// accumulators.
    #[target_feature(enable = "avx2,fma")]
    fn one_avx2<const L2: bool>(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let step = |acc: __m256, x: __m256, y: __m256| match L2 {
            true => {
                let d = _mm256_sub_ps(x, y);
                _mm256_fmadd_ps(d, d, acc)
            }
            false => _mm256_fmadd_ps(x, y, acc),
        };
        let mut i = 0;
        // SAFETY: every load reads 8 floats starting below `n - 7`.
        unsafe {
            while i + 32 <= n {
                for (j, acc) in acc.iter_mut().enumerate() {
                    let k = i + 8 * j;
                    *acc = step(*acc, load(pa.add(k)), load(pb.add(k)));
                }
                i += 32;
            }
            while i + 8 <= n {
                acc[0] = step(acc[0], load(pa.add(i)), load(pb.add(i)));
                i += 8;
            }
        }
        let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let tail: f32 = a[i..n]
            .iter()
            .zip(&b[i..n])
            .map(|(x, y)| if L2 { (x - y) * (x - y) } else { x * y })
            .sum();
        hsum(sum) + tail
    }

    /// `(query, v_j)` for four vectors, one accumulator each.
    #[target_feature(enable = "avx2,fma")]
    fn x4_avx2<const L2: bool>(q: &[f32], v: [&[f32]; 4]) -> [f32; 4] {
        let n = v.iter().fold(q.len(), |n, v| n.min(v.len()));
        let pq = q.as_ptr();
        let pv = v.map(|v| v.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        // SAFETY: every load reads 8 floats starting below `n - 7`.
        unsafe {
            while i + 8 <= n {
                let x = load(pq.add(i));
                for j in 0..4 {
                    let y = load(pv[j].add(i));
                    acc[j] = if L2 {
                        let d = _mm256_sub_ps(x, y);
                        _mm256_fmadd_ps(d, d, acc[j])
                    } else {
                        _mm256_fmadd_ps(x, y, acc[j])
                    };
                }
                i += 8;
            }
        }
        std::array::from_fn(|j| {
            let tail: f32 = q[i..n]
                .iter()
                .zip(&v[j][i..n])
                .map(|(x, y)| if L2 { (x - y) * (x - y) } else { x * y })
                .sum();
            hsum(acc[j]) + tail
        })
    }

    // The entry points are only handed out by `kernels()` after it has
    // detected AVX2 and FMA.
    pub fn l2_x4(q: &[f32], v: [&[f32]; 4]) -> [f32; 4] {
        // SAFETY: selected only on CPUs with AVX2 and FMA.
        unsafe { x4_avx2::<true>(q, v) }
    }

    pub fn dot_x4(q: &[f32], v: [&[f32]; 4]) -> [f32; 4] {
        // SAFETY: selected only on CPUs with AVX2 and FMA.
        unsafe { x4_avx2::<false>(q, v) }
    }

    pub fn l2(a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: selected only on CPUs with AVX2 and FMA.
        unsafe { one_avx2::<true>(a, b) }
    }

    pub fn dot(a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: selected only on CPUs with AVX2 and FMA.
        unsafe { one_avx2::<false>(a, b) }
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::*;

    // NEON is part of the AArch64 baseline: no detection needed.
    pub fn l2(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut i = 0;
        // SAFETY: every load reads 4 floats starting below `n - 3`.
        let sum = unsafe {
            let mut acc = [vdupq_n_f32(0.0); 4];
            while i + 16 <= n {
                for (j, acc) in acc.iter_mut().enumerate() {
                    let d = vsubq_f32(vld1q_f32(pa.add(i + 4 * j)), vld1q_f32(pb.add(i + 4 * j)));
                    *acc = vfmaq_f32(*acc, d, d);
                }
                i += 16;
            }
            while i + 4 <= n {
                let d = vsubq_f32(vld1q_f32(pa.add(i)), vld1q_f32(pb.add(i)));
                acc[0] = vfmaq_f32(acc[0], d, d);
                i += 4;
            }
            vaddvq_f32(vaddq_f32(
                vaddq_f32(acc[0], acc[1]),
                vaddq_f32(acc[2], acc[3]),
            ))
        };
        let tail: f32 = a[i..n]
            .iter()
            .zip(&b[i..n])
            .map(|(x, y)| (x - y) * (x - y))
            .sum();
        sum + tail
    }

    pub fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut i = 0;
        // SAFETY: every load reads 4 floats starting below `n - 3`.
        let sum = unsafe {
            let mut acc = [vdupq_n_f32(0.0); 4];
            while i + 16 <= n {
                for (j, acc) in acc.iter_mut().enumerate() {
                    *acc = vfmaq_f32(
                        *acc,
                        vld1q_f32(pa.add(i + 4 * j)),
                        vld1q_f32(pb.add(i + 4 * j)),
                    );
                }
                i += 16;
            }
            while i + 4 <= n {
                acc[0] = vfmaq_f32(acc[0], vld1q_f32(pa.add(i)), vld1q_f32(pb.add(i)));
                i += 4;
            }
            vaddvq_f32(vaddq_f32(
                vaddq_f32(acc[0], acc[1]),
                vaddq_f32(acc[2], acc[3]),
            ))
        };
        let tail: f32 = a[i..n].iter().zip(&b[i..n]).map(|(x, y)| x * y).sum();
        sum + tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hnsw::distance;

    #[test]
    fn kernels_match_the_reference_distances() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        for kernels in [*kernels(), portable()] {
            for dim in [1, 3, 7, 8, 9, 31, 32, 33, 100, 1024, 1031] {
                let a: Vec<f32> = (0..dim).map(|_| next()).collect();
                let b: Vec<f32> = (0..dim).map(|_| next()).collect();
                let (l2, dot) = (distance::l2(&a, &b), -distance::dot(&a, &b));
                let tolerance = 1e-5 * dim as f32;
                assert!(
                    ((kernels.l2)(&a, &b) - l2).abs() <= tolerance,
                    "{} l2 {dim}",
                    kernels.name
                );
                assert!(
                    ((kernels.dot)(&a, &b) - dot).abs() <= tolerance,
                    "{} dot {dim}",
                    kernels.name
                );
                let c: Vec<f32> = (0..dim).map(|_| next()).collect();
                let four = [&b[..], &c[..], &a[..], &b[..]];
                let (l2s, dots) = ((kernels.l2_x4)(&a, four), (kernels.dot_x4)(&a, four));
                for (j, v) in four.iter().enumerate() {
                    let (l2, dot) = (distance::l2(&a, v), -distance::dot(&a, v));
                    assert!(
                        (l2s[j] - l2).abs() <= tolerance,
                        "{} l2_x4 {dim}",
                        kernels.name
                    );
                    assert!(
                        (dots[j] - dot).abs() <= tolerance,
                        "{} dot_x4 {dim}",
                        kernels.name
                    );
                }
            }
        }
    }
}
