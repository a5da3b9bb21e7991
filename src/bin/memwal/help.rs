//! `\h` help for the functions memwal adds to DataFusion's: the
//! `vector_search` table function and the distance functions.
//! datafusion-cli's own `\h` knows only its built-in list.

use memwal::sql::{DEFAULT_EF, DISTANCE_COLUMN, MAX_K};

/// The names `\h` lists as memwal's.
pub const FUNCTIONS: [&str; 4] = [
    "vector_search",
    "l2_distance",
    "cosine_distance",
    "inner_product",
];

/// The help text of memwal function `name` (any case), if it is one.
pub fn function_help(name: &str) -> Option<String> {
    let name = name.trim().trim_end_matches(';').to_ascii_lowercase();
    let distance = |what: &str, metric: &str| {
        format!(
            "
Function:    {name}
Description: {what}, exact, computed in f32 like the search.
             The ground truth for vector_search with metric '{metric}'.
Syntax:
{name}(a, b)
  a, b  vectors of equal length: FLOAT[n] columns or lists of numbers
Returns FLOAT (NULL if either argument is NULL); vectors of different
lengths are an error.
Example:
SELECT id, {name}(emb, [0.1, 0.2, 0.3]) AS d FROM items ORDER BY d LIMIT 10;
"
        )
    };
    Some(match name.as_str() {
        "vector_search" => format!(
            "
Function:    vector_search
Description: the k rows of a memwal table nearest to a query vector, by the
             metric of the vector column (WITH ('<column>.metric' = 'l2' |
             'cosine' | 'dot')); approximate (HNSW) over fresh and flushed
             rows alike, newest version of each key only.
Syntax:
vector_search(table, column, query, k [, ef])
  table   the table's name as a string: 'items', 'shop.items'
  column  the name of a FLOAT[n] column of the table
  query   the query vector: n numbers, [0.1, 0.2, ...]
  k       how many rows, 1 to {MAX_K}
  ef      candidates kept while searching (default {DEFAULT_EF}, at least k):
          larger is slower and finds the true nearest more often
Returns every column of the table plus {DISTANCE_COLUMN} (FLOAT, smaller is
closer), nearest first. A WHERE on the table's columns is applied during the
search, so up to k matching rows are returned.
Example:
SELECT id, title, {DISTANCE_COLUMN}
FROM vector_search('shop.items', 'emb', [0.1, 0.2, 0.3], 10)
WHERE title <> 'lamp';
"
        ),
        "l2_distance" => distance(
            "Euclidean distance between two vectors (pgvector's <->)",
            "l2",
        ),
        "cosine_distance" => distance(
            "1 - cosine similarity of two vectors (1 when either is all zeros)",
            "cosine",
        ),
        "inner_product" => distance(
            "inner product of two vectors (a 'dot' column's distance is its negation)",
            "dot",
        ),
        _ => return None,
    })
}
