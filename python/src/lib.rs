//! `memwal._memwal`: the native half of the Python package. A [`Root`]
//! opens a memwal root (a `MemwalSession`); its catalog, tables and
//! `vector_search` cross to datafusion-python as FFI capsules; [`Table`]
//! takes and returns Arrow data through the Arrow C stream interface,
//! without copying it. Blocking calls release the GIL and run on one
//! tokio runtime per process, so puts from several Python threads meet in
//! the writers' group commit.

use std::ffi::CStr;
use std::future::Future;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use datafusion::arrow::array::{
    ArrayData, ArrayRef, AsArray, RecordBatch, RecordBatchIterator, RecordBatchReader, make_array,
    new_null_array,
};
use datafusion::arrow::buffer::{BooleanBuffer, Buffer, NullBuffer};
use datafusion::arrow::compute::{CastOptions, cast_with_options};
use datafusion::arrow::datatypes::{
    DataType, Field, Float32Type, Float64Type, Schema, SchemaRef, TimeUnit,
};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::ffi::FFI_ArrowSchema;
use datafusion::arrow::ffi_stream::{ArrowArrayStreamReader, FFI_ArrowArrayStream};
use datafusion::error::DataFusionError;
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use memwal::{Error, MemwalSession, WriterOptions};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict};
use tokio::runtime::{Handle, Runtime};

create_exception!(_memwal, MemwalError, PyException, "An error from memwal.");
create_exception!(
    _memwal,
    InvalidInputError,
    MemwalError,
    "Bad input: a value, a name, SQL or an argument memwal refuses."
);
create_exception!(
    _memwal,
    NotFoundError,
    MemwalError,
    "A namespace, table or object that does not exist."
);
create_exception!(
    _memwal,
    AlreadyExistsError,
    MemwalError,
    "Create of a name that exists."
);
create_exception!(
    _memwal,
    ConflictError,
    MemwalError,
    "A commit that lost its race after every retry, or whose outcome is unknown."
);
create_exception!(
    _memwal,
    FencedError,
    MemwalError,
    "This process's writer of a shard was replaced by another writer."
);

/// The Python exception for a memwal error, with memwal's message.
fn to_py(error: Error) -> PyErr {
    let message = error.to_string();
    match error {
        Error::InvalidInput(_) | Error::NamespaceNotEmpty(_) => InvalidInputError::new_err(message),
        Error::NotFound(_) => NotFoundError::new_err(message),
        Error::AlreadyExists(_) => AlreadyExistsError::new_err(message),
        Error::CommitConflict { .. } | Error::CommitOutcomeUnknown { .. } => {
            ConflictError::new_err(message)
        }
        Error::Fenced { .. } => FencedError::new_err(message),
        // Rows lost because another writer took the shard.
        Error::LostRows { cause, .. } if cause.starts_with("fenced: ") => {
            FencedError::new_err(message)
        }
        // SQL that does not parse or plan, or casts a value that cannot
        // be cast, is bad input too.
        Error::DataFusion(e)
            if matches!(
                e.find_root(),
                DataFusionError::Plan(_)
                    | DataFusionError::SQL(..)
                    | DataFusionError::SchemaError(..)
                    | DataFusionError::Configuration(_)
                    | DataFusionError::NotImplemented(_)
            ) || matches!(
                e.find_root(),
                DataFusionError::ArrowError(e, _) if matches!(**e, ArrowError::CastError(_))
            ) =>
        {
            InvalidInputError::new_err(message)
        }
        _ => MemwalError::new_err(message),
    }
}

/// The stack size of the runtime's threads (address space, used as
/// needed): DataFusion plans recursively, and a generated expression
/// thousands of terms long overflows the stack a caller's thread has.
const STACK_BYTES: usize = 256 << 20;

