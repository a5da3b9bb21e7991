//! The flush task of a [`super::ShardWriter`] (DESIGN.md §6): turns sealed
//! MemTables into SSTables, deletes the WAL entries they cover, and keeps
//! the number of SSTables bounded by compaction.
//!
//! Order of effects, each safe to interrupt at any point:
//! 1. flush: write the SSTable under a fresh name (an interrupted write
//!    leaves an unreferenced object), mark the rows of older SSTables its
//!    keys make old in new deletion vectors (fresh names too; see
//!    [`super::deletions`]), then commit the manifest — append the
//!    SSTable, name the new vectors and retire the old ones, advance the
//!    replay cursor, bump the generation — as the writer's epoch only (a
//!    fenced writer never commits). Generations are
//!    flushed one at a time, oldest first, so commits land in generation
//!    order, and a failed flush is retried before anything newer: a later
//!    success never hides an earlier failure;
//! 2. WAL garbage: data entries at or below the cursor are deleted after
//!    the commit — in a table with blob columns, where an entry may hold a
//!    pack SSTables name, once none does and the grace period is over
//!    (see [`Shared::collect_wal_packs`]); fences (which the manifest lists) once
//!    [`super::WriterOptions::fence_grace`] old, since a stale writer's
//!    next append lands exactly on a later epoch's fence and must collide
//!    with it (the writer's module doc says why that grace suffices);
//! 3. compaction, in a task of its own so flushes go on while it runs:
//!    merge a run of consecutive SSTables into one (streaming, without
//!    their marked rows), carry the marks flushes added meanwhile over to
//!    the output, commit the swap of that run (whatever flushes appended
//!    meanwhile), and delete the inputs once
//!    [`super::WriterOptions::sstable_grace`] has passed;
//! 4. at start, objects a crash left behind are collected: SSTables of
//!    older epochs that the manifest does not name (their writers can no
//!    longer commit them)
//!    and WAL entries below the cursor that a crash kept from deletion
//!    (or that a timed-out append re-created after it; in a table with
//!    blob columns, those go with its packs),
//!    and runs of bulk loads that never committed once they are old (see
//!    [`super::load`]); retired SSTables past their grace period are
//!    deleted, and so are blob packs nothing names any more (see
//!    [`Shared::delete_unnamed_packs`]), then and after every compaction.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use datafusion::arrow::array::{Array, AsArray};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::memory_pool::{MemoryPool, UnboundedMemoryPool};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;

use super::manifest::{Fence, RetiredFile, ShardManifest, commit_as, now_ms};
use super::{Generation, Shared, shared_error};
use crate::blob;
use crate::error::{Error, Result};
use crate::hnsw::{Graph, persist};
use crate::schema::VectorColumn;
use crate::sstable::{self, Codec, ReadMetrics, SstableFile, VectorColumnData, merge};
use crate::store::{Versioned, delete_if_present, paths};

/// Deletes issued at once.
const DELETES: usize = 16;

impl Shared {
    /// The flush loop; see the module doc.
    pub(super) async fn run_flush(self: Arc<Self>) {
        if let Err(e) = self.collect_leftovers().await {
            log::warn!("cleaning up after an earlier writer failed: {e}");
        }
        let expired = async {
            // Not beside a compaction: the packs it copies to are named
            // by nothing until it commits.
            let _no_compaction = self.compacting.lock().await;
            let _one_at_a_time = self.maintenance.lock().await;
            self.delete_retired().await
        };
        if let Err(e) = expired.await {
            self.stop(e);
            return;
        }
        loop {
            if self.progress.borrow().error.is_some() {
                return;
            }
            let sealed = {
                let layers = self.layers.read().expect("layers poisoned");
                layers
                    .generations
                    .first()
                    .filter(|g| {
                        g.sealed.load(Ordering::Acquire)
                            && g.memtable.indexed_batches() == g.memtable.written_batches()
                    })
                    .cloned()
            };
            let Some(generation) = sealed else {
                if self.closing.load(Ordering::Acquire)
                    && self.progress.borrow().wal_done
                    && self.index_done.load(Ordering::Acquire)
                {
                    return;
                }
                self.flush_wake.notified().await;
                continue;
            };
            let flushed = async {
                let _one_at_a_time = self.maintenance.lock().await;
                self.flush(&generation).await
            };
            if let Err(e) = flushed.await {
                self.stop(e);
                return;
            }
            self.compaction_due.store(true, Ordering::Release);
            self.compaction_wake.notify_one();
        }
    }

    /// The compaction loop: compacts whenever a flush made it due and no
    /// bulk load holds it; ends once the flush loop has ended and nothing
    /// is due.
    pub(super) async fn run_compaction(self: Arc<Self>) {
        loop {
            if self.progress.borrow().error.is_some() {
                return;
            }
            if self.compaction_holds.load(Ordering::Acquire) == 0
                && self.compaction_due.swap(false, Ordering::AcqRel)
            {
                let _one_at_a_time = self.compacting.lock().await;
                if let Err(e) = self.compact().await {
                    self.stop(e);
                    return;
                }
                continue;
            }
            if self.flush_done.load(Ordering::Acquire) {
                return;
            }
            self.compaction_wake.notified().await;
        }
    }

    /// Runs `attempt` until it succeeds, up to the writer's retry budget
    /// (see [`super::WriterOptions::append_retries`]); a fence is never
    /// retried, and a failure after another writer claimed the shard
    /// (whose collection may have deleted what the attempt reads) is that
    /// fence.
    async fn retrying<T, F: Future<Output = Result<T>>>(
        &self,
        what: &str,
        attempt: impl Fn() -> F,
    ) -> Result<T> {
        let mut failures = 0;
        loop {
            let tried = std::time::Instant::now();
            match attempt().await {
                Ok(t) => return Ok(t),
                Err(e @ Error::Fenced { .. }) => return Err(e),
                Err(e) => {
                    if let Ok(Some(fenced)) = self.newer_claim().await {
                        log::debug!("{what} failed after a newer writer claimed the shard: {e}");
                        return Err(fenced);
                    }
                    let manifest = self.manifest();
                    if let Some(lost) =
                        sstable::lost(&e, &manifest.state.sstables, manifest.version)
                    {
                        return Err(lost);
                    }
                    failures += 1;
                    if !self.options.retry(failures, tried.elapsed()) {
                        // An unknown outcome is no failure: it stands.
                        return Err(match e.outcome_unknown() {
                            true => e,
                            false => Error::Poisoned(format!(
                                "{what} failed (attempts: {failures}); last error: {e}"
                            )),
                        });
                    }
                    log::debug!("{what} failed, retrying: {e}");
                    tokio::time::sleep(self.options.commit.backoff(failures)).await;
                }
            }
        }
    }

    /// The newest shard manifest this writer knows.
    pub(super) fn manifest(&self) -> Versioned<ShardManifest> {
        self.layers
            .read()
            .expect("layers poisoned")
            .manifest
            .clone()
    }

