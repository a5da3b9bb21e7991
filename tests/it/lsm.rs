//! Flush, WAL deletion and compaction on real files: hundreds of
//! generations settle into a bounded number of SSTables, and a failure at
//! any object-store call of the flush and compaction sequence loses nothing
//! acknowledged, brings back nothing deleted, and never leaves the
//! manifest naming a file that is not there.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{AsArray, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::common::ScalarValue;
use datafusion::execution::memory_pool::{MemoryPool, UnboundedMemoryPool};
use futures::TryStreamExt;
use memwal::CommitOptions;
use memwal::testing::ShardManifest;
use memwal::testing::ShardWriter;
use memwal::testing::TableSchema;
use memwal::testing::{EntryKind, WalLog};
use memwal::testing::{Fault, FaultyStore, OpKind, VersionedObjects, paths};
use memwal::testing::{KeyBounds, deletions_complete};
use memwal::{TableMeta, WriterOptions};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

const LOCATION: &str = "tables/kv-0000000000000001";

fn table() -> Arc<TableSchema> {
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
    ]);
    let meta = TableMeta::new(&schema, vec!["id".into()], &[]).unwrap();
    Arc::new(TableSchema::new(&meta))
}

/// Every put freezes its MemTable: one generation (and flush) per put.
/// Replaced SSTables are deleted at once (no reads run concurrently).
fn tiny(max_sstables: usize) -> WriterOptions {
    let mut o = WriterOptions::default();
    o.wal_flush_interval = Duration::ZERO;
    o.memtable_bytes = 1;
    o.max_sstables = max_sstables;
    o.sstable_grace = Duration::ZERO;
    o
}

/// Time for scans running while compaction replaces their SSTables.
const GRACE: Duration = Duration::from_millis(300);

fn local(dir: &tempfile::TempDir) -> Arc<dyn ObjectStore> {
    Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap())
}

/// One operation of a workload: put `(id, v)` or delete `id`.
#[derive(Debug, Clone, Copy)]
enum Op {
    Put(i64, i64),
    Delete(i64),
}

async fn apply(writer: &ShardWriter, op: Op) -> memwal::Result<()> {
    let schema = &writer.schema().schema;
    match op {
        Op::Put(id, v) => {
            let batch = RecordBatch::try_new(
                Arc::clone(schema),
                vec![
                    Arc::new(Int64Array::from(vec![id])),
                    Arc::new(Int64Array::from(vec![v])),
                ],
            )
            .unwrap();
            writer.put(&[batch]).await
        }
        Op::Delete(id) => {
            let keys = RecordBatch::try_new(
                Arc::new(schema.project(&[0]).unwrap()),
                vec![Arc::new(Int64Array::from(vec![id]))],
            )
            .unwrap();
            writer.delete(&keys).await
        }
    }
}

fn model(ops: &[Op]) -> BTreeMap<i64, i64> {
    let mut rows = BTreeMap::new();
    for op in ops {
        match *op {
            Op::Put(id, v) => rows.insert(id, v),
            Op::Delete(id) => rows.remove(&id),
        };
    }
    rows
}

/// The rows a snapshot reads, by a full scan.
async fn collected_rows(snapshot: &memwal::ShardSnapshot) -> usize {
    let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
    let batches = snapshot.collect(&pool).await.unwrap();
    batches.iter().map(RecordBatch::num_rows).sum()
}

/// Every live row a writer's readers see, by a full scan.
async fn scan(writer: &ShardWriter) -> BTreeMap<i64, i64> {
    let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
    let mut rows = BTreeMap::new();
    for b in writer.snapshot().collect(&pool).await.unwrap() {
        let ids = b.column(0).as_primitive::<Int64Type>();
        let vs = b.column(1).as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            assert!(
                rows.insert(ids.value(i), vs.value(i)).is_none(),
                "key {} twice",
                ids.value(i)
            );
        }
    }
    rows
}

