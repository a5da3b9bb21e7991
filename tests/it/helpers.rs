//! Helpers the integration tests share.

use std::path::{Path, PathBuf};

use datafusion::arrow::array::RecordBatch;
use memwal::MemwalSession;

/// Every file under `dir`, sorted.
pub fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// Runs one statement to the end; its batches.
pub async fn run(session: &MemwalSession, sql: &str) -> Vec<RecordBatch> {
    session.sql(sql).await.unwrap().collect().await.unwrap()
}

/// The rows a scan of `table` returns.
pub async fn scanned_rows(table: &memwal::Table) -> usize {
    let batches = table.scan().await.unwrap();
    batches.iter().map(|b| b.num_rows()).sum()
}

/// The ids of a catalog's entries in its snapshot, in order.
pub fn catalog_ids(catalog: &memwal::Catalog) -> Vec<String> {
    catalog
        .snapshot()
        .iter()
        .map(|e| e.object_id.clone())
        .collect()
}
