//! What a table is, shared by every layer above the store (DESIGN.md §9):
//! its definition as the catalog keeps it ([`TableMeta`]), the stored form
//! of its rows and the checks on input ([`TableSchema`]), the canonical key
//! encoding and the shard a key routes to ([`key`]), and the vector metric
//! and graph parameters ([`Metric`], [`HnswParams`]).
//!
//! This module imports nothing of memwal but errors, so the write path, the
//! read path and the catalog can all depend on it without depending on each
//! other.

pub mod key;
mod meta;
mod metric;
mod stored;

pub(crate) use meta::parse_bool;
pub use meta::{ColumnOptions, TableMeta, VectorOptions};
pub use metric::{HnswParams, Metric, vector_fault};
#[cfg(test)]
pub use stored::stored_schema;
pub use stored::{
    BlobColumn, KeyedBatch, TableSchema, VectorColumn, blob_descriptor_fields, compact_views,
    held_bytes, owned_row,
};
