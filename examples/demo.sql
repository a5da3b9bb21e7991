-- memwal demo: run with `cargo run -- -f examples/demo.sql`.
-- Everything here persists in the root (./memwal-data by default):
-- run it twice and the second run finds what the first one made.

CREATE SCHEMA IF NOT EXISTS shop;
CREATE SCHEMA IF NOT EXISTS "shop.eu";

-- FLOAT[n] is a vector column; options go in WITH (...).
CREATE TABLE IF NOT EXISTS "shop.eu".items (
  id BIGINT PRIMARY KEY,
  title TEXT,
  emb FLOAT[4]
) WITH ('shards' = '4', 'emb.metric' = 'cosine');

CREATE TABLE IF NOT EXISTS shop.orders (
  order_id BIGINT,
  line INT,
  item BIGINT,
  qty INT,
  PRIMARY KEY (order_id, line)
);

SELECT schema_name FROM information_schema.schemata WHERE catalog_name = 'memwal' ORDER BY 1;

SHOW TABLES;

DESCRIBE "shop.eu".items;

-- INSERT returns once the rows are durable in the write-ahead log; an
-- existing key is replaced (upsert). Run the demo twice: counts stay put.
INSERT INTO "shop.eu".items VALUES
  (1, 'lamp',  [0.1, 0.2, 0.3, 0.4]),
  (2, 'desk',  [0.5, 0.1, 0.0, 0.2]),
  (3, 'chair', [0.3, 0.3, 0.3, 0.3]);
INSERT INTO "shop.eu".items VALUES (2, 'standing desk', [0.5, 0.2, 0.0, 0.2]);

INSERT INTO shop.orders VALUES (100, 1, 1, 2), (100, 2, 3, 4), (101, 1, 2, 1);
DELETE FROM shop.orders WHERE order_id = 101;

SELECT id, title FROM "shop.eu".items ORDER BY id;
SELECT * FROM "shop.eu".items WHERE id = 2;
SELECT order_id, sum(qty) AS qty FROM shop.orders GROUP BY order_id ORDER BY 1;

-- Vector search: the nearest items by the column's metric, over every
-- layer (MemTable and SSTables), with the WHERE applied inside the search.
SELECT id, title, round(_distance, 4) AS distance
FROM vector_search('shop.eu.items', 'emb', [0.5, 0.2, 0.0, 0.2], 2)
WHERE title <> 'lamp';

-- The layers a query reads: MemTables and SSTables per shard.
EXPLAIN SELECT count(*) FROM "shop.eu".items;
