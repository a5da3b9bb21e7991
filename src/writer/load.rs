//! Bulk loads through a [`ShardWriter`]: a write too large to hold in
//! memory goes to SSTables directly instead of the MemTable and the WAL.
//!
//! 1. [`LoadRun::write`] sorts a bounded part of the load and writes it
//!    as an SSTable that no manifest names yet (its long blob values
//!    first, into a pack named by the load, which pack collection leaves
//!    alone while the load may still commit), under the shard's `load/`
//!    directory, where writers that take the shard over meanwhile leave it
//!    alone; no writer of the shard is needed until the commit, which
//!    takes the shard (back) like a put. While it runs, the load rewrites
//!    a marker per shard (see [`super::WriterOptions::load_grace`]); a
//!    crash leaves runs whose markers age, which a writer of the shard
//!    deletes once they are as old as that, after it listed the load as
//!    dead in the shard's manifest (so that a load stalled that long
//!    never commits them);
//! 2. [`ShardWriter::finish_runs`] builds the runs' graphs and counts the
//!    distinct keys they hold (a merge of the key columns of the row groups
//!    whose key ranges overlap another run's: none for a load in key order),
//!    marking in each run's deletion vector the rows whose keys a later run
//!    holds (complete marks for a load into an empty shard, so that scans
//!    read its runs unmerged);
//! 3. [`ShardWriter::ingest`] makes the runs the shard's next generations
//!    (a later run's row of a key wins, as it would in a MemTable) in one
//!    manifest commit; compaction merges them later, in the background.
//!    Puts wait meanwhile, and every MemTable holding earlier puts is
//!    flushed first, so the load is newer than every put acknowledged
//!    before it and older than every put after it. The commit is the only
//!    moment the load becomes visible and durable: a shard's part is all
//!    there or not at all, across crashes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use datafusion::arrow::array::{AsArray, RecordBatch, UInt32Array};
use datafusion::arrow::compute::{concat_batches, take_record_batch};
use datafusion::arrow::row::OwnedRow;
use datafusion::execution::memory_pool::{MemoryPool, UnboundedMemoryPool};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};

use super::manifest::{MAX_DEAD_LOADS, now_ms};
use super::{ShardWriter, Shared};
use crate::blob;
use crate::error::{Error, Result};
use crate::schema::TableSchema;
use crate::sstable::{
    self, Codec, DeletionVector, ROW_GROUP_ROWS, ReadMetrics, SstableFile, merge,
};
use crate::store::{delete_if_present, paths};

/// Rows per batch a run is written in.
const RUN_BATCH_ROWS: usize = 8192;

/// The most runs of one shard a load merges at once (and commits).
const MAX_RUNS: usize = 16;

