//! The shard writer on real and fault-injecting stores: retries at the same
//! position, poisoning, corrupt WAL objects, fencing, and what concurrent
//! readers may see.

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{AsArray, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use memwal::testing::ShardWriter;
use memwal::testing::TableSchema;
use memwal::testing::WalLog;
use memwal::testing::{Delay, Fault, FaultyStore, LatencyProfile, LatencyStore, OpKind, paths};
use memwal::{Error, TableMeta, WriterOptions};
use object_store::memory::InMemory;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

const LOCATION: &str = "tables/t-0000000000000001";

fn table() -> Arc<TableSchema> {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("put", DataType::Int64, false),
        Field::new("v", DataType::Utf8, true),
    ]);
    let meta = TableMeta::new(&schema, vec!["id".into()], &[]).unwrap();
    Arc::new(TableSchema::new(&meta))
}

fn rows(schema: &SchemaRef, ids: std::ops::Range<i64>, put: i64) -> RecordBatch {
    let n = ids.end - ids.start;
    RecordBatch::try_new(
        Arc::clone(schema),
        vec![
            Arc::new(Int64Array::from_iter_values(ids)),
            Arc::new(Int64Array::from(vec![put; n as usize])),
            Arc::new(StringArray::from(vec![Some("x"); n as usize])),
        ],
    )
    .unwrap()
}

fn options(interval_ms: u64) -> WriterOptions {
    let mut o = WriterOptions::default();
    o.wal_flush_interval = Duration::from_millis(interval_ms);
    o
}

async fn open(store: &Arc<dyn ObjectStore>, interval_ms: u64) -> memwal::Result<ShardWriter> {
    ShardWriter::open(
        Arc::clone(store),
        LOCATION,
        0,
        table(),
        options(interval_ms),
    )
    .await
}

/// `(id, put)` of every row the writer's readers see.
async fn visible(writer: &ShardWriter) -> Vec<(i64, i64)> {
    let pool: Arc<dyn datafusion::execution::memory_pool::MemoryPool> =
        Arc::new(datafusion::execution::memory_pool::UnboundedMemoryPool::default());
    let mut out: Vec<(i64, i64)> = writer
        .snapshot()
        .collect(&pool)
        .await
        .unwrap()
        .iter()
        .flat_map(|b| {
            let ids = b.column(0).as_primitive::<Int64Type>().clone();
            let puts = b.column(1).as_primitive::<Int64Type>().clone();
            (0..b.num_rows()).map(move |i| (ids.value(i), puts.value(i)))
        })
        .collect();
    out.sort_unstable();
    out
}

fn wal(store: &Arc<dyn ObjectStore>) -> WalLog {
    WalLog::new(
        Arc::clone(store),
        paths::wal_dir(&paths::shard_dir(LOCATION, 0)),
    )
}

#[tokio::test]
async fn a_transient_wal_write_error_is_retried_at_the_same_position() {
    let faulty = FaultyStore::new(Arc::new(InMemory::new()));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let writer = open(&store, 100).await.unwrap();
    let schema = Arc::clone(&writer.schema().schema);
    // Fence at 1; the put's entry goes to 2 and fails twice before landing.
    faulty.inject(
        Fault::nth(OpKind::Put, 1)
            .times(2)
            .on_paths_containing("/wal/"),
    );
    writer.put(&[rows(&schema, 0..10, 1)]).await.unwrap();
    assert_eq!(faulty.injected(), 2);
    assert_eq!(wal(&store).positions_after(0).await.unwrap(), [1, 2]);
    let stats = writer.stats();
    assert_eq!((stats.wal_appends, stats.next_position), (1, 3));
    writer.close().await.unwrap();

    let reopened = open(&store, 100).await.unwrap();
    assert_eq!(visible(&reopened).await.len(), 10);
}

