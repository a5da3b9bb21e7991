//! One snapshot of each shard per statement: every scan and search of a
//! table that one statement plans (its subqueries' included) reads the
//! same snapshot of each shard, taken the first time the statement needs
//! it. Without this, `DELETE FROM t WHERE id > (SELECT max(id) FROM t)`
//! beside another process's inserts read `t` twice, at two moments, and
//! deleted rows the statement never selected.
//!
//! Different shards and tables are snapshotted one after another: a
//! statement over two tables sees each as it was at a slightly different
//! moment (memwal has no clock across shards).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::execution::context::QueryPlanner;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};
use futures::{StreamExt, TryStreamExt};
use tokio::sync::OnceCell;

use crate::error::Result;
use crate::memtable::Watermark;
use crate::read::ShardSnapshot;
use crate::table::Table;

/// Snapshots taken at the same time by [`snapshots`].
const SNAPSHOTS_IN_FLIGHT: usize = 32;

tokio::task_local! {
    /// The snapshots of the statement being planned, by table location
    /// and shard.
    static STATEMENT: Arc<Snapshots>;
}

type Snapshots = Mutex<HashMap<(String, u32), Arc<OnceCell<ShardSnapshot>>>>;

/// DataFusion's physical planner, planning each statement with snapshots
/// of its own (see the module doc).
#[derive(Debug)]
pub(super) struct StatementPlanner;

#[async_trait]
impl QueryPlanner for StatementPlanner {
    async fn create_physical_plan(
        &self,
        plan: &LogicalPlan,
        session: &dyn Session,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        one_statement(DefaultPhysicalPlanner::default().create_physical_plan(plan, session)).await
    }
}

/// Runs `planning` as the planning of one statement (see the module doc),
/// or as part of the statement being planned, if one is (DataFusion plans
/// a scalar subquery through the session's planner again).
pub(super) async fn one_statement<T>(planning: impl Future<Output = T>) -> T {
    match STATEMENT.try_with(|_| ()) {
        Ok(()) => planning.await,
        Err(_) => STATEMENT.scope(Arc::default(), planning).await,
    }
}

/// The snapshots of `shards` of `table`, in that order: while a statement
/// is planned, the ones it took before (taking those it has not); else as
/// [`Table::snapshots`].
pub(super) async fn snapshots(
    table: &Table,
    shards: impl IntoIterator<Item = u32>,
) -> Result<Vec<ShardSnapshot>> {
    let Ok(statement) = STATEMENT.try_with(Arc::clone) else {
        return table.snapshots(shards).await;
    };
    let cells: Vec<(u32, Arc<OnceCell<ShardSnapshot>>)> = {
        let mut taken = statement.lock().expect("statement snapshots poisoned");
        shards
            .into_iter()
            .map(|shard| {
                let key = (table.location().to_string(), shard);
                (shard, Arc::clone(taken.entry(key).or_default()))
            })
            .collect()
    };
    futures::stream::iter(cells)
        .map(|(shard, cell)| async move {
            let snapshot = cell
                .get_or_try_init(|| table.snapshot(shard, Duration::ZERO))
                .await?;
            Ok(snapshot.clone())
        })
        .buffered(SNAPSHOTS_IN_FLIGHT)
        .try_collect()
        .await
}

/// How far the snapshots the statement being planned took of each shard
/// of `table` reach (`None` for a shard it took none of, or outside a
/// statement): the versions a DELETE it plans may delete (see
/// [`Table::delete_seen`]).
pub(super) fn seen(table: &Table) -> Vec<Option<Watermark>> {
    let taken = STATEMENT.try_with(|statement| {
        let taken = statement.lock().expect("statement snapshots poisoned");
        (0..table.shard_count() as u32)
            .map(|shard| {
                let cell = taken.get(&(table.location().to_string(), shard))?;
                cell.get()?.seen
            })
            .collect()
    });
    taken.unwrap_or_else(|_| vec![None; table.shard_count()])
}
