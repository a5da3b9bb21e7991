//! The catalog as DataFusion sees it: namespaces are schemas (`public` is
//! the root, nested levels are dotted: `"shop.eu"`), tables are tables.
//! Names are answered from the catalog's snapshot; a table lookup that
//! misses refreshes it first, so objects made by other processes appear.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::{CatalogProvider, SchemaProvider};
use datafusion::datasource::TableProvider;
use datafusion::error::{DataFusionError, Result};

use super::table::MemwalTable;
use super::{ROOT_SCHEMA, namespace_to_schema, schema_to_namespace};
use crate::catalog::{Catalog, ObjectPath, ObjectType};
use crate::table::TableCache;

const DDL_HINT: &str = "memwal namespaces and tables are created and dropped with DDL run \
                        through memwal's own session (MemwalSession::sql in Rust, Root.sql \
                        in Python, the memwal shell)";

/// The memwal catalog as a DataFusion `CatalogProvider`.
#[derive(Debug)]
pub struct MemwalCatalogProvider {
    catalog: Arc<Catalog>,
    tables: Arc<TableCache>,
}

impl MemwalCatalogProvider {
    /// The provider over `catalog`, whose tables are opened in `tables`.
    pub fn new(catalog: Arc<Catalog>, tables: Arc<TableCache>) -> Self {
        Self { catalog, tables }
    }
}

impl CatalogProvider for MemwalCatalogProvider {
    fn schema_names(&self) -> Vec<String> {
        let snapshot = self.catalog.snapshot();
        std::iter::once(ROOT_SCHEMA.to_string())
            .chain(
                snapshot
                    .iter()
                    .filter(|e| e.object_type == ObjectType::Namespace)
                    .map(|e| namespace_to_schema(&e.path())),
            )
            .collect()
    }

    /// Any valid namespace name gets a provider, even one the snapshot does
    /// not know yet: its table lookups refresh the snapshot (this call cannot,
    /// being synchronous).
    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        let path = schema_to_namespace(name).ok()?;
        Some(Arc::new(NamespaceSchemaProvider {
            catalog: Arc::clone(&self.catalog),
            tables: Arc::clone(&self.tables),
            path,
        }))
    }

    fn register_schema(
        &self,
        _name: &str,
        _schema: Arc<dyn SchemaProvider>,
    ) -> Result<Option<Arc<dyn SchemaProvider>>> {
        Err(DataFusionError::NotImplemented(DDL_HINT.into()))
    }

    fn deregister_schema(
        &self,
        _name: &str,
        _cascade: bool,
    ) -> Result<Option<Arc<dyn SchemaProvider>>> {
        Err(DataFusionError::NotImplemented(DDL_HINT.into()))
    }
}

/// One namespace as a DataFusion `SchemaProvider`.
#[derive(Debug)]
pub struct NamespaceSchemaProvider {
    catalog: Arc<Catalog>,
    tables: Arc<TableCache>,
    path: ObjectPath,
}

#[async_trait]
impl SchemaProvider for NamespaceSchemaProvider {
    fn table_names(&self) -> Vec<String> {
        self.catalog
            .list(&self.path)
            .iter()
            .filter(|e| e.object_type == ObjectType::Table)
            .map(|e| e.path().name().to_string())
            .collect()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        let Ok(path) = self.path.child(name) else {
            return Ok(None);
        };
        let Some((entry, meta)) = self.catalog.table(&path).await? else {
            return Ok(None);
        };
        let Some(location) = &entry.location else {
            return Err(DataFusionError::Internal(format!(
                "catalog entry of table {path} has no location"
            )));
        };
        let table = self.tables.get_or_open(
            self.catalog.root().store(),
            location,
            &meta,
            Some(&self.catalog),
        );
        Ok(Some(Arc::new(MemwalTable::new(path, meta, table))))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.path.child(name).is_ok_and(|path| {
            self.catalog
                .snapshot()
                .get(&path)
                .is_some_and(|e| e.object_type == ObjectType::Table)
        })
    }

    fn register_table(
        &self,
        _name: String,
        _table: Arc<dyn TableProvider>,
    ) -> Result<Option<Arc<dyn TableProvider>>> {
        Err(DataFusionError::NotImplemented(DDL_HINT.into()))
    }

    fn deregister_table(&self, _name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        Err(DataFusionError::NotImplemented(DDL_HINT.into()))
    }
}
