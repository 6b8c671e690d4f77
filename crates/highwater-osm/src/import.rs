//! Import of an extract (`.osm.pbf` or `.osm`) into the primary store, and
//! replication state files.

use crate::model::{Element, Member, MemberKind, Node, Relation, Tags, Way};
use crate::store::{Store, StoreError};
use crate::xml::{read_osm, OsmError};
use rayon::prelude::*;
use std::path::{Path, PathBuf};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ImportError {
    #[error("{path}: not a readable PBF file: {message}")]
    Pbf { path: PathBuf, message: String },
    #[error(transparent)]
    Xml(#[from] OsmError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{path}: {message}")]
    State { path: PathBuf, message: String },
    #[error("{}: {message}", path.display())]
    Refused { path: PathBuf, message: String },
}

/// The folder `path` lies in (`.` for a bare name).
pub(crate) fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Fsyncs the folder `path` lies in, so a rename into it is durable.
pub(crate) fn sync_parent(path: &Path) -> std::io::Result<()> {
    std::fs::File::open(parent_dir(path))?.sync_all()
}

/// Removes what killed runs left beside `target`: files or folders named
/// `.NAME.hw-tmp-*`, `.NAME.hw-old-*` or `.NAME.hw-new-*`. Call it only
/// under the writer lease, when no other run can be writing them.
pub fn sweep_leftovers(target: &Path) {
    let Some(name) = target.file_name() else {
        return;
    };
    let dir = parent_dir(target);
    let name = name.to_string_lossy();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        let leftover = ["hw-tmp-", "hw-old-", "hw-new-"]
            .iter()
            .any(|k| n.starts_with(&format!(".{name}.{k}")));
        if leftover {
            let p = e.path();
            let _ = if p.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
        }
    }
}

/// `osm import`: the only way a store is made. Into an empty place only;
/// with `replace`, the new store is built beside the old one and swapped
/// in, under the old one's writer lease, so a reader sees one or the other.
pub fn import_into(
    dir: &Path,
    extract: &Path,
    replace: bool,
    wait: bool,
) -> Result<ImportStats, ImportError> {
    check_extract(extract)?;
    // A first import, or --replace with nothing to replace: into the place
    // itself, which must hold no data.
    if !replace || !dir.join("store.db").exists() {
        let mut store = Store::create(dir)?;
        store.lease_writer(wait)?;
        if !store.is_empty()? {
            return Err(ImportError::Refused {
                path: dir.to_path_buf(),
                message: "the store already holds data; importing into it would merge two snapshots. Give --replace to build a new store from the extract and swap it in, or another --store".into(),
            });
        }
        return import(&mut store, extract);
    }
    let mut old = Store::open(dir)?;
    old.lease_writer(wait)?;
    sweep_leftovers(dir);
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    let new_dir = dir.with_file_name(format!(".{name}.hw-new-{}", std::process::id()));
    let aside = dir.with_file_name(format!(".{name}.hw-old-{}", std::process::id()));
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |e: std::io::Error| ImportError::Refused {
            path,
            message: e.to_string(),
        }
    };
    let stats = {
        let mut new = Store::create(&new_dir)?;
        let stats = import(&mut new, extract)?;
        new.checkpoint()?;
        stats
    };
    // Anyone who opened the old store and waits for its lease finds it
    // retired, not writable.
    old.write(|w| w.set_meta("retired", "replaced by osm import --replace"))?;
    std::fs::rename(dir, &aside).map_err(io(dir))?;
    std::fs::rename(&new_dir, dir).map_err(io(dir))?;
    sync_parent(dir).map_err(io(parent_dir(dir)))?;
    drop(old);
    std::fs::remove_dir_all(&aside).map_err(io(&aside))?;
    Ok(stats)
}

/// Refuses an extract that cannot be one: missing, empty, or a change file.
fn check_extract(path: &Path) -> Result<(), ImportError> {
    let bad = |message: &str| ImportError::Refused {
        path: path.to_path_buf(),
        message: message.to_string(),
    };
    let meta =
        std::fs::metadata(path).map_err(|e| bad(&format!("cannot read the extract: {e}")))?;
    if meta.len() == 0 {
        return Err(bad(
            "the file is empty (0 bytes): a failed download? Fetch the extract again",
        ));
    }
    let name = path.to_string_lossy();
    if name.ends_with(".osc") || name.ends_with(".osc.gz") {
        return Err(bad(
            "this is a change file: apply it with `highwater osm apply`; import takes an extract (.osm.pbf or .osm)",
        ));
    }
    Ok(())
}

/// What a PBF header says of replication: sequence, timestamp (seconds),
/// base URL.
type Header = (Option<i64>, Option<i64>, Option<String>);