async fn manifest(store: &Arc<dyn ObjectStore>) -> ShardManifest {
    let versions = VersionedObjects::new(
        Arc::clone(store),
        paths::shard_manifest_dir(&paths::shard_dir(LOCATION, 0)),
        "json",
        CommitOptions::default(),
    );
    let latest = versions
        .load_latest(0, ShardManifest::decode)
        .await
        .unwrap();
    latest.state.as_ref().clone()
}

/// The manifest names only SSTables that exist, and (after a writer has
/// cleaned up) every SSTable that exists.
async fn check_files(store: &Arc<dyn ObjectStore>, orphans_allowed: bool) -> ShardManifest {
    let m = manifest(store).await;
    let named: HashSet<String> = m.sstables.iter().map(|f| f.path.clone()).collect();
    for f in &m.sstables {
        let head = store.head(&Path::from(f.path.as_str())).await;
        assert_eq!(
            head.unwrap().size,
            f.bytes,
            "{} is not as committed",
            f.path
        );
    }
    let sst_dir = paths::shard_dir(LOCATION, 0).join("sst");
    let present: Vec<String> = store
        .list(Some(&sst_dir))
        .map_ok(|m| m.location.to_string())
        .try_collect()
        .await
        .unwrap();
    if !orphans_allowed {
        // Retired SSTables wait out their grace period, named in the
        // manifest (a name may outlive its object by one commit); a live
        // one has the deletion vector it names.
        let retired: HashSet<&str> = m
            .retired
            .iter()
            .flat_map(|f| [Some(f.path.as_str()), paths::own_sstable_dir(&f.path)])
            .flatten()
            .collect();
        let vectors: HashSet<&str> = m
            .sstables
            .iter()
            .filter_map(|f| f.deletions.as_ref().map(|d| d.path.as_str()))
            .collect();
        let orphans: Vec<&String> = present
            .iter()
            .filter(|p| {
                !named.contains(*p)
                    && !retired.contains(p.as_str())
                    && !retired.contains(paths::sstable_dir(p))
                    && !vectors.contains(p.as_str())
            })
            .collect();
        assert!(
            orphans.is_empty(),
            "unreferenced SSTables left behind: {orphans:?}"
        );
    }
    m
}

/// Every WAL object left is a fence the manifest lists, or an entry after
/// its cursor.
async fn check_wal(store: &Arc<dyn ObjectStore>, m: &ShardManifest) {
    let wal = WalLog::new(
        Arc::clone(store),
        paths::wal_dir(&paths::shard_dir(LOCATION, 0)),
    );
    for position in wal.positions_after(0).await.unwrap() {
        if position <= m.replay_after {
            let entry = wal.read(position).await.unwrap().unwrap();
            assert_eq!(entry.kind, EntryKind::Fence, "WAL entry {position} kept");
            assert!(
                m.fences.iter().any(|f| f.position == position),
                "fence {position} unlisted"
            );
        }
    }
}

/// A compaction deletes no SSTable that a snapshot of the writer's own
/// process still holds, even with no grace period: that grace is for
/// other processes' queries. Once the snapshot is dropped, the next
/// compaction deletes them.
#[tokio::test]
async fn a_snapshot_held_in_the_writers_process_keeps_its_sstables_whatever_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let store = local(&dir);
    let open = || ShardWriter::open(Arc::clone(&store), LOCATION, 0, table(), tiny(64));
    let writer = open().await.unwrap();
    let ops: Vec<Op> = (0..12).map(|i| Op::Put(i % 5, i)).collect();
    for &op in &ops {
        apply(&writer, op).await.unwrap();
    }
    writer.close().await.unwrap();
    let writer = open().await.unwrap();
    let held = writer.snapshot();
    assert!(held.sstables.len() > 1, "{} SSTables", held.sstables.len());
    writer.compact().await.unwrap();
    let m = manifest(&store).await;
    assert_eq!(m.sstables.len(), 1);
    for f in held.sstables.iter() {
        assert!(
            m.retired.iter().any(|r| r.path == f.path),
            "{} retired",
            f.path
        );
        store.head(&Path::from(f.path.as_str())).await.unwrap();
    }
    let rows = collected_rows(&held).await;
    assert_eq!(rows, model(&ops).len(), "the held snapshot reads");

    drop(held);
    writer.compact().await.unwrap();
    assert!(manifest(&store).await.retired.is_empty());
    assert_eq!(scan(&writer).await, model(&ops));
    writer.close().await.unwrap();
    check_files(&store, false).await;
}

