//! The stored form of one WAL entry.
//!
//! An entry is one object: an Arrow IPC stream followed by an 8-byte
//! trailer, a CRC-32 (little-endian) and the magic `MWL2`. The CRC covers
//! the object's own path and the stream, so a truncated or altered object,
//! or an entry copied to another position or shard, fails the check and is
//! reported as [`Error::Corrupt`] naming the object, never decoded as
//! garbage or replayed out of place. (Entries written before the path was
//! covered end in `MWAL` and their CRC covers the stream only.)
//!
//! An entry of a group commit whose blob values fit one object carries
//! them in front of its stream (its pack, see [`crate::blob`]): the pack's
//! bytes, the stream, then a 16-byte trailer — the stream's length
//! (little-endian `u64`), the CRC-32 (of the path, the length and the
//! stream) and the magic `MWL3`. The entry's *head* is the stream and the
//! trailer: all that decoding reads, so a reader of the WAL need not read
//! the pack (see [`head_len`]).
//!
//! The stream's schema metadata carries the format version, the kind
//! (`data` or `fence`), the writer's epoch and the MemTable generation,
//! and, for an entry written while earlier appends were still in flight,
//! the position below them (see [`WalEntry::landed_through`]).
//! Data entries hold the table's columns plus the `_tombstone` column; a fence
//! entry has no columns and no rows.

use std::collections::HashMap;
use std::io::Cursor;
use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::Schema;
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;

use crate::error::{Error, Result};

const MAGIC: &[u8; 4] = b"MWL2";
/// Entries whose CRC covers the stream only.
const MAGIC_V1: &[u8; 4] = b"MWAL";
/// Entries with a pack in front of their stream.
const MAGIC_PACKED: &[u8; 4] = b"MWL3";
const TRAILER_LEN: usize = 8;
/// The trailer of an entry with a pack: the stream's length, CRC, magic.
const PACKED_TRAILER_LEN: usize = 16;
const FORMAT_KEY: &str = "memwal.wal.format";
const FORMAT_VERSION: &str = "1";
const KIND_KEY: &str = "memwal.wal.kind";
const EPOCH_KEY: &str = "memwal.wal.epoch";
const GENERATION_KEY: &str = "memwal.wal.generation";
const LANDED_KEY: &str = "memwal.wal.landed_through";

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// Rows (puts and tombstones) of one group commit.
    Data,
    /// A new writer's claim: every position before it belongs to older
    /// epochs, and an older writer that finds it must stop (`Fenced`).
    Fence,
}

/// One decoded WAL entry.
#[derive(Debug, Clone, PartialEq)]
pub struct WalEntry {
    pub kind: EntryKind,
    /// Epoch of the writer that wrote it.
    pub epoch: u64,
    /// MemTable generation its rows belong to (0 for a fence).
    pub generation: u64,
    /// For data entries: the rows, in put order, each batch with the
    /// table's columns plus the `_tombstone` column.
    pub batches: Vec<RecordBatch>,
    /// `Some(p)`: when this entry was written, the writer's appends at the
    /// positions after `p` and before this one were still in flight, so
    /// any of them may never land (its writer acknowledges nothing at or
    /// after a position that did not). `None`: every earlier position had
    /// landed. Only this lets a reader tell a gap that was never written
    /// from an entry that was lost.
    pub landed_through: Option<u64>,
}

impl WalEntry {
    /// A data entry; every batch must have the same schema (see
    /// [`crate::schema::stored_schema`]).
    pub fn data(epoch: u64, generation: u64, batches: Vec<RecordBatch>) -> Self {
        Self {
            kind: EntryKind::Data,
            epoch,
            generation,
            batches,
            landed_through: None,
        }
    }

    /// A fence entry of `epoch`.
    pub fn fence(epoch: u64) -> Self {
        Self {
            kind: EntryKind::Fence,
            epoch,
            generation: 0,
            batches: Vec::new(),
            landed_through: None,
        }
    }

