//! memwal: tables for Apache DataFusion that take a high rate of small
//! writes and answer SQL over fresh data, on any object store.
//!
//! Start with [`MemwalSession::open`]; see `DESIGN.md` for the architecture.

pub mod catalog;
pub mod error;
pub mod sql;
pub mod store;
pub mod wal;

pub use catalog::{Catalog, CatalogOptions, ObjectPath, TableMeta};
pub use error::{Error, Result};
pub use sql::MemwalSession;
pub use store::ObjectRoot;