impl Shared {
    /// Deletes the runs and markers of the shard's crashed bulk loads
    /// (their blob packs go by pack collection): loads whose markers are
    /// older than the grace they name (see [`paths::load_marker`]), or
    /// that have no markers and only objects older than `load_grace`, and
    /// whose runs no manifest names; and what is left of loads listed as
    /// dead already. They are first listed as dead in the manifest
    /// ([`super::ShardManifest::dead_loads`]), by a commit that sees
    /// their runs unnamed: from then on their commits are refused (see
    /// `Shared::flush_load`), so no commit names what is deleted here,
    /// however late a stalled load comes back. A writer fenced meanwhile
    /// deletes nothing.
    pub(super) async fn delete_dead_loads(&self) -> Result<()> {
        let listed: Vec<ObjectMeta> = self
            .store
            .list(Some(&paths::loads_dir(&self.shard_dir)))
            .try_collect()
            .await?;
        let grace = self.options.load_grace.as_millis() as u64;
        let fresh = markers(&listed);
        // Each load's runs (their directories), and whether every object
        // of it is older than the grace. Runs of an older build name no
        // load and are left alone.
        let mut loads: BTreeMap<u64, (HashSet<&str>, bool)> = BTreeMap::new();
        for meta in &listed {
            let path = meta.location.as_ref();
            let Some(load) = paths::load_of(path) else {
                continue;
            };
            let (runs, old) = loads.entry(load).or_insert((HashSet::new(), true));
            *old &= older_than(meta, grace);
            if paths::marker_grace(path).is_none() {
                runs.insert(paths::sstable_dir(path));
            }
        }
        // Listed as dead already: whatever is left of them goes now.
        let listed_dead = self.manifest().state.dead_loads.clone();
        loads.retain(|load, (_, old)| match fresh.get(load) {
            _ if listed_dead.contains(load) => true,
            Some(&fresh) => !fresh,
            None => *old,
        });
        if loads.is_empty() {
            return Ok(());
        }
        self.commit(
            "shard manifest commit of crashed bulk loads",
            |m| {
                let named = m.named_dirs();
                let dead: Vec<u64> = loads
                    .iter()
                    .filter(|(load, (runs, _))| {
                        !m.dead_loads.contains(load) && runs.is_disjoint(&named)
                    })
                    .map(|(&load, _)| load)
                    .collect();
                if dead.is_empty() {
                    return false;
                }
                m.dead_loads.extend(dead);
                let excess = m.dead_loads.len().saturating_sub(MAX_DEAD_LOADS);
                m.dead_loads.drain(..excess);
                true
            },
            |_| {},
        )
        .await?;
        // Of a load whose runs a manifest names (it committed), only the
        // markers its end left.
        let dead = &self.manifest().state.dead_loads;
        let doomed: Vec<Path> = listed
            .iter()
            .map(|meta| meta.location.as_ref())
            .filter(|&path| {
                paths::load_of(path).is_some_and(|load| {
                    loads.contains_key(&load)
                        && (dead.contains(&load) || paths::marker_grace(path).is_some())
                })
            })
            .map(Path::from)
            .collect();
        log::debug!(
            "deleting {} objects of crashed loads in {}",
            doomed.len(),
            self.shard_dir
        );
        futures::stream::iter(doomed)
            .map(|path| async move { delete_if_present(self.store.as_ref(), &path).await })
            .buffer_unordered(16)
            .try_collect()
            .await
    }

    /// The [`blob::load_tag`]s of the loads with objects in the shard's
    /// `load/` directory: a load that may still commit has its markers
    /// there (written before its first run and pack), unless a writer
    /// took it for crashed (see [`Shared::delete_dead_loads`]).
    pub(super) async fn loads_present(&self) -> Result<HashSet<u64>> {
        Ok(self
            .store
            .list(Some(&paths::loads_dir(&self.shard_dir)))
            .try_filter_map(|meta| {
                let load = paths::load_of(meta.location.as_ref());
                std::future::ready(Ok(load.map(blob::load_tag)))
            })
            .try_collect()
            .await?)
    }
}

/// Whether `meta` was last written more than `ms` ago.
fn older_than(meta: &ObjectMeta, ms: u64) -> bool {
    now_ms() as i64 - meta.last_modified.timestamp_millis() > ms as i64
}

/// The loads whose markers are among `listed`, and whether one of each
/// load's markers is fresh by the grace it names.
fn markers(listed: &[ObjectMeta]) -> HashMap<u64, bool> {
    let mut loads: HashMap<u64, bool> = HashMap::new();
    for meta in listed {
        let path = meta.location.as_ref();
        if let (Some(load), Some(its_grace)) = (paths::load_of(path), paths::marker_grace(path)) {
            *loads.entry(load).or_default() |= !older_than(meta, its_grace);
        }
    }
    loads
}

/// The first and last key of some rows sorted by key.
type KeyRange = (OwnedRow, OwnedRow);

/// The rows of a load's run that a merge with its other runs reads.
struct MergedRows {
    /// The run (its index among the load's runs).
    run: usize,
    /// `(first row, rows)` of each part read, in order.
    parts: Vec<(u64, u64)>,
    /// The rows (by position in what was read) that reached the output.
    reached: DeletionVector,
}

impl MergedRows {
    fn new(run: usize, parts: Vec<(u64, u64)>) -> Self {
        let rows = parts.iter().map(|&(_, rows)| rows).sum();
        Self {
            run,
            parts,
            reached: DeletionVector::new(rows),
        }
    }
}

/// A run of a load: an SSTable no manifest names yet.
#[derive(Debug, Clone)]
pub(crate) struct LoadRun {
    pub file: SstableFile,
    /// The key range of each of its row groups (`by_row_group`), or one
    /// range spanning the file; empty for a table without a key.
    ranges: Vec<KeyRange>,
    by_row_group: bool,
    /// The bytes of the blob pack written with it, if any.
    pack_bytes: Option<u64>,
}

