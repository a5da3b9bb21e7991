//! The `memwal` shell as a user runs it.

use std::io::Write;
use std::process::{Command, Stdio};

fn memwal(root: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_memwal"))
        .args(["--root", root])
        .args(args)
        .output()
        .expect("run memwal");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The CSV output of `sql` run with `-c`, which must succeed.
fn csv(root: &str, sql: &str) -> String {
    let (ok, out, err) = memwal(root, &["-q", "--format", "csv", "-c", sql]);
    assert!(ok, "{err}");
    out
}

/// The interactive shell fed `input` on stdin (in a directory of its own,
/// where it keeps its `.history`).
fn memwal_repl(root: &str, input: &str) -> (bool, String, String) {
    let cwd = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_memwal"))
        .current_dir(cwd.path())
        .args(["--root", root, "-q"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run memwal");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A root with `shop.items` (key, text, vector column, options) and two rows.
fn items_root() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let (ok, _, err) = memwal(
        dir.path().to_str().unwrap(),
        &[
            "-q",
            "-c",
            "CREATE SCHEMA shop",
            "-c",
            "CREATE TABLE shop.items (id BIGINT PRIMARY KEY, title TEXT, emb FLOAT[3]) WITH ('shards' = '2', 'emb.metric' = 'cosine')",
            "-c",
            "INSERT INTO shop.items VALUES (1, 'lamp', [1.0, 0.5, 0.0]), (2, NULL, [0.0, 1.0, 0.0])",
        ],
    );
    assert!(ok, "{err}");
    dir
}

#[test]
fn catalog_survives_between_shell_runs() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let (ok, _, err) = memwal(
        root,
        &[
            "-q",
            "-c",
            "CREATE SCHEMA shop",
            "-c",
            "CREATE TABLE shop.items (id BIGINT PRIMARY KEY, title TEXT, emb FLOAT[3]) WITH ('shards' = '2', 'emb.metric' = 'cosine')",
        ],
    );
    assert!(ok, "{err}");
    let out = csv(
        root,
        "SELECT table_schema, table_name FROM information_schema.tables WHERE table_schema = 'shop'",
    );
    assert_eq!(out.trim(), "table_schema,table_name\nshop,items");
}

#[test]
fn a_file_stops_at_its_first_error_and_fails_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    let root = root.to_str().unwrap();
    let sql = dir.path().join("demo.sql");
    std::fs::write(
        &sql,
        "-- a comment\nCREATE SCHEMA a;\nSELECT 41 + 1 AS n;\nCREATE SCHEMA a;\nCREATE TABLE a.t (id BIGINT\n  PRIMARY KEY);\n",
    )
    .unwrap();
    let (ok, out, err) = memwal(
        root,
        &["-q", "--format", "csv", "-f", sql.to_str().unwrap()],
    );
    assert!(!ok, "a half-run script must not look like success");
    assert!(out.contains("n\n42"), "{out}");
    assert!(
        err.contains("demo.sql:4: namespace 'a' already exists"),
        "{err}"
    );
    // Nothing after the failing statement ran.
    let out = csv(
        root,
        "SELECT count(*) AS n FROM information_schema.tables WHERE table_schema = 'a'",
    );
    assert_eq!(out.trim(), "n\n0");
}

/// A statement reaches the parser as written, from a file or piped in: a
/// string may hold lines that start with `--`, end with `;` or with
/// spaces, and a `;` in a comment ends nothing.
#[test]
fn strings_across_lines_are_kept_whole_from_a_file_and_piped_in() {
    let value = "keep   \n-- this line\nx;\nend";
    let script = format!(
        "-- a comment\nCREATE TABLE t (id BIGINT PRIMARY KEY, s TEXT);\n\
         INSERT INTO t VALUES (1, '{value}'); -- done\n\
         /* a comment; */ INSERT INTO t VALUES (2, 'two')"
    );
    let check = format!("SELECT id, length(s) AS n, s = '{value}' AS same FROM t ORDER BY id");
    let expected = format!("id,n,same\n1,{},true\n2,3,false\n", value.len());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("script.sql");
    std::fs::write(&file, &script).unwrap();
    let root = dir.path().join("from-file");
    let root = root.to_str().unwrap();
    let (ok, _, err) = memwal(root, &["-q", "-f", file.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(csv(root, &check), expected);
    let root = dir.path().join("piped");
    let root = root.to_str().unwrap();
    let (ok, _, err) = memwal_repl(root, &script);
    assert!(ok && err.is_empty(), "{err}");
    assert_eq!(csv(root, &check), expected);
}

#[test]
fn commands_run_before_files_and_both_run() {
    let dir = tempfile::tempdir().unwrap();
    let sql = dir.path().join("then.sql");
    std::fs::write(&sql, "SELECT count(*) AS n FROM t;\n").unwrap();
    let (ok, out, err) = memwal(
        dir.path().join("data").to_str().unwrap(),
        &[
            "-q",
            "--format",
            "csv",
            "-c",
            "CREATE TABLE t AS SELECT 1 AS x",
            "-f",
            sql.to_str().unwrap(),
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "n\n1");
}

#[test]
fn a_root_that_is_a_file_is_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    for root in [file.clone(), file.join("below")] {
        let root = root.to_str().unwrap();
        let (ok, _, err) = memwal(root, &["-q", "-c", "SELECT 1"]);
        assert!(!ok);
        assert!(
            err.contains(&format!("cannot open root '{root}'"))
                && err.contains("a local root must be a directory"),
            "{err}"
        );
    }
}

#[test]
fn every_format_prints_vector_columns() {
    let dir = items_root();
    let root = dir.path().to_str().unwrap();
    let query = "SELECT id, title, emb FROM shop.items ORDER BY id";
    for (format, expected) in [
        (
            "csv",
            "id,title,emb\n1,lamp,\"[1.0, 0.5, 0.0]\"\n2,,\"[0.0, 1.0, 0.0]\"",
        ),
        (
            "tsv",
            "id\ttitle\temb\n1\tlamp\t[1.0, 0.5, 0.0]\n2\t\t[0.0, 1.0, 0.0]",
        ),
        (
            "json",
            r#"[{"id":1,"title":"lamp","emb":[1.0,0.5,0.0]},{"id":2,"emb":[0.0,1.0,0.0]}]"#,
        ),
        (
            "ndjson",
            "{\"id\":1,\"title\":\"lamp\",\"emb\":[1.0,0.5,0.0]}\n{\"id\":2,\"emb\":[0.0,1.0,0.0]}",
        ),
    ] {
        let (ok, out, err) = memwal(root, &["-q", "--format", format, "-c", query]);
        assert!(ok, "{format}: {err}");
        assert_eq!(out.trim(), expected, "{format}");
    }
}

#[test]
fn show_create_table_and_describe_show_the_key_and_options() {
    let dir = items_root();
    let root = dir.path().to_str().unwrap();
    let definition = "CREATE TABLE shop.items (id BIGINT, title TEXT, emb FLOAT[3], PRIMARY KEY (id)) \
                      WITH ('shards' = '2', 'emb.metric' = 'cosine', 'emb.m' = '16', 'emb.ef_construction' = '100')";
    let out = csv(root, "SHOW CREATE TABLE shop.items");
    assert_eq!(
        out.trim(),
        format!(
            "table_catalog,table_schema,table_name,definition\nmemwal,shop,items,\"{definition}\""
        )
    );
    let out = csv(root, "DESCRIBE shop.items");
    assert_eq!(
        out.trim(),
        "column_name,data_type,is_nullable,primary_key,options\n\
         id,Int64,NO,1,\n\
         title,Utf8View,YES,,\n\
         emb,FixedSizeList(3 x Float32),YES,,\"metric = cosine, m = 16, ef_construction = 100\""
    );
    // DESCRIBE is shown whole, whatever --maxrows says.
    let (ok, out, err) = memwal(root, &["-q", "--maxrows", "1", "-c", "DESCRIBE shop.items"]);
    assert!(ok, "{err}");
    assert!(out.contains("| emb "), "{out}");
    // \d shows the same columns, then the statement.
    let (ok, out, err) = memwal_repl(root, "\\d shop.items\n");
    assert!(ok, "{err}");
    assert!(out.contains("| primary_key |"), "{out}");
    assert!(out.contains(definition), "{out}");

    // The statement recreates the table.
    let (ok, _, err) = memwal(
        root,
        &["-q", "-c", "DROP TABLE shop.items", "-c", definition],
    );
    assert!(ok, "{err}");
    let out = csv(root, "SHOW CREATE TABLE shop.items");
    assert!(out.trim().ends_with(&format!("\"{definition}\"")), "{out}");
}

#[test]
fn help_knows_memwals_functions() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out, err) = memwal_repl(
        dir.path().to_str().unwrap(),
        "\\h vector_search\n\\h L2_DISTANCE\n\\h cosine_distance\n\\h inner_product\n\\h\n",
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("vector_search(table, column, query, k [, ef])"),
        "{out}"
    );
    for function in [
        "l2_distance(a, b)",
        "cosine_distance(a, b)",
        "inner_product(a, b)",
    ] {
        assert!(out.contains(function), "{function}: {out}");
    }
    assert!(
        out.contains(
            "memwal functions: vector_search, l2_distance, cosine_distance, inner_product"
        ),
        "{out}"
    );
    assert!(!err.contains("not a supported function"), "{err}");
    // `\?` lists memwal's commands, not datafusion-cli's.
    let (_, out, err) = memwal_repl(
        dir.path().to_str().unwrap(),
        "\\?\n\\object_store_profiling\n",
    );
    assert!(
        out.contains("quit memwal") && !out.contains("datafusion-cli"),
        "{out}"
    );
    assert!(!out.contains("object_store_profiling"), "{out}");
    assert!(
        err.contains("\\object_store_profiling is not available"),
        "{err}"
    );
}

#[test]
fn a_piped_script_with_an_error_fails_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let (ok, out, err) = memwal_repl(
        root,
        "CREATE TABLE t (id BIGINT PRIMARY KEY);\nSELECT * FROM nosuch;\nINSERT INTO t VALUES (1);\n",
    );
    assert!(!ok, "{out}");
    assert!(err.contains("1 statement(s) or command(s) failed"), "{err}");
    // Said as -c and -f say it, so a log can be searched for errors.
    assert!(
        err.lines()
            .any(|l| l.starts_with("Error: ") && l.contains("nosuch")),
        "{err}"
    );
    // Like an interactive session, it ran on after the error.
    let out = csv(root, "SELECT id FROM t");
    assert_eq!(out.trim(), "id\n1");
    // So it does after a statement that fails on a line of several.
    let (ok, _, err) = memwal_repl(
        root,
        "INSERT INTO t VALUES (2); INSERT INTO t VALUES (1 / 0); INSERT INTO t VALUES (3);\n\
         INSERT INTO t VALUES (4);\n",
    );
    assert!(!ok);
    assert!(err.contains("Divide by zero"), "{err}");
    assert!(err.contains("1 statement(s) or command(s) failed"), "{err}");
    let out = csv(root, "SELECT id FROM t ORDER BY id");
    assert_eq!(out.trim(), "id\n1\n2\n3\n4");
}

