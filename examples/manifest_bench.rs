//! Catalog commit benchmark, mirroring the peer's `__manifest` protocol.
//!
//! ```text
//! cargo run --release --example manifest_bench -- seed-large --root DIR --entries 10000
//! cargo run --release --example manifest_bench -- run --root DIR --workers 8 [--processes] \
//!     (--ops-per-worker N | --duration-secs S) [--store local|s3-standard|s3-express]
//! ```
//!
//! `seed-large` brings the catalog to N namespaces (bulk commits of 10,000)
//! and writes a checkpoint. `--store` puts the directory behind the latency
//! model of an S3 class (`src/store/latency.rs`; each process its own model,
//! seeded by its worker number).
//! `run` has C workers each commit changes in a loop, either as tasks of
//! one process (sharing one catalog handle, so group commit applies) or, with
//! `--processes`, as C worker processes of this same program (each its own
//! handle: every commit races through put-if-absent). It prints one JSON
//! object: ops/s, latency percentiles, retry-budget errors, versions used,
//! and the catalog directory's size against one checkpoint's, measured once
//! each worker's handle finished its background checkpoint
//! (`Catalog::close`), with how many versions and checkpoints hold bytes.
//! Each op is
//! one committed change: by default a worker creates a namespace and drops it
//! again, alternately, so the catalog stays at its seeded size; with
//! `--grow` it only creates. After the run it checks that every acknowledged
//! change holds: each namespace acknowledged as created (and not dropped
//! since) exists, each acknowledged as dropped does not.

use std::collections::BTreeSet;
use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memwal::catalog::{Mutation, Outcome};
use memwal::testing::bench_root;
use memwal::{Catalog, CatalogOptions, Error, ObjectPath};

fn arg<T: std::str::FromStr>(args: &[String], name: &str) -> Option<T> {
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1)?.parse().ok()
}

async fn open(root: &str, store: &str, seed: u64) -> Arc<Catalog> {
    let (root, _) = bench_root(store, std::path::Path::new(root), seed).expect("open root");
    Catalog::open(root, CatalogOptions::default())
        .await
        .expect("open catalog")
}

/// The `--store` argument (default `local`).
fn store(args: &[String]) -> String {
    arg(args, "--store").unwrap_or_else(|| "local".to_string())
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root: String = arg(&args, "--root").expect("--root DIR is required");
    match args.first().map(String::as_str) {
        Some("seed-large") => seed(&root, arg(&args, "--entries").expect("--entries N")).await,
        Some("run") => run(&root, &args).await,
        Some("worker") => worker(&root, &args).await,
        _ => {
            eprintln!("usage: manifest_bench (seed-large|run) --root DIR ...");
            std::process::exit(2);
        }
    }
}

async fn seed(root: &str, entries: usize) {
    let catalog = open(root, "local", 0).await;
    let start = Instant::now();
    let mut have = catalog.snapshot().len();
    while have < entries {
        let batch: Vec<Mutation> = (have..entries.min(have + 10_000))
            .map(|i| Mutation::CreateNamespace {
                path: ObjectPath::new([format!("seed{i:08}")]).unwrap(),
                if_not_exists: true,
            })
            .collect();
        for r in catalog.mutate_all(batch).await {
            r.expect("seed commit");
        }
        have = catalog.snapshot().len();
        eprint!("\rseeded {have}/{entries}");
    }
    eprintln!();
    catalog.checkpoint().await.expect("checkpoint");
    println!(
        "{{\"seeded\":{have},\"version\":{},\"secs\":{:.2}}}",
        catalog.version(),
        start.elapsed().as_secs_f64()
    );
}

/// What one worker did.
#[derive(Default)]
struct Tally {
    latencies_us: Vec<u64>,
    conflicts: u64,
    other_errors: u64,
    /// Acknowledged as created and not dropped since.
    alive: BTreeSet<String>,
    /// Acknowledged as dropped.
    gone: BTreeSet<String>,
}

async fn work(
    catalog: Arc<Catalog>,
    id: String,
    grow: bool,
    ops: Option<u64>,
    until: Instant,
) -> Tally {
    let mut tally = Tally::default();
    // Without --grow: the namespace created last, dropped by the next op.
    let mut to_drop: Option<String> = None;
    let mut i = 0u64;
    while ops.map_or(Instant::now() < until, |n| i < n) {
        i += 1;
        let t = Instant::now();
        let result = match &to_drop {
            Some(name) => {
                let path = ObjectPath::new([name.clone()]).unwrap();
                catalog.drop_namespace(path, false, false).await
            }
            None => {
                let path = ObjectPath::new([format!("{id}_{i}")]).unwrap();
                catalog.create_namespace(path, false).await
            }
        };
        match result {
            Ok(Outcome::Created) => {
                tally.latencies_us.push(t.elapsed().as_micros() as u64);
                let name = format!("{id}_{i}");
                tally.alive.insert(name.clone());
                if !grow {
                    to_drop = Some(name);
                }
            }
            Ok(Outcome::Dropped { .. }) => {
                tally.latencies_us.push(t.elapsed().as_micros() as u64);
                let name = to_drop.take().expect("dropped what was created");
                tally.alive.remove(&name);
                tally.gone.insert(name);
            }
            Ok(other) => panic!("unexpected outcome {other:?}"),
            Err(Error::CommitConflict { .. }) => tally.conflicts += 1,
            Err(e) => {
                eprintln!("worker {id}: {e}");
                tally.other_errors += 1;
            }
        }
    }
    tally
}

