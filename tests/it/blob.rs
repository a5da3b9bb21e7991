//! Blob columns: long values go into one pack per WAL append, rows hold
//! descriptors; a scan reads packs only for the blob column, a pack that
//! could not be written fails its puts, and a damaged pack is an error,
//! never a different value.

use std::sync::Arc;

use datafusion::arrow::util::pretty::pretty_format_batches;
use futures::TryStreamExt;
use memwal::testing::{Fault, FaultyStore, OpKind};
use memwal::{Catalog, CatalogOptions, MemwalSession, ObjectRoot, WriterOptions};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use crate::helpers::{pause_at, run};

/// A session on `store` (a fresh one each call: a restart).
async fn open(store: &Arc<FaultyStore>) -> MemwalSession {
    open_with(store, |_| {}).await
}

/// Like [`open`], with `change` applied to the writer options.
async fn open_with(
    store: &Arc<FaultyStore>,
    change: impl FnOnce(&mut WriterOptions),
) -> MemwalSession {
    let root = ObjectRoot::new(store.clone(), "memory://blobs");
    let catalog = Catalog::open(root, CatalogOptions::default())
        .await
        .unwrap();
    let mut options = WriterOptions::default();
    options.wal_flush_interval = std::time::Duration::ZERO;
    options.append_retries = 1;
    // Retired SSTables, and packs nothing names, go at once.
    options.sstable_grace = std::time::Duration::ZERO;
    // Packs are objects of their own, which most tests look for and
    // inject faults into (`open_in_wal` keeps the default: small packs
    // inside their WAL entries).
    options.blob_wal_pack_bytes = 0;
    change(&mut options);
    MemwalSession::new(catalog, options)
}

/// Like [`open`], with each group's pack inside its WAL entry (the
/// default).
async fn open_in_wal(store: &Arc<FaultyStore>) -> MemwalSession {
    let default = WriterOptions::default().blob_wal_pack_bytes;
    open_with(store, |o| o.blob_wal_pack_bytes = default).await
}

/// The WAL entries under the root that carry a pack, and their sizes.
async fn packed_entries(store: &Arc<FaultyStore>) -> Vec<(Path, u64)> {
    let mut packed = Vec::new();
    let listed: Vec<_> = store.list(None).try_collect().await.unwrap();
    for meta in listed
        .into_iter()
        .filter(|m| m.location.as_ref().contains("/wal/"))
    {
        let bytes = store
            .get(&meta.location)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        if bytes.ends_with(b"MWL3") {
            packed.push((meta.location, meta.size));
        }
    }
    packed
}

/// The table most tests use: a key, a caption and a blob column.
const CREATE_MEDIA: &str = "CREATE TABLE media (id BIGINT PRIMARY KEY, caption TEXT, raw BYTEA) \
     WITH ('raw.blob' = 'true')";

/// Creates `media` (one shard) with three rows in one append: 8 KiB and
/// 16 KiB values (packed) and a one-byte value (inline).
async fn create_media(session: &MemwalSession) {
    run(session, CREATE_MEDIA).await;
    run(
        session,
        "INSERT INTO media VALUES \
         (1, 'one', CAST(repeat('1', 8192) AS BYTEA)), \
         (2, 'two', CAST(repeat('2', 16384) AS BYTEA)), \
         (3, 'three', CAST('3' AS BYTEA))",
    )
    .await;
}

/// Merges every SSTable of `media` into one (and collects packs).
async fn compact_media(session: &MemwalSession) {
    session
        .table("media")
        .await
        .unwrap()
        .compact()
        .await
        .unwrap();
}

/// The pack objects under the root.
async fn packs(store: &Arc<FaultyStore>) -> Vec<Path> {
    store
        .list(None)
        .map_ok(|meta| meta.location)
        .try_filter(|p| std::future::ready(p.as_ref().contains("/blobs/")))
        .try_collect()
        .await
        .unwrap()
}

/// From now on `store.matched_calls()` counts the GETs of packs (a rule
/// that never fires).
fn count_pack_gets(store: &Arc<FaultyStore>) {
    store.inject(
        Fault::nth(OpKind::Get, u64::MAX)
            .times(1)
            .on_paths_containing("/blobs/"),
    );
}

async fn text(session: &MemwalSession, sql: &str) -> String {
    pretty_format_batches(&run(session, sql).await)
        .unwrap()
        .to_string()
}

/// The error of `sql`, a statement that must fail when it runs.
async fn failure(session: &MemwalSession, sql: &str) -> String {
    let run = session.sql(sql).await.unwrap().collect().await;
    run.expect_err("the statement fails").to_string()
}

