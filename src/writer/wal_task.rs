//! The WAL task (group commit): one append at a time, each carrying every
//! batch put since the last one, at most one append per
//! [`WriterOptions::wal_flush_interval`](super::WriterOptions) unless
//! enough bytes wait; see [`next_step`] for the whole rule.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Shared;
use crate::error::{Error, Result};
use crate::wal::WalEntry;

/// What the WAL task knows about the generation it makes durable when it
/// decides what to do next.
#[derive(Debug, Clone)]
struct Group {
    /// Batches of the generation put so far, and durable so far.
    written: usize,
    durable: usize,
    /// The next generation, once this one is frozen (no batch comes any
    /// more).
    next_generation: Option<u64>,
    /// The writer is closing: no put comes any more.
    closing: bool,
    /// Bytes put but not yet durable (every generation).
    pending_bytes: u64,
    /// When the last append started.
    last_start: Option<Instant>,
}

/// The WAL task's next move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Every batch of a frozen generation is durable: seal it (it may be
    /// flushed) and go on with generation `next`.
    Seal { next: u64 },
    /// Nothing waits and the writer is closing: the task ends.
    Finish,
    /// Nothing waits: sleep until a put.
    WaitForPut,
    /// Batches wait, but the last append started less than an interval
    /// ago: sleep until `due`, or a put that changes the answer.
    WaitUntil(Instant),
    /// Append every waiting batch now.
    Append,
}

impl Group {
    /// Group commit's rule: batches wait at most one `interval` after the
    /// previous append started, and not at all when the first append is
    /// due, when `flush_bytes` or more wait, when the generation is frozen
    /// (so a full MemTable flushes without delay) or when the writer is
    /// closing.
    fn next_step(&self, now: Instant, interval: Duration, flush_bytes: u64) -> Step {
        if self.written == self.durable {
            return match (self.next_generation, self.closing) {
                (Some(next), _) => Step::Seal { next },
                (None, true) => Step::Finish,
                (None, false) => Step::WaitForPut,
            };
        }
        match self.last_start.map(|at| at + interval) {
            Some(due)
                if !self.closing
                    && self.next_generation.is_none()
                    && self.pending_bytes < flush_bytes
                    && now < due =>
            {
                Step::WaitUntil(due)
            }
            _ => Step::Append,
        }
    }
}

impl Shared {
    /// The group-commit loop: one WAL append at a time, each carrying every
    /// batch of the oldest generation with batches not yet durable, written
    /// when it starts. Seals a frozen generation once all of it is durable.
    pub(super) async fn run_wal(self: Arc<Self>, mut position: u64) {
        self.append_all(&mut position).await;
        self.progress.send_modify(|p| p.wal_done = true);
        self.flush_wake.notify_one();
    }

