//! [`ShardWriter`] (DESIGN.md §6): the one writer of a shard. Puts go into
//! the MemTable at once; a background flusher makes them durable in WAL
//! entries (group commit); in durable mode (the default) a put returns once
//! its entry exists, and readers see it from then on.
//!
//! Guarantees:
//! - WAL position order is put order; an entry carries every put pending
//!   when it started, and a put is acknowledged only after its entry exists;
//! - a transient append failure is retried at the same position with the
//!   same bytes; a failure whose outcome cannot be read back, exhausted
//!   retries, or a newer epoch's fence ([`Error::Fenced`]) stop the writer:
//!   every waiting and later put gets the error, nothing is acknowledged
//!   that is not durable, and recovery is to open the shard again;
//! - open claims the shard with a new epoch, fences the WAL after its tip,
//!   and replays every entry before the fence, so everything acknowledged by
//!   any earlier writer is in the new writer's MemTable.

mod manifest;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::arrow::array::RecordBatch;
use object_store::ObjectStore;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

pub use manifest::ShardManifest;

use crate::error::{Error, Result};
use crate::memtable::{KeyedBatch, MemTable, TableSchema};
use crate::store::{CommitOptions, VersionedObjects, paths};
use crate::wal::{EntryKind, WalEntry, WalLog};

/// How a [`ShardWriter`] makes puts durable.
#[derive(Debug, Clone)]
pub struct WriterOptions {
    /// `true` (default): a put returns once its WAL entry exists, and rows
    /// become visible then. `false`: a put returns (and is visible) at once;
    /// the WAL catches up in the background.
    pub durable: bool,
    /// The group-commit cadence: at most one WAL append starts per interval
    /// while puts keep coming (default 100 ms); a put arriving after a whole
    /// idle interval starts one at once. Zero is latency mode: the next
    /// append starts as soon as the previous one finishes.
    pub wal_flush_interval: Duration,
    /// An append starts early once this many bytes are pending (default
    /// 8 MiB).
    pub wal_flush_bytes: usize,
    /// Puts wait while more than this many bytes are not yet durable
    /// (default 256 MiB).
    pub max_unflushed_bytes: usize,
    /// Attempts at one WAL position after the first fails (default 5).
    pub append_retries: u32,
    /// Commit behaviour of the shard manifest (and the retry backoff).
    pub commit: CommitOptions,
    /// [`crate::Table::get`] trusts that this process's writer still owns
    /// its shard for this long after it last confirmed it (by an append or
    /// a check), and reads its MemTable without any store request; a write
    /// another process made to the shard within that window may be missed.
    /// Scans always check. Default 100 ms; zero checks on every read.
    pub owner_check_interval: Duration,
}

impl Default for WriterOptions {
    fn default() -> Self {
        Self {
            durable: true,
            wal_flush_interval: Duration::from_millis(100),
            wal_flush_bytes: 8 << 20,
            max_unflushed_bytes: 256 << 20,
            append_retries: 5,
            commit: CommitOptions::default(),
            owner_check_interval: Duration::from_millis(100),
        }
    }
}

/// Counters of one writer, read with [`ShardWriter::stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriterStats {
    pub epoch: u64,
    /// Puts and deletes accepted since open (replay not counted).
    pub puts: u64,
    pub rows: u64,
    pub wal_appends: u64,
    pub wal_bytes: u64,
    /// Sum and maximum of WAL append latencies.
    pub append_latency_total: Duration,
    pub append_latency_max: Duration,
    /// Not yet durable: rows, bytes, and puts (batches).
    pub pending_rows: u64,
    pub pending_bytes: u64,
    pub pending_batches: u64,
    /// MemTable batches that are durable, and that readers see.
    pub durable_batches: u64,
    pub visible_batches: u64,
    /// The next WAL position this writer will append at.
    pub next_position: u64,
}

/// What the flusher has made durable so far, or why it stopped.
#[derive(Debug, Clone, Default)]
struct Progress {
    batches: usize,
    rows: u64,
    bytes: usize,
    error: Option<Arc<Error>>,
}

#[derive(Default)]
struct Counters {
    puts: AtomicU64,
    rows: AtomicU64,
    wal_appends: AtomicU64,
    wal_bytes: AtomicU64,
    latency_total_us: AtomicU64,
    latency_max_us: AtomicU64,
    next_position: AtomicU64,
    /// Microseconds after `opened` when ownership was last confirmed.
    owned_at_us: AtomicU64,
}