/// A decoded blob: the header's replication facts, or elements.
type Decoded = Result<(Option<Header>, Vec<Element>), String>;

/// PBF blobs decoded at once: bounds the elements held in memory during an
/// import (a blob holds about 8,000 elements).
pub const PBF_BLOBS_PER_CHUNK: usize = 64;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImportStats {
    pub nodes: u64,
    pub ways: u64,
    pub relations: u64,
    /// The replication sequence and timestamp (seconds) from the header.
    pub sequence: Option<i64>,
    pub timestamp: Option<i64>,
    /// `osmosis_replication_base_url`: where `osm replicate` fetches from
    /// unless the config names a server.
    pub replication_url: Option<String>,
}

fn pbf_elements(block: &osmpbf::PrimitiveBlock) -> Result<Vec<Element>, String> {
    let tags = |it: &mut dyn Iterator<Item = (&str, &str)>| -> Tags {
        it.map(|(k, v)| (k.to_string(), v.to_string())).collect()
    };
    let mut out = Vec::new();
    let mut err = None;
    block.for_each_element(|e| match e {
        osmpbf::Element::Node(n) => out.push(Element::Node(Node {
            id: n.id(),
            lat_e7: Some(n.decimicro_lat()),
            lon_e7: Some(n.decimicro_lon()),
            tags: tags(&mut n.tags()),
        })),
        osmpbf::Element::DenseNode(n) => out.push(Element::Node(Node {
            id: n.id(),
            lat_e7: Some(n.decimicro_lat()),
            lon_e7: Some(n.decimicro_lon()),
            tags: tags(&mut n.tags()),
        })),
        osmpbf::Element::Way(w) => out.push(Element::Way(Way {
            id: w.id(),
            refs: w.refs().collect(),
            tags: tags(&mut w.tags()),
        })),
        osmpbf::Element::Relation(r) => {
            let mut members = Vec::new();
            for m in r.members() {
                let role = match m.role() {
                    Ok(s) => s.to_string(),
                    Err(e) => {
                        err = Some(format!("relation {}: {e}", r.id()));
                        String::new()
                    }
                };
                members.push(Member {
                    kind: match m.member_type {
                        osmpbf::RelMemberType::Node => MemberKind::Node,
                        osmpbf::RelMemberType::Way => MemberKind::Way,
                        osmpbf::RelMemberType::Relation => MemberKind::Relation,
                    },
                    id: m.member_id,
                    role,
                });
            }
            out.push(Element::Relation(Relation {
                id: r.id(),
                members,
                tags: tags(&mut r.tags()),
            }))
        }
    });
    match err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// The first id of an element (its own, a node ref, a member) beyond
/// [`crate::model::ID_ABS_MAX`].
fn id_out_of_range(e: &Element) -> Option<i64> {
    let ok = crate::model::id_in_range;
    match e {
        Element::Node(n) => (!ok(n.id)).then_some(n.id),
        Element::Way(w) => std::iter::once(w.id)
            .chain(w.refs.iter().copied())
            .find(|&i| !ok(i)),
        Element::Relation(r) => std::iter::once(r.id)
            .chain(r.members.iter().map(|m| m.id))
            .find(|&i| !ok(i)),
    }
}

fn count(stats: &mut ImportStats, e: &Element) {
    match e {
        Element::Node(_) => stats.nodes += 1,
        Element::Way(_) => stats.ways += 1,
        Element::Relation(_) => stats.relations += 1,
    }
}

/// Imports an extract into the store, in one transaction: the store holds
/// the whole extract or nothing of it. PBF blocks are decoded in parallel,
/// a bounded chunk at a time, and written in file order.
pub fn import(store: &mut Store, path: &Path) -> Result<ImportStats, ImportError> {
    let mut stats = ImportStats::default();
    let is_pbf = path.to_string_lossy().ends_with(".pbf");
    if !is_pbf {
        let mut elements = Vec::new();
        read_osm(path, |e| {
            elements.push(e);
            Ok(())
        })?;
        if elements.is_empty() {
            return Err(ImportError::Refused {
                path: path.to_path_buf(),
                message: "the extract holds no element: nothing to import".into(),
            });
        }
        store.write(|w| {
            for e in &elements {
                count(&mut stats, e);
                w.put(e)?;
            }
            w.set_meta("imported", &path.display().to_string())?;
            w.bump_generation()?;
            Ok(())
        })?;
        crate::derive::rebuild_shapes(store, &crate::features::LowZoom::none())?;
        return Ok(stats);
    }
    let bad = |message: String| ImportError::Pbf {
        path: path.to_path_buf(),
        message,
    };
    let reader = osmpbf::BlobReader::from_path(path).map_err(|e| bad(e.to_string()))?;
    let mut blobs = reader.peekable();
    store.write(|w| {
        loop {
            let chunk: Vec<osmpbf::Blob> = blobs
                .by_ref()
                .take(PBF_BLOBS_PER_CHUNK)
                .collect::<Result<_, _>>()
                .map_err(|e| StoreError::Corrupt {
                    path: path.to_path_buf(),
                    what: e.to_string(),
                })?;
            if chunk.is_empty() {
                break;
            }
            let decoded: Vec<Decoded> = chunk
                .par_iter()
                .map(|b| match b.decode().map_err(|e| e.to_string())? {
                    osmpbf::BlobDecode::OsmHeader(h) => Ok((
                        Some((
                            h.osmosis_replication_sequence_number(),
                            h.osmosis_replication_timestamp(),
                            h.osmosis_replication_base_url().map(str::to_string),
                        )),
                        Vec::new(),
                    )),
                    osmpbf::BlobDecode::OsmData(block) => Ok((None, pbf_elements(&block)?)),
                    osmpbf::BlobDecode::Unknown(_) => Ok((None, Vec::new())),
                })
                .collect();
            for d in decoded {
                let (header, elements) = d.map_err(|e| StoreError::Corrupt {
                    path: path.to_path_buf(),
                    what: e,
                })?;
                if let Some((seq, ts, url)) = header {
                    stats.sequence = seq;
                    stats.timestamp = ts;
                    stats.replication_url = url;
                }
                for e in &elements {
                    if let Some(id) = id_out_of_range(e) {
                        return Err(StoreError::Corrupt {
                            path: path.to_path_buf(),
                            what: format!(
                                "{}: id {id} is beyond ±2^60, the largest id highwater stores; nothing was imported",
                                e.key()
                            ),
                        });
                    }
                    count(&mut stats, e);
                    w.put(e)?;
                }
            }
        }
        if stats.nodes + stats.ways + stats.relations == 0 {
            return Err(StoreError::Corrupt {
                path: path.to_path_buf(),
                what: "the extract holds no element: nothing was imported".into(),
            });
        }
        w.set_meta("imported", &path.display().to_string())?;
        w.bump_generation()?;
        if let Some(seq) = stats.sequence {
            w.set_meta("sequence", &seq.to_string())?;
        }
        if let Some(ts) = stats.timestamp {
            w.set_meta(
                "timestamp",
                &highwater_core::window::format_rfc3339(ts * 1_000_000),
            )?;
        }
        if let Some(u) = &stats.replication_url {
            w.set_meta("replication_url", u)?;
        }
        Ok(())
    })?;
    // The shapes index lets a drain find the features of a dirty tile.
    crate::derive::rebuild_shapes(store, &crate::features::LowZoom::none())?;
    Ok(stats)
}

/// A replication state file (`sequenceNumber=`, `timestamp=` with escaped
/// colons).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct State {
    pub sequence: i64,
    pub timestamp: String,
    /// The state file it was read from, for messages.
    pub path: PathBuf,
}

