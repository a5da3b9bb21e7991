//! The read path over one shard's layers (DESIGN.md §7): the newest
//! version of each key, tombstones dropped, and the durable WAL as seen by
//! a process that does not write the shard.

mod wal_tail;

use std::collections::HashSet;

use datafusion::arrow::array::{RecordBatch, UInt32Array};
use datafusion::arrow::compute::take_record_batch;
use datafusion::arrow::row::{RowConverter, SortField};

pub use wal_tail::WalTail;

use crate::error::Result;
use crate::memtable::TableSchema;

/// The live rows of `batches` (stored form, oldest first): for a table with
/// a key, the newest row of each key unless it is a tombstone; for an
/// append-only table, every row. User form, in the order the rows were put.
pub fn newest_live_rows(schema: &TableSchema, batches: &[RecordBatch]) -> Result<Vec<RecordBatch>> {
    if !schema.has_key() {
        return batches.iter().map(|b| schema.to_user(b)).collect();
    }
    let fields = schema
        .key
        .iter()
        .map(|&k| SortField::new(schema.schema.field(k).data_type().clone()))
        .collect();
    let converter = RowConverter::new(fields)?;
    let keys = batches
        .iter()
        .map(|b| converter.convert_columns(&schema.key_columns(b)))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let total = batches.iter().map(RecordBatch::num_rows).sum();
    let mut seen = HashSet::with_capacity(total);
    let mut live = vec![Vec::new(); batches.len()];
    for (i, batch) in batches.iter().enumerate().rev() {
        let tombstones = schema.tombstone_flags(batch);
        for row in (0..batch.num_rows()).rev() {
            if seen.insert(keys[i].row(row)) && !tombstones.value(row) {
                live[i].push(row as u32);
            }
        }
        live[i].reverse();
    }
    batches
        .iter()
        .zip(live)
        .filter(|(_, rows)| !rows.is_empty())
        .map(|(batch, rows)| {
            let rows = take_record_batch(batch, &UInt32Array::from(rows))?;
            schema.to_user(&rows)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::TableMeta;
    use datafusion::arrow::array::{AsArray, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use std::sync::Arc;

    #[test]
    fn newest_wins_and_tombstones_hide_older_versions() {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ]);
        let t = TableSchema::new(&TableMeta::new(&schema, vec!["id".into()], &[]).unwrap());
        let rows = |ids: Vec<i64>, vs: Vec<i64>| {
            let b = RecordBatch::try_new(
                Arc::clone(&t.schema),
                vec![
                    Arc::new(Int64Array::from(ids)),
                    Arc::new(Int64Array::from(vs)),
                ],
            )
            .unwrap();
            t.to_stored(&b).unwrap()
        };
        let batches = vec![
            rows(vec![1, 2, 3], vec![10, 20, 30]),
            rows(vec![2, 2], vec![21, 22]),
            t.tombstones(
                &RecordBatch::try_new(
                    Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)])),
                    vec![Arc::new(Int64Array::from(vec![3]))],
                )
                .unwrap(),
            )
            .unwrap(),
        ];
        let live = newest_live_rows(&t, &batches).unwrap();
        let pairs: Vec<(i64, i64)> = live
            .iter()
            .flat_map(|b| {
                let ids = b.column(0).as_primitive::<Int64Type>().clone();
                let vs = b.column(1).as_primitive::<Int64Type>().clone();
                (0..b.num_rows()).map(move |i| (ids.value(i), vs.value(i)))
            })
            .collect();
        assert_eq!(pairs, [(1, 10), (2, 22)]);
        assert_eq!(live[0].schema(), t.schema);
    }
}