struct Shared {
    schema: Arc<TableSchema>,
    memtable: Arc<MemTable>,
    wal: WalLog,
    epoch: u64,
    generation: u64,
    options: WriterOptions,
    /// Serializes MemTable appends: one put at a time enters the table.
    append_lock: Mutex<()>,
    /// Written rows (the MemTable counts batches and bytes).
    written_rows: AtomicU64,
    wake: Notify,
    closing: AtomicBool,
    progress: watch::Sender<Progress>,
    counters: Counters,
    opened: Instant,
}

/// The writer of one shard. See the module doc for what it guarantees.
pub struct ShardWriter {
    shared: Arc<Shared>,
    flusher: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for ShardWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardWriter")
            .field("epoch", &self.shared.epoch)
            .field("memtable", &self.shared.memtable)
            .finish()
    }
}

/// A put's durability: [`Durability::wait`] returns once it is durable.
#[derive(Debug)]
pub struct Durability {
    progress: watch::Receiver<Progress>,
    target: usize,
}

impl Durability {
    /// Waits until the put is in a WAL entry; fails if the writer stopped
    /// before that.
    pub async fn wait(mut self) -> Result<()> {
        let target = self.target;
        let progress = self
            .progress
            .wait_for(|p| p.batches >= target || p.error.is_some())
            .await
            .map_err(|_| Error::Poisoned("the shard writer is gone".into()))?;
        if progress.batches >= target {
            return Ok(());
        }
        Err(shared_error(
            progress.error.as_ref().expect("checked above"),
        ))
    }
}

/// A typed copy of an error many waiters share.
fn shared_error(error: &Arc<Error>) -> Error {
    match error.as_ref() {
        Error::Fenced {
            path,
            epoch,
            by_epoch,
        } => Error::Fenced {
            path: path.clone(),
            epoch: *epoch,
            by_epoch: *by_epoch,
        },
        other => Error::Poisoned(other.to_string()),
    }
}

impl ShardWriter {
    /// Opens shard `shard` of the table at `location`: claims it (new
    /// epoch), fences the WAL, replays it into a fresh MemTable and starts
    /// the flusher. A corrupt or missing WAL entry fails the open, naming
    /// the object.
    pub async fn open(
        store: Arc<dyn ObjectStore>,
        location: &str,
        shard: u32,
        schema: Arc<TableSchema>,
        options: WriterOptions,
    ) -> Result<Self> {
        if options.wal_flush_bytes == 0 || options.max_unflushed_bytes == 0 {
            return Err(Error::invalid(
                "wal_flush_bytes and max_unflushed_bytes must be positive",
            ));
        }
        if shard >= schema.shards {
            return Err(Error::invalid(format!(
                "shard {shard} does not exist (the table has {})",
                schema.shards
            )));
        }
        let dir = paths::shard_dir(location, shard);
        let versions = VersionedObjects::new(
            Arc::clone(&store),
            paths::shard_manifest_dir(&dir),
            "json",
            options.commit.clone(),
        );
        let claimed = manifest::claim(&versions).await?;
        let ShardManifest {
            epoch,
            replay_after,
            generation,
            ..
        } = claimed.state.as_ref().clone();
        let wal = WalLog::new(store, paths::wal_dir(&dir));
        let fence = wal.fence(epoch, replay_after).await?;

        let memtable = Arc::new(MemTable::new(Arc::clone(&schema)));
        let mut rows = 0;
        for (position, entry) in wal.replay(replay_after).await? {
            if position >= fence {
                break;
            }
            if entry.kind != EntryKind::Data {
                continue;
            }
            let mut put = Vec::with_capacity(entry.batches.len());
            for batch in entry.batches {
                let batch =
                    RecordBatch::try_new(Arc::clone(&schema.stored), batch.columns().to_vec())
                        .map_err(|e| Error::Corrupt {
                            path: wal.path_of(position).to_string(),
                            reason: format!("rows do not fit the table: {e}"),
                        })?;
                rows += batch.num_rows() as u64;
                put.push(schema.keyed(batch)?);
            }
            memtable.append(put);
        }
        let replayed = memtable.written_batches();
        memtable.publish(replayed);
        log::debug!(
            "shard {shard} of {location}: epoch {epoch}, replayed {replayed} batches up to fence {fence}"
        );

        let (progress, _) = watch::channel(Progress {
            batches: replayed,
            rows,
            bytes: memtable.bytes(),
            error: None,
        });
        let shared = Arc::new(Shared {
            schema,
            memtable,
            wal,
            epoch,
            generation,
            options,
            append_lock: Mutex::new(()),
            written_rows: AtomicU64::new(rows),
            wake: Notify::new(),
            closing: AtomicBool::new(false),
            progress,
            counters: Counters {
                next_position: AtomicU64::new(fence + 1),
                ..Counters::default()
            },
            opened: Instant::now(),
        });
        let flusher = tokio::spawn(Arc::clone(&shared).run_flusher(fence + 1));
        Ok(Self {
            shared,
            flusher: Mutex::new(Some(flusher)),
        })
    }

