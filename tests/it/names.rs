//! Every name SQL accepts round-trips through the store: namespaces, tables
//! and columns named with non-ASCII letters, punctuation that object
//! stores escape, and the longest names allowed, through create, insert,
//! flush, compaction, restart and vector search.

use memwal::{MemwalSession, WriterOptions};

/// Names of one level: unicode, characters stores percent-encode, the
/// longest allowed (in characters, of 1- to 3-byte letters).
fn names() -> Vec<String> {
    let mut names: Vec<String> = [
        "café",
        "naïve_表",
        "100%",
        "%25",
        "a#b",
        "back\\slash",
        "tilde~x",
        "quo\"te",
        "sp ace",
        "a{b}[c]^`",
        "emoji😀",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    names.push("x".repeat(128));
    names.push("é".repeat(128));
    names.push("日".repeat(128));
    names
}

fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn literal(name: &str) -> String {
    format!("'{}'", name.replace('\'', "''"))
}

/// The rows of a query, each as its values' text.
async fn rows(session: &MemwalSession, sql: &str) -> Vec<Vec<String>> {
    use datafusion::arrow::util::display::array_value_to_string;
    let batches = session.sql(sql).await.unwrap().collect().await.unwrap();
    let mut out = Vec::new();
    for b in &batches {
        for r in 0..b.num_rows() {
            out.push(
                b.columns()
                    .iter()
                    .map(|c| array_value_to_string(c, r).unwrap())
                    .collect(),
            );
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_accepted_name_round_trips_through_flush_compaction_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    // Tiny MemTables: every insert below is flushed to an SSTable.
    let options = {
        let mut o = WriterOptions::default();
        o.memtable_bytes = 1;
        o.max_unflushed_bytes = 1 << 20;
        o
    };
    let names = names();
    let mut expected = Vec::new();
    {
        let session = MemwalSession::open_with(&root, options.clone())
            .await
            .unwrap();
        for (i, name) in names.iter().enumerate() {
            let (ns, table) = (quoted(name), quoted(name));
            let (key, emb) = (quoted(&format!("k{name}")), quoted(&format!("v{name}")));
            session
                .sql(&format!("CREATE SCHEMA {ns}"))
                .await
                .unwrap_or_else(|e| panic!("{name:?}: {e}"));
            session
                .sql(&format!(
                    "CREATE TABLE {ns}.{table} ({key} BIGINT PRIMARY KEY, {} TEXT, {emb} FLOAT[2]) \
                     WITH ('shards' = '2', {} = 'cosine')",
                    quoted(name),
                    literal(&format!("v{name}.metric"))
                ))
                .await
                .unwrap_or_else(|e| panic!("{name:?}: {e}"));
            for batch in 0..3 {
                let values: Vec<String> = (0..4)
                    .map(|r| {
                        let id = batch * 4 + r;
                        format!("({id}, {}, [{}.0, 1.0])", literal(name), id + 1)
                    })
                    .collect();
                session
                    .sql(&format!(
                        "INSERT INTO {ns}.{table} VALUES {}",
                        values.join(", ")
                    ))
                    .await
                    .unwrap()
                    .collect()
                    .await
                    .unwrap_or_else(|e| panic!("{name:?}: {e}"));
            }
            let path = format!("{name}.{name}");
            let t = session.table(&path).await.unwrap();
            t.compact()
                .await
                .unwrap_or_else(|e| panic!("{name:?}: {e}"));
            expected.push(i);
        }
        session.close().await.unwrap();
    }
    // A fresh process's view: everything comes from SSTables and graphs.
    let session = MemwalSession::open(&root).await.unwrap();
    for name in &names {
        let table = format!("{}.{}", quoted(name), quoted(name));
        let key = quoted(&format!("k{name}"));
        let got = rows(
            &session,
            &format!(
                "SELECT count(*) AS n, count(DISTINCT {}) AS d, min({key}) AS lo, max({key}) AS hi FROM {table}",
                quoted(name)
            ),
        )
        .await;
        assert_eq!(got, [["12", "1", "0", "11"]], "{name:?}");
        let point = rows(
            &session,
            &format!("SELECT {key} FROM {table} WHERE {key} = 7"),
        )
        .await;
        assert_eq!(point, [["7"]], "{name:?}");
        let dotted = literal(&format!("{name}.{name}"));
        let near = rows(
            &session,
            &format!(
                "SELECT {key} FROM vector_search({dotted}, {}, [5.0, 1.0], 1)",
                literal(&format!("v{name}"))
            ),
        )
        .await;
        assert_eq!(near, [["4"]], "{name:?}");
    }
    assert_eq!(expected.len(), names.len());
}