impl LoadRun {
    /// The key range of each row group of `body` (sorted by key) written
    /// in row groups of [`ROW_GROUP_ROWS`] rows.
    fn row_group_ranges(schema: &TableSchema, body: &RecordBatch) -> Result<Vec<KeyRange>> {
        let rows = body.num_rows() as u32;
        if !schema.has_key() || rows == 0 {
            return Ok(Vec::new());
        }
        let ends: Vec<u32> = (0..rows)
            .step_by(ROW_GROUP_ROWS)
            .flat_map(|first| [first, (first + ROW_GROUP_ROWS as u32).min(rows) - 1])
            .collect();
        let keys = schema.key_rows(&take_record_batch(body, &UInt32Array::from(ends))?)?;
        Ok((0..keys.num_rows())
            .step_by(2)
            .map(|at| (keys.row(at).owned(), keys.row(at + 1).owned()))
            .collect())
    }

    /// The range of every key of the run.
    fn range(&self) -> Option<KeyRange> {
        let (first, last) = (self.ranges.first()?, self.ranges.last()?);
        Some((first.0.clone(), last.1.clone()))
    }
}

/// The epoch in the names of a load's runs and of their blob packs: no
/// writer's (a writer's is at least 1). A run is no change of the shard
/// until a writer commits it, so no writer is needed to write it.
pub(super) const LOAD_EPOCH: u64 = 0;

/// Where a load writes one shard's runs (see [`LoadRun::write`]).
pub(crate) struct RunTarget {
    pub store: Arc<dyn ObjectStore>,
    pub shard_dir: Path,
    pub schema: Arc<TableSchema>,
    /// [`super::WriterOptions::blob_inline_bytes`].
    pub blob_inline_bytes: usize,
}

impl LoadRun {
    /// Writes `batches` (stored form, rows of the shard, oldest first) as
    /// one sorted run of load `load`, numbered `seq` (later runs have
    /// higher numbers and win over earlier ones), not yet part of the
    /// shard. `encoded` is called once the rows are sorted, encoded and
    /// dropped, before the upload ends: what is left is waiting on the
    /// store.
    pub(crate) async fn write(
        target: &RunTarget,
        batches: Vec<RecordBatch>,
        load: u64,
        seq: u64,
        encoded: impl FnOnce() + Send,
    ) -> Result<LoadRun> {
        let schema = Arc::clone(&target.schema);
        let (pack, inline) = (blob::load_pack_id(load, seq), target.blob_inline_bytes);
        let (body, ranges, packed, named) = tokio::task::spawn_blocking(move || {
            // One batch, and the parts dropped before the sort copies it.
            let all = concat_batches(&schema.stored, &batches)?;
            drop(batches);
            let body = sstable::newest_per_key_sorted(&schema, std::slice::from_ref(&all))?;
            drop(all);
            let ranges = LoadRun::row_group_ranges(&schema, &body)?;
            // Long blob values go into a pack of the run's own; the run
            // holds their descriptors.
            let packed = blob::pack(
                &schema,
                std::slice::from_ref(&body),
                pack,
                LOAD_EPOCH,
                inline,
            )?;
            let (body, packed) = match packed {
                Some(mut packed) => {
                    let bytes = std::mem::take(&mut packed.bytes);
                    (packed.into_batches()?.remove(0), Some(bytes))
                }
                None => (body, None),
            };
            let mut named = blob::Named::new();
            blob::collect_named(&schema, &body, &mut named);
            Ok::<_, Error>((body, ranges, packed, named))
        })
        .await
        .map_err(|e| Error::Poisoned(format!("sorting a load's rows failed: {e}")))??;
        // Before the run that names it. Until the load commits, pack
        // collection leaves it alone while the load's markers are fresh; a
        // load that fails leaves it to that collection.
        let mut pack_bytes = None;
        if let Some(bytes) = packed {
            pack_bytes = Some(bytes.content_length() as u64);
            let path = paths::blob_pack(&target.shard_dir, pack, LOAD_EPOCH);
            blob::put_pack(&target.store, &path, bytes).await?;
        }
        let slices: Vec<_> = (0..body.num_rows())
            .step_by(RUN_BATCH_ROWS)
            .map(|at| Ok(body.slice(at, RUN_BATCH_ROWS.min(body.num_rows() - at))))
            .collect();
        // The rows go as they are encoded (see `encoded`).
        let rows = Box::pin(RecordBatchStreamAdapter::new(
            body.schema(),
            futures::stream::iter(slices),
        ));
        drop(body);
        let path = paths::new_load_run(&target.shard_dir, load, seq, LOAD_EPOCH);
        let mut file = sstable::write_stream(
            &target.store,
            path,
            (seq, seq),
            (&target.schema, Codec::Fast),
            rows,
            encoded,
        )
        .await?;
        file.packs = blob::runs(&named);
        file.blob_bytes = named.values().sum();
        Ok(LoadRun {
            file,
            ranges,
            by_row_group: true,
            pack_bytes,
        })
    }
}

