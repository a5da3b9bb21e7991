//! The MemTable (DESIGN.md §2, §6): the rows of one shard's current
//! generation, in put order, in memory.
//!
//! One writer appends; any number of readers read at the same time without
//! taking a lock on the batches:
//! - batches live in append-only slots that are written once and never
//!   moved ([`OnceLock`] segments of doubling size); once a batch's WAL
//!   entry has landed, its slot's batch is swapped for the same rows with
//!   their long blob values in the entry's pack (so the MemTable holds no
//!   blob bytes that are durable elsewhere);
//! - `written` counts the batches of complete puts, `visible` the prefix
//!   readers may see: the shorter of the durable prefix (marked by the
//!   writer) and the indexed one (every vector column's [`Graph`] holds its
//!   rows); counts are published with release stores and read with
//!   acquire loads, so a reader that sees a count sees every slot below it;
//! - a put of several batches is published in one store, so readers see all
//!   of it or none of it;
//! - the primary-key index maps each key to its newest row and each row to
//!   the previous and next rows of its key, so a lookup capped at the
//!   visible prefix finds the newest visible version even while newer rows
//!   are being added, and a vector search can tell a row's newest version.
//!
//! The stored row form, the key encoding and the input checks it relies on
//! are in [`crate::schema`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use datafusion::arrow::array::{AsArray, RecordBatch};

use crate::hnsw::Graph;
use crate::schema::{KeyedBatch, TableSchema, held_bytes};

/// Slots in the first segment; segment `s` holds `FIRST_SEGMENT << s`.
const FIRST_SEGMENT: usize = 32;
/// Enough segments for more batches than memory can hold.
const SEGMENTS: usize = 40;

/// Append-only storage of values, written once per slot.
struct Slots<T> {
    segments: [OnceLock<Box<[OnceLock<T>]>>; SEGMENTS],
}

impl<T> Slots<T> {
    fn new() -> Self {
        Self {
            segments: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    fn locate(index: usize) -> (usize, usize) {
        let n = index / FIRST_SEGMENT + 1;
        let segment = (usize::BITS - 1 - n.leading_zeros()) as usize;
        (segment, index - FIRST_SEGMENT * ((1 << segment) - 1))
    }

    fn segment(&self, segment: usize) -> &[OnceLock<T>] {
        self.segments[segment].get_or_init(|| {
            (0..FIRST_SEGMENT << segment)
                .map(|_| OnceLock::new())
                .collect()
        })
    }

    /// Sets slot `index` (each slot is set once, by the one writer).
    fn set(&self, index: usize, value: T) {
        let (segment, offset) = Self::locate(index);
        if self.segment(segment)[offset].set(value).is_err() {
            unreachable!("MemTable slot {index} written twice");
        }
    }

    /// The value of slot `index`, which must have been set.
    fn get(&self, index: usize) -> &T {
        self.try_get(index)
            .expect("MemTable slot read before it was published")
    }

    /// The value of slot `index`, if set.
    fn try_get(&self, index: usize) -> Option<&T> {
        let (segment, offset) = Self::locate(index);
        self.segments[segment].get().and_then(|s| s[offset].get())
    }
}

/// One stored batch, the global row number of its first row, and the
/// bytes it adds to [`MemTable::bytes`].
#[derive(Debug, Clone)]
pub struct StoredBatch {
    pub batch: RecordBatch,
    pub first_row: u64,
    pub held: usize,
}

/// A MemTable slot: a written batch, its first row's number and row
/// count, and the bytes it adds to [`MemTable::bytes`].
#[derive(Debug)]
struct Slot {
    first_row: u64,
    rows: u64,
    held: RwLock<(RecordBatch, usize)>,
}

impl Slot {
    fn batch(&self) -> RecordBatch {
        self.held.read().expect("MemTable slot poisoned").0.clone()
    }

    fn stored(&self) -> StoredBatch {
        let (batch, held) = self.held.read().expect("MemTable slot poisoned").clone();
        StoredBatch {
            batch,
            first_row: self.first_row,
            held,
        }
    }
}

/// A MemTable as a snapshot sees it: its first `batches` batches.
#[derive(Debug, Clone)]
pub struct MemLayer {
    pub memtable: Arc<MemTable>,
    pub batches: usize,
}

/// How far a snapshot of a shard saw into the shard's log: every row of
/// the generations before `generation`, and the rows of `generation`
/// numbered below `rows`. Row numbers of a generation are the same in
/// every process (its WAL entries in order), so a writer can tell the
/// rows written after the snapshot: a DELETE deletes only versions it saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermark {
    /// The newest generation the snapshot saw rows of (or would have).
    pub generation: u64,
    /// The rows of that generation it saw.
    pub rows: u64,
}

/// Where a key's versions are.
#[derive(Default)]
struct KeyIndex {
    /// Key → its newest row.
    newest: HashMap<Box<[u8]>, u64>,
    /// Row → the previous row of the same key (`u64::MAX`: none).
    previous: Vec<u64>,
    /// Row → the next row of the same key (`u64::MAX`: none).
    next: Vec<u64>,
}

/// A MemTable. See the module doc for the concurrency contract.
pub struct MemTable {
    schema: Arc<TableSchema>,
    slots: Slots<Slot>,
    written: AtomicUsize,
    durable: AtomicUsize,
    indexed: AtomicUsize,
    visible: AtomicUsize,
    rows: AtomicU64,
    bytes: AtomicUsize,
    index: RwLock<KeyIndex>,
    /// One graph per vector column `(column index, graph)`; empty for a
    /// MemTable without vector indexes (then every written batch counts
    /// as indexed).
    graphs: Vec<(usize, Graph)>,
}

impl std::fmt::Debug for MemTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemTable")
            .field("written", &self.written_batches())
            .field("visible", &self.visible_batches())
            .field("bytes", &self.bytes())
            .finish()
    }
}

