//! [`Table`]: one table of a root as this process uses it — the Rust API
//! for `put`, `delete`, `get` and scans, and what the SQL layer runs on.
//!
//! Writes route by the primary key's shard (see [`crate::schema::key`]);
//! a table without a key is append-only and sends each batch to the next
//! shard in turn. Each shard's writer is opened on first write (one per
//! shard per process) and re-opened after it stopped (fenced by another
//! process, or poisoned).
//!
//! **Many writers of one table.** A shard has one writer at a time; a
//! process that writes a shard another process owns takes it over (a new
//! epoch fences the old writer, which stops; see [`ShardWriter`]). A write
//! ([`Table::put`], [`Table::delete`], one SQL statement) is one put per
//! shard, and a shard's part that fails because its writer was fenced
//! before the part became durable provably wrote nothing: the part is put
//! again through a re-opened writer, with jittered backoff, for up to
//! [`TAKEOVER_PATIENCE`]. The re-opened writer takes a turn that other
//! writers wait for, long enough for its replay and its put however slow
//! the store. So concurrent writers of one table all succeed; each
//! takeover costs a claim, a fence and a replay of the shard's unflushed
//! WAL. A part that became durable is never reported as failed, even when
//! its writer is fenced right after.
//!
//! Reads take a [`ShardSnapshot`] of each shard: from this process's
//! writer when it still owns the shard (checked with one existence check
//! on the shard manifest), otherwise from the shard manifest (one
//! existence check per query when unchanged) and the durable WAL after its
//! cursor ([`WalTail`]). Either way a scan sees every acknowledged durable
//! row. [`Table::get`] may trust a recent check (see
//! [`WriterOptions::owner_check_interval`]).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use datafusion::arrow::compute::take_record_batch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::execution::memory_pool::{MemoryPool, UnboundedMemoryPool};
use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStore;

mod load;

use crate::blob::{self, PackReader};
use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::memtable::{MemLayer, MemTable, Watermark};
use crate::read::{ShardSnapshot, WalTail};
use crate::schema::{BlobColumn, KeyedBatch, TableMeta, TableSchema, key};
use crate::sstable::{self, ReadMetrics, SstableFile, SstableReader};
use crate::store::{CommitOptions, Versioned, VersionedObjects, paths};
use crate::wal::WalLog;
use crate::writer::{ShardManifest, ShardWriter, WriterOptions, WriterStats};

/// How long a write keeps taking back a shard that other writers keep
/// taking over before it gives up with [`Error::Fenced`].
pub const TAKEOVER_PATIENCE: Duration = Duration::from_secs(120);

/// Manifest reads a snapshot retries when the WAL moved under it.
const SNAPSHOT_ATTEMPTS: usize = 10;

/// Shards whose snapshots [`Table::snapshots`] takes at once (each a few
/// store requests when the shard is written by another process).
const SNAPSHOTS_IN_FLIGHT: usize = 32;

/// The rows a write to several shards wrote, from each shard's outcome:
/// the failure alone if that is the whole story (no shard's part took
/// effect, and at most one shard's outcome is unknown, or none),
/// otherwise [`Error::PartlyWritten`] naming the shards of each outcome.
fn gather(mut outcomes: Vec<(u32, Result<u64>)>) -> Result<u64> {
    outcomes.sort_by_key(|(shard, _)| *shard);
    let (mut written, mut rows, mut failed, mut unknown) = (Vec::new(), 0, Vec::new(), Vec::new());
    let mut cause = None;
    for (shard, outcome) in outcomes {
        match outcome {
            Ok(n) => {
                written.push(shard);
                rows += n;
            }
            Err(e) => {
                match e.outcome_unknown() {
                    true => unknown.push(shard),
                    false => failed.push(shard),
                }
                cause.get_or_insert(e);
            }
        }
    }
    let Some(cause) = cause else {
        return Ok(rows);
    };
    match (written.is_empty(), failed.len(), unknown.len()) {
        (true, _, 0) | (true, 0, 1) => Err(cause),
        _ => Err(Error::PartlyWritten {
            written,
            rows,
            failed,
            unknown,
            cause: Box::new(cause),
        }),
    }
}

impl Part {
    /// Its batches with their key encodings: the ones routing made, the
    /// first time; encoded again for a retry.
    fn keyed(&mut self, schema: &TableSchema) -> Result<Vec<KeyedBatch>> {
        match std::mem::take(&mut self.keys) {
            keys if keys.len() == self.batches.len() => {
                Ok(self.batches.iter().cloned().zip(keys).collect())
            }
            _ => (self.batches.iter())
                .map(|b| schema.keyed(b.clone()))
                .collect(),
        }
    }

    /// The rows the shard will hold for the part: one per distinct key,
    /// every row without a key.
    fn rows_held(&self) -> u64 {
        let mut distinct = std::collections::HashSet::new();
        let mut rows = 0;
        for (batch, keys) in self.batches.iter().zip(&self.keys) {
            match keys {
                Some(keys) => distinct.extend(keys.iter().map(|k| &k[..])),
                None => rows += batch.num_rows() as u64,
            }
        }
        rows + distinct.len() as u64
    }
}

/// What a put holds per row beyond the row's Arrow data (the key's
/// encoding, the MemTable's index entry, their allocations: about 100–150
/// bytes measured for a `BIGINT` key), for [`Table::put_stream`] to turn
/// a write of many small rows into a bulk load before it outgrows its
/// memory budget.
const PUT_ROW_BYTES: usize = 128;

/// One shard as seen by this process.
struct Shard {
    index: u32,
    writer: RwLock<Option<Arc<ShardWriter>>>,
    opening: tokio::sync::Mutex<()>,
    reader: tokio::sync::Mutex<ShardReader>,
}

/// A shard's WAL tail and SSTables, and how far they reach.
type View = (MemLayer, Vec<SstableFile>, Watermark);

/// The shard as a process that does not write it reads it.
struct ShardReader {
    versions: VersionedObjects,
    manifest: Option<Versioned<ShardManifest>>,
    refreshed: Option<Instant>,
    tail: WalTail,
}

impl ShardReader {
    /// The WAL tail and SSTables as last refreshed, if that was at most
    /// `max_age` ago (a zero age is never fresh).
    fn fresh_view(&self, max_age: Duration) -> Option<View> {
        let at = self.refreshed?;
        (!max_age.is_zero() && at.elapsed() < max_age).then(|| self.view())?
    }

    /// The WAL tail and SSTables as last refreshed, if ever, and how far
    /// they reach (with no WAL tail: to the generation after the SSTables').
    fn view(&self) -> Option<View> {
        let manifest = self.manifest.as_ref()?;
        let sstables = manifest.state.sstables.clone();
        let seen = self.tail.seen().unwrap_or_else(|| Watermark {
            generation: sstables.iter().map(|f| f.generation).max().unwrap_or(0) + 1,
            rows: 0,
        });
        Some((self.tail.layer(), sstables, seen))
    }

