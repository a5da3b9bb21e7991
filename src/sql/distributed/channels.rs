//! [`Channels`]: the connections of a coordinator (or a worker) to the
//! workers it sends tasks to, one per worker, kept and reused, and closed
//! with an error once a worker stops answering: a query then fails instead
//! of waiting for it forever. A worker whose runtime is starved for longer
//! than [`PING_TIMEOUT`] counts as one that stopped answering. An error
//! in a worker's response (a lost connection, an unanswered ping) names
//! the worker.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::common::exec_datafusion_err;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion_distributed::{
    ChannelResolver, CoordinatorToWorkerMsg, ExecuteTaskRequest, GetWorkerInfoRequest,
    GetWorkerInfoResponse, SetPlanRequest, WorkerChannel, WorkerToCoordinatorMsg, grpc,
};
use futures::stream::{BoxStream, StreamExt, TryStreamExt};
use tokio::sync::OnceCell;
use tonic::codegen::http::HeaderMap;
use tonic::transport::{Channel, Endpoint};
use url::Url;

/// How long connecting to a worker may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a connection asks its worker for a sign of life (an HTTP/2
/// ping, answered by the worker's runtime between its tasks' polls).
pub(super) const PING_EVERY: Duration = Duration::from_secs(10);
/// How long a ping may go unanswered before the connection, and every
/// task on it, fails.
pub(super) const PING_TIMEOUT: Duration = Duration::from_secs(20);

/// Refuses a worker URL other than `http://host:port`: a worker speaks
/// gRPC over plain HTTP/2, so `https` would promise encryption it does not
/// give, and a path would be ignored.
pub(crate) fn check_worker_url(url: &Url) -> crate::Result<()> {
    let refused = |why: &str| Err(crate::Error::invalid(format!("worker URL '{url}': {why}")));
    match url.scheme() {
        "http" => {}
        "https" => {
            return refused(
                "workers speak plain HTTP/2 without TLS; use http:// within a private network",
            );
        }
        _ => return refused("a worker URL is http://host:port"),
    }
    if url.host_str().is_none_or(str::is_empty) {
        return refused("no host");
    }
    let plain = matches!(url.path(), "" | "/")
        && url.query().is_none()
        && url.fragment().is_none()
        && url.username().is_empty()
        && url.password().is_none();
    if !plain {
        return refused("a worker URL is http://host:port, without a path, query or user");
    }
    Ok(())
}

/// One connection per worker URL, made on first use (see the module doc);
/// clones share them. Connections to different workers are made at the
/// same time; one that fails is tried again on the next request.
#[derive(Debug, Clone, Default)]
pub(crate) struct Channels(Arc<Mutex<HashMap<Url, Arc<OnceCell<Channel>>>>>);

impl Channels {
    /// The connection to the worker at `url`, made if there is none yet
    /// (a connection lost later is made again by the channel itself).
    async fn channel(&self, url: &Url) -> Result<Channel> {
        let cell = {
            let mut channels = self.0.lock().expect("channels poisoned");
            Arc::clone(channels.entry(url.clone()).or_default())
        };
        let failed = |e: tonic::transport::Error| {
            exec_datafusion_err!("cannot connect to the memwal worker at {url}: {e}")
        };
        let connect = || async {
            Endpoint::from_shared(url.to_string())
                .map_err(failed)?
                .connect_timeout(CONNECT_TIMEOUT)
                .tcp_nodelay(true)
                .http2_keep_alive_interval(PING_EVERY)
                .keep_alive_timeout(PING_TIMEOUT)
                .keep_alive_while_idle(true)
                .connect()
                .await
                .map_err(failed)
        };
        cell.get_or_try_init(connect).await.cloned()
    }
}

#[async_trait]
impl ChannelResolver for Channels {
    async fn get_worker_client_for_url(&self, url: &Url) -> Result<Box<dyn WorkerChannel>> {
        let channel = self.channel(url).await?;
        Ok(Box::new(NamedWorker {
            url: url.clone(),
            inner: grpc::create_worker_client(grpc::BoxCloneSyncChannel::new(channel)),
        }))
    }
}

