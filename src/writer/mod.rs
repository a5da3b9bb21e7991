//! [`ShardWriter`] (DESIGN.md §6): the one writer of a shard. Puts go into
//! the active MemTable at once; a background task makes them durable in
//! WAL entries (group commit); in durable mode (the default) a put returns
//! once its entry exists, and readers see it from then on. A MemTable that
//! reaches [`WriterOptions::memtable_bytes`] freezes and a new generation
//! starts; a second task flushes frozen MemTables to SSTables, commits
//! them to the shard manifest, deletes the WAL entries they cover and
//! compacts SSTables (see [`flush`]).
//!
//! Guarantees:
//! - WAL position order is put order, across generations too; an entry
//!   holds rows of one generation only, and carries every put of it
//!   pending when it started; a put is acknowledged only after its entry
//!   exists;
//! - a transient append failure is retried at the same position with the
//!   same bytes; a failure whose outcome cannot be read back, exhausted
//!   retries, or a newer epoch's fence ([`Error::Fenced`]) stop the writer:
//!   every waiting and later put gets the error, nothing is acknowledged
//!   that is not durable, and recovery is to open the shard again;
//! - open claims the shard with a new epoch, fences the WAL after its tip,
//!   and replays every entry after the manifest's replay cursor into
//!   MemTables, one per recorded generation, so everything acknowledged by
//!   any earlier writer is in an SSTable or in the new writer's MemTables;
//! - fences are deleted once as old as the longest
//!   [`WriterOptions::fence_grace`] of the shard's writers (so
//!   storage stays bounded however often writers open). That stays safe
//!   because no writer relies on a fence older than that: a writer starts
//!   no append more than a quarter of its own grace after it last confirmed
//!   that it owns the shard (an append of its own that landed, or the
//!   shard manifest still naming its epoch), and an append that took more
//!   than a quarter of the grace is acknowledged only after the manifest
//!   confirms it still owns the shard. So a stale writer's append either
//!   lands while the newer epoch's fence still exists (and collides), or
//!   is never acknowledged.

mod deletions;
mod flush;
mod index_task;
mod latency;
mod load;
mod manifest;
mod options;
mod replay;
mod wal_task;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use datafusion::arrow::array::{RecordBatch, UInt32Array};
use datafusion::arrow::compute::take_record_batch;
use object_store::ObjectStore;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

pub(crate) use load::{LoadRun, RunTarget};
pub use manifest::ShardManifest;
pub(crate) use manifest::versions as manifest_versions;
pub use options::{ShardSlice, WriterOptions, parse_duration};
use replay::Replayed;

use crate::blob::PackReader;
use crate::error::{Error, Result};
use crate::memtable::{MemLayer, MemTable, Watermark};
use crate::schema::{KeyedBatch, TableSchema};
use crate::sstable::{self, SstableFile, SstableReader};
use crate::store::{CommitOptions, Versioned, VersionedObjects, paths};
use crate::wal::WalLog;
use latency::LatencyHistogram;

/// The longest a claim waits for other writers' turns to end.
const CLAIM_PATIENCE: Duration = Duration::from_secs(30);

/// A writer taking a shard back seals a replayed WAL tail longer than
/// this many entries (see [`ShardWriter::open_as`]).
const SEAL_REPLAYED_ENTRIES: u64 = 256;

/// Counters of one shard writer (see [`crate::Table::stats`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriterStats {
    /// The writer's epoch.
    pub epoch: u64,
    /// Puts and deletes accepted since open (replay not counted).
    pub puts: u64,
    /// Rows of those puts and deletes.
    pub rows: u64,
    /// WAL entries appended, and their bytes.
    pub wal_appends: u64,
    /// Bytes of [`WriterStats::wal_appends`].
    pub wal_bytes: u64,
    /// Blob packs written (one per WAL append, and per bulk load run, with
    /// long blob values), and their bytes.
    pub blob_packs: u64,
    /// See [`WriterStats::blob_packs`].
    pub blob_pack_bytes: u64,
    /// Blob packs deleted because nothing names them any more, and the
    /// bytes that reclaimed.
    pub blob_packs_deleted: u64,
    /// See [`WriterStats::blob_packs_deleted`].
    pub blob_pack_bytes_deleted: u64,
    /// Packs whose live values compactions moved into new packs because
    /// little of them was live (see [`WriterOptions::blob_repack_below`]),
    /// and the bytes copied.
    pub blob_packs_repacked: u64,
    /// See [`WriterStats::blob_packs_repacked`].
    pub blob_bytes_repacked: u64,
    /// Bytes the live rows of the shard's SSTables name in blob packs
    /// (estimated: each SSTable's bytes scaled by its share of rows not
    /// marked deleted), and bytes of the packs they may name (as of the
    /// last collection of packs, plus the packs flushed since): their
    /// ratio is the live share of the shard's packs.
    pub blob_live_bytes: u64,
    /// See [`WriterStats::blob_live_bytes`].
    pub blob_stored_bytes: u64,
    /// Sum and maximum of WAL append latencies.
    pub append_latency_total: Duration,
    /// See [`WriterStats::append_latency_total`].
    pub append_latency_max: Duration,
    /// Median and 99th percentile of WAL append latencies (each at most a
    /// quarter above the true value; zero before the first append).
    pub append_latency_p50: Duration,
    /// See [`WriterStats::append_latency_p50`].
    pub append_latency_p99: Duration,
    /// Not yet durable: rows, bytes, and puts (batches).
    pub pending_rows: u64,
    /// See [`WriterStats::pending_rows`].
    pub pending_bytes: u64,
    /// See [`WriterStats::pending_rows`].
    pub pending_batches: u64,
    /// MemTable batches that are durable, and that readers see.
    pub durable_batches: u64,
    /// See [`WriterStats::durable_batches`].
    pub visible_batches: u64,
    /// MemTable batches in the vector index (all of them when the table
    /// has no vector column).
    pub indexed_batches: u64,
    /// The next WAL position this writer will append at.
    pub next_position: u64,
    /// Generation of the active MemTable, and MemTables frozen and not yet
    /// in an SSTable.
    pub generation: u64,
    /// See [`WriterStats::generation`].
    pub frozen_memtables: u64,
    /// Bytes of rows in MemTables (active and frozen).
    pub memtable_bytes: u64,
    /// SSTables in the shard manifest; flushes and compactions committed.
    pub sstables: u64,
    /// See [`WriterStats::sstables`].
    pub flushes: u64,
    /// See [`WriterStats::sstables`].
    pub compactions: u64,
    /// When this writer last committed a flush, and a compaction.
    pub last_flush: Option<SystemTime>,
    /// See [`WriterStats::last_flush`].
    pub last_compaction: Option<SystemTime>,
}

