//! Integration tests, compiled as one binary.

mod catalog_faults;
mod catalog_processes;
mod crash;
mod hnsw;
mod lsm;
mod s3;
mod sessions;
mod shell;
mod vector_search;
mod writer;