#[tokio::test]
async fn two_hundred_generations_settle_into_at_most_max_sstables() {
    let dir = tempfile::tempdir().unwrap();
    let store = local(&dir);
    let options = {
        let mut o = tiny(4);
        o.sstable_grace = GRACE;
        o
    };
    let writer = ShardWriter::open(Arc::clone(&store), LOCATION, 0, table(), options.clone())
        .await
        .unwrap();
    let ops: Vec<Op> = (0..200)
        .map(|i| match i % 7 {
            3 => Op::Delete((i * 13) % 50),
            _ => Op::Put((i * 31) % 50, i),
        })
        .collect();
    for (i, &op) in ops.iter().enumerate() {
        apply(&writer, op).await.unwrap();
        if i % 50 == 49 {
            // Reads are right while flushes and compactions run.
            assert_eq!(scan(&writer).await, model(&ops[..=i]), "after op {i}");
        }
    }
    writer.close().await.unwrap();
    let stats = writer.stats();
    assert!(stats.flushes >= 200, "{stats:?}");
    assert!(stats.compactions > 0, "{stats:?}");
    let recent = |t: Option<std::time::SystemTime>| {
        t.and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age < Duration::from_secs(600))
    };
    assert!(
        recent(stats.last_flush) && recent(stats.last_compaction),
        "{stats:?}"
    );

    let m = manifest(&store).await;
    assert!(m.generation > 200, "{m:?}");
    assert!(m.sstables.len() <= 4, "{} SSTables", m.sstables.len());
    assert!(!m.retired.is_empty(), "the last compaction's inputs wait");
    check_wal(&store, &m).await;

    // Once the grace period is over (at once for a writer whose grace is
    // zero), the next writer deletes them.
    let mut no_grace = options;
    no_grace.sstable_grace = Duration::ZERO;
    let reopened = ShardWriter::open(Arc::clone(&store), LOCATION, 0, table(), no_grace)
        .await
        .unwrap();
    assert_eq!(reopened.stats().frozen_memtables, 0);
    assert_eq!(scan(&reopened).await, model(&ops));
    reopened.close().await.unwrap();
    let m = check_files(&store, false).await;
    assert!(m.retired.is_empty(), "{:?}", m.retired);
    assert!(m.sstables.len() <= 4, "{} SSTables", m.sstables.len());
}

/// Writes one SSTable of keys 1 to 3, then one of key 1 again, which
/// marks a third of the first (not enough for a merge, with room for 64
/// SSTables), each by a writer of its own; returns their options.
async fn one_marked_sstable(store: &Arc<dyn ObjectStore>) -> WriterOptions {
    let mut options = tiny(64);
    options.memtable_bytes = WriterOptions::default().memtable_bytes;
    for ops in [
        &[Op::Put(1, 1), Op::Put(2, 1), Op::Put(3, 1)][..],
        &[Op::Put(1, 2)],
    ] {
        let writer = ShardWriter::open(Arc::clone(store), LOCATION, 0, table(), options.clone())
            .await
            .unwrap();
        for &op in ops {
            apply(&writer, op).await.unwrap();
        }
        writer.close().await.unwrap();
    }
    options
}

