//! Containers compared as data (issue 49): a second authority behind the
//! byte hash. A GeoPackage that was `VACUUM`ed or re-exported, a Parquet
//! file rewritten with another compression, a `.gz` with a new header mtime
//! have new bytes and the same data; a stage with `compare = "data"` does
//! not re-run for them.
//!
//! The byte hash stays the first check: a file whose bytes are unchanged
//! costs exactly what it costs under `compare = "bytes"`. Only when the
//! bytes differ is the file read as data, and the result is recorded with
//! the byte hash in one [`Algo::Data1`] digest (128 bits of each), so the
//! next plan of the same bytes is quick again.
//!
//! One module per format behind one trait, [`DataDigest`]; a format is
//! recognised by its leading bytes, not its name (an `.xlsx` is a zip). A new
//! format is one file and one line in [`FORMATS`]. A file of no known format,
//! or one that cannot be read as its format, is compared by its bytes, and
//! the plan says so in a note.

use crate::error::FilesError;
use highwater_core::evidence::{Algo, Digest};
use std::io::{self, Read};
use std::path::Path;

mod gzip;
mod parquet;
mod rows;
mod sqlite;
mod zip;

pub use rows::Rows;

/// How a stage compares an input whose bytes changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// The bytes are the data (the default).
    #[default]
    Bytes,
    /// Read as data by its format; `order` says whether row order counts
    /// (Parquet only: SQLite tables have no order).
    Data { order: Order },
}

/// Whether the order of rows is part of the data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Order {
    #[default]
    Ordered,
    Free,
}

/// A stage's `compare` setting: a mode for all inputs, or modes by glob.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CompareSpec {
    /// The mode of inputs no glob matches.
    pub default: Mode,
    /// (glob over the item's path, mode): the longest matching glob wins.
    pub globs: Vec<(String, Mode)>,
}

impl CompareSpec {
    /// Whether any input may be compared as data.
    pub fn any_data(&self) -> bool {
        self.default != Mode::Bytes || self.globs.iter().any(|(_, m)| *m != Mode::Bytes)
    }
}

/// Reads a stage's `compare` value: `"bytes"`, `"data"`, or a table of
/// glob -> mode, where a mode is `"bytes"`, `"data"` or a table such as
/// `{ mode = "data", order = "free" }`. The error says what is allowed.
pub fn parse_spec(v: &toml::Value) -> Result<CompareSpec, String> {
    match v {
        toml::Value::String(_) => Ok(CompareSpec {
            default: parse_mode(v)?,
            globs: Vec::new(),
        }),
        toml::Value::Table(t) => {
            let mut globs = Vec::new();
            for (g, m) in t {
                globset::Glob::new(g).map_err(|e| format!("{g:?} is not a glob: {e}"))?;
                globs.push((g.clone(), parse_mode(m).map_err(|e| format!("{g:?}: {e}"))?));
            }
            Ok(CompareSpec {
                default: Mode::Bytes,
                globs,
            })
        }
        other => Err(format!(
            "{} is not understood; write \"bytes\" (the default), \"data\", or a table of glob = mode such as {{ \"data/*.gpkg\" = \"data\" }}",
            show(other)
        )),
    }
}

/// [`parse_spec`] for a declaration in JSON (the Python package's).
pub fn parse_spec_json(v: &serde_json::Value) -> Result<CompareSpec, String> {
    let t: toml::Value = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
    parse_spec(&t)
}

/// A value as the config wrote it, for a message.
fn show(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => format!("{s:?}"),
        other => format!("a {}", other.type_str()),
    }
}