/// What the WAL task has made durable so far, what the flush task has
/// moved to SSTables, or why the writer stopped.
#[derive(Debug, Clone, Default)]
struct Progress {
    /// Every batch of generations below `generation`, and the first
    /// `batches` of `generation`, are durable.
    generation: u64,
    batches: usize,
    /// The generation being indexed and its batches indexed so far.
    indexed_generation: u64,
    indexed_batches: usize,
    rows: u64,
    /// Bytes of durable rows, and of rows in flushed generations.
    bytes: u64,
    flushed_bytes: u64,
    /// Every generation below this one is in SSTables (once one flushed).
    flushed_generation: u64,
    /// The WAL task ended: no append is in flight, none will start.
    wal_done: bool,
    error: Option<Arc<Stop>>,
}

/// Why a writer stopped, and whether a call has failed with it.
#[derive(Debug)]
struct Stop {
    error: Error,
    told: AtomicBool,
}

impl Stop {
    /// The error, for a call it fails: [`ShardWriter::close`] does not
    /// report it again.
    fn tell(&self) -> Error {
        self.told.store(true, Ordering::Release);
        shared_error(&self.error)
    }
}

impl Progress {
    /// Whether the first `batches` of `generation` are indexed and (if
    /// `durable`) durable.
    fn covers(&self, generation: u64, batches: usize, durable: bool) -> bool {
        let past = |at: u64, done: usize| at > generation || (at == generation && done >= batches);
        (!durable || past(self.generation, self.batches))
            && past(self.indexed_generation, self.indexed_batches)
    }

    /// Whether the first `batches` of `generation` are in the WAL.
    fn durable_through(&self, generation: u64, batches: usize) -> bool {
        self.generation > generation || (self.generation == generation && self.batches >= batches)
    }
}

#[derive(Default)]
struct Counters {
    puts: AtomicU64,
    rows: AtomicU64,
    wal_appends: AtomicU64,
    wal_bytes: AtomicU64,
    blob_packs: AtomicU64,
    blob_pack_bytes: AtomicU64,
    blob_packs_deleted: AtomicU64,
    blob_pack_bytes_deleted: AtomicU64,
    blob_packs_repacked: AtomicU64,
    blob_bytes_repacked: AtomicU64,
    blob_stored_bytes: AtomicU64,
    latency_total_us: AtomicU64,
    latency_max_us: AtomicU64,
    latency: LatencyHistogram,
    next_position: AtomicU64,
    flushes: AtomicU64,
    compactions: AtomicU64,
    /// Unix milliseconds of the last flush and compaction (0: none yet).
    last_flush_ms: AtomicU64,
    last_compaction_ms: AtomicU64,
    /// Microseconds after `opened` when ownership was last confirmed.
    owned_at_us: AtomicU64,
}

/// One MemTable generation.
struct Generation {
    number: u64,
    memtable: Arc<MemTable>,
    /// WAL position of its newest entry (0: none yet).
    last_position: AtomicU64,
    /// Set once it is frozen and every batch is durable: it may be flushed.
    sealed: AtomicBool,
    /// A bulk load's SSTables: the content of an empty generation, which
    /// spans one number per SSTable (see [`load`]).
    ingested: Mutex<Vec<SstableFile>>,
    /// Set when its flush found the load of `ingested` listed as dead
    /// ([`manifest::ShardManifest::dead_loads`]) and committed nothing.
    refused: AtomicBool,
}

/// The bytes the rows of `file` not marked deleted name in blob packs,
/// estimated from its share of such rows.
fn live_blob_bytes(file: &SstableFile) -> u64 {
    let marked = file.deletions.as_ref().map_or(0, |d| d.rows);
    let live = file.rows.saturating_sub(marked);
    (file.blob_bytes as u128 * live as u128 / file.rows.max(1) as u128) as u64
}

impl Generation {
    fn new(number: u64, schema: &Arc<TableSchema>) -> Arc<Self> {
        Arc::new(Self {
            number,
            memtable: Arc::new(MemTable::indexed(Arc::clone(schema))),
            last_position: AtomicU64::new(0),
            sealed: AtomicBool::new(false),
            ingested: Mutex::default(),
            refused: AtomicBool::new(false),
        })
    }
}

/// What readers see of the shard: MemTables and the manifest's SSTables.
/// Changed as a whole, under its lock, when a flush or compaction commits.
struct Layers {
    /// Oldest first; the last one is active.
    generations: Vec<Arc<Generation>>,
    manifest: Versioned<ShardManifest>,
    sstables: Arc<Vec<SstableFile>>,
    /// Earlier `sstables` lists that readers (snapshots) may still hold:
    /// a retired SSTable or deletion vector in one that is still held is
    /// not deleted, whatever the grace period.
    replaced: Vec<Weak<Vec<SstableFile>>>,
}

impl Layers {
    fn active(&self) -> &Arc<Generation> {
        self.generations
            .last()
            .expect("there is always an active MemTable")
    }
}