/// A deletion vector a flush replaced stays while a query of the writer's
/// process holds a snapshot that reads it, like a retired SSTable, even
/// with no grace period; it goes at the first collection after.
#[tokio::test]
async fn a_replaced_deletion_vector_a_snapshot_holds_is_kept_whatever_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let store = local(&dir);
    one_marked_sstable(&store).await;
    // Every put is flushed on its own; no grace period.
    let writer = ShardWriter::open(Arc::clone(&store), LOCATION, 0, table(), tiny(64))
        .await
        .unwrap();
    let held = writer.snapshot();
    let vector = held
        .sstables
        .iter()
        .find_map(|f| f.deletions.clone())
        .expect("the first SSTable is marked")
        .path;
    let vector = Path::from(vector.as_str());
    // Key 2 again: its flush marks the first SSTable in a new vector.
    apply(&writer, Op::Put(2, 2)).await.unwrap();
    while writer.stats().flushes == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    writer.compact().await.unwrap();
    assert!(store.head(&vector).await.is_ok(), "the held vector stays");
    let rows = collected_rows(&held).await;
    assert_eq!(rows, 3, "the snapshot reads as it was");
    drop(held);
    writer.compact().await.unwrap();
    assert!(store.head(&vector).await.is_err(), "then it goes");
    assert_eq!(
        scan(&writer).await,
        BTreeMap::from([(1, 2), (2, 2), (3, 1)])
    );
    writer.close().await.unwrap();
}

#[tokio::test]
async fn overlapping_sstables_are_read_unmerged_through_their_deletion_vectors() {
    let dir = tempfile::tempdir().unwrap();
    let store = local(&dir);
    let options = {
        let mut o = tiny(6);
        o.sstable_grace = GRACE;
        o
    };
    let writer = ShardWriter::open(Arc::clone(&store), LOCATION, 0, table(), options.clone())
        .await
        .unwrap();
    // Keys in no order: every SSTable's range overlaps every other's.
    let ops: Vec<Op> = (0..120)
        .map(|i| match i % 5 {
            2 => Op::Delete((i * 37) % 41),
            _ => Op::Put((i * 17) % 41, i),
        })
        .collect();
    let (mut unmerged, mut marked) = (0, false);
    for (i, &op) in ops.iter().enumerate() {
        apply(&writer, op).await.unwrap();
        // A marked file lives until a compaction merges it away (soon,
        // one row of one is all there is): looked for after every write.
        let snapshot = writer.snapshot();
        marked |= snapshot.sstables.iter().any(|f| f.deletions.is_some());
        if i % 10 == 9 {
            let parts = snapshot.parts(2, &KeyBounds::all()).await.unwrap();
            if parts.iter().any(|p| p.describe().contains("unmerged")) {
                unmerged += 1;
                assert!(deletions_complete(&snapshot.sstables));
            }
            assert_eq!(scan(&writer).await, model(&ops[..=i]), "after op {i}");
            // A key range: only its rows, each once.
            let mut bounds = KeyBounds::all();
            bounds.above(ScalarValue::Int64(Some(10)), true);
            bounds.below(ScalarValue::Int64(Some(30)), false);
            let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
            let mut seen = BTreeMap::new();
            for part in snapshot.parts(2, &bounds).await.unwrap() {
                let rows: Vec<RecordBatch> = part
                    .scan(None, &pool, &memwal::testing::ScanMetrics::unrecorded())
                    .await
                    .unwrap()
                    .try_collect()
                    .await
                    .unwrap();
                for b in rows {
                    let ids = b.column(0).as_primitive::<Int64Type>();
                    let vs = b.column(1).as_primitive::<Int64Type>();
                    for r in 0..b.num_rows() {
                        assert!(seen.insert(ids.value(r), vs.value(r)).is_none());
                    }
                }
            }
            let expected = model(&ops[..=i]);
            for (id, v) in &expected {
                if (10..30).contains(id) {
                    assert_eq!(seen.get(id), Some(v), "key {id} after op {i}");
                }
            }
        }
    }
    assert!(unmerged >= 6, "read unmerged {unmerged} times of 12");
    writer.close().await.unwrap();
    let m = manifest(&store).await;
    assert!(deletions_complete(&m.sstables), "{m:?}");
    // Files mostly marked are merged away (at close too): the marks were
    // seen while the writes went on.
    assert!(marked, "no SSTable was ever marked");

    // A new writer (its own caches) reads the vectors back.
    let reopened = ShardWriter::open(Arc::clone(&store), LOCATION, 0, table(), options)
        .await
        .unwrap();
    assert_eq!(scan(&reopened).await, model(&ops));
    reopened.close().await.unwrap();

    // One damaged byte of a vector is an error naming it, never another
    // answer. On a shard of its own, so that no compaction merges the
    // marked file away first (see `one_marked_sstable`).
    let dir = tempfile::tempdir().unwrap();
    let store = local(&dir);
    let options = one_marked_sstable(&store).await;
    let m = manifest(&store).await;
    let vector = m
        .sstables
        .iter()
        .find_map(|f| f.deletions.clone())
        .expect("a file with marks");
    let path = dir.path().join(&vector.path);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[12] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let reopened = ShardWriter::open(Arc::clone(&store), LOCATION, 0, table(), options)
        .await
        .unwrap();
    let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
    let err = reopened.snapshot().collect(&pool).await.unwrap_err();
    assert!(
        matches!(&err, memwal::Error::Corrupt { path, .. } if *path == vector.path),
        "{err}"
    );
}

