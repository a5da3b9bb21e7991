//! [`SstableObject`]: one SSTable file of a store as Parquet reads it,
//! checked against its checksums ([`super::checksum`]) before any byte of
//! it is decoded.
//!
//! A requested range is widened to whole checksummed blocks (the tail is
//! one block); every block fetched is checked, and a mismatch, a file
//! shorter or longer than its manifest entry says, or a read past its end
//! is [`Error::Corrupt`] naming the file. A missing file is a store error
//! (it names the path too).

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use datafusion::parquet::arrow::arrow_reader::ArrowReaderOptions;
use datafusion::parquet::arrow::async_reader::AsyncFileReader;
use datafusion::parquet::errors::ParquetError;
use datafusion::parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use datafusion::physical_plan::metrics::Count;
use futures::FutureExt;
use futures::future::BoxFuture;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use super::SstableFile;
use super::checksum::{BLOCK, FileChecksum};
use crate::error::{Error, Result};
use crate::store::{paths, read_checked};

/// One SSTable file, read in checked blocks.
pub struct SstableObject {
    store: Arc<dyn ObjectStore>,
    path: Path,
    /// The file as the manifest names it (for messages).
    name: String,
    size: u64,
    checksum: Option<FileChecksum>,
    /// CRC-32s of the data region's blocks (from the footer, once read).
    blocks: Option<Arc<[u32]>>,
    /// The tail, once fetched and checked.
    tail: Option<Bytes>,
    /// The whole file, checked, when a caller has it in memory.
    whole: Option<Bytes>,
    /// Counts the bytes fetched from the store.
    bytes_read: Count,
}

impl SstableObject {
    /// The file of `file`; `blocks` are the block checksums its footer
    /// lists (`None` until the footer is read).
    pub fn new(
        store: Arc<dyn ObjectStore>,
        file: &SstableFile,
        blocks: Option<Arc<[u32]>>,
    ) -> Result<Self> {
        Ok(Self {
            store,
            path: paths::stored(&file.path)?,
            name: file.path.clone(),
            size: file.bytes,
            checksum: file.checksum,
            blocks,
            tail: None,
            whole: None,
            bytes_read: Count::new(),
        })
    }

    /// Counts the bytes this object fetches in `bytes_read` too.
    pub fn counting(mut self, bytes_read: &Count) -> Self {
        self.bytes_read = bytes_read.clone();
        self
    }

    /// Reads come from `whole`, the file's bytes (as [`SstableObject::whole`]
    /// returned them), with no request.
    pub fn in_memory(mut self, whole: Bytes) -> Self {
        self.whole = Some(whole);
        self
    }

    /// Whether reads come from memory (see [`SstableObject::in_memory`]).
    pub fn is_in_memory(&self) -> bool {
        self.whole.is_some()
    }

    /// The whole file, fetched and checked (its data blocks in one request,
    /// its tail in another unless already read).
    pub async fn whole(&mut self) -> Result<Bytes> {
        if let Some(whole) = &self.whole {
            return Ok(whole.clone());
        }
        let everything = 0..self.size;
        let mut got = self.read(vec![everything]).await?;
        Ok(got.remove(0))
    }

    /// `fetched`, counted.
    fn counted(&self, fetched: Vec<Bytes>) -> Vec<Bytes> {
        self.bytes_read
            .add(fetched.iter().map(Bytes::len).sum::<usize>());
        fetched
    }

    fn corrupt(&self, reason: impl Into<String>) -> Error {
        Error::Corrupt {
            path: self.name.clone(),
            reason: format!("SSTable: {}", reason.into()),
        }
    }

    /// A read of `range` that returned only `got` bytes: the file is
    /// shorter than its manifest entry records.
    fn cut_short(&self, range: Range<u64>, got: usize) -> Error {
        self.corrupt(format!(
            "the file is shorter than the {} bytes its manifest entry records \
             (bytes {range:?} read as {got})",
            self.size
        ))
    }

