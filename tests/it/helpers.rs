//! Helpers the integration tests share.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use memwal::{Catalog, CatalogOptions, MemwalSession, ObjectRoot};

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

/// A copy of `tests/fixtures/<name>` in a fresh directory.
pub fn fixture_root(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    for file in files(&fixture) {
        let to = dir.path().join(file.strip_prefix(&fixture).unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&file, &to).unwrap();
    }
    dir
}

/// The catalog of the root at `dir`, with default options.
pub async fn open_catalog(dir: &Path) -> Arc<Catalog> {
    Catalog::open(
        ObjectRoot::open(dir.to_str().unwrap()).unwrap(),
        CatalogOptions::default(),
    )
    .await
    .unwrap()
}

/// Polls `op` until `until` is done, then leaves it unpolled: a statement
/// held paused mid-way. Panics if `op` ends first (`before`: what it was
/// to get to).
pub async fn pause_at<F>(
    op: &mut std::pin::Pin<&mut F>,
    until: impl Future<Output = ()>,
    before: &str,
) where
    F: Future<Output: std::fmt::Debug>,
{
    tokio::select! {
        done = op.as_mut() => panic!("it ended before {before}: {done:?}"),
        () = until => {}
    }
}
