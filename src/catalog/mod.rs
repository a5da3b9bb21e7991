//! The `__manifest` catalog (DESIGN.md §5): namespaces and tables as rows of
//! an Arrow table, one immutable version per change, each version a delta
//! of the one before over periodic checkpoints (see the `delta_log` module).
//!
//! Invariants:
//! - every change is a new version committed through
//!   `VersionedObjects::commit_with` (the one commit primitive), so two
//!   racing creators of one id never both win and no change is lost or
//!   applied twice; a commit costs the same whatever the catalog's size;
//! - mutations from one process that arrive while a commit is in flight are
//!   committed together as one version (group commit); each keeps its own
//!   result, and one rejected mutation does not affect the others;
//! - reads answer from the in-memory snapshot; a miss refreshes it first
//!   ("not found" is never cached), except in a session's statement,
//!   which refreshed it as it began.

mod delta_log;
mod entry;
mod format;
mod state;

use std::sync::{Arc, Mutex, RwLock};

use object_store::ObjectStoreExt;
use object_store::path::Path;
use tokio::sync::oneshot;

pub use entry::{Entry, ObjectPath, ObjectType};
pub use state::{CatalogState, Change, Mutation, Outcome};

use crate::error::{Error, Result};
use crate::schema::TableMeta;
use crate::store::{CommitOptions, ObjectRoot, Versioned, delete_if_present, paths};
use delta_log::DeltaLog;

/// Options of a [`Catalog`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CatalogOptions {
    /// Commit protocol knobs (`keep_versions` does not apply: checkpoints
    /// decide which versions the catalog keeps).
    pub commit: CommitOptions,
    /// A handle writes a checkpoint in the background after a commit once
    /// this many versions followed the newest checkpoint it knows, or their
    /// deltas hold a quarter of its bytes (default 2,048; 0: only
    /// [`Catalog::checkpoint`] writes them). A reader opening the catalog
    /// reads about this many versions after the checkpoint at most.
    pub checkpoint_every: u64,
    /// Versions a checkpoint leaves uncollected behind the checkpoint before
    /// it, so that handles a little behind catch up by reading them rather
    /// than a checkpoint (default 256).
    pub keep_behind: u64,
}

impl Default for CatalogOptions {
    fn default() -> Self {
        Self {
            commit: CommitOptions::default(),
            checkpoint_every: 2048,
            keep_behind: 256,
        }
    }
}

tokio::task_local! {
    /// The catalog (its address) a statement running on this task
    /// refreshed as it began (see [`Catalog::in_statement`]).
    static REFRESHED_BY_STATEMENT: usize;
}

struct Pending {
    mutation: Mutation,
    done: oneshot::Sender<Result<Outcome>>,
}

/// A handle on one root's catalog. Cheap to share (`Arc`); every method is
/// safe to call concurrently.
pub struct Catalog {
    root: ObjectRoot,
    log: Arc<DeltaLog>,
    current: RwLock<Versioned<CatalogState>>,
    queue: Mutex<Vec<Pending>>,
    committer: tokio::sync::Mutex<()>,
    /// Held while this handle writes a checkpoint.
    checkpointing: Arc<tokio::sync::Mutex<()>>,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog")
            .field("root", &self.root.url())
            .field("version", &self.version())
            .finish()
    }
}

impl Catalog {
    /// Opens the catalog of `root` and loads its newest version (an empty
    /// catalog if there is none yet; nothing is written until a change).
    pub async fn open(root: ObjectRoot, options: CatalogOptions) -> Result<Arc<Self>> {
        let log = Arc::new(DeltaLog::new(Arc::clone(root.store()), &options));
        let current = log.load().await?;
        Ok(Arc::new(Self {
            root,
            log,
            current: RwLock::new(current),
            queue: Mutex::new(Vec::new()),
            committer: tokio::sync::Mutex::new(()),
            checkpointing: Arc::default(),
        }))
    }

    /// The root this catalog lives in.
    pub fn root(&self) -> &ObjectRoot {
        &self.root
    }

    /// The version the snapshot was read from (0: empty catalog).
    pub fn version(&self) -> u64 {
        self.read_current().version
    }