fn parse_mode(v: &toml::Value) -> Result<Mode, String> {
    let help = "give \"bytes\", \"data\" or { mode = \"data\", order = \"free\" }";
    match v {
        toml::Value::String(s) if s == "bytes" => Ok(Mode::Bytes),
        toml::Value::String(s) if s == "data" => Ok(Mode::Data {
            order: Order::Ordered,
        }),
        toml::Value::Table(t) => {
            let mut mode = Mode::Data {
                order: Order::Ordered,
            };
            let mut order = Order::Ordered;
            for (k, v) in t {
                match (k.as_str(), v.as_str()) {
                    ("mode", Some("data")) => {}
                    ("mode", Some("bytes")) => mode = Mode::Bytes,
                    ("order", Some("ordered")) => order = Order::Ordered,
                    ("order", Some("free")) => order = Order::Free,
                    _ => {
                        return Err(format!(
                            "{k} = {} is not understood; {help} (order: \"ordered\", the default, or \"free\")",
                            show(v)
                        ))
                    }
                }
            }
            if let Mode::Data { .. } = mode {
                mode = Mode::Data { order };
            }
            Ok(mode)
        }
        other => Err(format!("{} is not a mode; {help}", show(other))),
    }
}

/// A [`CompareSpec`] with its globs compiled, for one stage.
#[derive(Clone, Debug, Default)]
pub struct CompareRules {
    default: Mode,
    /// Longest glob first, so the first match is the most specific.
    globs: Vec<(globset::GlobMatcher, Mode)>,
}

impl CompareRules {
    pub fn new(stage: &str, spec: &CompareSpec) -> Result<CompareRules, FilesError> {
        let mut globs = Vec::new();
        let mut sorted: Vec<&(String, Mode)> = spec.globs.iter().collect();
        sorted.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
        for (g, mode) in sorted {
            let m = globset::GlobBuilder::new(g)
                .literal_separator(true)
                .build()
                .map_err(|e| FilesError::Compare {
                    stage: stage.to_string(),
                    message: format!("{g:?} is not a glob: {e}"),
                })?
                .compile_matcher();
            globs.push((m, *mode));
        }
        Ok(CompareRules {
            default: spec.default,
            globs,
        })
    }

    /// The mode of one input, by its item path.
    pub fn mode_for(&self, item: &str) -> Mode {
        self.globs
            .iter()
            .find(|(g, _)| g.is_match(item))
            .map_or(self.default, |(_, m)| *m)
    }
}

/// Why a file could not be read as data.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("SQLite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("Parquet: {0}")]
    Parquet(#[from] ::parquet::errors::ParquetError),
    #[error("Arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    #[error("zip: {0}")]
    Zip(#[from] ::zip::result::ZipError),
    #[error("{0}")]
    Other(String),
}

/// One container format read as data.
pub trait DataDigest: Sync {
    /// Its name in notes and in the digest's domain.
    fn name(&self) -> &'static str;
    /// Whether a file starting with `head` (up to [`SNIFF_BYTES`]) is one.
    fn sniff(&self, head: &[u8]) -> bool;
    /// Feeds what a reader of the file sees into `h`; nothing of its layout.
    fn digest(&self, path: &Path, order: Order, h: &mut blake3::Hasher)
        -> Result<(), CompareError>;
}

/// The formats, tried in order on a file's first bytes.
pub static FORMATS: &[&dyn DataDigest] =
    &[&sqlite::Sqlite, &parquet::Parquet, &gzip::Gzip, &zip::Zip];

/// How many leading bytes [`DataDigest::sniff`] is given.
pub const SNIFF_BYTES: usize = 16;

/// The format of a file by its leading bytes, if known.
pub fn format_of(path: &Path) -> io::Result<Option<&'static dyn DataDigest>> {
    let mut head = Vec::with_capacity(SNIFF_BYTES);
    std::fs::File::open(path)?
        .take(SNIFF_BYTES as u64)
        .read_to_end(&mut head)?;
    Ok(FORMATS.iter().copied().find(|f| f.sniff(&head)))
}

/// The data digest of a file alone, and which format read it (`None`: no
/// known format, so its bytes stand for its data).
pub fn data_digest(
    path: &Path,
    order: Order,
) -> Result<(blake3::Hash, Option<&'static str>), CompareError> {
    let Some(format) = format_of(path)? else {
        return Ok((bytes_as_data(&blake3_of(path)?), None));
    };
    let mut h = blake3::Hasher::new();
    h.update(b"highwater data1\0");
    h.update(format.name().as_bytes());
    h.update(b"\0");
    format.digest(path, order, &mut h)?;
    Ok((h.finalize(), Some(format.name())))
}

