//! A table's metadata as the catalog stores it: Arrow schema, primary key,
//! shard count and per-column options, built from `WITH (...)` options.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use serde::{Deserialize, Serialize};

use super::{HnswParams, Metric};
use crate::error::{Error, Result};

/// Largest accepted vector dimension.
pub const MAX_VECTOR_DIM: i32 = 65_536;

/// Largest accepted shard count.
pub const MAX_SHARDS: u32 = 1024;

/// Options of a `FLOAT[n]` vector column.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VectorOptions {
    /// Length of every vector (`FLOAT[dim]`).
    pub dim: i32,
    /// Distance the column is searched by.
    pub metric: Metric,
    /// The MemTable graph's parameters (`<column>.m`,
    /// `<column>.ef_construction`).
    #[serde(default)]
    pub hnsw: HnswParams,
}

/// Per-column options.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ColumnOptions {
    /// Set for every `FLOAT[n]` (`FixedSizeList<Float32, n>`) column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vector: Option<VectorOptions>,
    /// A binary column stored out of line in blob packs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub blob: bool,
}

/// Everything the catalog knows about a table. Valid by construction:
/// key columns exist and are NOT NULL, every vector column has a dimension in
/// `1..=65536`, options name existing columns of the right type. Made only
/// by [`TableMeta::new`]; decoding runs the same checks (see
/// [`TableMeta::from_json`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "StoredTableMeta")]
pub struct TableMeta {
    schema: Schema,
    primary_key: Vec<String>,
    shards: u32,
    #[serde(default)]
    columns: BTreeMap<String, ColumnOptions>,
}

/// [`TableMeta`] as stored, before it is checked.
#[derive(Deserialize)]
struct StoredTableMeta {
    schema: Schema,
    primary_key: Vec<String>,
    shards: u32,
    #[serde(default)]
    columns: BTreeMap<String, ColumnOptions>,
}

impl TryFrom<StoredTableMeta> for TableMeta {
    type Error = Error;

    /// Checks stored metadata as [`TableMeta::new`] checks a declaration:
    /// it must be what `new` makes of its own schema, key and options.
    /// Graph parameters an older build accepted are brought into today's
    /// bounds first (they shape only graphs built from now on).
    fn try_from(stored: StoredTableMeta) -> Result<Self> {
        let mut stored = TableMeta {
            schema: stored.schema,
            primary_key: stored.primary_key,
            shards: stored.shards,
            columns: stored.columns,
        };
        for options in stored.columns.values_mut() {
            if let Some(vector) = options.vector.as_mut() {
                vector.hnsw = vector.hnsw.clamped();
            }
        }
        let checked = TableMeta::new(
            &stored.schema,
            stored.primary_key.clone(),
            &stored.options(),
        )?;
        if checked != stored {
            return Err(Error::invalid(
                "the stored options do not match the stored columns \
                 (an option for a column of another type, or a key column that allows NULL)",
            ));
        }
        Ok(checked)
    }
}