    /// Reads the shard manifest if it changed (one existence check when it
    /// did not), the WAL after its cursor, and then the newest manifest
    /// (`location`: the table's, for errors).
    ///
    /// Every row acknowledged before the WAL listing is in it or, moved
    /// into an SSTable, in a manifest committed before the WAL holding it
    /// was deleted: the newest manifest read after the listing, with the
    /// listed entries after its cursor, is a consistent view however
    /// often a writer flushed meanwhile. A refresh starts over only when
    /// an entry it listed was gone by the time it read it and no newer
    /// manifest covers it.
    async fn refresh(&mut self, location: &str) -> Result<()> {
        let started = Instant::now();
        self.refreshed = None;
        // Whether to resolve the newest manifest in full (see `moved`).
        let mut resolve = false;
        // The last attempt's WAL entries were of a writer no manifest named.
        let mut unclaimed = false;
        for _ in 0..SNAPSHOT_ATTEMPTS {
            let manifest = match self.manifest.take() {
                Some(known) if !resolve && !self.versions.has_newer(&known).await? => {
                    known.confirmed()
                }
                known => {
                    let from = known.map_or(0, |m| m.version);
                    self.versions
                        .load_latest(from, ShardManifest::decode)
                        .await?
                }
            };
            if manifest.state.dropped {
                self.manifest = Some(manifest);
                return Err(Error::table_dropped(location, DROPPED));
            }
            let gone = self.tail.refresh(manifest.state.replay_after).await?;
            // `has_newer` trusts version N+1 to exist for a while once N
            // is superseded, which a dropped table's deleted versions
            // break: an entry of a newer writer than the manifest names,
            // or a gap, has the newest version resolved in full.
            let moved = self.tail.newest_epoch() > manifest.state.epoch
                || self.versions.has_newer(&manifest).await?
                || (gone.is_some()
                    && self.versions.latest_version(manifest.version).await? > manifest.version);
            let manifest = if moved {
                let newest = self
                    .versions
                    .load_latest(manifest.version, ShardManifest::decode)
                    .await?;
                if newest.state.dropped {
                    self.manifest = Some(newest);
                    return Err(Error::table_dropped(location, DROPPED));
                }
                self.tail.forget_through(newest.state.replay_after)?;
                newest
            } else {
                manifest
            };
            unclaimed = self.tail.newest_epoch() > manifest.state.epoch;
            resolve = unclaimed;
            let cursor = manifest.state.replay_after;
            self.manifest = Some(manifest);
            match gone {
                None if !unclaimed => {
                    self.refreshed = Some(started);
                    return Ok(());
                }
                Some(position) if !moved => {
                    return Err(Error::Corrupt {
                        path: self.tail.path_of(position).to_string(),
                        reason: "WAL entry missing: the shard manifest's replay cursor is \
                                 before it, so nothing may have deleted it"
                            .into(),
                    });
                }
                // Moved into an SSTable since it was listed: read on
                // from the newer cursor (or, past it, find what did).
                Some(position) => resolve = resolve || position > cursor,
                None => {}
            }
        }
        if unclaimed {
            let manifest = self.manifest.as_ref().expect("set by every attempt");
            // A writer claims the shard in a manifest version before it
            // writes, and a claim never changes ten times in a row here.
            return Err(Error::Corrupt {
                path: self.versions.path_of(manifest.version + 1).to_string(),
                reason: format!(
                    "missing: the WAL holds entries of writer epoch {}, which no shard \
                     manifest version names (the newest, version {}, names epoch {})",
                    self.tail.newest_epoch(),
                    manifest.version,
                    manifest.state.epoch
                ),
            });
        }
        Err(Error::CommitConflict {
            what: format!("a consistent snapshot of {}", location),
            attempts: SNAPSHOT_ATTEMPTS as u32,
        })
    }
}

/// The slot's writer, if it is still running.
fn live_writer(slot: &Shard) -> Option<Arc<ShardWriter>> {
    let current = slot.writer.read().expect("writer slot poisoned").clone()?;
    (current.stopped().is_none() && !current.is_closed()).then_some(current)
}

/// How a shard manifest that says its table was dropped is reported.
const DROPPED: &str = "dropped; open the table again by name";

/// Runs `op` on a task of its own and waits for it: what holds a
/// shard's locks (a writer's open, a load's commit, a compaction, a
/// reader's refresh) goes on to the end whether or not its caller's
/// future is polled meanwhile, so a statement paused (or dropped) in the
/// middle holds up no other.
async fn detached<T: Send + 'static>(
    what: &str,
    op: impl Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    tokio::spawn(op)
        .await
        .map_err(|e| Error::Poisoned(format!("{what}: {e}")))?
}

/// The open of a shard's writer (see [`Table::writer_as`]), with what it
/// needs owned: it runs on a task of its own.
struct OpenWriter {
    slot: Arc<Shard>,
    store: Arc<dyn ObjectStore>,
    location: String,
    schema: Arc<TableSchema>,
    options: WriterOptions,
    catalog: Option<Arc<Catalog>>,
}

impl OpenWriter {
    /// Opens the writer and puts it in the slot, unless another open did
    /// meanwhile (one at a time per shard). `None` when the slot holds a
    /// writer whose lost rows nobody has reported yet: its caller reports
    /// them (a task whose caller is gone must not).
    async fn run(self, taking_back: Option<Duration>) -> Result<Option<Arc<ShardWriter>>> {
        let slot = &self.slot;
        let _one_opener = slot.opening.lock().await;
        if let Some(w) = live_writer(slot) {
            return Ok(Some(w));
        }
        let stopped = slot.writer.read().expect("writer slot poisoned").clone();
        if stopped.is_some_and(|w| w.lost_rows().is_some()) {
            return Ok(None);
        }
        let opened = ShardWriter::open_as(
            Arc::clone(&self.store),
            &self.location,
            slot.index,
            Arc::clone(&self.schema),
            self.options.clone(),
            taking_back,
        )
        .await;
        let writer = match opened {
            Ok(writer) => Arc::new(writer),
            // An open that raced a DROP TABLE in another process finds the
            // shard's objects deleted under it (a WAL entry, an SSTable):
            // the drop is what happened, not damage.
            Err(
                e @ (Error::Corrupt { .. } | Error::Store(object_store::Error::NotFound { .. })),
            ) => {
                return Err(match self.check_still_named().await {
                    Err(dropped @ Error::NotFound(_)) => dropped,
                    _ => self.open_failed(e),
                });
            }
            Err(e) => return Err(self.open_failed(e)),
        };
        if writer.opened_empty()
            && let Err(e) = self.check_still_named().await
        {
            // Nothing was written through it.
            let _ = writer.close().await;
            return Err(e);
        }
        *slot.writer.write().expect("writer slot poisoned") = Some(Arc::clone(&writer));
        Ok(Some(writer))
    }