    /// The in-memory snapshot; see [`Catalog::refresh`] for a fresh one.
    pub fn snapshot(&self) -> Arc<CatalogState> {
        Arc::clone(&self.read_current().state)
    }

    fn read_current(&self) -> Versioned<CatalogState> {
        self.current.read().expect("catalog lock poisoned").clone()
    }

    /// Installs `next` unless the snapshot is newer.
    fn install(&self, next: Versioned<CatalogState>) {
        let mut current = self.current.write().expect("catalog lock poisoned");
        if next.version >= current.version {
            *current = next;
        }
    }

    /// Catches up with versions committed elsewhere: reads the versions
    /// after the snapshot's, one request when nothing changed (the newest
    /// checkpoint and what follows it after long idling).
    pub async fn refresh(&self) -> Result<()> {
        let base = self.read_current();
        let stale = self.log.versions().is_stale(&base);
        let next = self.log.reload(base, stale).await?;
        self.install(next);
        Ok(())
    }

    /// Runs `statement`, which refreshed this catalog as it began: a name
    /// it looks up and misses is missing as of then, and is not read
    /// again (a statement naming a table function would otherwise wait
    /// for the store twice).
    pub(crate) async fn in_statement<F: Future>(&self, statement: F) -> F::Output {
        REFRESHED_BY_STATEMENT
            .scope(self.address(), statement)
            .await
    }

