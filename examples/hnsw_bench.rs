//! Builds memwal's HNSW graph over deterministic vectors (`--shape`,
//! `--n` × `--dim`, see `memwal::testing::dataset`) and searches it with
//! `--queries` queries at each `--ef`, against exact ground truth, in
//! passes until they took `--min-cpu-seconds` of CPU. Prints one JSON
//! object: build vectors per CPU-second (and per wall second), and per ef
//! the queries per CPU-second and recall@k (CPU time from the kernel's
//! per-process clock, in nanoseconds); then the size of
//! the graph's persisted form, the time to encode it and to load it back
//! over the same vectors, and the loaded graph's recall at ef = 64.
//!
//! `--write DIR` also writes the data, the queries and the ground truth
//! as raw little-endian files (`data.f32`, `queries.f32`, `truth.u32`) so
//! `benches/peers/hnsw_peers.py` measures hnswlib and faiss on the same
//! vectors.
//!
//! ```text
//! cargo run --example hnsw_bench -- --shape clustered --n 20000 --dim 1024
//! ```

use std::time::Instant;

use clap::{Parser, ValueEnum};
use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::Float32Type;
use memwal::testing::dataset::{Shape, exact_neighbours, recall, to_array, vectors};
use memwal::testing::{Graph, distance, kernel};
use memwal::{HnswParams, Metric};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ShapeArg {
    Clustered,
    LowRank,
    Gaussian,
}

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, value_enum, default_value = "clustered")]
    shape: ShapeArg,
    #[arg(long, default_value_t = 20_000)]
    n: usize,
    #[arg(long, default_value_t = 1024)]
    dim: usize,
    #[arg(long, default_value_t = 1_000)]
    queries: usize,
    #[arg(long, default_value_t = 10)]
    k: usize,
    #[arg(long, default_value_t = 16)]
    m: usize,
    #[arg(long, default_value_t = 100)]
    ef_construction: usize,
    #[arg(long, value_delimiter = ',', default_value = "16,32,64,128")]
    ef: Vec<usize>,
    /// Insertion threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Each ef's searches repeat until they took this much CPU time.
    #[arg(long, default_value_t = 1.0)]
    min_cpu_seconds: f64,
    /// Write data, queries and ground truth here for the peer script.
    #[arg(long)]
    write: Option<std::path::PathBuf>,
}

/// The data shapes the benchmarks and tests share (PEERS.md: 100 clusters).
fn shape(arg: ShapeArg) -> Shape {
    match arg {
        ShapeArg::Clustered => Shape::Clustered {
            clusters: 100,
            spread: 0.5,
        },
        ShapeArg::LowRank => Shape::LowRank { rank: 32 },
        ShapeArg::Gaussian => Shape::Gaussian,
    }
}

/// CPU seconds this process has used (user + system).
fn cpu_seconds() -> f64 {
    memwal::testing::process_cpu_time().as_secs_f64()
}

fn write_raw(path: &std::path::Path, bytes: impl Iterator<Item = [u8; 4]>) {
    let data: Vec<u8> = bytes.flatten().collect();
    std::fs::write(path, data).expect("write bench data");
}

fn main() {
    let args = Args::parse();
    let dim = args.dim;
    let shape = shape(args.shape);
    let data = vectors(shape, args.n, dim, args.seed, 0);
    let queries = vectors(shape, args.queries, dim, args.seed, 1);
    let truth = exact_neighbours(&data, &queries, dim, args.k, distance::l2);
    if let Some(dir) = &args.write {
        std::fs::create_dir_all(dir).expect("create bench data directory");
        write_raw(&dir.join("data.f32"), data.iter().map(|x| x.to_le_bytes()));
        write_raw(
            &dir.join("queries.f32"),
            queries.iter().map(|x| x.to_le_bytes()),
        );
        write_raw(
            &dir.join("truth.u32"),
            truth.iter().flatten().map(|x| x.to_le_bytes()),
        );
    }

    let array = to_array(&data, dim);
    let params = HnswParams {
        m: args.m,
        ef_construction: args.ef_construction,
    };
    let graph = Graph::new(dim, Metric::L2, params, args.seed);
    let (cpu, wall) = (cpu_seconds(), Instant::now());
    // In 1,000-row appends, as a MemTable receives them.
    for start in (0..args.n).step_by(1_000) {
        let len = 1_000.min(args.n - start);
        graph.add(&array.slice(start, len), start as u64, args.threads);
    }
    let build_cpu = cpu_seconds() - cpu;
    let build_wall = wall.elapsed().as_secs_f64();

    // Each ef's queries run in passes until the passes took at least
    // `--min-cpu-seconds` of CPU, so the rate does not hang on a few
    // milliseconds; recall is the first pass's.
    let mut searches = Vec::new();
    for &ef in &args.ef {
        let search_all = || -> Vec<Vec<u32>> {
            queries
                .chunks_exact(dim)
                .map(|q| {
                    graph
                        .search(q, args.k, ef, &|_| true)
                        .iter()
                        .map(|h| h.row as u32)
                        .collect()
                })
                .collect()
        };
        let (cpu, wall) = (cpu_seconds(), Instant::now());
        let found = search_all();
        let mut passes = 1;
        while cpu_seconds() - cpu < args.min_cpu_seconds {
            std::hint::black_box(search_all());
            passes += 1;
        }
        let (cpu, wall) = (cpu_seconds() - cpu, wall.elapsed().as_secs_f64());
        let searched = (args.queries * passes) as f64;
        searches.push(serde_json::json!({
            "ef": ef,
            "recall": recall(&found, &truth),
            "passes": passes,
            "queries_per_cpu_s": searched / cpu,
            "queries_per_s": searched / wall,
        }));
    }
    // The persisted form a flush writes next to an SSTable, and loading it
    // back over the same vectors (what a reader does instead of a rebuild).
    let wall = Instant::now();
    let bytes = graph.encode(&Some);
    let encode_ms = wall.elapsed().as_secs_f64() * 1e3;
    let wall = Instant::now();
    let values = array
        .values()
        .as_primitive::<Float32Type>()
        .values()
        .clone();
    let loaded = Graph::decode(&bytes, values).expect("a graph just encoded decodes");
    let decode_ms = wall.elapsed().as_secs_f64() * 1e3;
    let found: Vec<Vec<u32>> = queries
        .chunks_exact(dim)
        .map(|q| {
            loaded
                .search(q, args.k, 64, &|_| true)
                .iter()
                .map(|h| h.row as u32)
                .collect()
        })
        .collect();
    let persisted = serde_json::json!({
        "bytes": bytes.len(),
        "encode_ms": encode_ms,
        "decode_ms": decode_ms,
        "recall_at_ef_64": recall(&found, &truth),
    });
    let out = serde_json::json!({
        "engine": "memwal",
        "debug_assertions": cfg!(debug_assertions),
        "kernel": kernel::kernels().name,
        "shape": format!("{:?}", args.shape),
        "n": args.n,
        "dim": dim,
        "m": args.m,
        "ef_construction": args.ef_construction,
        "threads": args.threads,
        "build_cpu_s": build_cpu,
        "build_vectors_per_cpu_s": args.n as f64 / build_cpu,
        "build_vectors_per_s": args.n as f64 / build_wall,
        "search": searches,
        "persisted": persisted,
    });
    println!("{out}");
}
