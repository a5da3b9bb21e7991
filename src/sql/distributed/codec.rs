//! [`MemwalCodec`]: memwal's operators in the plans a coordinator ships to
//! its workers.
//!
//! A scan travels with the snapshot it was planned against: for each shard
//! it reads, the SSTables of the manifest version it saw (by name: SSTables
//! are immutable, and their deletion is held back by a grace period for
//! readers in other processes) and the MemTable rows it saw (the rows
//! themselves, as Arrow IPC, only to the tasks whose parts read them).
//! So every task reads the coordinator's snapshot, whatever was committed
//! since, and a worker sees rows that live only in the coordinator's
//! MemTables. A `vector_search` travels the same way, each partition with
//! the snapshots of the shards it searches (with their MemTable rows).

use std::collections::HashMap;
use std::io::Cursor;
use std::sync::Arc;

use datafusion::arrow::array::{BooleanArray, Datum, RecordBatch};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::compute::kernels::boolean::and;
use datafusion::arrow::compute::kernels::cmp;
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::physical_plan::{
    PhysicalExtensionCodec, PhysicalPlanDecodeContext, PhysicalProtoConverterExtension,
};
use datafusion_proto::protobuf;
use object_store::ObjectStore;
use prost::Message;

use super::super::scan_exec::{ScanExec, ScanMode, ScanPlan};
use super::super::vector_search_exec::VectorSearchExec;
use crate::read::{KeyBounds, ScanPart, ShardSnapshot, VectorQuery};
use crate::schema::TableMeta;
use crate::table::{Table, TableCache};

/// Encodes memwal's scans and vector searches in distributed plans, and
/// decodes them on a worker against its own handles on the same root (the
/// store the coordinator's tables are in).
#[derive(Debug, Clone)]
pub struct MemwalCodec {
    store: Arc<dyn ObjectStore>,
    tables: Arc<TableCache>,
}

impl MemwalCodec {
    /// Decodes tables of the root `store`, opening them in `tables`.
    pub(crate) fn new(store: Arc<dyn ObjectStore>, tables: Arc<TableCache>) -> Self {
        Self { store, tables }
    }

    /// The table a plan names: this process's handle on it.
    fn table(&self, proto: Option<TableProto>) -> Result<Arc<Table>> {
        let proto = proto.ok_or_else(|| plan_error("an operator without a table".into()))?;
        let location = proto.location.as_str();
        let meta: TableMeta = from_json(&proto.meta, "a plan's table metadata")?;
        let table = self.tables.get_or_open(&self.store, location, &meta, None);
        // A location is never reused: other metadata means another root.
        if table.meta() != &meta {
            return Err(plan_error(format!(
                "the table at '{location}' is not the one the plan names: \
                 is the worker serving the coordinator's root?"
            )));
        }
        Ok(table)
    }
}

