//! The writer's side of Delta's protocol versions and table features
//! (PROTOCOL.md, "Protocol Evolution", "Table Features", "Writer
//! Requirements"): which tables highwater may write, and what it must do
//! on them. A writer must refuse a table whose protocol or features it
//! does not implement; this module decides, before anything is written.
//!
//! | feature | what highwater does |
//! |---|---|
//! | `appendOnly` (`delta.appendOnly = true`) | honoured: first landings and compactions (`dataChange = false`) go on; a re-land, which removes rows, is refused |
//! | `invariants` | honoured while no column carries one; a table with column invariants is refused |
//! | `checkConstraints` | honoured while the table has no constraint; a table with `delta.constraints.*` is refused (highwater does not evaluate SQL) |
//! | `changeDataFeed` | honoured while `delta.enableChangeDataFeed` is not true; enabled, refused (a re-land would need `cdc` files) |
//! | `generatedColumns`, `identityColumns` | honoured while no column is generated or an identity; otherwise refused |
//! | `columnMapping` | honoured with mode `none`; `name` or `id` refused (files would need physical names) |
//! | partition columns | refused: highwater writes unpartitioned files |
//! | anything else (`deletionVectors`, `timestampNtz`, `v2Checkpoint`, `rowTracking`, `domainMetadata`, `typeWidening`, `icebergCompat*`, `clustering`, `inCommitTimestamp`, `vacuumProtocolCheck`, ...) | refused |
//!
//! Tables highwater creates are protocol (1, 2) with no features enabled.

use serde_json::Value;

/// The writer features highwater implements (each only in the state the
/// table above says).
const WRITER_FEATURES: &[&str] = &[
    "appendOnly",
    "invariants",
    "checkConstraints",
    "changeDataFeed",
    "generatedColumns",
    "identityColumns",
    "columnMapping",
];

/// The newest legacy writer version and the features each legacy version
/// implies (PROTOCOL.md, "Table Features": versions before 7).
fn legacy_writer_features(v: i64) -> &'static [&'static str] {
    match v {
        ..=1 => &[],
        2 => &WRITER_FEATURES[..2],
        3 => &WRITER_FEATURES[..3],
        4 => &WRITER_FEATURES[..5],
        5 => &WRITER_FEATURES[..7],
        _ => WRITER_FEATURES,
    }
}

/// What a table asks of this writer, once it is known to be writable.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Duties {
    /// `delta.appendOnly = true`: no `remove` with `dataChange = true`.
    pub append_only: bool,
}