    /// Commits `change` as this writer's epoch, adding what the writer
    /// learned about fences and deleted WAL entries, and publishes the new
    /// SSTable list to readers together with `also` (run under the layers
    /// lock).
    pub(super) async fn commit(
        &self,
        what: &str,
        change: impl Fn(&mut ShardManifest) -> bool,
        also: impl FnOnce(&mut super::Layers),
    ) -> Result<()> {
        let fences = self.fences.lock().expect("fences poisoned").clone();
        let fences_deleted = self.fences_deleted.lock().expect("fences poisoned").clone();
        let deleted = self.wal_deleted_through.load(Ordering::Acquire);
        let now = now_ms();
        let committed = self
            .retrying(what, || {
                commit_as(&self.versions, self.manifest(), self.epoch, |m| {
                    if !change(m) {
                        return false;
                    }
                    for (&position, &at_ms) in fences.range(..=m.replay_after) {
                        if let Err(at) = m.fences.binary_search_by_key(&position, |f| f.position) {
                            m.fences.insert(at, Fence { position, at_ms });
                        }
                    }
                    m.fences.retain(|f| !fences_deleted.contains(&f.position));
                    for f in &mut m.fences {
                        // Listed before fences had times: from now on.
                        if f.at_ms == 0 {
                            f.at_ms = now;
                        }
                    }
                    m.wal_deleted_through = m.wal_deleted_through.max(deleted);
                    true
                })
            })
            .await;
        // A newer writer claimed the shard: this one can never commit
        // again, so it stops (and its table opens a new one).
        let committed = match committed {
            Err(e @ Error::Fenced { .. }) => {
                self.stop(shared_error(&e));
                return Err(e);
            }
            other => other?,
        };
        let mut layers = self.layers.write().expect("layers poisoned");
        if committed.version > layers.manifest.version {
            let sstables = Arc::new(committed.state.sstables.clone());
            let replaced = std::mem::replace(&mut layers.sstables, sstables);
            layers.replaced.retain(|r| r.strong_count() > 0);
            layers.replaced.push(Arc::downgrade(&replaced));
            layers.manifest = committed;
        }
        also(&mut layers);
        Ok(())
    }

    /// Flushes the oldest MemTable, sealed and fully indexed: one SSTable
    /// with its graphs, one commit, then the WAL entries it covers are
    /// deleted.
    async fn flush(&self, generation: &Arc<Generation>) -> Result<()> {
        let memtable = &generation.memtable;
        if memtable.written_batches() == 0 {
            return self.flush_load(generation).await;
        }
        let (encoded, graphs, (keys, packs)) = {
            let memtable = Arc::clone(memtable);
            let schema = Arc::clone(&self.schema);
            let threads = self.options.index_threads;
            // Sorting and encoding are CPU work: off the async runtime.
            tokio::task::spawn_blocking(move || {
                // As the WAL holds them (every entry has landed): long blob
                // values stay in their packs, the SSTable names them.
                let batches: Vec<_> = memtable
                    .batches(0, memtable.written_batches())
                    .into_iter()
                    .map(|b| b.batch)
                    .collect();
                let (encoded, body) = sstable::encode_batches(&schema, &batches)?;
                // MemTable rows are numbered from 0 through its batches,
                // as the encoder counts its input rows.
                let rows = memtable.rows_within(memtable.written_batches());
                let mut position = vec![u32::MAX; rows as usize];
                for (at, &row) in encoded.source.iter().enumerate() {
                    position[row as usize] = at as u32;
                }
                let graphs: Vec<(String, Bytes)> = schema
                    .vectors
                    .iter()
                    .filter_map(|v| {
                        let graph = memtable.graph(v.index)?;
                        let vectors = body.column(v.index).as_fixed_size_list();
                        let bytes = if 2 * (vectors.len() - vectors.null_count()) >= graph.len() {
                            graph.encode(&|row| {
                                let at = position[row as usize];
                                (at != u32::MAX).then_some(at as u64)
                            })
                        } else {
                            // Most nodes are superseded: bridging over
                            // them would leave a sparse graph; build anew.
                            let fresh =
                                Graph::new(v.dim as usize, v.metric, v.params, v.index as u64);
                            fresh.add(vectors, 0, threads);
                            fresh.encode(&Some)
                        };
                        Some((schema.schema.field(v.index).name().clone(), bytes.into()))
                    })
                    .collect();
                let keys: Vec<_> = schema
                    .key
                    .iter()
                    .map(|&k| Arc::clone(body.column(k)))
                    .collect();
                let mut packs = blob::Named::new();
                blob::collect_named(&schema, &body, &mut packs);
                Ok::<_, Error>((encoded, graphs, (keys, packs)))
            })
            .await
            .map_err(|e| Error::Poisoned(format!("SSTable encoding failed: {e}")))??
        };
        let mut file = self
            .retrying("SSTable write", || {
                sstable::write(
                    &self.store,
                    &self.shard_dir,
                    (self.epoch, generation.number),
                    &encoded,
                    &graphs,
                )
            })
            .await?;
        file.packs = blob::runs(&packs);
        file.blob_bytes = packs.values().sum();
        // The rows of older SSTables its keys make old (the maintenance
        // lock keeps their vectors as they are until the commit).
        let older = self.manifest().state.sstables.clone();
        let marked = self
            .retrying("deletion vectors of a flush", || {
                self.mark_shadowed(&older, &keys, generation.number)
            })
            .await?;
        // The vectors new ones replace wait out the grace period.
        let replaced: Vec<String> = older
            .into_iter()
            .filter_map(|f| {
                let now = &marked.get(&f.path)?.deletions;
                f.deletions.filter(|d| Some(d) != now.as_ref())
            })
            .map(|d| d.path)
            .collect();
        let retired_at_ms = now_ms();
        let grace_ms = self.options.sstable_grace.as_millis() as u64;
        let last = generation.last_position.load(Ordering::Acquire);
        let flushed = Arc::clone(generation);
        self.commit(
            "shard manifest commit of a flush",
            |m| {
                if m.sstables.iter().any(|f| f.path == file.path) {
                    return false;
                }
                for f in &mut m.sstables {
                    if let Some(marked) = marked.get(&f.path) {
                        f.deletions = marked.deletions.clone();
                        f.checked_through = marked.checked_through;
                    }
                }
                m.retired.extend(replaced.iter().map(|path| RetiredFile {
                    path: path.clone(),
                    retired_at_ms,
                    packs: Vec::new(),
                }));
                m.sstables.push(file.clone());
                m.replay_after = m.replay_after.max(last);
                m.record_flush(m.replay_after, retired_at_ms, grace_ms);
                m.generation = m.generation.max(generation.number + 1);
                true
            },
            |layers| {
                let first = layers.generations.remove(0);
                debug_assert!(Arc::ptr_eq(&first, &flushed));
            },
        )
        .await?;
        self.progress.send_modify(|p| {
            p.flushed_bytes += memtable.bytes() as u64;
            p.flushed_generation = generation.number + 1;
        });
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        // Its packs are now below the cursor: what the next collection
        // of packs will list (about: values superseded within the
        // MemTable are in them too).
        self.counters
            .blob_stored_bytes
            .fetch_add(file.blob_bytes, Ordering::Relaxed);
        self.counters
            .last_flush_ms
            .store(now_ms(), Ordering::Relaxed);
        log::debug!(
            "flushed generation {} ({} rows) to {}",
            generation.number,
            file.rows,
            file.path
        );
        self.delete_wal_below_cursor().await
    }