    async fn append_all(&self, position: &mut u64) {
        let interval = self.options.wal_flush_interval;
        let mut last_start: Option<Instant> = None;
        loop {
            // `closing` first: once it is set no put enters the MemTable, so
            // `written` read after it is final. Likewise a generation seen
            // frozen gets no more batches.
            let closing = self.closing.load(Ordering::Acquire);
            let durable = self.progress.borrow().clone();
            if durable.error.is_some() {
                return;
            }
            let (generation, next) = {
                let layers = self.layers.read().expect("layers poisoned");
                let at = layers
                    .generations
                    .iter()
                    .position(|g| g.number == durable.generation)
                    .expect("the generation being made durable is not flushed yet");
                (
                    Arc::clone(&layers.generations[at]),
                    layers.generations.get(at + 1).map(|g| g.number),
                )
            };
            let written = generation.memtable.written_batches();
            let group = Group {
                written,
                durable: durable.batches,
                next_generation: next,
                closing,
                pending_bytes: self
                    .written_bytes
                    .load(Ordering::Relaxed)
                    .saturating_sub(durable.bytes),
                last_start,
            };
            match group.next_step(
                Instant::now(),
                interval,
                self.options.wal_flush_bytes as u64,
            ) {
                Step::Seal { next } => {
                    generation.sealed.store(true, Ordering::Release);
                    self.progress.send_modify(|p| {
                        p.generation = next;
                        p.batches = 0;
                    });
                    self.flush_wake.notify_one();
                    continue;
                }
                Step::Finish => return,
                Step::WaitForPut => {
                    self.wake.notified().await;
                    continue;
                }
                Step::WaitUntil(due) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(due.into()) => {}
                        _ = self.wake.notified() => {}
                    }
                    continue;
                }
                Step::Append => {}
            }
            // A stale writer must not append after its newer epoch's fence
            // may have been deleted: after a lease without confirmation,
            // check the manifest first.
            let lease = self.options.lease();
            let mut attempt = 0;
            while !self.owned_within(lease) {
                match self.newer_claim().await {
                    Ok(None) => {}
                    Ok(Some(fenced)) => return self.stop(fenced),
                    // Nothing was written: a store error is retried.
                    Err(e) if attempt < self.options.append_retries => {
                        attempt += 1;
                        log::debug!("checking ownership of {} failed: {e}", self.shard_dir);
                        tokio::time::sleep(self.options.commit.backoff(attempt)).await;
                    }
                    Err(e) => return self.stop(e),
                }
            }
            last_start = Some(Instant::now());
            let batches = generation.memtable.batches(durable.batches, written);
            let rows: u64 = batches.iter().map(|b| b.batch.num_rows() as u64).sum();
            let bytes: u64 = batches
                .iter()
                .map(|b| b.batch.get_array_memory_size() as u64)
                .sum();
            let entry = WalEntry::data(
                self.epoch,
                generation.number,
                batches.into_iter().map(|b| b.batch).collect(),
            );
            let result = match self.wal.encode(*position, &entry) {
                Ok(encoded) => {
                    let len = encoded.len() as u64;
                    self.append_at(*position, encoded).await.map(|()| len)
                }
                Err(e) => Err(e),
            };
            // An append slower than the lease may have landed after a newer
            // epoch's fence was deleted, out of every reader's sight: it
            // counts only if the manifest still names this writer.
            let result = match result {
                Ok(len) if last_start.expect("set above").elapsed() > lease => {
                    match self.newer_claim().await {
                        Ok(None) => Ok(len),
                        Ok(Some(fenced)) => Err(Error::CommitOutcomeUnknown {
                            path: self.wal.path_of(*position).to_string(),
                            write: format!(
                                "the append took longer than {lease:?} and another writer \
                                 claimed the shard meanwhile ({fenced})"
                            ),
                            read_back: "the entry exists, but may be out of the new writer's sight"
                                .into(),
                        }),
                        Err(e) => Err(e),
                    }
                }
                other => other,
            };
            match result {
                Ok(len) => {
                    let latency = last_start.expect("set above").elapsed().as_micros() as u64;
                    let c = &self.counters;
                    c.wal_appends.fetch_add(1, Ordering::Relaxed);
                    c.wal_bytes.fetch_add(len, Ordering::Relaxed);
                    c.latency_total_us.fetch_add(latency, Ordering::Relaxed);
                    c.latency_max_us.fetch_max(latency, Ordering::Relaxed);
                    c.latency.record(Duration::from_micros(latency));
                    generation.last_position.store(*position, Ordering::Release);
                    *position += 1;
                    c.next_position.store(*position, Ordering::Release);
                    // Our entry landed, so nobody had fenced when it started.
                    self.confirm_owned(last_start.expect("set above"));
                    // Visible and counted at once: a reader that sees the
                    // batches and then reads the progress sees them durable.
                    self.progress.send_modify(|p| {
                        if self.options.durable {
                            generation.memtable.mark_durable(written);
                        }
                        p.batches = written;
                        p.rows += rows;
                        p.bytes += bytes;
                    });
                }
                Err(e) => {
                    self.stop(e);
                    return;
                }
            }
        }
    }

    /// Appends `bytes` at `position`, retrying the same position with the
    /// same bytes after a failure whose read-back shows nothing landed.
    async fn append_at(&self, position: u64, bytes: bytes::Bytes) -> Result<()> {
        let mut attempt = 0;
        loop {
            let err = match self.wal.append(position, self.epoch, bytes.clone()).await {
                Ok(()) => return Ok(()),
                Err(e @ Error::Fenced { .. }) => return Err(e),
                Err(e) => e,
            };
            match self.wal.read_bytes(position).await {
                Ok(Some(stored)) if stored == bytes => return Ok(()),
                // Someone else's entry: the next append reports the fence.
                Ok(Some(_)) => {}
                Ok(None) => {}
                Err(read_back) => {
                    return Err(Error::CommitOutcomeUnknown {
                        path: self.wal.path_of(position).to_string(),
                        write: err.to_string(),
                        read_back: read_back.to_string(),
                    });
                }
            }
            attempt += 1;
            if attempt > self.options.append_retries {
                return Err(Error::Poisoned(format!(
                    "WAL append at {} failed {attempt} times; last error: {err}",
                    self.wal.path_of(position)
                )));
            }
            log::debug!("retrying WAL append at position {position}: {err}");
            tokio::time::sleep(self.options.commit.backoff(attempt)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: Duration = Duration::from_millis(100);
    const FLUSH_BYTES: u64 = 1 << 20;

    /// Three batches written, one durable; the last append started at `t0`.
    fn waiting(t0: Instant) -> Group {
        Group {
            written: 3,
            durable: 1,
            next_generation: None,
            closing: false,
            pending_bytes: 100,
            last_start: Some(t0),
        }
    }

    fn step(group: &Group, now: Instant) -> Step {
        group.next_step(now, INTERVAL, FLUSH_BYTES)
    }

    #[test]
    fn the_first_append_goes_at_once() {
        let t0 = Instant::now();
        let first = Group {
            last_start: None,
            ..waiting(t0)
        };
        assert_eq!(step(&first, t0), Step::Append);
    }

    #[test]
    fn puts_wait_one_interval_after_the_last_append_started() {
        let t0 = Instant::now();
        let group = waiting(t0);
        let due = t0 + INTERVAL;
        assert_eq!(step(&group, t0), Step::WaitUntil(due));
        assert_eq!(step(&group, t0 + INTERVAL / 2), Step::WaitUntil(due));
        assert_eq!(
            step(&group, due - Duration::from_nanos(1)),
            Step::WaitUntil(due)
        );
        assert_eq!(step(&group, due), Step::Append);
        assert_eq!(step(&group, t0 + 10 * INTERVAL), Step::Append);
    }

    #[test]
    fn enough_waiting_bytes_go_before_the_interval() {
        let t0 = Instant::now();
        let mut group = waiting(t0);
        group.pending_bytes = FLUSH_BYTES - 1;
        assert_eq!(step(&group, t0), Step::WaitUntil(t0 + INTERVAL));
        group.pending_bytes = FLUSH_BYTES;
        assert_eq!(step(&group, t0), Step::Append);
    }

    #[test]
    fn a_frozen_generation_or_a_closing_writer_does_not_wait() {
        let t0 = Instant::now();
        let frozen = Group {
            next_generation: Some(8),
            ..waiting(t0)
        };
        assert_eq!(step(&frozen, t0), Step::Append);
        let closing = Group {
            closing: true,
            ..waiting(t0)
        };
        assert_eq!(step(&closing, t0), Step::Append);
    }

    #[test]
    fn with_nothing_waiting_it_seals_sleeps_or_ends() {
        let t0 = Instant::now();
        let done = Group {
            durable: 3,
            ..waiting(t0)
        };
        assert_eq!(step(&done, t0), Step::WaitForPut);
        let frozen = Group {
            next_generation: Some(8),
            ..done.clone()
        };
        assert_eq!(step(&frozen, t0), Step::Seal { next: 8 });
        // A frozen generation is sealed even while closing: the next one
        // may still hold batches.
        let closing_frozen = Group {
            closing: true,
            ..frozen
        };
        assert_eq!(step(&closing_frozen, t0), Step::Seal { next: 8 });
        let closing = Group {
            closing: true,
            ..done
        };
        assert_eq!(step(&closing, t0), Step::Finish);
    }
}
