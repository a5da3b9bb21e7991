//! Soak: `--writers` writer processes and `--readers` reader processes work
//! on one table of a local root for `--seconds`, while the parent SIGKILLs a
//! random child every `--kill-every-ms` on average (0: never) and starts it
//! again. Writers run SQL statements (multi-row upserts and deletes of their
//! own keys) through `MemwalSession` and print each statement before and
//! after it succeeds; readers check that no key is ever seen twice. At the
//! end the parent checks every key against a model built from what the
//! writers printed: each key holds the value of its last acknowledged
//! statement, or of a later one that was in flight when its writer was
//! killed. Prints one JSON object; exits non-zero if anything acknowledged
//! was lost, a key was duplicated or a statement of a live process failed.
//!
//! ```text
//! cargo run --release --example soak -- --writers 4 --readers 2 --seconds 1800
//! ```

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::Int64Type;
use memwal::{MemwalSession, WriterOptions};
use rand::Rng;

#[derive(Debug, Parser)]
struct Args {
    /// Writer processes.
    #[arg(long, default_value_t = 4)]
    writers: usize,
    /// Reader processes.
    #[arg(long, default_value_t = 2)]
    readers: usize,
    /// How long the children run.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Mean time between SIGKILLs of a random child (0: no kills).
    #[arg(long, default_value_t = 2000)]
    kill_every_ms: u64,
    /// Shards of the table.
    #[arg(long, default_value_t = 2)]
    shards: u32,
    /// Keys each writer owns.
    #[arg(long, default_value_t = 2000)]
    keys_per_writer: i64,
    /// Rows per statement.
    #[arg(long, default_value_t = 20)]
    rows_per_statement: usize,
    /// MemTable size of the writers in MiB (small: flushes and compactions
    /// happen during the run).
    #[arg(long, default_value_t = 1)]
    memtable_mb: usize,
    /// WAL group-commit interval of the writers in milliseconds (0: latency
    /// mode).
    #[arg(long, default_value_t = 100)]
    interval_ms: u64,
    /// Root directory (default: a fresh temporary one).
    #[arg(long)]
    root: Option<String>,
    /// Internal: the role of a child process (`writer` or `reader`).
    #[arg(long, hide = true)]
    role: Option<String>,
    /// Internal: a child's number.
    #[arg(long, hide = true, default_value_t = 0)]
    id: i64,
    /// Internal: a writer's first statement number.
    #[arg(long, hide = true, default_value_t = 0)]
    base: i64,
}

const TABLE: &str = "soak";

fn writer_options(args: &Args) -> WriterOptions {
    let mut o = WriterOptions::default();
    o.memtable_bytes = args.memtable_mb << 20;
    o.max_unflushed_bytes = (args.memtable_mb << 20).max(8 << 20) * 4;
    o.wal_flush_interval = Duration::from_millis(args.interval_ms);
    o
}

/// A writer: statement `n` (numbered from `--base`) upserts rows with value
/// `n` or deletes rows, on keys `id + writers * k`. Prints `issue n op keys`
/// before and `ack n` after it succeeds, `fail n error` if it fails.
async fn writer(args: &Args, root: &str) {
    let session = MemwalSession::open_with(root, writer_options(args))
        .await
        .expect("open the root");
    let mut rng = rand::rng();
    let stride = args.writers as i64;
    for n in args.base.. {
        let mut keys: Vec<i64> = (0..args.rows_per_statement)
            .map(|_| args.id + stride * rng.random_range(0..args.keys_per_writer))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let list = keys
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let (op, sql) = if rng.random_bool(0.8) {
            let values = keys
                .iter()
                .map(|k| format!("({k}, {n})"))
                .collect::<Vec<_>>()
                .join(", ");
            ("put", format!("INSERT INTO {TABLE} VALUES {values}"))
        } else {
            ("del", format!("DELETE FROM {TABLE} WHERE id IN ({list})"))
        };
        println!("issue {n} {op} {list}");
        match run(&session, &sql).await {
            Ok(_) => println!("ack {n}"),
            Err(e) => println!("fail {n} {}", e.to_string().replace('\n', " ")),
        }
    }
}

/// A reader: full scans that must never show a key twice, and point
/// lookups. Prints `read`, `dup id`, or `fail error`.
async fn reader(root: &str) {
    let session = MemwalSession::open(root).await.expect("open the root");
    let mut rng = rand::rng();
    loop {
        let sql = match rng.random_bool(0.5) {
            true => {
                format!("SELECT id, count(*) AS n FROM {TABLE} GROUP BY id HAVING count(*) > 1")
            }
            false => format!(
                "SELECT id, v FROM {TABLE} WHERE id = {}",
                rng.random_range(0..10_000)
            ),
        };
        match run(&session, &sql).await {
            Ok(batches) if sql.contains("GROUP BY") => {
                for b in &batches {
                    for id in b.column(0).as_primitive::<Int64Type>().values() {
                        println!("dup {id}");
                    }
                }
                println!("read");
            }
            Ok(_) => println!("read"),
            Err(e) => println!("fail {}", e.to_string().replace('\n', " ")),
        }
    }
}

