//! The Rust API in one page: open a root, create a table, put Arrow
//! batches, read a key, delete it, and query with SQL.
//!
//! ```text
//! cargo run --example rust_api [ROOT]     (default: a fresh temporary directory)
//! ```

use std::sync::Arc;

use datafusion::arrow::array::{Int64Array, RecordBatch, StringViewArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::util::pretty::print_batches;
use memwal::MemwalSession;

#[tokio::main]
async fn main() -> memwal::Result<()> {
    let scratch = tempfile::tempdir()?;
    let root = std::env::args()
        .nth(1)
        .unwrap_or_else(|| scratch.path().to_str().unwrap().to_string());
    let session = MemwalSession::open(&root).await?;
    session
        .sql("CREATE TABLE IF NOT EXISTS kv (id BIGINT PRIMARY KEY, v VARCHAR)")
        .await?;
    let kv = session.table("kv").await?;
    let schema = kv.schema();

    // A put returns once its rows are durable in the WAL.
    let rows = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(Int64Array::from(vec![1, 2, 3])),
            Arc::new(StringViewArray::from(vec!["one", "two", "three"])),
        ],
    )
    .map_err(memwal::Error::from)?;
    kv.put(&rows).await?;

    let key_schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    let key = |id: i64| {
        RecordBatch::try_new(
            Arc::clone(&key_schema),
            vec![Arc::new(Int64Array::from(vec![id]))],
        )
    };
    println!("get(2):");
    print_batches(&kv.get(&key(2)?).await?.into_iter().collect::<Vec<_>>())?;

    kv.delete(&key(2)?).await?;
    println!("after delete(2), get(2) is {:?}", kv.get(&key(2)?).await?);

    println!("SQL sees the same rows:");
    let all = session
        .sql("SELECT * FROM kv ORDER BY id")
        .await?
        .collect()
        .await?;
    print_batches(&all)?;
    session.close().await
}