/// memwal's runtime, made by the first call in this process. A process
/// forked from one that made it has none of its threads (waiting on it
/// would never end): there it is an error.
fn runtime() -> PyResult<&'static Runtime> {
    static RUNTIME: OnceLock<(u32, Runtime)> = OnceLock::new();
    let (made_in, runtime) = RUNTIME.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("memwal")
            .thread_stack_size(STACK_BYTES)
            .build()
            .expect("a tokio runtime");
        (std::process::id(), runtime)
    });
    match *made_in == std::process::id() {
        true => Ok(runtime),
        false => Err(MemwalError::new_err(
            "this process was forked from one that had used memwal, whose threads a fork \
             does not copy: start it with multiprocessing's 'spawn' or 'forkserver' method \
             (multiprocessing.get_context('spawn')), or use memwal only after the fork",
        )),
    }
}

/// Runs `future` to its end on memwal's runtime with the GIL released.
fn wait<F>(py: Python<'_>, future: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let runtime = runtime()?;
    Ok(py.detach(|| runtime.block_on(future)))
}

/// How often a wait on SQL looks for a signal (Ctrl-C) to the process.
const SIGNAL_CHECKS: Duration = Duration::from_millis(100);

/// Like [`wait`], but runs `future` on one of the runtime's threads (a
/// large stack) instead of the caller's: for SQL, which is planned there.
/// A signal whose Python handler raises (Ctrl-C's `KeyboardInterrupt`)
/// stops the wait within [`SIGNAL_CHECKS`] and drops the statement.
fn wait_on_runtime<F>(py: Python<'_>, future: F) -> PyResult<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let runtime = runtime()?;
    let mut task = runtime.spawn(future);
    loop {
        let ended = py.detach(|| {
            runtime.block_on(async { tokio::time::timeout(SIGNAL_CHECKS, &mut task).await })
        });
        match ended {
            Ok(Ok(output)) => return Ok(output),
            Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Ok(Err(e)) => return Err(MemwalError::new_err(e.to_string())),
            Err(_still_running) => {
                if let Err(raised) = py.check_signals() {
                    task.abort();
                    return Err(raised);
                }
            }
        }
    }
}

/// The foreign session's logical extension codec, from the object
/// datafusion-python passes to `__datafusion_*__` (a capsule, or an object
/// that makes one).
fn foreign_codec(session: &Bound<'_, PyAny>) -> PyResult<FFI_LogicalExtensionCodec> {
    const MAKER: &str = "__datafusion_logical_extension_codec__";
    let capsule = if session.hasattr(MAKER)? {
        session.call_method0(MAKER)?
    } else {
        session.clone()
    };
    let capsule = capsule.cast::<PyCapsule>()?;
    let codec: NonNull<FFI_LogicalExtensionCodec> = capsule
        .pointer_checked(Some(c"datafusion_logical_extension_codec"))?
        .cast();
    // SAFETY: the capsule's name promises this type; it outlives the clone.
    Ok(unsafe { codec.as_ref() }.clone())
}

/// The FFI struct `make` builds (on memwal's runtime, for the foreign
/// session's logical codec) as a PyCapsule named `name`, as
/// datafusion-python's `__datafusion_*__` protocol wants it.
fn export<'py, T, F, Fut>(
    py: Python<'py>,
    session: &Bound<'py, PyAny>,
    name: &'static CStr,
    make: F,
) -> PyResult<Bound<'py, PyCapsule>>
where
    T: Send + 'static,
    F: FnOnce(Handle, FFI_LogicalExtensionCodec) -> Fut,
    Fut: Future<Output = memwal::Result<T>> + Send,
{
    let codec = foreign_codec(session)?;
    let made = wait(py, make(runtime()?.handle().clone(), codec))?.map_err(to_py)?;
    PyCapsule::new_with_value(py, made, name)
}

/// A copy of `column` in memory memwal allocated. Data from Python is
/// never kept past the call that gave it: a MemTable held pyarrow's
/// buffers until a flush, and one released from memwal's threads while
/// the interpreter exited, after pyarrow's allocator was gone, aborted the
/// process ("cannot create default memory pool", or a bad free).
fn owned(column: &ArrayRef) -> ArrayRef {
    make_array(owned_data(&column.to_data()))
}