    fn address(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    /// The entry at `path`, refreshing the snapshot once on a miss (not in
    /// a session's statement, which refreshed it as it began).
    pub async fn describe(&self, path: &ObjectPath) -> Result<Option<Arc<Entry>>> {
        if let Some(e) = self.snapshot().get(path) {
            return Ok(Some(Arc::clone(e)));
        }
        let refreshed = REFRESHED_BY_STATEMENT.try_with(|&c| c == self.address());
        if !refreshed.unwrap_or(false) {
            self.refresh().await?;
        }
        Ok(self.snapshot().get(path).cloned())
    }

    /// Whether a namespace or table exists at `path` (the root always does).
    pub async fn exists(&self, path: &ObjectPath) -> Result<bool> {
        Ok(path.is_root() || self.describe(path).await?.is_some())
    }

    /// The metadata of the table at `path`, refreshing once on a miss.
    pub async fn table(&self, path: &ObjectPath) -> Result<Option<(Arc<Entry>, TableMeta)>> {
        match self.describe(path).await? {
            Some(e) if e.object_type == ObjectType::Table => {
                let meta = TableMeta::from_json(&e.metadata, &path.to_string())?;
                Ok(Some((e, meta)))
            }
            _ => Ok(None),
        }
    }

    /// The direct children of namespace `path` in the snapshot.
    pub fn list(&self, path: &ObjectPath) -> Vec<Arc<Entry>> {
        self.snapshot().children(path)
    }

    /// One page of [`Catalog::list`]: see [`CatalogState::children_page`].
    pub fn list_page(
        &self,
        path: &ObjectPath,
        after: Option<&str>,
        limit: usize,
    ) -> (Vec<Arc<Entry>>, Option<String>) {
        self.snapshot().children_page(path, after, limit)
    }

    /// Creates a namespace; its parent must exist.
    pub async fn create_namespace(
        self: &Arc<Self>,
        path: ObjectPath,
        if_not_exists: bool,
    ) -> Result<Outcome> {
        self.mutate(Mutation::CreateNamespace {
            path,
            if_not_exists,
        })
        .await
    }

    /// Drops a namespace; with `cascade` also everything below it, without
    /// it a non-empty namespace is an error.
    pub async fn drop_namespace(
        self: &Arc<Self>,
        path: ObjectPath,
        if_exists: bool,
        cascade: bool,
    ) -> Result<Outcome> {
        self.mutate(Mutation::DropNamespace {
            path,
            if_exists,
            cascade,
        })
        .await
    }

    /// Creates a table at a fresh, unique location; a column of a type
    /// SSTables cannot store (an interval of months, days and nanoseconds,
    /// a union) is refused, also under `if_not_exists`.
    pub async fn create_table(
        self: &Arc<Self>,
        path: ObjectPath,
        meta: TableMeta,
        if_not_exists: bool,
    ) -> Result<Outcome> {
        let location = paths::new_table_location(path.name());
        self.mutate(Mutation::CreateTable {
            path,
            meta: Box::new(meta),
            location,
            if_not_exists,
        })
        .await
    }

    /// What creating the table `path` would do on the current snapshot (a
    /// statement's is fresh as it began): checked before work that comes
    /// before the commit, which checks again.
    pub(crate) fn table_creation(
        &self,
        path: &ObjectPath,
        meta: &TableMeta,
        if_not_exists: bool,
    ) -> Result<Outcome> {
        crate::sstable::check_storable(meta.schema())?;
        self.snapshot()
            .creation(path, ObjectType::Table, if_not_exists)
    }

    /// Drops a table.
    pub async fn drop_table(
        self: &Arc<Self>,
        path: ObjectPath,
        if_exists: bool,
    ) -> Result<Outcome> {
        self.mutate(Mutation::DropTable { path, if_exists }).await
    }

    /// Deletes the data of dropped tables: at once for `dropped` (locations
    /// of tables this process just dropped; each shard's seal, its newest
    /// manifest version and WAL entry, stays until the grace is over, so
    /// a writer still running elsewhere keeps failing), and for every other location
    /// under the tables directory that the catalog no longer names and
    /// nothing was written to for `grace` (a table dropped elsewhere, or
    /// data a writer that missed the drop wrote after it, or the rows of a
    /// `CREATE TABLE ... AS SELECT` killed midway), unless a bulk load's
    /// marker in it is younger than the grace it names. A location is
    /// never reused, so no live table loses anything; a query still
    /// reading a dropped table fails. Returns the objects deleted; a
    /// failed delete is logged and left for a later sweep.
    pub async fn collect_dropped_tables(
        &self,
        dropped: &[String],
        grace: std::time::Duration,
    ) -> Result<usize> {
        use futures::{StreamExt, TryStreamExt};
        // Fresh, so a table created elsewhere before now is named: its
        // files can only be younger than this sweep.
        self.refresh().await?;
        let tip = self.read_current();
        let live = |location: &str| tip.state.holds_location(location);
        let store = self.root.store();
        // Ages by the store's clock: the newest object seen (the catalog's
        // tip included) is no later than the store's now.
        let mut now_ms = match store.head(&self.log.versions().path_of(tip.version)).await {
            Ok(meta) => meta.last_modified.timestamp_millis(),
            Err(_) => 0,
        };
        let listed = store
            .list_with_delimiter(Some(&Path::from(paths::TABLES_DIR)))
            .await?;
        let mut dead = Vec::new();
        for dir in listed.common_prefixes {
            let location = dir.as_ref();
            // Only names memwal makes, so a directory is never mistaken
            // for another one encoded differently.
            if live(location) || !paths::is_table_location(location) {
                continue;
            }
            let objects: Vec<object_store::ObjectMeta> =
                store.list(Some(&dir)).try_collect().await?;
            let newest = objects
                .iter()
                .map(|o| o.last_modified.timestamp_millis())
                .max();
            now_ms = now_ms.max(newest.unwrap_or(0));
            // A bulk load's markers keep its data for the grace they name
            // (a `CREATE TABLE ... AS SELECT` loads into a location no
            // entry names yet, and may write nothing for a while).
            let loading_until = objects
                .iter()
                .filter_map(|o| {
                    let grace = paths::marker_grace(o.location.as_ref())?;
                    Some(o.last_modified.timestamp_millis() + grace as i64)
                })
                .max();
            let named = dropped.iter().any(|d| d == location);
            dead.push((location.to_string(), named, newest, loading_until, objects));
        }
        let grace_ms = grace.as_millis() as i64;
        let mut deleted = 0;
        for (location, named, newest, loading_until, mut objects) in dead {
            let young = newest.is_some_and(|at| now_ms - at < grace_ms)
                || loading_until.is_some_and(|until| now_ms < until);
            if young && !named {
                continue;
            }
            if young {
                let seal = paths::newest_per_shard_log(objects.iter().map(|o| &o.location));
                objects.retain(|o| !seal.contains(&o.location));
            }
            let gone: Vec<Result<()>> = futures::stream::iter(objects)
                .map(|o| async move { delete_if_present(store.as_ref(), &o.location).await })
                .buffer_unordered(16)
                .collect()
                .await;
            for result in gone {
                match result {
                    Ok(()) => deleted += 1,
                    Err(e) => ::log::warn!("deleting data of dropped table {location}: {e}"),
                }
            }
        }
        Ok(deleted)
    }

    /// Deletes everything at `location` (a table location) unless the
    /// catalog, read fresh, names it: the rows of a `CREATE TABLE ... AS
    /// SELECT` that failed. No writer elsewhere knows of them, so unlike a
    /// dropped table's shards they keep no seal. Returns the objects
    /// deleted.
    pub(crate) async fn delete_unnamed(&self, location: &str) -> Result<usize> {
        use futures::{StreamExt, TryStreamExt};
        self.refresh().await?;
        if self.snapshot().holds_location(location) || !paths::is_table_location(location) {
            return Ok(0);
        }
        let store = self.root.store();
        let objects: Vec<object_store::ObjectMeta> = store
            .list(Some(&Path::from(location)))
            .try_collect()
            .await?;
        let deleted = objects.len();
        futures::stream::iter(objects)
            .map(|o| async move { delete_if_present(store.as_ref(), &o.location).await })
            .buffer_unordered(16)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(deleted)
    }

    /// Commits one mutation, sharing a version with every other mutation
    /// queued in this process meanwhile (group commit).
    pub async fn mutate(self: &Arc<Self>, mutation: Mutation) -> Result<Outcome> {
        let mut results = self.mutate_all(vec![mutation]).await;
        results.pop().expect("one result per mutation")
    }

    /// Commits many mutations, in order, with as few versions as group
    /// commit allows (one, unless the batch is joined mid-way by others).
    /// Each mutation gets its own result; a rejected one changes nothing.
    ///
    /// The commit runs in a task of its own: a caller cancelled mid-commit
    /// neither aborts the commit nor strands the mutations batched with its.
    pub async fn mutate_all(self: &Arc<Self>, mutations: Vec<Mutation>) -> Vec<Result<Outcome>> {
        let mut receivers = Vec::with_capacity(mutations.len());
        {
            let mut queue = self.queue.lock().expect("catalog queue poisoned");
            for mutation in mutations {
                let (done, result) = oneshot::channel();
                // A table whose rows no SSTable could hold is refused here
                // (not when a catalog holding one is read).
                match check_storable(&mutation) {
                    Err(e) => {
                        let _ = done.send(Err(e));
                    }
                    Ok(()) => queue.push(Pending { mutation, done }),
                }
                receivers.push(result);
            }
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            // Whoever holds the lock first commits everything queued by then;
            // later drainers may find the queue empty.
            let _leader = this.committer.lock().await;
            let batch = std::mem::take(&mut *this.queue.lock().expect("catalog queue poisoned"));
            if !batch.is_empty() {
                this.commit_batch(batch).await;
            }
        });
        let mut results = Vec::with_capacity(receivers.len());
        for receiver in receivers {
            results.push(
                receiver
                    .await
                    .unwrap_or_else(|_| Err(Error::invalid("catalog commit task failed"))),
            );
        }
        results
    }

