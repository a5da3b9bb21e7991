//! Integration tests, compiled as one binary.

mod catalog_faults;
mod catalog_processes;
mod crash;
mod damaged_catalog;
mod hnsw;
mod lsm;
mod s3;
mod session_files;
mod sessions;
mod shell;
mod writer;
