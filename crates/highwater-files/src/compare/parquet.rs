//! Parquet: the schema and the rows' values, in order (the default) or as a
//! multiset (`order = "free"`); not the encoding, compression, page or row
//! group sizes, statistics, or writer metadata (`created_by`, key-value
//! metadata, and the embedded Arrow schema, which differs between writers
//! of the same data: pyarrow's `string` is polars' `large_string`).
//!
//! The file is read as the Parquet schema alone says, so the same logical
//! data reads the same whatever wrote it. Counted: column names, nesting,
//! logical types (a `timestamp(ms)` rewritten as `timestamp(us)` is a
//! change, as a reader sees it), nullability, and every value.

use super::{CompareError, DataDigest, Order, Rows};
use arrow_array::cast::AsArray;
use arrow_array::{downcast_primitive_array, Array, ArrowPrimitiveType, PrimitiveArray};
use arrow_schema::{DataType, Field};
use parquet::arrow::arrow_reader::{ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
use std::path::Path;
use twox_hash::XxHash64;

/// Rows decoded at a time: big enough that per-batch costs vanish, small
/// enough that a wide file's batch stays a few MiB.
const BATCH_ROWS: usize = 16 * 1024;

const K1: u64 = 0x9E37_79B9_7F4A_7C15;
const K2: u64 = 0xC2B2_AE3D_27D4_EB4F;
/// A null's value hash: distinct from every value's with high probability.
const NULL: u64 = 0x6e75_6c6c_6e75_6c6c;

pub struct Parquet;

impl DataDigest for Parquet {
    fn name(&self) -> &'static str {
        "parquet"
    }

    fn sniff(&self, head: &[u8]) -> bool {
        head.starts_with(b"PAR1")
    }

    fn digest(
        &self,
        path: &Path,
        order: Order,
        h: &mut blake3::Hasher,
    ) -> Result<(), CompareError> {
        let f = std::fs::File::open(path)?;
        let opts = ArrowReaderOptions::new().with_skip_arrow_metadata(true);
        let builder = ParquetRecordBatchReaderBuilder::try_new_with_options(f, opts)?;
        let schema = builder.schema().clone();
        h.update(&(schema.fields().len() as u64).to_le_bytes());
        for f in schema.fields() {
            put_field(h, f);
        }
        let reader = builder.with_batch_size(BATCH_ROWS).build()?;
        let mut rows = Rows::new(order);
        let mut cell = Vec::new();
        for batch in reader {
            let batch = batch?;
            let n = batch.num_rows();
            let mut a = vec![K1; n];
            let mut b = vec![K2; n];
            for col in batch.columns() {
                cell.clear();
                cell.resize(n, 0);
                hash_array(col.as_ref(), &mut cell);
                for ((x, y), c) in a.iter_mut().zip(b.iter_mut()).zip(&cell) {
                    *x = (x.rotate_left(23) ^ fmix(*c)).wrapping_mul(K1);
                    *y = (y.rotate_left(31) ^ fmix(c ^ K2)).wrapping_mul(K2);
                }
            }
            for (x, y) in a.iter().zip(&b) {
                rows.push(((fmix(*x) as u128) << 64) | fmix(*y) as u128);
            }
        }
        rows.finish_into(h);
        Ok(())
    }
}

fn fmix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

fn put_str(h: &mut blake3::Hasher, s: &str) {
    h.update(&(s.len() as u64).to_le_bytes());
    h.update(s.as_bytes());
}

/// A field's name, nullability and type, nested fields by the same rule;
/// field metadata (Parquet field ids) is not data.
fn put_field(h: &mut blake3::Hasher, f: &Field) {
    put_str(h, f.name());
    h.update(&[f.is_nullable() as u8]);
    put_type(h, f.data_type());
}

fn put_type(h: &mut blake3::Hasher, t: &DataType) {
    match t {
        DataType::Struct(fields) => {
            put_str(h, "struct");
            h.update(&(fields.len() as u64).to_le_bytes());
            fields.iter().for_each(|f| put_field(h, f));
        }
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f) => {
            put_str(h, "list");
            put_field(h, f);
        }
        DataType::FixedSizeList(f, n) => {
            put_str(h, &format!("list[{n}]"));
            put_field(h, f);
        }
        DataType::Map(f, sorted) => {
            put_str(h, if *sorted { "map sorted" } else { "map" });
            put_field(h, f);
        }
        // Types without children: their display says all (unit, zone,
        // precision, scale).
        other => put_str(h, &other.to_string()),
    }
}