pub fn read_state(path: &Path) -> Result<State, ImportError> {
    let text = std::fs::read_to_string(path).map_err(|e| ImportError::State {
        path: path.to_path_buf(),
        message: format!("cannot read: {e}"),
    })?;
    parse_state_text(&text, path)
}

/// A state file's text (`sequenceNumber=`, `timestamp=` with `\:`
/// escapes); `path` names it in errors (a file, or a URL).
pub fn parse_state_text(text: &str, path: &Path) -> Result<State, ImportError> {
    let bad = |message: String| ImportError::State {
        path: path.to_path_buf(),
        message,
    };
    let mut seq = None;
    let mut ts = None;
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("sequenceNumber=") {
            seq = Some(
                v.trim()
                    .parse()
                    .map_err(|_| bad(format!("sequenceNumber {v:?} is not a number")))?,
            );
        } else if let Some(v) = line.strip_prefix("timestamp=") {
            ts = Some(v.trim().replace("\\:", ":"));
        }
    }
    Ok(State {
        path: path.to_path_buf(),
        sequence: seq.ok_or_else(|| bad("no sequenceNumber".into()))?,
        timestamp: ts.ok_or_else(|| bad("no timestamp".into()))?,
    })
}

/// `AAA/BBB/CCC` for a sequence number, as replication directories lay it out.
pub fn sequence_path(seq: i64) -> String {
    let s = format!("{seq:09}");
    format!("{}/{}/{}", &s[0..3], &s[3..6], &s[6..9])
}
