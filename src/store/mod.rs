//! Object storage: a root opened from a URL, versioned copy-on-write objects
//! (the one commit primitive) and a fault-injecting store for tests.

#[cfg(any(test, feature = "testing"))]
mod faulty;
pub mod paths;
mod root;
mod versioned;

#[cfg(any(test, feature = "testing"))]
pub use faulty::{Fault, FaultMode, FaultyStore, Gate, OpKind};
pub use root::ObjectRoot;
pub use versioned::{CommitOptions, Versioned, VersionedObjects};

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
