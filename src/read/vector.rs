//! Vector search over one shard's layers (DESIGN.md §7): the `k` rows
//! nearest to a query among the newest, live versions of the keys that
//! match a filter.
//!
//! Each layer is searched on its own for its nearest candidates: a
//! MemTable through its graph, an SSTable through its persisted graph over
//! its decoded vector column (cached by the SSTable reader), or exactly
//! when the layer is small or has no graph. A layer only offers rows that
//! are the newest version of their key within it, not deleted, and match
//! the filter; a candidate is then dropped if a newer layer holds any
//! version of its key (that version supersedes or deletes it). While the
//! SSTables' deletion vectors are complete, an SSTable offers none of its
//! marked rows and only the MemTables are asked about the others. When the
//! drops leave fewer than `k` rows nearer than what a layer may still
//! hold, every layer is asked again for twice as many candidates.
//!
//! Invariant: a search returns `min(k, matching live rows)` rows, whatever
//! the graphs. A graph is an approximation that may not reach every node
//! (a node whose in-links were all pruned, a graph built with poor
//! parameters by an older build), so a layer never takes "the graph found
//! fewer than asked" to mean "the layer holds no more": it scans itself
//! exactly instead. A layer is also scanned exactly, without its graph,
//! when the candidates asked for (`max(ef, fetch)`) are as many as the rows
//! it could offer: the graph would visit them all anyway. A graph search
//! that finds as many rows as asked costs nothing more.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, BooleanArray, RecordBatch, new_null_array};
use datafusion::arrow::datatypes::{Float32Type, Schema};
use datafusion::physical_expr::utils::collect_columns;
use datafusion::physical_plan::PhysicalExpr;
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder};
use futures::TryStreamExt;

use super::ShardSnapshot;
use crate::error::{Error, Result};
use crate::memtable::MemLayer;
use crate::schema::{Metric, owned_row, vector_fault};
use crate::sstable::{ReadMetrics, SstableFile, VectorColumnData, deletions_complete};

/// A layer that could offer fewer rows than this (live rows, or rows the
/// filter matches) is searched exactly: a scan of that many vectors costs
/// about what a graph search does.
pub const EXACT_BELOW_ROWS: u64 = 256;

/// One vector search.
#[derive(Debug, Clone)]
pub struct VectorQuery {
    /// The vector column (an index into the table schema).
    pub column: usize,
    /// The query vector (as long as the column's dimension, finite).
    pub vector: Vec<f32>,
    /// How many rows to return.
    pub k: usize,
    /// The graph searches' candidate list size (at least `k`).
    pub ef: usize,
    /// Rows must match this (evaluated on stored rows; the table's columns
    /// come first there, so an expression over the table schema applies).
    pub filter: Option<Arc<dyn PhysicalExpr>>,
}

/// A row found by a search: its distance and the row (stored form).
#[derive(Debug, Clone)]
pub struct Neighbour {
    /// Distance to the query as users see it ([`crate::Metric::reported`]).
    pub distance: f32,
    /// The row, one-row batch in stored form (long blob values not read
    /// back: see [`ShardSnapshot::read_blobs`]).
    pub row: RecordBatch,
}

/// A row a layer offers: its distance and the row itself (a MemTable's)
/// or its position in the SSTable (read only if the row is used).
struct Candidate {
    distance: f32,
    row: Option<RecordBatch>,
    position: usize,
}

/// What one layer offered.
struct Offer {
    /// Nearest first.
    found: Vec<Candidate>,
    /// Whether the layer holds no further matching row.
    exhausted: bool,
    /// Whether a graph was searched, and whether the rows were compared
    /// exactly (no graph, or it found fewer than asked): both can hold.
    walked_graph: bool,
    scanned: bool,
}