struct Shared {
    schema: Arc<TableSchema>,
    store: Arc<dyn ObjectStore>,
    shard_dir: object_store::path::Path,
    versions: VersionedObjects,
    reader: Arc<SstableReader>,
    wal: WalLog,
    epoch: u64,
    options: WriterOptions,
    /// Serializes MemTable appends: one put at a time enters the table.
    append_lock: Mutex<()>,
    layers: RwLock<Layers>,
    /// Rows and bytes ever put (replay included).
    written_rows: AtomicU64,
    written_bytes: AtomicU64,
    /// Bytes of long blob values put that no MemTable holds any more (see
    /// [`MemTable::set_packed`](crate::memtable::MemTable::set_packed)).
    released_bytes: AtomicU64,
    /// Wakes the WAL task, the flush task, the index task, the compaction
    /// task.
    wake: Notify,
    flush_wake: Notify,
    index_wake: Notify,
    compaction_wake: Notify,
    closing: AtomicBool,
    /// Set when the index task has exited (the WAL task's end is in
    /// `progress`).
    index_done: AtomicBool,
    progress: watch::Sender<Progress>,
    counters: Counters,
    opened: Instant,
    /// Fences this writer knows of (replayed or its own), position to
    /// when written (ms), that the manifest may not list yet.
    fences: Mutex<BTreeMap<u64, u64>>,
    /// Fences this writer deleted, to drop from the manifest's list.
    fences_deleted: Mutex<BTreeSet<u64>>,
    /// WAL data entries at or below this are deleted (recorded in the
    /// manifest with the next commit).
    wal_deleted_through: AtomicU64,
    /// Held while flushing: one flush at a time.
    maintenance: tokio::sync::Mutex<()>,
    /// Held while compacting: one compaction at a time (flushes go on).
    compacting: tokio::sync::Mutex<()>,
    /// Set when the flush task has exited: the compaction task ends once
    /// nothing is due.
    flush_done: AtomicBool,
    /// Puts hold it shared while they enter the MemTable; a bulk load
    /// holds it alone while it commits (see [`load`]).
    ingest_gate: tokio::sync::RwLock<()>,
    /// Bulk loads still committing other shards of the table: compaction
    /// waits for them (marked due meanwhile) so it does not compete with
    /// them for the cores (see [`ShardWriter::hold_compaction`]).
    compaction_holds: AtomicUsize,
    compaction_due: AtomicBool,
}

/// The writer of one shard. See the module doc for what it guarantees.
pub struct ShardWriter {
    shared: Arc<Shared>,
    /// How long the open took after its claim (the fence and the replay).
    open_took: Duration,
    /// Whether the shard held no rows when this writer opened it.
    opened_empty: bool,
    /// The WAL, flush, index and compaction tasks.
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for ShardWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardWriter")
            .field("epoch", &self.shared.epoch)
            .finish_non_exhaustive()
    }
}

/// A put's durability: [`Durability::wait`] returns once it is durable
/// and visible.
#[derive(Debug)]
pub struct Durability {
    progress: watch::Receiver<Progress>,
    generation: u64,
    target: usize,
    durable: bool,
}

impl Durability {
    /// Waits until the put is visible: its vectors indexed and, if the
    /// writer is durable, its WAL entry written; fails if the writer
    /// stopped before that. A put whose writer stopped once its WAL entry
    /// was written succeeds (the shard's next writer serves it), and a
    /// failure waits for the WAL append in flight, so an [`Error::Fenced`]
    /// from here means the put wrote nothing.
    pub async fn wait(mut self) -> Result<()> {
        let (generation, target, durable) = (self.generation, self.target, self.durable);
        let done = |p: &Progress| p.covers(generation, target, durable);
        let progress = self
            .progress
            .wait_for(|p| done(p) || (p.error.is_some() && p.wal_done))
            .await
            .map_err(|_| Error::Poisoned("the shard writer is gone".into()))?;
        if done(&progress) || progress.durable_through(generation, target) {
            return Ok(());
        }
        Err(progress.error.as_ref().expect("checked above").tell())
    }
}

/// A typed copy of an error many waiters share.
fn shared_error(error: &Error) -> Error {
    match error {
        Error::Fenced {
            path,
            epoch,
            by_epoch,
        } => Error::Fenced {
            path: path.clone(),
            epoch: *epoch,
            by_epoch: *by_epoch,
        },
        // Already a stop: said once.
        Error::Poisoned(reason) => Error::Poisoned(reason.clone()),
        other => Error::Poisoned(other.to_string()),
    }
}

impl ShardWriter {
    /// Opens shard `shard` of the table at `location`: claims it (new
    /// epoch), fences the WAL, replays it into fresh MemTables and starts
    /// the WAL and flush tasks. A corrupt or missing WAL entry fails the
    /// open, naming the object. While a writer that took the shard back
    /// from another one has its turn, the claim waits for the turn's end.
    #[cfg(any(test, feature = "testing"))]
    pub async fn open(
        store: Arc<dyn ObjectStore>,
        location: &str,
        shard: u32,
        schema: Arc<TableSchema>,
        options: WriterOptions,
    ) -> Result<Self> {
        Self::open_as(store, location, shard, schema, options, None).await
    }