impl TableMeta {
    /// Builds and validates a table's metadata from its declared schema, key
    /// and `WITH` options (`shards`, `<column>.metric`, `<column>.blob`).
    pub fn new(
        schema: &Schema,
        primary_key: Vec<String>,
        options: &[(String, String)],
    ) -> Result<Self> {
        if schema.fields().is_empty() {
            return Err(Error::invalid("a table needs at least one column"));
        }
        let mut names = std::collections::HashSet::new();
        for field in schema.fields() {
            if !names.insert(field.name()) {
                return Err(Error::invalid(format!(
                    "column '{}' is named twice (unquoted names are lower-cased)",
                    field.name()
                )));
            }
        }
        let mut seen = std::collections::HashSet::new();
        for key in &primary_key {
            if !seen.insert(key) {
                return Err(Error::invalid(format!(
                    "primary key column '{key}' listed twice"
                )));
            }
            let field = schema.field_with_name(key).map_err(|_| {
                Error::invalid(format!("primary key column '{key}' is not a column"))
            })?;
            if !is_key_type(field.data_type()) {
                return Err(Error::invalid(format!(
                    "primary key column '{key}' has type {}, which cannot be a key \
                     (use integers, strings, binary, dates, timestamps, decimals or booleans)",
                    field.data_type()
                )));
            }
        }
        // Key columns are NOT NULL.
        let fields: Vec<Arc<Field>> = schema
            .fields()
            .iter()
            .map(|f| {
                if primary_key.contains(f.name()) && f.is_nullable() {
                    Arc::new(f.as_ref().clone().with_nullable(false))
                } else {
                    Arc::clone(f)
                }
            })
            .collect();
        let schema = Schema::new_with_metadata(fields, schema.metadata().clone());

        let mut columns: BTreeMap<String, ColumnOptions> = BTreeMap::new();
        for field in schema.fields() {
            if let DataType::FixedSizeList(inner, dim) = field.data_type()
                && inner.data_type() == &DataType::Float32
            {
                if !(1..=MAX_VECTOR_DIM).contains(dim) {
                    return Err(Error::invalid(format!(
                        "vector column '{}' has dimension {dim}; FLOAT[n] needs 1 <= n <= {MAX_VECTOR_DIM}",
                        field.name()
                    )));
                }
                columns.entry(field.name().clone()).or_default().vector = Some(VectorOptions {
                    dim: *dim,
                    metric: Metric::default(),
                    hnsw: HnswParams::default(),
                });
            }
        }

        let mut shards = 1;
        let mut given = std::collections::HashSet::new();
        for (key, value) in options {
            let key_lower = key.to_ascii_lowercase();
            // Column names keep their case; option names do not.
            let option = match key.rsplit_once('.') {
                Some((column, option)) => format!("{column}.{}", option.to_ascii_lowercase()),
                None => key_lower.clone(),
            };
            if !given.insert(option) {
                return Err(Error::invalid(format!("table option '{key}' given twice")));
            }
            if key_lower == "shards" {
                shards = value
                    .trim()
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=MAX_SHARDS).contains(n))
                    .ok_or_else(|| {
                        Error::invalid(format!(
                            "option 'shards' must be an integer in 1..={MAX_SHARDS}, got '{value}'"
                        ))
                    })?;
                continue;
            }
            let Some((column, option)) = key.rsplit_once('.') else {
                return Err(unknown_option(key));
            };
            let field = schema.field_with_name(column).map_err(|_| {
                Error::invalid(format!(
                    "option '{key}' names column '{column}', which does not exist"
                ))
            })?;
            match option.to_ascii_lowercase().as_str() {
                option @ ("metric" | "m" | "ef_construction") => {
                    let vector = columns
                        .get_mut(column)
                        .and_then(|c| c.vector.as_mut())
                        .ok_or_else(|| {
                            Error::invalid(format!(
                                "option '{key}': column '{column}' is not a FLOAT[n] vector column"
                            ))
                        })?;
                    let count = |range: std::ops::RangeInclusive<usize>| {
                        value
                            .trim()
                            .parse::<usize>()
                            .ok()
                            .filter(|n| range.contains(n))
                            .ok_or_else(|| {
                                Error::invalid(format!(
                                    "option '{key}' must be an integer in {}..={}, got '{value}'",
                                    range.start(),
                                    range.end()
                                ))
                            })
                    };
                    match option {
                        "metric" => vector.metric = Metric::parse(value).ok_or_else(|| {
                            Error::invalid(format!(
                                "option '{key}': unknown metric '{value}' (use l2, cosine or dot)"
                            ))
                        })?,
                        "m" => vector.hnsw.m = count(HnswParams::M)?,
                        _ => vector.hnsw.ef_construction = count(HnswParams::EF_CONSTRUCTION)?,
                    }
                }
                "blob" => {
                    let blob = parse_bool(value).ok_or_else(|| {
                        Error::invalid(format!(
                            "option '{key}' must be true or false, got '{value}'"
                        ))
                    })?;
                    if !matches!(
                        field.data_type(),
                        DataType::Binary | DataType::LargeBinary | DataType::BinaryView
                    ) {
                        return Err(Error::invalid(format!(
                            "option '{key}': column '{column}' has type {}, blob columns must be binary",
                            field.data_type()
                        )));
                    }
                    if blob && primary_key.iter().any(|k| k == column) {
                        return Err(Error::invalid(format!(
                            "option '{key}': column '{column}' is part of the primary key, \
                             which is never stored out of line"
                        )));
                    }
                    if blob {
                        columns.entry(column.to_string()).or_default().blob = true;
                    }
                }
                _ => return Err(unknown_option(key)),
            }
        }
        // vector_search adds this column to the table's.
        if columns.values().any(|c| c.vector.is_some())
            && schema.field_with_name("_distance").is_ok()
        {
            return Err(Error::invalid(
                "a table with vector columns cannot have a column named '_distance': \
                 vector_search returns the distance under that name",
            ));
        }
        // Checked once every option is read, whatever their order.
        for (column, options) in &columns {
            let Some(hnsw) = options.vector.as_ref().map(|v| v.hnsw) else {
                continue;
            };
            let least = HnswParams::min_ef_construction(hnsw.m);
            if hnsw.ef_construction < least {
                return Err(Error::invalid(format!(
                    "option '{column}.ef_construction' must be an integer in {least}..={} \
                     (at least 2 × '{column}.m' = {}), got {}",
                    HnswParams::EF_CONSTRUCTION.end(),
                    hnsw.m,
                    hnsw.ef_construction
                )));
            }
        }
        Ok(Self {
            schema,
            primary_key,
            shards,
            columns,
        })
    }

    /// The Arrow schema (key columns NOT NULL).
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The Arrow schema as a shared reference.
    pub fn schema_ref(&self) -> SchemaRef {
        Arc::new(self.schema.clone())
    }

    /// Primary-key column names, in key order; empty for append-only
    /// tables.
    pub fn primary_key(&self) -> &[String] {
        &self.primary_key
    }

    /// Indices of the key columns in the schema.
    pub fn primary_key_indices(&self) -> Vec<usize> {
        self.primary_key
            .iter()
            .map(|k| self.schema.index_of(k).expect("key columns are checked"))
            .collect()
    }

    /// The number of shards, in `1..=MAX_SHARDS`.
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// Options of the columns that have any, by column name.
    pub fn columns(&self) -> &BTreeMap<String, ColumnOptions> {
        &self.columns
    }

    /// The `WITH` options that make this table with [`TableMeta::new`],
    /// every one spelled out (defaults included).
    pub fn options(&self) -> Vec<(String, String)> {
        let mut options = vec![("shards".to_string(), self.shards.to_string())];
        for (column, column_options) in &self.columns {
            if let Some(vector) = &column_options.vector {
                options.push((format!("{column}.metric"), vector.metric.name().into()));
                options.push((format!("{column}.m"), vector.hnsw.m.to_string()));
                options.push((
                    format!("{column}.ef_construction"),
                    vector.hnsw.ef_construction.to_string(),
                ));
            }
            if column_options.blob {
                options.push((format!("{column}.blob"), "true".into()));
            }
        }
        options
    }

    /// The stored JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("table metadata serializes")
    }

    /// Parses the stored JSON and checks it like a declaration (see
    /// [`TableMeta::new`]); `what` names the table in the error.
    pub fn from_json(json: &str, what: &str) -> Result<Self> {
        serde_json::from_str(json).map_err(|e| Error::Corrupt {
            path: what.to_string(),
            reason: format!("table metadata: {e}"),
        })
    }
}