/// A worker's client whose errors, of a request and of every stream it
/// answers with, name the worker.
struct NamedWorker {
    url: Url,
    inner: Box<dyn WorkerChannel>,
}

impl NamedWorker {
    /// `e` naming the worker, and first what broke when the connection to
    /// it did (the transport's own words follow, as the cause).
    fn name(url: &Url, e: DataFusionError) -> DataFusionError {
        // The transport's error is the source of a gRPC status, which its
        // display leaves out.
        let chain = format!("{e:?}");
        let lost = [
            "BrokenPipe",
            "ConnectionReset",
            "connection closed",
            "GoAway",
            "h2 protocol error",
        ];
        let what = if chain.contains("KeepAliveTimedOut") {
            format!(
                ": it stopped answering (no answer to a ping for {}s)",
                PING_TIMEOUT.as_secs()
            )
        } else if chain.contains("tcp connect error") {
            // A connection made before, made again on this request.
            ": cannot connect to it (it is not running, or not at this address)".into()
        } else if lost.iter().any(|sign| chain.contains(sign)) {
            ": the connection to it broke (the worker exited or stopped answering, or what \
             listens there is no memwal worker)"
                .into()
        } else {
            String::new()
        };
        e.context(format!("memwal worker {url}{what}"))
    }

    /// `stream` with every error naming the worker.
    fn named<T: Send + 'static>(
        &self,
        stream: BoxStream<'static, Result<T>>,
    ) -> BoxStream<'static, Result<T>> {
        let url = self.url.clone();
        stream.map_err(move |e| Self::name(&url, e)).boxed()
    }
}

#[async_trait]
impl WorkerChannel for NamedWorker {
    async fn coordinator_channel(
        &mut self,
        headers: HeaderMap,
        set_plan_request: SetPlanRequest,
        c2w_stream: BoxStream<'static, CoordinatorToWorkerMsg>,
        metrics: ExecutionPlanMetricsSet,
        task_ctx: &Arc<TaskContext>,
    ) -> Result<BoxStream<'static, Result<WorkerToCoordinatorMsg>>> {
        let stream = self
            .inner
            .coordinator_channel(headers, set_plan_request, c2w_stream, metrics, task_ctx)
            .await
            .map_err(|e| Self::name(&self.url, e))?;
        Ok(self.named(stream))
    }

    async fn execute_task(
        &mut self,
        headers: HeaderMap,
        request: ExecuteTaskRequest,
        metrics: ExecutionPlanMetricsSet,
        task_ctx: &Arc<TaskContext>,
    ) -> Result<Vec<BoxStream<'static, Result<RecordBatch>>>> {
        let streams = self
            .inner
            .execute_task(headers, request, metrics, task_ctx)
            .await
            .map_err(|e| Self::name(&self.url, e))?;
        Ok(streams.into_iter().map(|s| self.named(s)).collect())
    }

    async fn get_worker_info(
        &mut self,
        request: GetWorkerInfoRequest,
    ) -> Result<GetWorkerInfoResponse> {
        self.inner
            .get_worker_info(request)
            .await
            .map_err(|e| Self::name(&self.url, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_url_is_plain_http_to_a_host_and_port() {
        for good in ["http://127.0.0.1:7001", "http://h1:7001/", "http://h1"] {
            check_worker_url(&Url::parse(good).unwrap()).unwrap();
        }
        for (bad, why) in [
            ("https://127.0.0.1:7001", "without TLS"),
            ("ftp://127.0.0.1:1", "http://host:port"),
            ("http://h1:7001/some/path", "without a path"),
            ("http://h1:7001/?x=1", "without a path"),
            ("http://user@h1:7001", "without a path"),
        ] {
            let err = check_worker_url(&Url::parse(bad).unwrap()).unwrap_err();
            assert!(err.to_string().contains(why), "{bad}: {err}");
            assert!(err.to_string().contains(bad.trim_end_matches('/')), "{err}");
        }
    }
}
