//! The WAL task (group commit): each append carries every batch put since
//! the last one started, at most one append starts per
//! [`WriterOptions::wal_flush_interval`](super::WriterOptions) unless
//! enough bytes wait or a lone writer puts and waits one batch at a time,
//! and up to
//! [`WriterOptions::wal_appends_in_flight`](super::WriterOptions) run at
//! once, acknowledged in position order; see [`Group::next_step`] for the
//! whole rule.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use datafusion::arrow::array::RecordBatch;
use object_store::PutPayload;

use super::{Generation, Shared};
use crate::blob;
use crate::error::{Error, Result};
use crate::store::{AfterFailure, SameBytesRetries, paths};
use crate::wal::WalEntry;

/// What the WAL task knows about the generation it makes durable when it
/// decides what to do next.
#[derive(Debug, Clone)]
struct Group {
    /// Batches of the generation put so far, and sent to the WAL so far
    /// (in appends in flight or landed).
    written: usize,
    sent: usize,
    /// Appends in flight, and how many may be at once.
    in_flight: usize,
    max_in_flight: usize,
    /// The next generation, once this one is frozen (no batch comes any
    /// more).
    next_generation: Option<u64>,
    /// The writer is closing: no put comes any more.
    closing: bool,
    /// Bytes put but not yet sent (every generation).
    pending_bytes: u64,
    /// When the last append started.
    last_start: Option<Instant>,
    /// The last append carried a single batch, and no batch was put while
    /// appends were in flight since: one writer putting and waiting.
    lone_writer: bool,
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
    /// Wait for the oldest append in flight to land, or a put that changes
    /// the answer.
    WaitForAppend,
    /// Batches wait, but the last append started less than an interval
    /// ago: sleep until `due`, a put that changes the answer or a landing.
    WaitUntil(Instant),
    /// Append every waiting batch now.
    Append,
}