    /// Commits `batch` as one version and answers every waiter.
    async fn commit_batch(&self, batch: Vec<Pending>) {
        let mut results: Vec<Result<Outcome>> = Vec::new();
        let mut written = 0;
        let mut refreshed = false;
        let committed = loop {
            let base = self.read_current();
            let base_version = base.version;
            let log = &self.log;
            let committed = log
                .versions()
                .commit_with(
                    base,
                    |base, stale| log.reload(base, stale),
                    |state| {
                        let mut next = state.clone();
                        let mut changes = Vec::new();
                        results = batch
                            .iter()
                            .map(|p| next.apply(&p.mutation, &mut changes))
                            .collect();
                        if changes.is_empty() {
                            return Ok(None);
                        }
                        let bytes = format::encode_delta(&changes)?;
                        written = bytes.len();
                        Ok(Some((next, bytes)))
                    },
                )
                .await;
            // Nothing to write was decided on our snapshot: make sure it was
            // not stale ("exists"/"not found" must be true at the tip).
            match committed {
                Ok(v) if v.version == base_version && !refreshed => {
                    refreshed = true;
                    if let Err(e) = self.refresh().await {
                        break Err(e);
                    }
                    if self.version() == base_version {
                        break Ok(v);
                    }
                }
                other => break other,
            }
        };
        match committed {
            Ok(version) => {
                let (at, state) = (version.version, Arc::clone(&version.state));
                if written > 0 {
                    self.log.counted(at, written);
                }
                self.install(version);
                // Before answering: a caller that then waits in
                // `Catalog::close` waits for this checkpoint too.
                self.checkpoint_if_due(at, state);
                for (p, r) in batch.into_iter().zip(results) {
                    let _ = p.done.send(r);
                }
            }
            Err(e) => {
                let e = SharedError(e);
                for p in batch {
                    let _ = p.done.send(Err(e.for_waiter()));
                }
            }
        }
    }

