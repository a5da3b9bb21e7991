//! Conformance runner: every `sql-tests/**/*.slt` on a fresh root.
//!
//! - `RESTART` as a statement closes every handle and reopens the same root,
//!   so a file can assert what survives a restart.
//! - Each file runs on a fresh local directory; with `MEMWAL_TEST_S3_BUCKET`
//!   set (and the usual `AWS_*` variables) it runs on S3 as well; without
//!   it the S3 runs are reported as skipped.
//! - `MEMWAL_SLT_COMPLETE=1` rewrites the files' expected output instead.
//! - Arguments that are not flags filter files by substring.
//! - Files under `lsm/` and `blob/` run with tiny MemTables (2 KiB), at most 3 SSTables
//!   per shard and a 200 ms grace period, so they flush and compact all the
//!   time.
//! - `$ROOT` is the root's local directory or URL (with `control
//!   substitution on`); records marked `onlyif local` run on the local root
//!   only.
//! - A file that runs on one root for more than 5 minutes (each takes
//!   seconds) fails the run, naming the file, instead of holding it up.
//! - Sessions allow file access (URL tables, `COPY ... TO`), as the
//!   shell's do.
//! - Each file also runs `[cluster]`: on a local root, with queries
//!   across three workers (`memwal::sql::distributed`) in this process on
//!   127.0.0.1, every full scan and vector search on them (even of one
//!   part, see `SessionBuilder::min_scan_tasks`); the expected output is
//!   the same, but for plans (records label them `skipif cluster` and
//!   `onlyif cluster`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::arrow::array::{Array, RecordBatch};
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use memwal::{MemwalSession, WriterOptions};
use sqllogictest::{DBOutput, DefaultColumnType};
use url::Url;

struct MemwalDb {
    root: String,
    options: WriterOptions,
    workers: Vec<Url>,
    session: Option<MemwalSession>,
}

/// A session on `root` as the tests use it, running queries across
/// `workers` if there are any, every full scan and vector search on them.
async fn open(
    root: &str,
    options: WriterOptions,
    workers: &[Url],
) -> Result<MemwalSession, memwal::Error> {
    MemwalSession::builder(root)
        .writer_options(options)
        .allow_file_access(true)
        .workers(workers.to_vec())
        // Even a scan of a table of one shard runs on a worker.
        .min_scan_tasks(workers.len())
        .open()
        .await
}

/// The writer options of the tests in `path`.
fn options_for(path: &Path) -> WriterOptions {
    if path
        .components()
        .any(|c| c.as_os_str() == "lsm" || c.as_os_str() == "blob")
    {
        let mut o = WriterOptions::default();
        o.memtable_bytes = 2048;
        o.max_sstables = 3;
        o.sstable_grace = Duration::from_millis(200);
        o
    } else {
        WriterOptions::default()
    }
}

#[async_trait::async_trait]
impl sqllogictest::AsyncDB for MemwalDb {
    type Error = memwal::Error;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, memwal::Error> {
        if sql
            .trim()
            .trim_end_matches(';')
            .eq_ignore_ascii_case("restart")
        {
            // Close (flush) and drop every handle first, then reopen the
            // same root.
            if let Some(session) = self.session.take() {
                session.close().await?;
            }
            self.session = Some(open(&self.root, self.options.clone(), &self.workers).await?);
            return Ok(DBOutput::StatementComplete(0));
        }
        let session = self.session.as_ref().expect("a session is open");
        let df = session.sql(sql).await?;
        let schema = df.schema().as_arrow().clone();
        let batches = df.collect().await?;
        if schema.fields().is_empty() {
            return Ok(DBOutput::StatementComplete(0));
        }
        let types = schema
            .fields()
            .iter()
            .map(|f| column_type(f.data_type()))
            .collect();
        Ok(DBOutput::Rows {
            types,
            rows: rows(&batches)?,
        })
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "memwal"
    }

    async fn sleep(dur: Duration) {
        tokio::time::sleep(dur).await;
    }
}

fn column_type(t: &DataType) -> DefaultColumnType {
    if t.is_integer() {
        DefaultColumnType::Integer
    } else if t.is_floating() || matches!(t, DataType::Decimal128(..) | DataType::Decimal256(..)) {
        DefaultColumnType::FloatingPoint
    } else {
        DefaultColumnType::Text
    }
}

