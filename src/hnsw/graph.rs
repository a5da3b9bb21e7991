//! The HNSW graph (Malkov & Yashunin): searched by any number of readers
//! while it grows, without read-side locks.
//!
//! - Nodes are dense `u32` ids in insertion order. Each node points at its
//!   vector inside an Arrow buffer the graph keeps alive (vectors are not
//!   copied) and knows the row it came from.
//! - Neighbour lists are fixed-stride arrays of atomics (level 0 in flat
//!   segments, upper levels per node), each guarded by a sequence lock:
//!   writers take the lock bit, readers copy the list and retry if the
//!   sequence moved, so a reader never sees a list half rewritten.
//! - Inserters (one `add` at a time, on one or more threads) link nodes;
//!   a node counts as published once it and every node before it is fully
//!   linked. `published` (node count and entry point, one atomic word) is
//!   stored with release and loaded once per search with acquire; a search
//!   never follows a link to a node beyond it.
//! - Levels come from a hash of the node id, so one thread inserting the
//!   same vectors builds the same graph every time.

use std::cmp::{Ordering as CmpOrdering, Reverse};
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Mutex, OnceLock};

use datafusion::arrow::array::{Array, AsArray, FixedSizeListArray};
use datafusion::arrow::buffer::ScalarBuffer;
use datafusion::arrow::datatypes::Float32Type;

use super::kernel::{Kernel, Kernel4, kernels};
use super::persist::Parts;
use crate::schema::{HnswParams, Metric};

/// Nodes in the first segment; segment `s` holds `FIRST_SEGMENT << s`.
const FIRST_SEGMENT: usize = 1024;
/// Enough segments for `u32` node ids.
const SEGMENTS: usize = 23;
/// Highest level a node can get.
pub(super) const MAX_LEVEL: u8 = 16;
/// No node.
const NONE: u32 = u32::MAX;

/// One search result: the distance to the query and the row of the vector.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hit {
    /// Distance to the query, as the graph compares it (squared for L2).
    pub distance: f32,
    /// Row of the vector in the graph's column.
    pub row: u64,
}

/// A distance ordered by `total_cmp` (so it can key a heap).
#[derive(Debug, Clone, Copy, PartialEq)]
struct D(f32);

impl Eq for D {}

impl PartialOrd for D {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}

impl Ord for D {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        self.0.total_cmp(&other.0)
    }
}

/// A pointer to the first value of one vector inside a buffer in
/// [`Graph::buffers`].
#[derive(Clone, Copy)]
struct VectorRef(*const f32);

// SAFETY: the pointee is an immutable Arrow buffer that the graph holds
// (`Graph::buffers`) for as long as the node exists.
unsafe impl Send for VectorRef {}
unsafe impl Sync for VectorRef {}

struct Node {
    vector: VectorRef,
    row: u64,
    /// 1 / |vector| for cosine (0 for a zero vector), else unused.
    inv_norm: f32,
    level: u8,
    /// The lists of levels `1..=level`, `upper_stride` words each.
    upper: Box<[AtomicU32]>,
    /// Set once the node is fully linked.
    linked: AtomicBool,
}

struct Segment {
    nodes: Box<[OnceLock<Node>]>,
    /// Level-0 lists, `level0_stride` words per node.
    level0: Box<[AtomicU32]>,
}

/// A vector prepared for distance computations.
struct Query<'a> {
    vector: &'a [f32],
    inv_norm: f32,
}

/// Generation-tagged visited marks, reused across searches.
#[derive(Default)]
struct Visited {
    marks: Vec<u16>,
    tag: u16,
}

impl Visited {
    fn reset(&mut self, nodes: usize) {
        if self.marks.len() < nodes {
            self.marks.resize(nodes, 0);
        }
        self.tag = self.tag.wrapping_add(1);
        if self.tag == 0 {
            self.marks.fill(0);
            self.tag = 1;
        }
    }

    /// Marks `id`; false if it was marked already.
    fn insert(&mut self, id: u32) -> bool {
        let mark = &mut self.marks[id as usize];
        let fresh = *mark != self.tag;
        *mark = self.tag;
        fresh
    }
}

/// An HNSW graph over `dim`-dimensional `f32` vectors. See the module doc
/// for the concurrency contract.
pub struct Graph {
    dim: usize,
    metric: Metric,
    params: HnswParams,
    seed: u64,
    kernel: Kernel,
    kernel4: Kernel4,
    level0_stride: usize,
    upper_stride: usize,
    segments: [OnceLock<Segment>; SEGMENTS],
    /// Nodes set up for insertion (ids below it have a `Node`).
    reserved: AtomicU32,
    /// `published nodes << 32 | entry node`, for readers.
    published: AtomicU64,
    /// `(entry node, its level)` for inserters; may be unpublished.
    entry: Mutex<(u32, u8)>,
    /// Held for the whole insertion of a node above the entry's level, so
    /// two such nodes link to each other on the levels they share.
    rising: Mutex<()>,
    publish_lock: Mutex<()>,
    /// The buffers the vectors live in.
    buffers: Mutex<Vec<ScalarBuffer<f32>>>,
    /// One `add` at a time.
    adding: Mutex<()>,
    visited: Mutex<Vec<Visited>>,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("dim", &self.dim)
            .field("metric", &self.metric)
            .field("nodes", &self.len())
            .finish()
    }
}

impl Graph {
    /// An empty graph; `seed` picks the node levels.
    pub fn new(dim: usize, metric: Metric, params: HnswParams, seed: u64) -> Self {
        assert!(params.m >= 2, "HNSW needs m >= 2");
        let k = kernels();
        Self {
            dim,
            metric,
            params,
            seed,
            kernel: match metric {
                Metric::L2 => k.l2,
                Metric::Dot | Metric::Cosine => k.dot,
            },
            kernel4: match metric {
                Metric::L2 => k.l2_x4,
                Metric::Dot | Metric::Cosine => k.dot_x4,
            },
            level0_stride: 2 + 2 * params.m,
            upper_stride: 2 + params.m,
            segments: std::array::from_fn(|_| OnceLock::new()),
            reserved: AtomicU32::new(0),
            published: AtomicU64::new(NONE as u64),
            entry: Mutex::new((NONE, 0)),
            rising: Mutex::new(()),
            publish_lock: Mutex::new(()),
            buffers: Mutex::new(Vec::new()),
            adding: Mutex::new(()),
            visited: Mutex::new(Vec::new()),
        }
    }

