//! Object storage: a root opened from a URL, versioned copy-on-write objects
//! (the one commit primitive), and for tests and benchmarks a
//! fault-injecting store and a store with S3's latency.

#[cfg(any(test, feature = "testing"))]
mod faulty;
#[cfg(any(test, feature = "testing"))]
mod latency;
mod named;
pub mod paths;
mod root;
mod versioned;

#[cfg(any(test, feature = "testing"))]
pub use faulty::{Fault, FaultMode, FaultyStore, Gate, OpKind};
#[cfg(any(test, feature = "testing"))]
pub use latency::{Delay, LatencyProfile, LatencyStore, RequestCount, bench_root};
#[cfg(test)]
pub(crate) use root::QUICK_FAILURE;
pub(crate) use root::{AfterFailure, SameBytesRetries, retry_store_call};
pub use root::{DEFAULT_STORE_TIMEOUT, ObjectRoot};
pub use versioned::{CommitOptions, Slot, Versioned, VersionedObjects};

/// Whether an object of `size` bytes is at `path`, for a name only one
/// writer ever writes: how a write whose answer was lost after it landed
/// (a multipart upload's completion, which the client's own retry then
/// finds gone) is told from one that failed.
pub(crate) async fn landed(
    store: &dyn object_store::ObjectStore,
    path: &object_store::path::Path,
    size: u64,
) -> bool {
    use object_store::ObjectStoreExt;
    matches!(store.head(path).await, Ok(meta) if meta.size == size)
}

/// What `read` returns, checked by `check`, and read once more if the
/// check finds it damaged ([`crate::Error::Corrupt`]): bytes damaged on
/// their way (a store reached over plain HTTP, whose TCP checksums let
/// some flips through) read right the second time, while bytes damaged in
/// the store read the same and are reported.
pub(crate) async fn read_checked<B, T, Fut>(
    read: impl Fn() -> Fut,
    check: impl Fn(B) -> crate::error::Result<T>,
) -> crate::error::Result<T>
where
    Fut: std::future::Future<Output = crate::error::Result<B>>,
{
    match check(read().await?) {
        Err(crate::Error::Corrupt { .. }) => check(read().await?),
        checked => checked,
    }
}

/// Deletes the object at `path`; an object that is already gone is no
/// error (a delete repeated after a crash, or raced by another cleaner).
pub async fn delete_if_present(
    store: &dyn object_store::ObjectStore,
    path: &object_store::path::Path,
) -> crate::error::Result<()> {
    use object_store::ObjectStoreExt;
    match store.delete(path).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