/// `data` with every buffer copied, its children's too.
fn owned_data(data: &ArrayData) -> ArrayData {
    let copy = |buffer: &Buffer| Buffer::from_slice_ref(buffer.as_slice());
    let nulls = data.nulls().map(|n| {
        let bits = n.inner();
        NullBuffer::new(BooleanBuffer::new(
            copy(bits.inner()),
            bits.offset(),
            bits.len(),
        ))
    });
    let builder = data
        .clone()
        .into_builder()
        .buffers(data.buffers().iter().map(copy).collect())
        .child_data(data.child_data().iter().map(owned_data).collect())
        .nulls(nulls);
    // SAFETY: the same layout and bytes as `data`, as valid as it is.
    unsafe { builder.build_unchecked() }
}

/// The record batches of any object with `__arrow_c_stream__` (a pyarrow
/// Table or RecordBatchReader, a polars or DuckDB result...), as columns
/// of `schema`, copied (see [`owned`]): columns go by name, a nullable
/// column left out is NULL, and a column whose type differs is cast where
/// that keeps its values (see [`castable`]). Batches that do not fit pass
/// as they are, for memwal to refuse with its message.
fn batches_of(data: &Bound<'_, PyAny>, schema: &Schema) -> PyResult<Vec<RecordBatch>> {
    if !data.hasattr("__arrow_c_stream__")? {
        return Err(InvalidInputError::new_err(format!(
            "expected Arrow data (an object with __arrow_c_stream__, such as a \
             pyarrow Table), got {}",
            data.get_type().name()?
        )));
    }
    let capsule = data.call_method0("__arrow_c_stream__")?;
    let capsule = capsule.cast::<PyCapsule>()?;
    let stream: NonNull<FFI_ArrowArrayStream> =
        capsule.pointer_checked(Some(c"arrow_array_stream"))?.cast();
    // SAFETY: the capsule's name promises an ArrowArrayStream; from_raw
    // moves it out and leaves a released one for the capsule to drop.
    let reader = unsafe { ArrowArrayStreamReader::from_raw(stream.as_ptr()) }
        .map_err(|e| InvalidInputError::new_err(e.to_string()))?;
    let strict = CastOptions {
        safe: false, // an overflow is an error, not a NULL
        ..Default::default()
    };
    // The table's field for a batch field it may cast to.
    let target = |f: &Field| {
        schema
            .field_with_name(f.name())
            .ok()
            .filter(|t| f.data_type() == t.data_type() || castable(f.data_type(), t.data_type()))
    };
    let conformed = |batch: RecordBatch| -> Result<RecordBatch, ArrowError> {
        let given = batch.schema_ref().fields();
        if let Some(twice) = given
            .iter()
            .enumerate()
            .find(|(i, f)| given[..*i].iter().any(|g| g.name() == f.name()))
        {
            return Err(ArrowError::InvalidArgumentError(format!(
                "column '{}' is given twice",
                twice.1.name()
            )));
        }
        // A value that does not fit (a vector of another length, an
        // integer out of range) is named by its column.
        let cast_to = |name: &str, column: &ArrayRef, to: &DataType| match column.data_type() == to
        {
            true => Ok(Arc::clone(column)),
            false => {
                if let Some(message) = wrong_length(name, column, to) {
                    return Err(ArrowError::InvalidArgumentError(message));
                }
                let error = |e| {
                    ArrowError::InvalidArgumentError(format!("column '{name}' of type {to}: {e}"))
                };
                let cast =
                    cast_with_options(column, to, &strict).map_err(|e| error(e.to_string()))?;
                match beyond_range(column, &cast) {
                    Some(value) => Err(error(format!("{value:e} is beyond the range of {to}"))),
                    None => Ok(cast),
                }
            }
        };
        let complete = schema
            .fields()
            .iter()
            .all(|t| t.is_nullable() || batch.column_by_name(t.name()).is_some());
        if complete && given.iter().all(|f| target(f).is_some()) {
            // The table's columns in its order, left-out ones NULL;
            // nullable here: a NULL in a NOT NULL column is memwal's to name.
            let columns = schema
                .fields()
                .iter()
                .map(|t| match batch.column_by_name(t.name()) {
                    None => Ok(new_null_array(t.data_type(), batch.num_rows())),
                    Some(c) => cast_to(t.name(), c, t.data_type()).map(|c| owned(&c)),
                })
                .collect::<Result<Vec<_>, _>>()?;
            let fields: Vec<_> = schema
                .fields()
                .iter()
                .map(|f| f.as_ref().clone().with_nullable(true))
                .collect();
            return RecordBatch::try_new(Arc::new(Schema::new(fields)), columns);
        }
        // It does not fit: cast what can be, so memwal's refusal names only
        // what cannot.
        let mut fields = Vec::with_capacity(given.len());
        let mut columns = Vec::with_capacity(given.len());
        for (f, c) in given.iter().zip(batch.columns()) {
            match target(f) {
                Some(t) => {
                    columns.push(cast_to(f.name(), c, t.data_type())?);
                    fields.push(f.as_ref().clone().with_data_type(t.data_type().clone()));
                }
                None => {
                    columns.push(Arc::clone(c));
                    fields.push(f.as_ref().clone());
                }
            }
        }
        // Nullable columns left out are NULL here too: the refusal names
        // only what is wrong.
        for t in schema.fields() {
            if t.is_nullable() && batch.column_by_name(t.name()).is_none() {
                columns.push(new_null_array(t.data_type(), batch.num_rows()));
                fields.push(t.as_ref().clone());
            }
        }
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
    };
    // Importing a batch that does not match the stream's schema panics
    // in arrow's FFI (an assertion): that is bad input too.
    let batches = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        reader
            .map(|batch| batch.and_then(conformed))
            .collect::<Result<Vec<_>, ArrowError>>()
    }));
    match batches {
        // Said as memwal says bad input, not in Arrow's words.
        Ok(batches) => batches.map_err(|e| match e {
            ArrowError::InvalidArgumentError(why) => {
                InvalidInputError::new_err(Error::invalid(why).to_string())
            }
            other => InvalidInputError::new_err(other.to_string()),
        }),
        Err(panic) => {
            let why = (panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(InvalidInputError::new_err(format!(
                "a batch of the Arrow stream does not match the stream's schema ({why})"
            )))
        }
    }
}