    /// The failure of an open as the failure of the write it was for,
    /// which wrote nothing: a store's error says so (a fence or claim that
    /// timed out would read as the write's own outcome). Typed kinds
    /// (fenced, dropped, corrupt, ...) stay as they are.
    fn open_failed(&self, e: Error) -> Error {
        match e {
            Error::Store(_) | Error::Io(_) | Error::CommitOutcomeUnknown { .. } => {
                Error::NotWritten {
                    what: format!(
                        "the write to shard {} of the table at '{}'",
                        self.slot.index, self.location
                    ),
                    cause: format!("opening the shard: {e}"),
                }
            }
            other => other,
        }
    }

    /// Whether the catalog the table was opened through still names it,
    /// asked (fresh) when a writer found its shard empty, before anything
    /// is written through that writer. `DROP TABLE` seals the shards it
    /// finds, after its commit; a shard it did not find was created (or
    /// emptied by the collection of the dropped data) after that commit,
    /// so this fresh read sees the drop: the write fails instead of
    /// acknowledging rows that no table holds. Tables opened without a
    /// catalog are not checked.
    async fn check_still_named(&self) -> Result<()> {
        let Some(catalog) = &self.catalog else {
            return Ok(());
        };
        catalog.refresh().await?;
        match catalog.snapshot().holds_location(&self.location) {
            true => Ok(()),
            false => Err(Error::table_dropped(
                &self.location,
                "dropped before this write reached it; nothing was written",
            )),
        }
    }
}

/// A table of a root, opened in this process. Cheap to share.
pub struct Table {
    store: Arc<dyn ObjectStore>,
    location: String,
    #[cfg_attr(not(feature = "distributed"), allow(dead_code))]
    meta: TableMeta,
    schema: Arc<TableSchema>,
    options: WriterOptions,
    shards: Vec<Arc<Shard>>,
    next_append_shard: AtomicU32,
    sstables: Arc<SstableReader>,
    /// Set when this process dropped the table: the handle then refuses
    /// everything (a write would open a writer on the dropped data).
    dropped: AtomicBool,
    /// The catalog that named the table, if it was opened through one:
    /// asked whether it still does when a writer finds its shard empty.
    catalog: OnceLock<Arc<Catalog>>,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("location", &self.location)
            .field("shards", &self.shards.len())
            .finish()
    }
}

/// The rows of one write that go to one shard, in stored form.
struct Part {
    shard: u32,
    batches: Vec<RecordBatch>,
    /// Their key encodings (`None` for an append-only table), used by the
    /// first attempt.
    keys: Vec<Option<Vec<Box<[u8]>>>>,
}

impl Table {
    /// The table stored at `location` in `store`, described by `meta`.
    /// Opens nothing yet: writers open on first write.
    pub(crate) fn new(
        store: Arc<dyn ObjectStore>,
        location: &str,
        meta: &TableMeta,
        options: WriterOptions,
    ) -> Self {
        let schema = Arc::new(TableSchema::new(meta));
        let shards = (0..schema.shards)
            .map(|index| {
                let dir = paths::shard_dir(location, index);
                let wal = WalLog::new(Arc::clone(&store), paths::wal_dir(&dir))
                    .reading_heads(!schema.blobs.is_empty());
                let versions =
                    crate::writer::manifest_versions(Arc::clone(&store), &dir, &options.commit);
                Arc::new(Shard {
                    index,
                    writer: RwLock::new(None),
                    opening: tokio::sync::Mutex::new(()),
                    reader: tokio::sync::Mutex::new(ShardReader {
                        versions,
                        manifest: None,
                        refreshed: None,
                        tail: WalTail::new(wal, Arc::clone(&schema)),
                    }),
                })
            })
            .collect();
        Self {
            sstables: Arc::new(SstableReader::new(Arc::clone(&store), Arc::clone(&schema))),
            store,
            location: location.to_string(),
            meta: meta.clone(),
            schema,
            options,
            shards,
            next_append_shard: AtomicU32::new(0),
            dropped: AtomicBool::new(false),
            catalog: OnceLock::new(),
        }
    }

