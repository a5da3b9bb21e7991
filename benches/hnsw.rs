//! Criterion benchmarks of the HNSW pieces, on the reference data
//! (`memwal::testing::dataset`, clustered, 1024-d):
//! - `kernel/*`: one 1024-d distance with the dispatched SIMD kernel, the
//!   portable loop and the reference (plain iterator) distance;
//! - `graph/insert_1000`: 1,000 vectors added to a graph of 10,000 (one
//!   thread), the unit a MemTable indexes per put;
//! - `graph/search_ef*`: one query on 20,000 vectors, k = 10.
//!
//! Run with `cargo bench --bench hnsw`; `bash benches/run_peers.sh --only hnsw`
//! compares whole builds and searches with hnswlib, faiss and usearch.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use memwal::testing::dataset::{Shape, to_array, vectors};
use memwal::testing::{Graph, distance, kernel};
use memwal::{HnswParams, Metric};

const DIM: usize = 1024;
const SHAPE: Shape = Shape::Clustered {
    clusters: 100,
    spread: 0.5,
};

fn graph_of(data: &[f32]) -> Graph {
    let graph = Graph::new(DIM, Metric::L2, HnswParams::default(), 42);
    for (i, part) in data.chunks(1_000 * DIM).enumerate() {
        graph.add(&to_array(part, DIM), (i * 1_000) as u64, 2);
    }
    graph
}

fn kernels(c: &mut Criterion) {
    let v = vectors(SHAPE, 5, DIM, 1, 0);
    let (a, b) = (&v[..DIM], &v[DIM..2 * DIM]);
    let four: [&[f32]; 4] = std::array::from_fn(|j| &v[(j + 1) * DIM..(j + 2) * DIM]);
    let mut group = c.benchmark_group("kernel");
    let simd = kernel::kernels();
    group.bench_function(format!("l2_1024_{}", simd.name), |bench| {
        bench.iter(|| (simd.l2)(black_box(a), black_box(b)))
    });
    group.bench_function(format!("l2_1024_x4_{}", simd.name), |bench| {
        bench.iter(|| (simd.l2_x4)(black_box(a), black_box(four)))
    });
    let portable = kernel::portable();
    group.bench_function("l2_1024_portable", |bench| {
        bench.iter(|| (portable.l2)(black_box(a), black_box(b)))
    });
    group.bench_function("l2_1024_reference", |bench| {
        bench.iter(|| distance::l2(black_box(a), black_box(b)))
    });
    group.bench_function(format!("dot_1024_{}", simd.name), |bench| {
        bench.iter(|| (simd.dot)(black_box(a), black_box(b)))
    });
    group.finish();
}

fn graph(c: &mut Criterion) {
    let data = vectors(SHAPE, 20_000, DIM, 42, 0);
    let queries = vectors(SHAPE, 100, DIM, 42, 1);
    let mut group = c.benchmark_group("graph");
    group.sample_size(10);
    let base = &data[..10_000 * DIM];
    let more = to_array(&data[10_000 * DIM..11_000 * DIM], DIM);
    group.bench_function("insert_1000", |bench| {
        bench.iter_batched(
            || graph_of(base),
            |graph| graph.add(&more, 10_000, 1),
            BatchSize::PerIteration,
        )
    });
    let graph = graph_of(&data);
    for ef in [16, 64] {
        let mut i = 0;
        group.bench_function(format!("search_ef{ef}"), |bench| {
            bench.iter(|| {
                i = (i + 1) % 100;
                graph.search(&queries[i * DIM..][..DIM], 10, ef, &|_| true)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, kernels, graph);
criterion_main!(benches);