    /// Whether this entry explains the missing positions from
    /// `first_missing` up to its own as appends that were in flight when it
    /// was written (and so may never land), rather than entries lost.
    pub fn explains_gap_from(&self, first_missing: u64) -> bool {
        self.landed_through.is_some_and(|p| p < first_missing)
    }

    /// The stored bytes of the entry as the object at `path`: IPC
    /// stream, CRC-32 (of `path` and the stream), magic.
    pub fn encode(&self, path: &str) -> Result<Bytes> {
        let mut out = self.stream()?;
        let crc = entry_crc(path, &out);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(MAGIC);
        Ok(Bytes::from(out))
    }

    /// The head of the entry as the object at `path` whose pack (any
    /// number of bytes) comes before it: IPC stream, the stream's length,
    /// CRC-32 (of `path`, the length and the stream), magic.
    pub fn encode_after_pack(&self, path: &str) -> Result<Bytes> {
        let mut out = self.stream()?;
        let len = (out.len() as u64).to_le_bytes();
        let crc = packed_crc(path, &len, &out);
        out.extend_from_slice(&len);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(MAGIC_PACKED);
        Ok(Bytes::from(out))
    }

    /// The entry's IPC stream.
    fn stream(&self) -> Result<Vec<u8>> {
        let kind = match self.kind {
            EntryKind::Data => "data",
            EntryKind::Fence => "fence",
        };
        let base = match (self.kind, self.batches.first()) {
            (EntryKind::Data, Some(first)) => first.schema().as_ref().clone(),
            (EntryKind::Data, None) => {
                return Err(Error::invalid("a WAL data entry needs at least one batch"));
            }
            (EntryKind::Fence, _) => Schema::empty(),
        };
        let mut metadata = HashMap::from([
            (FORMAT_KEY.to_string(), FORMAT_VERSION.to_string()),
            (KIND_KEY.to_string(), kind.to_string()),
            (EPOCH_KEY.to_string(), self.epoch.to_string()),
            (GENERATION_KEY.to_string(), self.generation.to_string()),
        ]);
        if let Some(p) = self.landed_through {
            metadata.insert(LANDED_KEY.to_string(), p.to_string());
        }
        let schema = Arc::new(base.with_metadata(metadata));
        let mut out = Vec::with_capacity(
            self.batches
                .iter()
                .map(RecordBatch::get_array_memory_size)
                .sum::<usize>()
                + 1024,
        );
        let mut writer = StreamWriter::try_new(&mut out, &schema)?;
        for batch in &self.batches {
            // Same columns, our metadata: rebind instead of copying data.
            writer.write(&batch.clone().with_schema(Arc::clone(&schema))?)?;
        }
        writer.finish()?;
        drop(writer);
        Ok(out)
    }