    /// The writer's epoch.
    pub fn epoch(&self) -> u64 {
        self.shared.epoch
    }

    /// The MemTable (for readers in this process).
    pub fn memtable(&self) -> &Arc<MemTable> {
        &self.shared.memtable
    }

    /// The table schema this writer checks puts against.
    pub fn schema(&self) -> &Arc<TableSchema> {
        &self.shared.schema
    }

    /// Whether [`ShardWriter::close`] was called (then every put fails).
    pub fn is_closed(&self) -> bool {
        self.shared.closing.load(Ordering::Acquire)
    }

    /// The error that stopped the writer, if any (then every put fails).
    pub fn stopped(&self) -> Option<Error> {
        self.shared
            .progress
            .borrow()
            .error
            .as_ref()
            .map(shared_error)
    }

    /// Whether this writer still owns the shard: the WAL position it
    /// appends at next is free, or holds its own entry followed by a free
    /// position. One object read, in the common case.
    pub async fn still_owns_shard(&self) -> Result<bool> {
        let started = Instant::now();
        let mut next = self.shared.counters.next_position.load(Ordering::Acquire);
        // Our own entry there is an append that landed and is not counted
        // yet; someone may have fenced after it, so look on.
        loop {
            match self.shared.wal.read(next).await? {
                None => break,
                Some(entry) if entry.epoch == self.shared.epoch => next += 1,
                Some(_) => return Ok(false),
            }
        }
        self.shared.confirm_owned(started);
        Ok(true)
    }

    /// Whether ownership was confirmed less than `max_age` ago (no I/O).
    pub fn owned_within(&self, max_age: Duration) -> bool {
        let at = self.shared.counters.owned_at_us.load(Ordering::Acquire);
        at > 0 && self.shared.opened.elapsed().as_micros() as u64 - at < max_age.as_micros() as u64
    }

    /// Puts `batches` (user rows of the table; several batches become
    /// visible together) and, in durable mode, waits until they are durable.
    /// Bad input is an [`Error::InvalidInput`] and writes nothing.
    pub async fn put(&self, batches: &[RecordBatch]) -> Result<()> {
        let durability = self.put_nowait(batches).await?;
        if self.shared.options.durable {
            durability.wait().await?;
        }
        Ok(())
    }

    /// Like [`ShardWriter::put`] but returns once the rows are in the
    /// MemTable (after backpressure); the handle waits for durability.
    pub async fn put_nowait(&self, batches: &[RecordBatch]) -> Result<Durability> {
        if batches.is_empty() {
            return Err(Error::invalid("a put needs at least one batch"));
        }
        let schema = &self.shared.schema;
        let put = batches
            .iter()
            .map(|b| schema.keyed(schema.to_stored(b)?))
            .collect::<Result<Vec<_>>>()?;
        self.put_keyed(put).await
    }

    /// Deletes the keys in `keys` (exactly the key columns, in key order):
    /// writes tombstones, durable like a put.
    pub async fn delete(&self, keys: &RecordBatch) -> Result<()> {
        let durability = self.delete_nowait(keys).await?;
        if self.shared.options.durable {
            durability.wait().await?;
        }
        Ok(())
    }

    /// Like [`ShardWriter::delete`] without waiting for durability.
    pub async fn delete_nowait(&self, keys: &RecordBatch) -> Result<Durability> {
        let schema = &self.shared.schema;
        self.put_keyed(vec![schema.keyed(schema.tombstones(keys)?)?])
            .await
    }

