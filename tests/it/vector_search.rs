//! `vector_search` returns `min(k, matching live rows)` rows whatever the
//! graphs: over a grid of HNSW parameters (the accepted ones, and the
//! broken ones older builds accepted), metrics, `ef` and `k`, with rows in
//! a MemTable and in flushed SSTables (one over 256 rows, searched through
//! its graph decoded from disk, one under), upserts, deletes, rows without
//! a vector and filters. Every answer is checked against exact search over
//! a model of the table: the count, that each row is the newest live
//! version with its exact distance, nearest first, and the very rows
//! exact search gives when `k` covers every matching row or when `ef`
//! covers every row (the search is then exact).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{
    Array, AsArray, FixedSizeListArray, Float32Array, Int64Array, RecordBatch,
};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::{DataType, Field, Float32Type, Int64Type, Schema};
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{binary, col, lit};
use memwal::testing::ShardWriter;
use memwal::testing::TableSchema;
use memwal::testing::dataset::{Shape, vectors};
use memwal::{HnswParams, Metric};
use memwal::{ShardSnapshot, VectorQuery};
use memwal::{TableMeta, WriterOptions};
use object_store::ObjectStore;

const DIM: usize = 8;
const LOCATION: &str = "tables/search-0000000000000001";
/// A candidate list longer than any layer of the test: an exact search.
const EXHAUSTIVE_EF: usize = 5_000;

/// The table as the test believes it is: per key, its group and vector
/// (`None`: the row has no vector).
type Model = BTreeMap<i64, (i64, Option<Vec<f32>>)>;

fn schema() -> Schema {
    let item = Arc::new(Field::new("item", DataType::Float32, true));
    Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("grp", DataType::Int64, false),
        Field::new("emb", DataType::FixedSizeList(item, DIM as i32), true),
    ])
}

/// Rows `ids` with vectors drawn from `stream`; every `no_vector`-th row
/// has none. Recorded in `model`.
fn rows(
    table: &TableSchema,
    model: &mut Model,
    ids: &[i64],
    stream: u64,
    no_vector: i64,
) -> RecordBatch {
    let shape = Shape::Clustered {
        clusters: 10,
        spread: 0.4,
    };
    let values = vectors(shape, ids.len(), DIM, 3, stream);
    let present: Vec<bool> = ids.iter().map(|id| id % no_vector != 0).collect();
    for (i, &id) in ids.iter().enumerate() {
        let vector = present[i].then(|| values[i * DIM..][..DIM].to_vec());
        model.insert(id, (id % 5, vector));
    }
    let emb = FixedSizeListArray::new(
        Arc::new(Field::new("item", DataType::Float32, true)),
        DIM as i32,
        Arc::new(Float32Array::from(values)),
        Some(NullBuffer::from(present)),
    );
    RecordBatch::try_new(
        Arc::clone(&table.schema),
        vec![
            Arc::new(Int64Array::from(ids.to_vec())),
            Arc::new(Int64Array::from_iter_values(ids.iter().map(|id| id % 5))),
            Arc::new(emb),
        ],
    )
    .unwrap()
}

fn keys(table: &TableSchema, model: &mut Model, ids: &[i64]) -> RecordBatch {
    for id in ids {
        model.remove(id);
    }
    RecordBatch::try_new(
        Arc::new(table.schema.project(&[0]).unwrap()),
        vec![Arc::new(Int64Array::from(ids.to_vec()))],
    )
    .unwrap()
}

/// A filter on the table's columns and the same question of the model.
struct Filter {
    expr: Option<Arc<dyn PhysicalExpr>>,
    admits: fn(i64, i64) -> bool,
}

fn filters(schema: &Schema) -> Vec<Filter> {
    let compare = |column: &str, op, value: i64| {
        Some(binary(col(column, schema).unwrap(), op, lit(value), schema).unwrap())
    };
    vec![
        Filter {
            expr: None,
            admits: |_, _| true,
        },
        // A fifth of the rows.
        Filter {
            expr: compare("grp", Operator::Eq, 0),
            admits: |_, grp| grp == 0,
        },
        // Most of them.
        Filter {
            expr: compare("grp", Operator::NotEq, 3),
            admits: |_, grp| grp != 3,
        },
        // A few dozen, mostly deleted or moved by newer layers.
        Filter {
            expr: compare("id", Operator::Lt, 40),
            admits: |id, _| id < 40,
        },
        // None.
        Filter {
            expr: compare("grp", Operator::Gt, 100),
            admits: |_, _| false,
        },
    ]
}

