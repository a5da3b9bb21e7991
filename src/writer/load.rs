//! Bulk loads through a [`ShardWriter`]: a write too large to hold in
//! memory goes to SSTables directly instead of the MemTable and the WAL.
//!
//! 1. [`ShardWriter::write_run`] sorts a bounded part of the load and
//!    writes it as an SSTable that no manifest names yet (a crash leaves an
//!    orphan, which the shard's next writer deletes at open);
//! 2. [`ShardWriter::finish_runs`] merges the runs into one SSTable (a later
//!    run's row of a key wins) and builds its graphs;
//! 3. [`ShardWriter::ingest`] makes that SSTable the shard's next
//!    generation in one manifest commit: puts wait meanwhile, every
//!    MemTable holding earlier puts is flushed first, so the load is newer
//!    than every put acknowledged before it and older than every put after
//!    it. The commit is the only moment the load becomes visible and
//!    durable: a shard's part is all there or not at all, across crashes.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use datafusion::arrow::array::RecordBatch;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;

use super::{ShardWriter, shared_error};
use crate::error::{Error, Result};
use crate::sstable::{self, SstableFile};

/// Rows per batch a run is written in.
const RUN_BATCH_ROWS: usize = 8192;

impl ShardWriter {
    /// Writes `batches` (stored form, rows of this shard, oldest first) as
    /// one sorted run of a load, numbered `seq` (later runs have higher
    /// numbers and win over earlier ones), not yet part of the shard.
    pub(crate) async fn write_run(
        &self,
        batches: Vec<RecordBatch>,
        seq: u64,
    ) -> Result<SstableFile> {
        let shared = &self.shared;
        if let Some(e) = self.stopped() {
            return Err(e);
        }
        let schema = Arc::clone(&shared.schema);
        let body =
            tokio::task::spawn_blocking(move || sstable::newest_per_key_sorted(&schema, &batches))
                .await
                .map_err(|e| Error::Poisoned(format!("sorting a load's rows failed: {e}")))??;
        let slices: Vec<_> = (0..body.num_rows())
            .step_by(RUN_BATCH_ROWS)
            .map(|at| Ok(body.slice(at, RUN_BATCH_ROWS.min(body.num_rows() - at))))
            .collect();
        let rows = Box::pin(RecordBatchStreamAdapter::new(
            body.schema(),
            futures::stream::iter(slices),
        ));
        sstable::write_stream(
            &shared.store,
            &shared.shard_dir,
            shared.epoch,
            (seq, seq),
            &shared.schema,
            rows,
        )
        .await
    }

    /// The runs of a load (oldest first) as one SSTable with its graphs:
    /// their merge, or the one run. Runs merged are deleted.
    pub(crate) async fn finish_runs(&self, mut runs: Vec<SstableFile>) -> Result<SstableFile> {
        let shared = &self.shared;
        if runs.len() == 1 {
            let mut run = runs.pop().expect("one run");
            if let Err(e) = shared.build_graphs(&mut run).await {
                sstable::discard(&shared.store, &run.path).await;
                return Err(e);
            }
            return Ok(run);
        }
        let merged = shared.merge(&runs, true).await;
        self.discard_runs(&runs).await;
        merged
    }

    /// Makes `file` (from [`ShardWriter::finish_runs`]) part of the shard,
    /// newer than every put before and older than every put after; returns
    /// once the manifest names it. See the module doc.
    pub(crate) async fn ingest(&self, mut file: SstableFile) -> Result<()> {
        let shared = &self.shared;
        let _no_puts = shared.ingest_gate.write().await;
        let generation = {
            let _one_writer = shared.append_lock.lock().expect("append lock poisoned");
            if let Some(e) = &shared.progress.borrow().error {
                return Err(shared_error(e));
            }
            if shared.closing.load(Ordering::Acquire) {
                return Err(Error::Poisoned("the shard writer is closed".into()));
            }
            // Earlier puts go to SSTables first, in a generation of their own.
            let mut active = Arc::clone(shared.layers.read().expect("layers poisoned").active());
            if active.memtable.written_batches() > 0 {
                shared.rotate();
                active = Arc::clone(shared.layers.read().expect("layers poisoned").active());
            }
            // The now empty active generation is the load: its flush commits
            // the file (see `Shared::flush`).
            file.generation = active.number;
            file.first_generation = active.number;
            *active.ingested.lock().expect("ingest slot poisoned") = Some(file);
            shared.rotate();
            active.number
        };
        shared.flush_wake.notify_one();
        let mut progress = shared.progress.subscribe();
        let done = progress
            .wait_for(|p| p.error.is_some() || p.flushed_generation > generation)
            .await
            .map_err(|_| Error::Poisoned("the shard writer is gone".into()))?;
        match &done.error {
            Some(e) => Err(shared_error(e)),
            None => Ok(()),
        }
    }
}

impl ShardWriter {
    /// Deletes runs of a load that failed or were merged (failures are
    /// only logged: the shard's next writer deletes what is left).
    pub(crate) async fn discard_runs(&self, runs: &[SstableFile]) {
        for run in runs {
            sstable::discard(&self.shared.store, &run.path).await;
        }
    }
}