    /// Appends already checked rows in stored form with their key
    /// encodings (see [`TableSchema::keyed`]) as one put.
    pub(crate) async fn put_keyed(&self, put: Vec<KeyedBatch>) -> Result<Durability> {
        let shared = &self.shared;
        self.backpressure().await?;
        let rows = put.iter().map(|(b, _)| b.num_rows() as u64).sum::<u64>();
        let end = {
            let _one_writer = shared.append_lock.lock().expect("append lock poisoned");
            if let Some(e) = &shared.progress.borrow().error {
                return Err(shared_error(e));
            }
            // Checked under the lock `close` sets it under: the flusher,
            // which reads `closing` before `written`, sees every put that
            // got past here.
            if shared.closing.load(Ordering::Acquire) {
                return Err(Error::Poisoned("the shard writer is closed".into()));
            }
            let end = shared.memtable.append(put);
            shared.written_rows.fetch_add(rows, Ordering::Relaxed);
            end
        };
        if !shared.options.durable {
            shared.memtable.publish(end);
        }
        shared.counters.puts.fetch_add(1, Ordering::Relaxed);
        shared.counters.rows.fetch_add(rows, Ordering::Relaxed);
        shared.wake.notify_one();
        Ok(Durability {
            progress: shared.progress.subscribe(),
            target: end,
        })
    }

    /// Waits while too many bytes are not durable yet.
    async fn backpressure(&self) -> Result<()> {
        let shared = &self.shared;
        let ceiling = shared.options.max_unflushed_bytes;
        let pending = |p: &Progress| shared.memtable.bytes().saturating_sub(p.bytes);
        let mut progress = shared.progress.subscribe();
        let ready = progress
            .wait_for(|p| p.error.is_some() || pending(p) <= ceiling)
            .await
            .map_err(|_| Error::Poisoned("the shard writer is gone".into()))?;
        match &ready.error {
            Some(e) => Err(shared_error(e)),
            None => Ok(()),
        }
    }

    /// A snapshot of the writer's counters.
    pub fn stats(&self) -> WriterStats {
        let shared = &self.shared;
        let c = &shared.counters;
        let progress = shared.progress.borrow().clone();
        let written = shared.memtable.written_batches();
        WriterStats {
            epoch: shared.epoch,
            puts: c.puts.load(Ordering::Relaxed),
            rows: c.rows.load(Ordering::Relaxed),
            wal_appends: c.wal_appends.load(Ordering::Relaxed),
            wal_bytes: c.wal_bytes.load(Ordering::Relaxed),
            append_latency_total: Duration::from_micros(c.latency_total_us.load(Ordering::Relaxed)),
            append_latency_max: Duration::from_micros(c.latency_max_us.load(Ordering::Relaxed)),
            pending_rows: shared
                .written_rows
                .load(Ordering::Relaxed)
                .saturating_sub(progress.rows),
            pending_bytes: shared.memtable.bytes().saturating_sub(progress.bytes) as u64,
            pending_batches: written.saturating_sub(progress.batches) as u64,
            durable_batches: progress.batches as u64,
            visible_batches: shared.memtable.visible_batches() as u64,
            next_position: c.next_position.load(Ordering::Relaxed),
        }
    }

