//! Reading a Delta table's log the way a reader does (PROTOCOL.md,
//! "Delta Log Entries", "Checkpoints", "Action Reconciliation"): from the
//! newest complete checkpoint, then the commits after it. Version 0 is
//! never assumed to exist: other engines checkpoint the table and delete
//! the commits before the checkpoint (`cleanup_metadata`, log retention),
//! and a writer that replays from 0 would find nothing and write a new
//! version 0 that no reader ever sees (issue 46).
//!
//! Pure functions only: which log files to read, given the names in
//! `_delta_log`, and a checkpoint's bytes as actions. The I/O is in
//! [`super`].

use bytes::Bytes;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

/// What a name in `_delta_log` is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogFile {
    /// `NNNNNNNNNNNNNNNNNNNN.json`
    Commit(i64),
    /// `N.checkpoint.parquet` (`part: None`) or
    /// `N.checkpoint.PPPPPPPPPP.TTTTTTTTTT.parquet` (part P of T).
    Checkpoint {
        version: i64,
        part: Option<(u32, u32)>,
    },
    /// `N.checkpoint.UUID.json|parquet`: a v2 checkpoint (a table feature
    /// highwater does not implement).
    V2Checkpoint(i64),
    /// Anything else: `_last_checkpoint`, `N.M.compacted.json` (log
    /// compaction files are optional to read), `.crc` files, temporaries.
    Other,
}

/// Parses one name in `_delta_log`.
pub fn parse_name(name: &str) -> LogFile {
    let Some((head, rest)) = name.split_once('.') else {
        return LogFile::Other;
    };
    if head.len() != 20 || !head.bytes().all(|b| b.is_ascii_digit()) {
        return LogFile::Other;
    }
    let Ok(version) = head.parse::<i64>() else {
        return LogFile::Other;
    };
    if rest == "json" {
        return LogFile::Commit(version);
    }
    let Some(cp) = rest.strip_prefix("checkpoint.") else {
        return LogFile::Other;
    };
    if cp == "parquet" {
        return LogFile::Checkpoint {
            version,
            part: None,
        };
    }
    let parts: Vec<&str> = cp.split('.').collect();
    match parts.as_slice() {
        [p, t, "parquet"]
            if p.len() == 10
                && t.len() == 10
                && p.bytes().chain(t.bytes()).all(|b| b.is_ascii_digit()) =>
        {
            match (p.parse(), t.parse()) {
                (Ok(p), Ok(t)) if p >= 1 && p <= t => LogFile::Checkpoint {
                    version,
                    part: Some((p, t)),
                },
                _ => LogFile::Other,
            }
        }
        [_uuid, "json" | "parquet"] => LogFile::V2Checkpoint(version),
        _ => LogFile::Other,
    }
}

/// Where replay starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Start {
    /// The checkpoint to read first: its version and its file names (one,
    /// or every part of a multi-part checkpoint, in part order).
    pub checkpoint: Option<(i64, Vec<String>)>,
    /// The first commit to replay after it.
    pub first_commit: i64,
}

/// Where to start replaying a log whose folder holds `names`: the newest
/// checkpoint whose parts are all present, else commit 0. `Err` names
/// what makes the log unreadable for highwater.
pub fn start(names: &[String]) -> Result<Start, String> {
    let mut commits = BTreeSet::new();
    // version → parts seen (total, part numbers, names)
    let mut multi: BTreeMap<i64, BTreeMap<(u32, u32), String>> = BTreeMap::new();
    let mut single: BTreeMap<i64, String> = BTreeMap::new();
    let mut v2 = Vec::new();
    for n in names {
        match parse_name(n) {
            LogFile::Commit(v) => {
                commits.insert(v);
            }
            LogFile::Checkpoint {
                version,
                part: None,
            } => {
                single.insert(version, n.clone());
            }
            LogFile::Checkpoint {
                version,
                part: Some(pt),
            } => {
                multi.entry(version).or_default().insert(pt, n.clone());
            }
            LogFile::V2Checkpoint(v) => v2.push(v),
            LogFile::Other => {}
        }
    }
    let mut complete: BTreeMap<i64, Vec<String>> =
        single.into_iter().map(|(v, n)| (v, vec![n])).collect();
    for (v, parts) in multi {
        // A multi-part checkpoint counts only with every part of one
        // total present (a writer may have died after some parts).
        let mut by_total: BTreeMap<u32, Vec<(u32, String)>> = BTreeMap::new();
        for ((p, t), n) in parts {
            by_total.entry(t).or_default().push((p, n));
        }
        for (t, ps) in by_total {
            if ps.len() == t as usize {
                complete
                    .entry(v)
                    .or_insert_with(|| ps.into_iter().map(|(_, n)| n).collect());
            }
        }
    }
    let newest_commit = commits.iter().next_back().copied();
    let newest_v2 = v2.iter().max().copied();
    let checkpoint = complete
        .into_iter()
        .rev()
        // A checkpoint past the newest commit is impossible in a sound
        // log; one at or below it is the state at its version.
        .find(|(v, _)| newest_commit.is_none_or(|c| *v <= c));
    if let Some(v) = newest_v2 {
        if checkpoint.as_ref().is_none_or(|(c, _)| *c < v) {
            return Err(format!(
                "its newest checkpoint (version {v}) is a v2 checkpoint (the `v2Checkpoint` table feature), which highwater does not read; land into a table without v2 checkpoints"
            ));
        }
    }
    match checkpoint {
        Some((v, files)) => Ok(Start {
            checkpoint: Some((v, files)),
            first_commit: v + 1,
        }),
        None => match commits.iter().next() {
            Some(&first) if first > 0 => Err(format!(
                "its oldest commit is version {first} and no checkpoint covers the versions before it (their log files were deleted); a reader cannot rebuild the table from what is left"
            )),
            _ => Ok(Start {
                checkpoint: None,
                first_commit: 0,
            }),
        },
    }
}

