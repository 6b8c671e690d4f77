//! The content digest of a set of rows: independent of files, row groups
//! and row order, so a layout-only change (compaction, a different chunking)
//! leaves it as it was, and anything keyed on content sees no change.
//!
//! It is a multiset hash: each row hashes to 128 bits (two 64-bit lanes over
//! its values in column order), and the digest is the wrapping sum of the
//! row hashes with the row count. Sums add, so the digest of a window is
//! the sum of its chunks' digests, and the rows of a compacted period can be
//! checked window by window. It detects accidents, not adversaries.

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, TimestampMicrosecondType,
};
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use twox_hash::XxHash64;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RowsDigest {
    pub sum: u128,
    pub rows: u64,
}

const K1: u64 = 0x9E37_79B9_7F4A_7C15;
const K2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const NULL1: u64 = 0x6e75_6c6c_0000_0001;
const NULL2: u64 = 0x6e75_6c6c_0000_0002;

fn fmix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

impl RowsDigest {
    /// Adds every row of `batch`.
    pub fn add_batch(&mut self, batch: &RecordBatch) {
        let n = batch.num_rows();
        let mut a = vec![K1; n];
        let mut b = vec![K2; n];
        let schema = batch.schema();
        for (col, field) in batch.columns().iter().zip(schema.fields()) {
            // A Delta table's window stamp is highwater's, not the
            // source's: the digest is of the rows as the source gave them.
            if field.name() == crate::delta::WINDOW_COLUMN {
                continue;
            }
            let mut put = |r: usize, v1: u64, v2: u64| {
                a[r] = (a[r].rotate_left(23) ^ v1).wrapping_mul(K1);
                b[r] = (b[r].rotate_left(31) ^ v2).wrapping_mul(K2);
            };
            macro_rules! each {
                ($arr:expr, |$v:ident| $e:expr) => {{
                    let arr = $arr;
                    for r in 0..n {
                        if arr.is_null(r) {
                            put(r, NULL1, NULL2);
                        } else {
                            let $v = arr.value(r);
                            let x: u64 = $e;
                            put(r, fmix(x), fmix(x ^ K2));
                        }
                    }
                }};
            }
            match col.data_type() {
                DataType::Int64 => each!(col.as_primitive::<Int64Type>(), |v| v as u64),
                DataType::Decimal128(..) => each!(
                    col.as_primitive::<arrow_array::types::Decimal128Type>(),
                    |v| (v as u64) ^ ((v >> 64) as u64).rotate_left(29)
                ),
                DataType::Int32 => each!(col.as_primitive::<Int32Type>(), |v| v as i64 as u64),
                DataType::Int16 => each!(col.as_primitive::<Int16Type>(), |v| v as i64 as u64),
                DataType::Float64 => each!(col.as_primitive::<Float64Type>(), |v| v.to_bits()),
                DataType::Float32 => {
                    each!(col.as_primitive::<Float32Type>(), |v| v.to_bits() as u64)
                }
                DataType::Boolean => each!(col.as_boolean(), |v| v as u64 + 1),
                DataType::Date32 => each!(col.as_primitive::<Date32Type>(), |v| v as i64 as u64),
                DataType::Timestamp(..) => {
                    each!(col.as_primitive::<TimestampMicrosecondType>(), |v| v as u64)
                }
                DataType::Utf8 => {
                    let arr = col.as_string::<i32>();
                    for r in 0..n {
                        if arr.is_null(r) {
                            put(r, NULL1, NULL2);
                        } else {
                            let s = arr.value(r).as_bytes();
                            // One pass over the bytes; the second lane is
                            // a remix of the first with the length.
                            let h = XxHash64::oneshot(1, s);
                            put(r, h, fmix(h ^ K2 ^ s.len() as u64));
                        }
                    }
                }
                DataType::Binary => {
                    let arr = col.as_binary::<i32>();
                    for r in 0..n {
                        if arr.is_null(r) {
                            put(r, NULL1, NULL2);
                        } else {
                            let s = arr.value(r);
                            let h = XxHash64::oneshot(3, s);
                            put(r, h, fmix(h ^ K1 ^ s.len() as u64));
                        }
                    }
                }
                // Files another engine wrote are read with their Parquet
                // schema (no view types), but a digest never panics: the
                // string-like types by their bytes, anything else by its
                // debug form (slow, and only for types the sink never
                // writes).
                DataType::Utf8View
                | DataType::LargeUtf8
                | DataType::BinaryView
                | DataType::LargeBinary => {
                    for r in 0..n {
                        if col.is_null(r) {
                            put(r, NULL1, NULL2);
                            continue;
                        }
                        let s: &[u8] = match col.data_type() {
                            DataType::Utf8View => col.as_string_view().value(r).as_bytes(),
                            DataType::LargeUtf8 => col.as_string::<i64>().value(r).as_bytes(),
                            DataType::BinaryView => col.as_binary_view().value(r),
                            _ => col.as_binary::<i64>().value(r),
                        };
                        let h = XxHash64::oneshot(3, s);
                        put(r, h, fmix(h ^ K1 ^ s.len() as u64));
                    }
                }
                _ => {
                    for r in 0..n {
                        if col.is_null(r) {
                            put(r, NULL1, NULL2);
                        } else {
                            let s = format!("{:?}", col.slice(r, 1));
                            let h = XxHash64::oneshot(5, s.as_bytes());
                            put(r, h, fmix(h ^ K2 ^ s.len() as u64));
                        }
                    }
                }
            }
        }
        for r in 0..n {
            let h = ((fmix(a[r]) as u128) << 64) | fmix(b[r]) as u128;
            self.sum = self.sum.wrapping_add(h);
        }
        self.rows += n as u64;
    }

    pub fn merge(&mut self, other: &RowsDigest) {
        self.sum = self.sum.wrapping_add(other.sum);
        self.rows += other.rows;
    }

    /// `rd1:ROWS:SUM` (hex): the form recorded in manifests and windows.
    pub fn render(&self) -> String {
        format!("rd1:{}:{:032x}", self.rows, self.sum)
    }

    pub fn parse(s: &str) -> Option<RowsDigest> {
        let rest = s.strip_prefix("rd1:")?;
        let (rows, sum) = rest.split_once(':')?;
        Some(RowsDigest {
            rows: rows.parse().ok()?,
            sum: u128::from_str_radix(sum, 16).ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{ArrayRef, Int64Array, StringArray};
    use std::sync::Arc;

    fn batch(ids: &[i64], notes: &[Option<&str>]) -> RecordBatch {
        RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef),
            (
                "note",
                Arc::new(StringArray::from(notes.to_vec())) as ArrayRef,
            ),
        ])
        .unwrap()
    }

    #[test]
    fn order_and_batching_do_not_matter_content_does() {
        let mut one = RowsDigest::default();
        one.add_batch(&batch(&[1, 2, 3], &[Some("a"), None, Some("c")]));
        let mut two = RowsDigest::default();
        two.add_batch(&batch(&[3], &[Some("c")]));
        two.add_batch(&batch(&[2, 1], &[None, Some("a")]));
        assert_eq!(one, two);
        assert_eq!(RowsDigest::parse(&one.render()), Some(one));
        // The same values in other rows, or in other columns, differ.
        let mut swapped = RowsDigest::default();
        swapped.add_batch(&batch(&[1, 2, 3], &[None, Some("a"), Some("c")]));
        assert_ne!(one, swapped);
        let mut dup = RowsDigest::default();
        dup.add_batch(&batch(&[1, 1, 3], &[Some("a"), Some("a"), Some("c")]));
        assert_ne!(one, dup);
    }
}