    /// "Flushes" an empty generation: commits the SSTables a load left in
    /// it (see [`super::ShardWriter::ingest`]), one generation each.
    async fn flush_load(&self, generation: &Arc<Generation>) -> Result<()> {
        let files = generation
            .ingested
            .lock()
            .expect("ingest slot poisoned")
            .clone();
        let next = generation.number + files.len().max(1) as u64;
        let flushed = Arc::clone(generation);
        let keeps_marks = self.keeps_marks();
        let refused = &generation.refused;
        self.commit(
            "shard manifest commit of a load",
            |m| {
                // A writer took the load for crashed and deletes its runs.
                let dead = files
                    .iter()
                    .filter_map(|f| paths::load_of(&f.path))
                    .any(|load| m.dead_loads.contains(&load));
                refused.store(dead, Ordering::Release);
                if dead
                    || files
                        .iter()
                        .any(|f| m.sstables.iter().any(|s| s.path == f.path))
                {
                    return false;
                }
                // The runs are marked against each other (see
                // `ShardWriter::finish_runs`): into an empty shard, their
                // marks are complete through the last of them.
                let through = match keeps_marks && m.sstables.is_empty() {
                    true => next - 1,
                    false => 0,
                };
                m.sstables.extend(files.iter().map(|f| SstableFile {
                    checked_through: through,
                    ..f.clone()
                }));
                m.generation = m.generation.max(next);
                true
            },
            |layers| {
                let first = layers.generations.remove(0);
                debug_assert!(Arc::ptr_eq(&first, &flushed));
            },
        )
        .await?;
        self.progress.send_modify(|p| p.flushed_generation = next);
        if refused.load(Ordering::Acquire) {
            return Ok(());
        }
        // Their packs, as a flush's.
        let packed: u64 = files.iter().map(|f| f.blob_bytes).sum();
        self.counters
            .blob_stored_bytes
            .fetch_add(packed, Ordering::Relaxed);
        Ok(())
    }

    /// Deletes the WAL data entries at or below the manifest's cursor that
    /// are not deleted yet, and the fences past their grace period.
    async fn delete_wal_below_cursor(&self) -> Result<()> {
        self.delete_expired_fences().await;
        let manifest = self.manifest();
        if !self.schema.blobs.is_empty() {
            // Entries may be packs SSTables name: collected as packs.
            if let Err(e) = self.collect_wal_packs(&manifest.state).await {
                log::warn!("collecting WAL entries failed: {e}");
            }
            return Ok(());
        }
        let through = manifest.state.replay_after;
        let from = self.wal_deleted_through.load(Ordering::Acquire);
        if through <= from {
            return Ok(());
        }
        let fences: HashSet<u64> = manifest.state.fences.iter().map(|f| f.position).collect();
        let wal = &self.wal;
        let deleted = futures::stream::iter((from + 1..=through).filter(|p| !fences.contains(p)))
            .map(|position| async move {
                delete_if_present(self.store.as_ref(), &wal.path_of(position)).await
            })
            .buffer_unordered(DELETES)
            .try_collect::<()>()
            .await;
        // A failed delete leaves garbage for the next flush (or the next
        // writer's start) to delete; it is no reason to stop writing.
        match deleted {
            Ok(()) => {
                self.wal_deleted_through
                    .fetch_max(through, Ordering::AcqRel);
            }
            Err(e) => log::warn!("deleting WAL entries up to {through} failed: {e}"),
        }
        Ok(())
    }

    /// Deletes the fences the manifest lists that are older than the
    /// longest grace period of the writers that claimed the shard; the
    /// next commit drops them from the list. Failures are logged: the
    /// fence stays for a later try.
    async fn delete_expired_fences(&self) {
        let manifest = self.manifest();
        let own = self.options.fence_grace.as_millis() as u64;
        let grace = manifest.state.fence_grace_ms.max(own);
        let now = now_ms();
        let expired: Vec<u64> = manifest
            .state
            .fences
            .iter()
            .filter(|f| f.at_ms != 0 && f.at_ms.saturating_add(grace) <= now)
            .map(|f| f.position)
            .filter(|p| {
                !self
                    .fences_deleted
                    .lock()
                    .expect("fences poisoned")
                    .contains(p)
            })
            .collect();
        for position in expired {
            match delete_if_present(self.store.as_ref(), &self.wal.path_of(position)).await {
                Ok(()) => {
                    self.fences
                        .lock()
                        .expect("fences poisoned")
                        .remove(&position);
                    self.fences_deleted
                        .lock()
                        .expect("fences poisoned")
                        .insert(position);
                }
                Err(e) => log::debug!("deleting fence {position} failed: {e}"),
            }
        }
    }

    /// Deletes what a crash of an earlier writer may have left: WAL data
    /// entries below the cursor and SSTables no manifest names. The WAL is
    /// listed from its start, not from where deletions last got to: an
    /// append whose request timed out can land after its entry was flushed
    /// and deleted, and nothing else would ever list it (when nothing is
    /// there, the listing is the same).
    async fn collect_leftovers(&self) -> Result<()> {
        self.delete_expired_fences().await;
        let manifest = self.manifest();
        let m = &manifest.state;
        let fences: HashSet<u64> = m.fences.iter().map(|f| f.position).collect();
        // A table with blob columns collects its WAL with its packs (see
        // `collect_wal_packs`): an entry below the cursor may be a pack.
        let blobs = !self.schema.blobs.is_empty();
        let leftovers: Vec<Path> = match blobs {
            true => Vec::new(),
            false => (self.wal.positions_after(0).await?.into_iter())
                .filter(|p| *p <= m.replay_after && !fences.contains(p))
                .map(|p| self.wal.path_of(p))
                .collect(),
        };
        let named = m.named_dirs();
        let listed: Vec<object_store::ObjectMeta> = self
            .store
            .list(Some(&paths::sstables_dir(&self.shard_dir)))
            .try_collect()
            .await?;
        // Only older epochs' files: a newer writer (one that fenced this
        // one since) may be about to commit its own.
        let mut orphans: Vec<Path> = listed
            .iter()
            .map(|meta| meta.location.clone())
            .filter(|path| {
                !named.contains(paths::sstable_dir(path.as_ref()))
                    && paths::sstable_epoch(path.as_ref()) < self.epoch
            })
            .collect();
        orphans.extend(self.unnamed_deletions(m, &listed));
        // Runs of committed loads stay under `load/`, and a flush or
        // compaction may have left vectors beside them too (the directories
        // of runs no manifest names are `delete_dead_loads`'s).
        let in_loaded_runs: Vec<object_store::ObjectMeta> = self
            .store
            .list(Some(&paths::loads_dir(&self.shard_dir)))
            .try_filter(|meta| {
                let run = paths::sstable_dir(meta.location.as_ref());
                futures::future::ready(named.contains(run))
            })
            .try_collect()
            .await?;
        orphans.extend(self.unnamed_deletions(m, &in_loaded_runs));
        if !leftovers.is_empty() || !orphans.is_empty() {
            log::debug!(
                "deleting {} WAL entries and {} SSTables left behind in {}",
                leftovers.len(),
                orphans.len(),
                self.shard_dir
            );
        }
        futures::stream::iter(leftovers.into_iter().chain(orphans))
            .map(|path| async move { delete_if_present(self.store.as_ref(), &path).await })
            .buffer_unordered(DELETES)
            .try_collect::<()>()
            .await?;
        if !blobs {
            self.wal_deleted_through
                .fetch_max(m.replay_after, Ordering::AcqRel);
        }
        self.delete_dead_loads().await
    }

