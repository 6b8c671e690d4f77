//! Windows' rows taken out of the table wherever they now live (issue
//! 46; one window, or the windows of a period re-landed in one commit): in the window's own files, and in files another engine compacted
//! (OPTIMIZE), rewrote (DELETE, UPDATE, MERGE) or highwater compacted into
//! a period. Every row highwater lands carries its window's start in
//! [`super::WINDOW_COLUMN`], so a row's window survives whatever rewrites
//! it; a foreign row has none (null, or no such column in its file).
//!
//! For each active file, decided from its path and statistics alone where
//! they suffice, else by reading the column:
//!
//! | the file | fate |
//! |---|---|
//! | under a window's own folder (`data/START/`) | removed whole |
//! | statistics: only rows of one taken window | removed whole |
//! | statistics: no row of a taken window (bounds apart, or all null) | kept |
//! | read: no row of a taken window, or no stamp column | kept |
//! | read: only taken windows' rows | removed whole |
//! | read: some | rewritten without them (copy on write): removed, and its other rows added back as a new file, in the same commit |
//!
//! The plan is made against one snapshot; a commit that loses the race
//! to another writer makes it again against the newer snapshot (files
//! already read are not read again).

use super::stats::timestamp_stats;
use super::WINDOW_COLUMN;
use arrow_array::{Array, BooleanArray, RecordBatch};
use arrow_schema::{DataType, TimeUnit};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// The windows one commit takes out: their starts (µs), and the folders
/// their own files live under (`data/START/`, relative to the table).
#[derive(Clone, Debug, Default)]
pub struct Taken {
    starts: BTreeSet<i64>,
    prefixes: Vec<String>,
}

impl Taken {
    /// Windows by start and own-folder prefix.
    pub fn new(windows: impl IntoIterator<Item = (i64, String)>) -> Taken {
        let mut t = Taken::default();
        for (start, prefix) in windows {
            t.starts.insert(start);
            t.prefixes.push(prefix);
        }
        t
    }

    /// Windows by start only: rows are matched by stamp, no file by its
    /// folder (a reader of the rows, not a commit).
    pub fn stamps(starts: impl IntoIterator<Item = i64>) -> Taken {
        Taken {
            starts: starts.into_iter().collect(),
            prefixes: Vec::new(),
        }
    }

    /// Whether a row stamped `start_us` is taken.
    pub fn contains(&self, start_us: i64) -> bool {
        self.starts.contains(&start_us)
    }

    /// The taken window starts, oldest first.
    pub fn starts(&self) -> impl Iterator<Item = i64> + '_ {
        self.starts.iter().copied()
    }

    /// Whether some taken window starts in `lo..=hi`.
    fn any_in(&self, lo: i64, hi: i64) -> bool {
        lo <= hi && self.starts.range(lo..=hi).next().is_some()
    }

    /// Whether `path` lies under a taken window's own folder.
    fn own(&self, path: &str) -> bool {
        self.prefixes.iter().any(|p| path.starts_with(p.as_str()))
    }
}

/// What becomes of one active file when windows are taken out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fate {
    Keep,
    /// Removed whole: all its rows are taken windows'.
    Remove,
    /// Its rows must be read to decide.
    Read,
}

/// The fate of active file `path` (its `add` action `add`) from what the
/// log says, when the windows `taken` are taken out.
pub fn fate_by_log(path: &str, add: &Value, taken: &Taken) -> Fate {
    // The windows' own files; a file some re-land rewrote holds other
    // windows' rows wherever it lies (they are written outside every
    // window's folder, `delta::rewrite_dir`, and this guards the rule).
    if taken.own(path) && add["tags"]["highwater.rewritten_from"].is_null() {
        return Fate::Remove;
    }
    let s = timestamp_stats(add, WINDOW_COLUMN);
    if let (Some(rows), Some(nulls)) = (s.rows, s.nulls) {
        if nulls >= rows {
            return Fate::Keep;
        }
    }
    match (s.min_us, s.max_us) {
        (Some(lo), Some(hi)) if !taken.any_in(lo, hi) => Fate::Keep,
        // Statistics are to the millisecond: "only taken rows" needs one
        // stamp, on a whole millisecond, taken, and no nulls.
        (Some(lo), Some(hi))
            if hi == lo + 999 && lo % 1000 == 0 && taken.contains(lo) && s.nulls == Some(0) =>
        {
            Fate::Remove
        }
        _ => Fate::Read,
    }
}

