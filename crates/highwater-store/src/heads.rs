//! The window-heads snapshot: one source's window heads as one file, read
//! in one pass, so that a no-change plan over landed windows does not
//! decode a SQLite row per window (issue 49: reading 1,000 heads from
//! their index was a fifth of such a plan, beside a file stage over 1,000
//! files that reads none).
//!
//! A cache, never the truth, on the same rule as the manifest snapshot
//! ([`crate::snapshot`]): taken only from what the SQLite store read, and
//! used only at the source's current **window token**, a random number
//! that SQLite triggers replace on every insert, update or delete of the
//! source's `windows` rows, in the writing transaction itself.
//!
//! Layout (little-endian): magic, token, source, the heads (bounds,
//! status, counts, token, recipe, error and the three strings of `extra` a
//! head keeps), and an XXH64 of all of it. A file that is short, damaged,
//! of another format, source or token is not used.

use crate::snapshot::{checksum, put_len, put_str, write_file, Reader};
use crate::{WindowRecord, WindowStatus};
use std::path::{Path, PathBuf};

/// The format's name and version: a change of layout changes it.
const MAGIC: &[u8; 8] = b"HWHEAD01";

/// The fewest bytes a head takes, to bound what a count may reserve.
const HEAD_BYTES_MIN: usize = 8 * 5 + 1 + 4 * 2 + 4;

/// The file that holds `source`'s heads, beside the state store `db`:
/// `<db>.heads/<hash of the source name>`.
pub fn path_for(db: &Path, source: &str) -> PathBuf {
    crate::snapshot::path_in(db, ".heads", source)
}

/// Writes `heads` (of `source`, as `window_heads` reads them) at `token`:
/// a temporary file renamed into place. Not synced: a torn file fails its
/// checksum.
pub fn write(path: &Path, token: i64, source: &str, heads: &[WindowRecord]) -> std::io::Result<()> {
    write_file(path, &encode(token, source, heads))
}

/// Reads `source`'s heads if the file is whole and at `token`.
pub fn read(path: &Path, token: i64, source: &str) -> Option<Vec<WindowRecord>> {
    decode(&std::fs::read(path).ok()?, token, source)
}

/// The strings of a head's `extra`: `digest`, `path`, `compacted.path`.
fn extra_strings(extra: &serde_json::Value) -> [Option<&str>; 3] {
    [
        extra["digest"].as_str(),
        extra["path"].as_str(),
        extra["compacted"]["path"].as_str(),
    ]
}

/// What a head keeps of a record's `extra` (or of the `head` column, which
/// has its shape): the three strings, any other type as absent, as
/// `as_str` reads it.
pub(crate) fn kept_extra(extra: &serde_json::Value) -> serde_json::Value {
    let [digest, path, compacted] = extra_strings(extra).map(|s| s.map(str::to_string));
    extra_of(digest, path, compacted)
}

/// A head's `extra` from its three strings.
fn extra_of(
    digest: Option<String>,
    path: Option<String>,
    compacted: Option<String>,
) -> serde_json::Value {
    let mut extra = serde_json::Map::new();
    if let Some(d) = digest {
        extra.insert("digest".into(), d.into());
    }
    if let Some(p) = path {
        extra.insert("path".into(), p.into());
    }
    if let Some(p) = compacted {
        extra.insert("compacted".into(), serde_json::json!({ "path": p }));
    }
    serde_json::Value::Object(extra)
}

pub fn encode(token: i64, source: &str, heads: &[WindowRecord]) -> Vec<u8> {
    let mut w = Vec::with_capacity(64 + heads.len() * (HEAD_BYTES_MIN + 160));
    w.extend_from_slice(MAGIC);
    w.extend_from_slice(&token.to_le_bytes());
    put_str(&mut w, source);
    put_len(&mut w, heads.len());
    for h in heads {
        for v in [h.start_us, h.end_us, h.rows, h.duration_ms, h.updated_at_ns] {
            w.extend_from_slice(&v.to_le_bytes());
        }
        w.push(match h.status {
            WindowStatus::Running => 0,
            WindowStatus::Published => 1,
            WindowStatus::Failed => 2,
        });
        put_str(&mut w, &h.token);
        put_str(&mut w, &h.recipe);
        put_opt(&mut w, h.error.as_deref());
        for s in extra_strings(&h.extra) {
            put_opt(&mut w, s);
        }
    }
    let sum = checksum(&w);
    w.extend_from_slice(&sum.to_le_bytes());
    w
}

