//! What memwal's operators share: plan properties and streams built from
//! futures, measured with DataFusion's baseline metrics.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning};
use datafusion::physical_plan::PlanProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::BaselineMetrics;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::{StreamExt, TryStreamExt};

/// Properties of a bounded plan with `partitions` unknown partitions.
pub(crate) fn properties(
    schema: SchemaRef,
    partitions: usize,
    emission: EmissionType,
) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(schema),
        Partitioning::UnknownPartitioning(partitions),
        emission,
        Boundedness::Bounded,
    ))
}

/// A stream of the batches one future produces.
pub(super) fn stream_of(
    schema: SchemaRef,
    batches: impl Future<Output = crate::Result<Vec<RecordBatch>>> + Send + 'static,
) -> SendableRecordBatchStream {
    let stream = futures::stream::once(batches)
        .map_ok(|batches| futures::stream::iter(batches.into_iter().map(Ok)))
        .map_err(datafusion::error::DataFusionError::from)
        .try_flatten();
    Box::pin(RecordBatchStreamAdapter::new(schema, stream))
}

/// `inner`, its output rows and compute time recorded in `metrics`.
pub(super) fn observed(
    mut inner: SendableRecordBatchStream,
    metrics: BaselineMetrics,
) -> SendableRecordBatchStream {
    let schema = inner.schema();
    let stream = futures::stream::poll_fn(move |cx| {
        let timer = metrics.elapsed_compute().timer();
        let poll = inner.poll_next_unpin(cx);
        timer.done();
        metrics.record_poll(poll)
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, stream))
}
