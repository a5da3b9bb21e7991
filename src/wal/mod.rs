//! The write-ahead log (DESIGN.md §6): one immutable object per group
//! commit, at fixed-width positions created with put-if-absent, dense but
//! for appends in flight (see [`WalLog`]); fence entries for epochs; a
//! replay reader. The ShardWriter that drives it
//! (group commit cadence, retries, poisoning) is built on top.

mod entry;
mod log;

pub use entry::{EntryKind, WalEntry};
pub use log::WalLog;
