//! [`MemwalTable`]: a memwal table as a DataFusion `TableProvider`.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::common::{Constraint, Constraints, project_schema};
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::Result;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::empty::EmptyExec;

use crate::catalog::{ObjectPath, TableMeta};

/// A table of the catalog. Its schema and primary key come from the catalog
/// entry; until the write path lands it holds no rows, so a scan is empty.
#[derive(Debug)]
pub struct MemwalTable {
    path: ObjectPath,
    meta: TableMeta,
    schema: SchemaRef,
    constraints: Constraints,
}

impl MemwalTable {
    /// The provider for the table at `path` with metadata `meta`.
    pub fn new(path: ObjectPath, meta: TableMeta) -> Self {
        let schema = meta.schema_ref();
        let key = meta.primary_key_indices();
        let constraints = if key.is_empty() {
            Constraints::default()
        } else {
            Constraints::new_unverified(vec![Constraint::PrimaryKey(key)])
        };
        Self {
            path,
            meta,
            schema,
            constraints,
        }
    }

    /// The table's path in the catalog.
    pub fn path(&self) -> &ObjectPath {
        &self.path
    }

    /// The table's catalog metadata.
    pub fn meta(&self) -> &TableMeta {
        &self.meta
    }
}

#[async_trait]
impl TableProvider for MemwalTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn constraints(&self) -> Option<&Constraints> {
        Some(&self.constraints)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let schema = project_schema(&self.schema, projection)?;
        Ok(Arc::new(EmptyExec::new(schema)))
    }
}
