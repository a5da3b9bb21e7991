//! Object storage: a root opened from a URL, versioned copy-on-write objects
//! (the one commit primitive) and a fault-injecting store for tests.

mod faulty;
pub mod paths;
mod root;
mod versioned;

pub use faulty::{Fault, FaultMode, FaultyStore, OpKind};
pub use root::ObjectRoot;
pub use versioned::{CommitOptions, PutOutcome, Versioned, VersionedObjects};