#[tokio::test]
async fn an_ambiguous_wal_write_poisons_the_writer_and_every_waiter_gets_the_error() {
    let faulty = FaultyStore::new(Arc::new(InMemory::new()));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let writer = Arc::new(open(&store, 100).await.unwrap());
    let schema = Arc::clone(&writer.schema().schema);
    writer.put(&[rows(&schema, 0..5, 0)]).await.unwrap();

    // The next entry lands but its acknowledgement is lost, and reading it
    // back fails too: the outcome is unknown.
    faulty.set_latency(Duration::from_millis(20));
    faulty.inject(
        Fault::nth(OpKind::Put, 1)
            .after_write()
            .on_paths_containing("/wal/"),
    );
    faulty.inject(Fault::nth(OpKind::Get, 1).on_paths_containing("/wal/"));
    let waiters: Vec<_> = (1..=4)
        .map(|p| {
            let writer = Arc::clone(&writer);
            let batch = rows(&schema, p * 100..p * 100 + 5, p);
            tokio::spawn(async move { writer.put(&[batch]).await })
        })
        .collect();
    for waiter in waiters {
        match waiter.await.unwrap() {
            Err(Error::Poisoned(reason)) => {
                assert!(reason.contains("unknown"), "{reason}")
            }
            other => panic!("expected the writer to be poisoned, got {other:?}"),
        }
    }
    // Later puts fail at once; close does not report the error again.
    faulty.clear();
    assert!(matches!(
        writer.put(&[rows(&schema, 900..901, 9)]).await,
        Err(Error::Poisoned(_))
    ));
    assert!(writer.stopped().is_some());
    writer.close().await.unwrap();

    // Recovery is to reopen: the acknowledged rows are there.
    let reopened = open(&store, 100).await.unwrap();
    let seen = visible(&reopened).await;
    assert!((0..5).all(|id| seen.contains(&(id, 0))), "{seen:?}");
}

/// Found from outside over S3: a WAL append that timed out and whose
/// retries failed quickly was reported as failed, and landed later. It is
/// tried once more after a slow failure, and past that its outcome is
/// unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_that_failed_slowly_is_tried_once_more_then_unknown() {
    for (slow_failures, written) in [(1, true), (u64::MAX, false)] {
        let faulty = FaultyStore::new(Arc::new(InMemory::new()));
        let store: Arc<dyn ObjectStore> = faulty.clone();
        let writer = open(&store, 0).await.unwrap();
        let schema = Arc::clone(&writer.schema().schema);
        faulty.inject(
            Fault::nth(OpKind::Put, 1)
                .times(slow_failures)
                .slowly(Duration::from_millis(1100))
                .on_paths_containing("/wal/"),
        );
        match writer.put(&[rows(&schema, 0..5, 1)]).await {
            Ok(()) => assert!(written),
            Err(Error::Poisoned(reason)) => assert!(
                !written
                    && reason.starts_with("outcome of the commit of ")
                    && reason.contains("may still land"),
                "{reason}"
            ),
            Err(other) => panic!("{other}"),
        }
        let _ = writer.close().await;
    }
}

#[tokio::test]
async fn a_corrupt_truncated_or_missing_wal_entry_fails_open_naming_it() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let writer = open(&store, 0).await.unwrap();
    let schema = Arc::clone(&writer.schema().schema);
    for p in 0..3 {
        writer
            .put(&[rows(&schema, p * 10..p * 10 + 10, p)])
            .await
            .unwrap();
    }
    // Dropped, not closed: close would flush the MemTable and delete the
    // WAL entries.
    drop(writer);
    let log = wal(&store);
    assert_eq!(log.positions_after(0).await.unwrap(), [1, 2, 3, 4]);

    // Truncated.
    let good = log.read_bytes(3).await.unwrap().unwrap();
    store
        .put(
            &log.path_of(3),
            PutPayload::from_bytes(good.slice(..good.len() / 2)),
        )
        .await
        .unwrap();
    let err = open(&store, 0).await.unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    assert!(
        err.to_string().contains("00000000000000000003.arrow"),
        "{err}"
    );

    // One flipped byte.
    let mut bad = good.to_vec();
    bad[good.len() / 3] ^= 0x40;
    store
        .put(&log.path_of(3), PutPayload::from(bad))
        .await
        .unwrap();
    let err = open(&store, 0).await.unwrap_err();
    assert!(
        err.to_string().contains("00000000000000000003.arrow"),
        "{err}"
    );

    // Missing (a gap before later entries).
    store.delete(&log.path_of(3)).await.unwrap();
    let err = open(&store, 0).await.unwrap_err();
    assert!(
        err.to_string().contains("00000000000000000003.arrow")
            && err.to_string().contains("missing"),
        "{err}"
    );
}