    /// The vector dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The metric.
    pub fn metric(&self) -> Metric {
        self.metric
    }

    /// The parameters it is built with.
    pub fn params(&self) -> HnswParams {
        self.params
    }

    /// Published nodes: fully linked, visible to searches.
    pub fn len(&self) -> usize {
        (self.published.load(Ordering::Acquire) >> 32) as usize
    }

    /// Memory the graph's nodes and lists take (not the vectors).
    pub fn bytes(&self) -> usize {
        let nodes = self.reserved.load(Ordering::Acquire) as usize;
        let level0 = self.level0_stride * 4 + std::mem::size_of::<OnceLock<Node>>();
        // Upper levels: about 1/m of the nodes per level.
        let upper = self.upper_stride * 4 / (self.params.m - 1);
        nodes * (level0 + upper)
    }

    /// Whether no node is published.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds every non-null vector of `vectors` (row `i` is row
    /// `first_row + i`) on `threads` threads and returns when all of them
    /// are published. Null vectors get no node. One `add` runs at a time;
    /// searches may run throughout.
    pub fn add(&self, vectors: &FixedSizeListArray, first_row: u64, threads: usize) {
        self.add_all(&[(vectors, first_row)], threads);
    }

    /// [`Graph::add`] of several arrays at once, in order: the threads
    /// share the inserts of all of them, so many small arrays (a MemTable's
    /// small puts) are inserted as fast as one large one.
    pub fn add_all(&self, parts: &[(&FixedSizeListArray, u64)], threads: usize) {
        let _one = self.adding.lock().expect("graph add lock poisoned");
        let start = self.reserved.load(Ordering::Relaxed);
        let mut end = start;
        for &(vectors, first_row) in parts {
            assert_eq!(
                vectors.value_length() as usize,
                self.dim,
                "vector dimension does not match the graph"
            );
            let values = vectors
                .values()
                .as_primitive::<Float32Type>()
                .values()
                .clone();
            for i in 0..vectors.len() {
                if vectors.is_null(i) {
                    continue;
                }
                let offset = vectors.value_offset(i) as usize;
                let vector = &values[offset..offset + self.dim];
                self.set_node(end, vector, first_row + i as u64, self.level_of(end), false);
                end += 1;
            }
            self.buffers
                .lock()
                .expect("graph buffers poisoned")
                .push(values);
        }
        self.reserved.store(end, Ordering::Release);

        let threads = threads.clamp(1, ((end - start) as usize).div_ceil(64).max(1));
        let mut order: Vec<u32> = (start..end).collect();
        // On several threads the nodes above level 0 go first (as faiss
        // orders its inserts), and the others only once they are all in:
        // the levels a search descends through are whole before the bulk
        // of the nodes is linked. In id order about one build in 60 searched
        // worse (recall down to 0.97 where others reached 1.0).
        let mut upper = 0;
        if threads > 1 {
            order.sort_by_key(|&id| Reverse(self.node(id).level));
            upper = order.partition_point(|&id| self.node(id).level > 0);
        }
        let next = AtomicUsize::new(0);
        let work = |stop: usize| {
            let mut visited = self.take_visited();
            loop {
                let at = next.fetch_add(1, Ordering::Relaxed);
                if at >= stop {
                    break;
                }
                let id = order[at];
                self.insert(id, &mut visited);
                self.node(id).linked.store(true, Ordering::Release);
                self.advance_published();
            }
            self.return_visited(visited);
        };
        if threads == 1 {
            work(order.len());
        } else {
            for stop in [upper, order.len()] {
                std::thread::scope(|s| {
                    for _ in 1..threads {
                        s.spawn(|| work(stop));
                    }
                    work(stop);
                });
                next.store(stop, Ordering::Relaxed);
            }
        }
    }

    /// The `k` nodes nearest to `query` among the published ones whose row
    /// `accept` admits, nearest first, searching with a candidate list of
    /// `max(ef, k)`. Distances are exact; the set is approximate.
    pub fn search(
        &self,
        query: &[f32],
        k: usize,
        ef: usize,
        accept: &dyn Fn(u64) -> bool,
    ) -> Vec<Hit> {
        assert_eq!(query.len(), self.dim, "query dimension does not match");
        let published = self.published.load(Ordering::Acquire);
        let (len, entry) = ((published >> 32) as u32, published as u32);
        if len == 0 || k == 0 {
            return Vec::new();
        }
        let q = self.query(query);
        let mut current = (self.distance(&q, entry), entry);
        for level in (1..=self.node(entry).level as usize).rev() {
            current = self.greedy(&q, current, level, len);
        }
        let mut visited = self.take_visited();
        let found = self.search_layer(
            &q,
            &[current],
            ef.max(k),
            0,
            len,
            &|id| accept(self.node(id).row),
            &mut visited,
        );
        self.return_visited(visited);
        found
            .into_iter()
            .take(k)
            .map(|(d, id)| Hit {
                distance: d.0,
                row: self.node(id).row,
            })
            .collect()
    }

