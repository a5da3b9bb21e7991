//! Damaged objects: every object of a root (catalog versions, shard
//! manifests, WAL entries and fences, SSTables, persisted graphs, hints) is
//! in turn truncated, bit-flipped, emptied and swapped with another object
//! of its kind, in a copy of the root; then a fresh session runs scans,
//! point lookups and a vector search. Each answer is either exactly the
//! undamaged one or a typed error naming a damaged object — never another
//! answer, never a panic.

use std::path::{Path, PathBuf};

use memwal::{MemwalSession, WriterOptions};

use crate::helpers::{files, run};

const QUERIES: &[&str] = &[
    "SELECT id, v, emb FROM t ORDER BY id",
    "SELECT id, v FROM t WHERE id = 7",
    "SELECT id, v FROM t WHERE id = 1030",
    "SELECT id FROM vector_search('t', 'emb', [3.0, 1.0], 3) ORDER BY id",
];

/// Each query's rows as text, or the error.
async fn answers(root: &str) -> Vec<Result<String, String>> {
    let session = match MemwalSession::open(root).await {
        Ok(session) => session,
        Err(e) => return vec![Err(e.to_string())],
    };
    let mut out = Vec::new();
    for sql in QUERIES {
        let result = async {
            let batches = session.sql(sql).await?.collect().await?;
            Ok::<_, memwal::Error>(
                datafusion::arrow::util::pretty::pretty_format_batches(&batches)?.to_string(),
            )
        };
        out.push(result.await.map_err(|e| e.to_string()));
    }
    out
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The kind of an object, by its place: swaps happen within a kind.
fn kind(relative: &str) -> &'static str {
    match relative {
        r if r.ends_with("_hint") => "hint",
        r if r.starts_with("__manifest/") => "catalog",
        r if r.contains("/manifest/") => "shard manifest",
        r if r.contains("/wal/") => "wal",
        r if r.ends_with(".parquet") => "sstable",
        r if r.ends_with(".hnsw") => "graph",
        _ => "other",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_objects_give_named_errors_never_other_answers() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let root_str = root.to_str().unwrap().to_string();
    {
        // Small MemTables: several SSTables (with graphs) per shard.
        let small = {
            let mut o = WriterOptions::default();
            o.memtable_bytes = 2_000;
            o.max_sstables = 3;
            o
        };
        let session = MemwalSession::open_with(&root_str, small).await.unwrap();
        session
            .sql("CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT, emb FLOAT[2]) WITH ('shards' = '2')")
            .await
            .unwrap();
        for batch in 0..6 {
            let values: Vec<String> = (0..20)
                .map(|r| {
                    let id = batch * 20 + r;
                    format!("({id}, 'v{id}', [{id}.0, 1.0])")
                })
                .collect();
            session
                .sql(&format!("INSERT INTO t VALUES {}", values.join(", ")))
                .await
                .unwrap()
                .collect()
                .await
                .unwrap();
        }
        session.close().await.unwrap();
    }
    {
        // More rows that stay in the WAL: a writer that never closes.
        let session = MemwalSession::open(&root_str).await.unwrap();
        session
            .sql("INSERT INTO t VALUES (1030, 'late', [3.0, 1.0]), (7, 'seven', [7.0, 1.0])")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        session
            .sql("INSERT INTO t VALUES (1031, 'later', [3.0, 1.1])")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        std::mem::forget(session);
    }
    let expected = answers(&root_str).await;
    for answer in &expected {
        assert!(answer.is_ok(), "undamaged: {answer:?}");
    }
    let objects: Vec<String> = files(&root)
        .iter()
        .map(|p| p.strip_prefix(&root).unwrap().to_str().unwrap().to_string())
        .collect();
    for kind_needed in [
        "catalog",
        "shard manifest",
        "wal",
        "sstable",
        "graph",
        "hint",
    ] {
        assert!(
            objects.iter().any(|o| kind(o) == kind_needed),
            "no {kind_needed} object to damage: {objects:?}"
        );
    }
    let mut cases = 0;
    let mut errors = 0;
    for (n, object) in objects.iter().enumerate() {
        let bytes = std::fs::read(root.join(object)).unwrap();
        let partner = objects.iter().find(|o| {
            *o != object && kind(o) == kind(object) && std::fs::read(root.join(o)).unwrap() != bytes
        });
        // What, new content (or a swap with the partner).
        type Damage<'a> = (&'static str, Option<Vec<u8>>, Option<&'a String>);
        let mut damages: Vec<Damage> = Vec::new();
        if !bytes.is_empty() {
            damages.push(("truncated", Some(bytes[..bytes.len() / 2].to_vec()), None));
            if bytes.len() > 8 {
                let end = bytes.len() - 8;
                damages.push(("cut short", Some(bytes[..end].to_vec()), None));
            }
            damages.push(("emptied", Some(Vec::new()), None));
            for at in [
                0,
                bytes.len() / 3,
                bytes.len() / 2,
                bytes.len() * 7 / 8,
                bytes.len() - 1,
            ] {
                let mut flipped = bytes.clone();
                flipped[at] ^= 1 << (n % 8);
                damages.push(("bit-flipped", Some(flipped), None));
            }
        }
        if let Some(partner) = partner {
            damages.push(("swapped", None, Some(partner)));
        }
        for (what, content, partner) in damages {
            let copy = dir.path().join(format!("case-{cases}"));
            copy_dir(&root, &copy);
            match (content, partner) {
                (Some(content), _) => std::fs::write(copy.join(object), content).unwrap(),
                (None, Some(partner)) => {
                    std::fs::write(
                        copy.join(object),
                        std::fs::read(root.join(partner)).unwrap(),
                    )
                    .unwrap();
                    std::fs::write(copy.join(partner), &bytes).unwrap();
                }
                (None, None) => unreachable!(),
            }
            let got = answers(copy.to_str().unwrap()).await;
            for (i, answer) in got.iter().enumerate() {
                match answer {
                    Ok(rows) => assert_eq!(
                        Ok(rows),
                        expected[i].as_ref(),
                        "{object} {what}: query {:?} gave another answer",
                        QUERIES.get(i)
                    ),
                    Err(e) => {
                        errors += 1;
                        // memwal's typed error for damage, naming the object.
                        let named = e.contains(&format!("corrupt object {object}"))
                            || partner.is_some_and(|p| e.contains(&format!("corrupt object {p}")));
                        assert!(named, "{object} {what}: not an error naming it: {e}");
                        // Saying what is wrong with it, not only a parser's words.
                        let says = [
                            "damaged",
                            "cut short",
                            "truncated",
                            "shorter than",
                            "another version",
                            "manifest entry records",
                        ];
                        assert!(
                            says.iter().any(|s| e.contains(s)),
                            "{object} {what}: the error does not say it is damaged: {e}"
                        );
                    }
                }
            }
            std::fs::remove_dir_all(&copy).unwrap();
            cases += 1;
        }
    }
    assert!(
        errors > cases,
        "damage was hardly ever noticed ({errors} errors in {cases} cases)"
    );
}

/// A graph file copied over another SSTable's graph of the same size decodes
/// fine: only the manifest's record of which graph it is tells them apart.
/// A search must then scan exactly (a small `ef` through the wrong graph's
/// links would miss neighbours), so it gives the exact answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graph_swapped_for_another_valid_one_never_changes_an_answer() {
    use datafusion::arrow::array::{AsArray, Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::Int64Type;
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    // One indexing thread: the same graphs every run, so the search of the
    // intact shard (approximate, with a small ef) gives the same answer.
    let one_thread = {
        let mut o = WriterOptions::default();
        o.index_threads = 1;
        o
    };
    let session = MemwalSession::open_with(&root, one_thread).await.unwrap();
    session
        .sql("CREATE TABLE g (id BIGINT PRIMARY KEY, emb FLOAT[4]) WITH ('shards' = '2')")
        .await
        .unwrap();
    let table = session.table("g").await.unwrap();
    // 2,000 rows in each shard: graphs of the same size.
    let key_schema = Arc::new(table.schema().project(&[0]).unwrap());
    let mut ids = [Vec::new(), Vec::new()];
    for id in 0i64.. {
        let key = RecordBatch::try_new(
            Arc::clone(&key_schema),
            vec![Arc::new(Int64Array::from(vec![id]))],
        )
        .unwrap();
        let shard = table.shard_of(&key).unwrap() as usize;
        if ids[shard].len() < 2_000 {
            ids[shard].push(id);
        }
        if ids.iter().all(|s| s.len() == 2_000) {
            break;
        }
    }
    // Scattered vectors: element i of row id from a multiplicative hash.
    let element = |id: i64, i: i64| {
        let h = ((id * 4 + i) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
        (h % 100_000) as f32 / 100.0
    };
    let values: Vec<String> = ids
        .iter()
        .flatten()
        .map(|&id| {
            let v: Vec<String> = (0..4).map(|i| format!("{:.2}", element(id, i))).collect();
            format!("({id}, [{}])", v.join(", "))
        })
        .collect();
    run(
        &session,
        &format!("INSERT INTO g VALUES {}", values.join(", ")),
    )
    .await;
    session.close().await.unwrap();

    let graphs: Vec<PathBuf> = files(dir.path())
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "hnsw"))
        .collect();
    assert_eq!(graphs.len(), 2, "one SSTable with a graph per shard");
    std::fs::copy(&graphs[0], &graphs[1]).unwrap();

    let session = MemwalSession::open(&root).await.unwrap();
    let ids_of = |batches: Vec<RecordBatch>| -> Vec<i64> {
        batches
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect()
    };
    for q in 0..20 {
        let query: Vec<String> = (0..4)
            .map(|i| format!("{:.3}", element(100_000 + q, i) + 0.005))
            .collect();
        let query = query.join(", ");
        let search = session
            .sql(&format!(
                "SELECT id FROM vector_search('g', 'emb', [{query}], 5, 8) ORDER BY _distance, id"
            ))
            .await
            .unwrap()
            .collect()
            .await;
        let exact = run(
            &session,
            &format!("SELECT id FROM g ORDER BY l2_distance(emb, [{query}]), id LIMIT 5"),
        )
        .await;
        match search {
            Ok(found) => assert_eq!(ids_of(found), ids_of(exact), "query [{query}]"),
            Err(e) => assert!(e.to_string().contains("corrupt object"), "{e}"),
        }
    }
    session.close().await.unwrap();
}