/// Writes the layers, newest last: an SSTable of 700 rows (flushed, over
/// 256 rows: searched through its graph), one of 150 rows and 67 deletes
/// (under 256: searched exactly), then a MemTable of 600 upserts, new rows
/// and deletes (through its graph). The writer returned was opened after
/// both flushes, so the SSTables' graphs are decoded from their files.
async fn build(
    store: &Arc<dyn ObjectStore>,
    table: &Arc<TableSchema>,
    model: &mut Model,
) -> ShardWriter {
    let options = {
        let mut o = WriterOptions::default();
        o.wal_flush_interval = Duration::ZERO;
        o.sstable_grace = Duration::ZERO;
        // One indexing thread: the same graphs every run, so that a test
        // can rely on what a degenerate graph does not reach.
        o.index_threads = 1;
        o
    };
    let open = || {
        ShardWriter::open(
            Arc::clone(store),
            LOCATION,
            0,
            Arc::clone(table),
            options.clone(),
        )
    };
    let writer = open().await.unwrap();
    let ids: Vec<i64> = (0..700).collect();
    writer
        .put(&[rows(table, model, &ids[..400], 0, 50)])
        .await
        .unwrap();
    writer
        .put(&[rows(table, model, &ids[400..], 1, 50)])
        .await
        .unwrap();
    writer.close().await.unwrap();

    let writer = open().await.unwrap();
    expect_layers(&writer, &[700]);
    let ids: Vec<i64> = (600..750).collect();
    writer
        .put(&[rows(table, model, &ids, 2, 37)])
        .await
        .unwrap();
    let gone: Vec<i64> = (0..700).step_by(9).collect();
    writer.delete(&keys(table, model, &gone)).await.unwrap();
    writer.close().await.unwrap();

    let writer = open().await.unwrap();
    expect_layers(&writer, &[700, 150 + 67]);
    let ids: Vec<i64> = (300..900).collect();
    writer
        .put(&[rows(table, model, &ids[..300], 4, 41)])
        .await
        .unwrap();
    let gone: Vec<i64> = (0..900).step_by(13).collect();
    writer.delete(&keys(table, model, &gone)).await.unwrap();
    writer
        .put(&[rows(table, model, &ids[300..], 5, 41)])
        .await
        .unwrap();
    writer
}

/// Asserts that `writer`, just opened, has SSTables of `rows` rows (oldest
/// first; tombstones count) and replayed nothing into its MemTable: the
/// layers the searches below rely on.
fn expect_layers(writer: &ShardWriter, rows: &[u64]) {
    let snapshot = writer.snapshot();
    let files: Vec<_> = snapshot
        .sstables
        .iter()
        .map(|f| (f.rows, f.deletions.as_ref().map(|d| d.rows)))
        .collect();
    assert_eq!(
        files.iter().map(|f| f.0).collect::<Vec<_>>(),
        rows,
        "SSTables (rows, rows marked deleted): {files:?}; {:?}",
        writer.stats()
    );
    assert_eq!(snapshot.stored_rows(), rows.iter().sum::<u64>());
}