/// Runs one statement to the end.
async fn run(
    session: &MemwalSession,
    sql: &str,
) -> memwal::Result<Vec<datafusion::arrow::array::RecordBatch>> {
    Ok(session.sql(sql).await?.collect().await?)
}

/// One statement a writer issued.
struct Statement {
    put: bool,
    keys: Vec<i64>,
    acked: bool,
}

#[derive(Default)]
struct Model {
    /// By statement number (unique across writers and incarnations).
    statements: HashMap<i64, Statement>,
    acked: u64,
    failures: Vec<String>,
    reads: u64,
    duplicates: Vec<i64>,
}

impl Model {
    fn take(&mut self, line: &str) {
        let mut parts = line.splitn(4, ' ');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some("issue"), Some(n), Some(op), Some(keys)) => {
                let keys = keys.split(',').filter_map(|k| k.parse().ok()).collect();
                if let Ok(n) = n.parse() {
                    self.statements.insert(
                        n,
                        Statement {
                            put: op == "put",
                            keys,
                            acked: false,
                        },
                    );
                }
            }
            (Some("ack"), Some(n), None, None) => {
                if let Some(s) = n.parse().ok().and_then(|n| self.statements.get_mut(&n)) {
                    s.acked = true;
                    self.acked += 1;
                }
            }
            (Some("fail"), ..) => self.failures.push(line.to_string()),
            (Some("read"), ..) => self.reads += 1,
            (Some("dup"), Some(id), ..) => self.duplicates.extend(id.parse::<i64>().ok()),
            _ => {}
        }
    }

    /// For every key: the values it may hold (`None`: absent) — after its
    /// last acknowledged statement or any later one.
    fn allowed(&self) -> HashMap<i64, Vec<Option<i64>>> {
        let mut by_key: HashMap<i64, Vec<(i64, bool, bool)>> = HashMap::new();
        for (&n, s) in &self.statements {
            for &k in &s.keys {
                by_key.entry(k).or_default().push((n, s.put, s.acked));
            }
        }
        by_key
            .into_iter()
            .map(|(k, mut ops)| {
                ops.sort_unstable();
                let from = ops.iter().rposition(|(_, _, acked)| *acked);
                let mut allowed: Vec<Option<i64>> = Vec::new();
                if from.is_none() {
                    allowed.push(None);
                }
                for &(n, put, _) in &ops[from.unwrap_or(0)..] {
                    allowed.push(put.then_some(n));
                }
                (k, allowed)
            })
            .collect()
    }
}

struct Children {
    exe: std::path::PathBuf,
    args: Vec<String>,
    model: Arc<Mutex<Model>>,
    /// (role, id, process).
    running: Vec<(&'static str, i64, Child)>,
    readers: Vec<std::thread::JoinHandle<()>>,
    incarnations: i64,
}

impl Children {
    fn spawn(&mut self, role: &'static str, id: i64) {
        self.incarnations += 1;
        let mut child = Command::new(&self.exe)
            .args(&self.args)
            .args(["--role", role, "--id", &id.to_string()])
            .args(["--base", &(self.incarnations * 1_000_000_000).to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn a child");
        let stdout = child.stdout.take().expect("piped");
        let model = Arc::clone(&self.model);
        self.readers.push(std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                model.lock().expect("model").take(&line);
            }
        }));
        self.running.push((role, id, child));
    }