/// Which operator a message holds.
#[derive(Clone, PartialEq, Message)]
struct NodeProto {
    #[prost(oneof = "Node", tags = "1, 2")]
    node: Option<Node>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Node {
    #[prost(message, tag = "1")]
    Scan(ScanProto),
    #[prost(message, tag = "2")]
    Search(SearchProto),
}

/// A [`ScanExec`] (see [`ScanPlan`]).
#[derive(Clone, PartialEq, Message)]
struct ScanProto {
    #[prost(message, optional, tag = "1")]
    table: Option<TableProto>,
    #[prost(message, optional, tag = "2")]
    schema: Option<protobuf::Schema>,
    /// `None` is every column.
    #[prost(message, optional, tag = "3")]
    projection: Option<Columns>,
    #[prost(uint64, repeated, tag = "4")]
    sizes: Vec<u64>,
    #[prost(message, optional, tag = "5")]
    early: Option<protobuf::PhysicalExprNode>,
    /// Key lookups: the keys (Arrow IPC); a full scan otherwise.
    #[prost(bytes, optional, tag = "6")]
    keys: Option<Vec<u8>>,
    #[prost(message, repeated, tag = "7")]
    snapshots: Vec<SnapshotProto>,
    #[prost(message, repeated, tag = "8")]
    parts: Vec<PartProto>,
    #[prost(bool, tag = "9")]
    sorted: bool,
}

#[derive(Clone, PartialEq, Message)]
struct TableProto {
    #[prost(string, tag = "1")]
    location: String,
    /// The catalog metadata, as the catalog stores it (JSON).
    #[prost(string, tag = "2")]
    meta: String,
}

#[derive(Clone, PartialEq, Message)]
struct Columns {
    #[prost(uint64, repeated, tag = "1")]
    columns: Vec<u64>,
}

/// One shard's snapshot.
#[derive(Clone, PartialEq, Message)]
struct SnapshotProto {
    #[prost(uint32, tag = "1")]
    shard: u32,
    /// The SSTables, as the shard manifest records them (JSON).
    #[prost(string, tag = "2")]
    sstables: String,
    /// The MemTable rows, stored form (Arrow IPC); empty if no part that
    /// travels with it reads them.
    #[prost(bytes, tag = "3")]
    memtable: Vec<u8>,
}

/// One scan partition: a part of one of the snapshots.
#[derive(Clone, PartialEq, Message)]
struct PartProto {
    #[prost(uint32, tag = "1")]
    snapshot: u32,
    /// The part's [`crate::read::PartLayout`] (JSON).
    #[prost(string, tag = "2")]
    layout: String,
}

/// A [`VectorSearchExec`].
#[derive(Clone, PartialEq, Message)]
struct SearchProto {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, optional, tag = "2")]
    table: Option<TableProto>,
    /// The table's columns and `_distance`.
    #[prost(message, optional, tag = "3")]
    full: Option<protobuf::Schema>,
    #[prost(uint64, repeated, tag = "4")]
    projection: Vec<u64>,
    #[prost(uint64, tag = "5")]
    column: u64,
    #[prost(float, repeated, tag = "6")]
    vector: Vec<f32>,
    #[prost(uint64, tag = "7")]
    k: u64,
    #[prost(uint64, tag = "8")]
    ef: u64,
    #[prost(message, optional, tag = "9")]
    filter: Option<protobuf::PhysicalExprNode>,
    #[prost(message, repeated, tag = "10")]
    partitions: Vec<SearchPartition>,
}

/// The shards one partition of a [`VectorSearchExec`] searches.
#[derive(Clone, PartialEq, Message)]
struct SearchPartition {
    #[prost(message, repeated, tag = "1")]
    shards: Vec<SnapshotProto>,
}

fn plan_error(message: String) -> DataFusionError {
    DataFusionError::Plan(format!("memwal distributed plan: {message}"))
}

fn json<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|e| DataFusionError::External(Box::new(e)))
}

fn from_json<T: serde::de::DeserializeOwned>(text: &str, what: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| plan_error(format!("{what}: {e}")))
}

/// The schema an operator names.
fn schema(proto: Option<&protobuf::Schema>) -> Result<Schema> {
    let proto = proto.ok_or_else(|| plan_error("an operator without a schema".into()))?;
    Ok(proto.try_into()?)
}

fn table_proto(table: &Table) -> Result<TableProto> {
    Ok(TableProto {
        location: table.location().to_string(),
        meta: json(table.meta())?,
    })
}

/// `batches` (of one schema) as an Arrow IPC stream.
fn ipc(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut writer = StreamWriter::try_new(&mut out, schema)?;
    for batch in batches {
        writer.write(batch)?;
    }
    writer.finish()?;
    drop(writer);
    Ok(out)
}

fn from_ipc(bytes: &[u8]) -> Result<Vec<RecordBatch>> {
    let reader = StreamReader::try_new(Cursor::new(bytes), None)?;
    Ok(reader.collect::<std::result::Result<_, _>>()?)
}

/// Shard `shard`'s `snapshot`, with `rows` as its MemTable rows.
fn snapshot_proto(
    shard: u32,
    snapshot: &ShardSnapshot,
    rows: Option<Vec<RecordBatch>>,
) -> Result<SnapshotProto> {
    Ok(SnapshotProto {
        shard,
        sstables: json(snapshot.sstables.as_ref())?,
        memtable: match rows {
            Some(rows) => ipc(&snapshot.schema.stored, &rows)?,
            None => Vec::new(),
        },
    })
}

/// An Arrow comparison kernel.
type Compare = fn(&dyn Datum, &dyn Datum) -> std::result::Result<BooleanArray, ArrowError>;