/// The newest shard manifest version deleted while the WAL holds entries
/// of the writer that version claimed the shard for: an error naming the
/// missing version, not a commit conflict among writers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_newest_shard_manifest_version_is_named() {
    use std::io::{BufRead, BufReader, Write};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    let session = MemwalSession::open(&root).await.unwrap();
    run(
        &session,
        "CREATE TABLE t (id BIGINT PRIMARY KEY) WITH ('shards' = '1')",
    )
    .await;
    run(&session, "INSERT INTO t VALUES (1), (2)").await;
    session.close().await.unwrap();
    // A shell claims the shard (a new manifest version) and is killed with
    // its row in the WAL.
    let mut shell = std::process::Command::new(env!("CARGO_BIN_EXE_memwal"))
        .args(["--root", &root, "-q"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = shell.stdin.take().unwrap();
    stdin.write_all(b"INSERT INTO t VALUES (3);\n").unwrap();
    let mut stdout = BufReader::new(shell.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("| 1 ") {
        line.clear();
        assert_ne!(stdout.read_line(&mut line).unwrap(), 0, "no INSERT count");
    }
    shell.kill().unwrap();
    shell.wait().unwrap();
    let newest = files(dir.path())
        .into_iter()
        .filter(|p| p.to_str().unwrap().contains("/shards/0/manifest/v"))
        .max()
        .unwrap();
    std::fs::remove_file(&newest).unwrap();
    let session = MemwalSession::open(&root).await.unwrap();
    let err = match session.sql("SELECT count(*) FROM t").await {
        Ok(frame) => frame.collect().await.unwrap_err().to_string(),
        Err(e) => e.to_string(),
    };
    let name = newest.strip_prefix(dir.path()).unwrap().to_str().unwrap();
    assert!(
        err.contains(&format!("corrupt object {name}: missing")),
        "{err}"
    );
}

/// An SSTable the shard manifest names that is gone is named as a
/// corrupt object by every statement that reads it and by the flush that
/// marks it (found from outside: each gave the store's raw "not found").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_sstable_is_named_by_every_statement() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    let session = MemwalSession::open(&root).await.unwrap();
    run(
        &session,
        "CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT, emb FLOAT[2]) WITH ('shards' = '1')",
    )
    .await;
    run(
        &session,
        "INSERT INTO t VALUES (1, 'a', [1.0, 0.0]), (2, 'b', [0.0, 1.0])",
    )
    .await;
    session.close().await.unwrap();
    let data = files(dir.path())
        .into_iter()
        .find(|p| p.to_str().unwrap().ends_with("data.parquet"))
        .unwrap();
    std::fs::remove_file(&data).unwrap();
    let name = data.strip_prefix(dir.path()).unwrap().to_str().unwrap();
    let session = MemwalSession::open(&root).await.unwrap();
    for sql in [
        "SELECT * FROM t",
        "SELECT v FROM t WHERE id = 1",
        "SELECT id FROM vector_search('t', 'emb', [1.0, 0.0], 1)",
        "DELETE FROM t WHERE id = 2",
    ] {
        let err = match session.sql(sql).await {
            Ok(frame) => frame.collect().await.unwrap_err().to_string(),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains(&format!("corrupt object {name}: missing")),
            "{sql}: {err}"
        );
    }
    // A write is acknowledged (it is in the WAL); the flush at close marks
    // the rows it makes old in the lost SSTable, and names it.
    run(&session, "INSERT INTO t VALUES (1, 'c', [0.0, 0.0])").await;
    let err = session.close().await.unwrap_err().to_string();
    assert!(
        err.contains(&format!("corrupt object {name}: missing")),
        "{err}"
    );
}

/// A read whose bytes are damaged on their way (one bit flipped, the
/// object intact, as over plain HTTP) is read again: a catalog checkpoint,
/// a shard manifest version, a WAL entry, an SSTable, a blob pack and a
/// deletion vector each give the right answer, while the same damage on
/// every read is still reported (found from outside over S3: a response
/// damaged in transit read as "checksum mismatch: the version is damaged").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_damaged_on_their_way_are_read_again() {
    use std::sync::Arc;

    use memwal::testing::{Fault, FaultyStore, OpKind};
    use memwal::{Catalog, CatalogOptions, ObjectRoot};
    use object_store::ObjectStore;

    let inner: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    // Packs objects of their own, or (the default) inside WAL entries.
    let open_with = |store: Arc<dyn ObjectStore>, own_packs: bool| async move {
        let root = ObjectRoot::new(store, "memory://garbled");
        let catalog = Catalog::open(root, CatalogOptions::default()).await?;
        let mut options = WriterOptions::default();
        if own_packs {
            options.blob_wal_pack_bytes = 0;
        }
        Ok::<_, memwal::Error>(MemwalSession::new(catalog, options))
    };
    let open = |store: Arc<dyn ObjectStore>| open_with(store, false);
    // Rows in SSTables (flushed by a close), and one in the WAL of a
    // writer that stays open meanwhile.
    let writing = open_with(Arc::clone(&inner), true).await.unwrap();
    run(
        &writing,
        "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT, img BYTEA) \
         WITH ('shards' = '2', 'img.blob' = 'true')",
    )
    .await;
    run(
        &writing,
        "INSERT INTO t SELECT value, value * 2, CAST(repeat('x', 5000 + value) AS BYTEA) \
         FROM generate_series(1, 1000)",
    )
    .await;
    writing.table("t").await.unwrap().close().await.unwrap();
    // A deletion vector over the SSTables: a delete of flushed rows, flushed.
    let writing = open(Arc::clone(&inner)).await.unwrap();
    run(&writing, "DELETE FROM t WHERE id <= 10").await;
    // And a value packed inside its WAL entry, flushed.
    let packed = "CAST(repeat('z', 7000) AS BYTEA)";
    run(
        &writing,
        &format!("INSERT INTO t VALUES (4000, 2, {packed})"),
    )
    .await;
    writing.table("t").await.unwrap().close().await.unwrap();
    let writing = open(Arc::clone(&inner)).await.unwrap();
    run(
        &writing,
        &format!("INSERT INTO t VALUES (5000, 1, {packed})"),
    )
    .await;

    let sql = "SELECT count(*) AS n, sum(v) AS s, max(md5(img)) AS m FROM t";
    let expected = pretty(&run(&writing, sql).await);
    let answer = |faulty: Arc<FaultyStore>| async move {
        let frame = open(faulty).await?.sql(sql).await?;
        Ok::<_, memwal::Error>(pretty(&frame.collect().await?))
    };
    for needle in [
        "__manifest/checkpoints/",
        "/manifest/v",
        "/wal/",
        "data.parquet",
        ".pack",
        "/deletions-",
    ] {
        // Damaged on every read: reported as damage.
        let faulty = FaultyStore::new(Arc::clone(&inner));
        let garbled = Fault::nth(OpKind::Get, 1)
            .garbled()
            .on_paths_containing(needle);
        faulty.inject(garbled.clone().times(u64::MAX));
        let err = answer(faulty).await.unwrap_err().to_string();
        assert!(err.contains("corrupt object"), "{needle}: {err}");
        // Damaged once: read again, and right.
        let faulty = FaultyStore::new(Arc::clone(&inner));
        faulty.inject(garbled);
        let got = answer(faulty).await.map_err(|e| e.to_string());
        assert_eq!(got, Ok(expected.clone()), "{needle}");
    }
}

fn pretty(batches: &[datafusion::arrow::array::RecordBatch]) -> String {
    datafusion::arrow::util::pretty::pretty_format_batches(batches)
        .unwrap()
        .to_string()
}