impl ShardWriter {
    /// Builds the graphs of the runs of a load (oldest first) and counts
    /// the rows they hold together: distinct keys (a streaming merge of
    /// the key columns of the row groups that may share a key with another
    /// run), or every row of a table without a key.
    /// More than [`MAX_RUNS`] runs are first brought down to that many by
    /// merging the oldest in groups (a group's merge replacing it), so that
    /// memory stays bounded by a few batches of at most that many runs,
    /// here and in the compactions after the commit.
    pub(crate) async fn finish_runs(&self, runs: &mut Vec<LoadRun>) -> Result<u64> {
        let shared = &self.shared;
        // The packs the runs were written with count as this writer's.
        for bytes in runs.iter().filter_map(|r| r.pack_bytes) {
            shared.counters.blob_packs.fetch_add(1, Ordering::Relaxed);
            shared
                .counters
                .blob_pack_bytes
                .fetch_add(bytes, Ordering::Relaxed);
        }
        while runs.len() > MAX_RUNS {
            // The oldest runs, in groups of at most MAX_RUNS, as few as
            // bring the count down to MAX_RUNS. On an error `runs` still
            // names every run not yet deleted, for the caller to discard.
            let mut excess = runs.len() - MAX_RUNS;
            let mut rest = std::mem::take(runs).into_iter();
            while excess > 0 && rest.len() > 1 {
                let size = (excess + 1).min(MAX_RUNS).min(rest.len());
                let group: Vec<LoadRun> = rest.by_ref().take(size).collect();
                match self.merge_runs(&group).await {
                    Ok(merged) => runs.push(merged),
                    Err(e) => {
                        runs.extend(group.into_iter().chain(rest));
                        return Err(e);
                    }
                }
                excess -= size - 1;
            }
            runs.extend(rest);
        }
        for run in runs.iter_mut() {
            let threads = shared.options.index_threads;
            shared.build_graphs(&mut run.file, None, threads).await?;
        }
        let schema = &shared.schema;
        let total = runs.iter().map(|r| r.file.rows).sum();
        if !schema.has_key() {
            return Ok(total);
        }
        // Each run holds a key once: only the row groups whose key range
        // meets another run's can hold a key twice, so only those are
        // merged (none for runs of a load in key order).
        let whole: Vec<Option<KeyRange>> = runs.iter().map(LoadRun::range).collect();
        let mut columns = schema.key.clone();
        columns.push(schema.stored.fields().len() - 1);
        let (mut streams, mut merged) = (Vec::new(), 0);
        // What each stream reads, by its run's sequence.
        let mut read = HashMap::new();
        for (i, run) in runs.iter().enumerate() {
            let meets = |(first, last): &KeyRange| {
                whole.iter().enumerate().any(|(j, other)| {
                    j != i && other.as_ref().is_some_and(|(f, l)| first <= l && f <= last)
                })
            };
            let groups: Vec<usize> = (0..run.ranges.len())
                .filter(|&g| meets(&run.ranges[g]))
                .collect();
            if groups.is_empty() {
                continue;
            }
            // The ranges were cut every ROW_GROUP_ROWS rows: used only if
            // the file's row groups are exactly those.
            let sizes = shared.reader.row_group_rows(&run.file).await?;
            let cut =
                |g: usize| (run.file.rows - (g * ROW_GROUP_ROWS) as u64).min(ROW_GROUP_ROWS as u64);
            let aligned = sizes.len() == run.ranges.len()
                && sizes.iter().enumerate().all(|(g, &rows)| rows == cut(g));
            let row_groups = match run.by_row_group && aligned {
                true => {
                    merged += groups.iter().map(|&g| sizes[g]).sum::<u64>();
                    let first = |g: usize| (g * ROW_GROUP_ROWS) as u64;
                    let parts = groups.iter().map(|&g| (first(g), sizes[g])).collect();
                    read.insert(run.file.generation, MergedRows::new(i, parts));
                    Some(groups)
                }
                false => {
                    merged += run.file.rows;
                    let parts = vec![(0, run.file.rows)];
                    read.insert(run.file.generation, MergedRows::new(i, parts));
                    None
                }
            };
            streams.push(merge::Run {
                rows: shared
                    .reader
                    .stream(&run.file, row_groups, &columns, &ReadMetrics::default())
                    .await?,
                seq: run.file.generation,
                deleted: None,
            });
        }
        if streams.is_empty() {
            return Ok(total);
        }
        let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        // Tombstones kept: a run's newest row of a key is never marked.
        let (mut keys, trace) = merge::merge_runs_traced(schema, &columns, streams, true, &pool)?;
        let tombstone = columns.len() - 1;
        let mut distinct = 0;
        while let Some(batch) = keys.next().await {
            let batch = batch?;
            let dead = batch.column(tombstone).as_boolean().true_count();
            distinct += (batch.num_rows() - dead) as u64;
            // The trace emptied as the merge goes: one bit a row read.
            for (seq, rows) in trace.take() {
                let reached = &mut read.get_mut(&seq).expect("a run of the merge").reached;
                for row in rows {
                    reached.mark(row)?;
                }
            }
        }
        if shared.keeps_marks() {
            for read in read.into_values() {
                self.mark_older_rows(&mut runs[read.run].file, &read)
                    .await?;
            }
        }
        Ok(total - merged + distinct)
    }