/// A finite value of `from` that its cast `to` a narrower float made
/// infinite (arrow's cast does so without an error), if any.
/// Why the lists of `column` do not fit `to`, a fixed-size list, if one
/// has another length: as memwal's SQL says it (rows from 1).
fn wrong_length(name: &str, column: &ArrayRef, to: &DataType) -> Option<String> {
    let DataType::FixedSizeList(item, dim) = to else {
        return None;
    };
    let lengths: Vec<Option<usize>> = match column.data_type() {
        DataType::List(_) => column
            .as_list::<i32>()
            .iter()
            .map(|l| l.map(|l| l.len()))
            .collect(),
        DataType::LargeList(_) => column
            .as_list::<i64>()
            .iter()
            .map(|l| l.map(|l| l.len()))
            .collect(),
        _ => return None,
    };
    let (row, length) = (lengths.iter().enumerate())
        .find_map(|(row, length)| length.filter(|&l| l != *dim as usize).map(|l| (row, l)))?;
    let what = match item.data_type() {
        DataType::Float32 => {
            format!("vector column '{name}' is FLOAT[{dim}] and was given a vector")
        }
        other => format!("column '{name}' is a list of {dim} {other} and was given a list"),
    };
    Some(format!("{what} of length {length} in row {}", row + 1))
}

fn beyond_range(from: &ArrayRef, to: &ArrayRef) -> Option<f64> {
    let from = from.as_primitive_opt::<Float64Type>()?;
    let to = to.as_primitive_opt::<Float32Type>()?;
    (from.iter().zip(to.iter()))
        .find(|(f, t)| f.is_some_and(f64::is_finite) && t.is_some_and(f32::is_infinite))
        .and_then(|(f, _)| f)
}

