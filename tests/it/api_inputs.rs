//! Random arguments to the public Rust API never panic: batches of wrong
//! shapes, types and values, shard numbers out of range and odd query
//! vectors, k and ef (a seeded loop). Each call returns a value or an
//! error, and the table keeps working afterwards.

use std::sync::Arc;
use std::time::Duration;

use crate::helpers::scanned_rows;
use datafusion::arrow::array::{
    Array, ArrayRef, FixedSizeListArray, Float32Array, Int32Array, Int64Array, RecordBatch,
    StringArray,
};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use memwal::MemwalSession;
use memwal::VectorQuery;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A random column for `name`: usually of the table's type, sometimes not;
/// with nulls and non-finite values now and then.
fn column(rng: &mut StdRng, name: &str, rows: usize) -> (Field, ArrayRef) {
    let nulls = rng
        .random_bool(0.2)
        .then(|| NullBuffer::from((0..rows).map(|_| rng.random_bool(0.7)).collect::<Vec<_>>()));
    let kind = rng.random_range(0..10);
    match (name, kind) {
        (_, 0) => (
            Field::new(name, DataType::Int32, true),
            Arc::new(Int32Array::new((0..rows as i32).collect(), nulls)),
        ),
        (_, 1) => (
            Field::new(name, DataType::Utf8, true),
            Arc::new(StringArray::from_iter(
                (0..rows).map(|i| (i % 3 != 0).then(|| format!("é{i}"))),
            )),
        ),
        ("id", _) => (
            Field::new(name, DataType::Int64, nulls.is_some()),
            Arc::new(Int64Array::new(
                (0..rows).map(|_| rng.random_range(-5..50)).collect(),
                nulls,
            )),
        ),
        ("emb", _) => {
            let dim = [3, 3, 3, 2, 4, 0][rng.random_range(0..6)];
            let values: Vec<f32> = (0..rows * dim as usize)
                .map(|_| match rng.random_range(0..20) {
                    0 => f32::NAN,
                    1 => f32::INFINITY,
                    _ => rng.random_range(-1.0..1.0),
                })
                .collect();
            let item = Arc::new(Field::new("item", DataType::Float32, true));
            let inner_nulls = rng
                .random_bool(0.1)
                .then(|| NullBuffer::from(vec![true; values.len()]));
            let list = FixedSizeListArray::try_new(
                Arc::clone(&item),
                dim,
                Arc::new(Float32Array::new(values.into(), inner_nulls)),
                nulls,
            )
            .unwrap();
            (
                Field::new(name, DataType::FixedSizeList(item, dim), true),
                Arc::new(list),
            )
        }
        _ => (
            Field::new(name, DataType::Utf8, true),
            Arc::new(StringArray::from_iter(
                (0..rows).map(|i| (i % 4 != 0).then(|| "x".repeat(i))),
            )),
        ),
    }
}

