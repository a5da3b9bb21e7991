//! HNSW over MemTable vectors (DESIGN.md §8) — being built (issue 5).
//! So far: [`dataset`], the deterministic vector data and exact ground
//! truth that the graph's tests and benchmarks measure recall against, and
//! [`distance`], the exact distances that ground truth uses.

pub mod dataset;
pub mod distance;
