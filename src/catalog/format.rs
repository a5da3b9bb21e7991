//! The stored forms of the catalog, told apart by their format version:
//! - `1`, a **full** state, an Arrow IPC file with one row per entry,
//!   sorted by `object_id` (every version of a catalog written before delta
//!   versions, and every checkpoint);
//! - `2`, a **delta** as an Arrow IPC file: the changes of one version, in
//!   order, one row each (`change` is `put` with the entry, or `remove`
//!   with its id). Read, no longer written: a one-row Arrow file is
//!   2.7 KB, mostly its schema;
//! - `3`, a **delta** as a JSON object (`{"format": "3", "commit_id": ...,
//!   "changes": [{"put": {entry}}, {"remove": "id"}]}`), written by every
//!   commit: about 200 bytes for one change.
//!
//! The Arrow forms carry the format in their schema metadata. Every form
//! carries a random commit id that makes every written version's bytes
//! unique (the commit protocol needs that to resolve ambiguous writes).

use std::collections::HashMap;
use std::io::Cursor;
use std::sync::{Arc, LazyLock};

use bytes::Bytes;
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, ListArray, ListBuilder, RecordBatch, StringArray, StringBuilder,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::ipc::reader::FileReader;
use datafusion::arrow::ipc::writer::FileWriter;
use serde::{Deserialize, Serialize};

use super::entry::{Entry, ObjectType};
use super::state::Change;
use crate::error::{Error, Result};

const FORMAT_KEY: &str = "memwal.catalog.format";
const FULL: &str = "1";
const DELTA: &str = "2";
const JSON_DELTA: &str = "3";
const COMMIT_ID_KEY: &str = "memwal.commit_id";

/// The columns of an entry; in a delta all but `object_id` are NULL in a
/// `remove` row.
fn entry_fields(nullable: bool) -> Vec<Field> {
    vec![
        Field::new("object_id", DataType::Utf8, false),
        Field::new("object_type", DataType::Utf8, nullable),
        Field::new("location", DataType::Utf8, true),
        Field::new("metadata", DataType::Utf8, nullable),
        Field::new(
            "base_objects",
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            nullable,
        ),
    ]
}

static FULL_FIELDS: LazyLock<Vec<Field>> = LazyLock::new(|| entry_fields(false));
static DELTA_FIELDS: LazyLock<Vec<Field>> = LazyLock::new(|| {
    let mut fields = vec![Field::new("change", DataType::Utf8, false)];
    fields.extend(entry_fields(true));
    fields
});

/// One stored catalog object, decoded.
#[derive(Debug, PartialEq)]
pub enum Stored {
    /// Every entry, sorted by `object_id`.
    Full(Vec<Arc<Entry>>),
    /// The changes of one version onto the one before, in order.
    Delta(Vec<Change>),
}

fn schema(format: &str, fields: &[Field]) -> SchemaRef {
    let metadata = HashMap::from([
        (FORMAT_KEY.to_string(), format.to_string()),
        (
            COMMIT_ID_KEY.to_string(),
            format!("{:032x}", rand::random::<u128>()),
        ),
    ]);
    Arc::new(Schema::new_with_metadata(fields.to_vec(), metadata))
}

/// Builds the entry columns, one row per item (`None`: a removal of the id).
#[derive(Default)]
struct EntryColumns {
    ids: StringBuilder,
    types: StringBuilder,
    locations: StringBuilder,
    metadata: StringBuilder,
    bases: ListBuilder<StringBuilder>,
}

impl EntryColumns {
    fn push(&mut self, id: &str, entry: Option<&Entry>) {
        self.ids.append_value(id);
        self.types
            .append_option(entry.map(|e| e.object_type.as_str()));
        self.locations
            .append_option(entry.and_then(|e| e.location.as_deref()));
        self.metadata
            .append_option(entry.map(|e| e.metadata.as_str()));
        match entry {
            Some(e) => {
                for b in &e.base_objects {
                    self.bases.values().append_value(b);
                }
                self.bases.append(true);
            }
            None => self.bases.append(false),
        }
    }

    fn finish(mut self) -> Vec<ArrayRef> {
        vec![
            Arc::new(self.ids.finish()),
            Arc::new(self.types.finish()),
            Arc::new(self.locations.finish()),
            Arc::new(self.metadata.finish()),
            Arc::new(self.bases.finish()),
        ]
    }
}

fn write(schema: SchemaRef, columns: Vec<ArrayRef>) -> Result<Bytes> {
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns)?;
    let mut out = Vec::with_capacity(batch.get_array_memory_size() + 1024);
    let mut writer = FileWriter::try_new(&mut out, &schema)?;
    writer.write(&batch)?;
    writer.finish()?;
    drop(writer);
    Ok(Bytes::from(out))
}