#[test]
fn piped_output_ends_with_the_last_result() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out, err) = memwal_repl(dir.path().to_str().unwrap(), "SELECT 41 + 1 AS a;\n");
    assert!(ok, "{err}");
    assert!(out.contains("| 42 |"), "{out}");
    // The `\\q` a terminal's Ctrl-D echoes is not output of a script.
    assert!(!out.contains("\\q"), "{out}");
}

#[test]
fn a_failed_script_still_shows_what_closing_found() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    csv(
        root,
        "CREATE TABLE t (id BIGINT PRIMARY KEY) WITH ('shards' = '1')",
    );
    // The table's SSTables cannot be written: where their directory goes
    // is a file. The catalog version names the table's location.
    let catalog = std::fs::read_dir(dir.path().join("__manifest"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_file())
        .unwrap();
    let bytes = std::fs::read(catalog).unwrap();
    let at = bytes.windows(9).position(|w| w == b"tables/t-").unwrap();
    let location = std::str::from_utf8(&bytes[at..at + 9 + 16]).unwrap();
    let shard = dir.path().join(location).join("shards/0");
    std::fs::create_dir_all(&shard).unwrap();
    std::fs::write(shard.join("sst"), b"").unwrap();
    let (ok, out, err) = memwal_repl(
        root,
        "SET memwal.append_retries = '0';\nINSERT INTO t VALUES (1);\nSELECT * FROM nosuch;\n",
    );
    assert!(!ok, "{out}");
    // Both: the statement that failed, and the flush at exit that did.
    assert!(err.contains("1 statement(s) or command(s) failed"), "{err}");
    assert!(
        err.contains("closing the session (flushing what it wrote) failed: ")
            && err.contains("SSTable write failed"),
        "{err}"
    );
}