const VALUES: &str =
    "SELECT id, length(CAST(raw AS TEXT)) AS n, md5(raw) AS md5 FROM media ORDER BY id";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_reads_packs_only_for_the_blob_column() {
    let store = FaultyStore::new(Arc::new(InMemory::new()));
    let session = open(&store).await;
    create_media(&session).await;
    let before = text(&session, VALUES).await;
    session.close().await.unwrap();
    assert_eq!(packs(&store).await.len(), 1, "one append, one pack");

    count_pack_gets(&store);
    let session = open(&store).await;
    let captions = text(&session, "SELECT id, caption FROM media ORDER BY id").await;
    assert!(captions.contains("three"), "{captions}");
    let count = text(&session, "SELECT count(*) FROM media").await;
    assert!(count.contains("| 3 "), "{count}");
    // Sizes come from the descriptors.
    let sizes = text(
        &session,
        "SELECT id, blob_size(raw) AS size FROM media ORDER BY id",
    )
    .await;
    for row in ["| 1  | 8192  |", "| 2  | 16384 |", "| 3  | 1     |"] {
        assert!(sizes.contains(row), "{sizes}");
    }
    let plan = text(&session, "EXPLAIN SELECT id, blob_size(raw) FROM media").await;
    assert!(plan.contains("sizes of=[2]"), "{plan}");
    // Sizes in key lookups, filters, sorts, limits and aggregates come
    // from the descriptors too (DataFusion moves the call down to the
    // scan).
    for (sql, row) in [
        ("SELECT sum(blob_size(raw)) AS n FROM media", "| 24577 |"),
        (
            "SELECT blob_size(raw) AS n FROM media WHERE id = 2",
            "| 16384 |",
        ),
        (
            "SELECT sum(blob_size(raw)) AS n FROM media WHERE id IN (1, 2)",
            "| 24576 |",
        ),
        (
            "SELECT max(id) AS n FROM media WHERE blob_size(raw) > 10000",
            "| 2 |",
        ),
        (
            "SELECT count(*) AS n FROM media WHERE blob_size(raw) IS NULL",
            "| 0 |",
        ),
        (
            "SELECT id AS n FROM media ORDER BY blob_size(raw) LIMIT 1",
            "| 3 |",
        ),
        // Null checks and counts of the column are asked of its sizes.
        ("SELECT count(*) AS n FROM media WHERE raw IS NULL", "| 0 |"),
        ("SELECT count(raw) AS n FROM media", "| 3 |"),
        (
            "SELECT max(id) AS n FROM media WHERE raw IS NOT NULL",
            "| 3 |",
        ),
        (
            "SELECT min(s) AS n FROM (SELECT blob_size(raw) AS s FROM media LIMIT 5)",
            "| 1 |",
        ),
        (
            "SELECT count(*) AS n FROM media GROUP BY blob_size(raw) > 1 ORDER BY n LIMIT 1",
            "| 1 |",
        ),
    ] {
        let got = text(&session, sql).await;
        assert!(got.contains(row), "{sql}: {got}");
        let plan = text(&session, &format!("EXPLAIN {sql}")).await;
        assert!(plan.contains("sizes of=[2]"), "{sql}: {plan}");
    }
    // A key lookup that selects no blob column reads none.
    let found = text(&session, "SELECT count(*) AS n FROM media WHERE id = 2").await;
    assert!(found.contains("| 1 |"), "{found}");
    assert_eq!(store.matched_calls(), 0, "no pack read without the column");
    // Beside the values the function measures them.
    let both = text(
        &session,
        "SELECT length(CAST(raw AS TEXT)) AS n, blob_size(raw) AS size FROM media WHERE id = 2",
    )
    .await;
    assert!(both.contains("| 16384 | 16384 |"), "{both}");
    store.clear();
    store.inject(
        Fault::nth(OpKind::Get, u64::MAX)
            .times(1)
            .on_paths_containing("/blobs/"),
    );

    assert_eq!(text(&session, VALUES).await, before, "the same values back");
    assert!(before.contains("| 16384 |"), "{before}");
    assert_eq!(store.matched_calls(), 1, "one ranged read for the one pack");
    session.close().await.unwrap();
}

/// Creates `media`, then inserts row `id` with a packed value while every
/// PUT to a path containing `failing` fails: the INSERT must fail. The
/// values before it; the session is closed and the faults cleared.
async fn insert_failing_on(store: &Arc<FaultyStore>, failing: &str, id: i64) -> String {
    insert_failing_in(open(store).await, store, failing, id).await
}

