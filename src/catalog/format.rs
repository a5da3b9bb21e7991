//! The stored form of a catalog version: one Arrow IPC file, one row per
//! entry, sorted by `object_id`. Schema metadata carries the format version
//! and a random commit id that makes every written version's bytes unique
//! (the commit protocol needs that to resolve ambiguous writes).

use std::collections::HashMap;
use std::io::Cursor;
use std::sync::{Arc, LazyLock};

use bytes::Bytes;
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, ListBuilder, RecordBatch, StringArray, StringBuilder,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::ipc::reader::FileReader;
use datafusion::arrow::ipc::writer::FileWriter;

use super::entry::{Entry, ObjectType};
use crate::error::{Error, Result};

const FORMAT_KEY: &str = "memwal.catalog.format";
const FORMAT_VERSION: &str = "1";
const COMMIT_ID_KEY: &str = "memwal.commit_id";

static FIELDS: LazyLock<Vec<Field>> = LazyLock::new(|| {
    vec![
        Field::new("object_id", DataType::Utf8, false),
        Field::new("object_type", DataType::Utf8, false),
        Field::new("location", DataType::Utf8, true),
        Field::new("metadata", DataType::Utf8, false),
        Field::new(
            "base_objects",
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            false,
        ),
    ]
});

fn schema_with_commit_id() -> SchemaRef {
    let metadata = HashMap::from([
        (FORMAT_KEY.to_string(), FORMAT_VERSION.to_string()),
        (
            COMMIT_ID_KEY.to_string(),
            format!("{:032x}", rand::random::<u128>()),
        ),
    ]);
    Arc::new(Schema::new_with_metadata(FIELDS.clone(), metadata))
}

/// Encodes entries (already sorted by `object_id`) as one IPC file.
pub fn encode(entries: &[Arc<Entry>]) -> Result<Bytes> {
    let n = entries.len();
    let text_bytes = |f: fn(&Entry) -> usize| entries.iter().map(|e| f(e)).sum::<usize>();
    let mut ids = StringBuilder::with_capacity(n, text_bytes(|e| e.object_id.len()));
    let mut types = StringBuilder::with_capacity(n, n * 9);
    let mut locations = StringBuilder::with_capacity(
        n,
        text_bytes(|e| e.location.as_ref().map_or(0, String::len)),
    );
    let mut metadata = StringBuilder::with_capacity(n, text_bytes(|e| e.metadata.len()));
    let mut bases = ListBuilder::new(StringBuilder::new());
    for e in entries {
        ids.append_value(&e.object_id);
        types.append_value(e.object_type.as_str());
        locations.append_option(e.location.as_deref());
        metadata.append_value(&e.metadata);
        for b in &e.base_objects {
            bases.values().append_value(b);
        }
        bases.append(true);
    }
    let schema = schema_with_commit_id();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(ids.finish()),
        Arc::new(types.finish()),
        Arc::new(locations.finish()),
        Arc::new(metadata.finish()),
        Arc::new(bases.finish()),
    ];
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns)?;
    let mut out = Vec::with_capacity(batch.get_array_memory_size() + 1024);
    let mut writer = FileWriter::try_new(&mut out, &schema)?;
    writer.write(&batch)?;
    writer.finish()?;
    drop(writer);
    Ok(Bytes::from(out))
}

/// Decodes one catalog version; `path` names it in errors.
pub fn decode(path: &str, bytes: Bytes) -> Result<Vec<Arc<Entry>>> {
    let corrupt = |reason: String| Error::Corrupt {
        path: path.to_string(),
        reason,
    };
    let reader = FileReader::try_new(Cursor::new(bytes), None)
        .map_err(|e| corrupt(format!("not an Arrow IPC file: {e}")))?;
    let schema = reader.schema();
    match schema.metadata().get(FORMAT_KEY) {
        Some(v) if v == FORMAT_VERSION => {}
        other => return Err(corrupt(format!("unsupported catalog format {other:?}"))),
    }
    for (i, f) in FIELDS.iter().enumerate() {
        let got = schema.fields().get(i);
        if got.map(|g| (g.name(), g.data_type())) != Some((f.name(), f.data_type())) {
            return Err(corrupt(format!(
                "column {i} should be {} {}",
                f.name(),
                f.data_type()
            )));
        }
    }
    let mut entries = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| corrupt(e.to_string()))?;
        let strings = |i: usize| -> &StringArray { batch.column(i).as_string::<i32>() };
        let (ids, types, locations, metadata) = (strings(0), strings(1), strings(2), strings(3));
        let bases = batch.column(4).as_list::<i32>();
        entries.reserve(batch.num_rows());
        for row in 0..batch.num_rows() {
            let object_type = ObjectType::parse(types.value(row))
                .ok_or_else(|| corrupt(format!("unknown object_type '{}'", types.value(row))))?;
            let base_list = bases.value(row);
            let base_list = base_list.as_string::<i32>();
            entries.push(Arc::new(Entry {
                object_id: ids.value(row).to_string(),
                object_type,
                location: (!locations.is_null(row)).then(|| locations.value(row).to_string()),
                metadata: metadata.value(row).to_string(),
                base_objects: base_list.iter().flatten().map(str::to_string).collect(),
            }));
        }
    }
    if !entries.windows(2).all(|w| w[0].object_id < w[1].object_id) {
        return Err(corrupt(
            "entries are not sorted by object_id or repeat one".into(),
        ));
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_every_encoding_is_unique() {
        let entries = vec![
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
        ];
        let one = encode(&entries).unwrap();
        let two = encode(&entries).unwrap();
        assert_ne!(one, two, "two commits of the same state must differ");
        assert_eq!(decode("v1", one).unwrap(), entries);
        assert_eq!(decode("v2", encode(&[]).unwrap()).unwrap(), vec![]);
    }

    #[test]
    fn garbage_is_a_corrupt_error_naming_the_object() {
        let err = decode("__manifest/v7.arrow", Bytes::from_static(b"nope")).unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }));
        assert!(err.to_string().contains("__manifest/v7.arrow"));
    }
}