/// Whether a put casts a column of type `from` to the table's `to`: only
/// where every value keeps its meaning (other string or binary layouts,
/// dictionary-encoded ones unpacked, integers to integers or decimals
/// with overflow an error, numbers to floats, rounded to the float's
/// precision as SQL's `CAST` does, decimals to a finer scale, timestamps
/// of one time zone to a finer unit with overflow an error, lists of
/// numbers to vectors, an all-NULL column); never a rounding to an
/// integer or a parse of text.
fn castable(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    let text = |t: &DataType| matches!(t, Utf8 | LargeUtf8 | Utf8View);
    let bytes = |t: &DataType| matches!(t, Binary | LargeBinary | BinaryView);
    let finer = |unit: &TimeUnit| match unit {
        TimeUnit::Second => 0,
        TimeUnit::Millisecond => 1,
        TimeUnit::Microsecond => 2,
        TimeUnit::Nanosecond => 3,
    };
    match (from, to) {
        (Null, _) => true,
        (Dictionary(_, values), b) => values.as_ref() == b || castable(values, b),
        (a, b) if a.is_integer() && (b.is_integer() || matches!(b, Decimal128(..))) => true,
        (a, b) if (a.is_integer() || a.is_floating()) && b.is_floating() => true,
        (Decimal128(_, a), Decimal128(_, b)) => b >= a,
        (Timestamp(a, zone_a), Timestamp(b, zone_b)) => zone_a == zone_b && finer(b) >= finer(a),
        (a, b) if text(a) && text(b) => true,
        (a, b) if bytes(a) && bytes(b) => true,
        (
            List(a) | LargeList(a) | FixedSizeList(a, _),
            List(b) | LargeList(b) | FixedSizeList(b, _),
        ) => a.data_type() == b.data_type() || castable(a.data_type(), b.data_type()),
        _ => false,
    }
}

/// Record batches on their way to Python: an Arrow C stream that pyarrow
/// (`pa.table(stream)`, `pa.RecordBatchReader.from_stream`) takes once.
#[pyclass(module = "memwal._memwal")]
struct ArrowStream {
    batches: Mutex<Option<(SchemaRef, Vec<RecordBatch>)>>,
}

impl ArrowStream {
    fn new(schema: SchemaRef, batches: Vec<RecordBatch>) -> Self {
        Self {
            batches: Mutex::new(Some((schema, batches))),
        }
    }
}

#[pymethods]
impl ArrowStream {
    /// The Arrow PyCapsule interface: the stream, once.
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = requested_schema; // the table's own schema is what we have
        let (schema, batches) = self
            .batches
            .lock()
            .expect("not poisoned")
            .take()
            .ok_or_else(|| MemwalError::new_err("this stream was read already"))?;
        let reader: Box<dyn RecordBatchReader + Send> = Box::new(RecordBatchIterator::new(
            batches.into_iter().map(Ok),
            schema,
        ));
        PyCapsule::new_with_value(py, FFI_ArrowArrayStream::new(reader), c"arrow_array_stream")
    }
}

/// A memwal root: its catalog, SQL (DDL included), tables.
#[pyclass(module = "memwal._memwal", frozen)]
struct Root {
    session: Arc<MemwalSession>,
}

#[pymethods]
impl Root {
    /// Opens the root at `location` (a directory, `file://`, `s3://...`,
    /// `memory://`) with writer options `options` (the names of
    /// `SET memwal.<option>`, values as strings; `store_timeout` is the
    /// session's [`memwal::SessionBuilder::store_timeout`]) and, with
    /// `allow_file_access`, SQL reading and writing files outside the root.
    #[new]
    #[pyo3(signature = (location, options = None, allow_file_access = false))]
    fn new(
        py: Python<'_>,
        location: String,
        options: Option<Bound<'_, PyDict>>,
        allow_file_access: bool,
    ) -> PyResult<Self> {
        let mut writer = WriterOptions::default();
        let mut store_timeout = None;
        for (name, value) in options.iter().flat_map(|o| o.iter()) {
            let name: String = name.extract()?;
            let value = value.str()?.to_string();
            if name == "store_timeout" {
                store_timeout = Some(memwal::parse_duration(&name, &value).map_err(to_py)?);
            } else {
                writer.set(&name, &value).map_err(to_py)?;
            }
        }
        writer.check().map_err(to_py)?;
        let session = wait(py, async move {
            let mut builder = MemwalSession::builder(&location);
            if let Some(timeout) = store_timeout {
                builder = builder.store_timeout(timeout);
            }
            let session = builder
                .writer_options(writer)
                .allow_file_access(allow_file_access)
                .open()
                .await?;
            session.catalog().await?;
            Ok::<_, Error>(session)
        })?
        .map_err(to_py)?;
        Ok(Self {
            session: Arc::new(session),
        })
    }