/// One 64-bit hash per row of `a` into `out` (as long as `a`).
fn hash_array(a: &dyn Array, out: &mut [u64]) {
    downcast_primitive_array!(
        a => primitive(a, out),
        DataType::Boolean => {
            let b = a.as_boolean();
            for (r, o) in out.iter_mut().enumerate() {
                *o = b.value(r) as u64 + 1;
            }
        }
        DataType::Utf8 => bytes(out, |r| a.as_string::<i32>().value(r).as_bytes()),
        DataType::LargeUtf8 => bytes(out, |r| a.as_string::<i64>().value(r).as_bytes()),
        DataType::Utf8View => bytes(out, |r| a.as_string_view().value(r).as_bytes()),
        DataType::Binary => bytes(out, |r| a.as_binary::<i32>().value(r)),
        DataType::LargeBinary => bytes(out, |r| a.as_binary::<i64>().value(r)),
        DataType::BinaryView => bytes(out, |r| a.as_binary_view().value(r)),
        DataType::FixedSizeBinary(_) => bytes(out, |r| a.as_fixed_size_binary().value(r)),
        DataType::Struct(_) => {
            let s = a.as_struct();
            let mut child = vec![0u64; a.len()];
            for (i, c) in s.columns().iter().enumerate() {
                hash_array(c.as_ref(), &mut child);
                for (o, v) in out.iter_mut().zip(&child) {
                    *o = fmix(o.rotate_left(17) ^ v ^ (i as u64).wrapping_mul(K1));
                }
            }
        }
        DataType::List(_) => {
            let l = a.as_list::<i32>();
            let offsets: Vec<usize> = l.value_offsets().iter().map(|o| *o as usize).collect();
            nested(l.values().as_ref(), &offsets, out);
        }
        DataType::Map(..) => {
            let m = a.as_map();
            let offsets: Vec<usize> = m.value_offsets().iter().map(|o| *o as usize).collect();
            nested(m.entries(), &offsets, out);
        }
        DataType::LargeList(_) => {
            let l = a.as_list::<i64>();
            let offsets: Vec<usize> = l.value_offsets().iter().map(|o| *o as usize).collect();
            nested(l.values().as_ref(), &offsets, out);
        }
        DataType::FixedSizeList(_, n) => {
            let l = a.as_fixed_size_list();
            let n = *n as usize;
            let offsets: Vec<usize> = (0..=a.len()).map(|r| r * n).collect();
            nested(l.values().as_ref(), &offsets, out);
        }
        // Parquet read without its Arrow schema yields none of the other
        // types; should one appear, its rows are hashed by their printed
        // form (slow, and correct).
        _ => {
            for (r, o) in out.iter_mut().enumerate() {
                *o = XxHash64::oneshot(5, format!("{:?}", a.slice(r, 1)).as_bytes());
            }
        }
    );
    if a.null_count() > 0 {
        for (r, o) in out.iter_mut().enumerate() {
            if a.is_null(r) {
                *o = NULL;
            }
        }
    }
}

/// A primitive's values by their bytes (the type is in the schema digest).
fn primitive<T: ArrowPrimitiveType>(a: &PrimitiveArray<T>, out: &mut [u64]) {
    let w = std::mem::size_of::<T::Native>();
    let raw: &[u8] = a.values().inner().as_slice();
    for (o, v) in out.iter_mut().zip(raw.chunks_exact(w)) {
        *o = if w <= 8 {
            let mut b = [0u8; 8];
            b[..w].copy_from_slice(v);
            u64::from_le_bytes(b)
        } else {
            XxHash64::oneshot(7, v)
        };
    }
}

fn bytes<'a>(out: &mut [u64], value: impl Fn(usize) -> &'a [u8]) {
    for (r, o) in out.iter_mut().enumerate() {
        let s = value(r);
        *o = XxHash64::oneshot(3, s) ^ (s.len() as u64).wrapping_mul(K2);
    }
}

/// Rows that hold a run of child values (`offsets[r]..offsets[r + 1]`):
/// the children's hashes in order, with the run's length.
fn nested(values: &dyn Array, offsets: &[usize], out: &mut [u64]) {
    let mut child = vec![0u64; values.len()];
    hash_array(values, &mut child);
    for (r, o) in out.iter_mut().enumerate() {
        let (s, e) = (offsets[r], offsets[r + 1]);
        let mut x = K1 ^ (e - s) as u64;
        for v in &child[s..e] {
            x = fmix(x.rotate_left(13) ^ v);
        }
        *o = x;
    }
}