/// The stamp of each row of `batch`: `Some(start)` per row, `None` for a
/// foreign row; `None` for the whole batch when it has no stamp column.
fn stamps(batch: &RecordBatch) -> Option<Vec<Option<i64>>> {
    let col = batch.column_by_name(WINDOW_COLUMN)?;
    use arrow_array::cast::AsArray;
    use arrow_array::types::*;
    let per_us = |v: i64, unit: &TimeUnit| -> i64 {
        match unit {
            TimeUnit::Second => v.saturating_mul(1_000_000),
            TimeUnit::Millisecond => v.saturating_mul(1_000),
            TimeUnit::Microsecond => v,
            TimeUnit::Nanosecond => v.div_euclid(1_000),
        }
    };
    let out: Vec<Option<i64>> = match col.data_type() {
        DataType::Timestamp(unit, _) => {
            let vals: Vec<Option<i64>> = match unit {
                TimeUnit::Second => col.as_primitive::<TimestampSecondType>().iter().collect(),
                TimeUnit::Millisecond => col
                    .as_primitive::<TimestampMillisecondType>()
                    .iter()
                    .collect(),
                TimeUnit::Microsecond => col
                    .as_primitive::<TimestampMicrosecondType>()
                    .iter()
                    .collect(),
                TimeUnit::Nanosecond => col
                    .as_primitive::<TimestampNanosecondType>()
                    .iter()
                    .collect(),
            };
            vals.into_iter()
                .map(|v| v.map(|v| per_us(v, unit)))
                .collect()
        }
        // Not a stamp highwater wrote: the rows are foreign.
        _ => vec![None; batch.num_rows()],
    };
    Some(out)
}

/// How many rows of `batch` are taken windows', and how many not.
pub fn count(batch: &RecordBatch, taken: &Taken) -> (usize, usize) {
    match stamps(batch) {
        Some(st) => {
            let mine = st
                .iter()
                .filter(|s| s.is_some_and(|s| taken.contains(s)))
                .count();
            (mine, batch.num_rows() - mine)
        }
        None => (0, batch.num_rows()),
    }
}

/// The rows of `batch` that are not taken windows'.
pub fn without(batch: &RecordBatch, taken: &Taken) -> Result<RecordBatch, String> {
    let Some(st) = stamps(batch) else {
        return Ok(batch.clone());
    };
    let keep: BooleanArray = st
        .iter()
        .map(|s| Some(!s.is_some_and(|s| taken.contains(s))))
        .collect();
    arrow_select::filter::filter_record_batch(batch, &keep).map_err(|e| e.to_string())
}

/// The rows of `batch` that are taken windows' (none when it has no
/// stamp column).
pub fn only(batch: &RecordBatch, taken: &Taken) -> Result<RecordBatch, String> {
    let keep: BooleanArray = match stamps(batch) {
        Some(st) => st
            .iter()
            .map(|s| Some(s.is_some_and(|s| taken.contains(s))))
            .collect(),
        None => BooleanArray::from(vec![false; batch.num_rows()]),
    };
    arrow_select::filter::filter_record_batch(batch, &keep).map_err(|e| e.to_string())
}

/// A path of the log (a relative URI, percent-encoded) as a path below
/// the table's root, or `None` where it leaves the table (an absolute
/// URI, `..`): highwater reads only the table's own files.
pub fn table_relative(path: &str) -> Option<String> {
    if path.contains("://") || path.starts_with('/') {
        return None;
    }
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let rel = String::from_utf8(out).ok()?;
    std::path::Path::new(&rel)
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)))
        .then_some(rel)
}