/// A long generated expression is planned on a thread with a stack of its
/// own: with the main thread's (8 MiB), `1 + 1 + ...` of 8,000 terms
/// aborted the shell. Here the main thread gets 256 KiB, where 1,000 terms
/// aborted it.
#[test]
fn a_long_expression_does_not_overflow_the_stack() {
    let dir = tempfile::tempdir().unwrap();
    let sql = format!("SELECT {} AS n", vec!["1"; 1_000].join(" + "));
    let out = Command::new("sh")
        .args(["-c", "ulimit -s 256 && exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_memwal"))
        .args([
            "--root",
            dir.path().to_str().unwrap(),
            "-q",
            "--format",
            "csv",
        ])
        .args(["-c", &sql])
        .output()
        .expect("run memwal");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout, "n\n1000\n");
}

/// A statement that stops a writer shows why; the shell's exit does not
/// show it a second time (nothing acknowledged was lost).
#[test]
fn a_stopped_writer_is_reported_once() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_memwal"))
        .current_dir(cwd.path())
        .args(["--root", dir.path().to_str().unwrap(), "-q"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run memwal");
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(
            b"SET memwal.append_retries = '0';\n\
              CREATE TABLE t (id BIGINT PRIMARY KEY) WITH ('shards' = '1');\n\
              INSERT INTO t VALUES (1);\n",
        )
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("| 1 ") {
        line.clear();
        assert_ne!(stdout.read_line(&mut line).unwrap(), 0, "no INSERT count");
    }
    // The row is in the WAL; every next WAL position is taken by a
    // directory, so the next append fails and stops the writer.
    let tables = dir.path().join("tables");
    let table = std::fs::read_dir(&tables).unwrap().next().unwrap().unwrap();
    let wal = table.path().join("shards/0/wal");
    let last = std::fs::read_dir(&wal)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy()[..20].parse::<u64>())
        .map(Result::unwrap)
        .max()
        .unwrap();
    for position in last + 1..last + 20 {
        std::fs::create_dir(wal.join(format!("{position:020}.arrow"))).unwrap();
    }
    stdin.write_all(b"INSERT INTO t VALUES (2);\n").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("shard writer stopped").count(), 1, "{err}");
    assert!(err.contains("WAL append at"), "{err}");
    // The acknowledged row is there; the refused one is not.
    for position in last + 1..last + 20 {
        std::fs::remove_dir(wal.join(format!("{position:020}.arrow"))).unwrap();
    }
    let root = dir.path().to_str().unwrap();
    assert_eq!(csv(root, "SELECT id FROM t"), "id\n1\n");
}