    /// Marks, in the deletion vector of `file` (a run of a load), each row
    /// `read` took to a merge with the load's other runs that did not
    /// reach its output: a later run holds its key. The vector is written
    /// beside the run (and discarded with it if the load does not commit).
    async fn mark_older_rows(&self, file: &mut SstableFile, read: &MergedRows) -> Result<()> {
        let shared = &self.shared;
        let (mut vector, mut marked) = (DeletionVector::new(file.rows), false);
        let mut at = 0;
        for &(first, rows) in &read.parts {
            for row in first..first + rows {
                if !read.reached.contains(at) {
                    marked |= vector.mark(row)?;
                }
                at += 1;
            }
        }
        if marked {
            let entry =
                sstable::deletions::write(&shared.store, file, shared.epoch, &vector).await?;
            shared.reader.cache_deletions(&entry, Arc::new(vector));
            file.deletions = Some(entry);
        }
        Ok(())
    }

    /// Merges `group` (consecutive runs, oldest first) into one run and
    /// deletes them.
    async fn merge_runs(&self, group: &[LoadRun]) -> Result<LoadRun> {
        let shared = &self.shared;
        let files: Vec<SstableFile> = group.iter().map(|r| r.file.clone()).collect();
        // The merged run is the same load's (see `Shared::delete_dead_loads`).
        let load = paths::load_of(group[0].file.path.as_ref()).unwrap_or_default();
        let (file, _) = shared.merge(&files, true, Some(load)).await?;
        sstable::discard_all(&shared.store, &files).await;
        // The group's keys lie within the union of its ranges.
        let range = group
            .iter()
            .filter_map(LoadRun::range)
            .reduce(|(first, last), (f, l)| (first.min(f), last.max(l)));
        Ok(LoadRun {
            file,
            ranges: range.into_iter().collect(),
            by_row_group: false,
            pack_bytes: None,
        })
    }

    /// Holds the shard's compaction until as many
    /// [`ShardWriter::release_compaction`]s: a bulk load holds every shard
    /// it loads while it commits them, so that compacting the shards
    /// committed first does not slow the commits of the others.
    pub(crate) fn hold_compaction(&self) {
        self.shared.compaction_holds.fetch_add(1, Ordering::AcqRel);
    }

    /// Ends a [`ShardWriter::hold_compaction`]; the compaction task
    /// compacts what became due meanwhile once no hold is left.
    pub(crate) fn release_compaction(&self) {
        self.shared.compaction_holds.fetch_sub(1, Ordering::AcqRel);
        self.shared.compaction_wake.notify_one();
    }