    /// Decodes the stored bytes of the object at `path` (named in errors):
    /// the whole object, or for an entry with a pack any end of it that
    /// holds its head (see [`head_len`]).
    pub fn decode(path: &str, bytes: Bytes) -> Result<Self> {
        let corrupt = |reason: String| Error::Corrupt {
            path: path.to_string(),
            reason,
        };
        let magic = bytes.len().checked_sub(4).map(|at| &bytes[at..]);
        let not_an_entry = || {
            corrupt(format!(
                "not a WAL entry or cut short ({} bytes, no trailer)",
                bytes.len()
            ))
        };
        let crc_at = bytes.len().saturating_sub(TRAILER_LEN);
        let stored = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let (body, stored, actual) = match magic {
            Some(m) if m == MAGIC_PACKED => {
                let Some(len) = head_len(&bytes) else {
                    return Err(not_an_entry());
                };
                let Some(start) = bytes.len().checked_sub(len as usize) else {
                    return Err(corrupt(format!(
                        "its head is {len} bytes, more than the {} read (damaged, or cut short)",
                        bytes.len()
                    )));
                };
                let end = bytes.len() - PACKED_TRAILER_LEN;
                let body = bytes.slice(start..end);
                let actual = packed_crc(path, &bytes[end..end + 8], &body);
                (body, stored(end + 8), actual)
            }
            Some(m) if bytes.len() >= TRAILER_LEN && (m == MAGIC || m == MAGIC_V1) => {
                let body = bytes.slice(..crc_at);
                let actual = match m == MAGIC {
                    true => entry_crc(path, &body),
                    false => crc32fast::hash(&body),
                };
                (body, stored(crc_at), actual)
            }
            _ => return Err(not_an_entry()),
        };
        if stored != actual {
            return Err(corrupt(format!(
                "checksum mismatch (stored {stored:08x}, computed {actual:08x}): \
                 damaged, or an entry of another position"
            )));
        }
        let reader = StreamReader::try_new(Cursor::new(body), None)
            .map_err(|e| corrupt(format!("bad IPC stream: {e}")))?;
        let schema = reader.schema();
        let meta = |key: &str| {
            schema
                .metadata()
                .get(key)
                .cloned()
                .ok_or_else(|| corrupt(format!("missing {key}")))
        };
        if meta(FORMAT_KEY)? != FORMAT_VERSION {
            return Err(corrupt(format!(
                "unsupported WAL format {}",
                meta(FORMAT_KEY)?
            )));
        }
        let number = |key: &str| -> Result<u64> {
            meta(key)?
                .parse()
                .map_err(|_| corrupt(format!("{key} is not a number")))
        };
        let kind = match meta(KIND_KEY)?.as_str() {
            "data" => EntryKind::Data,
            "fence" => EntryKind::Fence,
            other => return Err(corrupt(format!("unknown entry kind '{other}'"))),
        };
        let (epoch, generation) = (number(EPOCH_KEY)?, number(GENERATION_KEY)?);
        let landed_through = match schema.metadata().contains_key(LANDED_KEY) {
            true => Some(number(LANDED_KEY)?),
            false => None,
        };
        // Batches come back with the table's schema, without our metadata.
        let plain = Arc::new(schema.as_ref().clone().with_metadata(HashMap::new()));
        let mut batches = Vec::new();
        for batch in reader {
            let batch = batch.map_err(|e| corrupt(format!("bad record batch: {e}")))?;
            batches.push(RecordBatch::try_new(
                Arc::clone(&plain),
                batch.columns().to_vec(),
            )?);
        }
        Ok(Self {
            kind,
            epoch,
            generation,
            batches,
            landed_through,
        })
    }
}

/// How many bytes at the end of an entry's object are its head (its
/// stream and trailer), if `end` — the last bytes of the object, at
/// least [`PACKED_TRAILER_LEN`] of them — is the end of an entry with a
/// pack; `None` for any other (decoding it needs the whole object).
pub fn head_len(end: &[u8]) -> Option<u64> {
    let at = end.len().checked_sub(PACKED_TRAILER_LEN)?;
    if &end[end.len() - 4..] != MAGIC_PACKED {
        return None;
    }
    let stream = u64::from_le_bytes(end[at..at + 8].try_into().expect("8 bytes"));
    stream.checked_add(PACKED_TRAILER_LEN as u64)
}

/// The CRC-32 of an entry with a pack stored at `path`: of the path, the
/// stream's length as stored, and the stream.
fn packed_crc(path: &str, len: &[u8], body: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(path.as_bytes());
    crc.update(len);
    crc.update(body);
    crc.finalize()
}

