//! [`Table`]: one table of a root as this process uses it — the Rust API
//! for `put`, `delete`, `get` and scans, and what the SQL layer runs on.
//!
//! Writes route by the primary key's shard (see [`crate::memtable::key`]);
//! a table without a key is append-only and sends each batch to the next
//! shard in turn. Each shard's writer is opened on first write (one per
//! shard per process) and re-opened after it stopped (fenced by another
//! process, or poisoned).
//!
//! Reads take a [`ShardSnapshot`] of each shard: from this process's
//! writer when it still owns the shard (checked with one read of the WAL
//! position it would write next), otherwise from the shard manifest (one
//! existence check per query when unchanged) and the durable WAL after its
//! cursor ([`WalTail`]). Either way a scan sees every acknowledged durable
//! row. [`Table::get`] may trust a recent check (see
//! [`WriterOptions::owner_check_interval`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

use datafusion::arrow::array::{RecordBatch, UInt32Array};
use datafusion::arrow::compute::take_record_batch;
use datafusion::execution::memory_pool::{MemoryPool, UnboundedMemoryPool};
use object_store::ObjectStore;

use crate::catalog::TableMeta;
use crate::error::{Error, Result};
use crate::memtable::{KeyedBatch, TableSchema, key};
use crate::read::{ShardSnapshot, WalTail};
use crate::sstable::SstableReader;
use crate::store::{Versioned, VersionedObjects, paths};
use crate::wal::WalLog;
use crate::writer::{Durability, ShardManifest, ShardWriter, WriterOptions};

/// Manifest reads a snapshot retries when the WAL moved under it.
const SNAPSHOT_ATTEMPTS: usize = 10;

/// One shard as seen by this process.
struct Shard {
    index: u32,
    writer: RwLock<Option<Arc<ShardWriter>>>,
    opening: tokio::sync::Mutex<()>,
    reader: tokio::sync::Mutex<ShardReader>,
}

/// The shard as a process that does not write it reads it.
struct ShardReader {
    versions: VersionedObjects,
    manifest: Option<Versioned<ShardManifest>>,
    refreshed: Option<Instant>,
    tail: WalTail,
}

/// A table of a root, opened in this process. Cheap to share.
pub struct Table {
    store: Arc<dyn ObjectStore>,
    location: String,
    schema: Arc<TableSchema>,
    options: WriterOptions,
    shards: Vec<Shard>,
    next_append_shard: AtomicU32,
    sstables: Arc<SstableReader>,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("location", &self.location)
            .field("shards", &self.shards.len())
            .finish()
    }
}

/// The durability of one table-level put (one handle per shard it touched).
#[derive(Debug)]
pub struct Acks(Vec<Durability>);

impl Acks {
    /// Waits until every part of the put is durable.
    pub async fn wait(self) -> Result<()> {
        for ack in self.0 {
            ack.wait().await?;
        }
        Ok(())
    }
}