    /// [`ShardWriter::open`]; with `taking_back`, for a writer taking the
    /// shard back from another one that took it over, where the last open
    /// took `taking_back` after its claim: it takes a turn (other writers
    /// wait for its end before they claim) of [`WriterOptions::turn`] plus
    /// twice that, so that the turn covers this open's own replay as well
    /// as the write it opens for, however slow the store; and a long
    /// replayed WAL tail is sealed at once, so that the turn flushes it and
    /// the next writer replays little.
    pub(crate) async fn open_as(
        store: Arc<dyn ObjectStore>,
        location: &str,
        shard: u32,
        schema: Arc<TableSchema>,
        options: WriterOptions,
        taking_back: Option<Duration>,
    ) -> Result<Self> {
        options.check()?;
        if shard >= schema.shards {
            return Err(Error::invalid(format!(
                "shard {shard} does not exist (the table has {})",
                schema.shards
            )));
        }
        let dir = paths::shard_dir(location, shard);
        let versions = manifest::versions(Arc::clone(&store), &dir, &options.commit);
        let claimed_at = Instant::now();
        let turn = taking_back.map(|open| (options.turn() + 2 * open).min(CLAIM_PATIENCE));
        let claimed = manifest::claim(&versions, turn, CLAIM_PATIENCE, options.fence_grace).await?;
        let after_claim = Instant::now();
        let (epoch, replay_after) = (claimed.state.epoch, claimed.state.replay_after);
        let wal = WalLog::new(Arc::clone(&store), paths::wal_dir(&dir))
            .reading_heads(!schema.blobs.is_empty());
        let fence = wal.fence(epoch, replay_after).await?;

        let Replayed {
            generations,
            fences,
            rows,
            bytes,
        } = replay::replay(
            &wal,
            &versions,
            &claimed.state,
            fence,
            &schema,
            &options,
            taking_back.is_some(),
        )
        .await?;
        let active_number = generations.last().expect("pushed above").number;
        let active_batches = generations
            .last()
            .expect("pushed above")
            .memtable
            .written_batches();
        log::debug!(
            "shard {shard} of {location}: epoch {epoch}, replayed {rows} rows in {} generations up to fence {fence}",
            generations.len()
        );

        let (progress, _) = watch::channel(Progress {
            generation: active_number,
            batches: active_batches,
            indexed_generation: active_number,
            indexed_batches: active_batches,
            rows,
            bytes,
            flushed_bytes: 0,
            flushed_generation: 0,
            wal_done: false,
            error: None,
        });
        let opened_empty = rows == 0 && claimed.state.sstables.is_empty();
        let sstables = Arc::new(claimed.state.sstables.clone());
        let wal_deleted_through = claimed.state.wal_deleted_through;
        let shared = Arc::new(Shared {
            reader: Arc::new(SstableReader::new(Arc::clone(&store), Arc::clone(&schema))),
            schema,
            store,
            shard_dir: dir,
            versions,
            wal,
            epoch,
            options,
            append_lock: Mutex::new(()),
            layers: RwLock::new(Layers {
                generations,
                manifest: claimed,
                sstables,
                replaced: Vec::new(),
            }),
            written_rows: AtomicU64::new(rows),
            written_bytes: AtomicU64::new(bytes),
            released_bytes: AtomicU64::new(0),
            wake: Notify::new(),
            flush_wake: Notify::new(),
            compaction_wake: Notify::new(),
            index_wake: Notify::new(),
            closing: AtomicBool::new(false),
            index_done: AtomicBool::new(false),
            progress,
            counters: Counters {
                next_position: AtomicU64::new(fence + 1),
                ..Counters::default()
            },
            opened: claimed_at,
            fences: Mutex::new(fences),
            fences_deleted: Mutex::default(),
            wal_deleted_through: AtomicU64::new(wal_deleted_through),
            maintenance: tokio::sync::Mutex::new(()),
            compacting: tokio::sync::Mutex::new(()),
            flush_done: AtomicBool::new(false),
            ingest_gate: tokio::sync::RwLock::new(()),
            compaction_holds: AtomicUsize::new(0),
            compaction_due: AtomicBool::new(false),
        });
        // The claim made this writer the owner.
        shared.confirm_owned(claimed_at);
        let wal_task = tokio::spawn(Shared::guarded(
            Arc::clone(&shared),
            Arc::clone(&shared).run_wal(fence + 1),
        ));
        let flush_task = tokio::spawn(Shared::guarded(Arc::clone(&shared), {
            let shared = Arc::clone(&shared);
            async move {
                Arc::clone(&shared).run_flush().await;
                shared.flush_done.store(true, Ordering::Release);
                shared.compaction_wake.notify_one();
            }
        }));
        let compaction_task = tokio::spawn(Shared::guarded(
            Arc::clone(&shared),
            Arc::clone(&shared).run_compaction(),
        ));
        let index_task = tokio::spawn(Shared::guarded(
            Arc::clone(&shared),
            Arc::clone(&shared).run_index(),
        ));
        Ok(Self {
            shared,
            open_took: after_claim.elapsed(),
            opened_empty,
            tasks: Mutex::new(vec![wal_task, flush_task, index_task, compaction_task]),
        })
    }

    /// How long the open took after its claim: the fence and the replay,
    /// which a turn taken to take the shard back must cover.
    pub(crate) fn open_took(&self) -> Duration {
        self.open_took
    }

    /// Whether the shard held no rows (no SSTable, nothing in the WAL)
    /// when this writer opened it: as a shard created by this open does,
    /// which a drop of its table may not have sealed (see
    /// [`crate::Table`]'s writer open).
    pub(crate) fn opened_empty(&self) -> bool {
        self.opened_empty
    }

    /// The writer's epoch.
    #[cfg(any(test, feature = "testing"))]
    pub fn epoch(&self) -> u64 {
        self.shared.epoch
    }

    /// What a reader may see of the shard now: the visible batches of every
    /// MemTable not yet in an SSTable (oldest first), the manifest's
    /// SSTables, and how far they reach. `crate::table` makes snapshots of
    /// them.
    pub fn layers(&self) -> (Vec<MemLayer>, Arc<Vec<SstableFile>>, Watermark) {
        let layers = self.shared.layers.read().expect("layers poisoned");
        // Newest first: a batch of a newer generation becomes visible only
        // after every batch of the older ones, so reading the visible
        // counts in this order yields a prefix of the log.
        let mut memtables: Vec<MemLayer> = layers
            .generations
            .iter()
            .rev()
            .map(|g| MemLayer {
                batches: g.memtable.visible_batches(),
                memtable: Arc::clone(&g.memtable),
            })
            .collect();
        memtables.reverse();
        // The first generation not seen whole: rows written but not yet
        // visible (a frozen generation's last puts too), or a load's runs
        // not yet in the manifest.
        let seen = (layers.generations.iter().zip(&memtables))
            .find_map(|(g, layer)| {
                let loading = !g.ingested.lock().expect("ingested poisoned").is_empty();
                let rows = layer.memtable.rows_within(layer.batches);
                (loading || layer.batches < layer.memtable.written_batches()).then_some(Watermark {
                    generation: g.number,
                    rows: if loading { 0 } else { rows },
                })
            })
            .unwrap_or_else(|| {
                let active = memtables
                    .last()
                    .expect("there is always an active MemTable");
                Watermark {
                    generation: layers.active().number,
                    rows: active.memtable.rows_within(active.batches),
                }
            });
        (memtables, Arc::clone(&layers.sstables), seen)
    }

    /// The reader of this shard's SSTables (its caches are shared).
    pub fn sstable_reader(&self) -> &Arc<SstableReader> {
        &self.shared.reader
    }

    /// A reader of this shard's blob packs.
    pub fn pack_reader(&self) -> PackReader {
        PackReader::new(
            Arc::clone(&self.shared.store),
            self.shared.shard_dir.clone(),
        )
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
            .map(|stop| shared_error(&stop.error))
    }