    /// Makes `runs` (oldest first, from [`LoadRun::write`]) part of
    /// the shard as consecutive generations, newer than every put before
    /// and older than every put after; returns once the manifest names
    /// them. No writer deletes the runs, or their blob packs, before
    /// `kept_until` (the load's markers are fresh till then); after it,
    /// the runs are first checked to be there, and a load a writer listed
    /// as dead meanwhile commits nothing and fails. See the module doc.
    pub(crate) async fn ingest(&self, runs: Vec<SstableFile>, kept_until: Instant) -> Result<()> {
        self.shared
            .stopping_on_panic("a load's commit", self.commit_runs(runs, kept_until))
            .await
    }

    /// [`ShardWriter::ingest`], unguarded.
    async fn commit_runs(&self, mut runs: Vec<SstableFile>, kept_until: Instant) -> Result<()> {
        let shared = &self.shared;
        // A retry after a commit that landed while its writer stopped (so
        // it could not say so): the manifest names the runs already.
        let named = shared
            .manifest()
            .state
            .named_dirs()
            .contains(paths::sstable_dir(
                &runs.first().ok_or_else(|| Error::invalid("no runs"))?.path,
            ));
        if named {
            return Ok(());
        }
        // A load silent for longer than `load_grace` (a stalled host) may
        // have lost its runs, or their blob packs, to a writer that took it
        // for crashed: never name a run or a pack that is gone.
        if Instant::now() >= kept_until {
            self.check_present(&runs).await?;
        }
        let _no_puts = shared.ingest_gate.write().await;
        let (generation, load) = {
            let _one_writer = shared.append_lock.lock().expect("append lock poisoned");
            shared.accepting()?;
            // Earlier puts go to SSTables first, in a generation of their own.
            let mut active = Arc::clone(shared.layers.read().expect("layers poisoned").active());
            if active.memtable.written_batches() > 0 {
                shared.rotate(1);
                active = Arc::clone(shared.layers.read().expect("layers poisoned").active());
            }
            // The now empty active generation is the load, numbered on for
            // each run: its flush commits the runs (see `Shared::flush`).
            for (i, run) in runs.iter_mut().enumerate() {
                run.generation = active.number + i as u64;
                run.first_generation = run.generation;
            }
            let span = runs.len().max(1) as u64;
            *active.ingested.lock().expect("ingest slot poisoned") = runs;
            shared.rotate(span);
            (active.number, active)
        };
        shared.flush_wake.notify_one();
        let mut progress = shared.progress.subscribe();
        let done = progress
            .wait_for(|p| p.error.is_some() || p.flushed_generation > generation)
            .await
            .map_err(|_| Error::Poisoned("the shard writer is gone".into()))?;
        if let Some(stop) = &done.error {
            return Err(stop.tell());
        }
        match load.refused.load(Ordering::Acquire) {
            true => Err(Error::NotFound(format!(
                "this bulk load's part of {} (its runs were deleted as a crashed load's: \
                 the load was silent for longer than load_grace)",
                shared.shard_dir
            ))),
            false => Ok(()),
        }
    }

    /// Deletes the runs of the shard's crashed bulk loads, once they are
    /// listed as dead in its manifest (so none of them commits them). A
    /// failure is logged: a later sweep deletes what is left.
    pub(crate) async fn delete_dead_loads(&self) {
        if let Err(e) = self.shared.delete_dead_loads().await {
            log::warn!("deleting the runs of crashed loads failed: {e}");
        }
    }