impl MemTable {
    /// An empty MemTable for rows of `schema`, without vector indexes.
    pub fn new(schema: Arc<TableSchema>) -> Self {
        Self {
            schema,
            slots: Slots::new(),
            written: AtomicUsize::new(0),
            durable: AtomicUsize::new(0),
            indexed: AtomicUsize::new(0),
            visible: AtomicUsize::new(0),
            rows: AtomicU64::new(0),
            bytes: AtomicUsize::new(0),
            index: RwLock::new(KeyIndex::default()),
            graphs: Vec::new(),
        }
    }

    /// An empty MemTable for rows of `schema` with a graph per vector
    /// column (built by [`MemTable::index_to`]).
    pub fn indexed(schema: Arc<TableSchema>) -> Self {
        let graphs = schema
            .vectors
            .iter()
            .map(|v| {
                let graph = Graph::new(v.dim as usize, v.metric, v.params, v.index as u64);
                (v.index, graph)
            })
            .collect();
        Self {
            graphs,
            ..Self::new(schema)
        }
    }

    /// The table schema of the rows.
    pub fn schema(&self) -> &Arc<TableSchema> {
        &self.schema
    }

    /// Appends the batches of one put (stored form, see [`TableSchema`])
    /// after the last written one, with their key encodings (`None` for
    /// append-only tables), and returns the new written count and the
    /// bytes they add to [`MemTable::bytes`] (see [`held_bytes`]). The batches
    /// are not visible until they are durable ([`MemTable::mark_durable`]) and
    /// indexed ([`MemTable::index_to`]).
    ///
    /// Only one thread may append at a time (the shard's writer).
    pub fn append(&self, batches: Vec<KeyedBatch>) -> (usize, usize) {
        let mut next = self.written.load(Ordering::Relaxed);
        let mut row = self.rows.load(Ordering::Relaxed);
        let mut bytes = 0;
        for (batch, keys) in batches {
            let rows = batch.num_rows() as u64;
            if let Some(keys) = keys {
                let mut index = self.index.write().expect("key index poisoned");
                let KeyIndex {
                    newest,
                    previous,
                    next,
                } = &mut *index;
                for (i, key) in keys.into_iter().enumerate() {
                    let at = row + i as u64;
                    let before = newest.insert(key, at).unwrap_or(u64::MAX);
                    previous.push(before);
                    next.push(u64::MAX);
                    if before != u64::MAX {
                        next[before as usize] = at;
                    }
                }
            }
            let held = held_bytes(&batch);
            bytes += held;
            self.slots.set(
                next,
                Slot {
                    first_row: row,
                    rows,
                    held: RwLock::new((batch, held)),
                },
            );
            next += 1;
            row += rows;
        }
        self.rows.store(row, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.written.store(next, Ordering::Release);
        if self.graphs.is_empty() {
            self.indexed.store(next, Ordering::SeqCst);
            self.update_visible();
        }
        (next, bytes)
    }

    /// Marks the first `batches` written batches durable (never moves
    /// back); they are visible once indexed too. `batches` must end at a
    /// put boundary.
    pub fn mark_durable(&self, batches: usize) {
        debug_assert!(batches <= self.written_batches());
        self.durable.fetch_max(batches, Ordering::SeqCst);
        self.update_visible();
    }

    /// Adds the vectors of the written batches up to `batches` to the
    /// graphs (on `threads` threads) and marks them indexed. One caller at
    /// a time (the shard's index task); searches run meanwhile.
    pub fn index_to(&self, batches: usize, threads: usize) {
        let from = self.indexed_batches();
        // All waiting batches in one add per graph: the threads share the
        // inserts of many small puts.
        let waiting = self.batches(from, batches);
        for (column, graph) in &self.graphs {
            let parts: Vec<_> = waiting
                .iter()
                .map(|stored| {
                    let vectors = stored.batch.column(*column).as_fixed_size_list();
                    (vectors, stored.first_row)
                })
                .collect();
            graph.add_all(&parts, threads);
        }
        self.indexed.fetch_max(batches, Ordering::SeqCst);
        self.update_visible();
    }

    /// Visible = min(durable, indexed). Both only grow and each updater
    /// re-reads the other after its own store (sequentially consistent), so
    /// the last of two racing updates sees both.
    fn update_visible(&self) {
        let ready = self
            .durable
            .load(Ordering::SeqCst)
            .min(self.indexed.load(Ordering::SeqCst));
        self.visible.fetch_max(ready, Ordering::Release);
    }

    /// Batches whose vectors are in the graphs.
    pub fn indexed_batches(&self) -> usize {
        self.indexed.load(Ordering::Acquire)
    }

    /// The graph of vector column `column` (a table schema index), if this
    /// MemTable indexes vectors.
    pub fn graph(&self, column: usize) -> Option<&Graph> {
        self.graphs
            .iter()
            .find(|(c, _)| *c == column)
            .map(|(_, g)| g)
    }

    /// Rows in the first `batches` written batches (row numbers below this
    /// are theirs).
    pub fn rows_within(&self, batches: usize) -> u64 {
        match batches.checked_sub(1) {
            Some(last) => {
                let last = self.slots.get(last);
                last.first_row + last.rows
            }
            None => 0,
        }
    }

    /// Whether `row` is the newest version of its key among rows below
    /// `cap` (always true without a primary key).
    pub fn is_newest(&self, row: u64, cap: u64) -> bool {
        let index = self.index.read().expect("key index poisoned");
        index
            .next
            .get(row as usize)
            .is_none_or(|&next| next == u64::MAX || next >= cap)
    }

    /// The row number of the newest written version of the key with
    /// encoding `key` (visible or not), if it has one here.
    pub fn newest_row(&self, key: &[u8]) -> Option<u64> {
        let index = self.index.read().expect("key index poisoned");
        index.newest.get(key).copied()
    }

    /// Batches of complete puts.
    pub fn written_batches(&self) -> usize {
        self.written.load(Ordering::Acquire)
    }

    /// Batches readers may see.
    pub fn visible_batches(&self) -> usize {
        self.visible.load(Ordering::Acquire)
    }

    /// Bytes of all written batches (see [`held_bytes`]; a batch's long
    /// blob values count until its WAL entry lands).
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// The written batches `from..to` (`to` at most the written count).
    pub fn batches(&self, from: usize, to: usize) -> Vec<StoredBatch> {
        assert!(
            to <= self.written_batches(),
            "batches beyond the written ones"
        );
        (from..to).map(|i| self.slots.get(i).stored()).collect()
    }

    /// Records that the WAL entry of the written batches from `from` on
    /// holds them as `batches` (the same rows, their long blob values in a
    /// pack): the MemTable holds those from now on, and no longer counts
    /// the blob bytes; returns by how much [`MemTable::bytes`] fell. Readers
    /// that took the batches before keep theirs.
    pub fn set_packed(&self, from: usize, batches: Vec<RecordBatch>) -> usize {
        let mut released = 0;
        for (i, batch) in batches.into_iter().enumerate() {
            let slot = self.slots.get(from + i);
            debug_assert_eq!(batch.num_rows() as u64, slot.rows);
            let held = held_bytes(&batch);
            let mut current = slot.held.write().expect("MemTable slot poisoned");
            released += current.1.saturating_sub(held);
            *current = (batch, held.min(current.1));
        }
        self.bytes.fetch_sub(released, Ordering::Relaxed);
        released
    }

    /// The visible prefix, captured once: every batch readers may see now.
    pub fn snapshot(&self) -> Vec<StoredBatch> {
        self.batches(0, self.visible_batches())
    }

    /// The newest visible version of the key with encoding `key`: its batch
    /// and row, or `None` if the key has no visible row. The row may be a
    /// tombstone. Costs one hash lookup and a binary search; copies nothing.
    pub fn get(&self, key: &[u8]) -> Option<(RecordBatch, usize)> {
        self.get_within(key, self.visible_batches())
    }

    /// Like [`MemTable::get`], among the first `visible` batches only.
    pub fn get_within(&self, key: &[u8], visible: usize) -> Option<(RecordBatch, usize)> {
        let last = self.slots.get(visible.checked_sub(1)?);
        let cap = last.first_row + last.rows;
        let mut row = {
            let index = self.index.read().expect("key index poisoned");
            let mut row = *index.newest.get(key)?;
            while row != u64::MAX && row >= cap {
                row = index.previous[row as usize];
            }
            row
        };
        if row == u64::MAX {
            return None;
        }
        // The last visible batch starting at or before `row`.
        let (mut lo, mut hi) = (0, visible);
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if self.slots.get(mid).first_row <= row {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let found = self.slots.get(lo);
        row -= found.first_row;
        Some((found.batch(), row as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{TableMeta, key};
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};

    fn table() -> Arc<TableSchema> {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Int64, true),
        ]);
        let meta = TableMeta::new(&schema, vec!["id".into()], &[]).unwrap();
        Arc::new(TableSchema::new(&meta))
    }

    fn put(t: &TableSchema, ids: &[i64], v: i64) -> KeyedBatch {
        let batch = RecordBatch::try_new(
            Arc::clone(&t.schema),
            vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(Int64Array::from(vec![v; ids.len()])),
            ],
        )
        .unwrap();
        let stored = t.to_stored(&batch).unwrap();
        let keys = t.encode_keys(&stored).unwrap();
        (stored, Some(keys))
    }