    /// Runs one SQL statement and returns its rows as an [`ArrowStream`]
    /// (DDL and DML return their one-row result).
    fn sql(&self, py: Python<'_>, query: String) -> PyResult<ArrowStream> {
        let session = Arc::clone(&self.session);
        let (schema, batches) = wait_on_runtime(py, async move {
            let frame = session.sql(&query).await?;
            let schema = Arc::new(frame.schema().as_arrow().clone());
            let batches = frame.collect().await?;
            Ok::<_, Error>((schema, batches))
        })?
        .map_err(to_py)?;
        Ok(ArrowStream::new(schema, batches))
    }

    /// The table `name` (dotted: `items`, `shop.items`).
    fn table(&self, py: Python<'_>, name: String) -> PyResult<Table> {
        let session = Arc::clone(&self.session);
        let table = {
            let name = name.clone();
            wait(py, async move { session.table(&name).await })?.map_err(to_py)?
        };
        Ok(Table {
            session: Arc::clone(&self.session),
            name,
            table,
        })
    }

    /// The catalog for datafusion-python's `register_catalog_provider`.
    fn __datafusion_catalog_provider__<'py>(
        &self,
        py: Python<'py>,
        session: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let root = Arc::clone(&self.session);
        export(
            py,
            &session,
            c"datafusion_catalog_provider",
            |rt, codec| async move { memwal::ffi::catalog_provider(&root, rt, codec).await },
        )
    }

    /// `vector_search` as datafusion-python's `TableFunction` takes it.
    fn vector_search_function(&self) -> VectorSearch {
        VectorSearch {
            session: Arc::clone(&self.session),
        }
    }

    /// Makes every write durable and closes the writers.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let session = Arc::clone(&self.session);
        wait(py, async move { session.close().await })?.map_err(to_py)
    }
}

/// `vector_search(table, column, query, k [, ef])` for datafusion-python.
#[pyclass(module = "memwal._memwal", frozen)]
struct VectorSearch {
    session: Arc<MemwalSession>,
}

#[pymethods]
impl VectorSearch {
    fn __datafusion_table_function__<'py>(
        &self,
        py: Python<'py>,
        session: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let root = Arc::clone(&self.session);
        export(
            py,
            &session,
            c"datafusion_table_function",
            |rt, codec| async move { memwal::ffi::vector_search(&root, rt, codec).await },
        )
    }
}

/// One table: put, delete, get and scan with Arrow data, its writer
/// statistics, and the table as a datafusion-python table provider.
#[pyclass(module = "memwal._memwal", frozen)]
struct Table {
    session: Arc<MemwalSession>,
    name: String,
    table: Arc<memwal::Table>,
}