impl Group {
    /// Group commit's rule: batches wait at most one `interval` after the
    /// previous append started, and not at all when the first append is
    /// due, when `flush_bytes` or more wait, when the generation is frozen
    /// (so a full MemTable flushes without delay), when the writer is
    /// closing, or for a lone writer with nothing in flight (one that
    /// waits for each put before the next gains nothing from waiting: its
    /// put takes one PUT, not an interval); but never while
    /// `max_in_flight` appends are in flight. A generation is sealed once
    /// nothing of it is in flight.
    fn next_step(&self, now: Instant, interval: Duration, flush_bytes: u64) -> Step {
        if self.written == self.sent {
            if self.in_flight > 0 {
                return Step::WaitForAppend;
            }
            return match (self.next_generation, self.closing) {
                (Some(next), _) => Step::Seal { next },
                (None, true) => Step::Finish,
                (None, false) => Step::WaitForPut,
            };
        }
        if self.in_flight >= self.max_in_flight {
            return Step::WaitForAppend;
        }
        let lone_writer = self.in_flight == 0 && self.lone_writer;
        match self.last_start.map(|at| at + interval) {
            Some(due)
                if !self.closing
                    && !lone_writer
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

/// One append in flight, in its own task.
struct Append {
    position: u64,
    generation: Arc<Generation>,
    /// The generation's batches durable once it lands, and their rows and
    /// bytes.
    written: usize,
    rows: u64,
    bytes: u64,
    started: Instant,
    /// The entry's bytes once it landed.
    task: JoinHandle<Result<Landed>>,
}

/// What an append that landed wrote.
#[derive(Debug)]
struct Landed {
    /// The entry's bytes.
    len: u64,
    /// Its pack's bytes, and its batches as the entry holds them, if a
    /// pack took their long blob values.
    packed: Option<(u64, Vec<RecordBatch>)>,
}

/// The oldest append in flight once it has landed or failed; pending while
/// none is in flight. Cancel-safe: the append stays in `in_flight` until
/// it has ended.
async fn next_landing(in_flight: &mut VecDeque<Append>) -> (Append, Result<Landed>) {
    let Some(front) = in_flight.front_mut() else {
        return std::future::pending().await;
    };
    let result = match (&mut front.task).await {
        Ok(result) => result,
        Err(e) => Err(Error::Poisoned(format!("a WAL append failed: {e}"))),
    };
    (in_flight.pop_front().expect("the front"), result)
}

impl Shared {
    /// The group-commit loop: appends, each carrying every batch of the
    /// oldest generation with batches not yet sent, written when it
    /// starts. Seals a frozen generation once all of it is durable. Ends
    /// with no append in flight.
    pub(super) async fn run_wal(self: Arc<Self>, position: u64) {
        let mut in_flight = VecDeque::new();
        // Stopped by something else than an append (a flush that failed,
        // a newer writer's claim), the appends in flight still count as
        // they land, in order up to the first that fails: their entries
        // are in the WAL, so their puts succeed. After a failed append
        // none does. None may run once the task says it has ended.
        let mut acknowledging = self.append_all(position, &mut in_flight).await;
        while !in_flight.is_empty() {
            let (append, result) = next_landing(&mut in_flight).await;
            acknowledging = acknowledging && self.landed(append, result);
        }
        self.progress.send_modify(|p| p.wal_done = true);
        self.flush_wake.notify_one();
    }

    /// The loop of [`Shared::run_wal`]; `false` if it ended because an
    /// append failed.
    async fn append_all(
        self: &Arc<Self>,
        mut position: u64,
        in_flight: &mut VecDeque<Append>,
    ) -> bool {
        let interval = self.options.wal_flush_interval;
        let (mut last_start, mut lone_writer) = (None, false);
        // Batches of the generation being made durable that were sent.
        let mut sent = 0;
        loop {
            // `closing` first: once it is set no put enters the MemTable, so
            // `written` read after it is final. Likewise a generation seen
            // frozen gets no more batches.
            let closing = self.closing.load(Ordering::Acquire);
            let durable = self.progress.borrow().clone();
            if durable.error.is_some() {
                return true;
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
            sent = sent.max(durable.batches);
            let sending: u64 = in_flight.iter().map(|a| a.bytes).sum();
            let group = Group {
                written,
                sent,
                in_flight: in_flight.len(),
                max_in_flight: self.options.wal_appends_in_flight,
                next_generation: next,
                closing,
                pending_bytes: self
                    .written_bytes
                    .load(Ordering::Relaxed)
                    .saturating_sub(durable.bytes + sending),
                last_start,
                lone_writer,
            };
            let step = group.next_step(
                Instant::now(),
                interval,
                self.options.wal_flush_bytes as u64,
            );
            match step {
                Step::Seal { next } => {
                    generation.sealed.store(true, Ordering::Release);
                    self.progress.send_modify(|p| {
                        p.generation = next;
                        p.batches = 0;
                    });
                    sent = 0;
                    self.flush_wake.notify_one();
                    continue;
                }
                Step::Finish => return true,
                Step::WaitForPut | Step::WaitForAppend | Step::WaitUntil(_) => {
                    let sleep = async {
                        match step {
                            Step::WaitUntil(due) => tokio::time::sleep_until(due.into()).await,
                            _ => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        _ = sleep => {}
                        _ = self.wake.notified() => {}
                        (append, result) = next_landing(in_flight) => {
                            // Read before the acknowledgement: a put it
                            // lets a writer make is not one made meanwhile.
                            let put_meanwhile = generation.memtable.written_batches() > sent;
                            if !self.landed(append, result) {
                                return false;
                            }
                            lone_writer &= !put_meanwhile;
                        }
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
                let asked = Instant::now();
                match self.newer_claim().await {
                    Ok(None) => {}
                    Ok(Some(fenced)) => {
                        self.stop(fenced);
                        return true;
                    }
                    // Nothing was written: a store error is retried.
                    Err(e) if self.options.retry(attempt + 1, asked.elapsed()) => {
                        attempt += 1;
                        log::debug!("checking ownership of {} failed: {e}", self.shard_dir);
                        tokio::time::sleep(self.options.commit.backoff(attempt)).await;
                    }
                    Err(e) => {
                        self.stop(e);
                        return true;
                    }
                }
            }
            let started = Instant::now();
            last_start = Some(started);
            lone_writer = written - sent == 1;
            let batches = generation.memtable.batches(sent, written);
            let rows: u64 = batches.iter().map(|b| b.batch.num_rows() as u64).sum();
            let bytes: u64 = batches.iter().map(|b| b.held as u64).sum();
            let mut entry = WalEntry::data(
                self.epoch,
                generation.number,
                batches.into_iter().map(|b| b.batch).collect(),
            );
            // The appends in flight hold the positions just below this one.
            if !in_flight.is_empty() {
                entry.landed_through = Some(position - 1 - in_flight.len() as u64);
            }
            log::trace!(
                "WAL append at {position} starts: {rows} rows, {} in flight",
                in_flight.len()
            );
            let shared = Arc::clone(self);
            let task =
                tokio::spawn(async move { shared.write_entry(position, entry, started).await });
            in_flight.push_back(Append {
                position,
                generation,
                written,
                rows,
                bytes,
                started,
                task,
            });
            sent = written;
            position += 1;
            self.counters
                .next_position
                .store(position, Ordering::Release);
        }
    }

    /// Writes `entry` at `position`. Its long blob values, if it has any,
    /// go into a pack: the front of the entry's object if the pack is at
    /// most [`super::WriterOptions::blob_wal_pack_bytes`], otherwise an
    /// object of its own, written first (an entry never names a pack that
    /// is not there). The values' checksums and the entry's encoding are
    /// made on a blocking thread, while a pack of its own is written.
    async fn write_entry(
        &self,
        position: u64,
        mut entry: WalEntry,
        started: Instant,
    ) -> Result<Landed> {
        let packed = blob::pack(
            &self.schema,
            &entry.batches,
            position,
            self.epoch,
            self.options.blob_inline_bytes,
        )?;
        let (front, head, packed) = match packed {
            Some(mut pack) => {
                let bytes = std::mem::take(&mut pack.bytes);
                let len = bytes.content_length() as u64;
                let inside = len <= self.options.blob_wal_pack_bytes as u64;
                if inside {
                    pack.inside_wal_entry();
                }
                let wal = self.wal.clone();
                let encode = tokio::task::spawn_blocking(move || {
                    entry.batches = pack.into_batches()?;
                    let head = match inside {
                        true => wal.encode_after_pack(position, &entry)?,
                        false => wal.encode(position, &entry)?,
                    };
                    Ok::<_, Error>((head, entry.batches))
                });
                let encoded = async {
                    encode
                        .await
                        .map_err(|e| Error::Poisoned(format!("encoding a WAL entry: {e}")))?
                };
                let (front, (head, batches)) = match inside {
                    true => (bytes, encoded.await?),
                    false => {
                        let (written, encoded) =
                            tokio::join!(self.write_pack(position, bytes), encoded);
                        written?;
                        (PutPayload::new(), encoded?)
                    }
                };
                (front, head, Some((len, batches)))
            }
            None => (PutPayload::new(), self.wal.encode(position, &entry)?, None),
        };
        let len = head.len() as u64;
        self.append_at(position, front, head).await?;
        // An append slower than the lease may have landed after a newer
        // epoch's fence was deleted, out of every reader's sight: it
        // counts only if the manifest still names this writer.
        let lease = self.options.lease();
        if started.elapsed() > lease
            && let Some(fenced) = self.newer_claim().await?
        {
            return Err(Error::CommitOutcomeUnknown {
                path: self.wal.path_of(position).to_string(),
                write: format!(
                    "the append took longer than {lease:?} and another writer \
                     claimed the shard meanwhile ({fenced})"
                ),
                read_back: "the entry exists, but may be out of the new writer's sight".into(),
            });
        }
        Ok(Landed { len, packed })
    }

    /// Writes the blob pack of the append at `position` (a name of this
    /// writer's alone, so a retry rewrites the same bytes), retrying a
    /// failed upload like an append. Before the entry that names it: an entry
    /// never names a pack that is not there.
    async fn write_pack(&self, position: u64, bytes: PutPayload) -> Result<()> {
        let path = paths::blob_pack(&self.shard_dir, position, self.epoch);
        let mut attempt = 0;
        loop {
            let tried = Instant::now();
            match blob::put_pack(&self.store, &path, bytes.clone()).await {
                Ok(()) => return Ok(()),
                Err(e) if self.options.retry(attempt + 1, tried.elapsed()) => {
                    attempt += 1;
                    log::debug!("retrying blob pack {path}: {e}");
                    tokio::time::sleep(self.options.commit.backoff(attempt)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Acknowledges an append that ended, in position order: its batches
    /// become durable (and, in durable mode, visible). A failure stops the
    /// writer; `false` then.
    fn landed(&self, append: Append, result: Result<Landed>) -> bool {
        let Landed { len, packed } = match result {
            Ok(landed) => landed,
            Err(e) => {
                self.stop(e);
                return false;
            }
        };
        let latency = append.started.elapsed().as_micros() as u64;
        log::trace!(
            "WAL append at {} landed: {} rows, {len} bytes, {latency} µs",
            append.position,
            append.rows
        );
        let c = &self.counters;
        c.wal_appends.fetch_add(1, Ordering::Relaxed);
        c.wal_bytes.fetch_add(len, Ordering::Relaxed);
        c.latency_total_us.fetch_add(latency, Ordering::Relaxed);
        c.latency_max_us.fetch_max(latency, Ordering::Relaxed);
        c.latency.record(Duration::from_micros(latency));
        let generation = &append.generation;
        if let Some((pack_bytes, batches)) = packed {
            c.blob_packs.fetch_add(1, Ordering::Relaxed);
            c.blob_pack_bytes.fetch_add(pack_bytes, Ordering::Relaxed);
            let released = generation
                .memtable
                .set_packed(append.written - batches.len(), batches);
            self.released_bytes
                .fetch_add(released as u64, Ordering::Relaxed);
        }
        generation
            .last_position
            .store(append.position, Ordering::Release);
        // Our entry landed, so nobody had fenced when it started.
        self.confirm_owned(append.started);
        // Visible and counted at once: a reader that sees the batches and
        // then reads the progress sees them durable.
        self.progress.send_modify(|p| {
            if self.options.durable {
                generation.memtable.mark_durable(append.written);
            }
            p.batches = append.written;
            p.rows += append.rows;
            p.bytes += append.bytes;
        });
        true
    }

    /// Appends the entry `pack` then `head` at `position` (see
    /// [`crate::wal::WalLog::append_after_pack`]), retrying the same position with the
    /// same bytes after a failure whose read-back shows nothing landed
    /// (see [`SameBytesRetries`]). Once an attempt failed slowly, nothing
    /// there is an unknown outcome: the append may land until the shard's
    /// next writer fences the position.
    async fn append_at(&self, position: u64, pack: PutPayload, head: bytes::Bytes) -> Result<()> {
        let mut failures = SameBytesRetries::new(self.options.append_retries);
        loop {
            let tried = Instant::now();
            let append =
                (self.wal).append_after_pack(position, self.epoch, pack.clone(), head.clone());
            let err = match append.await {
                Ok(()) => return Ok(()),
                Err(e @ Error::Fenced { .. }) => return Err(e),
                Err(e) => e,
            };
            let failed_after = tried.elapsed();
            match self.wal.read_bytes(position).await {
                Ok(Some(stored)) if stored == head => return Ok(()),
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
            match failures.failed(failed_after, err.to_string()) {
                AfterFailure::Retry => {
                    log::debug!("retrying WAL append at position {position}: {err}");
                    tokio::time::sleep(self.options.commit.backoff(failures.failures())).await;
                }
                AfterFailure::Unknown(write) => {
                    return Err(Error::CommitOutcomeUnknown {
                        path: self.wal.path_of(position).to_string(),
                        write,
                        read_back: "nothing there yet, but an append that timed out may \
                                    still land (until the shard is opened again)"
                            .into(),
                    });
                }
                AfterFailure::Failed => {
                    return Err(Error::Poisoned(format!(
                        "WAL append at {} failed (attempts: {}); last error: {err}",
                        self.wal.path_of(position),
                        failures.failures()
                    )));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: Duration = Duration::from_millis(100);
    const FLUSH_BYTES: u64 = 1 << 20;

    /// Three batches written, one sent and durable; the last append started
    /// at `t0`.
    fn waiting(t0: Instant) -> Group {
        Group {
            written: 3,
            sent: 1,
            in_flight: 0,
            max_in_flight: 2,
            next_generation: None,
            closing: false,
            pending_bytes: 100,
            last_start: Some(t0),
            lone_writer: false,
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
    fn a_lone_writer_putting_one_batch_at_a_time_does_not_wait() {
        let t0 = Instant::now();
        let lone = Group {
            lone_writer: true,
            ..waiting(t0)
        };
        assert_eq!(step(&lone, t0), Step::Append);
        // Another put while its append is in flight: puts come together,
        // and they wait for the cadence.
        let overlapping = Group {
            in_flight: 1,
            ..lone.clone()
        };
        assert_eq!(step(&overlapping, t0), Step::WaitUntil(t0 + INTERVAL));
        // The previous append carried several batches: the cadence holds.
        assert_eq!(step(&waiting(t0), t0), Step::WaitUntil(t0 + INTERVAL));
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
            sent: 3,
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

    #[test]
    fn appends_in_flight_overlap_up_to_the_limit_and_keep_the_cadence() {
        let t0 = Instant::now();
        let one = Group {
            in_flight: 1,
            ..waiting(t0)
        };
        // A second append may start while one is in flight, on the cadence.
        assert_eq!(step(&one, t0), Step::WaitUntil(t0 + INTERVAL));
        assert_eq!(step(&one, t0 + INTERVAL), Step::Append);
        // At the limit nothing starts, whatever is due.
        let full = Group {
            in_flight: 2,
            ..waiting(t0)
        };
        assert_eq!(step(&full, t0 + INTERVAL), Step::WaitForAppend);
        for urgent in [
            Group {
                closing: true,
                ..full.clone()
            },
            Group {
                next_generation: Some(8),
                ..full.clone()
            },
            Group {
                pending_bytes: FLUSH_BYTES,
                ..full.clone()
            },
        ] {
            assert_eq!(step(&urgent, t0), Step::WaitForAppend);
        }
        let serial = Group {
            max_in_flight: 1,
            ..one
        };
        assert_eq!(step(&serial, t0 + INTERVAL), Step::WaitForAppend);
    }

    #[test]
    fn a_generation_is_sealed_and_the_task_ends_only_with_nothing_in_flight() {
        let t0 = Instant::now();
        let sent = Group {
            sent: 3,
            in_flight: 1,
            next_generation: Some(8),
            closing: true,
            ..waiting(t0)
        };
        assert_eq!(step(&sent, t0), Step::WaitForAppend);
        let landed = Group {
            in_flight: 0,
            ..sent.clone()
        };
        assert_eq!(step(&landed, t0), Step::Seal { next: 8 });
        let last = Group {
            next_generation: None,
            ..sent
        };
        assert_eq!(step(&last, t0), Step::WaitForAppend);
    }
}