pub fn decode(bytes: &[u8], token: i64, source: &str) -> Option<Vec<WindowRecord>> {
    let mut r = crate::snapshot::body(bytes, MAGIC, token, source)?;
    let n = r.len(HEAD_BYTES_MIN)?;
    let mut heads = Vec::with_capacity(n);
    for _ in 0..n {
        let (start_us, end_us) = (r.i64()?, r.i64()?);
        let (rows, duration_ms, updated_at_ns) = (r.i64()?, r.i64()?, r.i64()?);
        let status = match r.u8()? {
            0 => WindowStatus::Running,
            1 => WindowStatus::Published,
            2 => WindowStatus::Failed,
            _ => return None,
        };
        let token = r.str()?.to_string();
        let recipe = r.str()?.to_string();
        let error = opt(&mut r)?;
        let extra = extra_of(opt(&mut r)?, opt(&mut r)?, opt(&mut r)?);
        // What a load guarantees, checked: rising starts, ends after them.
        if end_us <= start_us
            || heads
                .last()
                .is_some_and(|p: &WindowRecord| p.start_us >= start_us)
        {
            return None;
        }
        heads.push(WindowRecord {
            source: source.to_string(),
            start_us,
            end_us,
            status,
            rows,
            files: serde_json::Value::Array(Vec::new()),
            duration_ms,
            token,
            recipe,
            updated_at_ns,
            error,
            extra,
        });
    }
    r.b.is_empty().then_some(heads)
}

fn put_opt(w: &mut Vec<u8>, s: Option<&str>) {
    match s {
        None => w.push(0),
        Some(s) => {
            w.push(1);
            put_str(w, s);
        }
    }
}

fn opt(r: &mut Reader<'_>) -> Option<Option<String>> {
    match r.u8()? {
        0 => Some(None),
        1 => Some(Some(r.str()?.to_string())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(start_us: i64, extra: serde_json::Value) -> WindowRecord {
        WindowRecord {
            source: "orders".into(),
            start_us,
            end_us: start_us + 10,
            status: WindowStatus::Published,
            rows: 3,
            files: serde_json::json!([]),
            duration_ms: 7,
            token: format!("t{start_us}"),
            recipe: "r1:ab".into(),
            updated_at_ns: 99,
            error: (start_us == 20).then(|| "unique key".to_string()),
            extra,
        }
    }

    #[test]
    fn heads_round_trip_and_refuse_what_is_not_theirs() {
        let heads = vec![
            head(
                0,
                extra_of(Some("rd1:3:ab".into()), Some("raw/a".into()), None),
            ),
            head(
                10,
                extra_of(Some("rd1:4:cd".into()), None, Some("raw/p".into())),
            ),
            head(20, extra_of(None, None, None)),
        ];
        let bytes = encode(5, "orders", &heads);
        assert_eq!(decode(&bytes, 5, "orders"), Some(heads.clone()));
        assert_eq!(decode(&bytes, 6, "orders"), None, "another token");
        assert_eq!(decode(&bytes, 5, "order"), None, "another source");
        for cut in [0, 1, 8, bytes.len() / 2, bytes.len() - 1] {
            assert_eq!(decode(&bytes[..cut], 5, "orders"), None, "cut at {cut}");
        }
        let mut flipped = bytes.clone();
        flipped[40] ^= 1;
        assert_eq!(decode(&flipped, 5, "orders"), None, "a flipped bit");
        assert_eq!(decode(&encode(1, "orders", &[]), 1, "orders"), Some(vec![]));
    }
}