fn unknown_option(key: &str) -> Error {
    Error::invalid(format!(
        "unknown table option '{key}' (known: 'shards', '<vector column>.metric', '<vector column>.m', \
         '<vector column>.ef_construction', '<binary column>.blob')"
    ))
}

/// A boolean setting's value: `true`/`false`, `on`/`off`, `yes`/`no` or
/// `1`/`0`, in any case.
pub(crate) fn parse_bool(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Some(true),
        "false" | "0" | "no" | "off" => Some(false),
        _ => None,
    }
}

fn is_key_type(t: &DataType) -> bool {
    use DataType::*;
    matches!(
        t,
        Int8 | Int16
            | Int32
            | Int64
            | UInt8
            | UInt16
            | UInt32
            | UInt64
            | Utf8
            | LargeUtf8
            | Utf8View
            | Binary
            | LargeBinary
            | BinaryView
            | FixedSizeBinary(_)
            | Date32
            | Date64
            | Timestamp(_, _)
            | Decimal128(_, _)
            | Decimal256(_, _)
            | Boolean
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("title", DataType::Utf8, true),
            Field::new(
                "emb",
                DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, true)), 4),
                true,
            ),
            Field::new("raw", DataType::Binary, true),
        ])
    }

    fn opts(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn builds_options_and_round_trips_json() {
        let meta = TableMeta::new(
            &schema(),
            vec!["id".into()],
            &opts(&[
                ("shards", "4"),
                ("emb.metric", "cosine"),
                ("raw.blob", "true"),
            ]),
        )
        .unwrap();
        assert_eq!(meta.shards(), 4);
        assert!(!meta.schema().field_with_name("id").unwrap().is_nullable());
        let emb = meta.columns()["emb"].vector.clone().unwrap();
        assert_eq!((emb.dim, emb.metric), (4, Metric::Cosine));
        assert!(meta.columns()["raw"].blob);
        assert_eq!(TableMeta::from_json(&meta.to_json(), "t").unwrap(), meta);
        assert_eq!(meta.primary_key_indices(), vec![0]);
    }

    #[test]
    fn rejects_bad_options() {
        let s = schema();
        for (bad, needle) in [
            (opts(&[("colour", "red")]), "unknown table option 'colour'"),
            (opts(&[("shards", "0")]), "shards"),
            (opts(&[("shards", "x")]), "shards"),
            (opts(&[("title.metric", "cosine")]), "not a FLOAT[n]"),
            (opts(&[("emb.metric", "manhattan")]), "unknown metric"),
            (opts(&[("nope.metric", "l2")]), "does not exist"),
            (opts(&[("title.blob", "true")]), "must be binary"),
            // HNSW parameters that build a graph searches cannot walk.
            (
                opts(&[("emb.m", "2")]),
                "option 'emb.m' must be an integer in 5..=256, got '2'",
            ),
            (
                opts(&[("emb.m", "4")]),
                "option 'emb.m' must be an integer in 5..=256",
            ),
            (
                opts(&[("emb.m", "257")]),
                "option 'emb.m' must be an integer in 5..=256",
            ),
            (
                opts(&[("emb.ef_construction", "1")]),
                "option 'emb.ef_construction' must be an integer in 32..=10000, got '1'",
            ),
            (
                opts(&[("emb.ef_construction", "31")]),
                "option 'emb.ef_construction' must be an integer in 32..=10000",
            ),
            (
                opts(&[("emb.ef_construction", "40"), ("emb.m", "24")]),
                "option 'emb.ef_construction' must be an integer in 48..=10000 \
                 (at least 2 × 'emb.m' = 24), got 40",
            ),
            // The default ef_construction (100) is too small for m = 64.
            (
                opts(&[("emb.m", "64")]),
                "option 'emb.ef_construction' must be an integer in 128..=10000",
            ),
            (
                opts(&[("emb.metric", "l2"), ("emb.METRIC", "cosine")]),
                "table option 'emb.METRIC' given twice",
            ),
            (
                opts(&[("shards", "2"), ("SHARDS", "2")]),
                "table option 'SHARDS' given twice",
            ),
        ] {
            let err = TableMeta::new(&s, vec![], &bad).unwrap_err().to_string();
            assert!(err.contains(needle), "{err} lacks {needle}");
        }
        // The bounds themselves are accepted.
        for ok in [
            opts(&[("emb.m", "5"), ("emb.ef_construction", "32")]),
            opts(&[("emb.m", "256"), ("emb.ef_construction", "512")]),
            opts(&[("emb.ef_construction", "10000")]),
        ] {
            TableMeta::new(&s, vec![], &ok).unwrap();
        }
        let err = TableMeta::new(&s, vec!["missing".into()], &[]).unwrap_err();
        assert!(err.to_string().contains("not a column"));
        let err = TableMeta::new(&s, vec!["emb".into()], &[]).unwrap_err();
        assert!(err.to_string().contains("cannot be a key"));
    }

    #[test]
    fn stored_metadata_is_checked_like_a_declaration() {
        let good = TableMeta::new(
            &schema(),
            vec!["id".into()],
            &opts(&[("shards", "4"), ("emb.metric", "cosine")]),
        )
        .unwrap()
        .to_json();
        let decode = |json: &str| TableMeta::from_json(json, "t");
        assert!(decode(&good).is_ok());
        for (from, to, needle) in [
            (r#""shards":4"#, r#""shards":0"#, "shards"),
            (r#""shards":4"#, r#""shards":99999"#, "shards"),
            (
                r#""primary_key":["id"]"#,
                r#""primary_key":["nope"]"#,
                "not a column",
            ),
            (
                r#""primary_key":["id"]"#,
                r#""primary_key":["id","id"]"#,
                "twice",
            ),
            (
                r#""primary_key":["id"]"#,
                r#""primary_key":["emb"]"#,
                "cannot be a key",
            ),
            (
                r#""columns":{"emb""#,
                r#""columns":{"title""#,
                "not a FLOAT[n]",
            ),
            (r#""dim":4"#, r#""dim":3"#, "do not match"),
        ] {
            assert!(good.contains(from), "{from} not in {good}");
            let err = decode(&good.replacen(from, to, 1)).unwrap_err().to_string();
            assert!(err.contains("corrupt object t"), "{err}");
            assert!(err.contains(needle), "{from} -> {to}: {err} lacks {needle}");
        }
        // Graph parameters an older build accepted come back in bounds.
        let old = good.replacen(r#""m":16"#, r#""m":1"#, 1);
        assert_ne!(old, good);
        let meta = decode(&old).unwrap();
        let hnsw = meta.columns()["emb"].vector.as_ref().unwrap().hnsw;
        assert_eq!(hnsw.m, *HnswParams::M.start());
    }

    #[test]
    fn random_stored_metadata_never_panics() {
        use rand::{Rng, SeedableRng};
        let good = TableMeta::new(
            &schema(),
            vec!["id".into(), "title".into()],
            &opts(&[("shards", "3"), ("raw.blob", "true"), ("emb.m", "8")]),
        )
        .unwrap()
        .to_json();
        let pieces = [
            "0",
            "1",
            "-1",
            "4294967296",
            "65537",
            "null",
            "true",
            "\"\"",
            "[]",
            "{}",
            "\"id\"",
            "\"emb\"",
            "1e309",
            "\"Float32\"",
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(12);
        let (mut accepted, mut refused) = (0, 0);
        for _ in 0..5000 {
            let mut json = good.clone();
            for _ in 0..rng.random_range(1..4) {
                // Replace a run of digits, a string or a literal with another.
                let at = rng.random_range(0..json.len());
                let Some(start) = json[at..]
                    .find(|c: char| c.is_ascii_digit() || c == '"' || c == 't' || c == 'f')
                    .map(|i| at + i)
                else {
                    continue;
                };
                let len = json[start + 1..]
                    .find([',', '}', ']', ':'])
                    .map_or(0, |i| i + 1);
                let piece = pieces[rng.random_range(0..pieces.len())];
                json.replace_range(start..start + len, piece);
            }
            match TableMeta::from_json(&json, "t") {
                Ok(meta) => {
                    accepted += 1;
                    // Whatever decodes is usable.
                    let table = crate::schema::TableSchema::new(&meta);
                    assert!((1..=MAX_SHARDS).contains(&table.shards));
                    assert_eq!(table.key.len(), meta.primary_key().len());
                }
                Err(e) => {
                    refused += 1;
                    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
                }
            }
        }
        assert!(
            accepted > 0 && refused > 0,
            "{accepted} accepted, {refused} refused"
        );
    }

    #[test]
    fn rejects_bad_vector_dimensions() {
        let zero = Schema::new(vec![Field::new(
            "v",
            DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, true)), 0),
            true,
        )]);
        let err = TableMeta::new(&zero, vec![], &[]).unwrap_err();
        assert!(err.to_string().contains("dimension 0"), "{err}");
    }
}