#[test]
fn a_worker_address_without_its_scheme_says_what_a_worker_url_is() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let (ok, _, err) = memwal(root, &["--workers", "127.0.0.1:7001", "-c", "SELECT 1"]);
    assert!(!ok);
    assert!(err.contains("a worker URL is http://host:port"), "{err}");
}

#[test]
fn a_plain_http_s3_endpoint_without_allow_http_says_so() {
    let out = Command::new(env!("CARGO_BIN_EXE_memwal"))
        .args(["--root", "s3://bucket/x", "-c", "SELECT 1"])
        .env("AWS_ENDPOINT", "http://127.0.0.1:9")
        .env_remove("AWS_ALLOW_HTTP")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    // Not the HTTP client's "builder error" at the first request.
    assert!(err.contains("unless AWS_ALLOW_HTTP=true"), "{err}");
}

/// A store that accepts connections and never answers fails a statement
/// once the store timeout is spent, and says so (object_store's own
/// budget is 3 minutes of retries).
#[test]
fn a_store_that_never_answers_fails_the_statement_within_the_store_timeout() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", silent.local_addr().unwrap());
    // Accepted (by the kernel's backlog) and never read.
    let out = Command::new(env!("CARGO_BIN_EXE_memwal"))
        .args(["--root", "s3://bucket/x", "--store-timeout", "2s"])
        .args(["-c", "SELECT * FROM t"])
        .env("AWS_ENDPOINT", &endpoint)
        .env("AWS_ALLOW_HTTP", "true")
        .env_remove("AWS_TIMEOUT")
        .env("AWS_ACCESS_KEY_ID", "k")
        .env("AWS_SECRET_ACCESS_KEY", "s")
        .env("AWS_REGION", "us-east-1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    // Each attempt got half the budget: two attempts, then no more.
    assert!(err.contains("operation timed out"), "{err}");
    assert!(err.contains("after 1 retries"), "{err}");
    assert!(err.contains("retry_timeout: 1.5s"), "{err}");
    drop(silent);

    let out = Command::new(env!("CARGO_BIN_EXE_memwal"))
        .args(["--store-timeout", "0s", "-c", "SELECT 1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("the store timeout must be more than zero"),
        "{err}"
    );
}

/// A worker listens on a host name too; a shell's bad worker URL is
/// refused before any note about the workers.
#[cfg(feature = "distributed")]
#[test]
fn a_worker_listens_on_a_host_name_and_a_bad_worker_url_is_refused_first() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let mut worker = Command::new(env!("CARGO_BIN_EXE_memwal"))
        .args(["worker", "--listen", "localhost:0", "--root", root])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(worker.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    worker.kill().unwrap();
    worker.wait().unwrap();
    assert!(line.starts_with("memwal worker on http://"), "{line}");

    let out = Command::new(env!("CARGO_BIN_EXE_memwal"))
        .args([
            "--root",
            root,
            "--workers",
            "https://127.0.0.1:1",
            "-c",
            "SELECT 1",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("TLS"), "{err}");
    assert!(!err.contains("note:"), "{err}");
}

#[test]
fn explain_of_memwal_ddl_fails_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out, err) = memwal(
        dir.path().to_str().unwrap(),
        &["-q", "-c", "EXPLAIN CREATE TABLE x (id INT)"],
    );
    assert!(!ok, "{out}");
    assert!(
        err.contains("EXPLAIN is not supported for CREATE/DROP SCHEMA/TABLE"),
        "{err}"
    );
}