    /// Fails unless every one of `runs`, their deletion vectors and their
    /// blob packs is in the store.
    async fn check_present(&self, runs: &[SstableFile]) -> Result<()> {
        let shared = &self.shared;
        let packs = runs.iter().flat_map(|run| &run.packs).flat_map(|packs| {
            (packs.first..=packs.last)
                .map(|pack| paths::blob_pack(&shared.shard_dir, pack, packs.epoch))
        });
        let objects = runs
            .iter()
            .flat_map(|run| std::iter::once(&run.path).chain(run.deletions.iter().map(|d| &d.path)))
            .map(|path| Path::from(path.as_str()))
            .chain(packs);
        let present = objects.map(|path| async move {
            match shared.store.head(&path).await {
                Err(object_store::Error::NotFound { .. }) => Err(Error::NotFound(format!(
                    "{path} of this bulk load (deleted as a crashed load's: the load \
                     was silent for longer than load_grace)"
                ))),
                other => other.map(|_| ()).map_err(Error::from),
            }
        });
        futures::future::try_join_all(present).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use object_store::PutPayload;
    use object_store::memory::InMemory;

    use super::*;
    use crate::schema::TableMeta;
    use crate::writer::WriterOptions;

    /// A writer of shard 0 of a table `(id, v)`, and where a load writes
    /// runs of three rows (see [`run`]).
    async fn writer_and_target() -> (ShardWriter, RunTarget) {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Int64, true),
        ]);
        let meta = TableMeta::new(&schema, vec!["id".into()], &[]).unwrap();
        let schema = Arc::new(TableSchema::new(&meta));
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let target = RunTarget {
            store: Arc::clone(&store),
            shard_dir: paths::shard_dir("tables/t-1", 0),
            schema: Arc::clone(&schema),
            blob_inline_bytes: 4096,
        };
        let options = WriterOptions::default();
        let writer = ShardWriter::open(store, "tables/t-1", 0, schema, options)
            .await
            .unwrap();
        (writer, target)
    }

    /// Run 1 of load `load`: three rows.
    async fn run(target: &RunTarget, load: u64) -> LoadRun {
        let schema = &target.schema;
        let rows = RecordBatch::try_new(
            Arc::clone(&schema.schema),
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3])),
                Arc::new(Int64Array::from(vec![10, 20, 30])),
            ],
        )
        .unwrap();
        let stored = vec![schema.to_stored(&rows).unwrap()];
        LoadRun::write(target, stored, load, 1, || ())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_crashed_load_is_listed_dead_before_its_runs_go_and_commits_nothing_since() {
        let (writer, target) = writer_and_target().await;
        let store = &target.store;
        let exists = |path: &str| {
            let path = Path::from(path);
            async move { store.head(&path).await.is_ok() }
        };
        // Load 7 crashed: its marker (naming no grace) is stale at once.
        // Load 8 committed and left its marker behind.
        let crashed = run(&target, 7).await;
        let committed = run(&target, 8).await;
        let later = Instant::now() + Duration::from_secs(3600);
        writer
            .ingest(vec![committed.file.clone()], later)
            .await
            .unwrap();
        let marker = |load| paths::load_marker(&target.shard_dir, load, 0);
        for load in [7, 8] {
            store.put(&marker(load), PutPayload::new()).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
        writer.delete_dead_loads().await;
        assert_eq!(writer.shared.manifest().state.dead_loads, vec![7]);
        assert!(
            !exists(&crashed.file.path).await,
            "the crashed load's run went"
        );
        assert!(
            exists(&committed.file.path).await,
            "the committed one's stays"
        );
        for load in [7, 8] {
            assert!(!exists(marker(load).as_ref()).await, "markers went");
        }
        // Load 7 comes back (it had stalled) and commits: refused, however
        // long it counts on its runs being kept.
        let err = writer.ingest(vec![crashed.file], later).await.unwrap_err();
        assert!(err.to_string().contains("crashed load"), "{err}");
        assert_eq!(writer.stats().sstables, 1);
        let manifest = writer.shared.manifest();
        assert_eq!(manifest.state.sstables[0].path, committed.file.path);
        // What it writes since goes at the next sweep, fresh markers and all.
        let since = run(&target, 7).await;
        store
            .put(
                &paths::load_marker(&target.shard_dir, 7, 60_000),
                PutPayload::new(),
            )
            .await
            .unwrap();
        writer.delete_dead_loads().await;
        let left = store.list(Some(&paths::loads_dir(&target.shard_dir)));
        let left: Vec<ObjectMeta> = left.try_collect().await.unwrap();
        assert!(!exists(&since.file.path).await);
        assert_eq!(left.len(), 1, "the committed run: {left:?}");
        writer.close().await.unwrap();
    }

    #[tokio::test]
    async fn ingesting_runs_the_manifest_names_already_adds_nothing() {
        // A retried commit whose first attempt landed (its writer stopped
        // before it could say so) must not name the runs twice.
        let (writer, target) = writer_and_target().await;
        let run = run(&target, 7).await;
        writer
            .ingest(vec![run.file.clone()], Instant::now())
            .await
            .unwrap();
        assert_eq!(writer.stats().sstables, 1);
        writer.ingest(vec![run.file], Instant::now()).await.unwrap();
        assert_eq!(writer.stats().sstables, 1);
        writer.close().await.unwrap();
    }
}