    fn level_of(&self, id: u32) -> u8 {
        // SplitMix64 of the seed and the id: a uniform draw in (0, 1].
        let mut z = self.seed ^ (id as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let uniform = ((z >> 11) + 1) as f64 / (1u64 << 53) as f64;
        let level = -uniform.ln() / (self.params.m as f64).ln();
        (level as u8).min(MAX_LEVEL)
    }

    /// Creates node `id` (not yet reserved) for `vector`, which lives in a
    /// buffer the caller adds to `buffers`; its lists are empty.
    fn set_node(&self, id: u32, vector: &[f32], row: u64, level: u8, linked: bool) {
        let node = Node {
            vector: VectorRef(vector.as_ptr()),
            row,
            inv_norm: self.inv_norm(vector),
            level,
            upper: (0..level as usize * self.upper_stride)
                .map(|_| AtomicU32::new(0))
                .collect(),
            linked: AtomicBool::new(linked),
        };
        let (segment, offset) = locate(id);
        if self.segment(segment).nodes[offset].set(node).is_err() {
            unreachable!("graph node {id} set twice");
        }
    }

    fn segment(&self, segment: usize) -> &Segment {
        self.segments[segment].get_or_init(|| {
            let nodes = FIRST_SEGMENT << segment;
            Segment {
                nodes: (0..nodes).map(|_| OnceLock::new()).collect(),
                level0: (0..nodes * self.level0_stride)
                    .map(|_| AtomicU32::new(0))
                    .collect(),
            }
        })
    }

    fn node(&self, id: u32) -> &Node {
        let (segment, offset) = locate(id);
        self.segments[segment]
            .get()
            .and_then(|s| s.nodes[offset].get())
            .expect("graph node read before it was reserved")
    }

    /// The list of `id` at `level`: `[sequence, count, ids...]`.
    fn list(&self, id: u32, level: usize) -> &[AtomicU32] {
        if level == 0 {
            let (segment, offset) = locate(id);
            let segment = self.segments[segment]
                .get()
                .expect("graph node read before it was reserved");
            &segment.level0[offset * self.level0_stride..(offset + 1) * self.level0_stride]
        } else {
            let start = (level - 1) * self.upper_stride;
            &self.node(id).upper[start..start + self.upper_stride]
        }
    }

    fn vector(&self, node: &Node) -> &[f32] {
        // SAFETY: `node.vector` points at `dim` floats of a buffer in
        // `self.buffers`, which lives as long as `self`.
        unsafe { std::slice::from_raw_parts(node.vector.0, self.dim) }
    }

    fn query<'a>(&self, vector: &'a [f32]) -> Query<'a> {
        Query {
            vector,
            inv_norm: self.inv_norm(vector),
        }
    }

    /// 1 / |vector| for cosine (0 for a zero vector); 1 otherwise.
    fn inv_norm(&self, vector: &[f32]) -> f32 {
        match self.metric {
            Metric::Cosine => {
                let norm = (self.kernel)(vector, vector).sqrt();
                if norm > 0.0 { 1.0 / norm } else { 0.0 }
            }
            _ => 1.0,
        }
    }

    fn node_query(&self, id: u32) -> Query<'_> {
        let node = self.node(id);
        Query {
            vector: self.vector(node),
            inv_norm: node.inv_norm,
        }
    }

    fn distance(&self, q: &Query, id: u32) -> D {
        let node = self.node(id);
        self.finish(q, node, (self.kernel)(q.vector, self.vector(node)))
    }

    /// The distances from `q` to each of `ids`, four at a time.
    fn distances(&self, q: &Query, ids: &[u32], out: &mut Vec<D>) {
        out.clear();
        let mut chunks = ids.chunks_exact(4);
        for four in &mut chunks {
            let nodes = [0, 1, 2, 3].map(|j| self.node(four[j]));
            let raw = (self.kernel4)(q.vector, nodes.map(|n| self.vector(n)));
            out.extend((0..4).map(|j| self.finish(q, nodes[j], raw[j])));
        }
        out.extend(chunks.remainder().iter().map(|&id| self.distance(q, id)));
    }

    /// The metric's distance from a kernel's raw result.
    fn finish(&self, q: &Query, node: &Node, raw: f32) -> D {
        D(match self.metric {
            Metric::L2 => raw,
            Metric::Dot => -raw,
            Metric::Cosine => 1.0 - raw * q.inv_norm * node.inv_norm,
        })
    }

    fn prefetch(&self, id: u32) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            let p = self.node(id).vector.0 as *const i8;
            // SAFETY: a prefetch never faults; the address is the vector's.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(p);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64));
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = id;
    }

    /// Moves to the nearest neighbour at `level` until none is nearer.
    fn greedy(&self, q: &Query, mut current: (D, u32), level: usize, limit: u32) -> (D, u32) {
        let mut links = Vec::with_capacity(self.params.m);
        let mut distances = Vec::with_capacity(self.params.m);
        loop {
            let mut moved = false;
            read_list(self.list(current.1, level), &mut links);
            links.retain(|&n| n < limit);
            self.distances(q, &links, &mut distances);
            for (&n, &d) in links.iter().zip(&distances) {
                if d < current.0 {
                    current = (d, n);
                    moved = true;
                }
            }
            if !moved {
                return current;
            }
        }
    }

    /// Best-first search of `level` from `entries` with a result list of
    /// `ef` accepted nodes; nodes at or above `limit` are ignored. Nearest
    /// first.
    #[allow(clippy::too_many_arguments)]
    fn search_layer(
        &self,
        q: &Query,
        entries: &[(D, u32)],
        ef: usize,
        level: usize,
        limit: u32,
        accept: &dyn Fn(u32) -> bool,
        visited: &mut Visited,
    ) -> Vec<(D, u32)> {
        visited.reset(limit as usize);
        let mut candidates = BinaryHeap::new();
        let mut results: BinaryHeap<(D, u32)> = BinaryHeap::new();
        for &(d, id) in entries {
            if visited.insert(id) {
                candidates.push(Reverse((d, id)));
                if accept(id) {
                    results.push((d, id));
                }
            }
        }
        while results.len() > ef {
            results.pop();
        }
        let bound = |r: &BinaryHeap<(D, u32)>| match r.len() >= ef {
            true => r.peek().map_or(D(f32::INFINITY), |x| x.0),
            false => D(f32::INFINITY),
        };
        let mut worst = bound(&results);
        let mut links = Vec::with_capacity(2 * self.params.m);
        let mut distances = Vec::with_capacity(2 * self.params.m);
        while let Some(Reverse((d, c))) = candidates.pop() {
            if d > worst {
                break;
            }
            read_list(self.list(c, level), &mut links);
            links.retain(|&n| n < limit && visited.insert(n));
            for &n in &links {
                self.prefetch(n);
            }
            self.distances(q, &links, &mut distances);
            for (&n, &dn) in links.iter().zip(&distances) {
                if dn < worst {
                    candidates.push(Reverse((dn, n)));
                    if accept(n) {
                        results.push((dn, n));
                        if results.len() > ef {
                            results.pop();
                        }
                        worst = bound(&results);
                    }
                }
            }
        }
        results.into_sorted_vec()
    }

    /// Keeps at most `m` of `candidates` (nearest first) as links of
    /// `base`: a candidate is kept only if it is nearer to the base than to
    /// every kept one, so links spread in all directions (the paper's
    /// heuristic). Copies of the base (the same vector) are the exception:
    /// they are as near to every candidate as the base is, so they prune
    /// nothing, and at most [`COPY_LINKS`] of them are kept. Without that
    /// rule, a vector stored more times than a list holds links (rows with
    /// the same embedding; versions of a row whose vector did not change)
    /// made copies link only to copies: a group no search could leave.
    ///
    /// Inner product is no metric (a vector of a large norm is "nearer" to
    /// a candidate than the base is, whatever their angle), so with it the
    /// test dropped most candidates and left graphs over vectors of one
    /// sign too sparse to search: for it, "nearer" in the test is by
    /// Euclidean distance (the candidates still come nearest first by
    /// inner product).
    fn select(&self, base: u32, candidates: &[(D, u32)], m: usize) -> Vec<(D, u32)> {
        let base_vector = self.vector(self.node(base));
        let euclidean = kernels().l2;
        let spreads = |c: u32, d: D, spread: &[u32]| match self.metric {
            Metric::Dot => {
                let v = self.vector(self.node(c));
                let to_base = euclidean(v, base_vector);
                (spread.iter()).all(|&s| euclidean(v, self.vector(self.node(s))) >= to_base)
            }
            _ => self.none_nearer(&self.node_query(c), spread, d),
        };
        let mut kept: Vec<(D, u32)> = Vec::with_capacity(m);
        let mut spread: Vec<u32> = Vec::with_capacity(m);
        let mut copies = 0;
        for &(d, c) in candidates {
            if kept.len() >= m {
                break;
            }
            if self.vector(self.node(c)) == base_vector {
                if copies < COPY_LINKS {
                    kept.push((d, c));
                    copies += 1;
                }
            } else if spreads(c, d, &spread) {
                kept.push((d, c));
                spread.push(c);
            }
        }
        kept
    }

    /// Whether no node of `ids` is nearer than `d` to `q` (four distances
    /// per kernel call).
    fn none_nearer(&self, q: &Query, ids: &[u32], d: D) -> bool {
        let mut chunks = ids.chunks_exact(4);
        for four in &mut chunks {
            let nodes = [0, 1, 2, 3].map(|j| self.node(four[j]));
            let raw = (self.kernel4)(q.vector, nodes.map(|n| self.vector(n)));
            if (0..4).any(|j| self.finish(q, nodes[j], raw[j]) < d) {
                return false;
            }
        }
        chunks.remainder().iter().all(|&s| self.distance(q, s) >= d)
    }

    fn insert(&self, id: u32, visited: &mut Visited) {
        let level = self.node(id).level;
        let read_entry = || {
            let mut entry = self.entry.lock().expect("graph entry poisoned");
            if entry.0 == NONE {
                *entry = (id, level);
                return None;
            }
            Some(*entry)
        };
        let Some((mut entry, mut top)) = read_entry() else {
            return;
        };
        // A node rising above the top is inserted alone, from the entry as
        // it is then: two rising at once would each link only below the old
        // top, and the one that lost the entry would be cut off above it.
        let _rising = (level > top).then(|| self.rising.lock().expect("graph rising poisoned"));
        if _rising.is_some() {
            (entry, top) = read_entry().expect("the graph has an entry");
        }
        let q = self.node_query(id);
        let limit = self.reserved.load(Ordering::Acquire);
        let mut current = (self.distance(&q, entry), entry);
        for l in (level as usize + 1..=top as usize).rev() {
            current = self.greedy(&q, current, l, limit);
        }
        let mut entries = vec![current];
        for l in (0..=level.min(top) as usize).rev() {
            let mut found = self.search_layer(
                &q,
                &entries,
                self.params.ef_construction,
                l,
                limit,
                &|_| true,
                visited,
            );
            found.retain(|&(_, n)| n != id);
            newest_first_among_ties(&mut found);
            let chosen = self.select(id, &found, self.params.m);
            self.set_links(id, l, &chosen);
            for &(_, n) in &chosen {
                self.link(n, id, l);
            }
            if !found.is_empty() {
                entries = found;
            }
        }
        if level > top {
            let mut entry = self.entry.lock().expect("graph entry poisoned");
            if level > entry.1 {
                *entry = (id, level);
            }
        }
    }

    /// Sets the list of a node being inserted at `level` to `chosen`,
    /// keeping links other inserters added meanwhile (re-selecting when
    /// together they are too many).
    fn set_links(&self, id: u32, level: usize, chosen: &[(D, u32)]) {
        let list = self.list(id, level);
        lock_list(list);
        let count = list[1].load(Ordering::Relaxed) as usize;
        let mut ids: Vec<u32> = chosen.iter().map(|&(_, n)| n).collect();
        let added: Vec<u32> = list[2..2 + count]
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .filter(|n| !ids.contains(n))
            .collect();
        let max = self.max_links(level);
        let kept: Vec<u32> = if ids.len() + added.len() <= max {
            ids.extend(added);
            ids
        } else {
            ids.extend(added);
            self.reselect(id, ids, max)
        };
        for (slot, n) in list[2..].iter().zip(&kept) {
            slot.store(*n, Ordering::Relaxed);
        }
        list[1].store(kept.len() as u32, Ordering::Relaxed);
        unlock_list(list);
    }

    fn max_links(&self, level: usize) -> usize {
        if level == 0 {
            2 * self.params.m
        } else {
            self.params.m
        }
    }

    /// The heuristic's choice of at most `max` of `ids` as links of `base`.
    fn reselect(&self, base: u32, ids: Vec<u32>, max: usize) -> Vec<u32> {
        let q = self.node_query(base);
        let mut distances = Vec::with_capacity(ids.len());
        self.distances(&q, &ids, &mut distances);
        let mut all: Vec<(D, u32)> = distances.into_iter().zip(ids).collect();
        newest_first_among_ties(&mut all);
        self.select(base, &all, max)
            .into_iter()
            .map(|(_, n)| n)
            .collect()
    }

    /// Adds `new` to the list of `base` at `level`, re-selecting the list
    /// with the heuristic when it is full.
    fn link(&self, base: u32, new: u32, level: usize) {
        let max = self.max_links(level);
        let list = self.list(base, level);
        lock_list(list);
        let count = list[1].load(Ordering::Relaxed) as usize;
        if list[2..2 + count]
            .iter()
            .any(|n| n.load(Ordering::Relaxed) == new)
        {
            // Two nodes inserted at once chose each other: each has the
            // other already.
        } else if count < max {
            list[2 + count].store(new, Ordering::Relaxed);
            list[1].store(count as u32 + 1, Ordering::Relaxed);
        } else {
            let ids: Vec<u32> = list[2..2 + count]
                .iter()
                .map(|n| n.load(Ordering::Relaxed))
                .chain(std::iter::once(new))
                .collect();
            let kept = self.reselect(base, ids, max);
            for (slot, n) in list[2..].iter().zip(&kept) {
                slot.store(*n, Ordering::Relaxed);
            }
            list[1].store(kept.len() as u32, Ordering::Relaxed);
        }
        unlock_list(list);
    }

    /// Publishes the linked prefix of the nodes, with the highest node as
    /// the readers' entry point.
    fn advance_published(&self) {
        let _one = self.publish_lock.lock().expect("graph publish poisoned");
        let published = self.published.load(Ordering::Relaxed);
        let (start, mut entry) = ((published >> 32) as u32, published as u32);
        let reserved = self.reserved.load(Ordering::Acquire);
        let mut len = start;
        while len < reserved && self.node(len).linked.load(Ordering::Acquire) {
            if entry == NONE || self.node(len).level > self.node(entry).level {
                entry = len;
            }
            len += 1;
        }
        if len != start {
            self.published
                .store((len as u64) << 32 | entry as u64, Ordering::Release);
        }
    }

    /// This graph's published nodes and links over other rows: each
    /// node's row mapped through `position` into `vectors` (rows × dim),
    /// nodes whose row maps to `None` dropped and bridged over. The caller
    /// guarantees that row `position(r)` of `vectors` holds the vector of
    /// row `r`. More vectors may be added to the result.
    pub fn remapped(
        &self,
        position: &dyn Fn(u64) -> Option<u64>,
        vectors: ScalarBuffer<f32>,
    ) -> Graph {
        Graph::from_parts(self.export(position), vectors)
    }

    /// The rows of the published nodes, in node order.
    pub fn rows(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.len() as u32).map(|id| self.node(id).row)
    }

    /// The published nodes' structure (see [`Graph::encode`]): rows mapped
    /// through `position`, nodes whose row maps to `None` dropped and
    /// bridged over, the rest numbered in order of their new rows.
    pub(super) fn export(&self, position: &dyn Fn(u64) -> Option<u64>) -> Parts {
        let published = self.published.load(Ordering::Acquire);
        let (len, entry) = ((published >> 32) as u32, published as u32);
        let mut kept: Vec<(u64, u32)> = (0..len)
            .filter_map(|id| position(self.node(id).row).map(|p| (p, id)))
            .collect();
        kept.sort_unstable();
        let mut renumbered = vec![NONE; len as usize];
        for (new, &(_, old)) in kept.iter().enumerate() {
            renumbered[old as usize] = new as u32;
        }
        let is_kept = |n: u32| n < len && renumbered[n as usize] != NONE;
        let (mut list, mut bridge) = (Vec::new(), Vec::new());
        let links = kept
            .iter()
            .map(|&(_, id)| {
                (0..=self.node(id).level as usize)
                    .map(|level| {
                        read_list(self.list(id, level), &mut list);
                        let mut ids: Vec<u32> =
                            list.iter().copied().filter(|&n| is_kept(n)).collect();
                        if ids.len() < list.len() {
                            // Each dropped neighbour's neighbours take its place.
                            for &gone in list.iter().filter(|&&n| n < len && !is_kept(n)) {
                                read_list(self.list(gone, level), &mut bridge);
                                for &n in &bridge {
                                    if n != id && is_kept(n) && !ids.contains(&n) {
                                        ids.push(n);
                                    }
                                }
                            }
                            let max = self.max_links(level);
                            if ids.len() > max {
                                ids = self.reselect(id, ids, max);
                            }
                        }
                        ids.iter().map(|&n| renumbered[n as usize]).collect()
                    })
                    .collect()
            })
            .collect();
        let entry = if is_kept(entry) {
            renumbered[entry as usize]
        } else {
            // The first kept node of the highest level.
            let top = kept.iter().map(|&(_, id)| self.node(id).level).max();
            kept.iter()
                .position(|&(_, id)| Some(self.node(id).level) == top)
                .unwrap_or(0) as u32
        };
        Parts {
            dim: self.dim,
            metric: self.metric,
            params: self.params,
            seed: self.seed,
            entry,
            rows: kept.iter().map(|&(row, _)| row).collect(),
            links,
        }
    }

    /// The graph `parts` describe over `vectors` (checked by the caller:
    /// every row and link in range, the entry on the top level), complete
    /// and published.
    pub(super) fn from_parts(parts: Parts, vectors: ScalarBuffer<f32>) -> Graph {
        let graph = Graph::new(parts.dim, parts.metric, parts.params, parts.seed);
        for (id, (&row, lists)) in parts.rows.iter().zip(&parts.links).enumerate() {
            let vector = &vectors[row as usize * graph.dim..][..graph.dim];
            let level = (lists.len() - 1) as u8;
            graph.set_node(id as u32, vector, row, level, true);
            for (level, ids) in lists.iter().enumerate() {
                let list = graph.list(id as u32, level);
                for (slot, &n) in list[2..].iter().zip(ids) {
                    slot.store(n, Ordering::Relaxed);
                }
                list[1].store(ids.len() as u32, Ordering::Relaxed);
            }
        }
        let len = parts.rows.len() as u32;
        graph
            .buffers
            .lock()
            .expect("graph buffers poisoned")
            .push(vectors);
        graph.reserved.store(len, Ordering::Release);
        if len > 0 {
            let top = (parts.links[parts.entry as usize].len() - 1) as u8;
            *graph.entry.lock().expect("graph entry poisoned") = (parts.entry, top);
            graph
                .published
                .store((len as u64) << 32 | parts.entry as u64, Ordering::Release);
        }
        graph
    }

    fn take_visited(&self) -> Visited {
        self.visited
            .lock()
            .expect("visited pool poisoned")
            .pop()
            .unwrap_or_default()
    }

    fn return_visited(&self, visited: Visited) {
        self.visited
            .lock()
            .expect("visited pool poisoned")
            .push(visited);
    }
}

