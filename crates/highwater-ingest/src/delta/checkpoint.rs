//! Classic Parquet checkpoints (PROTOCOL.md, "Checkpoints"): every
//! `checkpoint_every_commits` commits, the table's state at that version
//! as one Parquet file of actions (protocol, metaData, txn, add, remove),
//! and `_delta_log/_last_checkpoint` pointing at it, so that a reader
//! replays only the commits after it.

use super::Snapshot;
use arrow_array::builder::{ListBuilder, MapBuilder, MapFieldNames, StringBuilder};
use arrow_array::{
    ArrayRef, BooleanArray, Int32Array, Int64Array, RecordBatch, StringArray, StructArray,
};
use arrow_schema::{DataType, Field, Fields, Schema};
use serde_json::Value;
use std::sync::Arc;

/// Which action a checkpoint row holds.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Protocol,
    MetaData,
    Txn,
    Add,
    Remove,
}

fn strings(rows: &[Option<&Value>], key: &str) -> ArrayRef {
    Arc::new(StringArray::from(
        rows.iter()
            .map(|r| r.and_then(|v| v[key].as_str()))
            .collect::<Vec<_>>(),
    ))
}

fn longs(rows: &[Option<&Value>], key: &str) -> ArrayRef {
    Arc::new(Int64Array::from(
        rows.iter()
            .map(|r| r.and_then(|v| v[key].as_i64()))
            .collect::<Vec<_>>(),
    ))
}

fn ints(rows: &[Option<&Value>], key: &str) -> ArrayRef {
    Arc::new(Int32Array::from(
        rows.iter()
            .map(|r| r.and_then(|v| v[key].as_i64()).map(|x| x as i32))
            .collect::<Vec<_>>(),
    ))
}

fn bools(rows: &[Option<&Value>], key: &str) -> ArrayRef {
    Arc::new(BooleanArray::from(
        rows.iter()
            .map(|r| r.and_then(|v| v[key].as_bool()))
            .collect::<Vec<_>>(),
    ))
}

fn map_names() -> MapFieldNames {
    MapFieldNames {
        entry: "key_value".into(),
        key: "key".into(),
        value: "value".into(),
    }
}

fn map_type() -> DataType {
    let entries = Fields::from(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("value", DataType::Utf8, true),
    ]);
    DataType::Map(
        Arc::new(Field::new("key_value", DataType::Struct(entries), false)),
        false,
    )
}

/// A map<string, string> column: the object at `key` of each row.
fn maps(rows: &[Option<&Value>], key: &str) -> ArrayRef {
    let mut b = MapBuilder::new(
        Some(map_names()),
        StringBuilder::new(),
        StringBuilder::new(),
    );
    for r in rows {
        match r {
            Some(v) => {
                if let Some(o) = v[key].as_object() {
                    for (k, x) in o {
                        b.keys().append_value(k);
                        match x.as_str() {
                            Some(s) => b.values().append_value(s),
                            None => b.values().append_value(x.to_string()),
                        }
                    }
                }
                b.append(true).expect("keys and values in step");
            }
            None => b.append(false).expect("keys and values in step"),
        }
    }
    Arc::new(b.finish())
}

fn list_type() -> DataType {
    DataType::List(Arc::new(Field::new("element", DataType::Utf8, true)))
}

fn lists(rows: &[Option<&Value>], key: &str) -> ArrayRef {
    let mut b = ListBuilder::new(StringBuilder::new()).with_field(Arc::new(Field::new(
        "element",
        DataType::Utf8,
        true,
    )));
    for r in rows {
        match r {
            // A list the action leaves out is null, not empty: a protocol
            // before table features has no feature lists at all.
            Some(v) if v[key].is_array() => {
                for x in v[key].as_array().into_iter().flatten() {
                    b.values().append_value(x.as_str().unwrap_or_default());
                }
                b.append(true);
            }
            _ => b.append(false),
        }
    }
    Arc::new(b.finish())
}

fn field(name: &str, ty: DataType) -> Field {
    Field::new(name, ty, true)
}

/// A struct column: `children` (name, type, array) valid where the row is
/// of this column's kind.
fn column(valid: Vec<bool>, children: Vec<(&str, DataType, ArrayRef)>) -> (DataType, ArrayRef) {
    let fields: Fields = children
        .iter()
        .map(|(n, t, _)| field(n, t.clone()))
        .collect::<Vec<_>>()
        .into();
    let arrays = children.into_iter().map(|(_, _, a)| a).collect();
    let s = StructArray::try_new(fields.clone(), arrays, Some(valid.into()))
        .expect("children have one value per row");
    (DataType::Struct(fields), Arc::new(s))
}