/// `memtable_bytes` is the memory the MemTable keeps alive: a one-row
/// delete whose key is a slice of a scanned batch (as a DELETE's are) does
/// not count, or hold, the whole batch, and the columns of a replayed WAL
/// entry (which share its buffer) count it once. (A replayed put holds a
/// little more than the live one: its decoded buffers are padded; a
/// replayed one-row delete, mostly padding, is copied.)
#[tokio::test]
async fn memtable_bytes_are_what_is_held_after_one_row_deletes_and_replay() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let writer = open(&store, 0).await.unwrap();
    let schema = Arc::clone(&writer.schema().schema);
    writer.put(&[rows(&schema, 0..8192, 1)]).await.unwrap();
    let put = writer.stats().memtable_bytes;
    let key_schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    let scanned = RecordBatch::try_new(
        key_schema,
        vec![Arc::new(Int64Array::from_iter_values(0..8192))],
    )
    .unwrap();
    for id in 0..100 {
        writer.delete(&scanned.slice(id, 1)).await.unwrap();
    }
    let deletes = writer.stats().memtable_bytes - put;
    assert!(
        deletes < 100 * 1024,
        "{deletes} bytes for 100 one-row deletes"
    );
    // Dropped, not closed: the rows stay in the WAL.
    drop(writer);
    let replayed = open(&store, 0).await.unwrap();
    assert_eq!(visible(&replayed).await.len(), 8092);
    let after = replayed.stats().memtable_bytes;
    assert!(
        after < put * 3 / 2 + 2 * deletes,
        "{after} bytes after replay, {put} + {deletes} before"
    );
}

#[tokio::test]
async fn a_second_writer_fences_the_first_and_nothing_acknowledged_is_lost() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let first = open(&store, 5).await.unwrap();
    let schema = Arc::clone(&first.schema().schema);
    first.put(&[rows(&schema, 0..10, 1)]).await.unwrap();

    let second = open(&store, 5).await.unwrap();
    assert!(second.epoch() > first.epoch());
    // The second writer replayed what the first acknowledged.
    assert_eq!(visible(&second).await.len(), 10);
    assert!(!first.still_owns_shard().await.unwrap());

    match first.put(&[rows(&schema, 10..20, 2)]).await {
        Err(Error::Fenced {
            epoch, by_epoch, ..
        }) => assert_eq!((epoch, by_epoch), (first.epoch(), second.epoch())),
        other => panic!("expected Fenced, got {other:?}"),
    }
    // Every later put of the fenced writer fails the same way.
    assert!(matches!(
        first.put(&[rows(&schema, 20..30, 3)]).await,
        Err(Error::Fenced { .. })
    ));
    second.put(&[rows(&schema, 0..5, 4)]).await.unwrap();
    second.close().await.unwrap();

    let third = open(&store, 5).await.unwrap();
    let seen = visible(&third).await;
    let expected: Vec<(i64, i64)> = (0..10).map(|id| (id, if id < 5 { 4 } else { 1 })).collect();
    assert_eq!(
        seen, expected,
        "acknowledged rows lost or rejected rows present"
    );
}

