"""memwal tables for datafusion-python: fresh, queryable data on object storage.

    import memwal, pyarrow as pa
    from datafusion import SessionContext

    root = memwal.open("./memwal-data")             # or s3://..., memory://...
    root.sql("CREATE TABLE items (id BIGINT PRIMARY KEY, name STRING)")
    ctx = SessionContext()
    ctx.register_catalog_provider("memwal", root)    # namespaces, tables, INSERT
    ctx.register_udtf(root.vector_search_udtf())     # vector_search(...)
    ctx.sql("SELECT * FROM memwal.public.items WHERE id = 7").to_pandas()

    items = root.table("items")
    items.put(pa.table({"id": [7], "name": ["seven"]}))  # durable when it returns
    items.delete([7])                                  # or a predicate: where="id > 5"

The catalog, tables and ``vector_search`` cross to datafusion-python through
DataFusion's FFI (the same major version, 55, on both sides); Arrow data
crosses through the Arrow C stream interface (results without a copy; puts
and keys are copied once, so memwal keeps no pyarrow buffer). DataFusion 55
does not forward DELETE over its FFI: ``DELETE`` in a datafusion-python
session fails; use ``Table.delete`` or ``Root.sql``. DDL runs through
``Root.sql`` too: in a datafusion-python session ``CREATE`` is refused with
that hint, and DataFusion reports a refused ``DROP TABLE`` as "doesn't
exist" (``IF EXISTS``: nothing done), the table left as it was. Blocking calls release
the GIL, so puts from several threads share the writers' group commits.
"""

from __future__ import annotations

from typing import Any

import os

import pyarrow as pa

from ._memwal import (
    AlreadyExistsError,
    ConflictError,
    FencedError,
    InvalidInputError,
    MemwalError,
    NotFoundError,
)
from ._memwal import Root as _NativeRoot

__all__ = [
    "AlreadyExistsError",
    "ConflictError",
    "FencedError",
    "InvalidInputError",
    "MemwalError",
    "NotFoundError",
    "Root",
    "Table",
    "open",
]


def open(location: Any, allow_file_access: bool = False, **options: Any) -> Root:  # noqa: A001
    """Opens the memwal root at ``location`` (a directory as a string or a
    path, ``file://``, ``s3://bucket/prefix``, ``memory://``). ``options``
    are writer options by the names of ``SET memwal.<option>``
    (``wal_flush_interval='50ms'``, ``durable=False``, ...); an unknown name
    raises InvalidInputError. ``store_timeout='30s'`` (default 60 s) fails a
    request to an ``s3://`` root that has not succeeded within it, retries
    included. ``allow_file_access`` lets ``Root.sql`` read
    and write files outside the root (``SELECT * FROM 'x.parquet'``,
    ``COPY ... TO``), as the shell does."""
    return Root(location, allow_file_access=allow_file_access, **options)