/// A batch of some of `names` (in a random order, maybe with an extra
/// column) with random columns.
fn batch(rng: &mut StdRng, names: &[&str]) -> Option<RecordBatch> {
    let rows = [0, 1, 2, 7, 40][rng.random_range(0..5)];
    let mut names: Vec<&str> = names
        .iter()
        .copied()
        .filter(|_| rng.random_bool(0.9))
        .collect();
    if rng.random_bool(0.1) {
        names.push("extra");
    }
    if rng.random_bool(0.1) {
        names.reverse();
    }
    let (fields, columns): (Vec<Field>, Vec<ArrayRef>) =
        names.iter().map(|n| column(rng, n, rows)).unzip();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_api_arguments_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let session = MemwalSession::open(dir.path().to_str().unwrap())
        .await
        .unwrap();
    session
        .sql(
            "CREATE TABLE t (id BIGINT PRIMARY KEY, name TEXT, emb FLOAT[3]) \
             WITH ('shards' = '3')",
        )
        .await
        .unwrap();
    let table = session.table("t").await.unwrap();
    let emb = table.schema().index_of("emb").unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..400 {
        let outcome: Result<(), memwal::Error> = match rng.random_range(0..7) {
            0 | 1 => match batch(&mut rng, &["id", "name", "emb"]) {
                Some(b) => table.put(&b).await.map(drop),
                None => Ok(()),
            },
            2 => match batch(&mut rng, &["id"]) {
                Some(b) => table.delete(&b).await.map(drop),
                None => Ok(()),
            },
            3 => match batch(&mut rng, &["id"]) {
                Some(b) => table.get(&b).await.map(drop),
                None => Ok(()),
            },
            4 => {
                let shard = [0, 1, 2, 3, 7, u32::MAX][rng.random_range(0..6)];
                table
                    .snapshot(shard, Duration::ZERO)
                    .await
                    .map(drop)
                    .and(table.writer(shard).await.map(drop))
            }
            _ => {
                let dim = [3, 3, 2, 4, 0][rng.random_range(0..5)];
                let mut vector: Vec<f32> = (0..dim).map(|_| rng.random_range(-1.0..1.0)).collect();
                if dim > 0 && rng.random_bool(0.2) {
                    vector[0] = f32::NAN;
                }
                let query = VectorQuery {
                    column: [emb, emb, 0, 99][rng.random_range(0..4)],
                    vector,
                    k: [0, 1, 5, 1000, usize::MAX][rng.random_range(0..5)],
                    ef: [0, 1, 64, usize::MAX][rng.random_range(0..4)],
                    filter: None,
                };
                let shard = rng.random_range(0..3);
                match table.snapshot(shard, Duration::ZERO).await {
                    Ok(snapshot) => snapshot.vector_search(&query).await.map(drop),
                    Err(e) => Err(e),
                }
            }
        };
        match outcome {
            Ok(()) => ok += 1,
            Err(_) => refused += 1,
        }
    }
    assert!(ok > 0 && refused > 0, "{ok} ok, {refused} refused");

    // The table still takes and serves rows.
    let good = session
        .sql("INSERT INTO t VALUES (1000, 'after', [1, 2, 3])")
        .await
        .unwrap()
        .collect()
        .await;
    assert!(good.is_ok(), "{good:?}");
    let key = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)])),
        vec![Arc::new(Int64Array::from(vec![1000]))],
    )
    .unwrap();
    let row = table.get(&key).await.unwrap().expect("the row just put");
    assert_eq!(row.num_rows(), 1);
    assert!(row.column(0).is_valid(0));
    session.close().await.unwrap();
}

/// A refused vector is named by its row in the whole write, counted from 1
/// across the batches of `put_all` and of a stream.
#[tokio::test]
async fn a_refused_vector_names_its_row_in_the_whole_write() {
    let dir = tempfile::tempdir().unwrap();
    let session = MemwalSession::open(dir.path().to_str().unwrap())
        .await
        .unwrap();
    session
        .sql("CREATE TABLE t (id BIGINT PRIMARY KEY, emb FLOAT[3])")
        .await
        .unwrap();
    let table = session.table("t").await.unwrap();
    let schema = table.schema();
    // Three batches of two rows; the fifth row's vector holds NaN.
    let batches: Vec<RecordBatch> = (0..3)
        .map(|b| {
            let values: Vec<f32> = (0..6)
                .map(|i| if b == 2 && i == 1 { f32::NAN } else { 1.0 })
                .collect();
            let emb = FixedSizeListArray::try_new(
                Arc::new(Field::new("item", DataType::Float32, true)),
                3,
                Arc::new(Float32Array::from(values)),
                None,
            )
            .unwrap();
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(Int64Array::from(vec![2 * b, 2 * b + 1])),
                    Arc::new(emb),
                ],
            )
            .unwrap()
        })
        .collect();
    let err = table.put_all(&batches).await.unwrap_err().to_string();
    assert!(err.contains("non-finite value (NaN) in row 5"), "{err}");
    let stream = futures::stream::iter(batches.into_iter().map(Ok));
    let err = table.put_stream(stream).await.unwrap_err().to_string();
    assert!(err.contains("non-finite value (NaN) in row 5"), "{err}");
    assert_eq!(scanned_rows(&table).await, 0, "nothing was written");
    session.close().await.unwrap();
}