/// Whether highwater may write a table of this `protocol` and `metaData`:
/// the duties it has there, or every reason it may not (each a sentence
/// naming the feature).
pub fn check(protocol: &Value, metadata: Option<&Value>) -> Result<Duties, Vec<String>> {
    let mut why = Vec::new();
    let reader = protocol["minReaderVersion"].as_i64().unwrap_or(1);
    let writer = protocol["minWriterVersion"].as_i64().unwrap_or(1);
    let names = |key: &str| -> Vec<String> {
        protocol[key]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|f| f.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    if reader > 3 {
        why.push(format!(
            "reader version {reader} is newer than the protocol highwater knows (3)"
        ));
    }
    if reader == 3 {
        for f in names("readerFeatures") {
            // columnMapping is the one reader feature whose inactive state
            // reads like no feature; the rest change how files are read.
            if f != "columnMapping" {
                why.push(format!(
                    "reader feature `{f}` is not implemented by highwater"
                ));
            }
        }
    }
    let enabled: Vec<String> = match writer {
        7 => names("writerFeatures"),
        w if w > 7 => {
            why.push(format!(
                "writer version {w} is newer than the protocol highwater knows (7)"
            ));
            Vec::new()
        }
        w => legacy_writer_features(w)
            .iter()
            .map(|s| s.to_string())
            .collect(),
    };
    for f in &enabled {
        if !WRITER_FEATURES.contains(&f.as_str()) {
            why.push(format!(
                "writer feature `{f}` is not implemented by highwater"
            ));
        }
    }
    let empty = Value::Null;
    let md = metadata.unwrap_or(&empty);
    let conf = |key: &str| {
        md["configuration"][key]
            .as_str()
            .map(str::to_ascii_lowercase)
    };
    // The property binds whether or not the protocol lists the feature
    // (the safer reading of a table that says it is append-only).
    let duties = Duties {
        append_only: conf("delta.appendOnly").as_deref() == Some("true"),
    };
    if let Some(m) = md["configuration"].as_object() {
        for (k, v) in m {
            if let Some(name) = k.strip_prefix("delta.constraints.") {
                why.push(format!(
                    "CHECK constraint `{name}` ({}) is not evaluated by highwater",
                    v.as_str().unwrap_or_default()
                ));
            }
        }
    }
    if conf("delta.enableChangeDataFeed").as_deref() == Some("true") {
        why.push("the change data feed is enabled (`delta.enableChangeDataFeed`); highwater writes no `cdc` files".into());
    }
    match conf("delta.columnMapping.mode").as_deref() {
        None | Some("none") => {}
        Some(m) => why.push(format!(
            "column mapping mode `{m}` is not implemented by highwater (its files would need physical column names)"
        )),
    }
    if md["partitionColumns"]
        .as_array()
        .is_some_and(|a| !a.is_empty())
    {
        why.push(format!(
            "the table is partitioned by {}; highwater writes unpartitioned files",
            md["partitionColumns"]
        ));
    }
    for (column, key) in column_metadata(md) {
        if key == "delta.invariants" {
            why.push(format!(
                "column `{column}` has an invariant, which highwater does not check"
            ));
        } else if key == "delta.generationExpression" {
            why.push(format!(
                "column `{column}` is generated, which highwater does not compute"
            ));
        } else if key.starts_with("delta.identity.") {
            why.push(format!(
                "column `{column}` is an identity column, which highwater does not fill"
            ));
        }
    }
    why.dedup();
    if why.is_empty() {
        Ok(duties)
    } else {
        Err(why)
    }
}

/// Every (column, metadata key) of the table schema's top-level fields
/// (nested fields included, by their dotted path).
fn column_metadata(md: &Value) -> Vec<(String, String)> {
    let Some(schema) = md["schemaString"]
        .as_str()
        .and_then(|s| serde_json::from_str::<Value>(s).ok())
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    walk(&schema, "", &mut out);
    out
}

fn walk(ty: &Value, prefix: &str, out: &mut Vec<(String, String)>) {
    let Some(fields) = ty["fields"].as_array() else {
        return;
    };
    for f in fields {
        let name = format!("{prefix}{}", f["name"].as_str().unwrap_or_default());
        if let Some(m) = f["metadata"].as_object() {
            for k in m.keys() {
                out.push((name.clone(), k.clone()));
            }
        }
        walk(&f["type"], &format!("{name}."), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn md(conf: Value, schema: Value, parts: Value) -> Value {
        json!({"configuration": conf, "schemaString": schema.to_string(), "partitionColumns": parts})
    }

    fn plain() -> Value {
        md(
            json!({}),
            json!({"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": true, "metadata": {}}]}),
            json!([]),
        )
    }

    #[test]
    fn tables_highwater_implements_are_written() {
        for (r, w) in [(1, 1), (1, 2), (1, 3), (1, 4), (1, 6), (2, 5)] {
            let p = json!({"minReaderVersion": r, "minWriterVersion": w});
            assert_eq!(
                check(&p, Some(&plain())),
                Ok(Duties::default()),
                "({r}, {w})"
            );
        }
        let p = json!({"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["appendOnly", "invariants"]});
        assert_eq!(check(&p, Some(&plain())), Ok(Duties::default()));
    }

    #[test]
    fn append_only_is_a_duty() {
        let p = json!({"minReaderVersion": 1, "minWriterVersion": 2});
        let m = md(
            json!({"delta.appendOnly": "true"}),
            json!({"fields": []}),
            json!([]),
        );
        assert_eq!(check(&p, Some(&m)), Ok(Duties { append_only: true }));
    }

    #[test]
    fn what_highwater_does_not_implement_is_refused_by_name() {
        let p = json!({"minReaderVersion": 3, "minWriterVersion": 7,
            "readerFeatures": ["deletionVectors"], "writerFeatures": ["deletionVectors", "appendOnly"]});
        let e = check(&p, Some(&plain())).unwrap_err();
        assert!(e.iter().any(|l| l.contains("`deletionVectors`")), "{e:?}");
        let p = json!({"minReaderVersion": 1, "minWriterVersion": 3});
        let m = md(
            json!({"delta.constraints.positive": "amount >= 0"}),
            json!({"fields": []}),
            json!([]),
        );
        let e = check(&p, Some(&m)).unwrap_err();
        assert!(
            e[0].contains("CHECK constraint `positive` (amount >= 0)"),
            "{e:?}"
        );
        let p = json!({"minReaderVersion": 1, "minWriterVersion": 2});
        let m = md(json!({}), json!({"fields": []}), json!(["amount"]));
        let e = check(&p, Some(&m)).unwrap_err();
        assert!(e[0].contains("partitioned by [\"amount\"]"), "{e:?}");
        let m = md(
            json!({"delta.columnMapping.mode": "name"}),
            json!({"fields": [{"name": "g", "type": "long", "metadata": {"delta.generationExpression": "id * 2"}}]}),
            json!([]),
        );
        let p = json!({"minReaderVersion": 2, "minWriterVersion": 5});
        let e = check(&p, Some(&m)).unwrap_err();
        assert_eq!(e.len(), 2, "{e:?}");
        let p = json!({"minReaderVersion": 4, "minWriterVersion": 8});
        assert_eq!(check(&p, None).unwrap_err().len(), 2);
    }
}
