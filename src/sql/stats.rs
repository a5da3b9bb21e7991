//! `memwal_stats(table)`: one row per shard of a table with its writer's
//! live counters ([`WriterStats`]): the WAL queue, the durable, visible and
//! indexed batches, MemTables, SSTables, the last flush and compaction and
//! the WAL append latency. A shard whose writer is not open in this
//! process has `writer_open = false` and NULL counters (the function never
//! opens a writer: that would take the shard from another process).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Float64Array, RecordBatch, TimestampMillisecondArray, UInt32Array,
    UInt64Array,
};
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::plan_err;
use datafusion::datasource::MemTable;
use datafusion::error::Result;

use super::function_args::{constant, named_table, text};
use crate::catalog::Catalog;
use crate::table::TableCache;
use crate::writer::WriterStats;

const FUNCTION: &str = "memwal_stats";

/// `memwal_stats(table)`.
#[derive(Debug)]
pub(super) struct StatsFunction {
    catalog: Arc<Catalog>,
    tables: Arc<TableCache>,
}

impl StatsFunction {
    /// The function over the tables of `catalog`, opened in `tables`.
    pub(super) fn new(catalog: Arc<Catalog>, tables: Arc<TableCache>) -> Self {
        Self { catalog, tables }
    }
}

/// The UInt64 column of `f` of each shard's counters.
fn counts(stats: &[Option<WriterStats>], f: fn(&WriterStats) -> u64) -> ArrayRef {
    Arc::new(UInt64Array::from_iter(
        stats.iter().map(|s| s.as_ref().map(f)),
    ))
}

/// The Float64 column of `f` in milliseconds.
fn millis(stats: &[Option<WriterStats>], f: fn(&WriterStats) -> Duration) -> ArrayRef {
    // Whole microseconds: 0.14, not 0.13999999999999999.
    let ms = |s: &WriterStats| f(s).as_micros() as f64 / 1e3;
    Arc::new(Float64Array::from_iter(
        stats.iter().map(|s| s.as_ref().map(ms)),
    ))
}

/// The UTC timestamp column of `f`.
fn times(stats: &[Option<WriterStats>], f: fn(&WriterStats) -> Option<SystemTime>) -> ArrayRef {
    let ms = |s: &WriterStats| {
        let since = f(s)?.duration_since(SystemTime::UNIX_EPOCH).ok()?;
        i64::try_from(since.as_millis()).ok()
    };
    let array = TimestampMillisecondArray::from_iter(stats.iter().map(|s| s.as_ref().and_then(ms)));
    Arc::new(array.with_timezone("UTC"))
}

impl TableFunctionImpl for StatsFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let [arg] = args.exprs() else {
            return plan_err!(
                "{FUNCTION}(table) takes 1 argument, got {}",
                args.exprs().len()
            );
        };
        let name = text(constant(args.session(), arg, FUNCTION)?, "table", FUNCTION)?;
        let (_, table) = named_table(&self.catalog, &self.tables, &name, args.session(), FUNCTION)?;
        let shards = table.shard_count() as u32;
        let stats = (0..shards)
            .map(|shard| table.stats(shard))
            .collect::<crate::error::Result<Vec<_>>>()?;
        let s = &stats;
        let open = BooleanArray::from_iter(s.iter().map(|s| Some(s.is_some())));
        let columns: Vec<(&str, ArrayRef, bool)> = vec![
            (
                "shard",
                Arc::new(UInt32Array::from_iter_values(0..shards)),
                false,
            ),
            ("writer_open", Arc::new(open), false),
            ("epoch", counts(s, |w| w.epoch), true),
            ("puts", counts(s, |w| w.puts), true),
            ("rows", counts(s, |w| w.rows), true),
            ("wal_queue_rows", counts(s, |w| w.pending_rows), true),
            ("wal_queue_bytes", counts(s, |w| w.pending_bytes), true),
            ("wal_queue_batches", counts(s, |w| w.pending_batches), true),
            ("durable_batches", counts(s, |w| w.durable_batches), true),
            ("visible_batches", counts(s, |w| w.visible_batches), true),
            ("indexed_batches", counts(s, |w| w.indexed_batches), true),
            ("next_wal_position", counts(s, |w| w.next_position), true),
            ("generation", counts(s, |w| w.generation), true),
            ("memtable_bytes", counts(s, |w| w.memtable_bytes), true),
            ("frozen_memtables", counts(s, |w| w.frozen_memtables), true),
            ("sstables", counts(s, |w| w.sstables), true),
            ("flushes", counts(s, |w| w.flushes), true),
            ("compactions", counts(s, |w| w.compactions), true),
            ("last_flush", times(s, |w| w.last_flush), true),
            ("last_compaction", times(s, |w| w.last_compaction), true),
            ("wal_appends", counts(s, |w| w.wal_appends), true),
            ("wal_bytes", counts(s, |w| w.wal_bytes), true),
            ("blob_packs", counts(s, |w| w.blob_packs), true),
            ("blob_pack_bytes", counts(s, |w| w.blob_pack_bytes), true),
            (
                "blob_packs_deleted",
                counts(s, |w| w.blob_packs_deleted),
                true,
            ),
            (
                "blob_pack_bytes_deleted",
                counts(s, |w| w.blob_pack_bytes_deleted),
                true,
            ),
            (
                "blob_packs_repacked",
                counts(s, |w| w.blob_packs_repacked),
                true,
            ),
            (
                "blob_bytes_repacked",
                counts(s, |w| w.blob_bytes_repacked),
                true,
            ),
            ("blob_live_bytes", counts(s, |w| w.blob_live_bytes), true),
            (
                "blob_stored_bytes",
                counts(s, |w| w.blob_stored_bytes),
                true,
            ),
            ("append_p50_ms", millis(s, |w| w.append_latency_p50), true),
            ("append_p99_ms", millis(s, |w| w.append_latency_p99), true),
            ("append_max_ms", millis(s, |w| w.append_latency_max), true),
        ];
        let batch = RecordBatch::try_from_iter_with_nullable(columns)?;
        Ok(Arc::new(MemTable::try_new(
            batch.schema(),
            vec![vec![batch]],
        )?))
    }
}
