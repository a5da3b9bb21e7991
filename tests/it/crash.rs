//! SIGKILL at random instants: a child process performs durable inserts and
//! prints each acknowledgement; the parent kills it, then checks that every
//! acknowledged row is there with its last acknowledged value (or a newer
//! one the child had issued) and that value's blob (stored out of line in
//! blob packs: MemTables are small, so kills land between packs, WAL
//! entries, flushes and pack collection), and that no row appears twice.
//!
//! `MEMWAL_CRASH_ITERATIONS` sets the number of kills (default 20; 1,000
//! for a soak).

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{ArrayRef, AsArray, BinaryArray, Int64Array, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::datatypes::Int64Type;
use memwal::{MemwalSession, WriterOptions};
use rand::Rng;

const CHILD_ENV: &str = "MEMWAL_CRASH_CHILD_ROOT";
const BASE_ENV: &str = "MEMWAL_CRASH_CHILD_BASE";
const TASKS: i64 = 6;
const KEYS_PER_TASK: i64 = 40;

/// The blob stored with `value`: 4–12 KiB derived from it, mostly above
/// the default 4 KiB inline limit.
fn blob_of(value: i64) -> Vec<u8> {
    let len = 4_000 + (value.unsigned_abs() % 8_192) as usize;
    value
        .to_le_bytes()
        .iter()
        .copied()
        .cycle()
        .take(len)
        .collect()
}

/// The child: `TASKS` tasks each upsert their own keys in turn, one
/// durable put at a time, with ever-growing values, and append one event row
/// per acknowledged put. Prints `issue`/`ack` lines. Runs until killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of crash::sigkill_never_loses_an_acknowledged_row"]
async fn crash_child() {
    let root = std::env::var(CHILD_ENV).expect("run by the crash test");
    let base: i64 = std::env::var(BASE_ENV).unwrap().parse().unwrap();
    let options = {
        let mut o = WriterOptions::default();
        o.wal_flush_interval = Duration::from_millis(5);
        o.memtable_bytes = 64 << 10;
        // Every other child writes each group's pack as an object of its
        // own instead of inside its WAL entry.
        if (base / 1_000_000) % 2 == 1 {
            o.blob_wal_pack_bytes = 0;
        }
        o
    };
    let session = MemwalSession::open_with(&root, options).await.unwrap();
    let kv = session.table("kv").await.unwrap();
    let events = session.table("events").await.unwrap();
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (kv, events) = (Arc::clone(&kv), Arc::clone(&events));
            tokio::spawn(async move {
                for i in 0.. {
                    let key = task * KEYS_PER_TASK + i % KEYS_PER_TASK;
                    let value = base + i;
                    println!("issue {key} {value}");
                    let blob: ArrayRef = Arc::new(BinaryArray::from(vec![&blob_of(value)[..]]));
                    let row = RecordBatch::try_new(
                        kv.schema(),
                        vec![
                            Arc::new(Int64Array::from(vec![key])),
                            Arc::new(Int64Array::from(vec![value])),
                            cast(&blob, kv.schema().field(2).data_type()).unwrap(),
                        ],
                    )
                    .unwrap();
                    kv.put(&row).await.unwrap();
                    println!("ack {key} {value}");
                    let event = RecordBatch::try_new(
                        events.schema(),
                        vec![
                            Arc::new(Int64Array::from(vec![task])),
                            Arc::new(Int64Array::from(vec![value])),
                        ],
                    )
                    .unwrap();
                    println!("issue-event {task} {value}");
                    events.put(&event).await.unwrap();
                    println!("ack-event {task} {value}");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

#[derive(Default)]
struct Expected {
    /// Key → (last acknowledged value, last issued value).
    kv: HashMap<i64, (Option<i64>, i64)>,
    /// Event rows acknowledged, and issued but not acknowledged.
    acked_events: Vec<(i64, i64)>,
    unacked_events: Vec<(i64, i64)>,
}

fn parse(stdout: &str, expected: &mut Expected) {
    let mut pending_events = BTreeMap::new();
    for line in stdout.lines() {
        // The harness may print its own text before the first line.
        let parts: Vec<&str> = line.split(' ').collect();
        let [.., kind, a, b] = parts.as_slice() else {
            continue;
        };
        let (Ok(a), Ok(b)) = (a.parse::<i64>(), b.parse::<i64>()) else {
            continue; // the line the kill cut short
        };
        match *kind {
            "issue" => expected.kv.entry(a).or_insert((None, b)).1 = b,
            "ack" => expected.kv.get_mut(&a).expect("ack after issue").0 = Some(b),
            "issue-event" => {
                pending_events.insert((a, b), ());
            }
            "ack-event" => {
                pending_events.remove(&(a, b));
                expected.acked_events.push((a, b));
            }
            _ => {}
        }
    }
    expected.unacked_events.extend(pending_events.into_keys());
}

fn pairs(batches: &[RecordBatch]) -> Vec<(i64, i64)> {
    batches
        .iter()
        .flat_map(|b| {
            let x = b.column(0).as_primitive::<Int64Type>().clone();
            let y = b.column(1).as_primitive::<Int64Type>().clone();
            (0..b.num_rows()).map(move |i| (x.value(i), y.value(i)))
        })
        .collect()
}

async fn verify(root: &str, expected: &Expected, iteration: usize) {
    let session = MemwalSession::open(root).await.unwrap();
    let batches = session.table("kv").await.unwrap().scan().await.unwrap();
    for b in &batches {
        let values = b.column(1).as_primitive::<Int64Type>();
        let blobs = cast(b.column(2), &DataType::Binary).unwrap();
        for (row, blob) in blobs.as_binary::<i32>().iter().enumerate() {
            let value = values.value(row);
            assert!(
                blob == Some(&blob_of(value)[..]),
                "iteration {iteration}: the blob of value {value} is wrong"
            );
        }
    }
    let kv = pairs(&batches);
    let mut seen = HashMap::new();
    for (key, value) in &kv {
        assert!(
            seen.insert(*key, *value).is_none(),
            "iteration {iteration}: key {key} appears twice"
        );
    }
    for (key, (acked, issued)) in &expected.kv {
        let Some(acked) = acked else { continue };
        let got = seen.get(key).copied();
        assert!(
            got.is_some_and(|v| v >= *acked && v <= *issued),
            "iteration {iteration}: key {key} acknowledged with {acked} (issued up to {issued}), found {got:?}"
        );
    }

    let events = pairs(&session.table("events").await.unwrap().scan().await.unwrap());
    let mut counts: HashMap<(i64, i64), usize> = HashMap::new();
    for e in events {
        *counts.entry(e).or_default() += 1;
    }
    for (event, n) in &counts {
        assert_eq!(
            *n, 1,
            "iteration {iteration}: event {event:?} appears {n} times"
        );
        assert!(
            expected.acked_events.contains(event) || expected.unacked_events.contains(event),
            "iteration {iteration}: event {event:?} was never issued"
        );
    }
    for event in &expected.acked_events {
        assert!(
            counts.contains_key(event),
            "iteration {iteration}: acknowledged event {event:?} lost"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_never_loses_an_acknowledged_row() {
    let iterations: usize = std::env::var("MEMWAL_CRASH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    {
        let session = MemwalSession::open(&root).await.unwrap();
        for ddl in [
            "CREATE TABLE kv (id BIGINT PRIMARY KEY, v BIGINT, img BYTEA) WITH ('img.blob' = 'true')",
            "CREATE TABLE events (task BIGINT, v BIGINT)",
        ] {
            session.sql(ddl).await.unwrap();
        }
    }
    let mut expected = Expected::default();
    let mut rng = rand::rng();
    let mut total_acks = 0;
    for iteration in 0..iterations {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "crash::crash_child",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &root)
            .env(BASE_ENV, (iteration as i64 * 1_000_000).to_string())
            .env("RUST_BACKTRACE", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (first_ack, acked) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut all = String::new();
            let mut stdout = BufReader::new(stdout);
            // Only whole lines count.
            while let Ok(n) = stdout.read_line(&mut all)
                && n > 0
                && all.ends_with('\n')
            {
                if all[all.len() - n..].starts_with("ack ") {
                    let _ = first_ack.send(());
                }
            }
            all.truncate(all.rfind('\n').map_or(0, |end| end + 1));
            all
        });
        // The kill instant counts from the child's first acknowledgement, so
        // a slow start on a loaded machine does not shrink what it writes.
        let _ = acked.recv_timeout(Duration::from_secs(60));
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..500))).await;
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let out = reader.join().unwrap();
        total_acks += out.lines().filter(|l| l.starts_with("ack ")).count();
        parse(&out, &mut expected);
        verify(&root, &expected, iteration).await;
    }
    assert!(
        total_acks > iterations,
        "the children acknowledged almost nothing ({total_acks} acks): the test proves little"
    );
    // The kills fell among blob packs (inside WAL entries, or objects of
    // their own) and flushed SSTables, not only WAL entries.
    let files = crate::helpers::files(dir.path());
    let with = |ext: &str| files.iter().any(|f| f.to_string_lossy().ends_with(ext));
    let packed_entry = files.iter().any(|f| {
        f.to_string_lossy().contains("/wal/")
            && std::fs::read(f).is_ok_and(|bytes| bytes.ends_with(b"MWL3"))
    });
    assert!(
        (with(".pack") || packed_entry) && with(".parquet"),
        "no blob pack or no SSTable was written"
    );
}