    /// The table's columns as users see them.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema.schema)
    }

    /// The names of the primary-key columns, in key order (empty for an
    /// append-only table).
    pub fn primary_key(&self) -> Vec<String> {
        let fields = self.schema.schema.fields();
        self.schema
            .key
            .iter()
            .map(|&i| fields[i].name().clone())
            .collect()
    }

    /// The table's schema, key and stored row form.
    pub(crate) fn table_schema(&self) -> &Arc<TableSchema> {
        &self.schema
    }

    /// Where the table's objects are, relative to the root.
    pub(crate) fn location(&self) -> &str {
        &self.location
    }

    /// The catalog metadata the table was opened with.
    #[cfg_attr(not(feature = "distributed"), allow(dead_code))]
    pub(crate) fn meta(&self) -> &TableMeta {
        &self.meta
    }

    /// The snapshot of shard `shard` whose layers are `sstables` (oldest
    /// generations first) under `memtable_rows` (stored form, oldest
    /// first): one another process took and shipped here. Nothing is read
    /// yet; the SSTables must still exist when it is read.
    #[cfg_attr(not(feature = "distributed"), allow(dead_code))]
    pub(crate) fn snapshot_of(
        &self,
        shard: u32,
        sstables: Vec<SstableFile>,
        memtable_rows: Vec<RecordBatch>,
    ) -> Result<ShardSnapshot> {
        self.slot(shard)?;
        let memtable = MemTable::new(Arc::clone(&self.schema));
        let mut keyed = Vec::with_capacity(memtable_rows.len());
        for rows in memtable_rows {
            let rows =
                RecordBatch::try_new(Arc::clone(&self.schema.stored), rows.columns().to_vec())
                    .map_err(|e| {
                        Error::invalid(format!("shipped rows do not fit the table: {e}"))
                    })?;
            keyed.push(self.schema.keyed(rows)?);
        }
        let (batches, _) = memtable.append(keyed);
        memtable.mark_durable(batches);
        let layer = MemLayer {
            memtable: Arc::new(memtable),
            batches,
        };
        Ok(self.snapshot_with(shard, layer, sstables, None))
    }

    /// The snapshot of shard `shard` (not written by this process) made of
    /// `memtable` over `sstables`, reaching `seen`.
    fn snapshot_with(
        &self,
        shard: u32,
        memtable: MemLayer,
        sstables: Vec<SstableFile>,
        seen: Option<Watermark>,
    ) -> ShardSnapshot {
        ShardSnapshot {
            schema: Arc::clone(&self.schema),
            reader: Arc::clone(&self.sstables),
            packs: PackReader::new(
                Arc::clone(&self.store),
                paths::shard_dir(&self.location, shard),
            ),
            memtables: vec![memtable],
            sstables: Arc::new(sstables),
            seen,
        }
    }

    /// Number of shards (scan partitions).
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Whether writes wait for durability.
    pub fn durable(&self) -> bool {
        self.options.durable
    }

    /// The writer of `shard`, opened (or re-opened after it stopped) if
    /// needed (for tests: users write through the table).
    #[cfg(any(test, feature = "testing"))]
    pub async fn writer(&self, shard: u32) -> Result<Arc<ShardWriter>> {
        self.writer_as(shard, None).await
    }

    /// The counters of this process's writer of `shard`, if it has one
    /// open (asking never opens one: that would claim the shard).
    pub fn stats(&self, shard: u32) -> Result<Option<WriterStats>> {
        let slot = self.slot(shard)?;
        let writer = slot.writer.read().expect("writer slot poisoned").clone();
        Ok(writer.map(|w| w.stats()))
    }

    /// [`Table::writer`]; a writer opened to take the shard back from
    /// another one (`taking_back`: how long the last open took) takes a
    /// turn (see [`ShardWriter::open_as`]). First reports the lost rows of
    /// the writer it replaces, if any. One open per shard at a time,
    /// [`detached`].
    async fn writer_as(
        &self,
        shard: u32,
        taking_back: Option<Duration>,
    ) -> Result<Arc<ShardWriter>> {
        let slot = self.slot(shard)?;
        self.check_owned(shard)?;
        loop {
            if let Some(w) = live_writer(slot) {
                return Ok(w);
            }
            Table::report_lost_rows(slot)?;
            let open = OpenWriter {
                slot: Arc::clone(slot),
                store: Arc::clone(&self.store),
                location: self.location.clone(),
                schema: Arc::clone(&self.schema),
                options: self.options.clone(),
                catalog: self.catalog.get().cloned(),
            };
            // `None`: the writer stopped meanwhile, losing rows: reported
            // on the next turn.
            if let Some(w) = detached("opening a shard's writer", open.run(taking_back)).await? {
                return Ok(w);
            }
        }
    }

    /// The state of `shard`; an error for a shard the table does not have,
    /// and for every shard once this process dropped the table.
    fn slot(&self, shard: u32) -> Result<&Arc<Shard>> {
        if self.dropped.load(Ordering::Acquire) {
            return Err(self.dropped_error(DROPPED));
        }
        self.shards.get(shard as usize).ok_or_else(|| {
            Error::invalid(format!(
                "shard {shard} does not exist: the table has {} (0..={})",
                self.shards.len(),
                self.shards.len() - 1
            ))
        })
    }

    /// An error unless this process writes `shard`
    /// ([`WriterOptions::owned_shards`]).
    pub(crate) fn check_owned(&self, shard: u32) -> Result<()> {
        let owned = self.options.owned_shards;
        match owned.contains(shard) {
            true => Ok(()),
            false => Err(Error::NotOwned(format!(
                "shard {shard} of the table at '{}' is not written by this process \
                 (owned_shards = {owned}); nothing was written",
                self.location
            ))),
        }
    }

    /// The shard the next rows of an append-only table go to: this
    /// process's shards in turn.
    pub(crate) fn next_append_shard(&self) -> u32 {
        let shards = self.shards.len() as u32;
        let mut owned = (0..shards).filter(|&s| self.options.owned_shards.contains(s));
        let count = owned.clone().count().max(1);
        let turn = self.next_append_shard.fetch_add(1, Ordering::Relaxed) as usize;
        // A slice with no shard of this table: rows go to shard 0 and
        // are refused there.
        owned.nth(turn % count).unwrap_or(0)
    }

    /// [`Error::LostRows`] of the slot's writer, once: the writer is let
    /// go when reported, so the next call opens the shard again.
    fn report_lost_rows(slot: &Shard) -> Result<()> {
        // A read lock on the common path: every write checks.
        let Some(writer) = slot.writer.read().expect("writer slot poisoned").clone() else {
            return Ok(());
        };
        let Some(lost) = writer.lost_rows() else {
            return Ok(());
        };
        let mut current = slot.writer.write().expect("writer slot poisoned");
        // Reported once: by whoever lets this writer go.
        match current.as_ref().is_some_and(|c| Arc::ptr_eq(c, &writer)) {
            true => {
                *current = None;
                Err(lost)
            }
            false => Ok(()),
        }
    }

    /// [`Error::NotFound`] of this table, dropped (`how` says when).
    fn dropped_error(&self, how: &str) -> Error {
        Error::table_dropped(&self.location, how)
    }

    /// `error`, met reading (or loading) `shard`; or, if it is an object
    /// gone missing because the table was dropped meanwhile, an object of
    /// an SSTable or a blob pack the shard's newest manifest no longer
    /// names (replaced, and deleted after the writer's `sstable_grace`), or
    /// an SSTable of a shard this root has no manifest of (a plan of
    /// another root's process), [`Error::NotFound`] saying that;
    /// [`Error::Corrupt`] if the newest manifest still names the object
    /// (it was lost).
    pub(crate) async fn explain_missing(&self, shard: u32, error: Error) -> Error {
        let pack = blob::missing_pack(&error);
        let path = match &error {
            Error::Store(object_store::Error::NotFound { path, .. }) => path,
            Error::Corrupt { path, .. } if pack.is_some() => path,
            _ => return error,
        };
        let sstable = paths::sstable_dir_of_object(path).map(str::to_string);
        // The shard the object is of (a statement's partition may read
        // others, a lookup any).
        let shard = paths::shard_of(path)
            .filter(|&s| (s as usize) < self.shards.len())
            .unwrap_or(shard);
        let slot = match self.slot(shard) {
            Ok(slot) => slot,
            // Dropped by this process.
            Err(dropped) => return dropped,
        };
        let (versions, known) = {
            let reader = slot.reader.lock().await;
            let known = reader.manifest.as_ref().map_or(0, |m| m.version);
            (reader.versions.clone(), known)
        };
        match versions.load_latest(known, ShardManifest::decode).await {
            Ok(manifest) if manifest.state.dropped => {
                self.dropped_error("dropped while this statement ran")
            }
            // No manifest at all: the SSTable is of another root's shard.
            Ok(manifest) if manifest.version == 0 && sstable.is_some() => Error::NotFound(format!(
                "the table at '{}' has no shard {shard} in this process's root, yet this \
                     statement reads its SSTables: the table was dropped and collected \
                     meanwhile, or another process planned the statement on another root \
                     (every worker must serve the coordinator's root): {error}",
                self.location
            )),
            Ok(manifest) => {
                let state = &manifest.state;
                if let Some(lost) = sstable::lost(&error, &state.sstables, manifest.version) {
                    return lost;
                }
                let named = |(position, epoch): (u64, u64)| {
                    (state.sstables.iter().flat_map(|f| &f.packs))
                        .any(|r| r.contains(epoch, position))
                };
                // Replaced: a manifest newer than this process read names
                // it no more.
                let replaced = match pack {
                    Some(pack) => !named(pack),
                    None => sstable.is_some(),
                };
                match replaced && manifest.version > known {
                    true => Error::NotFound(format!(
                        "{path} of shard {shard}, which this statement's snapshot reads \
                         (replaced since by the shard's writer, and deleted after its \
                         sstable_grace, which was shorter than this statement; run it again)"
                    )),
                    false => error,
                }
            }
            Err(_) => error,
        }
    }

    /// Puts the rows of `batch` and waits until they are visible (and
    /// durable, if the table is). Bad input writes nothing. Returns the
    /// rows the table holds for it: one per distinct key (the last row of a
    /// key wins), every row for an append-only table.
    pub async fn put(&self, batch: &RecordBatch) -> Result<u64> {
        self.put_all(std::slice::from_ref(batch)).await
    }

    /// Puts the rows of every batch as one put per shard: within a shard
    /// they become visible and durable at once, and a crash keeps all of
    /// a shard's part or none of it (shards are independent). Every batch
    /// is checked before anything is written. Returns what
    /// [`Table::put`] returns; when the parts of some shards fail and
    /// others' take effect, [`Error::PartlyWritten`] names them.
    pub async fn put_all(&self, batches: &[RecordBatch]) -> Result<u64> {
        let mut rows_before = 0;
        let mut stored = Vec::with_capacity(batches.len());
        for batch in batches {
            stored.push(self.schema.to_stored_at(batch, rows_before)?);
            rows_before += batch.num_rows();
        }
        self.write(stored).await
    }

    /// Puts the rows of a stream of batches as one write, like
    /// [`Table::put_all`] (all or none per shard, across crashes; the same
    /// count and errors), holding at most about [`WriterOptions::load_memory_bytes`]
    /// of rows in memory whatever the stream's size. A write within that
    /// bound (its rows' bytes, and about 128 bytes a row that a put's key
    /// index takes) is one put per shard; a larger one is a bulk load: each
    /// shard's rows are sorted and written to SSTables in runs of bounded
    /// size, which are added to the shard in one manifest commit (puts to
    /// the shard wait meanwhile; compaction merges them later;
    /// see the writer's `load` module). Nothing is visible before a
    /// shard's commit. A shard another process takes over during the load
    /// is taken back for the commit, like a put's part.
    pub async fn put_stream<S>(&self, mut batches: S) -> Result<u64>
    where
        S: futures::Stream<Item = Result<RecordBatch>> + Unpin + Send,
    {
        for slot in &self.shards {
            Self::report_lost_rows(slot)?;
        }
        let budget = self.options.load_memory_bytes;
        let (mut stored, mut held, mut rows) = (Vec::new(), 0, 0);
        while let Some(batch) = batches.next().await {
            let batch = batch?;
            if batch.num_rows() == 0 {
                continue;
            }
            let batch = self.schema.to_stored_at(&batch, rows)?;
            rows += batch.num_rows();
            held += batch.get_array_memory_size() + batch.num_rows() * PUT_ROW_BYTES;
            stored.push(batch);
            if held > budget {
                return self.bulk_load(stored, rows, batches).await;
            }
        }
        match stored.is_empty() {
            true => Ok(0),
            false => self.write(stored).await,
        }
    }

    /// Deletes the keys in `keys` (exactly the key columns, in key order),
    /// all or none per shard like [`Table::put_all`]; returns the number of
    /// distinct keys given (a key that is not in the table counts too).
    pub async fn delete(&self, keys: &RecordBatch) -> Result<u64> {
        self.delete_all(std::slice::from_ref(keys)).await
    }

    /// Deletes the keys of every batch as one put of tombstones per shard.
    pub async fn delete_all(&self, keys: &[RecordBatch]) -> Result<u64> {
        let stored = keys
            .iter()
            .map(|k| self.schema.tombstones(k))
            .collect::<Result<Vec<_>>>()?;
        self.write(stored).await
    }

    /// Deletes the keys of every batch (rows a `DELETE ... WHERE` read) as
    /// one put of tombstones per shard, all or none per shard, except keys
    /// written since the snapshot of their shard the statement read, which
    /// reached `seen[shard]` (see [`ShardWriter::delete_seen`]; a shard
    /// without one deletes every key). Returns the tombstones written.
    pub(crate) async fn delete_seen(
        &self,
        keys: &[RecordBatch],
        seen: &[Option<Watermark>],
    ) -> Result<u64> {
        let stored = keys
            .iter()
            .map(|k| self.schema.tombstones(k))
            .collect::<Result<Vec<_>>>()?;
        self.write_seen(stored, seen).await
    }

    /// Sends stored rows to their shards' writers, one put per shard, and
    /// waits for every part (see the module doc on fenced writers).
    async fn write(&self, stored: Vec<RecordBatch>) -> Result<u64> {
        self.write_seen(stored, &[]).await
    }

    /// [`Table::write`], the part of each shard that has a reach in `seen`
    /// being a DELETE's tombstones (see [`Table::delete_seen`]).
    async fn write_seen(
        &self,
        stored: Vec<RecordBatch>,
        seen: &[Option<Watermark>],
    ) -> Result<u64> {
        let parts = self.route(stored)?;
        // Rows an earlier write lost fail this one before it writes
        // anything, not one shard's part of it.
        for part in &parts {
            Self::report_lost_rows(self.slot(part.shard)?)?;
        }
        // Every shard's part ends, whatever the others' outcome.
        let outcomes = futures::future::join_all(parts.into_iter().map(|part| async move {
            let shard = part.shard;
            let written = match seen.get(shard as usize).copied().flatten() {
                None => {
                    let rows = part.rows_held();
                    self.write_part(part).await.map(|()| rows)
                }
                Some(seen) => self.delete_part(part, seen).await,
            };
            (shard, written)
        }))
        .await;
        self.gather(outcomes).await
    }

    /// [`gather`]; but if the shards a write failed in failed because the
    /// table was dropped meanwhile, that: the parts written went to a
    /// table no one can read any more.
    async fn gather(&self, outcomes: Vec<(u32, Result<u64>)>) -> Result<u64> {
        let gathered = gather(outcomes);
        if let Err(Error::PartlyWritten {
            failed, unknown, ..
        }) = &gathered
            && let Some(&shard) = failed.first().or(unknown.first())
            && self.dropped_now(shard).await
        {
            return Err(self.dropped_error("dropped while this statement ran"));
        }
        gathered
    }

    /// Whether the newest manifest of `shard` says the table was dropped.
    async fn dropped_now(&self, shard: u32) -> bool {
        let Ok(slot) = self.slot(shard) else {
            // Dropped by this process (or no such shard).
            return self.dropped.load(Ordering::Acquire);
        };
        let versions = slot.reader.lock().await.versions.clone();
        (versions.load_latest(0, ShardManifest::decode).await).is_ok_and(|m| m.state.dropped)
    }

    /// Deletes one shard's part of a DELETE that read up to `seen`, as
    /// [`ShardWriter::delete_seen`]; returns the tombstones written.
    async fn delete_part(&self, mut part: Part, seen: Watermark) -> Result<u64> {
        self.on_shard(part.shard, "a delete", |writer| {
            let tombstones = part.keyed(&self.schema);
            async move {
                let (put, deleted) = writer.delete_seen(tombstones?, seen).await?;
                if let Some(put) = put {
                    put.wait().await?;
                }
                Ok(deleted)
            }
        })
        .await
    }

    /// Splits stored rows by shard, each row's key encoded once (for
    /// routing and the MemTable index alike).
    fn route(&self, stored: Vec<RecordBatch>) -> Result<Vec<Part>> {
        let shards = self.shards.len() as u32;
        let mut parts: Vec<Part> = (0..shards)
            .map(|shard| Part {
                shard,
                batches: Vec::new(),
                keys: Vec::new(),
            })
            .collect();
        // Where rows go that need no key to route: the only shard, or the
        // next one in turn for an append-only table.
        let whole_shard = match self.schema.has_key() {
            true => 0,
            false => self.next_append_shard(),
        };
        for batch in stored {
            let (batch, keys) = self.schema.keyed(batch)?;
            let Some(keys) = keys else {
                let part = &mut parts[whole_shard as usize];
                part.batches.push(batch);
                part.keys.push(None);
                continue;
            };
            // Each shard's rows of the batch, and their keys.
            let mut rows_of: Vec<Vec<u32>> = vec![Vec::new(); shards as usize];
            let mut keys_of: Vec<Vec<Box<[u8]>>> = vec![Vec::new(); shards as usize];
            for (row, k) in keys.into_iter().enumerate() {
                let shard = key::shard_of(&k, shards) as usize;
                rows_of[shard].push(row as u32);
                keys_of[shard].push(k);
            }
            for (part, (at, keys)) in parts.iter_mut().zip(rows_of.into_iter().zip(keys_of)) {
                if at.len() == batch.num_rows() {
                    part.batches.push(batch.clone());
                } else if !at.is_empty() {
                    part.batches
                        .push(take_record_batch(&batch, &UInt32Array::from(at))?);
                } else {
                    continue;
                }
                part.keys.push(Some(keys));
            }
        }
        parts.retain(|p| !p.batches.is_empty());
        for part in &parts {
            self.check_owned(part.shard)?;
        }
        Ok(parts)
    }

    /// Puts one shard's part and waits until it is visible (durable, if
    /// the table is).
    async fn write_part(&self, mut part: Part) -> Result<()> {
        let shard = part.shard;
        self.on_shard(shard, "a put", |writer| {
            let keyed = part.keyed(&self.schema);
            async move { writer.put_keyed(keyed?).await?.wait().await }
        })
        .await
    }

    /// Runs `op` with the writer of `shard`. When another process took the
    /// shard over (`op` failed with [`Error::Fenced`], which changes
    /// nothing), takes the shard back and runs `op` again, for up to
    /// [`TAKEOVER_PATIENCE`].
    async fn on_shard<T, F, Fut>(&self, shard: u32, what: &str, mut op: F) -> Result<T>
    where
        F: FnMut(Arc<ShardWriter>) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let started = Instant::now();
        let mut attempt = 0;
        // How long the last open took, once the shard was taken over.
        let mut taking_back = None;
        loop {
            let (done, open_took) = match self.writer_as(shard, taking_back).await {
                Ok(writer) => {
                    let open_took = writer.open_took();
                    (op(writer).await, Some(open_took))
                }
                // Fenced while opening: how long an open takes is not known.
                Err(e) => (Err(e), None),
            };
            match done {
                Err(e @ Error::Fenced { .. }) if started.elapsed() < TAKEOVER_PATIENCE => {
                    attempt += 1;
                    taking_back = open_took.or(taking_back).or(Some(Duration::ZERO));
                    log::debug!(
                        "shard {shard} of {}: {e}; taking it back for {what} (attempt {attempt})",
                        self.location
                    );
                    tokio::time::sleep(self.options.commit.backoff(attempt)).await;
                }
                done => return done,
            }
        }
    }

    /// The shard a key (one row of exactly the key columns) belongs to, its
    /// encoding, and the key in stored form.
    fn locate(&self, key: &RecordBatch) -> Result<(u32, Box<[u8]>, RecordBatch)> {
        if !self.schema.has_key() {
            return Err(Error::invalid("the table has no primary key"));
        }
        if key.num_rows() != 1 {
            return Err(Error::invalid("a lookup takes exactly one key"));
        }
        let stored = self.schema.tombstones(key)?;
        let encoded = self.schema.encode_keys(&stored)?.remove(0);
        Ok((
            key::shard_of(&encoded, self.shards.len() as u32),
            encoded,
            stored,
        ))
    }

    /// The live row with key `key` (one row of exactly the key columns), in
    /// user form, or `None`. Served from this process's writer of the key's
    /// shard when it owned the shard within the last
    /// [`WriterOptions::owner_check_interval`], otherwise from a snapshot of
    /// the shard refreshed at most that long ago (so a write another
    /// process made since may be missed for that long).
    pub async fn get(&self, key: &RecordBatch) -> Result<Option<RecordBatch>> {
        self.get_checked_within(key, self.options.owner_check_interval)
            .await
    }

    /// Like [`Table::get`], from a snapshot at most `max_age` old (zero:
    /// refreshed now, which sees every durable row, like a scan).
    pub async fn get_checked_within(
        &self,
        key: &RecordBatch,
        max_age: Duration,
    ) -> Result<Option<RecordBatch>> {
        let (shard, encoded, stored) = self.locate(key)?;
        let columns = self.schema.key_columns(&stored);
        self.snapshot(shard, max_age)
            .await?
            .get(&encoded, &columns, &ReadMetrics::default())
            .await
    }

    /// Blob column `column`, the live row with key `key` (stored form,
    /// long values not read) if there is one, and the snapshot it is from;
    /// as fresh as [`Table::get`].
    async fn blob_row(
        &self,
        key: &RecordBatch,
        column: &str,
    ) -> Result<(BlobColumn, ShardSnapshot, Option<RecordBatch>)> {
        let index = self.schema.schema.index_of(column).ok();
        let blob = self
            .schema
            .blobs
            .iter()
            .find(|b| Some(b.index) == index)
            .copied()
            .ok_or_else(|| {
                Error::invalid(format!("'{column}' is not a blob column of the table"))
            })?;
        let (shard, encoded, stored) = self.locate(key)?;
        let snapshot = self
            .snapshot(shard, self.options.owner_check_interval)
            .await?;
        let columns = self.schema.key_columns(&stored);
        let row = snapshot
            .get_stored(&encoded, &columns, &ReadMetrics::default())
            .await?;
        Ok((blob, snapshot, row))
    }

    /// The size in bytes of the value of blob column `column` in the live
    /// row with key `key` (one row of exactly the key columns), read from
    /// the row's descriptor: no blob bytes are fetched. `None` if there is
    /// no such row or the value is NULL. As fresh as [`Table::get`].
    pub async fn blob_size(&self, key: &RecordBatch, column: &str) -> Result<Option<u64>> {
        let (blob, _, row) = self.blob_row(key, column).await?;
        let value = row.and_then(|row| blob::stored_value(&blob, &row, 0));
        Ok(value.map(|v| match v {
            Ok(inline) => inline.len() as u64,
            Err(packed) => packed.length,
        }))
    }

    /// The value of blob column `column` in the live row with key `key`
    /// (one row of exactly the key columns) as a stream of chunks: a value
    /// stored out of line is read with one ranged GET as the store
    /// delivers it, never held whole in memory, and the stream ends with
    /// [`Error::Corrupt`] if its bytes do not match their checksum. `None`
    /// if there is no such row or the value is NULL. As fresh as
    /// [`Table::get`].
    pub async fn read_blob(
        &self,
        key: &RecordBatch,
        column: &str,
    ) -> Result<Option<blob::BlobStream>> {
        match self.blob_row(key, column).await? {
            (blob, snapshot, Some(row)) => snapshot.stream_blob(&blob, &row).await,
            (_, _, None) => Ok(None),
        }
    }

    /// The columns `projection` of the live row with key `key` in
    /// `snapshot` (of the key's shard), the blob columns `sizes` among
    /// them as their values' sizes (see [`ShardSnapshot::get_sized`]);
    /// SSTable reads are counted in `metrics`.
    pub(crate) async fn get_in(
        &self,
        snapshot: &ShardSnapshot,
        key: &RecordBatch,
        (projection, sizes): (&[usize], &[usize]),
        metrics: &ReadMetrics,
    ) -> Result<Option<Vec<ArrayRef>>> {
        let (_, encoded, stored) = self.locate(key)?;
        let key = self.schema.key_columns(&stored);
        snapshot
            .get_sized(&encoded, &key, projection, sizes, metrics)
            .await
    }

    /// The shard of `key` (one row of exactly the key columns).
    pub fn shard_of(&self, key: &RecordBatch) -> Result<u32> {
        Ok(self.locate(key)?.0)
    }

    /// The live rows of `shard` (newest version per key, no tombstones), in
    /// user form.
    pub async fn scan_shard(&self, shard: u32) -> Result<Vec<RecordBatch>> {
        let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        self.snapshot(shard, Duration::ZERO)
            .await?
            .collect(&pool)
            .await
    }

    /// The live rows of every shard.
    pub async fn scan(&self) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        for shard in 0..self.shards.len() as u32 {
            out.extend(self.scan_shard(shard).await?);
        }
        Ok(out)
    }

    /// What a reader sees of `shard` now, or as of at most `max_age` ago.
    pub async fn snapshot(&self, shard: u32, max_age: Duration) -> Result<ShardSnapshot> {
        if let Some(writer) = self.owning_writer(shard, max_age).await? {
            return Ok(writer.snapshot());
        }
        let slot = Arc::clone(self.slot(shard)?);
        let fresh = slot
            .reader
            .try_lock()
            .ok()
            .and_then(|r| r.fresh_view(max_age));
        if let Some((layer, sstables, seen)) = fresh {
            return Ok(self.snapshot_with(shard, layer, sstables, Some(seen)));
        }
        // Detached: a read paused while it holds the shard's reader holds
        // up no other read of the shard.
        let location = self.location.clone();
        let (layer, sstables, seen) = detached("reading a shard", async move {
            let mut reader = slot.reader.lock().await;
            if let Some(view) = reader.fresh_view(max_age) {
                return Ok(view);
            }
            reader.refresh(&location).await?;
            Ok(reader.view().expect("refreshed above"))
        })
        .await?;
        Ok(self.snapshot_with(shard, layer, sstables, Some(seen)))
    }

    /// What a reader sees now of each shard in `shards` (like
    /// [`Table::snapshot`] with no staleness), in that order, taken up to
    /// 32 at a time: a table of many shards costs a few request latencies,
    /// not one per shard.
    pub async fn snapshots(
        &self,
        shards: impl IntoIterator<Item = u32>,
    ) -> Result<Vec<ShardSnapshot>> {
        futures::stream::iter(shards)
            .map(|shard| self.snapshot(shard, Duration::ZERO))
            .buffered(SNAPSHOTS_IN_FLIGHT)
            .try_collect()
            .await
    }

    /// This process's writer of `shard`, if it still owns the shard (nobody
    /// else has written at the position it appends at next), as checked at
    /// most `max_age` ago.
    async fn owning_writer(
        &self,
        shard: u32,
        max_age: Duration,
    ) -> Result<Option<Arc<ShardWriter>>> {
        let slot = self.slot(shard)?;
        let Some(writer) = live_writer(slot) else {
            return Ok(None);
        };
        if writer.owned_within(max_age) || writer.still_owns_shard().await? {
            return Ok(Some(writer));
        }
        log::debug!(
            "shard {} of {}: another writer took over; reading the WAL",
            slot.index,
            self.location
        );
        Ok(None)
    }

    /// Merges each shard's SSTables into one (opening the writers it
    /// needs, taking back shards other processes took over; only the
    /// shards this process writes), and deletes the runs of crashed bulk
    /// loads in them. A shard's merge, once begun, goes to its end even if
    /// the caller stops waiting (it runs on a task of its own).
    pub async fn compact(&self) -> Result<()> {
        let shards = self.shards.len() as u32;
        for shard in (0..shards).filter(|&s| self.options.owned_shards.contains(s)) {
            self.on_shard(shard, "a compaction", |w| {
                detached("a compaction", async move {
                    w.compact().await?;
                    w.delete_dead_loads().await;
                    Ok(())
                })
            })
            .await?;
        }
        Ok(())
    }

    /// Makes everything put so far durable and closes every open writer;
    /// reports the first error.
    pub async fn close(&self) -> Result<()> {
        let mut first = Ok(());
        for slot in &self.shards {
            let writer = {
                // An open under way (its caller may be gone) lands first.
                let _no_opener = slot.opening.lock().await;
                slot.writer.write().expect("writer slot poisoned").take()
            };
            if let Some(writer) = writer
                && let Err(e) = writer.close().await
                && first.is_ok()
            {
                first = Err(e);
            }
        }
        first
    }
}