/// Checks one search against the model; `label` names it in failures.
async fn check(
    snapshot: &ShardSnapshot,
    model: &Model,
    metric: Metric,
    query: VectorQuery,
    admits: fn(i64, i64) -> bool,
    label: &str,
) {
    // Exact search over the model, nearest first.
    let mut exact: Vec<(f32, i64)> = model
        .iter()
        .filter(|(id, (grp, _))| admits(**id, *grp))
        .filter_map(|(id, (_, v))| {
            Some((
                metric.reported(metric.distance(&query.vector, v.as_ref()?)),
                *id,
            ))
        })
        .collect();
    exact.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (k, ef) = (query.k, query.ef);
    let hits = snapshot.vector_search(&query).await.unwrap();
    assert_eq!(
        hits.len(),
        k.min(exact.len()),
        "{label}: k = {k}, ef = {ef}, {} matching live rows",
        exact.len()
    );
    let close = |a: f32, b: f32| (a - b).abs() <= 1e-4 * a.abs().max(b.abs()).max(1.0);
    let mut ids = Vec::new();
    for (i, hit) in hits.iter().enumerate() {
        let id = hit.row.column(0).as_primitive::<Int64Type>().value(0);
        let grp = hit.row.column(1).as_primitive::<Int64Type>().value(0);
        let emb = hit.row.column(2).as_fixed_size_list();
        let (model_grp, model_vector) = model
            .get(&id)
            .unwrap_or_else(|| panic!("{label}: row {id} is deleted"));
        let vector = model_vector
            .as_ref()
            .unwrap_or_else(|| panic!("{label}: row {id} has no vector now"));
        assert_eq!(grp, *model_grp, "{label}: row {id} is an old version");
        assert!(!emb.is_null(0), "{label}: row {id}");
        let stored = emb.value(0);
        assert_eq!(
            stored.as_primitive::<Float32Type>().values()[..],
            vector[..],
            "{label}: row {id} is an old version"
        );
        assert!(
            admits(id, grp),
            "{label}: row {id} does not match the filter"
        );
        let distance = metric.reported(metric.distance(&query.vector, vector));
        assert!(
            close(hit.distance, distance),
            "{label}: row {id} at {} but exactly {distance}",
            hit.distance
        );
        if i > 0 {
            assert!(
                hits[i - 1].distance <= hit.distance,
                "{label}: not nearest first"
            );
        }
        ids.push(id);
    }
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), hits.len(), "{label}: a row twice");
    if k >= exact.len() {
        let mut all: Vec<i64> = exact.iter().map(|&(_, id)| id).collect();
        all.sort_unstable();
        assert_eq!(ids, all, "{label}: k = {k} covers every matching row");
    }
    if ef >= EXHAUSTIVE_EF {
        // A candidate list longer than any layer: exact search (the same
        // distances; rows at equal distances may differ).
        for (hit, (distance, _)) in hits.iter().zip(&exact) {
            assert!(
                close(hit.distance, *distance),
                "{label}: ef = {ef} is not exact"
            );
        }
    }
}

/// The grid. `(m, ef_construction)`: the smallest accepted, small and
/// large ones, the default; and, bypassing validation as a table created
/// by an older build does, parameters whose graphs searches cannot walk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_returns_min_k_live_rows_whatever_the_graph() {
    let floor = *HnswParams::M.start();
    let grid = [
        (
            floor,
            HnswParams::min_ef_construction(floor),
            Metric::L2,
            true,
        ),
        (floor, 400, Metric::Cosine, true),
        (32, 64, Metric::Dot, true),
        (16, 100, Metric::L2, true),
        (2, 1, Metric::L2, false),
        (3, 2, Metric::Cosine, false),
    ];
    let queries = vectors(
        Shape::Clustered {
            clusters: 10,
            spread: 0.4,
        },
        3,
        DIM,
        3,
        9,
    );
    for (m, ef_construction, metric, accepted) in grid {
        let options = [
            ("emb.metric".to_string(), format!("{metric:?}")),
            ("emb.m".to_string(), m.to_string()),
            (
                "emb.ef_construction".to_string(),
                ef_construction.to_string(),
            ),
        ];
        let table = match TableMeta::new(&schema(), vec!["id".into()], &options) {
            Ok(meta) => {
                assert!(
                    accepted,
                    "m = {m}, ef_construction = {ef_construction} accepted"
                );
                Arc::new(TableSchema::new(&meta))
            }
            Err(e) => {
                assert!(!accepted, "{e}");
                // As an older build, which accepted them, built graphs.
                let meta = TableMeta::new(&schema(), vec!["id".into()], &options[..1])
                    .expect("valid without the HNSW options");
                let mut table = TableSchema::new(&meta);
                table.vectors[0].params = HnswParams { m, ef_construction };
                Arc::new(table)
            }
        };
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let mut model = Model::new();
        let writer = build(&store, &table, &mut model).await;
        let snapshot = writer.snapshot();
        assert_eq!(snapshot.sstables.len(), 2);
        assert_eq!(snapshot.memtables.len(), 1);
        let big = snapshot
            .reader
            .vector_column(&snapshot.sstables[0], 2, &Default::default())
            .await
            .unwrap();
        let [graph] = &big.graphs[..] else {
            panic!("the big SSTable's one graph, from its file");
        };
        assert!(big.live_rows >= 256 && snapshot.sstables[1].rows < 256);
        assert!(snapshot.stored_rows() < EXHAUSTIVE_EF as u64);
        if !accepted {
            // The graph alone cannot find every row: the search must.
            let found = graph.search(&queries[..DIM], 300, 300, &|_| true).len();
            assert!(found < 300, "m = {m}: the graph reached {found} of 300");
        }
        let live = model.values().filter(|(_, v)| v.is_some()).count();
        let table_schema = table.schema.as_ref().clone();
        for (f, filter) in filters(&table_schema).into_iter().enumerate() {
            for (q, vector) in queries.chunks(DIM).enumerate() {
                for k in [1, 7, 60, live - 1, live, 100_000] {
                    for ef in [1, 10, 64, EXHAUSTIVE_EF] {
                        let query = VectorQuery {
                            column: 2,
                            vector: vector.to_vec(),
                            k,
                            ef,
                            filter: filter.expr.clone(),
                        };
                        let label = format!(
                            "m = {m}, ef_construction = {ef_construction}, {metric:?}, \
                             filter {f}, query {q}"
                        );
                        check(&snapshot, &model, metric, query, filter.admits, &label).await;
                    }
                }
            }
        }
        writer.close().await.unwrap();
    }
}