/// What a vector search records for `EXPLAIN ANALYZE` (DataFusion metric
/// counters; clones count into the same ones, and a default one counts
/// for nobody).
#[derive(Debug, Clone, Default)]
pub struct SearchMetrics {
    /// The layers searched: MemTables, and SSTables.
    pub memtable_layers: Count,
    /// See [`SearchMetrics::memtable_layers`].
    pub sstable_layers: Count,
    /// Layer searches that walked a graph.
    pub graph_searches: Count,
    /// Layer searches that compared every row the layer could offer (a
    /// small layer, one without a graph, or a graph that found fewer than
    /// asked).
    pub exact_scans: Count,
    /// Candidates dropped because a newer layer holds their key (in the
    /// round that answered).
    pub superseded: Count,
    /// Rounds after the first: every layer asked again for twice as many
    /// candidates, the drops having left too few.
    pub more_rounds: Count,
    /// What the search read (its bytes): the SSTables' vector columns and
    /// graphs (once per SSTable, then cached), the columns a filter reads
    /// and their blob values, the candidate rows, and the lookups of
    /// newer versions of their keys.
    pub read: ReadMetrics,
}

impl SearchMetrics {
    /// Counters registered in `set` for `partition`.
    pub fn new(set: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        let counter = |name: &'static str| MetricBuilder::new(set).counter(name, partition);
        Self {
            memtable_layers: counter("memtable_layers"),
            sstable_layers: counter("sstable_layers"),
            graph_searches: counter("graph_searches"),
            exact_scans: counter("exact_scans"),
            superseded: counter("superseded"),
            more_rounds: counter("more_rounds"),
            // Only what a search's reads can show: no lookup prunes here.
            read: ReadMetrics {
                bytes_read: counter("bytes_read"),
                ..ReadMetrics::default()
            },
        }
    }
}

/// What a search needs of one layer, computed once per search: the
/// filter's verdict per row, how many rows the layer could offer at most
/// (`admissible`: rows that match the filter and, in an SSTable, are live)
/// and, for an SSTable, its vectors.
enum Layer<'a> {
    Memtable {
        layer: &'a MemLayer,
        matches: Option<Vec<BooleanArray>>,
        admissible: usize,
    },
    Sstable {
        file: &'a SstableFile,
        vectors: Arc<VectorColumnData>,
        matches: Option<Vec<bool>>,
        admissible: usize,
    },
}

/// Whether a layer that could offer `admissible` rows is searched through
/// its graph for `fetch` of them with a candidate list of `ef`: not when
/// it is small, nor when the candidates asked for are as many as its rows
/// (an exact scan is then cheaper than a graph walk, and complete).
fn through_graph(admissible: usize, fetch: usize, ef: usize) -> bool {
    admissible as u64 >= EXACT_BELOW_ROWS && fetch.max(ef) < admissible
}

impl ShardSnapshot {
    /// The `query.k` rows nearest to the query vector among the visible,
    /// live rows of the shard matching the filter, nearest first, with
    /// exact distances: `min(k, matching live rows)` of them (rows without
    /// a vector are never found). The set is approximate where a graph
    /// serves a layer; the count is not (see the module doc).
    ///
    /// A query vector of another dimension than the column's, or one that
    /// could not be stored (a value not finite, or a squared length
    /// outside `f32`'s normal range), is an [`Error::InvalidInput`]. Distances are the
    /// column metric's [`Metric::reported`] ones (Euclidean for `l2`).
    pub async fn vector_search(&self, query: &VectorQuery) -> Result<Vec<Neighbour>> {
        self.vector_search_recorded(query, &SearchMetrics::default())
            .await
    }

    /// [`ShardSnapshot::vector_search`], recording what it did in
    /// `metrics`.
    pub(crate) async fn vector_search_recorded(
        &self,
        query: &VectorQuery,
        metrics: &SearchMetrics,
    ) -> Result<Vec<Neighbour>> {
        let mut nearest = self.nearest(query, metrics).await?;
        let metric = self.schema.vectors.iter().find(|v| v.index == query.column);
        if let Some(column) = metric {
            for n in &mut nearest {
                n.distance = column.metric.reported(n.distance);
            }
        }
        Ok(nearest)
    }