    /// Makes everything put so far durable, stops the flusher and reports
    /// the error that stopped the writer, if any.
    pub async fn close(&self) -> Result<()> {
        {
            let _no_put_in_flight = self
                .shared
                .append_lock
                .lock()
                .expect("append lock poisoned");
            self.shared.closing.store(true, Ordering::Release);
        }
        self.shared.wake.notify_one();
        let flusher = self.flusher.lock().expect("flusher handle poisoned").take();
        if let Some(flusher) = flusher {
            flusher
                .await
                .map_err(|e| Error::Poisoned(format!("WAL flusher failed: {e}")))?;
        }
        match self.stopped() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for ShardWriter {
    fn drop(&mut self) {
        // The flusher drains what is pending, then exits.
        self.shared.closing.store(true, Ordering::Release);
        self.shared.wake.notify_one();
    }
}

impl Shared {
    /// Records that nobody else had written to the shard by `at`.
    fn confirm_owned(&self, at: Instant) {
        let at = at.saturating_duration_since(self.opened).as_micros() as u64;
        self.counters
            .owned_at_us
            .fetch_max(at.max(1), Ordering::AcqRel);
    }

    /// The group-commit loop: one WAL append at a time, each carrying every
    /// batch written and not yet durable when it starts.
    async fn run_flusher(self: Arc<Self>, mut position: u64) {
        let interval = self.options.wal_flush_interval;
        let mut last_start: Option<Instant> = None;
        loop {
            // `closing` first: once it is set no put enters the MemTable, so
            // `written` read after it is final.
            let closing = self.closing.load(Ordering::Acquire);
            let durable = self.progress.borrow().clone();
            let written = self.memtable.written_batches();
            if written == durable.batches {
                if closing {
                    return;
                }
                self.wake.notified().await;
                continue;
            }
            let pending_bytes = self.memtable.bytes().saturating_sub(durable.bytes);
            let due = last_start.map(|at| at + interval);
            if let Some(due) = due
                && !closing
                && pending_bytes < self.options.wal_flush_bytes
                && Instant::now() < due
            {
                tokio::select! {
                    _ = tokio::time::sleep_until(due.into()) => {}
                    _ = self.wake.notified() => {}
                }
                continue;
            }
            last_start = Some(Instant::now());
            let batches = self.memtable.batches(durable.batches, written);
            let rows: u64 = batches.iter().map(|b| b.batch.num_rows() as u64).sum();
            let bytes: usize = batches
                .iter()
                .map(|b| b.batch.get_array_memory_size())
                .sum();
            let entry = WalEntry::data(
                self.epoch,
                self.generation,
                batches.into_iter().map(|b| b.batch).collect(),
            );
            let result = match entry.encode() {
                Ok(encoded) => {
                    let len = encoded.len() as u64;
                    self.append_at(position, encoded).await.map(|()| len)
                }
                Err(e) => Err(e),
            };
            match result {
                Ok(len) => {
                    let latency = last_start.expect("set above").elapsed().as_micros() as u64;
                    let c = &self.counters;
                    c.wal_appends.fetch_add(1, Ordering::Relaxed);
                    c.wal_bytes.fetch_add(len, Ordering::Relaxed);
                    c.latency_total_us.fetch_add(latency, Ordering::Relaxed);
                    c.latency_max_us.fetch_max(latency, Ordering::Relaxed);
                    position += 1;
                    c.next_position.store(position, Ordering::Release);
                    // Our entry landed, so nobody had fenced when it started.
                    self.confirm_owned(last_start.expect("set above"));
                    if self.options.durable {
                        self.memtable.publish(written);
                    }
                    self.progress.send_modify(|p| {
                        p.batches = written;
                        p.rows += rows;
                        p.bytes += bytes;
                    });
                }
                Err(e) => {
                    log::warn!("shard writer of epoch {} stopped: {e}", self.epoch);
                    self.progress.send_modify(|p| p.error = Some(Arc::new(e)));
                    return;
                }
            }
        }
    }

    /// Appends `bytes` at `position`, retrying the same position with the
    /// same bytes after a failure whose read-back shows nothing landed.
    async fn append_at(&self, position: u64, bytes: bytes::Bytes) -> Result<()> {
        let mut attempt = 0;
        loop {
            let err = match self.wal.append(position, self.epoch, bytes.clone()).await {
                Ok(()) => return Ok(()),
                Err(e @ Error::Fenced { .. }) => return Err(e),
                Err(e) => e,
            };
            match self.wal.read_bytes(position).await {
                Ok(Some(stored)) if stored == bytes => return Ok(()),
                // Someone else's entry: the next append reports the fence.
                Ok(Some(_)) => {}
                Ok(None) => {}
                Err(read_back) => {
                    return Err(Error::CommitOutcomeUnknown {
                        path: self.wal.path_of(position).to_string(),
                        write: err.to_string(),
                        read_back: read_back.to_string(),
                    });
                }
            }
            attempt += 1;
            if attempt > self.options.append_retries {
                return Err(Error::Poisoned(format!(
                    "WAL append at {} failed {attempt} times; last error: {err}",
                    self.wal.path_of(position)
                )));
            }
            log::debug!("retrying WAL append at position {position}: {err}");
            tokio::time::sleep(self.options.commit.backoff(attempt)).await;
        }
    }
}