/// The most links a node keeps to copies of itself (see [`Graph::select`]).
const COPY_LINKS: usize = 2;

/// Sorts `nodes` nearest first, and among nodes as near the newest
/// (highest id) first: of the versions of a row with one vector, links go
/// to the newest, the one a search accepts.
fn newest_first_among_ties(nodes: &mut [(D, u32)]) {
    nodes.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
}

fn locate(id: u32) -> (usize, usize) {
    let n = id as usize / FIRST_SEGMENT + 1;
    let segment = (usize::BITS - 1 - n.leading_zeros()) as usize;
    (segment, id as usize - FIRST_SEGMENT * ((1 << segment) - 1))
}

/// Copies a list's ids into `out`, retrying while a writer holds it or
/// changed it meanwhile (a sequence lock: never a mix of two versions).
fn read_list(list: &[AtomicU32], out: &mut Vec<u32>) {
    let mut spins = 0u32;
    loop {
        let before = list[0].load(Ordering::Acquire);
        if before & 1 == 1 {
            back_off(&mut spins);
            continue;
        }
        out.clear();
        let count = (list[1].load(Ordering::Relaxed) as usize).min(list.len() - 2);
        out.extend(list[2..2 + count].iter().map(|n| n.load(Ordering::Relaxed)));
        fence(Ordering::Acquire);
        if list[0].load(Ordering::Relaxed) == before {
            return;
        }
    }
}