/// A query vector of the wrong dimension or with a non-finite value is
/// bad input, not a panic in the graph.
#[tokio::test]
async fn bad_query_vectors_are_refused() {
    let meta = TableMeta::new(&schema(), vec!["id".into()], &[]).unwrap();
    let table = Arc::new(TableSchema::new(&meta));
    let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let writer = build(&store, &table, &mut Model::new()).await;
    let snapshot = writer.snapshot();
    for (vector, needle) in [
        (
            vec![0.5; DIM - 1],
            "has 7 values, the column has dimension 8",
        ),
        (vec![f32::NAN; DIM], "non-finite value (NaN)"),
        (vec![1e19; DIM], "values too large for FLOAT distances"),
        (vec![1e-30; DIM], "values too small for FLOAT distances"),
    ] {
        let query = VectorQuery {
            column: 2,
            vector,
            k: 5,
            ef: 64,
            filter: None,
        };
        let err = snapshot.vector_search(&query).await.unwrap_err();
        assert!(matches!(err, memwal::Error::InvalidInput(_)), "{err:?}");
        assert!(err.to_string().contains(needle), "{err}");
    }
    writer.close().await.unwrap();
}

/// The outside report: in the process that wrote them, rows upserted many
/// times with their vectors unchanged, beside many rows sharing one vector,
/// hid nearest rows from `vector_search` (the MemTable's graph), whatever
/// the ef; a reader in another process (a graph of the newest versions)
/// was right. Every search along the line must equal the exact top 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upserts_with_unchanged_vectors_beside_copies_keep_the_nearest_rows() {
    use crate::helpers::run;
    let dir = tempfile::tempdir().unwrap();
    let mut options = WriterOptions::default();
    options.wal_flush_interval = Duration::ZERO;
    let session = memwal::MemwalSession::builder(dir.path().to_str().unwrap())
        .writer_options(options)
        .open()
        .await
        .unwrap();
    run(
        &session,
        "CREATE TABLE kv (id BIGINT PRIMARY KEY, emb FLOAT[3])",
    )
    .await;
    // A fixed sequence of ten keys of 100 a round (an LCG), each with the
    // vector [key, 1, 0], then one new key with [1, 2, 3].
    let mut state = 7u64;
    for round in 0..300 {
        let keys: Vec<String> = (0..10)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 33) % 100).to_string()
            })
            .collect();
        run(
            &session,
            &format!(
                "INSERT INTO kv SELECT value, [value, 1.0, 0.0] FROM generate_series(0, 99) \
                 WHERE value IN ({})",
                keys.join(", ")
            ),
        )
        .await;
        run(
            &session,
            &format!("INSERT INTO kv VALUES ({}, [1.0, 2.0, 3.0])", 1_000 + round),
        )
        .await;
    }
    let distances = |batches: Vec<RecordBatch>| -> Vec<f64> {
        batches
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_primitive::<datafusion::arrow::datatypes::Float64Type>()
                    .values()
                    .to_vec()
            })
            .collect()
    };
    for key in 0..100 {
        let q = format!("[{key}.0, 1.0, 0.0]");
        let found = run(
            &session,
            &format!(
                "SELECT CAST(_distance AS DOUBLE) FROM vector_search('kv', 'emb', {q}, 3) \
                 ORDER BY 1"
            ),
        )
        .await;
        let exact = run(
            &session,
            &format!(
                "SELECT CAST(l2_distance(emb, {q}) AS DOUBLE) AS d FROM kv ORDER BY d LIMIT 3"
            ),
        )
        .await;
        assert_eq!(distances(found), distances(exact), "key {key}");
    }
    session.close().await.unwrap();
}