    #[test]
    fn slots_cover_every_index_once() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..10_000 {
            let (s, o) = Slots::<()>::locate(i);
            assert!(o < FIRST_SEGMENT << s, "{i}");
            assert!(seen.insert((s, o)));
        }
    }

    #[test]
    fn lookups_see_the_newest_visible_version_only() {
        let t = table();
        let m = MemTable::new(Arc::clone(&t));
        let one = key::encode_keys(&[Arc::new(Int64Array::from(vec![1]))], 1).unwrap();
        assert_eq!(m.append(vec![put(&t, &[1, 2], 10)]).0, 1);
        m.mark_durable(1);
        assert_eq!(m.append(vec![put(&t, &[1], 20), put(&t, &[3], 20)]).0, 3);

        // The second put is written but not visible: version 10 wins.
        assert_eq!(m.snapshot().len(), 1);
        let (b, r) = m.get(&one[0]).unwrap();
        assert_eq!(b.column(1).as_primitive::<Int64Type>().value(r), 10);

        m.mark_durable(3);
        assert_eq!(m.snapshot().len(), 3);
        let (b, r) = m.get(&one[0]).unwrap();
        assert_eq!(
            (b.column(1).as_primitive::<Int64Type>().value(r), r),
            (20, 0)
        );
        let missing = key::encode_keys(&[Arc::new(Int64Array::from(vec![9]))], 1).unwrap();
        assert!(m.get(&missing[0]).is_none());
        // The visible prefix never moves back.
        m.mark_durable(1);
        assert_eq!(m.visible_batches(), 3);
    }
}