/// The CRC-32 of an entry stored at `path` with IPC stream `body`.
fn entry_crc(path: &str, body: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(path.as_bytes());
    crc.update(body);
    crc.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::stored_schema;
    use datafusion::arrow::array::{BooleanArray, Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field};

    fn batch(ids: &[i64]) -> RecordBatch {
        let table = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Utf8, true),
        ]);
        let n = ids.len();
        RecordBatch::try_new(
            stored_schema(&table, &[]),
            vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(StringArray::from(vec![Some("x"); n])),
                Arc::new(BooleanArray::from(vec![false; n])),
            ],
        )
        .unwrap()
    }

    #[test]
    fn data_and_fence_entries_round_trip() {
        let entry = WalEntry::data(3, 7, vec![batch(&[1, 2]), batch(&[3])]);
        let decoded = WalEntry::decode("w", entry.encode("w").unwrap()).unwrap();
        assert_eq!(decoded, entry);
        let overtaking = WalEntry {
            landed_through: Some(11),
            ..entry
        };
        let decoded = WalEntry::decode("w", overtaking.encode("w").unwrap()).unwrap();
        assert_eq!(decoded, overtaking);
        assert!(decoded.explains_gap_from(12) && !decoded.explains_gap_from(11));
        let rows: usize = decoded.batches.iter().map(RecordBatch::num_rows).sum();
        assert_eq!(rows, 3);
        let fence = WalEntry::fence(4);
        assert_eq!(
            WalEntry::decode("w", fence.encode("w").unwrap()).unwrap(),
            fence
        );
        assert!(WalEntry::data(1, 1, vec![]).encode("w").is_err());
    }

    #[test]
    fn truncated_or_altered_entries_are_corrupt_and_named() {
        let path = "t/shards/0/wal/00000000000000000009.arrow";
        let bytes = WalEntry::data(1, 1, vec![batch(&[1, 2, 3])])
            .encode(path)
            .unwrap();
        // The same entry read as another position's, or another shard's.
        for elsewhere in [
            "t/shards/0/wal/00000000000000000010.arrow",
            "t/shards/1/wal/00000000000000000009.arrow",
        ] {
            let err = WalEntry::decode(elsewhere, bytes.clone()).unwrap_err();
            assert!(matches!(err, Error::Corrupt { .. }), "{err}");
            assert!(err.to_string().contains(elsewhere), "{err}");
        }
        for (what, damaged) in [
            ("truncated", bytes.slice(..bytes.len() / 2)),
            ("empty", Bytes::new()),
            ("flipped", {
                let mut v = bytes.to_vec();
                v[bytes.len() / 3] ^= 0x40;
                Bytes::from(v)
            }),
        ] {
            let err = WalEntry::decode(path, damaged).unwrap_err();
            assert!(matches!(err, Error::Corrupt { .. }), "{what}: {err}");
            assert!(err.to_string().contains(path), "{what}: {err}");
        }
    }

    #[test]
    fn an_entry_after_a_pack_decodes_from_the_object_or_its_head_alone() {
        let path = "t/shards/0/wal/00000000000000000009.arrow";
        let entry = WalEntry::data(2, 5, vec![batch(&[1, 2])]);
        let head = entry.encode_after_pack(path).unwrap();
        let pack = vec![7u8; 1000];
        let object = Bytes::from([pack.as_slice(), &head].concat());
        assert_eq!(head_len(&object), Some(head.len() as u64));
        assert_eq!(head_len(&entry.encode(path).unwrap()), None);
        for read in [object.clone(), head.clone(), object.slice(500..)] {
            assert_eq!(WalEntry::decode(path, read).unwrap(), entry);
        }
        let elsewhere = "t/shards/0/wal/00000000000000000010.arrow";
        assert!(matches!(
            WalEntry::decode(elsewhere, object.clone()),
            Err(Error::Corrupt { .. })
        ));
        // Less than the head, a damaged length, a damaged stream.
        let end = object.len();
        let mut longer = object.to_vec();
        longer[end - PACKED_TRAILER_LEN] ^= 1;
        let mut flipped = object.to_vec();
        flipped[end - head.len() / 2] ^= 0x40;
        for (what, damaged) in [
            ("short", head.slice(1..)),
            ("length", Bytes::from(longer)),
            ("stream", Bytes::from(flipped)),
        ] {
            let err = WalEntry::decode(path, damaged).unwrap_err();
            assert!(matches!(err, Error::Corrupt { .. }), "{what}: {err}");
            assert!(err.to_string().contains(path), "{what}: {err}");
        }
    }
}
