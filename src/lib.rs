//! memwal: tables for Apache DataFusion that take a high rate of small
//! writes and answer SQL over fresh data, on any object store.
//!
//! Start with [`MemwalSession::open`] for SQL, or [`Table`] (through
//! [`MemwalSession::table`]) for the Rust API; see `DESIGN.md` for the
//! architecture.
//!
//! Modules, top down; a module imports only from modules below it:
//!
//! | layer | modules |
//! |---|---|
//! | SQL | [`sql`] (DataFusion adapters, session) |
//! | Rust API | [`table`] (routing, snapshots: where write and read meet) |
//! | paths | [`read`], [`writer`], [`catalog`] |
//! | layers | [`wal`], [`memtable`], [`sstable`] |
//! | vectors | [`hnsw`] |
//! | rows | [`schema`] (table definition, stored rows, keys, metric) |
//! | storage | [`store`] (object names in `store::paths`), [`error`] |

pub mod catalog;
pub mod error;
pub mod hnsw;
pub mod memtable;
pub mod read;
pub mod schema;
pub mod sql;
pub mod sstable;
pub mod store;
pub mod table;
pub mod wal;
pub mod writer;

pub use catalog::{Catalog, CatalogOptions, ObjectPath};
pub use error::{Error, Result};
pub use schema::TableMeta;
pub use sql::{MemwalSession, SessionBuilder};
pub use store::ObjectRoot;
pub use table::{Table, TableCache};
pub use writer::{ShardWriter, WriterOptions, WriterStats};