/// The tables this process has opened, by location (a location is never
/// reused, so the entry stays valid for the table's life).
#[derive(Debug, Default)]
pub struct TableCache {
    tables: Mutex<HashMap<String, Arc<Table>>>,
    options: RwLock<WriterOptions>,
}

/// The process's shared caches (see [`TableCache::shared`]), by root URL
/// and options.
static SHARED_CACHES: OnceLock<Mutex<HashMap<String, Weak<TableCache>>>> = OnceLock::new();

impl TableCache {
    /// An empty cache whose tables write with `options`.
    pub fn new(options: WriterOptions) -> Self {
        Self {
            tables: Mutex::default(),
            options: RwLock::new(options),
        }
    }

    /// The options its tables write with.
    pub fn options(&self) -> WriterOptions {
        self.options.read().expect("options poisoned").clone()
    }

    /// Makes the tables write with `options` from now on: every open table
    /// is closed (its writes made durable, as by [`Table::close`]) and
    /// opens again on next use. A table handle taken before keeps the old
    /// options. A shared cache stops being the one
    /// [`TableCache::shared`] gives for its old options.
    pub async fn reconfigure(self: &Arc<Self>, options: WriterOptions) -> Result<()> {
        options.check()?;
        {
            let mut current = self.options.write().expect("options poisoned");
            if format!("{options:?}") == format!("{current:?}") {
                return Ok(());
            }
            *current = options;
        }
        if let Some(caches) = SHARED_CACHES.get() {
            let me = Arc::downgrade(self);
            caches
                .lock()
                .expect("table caches poisoned")
                .retain(|_, cache| !cache.ptr_eq(&me));
        }
        self.close().await
    }