    /// [`Error::LostRows`] if this writer acknowledged puts before they
    /// were durable and stopped before a WAL entry held them all; `None`
    /// for a durable writer, whose puts are acknowledged only once durable.
    pub fn lost_rows(&self) -> Option<Error> {
        if self.shared.options.durable {
            return None;
        }
        let cause = self.stopped()?;
        let rows = self.shared.pending_rows(&self.shared.progress.borrow());
        (rows > 0).then(|| Error::LostRows {
            shard: self.shared.shard_dir.to_string(),
            rows,
            cause: cause.to_string(),
        })
    }

    /// Whether this writer still owns the shard: the shard manifest still
    /// names its epoch (a newer writer claims it there before it writes
    /// anything). One existence check, in the common case.
    pub async fn still_owns_shard(&self) -> Result<bool> {
        Ok(self.shared.newer_claim().await?.is_none())
    }

    /// Whether ownership was confirmed less than `max_age` ago (no I/O).
    pub fn owned_within(&self, max_age: Duration) -> bool {
        self.shared.owned_within(max_age)
    }

    /// Puts `batches` (user rows of the table; several batches become
    /// visible together) and waits until they are visible (and, in durable
    /// mode, durable).
    /// Bad input is an [`Error::InvalidInput`] and writes nothing.
    #[cfg(any(test, feature = "testing"))]
    pub async fn put(&self, batches: &[RecordBatch]) -> Result<()> {
        let durability = self.put_nowait(batches).await?;
        durability.wait().await?;
        Ok(())
    }

    /// Like [`ShardWriter::put`] but returns once the rows are in the
    /// MemTable (after backpressure); the handle waits for visibility.
    #[cfg(any(test, feature = "testing"))]
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
    #[cfg(any(test, feature = "testing"))]
    pub async fn delete(&self, keys: &RecordBatch) -> Result<()> {
        let durability = self.delete_nowait(keys).await?;
        durability.wait().await?;
        Ok(())
    }

    /// Like [`ShardWriter::delete`] without waiting for durability.
    #[cfg(any(test, feature = "testing"))]
    pub async fn delete_nowait(&self, keys: &RecordBatch) -> Result<Durability> {
        let schema = &self.shared.schema;
        self.put_keyed(vec![schema.keyed(schema.tombstones(keys)?)?])
            .await
    }

    /// Appends already checked rows in stored form with their key
    /// encodings (see [`TableSchema::keyed`]) as one put.
    pub(crate) async fn put_keyed(&self, put: Vec<KeyedBatch>) -> Result<Durability> {
        let appended = self.append_keyed(Append::Put(put)).await?;
        let Ok((durability, _)) = appended else {
            unreachable!("a put has nothing to wait for")
        };
        Ok(durability.expect("a put with rows appends them"))
    }

    /// Appends the tombstones of a DELETE that read a snapshot reaching
    /// `seen` (keyed, like [`ShardWriter::put_keyed`]), except those of
    /// keys written since: a DELETE deletes only versions it saw, never a
    /// row another statement wrote meanwhile. Returns the put (`None` if
    /// no tombstone was left) and how many tombstones it holds. Fails with
    /// [`Error::DeleteConflict`], writing nothing, if rows written since
    /// the snapshot are no longer in a MemTable (a flush or a load took
    /// them), where they cannot be told from the ones it saw.
    pub(crate) async fn delete_seen(
        &self,
        tombstones: Vec<KeyedBatch>,
        seen: Watermark,
    ) -> Result<(Option<Durability>, u64)> {
        let mut since = Since {
            seen,
            checked: HashSet::new(),
            changed: HashSet::new(),
        };
        // Each round reads the SSTables that flushes and loads added since
        // the snapshot (outside the append lock); the append then finds
        // none unread, or another round reads the ones that came meanwhile.
        let mut tombstones = tombstones;
        for _ in 0..DELETE_ROUNDS {
            let unread: Vec<SstableFile> = {
                let layers = self.shared.layers.read().expect("layers poisoned");
                since.unread(&layers)
            };
            if !unread.is_empty() {
                self.read_changed(&tombstones, &unread, &mut since).await?;
            }
            match (self.append_keyed(Append::Delete(tombstones, &since))).await? {
                Ok(done) => return Ok(done),
                Err(unappended) => tombstones = unappended,
            }
        }
        Err(Error::DeleteConflict(self.shared.shard_dir.to_string()))
    }

    /// Adds to `since` the keys of `tombstones` that `files` (SSTables
    /// added since the snapshot) hold a version of; fails if one holds a
    /// version it cannot tell from one the snapshot saw.
    async fn read_changed(
        &self,
        tombstones: &[KeyedBatch],
        files: &[SstableFile],
        since: &mut Since,
    ) -> Result<()> {
        let schema = &self.shared.schema;
        // The keys sorted and distinct, as a lookup takes them.
        let batches: Vec<RecordBatch> = tombstones.iter().map(|(b, _)| b.clone()).collect();
        let (distinct, order) = sstable::sorted(schema, &batches)?;
        let sorted = schema.key_columns(&distinct);
        let encodings: Vec<&Box<[u8]>> = (tombstones.iter())
            .flat_map(|(_, k)| k.as_ref().expect("tombstones have keys"))
            .collect();
        for file in files {
            let found = self.shared.reader.keys_in(file, &sorted).await?;
            // A file of rows all written after the snapshot, or one that
            // also holds rows it saw (a flush of the generation it ended
            // in, or a compaction over it).
            let all_after = file.first_generation > since.seen.generation
                || (file.first_generation == since.seen.generation && since.seen.rows == 0);
            if !found.is_empty() && !all_after {
                return Err(Error::DeleteConflict(self.shared.shard_dir.to_string()));
            }
            for i in found {
                since.changed.insert(encodings[order[i] as usize].clone());
            }
            since.checked.insert(file.path.clone());
        }
        Ok(())
    }