    /// Deletes retired SSTables whose grace period is over, merges
    /// SSTables while the shard has more than the configured number, and
    /// deletes what that retired if the grace period is zero; after a
    /// merge, also the runs of crashed loads.
    async fn compact(&self) -> Result<()> {
        self.delete_retired().await?;
        if self.compaction_holds.load(Ordering::Acquire) > 0 {
            // The compaction task compacts once the holds are released.
            self.compaction_due.store(true, Ordering::Release);
            return Ok(());
        }
        let mut merged = false;
        loop {
            let files = Arc::clone(&self.layers.read().expect("layers poisoned").sstables);
            let Some(run) = run_to_merge(&files, self.options.max_sstables) else {
                // Not held while retired SSTables are deleted: they would
                // count as read by a query.
                drop(files);
                if merged {
                    // Now and then, not only when a writer opens the shard.
                    if let Err(e) = self.delete_dead_loads().await {
                        log::warn!("deleting the runs of crashed loads failed: {e}");
                    }
                }
                return self.delete_retired().await;
            };
            self.merge_run(&files[run.clone()], run.start == 0).await?;
            merged = true;
        }
    }

    /// Merges every SSTable of the shard into one (a major compaction).
    pub(super) async fn compact_all(&self) -> Result<()> {
        let _one_at_a_time = self.compacting.lock().await;
        let files = Arc::clone(&self.layers.read().expect("layers poisoned").sstables);
        if files.len() > 1 {
            self.merge_run(&files, true).await?;
        }
        drop(files);
        self.delete_retired().await
    }

    /// Replaces `inputs`, consecutive SSTables (the oldest among them if
    /// `oldest`), by their merge, and retires them.
    async fn merge_run(&self, inputs: &[SstableFile], oldest: bool) -> Result<()> {
        let (mut output, trace) = self
            .retrying("compaction", || self.merge(inputs, oldest, None))
            .await?;
        // Flushes since the merge began may have marked more rows of the
        // inputs: the output gets the marks the inputs have now, and no
        // flush adds any until the commit.
        let _no_flush = self.maintenance.lock().await;
        let files = self.manifest().state.sstables.clone();
        let same = |run: &[SstableFile]| {
            run.len() == inputs.len() && run.iter().zip(inputs).all(|(a, b)| a.path == b.path)
        };
        let Some(at) = files.iter().position(|f| f.path == inputs[0].path) else {
            return Err(Error::Poisoned(format!(
                "the compaction's input {} left the shard",
                inputs[0].path
            )));
        };
        let current = files.get(at..at + inputs.len()).unwrap_or_default();
        if !same(current) {
            return Err(Error::Poisoned(
                "the compaction's inputs changed while it ran".into(),
            ));
        }
        if let Some(trace) = trace.as_ref().filter(|_| self.keeps_marks()) {
            let marked = self
                .retrying("deletion vectors of a compaction", || {
                    self.carry_marks(&files, current, trace, &output)
                })
                .await?;
            output.deletions = marked.deletions;
            output.checked_through = marked.checked_through;
        }
        let retired_at_ms = now_ms();
        self.commit(
            "shard manifest commit of a compaction",
            |m| {
                let Some(at) = m.sstables.iter().position(|f| f.path == inputs[0].path) else {
                    return false;
                };
                let run = at..at + inputs.len();
                if !m.sstables.get(run.clone()).is_some_and(same) {
                    return false;
                }
                m.sstables.splice(run, [output.clone()]);
                m.retired.extend(inputs.iter().map(|f| RetiredFile {
                    path: f.path.clone(),
                    retired_at_ms,
                    packs: f.packs.clone(),
                }));
                true
            },
            |_| {},
        )
        .await?;
        self.counters.compactions.fetch_add(1, Ordering::Relaxed);
        self.counters
            .last_compaction_ms
            .store(now_ms(), Ordering::Relaxed);
        log::debug!(
            "compacted {} SSTables into {} ({} rows)",
            inputs.len(),
            output.path,
            output.rows
        );
        Ok(())
    }

