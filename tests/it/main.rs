//! Integration tests, compiled as one binary.

mod api_inputs;
mod atomic;
mod blob;
mod bulk;
mod catalog_faults;
mod catalog_log;
mod catalog_processes;
mod crash;
mod damage;
mod damaged_catalog;
mod distributed;
mod explain;
mod gc;
mod helpers;
mod hnsw;
mod lsm;
mod names;
mod s3;
mod session_files;
mod sessions;
mod shell;
mod vector_search;
mod writer;
mod writers;