/// The workload of the fault matrix: upserts and deletes over six keys.
fn fault_workload() -> Vec<Op> {
    (0..14)
        .map(|i| match i % 4 {
            3 => Op::Delete((i * 5) % 6),
            _ => Op::Put(i % 6, i),
        })
        .collect()
}

/// Runs the workload on `faulty` until the writer stops, then closes it;
/// returns how many operations were acknowledged, and whether the writer
/// stopped on an error (during the workload or its close).
async fn run_until_failure(store: Arc<dyn ObjectStore>, ops: &[Op]) -> (usize, bool) {
    let options = {
        let mut o = tiny(2);
        o.append_retries = 0;
        o
    };
    let Ok(writer) = ShardWriter::open(store, LOCATION, 0, table(), options).await else {
        return (0, true);
    };
    let mut acked = 0;
    for &op in ops {
        if apply(&writer, op).await.is_err() {
            break;
        }
        acked += 1;
    }
    let closed = writer.close().await;
    (acked, acked < ops.len() || closed.is_err())
}

#[tokio::test]
async fn a_failure_at_any_store_call_of_flush_or_compaction_loses_nothing() {
    let ops = fault_workload();
    // The calls of the flush and compaction sequence, by kind and object.
    let targets = [
        (OpKind::Put, "/sst/"),
        (OpKind::Get, "/sst/"),
        (OpKind::Delete, "/sst/"),
        (OpKind::List, "/sst"),
        (OpKind::Put, "/manifest/"),
        (OpKind::Get, "/manifest/"),
        (OpKind::Head, "/manifest/"),
        (OpKind::Delete, "/wal/"),
    ];
    // How many such calls a run without faults makes.
    let clean_dir = tempfile::tempdir().unwrap();
    let clean = FaultyStore::new(local(&clean_dir));
    assert_eq!(
        run_until_failure(clean.clone(), &ops).await,
        (ops.len(), false)
    );
    let mut cases = 0;
    for (kind, needle) in targets {
        // Count this target's calls in a clean run.
        let probe_dir = tempfile::tempdir().unwrap();
        let probe = FaultyStore::new(local(&probe_dir));
        probe.inject(
            Fault::nth(kind, u64::MAX)
                .on_paths_containing(needle)
                .times(1),
        );
        run_until_failure(probe.clone(), &ops).await;
        let calls = probe.matched_calls();
        assert!(calls > 0, "no {kind:?} call on {needle}");
        let mut fired = 0;
        for nth in 1..=calls {
            for after in [false, true] {
                cases += 1;
                let dir = tempfile::tempdir().unwrap();
                let inner = local(&dir);
                let faulty = FaultyStore::new(Arc::clone(&inner));
                // The store fails this call and every later one like it:
                // the writer cannot retry its way past the failure.
                let fault = Fault::nth(kind, nth)
                    .on_paths_containing(needle)
                    .times(u64::MAX);
                faulty.inject(if after { fault.after_write() } else { fault });
                let (acked, failed) = run_until_failure(faulty.clone(), &ops).await;
                let case = format!("{kind:?} #{nth} on {needle} (after: {after}), {acked} acked");
                // Whether a run reaches a later call, and whether the
                // writer still waits for it, depends on timing: a
                // compaction runs in the background and a close may end it.
                // The first write of each kind is not a compaction's (the
                // shard's claim, its first flush): it stops the writer.
                fired += usize::from(faulty.injected() > 0);
                if kind == OpKind::Put && nth == 1 && !after {
                    assert!(failed, "{case}: the writer went on past a failed write");
                }

                // Reopen without faults: acknowledged operations are all
                // there; the one in flight may or may not be.
                check_files(&inner, true).await;
                // Its flush task compacts while the scan below reads.
                let options = {
                    let mut o = tiny(2);
                    o.sstable_grace = GRACE;
                    o
                };
                let writer = ShardWriter::open(Arc::clone(&inner), LOCATION, 0, table(), options)
                    .await
                    .unwrap_or_else(|e| panic!("{case}: reopen failed: {e}"));
                let seen = scan(&writer).await;
                let in_flight = (acked + 1).min(ops.len());
                assert!(
                    seen == model(&ops[..acked]) || seen == model(&ops[..in_flight]),
                    "{case}: saw {seen:?}, acknowledged {:?}",
                    model(&ops[..acked])
                );
                writer.close().await.unwrap();
                // The next writer cleaned up what the failure left behind.
                let m = check_files(&inner, false).await;
                check_wal(&inner, &m).await;
            }
        }
        assert!(fired > 0, "no fault on {kind:?} {needle} fired");
    }
    assert!(cases > 40, "only {cases} cases");
}

