//! The persisted form of a [`Graph`] (DESIGN.md §3, §8): what an SSTable's
//! `<column>.hnsw` sidecar holds, so flushed vectors are searchable without
//! a rebuild. Only the structure is stored; the vectors stay in the
//! SSTable's Parquet file and node `i` names the row position it reads.
//!
//! Layout, little-endian:
//!
//! ```text
//! magic "MWHNSW\0\0" | version u32 | dim u32 | metric u32 | m u32
//! | ef_construction u32 | seed u64 | nodes u32 | entry u32
//! | per node: row u64 | level u32 | per level 0..=level: count u32, ids u32 × count
//! | CRC32 (IEEE) of everything before it, u32
//! ```
//!
//! A column's index may be several graphs over disjoint rows (a
//! compaction keeps its inputs' graphs rather than building one anew);
//! their file is a set:
//!
//! ```text
//! magic "MWHNSWS\0" | graphs u32 | per graph: length u64, a graph as above
//! | CRC32 (IEEE) of everything before it, u32
//! ```
//!
//! Decoding checks everything a search relies on (ids in range, lists no
//! longer than the graph's degree, rows inside the vector column, the
//! entry point on the top level, no row in two graphs of a set), so a
//! damaged file is an error, never a wrong answer or a panic.

use datafusion::arrow::buffer::ScalarBuffer;

use super::Graph;
use crate::schema::{HnswParams, Metric};

const MAGIC: &[u8; 8] = b"MWHNSW\0\0";
const SET_MAGIC: &[u8; 8] = b"MWHNSWS\0";
/// The format version this code writes and reads.
pub const VERSION: u32 = 1;

/// A graph's structure apart from its vectors: node `i` reads the vector
/// at `rows[i]` and has the lists `links[i][level]` (ids of other nodes).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Parts {
    pub dim: usize,
    pub metric: Metric,
    pub params: HnswParams,
    pub seed: u64,
    /// The search entry point, on the top level (ignored without nodes).
    pub entry: u32,
    pub rows: Vec<u64>,
    pub links: Vec<Vec<Vec<u32>>>,
}

impl Graph {
    /// The published graph in the persisted form, each node's row mapped
    /// through `position`; a node whose row maps to `None` is left out and
    /// the lists that pointed at it take its neighbours instead
    /// (re-selected with the heuristic when too many). Nodes are numbered
    /// in order of their new rows.
    pub fn encode(&self, position: &dyn Fn(u64) -> Option<u64>) -> Vec<u8> {
        write(&self.export(position))
    }

    /// The graph `bytes` (made by [`Graph::encode`]) describe, over
    /// `vectors` (row `r` is `vectors[r * dim..(r + 1) * dim]`). It is
    /// complete and published; more vectors may be added to it.
    pub fn decode(bytes: &[u8], vectors: ScalarBuffer<f32>) -> Result<Graph, String> {
        let parts = read(bytes)?;
        let rows = vectors.len() / parts.dim.max(1);
        if let Some(&row) = parts.rows.iter().find(|&&r| r >= rows as u64) {
            return Err(format!("row {row} is beyond the {rows} vectors"));
        }
        Ok(Graph::from_parts(parts, vectors))
    }
}

