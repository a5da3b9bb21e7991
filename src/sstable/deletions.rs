//! Deletion vectors: the rows of an SSTable that a newer SSTable of the
//! shard holds a version of (DESIGN.md §7, "as built").
//!
//! A flush marks, in every older SSTable, the rows whose keys the new one
//! holds; a compaction carries its inputs' marks over to its output. While
//! every SSTable's marks account for all newer ones
//! ([`SstableFile::checked_through`]), the live rows of the SSTables are
//! exactly their unmarked rows, so a scan reads them one after another
//! instead of merging every overlapping run by key (which random keys make
//! the whole table).
//!
//! A vector is one object next to its SSTable (`deletions-….bin`), written
//! once under a fresh name and replaced by a new object when rows are
//! added: the row count, the bitmap (little-endian 64-bit words) and a
//! CRC-32 of all that, which the manifest entry also records, so a damaged
//! or swapped vector is an error naming it, never a different answer.

use bytes::{BufMut, Bytes, BytesMut};
use datafusion::parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::SstableFile;
use crate::error::{Error, Result};
use crate::store::paths;

/// The first bytes of every deletion vector object.
const MAGIC: &[u8; 8] = b"MWDELV1\0";

/// What a shard manifest records about an SSTable's deletion vector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deletions {
    /// Object path, relative to the root (in the SSTable's directory).
    pub path: String,
    /// Rows marked.
    pub rows: u64,
    /// CRC-32 of the object.
    pub crc32: u32,
}

/// Marked rows of one SSTable, by position in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeletionVector {
    rows: u64,
    words: Vec<u64>,
    marked: u64,
}

impl DeletionVector {
    /// No row of a file of `rows` rows marked.
    pub fn new(rows: u64) -> Self {
        Self {
            rows,
            words: vec![0; rows.div_ceil(64) as usize],
            marked: 0,
        }
    }

    /// Rows of the file.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Rows marked.
    pub fn marked(&self) -> u64 {
        self.marked
    }

    /// Marks `row`; whether it was unmarked. Rows past the file's are an
    /// error (a key lookup and its file disagree).
    pub fn mark(&mut self, row: u64) -> Result<bool> {
        if row >= self.rows {
            return Err(Error::invalid(format!(
                "row {row} is past the {} rows of the file",
                self.rows
            )));
        }
        let (word, bit) = ((row / 64) as usize, 1u64 << (row % 64));
        let fresh = self.words[word] & bit == 0;
        self.words[word] |= bit;
        self.marked += fresh as u64;
        Ok(fresh)
    }

    /// Whether `row` is marked.
    pub fn contains(&self, row: u64) -> bool {
        self.words
            .get((row / 64) as usize)
            .is_some_and(|w| w & (1 << (row % 64)) != 0)
    }

    /// The marked rows, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &word)| {
            let mut w = word;
            std::iter::from_fn(move || {
                (w != 0).then(|| {
                    let bit = w.trailing_zeros() as u64;
                    w &= w - 1;
                    i as u64 * 64 + bit
                })
            })
        })
    }

    /// The unmarked rows among `start..start + len` as a Parquet row
    /// selection over those rows.
    pub fn selection(&self, start: u64, len: u64) -> RowSelection {
        let mut selectors: Vec<RowSelector> = Vec::new();
        let mut push = |skip: bool, n: usize| match selectors.last_mut() {
            Some(last) if last.skip == skip => last.row_count += n,
            _ => selectors.push(match skip {
                true => RowSelector::skip(n),
                false => RowSelector::select(n),
            }),
        };
        for row in start..start + len {
            push(self.contains(row), 1);
        }
        RowSelection::from(selectors)
    }

    /// The object bytes: magic, rows, words, CRC-32 of all before it.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(MAGIC.len() + 8 + 8 * self.words.len() + 4);
        out.put_slice(MAGIC);
        out.put_u64_le(self.rows);
        for &word in &self.words {
            out.put_u64_le(word);
        }
        let crc = crc32fast::hash(&out);
        out.put_u32_le(crc);
        out.freeze()
    }

    /// Decodes the object at `path` whose manifest entry is `entry`, for a
    /// file of `rows` rows: anything but exactly what was written is
    /// [`Error::Corrupt`].
    pub fn decode(entry: &Deletions, rows: u64, bytes: &[u8]) -> Result<Self> {
        let corrupt = |reason: &str| Error::Corrupt {
            path: entry.path.clone(),
            reason: format!("damaged deletion vector: {reason}"),
        };
        let words = rows.div_ceil(64) as usize;
        if bytes.len() != MAGIC.len() + 8 + 8 * words + 4 {
            return Err(corrupt(&format!(
                "{} bytes where a file of {rows} rows needs {}",
                bytes.len(),
                MAGIC.len() + 8 + 8 * words + 4
            )));
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        let crc = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
        if crc32fast::hash(body) != crc || crc != entry.crc32 {
            return Err(corrupt("checksum mismatch"));
        }
        if &body[..MAGIC.len()] != MAGIC {
            return Err(corrupt("not a deletion vector"));
        }
        let u64_at = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
        if u64_at(MAGIC.len()) != rows {
            return Err(corrupt("written for a file of another size"));
        }
        let words: Vec<u64> = (0..words)
            .map(|i| u64_at(MAGIC.len() + 8 + 8 * i))
            .collect();
        let marked: u64 = words.iter().map(|w| w.count_ones() as u64).sum();
        if words
            .last()
            .is_some_and(|&w| !rows.is_multiple_of(64) && w >> (rows % 64) != 0)
            || marked != entry.rows
        {
            return Err(corrupt("marks rows its entry does not count"));
        }
        Ok(Self {
            rows,
            words,
            marked,
        })
    }
}

