"""memwal from Python: the catalog, tables and vector_search in a
datafusion-python session, and the put/get/delete/scan API with pyarrow."""

import os
import subprocess
import sys
import textwrap
import threading
import time

import pyarrow as pa
import pytest
from datafusion import SessionContext

import memwal


@pytest.fixture
def root(tmp_path):
    with memwal.open(str(tmp_path / "root")) as r:
        yield r


def session(root):
    ctx = SessionContext()
    ctx.register_catalog_provider("memwal", root)
    ctx.register_udtf(root.vector_search_udtf())
    return ctx


def rows(table):
    """A pyarrow Table as sorted tuples."""
    return sorted(tuple(r.values()) for r in table.to_pylist())


def test_catalog_ddl_is_seen_by_datafusion_python(root):
    root.sql("CREATE SCHEMA shop")
    root.sql("CREATE TABLE shop.items (id BIGINT PRIMARY KEY, name STRING)")
    root.sql("CREATE TABLE plain (id BIGINT PRIMARY KEY)")
    ctx = session(root)
    assert "shop" in ctx.catalog("memwal").names()
    assert ctx.catalog("memwal").schema("shop").names() == {"items"}
    # A table made after registration appears too (lookups refresh).
    root.sql("CREATE TABLE shop.orders (id BIGINT PRIMARY KEY)")
    assert ctx.sql("SELECT count(*) AS n FROM memwal.shop.orders").to_pylist() == [{"n": 0}]
    root.sql("DROP TABLE shop.orders")
    with pytest.raises(Exception, match="orders"):
        ctx.sql("SELECT * FROM memwal.shop.orders").collect()


def test_insert_through_sql_then_read_back(root):
    root.sql("CREATE TABLE t (id BIGINT PRIMARY KEY, v STRING)")
    ctx = session(root)
    out = ctx.sql("INSERT INTO memwal.public.t VALUES (1, 'a'), (2, 'b'), (1, 'c')").to_pylist()
    assert out == [{"count": 2}]
    got = ctx.sql("SELECT id, v FROM memwal.public.t ORDER BY id").to_pylist()
    assert got == [{"id": 1, "v": "c"}, {"id": 2, "v": "b"}]
    # The same rows through memwal's own session and the Python API.
    assert rows(root.sql("SELECT id, v FROM t")) == [(1, "c"), (2, "b")]
    assert rows(root.table("t").get([2])) == [(2, "b")]
    # A point query with a filter goes through memwal's scan.
    assert ctx.sql("SELECT v FROM memwal.public.t WHERE id = 1").to_pylist() == [{"v": "c"}]


def test_put_get_delete_upsert(root):
    root.sql("CREATE TABLE kv (id BIGINT PRIMARY KEY, a BIGINT, s STRING) WITH ('shards' = '3')")
    kv = root.table("kv")
    assert kv.primary_key == ["id"]
    assert kv.schema.names == ["id", "a", "s"]
    n = kv.put(pa.table({"id": list(range(100)), "a": [i * 7 for i in range(100)],
                         "s": [f"s{i}" for i in range(100)]}))
    assert n == 100
    # Upsert: the newest version of a key wins, the last row of a key in one put.
    assert kv.put({"id": [5, 5, 200], "a": [1, 2, 3], "s": ["x", "y", "z"]}) == 2
    assert rows(kv.get([5, 200, 999])) == [(5, 2, "y"), (200, 3, "z")]
    # A RecordBatchReader streams in; columns go by name, in any order.
    reader_batch = pa.record_batch({"id": [301], "a": [8], "s": ["q"]})
    reader = pa.RecordBatchReader.from_batches(reader_batch.schema, [reader_batch])
    assert kv.put(reader) == 1
    batch = pa.record_batch({"s": ["r"], "id": [300], "a": [9]})
    assert kv.put(batch) == 1
    assert rows(kv.get([300, 301])) == [(300, 9, "r"), (301, 8, "q")]
    # By key: the distinct keys given (999 has no row; nothing is read).
    assert kv.delete([0, 1, 2, 999, 2]) == 4
    assert kv.delete(where="id >= 90 AND id < 100") == 10
    table = kv.scan()
    assert table.num_rows == 100 - 3 - 10 + 3
    assert {0, 1, 2, 95}.isdisjoint(table.column("id").to_pylist())
    stats = kv.stats()
    assert len(stats) == 3 and sum(s["rows"] for s in stats) > 0


