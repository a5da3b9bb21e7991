//! memwal: tables for Apache DataFusion that take a high rate of small
//! writes and answer SQL over fresh data, on any object store.
//!
//! Start with [`MemwalSession::open`] for SQL, or [`Table`] (through
//! [`MemwalSession::table`]) for the Rust API; see `DESIGN.md` for the
//! architecture.
//!
//! Modules, top down; a module imports only from modules below it:
//!
//! | layer | modules |
//! |---|---|
//! | FFI | [`ffi`] (the catalog, tables and `vector_search` for other DataFusion builds) |
//! | SQL | [`sql`] (DataFusion adapters, session) |
//! | Rust API | `table` (routing, snapshots: where write and read meet) |
//! | paths | `read`, `writer`, [`catalog`] |
//! | layers | `wal`, `memtable`, `sstable` |
//! | vectors | `hnsw` |
//! | rows | `schema` (table definition, stored rows, keys, metric) |
//! | storage | `store` (object names in `store::paths`), [`error`] |

#![warn(missing_docs)]

mod blob;
pub mod catalog;
pub mod error;
pub mod ffi;
mod hnsw;
mod memtable;
mod read;
mod schema;
pub mod sql;
mod sstable;
mod store;
mod table;
mod wal;
mod writer;

pub use blob::BlobStream;
pub use catalog::{Catalog, CatalogOptions, ObjectPath};
pub use error::{Error, Result};
pub use read::{Neighbour, ShardSnapshot, VectorQuery};
pub use schema::{ColumnOptions, HnswParams, Metric, TableMeta, VectorOptions};
pub use sql::{MemwalSession, SessionBuilder};
pub use store::{CommitOptions, ObjectRoot};
pub use table::{Table, TableCache};
pub use writer::{ShardSlice, WriterOptions, WriterStats, parse_duration};

/// Internals that tests and benchmarks drive directly: the shard writer
/// and its layers, the fault-injecting store, the HNSW graph and the
/// vector dataset generator. Built with the `testing` feature (which the
/// crate's own tests, examples and benches switch on); not a stable API.
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    pub use crate::blob::load_tag_of_pack;
    pub use crate::hnsw::{Graph, Hit, dataset, distance, kernel};
    pub use crate::read::{KeyBounds, ScanMetrics};
    pub use crate::schema::TableSchema;
    pub use crate::sstable::{SstableFile, deletions_complete};
    pub use crate::store::{
        Delay, Fault, FaultMode, FaultyStore, Gate, LatencyProfile, LatencyStore, OpKind,
        RequestCount, Slot, VersionedObjects, bench_root, paths,
    };
    pub use crate::wal::{EntryKind, WalLog};
    pub use crate::writer::{Durability, ShardManifest, ShardWriter};

    /// `n` workers serving the root at `root` in this process, on free
    /// ports of 127.0.0.1 (their URLs); they stop when the returned sender
    /// is dropped.
    #[cfg(feature = "distributed")]
    pub async fn start_workers(
        root: &str,
        n: usize,
    ) -> (Vec<url::Url>, tokio::sync::watch::Sender<()>) {
        let (stop, stopped) = tokio::sync::watch::channel(());
        let mut urls = Vec::new();
        for _ in 0..n {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap();
            urls.push(url::Url::parse(&format!("http://{address}")).unwrap());
            let root = crate::ObjectRoot::open(root).unwrap();
            let mut stopped = stopped.clone();
            tokio::spawn(async move {
                let shutdown = async move {
                    let _ = stopped.changed().await;
                };
                crate::sql::distributed::serve_worker(root, listener, shutdown)
                    .await
                    .expect("worker");
            });
        }
        (urls, stop)
    }

    /// A `memwal worker` process (the binary at `memwal`) serving the
    /// root at `root` on a free port of 127.0.0.1; killed on drop.
    #[cfg(feature = "distributed")]
    pub struct WorkerProcess {
        child: std::process::Child,
        /// Where it listens.
        pub url: url::Url,
    }

    #[cfg(feature = "distributed")]
    impl WorkerProcess {
        /// Starts it and waits until it listens.
        pub fn start(memwal: &std::path::Path, root: &str) -> Self {
            use std::io::BufRead;
            let mut child = std::process::Command::new(memwal)
                .args(["worker", "--listen", "127.0.0.1:0", "--root", root])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("starting {}: {e}", memwal.display()));
            let mut line = String::new();
            let mut out = std::io::BufReader::new(child.stdout.take().expect("piped"));
            out.read_line(&mut line).expect("the worker's first line");
            // "memwal worker on http://127.0.0.1:PORT serving ROOT"
            let url = line
                .split_whitespace()
                .nth(3)
                .expect("the worker's address");
            Self {
                url: url::Url::parse(url).expect("the worker's URL"),
                child,
            }
        }

        /// Stops the process (SIGSTOP) and leaves its connections open: a
        /// worker that hangs. Returns once every thread of it has stopped
        /// (kill(2) returns as soon as the signal is queued, and a worker's
        /// threads can answer a query meanwhile).
        pub fn freeze(&self) {
            let pid = self.child.id() as libc::pid_t;
            // SAFETY: kill(2) with the pid of a child this handle owns and
            // has not waited for.
            let sent = unsafe { libc::kill(pid, libc::SIGSTOP) };
            assert_eq!(sent, 0, "SIGSTOP to the worker");
            let mut status = 0;
            // SAFETY: waitpid(2) on that child; WUNTRACED reports its stop
            // (once the whole process is stopped) without reaping it.
            let waited = unsafe { libc::waitpid(pid, &mut status, libc::WUNTRACED) };
            assert!(
                waited == pid && libc::WIFSTOPPED(status),
                "the worker did not stop: {status:#x}"
            );
        }
    }

    #[cfg(feature = "distributed")]
    impl Drop for WorkerProcess {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// User plus system CPU time this process has used, from the kernel's
    /// per-process clock (nanoseconds, not the 10 ms scheduler tick).
    pub fn process_cpu_time() -> std::time::Duration {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime only writes into the timespec it is given.
        unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
        std::time::Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
    }
}