    /// The cache of this process for root `url` and `options`: the same
    /// one for as long as any holder keeps it alive.
    pub fn shared(url: &str, options: WriterOptions) -> Arc<Self> {
        let key = format!("{url}\n{options:?}");
        let mut caches = SHARED_CACHES
            .get_or_init(Mutex::default)
            .lock()
            .expect("table caches poisoned");
        caches.retain(|_, cache| cache.strong_count() > 0);
        if let Some(cache) = caches.get(&key).and_then(Weak::upgrade) {
            return cache;
        }
        let cache = Arc::new(Self::new(options));
        caches.insert(key, Arc::downgrade(&cache));
        cache
    }

    /// The table at `location` of the root `store`, opened on first use.
    /// Given the `catalog` that names it, the table's writers make sure
    /// it still does before they write to a shard they find empty, so a
    /// write racing a `DROP TABLE` elsewhere fails instead of being
    /// acknowledged into a dropped table.
    pub fn get_or_open(
        &self,
        store: &Arc<dyn ObjectStore>,
        location: &str,
        meta: &TableMeta,
        catalog: Option<&Arc<Catalog>>,
    ) -> Arc<Table> {
        let mut tables = self.tables.lock().expect("table cache poisoned");
        let table = tables.entry(location.to_string()).or_insert_with(|| {
            Arc::new(Table::new(
                Arc::clone(store),
                location,
                meta,
                self.options(),
            ))
        });
        if let Some(catalog) = catalog {
            table.catalog.get_or_init(|| Arc::clone(catalog));
        }
        Arc::clone(table)
    }