/// Encodes a full state: `entries` sorted by `object_id`.
pub fn encode_full<'a>(entries: impl Iterator<Item = &'a Arc<Entry>>) -> Result<Bytes> {
    let mut columns = EntryColumns::default();
    for e in entries {
        columns.push(&e.object_id, Some(e));
    }
    write(schema(FULL, &FULL_FIELDS), columns.finish())
}

/// A format-3 delta as stored.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDelta {
    format: String,
    commit_id: String,
    changes: Vec<JsonChange>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
enum JsonChange {
    Put(JsonEntry),
    Remove(String),
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    object_id: String,
    object_type: String,
    location: Option<String>,
    metadata: String,
    base_objects: Vec<String>,
}

/// Encodes the changes of one version (format 3).
pub fn encode_delta(changes: &[Change]) -> Result<Bytes> {
    let changes = changes
        .iter()
        .map(|change| match change {
            Change::Put(e) => JsonChange::Put(JsonEntry {
                object_id: e.object_id.clone(),
                object_type: e.object_type.as_str().to_string(),
                location: e.location.clone(),
                metadata: e.metadata.clone(),
                base_objects: e.base_objects.clone(),
            }),
            Change::Remove(id) => JsonChange::Remove(id.clone()),
        })
        .collect();
    let delta = JsonDelta {
        format: JSON_DELTA.to_string(),
        commit_id: format!("{:032x}", rand::random::<u128>()),
        changes,
    };
    Ok(Bytes::from(
        serde_json::to_vec(&delta).expect("a catalog delta always serializes"),
    ))
}

/// Decodes a format-3 delta.
fn decode_json_delta(bytes: &[u8], corrupt: impl Fn(String) -> Error) -> Result<Stored> {
    let delta: JsonDelta = serde_json::from_slice(bytes).map_err(|e| {
        corrupt(format!(
            "not a readable catalog delta (damaged, or cut short): {e}"
        ))
    })?;
    if delta.format != JSON_DELTA {
        return Err(corrupt(format!(
            "unsupported catalog format {:?}",
            delta.format
        )));
    }
    let changes = delta
        .changes
        .into_iter()
        .map(|change| match change {
            JsonChange::Put(e) => {
                let object_type = ObjectType::parse(&e.object_type)
                    .ok_or_else(|| corrupt(format!("unknown object_type '{}'", e.object_type)))?;
                Ok(Change::Put(Arc::new(Entry {
                    object_id: e.object_id,
                    object_type,
                    location: e.location,
                    metadata: e.metadata,
                    base_objects: e.base_objects,
                })))
            }
            JsonChange::Remove(id) => Ok(Change::Remove(id)),
        })
        .collect::<Result<_>>()?;
    Ok(Stored::Delta(changes))
}