    /// Writes the merge of `inputs` (consecutive, oldest first) as one
    /// SSTable; tombstones are dropped when nothing older exists. A merge
    /// of a bulk load's runs (`load`) is a run itself (see [`super::load`]).
    pub(super) async fn merge(
        &self,
        inputs: &[SstableFile],
        oldest: bool,
        load: Option<u64>,
    ) -> Result<(SstableFile, Option<merge::RowTrace>)> {
        let schema = &self.schema;
        let columns: Vec<usize> = (0..schema.stored.fields().len()).collect();
        let mut streams = Vec::with_capacity(inputs.len());
        for file in inputs {
            streams.push(
                self.reader
                    .stream(file, None, &columns, &ReadMetrics::default())
                    .await?,
            );
        }
        // The inputs' graphs are carried over to the output, not built
        // again: the merge traces where their rows go.
        let has_graphs = !schema.vectors.is_empty();
        let (rows, trace) = if schema.has_key() {
            let mut runs = Vec::with_capacity(inputs.len());
            for (rows, file) in streams.into_iter().zip(inputs) {
                // Rows a newer file holds are left out; marks added
                // meanwhile follow the trace (see `merge_run`).
                runs.push(merge::Run {
                    rows,
                    seq: file.generation,
                    deleted: self.reader.deletions(file).await?,
                });
            }
            let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
            // The trace carries graphs and marks over; without either,
            // the merge need not record it.
            if has_graphs || self.keeps_marks() {
                let (rows, trace) =
                    merge::merge_runs_traced(schema, &columns, runs, !oldest, &pool)?;
                (rows, Some(trace))
            } else {
                let rows =
                    merge::merge_runs(schema, &columns, runs, !oldest, &pool, merge::unrecorded())?;
                (rows, None)
            }
        } else {
            let runs: Vec<(u64, u64)> = inputs.iter().map(|f| (f.generation, f.rows)).collect();
            let trace = has_graphs.then(|| merge::RowTrace::concatenated(&runs));
            (merge::concat(Arc::clone(&schema.stored), streams), trace)
        };
        let generations = (
            inputs[0].first_generation,
            inputs[inputs.len() - 1].generation,
        );
        let path = match load {
            Some(load) => paths::new_load_run(&self.shard_dir, load, generations.1, self.epoch),
            None => paths::new_sstable_file(&self.shard_dir, generations.1, self.epoch),
        };
        // A compaction inserts on one thread: it runs beside the writes,
        // whose MemTable inserts come first. A bulk load takes them all.
        let threads = match load {
            Some(_) => self.options.index_threads,
            None => 1,
        };
        // Values a compaction keeps of packs mostly dead move to new
        // packs; the packs the output's rows name are gathered as they
        // pass.
        let named = Arc::new(Mutex::new(blob::Named::new()));
        let mut repacker = None;
        let rows = match schema.blobs.is_empty() {
            true => rows,
            false => {
                let moving = match load {
                    Some(_) => BTreeSet::new(),
                    None => self.packs_to_repack(inputs, oldest).await?,
                };
                let rows = match moving.is_empty() {
                    true => rows,
                    false => {
                        let (rows, r) = self.repacked(rows, moving);
                        repacker = Some(r);
                        rows
                    }
                };
                let (named, blobs) = (Arc::clone(&named), Arc::clone(schema));
                let rows = rows.inspect_ok(move |batch| {
                    let mut named = named.lock().expect("pack names poisoned");
                    blob::collect_named(&blobs, batch, &mut named);
                });
                Box::pin(RecordBatchStreamAdapter::new(
                    Arc::clone(&schema.stored),
                    rows,
                ))
            }
        };
        let started = std::time::Instant::now();
        // A load's runs merged before its commit are runs still.
        let codec = match load {
            Some(_) => Codec::Fast,
            None => Codec::Small,
        };
        let mut output =
            sstable::write_stream(&self.store, path, generations, (schema, codec), rows, || ())
                .await?;
        {
            let named = named.lock().expect("pack names poisoned");
            output.packs = blob::runs(&named);
            output.blob_bytes = named.values().sum();
        }
        if let Some(repacker) = repacker {
            let copied = repacker.lock().await.bytes_written;
            self.counters
                .blob_bytes_repacked
                .fetch_add(copied, Ordering::Relaxed);
        }
        let written = started.elapsed();
        if let Err(e) = self
            .build_graphs(&mut output, trace.as_ref().map(|t| (inputs, t)), threads)
            .await
        {
            sstable::discard(&self.store, &output.path).await;
            return Err(e);
        }
        log::debug!(
            "merged {} SSTables into {} rows: data {:.2?}, graphs {:.2?}",
            inputs.len(),
            output.rows,
            written,
            started.elapsed() - written
        );
        Ok((output, trace))
    }

    /// The packs whose values a merge of `inputs` (the oldest SSTables if
    /// `oldest`) should move into new packs: packs no other live SSTable
    /// names whose live share — the bytes the merge's rows name over the
    /// pack's size — is below [`super::WriterOptions::blob_repack_below`].
    /// Costs a merge of the inputs' keys and descriptors, and a listing of
    /// the shard's packs. Tables without a primary key never drop a row in
    /// a merge: none.
    async fn packs_to_repack(
        &self,
        inputs: &[SstableFile],
        oldest: bool,
    ) -> Result<BTreeSet<(u64, u64)>> {
        let schema = &self.schema;
        let below = self.options.blob_repack_below;
        if !schema.has_key() || below <= 0.0 || inputs.iter().all(|f| f.packs.is_empty()) {
            return Ok(BTreeSet::new());
        }
        let mut columns = schema.key.clone();
        columns.extend(schema.blobs.iter().map(|b| b.descriptor));
        columns.push(schema.stored.fields().len() - 1);
        columns.sort_unstable();
        columns.dedup();
        let mut runs = Vec::with_capacity(inputs.len());
        for file in inputs {
            runs.push(merge::Run {
                rows: self
                    .reader
                    .stream(file, None, &columns, &ReadMetrics::default())
                    .await?,
                seq: file.generation,
                deleted: self.reader.deletions(file).await?,
            });
        }
        let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        let mut rows =
            merge::merge_runs(schema, &columns, runs, !oldest, &pool, merge::unrecorded())?;
        let mut live = blob::Named::new();
        while let Some(batch) = rows.try_next().await? {
            for blob in &schema.blobs {
                let at = columns.binary_search(&blob.descriptor).expect("projected");
                blob::count_named(batch.column(at).as_struct(), &mut live);
            }
        }
        let m = self.manifest().state;
        let others: Vec<_> = m
            .sstables
            .iter()
            .filter(|f| !inputs.iter().any(|i| i.path == f.path))
            .flat_map(|f| &f.packs)
            .collect();
        // Packs of their own, and those inside WAL entries (named by
        // their position alone; the entry's head counts as dead bytes).
        let (blobs_dir, wal_dir) = (
            paths::blobs_dir(&self.shard_dir),
            paths::wal_dir(&self.shard_dir),
        );
        let (own, in_wal) = futures::try_join!(
            self.store.list(Some(&blobs_dir)).try_collect::<Vec<_>>(),
            self.store.list(Some(&wal_dir)).try_collect::<Vec<_>>(),
        )?;
        let wal_epochs: HashMap<u64, u64> = (live.keys())
            .filter(|(_, pack)| blob::in_wal(*pack))
            .map(|&(epoch, pack)| (pack, epoch))
            .collect();
        let own = own.iter().filter_map(|meta| {
            let (pack, epoch) = paths::parse_blob_pack(meta.location.filename()?)?;
            Some((epoch, pack, meta.size))
        });
        let in_wal = in_wal.iter().filter_map(|meta| {
            let pack = paths::parse_wal_file(meta.location.filename()?)? | blob::IN_WAL;
            Some((*wal_epochs.get(&pack)?, pack, meta.size))
        });
        Ok(own
            .chain(in_wal)
            .filter_map(|(epoch, pack, size)| {
                let live = *live.get(&(epoch, pack))?;
                let sparse = (live as f64) < below * size as f64;
                let elsewhere = others.iter().any(|r| r.contains(epoch, pack));
                (sparse && !elsewhere).then_some((epoch, pack))
            })
            .collect())
    }