    /// What a failed read means: a missing file stays a store error
    /// (naming the path); a file of another size than its manifest entry
    /// records is damaged (a read past its real end fails that way).
    async fn failed(&self, e: object_store::Error) -> Error {
        if matches!(e, object_store::Error::NotFound { .. }) {
            return Error::Store(e);
        }
        match self.store.head(&self.path).await {
            Ok(meta) if meta.size != self.size => self.corrupt(format!(
                "the file has {} bytes, its manifest entry records {} ({e})",
                meta.size, self.size
            )),
            _ => Error::Store(e),
        }
    }

    /// The bytes of `ranges`, each checked.
    pub async fn read(&mut self, ranges: Vec<Range<u64>>) -> Result<Vec<Bytes>> {
        if let Some(bad) = ranges.iter().find(|r| r.start > r.end || r.end > self.size) {
            return Err(self.corrupt(format!(
                "a read of bytes {bad:?} is past the end of the file ({} bytes)",
                self.size
            )));
        }
        if let Some(whole) = &self.whole {
            return Ok(ranges
                .iter()
                .map(|r| whole.slice(r.start as usize..r.end as usize))
                .collect());
        }
        let Some(checksum) = self.checksum else {
            // Written before SSTables had checksums: read as is.
            return match self.store.get_ranges(&self.path, &ranges).await {
                Ok(bytes) => Ok(self.counted(bytes)),
                Err(e) => Err(self.failed(e).await),
            };
        };
        let data_len = checksum.tail_offset;
        if data_len > self.size {
            return Err(self.corrupt("its tail starts past its end"));
        }
        let mut pieces: BTreeMap<u64, Bytes> = BTreeMap::new();
        if ranges.iter().any(|r| r.end > data_len) {
            let tail = self.tail(checksum).await?;
            pieces.insert(data_len, tail);
        }
        // Data blocks every range touches, fetched as runs of blocks.
        let mut needed: Vec<u64> = ranges
            .iter()
            .filter(|r| r.start < data_len && r.start < r.end)
            .flat_map(|r| r.start / BLOCK..=(r.end.min(data_len) - 1) / BLOCK)
            .collect();
        needed.sort_unstable();
        needed.dedup();
        if !needed.is_empty() {
            let blocks = self
                .blocks
                .clone()
                .ok_or_else(|| self.corrupt("its footer lists no block checksums"))?;
            let mut runs: Vec<Range<u64>> = Vec::new();
            for &b in &needed {
                match runs.last_mut() {
                    Some(run) if run.end == b => run.end += 1,
                    _ => runs.push(b..b + 1),
                }
            }
            let byte_ranges: Vec<Range<u64>> = runs
                .iter()
                .map(|run| run.start * BLOCK..(run.end * BLOCK).min(data_len))
                .collect();
            let fetch = || async {
                match self.store.get_ranges(&self.path, &byte_ranges).await {
                    Ok(fetched) => Ok(self.counted(fetched)),
                    Err(e) => Err(self.failed(e).await),
                }
            };
            // Each block of each run, by offset, checked.
            let check = |fetched: Vec<Bytes>| {
                let mut blocks_read = Vec::with_capacity(needed.len());
                for (run, bytes) in runs.iter().zip(fetched) {
                    for b in run.clone() {
                        let start = ((b - run.start) * BLOCK) as usize;
                        let end = (start + BLOCK as usize).min(bytes.len());
                        let block = bytes.slice(start.min(end)..end);
                        let expected = b * BLOCK..b * BLOCK + BLOCK.min(data_len - b * BLOCK);
                        if block.len() as u64 != expected.end - expected.start {
                            return Err(self.cut_short(expected, block.len()));
                        }
                        if crc32fast::hash(&block) != blocks[b as usize] {
                            return Err(self.corrupt(format!(
                                "checksum mismatch in bytes {expected:?}: damaged"
                            )));
                        }
                        blocks_read.push((expected.start, block));
                    }
                }
                Ok(blocks_read)
            };
            pieces.extend(read_checked(fetch, check).await?);
        }
        Ok(ranges
            .iter()
            .map(|r| assemble(&pieces, r.clone()))
            .collect())
    }