fn limits(args: &[String]) -> (Option<u64>, Instant) {
    let ops = arg(args, "--ops-per-worker");
    let secs: f64 = arg(args, "--duration-secs").unwrap_or(10.0);
    (ops, Instant::now() + Duration::from_secs_f64(secs))
}

/// A worker process: runs its loop and prints its tally, one line per
/// field, for the parent.
async fn worker(root: &str, args: &[String]) {
    let id: String = arg(args, "--id").expect("--id");
    let seed = arg(args, "--seed").unwrap_or(0);
    let catalog = open(root, &store(args), seed).await;
    // Start together: say we are ready, wait for the parent's release.
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    let (ops, until) = limits(args);
    let grow = args.iter().any(|a| a == "--grow");
    let tally = work(Arc::clone(&catalog), id, grow, ops, until).await;
    let mut out = std::io::stdout().lock();
    let join = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    writeln!(out, "{}", join(&tally.latencies_us)).unwrap();
    writeln!(out, "{} {}", tally.conflicts, tally.other_errors).unwrap();
    let names = |set: &BTreeSet<String>| set.iter().cloned().collect::<Vec<_>>().join(",");
    writeln!(out, "{}", names(&tally.alive)).unwrap();
    writeln!(out, "{}", names(&tally.gone)).unwrap();
    out.flush().unwrap();
    drop(out);
    // Untimed: the parent has the tally.
    catalog.close().await;
}

async fn run(root: &str, args: &[String]) {
    let workers: usize = arg(args, "--workers").unwrap_or(1);
    let processes = args.iter().any(|a| a == "--processes");
    let before = open(root, &store(args), 1_000).await;
    let (entries_before, version_before) = (before.snapshot().len(), before.version());

    // The time until every worker's last commit (a handle's background
    // checkpoint, awaited after it, is not timed).
    let (elapsed, tallies): (Duration, Vec<Tally>) = if processes {
        let exe = std::env::current_exe().unwrap();
        let mut children: Vec<_> = (0..workers)
            .map(|w| {
                let mut cmd = Command::new(&exe);
                let id = format!("p{w}_{:x}", rand::random::<u32>());
                cmd.args(["worker", "--root", root, "--id", &id]);
                cmd.args(["--seed", &w.to_string()]);
                for flag in ["--ops-per-worker", "--duration-secs", "--store"] {
                    if let Some(v) = arg::<String>(args, flag) {
                        cmd.args([flag, &v]);
                    }
                }
                if args.iter().any(|a| a == "--grow") {
                    cmd.arg("--grow");
                }
                let mut child = cmd
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("spawn worker");
                let out = std::io::BufReader::new(child.stdout.take().unwrap());
                (child, out)
            })
            .collect();
        for (_, out) in &mut children {
            let mut ready = String::new();
            out.read_line(&mut ready).unwrap();
            assert_eq!(ready.trim(), "ready", "a worker did not start");
        }
        let start_again = Instant::now();
        for (child, _) in &mut children {
            writeln!(child.stdin.as_mut().unwrap()).unwrap();
        }
        let tallies: Vec<Tally> = children
            .iter_mut()
            .map(|(_, out)| {
                let text: Vec<String> = (0..4)
                    .map(|_| {
                        let mut line = String::new();
                        let read = out.read_line(&mut line).unwrap();
                        assert!(read > 0, "a worker failed");
                        line.trim_end().to_string()
                    })
                    .collect();
                let mut lines = text.iter().map(String::as_str);
                let nums = |s: &str| {
                    s.split(',')
                        .filter(|x| !x.is_empty())
                        .map(|x| x.parse().unwrap())
                        .collect()
                };
                let latencies_us = nums(lines.next().unwrap_or(""));
                let mut errs = lines
                    .next()
                    .unwrap_or("0 0")
                    .split(' ')
                    .map(|x| x.parse().unwrap());
                let (conflicts, other_errors) = (errs.next().unwrap(), errs.next().unwrap());
                let mut names = || -> BTreeSet<String> {
                    lines
                        .next()
                        .unwrap_or("")
                        .split(',')
                        .filter(|x| !x.is_empty())
                        .map(str::to_string)
                        .collect()
                };
                let (alive, gone) = (names(), names());
                Tally {
                    latencies_us,
                    conflicts,
                    other_errors,
                    alive,
                    gone,
                }
            })
            .collect();
        let elapsed = start_again.elapsed();
        for (mut child, _) in children {
            assert!(child.wait().unwrap().success(), "a worker failed");
        }
        (elapsed, tallies)
    } else {
        let start = Instant::now();
        let (ops, until) = limits(args);
        let tasks: Vec<_> = (0..workers)
            .map(|w| {
                let id = format!("t{w}_{:x}", rand::random::<u32>());
                let grow = args.iter().any(|a| a == "--grow");
                tokio::spawn(work(Arc::clone(&before), id, grow, ops, until))
            })
            .collect();
        let mut tallies = Vec::new();
        for t in tasks {
            tallies.push(t.await.unwrap());
        }
        let elapsed = start.elapsed();
        before.close().await;
        (elapsed, tallies)
    };
    report(
        root,
        &store(args),
        workers,
        processes,
        entries_before,
        version_before,
        elapsed,
        tallies,
    )
    .await;
}

