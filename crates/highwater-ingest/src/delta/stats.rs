//! Per-file statistics of an `add` action (PROTOCOL.md, "Per-file
//! Statistics"): `numRecords`, and `minValues`, `maxValues` and
//! `nullCount` per column, taken from the Parquet footer the writer just
//! built (its row groups' statistics), so they cost no pass over the rows.
//! Readers use them to skip files; highwater uses them to find the files
//! that may hold a window's rows (`_highwater_window` between a file's
//! minimum and maximum).
//!
//! Bounds are written only where they are exact or safely wider: strings
//! whose Parquet bounds were truncated keep the truncated minimum (a lower
//! bound) and leave the maximum out unless Parquet marks it exact or
//! rounded up; timestamps are written to the millisecond (Spark's and
//! delta-rs's form), the minimum rounded down and the maximum up; binary,
//! boolean and non-finite floats have no bounds.

use arrow_schema::{DataType, Schema, TimeUnit};
use highwater_core::window::civil;
use parquet::file::metadata::RowGroupMetaData;
use parquet::file::statistics::Statistics;
use serde_json::{json, Map, Value};

/// A column's bound, in the column's own order.
#[derive(Clone, Debug, PartialEq, PartialOrd)]
enum Bound {
    Int(i64),
    Float(f64),
    Text(Vec<u8>),
}

/// A row group's bounds of one column, where they are safe to write.
fn bounds(s: &Statistics) -> (Option<Bound>, Option<Bound>) {
    let f = |x: f64| x.is_finite().then_some(Bound::Float(x));
    match s {
        Statistics::Int32(v) => (
            v.min_opt().map(|x| Bound::Int(*x as i64)),
            v.max_opt().map(|x| Bound::Int(*x as i64)),
        ),
        Statistics::Int64(v) => (
            v.min_opt().map(|x| Bound::Int(*x)),
            v.max_opt().map(|x| Bound::Int(*x)),
        ),
        Statistics::Float(v) => (
            v.min_opt().and_then(|x| f(*x as f64)),
            v.max_opt().and_then(|x| f(*x as f64)),
        ),
        Statistics::Double(v) => (
            v.min_opt().and_then(|x| f(*x)),
            v.max_opt().and_then(|x| f(*x)),
        ),
        Statistics::ByteArray(v) => (
            v.min_opt().map(|x| Bound::Text(x.data().to_vec())),
            // A truncated maximum that Parquet did not round up would be
            // below the real one: no bound then.
            v.max_opt()
                .filter(|_| v.max_is_exact())
                .map(|x| Bound::Text(x.data().to_vec())),
        ),
        _ => (None, None),
    }
}

/// Min and max of one column over the row groups seen (`None` inside
/// once any row group's bound is unknown) and its null count.
struct Acc {
    min: Option<Option<Bound>>,
    max: Option<Option<Bound>>,
    nulls: Option<u64>,
}

impl Default for Acc {
    fn default() -> Self {
        Acc {
            min: None,
            max: None,
            nulls: Some(0),
        }
    }
}

/// `acc` folded with `b`: the lesser (`lower`) or greater of the two;
/// unknown once either is unknown or they do not compare.
fn fold(acc: &mut Option<Option<Bound>>, b: Option<Bound>, lower: bool) {
    *acc = Some(match (acc.take(), b) {
        (None, b) => b,
        (Some(Some(a)), Some(b)) => match a.partial_cmp(&b) {
            Some(o) if (o == std::cmp::Ordering::Less) == lower => Some(a),
            Some(_) => Some(b),
            None => None,
        },
        _ => None,
    });
}

impl Acc {
    /// Adds one row group's statistics `s` of a chunk of `values` values.
    fn add(&mut self, s: Option<&Statistics>, values: i64) {
        let nulls = s.and_then(|s| s.null_count_opt());
        self.nulls = match (self.nulls, nulls) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
        if nulls == Some(values.max(0) as u64) {
            // Only nulls: no bounds, and it narrows nothing.
            return;
        }
        let (lo, hi) = s.map(bounds).unwrap_or((None, None));
        fold(&mut self.min, lo, true);
        fold(&mut self.max, hi, false);
    }
}

/// The instant `ms` as Delta statistics write it (milliseconds, UTC).
fn millis(ms: i64) -> String {
    let c = civil(ms * 1000);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        c.year,
        c.month,
        c.day,
        c.hour,
        c.minute,
        c.second,
        c.micro / 1000
    )
}

