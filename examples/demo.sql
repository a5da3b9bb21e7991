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

-- Until the write path lands, tables scan as empty with their schema.
SELECT count(*) AS items FROM "shop.eu".items;