    /// [`ShardSnapshot::vector_search`] with the metric's own distances
    /// (squared for `l2`).
    async fn nearest(
        &self,
        query: &VectorQuery,
        metrics: &SearchMetrics,
    ) -> Result<Vec<Neighbour>> {
        let column = self
            .schema
            .vectors
            .iter()
            .find(|v| v.index == query.column)
            .ok_or_else(|| Error::invalid("not a vector column"))?;
        let metric = column.metric;
        if query.vector.len() != column.dim as usize {
            return Err(Error::invalid(format!(
                "the query vector has {} values, the column has dimension {}",
                query.vector.len(),
                column.dim
            )));
        }
        if let Some(fault) = vector_fault(&query.vector) {
            return Err(Error::invalid(format!("the query vector holds {fault}")));
        }
        if query.k == 0 {
            return Ok(Vec::new());
        }
        // Blob columns the filter does not read: their packed values stay
        // unread when it runs on MemTable rows.
        let unread: Vec<usize> = match &query.filter {
            Some(filter) => {
                let read = collect_columns(filter);
                let reads = |i: usize| read.iter().any(|c| c.index() == i);
                let blobs = self.schema.blobs.iter().map(|b| b.index);
                blobs.filter(|&i| !reads(i)).collect()
            }
            None => Vec::new(),
        };
        // Newest first: MemTables, then SSTables.
        let mut layers = Vec::new();
        for layer in self.memtables.iter().rev() {
            let rows = layer.memtable.rows_within(layer.batches) as usize;
            let (matches, admissible) = match &query.filter {
                Some(filter) => {
                    let mut matches = Vec::new();
                    for b in layer.memtable.batches(0, layer.batches) {
                        let matched = self.filter_memtable(filter, b.batch, &unread, metrics);
                        matches.push(matched.await?);
                    }
                    let admissible = matches.iter().map(BooleanArray::true_count).sum();
                    (Some(matches), admissible)
                }
                None => (None, rows),
            };
            layers.push(Layer::Memtable {
                layer,
                matches,
                admissible,
            });
        }
        // With complete deletion vectors a marked row is an old version:
        // never offered, and no newer SSTable need be asked about the
        // others.
        let marked = deletions_complete(&self.sstables);
        for file in self.sstables.iter().rev() {
            let mut matches = match &query.filter {
                Some(filter) => Some(self.filter_sstable(file, filter, metrics).await?),
                None => None,
            };
            if marked && let Some(marks) = self.reader.deletions(file).await? {
                let m = matches.get_or_insert_with(|| vec![true; file.rows as usize]);
                for row in marks.iter() {
                    m[row as usize] = false;
                }
            }
            let vectors = (self.reader)
                .vector_column(file, query.column, &metrics.read)
                .await?;
            let admissible = match &matches {
                Some(m) => (m.iter().zip(&vectors.live))
                    .filter(|(m, l)| **m && **l)
                    .count(),
                None => vectors.live_rows,
            };
            layers.push(Layer::Sstable {
                file,
                vectors,
                matches,
                admissible,
            });
        }
        let memtables = self.memtables.len();
        metrics.memtable_layers.add(memtables);
        metrics.sstable_layers.add(layers.len() - memtables);
        let mut fetch = query.k;
        loop {
            let offers: Vec<Offer> = layers
                .iter()
                .map(|layer| match layer {
                    Layer::Memtable {
                        layer,
                        matches,
                        admissible,
                    } => self.search_memtable(
                        layer,
                        matches.as_deref(),
                        *admissible,
                        query,
                        metric,
                        fetch,
                    ),
                    Layer::Sstable {
                        vectors,
                        matches,
                        admissible,
                        ..
                    } => Ok(search_sstable(
                        vectors,
                        matches.as_deref(),
                        *admissible,
                        query,
                        metric,
                        fetch,
                    )),
                })
                .collect::<Result<_>>()?;
            for offer in &offers {
                metrics.graph_searches.add(usize::from(offer.walked_graph));
                metrics.exact_scans.add(usize::from(offer.scanned));
            }
            // A candidate is certain only up to the distance where a layer
            // that may hold more stopped.
            let certain_up_to = offers
                .iter()
                .filter(|o| !o.exhausted)
                .filter_map(|o| o.found.last().map(|n| n.distance))
                .fold(f32::INFINITY, f32::min);
            let mut all: Vec<(usize, Candidate)> = offers
                .into_iter()
                .enumerate()
                .flat_map(|(layer, o)| o.found.into_iter().map(move |n| (layer, n)))
                .collect();
            all.sort_by(|a, b| a.1.distance.total_cmp(&b.1.distance));
            // The SSTable rows of the first k certain candidates, read in
            // one pass per file; rows needed beyond them (when some are
            // superseded) are read one at a time.
            let mut wanted: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
            for (at, c) in all
                .iter()
                .take_while(|(_, c)| c.distance <= certain_up_to)
                .take(query.k)
            {
                if c.row.is_none() {
                    wanted.entry(*at).or_default().push(c.position);
                }
            }
            let mut fetched = HashMap::new();
            for (at, mut positions) in wanted {
                let Layer::Sstable { file, vectors, .. } = &layers[at] else {
                    unreachable!("MemTable offers carry rows");
                };
                positions.sort_unstable();
                positions.dedup();
                let decoded = [(query.column, vectors.as_ref())];
                let rows = self
                    .reader
                    .rows_at(file, &positions, &decoded, &metrics.read)
                    .await?;
                fetched.extend(positions.into_iter().map(|p| (at, p)).zip(rows));
            }
            let mut out = Vec::new();
            // Counted for the round that answers: each round goes through
            // the candidates again.
            let mut superseded = 0;
            let mut complete = true;
            for (at, candidate) in all {
                if candidate.distance > certain_up_to {
                    complete = false;
                    break;
                }
                let row = match (candidate.row, &layers[at]) {
                    (Some(row), _) => row,
                    (None, Layer::Sstable { file, vectors, .. }) => {
                        match fetched.remove(&(at, candidate.position)) {
                            Some(row) => row,
                            None => {
                                let decoded = [(query.column, vectors.as_ref())];
                                let at = [candidate.position];
                                let mut rows = self
                                    .reader
                                    .rows_at(file, &at, &decoded, &metrics.read)
                                    .await?;
                                rows.pop().expect("one row")
                            }
                        }
                    }
                    (None, Layer::Memtable { .. }) => unreachable!("MemTable offers carry rows"),
                };
                if self.superseded(&row, at, !marked, &metrics.read).await? {
                    superseded += 1;
                } else {
                    out.push(Neighbour {
                        distance: candidate.distance,
                        row,
                    });
                    if out.len() == query.k {
                        metrics.superseded.add(superseded);
                        return Ok(out);
                    }
                }
            }
            if complete && certain_up_to == f32::INFINITY {
                metrics.superseded.add(superseded);
                return Ok(out);
            }
            metrics.more_rounds.add(1);
            fetch *= 2;
        }
    }