    /// `rows` (a merge's output) with the values of the `moving` packs
    /// moved into new ones (see [`blob::Repacker`]), the last new pack
    /// written before the stream ends; and the repacker, for its counts.
    fn repacked(
        &self,
        rows: SendableRecordBatchStream,
        moving: BTreeSet<(u64, u64)>,
    ) -> (
        SendableRecordBatchStream,
        Arc<tokio::sync::Mutex<blob::Repacker>>,
    ) {
        use datafusion::error::DataFusionError;
        let external = |e: Error| DataFusionError::External(Box::new(e));
        self.counters
            .blob_packs_repacked
            .fetch_add(moving.len() as u64, Ordering::Relaxed);
        let reader = blob::PackReader::new(Arc::clone(&self.store), self.shard_dir.clone());
        let repacker =
            blob::Repacker::new(reader, self.epoch, moving, self.options.blob_repack_bytes);
        let repacker = Arc::new(tokio::sync::Mutex::new(repacker));
        let (schema, rewriting) = (Arc::clone(&self.schema), Arc::clone(&repacker));
        let rewritten = rows.and_then(move |batch| {
            let (schema, repacker) = (Arc::clone(&schema), Arc::clone(&rewriting));
            async move {
                let mut repacker = repacker.lock().await;
                repacker.rewrite(&schema, batch).await.map_err(external)
            }
        });
        let finishing = Arc::clone(&repacker);
        let finished = futures::stream::once(async move {
            let done = finishing.lock().await.finish().await;
            done.map_err(external).err().map(Err)
        })
        .filter_map(std::future::ready);
        let rows = Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema.stored),
            rewritten.chain(finished),
        ));
        (rows, repacker)
    }

    /// Builds and writes the graphs of every vector column of `file` (a
    /// compaction's output, not yet committed) and caches them for
    /// searches. With the compaction's `inputs` and where their rows went,
    /// their graphs are carried over and only the rows none of them holds
    /// are inserted (see [`complete_graphs`]), on `threads` threads.
    pub(super) async fn build_graphs(
        &self,
        file: &mut SstableFile,
        inputs: Option<(&[SstableFile], &merge::RowTrace)>,
        threads: usize,
    ) -> Result<()> {
        for v in &self.schema.vectors {
            let mut data = self
                .reader
                .read_vectors(file, v.index, &ReadMetrics::default())
                .await?;
            if data.live_rows == 0 {
                continue;
            }
            let carried = match inputs {
                Some((inputs, trace)) => self.carried_graphs(inputs, trace, v, &data).await,
                None => Vec::new(),
            };
            let column = v.clone();
            let (data, bytes) = tokio::task::spawn_blocking(move || {
                data.graphs = complete_graphs(carried, &data, &column, threads);
                let bytes = persist::encode_set(&data.graphs);
                (data, bytes)
            })
            .await
            .map_err(|e| Error::Poisoned(format!("building an HNSW graph failed: {e}")))?;
            let column = self.schema.schema.field(v.index).name();
            sstable::write_graph(&self.store, file, column, bytes.into()).await?;
            self.reader
                .cache_vector_column(file, v.index, Arc::new(data));
        }
        Ok(())
    }

    /// The graphs of column `v` of `inputs` carried over to the rows of
    /// `output` (a merge of them whose rows went where `trace` says): those
    /// built with the column's settings of which at least half the nodes
    /// reached the output (each one dropped is bridged over; past that,
    /// inserting the rest anew is better).
    async fn carried_graphs(
        &self,
        inputs: &[SstableFile],
        trace: &merge::RowTrace,
        v: &VectorColumn,
        output: &VectorColumnData,
    ) -> Vec<Graph> {
        let mut carried = Vec::new();
        for input in inputs {
            let data = match self
                .reader
                .vector_column(input, v.index, &ReadMetrics::default())
                .await
            {
                Ok(data) => data,
                Err(e) => {
                    log::debug!("not carrying over the graphs of {}: {e}", input.path);
                    continue;
                }
            };
            for graph in &data.graphs {
                if graph.params() != v.params || graph.metric() != v.metric {
                    continue;
                }
                let position = |row| trace.position(input.generation, row);
                let kept = graph.rows().filter(|&r| position(r).is_some()).count();
                if kept > 0 && kept * 2 >= graph.len() {
                    carried.push(graph.remapped(&position, output.values.clone()));
                }
            }
        }
        carried
    }

    /// Deletes retired SSTables past their grace period and drops them
    /// from the manifest (deleted first: a crash in between leaves a name
    /// of a missing object in `retired`, which nothing reads).
    async fn delete_retired(&self) -> Result<()> {
        self.delete_expired_sstables().await?;
        self.delete_unnamed_packs().await
    }

    /// Deletes the retired SSTables of [`Shared::delete_retired`].
    async fn delete_expired_sstables(&self) -> Result<()> {
        let manifest = self.manifest();
        let grace = self.options.sstable_grace.as_millis() as u64;
        let now = now_ms();
        // Queries of this process keep what they read (SSTables and their
        // deletion vectors), whatever the grace.
        let read: HashSet<String> = {
            let layers = self.layers.read().expect("layers poisoned");
            let held = layers.replaced.iter().filter_map(std::sync::Weak::upgrade);
            held.flat_map(|files| {
                let vectors = files.iter().filter_map(|f| f.deletions.as_ref());
                let paths = files.iter().map(|f| f.path.clone());
                paths
                    .chain(vectors.map(|d| d.path.clone()))
                    .collect::<Vec<_>>()
            })
            .collect()
        };
        let expired: Vec<String> = manifest
            .state
            .retired
            .iter()
            .filter(|f| f.retired_at_ms.saturating_add(grace) <= now && !read.contains(&f.path))
            .map(|f| f.path.clone())
            .collect();
        if expired.is_empty() {
            return Ok(());
        }
        let store = &self.store;
        let deleted = futures::stream::iter(expired.clone())
            .map(|path| async move { sstable::delete(store, &path).await })
            .buffer_unordered(DELETES)
            .try_collect::<()>()
            .await;
        if let Err(e) = deleted {
            // They stay retired; the next compaction tries again.
            log::warn!("deleting retired SSTables failed: {e}");
            return Ok(());
        }
        self.commit(
            "shard manifest commit of deleted SSTables",
            |m| {
                let before = m.retired.len();
                m.retired.retain(|f| !expired.contains(&f.path));
                m.retired.len() != before
            },
            |_| {},
        )
        .await
    }

    /// Deletes the blob packs nothing reads any more: named by no SSTable
    /// of the newest manifest, live or retired, and either at or below the
    /// replay cursor (the WAL entry that named one, if it landed, is in
    /// SSTables) for [`super::WriterOptions::sstable_grace`] since this
    /// writer first saw it so (a query that read a MemTable row naming one
    /// before its flush has that long to finish, as one reading a retired
    /// SSTable does; a pack's own age says nothing of when its rows stopped
    /// being read), or named by no WAL entry (see [`blob::UNLOGGED`]: a
    /// compaction's, or a bulk load's once the load ended or is listed as
    /// dead), at once. Packs of appends that never landed go the same way.
    /// A failed delete is tried again by the next call.
    async fn delete_unnamed_packs(&self) -> Result<()> {
        if self.schema.blobs.is_empty() {
            return Ok(());
        }
        let listed: Vec<object_store::ObjectMeta> = self
            .store
            .list(Some(&paths::blobs_dir(&self.shard_dir)))
            .try_collect()
            .await?;
        // The loads before the manifest: one that may still commit wrote
        // its markers before its packs and is listed there, unless a
        // writer listed it as dead in the manifest (see `delete_dead_loads`).
        let loads = self.loads_present().await?;
        let manifest = self
            .versions
            .load_latest(self.manifest().version, ShardManifest::decode)
            .await?;
        let m = &manifest.state;
        let dead: HashSet<u64> = m.dead_loads.iter().map(|&l| blob::load_tag(l)).collect();
        let a_load_may_name = |position: u64, epoch: u64| {
            let tag = blob::load_tag_of_pack(position);
            epoch == super::load::LOAD_EPOCH
                && position & blob::UNLOGGED != 0
                && loads.contains(&tag)
                && !dead.contains(&tag)
        };
        let (now, grace) = (now_ms(), self.options.sstable_grace.as_millis() as u64);
        // Packs of landed appends (at or below the cursor) and those no
        // WAL entry names; the rest may be named by MemTable rows.
        let settled = |meta: &object_store::ObjectMeta| {
            let (position, epoch) = meta.location.filename().and_then(paths::parse_blob_pack)?;
            (position <= m.replay_after || position & blob::UNLOGGED != 0)
                .then_some((position, epoch))
        };
        let mut stored: u64 = listed
            .iter()
            .filter(|meta| settled(meta).is_some())
            .map(|meta| meta.size)
            .sum();
        // An unnamed pack no WAL entry names was never in a MemTable, so
        // it stopped being named when the last retired SSTable naming it
        // was deleted, past its grace period, or it never was (a failed
        // compaction's, a load's that never committed): it goes at once.
        // One a WAL entry names goes once the flush that passed it is
        // past the grace period (see `ShardManifest::flushed`).
        let dead: Vec<(Path, u64)> = listed
            .into_iter()
            .filter_map(|meta| {
                let (position, epoch) = settled(&meta)?;
                let named = a_load_may_name(position, epoch) || m.names_pack(epoch, position);
                let unlogged = position & blob::UNLOGGED != 0;
                let expired = unlogged || m.flushed_before(position, now, grace);
                (!named && expired).then_some((meta.location, meta.size))
            })
            .collect();
        stored += self.collect_wal_packs(m).await?;
        let store = &self.store;
        let deleted: Vec<Result<u64>> = futures::stream::iter(dead)
            .map(|(path, size)| async move {
                delete_if_present(store.as_ref(), &path).await?;
                Ok(size)
            })
            .buffer_unordered(DELETES)
            .collect()
            .await;
        for result in deleted {
            match result {
                Ok(size) => {
                    stored -= size;
                    self.counters
                        .blob_packs_deleted
                        .fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .blob_pack_bytes_deleted
                        .fetch_add(size, Ordering::Relaxed);
                }
                Err(e) => log::warn!("deleting a blob pack failed: {e}"),
            }
        }
        self.counters
            .blob_stored_bytes
            .store(stored, Ordering::Relaxed);
        Ok(())
    }

    /// In a table with blob columns, deletes the WAL entries at or below
    /// the cursor of `m` that no SSTable of it names as a pack (see
    /// [`blob::IN_WAL`]) once the flush that passed them is
    /// [`super::WriterOptions::sstable_grace`] old (a statement's snapshot
    /// from before it may still read them), fences excepted (they have
    /// their own grace); returns the bytes of the entries kept as packs.
    /// A failed delete is logged, for a later collection to retry.
    async fn collect_wal_packs(&self, m: &ShardManifest) -> Result<u64> {
        let (now, grace) = (now_ms(), self.options.sstable_grace.as_millis() as u64);
        let dir = paths::wal_dir(&self.shard_dir);
        let listed: Vec<object_store::ObjectMeta> =
            self.store.list(Some(&dir)).try_collect().await?;
        let fences: HashSet<u64> = {
            let known = self.fences.lock().expect("fences poisoned");
            let listed = m.fences.iter().map(|f| f.position);
            listed.chain(known.keys().copied()).collect()
        };
        let (mut kept, mut dead) = (0, Vec::new());
        for meta in listed {
            let Some(position) = meta.location.filename().and_then(paths::parse_wal_file) else {
                continue;
            };
            if position > m.replay_after || fences.contains(&position) {
                continue;
            }
            if m.names_pack(0, position | blob::IN_WAL) {
                kept += meta.size;
            } else if m.flushed_before(position, now, grace) {
                dead.push(meta.location);
            }
        }
        let store = &self.store;
        let deleted = futures::stream::iter(dead)
            .map(|path| async move { delete_if_present(store.as_ref(), &path).await })
            .buffer_unordered(DELETES)
            .collect::<Vec<_>>()
            .await;
        for e in deleted.into_iter().filter_map(Result::err) {
            log::warn!("deleting a WAL entry failed: {e}");
        }
        Ok(kept)
    }
}

