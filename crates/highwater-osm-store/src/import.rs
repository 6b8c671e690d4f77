//! Import of an extract (`.osm.pbf` or `.osm`) into the primary store, and
//! replication state files.

use crate::model::{Element, Member, MemberKind, Node, Relation, Tags, Way};
use crate::nodeblocks::Entry;
use crate::store::{Extension, Store, StoreError};
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
pub fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Fsyncs the folder `path` lies in, so a rename into it is durable.
pub fn sync_parent(path: &Path) -> std::io::Result<()> {
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
///
/// Either way the new store is built unseen (a hidden file with no journal,
/// see [`Store::create_unpublished`]) and published whole: a first import
/// links its file into place only if no store appeared there meanwhile.
pub fn import_into(
    dir: &Path,
    extract: &Path,
    replace: bool,
    wait: bool,
    ext: &Extension,
) -> Result<ImportStats, ImportError> {
    import_into_after(dir, extract, replace, wait, 0, ext)
}

/// The meta row holding the extract's bounds: `west,south,east,north` in
/// 1e-7 degrees. The import records them; the sea
/// (`highwater_osm::coast`) is closed along them.
pub const BOUNDS_META: &str = "bounds";

/// `bounds` as [`BOUNDS_META`] holds them.
pub fn bounds_text(b: [i64; 4]) -> String {
    format!("{},{},{},{}", b[0], b[1], b[2], b[3])
}

/// `[osm] cache_mb`'s default: what an import may hold in memory.
pub const IMPORT_CACHE_MB_DEFAULT: u64 = 256;
/// The smallest `cache_mb` taken: below it the decoding of two PBF blobs
/// at once and SQLite's working set alone exceed it.
pub const IMPORT_CACHE_MB_MIN: u64 = 32;
/// The largest `cache_mb` taken (1 TiB): more is a typo.
pub const IMPORT_CACHE_MB_MAX: u64 = 1 << 20;

/// How an import runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImportOptions {
    /// `[osm] cache_mb`: the memory an import of a sorted extract may use,
    /// whatever the extract's size. A quarter goes to SQLite's page cache,
    /// a quarter to way references sorted before they spill to disk (three
    /// buffers of a twelfth, see [`crate::spill`]), about half to PBF
    /// blobs being decoded.
    pub cache_mb: u64,
    /// `[osm] flat_nodes`: untagged nodes' locations go to this flat file
    /// by id ([`crate::flatnodes`]) instead of the node blocks.
    pub flat_nodes: Option<PathBuf>,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            cache_mb: IMPORT_CACHE_MB_DEFAULT,
            flat_nodes: None,
        }
    }
}

/// The rule for choosing flat nodes (as osm2pgsql's advice: "for the
/// planet or very large extracts"), in two numbers. Both must hold:
///
/// Nodes from which flat nodes pay off in time: at a billion nodes the
/// node blocks' locations alone pass 10 GB (measured: about 10 bytes of
/// store per node location, bench/osm_flatnodes.sh), more than the page
/// cache of the machines this runs on, so a lookup is a B-tree descent to
/// disk, where the flat file's is one `pread`. Below it the blocks stay
/// cached and cost less disk.
pub const FLAT_NODES_NODES_MIN: u64 = 1_000_000_000;

/// Share of the id range the extract's nodes use, in percent, from which
/// the flat file's disk pays: it costs 8 bytes per id of the range (a 4 KiB
/// page for every 512 ids touched), so 8 / share bytes per node, 40 bytes
/// at 20%: within a few times what the node blocks take. The planet (10.5
/// billion nodes, ids to 13 billion) is at 80%; a continent's extract
/// (Europe: about a third of the planet's nodes) near 25%; a city's far
/// below 1%, where the file takes a page per node.
pub const FLAT_NODES_DENSITY_MIN_PERCENT: f64 = 20.0;

/// What an import says (stderr) about its node storage: which it used and
/// why, or a warning when the choice looks wrong for the extract's id
/// density. `(warning, text)`.
pub fn node_storage_note(stats: &ImportStats, flat: Option<&Path>) -> (bool, String) {
    let max_id = stats.node_id_max.unwrap_or(0).max(1);
    let density = 100.0 * stats.nodes as f64 / max_id as f64;
    let pays = stats.nodes >= FLAT_NODES_NODES_MIN && density >= FLAT_NODES_DENSITY_MIN_PERCENT;
    let facts = format!(
        "{} nodes over ids up to {max_id} ({density:.3}% of the id range used); flat nodes pay off from {FLAT_NODES_NODES_MIN} nodes and {FLAT_NODES_DENSITY_MIN_PERCENT}% (the book: docs/src/guides/osm.md, \"Flat nodes\")",
        stats.nodes
    );
    match (flat, pays) {
        (Some(p), true) => (
            false,
            format!("node storage: flat nodes in {} ([osm] flat_nodes): {facts}", p.display()),
        ),
        (Some(p), false) => {
            let disk = stats.flat_disk_bytes.unwrap_or(0);
            (
                true,
                format!(
                    "flat nodes in {} ([osm] flat_nodes) look wrong for this extract: {facts}; the file takes {disk} bytes on disk, {:.0} per node. Node blocks (no flat_nodes) would do",
                    p.display(),
                    disk as f64 / stats.nodes.max(1) as f64
                ),
            )
        }
        (None, false) => (false, format!("node storage: node blocks in the store: {facts}")),
        (None, true) => (
            true,
            format!("node blocks in the store, but this extract is where flat nodes pay off: {facts}. Set flat_nodes = \"PATH\" in [osm]"),
        ),
    }
}