/// BLAKE3 of every byte (mapped and on all cores for large files).
fn blake3_of(path: &Path) -> io::Result<blake3::Hash> {
    let d = crate::hash::blake3_file(path)?;
    Ok(blake3::Hash::from_bytes(*d.as_bytes()))
}

/// The data half for a file compared by its bytes (no known format, or
/// unreadable as its format): equal only to itself, never to a real data
/// digest.
fn bytes_as_data(bytes: &blake3::Hash) -> blake3::Hash {
    let mut h = blake3::Hasher::new();
    h.update(b"highwater data1 bytes\0");
    h.update(bytes.as_bytes());
    h.finalize()
}

/// The [`Algo::Data1`] digest of a file: the byte hash first; when it equals
/// the one in `prev` (a data digest on record), `prev` itself, without
/// reading the data. Returns a note when the file had to be compared by
/// its bytes.
pub fn data1_file(
    path: &Path,
    order: Order,
    prev: Option<&Digest>,
) -> io::Result<(Digest, Option<String>)> {
    let bytes = blake3_of(path)?;
    if let Some(p) = prev.filter(|p| p.algo() == Algo::Data1) {
        if p.byte_half() == Some(&bytes.as_bytes()[..16]) {
            return Ok((*p, None));
        }
    }
    let (data, note) = match data_digest(path, order) {
        Ok((d, _)) => (d, None),
        Err(e) => (
            bytes_as_data(&bytes),
            Some(format!(
                "compared by its bytes: cannot read it as data: {e}"
            )),
        ),
    };
    Ok((Digest::data1(&bytes, &data), note))
}

/// The formats to compute for an input, given what the planner asked for
/// ([`highwater_core::plan::digest_needed`]) and the input's mode: compared
/// as data, BLAKE3 becomes a data digest (which carries it); compared by
/// bytes, a data digest on record is checked by BLAKE3 (its byte half).
/// An input newly compared as data whose stat vouches for it gets its first
/// data digest now, so its next change can be judged as data.
pub fn needed(asked: Vec<Algo>, mode: Mode, prev: Option<&Digest>) -> Vec<Algo> {
    let mut out: Vec<Algo> = Vec::with_capacity(asked.len() + 1);
    let mut push = |a: Algo| {
        if !out.contains(&a) {
            out.push(a)
        }
    };
    match mode {
        Mode::Bytes => asked
            .into_iter()
            .for_each(|a| push(if a == Algo::Data1 { Algo::Blake3 } else { a })),
        Mode::Data { .. } => {
            let empty = asked.is_empty();
            asked
                .into_iter()
                .for_each(|a| push(if a == Algo::Blake3 { Algo::Data1 } else { a }));
            if empty && prev.is_some_and(|p| p.algo() == Algo::Blake3) {
                push(Algo::Data1);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_glob_decides_and_others_keep_the_default() {
        let data = Mode::Data {
            order: Order::Ordered,
        };
        let spec = CompareSpec {
            default: Mode::Bytes,
            globs: vec![
                ("data/**".into(), data),
                ("data/raw/*.gpkg".into(), Mode::Bytes),
            ],
        };
        let r = CompareRules::new("s", &spec).unwrap();
        assert_eq!(r.mode_for("data/roads.gpkg"), data);
        assert_eq!(r.mode_for("data/raw/roads.gpkg"), Mode::Bytes);
        assert_eq!(r.mode_for("other/roads.gpkg"), Mode::Bytes);
    }

    #[test]
    fn a_known_byte_hash_skips_the_data_and_a_new_one_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("plain.txt");
        std::fs::write(&p, "alpha").unwrap();
        let (d, note) = data1_file(&p, Order::Ordered, None).unwrap();
        assert_eq!(d.algo(), Algo::Data1);
        assert!(note.is_none());
        // A made-up record with the same byte half is returned as it is:
        // proof that the data was not read again.
        let mut fake = *d.as_bytes();
        fake[31] ^= 1;
        let fake = Digest::from_bytes(Algo::Data1, fake);
        assert_eq!(data1_file(&p, Order::Ordered, Some(&fake)).unwrap().0, fake);
        std::fs::write(&p, "omega").unwrap();
        assert_ne!(data1_file(&p, Order::Ordered, Some(&fake)).unwrap().0, fake);
    }
}
