//! The table schema of a Delta source: the source's columns in Delta's
//! types, the `schemaString` of the table's `metaData`, and the rule for a
//! changed source (a column added evolves the table; anything else is
//! refused before a commit).
//!
//! Type mapping (highwater's Arrow column → Delta, protocol (1, 2), no
//! table features, so every reader reads it):
//!
//! | column | Delta |
//! |---|---|
//! | Boolean | boolean |
//! | Int16, Int32, Int64 | short, integer, long |
//! | Float32, Float64 | float, double |
//! | Utf8 (text, json, uuid, `numeric` without a precision, ...) | string |
//! | `numeric(p, s)`, p <= 38 (PostgreSQL) | decimal(p,s) (issue 46), unless the table holds the column as a string already |
//! | Binary | binary |
//! | Timestamp(µs, UTC) | timestamp |
//! | Timestamp(µs) (PostgreSQL `timestamp`) | timestamp: read as UTC, written as UTC µs (`timestamp_ntz` needs a table feature) |
//! | Date32 | date |
//!
//! A type change is refused even where Parquet windows would widen
//! (int32 → int64): Delta's type widening is a table feature
//! (protocol (3, 7)) that older readers cannot read.

use crate::sink::{ColType, Column};
use serde_json::{json, Value};

/// A column's Delta type.
pub fn delta_type(ty: ColType) -> String {
    match ty {
        ColType::Bool => "boolean",
        ColType::I16 => "short",
        ColType::I32 => "integer",
        ColType::I64 => "long",
        ColType::F32 => "float",
        ColType::F64 => "double",
        ColType::Text => "string",
        ColType::Bytes => "binary",
        ColType::TimestampTz | ColType::Timestamp => "timestamp",
        ColType::Date => "date",
        ColType::Decimal(p, s) => return format!("decimal({p},{s})"),
    }
    .to_string()
}

/// The widest `numeric(p, s)` a Delta `decimal` holds.
pub const DECIMAL_PRECISION_MAX: u8 = 38;

/// The decimal a source type `numeric(p,s)` lands as, where Delta's
/// decimal holds it (1 <= p <= 38, 0 <= s <= p); `None` for a `numeric`
/// without a precision (any number of digits: it stays the server's exact
/// text) or a wider one.
pub fn decimal_of_source_type(source_type: &str) -> Option<ColType> {
    let inner = source_type.strip_prefix("numeric(")?.strip_suffix(')')?;
    let (p, s) = inner.split_once(',')?;
    let (p, s): (u8, i8) = (p.trim().parse().ok()?, s.trim().parse().ok()?);
    (1..=DECIMAL_PRECISION_MAX)
        .contains(&p)
        .then_some(())
        .filter(|_| s >= 0 && s as u8 <= p)
        .map(|_| ColType::Decimal(p, s))
}

/// The columns as a Delta table writes them: a naive timestamp becomes
/// UTC (its values are read as UTC already), since protocol (1, 2) has
/// only `timestamp`, which is adjusted to UTC.
/// A `numeric(p,s)` becomes `decimal(p,s)`, except in a table that holds
/// the column as a string already (landed before decimals were): a
/// Delta column keeps its one type.
pub fn table_columns(columns: &[Column], table: Option<&[Field]>) -> Vec<Column> {
    columns
        .iter()
        .map(|c| Column {
            ty: match c.ty {
                ColType::Timestamp => ColType::TimestampTz,
                ColType::Text => {
                    let as_string = table
                        .and_then(|t| t.iter().find(|f| f.name == c.name))
                        .is_some_and(|f| f.ty == "string");
                    decimal_of_source_type(&c.source_type)
                        .filter(|_| !as_string)
                        .unwrap_or(ColType::Text)
                }
                t => t,
            },
            ..c.clone()
        })
        .collect()
}

/// One field of a table schema: name and Delta type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub ty: String,
}

/// The fields of a `schemaString`.
pub fn parse_schema_string(s: &str) -> Option<Vec<Field>> {
    let v: Value = serde_json::from_str(s).ok()?;
    v["fields"]
        .as_array()?
        .iter()
        .map(|f| {
            Some(Field {
                name: f["name"].as_str()?.to_string(),
                // A nested type is an object: rendered as its JSON text,
                // which never equals one of our primitive names.
                ty: match &f["type"] {
                    Value::String(t) => t.clone(),
                    other => other.to_string(),
                },
            })
        })
        .collect()
}

/// The `schemaString` of `fields`, every one nullable (a column added
/// later reads as null in the older files).
pub fn schema_string(fields: &[Field]) -> String {
    json!({
        "type": "struct",
        "fields": fields
            .iter()
            .map(|f| json!({"name": f.name, "type": f.ty, "nullable": true, "metadata": {}}))
            .collect::<Vec<_>>(),
    })
    .to_string()
}

/// What the table's schema becomes for the source's `columns`: `Ok(None)`
/// when it stays, `Ok(Some(fields))` when columns were added (appended, in
/// the source's order), `Err(lines)` naming each column that was dropped or
/// changed type, with both types. With `tolerate_dropped` (`checks.schema`
/// `warn` or `off`), a column the source no longer has stays in the table
/// (new rows read it as null) and is not an error; a changed type always
/// is: a Delta column has one type (type widening is a table feature).
pub fn evolve(
    table: &[Field],
    columns: &[Column],
    tolerate_dropped: bool,
) -> Result<Option<Vec<Field>>, Vec<String>> {
    let mut bad = Vec::new();
    for f in table {
        match columns.iter().find(|c| c.name == f.name) {
            None if tolerate_dropped => {}
            None => bad.push(format!(
                "column `{}` ({}) is in the table but the source no longer has it",
                f.name, f.ty
            )),
            Some(c) if delta_type(c.ty) != f.ty.replace(' ', "") => bad.push(format!(
                "column `{}` is {} in the table, and the source now gives {} ({})",
                f.name,
                f.ty,
                delta_type(c.ty),
                c.source_type
            )),
            Some(_) => {}
        }
    }
    if !bad.is_empty() {
        return Err(bad);
    }
    let added: Vec<Field> = columns
        .iter()
        .filter(|c| !table.iter().any(|f| f.name == c.name))
        .map(|c| Field {
            name: c.name.clone(),
            ty: delta_type(c.ty),
        })
        .collect();
    if added.is_empty() {
        return Ok(None);
    }
    let mut all = table.to_vec();
    all.extend(added);
    Ok(Some(all))
}