fn rows(batches: &[RecordBatch]) -> Result<Vec<Vec<String>>, memwal::Error> {
    let options = FormatOptions::default().with_null("NULL");
    let mut out = Vec::new();
    for batch in batches {
        let formatters = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<Result<Vec<_>, _>>()?;
        for row in 0..batch.num_rows() {
            out.push(
                formatters
                    .iter()
                    .zip(batch.columns())
                    .map(|(f, c)| {
                        let s = f.value(row).to_string();
                        if s.is_empty() && !c.is_null(row) {
                            "(empty)".to_string()
                        } else {
                            s
                        }
                    })
                    .collect(),
            );
        }
    }
    Ok(out)
}

fn slt_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            slt_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "slt") {
            out.push(path);
        }
    }
}

async fn run_file(path: &Path, kind: &str, root: String, complete: bool) -> Result<(), String> {
    let options = options_for(path);
    let local_root = root.clone();
    let (workers, _stop) = match kind {
        "cluster" => memwal::testing::start_workers(&root, 3).await,
        _ => (Vec::new(), tokio::sync::watch::channel(()).0),
    };
    let make = move || {
        let root = root.clone();
        let options = options.clone();
        let workers = workers.clone();
        async move {
            let session = open(&root, options.clone(), &workers).await?;
            Ok::<_, memwal::Error>(MemwalDb {
                root,
                options,
                workers,
                session: Some(session),
            })
        }
    };
    let mut runner = sqllogictest::Runner::new(make);
    runner.add_label(kind);
    if kind == "cluster" {
        // A local root too.
        runner.add_label("local");
    }
    runner.set_var("ROOT".into(), local_root);
    if complete {
        runner
            .update_test_file(
                path,
                " ",
                sqllogictest::default_validator,
                sqllogictest::default_normalizer,
                sqllogictest::default_column_validator,
            )
            .await
            .map_err(|e| e.to_string())
    } else {
        runner
            .run_file_async(path)
            .await
            .map_err(|e| e.display(false).to_string())
    }
}

/// How long one file may run on one root.
const FILE_LIMIT: Duration = Duration::from_secs(300);

/// The file and root running now, and since when: a thread watching it
/// fails the whole run, naming them, once they exceed [`FILE_LIMIT`] (a
/// hang may block the runtime's threads, so no timer on it would fire).
fn watchdog() -> Arc<Mutex<Option<(String, Instant)>>> {
    let running: Arc<Mutex<Option<(String, Instant)>>> = Arc::default();
    let watched = Arc::clone(&running);
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_secs(1));
            if let Some((what, since)) = &*watched.lock().unwrap()
                && since.elapsed() > FILE_LIMIT
            {
                println!("test {what} ... FAILED (still running after {FILE_LIMIT:?})");
                std::process::exit(1);
            }
        }
    });
    running
}

fn main() {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let complete = std::env::var_os("MEMWAL_SLT_COMPLETE").is_some();
    let s3_bucket = std::env::var("MEMWAL_TEST_S3_BUCKET").ok();
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("sql-tests");
    let mut files = Vec::new();
    slt_files(&base, &mut files);
    files.retain(|f| {
        filters.is_empty()
            || filters
                .iter()
                .any(|x| f.to_string_lossy().contains(x.as_str()))
    });

    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let running = watchdog();
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for file in &files {
        let name = file
            .strip_prefix(&base)
            .unwrap_or(file)
            .display()
            .to_string();
        let dir = tempfile::tempdir().expect("temp dir");
        let cluster_dir = tempfile::tempdir().expect("temp dir");
        let mut roots = vec![("local", dir.path().display().to_string())];
        if !complete {
            roots.push(("cluster", cluster_dir.path().display().to_string()));
        }
        match &s3_bucket {
            Some(bucket) if !complete => {
                let prefix = format!("slt-{:016x}", rand::random::<u64>());
                roots.push(("s3", format!("s3://{bucket}/{prefix}")));
            }
            Some(_) => {}
            None => {
                skipped += 1;
                println!("test {name} [s3] ... skipped (MEMWAL_TEST_S3_BUCKET is not set)");
            }
        }
        for (kind, root) in roots {
            *running.lock().unwrap() = Some((format!("{name} [{kind}]"), Instant::now()));
            let result = runtime.block_on(run_file(file, kind, root, complete));
            *running.lock().unwrap() = None;
            match result {
                Ok(()) => {
                    passed += 1;
                    println!("test {name} [{kind}] ... ok");
                }
                Err(e) => {
                    failed += 1;
                    println!("test {name} [{kind}] ... FAILED\n{e}");
                }
            }
        }
    }
    println!("\nsqllogictests: {passed} passed, {failed} failed, {skipped} skipped");
    if failed > 0 || files.is_empty() {
        std::process::exit(1);
    }
}