    /// Closes and forgets every open table whose location `keep` rejects
    /// (a dropped table): handles of it still held refuse every call from
    /// then on. Reports the first error.
    pub async fn close_unless(&self, keep: impl Fn(&str) -> bool) -> Result<()> {
        self.close_where(|location| !keep(location), true).await
    }

    async fn close_where(&self, close: impl Fn(&str) -> bool, dropped: bool) -> Result<()> {
        let gone: Vec<Arc<Table>> = self
            .tables
            .lock()
            .expect("table cache poisoned")
            .extract_if(|location, _| close(location))
            .map(|(_, table)| table)
            .collect();
        let mut first = Ok(());
        for table in gone {
            table.dropped.store(dropped, Ordering::Release);
            if let Err(e) = table.close().await
                && first.is_ok()
            {
                first = Err(e);
            }
        }
        first
    }

    /// The locations of the tables open in this cache.
    pub fn locations(&self) -> Vec<String> {
        let tables = self.tables.lock().expect("table cache poisoned");
        tables.keys().cloned().collect()
    }

    /// Closes every open table (see [`Table::close`]); a handle still
    /// held opens its writers again when used.
    pub async fn close(&self) -> Result<()> {
        self.close_where(|_| true, false).await
    }
}

/// After `DROP TABLE` committed: seals every shard of the table at
/// `location` (each found under its `shards/` directory; up to
/// [`SEALS_AT_ONCE`] at once), so a writer of it still running in another
/// process fails its next append, and no writer opens on it again,
/// instead of acknowledging rows that no table holds (a shard created
/// after the listing is checked by its writer: see
/// [`OpenWriter::check_still_named`]).
pub(crate) async fn seal_dropped(
    store: &Arc<dyn ObjectStore>,
    location: &str,
    commit: &CommitOptions,
) -> Result<()> {
    let listed = store
        .list_with_delimiter(Some(&paths::shards_dir(location)))
        .await?;
    let shards: Vec<u32> = listed
        .common_prefixes
        .iter()
        .filter_map(|dir| dir.filename().and_then(|n| n.parse().ok()))
        .collect();
    futures::stream::iter(shards)
        .map(|shard| crate::writer::seal_dropped_shard(Arc::clone(store), location, shard, commit))
        .buffer_unordered(SEALS_AT_ONCE)
        .try_collect()
        .await
}