    /// Appends a put, or the tombstones of [`ShardWriter::delete_seen`]
    /// but those of keys changed since, and returns the put (none if
    /// nothing was left to append) and its rows; the tombstones back,
    /// nothing appended, if SSTables the delete did not read came
    /// meanwhile.
    async fn append_keyed(&self, append: Append<'_>) -> Result<Appended> {
        let shared = &self.shared;
        self.backpressure().await?;
        let _no_load_committing = shared.ingest_gate.read().await;
        let (generation, end, rows) = {
            let _one_writer = shared.append_lock.lock().expect("append lock poisoned");
            // Checked under the lock `close` sets `closing` under: the WAL
            // task, which reads `closing` before `written`, sees every put
            // that got past here.
            shared.accepting()?;
            let (active, put) = {
                let layers = shared.layers.read().expect("layers poisoned");
                let put = match append {
                    Append::Put(put) => put,
                    Append::Delete(tombstones, since) if !since.unread(&layers).is_empty() => {
                        return Ok(Err(tombstones));
                    }
                    Append::Delete(tombstones, since) => since.unchanged(&layers, tombstones)?,
                };
                (Arc::clone(layers.active()), put)
            };
            let rows = put.iter().map(|(b, _)| b.num_rows() as u64).sum::<u64>();
            if rows == 0 {
                return Ok(Ok((None, 0)));
            }
            let (end, bytes) = active.memtable.append(put);
            if !shared.options.durable {
                active.memtable.mark_durable(end);
            }
            shared.written_rows.fetch_add(rows, Ordering::Relaxed);
            shared
                .written_bytes
                .fetch_add(bytes as u64, Ordering::Relaxed);
            if active.memtable.bytes() >= shared.options.memtable_bytes {
                shared.rotate(1);
            }
            (active.number, end, rows)
        };
        shared.counters.puts.fetch_add(1, Ordering::Relaxed);
        shared.counters.rows.fetch_add(rows, Ordering::Relaxed);
        shared.wake.notify_one();
        shared.index_wake.notify_one();
        let durability = Durability {
            progress: shared.progress.subscribe(),
            generation,
            target: end,
            durable: shared.options.durable,
        };
        Ok(Ok((Some(durability), rows)))
    }

    /// Waits while too many bytes are in memory and not in SSTables.
    async fn backpressure(&self) -> Result<()> {
        let shared = &self.shared;
        let ceiling = shared.options.max_unflushed_bytes as u64;
        let unflushed = |p: &Progress| {
            let released = shared.released_bytes.load(Ordering::Relaxed);
            shared
                .written_bytes
                .load(Ordering::Relaxed)
                .saturating_sub(p.flushed_bytes + released)
        };
        let mut progress = shared.progress.subscribe();
        let ready = progress
            .wait_for(|p| p.error.is_some() || unflushed(p) <= ceiling)
            .await
            .map_err(|_| Error::Poisoned("the shard writer is gone".into()))?;
        match &ready.error {
            Some(stop) => Err(stop.tell()),
            None => Ok(()),
        }
    }

    /// A snapshot of the writer's counters.
    pub fn stats(&self) -> WriterStats {
        let shared = &self.shared;
        let c = &shared.counters;
        let progress = shared.progress.borrow().clone();
        let layers = shared.layers.read().expect("layers poisoned");
        let (mut pending_batches, mut durable_batches, mut visible_batches) = (0, 0, 0);
        let (mut indexed_batches, mut memtable_bytes) = (0, 0);
        for g in &layers.generations {
            indexed_batches += g.memtable.indexed_batches() as u64;
            memtable_bytes += g.memtable.bytes() as u64;
            let written = g.memtable.written_batches() as u64;
            let durable = match g.number.cmp(&progress.generation) {
                std::cmp::Ordering::Less => written,
                std::cmp::Ordering::Equal => progress.batches as u64,
                std::cmp::Ordering::Greater => 0,
            };
            pending_batches += written - durable;
            durable_batches += durable;
            visible_batches += g.memtable.visible_batches() as u64;
        }
        let latency_max = Duration::from_micros(c.latency_max_us.load(Ordering::Relaxed));
        WriterStats {
            epoch: shared.epoch,
            puts: c.puts.load(Ordering::Relaxed),
            rows: c.rows.load(Ordering::Relaxed),
            wal_appends: c.wal_appends.load(Ordering::Relaxed),
            wal_bytes: c.wal_bytes.load(Ordering::Relaxed),
            blob_packs: c.blob_packs.load(Ordering::Relaxed),
            blob_pack_bytes: c.blob_pack_bytes.load(Ordering::Relaxed),
            blob_packs_deleted: c.blob_packs_deleted.load(Ordering::Relaxed),
            blob_pack_bytes_deleted: c.blob_pack_bytes_deleted.load(Ordering::Relaxed),
            blob_packs_repacked: c.blob_packs_repacked.load(Ordering::Relaxed),
            blob_bytes_repacked: c.blob_bytes_repacked.load(Ordering::Relaxed),
            blob_live_bytes: layers.sstables.iter().map(live_blob_bytes).sum(),
            blob_stored_bytes: c.blob_stored_bytes.load(Ordering::Relaxed),
            append_latency_total: Duration::from_micros(c.latency_total_us.load(Ordering::Relaxed)),
            append_latency_max: latency_max,
            // The histogram answers a bucket's bound: never above the max.
            append_latency_p50: c.latency.quantile(0.5).min(latency_max),
            append_latency_p99: c.latency.quantile(0.99).min(latency_max),
            pending_rows: shared.pending_rows(&progress),
            pending_bytes: shared
                .written_bytes
                .load(Ordering::Relaxed)
                .saturating_sub(progress.bytes),
            pending_batches,
            durable_batches,
            visible_batches,
            indexed_batches,
            next_position: c.next_position.load(Ordering::Relaxed),
            generation: layers.active().number,
            frozen_memtables: layers.generations.len() as u64 - 1,
            memtable_bytes,
            sstables: layers.sstables.len() as u64,
            flushes: c.flushes.load(Ordering::Relaxed),
            compactions: c.compactions.load(Ordering::Relaxed),
            last_flush: unix_ms(&c.last_flush_ms),
            last_compaction: unix_ms(&c.last_compaction_ms),
        }
    }