/// A WAL append whose request timed out can land after its entry was
/// flushed and deleted, below where the manifest says deletions got to:
/// the next writer's start deletes it (found from outside over S3, where
/// such an entry stayed until DROP TABLE).
#[tokio::test]
async fn a_wal_entry_that_lands_after_its_deletion_is_collected_by_the_next_writer() {
    let dir = tempfile::tempdir().unwrap();
    let store = local(&dir);
    let open = |store: &Arc<dyn ObjectStore>| {
        ShardWriter::open(Arc::clone(store), LOCATION, 0, table(), tiny(100))
    };
    let wal = WalLog::new(
        Arc::clone(&store),
        paths::wal_dir(&paths::shard_dir(LOCATION, 0)),
    );
    // The put's entry is read before its flush deletes it.
    let faulty = FaultyStore::new(Arc::clone(&store));
    let deletes = faulty.gate(OpKind::Delete, "/wal/");
    let writer = open(&(faulty.clone() as Arc<dyn ObjectStore>))
        .await
        .unwrap();
    apply(&writer, Op::Put(1, 1)).await.unwrap();
    let mut first = 0; // (the first object is the writer's fence)
    for position in wal.positions_after(0).await.unwrap() {
        if wal.read(position).await.unwrap().unwrap().kind != EntryKind::Fence {
            first = position;
            break;
        }
    }
    let late = store
        .get(&wal.path_of(first))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    deletes.open();
    for i in 2..6 {
        apply(&writer, Op::Put(i, i)).await.unwrap();
    }
    writer.close().await.unwrap();
    let m = manifest(&store).await;
    assert!(
        first <= m.wal_deleted_through,
        "{first} is not below the line"
    );
    // The late request lands.
    store.put(&wal.path_of(first), late.into()).await.unwrap();

    let writer = open(&store).await.unwrap();
    assert_eq!(scan(&writer).await, (1..6).map(|i| (i, i)).collect());
    writer.close().await.unwrap();
    assert!(
        !wal.positions_after(0).await.unwrap().contains(&first),
        "the entry that landed late is still there"
    );
    check_wal(&store, &manifest(&store).await).await;
}

