//! Queries across worker processes, on datafusion-distributed: a session
//! opened with [`crate::SessionBuilder::workers`] plans each query in
//! stages and sends them to `memwal worker` processes ([`serve_worker`])
//! on the same root.
//!
//! - A full scan splits into tasks by its parts (each a shard, or a key
//!   range of one): no key is in two parts, so every version of a key is
//!   merged in one task. Each task carries the snapshot the coordinator
//!   planned against (see [`MemwalCodec`]): SSTables by name, MemTable rows
//!   shipped with the task, so a worker sees rows that live only in the
//!   coordinator's MemTables, and nothing committed after planning.
//! - A `vector_search` splits into tasks by shard, each searching its
//!   shards (graphs of SSTables loaded on the worker; the coordinator's
//!   MemTable rows, shipped, searched exactly); the coordinator merges
//!   their nearest rows into the global top `k`. One that selects a blob
//!   column runs as one task (see `vector.rs`).
//! - Key lookups run as one task.
//! - Statements that write (`INSERT`, `DELETE`, DDL) run on the
//!   coordinator; the scans they read from may run on workers.
//! - A worker that stops answering fails the queries that wait on it
//!   within about half a minute (an unanswered HTTP/2 ping closes its
//!   connection).

mod channels;
mod codec;

use std::future::Future;
use std::sync::Arc;

use datafusion::error::Result;
use datafusion::execution::{FunctionRegistry, SessionStateBuilder};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_distributed::{
    DesiredTaskCountEvent, DesiredTaskCountEventResponse, DistributedExt, DistributedLeafExec,
    ScaleUpLeafNodeEvent, ScaleUpLeafNodeEventResponse, SessionStateBuilderExt, Worker,
    WorkerQueryContext, WorkerResolver,
};
use url::Url;

pub use codec::MemwalCodec;

use channels::Channels;
pub(crate) use channels::check_worker_url;

use super::scan_exec::{ScanExec, ScanMode, ScanPlan};
use super::session::memwal_functions;
use super::vector_search_exec::VectorSearchExec;
use crate::read::ScanPart;
use crate::store::ObjectRoot;
use crate::table::TableCache;
use crate::writer::WriterOptions;

/// Workers at fixed URLs.
#[derive(Debug, Clone)]
struct Workers(Vec<Url>);

impl WorkerResolver for Workers {
    fn get_urls(&self) -> Result<Vec<Url>> {
        Ok(self.0.clone())
    }
}

/// `builder` with queries planned across `workers`, whose tasks carry
/// memwal's operators encoded by `codec`.
pub(crate) fn coordinate(
    builder: SessionStateBuilder,
    workers: Vec<Url>,
    codec: MemwalCodec,
) -> SessionStateBuilder {
    builder
        .with_distributed_worker_resolver(Workers(workers))
        .with_distributed_planner()
        .with_distributed_user_codec(codec)
        .with_distributed_channel_resolver(Channels::default())
        .with_distributed_desired_task_count_handler(desired_tasks)
        .with_distributed_scale_up_leaf_node_handler(split_leaf)
}

/// A full scan wants a task per part, a vector search one per partition;
/// key lookups one.
fn desired_tasks(ev: DesiredTaskCountEvent) -> Option<Result<DesiredTaskCountEventResponse>> {
    if let Some(search) = ev.plan.downcast_ref::<VectorSearchExec>() {
        let partitions = search.properties().partitioning.partition_count();
        return Some(Ok(DesiredTaskCountEventResponse::desired(partitions)));
    }
    let scan = ev.plan.downcast_ref::<ScanExec>()?;
    let plan = scan.plan();
    Some(Ok(match plan.mode {
        ScanMode::All => DesiredTaskCountEventResponse::desired(plan.parts.len()),
        ScanMode::Keys(_) => DesiredTaskCountEventResponse::maximum(1),
    }))
}