class Root:
    """A memwal root: its catalog (for ``SessionContext.register_catalog_provider``),
    SQL with memwal's DDL, and its tables."""

    def __init__(self, location: Any, allow_file_access: bool = False, **options: Any) -> None:
        values = {k: _option_text(v) for k, v in options.items()}
        self._native = _NativeRoot(os.fspath(location), values, allow_file_access)
        self._closed = False

    def _live(self) -> Any:
        if self._closed:
            raise MemwalError("this root is closed: open it again with memwal.open")
        return self._native

    def sql(self, query: str) -> pa.Table:
        """Runs one statement through memwal's own session (DDL, INSERT,
        DELETE, queries) and returns its result. Ctrl-C (a signal whose
        handler raises) stops it within 0.1 s: a query's work stops, and a
        write's shards hold their part of it or not, each whole."""
        return pa.table(self._live().sql(query))

    def table(self, name: str) -> Table:
        """The table ``name``: ``items``, or dotted with its namespace
        (``shop.items``). Raises NotFoundError if there is none."""
        return Table(self, self._live().table(name))

    def vector_search_udtf(self):
        """``vector_search(table, column, query, k [, ef])`` as a
        datafusion-python ``TableFunction``, for ``ctx.register_udtf``."""
        from datafusion import udtf

        return udtf(self._live().vector_search_function(), "vector_search")

    def close(self) -> None:
        """Makes every write durable and closes the writers; the root and
        its tables refuse every call after it (providers already handed to
        a SessionContext keep working)."""
        if not self._closed:
            self._closed = True
            self._native.close()

    def __datafusion_catalog_provider__(self, session: Any) -> object:
        return self._live().__datafusion_catalog_provider__(session)

    def __enter__(self) -> Root:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Table:
    """One memwal table: put, delete, get and scan with Arrow data."""

    def __init__(self, root: Root, native: Any) -> None:
        self._root = root
        self._native = native
        self.schema: pa.Schema = pa.schema(native)
        self.primary_key: list[str] = list(native.primary_key)

    @property
    def name(self) -> str:
        return self._native.name

    def _live(self) -> Any:
        self._root._live()
        return self._native

    def put(self, data: Any) -> int:
        """Upserts the rows of ``data`` and returns once they are durable
        (visible, with ``durable=False``). Puts from several threads at once
        share the writers' group commits: one WAL append per
        ``wal_flush_interval`` (100 ms) for all of them, so each such put
        takes up to that long and their rows per second grow with the
        threads.

        ``data`` is Arrow data (a pyarrow Table, RecordBatch or
        RecordBatchReader, or any object with ``__arrow_c_stream__``) or what
        ``pa.table`` takes (a dict of columns, a pandas DataFrame). Columns
        go by name and a nullable column left out is NULL. A column whose
        type differs from the table's is cast where every value keeps its
        meaning (``string`` for ``string_view`` or a dictionary of strings,
        ``int64`` for ``int32`` with overflow an error, a list of floats for
        a vector column, a timestamp of a coarser unit such as a Python
        ``datetime``'s microseconds; numbers for a float column are rounded
        to its precision, as SQL's CAST does, and one beyond its range is
        an error), never by rounding to an integer or parsing text; the
        others are not copied. A column given twice is
        refused.
        Returns the rows stored: one per distinct key."""
        return self._live().put(self._arrow(data))

    def delete(self, keys: Any = None, *, where: str | None = None) -> int:
        """Deletes rows and returns once that is durable.

        ``keys``: key values (a list, numpy array, pandas Series or pyarrow
        array of them; one key column) or Arrow data of the key columns:
        returns the distinct keys given (a key with no row counts too, as
        nothing is read to delete by key). ``where``: a SQL predicate
        (``where="id > 5"``) instead: returns the rows deleted. A bare
        string is refused, as it could be either (a text key ``'true'``,
        or the predicate deleting every row)."""
        if (keys is None) == (where is None):
            raise InvalidInputError("give the keys to delete, or where= a SQL predicate")
        if isinstance(keys, str):
            raise InvalidInputError(
                f"delete({keys!r}): a string could be a key or a predicate: give "
                f"delete([{keys!r}]) for the key, or delete(where={keys!r}) for the predicate"
            )
        if where is None:
            return self._live().delete_keys(self._keys(keys))
        if not where.strip():
            raise InvalidInputError(
                "an empty predicate: give a condition, such as where='id > 5' (or "
                "where='true' to delete every row)"
            )
        # By name: only while the name still names this table.
        self._live().check_current()
        result = self._root.sql(f"DELETE FROM {_sql_name(self.name)} WHERE {where}")
        return int(result.column(0)[0].as_py())

    def get(self, keys: Any) -> pa.Table:
        """The newest live rows with the keys ``keys`` (a key value, a list,
        numpy array, pandas Series or pyarrow array of them, or Arrow data
        of the key columns), in their order; absent keys are left out."""
        return pa.table(self._live().get_keys(self._keys(keys)))

    def scan(self) -> pa.Table:
        """Every live row (the newest version of each key)."""
        return pa.table(self._live().scan())

    def stats(self) -> list[dict[str, Any]]:
        """The writer statistics, one dict per shard (``memwal_stats``)."""
        self._live().check_current()
        name = self.name.replace("'", "''")
        return self._root.sql(f"SELECT * FROM memwal_stats('{name}')").to_pylist()

    def __datafusion_table_provider__(self, session: Any) -> object:
        return self._live().__datafusion_table_provider__(session)

    def _keys(self, keys: Any) -> Any:
        if not self.primary_key:
            raise InvalidInputError(f"table {self.name} has no primary key")
        if keys is None:
            raise InvalidInputError("no keys given (None)")
        if isinstance(keys, (pa.Table, pa.RecordBatch, pa.RecordBatchReader)) or (
            type(keys).__name__ == "DataFrame"
        ):
            return self._arrow(keys)
        if len(self.primary_key) != 1:
            raise InvalidInputError(
                f"table {self.name} has a key of {len(self.primary_key)} columns: "
                "pass a pyarrow Table of them"
            )
        if isinstance(keys, (str, bytes, int, float)):
            keys = [keys]
        if isinstance(keys, pa.ChunkedArray):
            column = keys
        elif isinstance(keys, pa.Array):
            column = keys
        else:  # a list, tuple, range, numpy array or pandas Series
            column = pa.array(keys)
        return pa.table({self.primary_key[0]: column})

    @staticmethod
    def _arrow(data: Any) -> Any:
        """``data`` as an object with ``__arrow_c_stream__``."""
        if hasattr(data, "__arrow_c_stream__"):
            return data
        if isinstance(data, pa.RecordBatch):
            return pa.Table.from_batches([data])
        return pa.table(data)

def _sql_name(dotted: str) -> str:
    """``shop.items`` as SQL names it: each level quoted."""
    *namespace, table = dotted.split(".")
    quoted = '"' + table.replace('"', '""') + '"'
    if namespace:
        schema = ".".join(namespace).replace('"', '""')
        return f'"{schema}".{quoted}'
    return quoted


def _option_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
