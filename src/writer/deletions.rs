//! The deletion vectors a [`super::ShardWriter`] keeps (see
//! [`crate::sstable::deletions`]): a flush marks in each older SSTable the
//! rows whose keys it writes; a compaction carries its inputs' marks over
//! to its output. Both run under the writer's `maintenance` lock up to
//! their commit, so no mark is added to a file between reading its vector
//! and committing the next one.
//!
//! A replaced vector is retired like a replaced SSTable: the manifest
//! lists it until [`super::WriterOptions::sstable_grace`] has passed
//! (queries planned before may still read it), then it is deleted. A
//! vector written by a flush or compaction that never committed is deleted
//! by the next writer's start.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::array::ArrayRef;
use object_store::ObjectMeta;

use super::Shared;
use super::manifest::ShardManifest;
use crate::error::Result;
use crate::sstable::merge::RowTrace;
use crate::sstable::{self, DeletionVector, Deletions, SstableFile};
use crate::store::paths;

/// Files whose vectors are computed at once.
const FILES_AT_ONCE: usize = 4;

/// What a commit changes about one SSTable: its new vector (if it has
/// new marks) and how far its marks are complete.
#[derive(Debug, Clone)]
pub(super) struct Marked {
    pub deletions: Option<Deletions>,
    pub checked_through: u64,
}

impl Shared {
    /// Whether this shard's SSTables get deletion vectors: scans read
    /// unmerged only by the key ranges of a one-column key (see
    /// `ShardSnapshot::parts`), so for other tables marks would not pay
    /// for themselves.
    pub(super) fn keeps_marks(&self) -> bool {
        self.schema.key.len() == 1
    }

    /// Marks, in each SSTable of `files` (the shard's, oldest first), the
    /// rows whose keys are among `keys` (the key columns of the SSTable of
    /// `generation` about to be appended, sorted by key), writing a new
    /// vector for each file that gets new marks. Returns what to change,
    /// by path.
    pub(super) async fn mark_shadowed(
        &self,
        files: &[SstableFile],
        keys: &[ArrayRef],
        generation: u64,
    ) -> Result<HashMap<String, Marked>> {
        if !self.keeps_marks() || files.is_empty() {
            return Ok(HashMap::new());
        }
        let mut marked = HashMap::new();
        let all: Vec<usize> = (0..files.len()).collect();
        for some in all.chunks(FILES_AT_ONCE) {
            let done = futures::future::try_join_all(
                some.iter()
                    .map(|&i| self.mark_shadowed_in(files, i, keys, generation)),
            )
            .await?;
            marked.extend(done);
        }
        Ok(marked)
    }

    /// [`Shared::mark_shadowed`] of `files[i]`.
    async fn mark_shadowed_in(
        &self,
        files: &[SstableFile],
        i: usize,
        keys: &[ArrayRef],
        generation: u64,
    ) -> Result<(String, Marked)> {
        let file = &files[i];
        let rows = self.reader.rows_with_keys(file, keys).await?;
        let deletions = self.add_marks(file, rows).await?;
        // Complete through `generation` if it was through every file
        // before it.
        let newest = files.last().expect("not empty").generation;
        let checked_through = match sstable::checked_through(files, i) >= newest {
            true => generation,
            false => file.checked_through,
        };
        let marked = Marked {
            deletions: deletions.or_else(|| file.deletions.clone()),
            checked_through,
        };
        Ok((file.path.clone(), marked))
    }

    /// A new vector for `file` with `rows` marked too, written (and the
    /// one it replaces queued for deletion); `None` if nothing is new.
    async fn add_marks(
        &self,
        file: &SstableFile,
        rows: impl IntoIterator<Item = u64>,
    ) -> Result<Option<Deletions>> {
        let mut vector = match self.reader.deletions(file).await? {
            Some(v) => (*v).clone(),
            None => DeletionVector::new(file.rows),
        };
        let mut fresh = false;
        for row in rows {
            fresh |= vector.mark(row)?;
        }
        if !fresh {
            return Ok(None);
        }
        let entry = sstable::deletions::write(&self.store, file, self.epoch, &vector).await?;
        self.reader.cache_deletions(&entry, Arc::new(vector));
        Ok(Some(entry))
    }

    /// The marks of a compaction's output `output`: each row of `inputs`
    /// (their entries now, oldest first, a consecutive run of `files`, the
    /// shard's SSTables now) that is marked and reached the output (as
    /// `trace` says) is marked there. Its marks are complete as far as all
    /// of the inputs' are.
    pub(super) async fn carry_marks(
        &self,
        files: &[SstableFile],
        inputs: &[SstableFile],
        trace: &RowTrace,
        output: &SstableFile,
    ) -> Result<Marked> {
        let at = files
            .iter()
            .position(|f| f.path == inputs[0].path)
            .expect("the run is among the files");
        let checked_through = (at..at + inputs.len())
            .map(|i| sstable::checked_through(files, i))
            .min()
            .unwrap_or(0);
        let mut rows = Vec::new();
        for input in inputs {
            if let Some(vector) = self.reader.deletions(input).await? {
                rows.extend(
                    vector
                        .iter()
                        .filter_map(|row| trace.position(input.generation, row)),
                );
            }
        }
        Ok(Marked {
            deletions: self.add_marks(output, rows).await?,
            checked_through,
        })
    }

    /// Of `listed` (objects under the shard's SSTables), the deletion
    /// vectors of older epochs that `manifest` does not name, live or
    /// retired, nor holds in the directory of a retired SSTable: written
    /// by a flush or compaction that never committed (and never will: its
    /// writer is fenced).
    pub(super) fn unnamed_deletions(
        &self,
        manifest: &ShardManifest,
        listed: &[ObjectMeta],
    ) -> Vec<object_store::path::Path> {
        let live = manifest.sstables.iter();
        let named: HashSet<&str> = live
            .filter_map(|f| f.deletions.as_ref().map(|d| d.path.as_str()))
            .chain(manifest.retired.iter().map(|f| f.path.as_str()))
            .collect();
        let retired: HashSet<&str> = manifest
            .retired
            .iter()
            .filter_map(|f| paths::own_sstable_dir(&f.path))
            .collect();
        listed
            .iter()
            .map(|meta| &meta.location)
            .filter(|path| {
                paths::deletions_epoch(path.as_ref()).is_some_and(|epoch| epoch < self.epoch)
                    && !named.contains(path.as_ref())
                    && !retired.contains(paths::sstable_dir(path.as_ref()))
            })
            .cloned()
            .collect()
    }
}