/// Decodes one stored catalog object; `path` names it in errors.
pub fn decode(path: &str, bytes: Bytes) -> Result<Stored> {
    let corrupt = |reason: String| Error::Corrupt {
        path: path.to_string(),
        reason,
    };
    if bytes.first() == Some(&b'{') {
        return decode_json_delta(&bytes, corrupt);
    }
    let reader = FileReader::try_new(Cursor::new(bytes), None).map_err(|e| {
        corrupt(format!(
            "not a readable Arrow IPC file (damaged, or cut short): {e}"
        ))
    })?;
    let schema = reader.schema();
    let (delta, fields) = match schema.metadata().get(FORMAT_KEY).map(String::as_str) {
        Some(FULL) => (false, &*FULL_FIELDS),
        Some(DELTA) => (true, &*DELTA_FIELDS),
        other => return Err(corrupt(format!("unsupported catalog format {other:?}"))),
    };
    for (i, f) in fields.iter().enumerate() {
        let got = schema.fields().get(i);
        if got.map(|g| (g.name(), g.data_type())) != Some((f.name(), f.data_type())) {
            return Err(corrupt(format!(
                "column {i} should be {} {}",
                f.name(),
                f.data_type()
            )));
        }
    }
    let (mut entries, mut changes) = (Vec::new(), Vec::new());
    for batch in reader {
        let batch = batch.map_err(|e| corrupt(e.to_string()))?;
        let skip = usize::from(delta);
        let strings = |i: usize| -> &StringArray { batch.column(skip + i).as_string::<i32>() };
        let (ids, types, locations, metadata) = (strings(0), strings(1), strings(2), strings(3));
        let bases: &ListArray = batch.column(skip + 4).as_list::<i32>();
        let entry = |row: usize| -> Result<Arc<Entry>> {
            if types.is_null(row) || metadata.is_null(row) || bases.is_null(row) {
                return Err(corrupt(format!("entry '{}' is incomplete", ids.value(row))));
            }
            let object_type = ObjectType::parse(types.value(row))
                .ok_or_else(|| corrupt(format!("unknown object_type '{}'", types.value(row))))?;
            let base_list = bases.value(row);
            Ok(Arc::new(Entry {
                object_id: ids.value(row).to_string(),
                object_type,
                location: (!locations.is_null(row)).then(|| locations.value(row).to_string()),
                metadata: metadata.value(row).to_string(),
                base_objects: base_list
                    .as_string::<i32>()
                    .iter()
                    .flatten()
                    .map(str::to_string)
                    .collect(),
            }))
        };
        if !delta {
            entries.reserve(batch.num_rows());
            for row in 0..batch.num_rows() {
                entries.push(entry(row)?);
            }
            continue;
        }
        let kinds = batch.column(0).as_string::<i32>();
        for row in 0..batch.num_rows() {
            changes.push(match kinds.value(row) {
                "put" => Change::Put(entry(row)?),
                "remove" => Change::Remove(ids.value(row).to_string()),
                other => return Err(corrupt(format!("unknown change '{other}'"))),
            });
        }
    }
    if delta {
        return Ok(Stored::Delta(changes));
    }
    if !entries.windows(2).all(|w| w[0].object_id < w[1].object_id) {
        return Err(corrupt(
            "entries are not sorted by object_id or repeat one".into(),
        ));
    }
    Ok(Stored::Full(entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries() -> Vec<Arc<Entry>> {
        vec![
            Arc::new(Entry {
                object_id: "a".into(),
                object_type: ObjectType::Namespace,
                location: None,
                metadata: "{}".into(),
                base_objects: vec![],
            }),
            Arc::new(Entry {
                object_id: "a$t".into(),
                object_type: ObjectType::Table,
                location: Some("tables/t-1".into()),
                metadata: "{\"x\":1}".into(),
                base_objects: vec!["b".into()],
            }),
        ]
    }

    #[test]
    fn round_trips_and_every_encoding_is_unique() {
        let entries = entries();
        let one = encode_full(entries.iter()).unwrap();
        let two = encode_full(entries.iter()).unwrap();
        assert_ne!(one, two, "two commits of the same state must differ");
        assert_eq!(decode("v1", one).unwrap(), Stored::Full(entries.clone()));
        let empty = encode_full(std::iter::empty()).unwrap();
        assert_eq!(decode("v2", empty).unwrap(), Stored::Full(vec![]));

        let changes = vec![
            Change::Put(Arc::clone(&entries[1])),
            Change::Remove("a$u".into()),
            Change::Put(Arc::clone(&entries[0])),
        ];
        let one = encode_delta(&changes).unwrap();
        assert_ne!(one, encode_delta(&changes).unwrap());
        assert_eq!(decode("v3", one).unwrap(), Stored::Delta(changes));
    }

    #[test]
    fn deltas_of_format_2_still_decode() {
        // Written by memwal before format 3: an Arrow IPC file.
        let (mut kinds, mut columns) = (StringBuilder::new(), EntryColumns::default());
        let entries = entries();
        kinds.append_value("put");
        columns.push(&entries[1].object_id, Some(&entries[1]));
        kinds.append_value("remove");
        columns.push("a$u", None);
        let mut all: Vec<ArrayRef> = vec![Arc::new(kinds.finish())];
        all.extend(columns.finish());
        let stored = write(schema(DELTA, &DELTA_FIELDS), all).unwrap();
        assert_eq!(
            decode("v4", stored).unwrap(),
            Stored::Delta(vec![
                Change::Put(Arc::clone(&entries[1])),
                Change::Remove("a$u".into())
            ])
        );
    }

    #[test]
    fn a_delta_is_small_and_strict() {
        let one = encode_delta(&[Change::Put(Arc::clone(&entries()[0]))]).unwrap();
        assert!(one.len() < 200, "{} bytes", one.len());
        for bad in [
            r#"{"format":"3","commit_id":"0","changes":[{"put":{"object_id":"a"}}]}"#,
            r#"{"format":"3","commit_id":"0","changes":[{"drop":"a"}]}"#,
            r#"{"format":"4","commit_id":"0","changes":[]}"#,
            r#"{"format":"3","commit_id":"0","changes":[],"extra":1}"#,
            r#"{"format":"3","commit_id":"0","changes":[{"put":{"object_id":"a","object_type":"view","location":null,"metadata":"{}","base_objects":[]}}]}"#,
            "{",
        ] {
            let err = decode("v5", Bytes::from(bad)).unwrap_err();
            assert!(matches!(err, Error::Corrupt { .. }), "{bad}: {err}");
        }
    }

    #[test]
    fn garbage_is_a_corrupt_error_naming_the_object() {
        let err = decode("__manifest/v7.arrow", Bytes::from_static(b"nope")).unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }));
        assert!(err.to_string().contains("__manifest/v7.arrow"));
    }
}