/// Shards a drop seals at once: each seal is a few requests in a row
/// (the manifest's newest version, its sealed successor, a WAL fence),
/// so a table of many shards on an object store is sealed in seconds.
const SEALS_AT_ONCE: usize = 16;

/// Defined here, where the write and read paths meet, so that the writer
/// hands out its layers without knowing how readers use them.
impl ShardWriter {
    /// What a reader sees of the shard now: the visible rows of every
    /// MemTable not yet in an SSTable, and the manifest's SSTables.
    pub fn snapshot(&self) -> ShardSnapshot {
        let (memtables, sstables, seen) = self.layers();
        ShardSnapshot {
            schema: Arc::clone(self.schema()),
            reader: Arc::clone(self.sstable_reader()),
            packs: self.pack_reader(),
            memtables,
            sstables,
            seen: Some(seen),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unknown() -> Error {
        Error::Poisoned("outcome of the commit of t/shards/2/wal/3.arrow is unknown".into())
    }

    fn failed() -> Error {
        Error::NotWritten {
            what: "the write to shard 0".into(),
            cause: "refused".into(),
        }
    }

    /// Found from outside over S3: a statement none of whose shards took
    /// effect said only its first shard's "nothing of it was written",
    /// and another shard's part, whose outcome was unknown, was there.
    #[test]
    fn a_write_is_described_shard_by_shard_unless_one_failure_tells_it_all() {
        let shards = |e: Error| match e {
            Error::PartlyWritten {
                written,
                rows,
                failed,
                unknown,
                ..
            } => (written, rows, failed, unknown),
            other => panic!("{other}"),
        };
        let partly = gather(vec![(2, Err(unknown())), (0, Err(failed())), (1, Ok(3))]);
        assert_eq!(shards(partly.unwrap_err()), (vec![1], 3, vec![0], vec![2]));
        let nothing_known = gather(vec![(2, Err(unknown())), (0, Err(failed()))]);
        assert_eq!(
            shards(nothing_known.unwrap_err()),
            (vec![], 0, vec![0], vec![2])
        );
        // One failure, or failures all of one kind in no more than one
        // shard of unknown outcome: that error alone.
        let alone = gather(vec![(0, Err(failed())), (1, Err(failed()))]);
        assert!(matches!(alone, Err(Error::NotWritten { .. })));
        let alone = gather(vec![(2, Err(unknown()))]);
        assert!(matches!(alone, Err(Error::Poisoned(_))));
        let two_unknown = gather(vec![(2, Err(unknown())), (3, Err(unknown()))]);
        assert_eq!(shards(two_unknown.unwrap_err()).3, vec![2, 3]);
        assert_eq!(gather(vec![(0, Ok(2)), (1, Ok(3))]).unwrap(), 5);
    }
}