/// The MemTable rows of `snapshot` that a scan keeping the keys `bounds`
/// needs: those within them (every row for a key of several columns, or
/// when a bound does not compare with the key column). A row left out
/// only unmasks older versions of its key, outside the bounds too, which
/// the filter above the scan drops.
fn memtable_rows(snapshot: &ShardSnapshot, bounds: &KeyBounds) -> Vec<RecordBatch> {
    let batches = snapshot.memtable_batches();
    let [key] = snapshot.schema.key[..] else {
        return batches;
    };
    if *bounds == KeyBounds::all() {
        return batches;
    }
    let within = |batch: &RecordBatch| -> Result<RecordBatch> {
        let column = batch.column(key);
        let mut keep = BooleanArray::from(vec![true; batch.num_rows()]);
        // Each bound with its comparison when it is included, and not.
        let tests: [(_, Compare, Compare); 2] = [
            (&bounds.lower, cmp::gt_eq, cmp::gt),
            (&bounds.upper, cmp::lt_eq, cmp::lt),
        ];
        for (bound, included, excluded) in tests {
            if let Some((value, inclusive)) = bound {
                let value = value.to_scalar()?;
                let test = if *inclusive { included } else { excluded };
                keep = and(&keep, &test(column, &value)?)?;
            }
        }
        Ok(filter_record_batch(batch, &keep)?)
    };
    (batches.into_iter())
        .map(|batch| within(&batch).unwrap_or(batch))
        .filter(|batch| batch.num_rows() > 0)
        .collect()
}

/// The snapshot `proto` describes, of a shard of `table`.
fn snapshot(table: &Table, proto: &SnapshotProto) -> Result<ShardSnapshot> {
    let sstables = from_json(&proto.sstables, "a snapshot's SSTables")?;
    let rows = match proto.memtable.is_empty() {
        true => Vec::new(),
        false => from_ipc(&proto.memtable)?,
    };
    Ok(table.snapshot_of(proto.shard, sstables, rows)?)
}

fn indices(values: &[u64]) -> Vec<usize> {
    values.iter().map(|&v| v as usize).collect()
}

fn numbers(values: &[usize]) -> Vec<u64> {
    values.iter().map(|&v| v as u64).collect()
}

