//! A remote store whose read errors name the object read (or the prefix
//! listed): the HTTP client's error for a response body cut short or
//! stalled ("request or response body error: operation timed out") names
//! none.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};

/// `inner`, with every error of a read or listing that does not name its
/// object or prefix naming it ("reading {path}: ...", "listing
/// {prefix}: ...").
#[derive(Debug)]
pub(crate) struct NamedReads {
    inner: Arc<dyn ObjectStore>,
}

impl NamedReads {
    pub(crate) fn new(inner: Arc<dyn ObjectStore>) -> Self {
        Self { inner }
    }
}

/// The cause of a read's or listing's error, with what was read.
#[derive(Debug, thiserror::Error)]
#[error("{what} {path}: {source}")]
struct Naming {
    what: &'static str,
    path: String,
    source: Box<dyn std::error::Error + Send + Sync>,
}

/// `e`, naming `path` if it does not.
fn named(path: &Path, e: object_store::Error) -> object_store::Error {
    naming("reading", path, e)
}

/// `e`, saying it came from `what` (reading, listing) `path` if it does
/// not name it.
fn naming(what: &'static str, path: &Path, e: object_store::Error) -> object_store::Error {
    match e {
        object_store::Error::Generic { store, source }
            if !source.to_string().contains(path.as_ref()) =>
        {
            object_store::Error::Generic {
                store,
                source: Box::new(Naming {
                    what,
                    path: path.to_string(),
                    source,
                }),
            }
        }
        other => other,
    }
}

/// `listing`, with its errors naming `prefix`, if any.
fn listed<T: Send + 'static>(
    prefix: Option<&Path>,
    listing: BoxStream<'static, object_store::Result<T>>,
) -> BoxStream<'static, object_store::Result<T>> {
    match prefix.cloned() {
        Some(prefix) => listing
            .map(move |r| r.map_err(|e| naming("listing", &prefix, e)))
            .boxed(),
        None => listing,
    }
}

impl fmt::Display for NamedReads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.inner)
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl ObjectStore for NamedReads {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let mut got =
            (self.inner.get_opts(location, options).await).map_err(|e| named(location, e))?;
        if let GetResultPayload::Stream(body) = got.payload {
            let path = location.clone();
            got.payload =
                GetResultPayload::Stream(body.map(move |r| r.map_err(|e| named(&path, e))).boxed());
        }
        Ok(got)
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        (self.inner.get_ranges(location, ranges).await).map_err(|e| named(location, e))
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        listed(prefix, self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        listed(prefix, self.inner.list_with_offset(prefix, offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        (self.inner.list_with_delimiter(prefix).await).map_err(|e| match prefix {
            Some(prefix) => naming("listing", prefix, e),
            None => e,
        })
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Fault, FaultyStore, OpKind};
    use object_store::ObjectStoreExt;
    use object_store::memory::InMemory;

    #[tokio::test]
    async fn a_read_error_that_names_no_object_names_it() {
        let faulty = FaultyStore::new(Arc::new(InMemory::new()));
        let store = NamedReads::new(Arc::clone(&faulty) as _);
        let path = Path::from("tables/t/shards/0/sst/a/data.parquet");
        store
            .put(&path, Bytes::from_static(b"xy").into())
            .await
            .unwrap();
        let message = |e: object_store::Error| crate::error::Error::from(e).to_string();
        // A body cut short, in a whole read and in a ranged one.
        faulty.inject(Fault::nth(OpKind::Get, 1).times(2).after_write());
        let body = store.get(&path).await.unwrap().bytes().await.unwrap_err();
        assert_eq!(
            message(body),
            "object store: Generic FaultyStore error: reading \
             tables/t/shards/0/sst/a/data.parquet: injected: request or response body error"
        );
        let ranged = store.get_ranges(&path, &[0..1, 1..2]).await.unwrap_err();
        assert!(message(ranged).contains("reading tables/t/shards/0/sst/a/data.parquet: injected"));
        // An error that names it, or of another kind, is left as it is.
        faulty.inject(Fault::nth(OpKind::Get, 1));
        let e = message(store.get(&path).await.unwrap_err());
        assert_eq!(e.matches(path.as_ref()).count(), 1, "{e}");
        let e = store.get(&Path::from("nothing/here")).await.unwrap_err();
        assert!(matches!(e, object_store::Error::NotFound { .. }), "{e}");
        // A listing's error names its prefix (the HTTP client's for a
        // listing's body cut short names none).
        let bare = object_store::Error::Generic {
            store: "S3",
            source: "Error getting list response body".into(),
        };
        let listing = futures::stream::iter([Err::<ObjectMeta, _>(bare)]).boxed();
        let prefix = Path::from("tables/t");
        let e = listed(Some(&prefix), listing).next().await.unwrap();
        assert_eq!(
            message(e.unwrap_err()),
            "object store: Generic S3 error: listing tables/t: Error getting list response body"
        );
        assert_eq!(store.get(&path).await.unwrap().bytes().await.unwrap(), "xy");
    }
}