def test_vector_search_with_a_where(root):
    root.sql("CREATE TABLE docs (id BIGINT PRIMARY KEY, tag STRING, emb FLOAT[3])")
    docs = root.table("docs")
    docs.put({
        "id": [1, 2, 3, 4, 5],
        "tag": ["a", "b", "a", "a", "b"],
        "emb": [[1.0, 0.0, 0.0], [0.9, 0.1, 0.0], [0.0, 1.0, 0.0], [0.8, 0.2, 0.0], [1.0, 0.0, 0.1]],
    })
    ctx = session(root)
    got = ctx.sql(
        "SELECT id FROM vector_search('docs', 'emb', [1.0, 0.0, 0.0], 2) WHERE tag = 'a'"
    ).to_pylist()
    assert [r["id"] for r in got] == [1, 4]
    # Without the WHERE the nearest two of all rows.
    got = ctx.sql("SELECT id FROM vector_search('docs', 'emb', [1.0, 0.0, 0.0], 2)").to_pylist()
    assert sorted(r["id"] for r in got) == [1, 5]


def test_errors_are_typed_with_memwal_messages(root, tmp_path):
    with pytest.raises(memwal.NotFoundError, match="nope"):
        root.table("nope")
    root.sql("CREATE TABLE t (id BIGINT PRIMARY KEY, v STRING NOT NULL)")
    with pytest.raises(memwal.AlreadyExistsError):
        root.sql("CREATE TABLE t (id BIGINT PRIMARY KEY)")
    t = root.table("t")
    with pytest.raises(memwal.InvalidInputError, match="'v' holds NULL"):
        t.put({"id": [1], "v": [None]})
    # A value that does not fit the column's type is refused, not made NULL.
    root.sql("CREATE TABLE small (id BIGINT PRIMARY KEY, n INT)")
    with pytest.raises(memwal.InvalidInputError, match="column 'n'"):
        root.table("small").put({"id": [1], "n": [2**40]})
    assert root.table("small").scan().num_rows == 0
    with pytest.raises(memwal.InvalidInputError, match="Arrow data"):
        t._native.put(42)
    with pytest.raises(memwal.InvalidInputError, match="unknown writer option"):
        memwal.open(str(tmp_path / "other"), no_such_option=1)
    with pytest.raises(memwal.InvalidInputError, match="store_timeout"):
        memwal.open(str(tmp_path / "other"), store_timeout="soon")
    with pytest.raises(memwal.InvalidInputError, match="more than zero"):
        memwal.open(str(tmp_path / "other"), store_timeout="0s")
    memwal.open(str(tmp_path / "other"), store_timeout="30s").close()
    with pytest.raises(memwal.InvalidInputError):
        root.sql("SELECT 1; SELECT 2")
    with pytest.raises(memwal.InvalidInputError):
        root.sql("SELEC 1")
    with pytest.raises(memwal.InvalidInputError, match="Cast error"):
        root.sql("SELECT CAST('x' AS INT)")
    with pytest.raises(memwal.InvalidInputError, match="no_such_column"):
        root.sql("SELECT no_such_column FROM t")
    # DELETE is not forwarded by DataFusion 55's FFI: it fails, nothing deleted.
    t.put({"id": [1], "v": ["kept"]})
    ctx = session(root)
    with pytest.raises(Exception, match="DELETE"):
        ctx.sql("DELETE FROM memwal.public.t WHERE id = 1").collect()
    assert rows(t.get([1])) == [(1, "kept")]
    # Every memwal error is a MemwalError.
    assert issubclass(memwal.FencedError, memwal.MemwalError)


