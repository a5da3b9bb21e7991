//! Bulk loads of a [`Table`] (see [`Table::put_stream`]): the input is
//! split by shard as it is read, each shard's rows are written as sorted
//! runs of bounded size (see the writer's `load` module), and every
//! shard's runs are committed at once, shard by shard.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::arrow::array::{RecordBatch, UInt32Array};
use datafusion::arrow::compute::take_record_batch;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use tokio::sync::{Semaphore, oneshot};
use tokio::task::JoinSet;

use super::Table;
use crate::error::{Error, Result};
use crate::schema::{TableSchema, compact_views, key};
use crate::sstable::{self, SstableFile};
use crate::store::{delete_if_present, paths};
use crate::writer::{LoadRun, RunTarget, ShardWriter};

/// Runs of a bulk load sorted and encoded at once (their uploads end
/// without holding a turn), and shards whose runs are counted at once.
const LOAD_CONCURRENCY: usize = 2;

/// How long the end of a load waits on the store to delete what a
/// failed load wrote, and its markers (see [`Load::end`]).
const CLEANUP_PATIENCE: Duration = Duration::from_secs(30);

/// Splits a stored batch of a load by shard (without keeping the key
/// encodings, see [`key::shards_of`]); a table without a key puts it
/// whole in shard `append_to`.
fn split(
    schema: &TableSchema,
    shards: u32,
    append_to: u32,
    batch: RecordBatch,
) -> Result<Vec<(u32, RecordBatch)>> {
    if !schema.has_key() {
        return Ok(vec![(append_to, batch)]);
    }
    if shards == 1 {
        // Stored rows were checked: no key holds NULL.
        return Ok(vec![(0, batch)]);
    }
    let of = key::shards_of(&schema.key_columns(&batch), batch.num_rows(), shards)?;
    let mut rows_of: Vec<Vec<u32>> = vec![Vec::new(); shards as usize];
    for (row, &shard) in of.iter().enumerate() {
        rows_of[shard as usize].push(row as u32);
    }
    let mut out = Vec::new();
    for (shard, rows) in rows_of.into_iter().enumerate() {
        if !rows.is_empty() {
            // A part holds only its rows' bytes, in row order, copied
            // while the input batch is still in the cache (a part that
            // shares the input's buffers makes each later pass over its
            // values, the sort's and the Parquet writer's, stride through
            // all the input).
            let part = take_record_batch(&batch, &UInt32Array::from(rows))?;
            out.push((shard as u32, compact_views(part)?));
        }
    }
    Ok(out)
}