impl ImportOptions {
    fn sqlite_cache_kib(&self) -> i64 {
        (self.cache_mb * 1024 / 4) as i64
    }

    fn refs_budget_bytes(&self) -> usize {
        ((self.cache_mb as usize) << 20) / 4
    }

    /// A decoded blob holds about 8,000 elements, a few MB; up to
    /// [`PBF_CHUNKS_QUEUED`] + 1 chunks are in memory at once.
    fn blobs_per_chunk(&self) -> usize {
        ((self.cache_mb / 24) as usize).clamp(2, PBF_BLOBS_PER_CHUNK)
    }
}

/// [`import_into`], with the new store's writer-lease tokens continuing
/// past `tokens_used`: the largest token any output of the project
/// recorded (an MBTiles file's), so that no output fences out the new
/// store's writers. A replaced store's own token is continued anyway.
pub fn import_into_after(
    dir: &Path,
    extract: &Path,
    replace: bool,
    wait: bool,
    tokens_used: i64,
    ext: &Extension,
) -> Result<ImportStats, ImportError> {
    import_into_with(
        dir,
        extract,
        replace,
        wait,
        tokens_used,
        &ImportOptions::default(),
        ext,
    )
}

/// [`import_into_after`] with options (`[osm] cache_mb`).
pub fn import_into_with(
    dir: &Path,
    extract: &Path,
    replace: bool,
    wait: bool,
    tokens_used: i64,
    opts: &ImportOptions,
    ext: &Extension,
) -> Result<ImportStats, ImportError> {
    check_extract(extract)?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |e: std::io::Error| ImportError::Refused {
            path,
            message: e.to_string(),
        }
    };
    let target = dir.join("store.db");
    if !target.exists() {
        std::fs::create_dir_all(dir).map_err(|e| ImportError::Refused {
            path: dir.to_path_buf(),
            message: format!("cannot create the store folder: {e}"),
        })?;
        sweep_dead_builds(dir);
        let tmp = dir.join(format!(".store.db.hw-new-{}", std::process::id()));
        let built = build(&tmp, extract, tokens_used, opts, ext);
        let stats = match built {
            Ok(stats) => stats,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                let _ = std::fs::remove_dir_all(spill_dir(&tmp));
                return Err(e);
            }
        };
        failpoint_before_publish();
        publish_flat(opts)?;
        // A hard link never replaces: if another import published a store
        // here meanwhile, this one is refused and changes nothing.
        let linked = std::fs::hard_link(&tmp, &target);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(ImportError::Refused {
                    path: dir.to_path_buf(),
                    message: "another import made a store here while this one ran; nothing was changed. Give --replace to replace it".into(),
                });
            }
            Err(e) => return Err(io(&target)(e)),
        }
        sync_parent(&target).map_err(io(dir))?;
        return Ok(stats);
    }
    // Without `--replace` the store is opened as any writer opens it, so a
    // store whose flat node file is not its own is refused, naming it.
    let mut old = if replace {
        Store::open_to_replace(dir, ext)?
    } else {
        Store::open(dir, ext)?
    };
    old.lease_writer(wait)?;
    if !replace && !old.is_empty()? {
        return Err(ImportError::Refused {
            path: dir.to_path_buf(),
            message: "the store already holds data; importing into it would merge two snapshots. Give --replace to build a new store from the extract and swap it in, or another --store".into(),
        });
    }
    sweep_leftovers(dir);
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    let new_dir = dir.with_file_name(format!(".{name}.hw-new-{}", std::process::id()));
    let aside = dir.with_file_name(format!(".{name}.hw-old-{}", std::process::id()));
    std::fs::create_dir_all(&new_dir).map_err(io(&new_dir))?;
    // The new store's writers continue the old one's tokens: outputs the
    // old store's writers fenced (an MBTiles file records its writer's
    // token) would otherwise refuse every writer of the new store until
    // its tokens caught up.
    let continued = old.writer_token().unwrap_or(0).max(tokens_used);
    let stats = match build(&new_dir.join("store.db"), extract, continued, opts, ext) {
        Ok(stats) => stats,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&new_dir);
            return Err(e);
        }
    };
    // Anyone who opened the old store and waits for its lease finds it
    // retired, not writable.
    // Already so when an earlier replace died before its swap: the mark
    // stands, and a write to a retired store is refused.
    if old.meta("retired")?.is_none() {
        old.write(|w| w.set_meta("retired", "replaced by osm import --replace"))?;
    }
    publish_flat(opts)?;
    failpoint_between_flat_and_store();
    std::fs::rename(dir, &aside).map_err(io(dir))?;
    std::fs::rename(&new_dir, dir).map_err(io(dir))?;
    sync_parent(dir).map_err(io(parent_dir(dir)))?;
    drop(old);
    std::fs::remove_dir_all(&aside).map_err(io(&aside))?;
    Ok(stats)
}