/// Graphs an SSTable's vector column keeps before a compaction merges the
/// smallest: each is searched on its own, so a search of the column costs
/// up to this many graph searches, and a compaction that keeps its inputs'
/// graphs inserts no vector again.
const MAX_GRAPHS: usize = 8;

/// The index of column `v` of `data` (on `threads` threads): `graphs`
/// (over disjoint live rows of `data`), at most [`MAX_GRAPHS`] of them —
/// the smallest past that merged into the largest of them — with every
/// live row no graph holds inserted into the smallest one (a new one if
/// there are none).
fn complete_graphs(
    mut graphs: Vec<Graph>,
    data: &VectorColumnData,
    v: &VectorColumn,
    threads: usize,
) -> Vec<Graph> {
    graphs.sort_by_key(|g| std::cmp::Reverse(g.len()));
    let mut todo = data.live.clone();
    for (i, graph) in graphs.iter().enumerate() {
        let merged = i >= MAX_GRAPHS;
        for row in graph.rows() {
            todo[row as usize] = merged;
        }
    }
    graphs.truncate(MAX_GRAPHS);
    if todo.contains(&true) {
        if graphs.is_empty() {
            graphs.push(Graph::new(
                v.dim as usize,
                v.metric,
                v.params,
                v.index as u64,
            ));
        }
        let smallest = graphs.last().expect("a graph");
        smallest.add(&data.to_array_of(todo), 0, threads);
    }
    graphs
}