#[allow(clippy::too_many_arguments)]
async fn report(
    root: &str,
    store: &str,
    workers: usize,
    processes: bool,
    entries_before: usize,
    version_before: u64,
    elapsed: Duration,
    tallies: Vec<Tally>,
) {
    let secs = elapsed.as_secs_f64();
    let mut latencies: Vec<u64> = tallies
        .iter()
        .flat_map(|t| t.latencies_us.iter().copied())
        .collect();
    latencies.sort_unstable();
    let ops = latencies.len();
    let conflicts: u64 = tallies.iter().map(|t| t.conflicts).sum();
    let other_errors: u64 = tallies.iter().map(|t| t.other_errors).sum();
    let pct = |p: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let i = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[i] as f64 / 1000.0
    };

    // Every acknowledged change must hold.
    let after = open(root, "local", 0).await;
    let snapshot = after.snapshot();
    let present: BTreeSet<&str> = snapshot.iter().map(|e| e.object_id.as_str()).collect();
    let lost = tallies
        .iter()
        .map(|t| {
            t.alive
                .iter()
                .filter(|n| !present.contains(n.as_str()))
                .count()
                + t.gone
                    .iter()
                    .filter(|n| present.contains(n.as_str()))
                    .count()
        })
        .sum::<usize>();

    // Bytes of the versions (and tombstones) and of the checkpoints, and
    // how many files hold bytes, once the writers' background work ended.
    let bytes_in = |dir: &std::path::Path| -> (u64, u64, u64) {
        let (mut all, mut full, mut newest) = (0, 0, (String::new(), 0));
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                continue;
            }
            all += meta.len();
            full += u64::from(meta.len() > 0);
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('v') && name > newest.0 {
                newest = (name, meta.len());
            }
        }
        (all, full, newest.1)
    };
    let dir = std::path::Path::new(root).join("__manifest");
    let (version_bytes, full_versions, _) = bytes_in(&dir);
    let (checkpoint_dir_bytes, checkpoint_files, checkpoint_bytes) =
        bytes_in(&dir.join("checkpoints"));
    let dir_bytes = version_bytes + checkpoint_dir_bytes;
    let attempts = ops as u64 + conflicts + other_errors;
    println!(
        "{{\"debug_assertions\":{},\"store\":\"{}\",\"mode\":\"{}\",\"workers\":{workers},\"entries_before\":{entries_before},\"entries_after\":{},\
\"ops\":{ops},\"secs\":{secs:.3},\"ops_per_s\":{:.1},\"versions\":{},\"versions_per_s\":{:.1},\
\"p50_ms\":{:.3},\"p90_ms\":{:.3},\"p99_ms\":{:.3},\"retry_budget_errors\":{conflicts},\
\"retry_budget_error_pct\":{:.3},\"other_errors\":{other_errors},\"lost\":{lost},\
\"manifest_dir_bytes\":{dir_bytes},\"versions_with_content\":{full_versions},\"checkpoint_files\":{checkpoint_files},\"checkpoint_bytes\":{checkpoint_bytes},\"dir_over_checkpoint\":{:.2}}}",
        cfg!(debug_assertions),
        store,
        if processes { "processes" } else { "tasks" },
        snapshot.len(),
        ops as f64 / secs,
        after.version() - version_before,
        (after.version() - version_before) as f64 / secs,
        pct(0.50),
        pct(0.90),
        pct(0.99),
        100.0 * conflicts as f64 / attempts.max(1) as f64,
        dir_bytes as f64 / checkpoint_bytes.max(1) as f64,
    );
    assert_eq!(lost, 0, "acknowledged changes were lost");
    assert_eq!(other_errors, 0, "commits failed");
}