    /// The tail, fetched whole and checked once.
    async fn tail(&mut self, checksum: FileChecksum) -> Result<Bytes> {
        if let Some(tail) = &self.tail {
            return Ok(tail.clone());
        }
        let range = checksum.tail_offset..self.size;
        let fetch = || async {
            match self.store.get_range(&self.path, range.clone()).await {
                Ok(tail) => {
                    self.bytes_read.add(tail.len());
                    Ok(tail)
                }
                Err(e) => Err(self.failed(e).await),
            }
        };
        let check = |tail: Bytes| {
            if tail.len() as u64 != range.end - range.start {
                return Err(self.cut_short(range.clone(), tail.len()));
            }
            if crc32fast::hash(&tail) != checksum.tail_crc32 {
                return Err(self.corrupt(format!(
                    "checksum mismatch in its footer (bytes {range:?}): damaged, or not the file its manifest entry describes"
                )));
            }
            Ok(tail)
        };
        let tail = read_checked(fetch, check).await?;
        self.tail = Some(tail.clone());
        Ok(tail)
    }

    fn parquet_error(e: Error) -> ParquetError {
        ParquetError::External(Box::new(e))
    }
}

/// The bytes of `range` out of checked pieces (by start offset) that
/// together cover it: a slice of one piece when one covers it.
fn assemble(pieces: &BTreeMap<u64, Bytes>, range: Range<u64>) -> Bytes {
    let mut out: Option<BytesMut> = None;
    let mut at = range.start;
    // Walk forward from the piece holding `range.start`.
    let first = pieces
        .range(..=range.start)
        .next_back()
        .map_or(range.start, |(&s, _)| s);
    for (&start, piece) in pieces.range(first..range.end) {
        let end = start + piece.len() as u64;
        if end <= at {
            continue;
        }
        let slice = piece.slice((at - start) as usize..(range.end.min(end) - start) as usize);
        if at == range.start && range.end <= end {
            return slice;
        }
        out.get_or_insert_with(|| BytesMut::with_capacity((range.end - range.start) as usize))
            .extend_from_slice(&slice);
        at = range.end.min(end);
        if at == range.end {
            break;
        }
    }
    out.map_or_else(Bytes::new, BytesMut::freeze)
}

impl AsyncFileReader for SstableObject {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, Result<Bytes, ParquetError>> {
        async move {
            let mut got = self.read(vec![range]).await.map_err(Self::parquet_error)?;
            Ok(got.remove(0))
        }
        .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, Result<Vec<Bytes>, ParquetError>> {
        async move { self.read(ranges).await.map_err(Self::parquet_error) }.boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, Result<Arc<ParquetMetaData>, ParquetError>> {
        async move {
            let size = self.size;
            let metadata = ParquetMetaDataReader::new()
                .with_arrow_reader_options(options)
                .load_and_finish(self, size)
                .await?;
            Ok(Arc::new(metadata))
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assembles_ranges_from_pieces() {
        let mut pieces = BTreeMap::new();
        pieces.insert(0, Bytes::from_static(b"abcd"));
        pieces.insert(4, Bytes::from_static(b"efgh"));
        pieces.insert(8, Bytes::from_static(b"ij"));
        assert_eq!(assemble(&pieces, 1..3), Bytes::from_static(b"bc"));
        assert_eq!(assemble(&pieces, 2..9), Bytes::from_static(b"cdefghi"));
        assert_eq!(assemble(&pieces, 4..8), Bytes::from_static(b"efgh"));
        assert_eq!(assemble(&pieces, 0..10), Bytes::from_static(b"abcdefghij"));
        assert_eq!(assemble(&pieces, 5..5), Bytes::new());
    }
}
