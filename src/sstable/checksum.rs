//! Checksums of SSTable files: a damaged or swapped file is an error naming
//! it, never a different answer.
//!
//! Parquet's writer here leaves page checksums out, so memwal keeps its own
//! (the file stays plain Parquet for every other reader):
//! - the **data region** (row groups with their pages and bloom filters,
//!   everything before the page index and footer) is cut into blocks of
//!   [`BLOCK`] bytes; the CRC-32 of each block is stored in the footer's
//!   key-value metadata under [`BLOCKS_KEY`];
//! - the **tail** (page index, footer, length, magic) is checked by the
//!   CRC-32 the shard manifest records with the file ([`FileChecksum`]),
//!   which also fixes where the tail starts: a file swapped for another
//!   one, truncated or extended fails it.
//!
//! A reader fetches whole blocks (a range is widened to block edges) and
//! checks each before decoding anything in it ([`super::object`]).

use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::array::RecordBatch;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::file::metadata::{KeyValue, ParquetMetaData};
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::schema::TableSchema;

/// Bytes per checksummed block of an SSTable's data region.
pub const BLOCK: u64 = 32 << 10;

/// Footer key-value metadata holding the blocks' CRC-32s (8 hex digits
/// each, in file order).
pub const BLOCKS_KEY: &str = "memwal.block_crc32";

/// What a shard manifest records to verify an SSTable file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChecksum {
    /// Where the tail (page index and footer) starts: the data region's
    /// length.
    pub tail_offset: u64,
    /// CRC-32 of the tail, up to the end of the file.
    pub tail_crc32: u32,
}

/// CRC-32s of consecutive [`BLOCK`]-byte blocks of a byte stream.
#[derive(Default)]
struct BlockSums {
    done: Vec<u32>,
    current: crc32fast::Hasher,
    /// Bytes in the current (unfinished) block, and in all.
    filled: u64,
    len: u64,
}

impl BlockSums {
    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let take = ((BLOCK - self.filled) as usize).min(bytes.len());
            self.current.update(&bytes[..take]);
            self.filled += take as u64;
            self.len += take as u64;
            bytes = &bytes[take..];
            if self.filled == BLOCK {
                let full = std::mem::take(&mut self.current);
                self.done.push(full.finalize());
                self.filled = 0;
            }
        }
    }

    /// The metadata value: every block's CRC, the last one partial.
    fn encode(&self) -> String {
        let mut sums = self.done.clone();
        if self.filled > 0 {
            sums.push(self.current.clone().finalize());
        }
        sums.iter().map(|crc| format!("{crc:08x}")).collect()
    }
}

/// The block CRC-32s a file's footer lists, if it lists any; `None` also
/// when the value is malformed or does not cover `data_len` bytes (the
/// caller reports that file as damaged).
pub fn block_sums(metadata: &ParquetMetaData, data_len: u64) -> Option<Arc<[u32]>> {
    let value = metadata
        .file_metadata()
        .key_value_metadata()?
        .iter()
        .find(|kv| kv.key == BLOCKS_KEY)?
        .value
        .as_deref()?;
    if !value.len().is_multiple_of(8) || (value.len() / 8) as u64 != data_len.div_ceil(BLOCK) {
        return None;
    }
    (0..value.len())
        .step_by(8)
        .map(|at| u32::from_str_radix(value.get(at..at + 8)?, 16).ok())
        .collect()
}

/// Encodes an SSTable with its checksums. Bytes come out as row groups
/// complete ([`Encoder::take`]), so a large file can be streamed to the
/// store while it is written.
pub struct Encoder {
    writer: ArrowWriter<Vec<u8>>,
    sums: BlockSums,
}

impl Encoder {
    /// An encoder of SSTables of `schema` with about `rows` rows.
    pub fn new(schema: &TableSchema, rows: usize, codec: super::Codec) -> Result<Self> {
        let writer = ArrowWriter::try_new(
            Vec::new(),
            Arc::clone(&schema.stored),
            Some(super::properties(schema, rows, codec)),
        )?;
        Ok(Self {
            writer,
            sums: BlockSums::default(),
        })
    }

    /// Encodes `rows` (stored form, in SSTable order).
    pub fn write(&mut self, rows: &RecordBatch) -> Result<()> {
        Ok(self.writer.write(rows)?)
    }

    /// The bytes of the row groups completed so far and not taken yet.
    pub fn take(&mut self) -> Result<Bytes> {
        self.writer.sync()?;
        let bytes = std::mem::take(self.writer.inner_mut());
        self.sums.feed(&bytes);
        Ok(bytes.into())
    }

    /// Completes the file: the rest of its bytes (everything if nothing
    /// was taken) and the checksum its manifest entry records.
    pub fn finish(mut self) -> Result<(Bytes, FileChecksum)> {
        self.writer.flush()?;
        let data = self.take()?;
        let tail_offset = self.sums.len;
        self.writer
            .append_key_value_metadata(KeyValue::new(BLOCKS_KEY.into(), self.sums.encode()));
        self.writer.finish()?;
        self.writer.sync()?;
        let tail = std::mem::take(self.writer.inner_mut());
        let checksum = FileChecksum {
            tail_offset,
            tail_crc32: crc32fast::hash(&tail),
        };
        let mut rest = Vec::with_capacity(data.len() + tail.len());
        rest.extend_from_slice(&data);
        rest.extend_from_slice(&tail);
        Ok((rest.into(), checksum))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sums_cover_every_byte_in_blocks() {
        let bytes: Vec<u8> = (0..(2 * BLOCK + 5)).map(|i| (i * 7 % 251) as u8).collect();
        let mut sums = BlockSums::default();
        // Fed in uneven pieces: the same sums as block by block.
        for piece in bytes.chunks(10_007) {
            sums.feed(piece);
        }
        let expected: String = bytes
            .chunks(BLOCK as usize)
            .map(|block| format!("{:08x}", crc32fast::hash(block)))
            .collect();
        assert_eq!(sums.encode(), expected);
        assert_eq!(sums.len, bytes.len() as u64);
    }
}