#[pymethods]
impl Table {
    /// The table's name as it was opened.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The table's schema as an Arrow C schema capsule
    /// (`pa.schema(table)` reads it).
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        let schema = FFI_ArrowSchema::try_from(self.table.schema().as_ref())
            .map_err(|e| MemwalError::new_err(e.to_string()))?;
        PyCapsule::new_with_value(py, schema, c"arrow_schema")
    }

    /// The names of the primary-key columns, in key order.
    #[getter]
    fn primary_key(&self) -> Vec<String> {
        self.table.primary_key()
    }

    /// Upserts the rows of `data` (Arrow data); returns once they are
    /// durable, with the rows stored (one per distinct key).
    fn put(&self, py: Python<'_>, data: Bound<'_, PyAny>) -> PyResult<u64> {
        let batches = batches_of(&data, &self.table.schema())?;
        let table = Arc::clone(&self.table);
        wait(py, async move { table.put_all(&batches).await })?.map_err(to_py)
    }

    /// Deletes the rows whose keys are the rows of `keys` (Arrow data of
    /// exactly the key columns); returns once durable, with the count.
    fn delete_keys(&self, py: Python<'_>, keys: Bound<'_, PyAny>) -> PyResult<u64> {
        let batches = batches_of(&keys, &self.key_schema())?;
        let table = Arc::clone(&self.table);
        wait(py, async move { table.delete_all(&batches).await })?.map_err(to_py)
    }

    /// The live rows with the keys of `keys` (Arrow data of exactly the key
    /// columns), in their order; keys with no row are left out.
    fn get_keys(&self, py: Python<'_>, keys: Bound<'_, PyAny>) -> PyResult<ArrowStream> {
        let batches = batches_of(&keys, &self.key_schema())?;
        let table = Arc::clone(&self.table);
        let rows = wait(py, async move {
            let mut rows = Vec::new();
            for batch in &batches {
                for i in 0..batch.num_rows() {
                    if let Some(row) = table.get(&batch.slice(i, 1)).await? {
                        rows.push(row);
                    }
                }
            }
            Ok::<_, Error>(rows)
        })?
        .map_err(to_py)?;
        Ok(ArrowStream::new(self.table.schema(), rows))
    }

    /// Every live row, newest version of each key.
    fn scan(&self, py: Python<'_>) -> PyResult<ArrowStream> {
        let table = Arc::clone(&self.table);
        let rows = wait(py, async move { table.scan().await })?.map_err(to_py)?;
        Ok(ArrowStream::new(self.table.schema(), rows))
    }

    /// Raises NotFoundError unless the name this handle was opened by
    /// still names its table (for what goes by name: SQL, the provider).
    fn check_current(&self, py: Python<'_>) -> PyResult<()> {
        let (session, name) = (Arc::clone(&self.session), self.name.clone());
        match wait(py, async move { session.table(&name).await })? {
            Ok(current) if Arc::ptr_eq(&current, &self.table) => Ok(()),
            Ok(_) | Err(Error::NotFound(_)) => Err(to_py(Error::NotFound(format!(
                "table {} (dropped since this handle was opened; open it again by name)",
                self.name
            )))),
            Err(e) => Err(to_py(e)),
        }
    }

    /// The table for datafusion-python's `register_table`.
    fn __datafusion_table_provider__<'py>(
        &self,
        py: Python<'py>,
        session: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        self.check_current(py)?;
        let (root, name) = (Arc::clone(&self.session), self.name.clone());
        export(
            py,
            &session,
            c"datafusion_table_provider",
            |rt, codec| async move { memwal::ffi::table_provider(&root, &name, rt, codec).await },
        )
    }
}

impl Table {
    fn key_schema(&self) -> Schema {
        let schema = self.table.schema();
        let fields: Vec<_> = self
            .table
            .primary_key()
            .iter()
            .map(|k| schema.field_with_name(k).expect("a key column").clone())
            .collect();
        Schema::new(fields)
    }
}

/// The native module.
#[pymodule]
fn _memwal(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<Root>()?;
    m.add_class::<Table>()?;
    m.add_class::<VectorSearch>()?;
    m.add_class::<ArrowStream>()?;
    m.add("MemwalError", py.get_type::<MemwalError>())?;
    m.add("InvalidInputError", py.get_type::<InvalidInputError>())?;
    m.add("NotFoundError", py.get_type::<NotFoundError>())?;
    m.add("AlreadyExistsError", py.get_type::<AlreadyExistsError>())?;
    m.add("ConflictError", py.get_type::<ConflictError>())?;
    m.add("FencedError", py.get_type::<FencedError>())?;
    // Benchmarks refuse figures from a build with debug assertions.
    m.add("DEBUG_ASSERTIONS", cfg!(debug_assertions))?;
    Ok(())
}