    /// Merges all of the shard's SSTables into one (a major compaction:
    /// tombstones are dropped), after any flush or compaction in progress.
    /// Scans of a compacted shard read one run, with no merge by key.
    pub async fn compact(&self) -> Result<()> {
        if let Some(e) = self.stopped() {
            return Err(e);
        }
        self.shared
            .stopping_on_panic("a compaction", self.shared.compact_all())
            .await
    }

    /// Makes everything put so far durable, flushes every MemTable to an
    /// SSTable, stops the writer's tasks and reports the error that stopped
    /// the writer, unless a call already failed with it. A writer fenced by
    /// a newer one closes without error unless it lost rows
    /// ([`ShardWriter::lost_rows`], always reported): every put it
    /// acknowledged is in the WAL, and the newer writer replayed or will
    /// replay it (the puts it had not acknowledged failed themselves).
    pub async fn close(&self) -> Result<()> {
        {
            let _no_put_in_flight = self
                .shared
                .append_lock
                .lock()
                .expect("append lock poisoned");
            self.shared.closing.store(true, Ordering::Release);
            let active = Arc::clone(self.shared.layers.read().expect("layers poisoned").active());
            if active.memtable.written_batches() > 0 {
                self.shared.rotate(1);
            }
        }
        self.shared.wake.notify_one();
        self.shared.flush_wake.notify_one();
        self.shared.index_wake.notify_one();
        self.shared.compaction_wake.notify_one();
        let tasks = std::mem::take(&mut *self.tasks.lock().expect("task handles poisoned"));
        for task in tasks {
            task.await
                .map_err(|e| Error::Poisoned(format!("shard writer task failed: {e}")))?;
        }
        self.shared.versions.settle().await;
        if let Some(lost) = self.lost_rows() {
            return Err(lost);
        }
        let stop = self.shared.progress.borrow().error.clone();
        match stop.as_deref() {
            Some(Stop {
                error: Error::Fenced { by_epoch, .. },
                ..
            }) => {
                log::debug!(
                    "shard writer of epoch {} closed after a writer of epoch {by_epoch} took over",
                    self.shared.epoch
                );
                Ok(())
            }
            // A call failed with it already.
            Some(stop) if stop.told.load(Ordering::Acquire) => Ok(()),
            Some(stop) => Err(shared_error(&stop.error)),
            None => Ok(()),
        }
    }
}

impl Drop for ShardWriter {
    fn drop(&mut self) {
        // The tasks make pending puts durable and flush frozen MemTables,
        // then exit.
        self.shared.closing.store(true, Ordering::Release);
        self.shared.wake.notify_one();
        self.shared.flush_wake.notify_one();
        self.shared.index_wake.notify_one();
        self.shared.compaction_wake.notify_one();
    }
}

impl Shared {
    /// Rows put and not yet durable, as of `progress`.
    fn pending_rows(&self, progress: &Progress) -> u64 {
        let written = self.written_rows.load(Ordering::Acquire);
        written.saturating_sub(progress.rows)
    }

    /// Whether the writer still takes puts: the error that stopped it, or
    /// that it is closed. Called under the append lock.
    fn accepting(&self) -> Result<()> {
        if let Some(stop) = &self.progress.borrow().error {
            return Err(stop.tell());
        }
        if self.closing.load(Ordering::Acquire) {
            return Err(Error::Poisoned("the shard writer is closed".into()));
        }
        Ok(())
    }

    /// [`Error::Fenced`] naming the manifest version of a newer writer that
    /// claimed the shard, if one did; otherwise records that this writer
    /// owned it when the check started.
    async fn newer_claim(&self) -> Result<Option<Error>> {
        let started = Instant::now();
        let known = self
            .layers
            .read()
            .expect("layers poisoned")
            .manifest
            .clone();
        if self.versions.has_newer(&known).await? {
            let claim = manifest::newer_claim(&self.versions, self.epoch).await?;
            if claim.is_some() {
                return Ok(claim);
            }
        } else if known.version > 0 && !self.versions.exists(known.version).await? {
            // The tip this writer made is gone with nothing after it: the
            // table was dropped and its objects collected (a seal would
            // have been a newer version). Appending would write into a
            // location no table has.
            let dir = self.shard_dir.as_ref();
            return Err(Error::table_dropped(
                paths::table_of(dir).unwrap_or(dir),
                &format!(
                    "dropped while this writer ran: the manifest version {} it made \
                     is gone; open the table again by name",
                    known.version
                ),
            ));
        } else {
            // Confirmed as the tip: the next check is one existence check.
            let mut layers = self.layers.write().expect("layers poisoned");
            if layers.manifest.version == known.version {
                layers.manifest = known.confirmed();
            }
        }
        self.confirm_owned(started);
        Ok(None)
    }

    /// Whether ownership was confirmed less than `max_age` ago (no I/O).
    fn owned_within(&self, max_age: Duration) -> bool {
        let at = self.counters.owned_at_us.load(Ordering::Acquire);
        at > 0 && self.opened.elapsed().as_micros() as u64 - at < max_age.as_micros() as u64
    }

    /// Records that nobody else had written to the shard by `at`.
    fn confirm_owned(&self, at: Instant) {
        let at = at.saturating_duration_since(self.opened).as_micros() as u64;
        self.counters
            .owned_at_us
            .fetch_max(at.max(1), Ordering::AcqRel);
    }

    /// Freezes the active MemTable and starts a generation `span` numbers
    /// later (1, except after a bulk load's runs). Called under the append
    /// lock.
    fn rotate(&self, span: u64) {
        let mut layers = self.layers.write().expect("layers poisoned");
        let next = Generation::new(layers.active().number + span, &self.schema);
        layers.generations.push(next);
        self.wake.notify_one();
        self.index_wake.notify_one();
    }

    /// Runs one of the writer's tasks; if it panics, the writer stops (so
    /// no put waits forever) and counts the WAL as done (so `close` does
    /// not either).
    async fn guarded(self: Arc<Self>, task: impl Future<Output = ()>) {
        use futures::FutureExt;
        if std::panic::AssertUnwindSafe(task)
            .catch_unwind()
            .await
            .is_err()
        {
            self.stop(Error::Poisoned("a shard writer task panicked".into()));
            self.progress.send_modify(|p| p.wal_done = true);
            self.index_done.store(true, Ordering::Release);
            self.flush_wake.notify_one();
        }
    }