    /// Whether a layer newer than `layer` (0: the newest MemTable) holds a
    /// version of the key of `row` (newer SSTables only if `ask_sstables`).
    async fn superseded(
        &self,
        row: &RecordBatch,
        layer: usize,
        ask_sstables: bool,
        metrics: &ReadMetrics,
    ) -> Result<bool> {
        if !self.schema.has_key() || layer == 0 {
            return Ok(false);
        }
        let encoded = self.schema.encode_keys(row)?;
        let key = self.schema.key_columns(row);
        let memtables = self.memtables.iter().rev();
        let sstables = self.sstables.iter().rev();
        for newer in memtables.take(layer) {
            if newer
                .memtable
                .get_within(&encoded[0], newer.batches)
                .is_some()
            {
                return Ok(true);
            }
        }
        let newer = match ask_sstables {
            true => layer.saturating_sub(self.memtables.len()),
            false => 0,
        };
        for file in sstables.take(newer) {
            if self.reader.lookup(file, &key, metrics).await?.is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The `fetch` nearest rows `layer` offers: through its graph, or
    /// exactly (see [`through_graph`]), or exactly after its graph found
    /// fewer (the graph did not reach them all).
    fn search_memtable(
        &self,
        layer: &MemLayer,
        matches: Option<&[BooleanArray]>,
        admissible: usize,
        query: &VectorQuery,
        metric: Metric,
        fetch: usize,
    ) -> Result<Offer> {
        let memtable = &layer.memtable;
        let batches = memtable.batches(0, layer.batches);
        let cap = memtable.rows_within(layer.batches);
        // The batch holding `row`.
        let locate = |row: u64| batches.partition_point(|b| b.first_row <= row) - 1;
        let keyed = self.schema.has_key();
        let admits = |row: u64| {
            row < cap
                && (!keyed || memtable.is_newest(row, cap))
                && matches.is_none_or(|m| {
                    let at = locate(row);
                    m[at].value((row - batches[at].first_row) as usize)
                })
        };
        let graph = memtable
            .graph(query.column)
            .filter(|_| through_graph(admissible, fetch, query.ef));
        let found = graph.map(|graph| {
            graph
                .search(&query.vector, fetch, query.ef.max(fetch), &admits)
                .into_iter()
                .map(|h| (h.distance, h.row))
                .collect::<Vec<_>>()
        });
        let walked_graph = found.is_some();
        let (hits, exhausted, scanned) = match found {
            Some(hits) if hits.len() == fetch => (hits, false, false),
            _ => {
                let mut hits = Vec::new();
                for stored in &batches {
                    let vectors = stored.batch.column(query.column).as_fixed_size_list();
                    let values = vectors.values().as_primitive::<Float32Type>();
                    let dim = vectors.value_length() as usize;
                    for i in 0..vectors.len() {
                        let row = stored.first_row + i as u64;
                        if vectors.is_null(i) || !admits(row) {
                            continue;
                        }
                        let start = vectors.value_offset(i) as usize;
                        let v = &values.values()[start..start + dim];
                        hits.push((metric.distance(&query.vector, v), row));
                    }
                }
                let exhausted = hits.len() <= fetch;
                top(&mut hits, fetch);
                (hits, exhausted, true)
            }
        };
        let found = hits
            .into_iter()
            .map(|(distance, row)| {
                let b = &batches[locate(row)];
                Ok(Candidate {
                    distance,
                    row: Some(owned_row(&b.batch, (row - b.first_row) as usize)?),
                    position: 0,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Offer {
            found,
            exhausted,
            walked_graph,
            scanned,
        })
    }

    /// `filter` on a MemTable batch (stored form), with the packed values
    /// of the blob columns it reads (all but `unread`) read back first.
    async fn filter_memtable(
        &self,
        filter: &Arc<dyn PhysicalExpr>,
        batch: RecordBatch,
        unread: &[usize],
        metrics: &SearchMetrics,
    ) -> Result<BooleanArray> {
        let batch = match unread.len() == self.schema.blobs.len() {
            true => batch,
            false => {
                let every: Vec<usize> = (0..batch.num_columns()).collect();
                (self.packs.counting(&metrics.read.bytes_read))
                    .resolve_except(&self.schema, &every, batch, unread)
                    .await?
            }
        };
        evaluate(filter, &batch)
    }

    /// `filter` on every row of `file`, in file order, reading only the
    /// columns it refers to (and the packed values of a blob column among
    /// them).
    async fn filter_sstable(
        &self,
        file: &SstableFile,
        filter: &Arc<dyn PhysicalExpr>,
        metrics: &SearchMetrics,
    ) -> Result<Vec<bool>> {
        let stored = &self.schema.stored;
        // The same columns, every one nullable, for the stand-ins.
        let nullable: Arc<Schema> = Arc::new(Schema::new(
            stored
                .fields()
                .iter()
                .map(|f| f.as_ref().clone().with_nullable(true))
                .collect::<Vec<_>>(),
        ));
        let mut columns: Vec<usize> = collect_columns(filter).iter().map(|c| c.index()).collect();
        // A blob column's long values are read back through its
        // descriptors.
        for blob in &self.schema.blobs {
            if columns.contains(&blob.index) {
                columns.push(blob.descriptor);
            }
        }
        columns.sort_unstable();
        columns.dedup();
        if columns.is_empty() {
            // A constant filter: one column for the row count.
            columns.push(stored.fields().len() - 1);
        }
        let mut stream = self
            .reader
            .stream(file, None, &columns, &metrics.read)
            .await?;
        let packs = self.packs.counting(&metrics.read.bytes_read);
        let mut out = Vec::new();
        while let Some(batch) = stream.try_next().await? {
            let batch = packs.resolve(&self.schema, &columns, batch).await?;
            // The filter's column indices are into the stored schema:
            // every other column is a stand-in of nulls.
            let rows = batch.num_rows();
            let full: Vec<_> = stored
                .fields()
                .iter()
                .enumerate()
                .map(|(i, f)| match columns.binary_search(&i) {
                    Ok(at) => Arc::clone(batch.column(at)),
                    Err(_) => new_null_array(f.data_type(), rows),
                })
                .collect();
            let full = RecordBatch::try_new(Arc::clone(&nullable), full)?;
            out.extend(evaluate(filter, &full)?.values().iter());
        }
        Ok(out)
    }
}

/// The `fetch` nearest rows an SSTable offers, over its decoded vectors:
/// through its graphs, or exactly (see [`through_graph`]) when it has none,
/// or exactly after its graphs found fewer (they did not reach them all).
fn search_sstable(
    data: &VectorColumnData,
    matches: Option<&[bool]>,
    admissible: usize,
    query: &VectorQuery,
    metric: Metric,
    fetch: usize,
) -> Offer {
    let admits = |p: usize| data.live[p] && matches.is_none_or(|m| m[p]);
    let graphs = !data.graphs.is_empty() && through_graph(admissible, fetch, query.ef);
    // Each graph over its own rows; the nearest of all of them.
    let found = graphs.then(|| {
        let mut hits: Vec<(f32, u64)> = data
            .graphs
            .iter()
            .flat_map(|graph| {
                graph.search(&query.vector, fetch, query.ef.max(fetch), &|p| {
                    admits(p as usize)
                })
            })
            .map(|h| (h.distance, h.row))
            .collect();
        top(&mut hits, fetch);
        hits
    });
    let walked_graph = found.is_some();
    let (hits, exhausted, scanned) = match found {
        Some(hits) if hits.len() == fetch => (hits, false, false),
        _ => {
            let mut hits: Vec<(f32, u64)> = (0..data.live.len())
                .filter(|&p| admits(p))
                .map(|p| (metric.distance(&query.vector, data.vector(p)), p as u64))
                .collect();
            let exhausted = hits.len() <= fetch;
            top(&mut hits, fetch);
            (hits, exhausted, true)
        }
    };
    let found = hits
        .into_iter()
        .map(|(distance, position)| Candidate {
            distance,
            row: None,
            position: position as usize,
        })
        .collect();
    Offer {
        found,
        exhausted,
        walked_graph,
        scanned,
    }
}

/// Keeps the `n` nearest of `hits`, nearest first.
fn top(hits: &mut Vec<(f32, u64)>, n: usize) {
    let by = |a: &(f32, u64), b: &(f32, u64)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
    if hits.len() > n && n > 0 {
        hits.select_nth_unstable_by(n - 1, by);
    }
    hits.truncate(n);
    hits.sort_unstable_by(by);
}

/// `filter` on `batch`, NULL counting as false.
fn evaluate(filter: &Arc<dyn PhysicalExpr>, batch: &RecordBatch) -> Result<BooleanArray> {
    let value = filter.evaluate(batch)?.into_array(batch.num_rows())?;
    let matches = value
        .as_boolean_opt()
        .ok_or_else(|| Error::invalid("a vector search filter must be a boolean expression"))?;
    Ok(match matches.nulls() {
        Some(nulls) => BooleanArray::new(matches.values() & nulls.inner(), None),
        None => matches.clone(),
    })
}
