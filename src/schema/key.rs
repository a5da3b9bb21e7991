//! Primary keys as bytes, and the shard a key belongs to.
//!
//! The canonical encoding of one key is the concatenation, in key-column
//! order, of each column's value:
//! - `Boolean`: one byte, 0 or 1;
//! - signed integers, `Date32`, `Date64`, `Timestamp(*)`: the value as a
//!   64-bit signed integer, 8 bytes little-endian (so an `INT` and a
//!   `BIGINT` key with the same value encode alike);
//! - unsigned integers: as a 64-bit unsigned integer, 8 bytes little-endian;
//! - `Decimal128` / `Decimal256`: the unscaled integer, 16 / 32 bytes
//!   little-endian two's complement;
//! - strings and binaries (every variant, including fixed-size binary): the
//!   byte length as 4 bytes little-endian, then the bytes (UTF-8 for
//!   strings).
//!
//! The shard of a key is `xxHash64(seed 0, encoding) mod shards`. Both are
//! part of the stored format: they must never change, on any platform.

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::buffer::ScalarBuffer;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{
    DataType, Decimal128Type, Decimal256Type, Int64Type, UInt64Type,
};
use twox_hash::XxHash64;

use crate::error::{Error, Result};

/// The canonical encoding of each row's key (see the module doc), one
/// boxed byte string per row. `columns` are the key columns in key order;
/// none may hold a null.
pub fn encode_keys(columns: &[ArrayRef], rows: usize) -> Result<Vec<Box<[u8]>>> {
    let mut out: Vec<Vec<u8>> = (0..rows).map(|_| Vec::with_capacity(8)).collect();
    for column in columns {
        if column.null_count() > 0 {
            return Err(Error::invalid("a primary key column holds NULL"));
        }
        append_column(column, &mut out)?;
    }
    Ok(out.into_iter().map(Vec::into_boxed_slice).collect())
}

/// The shard of each row's key among `shards`: [`shard_of`] of its
/// [`encode_keys`] encoding, without keeping the encodings (and without
/// allocating per row for a one-column integer key).
pub fn shards_of(columns: &[ArrayRef], rows: usize, shards: u32) -> Result<Vec<u32>> {
    if let [column] = columns {
        match integer_keys(column)? {
            Some(IntegerKeys::Signed(v)) => {
                return Ok(v
                    .iter()
                    .map(|v| shard_of(&v.to_le_bytes(), shards))
                    .collect());
            }
            Some(IntegerKeys::Unsigned(v)) => {
                return Ok(v
                    .iter()
                    .map(|v| shard_of(&v.to_le_bytes(), shards))
                    .collect());
            }
            None => {}
        }
    }
    Ok(encode_keys(columns, rows)?
        .iter()
        .map(|k| shard_of(k, shards))
        .collect())
}

/// A one-column key of an integer type (any width, signed or not, dates,
/// timestamps) as 64-bit integers: the values whose little-endian bytes
/// are its canonical encoding, ordered as the key orders.
pub enum IntegerKeys {
    /// Signed integers, dates and timestamps.
    Signed(ScalarBuffer<i64>),
    /// Unsigned integers.
    Unsigned(ScalarBuffer<u64>),
}

/// `column` as [`IntegerKeys`], or `None` for another type; a NULL is an
/// error, as in [`encode_keys`].
pub fn integer_keys(column: &ArrayRef) -> Result<Option<IntegerKeys>> {
    use DataType::*;
    let signed = |column: &ArrayRef| -> Result<IntegerKeys> {
        let wide = cast(column, &Int64)?;
        Ok(IntegerKeys::Signed(
            wide.as_primitive::<Int64Type>().values().clone(),
        ))
    };
    let keys = match column.data_type() {
        Int8 | Int16 | Int32 | Int64 | Date64 | Timestamp(_, _) => signed(column)?,
        Date32 => signed(&cast(column, &Int32)?)?,
        UInt8 | UInt16 | UInt32 | UInt64 => IntegerKeys::Unsigned(
            cast(column, &UInt64)?
                .as_primitive::<UInt64Type>()
                .values()
                .clone(),
        ),
        _ => return Ok(None),
    };
    if column.null_count() > 0 {
        return Err(Error::invalid("a primary key column holds NULL"));
    }
    Ok(Some(keys))
}

/// The shard of an encoded key among `shards` (see the module doc).
pub fn shard_of(encoded: &[u8], shards: u32) -> u32 {
    (XxHash64::oneshot(0, encoded) % u64::from(shards.max(1))) as u32
}