impl Table {
    /// The table stored at `location` in `store`, described by `meta`.
    /// Opens nothing yet: writers open on first write.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        location: &str,
        meta: &TableMeta,
        options: WriterOptions,
    ) -> Self {
        let schema = Arc::new(TableSchema::new(meta));
        let shards = (0..schema.shards)
            .map(|index| {
                let dir = paths::shard_dir(location, index);
                let wal = WalLog::new(Arc::clone(&store), paths::wal_dir(&dir));
                let versions = VersionedObjects::new(
                    Arc::clone(&store),
                    paths::shard_manifest_dir(&dir),
                    "json",
                    options.commit.clone(),
                );
                Shard {
                    index,
                    writer: RwLock::new(None),
                    opening: tokio::sync::Mutex::new(()),
                    reader: tokio::sync::Mutex::new(ShardReader {
                        versions,
                        manifest: None,
                        refreshed: None,
                        tail: WalTail::new(wal, Arc::clone(&schema)),
                    }),
                }
            })
            .collect();
        Self {
            sstables: Arc::new(SstableReader::new(Arc::clone(&store), Arc::clone(&schema))),
            store,
            location: location.to_string(),
            schema,
            options,
            shards,
            next_append_shard: AtomicU32::new(0),
        }
    }

    /// The table's schema, key and stored row form.
    pub fn schema(&self) -> &Arc<TableSchema> {
        &self.schema
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
    /// needed.
    pub async fn writer(&self, shard: u32) -> Result<Arc<ShardWriter>> {
        let slot = &self.shards[shard as usize];
        if let Some(w) = self.live_writer(slot) {
            return Ok(w);
        }
        let _one_opener = slot.opening.lock().await;
        if let Some(w) = self.live_writer(slot) {
            return Ok(w);
        }
        let writer = Arc::new(
            ShardWriter::open(
                Arc::clone(&self.store),
                &self.location,
                shard,
                Arc::clone(&self.schema),
                self.options.clone(),
            )
            .await?,
        );
        *slot.writer.write().expect("writer slot poisoned") = Some(Arc::clone(&writer));
        Ok(writer)
    }

    fn live_writer(&self, slot: &Shard) -> Option<Arc<ShardWriter>> {
        let current = slot.writer.read().expect("writer slot poisoned").clone()?;
        (current.stopped().is_none() && !current.is_closed()).then_some(current)
    }

    /// Puts the rows of `batch` and waits until they are visible (and
    /// durable, if the table is). Bad input writes nothing.
    pub async fn put(&self, batch: &RecordBatch) -> Result<()> {
        let acks = self.put_nowait(batch).await?;
        acks.wait().await?;
        Ok(())
    }

    /// Puts the rows of `batch` into the MemTables and returns without
    /// waiting for durability.
    pub async fn put_nowait(&self, batch: &RecordBatch) -> Result<Acks> {
        self.put_all_nowait(std::slice::from_ref(batch)).await
    }

    /// Puts the rows of every batch as one put per shard (each shard makes
    /// its part visible and durable at once; shards are independent) and
    /// returns without waiting for durability. Every batch is checked
    /// before anything is written.
    pub async fn put_all_nowait(&self, batches: &[RecordBatch]) -> Result<Acks> {
        let stored = batches
            .iter()
            .map(|b| self.schema.to_stored(b))
            .collect::<Result<Vec<_>>>()?;
        self.route(stored).await
    }

    /// Deletes the keys in `keys` (exactly the key columns, in key order).
    pub async fn delete(&self, keys: &RecordBatch) -> Result<()> {
        let acks = self.delete_nowait(keys).await?;
        acks.wait().await?;
        Ok(())
    }

    /// Like [`Table::delete`] without waiting for durability.
    pub async fn delete_nowait(&self, keys: &RecordBatch) -> Result<Acks> {
        let stored = self.schema.tombstones(keys)?;
        self.route(vec![stored]).await
    }

    /// Sends stored rows to their shards' writers, one put per shard. Each
    /// row's key is encoded once, for routing and the MemTable index alike.
    async fn route(&self, stored: Vec<RecordBatch>) -> Result<Acks> {
        let shards = self.shards.len() as u32;
        let mut parts: Vec<Vec<KeyedBatch>> = vec![Vec::new(); shards as usize];
        // Where rows go that need no key to route: the only shard, or the
        // next one in turn for an append-only table.
        let whole_shard = if self.schema.has_key() {
            0
        } else {
            self.next_append_shard.fetch_add(1, Ordering::Relaxed) % shards
        };
        for batch in stored {
            let (batch, keys) = self.schema.keyed(batch)?;
            let keys = match keys {
                Some(keys) if shards > 1 => keys,
                keys => {
                    parts[whole_shard as usize].push((batch, keys));
                    continue;
                }
            };
            let mut rows: Vec<Vec<u32>> = vec![Vec::new(); shards as usize];
            let mut shard_keys: Vec<Vec<Box<[u8]>>> = vec![Vec::new(); shards as usize];
            for (row, k) in keys.into_iter().enumerate() {
                let shard = key::shard_of(&k, shards) as usize;
                rows[shard].push(row as u32);
                shard_keys[shard].push(k);
            }
            for (shard, (rows, keys)) in rows.into_iter().zip(shard_keys).enumerate() {
                if !rows.is_empty() {
                    let part = take_record_batch(&batch, &UInt32Array::from(rows))?;
                    parts[shard].push((part, Some(keys)));
                }
            }
        }
        let mut acks = Vec::new();
        for (shard, part) in parts.into_iter().enumerate() {
            if !part.is_empty() {
                acks.push(self.writer(shard as u32).await?.put_keyed(part).await?);
            }
        }
        Ok(Acks(acks))
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
        self.snapshot(shard, max_age)
            .await?
            .get(&encoded, &self.schema.key_columns(&stored))
            .await
    }

    /// The live row with key `key` in `snapshot` (of the key's shard).
    pub async fn get_in(
        &self,
        snapshot: &ShardSnapshot,
        key: &RecordBatch,
    ) -> Result<Option<RecordBatch>> {
        let (_, encoded, stored) = self.locate(key)?;
        snapshot
            .get(&encoded, &self.schema.key_columns(&stored))
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
        let mut reader = self.shards[shard as usize].reader.lock().await;
        let fresh = reader
            .refreshed
            .is_some_and(|at| !max_age.is_zero() && at.elapsed() < max_age);
        if !fresh {
            self.refresh(&mut reader).await?;
        }
        let manifest = reader.manifest.as_ref().expect("refreshed above");
        Ok(ShardSnapshot {
            schema: Arc::clone(&self.schema),
            reader: Arc::clone(&self.sstables),
            memtables: vec![reader.tail.layer()],
            sstables: Arc::new(manifest.state.sstables.clone()),
        })
    }

    /// Reads the shard manifest if it changed (one existence check when it
    /// did not), the WAL after its cursor, and checks the manifest did not
    /// move meanwhile.
    async fn refresh(&self, reader: &mut ShardReader) -> Result<()> {
        let started = Instant::now();
        reader.refreshed = None;
        for _ in 0..SNAPSHOT_ATTEMPTS {
            let manifest = match reader.manifest.take() {
                Some(known) if !reader.versions.has_newer(&known).await? => known.confirmed(),
                known => {
                    let from = known.map_or(0, |m| m.version);
                    reader
                        .versions
                        .load_latest(from, ShardManifest::decode)
                        .await?
                }
            };
            let cursor = manifest.state.replay_after;
            let fresh = reader.tail.refresh(cursor).await?
                // A flush that committed (and deleted the WAL it covers)
                // after the manifest was read leaves no gap to see when
                // nothing was written after it: check the manifest again.
                && !reader.versions.has_newer(&manifest).await?;
            reader.manifest = Some(manifest);
            if fresh {
                reader.refreshed = Some(started);
                return Ok(());
            }
        }
        Err(Error::CommitConflict {
            what: format!("a consistent snapshot of {}", self.location),
            attempts: SNAPSHOT_ATTEMPTS as u32,
        })
    }

    /// This process's writer of `shard`, if it still owns the shard (nobody
    /// else has written at the position it appends at next), as checked at
    /// most `max_age` ago.
    async fn owning_writer(
        &self,
        shard: u32,
        max_age: Duration,
    ) -> Result<Option<Arc<ShardWriter>>> {
        let slot = &self.shards[shard as usize];
        let Some(writer) = self.live_writer(slot) else {
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

    /// Merges each shard's SSTables into one (see
    /// [`ShardWriter::compact`]); opens the writers it needs.
    pub async fn compact(&self) -> Result<()> {
        for shard in 0..self.shards.len() as u32 {
            self.writer(shard).await?.compact().await?;
        }
        Ok(())
    }

    /// Makes everything put so far durable and closes every open writer;
    /// reports the first error.
    pub async fn close(&self) -> Result<()> {
        let mut first = Ok(());
        for slot in &self.shards {
            let writer = slot.writer.write().expect("writer slot poisoned").take();
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
    options: WriterOptions,
}

impl TableCache {
    /// An empty cache whose tables write with `options`.
    pub fn new(options: WriterOptions) -> Self {
        Self {
            tables: Mutex::default(),
            options,
        }
    }

    /// The cache of this process for root `url` and `options`: the same
    /// one for as long as any holder keeps it alive.
    pub fn shared(url: &str, options: WriterOptions) -> Arc<Self> {
        static CACHES: OnceLock<Mutex<HashMap<String, Weak<TableCache>>>> = OnceLock::new();
        let key = format!("{url}\n{options:?}");
        let mut caches = CACHES
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

    /// The table at `location`, opened on first use.
    pub fn get_or_open(
        &self,
        store: &Arc<dyn ObjectStore>,
        location: &str,
        meta: &TableMeta,
    ) -> Arc<Table> {
        let mut tables = self.tables.lock().expect("table cache poisoned");
        Arc::clone(tables.entry(location.to_string()).or_insert_with(|| {
            Arc::new(Table::new(
                Arc::clone(store),
                location,
                meta,
                self.options.clone(),
            ))
        }))
    }

    /// Closes and forgets every open table whose location `keep` rejects
    /// (a dropped table); reports the first error.
    pub async fn close_unless(&self, keep: impl Fn(&str) -> bool) -> Result<()> {
        let gone: Vec<Arc<Table>> = self
            .tables
            .lock()
            .expect("table cache poisoned")
            .extract_if(|location, _| !keep(location))
            .map(|(_, table)| table)
            .collect();
        let mut first = Ok(());
        for table in gone {
            if let Err(e) = table.close().await
                && first.is_ok()
            {
                first = Err(e);
            }
        }
        first
    }

    /// Closes every open table (see [`Table::close`]).
    pub async fn close(&self) -> Result<()> {
        self.close_unless(|_| false).await
    }
}