#[tokio::test]
async fn racing_openers_get_distinct_epochs_and_only_the_newest_writes() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let opened = futures::future::join_all((0..4).map(|_| open(&store, 0))).await;
    let mut writers = Vec::new();
    for result in opened {
        match result {
            Ok(w) => writers.push(w),
            // A fence of a newer epoch was already in the WAL.
            Err(Error::Fenced {
                epoch, by_epoch, ..
            }) => assert!(by_epoch > epoch),
            Err(e) => panic!("{e}"),
        }
    }
    let newest = writers.iter().map(ShardWriter::epoch).max().unwrap();
    let schema = Arc::clone(&writers[0].schema().schema);
    for (i, w) in writers.iter().enumerate() {
        let result = w.put(&[rows(&schema, 0..1, i as i64)]).await;
        if w.epoch() == newest {
            result.unwrap();
        } else {
            assert!(matches!(result, Err(Error::Fenced { .. })), "{result:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_never_see_a_partial_put_or_rows_beyond_the_durable_prefix() {
    const PUTS: i64 = 300;
    const BATCHES: i64 = 3;
    const ROWS: i64 = 7;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let writer = Arc::new(open(&store, 2).await.unwrap());
    let schema = Arc::clone(&writer.schema().schema);

    let put_task = {
        let writer = Arc::clone(&writer);
        tokio::spawn(async move {
            let mut pending = Vec::new();
            for p in 0..PUTS {
                let batches: Vec<RecordBatch> = (0..BATCHES)
                    .map(|b| {
                        let start = (p * BATCHES + b) * ROWS;
                        rows(&schema, start..start + ROWS, p)
                    })
                    .collect();
                pending.push(writer.put_nowait(&batches).await.unwrap());
                if pending.len() == 8 {
                    for ack in pending.drain(..) {
                        ack.wait().await.unwrap();
                    }
                }
            }
            for ack in pending {
                ack.wait().await.unwrap();
            }
        })
    };
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let writer = Arc::clone(&writer);
            tokio::spawn(async move {
                let mut scans = 0;
                let mut last_seen = 0;
                loop {
                    let snapshot: Vec<_> = writer
                        .snapshot()
                        .memtables
                        .iter()
                        .flat_map(|l| l.memtable.batches(0, l.batches))
                        .collect();
                    let durable = writer.stats().durable_batches as usize;
                    assert!(
                        snapshot.len() <= durable,
                        "saw {} batches, only {durable} durable",
                        snapshot.len()
                    );
                    let mut per_put = std::collections::BTreeMap::<i64, i64>::new();
                    for b in &snapshot {
                        for p in b.batch.column(1).as_primitive::<Int64Type>().values() {
                            *per_put.entry(*p).or_default() += 1;
                        }
                    }
                    for (p, n) in &per_put {
                        assert_eq!(*n, BATCHES * ROWS, "put {p} seen partially");
                    }
                    assert!(snapshot.len() >= last_seen, "the visible prefix moved back");
                    last_seen = snapshot.len();
                    scans += 1;
                    if per_put.len() as i64 == PUTS {
                        return scans;
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    put_task.await.unwrap();
    let mut scans = Vec::new();
    for reader in readers {
        scans.push(reader.await.unwrap());
    }
    // At least one reader looked while puts were still coming.
    assert!(scans.iter().any(|&n| n > 1), "{scans:?}");
    let stats = writer.stats();
    assert_eq!(stats.rows, (PUTS * BATCHES * ROWS) as u64);
    assert_eq!(stats.pending_rows, 0);
    assert!(
        stats.wal_appends < PUTS as u64,
        "group commit never grouped: {stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_waiting_for_each_put_share_appends_on_a_slow_store() {
    // PUTs of 30 ms, a 100 ms cadence. One caller putting and waiting gets
    // an append per put, at once; but two callers, each putting while the
    // other's append is in flight, must not make every put an append of
    // its own: they share appends on the cadence.
    let profile = LatencyProfile {
        name: "slow-puts",
        put: Delay {
            p50: Duration::from_millis(30),
            p99: Duration::from_millis(30),
        },
        ..LatencyProfile::S3_EXPRESS
    };
    let store: Arc<dyn ObjectStore> = LatencyStore::new(Arc::new(InMemory::new()), profile, 1);
    let writer = Arc::new(open(&store, 100).await.unwrap());
    let schema = Arc::clone(&writer.schema().schema);
    const PUTS: i64 = 12;
    let callers: Vec<_> = (0..2)
        .map(|c| {
            let (writer, schema) = (Arc::clone(&writer), Arc::clone(&schema));
            tokio::spawn(async move {
                for p in 0..PUTS {
                    let id = c * PUTS + p;
                    writer.put(&[rows(&schema, id..id + 1, p)]).await.unwrap();
                }
            })
        })
        .collect();
    for caller in callers {
        caller.await.unwrap();
    }
    let stats = writer.stats();
    assert_eq!(stats.rows, 2 * PUTS as u64);
    assert!(
        stats.wal_appends <= (2 * PUTS as u64) * 3 / 4,
        "two callers' puts went one append each: {stats:?}"
    );
}

#[tokio::test]
async fn puts_wait_while_too_much_is_not_durable() {
    let faulty = FaultyStore::new(Arc::new(InMemory::new()));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let writer = Arc::new(
        ShardWriter::open(Arc::clone(&store), LOCATION, 0, table(), {
            let mut o = WriterOptions::default();
            o.wal_flush_interval = Duration::ZERO;
            o.max_unflushed_bytes = 1;
            o.memtable_bytes = 1;
            o
        })
        .await
        .unwrap(),
    );
    let schema = Arc::clone(&writer.schema().schema);
    let appends = faulty.gate(OpKind::Put, "/wal/");
    let first = writer.put_nowait(&[rows(&schema, 0..10, 1)]).await.unwrap();
    // The first put's append is held: the second put waits for it.
    appends.arrived(1).await;
    let second = {
        let writer = Arc::clone(&writer);
        let batch = rows(&schema, 10..20, 2);
        tokio::spawn(async move { writer.put_nowait(&[batch]).await.map(|_| ()) })
    };
    // It stays waiting while the append is held (given 100 ms here; the
    // gate, not the time, is what holds it).
    let mut second = second;
    assert!(
        tokio::time::timeout(Duration::from_millis(100), &mut second)
            .await
            .is_err(),
        "a put went past the unflushed-bytes ceiling"
    );
    assert_eq!(writer.stats().pending_batches, 1);
    appends.open();
    first.wait().await.unwrap();
    second.await.unwrap().unwrap();
}

#[tokio::test]
async fn bad_input_writes_nothing_and_the_writer_stays_usable() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let writer = open(&store, 0).await.unwrap();
    let schema = Arc::clone(&writer.schema().schema);
    let null_key = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("put", DataType::Int64, false),
            Field::new("v", DataType::Utf8, true),
        ])),
        vec![
            Arc::new(Int64Array::from(vec![Some(1), None])),
            Arc::new(Int64Array::from(vec![1, 1])),
            Arc::new(StringArray::from(vec!["a", "b"])),
        ],
    )
    .unwrap();
    let wrong_schema = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)])),
        vec![Arc::new(Int64Array::from(vec![1]))],
    )
    .unwrap();
    let empty = rows(&schema, 0..0, 1);
    for (what, bad) in [
        ("a NULL primary key", vec![rows(&schema, 5..6, 1), null_key]),
        ("a schema mismatch", vec![wrong_schema.clone()]),
        ("an empty batch", vec![empty]),
        ("no batch", vec![]),
    ] {
        let err = writer.put(&bad).await.unwrap_err();
        assert!(matches!(err, Error::InvalidInput(_)), "{what}: {err}");
    }
    assert!(matches!(
        writer.delete(&wrong_schema.project(&[]).unwrap()).await,
        Err(Error::InvalidInput(_))
    ));
    let stats = writer.stats();
    assert_eq!((stats.puts, stats.rows, stats.wal_appends), (0, 0, 0));
    writer.put(&[rows(&schema, 0..3, 1)]).await.unwrap();
    assert_eq!(visible(&writer).await, [(0, 1), (1, 1), (2, 1)]);
}

