//! A statement is all or nothing per shard, across crashes: `memwal`
//! shell processes run large DELETEs and INSERT ... SELECTs and are
//! SIGKILLed at random instants; afterwards every shard holds exactly its rows from before the
//! statement or exactly its rows from after it. The same holds for bulk
//! loads (INSERTs larger than `load_memory_bytes`, which go through
//! SSTables).

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{AsArray, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::Int64Type;
use memwal::{MemwalSession, Table};
use rand::Rng;

use crate::helpers::run;

/// id → v of one shard.
type Rows = BTreeMap<i64, i64>;

async fn shard_rows(table: &Table) -> Vec<Rows> {
    let mut shards = Vec::new();
    for shard in 0..table.shard_count() as u32 {
        let mut rows = Rows::new();
        for b in table.scan_shard(shard).await.unwrap() {
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
        shards.push(rows);
    }
    shards
}

/// SIGKILLs at an instant that adapts until kills land both before and
/// after the statements' commits (so a test cannot pass by always
/// missing); counts the shards found as before and as after.
struct Kills {
    rng: rand::rngs::ThreadRng,
    delay_ms: f64,
    rounds: usize,
    before: usize,
    after: usize,
}

impl Kills {
    fn new() -> Self {
        Self {
            rng: rand::rng(),
            delay_ms: 300.0,
            rounds: 0,
            before: 0,
            after: 0,
        }
    }

    /// Whether to run another round: at least `min`, then (up to 40)
    /// until both outcomes were seen.
    fn more(&self, min: usize) -> bool {
        self.rounds < min || (self.rounds < 40 && (self.before == 0 || self.after == 0))
    }

    /// Kills `child` (a no-op if it finished) after the delay, jittered.
    async fn kill(&mut self, mut child: Child) {
        let jitter = self.rng.random_range(0.5..1.5);
        tokio::time::sleep(Duration::from_secs_f64(self.delay_ms * jitter / 1000.0)).await;
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Records a round's shards found as before and as after, and moves
    /// the delay towards the commits.
    fn record(&mut self, before: usize, after: usize) {
        self.before += before;
        self.after += after;
        self.rounds += 1;
        if after == 0 {
            self.delay_ms = (self.delay_ms * 1.5).min(10_000.0); // too early
        } else if before == 0 {
            self.delay_ms = (self.delay_ms / 1.5).max(5.0); // too late
        }
    }

    fn check(&self, what: &str) {
        let (before, after) = (self.before, self.after);
        eprintln!("shards found as before the {what}: {before}, as after it: {after}");
        assert!(
            before > 0 && after > 0,
            "{} kills never split before/after ({before}/{after})",
            self.rounds
        );
    }
}

/// What a statement does to the rows.
type Effect = Box<dyn Fn(&Rows) -> Rows>;

/// The SQL of statement `i` on `table`, and what it does to the rows.
fn statement(i: usize, table: &str) -> (String, Effect) {
    match i % 3 {
        0 => {
            let m = (i % 7 + 2) as i64;
            (
                format!("DELETE FROM {table} WHERE id % {m} = 0"),
                Box::new(move |rows: &Rows| {
                    rows.iter()
                        .filter(|(id, _)| *id % m != 0)
                        .map(|(k, v)| (*k, *v))
                        .collect()
                }),
            )
        }
        1 => {
            let base = 10_000_000 * (i as i64 + 1);
            (
                format!("INSERT INTO {table} SELECT id + {base}, v FROM {table} WHERE id % 3 = 1"),
                Box::new(move |rows: &Rows| {
                    let mut out = rows.clone();
                    for (id, v) in rows.iter().filter(|(id, _)| *id % 3 == 1) {
                        out.insert(id + base, *v);
                    }
                    out
                }),
            )
        }
        _ => (
            // An update of every row: upserts of existing keys.
            format!("INSERT INTO {table} SELECT id, v + 1 FROM {table}"),
            Box::new(|rows: &Rows| rows.iter().map(|(k, v)| (*k, v + 1)).collect()),
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_killed_at_random_instants_are_all_or_none_per_shard() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    let rows: i64 = 60_000;
    {
        let session = MemwalSession::open(&root).await.unwrap();
        for (name, shards) in [("one", 1), ("four", 4)] {
            session
                .sql(&format!(
                    "CREATE TABLE {name} (id BIGINT PRIMARY KEY, v BIGINT) WITH ('shards' = '{shards}')"
                ))
                .await
                .unwrap();
            let table = session.table(name).await.unwrap();
            let batch = RecordBatch::try_new(
                table.schema(),
                vec![
                    Arc::new(Int64Array::from_iter_values(0..rows)),
                    Arc::new(Int64Array::from_iter_values(0..rows)),
                ],
            )
            .unwrap();
            assert_eq!(table.put(&batch).await.unwrap(), rows as u64);
        }
        session.close().await.unwrap();
    }
    let mut kills = Kills::new();
    while kills.more(8) {
        let i = kills.rounds;
        let name = ["one", "four"][i % 2];
        let (sql, apply) = statement(i, name);
        let expected_before = {
            let session = MemwalSession::open(&root).await.unwrap();
            shard_rows(&session.table(name).await.unwrap()).await
        };
        let child = Command::new(env!("CARGO_BIN_EXE_memwal"))
            .args(["--root", &root, "-q", "-c", &sql])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        kills.kill(child).await;

        let session = MemwalSession::open(&root).await.unwrap();
        let table = session.table(name).await.unwrap();
        let got = shard_rows(&table).await;
        let (mut before, mut after) = (0, 0);
        // Which shard each key of the "after" state belongs to.
        let whole_after = apply(
            &expected_before
                .iter()
                .flatten()
                .map(|(k, v)| (*k, *v))
                .collect(),
        );
        for (shard, (got, was)) in got.iter().zip(&expected_before).enumerate() {
            let will: Rows = whole_after
                .iter()
                .filter(|(id, _)| {
                    let key = RecordBatch::try_new(
                        Arc::new(table.schema().project(&[0]).unwrap()),
                        vec![Arc::new(Int64Array::from(vec![**id]))],
                    )
                    .unwrap();
                    table.shard_of(&key).unwrap() as usize == shard
                })
                .map(|(k, v)| (*k, *v))
                .collect();
            if got == was && was != &will {
                before += 1;
            } else if got == &will {
                after += 1;
            } else {
                panic!(
                    "statement {i} ({sql}), shard {shard}: {} rows, neither the {} before nor the {} after",
                    got.len(),
                    was.len(),
                    will.len()
                );
            }
        }
        session.close().await.unwrap();
        kills.record(before, after);
    }
    kills.check("statement");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_loads_killed_at_random_instants_are_all_or_none_per_shard() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    let rows: i64 = 300_000;
    let shell = |sql: &str| {
        // A 1 MiB budget: several sorted runs per shard, merged, committed.
        Command::new(env!("CARGO_BIN_EXE_memwal"))
            .args(["--root", &root, "-q", "--option", "load_memory_bytes=1MiB"])
            .args(["-c", sql])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let create = "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT) WITH ('shards' = '4')";
    assert!(shell(create).wait().unwrap().success());
    let load =
        |v: usize| format!("INSERT INTO t SELECT value, {v} FROM generate_series(1, {rows})");
    assert!(shell(&load(0)).wait().unwrap().success());
    let mut kills = Kills::new();
    let mut version = 0;
    while kills.more(6) {
        let i = kills.rounds;
        kills.kill(shell(&load(version + 1))).await;

        // Every shard holds all its rows, each of one version: the one
        // before the load or the load's.
        let session = MemwalSession::open(&root).await.unwrap();
        let table = session.table("t").await.unwrap();
        let (mut before, mut after) = (0, 0);
        let mut total = 0;
        for (shard, got) in shard_rows(&table).await.iter().enumerate() {
            total += got.len() as i64;
            let versions: std::collections::BTreeSet<i64> = got.values().copied().collect();
            match versions.into_iter().collect::<Vec<_>>()[..] {
                [v] if v == version as i64 => before += 1,
                [v] if v == version as i64 + 1 => after += 1,
                ref other => panic!("load {i}, shard {shard}: versions {other:?}"),
            }
        }
        assert_eq!(total, rows, "load {i}");
        session.close().await.unwrap();
        if after > 0 {
            // Bring every shard to the load's version; the next load is
            // one newer.
            version += 1;
            let session = MemwalSession::open(&root).await.unwrap();
            run(&session, &load(version)).await;
            session.close().await.unwrap();
        }
        kills.record(before, after);
    }
    kills.check("load");
}