/// Writes `vector` as the deletion vector of `file` (made by the writer of
/// `epoch`) under a fresh name; returns its manifest entry. Nothing reads
/// it until a manifest names it.
pub async fn write(
    store: &Arc<dyn ObjectStore>,
    file: &SstableFile,
    epoch: u64,
    vector: &DeletionVector,
) -> Result<Deletions> {
    let path = paths::new_deletions_file(&file.path, epoch)?;
    let bytes = vector.encode();
    let crc32 = u32::from_le_bytes(bytes[bytes.len() - 4..].try_into().expect("4 bytes"));
    store.put(&path, PutPayload::from_bytes(bytes)).await?;
    Ok(Deletions {
        path: path.to_string(),
        rows: vector.marked(),
        crc32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(vector: &DeletionVector) -> (Deletions, Bytes) {
        let bytes = vector.encode();
        let crc32 = u32::from_le_bytes(bytes[bytes.len() - 4..].try_into().unwrap());
        let entry = Deletions {
            path: "t/dv".into(),
            rows: vector.marked(),
            crc32,
        };
        (entry, bytes)
    }

    #[test]
    fn marks_round_trip_and_select_the_unmarked_rows() {
        let mut v = DeletionVector::new(130);
        for row in [0, 63, 64, 65, 129] {
            assert!(v.mark(row).unwrap());
        }
        assert!(!v.mark(64).unwrap(), "marking twice counts once");
        assert!(v.mark(130).is_err());
        assert_eq!(v.marked(), 5);
        assert_eq!(v.iter().collect::<Vec<_>>(), vec![0, 63, 64, 65, 129]);
        let (e, bytes) = entry(&v);
        assert_eq!(DeletionVector::decode(&e, 130, &bytes).unwrap(), v);
        // Rows 60..70: 60, 61, 62 kept, 63, 64, 65 skipped, 66..70 kept.
        let selected: Vec<(bool, usize)> = Vec::<RowSelector>::from(v.selection(60, 10))
            .into_iter()
            .map(|s| (s.skip, s.row_count))
            .collect();
        assert_eq!(selected, vec![(false, 3), (true, 3), (false, 4)]);
    }

    #[test]
    fn any_damage_is_an_error_naming_the_object() {
        let mut v = DeletionVector::new(100);
        v.mark(7).unwrap();
        let (e, bytes) = entry(&v);
        for at in 0..bytes.len() {
            let mut damaged = bytes.to_vec();
            damaged[at] ^= 0x10;
            let err = DeletionVector::decode(&e, 100, &damaged).unwrap_err();
            assert!(
                matches!(&err, Error::Corrupt { path, .. } if path == "t/dv"),
                "byte {at}: {err}"
            );
        }
        assert!(DeletionVector::decode(&e, 100, &bytes[..bytes.len() - 1]).is_err());
        assert!(
            DeletionVector::decode(&e, 101, &bytes).is_err(),
            "another file's size"
        );
        // Another vector of the same size: its own CRC, not the entry's.
        let mut other = DeletionVector::new(100);
        other.mark(8).unwrap();
        assert!(DeletionVector::decode(&e, 100, &other.encode()).is_err());
    }
}