fn append_column(column: &ArrayRef, out: &mut [Vec<u8>]) -> Result<()> {
    use DataType::*;
    match column.data_type() {
        Boolean => {
            for (row, v) in out.iter_mut().zip(column.as_boolean().values().iter()) {
                row.push(u8::from(v));
            }
        }
        Int8 | Int16 | Int32 | Int64 | Date64 | Timestamp(_, _) => {
            let wide = cast(column, &Int64)?;
            for (row, v) in out
                .iter_mut()
                .zip(wide.as_primitive::<Int64Type>().values())
            {
                row.extend_from_slice(&v.to_le_bytes());
            }
        }
        Date32 => {
            let wide = cast(&cast(column, &Int32)?, &Int64)?;
            for (row, v) in out
                .iter_mut()
                .zip(wide.as_primitive::<Int64Type>().values())
            {
                row.extend_from_slice(&v.to_le_bytes());
            }
        }
        UInt8 | UInt16 | UInt32 | UInt64 => {
            let wide = cast(column, &UInt64)?;
            for (row, v) in out
                .iter_mut()
                .zip(wide.as_primitive::<UInt64Type>().values())
            {
                row.extend_from_slice(&v.to_le_bytes());
            }
        }
        Decimal128(_, _) => {
            for (row, v) in out
                .iter_mut()
                .zip(column.as_primitive::<Decimal128Type>().values())
            {
                row.extend_from_slice(&v.to_le_bytes());
            }
        }
        Decimal256(_, _) => {
            for (row, v) in out
                .iter_mut()
                .zip(column.as_primitive::<Decimal256Type>().values())
            {
                row.extend_from_slice(&v.to_le_bytes());
            }
        }
        Utf8 => append_bytes(out, column.as_string::<i32>().iter().map(as_bytes)),
        LargeUtf8 => append_bytes(out, column.as_string::<i64>().iter().map(as_bytes)),
        Utf8View => append_bytes(out, column.as_string_view().iter().map(as_bytes)),
        Binary => append_bytes(out, column.as_binary::<i32>().iter()),
        LargeBinary => append_bytes(out, column.as_binary::<i64>().iter()),
        BinaryView => append_bytes(out, column.as_binary_view().iter()),
        FixedSizeBinary(_) => append_bytes(out, column.as_fixed_size_binary().iter()),
        other => {
            return Err(Error::invalid(format!(
                "type {other} cannot be a primary key"
            )));
        }
    }
    Ok(())
}

fn as_bytes(v: Option<&str>) -> Option<&[u8]> {
    v.map(str::as_bytes)
}

fn append_bytes<'a>(out: &mut [Vec<u8>], values: impl Iterator<Item = Option<&'a [u8]>>) {
    for (row, v) in out.iter_mut().zip(values) {
        let v = v.unwrap_or_default();
        row.extend_from_slice(&(v.len() as u32).to_le_bytes());
        row.extend_from_slice(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{FixedSizeBinaryArray, Int32Array, Int64Array, StringArray};
    use std::sync::Arc;

    #[test]
    fn shards_of_routes_as_the_encodings_do() {
        use datafusion::arrow::array::{Date32Array, UInt16Array};
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![-3, 0, 7, i64::MAX, 42])),
            Arc::new(Int32Array::from(vec![-3, 0, 7, i32::MAX, 42])),
            Arc::new(UInt16Array::from(vec![3, 0, 7, u16::MAX, 42])),
            Arc::new(Date32Array::from(vec![-3, 0, 7, 19_000, 42])),
            Arc::new(StringArray::from(vec!["a", "", "ccc", "d", "e"])),
        ];
        for column in &columns {
            let one = std::slice::from_ref(column);
            let expected: Vec<u32> = encode_keys(one, 5)
                .unwrap()
                .iter()
                .map(|k| shard_of(k, 7))
                .collect();
            assert_eq!(
                shards_of(one, 5, 7).unwrap(),
                expected,
                "{}",
                column.data_type()
            );
        }
        let both = shards_of(&columns[..2], 5, 7).unwrap();
        let expected: Vec<u32> = encode_keys(&columns[..2], 5)
            .unwrap()
            .iter()
            .map(|k| shard_of(k, 7))
            .collect();
        assert_eq!(both, expected);
        let null: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), None]));
        assert!(shards_of(&[null], 2, 7).is_err());
    }

    #[test]
    fn xxhash64_matches_the_reference() {
        // Reference values of XXH64 with seed 0 (xxHash's own test vectors).
        assert_eq!(XxHash64::oneshot(0, b""), 0xEF46_DB37_51D8_E999);
        assert_eq!(XxHash64::oneshot(0, b"a"), 0xD24E_C4F1_A98C_6E5B);
    }

    #[test]
    fn encodings_and_shards_are_pinned() {
        let ints: ArrayRef = Arc::new(Int64Array::from(vec![0, 1, -1, 42]));
        let keys = encode_keys(&[ints], 4).unwrap();
        assert_eq!(&*keys[1], &[1, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&*keys[2], &[0xff; 8]);
        let shards: Vec<u32> = keys.iter().map(|k| shard_of(k, 16)).collect();
        assert_eq!(shards, PINNED_INT_SHARDS);

        // INT and BIGINT keys of the same value share a shard.
        let narrow: ArrayRef = Arc::new(Int32Array::from(vec![0, 1, -1, 42]));
        assert_eq!(encode_keys(&[narrow], 4).unwrap(), keys);

        // Composite key: string then integer.
        let names: ArrayRef = Arc::new(StringArray::from(vec!["ab", ""]));
        let ids: ArrayRef = Arc::new(Int64Array::from(vec![7, 8]));
        let keys = encode_keys(&[names, ids], 2).unwrap();
        assert_eq!(&*keys[0], &[2, 0, 0, 0, b'a', b'b', 7, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&*keys[1], &[0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(shard_of(&keys[0], 1000), PINNED_COMPOSITE_SHARD);

        let uuid: ArrayRef =
            Arc::new(FixedSizeBinaryArray::try_from_iter([[9u8; 16]].into_iter()).unwrap());
        let keys = encode_keys(&[uuid], 1).unwrap();
        assert_eq!(keys[0].len(), 20);
    }

    #[test]
    fn a_null_key_is_rejected() {
        let ints: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), None]));
        assert!(matches!(
            encode_keys(&[ints], 2),
            Err(Error::InvalidInput(_))
        ));
    }

    const PINNED_INT_SHARDS: [u32; 4] = [11, 5, 9, 3];
    const PINNED_COMPOSITE_SHARD: u32 = 801;
}