/// A writer whose flush meets SSTables that a newer writer merged and
/// deleted at once (no grace period) stops as fenced, at the first failed
/// attempt, instead of retrying against the missing files until its
/// retries run out and stopping as broken (found from outside: a bulk load
/// beside another shell's compactions failed with "deletion vectors of a
/// flush failed 6 times").
#[tokio::test]
async fn a_flush_over_sstables_a_newer_writer_deleted_stops_as_fenced() {
    let inner: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let options = one_marked_sstable(&inner).await;
    // A put left in the WAL by a writer still running.
    let running = ShardWriter::open(Arc::clone(&inner), LOCATION, 0, table(), options.clone())
        .await
        .unwrap();
    apply(&running, Op::Put(2, 3)).await.unwrap();
    // This writer takes it over and flushes it at its close, its SSTable
    // held at the upload.
    let faulty = FaultyStore::new(Arc::clone(&inner));
    let held = faulty.gate(OpKind::Put, "/sst/");
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let writer = ShardWriter::open(store, LOCATION, 0, table(), options.clone())
        .await
        .unwrap();
    let closing = tokio::spawn(async move { writer.close().await });
    held.arrived(1).await;
    // Meanwhile a newer writer merges the two SSTables and deletes them.
    let newer = ShardWriter::open(Arc::clone(&inner), LOCATION, 0, table(), options)
        .await
        .unwrap();
    newer.compact().await.unwrap();
    held.open();
    // Fenced, with no rows of its own acknowledged: a close without error.
    closing.await.unwrap().unwrap();
    assert_eq!(scan(&newer).await, BTreeMap::from([(1, 2), (2, 3), (3, 1)]));
    newer.close().await.unwrap();
    let _ = running.close().await;
}

/// A panic in a compaction (a bug, here a store client's) stops the
/// writer, whose state it may have left half changed, instead of leaving
/// it running: the compaction fails as poisoned, and a writer opened
/// afresh has every row.
#[tokio::test]
async fn a_panic_in_a_compaction_stops_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let inner = local(&dir);
    let ops: Vec<Op> = (0..6).map(|i| Op::Put(i, i * 10)).collect();
    // One SSTable a put, none merged.
    let writer = ShardWriter::open(Arc::clone(&inner), LOCATION, 0, table(), tiny(100))
        .await
        .unwrap();
    for &op in &ops {
        apply(&writer, op).await.unwrap();
    }
    writer.close().await.unwrap();

    let faulty = FaultyStore::new(Arc::clone(&inner));
    let writer = ShardWriter::open(faulty.clone(), LOCATION, 0, table(), tiny(100))
        .await
        .unwrap();
    assert!(writer.layers().1.len() > 1);
    // The compaction's commit: the manifest version after the newest.
    let newest = crate::helpers::files(dir.path())
        .iter()
        .filter_map(|f| {
            let name = f.file_name()?.to_str()?;
            name.strip_prefix('v')?
                .strip_suffix(".json")?
                .parse::<u64>()
                .ok()
        })
        .max()
        .unwrap();
    faulty.inject(
        Fault::nth(OpKind::Put, 1)
            .on_paths_containing(format!("/manifest/v{:020}.json", newest + 1))
            .panicking(),
    );
    let compacted = writer.compact().await;
    assert!(
        matches!(&compacted, Err(memwal::Error::Poisoned(m)) if m.contains("injected Put panic")),
        "{compacted:?}"
    );
    assert!(matches!(writer.stopped(), Some(memwal::Error::Poisoned(_))));
    assert!(apply(&writer, Op::Put(100, 1)).await.is_err());
    let _ = writer.close().await;

    let writer = ShardWriter::open(inner, LOCATION, 0, table(), tiny(100))
        .await
        .unwrap();
    assert_eq!(scan(&writer).await, model(&ops));
    writer.close().await.unwrap();
}