impl MemwalCodec {
    fn encode_scan(
        &self,
        scan: ScanPlan,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<ScanProto> {
        // One snapshot per shard; its MemTable rows if a part reads them.
        let mut snapshots: Vec<SnapshotProto> = Vec::new();
        let mut at: HashMap<u32, usize> = HashMap::new();
        let mut add = |shard: u32, part: Option<&ScanPart>, snapshot: &ShardSnapshot| {
            let index = match at.get(&shard) {
                Some(&i) => i,
                None => {
                    snapshots.push(snapshot_proto(shard, snapshot, None)?);
                    at.insert(shard, snapshots.len() - 1);
                    snapshots.len() - 1
                }
            };
            let reads = part.is_none_or(ScanPart::reads_memtables);
            if reads && snapshots[index].memtable.is_empty() {
                let rows = memtable_rows(snapshot, &scan.bounds);
                snapshots[index].memtable = ipc(&snapshot.schema.stored, &rows)?;
            }
            Ok::<_, DataFusionError>(index as u32)
        };
        let mut parts = Vec::with_capacity(scan.parts.len());
        for (shard, part) in &scan.parts {
            parts.push(PartProto {
                snapshot: add(*shard, Some(part), part.snapshot())?,
                layout: json(&part.layout())?,
            });
        }
        for (shard, snapshot) in scan.snapshots.iter().enumerate() {
            if let Some(snapshot) = snapshot {
                add(shard as u32, None, snapshot)?;
            }
        }
        let keys = match &scan.mode {
            ScanMode::All => None,
            ScanMode::Keys(keys) => Some(ipc(&keys.schema(), std::slice::from_ref(keys))?),
        };
        let early = match &scan.early {
            Some(early) => Some(converter.physical_expr_to_proto(early, self)?),
            None => None,
        };
        Ok(ScanProto {
            table: Some(table_proto(&scan.table)?),
            schema: Some(scan.schema.as_ref().try_into()?),
            projection: scan.projection.as_deref().map(|p| Columns {
                columns: numbers(p),
            }),
            sizes: numbers(&scan.sizes),
            early,
            keys,
            snapshots,
            parts,
            sorted: scan.sorted,
        })
    }

    fn decode_scan(
        &self,
        proto: ScanProto,
        ctx: &TaskContext,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<ScanExec> {
        let table = self.table(proto.table)?;
        let schema = schema(proto.schema.as_ref())?;
        let schema = Arc::new(schema);
        let mut snapshots = Vec::with_capacity(proto.snapshots.len());
        let mut by_shard = vec![None; table.shard_count()];
        for s in &proto.snapshots {
            let snapshot = snapshot(&table, s)?;
            by_shard[s.shard as usize] = Some(snapshot.clone());
            snapshots.push((s.shard, snapshot));
        }
        let mut parts = Vec::with_capacity(proto.parts.len());
        for p in proto.parts {
            let (shard, snapshot) = snapshots
                .get(p.snapshot as usize)
                .ok_or_else(|| plan_error("a part of a missing snapshot".into()))?;
            let layout = from_json(&p.layout, "a scan part")?;
            parts.push((*shard, ScanPart::from_layout(snapshot.clone(), layout)?));
        }
        let mode = match &proto.keys {
            None => ScanMode::All,
            Some(bytes) => {
                let keys = from_ipc(bytes)?;
                let [keys] = <[RecordBatch; 1]>::try_from(keys)
                    .map_err(|_| plan_error("key lookups without one batch of keys".into()))?;
                ScanMode::Keys(keys)
            }
        };
        let early = match &proto.early {
            Some(node) => Some(converter.proto_to_physical_expr(
                node,
                &schema,
                &PhysicalPlanDecodeContext::new(ctx, self),
            )?),
            None => None,
        };
        Ok(ScanExec::assemble(ScanPlan {
            table,
            schema,
            projection: proto.projection.map(|p| indices(&p.columns)),
            sizes: indices(&proto.sizes),
            early,
            mode,
            parts,
            snapshots: match proto.keys {
                Some(_) => by_shard,
                None => Vec::new(),
            },
            sorted: proto.sorted,
            // Only the coordinator leaves rows out by them.
            bounds: KeyBounds::all(),
        }))
    }

    fn encode_search(
        &self,
        search: &VectorSearchExec,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<SearchProto> {
        let (name, table, query, full, projection, partitions) = search.parts();
        let filter = match &query.filter {
            Some(filter) => Some(converter.physical_expr_to_proto(filter, self)?),
            None => None,
        };
        Ok(SearchProto {
            name: name.to_string(),
            table: Some(table_proto(table)?),
            full: Some(full.as_ref().try_into()?),
            projection: numbers(projection),
            column: query.column as u64,
            vector: query.vector.clone(),
            k: query.k as u64,
            ef: query.ef as u64,
            filter,
            partitions: (partitions.iter())
                .map(|shards| {
                    let shards = (shards.iter())
                        .map(|(shard, s)| snapshot_proto(*shard, s, Some(s.memtable_batches())));
                    Ok(SearchPartition {
                        shards: shards.collect::<Result<_>>()?,
                    })
                })
                .collect::<Result<_>>()?,
        })
    }

    fn decode_search(
        &self,
        proto: SearchProto,
        ctx: &TaskContext,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<VectorSearchExec> {
        let table = self.table(proto.table)?;
        let full = schema(proto.full.as_ref())?;
        let filter = match &proto.filter {
            Some(node) => Some(converter.proto_to_physical_expr(
                node,
                &table.table_schema().schema,
                &PhysicalPlanDecodeContext::new(ctx, self),
            )?),
            None => None,
        };
        let query = VectorQuery {
            column: proto.column as usize,
            vector: proto.vector,
            k: proto.k as usize,
            ef: proto.ef as usize,
            filter,
        };
        let partitions = (proto.partitions.iter())
            .map(|p| {
                (p.shards.iter())
                    .map(|s| Ok((s.shard, snapshot(&table, s)?)))
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<_>>()?;
        VectorSearchExec::new(
            proto.name,
            table,
            query,
            &Arc::new(full),
            indices(&proto.projection),
            partitions,
        )
    }
}

impl PhysicalExtensionCodec for MemwalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if !inputs.is_empty() {
            return Err(plan_error(format!(
                "memwal's operators have no inputs, got {}",
                inputs.len()
            )));
        }
        let proto = NodeProto::decode(buf).map_err(|e| plan_error(e.to_string()))?;
        Ok(match proto.node {
            Some(Node::Scan(scan)) => Arc::new(self.decode_scan(scan, ctx, converter)?),
            Some(Node::Search(search)) => Arc::new(self.decode_search(search, ctx, converter)?),
            None => return Err(plan_error("an empty memwal operator".into())),
        })
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        let node = if let Some(scan) = node.downcast_ref::<ScanExec>() {
            Node::Scan(self.encode_scan(scan.plan(), converter)?)
        } else if let Some(search) = node.downcast_ref::<VectorSearchExec>() {
            Node::Search(self.encode_search(search, converter)?)
        } else {
            return Err(DataFusionError::NotImplemented(format!(
                "{} cannot run on a memwal worker",
                node.name()
            )));
        };
        NodeProto { node: Some(node) }
            .encode(buf)
            .map_err(|e| plan_error(e.to_string()))
    }
}