fn lock_list(list: &[AtomicU32]) {
    let mut spins = 0u32;
    loop {
        let sequence = list[0].load(Ordering::Relaxed);
        if sequence & 1 == 0
            && list[0]
                .compare_exchange_weak(sequence, sequence + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            fence(Ordering::Release);
            return;
        }
        back_off(&mut spins);
    }
}

/// Spins a little, then yields: a list's writer may have been preempted
/// while it holds the list (it computes distances under the lock).
fn back_off(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

fn unlock_list(list: &[AtomicU32]) {
    list[0].fetch_add(1, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hnsw::dataset::{Shape, exact_neighbours, recall, to_array as array, vectors};
    use crate::hnsw::distance;
    use datafusion::arrow::array::Float32Array;
    use datafusion::arrow::datatypes::{DataType, Field};
    use std::collections::{HashMap, HashSet};
    use std::sync::Arc;

    #[test]
    fn segments_cover_every_id_once() {
        let mut seen = std::collections::HashSet::new();
        for id in 0..100_000u32 {
            let (s, o) = locate(id);
            assert!(o < FIRST_SEGMENT << s);
            assert!(seen.insert((s, o)));
        }
    }

    #[test]
    fn finds_neighbours_for_every_metric_and_skips_nulls() {
        let dim = 16;
        let data = vectors(
            Shape::Clustered {
                clusters: 8,
                spread: 0.3,
            },
            2_000,
            dim,
            7,
            0,
        );
        let queries = vectors(
            Shape::Clustered {
                clusters: 8,
                spread: 0.3,
            },
            50,
            dim,
            7,
            1,
        );
        for (metric, reference) in [
            (Metric::L2, distance::l2 as fn(&[f32], &[f32]) -> f32),
            (Metric::Cosine, distance::cosine),
            (Metric::Dot, distance::dot),
        ] {
            let graph = Graph::new(dim, metric, HnswParams::default(), 1);
            // In three appends, on two threads.
            for (i, part) in data.chunks(700 * dim).enumerate() {
                graph.add(&array(part, dim), (i * 700) as u64, 2);
            }
            assert_eq!(graph.len(), 2_000);
            let truth = exact_neighbours(&data, &queries, dim, 10, reference);
            let found: Vec<Vec<u32>> = queries
                .chunks(dim)
                .map(|q| {
                    let hits = graph.search(q, 10, 64, &|_| true);
                    for h in &hits {
                        let v = &data[h.row as usize * dim..][..dim];
                        assert!((h.distance - reference(q, v)).abs() < 1e-4, "{metric:?}");
                    }
                    hits.iter().map(|h| h.row as u32).collect()
                })
                .collect();
            let r = recall(&found, &truth);
            assert!(r >= 0.98, "{metric:?}: recall {r}");
            // A filter admits only even rows.
            let hits = graph.search(&queries[..dim], 10, 64, &|row| row % 2 == 0);
            assert_eq!(hits.len(), 10);
            assert!(hits.iter().all(|h| h.row % 2 == 0));
        }

        // Null vectors get no node; rows keep their numbers.
        let with_nulls = FixedSizeListArray::new(
            Arc::new(Field::new("item", DataType::Float32, true)),
            2,
            Arc::new(Float32Array::from(vec![0.0, 0.0, 9.0, 9.0, 1.0, 1.0])),
            Some(vec![true, false, true].into()),
        );
        let graph = Graph::new(2, Metric::L2, HnswParams::default(), 1);
        graph.add(&with_nulls, 100, 1);
        assert_eq!(graph.len(), 2);
        let rows: Vec<u64> = graph
            .search(&[9.0, 9.0], 5, 10, &|_| true)
            .iter()
            .map(|h| h.row)
            .collect();
        assert_eq!(rows, vec![102, 100]);
    }

    /// Panics unless every level of `graph` is reachable from its entry
    /// (each node on each level up to its own) and no list holds a link
    /// twice.
    fn assert_well_formed(graph: &Graph) {
        let nodes = graph.len() as u32;
        let entry = graph.published.load(Ordering::Acquire) as u32;
        let mut links = Vec::new();
        for level in 0..=graph.node(entry).level as usize {
            let mut seen = vec![false; nodes as usize];
            seen[entry as usize] = true;
            let mut next = vec![entry];
            while let Some(id) = next.pop() {
                read_list(graph.list(id, level), &mut links);
                let mut distinct = links.clone();
                distinct.sort_unstable();
                distinct.dedup();
                assert_eq!(
                    distinct.len(),
                    links.len(),
                    "node {id} level {level}: {links:?}"
                );
                for &n in &links {
                    if !std::mem::replace(&mut seen[n as usize], true) {
                        next.push(n);
                    }
                }
            }
            let cut_off = (0..nodes)
                .filter(|&id| graph.node(id).level as usize >= level && !seen[id as usize])
                .count();
            assert_eq!(cut_off, 0, "nodes not reachable on level {level}");
        }
    }

    /// Graphs built on two threads stay whole: two nodes rising above the
    /// top at once left one cut off above the old top (in id order this
    /// test then failed about one run in five), and two nodes inserted at
    /// once could link each other twice.
    #[test]
    fn graphs_built_on_two_threads_are_connected_on_every_level() {
        let dim = 8;
        let shape = Shape::Clustered {
            clusters: 8,
            spread: 0.3,
        };
        let data = vectors(shape, 300, dim, 3, 0);
        let data = array(&data, dim);
        for _ in 0..500 {
            let graph = Graph::new(dim, Metric::L2, HnswParams::default(), 1);
            graph.add(&data, 0, 2);
            assert_well_formed(&graph);
        }
    }

    /// Many small arrays added at once (a MemTable's small puts) are
    /// inserted on all threads, keep their rows, and search as well as
    /// one large add.
    #[test]
    fn small_arrays_added_together_keep_their_rows_and_recall() {
        let dim = 16;
        let shape = Shape::Clustered {
            clusters: 8,
            spread: 0.3,
        };
        let data = vectors(shape, 1_000, dim, 3, 0);
        let queries = vectors(shape, 50, dim, 3, 1);
        let arrays: Vec<_> = data.chunks(10 * dim).map(|p| array(p, dim)).collect();
        // Rows start at 5,000; each array of 10 follows the one before.
        let parts: Vec<_> = arrays
            .iter()
            .enumerate()
            .map(|(i, a)| (a, 5_000 + 10 * i as u64))
            .collect();
        let graph = Graph::new(dim, Metric::L2, HnswParams::default(), 1);
        graph.add_all(&parts, 2);
        assert_eq!(graph.len(), 1_000);
        for row in [0, 9, 10, 555, 999] {
            let hit = graph.search(&data[row * dim..][..dim], 1, 32, &|_| true)[0];
            assert_eq!(hit.row, 5_000 + row as u64);
            assert!(hit.distance.abs() < 1e-6);
        }
        let truth = exact_neighbours(&data, &queries, dim, 10, distance::l2);
        let found: Vec<Vec<u32>> = queries
            .chunks(dim)
            .map(|q| graph.search(q, 10, 64, &|_| true))
            .map(|hits| hits.iter().map(|h| (h.row - 5_000) as u32).collect())
            .collect();
        // Two threads interleave differently from run to run and so build
        // different graphs: over 1,800 builds of this one under load, recall
        // was 1.0 in every one (with the nodes in id order: in 98 %, and
        // 0.968 at the lowest).
        let r = recall(&found, &truth);
        assert!(r >= 0.98, "recall {r}");
        assert_well_formed(&graph);
    }

    /// A graph carried over to other rows (a compaction's output: rows
    /// reordered, some dropped) and completed with new vectors finds every
    /// row where it now is and searches as well as a graph built anew.
    #[test]
    fn a_remapped_graph_completed_with_new_rows_keeps_its_recall() {
        use datafusion::arrow::buffer::NullBuffer;
        let (dim, old, new) = (16, 2_000, 1_000);
        let shape = Shape::Clustered {
            clusters: 8,
            spread: 0.3,
        };
        let data = vectors(shape, old + new, dim, 5, 0);
        let queries = vectors(shape, 50, dim, 5, 1);
        let graph = Graph::new(dim, Metric::L2, HnswParams::default(), 1);
        graph.add(&array(&data[..old * dim], dim), 0, 2);
        // The output: every vector but one old one in ten, shuffled.
        let mut order: Vec<usize> = (0..old + new)
            .filter(|&i| i >= old || i % 10 != 3)
            .collect();
        order.sort_by_key(|&i| (i * 7_919) % 3_001);
        let mut at = vec![None; old + new];
        let mut output = Vec::with_capacity(order.len() * dim);
        for (position, &i) in order.iter().enumerate() {
            at[i] = Some(position as u64);
            output.extend_from_slice(&data[i * dim..][..dim]);
        }
        let seeded = graph.remapped(&|row| at[row as usize], output.clone().into());
        assert_eq!(seeded.len(), old - old / 10);
        let mut todo = vec![true; order.len()];
        for row in seeded.rows() {
            assert!(order[row as usize] < old, "only old rows are carried over");
            todo[row as usize] = false;
        }
        let rest = FixedSizeListArray::new(
            Arc::new(Field::new_list_field(DataType::Float32, true)),
            dim as i32,
            Arc::new(Float32Array::from(output.clone())),
            Some(NullBuffer::from(todo)),
        );
        seeded.add(&rest, 0, 2);
        assert_eq!(seeded.len(), order.len());
        for position in [0, 1, 500, order.len() - 1] {
            let hit = seeded.search(&output[position * dim..][..dim], 1, 32, &|_| true)[0];
            assert_eq!(hit.row, position as u64);
            assert!(hit.distance.abs() < 1e-6);
        }
        let truth = exact_neighbours(&output, &queries, dim, 10, distance::l2);
        let found: Vec<Vec<u32>> = queries
            .chunks(dim)
            .map(|q| seeded.search(q, 10, 64, &|_| true))
            .map(|hits| hits.iter().map(|h| h.row as u32).collect())
            .collect();
        let r = recall(&found, &truth);
        assert!(r >= 0.98, "recall {r}");
    }

    /// The share of `graph`'s nodes a search can reach at all (a
    /// candidate list as long as the graph walks its whole component).
    fn reach(graph: &Graph, query: &[f32]) -> f64 {
        let n = graph.len();
        graph.search(query, n, n, &|_| true).len() as f64 / n as f64
    }

    /// The smallest parameters a table accepts build a graph searches can
    /// walk on every shape of data; the smallest it used to accept
    /// (m = 2, ef_construction = 1) did not: a search reached a few nodes.
    #[test]
    fn the_smallest_accepted_parameters_build_a_navigable_graph() {
        let (dim, n) = (32, 4_000);
        let m = *HnswParams::M.start();
        let floor = HnswParams {
            m,
            ef_construction: HnswParams::min_ef_construction(m),
        };
        let broken = HnswParams {
            m: 2,
            ef_construction: 1,
        };
        let clustered = Shape::Clustered {
            clusters: 100,
            spread: 0.5,
        };
        for shape in [clustered, Shape::LowRank { rank: 16 }, Shape::Gaussian] {
            let data = vectors(shape, n, dim, 42, 0);
            let queries = vectors(shape, 50, dim, 42, 1);
            let build = |params| {
                let graph = Graph::new(dim, Metric::L2, params, 42);
                graph.add(&array(&data, dim), 0, 1);
                graph
            };
            let (good, bad) = (build(floor), build(broken));
            let good_reach = reach(&good, &queries[..dim]);
            let bad_reach = reach(&bad, &queries[..dim]);
            assert!(
                good_reach >= 0.95,
                "{shape:?}: {floor:?} reaches {good_reach}"
            );
            assert!(bad_reach < 0.5, "{shape:?}: {broken:?} reaches {bad_reach}");
            if shape == clustered {
                let truth = exact_neighbours(&data, &queries, dim, 10, distance::l2);
                let found: Vec<Vec<u32>> = queries
                    .chunks(dim)
                    .map(|q| good.search(q, 10, 64, &|_| true))
                    .map(|hits| hits.iter().map(|h| h.row as u32).collect())
                    .collect();
                let r = recall(&found, &truth);
                assert!(r >= 0.9, "{floor:?}: recall@10 at ef=64 {r}");
            }
        }
    }

    #[test]
    fn one_thread_builds_the_same_graph_every_time() {
        let dim = 8;
        let data = vectors(Shape::Gaussian, 1_500, dim, 3, 0);
        let build = || {
            let g = Graph::new(dim, Metric::L2, HnswParams::default(), 9);
            g.add(&array(&data, dim), 0, 1);
            g
        };
        let (a, b) = (build(), build());
        for id in 0..1_500 {
            for level in 0..=a.node(id).level as usize {
                let (mut x, mut y) = (Vec::new(), Vec::new());
                read_list(a.list(id, level), &mut x);
                read_list(b.list(id, level), &mut y);
                assert_eq!(x, y);
            }
        }
    }

    /// A vector stored many times (rows sharing an embedding; versions of
    /// a row whose vector did not change, which stay in the graph) neither
    /// traps searches for other vectors nor hides the newest version of a
    /// row. Copies used to link only to copies: in 14 of 20 builds of this
    /// shape some searches along the line missed their nearest rows.
    #[test]
    fn vectors_stored_many_times_neither_trap_searches_nor_hide_new_versions() {
        use rand::{Rng, SeedableRng};
        let copy = [1.0f32, 2.0, 3.0];
        for seed in 0..6u64 {
            let graph = Graph::new(3, Metric::L2, HnswParams::default(), seed);
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            // Row of each key's newest version, and every row's vector.
            let (mut newest, mut stored) = (HashMap::new(), Vec::new());
            for round in 0..300u64 {
                // Ten keys of 100 get a new version (the same vector), then
                // one new key gets `copy`, the vector all the new keys share.
                let mut put: Vec<(u64, [f32; 3])> = (0..10)
                    .map(|_| rng.random_range(0..100u64))
                    .map(|key| (key, [key as f32, 1.0, 0.0]))
                    .collect();
                put.sort_by_key(|&(key, _)| key);
                put.dedup_by_key(|&mut (key, _)| key);
                put.push((1_000 + round, copy));
                for part in [&put[..put.len() - 1], &put[put.len() - 1..]] {
                    let flat: Vec<f32> = part.iter().flat_map(|(_, v)| *v).collect();
                    graph.add(&array(&flat, 3), stored.len() as u64, 1 + seed as usize % 2);
                    for &(key, v) in part {
                        newest.insert(key, stored.len() as u64);
                        stored.push(v);
                    }
                }
            }
            let live: HashSet<u64> = newest.values().copied().collect();
            let accept = |row: u64| live.contains(&row);
            for key in 0..100 {
                let query = [key as f32, 1.0, 0.0];
                let mut exact: Vec<f32> = (0..stored.len())
                    .filter(|&row| accept(row as u64))
                    .map(|row| distance::l2(&query, &stored[row]))
                    .collect();
                exact.sort_by(f32::total_cmp);
                let found: Vec<f32> = graph
                    .search(&query, 5, 64, &accept)
                    .iter()
                    .map(|hit| hit.distance)
                    .collect();
                assert_eq!(found, exact[..5], "seed {seed}, key {key}");
            }
            let at_copy = graph.search(&copy, 10, 64, &accept);
            assert!(at_copy.iter().all(|hit| hit.distance == 0.0), "seed {seed}");
            assert_eq!(at_copy.len(), 10);
        }
    }

    /// Rows rewritten many times with their vectors unchanged (an UPDATE of
    /// another column) are found at their newest version, the only one a
    /// search accepts, however many rows were written since.
    #[test]
    fn the_newest_of_many_versions_with_one_vector_is_found() {
        use rand::{Rng, SeedableRng};
        let dim = 8;
        let data = vectors(Shape::Gaussian, 200, dim, 7, 0);
        for seed in 0..4u64 {
            let graph = Graph::new(dim, Metric::L2, HnswParams::default(), seed);
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut newest: Vec<u64> = (0..200).collect();
            graph.add(&array(&data, dim), 0, 1);
            let mut row = 200;
            for _ in 0..400 {
                // Twenty keys get a new version, the same vector.
                let mut keys: Vec<usize> = (0..20).map(|_| rng.random_range(0..200)).collect();
                keys.sort_unstable();
                keys.dedup();
                let flat: Vec<f32> = keys
                    .iter()
                    .flat_map(|&k| data[k * dim..][..dim].to_vec())
                    .collect();
                graph.add(&array(&flat, dim), row, 1 + seed as usize % 2);
                for &key in &keys {
                    newest[key] = row;
                    row += 1;
                }
            }
            let live: HashSet<u64> = newest.iter().copied().collect();
            for (key, query) in data.chunks(dim).enumerate() {
                let hit = graph.search(query, 1, 64, &|row| live.contains(&row));
                assert_eq!(
                    hit.first().map(|h| h.row),
                    Some(newest[key]),
                    "seed {seed}, key {key}"
                );
            }
        }
    }
}