/// Files already read for one window's commit, by path: what each held
/// (`None`: kept; `Some(None)`: removed whole; `Some(Some(files))`: written
/// back as these files, paths relative to the table).
pub type Decided = BTreeMap<String, Option<Option<Vec<crate::sink::FileInfo>>>>;

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int64Array, TimestampMicrosecondArray};
    use arrow_schema::{Field, Schema};
    use serde_json::json;
    use std::sync::Arc;

    fn add(stats: Value) -> Value {
        json!({"stats": stats.to_string()})
    }

    #[test]
    fn the_log_decides_where_it_can() {
        let w = Taken::new([(3_600_000_000, "data/19700101T010000Z/".to_string())]);
        let w = &w;
        assert_eq!(
            fate_by_log("data/19700101T010000Z/t/part-0.parquet", &json!({}), w),
            Fate::Remove
        );
        assert_eq!(fate_by_log("part-x.parquet", &json!({}), w), Fate::Read);
        let rewritten = json!({"tags": {"highwater.rewritten_from": "part-x.parquet"}});
        assert_eq!(
            fate_by_log(
                "data/19700101T010000Z/t/part-rewrite-0000-00000.parquet",
                &rewritten,
                w
            ),
            Fate::Read
        );
        let only = add(json!({"numRecords": 3, "nullCount": {WINDOW_COLUMN: 0},
            "minValues": {WINDOW_COLUMN: "1970-01-01T01:00:00.000Z"}, "maxValues": {WINDOW_COLUMN: "1970-01-01T01:00:00.000Z"}}));
        assert_eq!(fate_by_log("part-x.parquet", &only, w), Fate::Remove);
        let apart = add(json!({"numRecords": 3, "nullCount": {WINDOW_COLUMN: 0},
            "minValues": {WINDOW_COLUMN: "1970-01-01T02:00:00.000Z"}, "maxValues": {WINDOW_COLUMN: "1970-01-01T03:00:00.000Z"}}));
        assert_eq!(fate_by_log("part-x.parquet", &apart, w), Fate::Keep);
        let foreign = add(json!({"numRecords": 3, "nullCount": {WINDOW_COLUMN: 3}}));
        assert_eq!(fate_by_log("part-x.parquet", &foreign, w), Fate::Keep);
        let mixed = add(json!({"numRecords": 3, "nullCount": {WINDOW_COLUMN: 1},
            "minValues": {WINDOW_COLUMN: "1970-01-01T01:00:00.000Z"}, "maxValues": {WINDOW_COLUMN: "1970-01-01T01:00:00.000Z"}}));
        assert_eq!(fate_by_log("part-x.parquet", &mixed, w), Fate::Read);
    }

    /// The windows of a period taken out in one commit (issue 46): a file
    /// holding rows of several taken windows is read, one holding only
    /// rows of windows not taken is kept.
    #[test]
    fn several_windows_are_taken_together() {
        let h = 3_600_000_000;
        let taken = Taken::new((1..=3).map(|i| (i * h, format!("data/h{i}/"))));
        assert_eq!(
            fate_by_log("data/h2/t/part-0.parquet", &json!({}), &taken),
            Fate::Remove
        );
        let span = add(json!({"numRecords": 3, "nullCount": {WINDOW_COLUMN: 0},
            "minValues": {WINDOW_COLUMN: "1970-01-01T01:00:00.000Z"}, "maxValues": {WINDOW_COLUMN: "1970-01-01T03:00:00.000Z"}}));
        assert_eq!(fate_by_log("p.parquet", &span, &taken), Fate::Read);
        let later = add(json!({"numRecords": 3, "nullCount": {WINDOW_COLUMN: 0},
            "minValues": {WINDOW_COLUMN: "1970-01-01T04:00:00.000Z"}, "maxValues": {WINDOW_COLUMN: "1970-01-01T05:00:00.000Z"}}));
        assert_eq!(fate_by_log("p.parquet", &later, &taken), Fate::Keep);
        let one = add(json!({"numRecords": 3, "nullCount": {WINDOW_COLUMN: 0},
            "minValues": {WINDOW_COLUMN: "1970-01-01T02:00:00.000Z"}, "maxValues": {WINDOW_COLUMN: "1970-01-01T02:00:00.000Z"}}));
        assert_eq!(fate_by_log("p.parquet", &one, &taken), Fate::Remove);
    }

    #[test]
    fn a_file_is_split_by_its_stamps() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new(
                WINDOW_COLUMN,
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
        ]));
        let b = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3, 4])),
                Arc::new(
                    TimestampMicrosecondArray::from(vec![Some(10), Some(20), None, Some(10)])
                        .with_timezone("UTC"),
                ),
            ],
        )
        .unwrap();
        let t10 = &Taken::stamps([10]);
        assert_eq!(count(&b, t10), (2, 2));
        assert_eq!(count(&b, &Taken::stamps([10, 20])), (3, 1));
        assert_eq!(count(&b, &Taken::stamps([99])), (0, 4));
        let rest = without(&b, t10).unwrap();
        let ids = rest
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .values()
            .to_vec();
        assert_eq!(ids, vec![2, 3]);
        assert_eq!(only(&b, t10).unwrap().num_rows(), 2);
        let unstamped = b.project(&[0]).unwrap();
        assert_eq!(only(&unstamped, t10).unwrap().num_rows(), 0);
        assert_eq!(count(&unstamped, t10), (0, 4));
        assert_eq!(without(&unstamped, t10).unwrap().num_rows(), 4);
    }

    #[test]
    fn log_paths_stay_inside_the_table() {
        assert_eq!(
            table_relative("part-1.parquet").as_deref(),
            Some("part-1.parquet")
        );
        assert_eq!(
            table_relative("a%3Db/part%201.parquet").as_deref(),
            Some("a=b/part 1.parquet")
        );
        for bad in [
            "../x.parquet",
            "/etc/passwd",
            "s3://b/x.parquet",
            "a/%2E%2E/%2E%2E/x",
            "bad%zz",
            "x%4",
        ] {
            assert_eq!(table_relative(bad), None, "{bad}");
        }
    }
}