/// The persisted form of `graphs` (over disjoint rows, positions as they
/// are): one graph as [`Graph::encode`] writes it, several as a set.
pub fn encode_set(graphs: &[Graph]) -> Vec<u8> {
    if let [graph] = graphs {
        return graph.encode(&Some);
    }
    let mut out = SET_MAGIC.to_vec();
    out.extend_from_slice(&(graphs.len() as u32).to_le_bytes());
    for graph in graphs {
        let bytes = graph.encode(&Some);
        out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        out.extend_from_slice(&bytes);
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The graphs `bytes` (made by [`encode_set`] or [`Graph::encode`])
/// describe over `vectors`, each checked as [`Graph::decode`] checks one,
/// and no row in two of them.
pub fn decode_set(bytes: &[u8], vectors: ScalarBuffer<f32>) -> Result<Vec<Graph>, String> {
    if !bytes.starts_with(SET_MAGIC) {
        return Ok(vec![Graph::decode(bytes, vectors)?]);
    }
    if bytes.len() < SET_MAGIC.len() + 8 {
        return Err("truncated".into());
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32fast::hash(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
        return Err("checksum mismatch".into());
    }
    let mut r = Reader {
        bytes: &body[SET_MAGIC.len()..],
    };
    let count = r.u32()?;
    let mut graphs = Vec::new();
    let mut seen: Vec<bool> = Vec::new();
    for i in 0..count {
        let length = usize::try_from(r.u64()?).map_err(|_| "graph length".to_string())?;
        let graph = Graph::decode(r.take(length)?, vectors.clone())
            .map_err(|e| format!("graph {i} of {count}: {e}"))?;
        if let Some(first) = graphs.first().map(|g: &Graph| (g.dim(), g.metric()))
            && first != (graph.dim(), graph.metric())
        {
            return Err(format!("graph {i} of {count}: another dimension or metric"));
        }
        seen.resize(vectors.len() / graph.dim(), false);
        for row in graph.rows() {
            if std::mem::replace(&mut seen[row as usize], true) {
                return Err(format!("row {row} is in two graphs"));
            }
        }
        graphs.push(graph);
    }
    if !r.bytes.is_empty() {
        return Err(format!("{} bytes after the last graph", r.bytes.len()));
    }
    Ok(graphs)
}

fn metric_code(metric: Metric) -> u32 {
    match metric {
        Metric::L2 => 0,
        Metric::Cosine => 1,
        Metric::Dot => 2,
    }
}

fn write(parts: &Parts) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    let u32s = |out: &mut Vec<u8>, values: &[u32]| {
        for v in values {
            out.extend_from_slice(&v.to_le_bytes());
        }
    };
    u32s(
        &mut out,
        &[
            VERSION,
            parts.dim as u32,
            metric_code(parts.metric),
            parts.params.m as u32,
            parts.params.ef_construction as u32,
        ],
    );
    out.extend_from_slice(&parts.seed.to_le_bytes());
    u32s(&mut out, &[parts.rows.len() as u32, parts.entry]);
    for (row, lists) in parts.rows.iter().zip(&parts.links) {
        out.extend_from_slice(&row.to_le_bytes());
        u32s(&mut out, &[lists.len() as u32 - 1]);
        for list in lists {
            u32s(&mut out, &[list.len() as u32]);
            u32s(&mut out, list);
        }
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The checksum a persisted graph ends with (CRC-32 of everything
/// before it), which tells one graph from another: what a manifest records
/// (a CRC over the whole file would be the same for every graph).
pub fn checksum(bytes: &[u8]) -> Option<u32> {
    let trailer = bytes.get(bytes.len().checked_sub(4)?..)?;
    Some(u32::from_le_bytes(trailer.try_into().ok()?))
}

/// A cursor over the bytes of a persisted graph.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        if self.bytes.len() < n {
            return Err("truncated".into());
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
}

fn read(bytes: &[u8]) -> Result<Parts, String> {
    // Magic, version and checksum at least.
    if bytes.len() < MAGIC.len() + 8 || &bytes[..MAGIC.len()] != MAGIC {
        return Err("not a memwal HNSW graph".into());
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    let version = u32::from_le_bytes(body[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(format!(
            "graph format version {version}; this build reads {VERSION}"
        ));
    }
    if crc32fast::hash(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
        return Err("checksum mismatch".into());
    }
    let mut r = Reader { bytes: &body[12..] };
    let dim = r.u32()? as usize;
    let metric = match r.u32()? {
        0 => Metric::L2,
        1 => Metric::Cosine,
        2 => Metric::Dot,
        other => return Err(format!("unknown metric {other}")),
    };
    let params = HnswParams {
        m: r.u32()? as usize,
        ef_construction: r.u32()? as usize,
    };
    let seed = r.u64()?;
    let nodes = r.u32()?;
    let entry = r.u32()?;
    // What any build could write: older ones accepted m from 2 and
    // ef_construction from 1, and their graphs still serve (a search
    // that finds too little through one falls back to an exact scan).
    if dim == 0
        || !(2..=*HnswParams::M.end()).contains(&params.m)
        || !(1..=*HnswParams::EF_CONSTRUCTION.end()).contains(&params.ef_construction)
    {
        return Err(format!(
            "dimension {dim}, m {}, ef_construction {}",
            params.m, params.ef_construction
        ));
    }
    let mut rows = Vec::new();
    let mut links = Vec::new();
    for id in 0..nodes {
        let row = r.u64()?;
        if rows.last().is_some_and(|&last| last >= row) {
            return Err(format!("node {id}: rows out of order"));
        }
        rows.push(row);
        let level = r.u32()?;
        if level > super::graph::MAX_LEVEL as u32 {
            return Err(format!("node {id}: level {level}"));
        }
        let mut lists = Vec::with_capacity(level as usize + 1);
        for l in 0..=level as usize {
            let count = r.u32()? as usize;
            let max = if l == 0 { 2 * params.m } else { params.m };
            if count > max {
                return Err(format!("node {id}: {count} links at level {l}"));
            }
            let list = (0..count).map(|_| r.u32()).collect::<Result<Vec<_>, _>>()?;
            lists.push(list);
        }
        links.push(lists);
    }
    if !r.bytes.is_empty() {
        return Err(format!("{} bytes after the last node", r.bytes.len()));
    }
    // Every link leads to a node that has the level it is linked on.
    for (id, lists) in links.iter().enumerate() {
        for (l, list) in lists.iter().enumerate() {
            if let Some(&bad) = list
                .iter()
                .find(|&&n| n >= nodes || links[n as usize].len() <= l)
            {
                return Err(format!("node {id}: bad link to {bad} at level {l}"));
            }
        }
    }
    if nodes > 0 {
        let top = links.iter().map(Vec::len).max().expect("nodes");
        if entry >= nodes || links[entry as usize].len() != top {
            return Err(format!("entry point {entry} is not on the top level"));
        }
    }
    Ok(Parts {
        dim,
        metric,
        params,
        seed,
        entry,
        rows,
        links,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hnsw::dataset::{Shape, exact_neighbours, recall, to_array, vectors};
    use crate::hnsw::distance;
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::Float32Type;

    const DIM: usize = 16;

    fn shape() -> Shape {
        Shape::Clustered {
            clusters: 8,
            spread: 0.3,
        }
    }

    fn buffer(data: &[f32]) -> ScalarBuffer<f32> {
        to_array(data, DIM)
            .values()
            .as_primitive::<Float32Type>()
            .values()
            .clone()
    }

    fn recall_of(graph: &Graph, data: &[f32], rows: &[u64], queries: &[f32]) -> f64 {
        // Ground truth over the vectors the graph still holds.
        let kept: Vec<f32> = rows
            .iter()
            .flat_map(|&r| data[r as usize * DIM..][..DIM].to_vec())
            .collect();
        let truth = exact_neighbours(&kept, queries, DIM, 10, distance::l2);
        let found: Vec<Vec<u32>> = queries
            .chunks(DIM)
            .map(|q| {
                graph
                    .search(q, 10, 64, &|_| true)
                    .iter()
                    .map(|h| rows.binary_search(&h.row).expect("a kept row") as u32)
                    .collect()
            })
            .collect();
        recall(&found, &truth)
    }

    #[test]
    fn round_trip_is_the_same_graph() {
        let data = vectors(shape(), 3_000, DIM, 5, 0);
        let graph = Graph::new(DIM, Metric::Cosine, HnswParams::default(), 4);
        graph.add(&to_array(&data, DIM), 0, 2);
        let bytes = graph.encode(&Some);
        let back = Graph::decode(&bytes, buffer(&data)).unwrap();
        assert_eq!(back.export(&Some), graph.export(&Some));
        assert_eq!(back.encode(&Some), bytes);
        // Graphs are told apart by their trailing checksum; a CRC over a
        // whole file would be the same residue for every graph.
        let other = Graph::new(DIM, Metric::Cosine, HnswParams::default(), 5);
        other.add(&to_array(&data[..100 * DIM], DIM), 0, 1);
        let other = other.encode(&Some);
        assert_ne!(checksum(&bytes), checksum(&other));
        assert_eq!(crc32fast::hash(&bytes), crc32fast::hash(&other));
        assert_eq!(checksum(&bytes[..3]), None);
        let query = &data[..DIM];
        assert_eq!(
            back.search(query, 10, 64, &|_| true),
            graph.search(query, 10, 64, &|_| true)
        );
        // A decoded graph keeps growing like any other.
        let more = vectors(shape(), 3_500, DIM, 5, 0);
        let grown = Graph::decode(&bytes, buffer(&more)).unwrap();
        grown.add(&to_array(&more[3_000 * DIM..], DIM), 3_000, 1);
        assert_eq!(grown.len(), 3_500);
        let hit = grown.search(&more[3_200 * DIM..][..DIM], 1, 64, &|_| true);
        assert_eq!(hit[0].row, 3_200);
    }

    #[test]
    fn dropped_nodes_are_bridged_and_rows_renumbered() {
        let data = vectors(shape(), 4_000, DIM, 6, 0);
        let queries = vectors(shape(), 100, DIM, 6, 1);
        let graph = Graph::new(DIM, Metric::L2, HnswParams::default(), 2);
        graph.add(&to_array(&data, DIM), 0, 1);
        // A third of the rows go (superseded), the rest move: row r lands
        // at position 2 * (4000 - r), reversed, as a sort by key might.
        let position = |row: u64| (!row.is_multiple_of(3)).then(|| 2 * (4_000 - row));
        let parts = graph.export(&position);
        assert!(parts.rows.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(parts.rows.len(), 4_000 - 4_000_usize.div_ceil(3));
        // No list names a dropped node or itself; nodes keep their degree.
        for (id, lists) in parts.links.iter().enumerate() {
            for list in lists {
                assert!(list.iter().all(|&n| n as usize != id));
            }
        }
        let mean = |p: &Parts| {
            p.links.iter().map(|l| l[0].len()).sum::<usize>() as f64 / p.rows.len() as f64
        };
        let before = graph.export(&Some);
        // Dropping a third without bridging would leave about 2/3 of them.
        assert!(mean(&parts) > 0.75 * mean(&before), "links were lost");

        let mut moved = vec![0.0f32; 8_001 * DIM];
        for row in 0..4_000u64 {
            let p = 2 * (4_000 - row) as usize;
            moved[p * DIM..][..DIM].copy_from_slice(&data[row as usize * DIM..][..DIM]);
        }
        let loaded = Graph::decode(&graph.encode(&position), buffer(&moved)).unwrap();
        assert_eq!(loaded.len(), parts.rows.len());
        let r = recall_of(&loaded, &moved, &parts.rows, &queries);
        assert!(r >= 0.97, "recall {r} after dropping a third");
    }

    #[test]
    fn a_set_of_graphs_round_trips_and_overlapping_ones_are_an_error() {
        let data = vectors(shape(), 1_000, DIM, 8, 0);
        let graphs: Vec<Graph> = [0..600, 600..1_000]
            .into_iter()
            .map(|rows| {
                let graph = Graph::new(DIM, Metric::L2, HnswParams::default(), 1);
                let part = &data[rows.start * DIM..rows.end * DIM];
                graph.add(&to_array(part, DIM), rows.start as u64, 1);
                graph
            })
            .collect();
        let bytes = encode_set(&graphs);
        let back = decode_set(&bytes, buffer(&data)).unwrap();
        assert_eq!(back.len(), 2);
        for (back, graph) in back.iter().zip(&graphs) {
            assert_eq!(back.export(&Some), graph.export(&Some));
        }
        // One graph is written as it always was.
        let one = encode_set(&graphs[..1]);
        assert_eq!(one, graphs[0].encode(&Some));
        assert_eq!(decode_set(&one, buffer(&data)).unwrap().len(), 1);

        let decode = |b: &[u8]| decode_set(b, buffer(&data)).map(|_| ()).unwrap_err();
        let mut flipped = bytes.clone();
        flipped[40] ^= 1;
        assert!(decode(&flipped).contains("checksum"));
        assert!(decode(&bytes[..bytes.len() - 9]).contains("checksum"));
        let twice = encode_set(&[
            graphs[0].remapped(&Some, buffer(&data)),
            graphs[0].remapped(&Some, buffer(&data)),
        ]);
        assert!(decode(&twice).contains("in two graphs"));
    }

    #[test]
    fn damage_is_an_error() {
        let data = vectors(shape(), 500, DIM, 7, 0);
        let graph = Graph::new(DIM, Metric::Dot, HnswParams::default(), 1);
        graph.add(&to_array(&data, DIM), 0, 1);
        let bytes = graph.encode(&Some);
        let decode = |b: &[u8]| Graph::decode(b, buffer(&data)).map(|_| ()).unwrap_err();
        assert!(decode(&bytes[..bytes.len() - 1]).contains("checksum"));
        let mut flipped = bytes.clone();
        flipped[100] ^= 1;
        assert!(decode(&flipped).contains("checksum"));
        let mut newer = bytes.clone();
        newer[8] = 2;
        assert!(decode(&newer).contains("version 2"));
        assert!(decode(b"PAR1....").contains("not a memwal HNSW graph"));
        assert!(decode(&bytes[..12]).contains("not a memwal HNSW graph"));
        // Parameters out of range, with a valid checksum.
        let mut parts = graph.export(&Some);
        parts.params.m = 1 << 30;
        assert!(decode(&write(&parts)).contains("m 1073741824"));
        // An entry point below the top level.
        let mut parts = graph.export(&Some);
        let low = parts.links.iter().position(|l| l.len() == 1).unwrap();
        parts.entry = low as u32;
        assert!(decode(&write(&parts)).contains("entry point"));
        // A well-formed file naming rows the vectors do not have.
        let short = Graph::decode(&bytes, buffer(&data[..100 * DIM])).map(|_| ());
        assert!(short.unwrap_err().contains("beyond"));
        // Links to nodes that do not exist, with a valid checksum.
        let mut parts = graph.export(&Some);
        parts.links[3][0][0] = 500;
        assert!(decode(&write(&parts)).contains("bad link"));
        let mut parts = graph.export(&Some);
        parts.links[3][0] = vec![1; 33];
        assert!(decode(&write(&parts)).contains("33 links"));
    }
}