/// The run of consecutive SSTables to merge, if `files` (oldest first) are
/// more than `max`: size-tiered — the newest run of two or more files in
/// which each file is no larger than all newer ones of the run together;
/// if sizes only grow towards the newest, the newest files, enough to get
/// back to `max`. (Always ending the run at the newest file would merge a
/// grown file again at every flush.)
/// Otherwise, a file of which more than half the rows are marked deleted
/// (newer files hold their keys) is merged with the next newer one: a
/// merge drops its dead rows, and the blob values they named become
/// collectable, where size tiers alone would never merge an old large
/// file again.
fn run_to_merge(files: &[SstableFile], max: usize) -> Option<Range<usize>> {
    if files.len() <= max {
        let dead = |f: &SstableFile| f.deletions.as_ref().is_some_and(|d| 2 * d.rows > f.rows);
        let sparse = files[..files.len().saturating_sub(1)]
            .iter()
            .position(dead)?;
        return Some(sparse..sparse + 2);
    }
    for end in (1..files.len()).rev() {
        let (mut start, mut bytes) = (end, files[end].bytes);
        while start > 0 && files[start - 1].bytes <= bytes {
            start -= 1;
            bytes += files[start].bytes;
        }
        if start < end {
            return Some(start..end + 1);
        }
    }
    Some(max.saturating_sub(1).min(files.len() - 2)..files.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(sizes: &[u64]) -> Vec<SstableFile> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &bytes)| SstableFile {
                path: format!("f{i}"),
                generation: i as u64 + 1,
                first_generation: i as u64 + 1,
                rows: 1,
                bytes,
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn merges_similar_files_and_always_gets_back_under_the_limit() {
        assert_eq!(run_to_merge(&files(&[1, 1, 1]), 3), None);
        // Equal sizes: all of them.
        assert_eq!(run_to_merge(&files(&[1, 1, 1, 1]), 3), Some(0..4));
        // A big old file stays out of a run of small new ones.
        assert_eq!(run_to_merge(&files(&[100, 1, 1, 1]), 3), Some(1..4));
        // Growing newest files: merge at least enough to get back to max.
        assert_eq!(run_to_merge(&files(&[8, 4, 2, 1]), 3), Some(2..4));
        assert_eq!(run_to_merge(&files(&[9, 4, 2, 1, 1]), 2), Some(1..5));
        // A grown newest-but-one file takes the older ones with it, not
        // the newest flush.
        assert_eq!(
            run_to_merge(&files(&[9, 8, 7, 6, 5, 4, 3, 17, 1]), 8),
            Some(0..8)
        );
    }

    #[test]
    fn a_mostly_deleted_file_is_merged_with_the_next_newer_one() {
        let mut f = files(&[100, 1, 1]);
        let marked = |rows| {
            Some(sstable::Deletions {
                path: String::new(),
                rows,
                crc32: 0,
            })
        };
        f[0].rows = 10;
        f[0].deletions = marked(5);
        assert_eq!(run_to_merge(&f, 3), None, "half deleted");
        f[0].deletions = marked(6);
        assert_eq!(run_to_merge(&f, 3), Some(0..2));
        // Beyond the limit, size tiers come first.
        f.push(files(&[1])[0].clone());
        assert_eq!(run_to_merge(&f, 3), Some(1..4));
    }

    /// A compaction's index: the largest graphs kept as they are, the
    /// smallest past [`MAX_GRAPHS`] merged into the largest of them with
    /// the rows no graph held; every live row in exactly one graph.
    #[test]
    fn complete_graphs_keeps_the_largest_and_merges_the_rest() {
        use crate::hnsw::dataset::{Shape, vectors};
        use crate::schema::{HnswParams, Metric};
        let (dim, rows) = (8, 1_000);
        let shape = Shape::Clustered {
            clusters: 4,
            spread: 0.3,
        };
        let values = vectors(shape, rows, dim, 9, 0);
        // Every tenth row is dead (a tombstone or a null vector).
        let live: Vec<bool> = (0..rows).map(|r| r % 10 != 7).collect();
        let data = VectorColumnData {
            dim,
            values: values.clone().into(),
            live_rows: live.iter().filter(|&&l| l).count(),
            live: live.clone(),
            graphs: Vec::new(),
        };
        let v = VectorColumn {
            index: 1,
            dim: dim as i32,
            metric: Metric::L2,
            params: HnswParams::default(),
        };
        // Two graphs more than are kept, over the live rows of 0..850,
        // each smaller than the one before; 850..1000 in none.
        let count = MAX_GRAPHS + 2;
        let weights: usize = (1..=count).sum();
        let mut bounds = vec![0];
        for i in 0..count {
            bounds.push(bounds[i] + 850 * (count - i) / weights);
        }
        *bounds.last_mut().unwrap() = 850;
        let graphs: Vec<Graph> = bounds
            .windows(2)
            .map(|w| {
                let graph = Graph::new(dim, Metric::L2, HnswParams::default(), 1);
                let part = data.to_array_of(
                    (0..rows)
                        .map(|r| live[r] && (w[0]..w[1]).contains(&r))
                        .collect(),
                );
                graph.add(&part, 0, 1);
                graph
            })
            .collect();
        let lens: Vec<usize> = graphs.iter().map(Graph::len).collect();
        let index = complete_graphs(graphs, &data, &v, 2);
        let after: Vec<usize> = index.iter().map(Graph::len).collect();
        assert_eq!(after.len(), MAX_GRAPHS);
        let kept = MAX_GRAPHS - 1;
        assert_eq!(after[..kept], lens[..kept], "the largest kept as they were");
        let mut held: Vec<u64> = index.iter().flat_map(|g| g.rows()).collect();
        held.sort_unstable();
        let expected: Vec<u64> = (0..rows as u64).filter(|&r| live[r as usize]).collect();
        assert_eq!(held, expected, "every live row in exactly one graph");
        for row in [0, 299, 650, 799, 849, 999] {
            let query = &values[row * dim..][..dim];
            let nearest = index
                .iter()
                .flat_map(|g| g.search(query, 1, 32, &|_| true))
                .min_by(|a, b| a.distance.total_cmp(&b.distance))
                .unwrap();
            assert_eq!(nearest.row, row as u64);
        }
        // Without graphs to carry over: one graph of every live row.
        let fresh = complete_graphs(Vec::new(), &data, &v, 2);
        assert_eq!(fresh.len(), 1);
        assert_eq!(fresh[0].len(), data.live_rows);
    }

    /// Bytes written by compactions per byte flushed, `flushes` equal
    /// flushes into a shard that keeps at most `max` SSTables.
    fn write_amplification(flushes: u64, max: usize) -> f64 {
        let (mut sstables, mut written) = (Vec::new(), 0);
        for _ in 0..flushes {
            sstables.push(1);
            while let Some(run) = run_to_merge(&files(&sstables), max) {
                let merged: u64 = sstables[run.clone()].iter().sum();
                written += merged;
                sstables.splice(run, [merged]);
            }
            assert!(sstables.len() <= max);
        }
        written as f64 / flushes as f64
    }

    #[test]
    fn compaction_rewrites_each_flushed_byte_a_logarithmic_number_of_times() {
        // Always merging into the newest file rewrote it at every flush:
        // 17 bytes a byte after 100 flushes, 459 after 1,000.
        let (hundred, thousand) = (write_amplification(100, 8), write_amplification(1000, 8));
        assert!(hundred < 3.0, "{hundred}");
        assert!(thousand < 6.0, "{thousand}");
    }
}