/// The actions a checkpoint file holds, each as `{"add": {...}}` and so on
/// (the commit file's shape), for the log replay.
pub fn checkpoint_actions(bytes: Bytes) -> Result<Vec<Value>, String> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let reader = SerializedFileReader::new(bytes).map_err(|e| e.to_string())?;
    let rows = reader.get_row_iter(None).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for row in rows {
        let row = row.map_err(|e| e.to_string())?.to_json_value();
        let Value::Object(fields) = row else {
            continue;
        };
        for (kind, action) in fields {
            if action.is_null() {
                continue;
            }
            out.push(json!({ kind: normalise(action) }));
        }
    }
    Ok(out)
}

/// A checkpoint action as a commit would hold it: optional fields that a
/// Parquet row reads as null are left out (a commit leaves them out).
fn normalise(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, normalise(v)))
                .collect(),
        ),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn names_in_the_log_are_told_apart() {
        assert_eq!(parse_name("00000000000000000007.json"), LogFile::Commit(7));
        assert_eq!(
            parse_name("00000000000000000010.checkpoint.parquet"),
            LogFile::Checkpoint {
                version: 10,
                part: None
            }
        );
        assert_eq!(
            parse_name("00000000000000000010.checkpoint.0000000002.0000000003.parquet"),
            LogFile::Checkpoint {
                version: 10,
                part: Some((2, 3))
            }
        );
        assert_eq!(
            parse_name("00000000000000000010.checkpoint.80a083e8-7026-4e79-81be-64bd76c43a11.json"),
            LogFile::V2Checkpoint(10)
        );
        for other in [
            "_last_checkpoint",
            "00000000000000000001.00000000000000000004.compacted.json",
            "00000000000000000003.crc",
            ".00000000000000000003.json.abc.tmp",
            "7.json",
        ] {
            assert_eq!(parse_name(other), LogFile::Other, "{other}");
        }
    }

    #[test]
    fn replay_starts_at_the_newest_complete_checkpoint() {
        let cp10 = "00000000000000000010.checkpoint.parquet";
        let s = start(&names(&[
            cp10,
            "00000000000000000010.json",
            "00000000000000000011.json",
            "00000000000000000012.json",
        ]))
        .unwrap();
        assert_eq!(s.checkpoint, Some((10, vec![cp10.to_string()])));
        assert_eq!(s.first_commit, 11);
        // Part 2 of 2 missing at 20: the complete one at 10 is used.
        let s = start(&names(&[
            cp10,
            "00000000000000000020.checkpoint.0000000001.0000000002.parquet",
            "00000000000000000020.json",
            "00000000000000000021.json",
        ]))
        .unwrap();
        assert_eq!(s.first_commit, 11);
        // Both parts: used, in part order.
        let s = start(&names(&[
            "00000000000000000020.checkpoint.0000000002.0000000002.parquet",
            "00000000000000000020.checkpoint.0000000001.0000000002.parquet",
            "00000000000000000020.json",
        ]))
        .unwrap();
        assert_eq!(
            s.checkpoint.unwrap().1,
            names(&[
                "00000000000000000020.checkpoint.0000000001.0000000002.parquet",
                "00000000000000000020.checkpoint.0000000002.0000000002.parquet"
            ])
        );
    }

    #[test]
    fn a_log_without_its_start_or_with_a_v2_checkpoint_is_refused() {
        let e = start(&names(&["00000000000000000005.json"])).unwrap_err();
        assert!(e.contains("oldest commit is version 5"), "{e}");
        let e = start(&names(&[
            "00000000000000000005.checkpoint.80a083e8-7026-4e79-81be-64bd76c43a11.parquet",
            "00000000000000000005.json",
        ]))
        .unwrap_err();
        assert!(e.contains("v2 checkpoint"), "{e}");
        // An empty log is a new table; a log from 0 replays from 0.
        assert_eq!(start(&[]).unwrap().first_commit, 0);
        let s = start(&names(&["00000000000000000000.json"])).unwrap();
        assert_eq!((s.checkpoint, s.first_commit), (None, 0));
    }
}