/// Writes (or rewrites) each of a load's `markers`, empty, up to
/// [`OPENS`] at a time.
async fn mark(store: &Arc<dyn ObjectStore>, markers: &[Path]) -> Result<()> {
    futures::stream::iter(markers.iter().cloned())
        .map(|marker| async move { store.put(&marker, PutPayload::new()).await })
        .buffer_unordered(OPENS)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// Markers written, and shard writers opened, at once: each is a few
/// requests' latency on an object store.
const OPENS: usize = 32;

/// A bulk load's marker in every shard (see [`paths::load_marker`]),
/// rewritten while it runs.
struct Markers {
    paths: Vec<Path>,
    heartbeat: JoinSet<()>,
    kept: RunsKept,
}

/// How long no writer deletes a load's runs, as its markers show.
#[derive(Clone)]
struct RunsKept {
    marked: Arc<Mutex<Marked>>,
    /// The grace the markers name.
    grace: Duration,
}

struct Marked {
    /// When the last writing of the markers that succeeded began.
    last: Instant,
    /// Whether a writing succeeded half the grace or more after the one
    /// before it began (a stalled host): the markers may have looked
    /// stale meanwhile.
    lapsed: bool,
}

impl RunsKept {
    /// Records a writing of the markers that began at `began` and
    /// succeeded.
    fn marked(&self, began: Instant) {
        let mut marked = self.marked.lock().expect("marked poisoned");
        marked.lapsed |= marked.last.elapsed() >= self.grace / 2;
        marked.last = began;
    }

    /// Until when no writer takes the load for crashed and deletes its
    /// runs (it judges the markers by their age against their grace):
    /// half the grace after the last writing of the markers began, the
    /// other half a margin for clocks and a commit's requests; unless the
    /// markers have lapsed once, when the runs may be gone already.
    fn until(&self) -> Instant {
        let marked = self.marked.lock().expect("marked poisoned");
        match marked.lapsed {
            true => marked.last,
            false => marked.last + self.grace / 2,
        }
    }
}

impl Markers {
    fn new(table_location: &str, shards: usize, load: u64, grace: Duration) -> Self {
        let grace_ms = grace.as_millis() as u64;
        Self {
            paths: (0..shards as u32)
                .map(|s| paths::load_marker(&paths::shard_dir(table_location, s), load, grace_ms))
                .collect(),
            heartbeat: JoinSet::new(),
            kept: RunsKept {
                marked: Arc::new(Mutex::new(Marked {
                    last: Instant::now(),
                    lapsed: false,
                })),
                grace,
            },
        }
    }

    /// Writes the markers, and rewrites them every `heartbeat` until
    /// [`Markers::end`]: runs are written only after, so a writer of the
    /// shard never takes them for a crashed load's.
    async fn begin(&mut self, store: &Arc<dyn ObjectStore>, heartbeat: Duration) -> Result<()> {
        let began = Instant::now();
        mark(store, &self.paths).await?;
        self.kept.marked(began);
        let (store, markers, kept) = (Arc::clone(store), self.paths.clone(), self.kept.clone());
        self.heartbeat.spawn(async move {
            loop {
                tokio::time::sleep(heartbeat).await;
                let began = Instant::now();
                match mark(&store, &markers).await {
                    Ok(()) => kept.marked(began),
                    Err(e) => log::warn!("a bulk load could not rewrite its markers: {e}"),
                }
            }
        });
        Ok(())
    }

    /// Stops rewriting the markers and deletes them.
    async fn end(&mut self, store: &Arc<dyn ObjectStore>) {
        self.heartbeat.abort_all();
        futures::stream::iter(&self.paths)
            .for_each_concurrent(OPENS, |marker| async move {
                if let Err(e) = delete_if_present(store.as_ref(), marker).await {
                    log::debug!("deleting the load marker {marker}: {e}");
                }
            })
            .await;
    }
}

/// A bulk load in progress (see [`Table::put_stream`]), by shard.
struct Load {
    /// Names its runs and markers.
    id: u64,
    /// Rows not yet in a run, by shard, and the bytes they hold.
    pending: Vec<Vec<RecordBatch>>,
    bytes: usize,
    /// Runs written, by shard, oldest first.
    runs: Vec<Vec<LoadRun>>,
    runs_written: u64,
    /// The runs being written, by spill, oldest first (aborted if the
    /// load is dropped), at most [`LOAD_CONCURRENCY`] of them sorting and
    /// encoding at a time.
    writing: VecDeque<JoinSet<(usize, Result<LoadRun>)>>,
    /// Each run of the last spill until its rows are encoded (and
    /// dropped: what is left of it is the upload).
    encoding: Vec<oneshot::Receiver<()>>,
    permits: Arc<Semaphore>,
}

impl Load {
    fn new(shards: usize) -> Self {
        Self {
            id: rand::random(),
            pending: vec![Vec::new(); shards],
            bytes: 0,
            runs: vec![Vec::new(); shards],
            runs_written: 0,
            writing: VecDeque::new(),
            encoding: Vec::new(),
            permits: Arc::new(Semaphore::new(LOAD_CONCURRENCY)),
        }
    }

    /// Adds the shards' parts of a batch (see [`split`]).
    fn add(&mut self, parts: Vec<(u32, RecordBatch)>) {
        // Each part holds its rows' bytes alone (see `compact_views`).
        self.bytes += parts
            .iter()
            .map(|(_, p)| p.get_array_memory_size())
            .sum::<usize>();
        for (shard, batch) in parts {
            self.pending[shard as usize].push(batch);
        }
    }

    /// Waits for the runs being written; the first error, once all ended.
    async fn written(&mut self) -> Result<()> {
        self.written_but(0).await
    }

    /// Waits for the runs of every spill but the last `spills` to be
    /// written; the first error, once they ended.
    async fn written_but(&mut self, spills: usize) -> Result<()> {
        let mut failed = None;
        while self.writing.len() > spills {
            let mut spill = self.writing.pop_front().expect("more than none");
            while let Some(joined) = spill.join_next().await {
                match joined {
                    Ok((shard, Ok(run))) => self.runs[shard].push(run),
                    Ok((_, Err(e))) => failed = Some(e),
                    Err(e) => failed = Some(Error::Poisoned(format!("writing a load's run: {e}"))),
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Stops rewriting the `markers` and deletes them, and first the runs
    /// of a load that `failed` before their commit, waiting on the store
    /// for at most [`CLEANUP_PATIENCE`]: a store that does not answer must
    /// not hold back the statement's answer. What is left (a load dropped
    /// before this leaves everything) ages: once the markers are older
    /// than the load's grace, the next load, or the shard's writer, deletes
    /// the runs no manifest names.
    async fn end(&mut self, markers: &mut Markers, store: &Arc<dyn ObjectStore>, failed: bool) {
        let cleanup = async {
            if failed {
                let _ = self.written().await;
                let files: Vec<SstableFile> =
                    self.runs.iter().flatten().map(|r| r.file.clone()).collect();
                sstable::discard_all(store, &files).await;
            }
            markers.end(store).await;
        };
        if tokio::time::timeout(CLEANUP_PATIENCE, cleanup)
            .await
            .is_err()
        {
            log::warn!(
                "a bulk load's cleanup stopped after {CLEANUP_PATIENCE:?}: what is left is \
                 deleted once its markers are older than the load's grace"
            );
        }
    }
}

/// Holds the compaction of shard writers while it lives (see
/// [`ShardWriter::hold_compaction`]).
struct CompactionHold(Vec<Arc<ShardWriter>>);

impl Drop for CompactionHold {
    fn drop(&mut self) {
        for writer in &self.0 {
            writer.release_compaction();
        }
    }
}

impl Table {
    /// The bulk load of [`Table::put_stream`]: `first` (stored, the
    /// first `rows_read` rows), then `rest`. The load's markers are
    /// written and the writers of the shards this process writes opened
    /// (each deleting the runs of crashed loads) at once: each is a few
    /// requests' latency on an object store.
    pub(super) async fn bulk_load<S>(
        &self,
        first: Vec<RecordBatch>,
        rows_read: usize,
        rest: S,
    ) -> Result<u64>
    where
        S: futures::Stream<Item = Result<RecordBatch>> + Unpin + Send,
    {
        let mut load = Load::new(self.shards.len());
        let mut markers = Markers::new(
            &self.location,
            self.shards.len(),
            load.id,
            self.options.load_grace,
        );
        let kept = markers.kept.clone();
        let owned =
            (0..self.shards.len() as u32).filter(|&s| self.options.owned_shards.contains(s));
        let open = futures::stream::iter(owned)
            .map(|shard| async move {
                self.load_writer(shard).await?.delete_dead_loads().await;
                Ok::<_, Error>(())
            })
            .buffer_unordered(OPENS)
            .try_collect::<()>();
        let begin = markers.begin(&self.store, self.options.load_heartbeat());
        let loaded = (self.load(&mut load, (begin, open), &kept, first, rows_read, rest)).await;
        load.end(&mut markers, &self.store, loaded.is_err()).await;
        match loaded {
            // A run deleted under the load: by a DROP TABLE, most likely.
            Err(e) => Err(self.explain_missing(0, e).await),
            ok => ok,
        }
    }

    /// The load of [`Table::bulk_load`]: `first` (stored, the first
    /// `rows_read` rows), then `rest`. Half the memory budget holds
    /// rows read, the other half the runs being sorted and written
    /// meanwhile. Batches are split by shard on tasks of their own while
    /// the next is read, while `begin` writes the markers (the first run
    /// waits for them) and while `open` opens the shards' writers (the
    /// commit waits for them).
    async fn load<S>(
        &self,
        load: &mut Load,
        (begin, open): (
            impl Future<Output = Result<()>>,
            impl Future<Output = Result<()>>,
        ),
        kept: &RunsKept,
        first: Vec<RecordBatch>,
        mut rows_read: usize,
        rest: S,
    ) -> Result<u64>
    where
        S: futures::Stream<Item = Result<RecordBatch>> + Unpin + Send,
    {
        let schema = Arc::clone(&self.schema);
        let rest = rest.filter_map(move |batch| {
            // Errors number rows of the whole load.
            let stored = batch.and_then(|batch| {
                let stored = schema.to_stored_at(&batch, rows_read)?;
                rows_read += batch.num_rows();
                Ok(stored)
            });
            std::future::ready(match stored {
                Ok(batch) if batch.num_rows() == 0 => None,
                stored => Some(stored),
            })
        });
        let shards = self.shards.len() as u32;
        let mut split = futures::stream::iter(first.into_iter().map(Ok))
            .chain(rest)
            .map(|batch| {
                let append_to = self.next_append_shard();
                let schema = Arc::clone(&self.schema);
                async move {
                    let batch = batch?;
                    tokio::task::spawn_blocking(move || split(&schema, shards, append_to, batch))
                        .await
                        .map_err(|e| Error::Poisoned(format!("splitting a load's rows: {e}")))?
                }
            })
            .buffered(LOAD_CONCURRENCY);
        let (mut begin, mut open) = (std::pin::pin!(begin), std::pin::pin!(open));
        let (mut begun, mut opened) = (false, false);
        loop {
            let parts = tokio::select! {
                done = &mut begin, if !begun => {
                    done?;
                    begun = true;
                    continue;
                }
                done = &mut open, if !opened => {
                    done?;
                    opened = true;
                    continue;
                }
                parts = split.try_next() => parts?,
            };
            let Some(parts) = parts else { break };
            for (shard, _) in &parts {
                self.check_owned(*shard)?;
            }
            load.add(parts);
            if load.bytes > self.options.load_memory_bytes / 2 {
                if !begun {
                    (&mut begin).await?;
                    begun = true;
                }
                self.spill(load).await?;
            }
        }
        if !begun {
            begin.await?;
        }
        self.spill(load).await?;
        if !opened {
            open.await?;
        }
        load.written().await?;
        // Each shard's runs are committed on their own.
        let shards: Vec<(u32, Vec<LoadRun>)> = std::mem::take(&mut load.runs)
            .into_iter()
            .enumerate()
            .filter(|(_, runs)| !runs.is_empty())
            .map(|(shard, runs)| (shard as u32, runs))
            .collect();
        // Compaction of the shards committed first waits for the others.
        let mut held = CompactionHold(Vec::with_capacity(shards.len()));
        for (shard, _) in &shards {
            let writer = self.load_writer(*shard).await?;
            writer.hold_compaction();
            held.0.push(writer);
        }
        // Counting runs takes the cores, their commit requests' latency.
        // Every shard's commit ends, whatever the others' outcome.
        let counting = Semaphore::new(LOAD_CONCURRENCY);
        let kept_until = || kept.until();
        let outcomes: Vec<(u32, Result<u64>)> = futures::stream::iter(shards)
            .map(|(shard, runs)| {
                let counting = &counting;
                async move {
                    (
                        shard,
                        (self.commit_runs(shard, runs, counting, kept_until)).await,
                    )
                }
            })
            .buffer_unordered(OPENS)
            .collect()
            .await;
        drop(held);
        self.gather(outcomes).await
    }

    /// The writer of `shard` for a load: opened, and taken back from other
    /// writers that claim the shard while it opens, like a put's (for up
    /// to [`super::TAKEOVER_PATIENCE`]).
    async fn load_writer(&self, shard: u32) -> Result<Arc<ShardWriter>> {
        self.on_shard(shard, "a load", |writer| async move { Ok(writer) })
            .await
    }

    /// Counts (holding a permit of `counting`) and commits the runs of a
    /// load of `shard`, which no other writer deletes before `kept_until()`
    /// (see [`ShardWriter::ingest`]); when another
    /// process took the shard over meanwhile, takes it back and commits
    /// them again (for up to [`super::TAKEOVER_PATIENCE`]), like a put. Returns
    /// the rows the shard holds for them.
    async fn commit_runs(
        &self,
        shard: u32,
        mut runs: Vec<LoadRun>,
        counting: &Semaphore,
        kept_until: impl Fn() -> Instant,
    ) -> Result<u64> {
        let writer = self.load_writer(shard).await?;
        let counted = {
            let _turn = counting.acquire().await;
            writer.finish_runs(&mut runs).await
        };
        let files: Vec<SstableFile> = runs.into_iter().map(|r| r.file).collect();
        let rows = match counted {
            Ok(rows) => rows,
            Err(e) => {
                sstable::discard_all(&self.store, &files).await;
                return Err(e);
            }
        };
        // From here the commit's outcome decides: runs of a failed one are
        // left to a later writer of the shard to delete.
        self.on_shard(shard, "a load", |writer| {
            let (files, kept_until) = (files.clone(), kept_until());
            // It holds the shard's puts until the commit lands.
            super::detached("a load's commit", async move {
                writer.ingest(files, kept_until).await
            })
        })
        .await?;
        Ok(rows)
    }

    /// Starts writing every shard's pending rows of `load` as a run, once
    /// the runs of the spill before are encoded and those of the one
    /// before that written: memory holds the rows read, the rows being
    /// encoded and the encoded runs of one spill being uploaded (their
    /// uploads take requests' latency, not the cores).
    async fn spill(&self, load: &mut Load) -> Result<()> {
        load.written_but(1).await?;
        for encoded in std::mem::take(&mut load.encoding) {
            // A run that failed before it was encoded says so when joined.
            let _ = encoded.await;
        }
        let (id, seq) = (load.id, load.runs_written + 1);
        let mut spill = JoinSet::new();
        for (shard, pending) in load.pending.iter_mut().enumerate() {
            if pending.is_empty() {
                continue;
            }
            let rows = std::mem::take(pending);
            let target = RunTarget {
                store: Arc::clone(&self.store),
                shard_dir: paths::shard_dir(&self.location, shard as u32),
                schema: Arc::clone(&self.schema),
                blob_inline_bytes: self.options.blob_inline_bytes,
            };
            let permits = Arc::clone(&load.permits);
            let (encoded, encoding) = oneshot::channel();
            load.encoding.push(encoding);
            spill.spawn(async move {
                let permit = permits.acquire_owned().await;
                let encoded = move || {
                    drop(permit);
                    let _ = encoded.send(());
                };
                (shard, LoadRun::write(&target, rows, id, seq, encoded).await)
            });
        }
        load.writing.push_back(spill);
        load.bytes = 0;
        load.runs_written = seq;
        Ok(())
    }
}