    fn kill(&mut self, at: usize) -> (&'static str, i64) {
        let (role, id, mut child) = self.running.swap_remove(at);
        let _ = child.kill();
        let _ = child.wait();
        (role, id)
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let root = args
        .root
        .clone()
        .unwrap_or_else(|| dir.path().to_str().expect("utf-8 path").to_string());
    match args.role.as_deref() {
        Some("writer") => return writer(&args, &root).await,
        Some("reader") => return reader(&root).await,
        _ => {}
    }
    {
        let session = MemwalSession::open(&root).await.expect("open the root");
        session
            .sql(&format!(
                "CREATE TABLE {TABLE} (id BIGINT PRIMARY KEY, v BIGINT) WITH ('shards' = '{}')",
                args.shards
            ))
            .await
            .expect("create the table");
    }
    let mut forwarded: Vec<String> = vec!["--root".into(), root.clone()];
    for (flag, value) in [
        ("--writers", args.writers.to_string()),
        ("--keys-per-writer", args.keys_per_writer.to_string()),
        ("--rows-per-statement", args.rows_per_statement.to_string()),
        ("--memtable-mb", args.memtable_mb.to_string()),
        ("--interval-ms", args.interval_ms.to_string()),
    ] {
        forwarded.extend([flag.to_string(), value]);
    }
    let mut children = Children {
        exe: std::env::current_exe().expect("this program"),
        args: forwarded,
        model: Arc::default(),
        running: Vec::new(),
        readers: Vec::new(),
        incarnations: 0,
    };
    for id in 0..args.writers as i64 {
        children.spawn("writer", id);
    }
    for id in 0..args.readers as i64 {
        children.spawn("reader", id);
    }
    let started = Instant::now();
    let end = started + Duration::from_secs(args.seconds);
    let mut kills = 0u64;
    let mut rng = rand::rng();
    let mut last_report = Instant::now();
    while Instant::now() < end {
        let pause = match args.kill_every_ms {
            0 => 1000,
            mean => rng.random_range(mean / 2..=mean * 3 / 2),
        };
        tokio::time::sleep(Duration::from_millis(pause).min(end - Instant::now())).await;
        if args.kill_every_ms > 0 && Instant::now() < end {
            let at = rng.random_range(0..children.running.len());
            let (role, id) = children.kill(at);
            kills += 1;
            children.spawn(role, id);
        }
        if last_report.elapsed() > Duration::from_secs(60) {
            let model = children.model.lock().expect("model");
            eprintln!(
                "{:>5} s: {} statements acknowledged, {} reads, {kills} kills, {} failures",
                started.elapsed().as_secs(),
                model.acked,
                model.reads,
                model.failures.len()
            );
            last_report = Instant::now();
        }
    }
    let elapsed = started.elapsed();
    while !children.running.is_empty() {
        children.kill(0);
    }
    for reader in std::mem::take(&mut children.readers) {
        let _ = reader.join();
    }

    // Every key against the model, from a fresh process's point of view.
    let session = MemwalSession::open(&root).await.expect("open the root");
    let table = session.table(TABLE).await.expect("the table");
    let mut present: HashMap<i64, i64> = HashMap::new();
    let mut duplicated = 0u64;
    for batch in table.scan().await.expect("scan") {
        let ids = batch.column(0).as_primitive::<Int64Type>();
        let vs = batch.column(1).as_primitive::<Int64Type>();
        for i in 0..batch.num_rows() {
            duplicated += u64::from(present.insert(ids.value(i), vs.value(i)).is_some());
        }
    }
    session.close().await.expect("close");
    let model = children.model.lock().expect("model");
    let allowed = model.allowed();
    let (mut lost, mut wrong) = (0u64, 0u64);
    for (key, values) in &allowed {
        let got = present.get(key).copied();
        if !values.contains(&got) {
            match got {
                None => lost += 1,
                Some(_) => wrong += 1,
            }
            if lost + wrong <= 5 {
                eprintln!("key {key}: found {got:?}, allowed {values:?}");
            }
        }
    }
    let unknown = present.keys().filter(|k| !allowed.contains_key(k)).count();
    let rows_acked: usize = model
        .statements
        .values()
        .filter(|s| s.acked)
        .map(|s| s.keys.len())
        .sum();
    let ok = lost == 0
        && wrong == 0
        && unknown == 0
        && duplicated == 0
        && model.duplicates.is_empty()
        && model.failures.is_empty();
    println!(
        "{}",
        serde_json::json!({
            "bench": "soak",
            "ok": ok,
            "seconds": elapsed.as_secs_f64(),
            "writers": args.writers,
            "readers": args.readers,
            "shards": args.shards,
            "kill_every_ms": args.kill_every_ms,
            "memtable_mb": args.memtable_mb,
            "interval_ms": args.interval_ms,
            "rows_per_statement": args.rows_per_statement,
            "kills": kills,
            "statements_issued": model.statements.len(),
            "statements_acked": model.acked,
            "statements_per_second": model.acked as f64 / elapsed.as_secs_f64(),
            "rows_acked": rows_acked,
            "keys_checked": allowed.len(),
            "keys_present": present.len(),
            "lost": lost,
            "wrong_value": wrong,
            "unknown_keys": unknown,
            "duplicated": duplicated + model.duplicates.len() as u64,
            "reads": model.reads,
            "failures": model.failures.len(),
            "first_failures": model.failures.iter().take(5).collect::<Vec<_>>(),
        })
    );
    if !ok {
        std::process::exit(1);
    }
}