#[test]
fn a_null_key_names_the_column() {
    let dir = items_root();
    let (ok, _, err) = memwal(
        dir.path().to_str().unwrap(),
        &[
            "-q",
            "-c",
            "INSERT INTO shop.items VALUES (NULL, 'x', [1.0, 2.0, 3.0])",
        ],
    );
    assert!(!ok);
    assert!(err.contains("primary key column 'id' holds NULL"), "{err}");
}

#[test]
fn the_shell_reads_and_writes_files_but_not_inside_the_root() {
    let dir = items_root();
    let root = dir.path().to_str().unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("items.parquet");
    let (ok, _, err) = memwal(
        root,
        &[
            "-q",
            "-c",
            &format!("COPY shop.items TO '{}'", out.display()),
        ],
    );
    assert!(ok, "{err}");
    let stdout = csv(
        root,
        &format!("SELECT count(*) AS n FROM '{}'", out.display()),
    );
    assert_eq!(stdout.trim(), "n\n2");

    let (ok, _, err) = memwal(
        root,
        &[
            "-q",
            "-c",
            &format!(
                "COPY shop.items TO '{root}/__manifest/v99999999999999999999.arrow' STORED AS ARROW"
            ),
        ],
    );
    assert!(!ok);
    assert!(err.contains("would write inside the memwal root"), "{err}");
    // Every later statement still works.
    let stdout = csv(root, "SELECT count(*) AS n FROM shop.items");
    assert_eq!(stdout.trim(), "n\n2");
}

#[test]
fn a_damaged_catalog_still_runs_select_1() {
    let dir = items_root();
    let root = dir.path().to_str().unwrap();
    let newest = std::fs::read_dir(dir.path().join("__manifest"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "arrow"))
        .max()
        .unwrap();
    std::fs::write(&newest, b"garbage").unwrap();
    let name = newest.file_name().unwrap().to_str().unwrap();

    let (ok, out, err) = memwal(root, &["-q", "--format", "csv", "-c", "SELECT 1 AS one"]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "one\n1");
    // The interactive shell says so at start, naming the damage, and runs on.
    let (ok, out, err) = memwal_repl(root, "SELECT 1 AS one;\n");
    assert!(ok, "{err}");
    assert!(out.contains("one"), "{out}");
    assert!(
        err.contains("Warning: the catalog cannot be loaded") && err.contains(name),
        "{err}"
    );
    // Not "until the store answers": waiting does not mend it.
    assert!(
        err.contains("until the damaged object is restored"),
        "{err}"
    );

    let (ok, _, err) = memwal(root, &["-q", "-c", "SELECT * FROM shop.items"]);
    assert!(!ok);
    assert!(
        err.contains(&format!("Error: corrupt object __manifest/{name}")),
        "{err}"
    );
}

#[test]
fn bad_statement_with_c_fails_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, _, err) = memwal(
        dir.path().to_str().unwrap(),
        &[
            "-q",
            "-c",
            "CREATE TABLE t (id BIGINT) WITH ('colour' = 'red')",
        ],
    );
    assert!(!ok);
    assert!(err.contains("unknown table option 'colour'"), "{err}");
}

#[test]
fn root_comes_from_the_environment_and_maxrows_limits_tables() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_memwal"))
        .env("MEMWAL_ROOT", dir.path())
        .args([
            "--maxrows",
            "2",
            "-c",
            "SELECT * FROM (VALUES (1), (2), (3)) AS v(x)",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        stdout.contains(dir.path().canonicalize().unwrap().to_str().unwrap()),
        "{stdout}"
    );
    assert!(
        stdout.contains("3 row(s) fetched. (First 2 displayed."),
        "{stdout}"
    );
}