/// `items` split into `tasks` runs of consecutive items, about as many
/// each, padded with `filler` to the same length.
fn shares<T: Clone>(items: &[T], tasks: usize, filler: T) -> Vec<Vec<T>> {
    let n = items.len();
    let mut shares: Vec<Vec<T>> = (0..tasks)
        .map(|t| items[t * n / tasks..(t + 1) * n / tasks].to_vec())
        .collect();
    let width = shares.iter().map(Vec::len).max().unwrap_or(0).max(1);
    (shares.iter_mut()).for_each(|share| share.resize(width, filler.clone()));
    shares
}

/// A scan split into `task_count` scans of consecutive parts (padded with
/// empty parts to the same partition count); a vector search likewise by
/// its partitions.
fn split_leaf(ev: ScaleUpLeafNodeEvent) -> Option<Result<ScaleUpLeafNodeEventResponse>> {
    let tasks = ev.task_count.max(1);
    let variants: Result<Vec<Arc<dyn ExecutionPlan>>> =
        if let Some(search) = ev.plan.downcast_ref::<VectorSearchExec>() {
            let partitions = search.parts().5;
            (shares(partitions, tasks, Vec::new()).into_iter())
                .map(|p| Ok(Arc::new(search.with_partitions(p)?) as Arc<dyn ExecutionPlan>))
                .collect()
        } else {
            let scan = ev.plan.downcast_ref::<ScanExec>()?;
            Ok(split_scan(scan.plan(), tasks)?
                .into_iter()
                .map(|share| Arc::new(ScanExec::assemble(share)) as Arc<dyn ExecutionPlan>)
                .collect())
        };
    Some(variants.and_then(|variants| {
        DistributedLeafExec::try_new(Arc::clone(ev.plan), variants)
            .map(|leaf| ScaleUpLeafNodeEventResponse::new(Arc::new(leaf)))
    }))
}

/// `plan` split into `tasks` scans.
fn split_scan(plan: ScanPlan, tasks: usize) -> Option<Vec<ScanPlan>> {
    Some(match &plan.mode {
        ScanMode::All => {
            let (shard, first) = plan.parts.first()?;
            let filler = (*shard, ScanPart::empty(first.snapshot().clone()));
            (shares(&plan.parts, tasks, filler).into_iter())
                .map(|parts| ScanPlan {
                    parts,
                    ..plan.clone()
                })
                .collect()
        }
        // The first task looks the keys up; the others look up none.
        ScanMode::Keys(keys) => (0..tasks)
            .map(|t| ScanPlan {
                mode: ScanMode::Keys(match t {
                    0 => keys.clone(),
                    _ => keys.slice(0, 0),
                }),
                ..plan.clone()
            })
            .collect(),
    })
}

/// Serves the tasks of distributed queries over `root` (the root their
/// coordinators' sessions are on) on `listener`, until `shutdown`
/// completes. Tables are opened read-only as the tasks name them.
pub async fn serve_worker(
    root: ObjectRoot,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> crate::Result<()> {
    let tables = TableCache::shared(root.url(), WriterOptions::default());
    let codec = MemwalCodec::new(Arc::clone(root.store()), tables);
    // Shared by every query's session: stages read from other workers
    // over these connections.
    let channels = Channels::default();
    let worker = Worker::from_session_builder(move |ctx: WorkerQueryContext| {
        let (codec, channels) = (codec.clone(), channels.clone());
        async move {
            let mut state = ctx
                .builder
                .with_distributed_user_codec(codec)
                .with_distributed_channel_resolver(channels)
                .build();
            for function in memwal_functions() {
                state.register_udf(Arc::new(function))?;
            }
            Ok(state)
        }
    });
    // Replies go out as they are written: Nagle's algorithm against the
    // coordinator's delayed ACKs costs tens of milliseconds per exchange.
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    // A coordinator that vanishes without closing its connection stops
    // answering pings: its tasks here end.
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(channels::PING_EVERY))
        .http2_keepalive_timeout(Some(channels::PING_TIMEOUT))
        .add_service(worker.into_worker_server())
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| std::io::Error::other(format!("the worker stopped: {e}")).into())
}