/// The bound as JSON for a column of type `ty`; `up` rounds a timestamp's
/// fraction of a millisecond up (a maximum), else down.
fn json_of(b: &Bound, ty: &DataType, up: bool) -> Option<Value> {
    match (ty, b) {
        (DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64, Bound::Int(i)) => {
            Some(json!(i))
        }
        (DataType::Float32 | DataType::Float64, Bound::Float(x)) => Some(json!(x)),
        (DataType::Utf8 | DataType::LargeUtf8, Bound::Text(t)) => {
            std::str::from_utf8(t).ok().map(|s| json!(s))
        }
        (DataType::Date32, Bound::Int(d)) => {
            let c = civil(d * 86_400_000_000);
            Some(json!(format!("{:04}-{:02}-{:02}", c.year, c.month, c.day)))
        }
        (DataType::Timestamp(unit, Some(_)), Bound::Int(v)) => {
            let per_ms: i64 = match unit {
                TimeUnit::Second => return Some(json!(millis(v.checked_mul(1000)?))),
                TimeUnit::Millisecond => 1,
                TimeUnit::Microsecond => 1_000,
                TimeUnit::Nanosecond => 1_000_000,
            };
            let ms = if up {
                v.div_euclid(per_ms) + i64::from(v.rem_euclid(per_ms) != 0)
            } else {
                v.div_euclid(per_ms)
            };
            Some(json!(millis(ms)))
        }
        _ => None,
    }
}

/// The `stats` of a file of `schema` (flat: one Parquet leaf per field)
/// whose row groups are `groups`, holding `rows` rows.
pub fn of_row_groups(schema: &Schema, groups: &[RowGroupMetaData], rows: u64) -> Value {
    let mut min = Map::new();
    let mut max = Map::new();
    let mut nulls = Map::new();
    for (i, field) in schema.fields().iter().enumerate() {
        let mut acc = Acc::default();
        for g in groups {
            if i < g.num_columns() {
                acc.add(g.column(i).statistics(), g.column(i).num_values());
            }
        }
        let name = field.name().clone();
        if let Some(n) = acc.nulls {
            nulls.insert(name.clone(), json!(n));
        }
        if let Some(v) = acc
            .min
            .flatten()
            .and_then(|b| json_of(&b, field.data_type(), false))
        {
            min.insert(name.clone(), v);
        }
        if let Some(v) = acc
            .max
            .flatten()
            .and_then(|b| json_of(&b, field.data_type(), true))
        {
            max.insert(name, v);
        }
    }
    json!({"numRecords": rows, "minValues": min, "maxValues": max, "nullCount": nulls})
}

/// What an `add` action's statistics say of column `column`, a
/// timestamp: the file's rows, its least and greatest value (µs) and its
/// nulls, each `None` where the statistics do not say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimestampStats {
    pub rows: Option<u64>,
    pub min_us: Option<i64>,
    pub max_us: Option<i64>,
    pub nulls: Option<u64>,
}

/// Reads [`TimestampStats`] of `column` from an `add` action.
pub fn timestamp_stats(add: &Value, column: &str) -> TimestampStats {
    let Some(s) = add["stats"]
        .as_str()
        .and_then(|s| serde_json::from_str::<Value>(s).ok())
    else {
        return TimestampStats::default();
    };
    let at = |k: &str| {
        s[k][column]
            .as_str()
            .and_then(|t| highwater_core::window::parse_rfc3339(t).ok())
    };
    TimestampStats {
        rows: s["numRecords"].as_u64(),
        // Written to the millisecond: the maximum may stand for any
        // instant up to the next millisecond.
        min_us: at("minValues"),
        max_us: at("maxValues").map(|m| m + 999),
        nulls: s["nullCount"][column].as_u64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{
        Float64Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
    };
    use arrow_schema::Field;
    use std::sync::Arc;

    #[test]
    fn stats_of_a_written_file_bound_its_rows() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("amount", DataType::Float64, true),
            Field::new("note", DataType::Utf8, true),
            Field::new(
                "_highwater_window",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![Some(5), None, Some(-2)])),
                Arc::new(Float64Array::from(vec![1.5, f64::NAN, -3.0])),
                Arc::new(StringArray::from(vec![Some("b"), Some("a"), None])),
                Arc::new(
                    TimestampMicrosecondArray::from(vec![Some(1_500), Some(2_000_001), None])
                        .with_timezone("UTC"),
                ),
            ],
        )
        .unwrap();
        let mut buf = Vec::new();
        let props = parquet::file::properties::WriterProperties::builder()
            .set_max_row_group_row_count(Some(2))
            .build();
        let mut w =
            parquet::arrow::ArrowWriter::try_new(&mut buf, schema.clone(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.flush().unwrap();
        let groups = w.flushed_row_groups().to_vec();
        w.close().unwrap();
        let s = of_row_groups(&schema, &groups, 3);
        assert_eq!(s["numRecords"], 3);
        assert_eq!(s["minValues"]["id"], -2);
        assert_eq!(s["maxValues"]["id"], 5);
        assert_eq!(s["nullCount"]["id"], 1);
        assert_eq!(s["minValues"]["note"], "a");
        assert_eq!(s["maxValues"]["note"], "b");
        assert_eq!(
            s["minValues"]["_highwater_window"],
            "1970-01-01T00:00:00.001Z"
        );
        assert_eq!(
            s["maxValues"]["_highwater_window"],
            "1970-01-01T00:00:02.001Z"
        );
        let add = json!({"stats": s.to_string()});
        let t = timestamp_stats(&add, "_highwater_window");
        assert_eq!(t.rows, Some(3));
        assert_eq!(t.nulls, Some(1));
        assert!(t.min_us.unwrap() <= 1_500 && t.max_us.unwrap() >= 2_000_001);
    }
}