    /// Runs `op`, a change of the writer's state made in its caller's
    /// task; if it panics, the writer stops (its state may be half
    /// changed, so the table opens the shard afresh) and the panic is
    /// returned as [`Error::Poisoned`].
    async fn stopping_on_panic<T>(
        &self,
        what: &str,
        op: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        use futures::FutureExt;
        let panic = match std::panic::AssertUnwindSafe(op).catch_unwind().await {
            Ok(done) => return done,
            Err(panic) => panic,
        };
        let message = match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
            (Some(message), _) => message.to_string(),
            (None, Some(message)) => message.clone(),
            (None, None) => "no message".into(),
        };
        self.stop(Error::Poisoned(format!("{what} panicked: {message}")));
        // The stop this panic caused, or one before it.
        let stop = self.progress.borrow().error.clone();
        Err(stop.expect("stopped above").tell())
    }

    /// Stops the writer with `error`: every waiting and later put gets it.
    fn stop(&self, error: Error) {
        match &error {
            // Another writer took over: routine with several writers.
            Error::Fenced { .. } => {
                log::debug!("shard writer of epoch {} stopped: {error}", self.epoch)
            }
            _ => log::warn!("shard writer of epoch {} stopped: {error}", self.epoch),
        }
        self.progress.send_modify(|p| {
            p.error.get_or_insert(Arc::new(Stop {
                error,
                told: AtomicBool::new(false),
            }));
        });
        self.wake.notify_one();
        self.flush_wake.notify_one();
        self.index_wake.notify_one();
        self.compaction_wake.notify_one();
    }
}

/// Rounds of reading the SSTables added since a DELETE's snapshot before
/// it gives up (each round follows a flush or load that came during the
/// one before).
const DELETE_ROUNDS: usize = 8;

/// What [`ShardWriter::append_keyed`] appends.
enum Append<'a> {
    /// A put's rows.
    Put(Vec<KeyedBatch>),
    /// A DELETE's tombstones, with what it found written since its
    /// snapshot.
    Delete(Vec<KeyedBatch>, &'a Since),
}

/// What [`ShardWriter::append_keyed`] did: the put and its rows, or a
/// DELETE's tombstones back, not appended.
type Appended = std::result::Result<(Option<Durability>, u64), Vec<KeyedBatch>>;

/// What a DELETE found written since the snapshot it read (see
/// [`ShardWriter::delete_seen`]).
struct Since {
    seen: Watermark,
    /// The SSTables added since that it read.
    checked: HashSet<String>,
    /// Keys they hold a version of (encoded).
    changed: HashSet<Box<[u8]>>,
}

impl Since {
    /// The SSTables in `layers` (a load's included) holding rows written
    /// after the snapshot that it has not read.
    fn unread(&self, layers: &Layers) -> Vec<SstableFile> {
        let new = |f: &&SstableFile| {
            f.generation >= self.seen.generation && !self.checked.contains(&f.path)
        };
        let mut files: Vec<SstableFile> = layers.sstables.iter().filter(new).cloned().collect();
        for g in (layers.generations.iter()).filter(|g| g.number >= self.seen.generation) {
            let loaded = g.ingested.lock().expect("ingested poisoned");
            files.extend(loaded.iter().filter(new).cloned());
        }
        files
    }

    /// The rows of `tombstones` whose key has no version written after the
    /// snapshot: in the SSTables it read, or in the MemTables of `layers`.
    fn unchanged(&self, layers: &Layers, tombstones: Vec<KeyedBatch>) -> Result<Vec<KeyedBatch>> {
        let newer: Vec<&Arc<Generation>> = (layers.generations.iter())
            .filter(|g| g.number >= self.seen.generation)
            .collect();
        let changed = |key: &[u8]| {
            self.changed.contains(key)
                || newer.iter().any(|g| match g.memtable.newest_row(key) {
                    Some(row) => g.number > self.seen.generation || row >= self.seen.rows,
                    None => false,
                })
        };
        let mut kept = Vec::with_capacity(tombstones.len());
        for (batch, keys) in tombstones {
            let keys = keys.expect("tombstones have keys");
            let rows: Vec<u32> = (0..keys.len() as u32)
                .filter(|&i| !changed(&keys[i as usize]))
                .collect();
            if rows.len() == keys.len() {
                kept.push((batch, Some(keys)));
            } else if !rows.is_empty() {
                let batch = take_record_batch(&batch, &UInt32Array::from(rows.clone()))?;
                let keys = rows.iter().map(|&i| keys[i as usize].clone()).collect();
                kept.push((batch, Some(keys)));
            }
        }
        Ok(kept)
    }
}

/// The time in a counter of Unix milliseconds; none for 0.
fn unix_ms(counter: &AtomicU64) -> Option<SystemTime> {
    match counter.load(Ordering::Relaxed) {
        0 => None,
        ms => Some(SystemTime::UNIX_EPOCH + Duration::from_millis(ms)),
    }
}

/// Seals shard `shard` of the dropped table at `location` (see
/// [`manifest::seal`]): its manifest claims the next epoch for good and
/// its WAL gets that epoch's fence.
pub(crate) async fn seal_dropped_shard(
    store: Arc<dyn ObjectStore>,
    location: &str,
    shard: u32,
    commit: &CommitOptions,
) -> Result<()> {
    let dir = paths::shard_dir(location, shard);
    let versions = manifest::versions(Arc::clone(&store), &dir, commit);
    let sealed = manifest::seal(&versions).await?;
    WalLog::new(store, paths::wal_dir(&dir))
        .fence(sealed.state.epoch, sealed.state.replay_after)
        .await?;
    versions.settle().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_is_said_once() {
        let stopped = Error::Poisoned("the flush failed 6 times".into());
        assert_eq!(
            shared_error(&stopped).to_string(),
            "shard writer stopped: the flush failed 6 times; the rows it acknowledged as durable are in the WAL, and the table's next write opens the shard again"
        );
        let other = Error::invalid("bad");
        assert_eq!(
            shared_error(&other).to_string(),
            format!(
                "shard writer stopped: {other}; the rows it acknowledged as durable are in the \
                 WAL, and the table's next write opens the shard again"
            )
        );
    }
}
