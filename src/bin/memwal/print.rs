//! Printing results with datafusion-cli's formats, vector columns included.
//!
//! datafusion-cli's CSV and TSV writers (Arrow's) refuse nested columns
//! after printing the header; memwal's vector columns are nested
//! (`FixedSizeList<Float32>`). For those two formats nested columns are
//! printed as text, the way the table format shows them (`[0.1, 0.2]`);
//! JSON and NDJSON print them as arrays.

use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{ArrayRef, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::util::display::ArrayFormatter;
use datafusion::config::FormatOptions;
use datafusion::error::Result;
use datafusion_cli::print_format::PrintFormat;
use datafusion_cli::print_options::PrintOptions;

/// Prints `batches` (with `schema`) in the format of `options`.
pub fn print_batches(
    options: &PrintOptions,
    schema: SchemaRef,
    batches: &[RecordBatch],
    start: Instant,
    format: &FormatOptions,
) -> Result<()> {
    let rows = batches.iter().map(|b| b.num_rows()).sum();
    if matches!(options.format, PrintFormat::Csv | PrintFormat::Tsv)
        && schema.fields().iter().any(|f| f.data_type().is_nested())
    {
        let display = format.try_into()?;
        let text_schema = nested_as_text(&schema);
        let batches = batches
            .iter()
            .map(|batch| {
                let columns = batch
                    .columns()
                    .iter()
                    .map(|column| -> Result<ArrayRef> {
                        if !column.data_type().is_nested() {
                            return Ok(Arc::clone(column));
                        }
                        let formatter = ArrayFormatter::try_new(column.as_ref(), &display)?;
                        let text: StringArray = (0..column.len())
                            .map(|i| (!column.is_null(i)).then(|| formatter.value(i).to_string()))
                            .collect();
                        Ok(Arc::new(text))
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(RecordBatch::try_new(Arc::clone(&text_schema), columns)?)
            })
            .collect::<Result<Vec<_>>>()?;
        return options.print_batches(text_schema, &batches, start, rows, format);
    }
    options.print_batches(schema, batches, start, rows, format)
}

/// `schema` with every nested column turned into a text column.
fn nested_as_text(schema: &Schema) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| {
            if f.data_type().is_nested() {
                Field::new(f.name(), DataType::Utf8, f.is_nullable())
            } else {
                f.as_ref().clone()
            }
        })
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}
