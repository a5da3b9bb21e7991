//! The index task: inserts the vectors of written batches into their
//! MemTable's graphs, generation by generation, off the async runtime, and
//! publishes how far it got (a batch is visible once indexed and durable).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Shared;

impl Shared {
    /// The index loop: inserts the vectors of written batches into their
    /// MemTable's graphs, generation by generation, off the async runtime;
    /// each step makes the batches visible once they are durable too.
    pub(super) async fn run_index(self: Arc<Self>) {
        self.index_all().await;
        self.index_done.store(true, Ordering::Release);
        self.flush_wake.notify_one();
    }

    async fn index_all(&self) {
        loop {
            let closing = self.closing.load(Ordering::Acquire);
            let at = {
                let p = self.progress.borrow();
                if p.error.is_some() {
                    return;
                }
                p.indexed_generation
            };
            let (generation, next) = {
                let layers = self.layers.read().expect("layers poisoned");
                let i = layers
                    .generations
                    .iter()
                    .position(|g| g.number >= at)
                    .expect("the active generation is never flushed");
                (
                    Arc::clone(&layers.generations[i]),
                    layers.generations.get(i + 1).map(|g| g.number),
                )
            };
            // A generation is flushed only once indexed: one that is gone
            // was done.
            if generation.number != at {
                self.progress.send_modify(|p| {
                    p.indexed_generation = generation.number;
                    p.indexed_batches = 0;
                });
                continue;
            }
            let memtable = Arc::clone(&generation.memtable);
            let written = memtable.written_batches();
            if memtable.indexed_batches() < written {
                let threads = self.options.index_threads;
                let indexing =
                    tokio::task::spawn_blocking(move || memtable.index_to(written, threads));
                if let Err(e) = indexing.await {
                    std::panic::resume_unwind(e.into_panic());
                }
            }
            // (Without vector columns every written batch counts as indexed.)
            let indexed = generation.memtable.indexed_batches();
            if self.progress.borrow().indexed_batches < indexed {
                self.progress.send_modify(|p| p.indexed_batches = indexed);
                self.flush_wake.notify_one();
                continue;
            }
            // Frozen (a newer generation exists): no batch comes any more.
            if let Some(next) = next {
                self.progress.send_modify(|p| {
                    p.indexed_generation = next;
                    p.indexed_batches = 0;
                });
                continue;
            }
            if closing {
                return;
            }
            self.index_wake.notified().await;
        }
    }
}