#[tokio::test]
async fn close_makes_every_put_durable_and_later_puts_fail() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let writer = ShardWriter::open(Arc::clone(&store), LOCATION, 0, table(), {
        let mut o = options(100);
        o.durable = false;
        o
    })
    .await
    .unwrap();
    let schema = Arc::clone(&writer.schema().schema);
    for p in 0..20 {
        writer
            .put(&[rows(&schema, p * 5..p * 5 + 5, p)])
            .await
            .unwrap();
    }
    writer.close().await.unwrap();
    assert!(matches!(
        writer.put(&[rows(&schema, 500..501, 0)]).await,
        Err(Error::Poisoned(_))
    ));
    let reopened = open(&store, 100).await.unwrap();
    assert_eq!(
        visible(&reopened).await.len(),
        100,
        "close lost non-durable puts"
    );
}

/// Waits until the WAL object at `position` exists.
async fn landed(store: &Arc<dyn ObjectStore>, position: u64) {
    let wal = wal(store);
    for _ in 0..5_000 {
        if wal.read(position).await.unwrap().is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("WAL position {position} never landed");
}

/// A writer with its append at WAL position 2 held (its first after the
/// fence at 1) and a second put's append at 3 landed; the puts' waits.
async fn overtaken() -> (
    Arc<dyn ObjectStore>,
    Arc<FaultyStore>,
    memwal::testing::Gate,
    ShardWriter,
    [tokio::task::JoinHandle<memwal::Result<()>>; 2],
) {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let faulty = FaultyStore::new(Arc::clone(&inner));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    // Latency mode: the second append starts as soon as its put arrives.
    let writer = open(&store, 0).await.unwrap();
    let schema = Arc::clone(&writer.schema().schema);
    let held = faulty.gate(OpKind::Put, "00000000000000000002.arrow");
    let first = writer.put_nowait(&[rows(&schema, 0..10, 1)]).await.unwrap();
    held.arrived(1).await;
    let second = writer
        .put_nowait(&[rows(&schema, 10..20, 2)])
        .await
        .unwrap();
    landed(&inner, 3).await;
    let entry = wal(&inner).read(3).await.unwrap().unwrap();
    assert_eq!(entry.landed_through, Some(1), "3 says 2 was in flight");
    let waits = [tokio::spawn(first.wait()), tokio::spawn(second.wait())];
    (inner, faulty, held, writer, waits)
}

#[tokio::test]
async fn an_append_that_overtakes_another_is_acknowledged_after_it() {
    let (inner, _faulty, held, writer, [mut first, mut second]) = overtaken().await;
    // Given 100 ms, neither put is acknowledged while 2 is held (the gate,
    // not the time, holds them).
    for wait in [&mut first, &mut second] {
        assert!(
            tokio::time::timeout(Duration::from_millis(100), wait)
                .await
                .is_err(),
            "a put was acknowledged before the append before it landed"
        );
    }
    assert_eq!(writer.stats().durable_batches, 0);
    assert!(visible(&writer).await.is_empty());
    held.open();
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    assert_eq!(visible(&writer).await.len(), 20);
    writer.close().await.unwrap();
    let reopened = open(&inner, 5).await.unwrap();
    assert_eq!(visible(&reopened).await.len(), 20);
}

#[tokio::test]
async fn a_new_writer_plugs_the_gap_so_the_held_append_can_never_land() {
    let (inner, _faulty, held, old, [first, second]) = overtaken().await;
    // Another process takes the shard over while 2 is still on its way
    // (it reaches the store without the gate).
    let new = open(&inner, 5).await.unwrap();
    let plug = wal(&inner).read(2).await.unwrap().unwrap();
    assert_eq!(
        (plug.kind, plug.epoch),
        (memwal::testing::EntryKind::Fence, new.epoch())
    );
    // The held append now fails, and with it both puts: nothing was
    // acknowledged, and the overtaking entry's unacknowledged rows replay.
    held.open();
    for wait in [first, second] {
        assert!(matches!(wait.await.unwrap(), Err(Error::Fenced { .. })));
    }
    assert!(matches!(old.stopped(), Some(Error::Fenced { .. })));
    let seen = visible(&new).await;
    assert_eq!(seen, (10..20).map(|id| (id, 2)).collect::<Vec<_>>());
    new.close().await.unwrap();
    let again = open(&inner, 5).await.unwrap();
    assert_eq!(visible(&again).await, seen);
}

#[tokio::test]
async fn an_append_in_flight_when_a_flush_stops_the_writer_still_acknowledges_its_put() {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let faulty = FaultyStore::new(Arc::clone(&inner));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let mut o = options(0);
    // Every put freezes its MemTable; a flush gives up after two attempts.
    o.memtable_bytes = 1;
    o.append_retries = 1;
    let writer = ShardWriter::open(Arc::clone(&store), LOCATION, 0, table(), o)
        .await
        .unwrap();
    let schema = Arc::clone(&writer.schema().schema);
    faulty.inject(
        Fault::nth(OpKind::Put, 1)
            .times(u64::MAX)
            .on_paths_containing("/sst/"),
    );
    let sstables = faulty.gate(OpKind::Put, "/sst/");
    writer.put(&[rows(&schema, 0..10, 1)]).await.unwrap();
    sstables.arrived(1).await;
    // The next put's append is on its way when the flush fails for good.
    let appends = faulty.gate(OpKind::Put, "/wal/");
    let put = writer
        .put_nowait(&[rows(&schema, 10..20, 2)])
        .await
        .unwrap();
    appends.arrived(1).await;
    let put = tokio::spawn(put.wait());
    sstables.open();
    tokio::time::timeout(Duration::from_secs(30), async {
        while writer.stopped().is_none() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the writer stops once its flush failed");
    appends.open();
    // Its rows are in the WAL: the put succeeded, and the next writer has them.
    put.await.unwrap().unwrap();
    faulty.clear();
    let next = open(&store, 0).await.unwrap();
    assert_eq!(visible(&next).await.len(), 20);
    next.close().await.unwrap();
}