/// [`insert_failing_on`] with `session` (on `store`).
async fn insert_failing_in(
    session: MemwalSession,
    store: &Arc<FaultyStore>,
    failing: &str,
    id: i64,
) -> String {
    create_media(&session).await;
    let before = text(&session, VALUES).await;
    store.inject(
        Fault::nth(OpKind::Put, 1)
            .times(u64::MAX)
            .on_paths_containing(failing),
    );
    let insert = format!("INSERT INTO media VALUES ({id}, 'x', CAST(repeat('x', 9000) AS BYTEA))");
    let failed = session.sql(&insert).await.unwrap().collect().await;
    assert!(
        failed.is_err(),
        "a put whose {failing} PUT failed is not acknowledged"
    );
    let _ = session.close().await;
    store.clear();
    before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pack_that_cannot_be_written_fails_its_puts_and_nothing_names_it() {
    let store = FaultyStore::new(Arc::new(InMemory::new()));
    let before = insert_failing_on(&store, "/blobs/", 4).await;
    let session = open(&store).await;
    assert_eq!(text(&session, VALUES).await, before, "row 4 is not there");
    session.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wal_append_that_fails_after_its_pack_leaves_its_rows_out() {
    let store = FaultyStore::new(Arc::new(InMemory::new()));
    let before = insert_failing_on(&store, "/wal/", 5).await;
    assert_eq!(packs(&store).await.len(), 2, "its pack was written first");

    let session = open(&store).await;
    assert_eq!(text(&session, VALUES).await, before, "row 5 is not there");
    // Once the shard's flushes pass its position, the pack no entry names
    // is deleted.
    run(
        &session,
        "INSERT INTO media VALUES (6, 'six', CAST('6' AS BYTEA))",
    )
    .await;
    session.close().await.unwrap();
    let session = open(&store).await;
    compact_media(&session).await;
    assert_eq!(packs(&store).await.len(), 1, "the orphan pack is gone");
    assert!(text(&session, VALUES).await.contains("| 16384 |"));
    session.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packs_nothing_names_any_more_are_deleted_and_the_others_kept() {
    let store = FaultyStore::new(Arc::new(InMemory::new()));
    let session = open(&store).await;
    create_media(&session).await;
    let [first] = packs(&store).await.try_into().unwrap();
    run(
        &session,
        "INSERT INTO media VALUES (4, 'four', CAST(repeat('4', 5000) AS BYTEA))",
    )
    .await;
    session.close().await.unwrap();
    assert_eq!(
        packs(&store).await.len(),
        2,
        "the flushed SSTable names both"
    );

    // Rows 1 and 2, the only ones in the first pack, get short values: the
    // older SSTable still names the pack until a compaction drops it.
    let session = open(&store).await;
    run(
        &session,
        "INSERT INTO media VALUES (1, 'one', CAST('1' AS BYTEA)), (2, 'two', CAST('2' AS BYTEA))",
    )
    .await;
    let expected = text(&session, VALUES).await;
    session.close().await.unwrap();
    assert_eq!(packs(&store).await.len(), 2);

    let session = open(&store).await;
    let table = session.table("media").await.unwrap();
    table.compact().await.unwrap();
    let left = packs(&store).await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_ne!(
        left[0], first,
        "the pack no row names went, the other stayed"
    );
    let stats = table.stats(0).unwrap().expect("the writer is open");
    assert_eq!(stats.blob_packs_deleted, 1);
    assert_eq!(stats.blob_pack_bytes_deleted, 8192 + 16384);
    assert_eq!(text(&session, VALUES).await, expected);
    assert!(expected.contains("| 5000 |"), "{expected}");
    session.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_pack_is_an_error_not_a_different_value() {
    let store = FaultyStore::new(Arc::new(InMemory::new()));
    let session = open(&store).await;
    create_media(&session).await;
    session.close().await.unwrap();
    let [pack] = packs(&store).await.try_into().unwrap();
    let mut bytes = store
        .get(&pack)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    // A byte of the second value (row 2's 16 KiB follow row 1's 8 KiB).
    bytes[8192 + 100] ^= 1;
    store.put(&pack, bytes.clone().into()).await.unwrap();

    let session = open(&store).await;
    let err = failure(&session, VALUES).await;
    assert!(err.contains("checksum"), "{err}");
    // The other columns are still readable.
    let captions = text(&session, "SELECT caption FROM media ORDER BY id").await;
    assert!(captions.contains("two"), "{captions}");
    // So are the other values: a filter on other columns drops rows
    // before their values are read.
    let others = text(
        &session,
        "SELECT id, length(CAST(raw AS TEXT)) AS n FROM media WHERE caption <> 'two' ORDER BY id",
    )
    .await;
    assert!(
        others.contains("| 1  | 8192 |") && others.contains("| 3  | 1    |"),
        "{others}"
    );
    let plan = text(
        &session,
        "EXPLAIN SELECT raw FROM media WHERE caption <> 'two'",
    )
    .await;
    assert!(plan.contains("before blobs"), "{plan}");
    // A pack cut short is named too, not a bare range error of the store.
    store
        .put(&pack, bytes[..5000].to_vec().into())
        .await
        .unwrap();
    let err = failure(&session, VALUES).await;
    assert!(
        err.contains("holds 5000 bytes") && err.contains(pack.as_ref()),
        "{err}"
    );
    // And the damaged rows can still be deleted: DELETE and TRUNCATE read
    // keys (and what the predicate needs), not blob values.
    run(&session, "DELETE FROM media WHERE caption = 'two'").await;
    run(&session, "TRUNCATE media").await;
    let count = text(&session, "SELECT count(*) FROM media").await;
    assert!(count.contains("| 0 "), "{count}");
    session.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vector_search_reads_blob_values_only_of_the_rows_it_returns_and_only_if_asked() {
    let store = FaultyStore::new(Arc::new(InMemory::new()));
    let session = open(&store).await;
    run(
        &session,
        "CREATE TABLE clips (id BIGINT PRIMARY KEY, raw BYTEA, emb FLOAT[2]) \
         WITH ('raw.blob' = 'true', 'shards' = '2')",
    )
    .await;
    run(
        &session,
        "INSERT INTO clips SELECT value, CAST(repeat(CAST(value AS TEXT), 5000) AS BYTEA), \
         [CAST(value AS FLOAT), 0.0] FROM generate_series(1, 20)",
    )
    .await;
    session.close().await.unwrap();
    count_pack_gets(&store);
    let session = open(&store).await;
    let search = "FROM vector_search('clips', 'emb', [3.1, 0.0], 2) ORDER BY _distance";
    let ids = text(&session, &format!("SELECT id {search}")).await;
    assert!(ids.contains("| 3  |") && ids.contains("| 4  |"), "{ids}");
    assert_eq!(store.matched_calls(), 0, "no pack read without the column");
    let values = text(
        &session,
        &format!("SELECT id, length(CAST(raw AS TEXT)) AS n {search}"),
    )
    .await;
    assert!(values.contains("| 3  | 5000 |"), "{values}");
    assert!(
        store.matched_calls() <= 2,
        "one read per returned row at most"
    );
    // A filter on the blob column sees the packed values (the rows are in
    // SSTables since the restart).
    let filtered = text(
        &session,
        "SELECT id FROM vector_search('clips', 'emb', [3.1, 0.0], 2) \
         WHERE raw = CAST(repeat('17', 5000) AS BYTEA)",
    )
    .await;
    assert!(filtered.contains("| 17 |"), "{filtered}");
    session.close().await.unwrap();
}

/// Once a put's pack has landed, the MemTable holds the rows'
/// descriptors, not their long values: far more blob bytes than
/// `memtable_bytes` fit in one MemTable, and its rows read back from the
/// pack, through a scan, a key lookup and a vector search whose filter
/// reads the blob column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memtable_lets_go_of_blob_values_once_their_pack_landed() {
    let store = FaultyStore::new(Arc::new(InMemory::new()));
    let session = open_with(&store, |o| o.memtable_bytes = 1 << 20).await;
    run(
        &session,
        "CREATE TABLE clips (id BIGINT PRIMARY KEY, raw BYTEA, emb FLOAT[2]) \
         WITH ('raw.blob' = 'true')",
    )
    .await;
    // 8 puts of 8 values of 64 KiB: 4 MiB.
    for put in 0..8 {
        run(
            &session,
            &format!(
                "INSERT INTO clips SELECT value, \
                 CAST(repeat(CAST(value % 10 AS TEXT), 65536) AS BYTEA), \
                 [CAST(value AS FLOAT), 0.0] FROM generate_series({}, {})",
                put * 8 + 1,
                put * 8 + 8
            ),
        )
        .await;
    }
    let stats = text(
        &session,
        "SELECT flushes, memtable_bytes < 1048576 AS small FROM memwal_stats('clips')",
    )
    .await;
    assert!(stats.contains("| 0       | true  |"), "{stats}");
    count_pack_gets(&store);
    let right = text(
        &session,
        "SELECT count(*) FROM clips \
         WHERE raw = CAST(repeat(CAST(id % 10 AS TEXT), 65536) AS BYTEA)",
    )
    .await;
    assert!(right.contains("| 64 "), "{right}");
    assert!(store.matched_calls() > 0, "the values come from the packs");
    let one = text(
        &session,
        "SELECT raw = CAST(repeat('5', 65536) AS BYTEA) AS same FROM clips WHERE id = 5",
    )
    .await;
    assert!(one.contains("| true "), "{one}");
    let nearest = text(
        &session,
        "SELECT id FROM vector_search('clips', 'emb', [3.1, 0.0], 1) \
         WHERE raw = CAST(repeat('7', 65536) AS BYTEA)",
    )
    .await;
    assert!(nearest.contains("| 7  |"), "{nearest}");
    session.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_pack_uploads_in_parts_and_a_failed_part_leaves_none_behind() {
    let dir = tempfile::tempdir().unwrap();
    let local = object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap();
    let store = FaultyStore::new(Arc::new(local));
    let session = open(&store).await;
    run(&session, CREATE_MEDIA).await;
    // 40 MB: a start and three parts. The second part fails once; the
    // pack is uploaded again from the start.
    store.inject(Fault::nth(OpKind::Put, 3).on_paths_containing("/blobs/"));
    run(
        &session,
        "INSERT INTO media VALUES (1, 'big', CAST(repeat('m', 40000000) AS BYTEA))",
    )
    .await;
    assert_eq!(store.injected(), 1, "a part failed");
    assert!(store.matched_calls() >= 7, "two uploads of three parts");
    let values = text(&session, VALUES).await;
    assert!(values.contains("| 1  | 40000000 |"), "{values}");
    let files: Vec<String> = crate::helpers::files(dir.path())
        .into_iter()
        .map(|p| p.display().to_string())
        .filter(|p| p.contains("/blobs/"))
        .collect();
    assert_eq!(files.len(), 1, "one pack, no part left: {files:?}");
    session.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pack_whose_completion_landed_with_its_answer_lost_counts_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let local = object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap();
    let store = FaultyStore::new(Arc::new(local));
    let session = open(&store).await;
    run(&session, CREATE_MEDIA).await;
    // 40 MB: a multipart upload; it completes and its answer is lost.
    store.inject(
        Fault::nth(OpKind::Complete, 1)
            .after_write()
            .on_paths_containing("/blobs/"),
    );
    run(
        &session,
        "INSERT INTO media VALUES (1, 'big', CAST(repeat('m', 40000000) AS BYTEA))",
    )
    .await;
    assert_eq!(store.injected(), 1);
    assert_eq!(store.calls(OpKind::Complete), 1, "uploaded once");
    let values = text(&session, VALUES).await;
    assert!(values.contains("| 1  | 40000000 |"), "{values}");
    session.close().await.unwrap();
}

/// Creates `media` with ten 8 KiB values in one pack and ten short
/// inline ones (flushed), then gives eight of the long ones new values in
/// a second pack (flushed): a fifth of the first pack stays live, and
/// fewer than half the rows of the first SSTable are replaced (no
/// compaction merges it on its own). The pack objects, oldest first.
async fn one_pack_mostly_overwritten(store: &Arc<FaultyStore>) -> (Path, Path) {
    let session = open(store).await;
    run(&session, CREATE_MEDIA).await;
    run(
        &session,
        "INSERT INTO media SELECT value, 'old', CAST(repeat(CAST(value % 10 AS TEXT), \
         CASE WHEN value <= 10 THEN 8192 ELSE 1 END) AS BYTEA) FROM generate_series(1, 20)",
    )
    .await;
    session.close().await.unwrap();
    let session = open(store).await;
    run(
        &session,
        "INSERT INTO media SELECT value, 'new', CAST(repeat('n', 8192) AS BYTEA) \
         FROM generate_series(1, 8)",
    )
    .await;
    session.close().await.unwrap();
    let [old, new] = packs(store).await.try_into().unwrap();
    (old, new)
}

/// What `media` holds after [`one_pack_mostly_overwritten`].
fn overwritten_values(values: &str) {
    for id in 1..=10 {
        let caption = if id <= 8 { "new" } else { "old" };
        let row = format!("| {id:<2} | {caption:<7} | 8192 |");
        assert!(values.contains(&row), "row {id}: {values}");
    }
}

const CAPTIONS: &str = "SELECT id, caption, length(CAST(raw AS TEXT)) AS n FROM media ORDER BY id";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_moves_the_live_values_of_a_mostly_dead_pack_and_collects_it() {
    let store = FaultyStore::new(Arc::new(InMemory::new()));
    let (old, new) = one_pack_mostly_overwritten(&store).await;
    let session = open(&store).await;
    let table = session.table("media").await.unwrap();
    table.compact().await.unwrap();
    let left = packs(&store).await;
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(
        !left.contains(&old),
        "the mostly dead pack is gone: {left:?}"
    );
    assert!(left.contains(&new), "the live pack stays: {left:?}");
    let stats = table.stats(0).unwrap().expect("the writer is open");
    assert_eq!(stats.blob_packs_repacked, 1);
    assert_eq!(stats.blob_bytes_repacked, 2 * 8192, "rows 9 and 10 moved");
    assert_eq!(stats.blob_pack_bytes_deleted, 10 * 8192);
    assert_eq!(stats.blob_live_bytes, 10 * 8192);
    assert_eq!(
        stats.blob_stored_bytes,
        10 * 8192,
        "every stored byte is live"
    );
    overwritten_values(&text(&session, CAPTIONS).await);
    session.close().await.unwrap();
    let session = open(&store).await;
    overwritten_values(&text(&session, CAPTIONS).await);
    session.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repack_that_fails_loses_nothing_and_leaves_no_pack_behind() {
    let store = FaultyStore::new(Arc::new(InMemory::new()));
    let (old, new) = one_pack_mostly_overwritten(&store).await;
    // Reading the values to move fails, then writing the compaction's
    // SSTable after its new pack was written; every attempt. (A long grace
    // keeps a writer's own collection, which may run right after the
    // failed compaction, from taking the copies before they are counted.)
    let mut left_behind = Vec::new();
    let graceful = |o: &mut WriterOptions| o.sstable_grace = std::time::Duration::from_secs(3600);
    for fault in [
        Fault::nth(OpKind::Get, 1).on_paths_containing("/blobs/"),
        Fault::nth(OpKind::Put, 1).on_paths_containing("/sst/"),
    ] {
        let session = open_with(&store, graceful).await;
        store.inject(fault.times(u64::MAX));
        let table = session.table("media").await.unwrap();
        assert!(table.compact().await.is_err(), "the compaction failed");
        assert!(store.injected() > 0);
        store.clear();
        left_behind.push(packs(&store).await.len());
        let _ = session.close().await;
        let session = open_with(&store, graceful).await;
        overwritten_values(&text(&session, CAPTIONS).await);
        session.close().await.unwrap();
    }
    assert_eq!(left_behind[0], 2, "no copy before the read failed");
    assert!(
        left_behind[1] > 2,
        "copies before the SSTable failed: {left_behind:?}"
    );
    // The next writer collects the copies no SSTable names; the next
    // compaction moves the values again.
    let session = open(&store).await;
    let table = session.table("media").await.unwrap();
    table.compact().await.unwrap();
    let left = packs(&store).await;
    assert_eq!(left.len(), 2, "the live pack and one copy: {left:?}");
    assert!(left.contains(&new) && !left.contains(&old), "{left:?}");
    overwritten_values(&text(&session, CAPTIONS).await);
    session.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sizes_come_from_descriptors_and_a_value_streams_in_pieces() {
    use datafusion::arrow::array::{Int64Array, RecordBatch};
    let dir = tempfile::tempdir().unwrap();
    let local = object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap();
    let store = FaultyStore::new(Arc::new(local));
    let session = open(&store).await;
    create_media(&session).await;
    run(
        &session,
        "INSERT INTO media VALUES (4, 'four', NULL), \
         (5, 'five', CAST(repeat('5', 3000000) AS BYTEA))",
    )
    .await;
    session.close().await.unwrap();
    let session = open(&store).await;
    let table = session.table("media").await.unwrap();
    let key_schema = Arc::new(table.schema().project(&[0]).unwrap());
    let key = |id: i64| {
        let ids = Arc::new(Int64Array::from(vec![id]));
        RecordBatch::try_new(Arc::clone(&key_schema), vec![ids]).unwrap()
    };
    count_pack_gets(&store);
    for (id, size) in [
        (1, Some(8192)),
        (2, Some(16384)),
        (3, Some(1)),
        (4, None),
        (5, Some(3_000_000)),
        (99, None),
    ] {
        assert_eq!(
            table.blob_size(&key(id), "raw").await.unwrap(),
            size,
            "row {id}"
        );
    }
    assert_eq!(store.matched_calls(), 0, "sizes read no pack");
    let err = table.blob_size(&key(1), "caption").await.unwrap_err();
    assert!(err.to_string().contains("not a blob column"), "{err}");

    let stream = table.read_blob(&key(5), "raw").await.unwrap().unwrap();
    let chunks: Vec<bytes::Bytes> = stream.try_collect().await.unwrap();
    assert!(chunks.len() > 1, "the value comes in pieces");
    assert_eq!(chunks.concat(), vec![b'5'; 3_000_000]);
    assert_eq!(store.matched_calls(), 1, "one ranged read");
    let inline: Vec<bytes::Bytes> = (table.read_blob(&key(3), "raw").await.unwrap().unwrap())
        .try_collect()
        .await
        .unwrap();
    assert_eq!(inline.concat(), b"3");
    assert!(table.read_blob(&key(4), "raw").await.unwrap().is_none());
    assert!(table.read_blob(&key(99), "raw").await.unwrap().is_none());

    // One flipped byte in the pack: the stream ends with an error.
    let pack = crate::helpers::files(dir.path())
        .into_iter()
        .find(|f| {
            f.extension().is_some_and(|e| e == "pack") && f.metadata().unwrap().len() > 1 << 20
        })
        .expect("the 3 MB value's pack");
    let mut bytes = std::fs::read(&pack).unwrap();
    bytes[1_500_000] ^= 0x01;
    std::fs::write(&pack, bytes).unwrap();
    let stream = table.read_blob(&key(5), "raw").await.unwrap().unwrap();
    let read: Result<Vec<bytes::Bytes>, _> = stream.try_collect().await;
    let err = read.unwrap_err();
    assert!(err.to_string().contains("checksum"), "{err}");
    session.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pack_whose_rows_were_all_replaced_goes_after_the_next_flush() {
    let store = FaultyStore::new(Arc::new(InMemory::new()));
    let session = open(&store).await;
    run(&session, CREATE_MEDIA).await;
    run(
        &session,
        "INSERT INTO media SELECT value, 'old', CAST(repeat('o', 8192) AS BYTEA) \
         FROM generate_series(1, 10)",
    )
    .await;
    session.close().await.unwrap();
    assert_eq!(packs(&store).await.len(), 1);
    // Every row gets a short value: the flush marks every row of the
    // first SSTable deleted, far below any size tier's limit.
    let session = open(&store).await;
    run(
        &session,
        "INSERT INTO media SELECT value, 'new', CAST('n' AS BYTEA) FROM generate_series(1, 10)",
    )
    .await;
    session.close().await.unwrap();
    assert_eq!(
        packs(&store).await,
        Vec::<Path>::new(),
        "nothing names the pack"
    );
    let session = open(&store).await;
    let values = text(&session, CAPTIONS).await;
    assert_eq!(values.matches("| new     | 1 |").count(), 10, "{values}");
    session.close().await.unwrap();
}

/// A pack written long ago whose rows are replaced: its grace period
/// starts when a collection first finds it named by nothing, so a snapshot
/// taken before the flush still reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pack_stays_for_its_grace_period_after_its_rows_were_flushed_over_however_old() {
    use datafusion::arrow::array::{AsArray, Int64Array};
    use datafusion::execution::memory_pool::{MemoryPool, UnboundedMemoryPool};
    let dir = tempfile::tempdir().unwrap();
    let local = object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap();
    let store = FaultyStore::new(Arc::new(local));
    let graceful = |o: &mut WriterOptions| o.sstable_grace = std::time::Duration::from_secs(3600);
    let session = open_with(&store, graceful).await;
    create_media(&session).await;
    let [old] = packs(&store).await.try_into().unwrap();
    // Written two hours ago, as far as the store can tell.
    let file = std::fs::File::options()
        .write(true)
        .open(dir.path().join(old.as_ref()))
        .unwrap();
    let hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
    file.set_modified(hours_ago).unwrap();
    let table = session.table("media").await.unwrap();
    let before = table.snapshot(0, std::time::Duration::ZERO).await.unwrap();
    run(
        &session,
        "INSERT INTO media VALUES (1, 'one', CAST('1' AS BYTEA)), (2, 'two', CAST('2' AS BYTEA))",
    )
    .await;
    session.close().await.unwrap();
    // The next writer's collection, after the flush that dropped the rows.
    let next = open_with(&store, graceful).await;
    next.table("media").await.unwrap().compact().await.unwrap();
    assert!(
        packs(&store).await.contains(&old),
        "the pack outlives the flush that dropped its rows"
    );
    let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
    let rows = before.collect(&pool).await.unwrap();
    let mut lengths: Vec<(i64, usize)> = Vec::new();
    for batch in &rows {
        let ids = batch
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        let raw = batch.column(2).as_binary::<i32>();
        lengths.extend((0..batch.num_rows()).map(|i| (ids.value(i), raw.value(i).len())));
    }
    lengths.sort();
    assert_eq!(lengths, [(1, 8192), (2, 16384), (3, 1)], "the old values");
    next.close().await.unwrap();

    // Without a grace period the next writer's collection takes it.
    let session = open(&store).await;
    session
        .table("media")
        .await
        .unwrap()
        .compact()
        .await
        .unwrap();
    assert!(!packs(&store).await.contains(&old));
    session.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repack_leaves_a_damaged_value_in_place_and_goes_on() {
    let store = FaultyStore::new(Arc::new(InMemory::new()));
    let (old, _) = one_pack_mostly_overwritten(&store).await;
    // Row 9's value (the ninth in the pack) gets one flipped byte.
    let mut bytes = store
        .get(&old)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    bytes[8 * 8192 + 10] ^= 0x01;
    store.put(&old, bytes.into()).await.unwrap();
    let session = open(&store).await;
    let table = session.table("media").await.unwrap();
    table.compact().await.unwrap();
    let stats = table.stats(0).unwrap().expect("the writer is open");
    assert_eq!(
        stats.blob_bytes_repacked, 8192,
        "row 10 moved, row 9 stayed"
    );
    assert!(packs(&store).await.contains(&old), "row 9 still names it");
    let err = failure(&session, "SELECT md5(raw) FROM media WHERE id = 9").await;
    assert!(err.contains("checksum"), "{err}");
    let row = text(
        &session,
        "SELECT id, length(CAST(raw AS TEXT)) AS n FROM media WHERE id = 10",
    )
    .await;
    assert!(row.contains("| 10 | 8192 |"), "{row}");
    // The writer goes on.
    run(
        &session,
        "INSERT INTO media VALUES (11, 'more', CAST(repeat('m', 8192) AS BYTEA))",
    )
    .await;
    session.close().await.unwrap();
}

/// A bulk load (an INSERT larger than `load_memory_bytes`) moves long
/// values into packs of its runs' own, as appends do: the runs hold
/// descriptors, sizes need no pack read, and the values read back across a
/// restart and a compaction. A load that fails leaves its packs to
/// collection, which holds off while an object of the load is left under
/// `load/` (its markers, while it may commit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_load_packs_long_values_and_a_failed_load_leaves_no_pack() {
    use memwal::testing::{load_tag_of_pack, paths};

    let store = FaultyStore::new(Arc::new(InMemory::new()));
    let loading = |o: &mut WriterOptions| o.load_memory_bytes = 64 << 10;
    let session = open_with(&store, loading).await;
    run(&session, CREATE_MEDIA).await;
    // 39 values of 5 to 18 KiB and one inline (500 KiB).
    let rows = |ids: &str| {
        format!(
            "SELECT value AS id, 'c' AS caption, \
             CAST(repeat(CAST(value AS TEXT), CASE WHEN value = 7 THEN 1 ELSE 5000 + value * 100 END) AS BYTEA) AS raw \
             FROM generate_series({ids})"
        )
    };
    run(&session, &format!("INSERT INTO media {}", rows("1, 40"))).await;
    let md5s = "SELECT id, md5(raw) AS md5, blob_size(raw) AS size FROM media ORDER BY id";
    let expected = text(
        &session,
        &format!(
            "SELECT id, md5(raw) AS md5, blob_size(raw) AS size FROM ({}) ORDER BY id",
            rows("1, 40")
        ),
    )
    .await;
    let loaded = packs(&store).await;
    assert!(!loaded.is_empty());
    let table = session.table("media").await.unwrap();
    let stats = table.stats(0).unwrap().expect("the writer is open");
    assert_eq!(stats.blob_packs as usize, loaded.len());
    assert_eq!(stats.wal_appends, 0, "the load went around the WAL");

    count_pack_gets(&store);
    let total = text(&session, "SELECT sum(blob_size(raw)) AS n FROM media").await;
    assert!(total.contains("| 508801 |"), "{total}");
    assert_eq!(store.matched_calls(), 0, "sizes from descriptors");
    assert_eq!(text(&session, md5s).await, expected);
    assert!(store.matched_calls() > 0, "the values are in packs");
    store.clear();
    session.close().await.unwrap();

    // After a restart and a compaction, the same values from the same packs.
    let session = open_with(&store, loading).await;
    compact_media(&session).await;
    assert_eq!(text(&session, md5s).await, expected);
    assert_eq!(packs(&store).await, loaded);

    // A load whose runs cannot be written commits nothing; its packs
    // stay while a load looks alive, and go once none does.
    store.inject(
        Fault::nth(OpKind::Put, 1)
            .times(u64::MAX)
            .on_paths_containing("data.parquet"),
    );
    let err = failure(&session, &format!("INSERT INTO media {}", rows("41, 80"))).await;
    assert!(err.contains("injected"), "{err}");
    store.clear();
    assert_eq!(text(&session, md5s).await, expected);
    session.close().await.unwrap();
    let left = packs(&store).await;
    assert!(left.len() > loaded.len(), "{left:?}");
    // As if the failed load were alive still (it may commit while its
    // marker is there, fresh or not): its packs stay. Another load's
    // marker holds none.
    let shard = Path::from(loaded[0].as_ref().split_once("/blobs/").unwrap().0);
    let failed = left.iter().find(|p| !loaded.contains(p)).unwrap();
    let (pack, _) = paths::parse_blob_pack(failed.filename().unwrap()).unwrap();
    let marker = paths::load_marker(&shard, load_tag_of_pack(pack), 3_600_000);
    store.put(&marker, Vec::new().into()).await.unwrap();
    let other = paths::load_marker(&shard, 0xabc, 3_600_000);
    store.put(&other, Vec::new().into()).await.unwrap();
    // Never read by anyone, they need no grace period once the load ended.
    let session = open_with(&store, |o| {
        loading(o);
        o.sstable_grace = std::time::Duration::from_secs(3600);
    })
    .await;
    compact_media(&session).await;
    assert_eq!(packs(&store).await, left, "a live load's packs stay");
    store.delete(&marker).await.unwrap();
    compact_media(&session).await;
    assert_eq!(packs(&store).await, loaded, "the failed load's went");
    store.delete(&other).await.unwrap();
    assert_eq!(text(&session, md5s).await, expected);
    session.close().await.unwrap();
}

/// A load whose packs were deleted before it committed (a writer took it
/// for crashed: it was silent for longer than `load_grace`) fails instead
/// of naming values that are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_whose_packs_were_collected_before_its_commit_fails() {
    let store = FaultyStore::new(Arc::new(InMemory::new()));
    let session = open_with(&store, |o| {
        o.load_memory_bytes = 64 << 10;
        o.load_grace = std::time::Duration::from_secs(1);
    })
    .await;
    run(&session, CREATE_MEDIA).await;
    // The host stalls: the load's marker is written, then not rewritten
    // twice (every 250 ms), then rewritten again; its first pack waits
    // until then. The marker may have looked stale meanwhile (older than
    // half the grace), so the load looks for its packs before it commits.
    store.inject(
        Fault::nth(OpKind::Put, 2)
            .times(2)
            .on_paths_containing(".alive"),
    );
    let written = store.gate(OpKind::Put, "/blobs/");
    let looked = store.gate(OpKind::Head, "/blobs/");
    let insert = failure(
        &session,
        "INSERT INTO media SELECT value, 'c', CAST(repeat('v', 10000) AS BYTEA) \
         FROM generate_series(1, 40)",
    );
    tokio::pin!(insert);
    tokio::select! {
        err = &mut insert => panic!("the load ended before it wrote a pack: {err}"),
        () = written.arrived(1) => {}
    }
    while store.matched_calls() < 4 {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    written.open();
    let wait = std::time::Duration::from_secs(30);
    tokio::select! {
        err = &mut insert => panic!("the load ended without looking for its packs: {err}"),
        arrived = tokio::time::timeout(wait, looked.arrived(1)) => {
            arrived.expect("the load looks for its packs");
        }
    }
    for pack in packs(&store).await {
        store.delete(&pack).await.unwrap();
    }
    looked.open();
    let err = insert.await;
    assert!(err.contains("crashed load"), "{err}");
    let count = text(&session, "SELECT count(*) AS n FROM media").await;
    assert!(count.contains("| 0 |"), "no row: {count}");
    session.close().await.unwrap();
}

/// A load whose writers another process fences while its runs wait to be
/// written writes them all the same and commits, taking the shards back
/// (found from outside: a blob load beside another shell's writes failed
/// with the fence its writers had met meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_goes_on_when_its_writers_are_fenced_before_its_runs_are_written() {
    use datafusion::arrow::array::{BinaryArray, Int64Array, RecordBatch, StringArray};
    let store = FaultyStore::new(Arc::new(InMemory::new()));
    let session = open_with(&store, |o| o.load_memory_bytes = 64 << 10).await;
    run(
        &session,
        "CREATE TABLE media (id BIGINT PRIMARY KEY, caption TEXT, raw BYTEA) \
         WITH ('raw.blob' = 'true', 'shards' = '4')",
    )
    .await;
    // Two runs (one at a time per core) hold at their packs' upload; the
    // other shards' runs wait for them.
    let held = store.gate(OpKind::Put, "/blobs/");
    let insert = session
        .sql(
            "INSERT INTO media SELECT value, 'c', CAST(repeat('v', 10000) AS BYTEA) \
             FROM generate_series(1, 40)",
        )
        .await
        .unwrap()
        .collect();
    tokio::pin!(insert);
    pause_at(&mut insert, held.arrived(2), "its packs were written").await;
    // Another process takes every shard over; this one's writers meet its
    // fences with their next puts (short values: no pack) and take the
    // shards back.
    let other = open(&store).await;
    other.table("media").await.unwrap().compact().await.unwrap();
    other.close().await.unwrap();
    let table = session.table("media").await.unwrap();
    let ids: Vec<i64> = (100..140).collect();
    let columns: Vec<datafusion::arrow::array::ArrayRef> = vec![
        Arc::new(Int64Array::from(ids.clone())),
        Arc::new(StringArray::from(vec!["p"; ids.len()])),
        Arc::new(BinaryArray::from(vec![&b"p"[..]; ids.len()])),
    ];
    let schema = table.schema();
    let columns = columns
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| datafusion::arrow::compute::cast(c, f.data_type()).unwrap())
        .collect();
    let puts = RecordBatch::try_new(schema, columns).unwrap();
    table.put(&puts).await.unwrap();
    held.open();
    insert.await.expect("the load commits");
    let count = text(
        &session,
        "SELECT count(*) AS n, sum(length(raw)) AS bytes FROM media",
    )
    .await;
    assert!(count.contains("| 80 | 400040 |"), "{count}");
    session.close().await.unwrap();
}

/// A group's pack that fits one request is the front of its WAL entry:
/// no object of its own, kept past the flush while an SSTable names it,
/// read by range, never by a scan without the column, and collected with
/// the entry once nothing names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_pack_rides_in_its_wal_entry_until_nothing_names_it() {
    let store = FaultyStore::new(Arc::new(InMemory::new()));
    let session = open_in_wal(&store).await;
    create_media(&session).await;
    let before = text(&session, VALUES).await;
    assert!(before.contains("| 16384 |"), "{before}");
    session.close().await.unwrap();
    assert_eq!(packs(&store).await, Vec::<Path>::new(), "no pack object");
    let entries = packed_entries(&store).await;
    assert_eq!(entries.len(), 1, "one append, its pack inside: {entries:?}");
    assert!(entries[0].1 > 8192 + 16384, "{entries:?}");

    // Restarted: the rows are in an SSTable that names the entry.
    store.inject(
        Fault::nth(OpKind::Get, u64::MAX)
            .times(1)
            .on_paths_containing("/wal/"),
    );
    let session = open_in_wal(&store).await;
    let captions = text(&session, "SELECT id, caption FROM media ORDER BY id").await;
    assert!(captions.contains("three"), "{captions}");
    let sizes = text(&session, "SELECT sum(blob_size(raw)) AS n FROM media").await;
    assert!(sizes.contains("| 24577 |"), "{sizes}");
    assert_eq!(store.matched_calls(), 0, "no entry read without the column");
    assert_eq!(text(&session, VALUES).await, before, "the same values back");
    assert_eq!(store.matched_calls(), 1, "one ranged read of the entry");
    store.clear();

    // Fresh rows read theirs from the entry too, in this process and in
    // another one that tails the WAL.
    run(
        &session,
        "INSERT INTO media VALUES (4, 'four', CAST(repeat('4', 9000) AS BYTEA))",
    )
    .await;
    let other = open_in_wal(&store).await;
    let fresh = "SELECT md5(raw) AS m FROM media WHERE id = 4";
    assert_eq!(text(&other, fresh).await, text(&session, fresh).await);
    assert_eq!(packed_entries(&store).await.len(), 2);

    // Every packed row replaced by a short value: once flushed, nothing
    // names either entry, and both go (the grace period is zero here).
    run(
        &session,
        "INSERT INTO media VALUES (1, 'one', CAST('a' AS BYTEA)), \
         (2, 'two', CAST('b' AS BYTEA)), (4, 'four', CAST('d' AS BYTEA))",
    )
    .await;
    session.close().await.unwrap();
    compact_media(&other).await;
    assert_eq!(packed_entries(&store).await, Vec::<(Path, u64)>::new());
    let after = text(&other, VALUES).await;
    assert_eq!(after.matches(" | 1 | ").count(), 4, "{after}");
    other.close().await.unwrap();
}

/// A failed append of an entry with its pack inside is one failure: the
/// puts fail, the next writer reads the table as before, and no entry
/// with a pack is left but the one that landed before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_append_with_its_pack_inside_leaves_its_rows_out() {
    let store = FaultyStore::new(Arc::new(InMemory::new()));
    let before = insert_failing_in(open_in_wal(&store).await, &store, "/wal/", 9).await;
    let session = open_in_wal(&store).await;
    assert_eq!(text(&session, VALUES).await, before, "row 9 is not there");
    session.close().await.unwrap();
    assert_eq!(packed_entries(&store).await.len(), 1);
    assert_eq!(packs(&store).await, Vec::<Path>::new());
}

/// A pack (here: WAL entries holding packs) nothing names any more is
/// deleted once the flush that passed it is a grace period old, by any
/// later writer: one that opens after the grace, not only one that lived
/// through it (found from outside: shells that each ran one INSERT kept
/// every replaced entry for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_writer_collects_packs_whose_grace_period_ended_meanwhile() {
    let store = FaultyStore::new(Arc::new(InMemory::new()));
    let grace = std::time::Duration::from_millis(500);
    let default = WriterOptions::default().blob_wal_pack_bytes;
    let graceful = |o: &mut WriterOptions| {
        o.blob_wal_pack_bytes = default;
        o.sstable_grace = grace;
    };
    let session = open_with(&store, graceful).await;
    create_media(&session).await;
    session.close().await.unwrap();
    let first = packed_entries(&store).await;
    assert_eq!(first.len(), 1, "{first:?}");

    // Rows 1 and 2 replaced and compacted (the first SSTable retired),
    // and row 7 written and replaced before its flush (never named).
    let session = open_with(&store, graceful).await;
    run(
        &session,
        "INSERT INTO media VALUES (1, 'one', CAST('a' AS BYTEA)), (2, 'two', CAST('b' AS BYTEA))",
    )
    .await;
    run(
        &session,
        "INSERT INTO media VALUES (7, 'seven', CAST(repeat('7', 9000) AS BYTEA))",
    )
    .await;
    run(
        &session,
        "INSERT INTO media VALUES (7, 'seven', CAST('7' AS BYTEA))",
    )
    .await;
    session.close().await.unwrap();
    let session = open_with(&store, graceful).await;
    compact_media(&session).await;
    session.close().await.unwrap();
    assert_eq!(packed_entries(&store).await.len(), 2, "within the grace");

    tokio::time::sleep(grace + std::time::Duration::from_millis(100)).await;
    let session = open_with(&store, graceful).await;
    run(&session, "INSERT INTO media VALUES (8, 'eight', NULL)").await;
    session.close().await.unwrap();
    assert_eq!(packed_entries(&store).await, Vec::<(Path, u64)>::new());
    let session = open_with(&store, graceful).await;
    let values = text(&session, VALUES).await;
    assert_eq!(values.matches(" | 1 | ").count(), 4, "{values}");
    session.close().await.unwrap();
}