/// For the crash and overlap tests: `HIGHWATER_FAILPOINT=import-kill`
/// dies (SIGKILL) with the store built but not published;
/// `import-gate` waits while the file `HIGHWATER_FAILPOINT_GATE` names
/// exists (at most a minute), so another import can run meanwhile.
fn failpoint_before_publish() {
    match std::env::var("HIGHWATER_FAILPOINT").as_deref() {
        Ok("import-kill") => {
            // SAFETY: a signal to our own pid has no memory effects.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
        Ok("import-gate") => {
            if let Some(gate) = std::env::var_os("HIGHWATER_FAILPOINT_GATE") {
                let t0 = std::time::Instant::now();
                while Path::new(&gate).exists() && t0.elapsed().as_secs() < 60 {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
        }
        _ => {}
    }
}

/// For the crash test of `--replace` with flat nodes:
/// `HIGHWATER_FAILPOINT=import-kill-swap` dies (SIGKILL) with the new flat
/// node file in place and the old store, retired, not yet swapped out.
fn failpoint_between_flat_and_store() {
    if std::env::var("HIGHWATER_FAILPOINT").as_deref() == Ok("import-kill-swap") {
        // SAFETY: a signal to our own pid has no memory effects.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

/// Builds a store from an extract into a new, unpublished file, its
/// writer-lease tokens continuing after `tokens_used`.
fn build(
    file: &Path,
    extract: &Path,
    tokens_used: i64,
    opts: &ImportOptions,
    ext: &Extension,
) -> Result<ImportStats, ImportError> {
    let mut store = Store::create_unpublished(file, ext)?;
    let mut flat = new_flat(&mut store, opts)?;
    let result = match import_streaming(&mut store, extract, opts) {
        Ok(stats) => Ok(stats),
        Err(Streamed::Unsorted(_)) => {
            // The unpublished file has no journal, so its transaction
            // cannot roll back: start again with a new file.
            drop(store);
            std::fs::remove_file(file).map_err(|e| ImportError::Refused {
                path: file.to_path_buf(),
                message: format!("cannot remove the unfinished store: {e}"),
            })?;
            store = Store::create_unpublished(file, ext)?;
            flat = new_flat(&mut store, opts)?;
            import_in_memory(&mut store, extract, opts)
        }
        Err(Streamed::Failed(e)) => Err(e),
    };
    let mut stats = match result {
        Ok(s) => s,
        Err(e) => {
            if let Some((_, tmp, _)) = &flat {
                let _ = std::fs::remove_file(tmp);
            }
            return Err(e);
        }
    };
    if let Some((f, _, token)) = &flat {
        let final_path = opts.flat_nodes.as_deref().expect("flat nodes asked");
        // Straight into the unpublished file (no lease: a lease row taken
        // here would outlive the import in the published store).
        for (k, v) in [
            (
                crate::store::FLAT_NODES_META,
                final_path.display().to_string(),
            ),
            (crate::store::FLAT_TOKEN_META, token.to_string()),
        ] {
            store
                .conn
                .execute(
                    "INSERT OR REPLACE INTO meta(key, value) VALUES(?1, ?2)",
                    [k, v.as_str()],
                )
                .map_err(|e| store.err(e))?;
        }
        f.sync().map_err(StoreError::from)?;
        stats.flat_disk_bytes = Some(f.disk_bytes().map_err(StoreError::from)?);
    }
    store.continue_tokens(tokens_used)?;
    store.seal()?;
    Ok(stats)
}

/// The new flat node file an import with `[osm] flat_nodes` writes
/// (`PATH.hw-import`, emptied first: a killed import's is started over),
/// attached to the store being built, with its token in slot 0: (file,
/// its path, token).
fn new_flat(
    store: &mut Store,
    opts: &ImportOptions,
) -> Result<Option<(std::sync::Arc<crate::flatnodes::FlatNodes>, PathBuf, u64)>, ImportError> {
    let Some(p) = &opts.flat_nodes else {
        return Ok(None);
    };
    let tmp = flat_import_path(p);
    let _ = std::fs::remove_file(&tmp);
    let f = crate::flatnodes::FlatNodes::open(&tmp).map_err(StoreError::from)?;
    // A token no other import's file holds: the time and the process.
    let token = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ (u64::from(std::process::id()) << 40))
        | 1;
    f.set_token(token).map_err(StoreError::from)?;
    let f = std::sync::Arc::new(f);
    store.attach_flat(f.clone());
    Ok(Some((f, tmp, token)))
}

/// Where an import writes the new flat node file for `p`.
fn flat_import_path(p: &Path) -> PathBuf {
    let mut n = p.file_name().unwrap_or_default().to_os_string();
    n.push(".hw-import");
    p.with_file_name(n)
}

/// Puts an import's new flat node file in place (just before its store is
/// published): fsynced, renamed over the old, the folder synced. A store
/// still using the old file refuses it from then on (its token differs).
fn publish_flat(opts: &ImportOptions) -> Result<(), ImportError> {
    let Some(p) = &opts.flat_nodes else {
        return Ok(());
    };
    let tmp = flat_import_path(p);
    let io = |e: std::io::Error| ImportError::Refused {
        path: p.clone(),
        message: format!("cannot put the new flat node file in place: {e}"),
    };
    std::fs::rename(&tmp, p).map_err(io)?;
    let _ = std::fs::remove_file(crate::store::undo_path(p));
    sync_parent(p).map_err(io)
}

/// Removes hidden store files that killed first imports left in `dir`:
/// only those whose process is gone, so a running import keeps its file.
fn sweep_dead_builds(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = n.strip_prefix(".store.db.hw-new-") else {
            continue;
        };
        // `PID` (the store) or `PID.spill` (its scratch folder).
        let pid = rest.split('.').next().unwrap_or_default();
        let alive = pid
            .parse::<u32>()
            .is_ok_and(|p| Path::new(&format!("/proc/{p}")).exists());
        if !alive {
            let p = e.path();
            let _ = if p.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
        }
    }
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

/// What a PBF header says: replication sequence, timestamp (seconds),
/// base URL, and the extract's bounds (see [`ImportStats::bounds`]).
type Header = (Option<i64>, Option<i64>, Option<String>, Option<[i64; 4]>);

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
    /// The extract's bounds, in 1e-7 degrees (west, south, east, north):
    /// the PBF header's bounding box when it has one, else the extent of
    /// its nodes. The sea (`highwater_osm::coast`) is closed along them.
    pub bounds: Option<[i64; 4]>,
    /// The extent of the extract's nodes, as `bounds`.
    pub extent: Option<[i64; 4]>,
    /// The largest node id (the id range flat nodes would span).
    pub node_id_max: Option<i64>,
    /// With flat nodes: the file's bytes on disk after the import.
    pub flat_disk_bytes: Option<u64>,
}

impl ImportStats {
    /// Grows the node extent (used when the header gives no bounds).
    fn extend(&mut self, e: &Element) {
        if let Element::Node(n) = e {
            self.node_id_max = Some(self.node_id_max.map_or(n.id, |m| m.max(n.id)));
            if let (Some(lat), Some(lon)) = (n.lat_e7, n.lon_e7) {
                let (lat, lon) = (lat as i64, lon as i64);
                let b = self.extent.get_or_insert([lon, lat, lon, lat]);
                *b = [b[0].min(lon), b[1].min(lat), b[2].max(lon), b[3].max(lat)];
            }
        }
    }
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
/// [`crate::model::ID_ABS_MAX`] or negative (issue 50).
fn id_out_of_range(e: &Element) -> Option<i64> {
    let ok = |i: i64| i >= 0 && crate::model::id_in_range(i);
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

/// Why [`id_out_of_range`]'s id is refused.
fn id_refused(e: &Element, id: i64) -> String {
    if id < 0 {
        format!(
            "{}: id {id} is negative: {}; nothing was imported",
            e.key(),
            crate::model::NEGATIVE_ID_ADVICE
        )
    } else {
        format!(
            "{}: id {id} is beyond ±2^60, the largest id highwater stores; nothing was imported",
            e.key()
        )
    }
}

fn count(stats: &mut ImportStats, e: &Element) {
    stats.extend(e);
    match e {
        Element::Node(_) => stats.nodes += 1,
        Element::Way(_) => stats.ways += 1,
        Element::Relation(_) => stats.relations += 1,
    }
}

/// Nodes an import holds in memory before writing them as blocks: 16
/// bytes each plus the ways through them, so 2^28 nodes (about 8 GB with
/// their references) is the most one machine should be asked for. A
/// larger extract is the planet's case, which needs flat nodes
/// ([`crate::flatnodes`]) and is refused with that said.
pub const IMPORT_NODES_MAX: usize = 1 << 28;

/// What an import gathers before writing: the writes are then sorted bulk
/// inserts (node blocks, see [`crate::nodeblocks`]).
#[derive(Default)]
struct Bulk {
    /// (id, lat, lon) in arrival order.
    nodes: Vec<(i64, i32, i32)>,
    node_tags: std::collections::HashMap<i64, Tags>,
    ways: Vec<Way>,
    relations: Vec<Relation>,
    stats: ImportStats,
}

impl Bulk {
    fn add(&mut self, e: Element, path: &Path) -> Result<(), StoreError> {
        if let Some(id) = id_out_of_range(&e) {
            return Err(StoreError::Corrupt {
                path: path.to_path_buf(),
                what: id_refused(&e, id),
            });
        }
        count(&mut self.stats, &e);
        match e {
            Element::Node(n) => {
                let (Some(lat), Some(lon)) = (n.lat_e7, n.lon_e7) else {
                    return Err(StoreError::Corrupt {
                        path: path.to_path_buf(),
                        what: format!("n{} has no location; nothing was imported", n.id),
                    });
                };
                if self.nodes.len() >= IMPORT_NODES_MAX {
                    return Err(StoreError::Corrupt {
                        path: path.to_path_buf(),
                        what: format!("the extract holds more than {IMPORT_NODES_MAX} nodes, more than an import keeps in memory: an unsorted extract is imported in memory; sort it with `osmium sort` and it is imported in bounded memory (`[osm] cache_mb`); nothing was imported"),
                    });
                }
                self.nodes.push((n.id, lat, lon));
                if n.tags.is_empty() {
                    // A repeated id: the last copy wins, as it would in a
                    // diff.
                    if !self.node_tags.is_empty() {
                        self.node_tags.remove(&n.id);
                    }
                } else {
                    self.node_tags.insert(n.id, n.tags);
                }
            }
            Element::Way(w) => self.ways.push(w),
            Element::Relation(r) => self.relations.push(r),
        }
        Ok(())
    }

    /// The elements, in bulk: node blocks from the sorted nodes merged with
    /// the sorted way references, then the other rows, which a thread of
    /// their own encodes meanwhile.
    fn write_elements(&self, w: &mut crate::store::Writer<'_>) -> Result<(), StoreError> {
        std::thread::scope(|scope| {
            let rows = scope.spawn(|| self.encode_rows());
            let mut refs: Vec<(i64, i64)> = self
                .ways
                .iter()
                .flat_map(|w| w.refs.iter().map(move |&r| (r, w.id)))
                .collect();
            refs.sort_unstable();
            refs.dedup();
            let nodes = self.nodes.iter().map(|&(id, lat, lon)| Entry {
                id,
                loc: Some((lat, lon)),
                tagged: self.node_tags.contains_key(&id),
                ways: Vec::new(),
                flat: false,
            });
            w.put_node_blocks(crate::store::Entries(crate::store::merge_refs(
                nodes,
                refs.iter().copied(),
            )))?;
            drop(refs);
            let rows = rows.join().expect("the encoding thread does not panic");
            w.put_rows(&rows)
        })
    }

    /// Node tags, ways and relations as the store's rows, in id order.
    fn encode_rows(&self) -> crate::store::BulkRows {
        use crate::store::{refs_blob, tags_text};
        let mut node_tags: Vec<(i64, String)> = self
            .node_tags
            .par_iter()
            .filter_map(|(id, t)| tags_text(t).map(|t| (*id, t)))
            .collect();
        node_tags.par_sort_unstable_by_key(|t| t.0);
        let ways = self
            .ways
            .par_iter()
            .map(|w| (w.id, refs_blob(&w.refs), tags_text(&w.tags)))
            .collect();
        crate::store::BulkRows {
            node_tags,
            ways,
            relations: self.relations.clone(),
        }
    }

    /// Writes everything gathered, in `w`'s transaction. No shapes index:
    /// the first dataset that needs one builds it (`osm tiles build`
    /// always rebuilds it, so building it here too did the work twice).
    fn finish(mut self, w: &mut crate::store::Writer<'_>) -> Result<ImportStats, StoreError> {
        // Extracts come sorted by id; a repeated id keeps its last copy.
        last_of_each(&mut self.nodes, |n| n.0);
        last_of_each(&mut self.ways, |w| w.id);
        last_of_each(&mut self.relations, |r| r.id);
        self.write_elements(w)?;
        Ok(self.stats)
    }
}

/// Sorts by key (stably) and keeps the last of each run of equal keys.
fn last_of_each<T>(v: &mut Vec<T>, key: impl Fn(&T) -> i64) {
    if v.windows(2).all(|w| key(&w[0]) < key(&w[1])) {
        return;
    }
    v.sort_by_key(&key);
    v.reverse();
    v.dedup_by_key(|t| key(t));
    v.reverse();
}

/// Imports an extract into an empty store, in one transaction: the store
/// holds the whole extract or nothing of it. See [`import_with`].
pub fn import(store: &mut Store, path: &Path) -> Result<ImportStats, ImportError> {
    import_with(store, path, &ImportOptions::default())
}

/// Imports an extract into an empty store, in one transaction, in the
/// memory `opts` gives when the extract is sorted by type then id (as
/// planet files, Geofabrik's extracts and `osmium sort` leave them): nodes
/// and way references go to scratch files (see [`crate::spill`]), rows are
/// written in id order as they arrive, and node blocks are merged at the
/// end. An unsorted extract (or one with repeated ids) is imported in
/// memory instead, up to [`IMPORT_NODES_MAX`] nodes.
pub fn import_with(
    store: &mut Store,
    path: &Path,
    opts: &ImportOptions,
) -> Result<ImportStats, ImportError> {
    if !store.is_empty()? {
        return Err(ImportError::Refused {
            path: store.path().to_path_buf(),
            message: "the store already holds data: an import writes only into an empty store"
                .into(),
        });
    }
    match import_streaming(store, path, opts) {
        Ok(stats) => Ok(stats),
        Err(Streamed::Unsorted(why)) => {
            if store.unjournaled()? {
                return Err(ImportError::Refused {
                    path: path.to_path_buf(),
                    message: format!("the extract is not sorted by type then id ({why}); sort it with `osmium sort` first"),
                });
            }
            // The transaction rolled back: nothing of the first try stays.
            import_in_memory(store, path, opts)
        }
        Err(Streamed::Failed(e)) => Err(e),
    }
}

/// How a streaming import ended without a store.
enum Streamed {
    /// The extract is not sorted by type then id (what came after what):
    /// nothing was written.
    Unsorted(String),
    Failed(ImportError),
}

/// The scratch folder of an import building `store_file`.
pub(crate) fn spill_dir(store_file: &Path) -> PathBuf {
    let mut name = store_file.file_name().unwrap_or_default().to_os_string();
    name.push(".spill");
    store_file.with_file_name(name)
}

/// Rows gathered before they are written in one bulk insert.
const ROWS_PER_FLUSH: usize = 8192;

/// An import of a sorted extract as it streams in.
struct Stream<'p> {
    spill: crate::spill::Spill,
    rows: crate::store::BulkRows,
    row_count: usize,
    /// The last element's (type rank, id): the next must come after it.
    last: Option<(u8, i64)>,
    stats: ImportStats,
    path: &'p Path,
    spill_path: PathBuf,
    unsorted: Option<String>,
}

impl Stream<'_> {
    fn scratch(&self, e: std::io::Error) -> StoreError {
        StoreError::Corrupt {
            path: self.spill_path.clone(),
            what: format!("cannot write the import's scratch files (beside the new store; is the disk full?): {e}; nothing was imported"),
        }
    }

    fn add(&mut self, w: &mut crate::store::Writer<'_>, e: Element) -> Result<(), StoreError> {
        use crate::store::{refs_blob, tags_text};
        if let Some(id) = id_out_of_range(&e) {
            return Err(StoreError::Corrupt {
                path: self.path.to_path_buf(),
                what: id_refused(&e, id),
            });
        }
        let key = match &e {
            Element::Node(n) => (0, n.id),
            Element::Way(w) => (1, w.id),
            Element::Relation(r) => (2, r.id),
        };
        if let Some(last) = self.last.filter(|&l| key <= l) {
            let name = |(k, id): (u8, i64)| format!("{}{id}", ["n", "w", "r"][k as usize]);
            let why = format!("{} after {}", name(key), name(last));
            self.unsorted = Some(why.clone());
            return Err(StoreError::Corrupt {
                path: self.path.to_path_buf(),
                what: format!("not sorted: {why}"),
            });
        }
        self.last = Some(key);
        count(&mut self.stats, &e);
        match e {
            Element::Node(n) => {
                let (Some(lat), Some(lon)) = (n.lat_e7, n.lon_e7) else {
                    return Err(StoreError::Corrupt {
                        path: self.path.to_path_buf(),
                        what: format!("n{} has no location; nothing was imported", n.id),
                    });
                };
                let tags = tags_text(&n.tags);
                self.spill
                    .node(n.id, lat, lon, tags.is_some())
                    .map_err(|e| self.scratch(e))?;
                if let Some(t) = tags {
                    self.rows.node_tags.push((n.id, t));
                }
            }
            Element::Way(way) => {
                for &r in &way.refs {
                    self.spill.way_ref(r, way.id).map_err(|e| self.scratch(e))?;
                }
                self.rows
                    .ways
                    .push((way.id, refs_blob(&way.refs), tags_text(&way.tags)));
            }
            Element::Relation(r) => self.rows.relations.push(r),
        }
        self.row_count += 1;
        if self.row_count >= ROWS_PER_FLUSH {
            self.flush(w)?;
        }
        Ok(())
    }

    fn flush(&mut self, w: &mut crate::store::Writer<'_>) -> Result<(), StoreError> {
        w.put_rows(&self.rows)?;
        self.rows = crate::store::BulkRows::default();
        self.row_count = 0;
        Ok(())
    }

    /// Writes what is left and the node blocks.
    fn finish(mut self, w: &mut crate::store::Writer<'_>) -> Result<ImportStats, StoreError> {
        self.flush(w)?;
        failpoint("import-kill-blocks");
        let spill_path = self.spill_path.clone();
        let scratch = |e: std::io::Error| StoreError::Corrupt {
            path: spill_path.clone(),
            what: format!("cannot read the import's scratch files: {e}; nothing was imported"),
        };
        let mut merged = self.spill.finish().map_err(scratch)?;
        w.put_node_blocks(&mut merged)?;
        if let Some(e) = merged.error.take() {
            return Err(scratch(e));
        }
        Ok(self.stats)
    }
}

/// Dies (SIGKILL) where the test's `HIGHWATER_FAILPOINT` names `name`.
fn failpoint(name: &str) {
    if std::env::var("HIGHWATER_FAILPOINT").as_deref() == Ok(name) {
        // SAFETY: a signal to our own pid has no memory effects.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

/// The meta rows every import writes, in its transaction.
fn write_meta(
    w: &mut crate::store::Writer<'_>,
    path: &Path,
    stats: &ImportStats,
) -> Result<(), StoreError> {
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
        // An extract's header may carry credentials: never stored.
        w.set_meta("replication_url", &crate::redact::redact_url(u))?;
    }
    if let Some(b) = stats.bounds.or(stats.extent) {
        w.set_meta(BOUNDS_META, &bounds_text(b))?;
    }
    Ok(())
}

fn nothing_to_import(path: &Path) -> ImportError {
    ImportError::Refused {
        path: path.to_path_buf(),
        message: "the extract holds no element: nothing to import".into(),
    }
}

/// The streaming import of a sorted extract (see [`import_with`]).
fn import_streaming(
    store: &mut Store,
    path: &Path,
    opts: &ImportOptions,
) -> Result<ImportStats, Streamed> {
    let spill_path = spill_dir(store.path());
    let spill =
        crate::spill::Spill::create(&spill_path, opts.refs_budget_bytes()).map_err(|e| {
            Streamed::Failed(ImportError::Refused {
                path: spill_path.clone(),
                message: format!("cannot create the import's scratch folder: {e}"),
            })
        })?;
    store
        .set_cache_kib(opts.sqlite_cache_kib())
        .map_err(|e| Streamed::Failed(e.into()))?;
    let mut stream = Stream {
        spill,
        rows: Default::default(),
        row_count: 0,
        last: None,
        stats: ImportStats::default(),
        path,
        spill_path: spill_path.clone(),
        unsorted: None,
    };
    let is_pbf = path.to_string_lossy().ends_with(".pbf");
    let mut unsorted = None;
    let result = store.write_then(|w| -> Result<ImportStats, ImportError> {
        let read = if is_pbf {
            read_pbf(path, opts.blobs_per_chunk(), &mut stream, |s, e| {
                s.add(w, e)
            })
        } else {
            let mut err = None;
            read_osm(path, |e| {
                if err.is_none() {
                    err = stream.add(w, e).err();
                }
                Ok(())
            })?;
            match err {
                Some(e) => Err(e.into()),
                None => Ok(()),
            }
        };
        if let Err(e) = read {
            unsorted = stream.unsorted.take();
            return Err(e);
        }
        let s = &stream.stats;
        if s.nodes + s.ways + s.relations == 0 {
            return Err(nothing_to_import(path));
        }
        let stats = stream.finish(w)?;
        write_meta(w, path, &stats)?;
        Ok(stats)
    });
    let _ = std::fs::remove_dir_all(&spill_path);
    let _ = store.set_cache_kib(crate::store::STORE_CACHE_KIB);
    match (result, unsorted) {
        (Ok(stats), _) => Ok(stats),
        (Err(_), Some(why)) => Err(Streamed::Unsorted(why)),
        (Err(e), None) => Err(Streamed::Failed(e)),
    }
}

/// Imports an extract in memory: the way for an unsorted extract, whose
/// nodes cannot be merged with way references in one pass.
fn import_in_memory(
    store: &mut Store,
    path: &Path,
    opts: &ImportOptions,
) -> Result<ImportStats, ImportError> {
    let is_pbf = path.to_string_lossy().ends_with(".pbf");
    let mut bulk = Bulk::default();
    if !is_pbf {
        let mut err = None;
        read_osm(path, |e| {
            if err.is_none() {
                if let Err(e) = bulk.add(e, path) {
                    err = Some(e);
                }
            }
            Ok(())
        })?;
        if let Some(e) = err {
            return Err(e.into());
        }
    } else {
        read_pbf(path, opts.blobs_per_chunk(), &mut bulk, |b, e| {
            b.add(e, path)
        })?;
    }
    let stats = &bulk.stats;
    if stats.nodes + stats.ways + stats.relations == 0 {
        return Err(nothing_to_import(path));
    }
    let stats = store.write(|w| {
        let stats = bulk.finish(w)?;
        write_meta(w, path, &stats)?;
        Ok(stats)
    })?;
    Ok(stats)
}

/// Somewhere a PBF file's contents go: the header's replication facts,
/// then each element.
trait PbfSink {
    fn stats(&mut self) -> &mut ImportStats;
}

impl PbfSink for Bulk {
    fn stats(&mut self) -> &mut ImportStats {
        &mut self.stats
    }
}

impl PbfSink for Stream<'_> {
    fn stats(&mut self) -> &mut ImportStats {
        &mut self.stats
    }
}

/// Reads a PBF file into `sink` through `add`: a thread decodes chunks of
/// `blobs_per_chunk` blobs in parallel and hands them over a channel of
/// [`PBF_CHUNKS_QUEUED`], so decoding the next chunk overlaps gathering
/// this one.
fn read_pbf<S: PbfSink>(
    path: &Path,
    blobs_per_chunk: usize,
    sink: &mut S,
    mut add: impl FnMut(&mut S, Element) -> Result<(), StoreError>,
) -> Result<(), ImportError> {
    let bad = |message: String| ImportError::Pbf {
        path: path.to_path_buf(),
        message,
    };
    let reader = osmpbf::BlobReader::from_path(path).map_err(|e| bad(e.to_string()))?;
    let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Vec<Decoded>, String>>(PBF_CHUNKS_QUEUED);
    std::thread::scope(|scope| -> Result<(), ImportError> {
        scope.spawn(move || {
            let mut blobs = reader;
            loop {
                let chunk: Result<Vec<osmpbf::Blob>, _> =
                    blobs.by_ref().take(blobs_per_chunk).collect();
                let chunk = match chunk {
                    Ok(c) if c.is_empty() => return,
                    Ok(c) => c,
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let decoded: Vec<Decoded> = chunk.par_iter().map(decode_blob).collect();
                // A closed channel: the reader stopped on an error.
                if tx.send(Ok(decoded)).is_err() {
                    return;
                }
            }
        });
        for chunk in rx {
            for d in chunk.map_err(&bad)? {
                let (header, elements) = d.map_err(&bad)?;
                if let Some((seq, ts, url, bounds)) = header {
                    let stats = sink.stats();
                    stats.sequence = seq;
                    stats.timestamp = ts;
                    stats.replication_url = url;
                    stats.bounds = bounds;
                }
                for e in elements {
                    add(sink, e)?;
                }
            }
        }
        Ok(())
    })
}

/// Chunks decoded ahead of the gatherer: bounds memory to this many
/// chunks of [`PBF_BLOBS_PER_CHUNK`] blobs.
pub const PBF_CHUNKS_QUEUED: usize = 2;

fn decode_blob(b: &osmpbf::Blob) -> Decoded {
    match b.decode().map_err(|e| e.to_string())? {
        osmpbf::BlobDecode::OsmHeader(h) => Ok((
            Some((
                h.osmosis_replication_sequence_number(),
                h.osmosis_replication_timestamp(),
                h.osmosis_replication_base_url().map(str::to_string),
                h.bbox().map(|b| {
                    let e7 = |v: f64| (v * 1e7).round() as i64;
                    [
                        e7(b.left),
                        e7(b.bottom.min(b.top)),
                        e7(b.right),
                        e7(b.top.max(b.bottom)),
                    ]
                }),
            )),
            Vec::new(),
        )),
        osmpbf::BlobDecode::OsmData(block) => Ok((None, pbf_elements(&block)?)),
        osmpbf::BlobDecode::Unknown(_) => Ok((None, Vec::new())),
    }
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