/// The checkpoint of `snap` as one record batch.
pub fn batch(snap: &Snapshot) -> RecordBatch {
    // The table's protocol as it is: a checkpoint that wrote its own
    // would drop the table's features for every reader after it.
    let protocol = snap
        .protocol
        .clone()
        .unwrap_or_else(|| serde_json::json!({"minReaderVersion": 1, "minWriterVersion": 2}));
    let metadata = snap.metadata.clone().unwrap_or_default();
    let mut rows: Vec<(Kind, Value)> = vec![(Kind::Protocol, protocol), (Kind::MetaData, metadata)];
    for t in snap.txns.values() {
        rows.push((Kind::Txn, t.clone()));
    }
    for a in snap.files.values() {
        rows.push((Kind::Add, a.clone()));
    }
    for (path, at) in &snap.tombstones {
        rows.push((
            Kind::Remove,
            serde_json::json!({"path": path, "deletionTimestamp": at, "dataChange": true,
                "extendedFileMetadata": false}),
        ));
    }
    let of = |k: Kind| -> Vec<Option<&Value>> {
        rows.iter()
            .map(|(kind, v)| (*kind == k).then_some(v))
            .collect()
    };
    let valid = |k: Kind| -> Vec<bool> { rows.iter().map(|(kind, _)| *kind == k).collect() };
    let txn = of(Kind::Txn);
    let add = of(Kind::Add);
    let rm = of(Kind::Remove);
    let md = of(Kind::MetaData);
    let pr = of(Kind::Protocol);
    let formats: Vec<Option<&Value>> = md.iter().map(|m| m.map(|m| &m["format"])).collect();
    let (format_ty, format_arr) = column(
        md.iter().map(Option::is_some).collect(),
        vec![
            ("provider", DataType::Utf8, strings(&formats, "provider")),
            ("options", map_type(), maps(&formats, "options")),
        ],
    );
    let cols = vec![
        (
            "txn",
            column(
                valid(Kind::Txn),
                vec![
                    ("appId", DataType::Utf8, strings(&txn, "appId")),
                    ("version", DataType::Int64, longs(&txn, "version")),
                    ("lastUpdated", DataType::Int64, longs(&txn, "lastUpdated")),
                ],
            ),
        ),
        (
            "add",
            column(
                valid(Kind::Add),
                vec![
                    ("path", DataType::Utf8, strings(&add, "path")),
                    ("partitionValues", map_type(), maps(&add, "partitionValues")),
                    ("size", DataType::Int64, longs(&add, "size")),
                    (
                        "modificationTime",
                        DataType::Int64,
                        longs(&add, "modificationTime"),
                    ),
                    ("dataChange", DataType::Boolean, bools(&add, "dataChange")),
                    ("stats", DataType::Utf8, strings(&add, "stats")),
                    ("tags", map_type(), maps(&add, "tags")),
                ],
            ),
        ),
        (
            "remove",
            column(
                valid(Kind::Remove),
                vec![
                    ("path", DataType::Utf8, strings(&rm, "path")),
                    (
                        "deletionTimestamp",
                        DataType::Int64,
                        longs(&rm, "deletionTimestamp"),
                    ),
                    ("dataChange", DataType::Boolean, bools(&rm, "dataChange")),
                    (
                        "extendedFileMetadata",
                        DataType::Boolean,
                        bools(&rm, "extendedFileMetadata"),
                    ),
                ],
            ),
        ),
        (
            "metaData",
            column(
                valid(Kind::MetaData),
                vec![
                    ("id", DataType::Utf8, strings(&md, "id")),
                    ("name", DataType::Utf8, strings(&md, "name")),
                    ("description", DataType::Utf8, strings(&md, "description")),
                    ("format", format_ty, format_arr),
                    ("schemaString", DataType::Utf8, strings(&md, "schemaString")),
                    (
                        "partitionColumns",
                        list_type(),
                        lists(&md, "partitionColumns"),
                    ),
                    ("configuration", map_type(), maps(&md, "configuration")),
                    ("createdTime", DataType::Int64, longs(&md, "createdTime")),
                ],
            ),
        ),
        (
            "protocol",
            column(
                valid(Kind::Protocol),
                vec![
                    (
                        "minReaderVersion",
                        DataType::Int32,
                        ints(&pr, "minReaderVersion"),
                    ),
                    (
                        "minWriterVersion",
                        DataType::Int32,
                        ints(&pr, "minWriterVersion"),
                    ),
                    ("readerFeatures", list_type(), lists(&pr, "readerFeatures")),
                    ("writerFeatures", list_type(), lists(&pr, "writerFeatures")),
                ],
            ),
        ),
    ];
    let schema = Schema::new(
        cols.iter()
            .map(|(n, (t, _))| field(n, t.clone()))
            .collect::<Vec<_>>(),
    );
    RecordBatch::try_new(
        Arc::new(schema),
        cols.into_iter().map(|(_, (_, a))| a).collect(),
    )
    .expect("one value per row in every column")
}

/// The checkpoint file's bytes.
pub fn encode(snap: &Snapshot) -> Result<Vec<u8>, String> {
    let b = batch(snap);
    let mut out = Vec::new();
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut out, b.schema(), None)
        .map_err(|e| e.to_string())?;
    w.write(&b).map_err(|e| e.to_string())?;
    w.close().map_err(|e| e.to_string())?;
    Ok(out)
}