    /// Writes a checkpoint of `state` (the catalog at `version`) in the
    /// background when one is due, this handle is not writing one, and no
    /// other handle wrote a newer one since the one it knows.
    fn checkpoint_if_due(&self, version: u64, state: Arc<CatalogState>) {
        if !self.log.checkpoint_due(version) {
            return;
        }
        let Ok(busy) = Arc::clone(&self.checkpointing).try_lock_owned() else {
            return;
        };
        let log = Arc::clone(&self.log);
        tokio::spawn(async move {
            let spared = log.adopt_newer().await.unwrap_or(false);
            if !spared && let Err(e) = log.checkpoint(version, state, false).await {
                ::log::warn!("writing the catalog checkpoint of version {version} failed: {e}");
            }
            drop(busy);
        });
    }

    /// Waits for the checkpoint this handle is writing in the background,
    /// and its collection, to end (it has begun by the time the commit
    /// that made it due returned). The handle stays usable. A process that
    /// exits without it may leave two checkpoints, or versions left to
    /// collect, for the next checkpoint to clear.
    pub async fn close(&self) {
        let _idle = self.checkpointing.lock().await;
    }

    /// Writes a checkpoint of the newest version now (they are written in
    /// the background as commits go, see
    /// [`CatalogOptions::checkpoint_every`]), after one being written by
    /// this handle, and collects what the checkpoint before it covers,
    /// listing the versions for what earlier collections left; returns its
    /// version (0, and nothing written, for a catalog without versions).
    pub async fn checkpoint(&self) -> Result<u64> {
        let _busy = self.checkpointing.lock().await;
        self.refresh().await?;
        let tip = self.read_current();
        if tip.version > 0 {
            self.log.checkpoint(tip.version, tip.state, true).await?;
        }
        Ok(tip.version)
    }
}

/// Refuses a mutation that creates a table whose rows no SSTable could
/// hold.
fn check_storable(mutation: &Mutation) -> Result<()> {
    match mutation {
        Mutation::CreateTable { meta, .. } => crate::sstable::check_storable(meta.schema()),
        Mutation::All(mutations) => mutations.iter().try_for_each(check_storable),
        _ => Ok(()),
    }
}

/// A batch-level failure, handed to each waiter of the batch with its kind
/// and message intact; any other kind came before a version was written
/// (every write's failure is one of the kinds kept), and says so.
struct SharedError(Error);

impl SharedError {
    fn for_waiter(&self) -> Error {
        match &self.0 {
            Error::CommitConflict { what, attempts } => Error::CommitConflict {
                what: what.clone(),
                attempts: *attempts,
            },
            Error::CommitOutcomeUnknown {
                path,
                write,
                read_back,
            } => Error::CommitOutcomeUnknown {
                path: path.clone(),
                write: write.clone(),
                read_back: read_back.clone(),
            },
            Error::Corrupt { path, reason } => Error::Corrupt {
                path: path.clone(),
                reason: reason.clone(),
            },
            Error::NotWritten { what, cause } => Error::NotWritten {
                what: what.clone(),
                cause: cause.clone(),
            },
            // Failed before its version was written (reading the tip,
            // encoding).
            other => Error::NotWritten {
                what: "the catalog's commit".into(),
                cause: other.to_string(),
            },
        }
    }
}