def test_puts_from_threads_share_group_commits(root):
    root.sql("CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT)")
    t = root.table("t")

    def put(first):
        for i in range(first, first + 200, 10):
            t.put({"id": list(range(i, i + 10)), "v": list(range(i, i + 10))})

    threads = [threading.Thread(target=put, args=(k * 200,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert t.scan().num_rows == 1600
    stats = t.stats()[0]
    # 160 puts from 8 threads at once: fewer WAL appends than puts.
    assert stats["puts"] == 160
    assert stats["wal_appends"] < 160


def test_a_reopened_root_and_a_second_process(tmp_path):
    location = str(tmp_path / "root")
    with memwal.open(location) as r:
        r.sql("CREATE TABLE t (id BIGINT PRIMARY KEY, v STRING)")
        r.table("t").put({"id": [1, 2], "v": ["a", "b"]})
    # Another process writes the same table, then this one reads and writes.
    script = textwrap.dedent(f"""
        import memwal
        with memwal.open({location!r}) as r:
            t = r.table("t")
            t.put({{"id": [2, 3], "v": ["B", "c"]}})
            assert t.delete([1]) == 1
    """)
    subprocess.run([sys.executable, "-c", script], check=True, env=os.environ)
    with memwal.open(location) as r:
        t = r.table("t")
        assert rows(t.scan()) == [(2, "B"), (3, "c")]
        t.put({"id": [4], "v": ["d"]})
        ctx = session(r)
        got = ctx.sql("SELECT id FROM memwal.public.t ORDER BY id").to_pylist()
        assert [g["id"] for g in got] == [2, 3, 4]
    with memwal.open(location) as r:
        assert rows(r.table("t").scan()) == [(2, "B"), (3, "c"), (4, "d")]


def test_rows_lost_to_another_writer_raise_fenced_error(tmp_path):
    # Found from outside: it raised a bare MemwalError.
    location = str(tmp_path / "root")
    first = memwal.open(location, durable=False)
    first.sql("CREATE TABLE kv (id BIGINT PRIMARY KEY)")
    t = first.table("kv")
    t.put({"id": [1]})
    with memwal.open(location) as second:
        second.table("kv").put({"id": [2]})  # takes the shard
    with pytest.raises(memwal.FencedError, match="lost"):
        # Acknowledged before durable: a put is lost, and reported by a
        # later one once the writer's append met the new writer's fence.
        for n in range(3, 200):
            t.put({"id": [n]})
            time.sleep(0.05)
    first.close()


def test_two_processes_write_one_table_at_once(tmp_path):
    location = str(tmp_path / "root")
    with memwal.open(location) as r:
        r.sql("CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT) WITH ('shards' = '2')")
    script = textwrap.dedent(f"""
        import memwal
        with memwal.open({location!r}) as r:
            t = r.table("t")
            for i in range(1000, 1200, 10):
                t.put({{"id": list(range(i, i + 10)), "v": [2] * 10}})
    """)
    child = subprocess.Popen([sys.executable, "-c", script], env=os.environ)
    with memwal.open(location) as r:
        t = r.table("t")
        for i in range(0, 200, 10):
            t.put({"id": list(range(i, i + 10)), "v": [1] * 10})
        assert child.wait(timeout=120) == 0
        # Every row either process acknowledged, seen from this one.
        got = rows(t.scan())
        assert got == [(i, 1) for i in range(200)] + [(i, 2) for i in range(1000, 1200)]


def test_inputs_are_cast_only_where_values_keep_their_meaning(root):
    root.sql("CREATE TABLE t (id BIGINT PRIMARY KEY, n INT, note STRING, emb FLOAT[2])")
    t = root.table("t")
    # Left-out nullable columns are NULL; ints and float lists are cast.
    assert t.put(pa.table({"id": pa.array([1, 2], pa.int32()), "n": [5, 6]})) == 2
    assert rows(t.get(pa.array([2, 1]))) == [(1, 5, None, None), (2, 6, None, None)]
    assert t.get(1).num_rows == 1
    # A float is not a key: no row 1 for 1.9, no delete of 2 for 2.7.
    with pytest.raises(memwal.InvalidInputError, match="id is double, not int64|Float64"):
        t.get([1.9])
    with pytest.raises(memwal.InvalidInputError):
        t.delete([2.7])
    with pytest.raises(memwal.InvalidInputError):
        t.put({"id": [3], "n": [1.5]})
    with pytest.raises(memwal.InvalidInputError):
        t.get(["1"])
    # A value that does not fit its column names the column.
    # (Said as SQL says it, not in Arrow's words.)
    with pytest.raises(
        memwal.InvalidInputError,
        match=r"^invalid input: vector column 'emb' is FLOAT\[2\] and was given a vector of length 3 in row 2$",
    ):
        t.put({"id": [3, 4], "emb": [[1.0, 2.0], [1.0, 2.0, 3.0]]})
    # A column the table does not have, or a NOT NULL one left out, is named.
    with pytest.raises(memwal.InvalidInputError, match="not in the table: extra"):
        t.put({"id": [4], "extra": [1]})
    with pytest.raises(memwal.InvalidInputError, match="missing id"):
        t.put({"n": [1]})
    # A column given twice is refused, not taken from its first copy.
    twice = pa.Table.from_arrays([pa.array([20]), pa.array([21])], names=["id", "id"])
    with pytest.raises(memwal.InvalidInputError, match="^invalid input: column 'id' is given twice$"):
        t.put(twice)
    assert rows(t.scan()) == [(1, 5, None, None), (2, 6, None, None)]
    # Dictionary-encoded strings (a pandas categorical) are unpacked.
    notes = pa.array(["a", "b"]).dictionary_encode()
    assert t.put(pa.table({"id": [7, 8], "note": notes})) == 2
    assert [r[2] for r in rows(t.get([7, 8]))] == ["a", "b"]
    # A refusal names what is wrong, not the nullable columns left out
    # (found from outside: "... not Int32; missing note, emb").
    with pytest.raises(memwal.InvalidInputError) as refused:
        t.put({"id": [9], "n": ["x"]})
    assert "missing" not in str(refused.value), refused.value


def test_an_empty_predicate_or_an_unknown_scheme_is_invalid_input(root):
    root.sql("CREATE TABLE t (id BIGINT PRIMARY KEY)")
    with pytest.raises(memwal.InvalidInputError, match="an empty predicate"):
        root.table("t").delete(where=" ")
    with pytest.raises(memwal.InvalidInputError, match="not one memwal opens"):
        memwal.open("ftp://host/path")


def test_a_bare_string_is_neither_a_key_nor_a_predicate_to_delete(root):
    # Found from outside: delete("true") on a text-keyed table ran
    # DELETE ... WHERE true (every row), where get("true") reads the key.
    root.sql("CREATE TABLE tk (name TEXT PRIMARY KEY, n INT)")
    t = root.table("tk")
    t.put({"name": ["a", "true", "c"], "n": [1, 2, 3]})
    with pytest.raises(memwal.InvalidInputError, match=r"delete\(\['true'\]\) for the key"):
        t.delete("true")
    with pytest.raises(memwal.InvalidInputError, match="or where= a SQL predicate"):
        t.delete()
    with pytest.raises(memwal.InvalidInputError, match=r"no keys given \(None\)"):
        t.get(None)
    with pytest.raises(memwal.InvalidInputError, match="or where= a SQL predicate"):
        t.delete(["a"], where="n > 1")
    assert t.scan().num_rows == 3
    assert t.delete(["true"]) == 1
    assert t.delete(where="n = 3") == 1
    assert t.scan().column("name").to_pylist() == ["a"]


def test_ctrl_c_stops_a_long_statement(tmp_path):
    # Found from outside: a KeyboardInterrupt came only when the query
    # ended. A join of 10^10 pairs runs for minutes.
    script = textwrap.dedent(f"""
        import os, signal, threading, time
        import memwal

        with memwal.open({str(tmp_path / "root")!r}) as r:
            threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
            started = time.monotonic()
            try:
                r.sql("SELECT count(*) FROM generate_series(1, 100000) a, "
                      "generate_series(1, 100000) b WHERE a.value + b.value = 7")
                print("finished")
            except KeyboardInterrupt:
                print("interrupted", round(time.monotonic() - started, 1))
            print(r.sql("SELECT 1 AS one").to_pylist())
    """)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=os.environ
    )
    assert out.returncode == 0, out.stderr
    interrupted, after = out.stdout.splitlines()
    assert interrupted.startswith("interrupted"), out.stdout
    assert float(interrupted.split()[1]) < 5, out.stdout
    assert after == "[{'one': 1}]"


def test_a_timestamp_of_a_coarser_unit_is_cast(root):
    # Found from outside: a Python datetime (microseconds) was refused for
    # a TIMESTAMP column (nanoseconds).
    import datetime

    root.sql("CREATE TABLE t (id BIGINT PRIMARY KEY, at TIMESTAMP)")
    t = root.table("t")
    at = datetime.datetime(2026, 12, 7, 11, 45, 30, 123456)
    assert t.put({"id": [1], "at": [at]}) == 1
    assert t.get(1).column("at").to_pylist() == [at]
    # Beyond what nanoseconds hold: an error, not a wrapped value.
    with pytest.raises(memwal.InvalidInputError, match="column 'at'"):
        t.put({"id": [2], "at": [datetime.datetime(3000, 1, 1)]})


def test_a_float_beyond_a_columns_range_and_a_malformed_stream_are_refused(root):
    root.sql("CREATE TABLE t (id BIGINT PRIMARY KEY, x FLOAT, y DOUBLE)")
    t = root.table("t")
    # Found from outside: 1e300 was stored as inf; inf itself stays inf.
    with pytest.raises(memwal.InvalidInputError, match="column 'x'.*1e300 is beyond the range"):
        t.put({"id": [1], "x": [1e300]})
    assert t.put({"id": [2], "x": [float("inf")], "y": [1e300]}) == 1
    assert rows(t.scan()) == [(2, float("inf"), 1e300)]
    # A stream whose second batch does not match its schema (found from
    # outside: arrow's import panicked, a PanicException).
    schema = pa.schema([("id", pa.int64()), ("x", pa.float32())])

    def batches():
        yield pa.record_batch([pa.array([3]), pa.array([1.0], pa.float32())], schema=schema)
        yield pa.record_batch([pa.array([4])], names=["id"])

    stream = pa.RecordBatchReader.from_batches(schema, batches())
    with pytest.raises(memwal.InvalidInputError, match="does not match the stream's schema"):
        t.put(stream)
    assert rows(t.scan()) == [(2, float("inf"), 1e300)]


def test_a_process_forked_after_memwal_ran_is_told_to_spawn(tmp_path):
    # Found from outside: a multiprocessing child (fork) of a process that
    # had used memwal waited forever for the runtime's threads.
    location = str(tmp_path / "root")
    script = textwrap.dedent(f"""
        import multiprocessing, sys
        import memwal

        def child(location, start):
            try:
                with memwal.open(location) as r:
                    r.table("t").put({{"id": [2]}})
                print(start, "ok", flush=True)
            except memwal.MemwalError as e:
                print(start, "refused:", e, flush=True)

        if __name__ == "__main__":
            with memwal.open({location!r}) as r:
                r.sql("CREATE TABLE t (id BIGINT PRIMARY KEY)")
                r.table("t").put({{"id": [1]}})
            for start in ["fork", "spawn"]:
                p = multiprocessing.get_context(start).Process(target=child, args=({location!r}, start))
                p.start()
                p.join(60)
                assert p.exitcode == 0, (start, p.exitcode)
    """)
    path = tmp_path / "forks.py"
    path.write_text(script)
    out = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=120, env=os.environ
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("fork refused: this process was forked"), out.stdout
    assert "'spawn'" in lines[0]
    assert lines[1] == "spawn ok", out.stdout


def test_a_dropped_or_closed_handle_refuses_writes(tmp_path):
    r = memwal.open(tmp_path / "root")  # a path object too
    r.sql("CREATE TABLE t (id BIGINT PRIMARY KEY)")
    t = r.table("public.t")  # `public` is the root, as in SQL
    t.put({"id": [1]})
    r.sql("DROP TABLE t")
    with pytest.raises(memwal.NotFoundError, match="dropped"):
        t.put({"id": [2]})
    r.sql("CREATE TABLE t (id BIGINT PRIMARY KEY)")
    assert r.table("t").scan().num_rows == 0
    # What goes by name does not reach the new table of that name either.
    r.table("t").put({"id": [2]})
    with pytest.raises(memwal.NotFoundError, match="dropped"):
        t.delete(where="id = 2")
    with pytest.raises(memwal.NotFoundError, match="dropped"):
        t.stats()
    with pytest.raises(memwal.NotFoundError, match="dropped"):
        SessionContext().register_table("old", t)
    assert r.table("t").scan().num_rows == 1
    r.close()
    with pytest.raises(memwal.MemwalError, match="closed"):
        r.table("t")
    with pytest.raises(memwal.MemwalError, match="closed"):
        t.scan()


def test_ddl_in_a_datafusion_session_is_refused_with_the_way_to_run_it(root):
    root.sql("CREATE TABLE t (id BIGINT PRIMARY KEY)")
    ctx = session(root)
    for ddl in ["CREATE SCHEMA memwal.newns", "CREATE SCHEMA IF NOT EXISTS memwal.newns",
                "CREATE TABLE memwal.public.x (id INT)"]:
        with pytest.raises(Exception, match="Root.sql"):
            ctx.sql(ddl).collect()
    # DataFusion 55 reports any refusal of DROP TABLE as "doesn't exist"
    # (and IF EXISTS as nothing to do); the table stays either way.
    with pytest.raises(Exception, match="doesn't exist"):
        ctx.sql("DROP TABLE memwal.public.t").collect()
    ctx.sql("DROP TABLE IF EXISTS memwal.public.t").collect()
    assert root.sql("SELECT table_name FROM information_schema.tables "
                    "WHERE table_name = 't'").num_rows == 1
    assert root.sql("SELECT schema_name FROM information_schema.schemata "
                    "WHERE schema_name = 'newns'").num_rows == 0
    with pytest.raises(memwal.InvalidInputError, match="named twice"):
        root.sql("CREATE TABLE d (id BIGINT PRIMARY KEY, v INT, V STRING)")


def test_files_outside_the_root_only_when_allowed(tmp_path):
    out = tmp_path / "out.parquet"
    with memwal.open(tmp_path / "a") as r:
        with pytest.raises(memwal.InvalidInputError, match="allow_file_access=True"):
            r.sql(f"COPY (SELECT 1 AS x) TO '{out}' STORED AS PARQUET")
    with memwal.open(tmp_path / "b", allow_file_access=True) as r:
        r.sql(f"COPY (SELECT 1 AS x) TO '{out}' STORED AS PARQUET")
        assert r.sql(f"SELECT x FROM '{out}'").to_pylist() == [{"x": 1}]


def test_stats_latency_percentiles_stay_within_the_max(root):
    root.sql("CREATE TABLE t (id BIGINT PRIMARY KEY)")
    t = root.table("t")
    for i in range(20):
        t.put({"id": [i]})
    s = t.stats()[0]
    assert 0 < s["append_p50_ms"] <= s["append_p99_ms"] <= s["append_max_ms"]
    assert round(s["append_max_ms"], 3) == s["append_max_ms"]


def test_a_long_expression_does_not_overflow_the_callers_stack(tmp_path):
    # DataFusion plans recursively; a generated expression thousands of terms
    # long used to overflow the calling thread's stack and kill the process.
    location = str(tmp_path / "root")
    script = textwrap.dedent(f"""
        import threading
        import memwal
        threading.stack_size(256 * 1024)
        out = []
        def run():
            with memwal.open({location!r}) as r:
                out.append(r.sql("SELECT " + " + ".join(["1"] * 1000) + " AS n").to_pylist())
        th = threading.Thread(target=run)
        th.start()
        th.join()
        assert out == [[{{"n": 1000}}]], out
    """)
    done = subprocess.run([sys.executable, "-c", script], env=os.environ)
    assert done.returncode == 0


def test_puts_and_keys_keep_no_pyarrow_memory(root):
    # memwal copies what it is given: a MemTable holding pyarrow's buffers
    # released them from memwal's threads, and at interpreter exit, after
    # pyarrow's allocator was gone, that aborted the process.
    root.sql("CREATE TABLE t (id BIGINT PRIMARY KEY, v STRING)")
    t = root.table("t")
    before = pa.total_allocated_bytes()
    n = 50_000
    data = pa.table({"id": pa.array(range(n), pa.int64()), "v": [f"value {i}" for i in range(n)]})
    keys = pa.table({"id": pa.array(range(0, n, 2), pa.int64())})
    assert pa.total_allocated_bytes() > before + 500_000
    t.put(data)
    assert t.delete(keys) == n // 2
    del data, keys
    assert pa.total_allocated_bytes() == before
    assert t.scan().num_rows == n // 2


def test_insert_select_through_datafusion_python_keeps_every_row(root):
    # datafusion-python's optimizer cannot see that an INSERT's sink reads
    # one partition (DataFusion's FFI does not carry it): it spread the
    # input round-robin and every other 8,192-row batch was lost.
    root.sql("CREATE TABLE t (id BIGINT PRIMARY KEY, v STRING)")
    root.sql("CREATE TABLE log (id BIGINT, v STRING)")
    ctx = session(root)
    n = 50_000
    data = pa.table({"id": pa.array(range(n), pa.int64()), "v": [f"v{i}" for i in range(n)]})
    ctx.register_record_batches("src", [data.to_batches()])
    for table in ("t", "log"):
        out = ctx.sql(f"INSERT INTO memwal.public.{table} SELECT * FROM src").to_pylist()
        assert out == [{"count": n}]
        got = root.sql(f"SELECT count(*) AS n, sum(id) AS s FROM {table}").to_pylist()
        assert got == [{"n": n, "s": n * (n - 1) // 2}]