/// `columns` with the window stamp after them, as the table's schema
/// holds them (see [`super::WINDOW_COLUMN`]).
pub fn stamped(columns: &[Column]) -> Vec<Column> {
    let mut all = columns.to_vec();
    all.push(Column {
        name: super::WINDOW_COLUMN.to_string(),
        ty: ColType::TimestampTz,
        source_type: "the start of the window the row was landed in".into(),
    });
    all
}

/// Column names a Delta reader accepts and highwater's own column
/// leaves free: `Err` names each collision. Delta's column names are
/// case-insensitive (deltalake and Polars refuse `id` beside `ID`).
pub fn check_names(columns: &[Column]) -> Result<(), Vec<String>> {
    let mut bad = Vec::new();
    let mut seen: std::collections::BTreeMap<String, &str> = Default::default();
    for c in columns {
        // SQLite renames a result column whose name an earlier one has
        // (case-insensitively) to `NAME:N` when it reads a subquery: the
        // query named two columns alike all the same.
        let renamed = c
            .name
            .rsplit_once(':')
            .filter(|(base, n)| {
                !n.is_empty()
                    && n.bytes().all(|b| b.is_ascii_digit())
                    && seen.contains_key(&base.to_lowercase())
            })
            .map(|(base, _)| base);
        if let Some(base) = renamed {
            bad.push(format!(
                "columns `{}` and `{base}` differ only in case (SQLite renamed the second `{}`), and Delta's column names are case-insensitive",
                seen[&base.to_lowercase()],
                c.name
            ));
            continue;
        }
        let folded = c.name.to_lowercase();
        if folded == super::WINDOW_COLUMN.to_lowercase() {
            bad.push(format!(
                "column `{}` is highwater's own (each row's window start)",
                c.name
            ));
        } else if let Some(first) = seen.insert(folded, &c.name) {
            bad.push(format!(
                "columns `{first}` and `{}` differ only in case, and Delta's column names are case-insensitive",
                c.name
            ));
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(bad)
    }
}

/// The fields of a first commit.
pub fn fields_of(columns: &[Column]) -> Vec<Field> {
    columns
        .iter()
        .map(|c| Field {
            name: c.name.clone(),
            ty: delta_type(c.ty),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, ty: ColType) -> Column {
        Column {
            name: name.into(),
            ty,
            source_type: format!("{ty:?}"),
        }
    }

    fn field(name: &str, ty: &str) -> Field {
        Field {
            name: name.into(),
            ty: ty.into(),
        }
    }

    /// Issue 21: the schema rule, case by case.
    #[test]
    fn evolve_adds_columns_and_refuses_the_rest() {
        let table = vec![field("id", "long"), field("amount", "double")];
        let check = |cols: Vec<Column>| evolve(&table, &cols, false);
        assert_eq!(
            check(vec![col("amount", ColType::F64), col("id", ColType::I64)]),
            Ok(None)
        );
        assert_eq!(
            check(vec![
                col("id", ColType::I64),
                col("note", ColType::Text),
                col("amount", ColType::F64)
            ]),
            Ok(Some(vec![
                field("id", "long"),
                field("amount", "double"),
                field("note", "string")
            ]))
        );
        let e = check(vec![col("id", ColType::I64), col("amount", ColType::F32)]).unwrap_err();
        assert!(
            e[0].contains("`amount` is double") && e[0].contains("float"),
            "{e:?}"
        );
        let e = check(vec![col("id", ColType::I64)]).unwrap_err();
        assert!(e[0].contains("`amount` (double)"), "{e:?}");
        // `checks.schema = "warn"`: a dropped column stays in the table, a
        // changed type is still refused.
        assert_eq!(evolve(&table, &[col("id", ColType::I64)], true), Ok(None));
        assert!(evolve(
            &table,
            &[col("id", ColType::I64), col("amount", ColType::F32)],
            true
        )
        .is_err());
    }

    #[test]
    fn names_that_collide_are_refused() {
        let ok = [col("id", ColType::I64), col("amount", ColType::F64)];
        assert!(check_names(&ok).is_ok());
        let e = check_names(&[col("id", ColType::I64), col("ID", ColType::I64)]).unwrap_err();
        assert!(e[0].contains("`id` and `ID`"), "{e:?}");
        let e = check_names(&[col("id", ColType::I64), col("ID:1", ColType::I64)]).unwrap_err();
        assert!(e[0].contains("`id` and `ID`"), "{e:?}");
        assert!(check_names(&[col("a:1", ColType::I64)]).is_ok());
        let e = check_names(&[col("_HIGHWATER_window", ColType::I64)]).unwrap_err();
        assert!(e[0].contains("highwater's own"), "{e:?}");
        assert_eq!(
            stamped(&ok).last().unwrap().name,
            super::super::WINDOW_COLUMN
        );
    }

    #[test]
    fn schema_string_round_trips() {
        let f = vec![field("id", "long"), field("at", "timestamp")];
        assert_eq!(parse_schema_string(&schema_string(&f)), Some(f));
    }
}
