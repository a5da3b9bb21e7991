//! DataFusion adapters: the catalog as a `CatalogProvider`, tables as
//! `TableProvider`s (scan, INSERT sink, DELETE), DDL with memwal's options,
//! `SHOW CREATE TABLE`/`DESCRIBE`, vector search (`vector_search` and the
//! distance functions), writer statistics (`memwal_stats`), the file policy, and the session that ties them
//! together.

mod blob_size;
mod catalog_provider;
mod config;
mod ddl;
mod delete_alias;
mod delete_exec;
mod describe;
#[cfg(feature = "distributed")]
pub mod distributed;
mod files;
mod function_args;
mod insert_checks;
mod insert_sink;
mod key_filters;
mod prepared_delete;
mod scan_exec;
mod session;
mod statement;
mod stats;
mod streams;
mod table;
mod vector;
mod vector_search_exec;

pub use catalog_provider::{MemwalCatalogProvider, NamespaceSchemaProvider};
pub use config::MemwalConfig;
pub use delete_exec::DeleteExec;
pub use insert_sink::{InsertProgress, InsertSink};
pub use scan_exec::{ScanExec, ScanMode};
pub(crate) use session::table_path;
pub use session::{MemwalSession, SessionBuilder};
pub(crate) use streams::properties as plan_properties;
pub use table::MemwalTable;
pub use vector::{DEFAULT_EF, DISTANCE_COLUMN, MAX_K, VectorSearchFunction, distance_functions};
pub use vector_search_exec::VectorSearchExec;

use crate::catalog::ObjectPath;
use crate::error::Result;

/// The name under which the memwal catalog is registered with DataFusion.
pub const CATALOG_NAME: &str = "memwal";

/// The SQL schema that stands for the root namespace.
pub const ROOT_SCHEMA: &str = "public";

/// The namespace a SQL schema name denotes: `public` is the root, otherwise
/// levels are separated by dots (`"shop.eu"`).
pub fn schema_to_namespace(schema: &str) -> Result<ObjectPath> {
    if schema == ROOT_SCHEMA {
        Ok(ObjectPath::root())
    } else {
        ObjectPath::parse_dotted(schema)
    }
}

/// The SQL schema name of a namespace (inverse of [`schema_to_namespace`]).
pub fn namespace_to_schema(path: &ObjectPath) -> String {
    if path.is_root() {
        ROOT_SCHEMA.to_string()
    } else {
        path.to_string()
    }
}
