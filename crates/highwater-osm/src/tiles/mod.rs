//! The vector-tile dataset: an MBTiles file per `[osm.tiles.NAME]` with
//! `mbtiles = "..."`, built whole by `build`, kept current by `drain`
//! (re-cutting the dirty tiles), and checked by `verify` (re-cutting tiles
//! from a full pass over the store and comparing them byte for byte).
//!
//! Order of a drain, per batch of dirty tiles: cut them from the store as
//! it is now, write them to the MBTiles file and commit, then remove them
//! from the dirty set. A crash between the two commits leaves tiles dirty
//! that are already current: they are cut again, which changes nothing.
//! The other order could lose a tile.
//!
//! The MBTiles file carries the recipe it was cut with (`highwater_recipe`
//! in its metadata); a drain that finds another recipe rebuilds the file
//! instead, and says so, so that new logic never mixes with old tiles.
//!
//! Layout: this file is the dataset (its [`Dataset`] impl, build, drain,
//! verify); [`config`]: its config section and status; [`cut`](mod@cut): one tile cut from features; [`ocean`]: the
//! kept sea; [`patch`]: a dirty tile patched from the file's copy; [`fresh`] and [`wal_index`]: serve's fresh tiles;
//! [`pmtiles`] (the format) and [`publish`] (`osm tiles publish`: the file as a PMTiles archive in a folder or a
//! bucket, kept current incrementally). Tile
//! schemas ([`crate::schema`], Shortbread 1.0 bundled) and the MVT
//! encoding ([`crate::mvt`]) are below the datasets, beside the
//! features. Expiry (which tiles a diff affects) reads the same schema
//! through [`crate::features`] and [`crate::derive`].
//!
//! [`Dataset`]: crate::dataset::Dataset

pub mod config;
pub mod cut;
pub mod fresh;
pub mod listing;
pub mod ocean;
pub mod patch;
pub mod pmtiles;
pub mod publish;
pub mod wal_index;

/// The schemas and the MVT encoding sit below the datasets (features read
/// them too); re-exported here under their former paths.
pub use crate::{mvt, schema};

use crate::derive::{rebuild_shapes, TileLayer};
use crate::features::{self, ElementKey, Feature};
use crate::schema::Placement;
use crate::store::{DrainOrder, Store, StoreError};
use crate::tiles::cut::cut;
use highwater_core::tile::Tile;
use rayon::prelude::*;
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Tiles keep one table of their own in the store, the kept sea
/// ([`ocean`]); their tiles are in the MBTiles file, their dirty set and
/// marker in the store's own tables.
pub const TABLES: &str = ocean::TABLES;

/// The kind, for the registry.
pub const KIND: crate::dataset::Kind = crate::dataset::Kind {
    name: "tiles",
    tables: &[TABLES, patch::TABLES, publish::TABLES],
    // After the keyed datasets: a tile drain may be bounded by --max.
    order: 1,
    configure: config::configure,
};

pub use config::TILES_CODE_VERSION;

/// One tile dataset.
#[derive(Clone, Debug)]
pub struct TileDataset {
    pub name: String,
    pub layer: TileLayer,
    /// Which features show at low zooms in any tile dataset of the config:
    /// the predicate of the low-zoom index (one, shared by all of them).
    pub low: std::sync::Arc<crate::features::LowZoom>,
    /// Tiles one diff may dirty at the layer's top zoom before expiry zooms
    /// out to coarser tiles: bounds the dirty set a single large edit (a
    /// country boundary) can create.
    pub tiles_affected_max: usize,
    pub recipe: String,
    /// The MBTiles file `osm tiles build` writes and `osm apply` keeps
    /// current; `None`: expiry only.
    pub mbtiles: Option<PathBuf>,
    /// Whether `osm apply` re-cuts the dirty tiles right away (true) or
    /// leaves them for `osm tiles drain`.
    pub drain_on_apply: bool,
    /// Above this share of the file's tiles dirty, a drain rebuilds the
    /// file instead: it bounds a drain's cost by a full pass's. Measured
    /// (bench/osm-datasets.sh): re-cutting 98% of Monaco's tiles took 0.6x
    /// a rebuild; re-cutting 2.6 times Liechtenstein's tile count (a
    /// three-year diff, old and new tiles) took 1.0x. The default, 1,
    /// rebuilds a little early, on the side that is always correct.
    pub drain_rebuild_share: f64,
    /// `osm tiles publish` (issue 50): above this share of dead bytes in
    /// a PMTiles archive's tile data (percent), the next publish rewrites
    /// it whole instead of appending.
    pub pmtiles_dead_share_max_pct: f64,
    /// PMTiles versions kept in the place after a publish, the current one
    /// included (at least 2).
    pub pmtiles_versions_kept: usize,
}

/// Keeps at most `max` tiles at the top zoom by taking parents; returns the
/// zoom it stopped at when it had to.
fn bound(tiles: BTreeSet<Tile>, layer: &TileLayer, max: usize) -> (BTreeSet<Tile>, Option<u8>) {
    let mut top: BTreeSet<(u32, u32)> = tiles
        .iter()
        .filter(|t| t.z == layer.zoom_max)
        .map(|t| (t.x, t.y))
        .collect();
    if top.len() <= max {
        return (tiles, None);
    }
    let mut z = layer.zoom_max;
    while top.len() > max && z > layer.zoom_min {
        top = top.iter().map(|&(x, y)| (x / 2, y / 2)).collect();
        z -= 1;
    }
    (
        highwater_core::tile::with_parents(&top, z, layer.zoom_min),
        Some(z),
    )
}

/// Tiles cut whole at once, and written per MBTiles transaction by a
/// build: bounds the features a batch holds decoded (each shown feature
/// once per batch) and the work a crash can make a build repeat.
pub const DRAIN_BATCH_TILES: usize = 512;

/// Tiles a drain takes per transaction (of the MBTiles file, then of the
/// store), the ones cut whole still cut [`DRAIN_BATCH_TILES`] at a time.
/// Larger than a build's: a patched tile holds only its touched features,
/// and each transaction costs its fsyncs (the MBTiles journal, the file,
/// the store's WAL). The 100M-node store's minutely diff dirties ~2,070
/// tiles: one transaction instead of five took its tiles drain from 422
/// to 360 ms (medians of 6 interleaved rounds) for ~10 MB more peak RSS.
pub const DRAIN_TRANSACTION_TILES: usize = 2048;

#[derive(Debug, Error)]
pub enum TilesError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("MBTiles {path}: {err}")]
    Mbtiles { path: PathBuf, err: rusqlite::Error },
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error(
        "[osm.tiles.{dataset}] has no `mbtiles = \"FILE\"`: add one to build and keep its tiles"
    )]
    NoFile { dataset: String },
    #[error("{path}: tile {tile} does not decode ({err}); run `highwater osm rebuild {dataset}`")]
    Corrupt {
        path: PathBuf,
        dataset: String,
        tile: String,
        err: String,
    },
    #[error("publishing to {target}: {message}")]
    Publish { target: String, message: String },
    #[error("dataset {dataset}: failed on purpose (HIGHWATER_FAILPOINT)")]
    Injected { dataset: String },
    #[error("MBTiles {}: a newer writer (lease token {theirs}, ours {ours}) wrote it; this process lost its writer lease and writes nothing more. Run the command again", path.display())]
    Fenced {
        path: PathBuf,
        theirs: i64,
        ours: i64,
    },
}

/// The metadata row that fences writes to an MBTiles file: the largest
/// writer-lease token that wrote it. A write under a smaller token is a
/// writer that lost its lease, and is refused.
pub const WRITER_TOKEN_KEY: &str = "highwater_writer_token";

/// The metadata key of the file's tile count, kept by every write
/// ([`Mbtiles::count`]).
pub const TILE_COUNT_KEY: &str = "highwater_tiles";

/// The writer token the dataset's MBTiles file records, if the file
/// exists and records one: an import continues the store's tokens past it.
pub fn recorded_writer_token(d: &TileDataset) -> Result<Option<i64>, TilesError> {
    match d.mbtiles.as_deref() {
        Some(p) => match Mbtiles::open(p)? {
            Some(mb) => mb.writer_token(),
            None => Ok(None),
        },
        None => Ok(None),
    }
}

/// An open MBTiles file (the standard schema: `metadata`, `tiles` with TMS
/// rows, gzip-compressed MVT).
pub struct Mbtiles {
    conn: Connection,
    path: PathBuf,
}

/// A stored tile's size unzipped, at most: past it the tile is refused as
/// damaged, never allocated (the gzip trailer states the size).
pub const TILE_BYTES_MAX: usize = 256 << 20;

thread_local! {
    // One compressor and decompressor per thread: their state is a few
    // hundred KB, too much to set up per tile.
    static DEFLATE: std::cell::RefCell<(libdeflater::Compressor, libdeflater::Decompressor)> =
        std::cell::RefCell::new((
            libdeflater::Compressor::new(libdeflater::CompressionLvl::default()),
            libdeflater::Decompressor::new(),
        ));
}

/// The MBTiles `attribution` every tile file carries (HTML, as the MBTiles
/// spec allows): what ODbL asks of a map made from OpenStreetMap data.
pub const OSM_ATTRIBUTION: &str =
    "<a href=\"https://www.openstreetmap.org/copyright\" target=\"_blank\">© OpenStreetMap contributors</a>";

/// A tile gzip'd at level 6 by libdeflate: zlib's ratio at twice its speed
/// (bench/README.md); its header has no time or name: equal tiles, equal
/// bytes.
pub(crate) fn gzip(b: &[u8]) -> Vec<u8> {
    DEFLATE.with_borrow_mut(|(c, _)| {
        let mut out = vec![0; c.gzip_compress_bound(b.len())];
        let n = c
            .gzip_compress(b, &mut out)
            .expect("the output holds the compression bound");
        out.truncate(n);
        out
    })
}

fn gunzip(b: &[u8]) -> std::io::Result<Vec<u8>> {
    let bad = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    let Some(trailer) = b.len().checked_sub(4).filter(|_| b.len() >= 18) else {
        return Err(bad(format!("{} bytes: too short for gzip", b.len())));
    };
    let size = u32::from_le_bytes(b[trailer..].try_into().expect("4 bytes")) as usize;
    if size > TILE_BYTES_MAX {
        return Err(bad(format!(
            "its trailer says {size} bytes unzipped, more than TILE_BYTES_MAX = {TILE_BYTES_MAX}"
        )));
    }
    DEFLATE.with_borrow_mut(|(_, d)| {
        let mut out = vec![0; size];
        let n = d
            .gzip_decompress(b, &mut out)
            .map_err(|e| bad(format!("not a gzip'd tile: {e}")))?;
        out.truncate(n);
        Ok(out)
    })
}

fn tms_row(t: Tile) -> u32 {
    (1u32 << t.z) - 1 - t.y
}

impl Mbtiles {
    fn err(&self, err: rusqlite::Error) -> TilesError {
        TilesError::Mbtiles {
            path: self.path.clone(),
            err,
        }
    }

    /// A new file with the standard schema and metadata. `seen` are the
    /// keys the features carry, listed as the layer's fields when the layer
    /// reads every key (readers such as GDAL build their columns from it).
    fn create(path: &Path, d: &TileDataset, seen: &BTreeSet<&str>) -> Result<Mbtiles, TilesError> {
        let conn = Connection::open(path).map_err(|err| TilesError::Mbtiles {
            path: path.to_path_buf(),
            err,
        })?;
        let mb = Mbtiles {
            conn,
            path: path.to_path_buf(),
        };
        mb.conn
            .execute_batch(
                "CREATE TABLE metadata(name TEXT, value TEXT);
                 CREATE UNIQUE INDEX name ON metadata(name);
                 CREATE TABLE tiles(zoom_level INTEGER, tile_column INTEGER, tile_row INTEGER, tile_data BLOB);
                 CREATE UNIQUE INDEX tile_index ON tiles(zoom_level, tile_column, tile_row);",
            )
            .map_err(|e| mb.err(e))?;
        let layers: Vec<serde_json::Value> = match &d.layer.schema {
            Some(schema) => schema
                .layers
                .iter()
                .map(|l| {
                    serde_json::json!({
                        "id": l.name,
                        "minzoom": l.zoom_min().max(d.layer.zoom_min),
                        "maxzoom": d.layer.zoom_max,
                        "fields": l.fields(),
                    })
                })
                .collect(),
            None => {
                let fields: BTreeMap<String, String> = match &d.layer.keys {
                    Some(k) => k.iter().map(|k| (k.clone(), "String".into())).collect(),
                    None => seen
                        .iter()
                        .map(|k| (k.to_string(), "String".into()))
                        .collect(),
                };
                vec![serde_json::json!({
                    "id": d.name, "minzoom": d.layer.zoom_min, "maxzoom": d.layer.zoom_max, "fields": fields,
                })]
            }
        };
        let json = serde_json::json!({ "vector_layers": layers });
        let kind = if d.layer.schema.is_some() {
            "baselayer"
        } else {
            "overlay"
        };
        for (k, v) in [
            ("name", d.name.clone()),
            ("format", "pbf".into()),
            ("type", kind.into()),
            ("minzoom", d.layer.zoom_min.to_string()),
            ("maxzoom", d.layer.zoom_max.to_string()),
            ("json", json.to_string()),
            ("highwater_recipe", d.recipe.clone()),
            // ODbL: every map made from the data says where it is from
            // (issue 50); readers (serve, martin, tileserver-gl) show it.
            ("attribution", OSM_ATTRIBUTION.into()),
        ]
        .into_iter()
        // The schema's name tells readers (serve's map style) what the
        // layers mean.
        .chain(
            d.layer
                .schema
                .as_ref()
                .map(|s| ("highwater_schema", s.name.clone())),
        ) {
            mb.conn
                .execute(
                    "INSERT INTO metadata(name, value) VALUES(?1, ?2)",
                    params![k, v],
                )
                .map_err(|e| mb.err(e))?;
        }
        Ok(mb)
    }

    /// Opens an existing file; `None` when there is none.
    pub fn open(path: &Path) -> Result<Option<Mbtiles>, TilesError> {
        if !path.exists() {
            return Ok(None);
        }
        let conn = Connection::open(path).map_err(|err| TilesError::Mbtiles {
            path: path.to_path_buf(),
            err,
        })?;
        Ok(Some(Mbtiles {
            conn,
            path: path.to_path_buf(),
        }))
    }

    pub fn metadata(&self, name: &str) -> Result<Option<String>, TilesError> {
        self.conn
            .query_row("SELECT value FROM metadata WHERE name = ?1", [name], |r| {
                r.get(0)
            })
            .optional()
            .map_err(|e| self.err(e))
    }

    /// A tile's MVT bytes (decompressed), if the file has it.
    pub fn get(&self, t: Tile) -> Result<Option<Vec<u8>>, TilesError> {
        let data: Option<Vec<u8>> = self
            .conn
            .query_row(
                "SELECT tile_data FROM tiles WHERE zoom_level = ?1 AND tile_column = ?2 AND tile_row = ?3",
                params![t.z, t.x, tms_row(t)],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))?;
        data.map(|d| {
            gunzip(&d).map_err(|err| TilesError::Io {
                path: self.path.clone(),
                err,
            })
        })
        .transpose()
    }

    /// The stored (gzip'd) bytes of each of `tiles` the file has.
    pub(crate) fn get_raw(&self, tiles: &[Tile]) -> Result<HashMap<Tile, Vec<u8>>, TilesError> {
        let mut st = self
            .conn
            .prepare_cached(
                "SELECT tile_data FROM tiles WHERE zoom_level = ?1 AND tile_column = ?2 AND tile_row = ?3",
            )
            .map_err(|e| self.err(e))?;
        let mut out = HashMap::with_capacity(tiles.len());
        for &t in tiles {
            let data: Option<Vec<u8>> = st
                .query_row(params![t.z, t.x, tms_row(t)], |r| r.get(0))
                .optional()
                .map_err(|e| self.err(e))?;
            if let Some(d) = data {
                out.insert(t, d);
            }
        }
        Ok(out)
    }

    /// The number of tiles in the file, as every write keeps it in the
    /// metadata (a drain's rebuild check must not count a file that grows
    /// with the world); counted for a file written before the count was
    /// kept.
    pub fn count(&self) -> Result<i64, TilesError> {
        match self.metadata(TILE_COUNT_KEY)?.and_then(|v| v.parse().ok()) {
            Some(n) => Ok(n),
            None => self
                .conn
                .query_row("SELECT count(*) FROM tiles", [], |r| r.get(0))
                .map_err(|e| self.err(e)),
        }
    }

    /// Every tile in the file, in (z, x, y) order.
    pub fn tiles(&self) -> Result<Vec<Tile>, TilesError> {
        let mut st = self
            .conn
            .prepare("SELECT zoom_level, tile_column, tile_row FROM tiles")
            .map_err(|e| self.err(e))?;
        let rows = st
            .query_map([], |r| {
                let z: u8 = r.get(0)?;
                let row: u32 = r.get(2)?;
                Ok(Tile {
                    z,
                    x: r.get(1)?,
                    y: (1u32 << z) - 1 - row,
                })
            })
            .map_err(|e| self.err(e))?;
        let mut v: Vec<Tile> = rows.collect::<Result<_, _>>().map_err(|e| self.err(e))?;
        v.sort();
        Ok(v)
    }

    /// Writes a batch in one transaction: a tile with bytes is replaced, one
    /// without is deleted (nothing shows in it any more).
    /// The writer token recorded in the file, if any.
    fn writer_token(&self) -> Result<Option<i64>, TilesError> {
        Ok(self
            .metadata(WRITER_TOKEN_KEY)?
            .and_then(|v| v.parse().ok()))
    }

    /// Writes a batch in one transaction, fenced by the writer-lease token:
    /// refused if a larger token wrote the file, and records ours. `existed`
    /// says which of the batch's tiles the file held before (the caller
    /// read them): the kept tile count moves by the tiles added less those
    /// deleted, in the same transaction.
    fn write(
        &mut self,
        batch: &[(Tile, Option<Vec<u8>>)],
        token: Option<i64>,
        existed: &dyn Fn(Tile) -> bool,
    ) -> Result<(), TilesError> {
        let path = self.path.clone();
        let e = |err| TilesError::Mbtiles {
            path: path.clone(),
            err,
        };
        // Compressed in parallel, before the write lock is taken.
        let zipped: Vec<Option<Vec<u8>>> = batch
            .par_iter()
            .map(|(_, data)| data.as_deref().map(gzip))
            .collect();
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(e)?;
        if let Some(ours) = token {
            let theirs = number_in(&tx, WRITER_TOKEN_KEY).map_err(e)?;
            if let Some(theirs) = theirs.filter(|t| *t > ours) {
                return Err(TilesError::Fenced { path, theirs, ours });
            }
            if theirs != Some(ours) {
                tx.execute(
                    "INSERT OR REPLACE INTO metadata(name, value) VALUES(?1, ?2)",
                    params![WRITER_TOKEN_KEY, ours.to_string()],
                )
                .map_err(e)?;
            }
        }
        {
            let mut put = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO tiles(zoom_level, tile_column, tile_row, tile_data) VALUES(?1, ?2, ?3, ?4)",
                )
                .map_err(e)?;
            let mut del = tx
                .prepare_cached(
                    "DELETE FROM tiles WHERE zoom_level = ?1 AND tile_column = ?2 AND tile_row = ?3",
                )
                .map_err(e)?;
            for ((t, _), data) in batch.iter().zip(&zipped) {
                match data {
                    Some(z) => put.execute(params![t.z, t.x, tms_row(*t), z]),
                    None => del.execute(params![t.z, t.x, tms_row(*t)]),
                }
                .map_err(e)?;
            }
        }
        let delta: i64 = batch
            .iter()
            .map(|(t, data)| i64::from(data.is_some()) - i64::from(existed(*t)))
            .sum();
        let count = match number_in(&tx, TILE_COUNT_KEY).map_err(e)? {
            Some(n) => n + delta,
            // A file from before the count: counted once, here.
            None => tx
                .query_row("SELECT count(*) FROM tiles", [], |r| r.get(0))
                .map_err(e)?,
        };
        tx.execute(
            "INSERT OR REPLACE INTO metadata(name, value) VALUES(?1, ?2)",
            params![TILE_COUNT_KEY, count.to_string()],
        )
        .map_err(e)?;
        tx.commit().map_err(e)
    }
}

/// A number the file's metadata keeps under `key`, read in `tx` (`None`:
/// absent or not a number).
fn number_in(tx: &rusqlite::Transaction<'_>, key: &str) -> rusqlite::Result<Option<i64>> {
    Ok(tx
        .query_row("SELECT value FROM metadata WHERE name = ?1", [key], |r| {
            r.get::<_, String>(0)
        })
        .optional()?
        .and_then(|v| v.parse().ok()))
}

fn path_of(d: &TileDataset) -> Result<&Path, TilesError> {
    d.mbtiles.as_deref().ok_or_else(|| TilesError::NoFile {
        dataset: d.name.clone(),
    })
}

fn failpoint(name: &str, dataset: &str) -> Result<(), TilesError> {
    let Some(v) = std::env::var_os("HIGHWATER_FAILPOINT") else {
        return Ok(());
    };
    let v = v.to_string_lossy();
    if v == format!("{name}:{dataset}") {
        if name.starts_with("kill") {
            // For the crash tests: die as a killed process dies.
            // SAFETY: a signal to our own pid has no memory effects.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
        return Err(TilesError::Injected {
            dataset: dataset.to_string(),
        });
    }
    Ok(())
}

/// The rebuild's view of a layer: every feature, its placements, and per
/// tile the features that show in it.
pub struct Rebuild {
    pub features: Vec<(ElementKey, Feature)>,
    pub placements: Vec<Vec<Placement>>,
    pub by_tile: BTreeMap<Tile, Vec<usize>>,
}

/// A full pass over the store: what every tile of the layer should hold.
pub fn rebuild_view(store: &Store, layer: &TileLayer) -> Result<Rebuild, StoreError> {
    let features = features::all(store, layer)?;
    let placements: Vec<Vec<Placement>> =
        features.par_iter().map(|(_, f)| layer.place(f)).collect();
    let mut by_tile: BTreeMap<Tile, Vec<usize>> = BTreeMap::new();
    for (i, ps) in placements.iter().enumerate() {
        if ps.is_empty() {
            continue;
        }
        for z in layer.zoom_min..=layer.zoom_max {
            for (x, y) in layer.signatures(ps, z).into_keys() {
                by_tile.entry(Tile { z, x, y }).or_default().push(i);
            }
        }
    }
    Ok(Rebuild {
        features,
        placements,
        by_tile,
    })
}

/// [`rebuild_view`] of `tiles` only: the same full pass over the store
/// (features assembled from nodes, not read from the shapes index), a page
/// at a time, keeping only the features some of `tiles` shows. Its memory
/// is what those tiles show, not the store: a sampled verify of the
/// 100M-node world holding every feature ran out of 24 GB.
pub fn rebuild_view_of(
    store: &Store,
    layer: &TileLayer,
    tiles: &BTreeSet<Tile>,
) -> Result<Rebuild, StoreError> {
    let zooms: BTreeSet<u8> = tiles.iter().map(|t| t.z).collect();
    store.snapshot(|s| {
        let mut pass = features::Pass::new(layer);
        let mut view = Rebuild {
            features: Vec::new(),
            placements: Vec::new(),
            by_tile: BTreeMap::new(),
        };
        while let Some(page) = pass.next_page(s)? {
            let placed: Vec<(ElementKey, Feature, Vec<Placement>)> = page
                .into_par_iter()
                .map(|(k, f)| {
                    let ps = layer.place(&f);
                    (k, f, ps)
                })
                .collect();
            for (k, f, ps) in placed {
                if ps.is_empty() {
                    continue;
                }
                let i = view.features.len();
                let mut shown = false;
                for &z in &zooms {
                    for (x, y) in layer.signatures(&ps, z).into_keys() {
                        let t = Tile { z, x, y };
                        if tiles.contains(&t) {
                            view.by_tile.entry(t).or_default().push(i);
                            shown = true;
                        }
                    }
                }
                if shown {
                    view.features.push((k, f));
                    view.placements.push(ps);
                }
            }
        }
        Ok(view)
    })
}

impl Rebuild {
    /// The tile as a rebuild cuts it.
    pub fn cut(&self, t: Tile, d: &TileDataset) -> Option<Vec<u8>> {
        let fs: Vec<(ElementKey, &[Placement])> = self
            .by_tile
            .get(&t)
            .map(|ix| {
                ix.iter()
                    .map(|&i| (self.features[i].0, self.placements[i].as_slice()))
                    .collect()
            })
            .unwrap_or_default();
        cut(t, &d.layer, &d.name, &fs)
    }
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct BuildReport {
    pub dataset: String,
    /// The store's features that some zoom of a tile dataset shows (the
    /// shapes index's; the sea counted).
    pub features: usize,
    pub tiles: usize,
    pub sequence: Option<i64>,
    /// Why a drain rebuilt instead, if it did.
    pub reason: Option<String>,
}

/// Cuts every tile of the dataset into a new MBTiles file, swaps it in
/// atomically, then empties the dirty set and sets the marker to the
/// store's sequence. Also rebuilds the shapes index: the always-working
/// path trusts no incremental state.
pub fn build(store: &mut Store, d: &TileDataset) -> Result<BuildReport, TilesError> {
    let path = path_of(d)?.to_path_buf();
    // Under the writer lease from the start: the rebuild's read and its
    // clearing of the dirty set must not interleave with another writer,
    // and only then are leftovers of killed builds safe to sweep.
    store.lease_writer(false)?;
    let token = store.writer_token();
    crate::import::sweep_leftovers(&path);
    rebuild_shapes(store, &d.low)?;
    // What the rebuild reads: diffs applied after this stay dirty for it.
    let (sequence, generation) = store.snapshot(|s| {
        Ok((
            s.meta("sequence")?.and_then(|q| q.parse::<i64>().ok()),
            s.generation()?,
        ))
    })?;
    // The sea, assembled from every coastline way: cut into the tiles and
    // kept for the drains after this build.
    let sea = match d.layer.shows_ocean() {
        true => store.snapshot(features::assemble_sea)?,
        false => None,
    };
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.hw-tmp-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    // The folder the config names for the file is made, as an output's is:
    // a fresh project has none yet.
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| TilesError::Io {
            path: dir.to_path_buf(),
            err: e,
        })?;
    }
    let seen = seen_keys(store, d, sea.as_ref())?;
    let seen: BTreeSet<&str> = seen.iter().map(String::as_str).collect();
    let mut mb = Mbtiles::create(&tmp, d, &seen)?;
    // Nobody reads the temporary file, and it is fsynced whole before the
    // rename that publishes it: no need to sync each batch.
    mb.conn
        .pragma_update(None, "synchronous", "OFF")
        .map_err(|e| mb.err(e))?;
    let (features, written) = cut_all(store, d, sea.as_ref(), &mut mb, token)?;
    drop(mb);
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(|err| TilesError::Io {
            path: tmp.clone(),
            err,
        })?;
    // Swap in only while still the writer: a file written under a newer
    // token, or a lost lease, means another build or drain took over.
    store.check_fence()?;
    if let (Some(ours), Some(old)) = (token, Mbtiles::open(&path)?) {
        if let Some(theirs) = old.writer_token()?.filter(|t| *t > ours) {
            let _ = std::fs::remove_file(&tmp);
            return Err(TilesError::Fenced { path, theirs, ours });
        }
    }
    std::fs::rename(&tmp, &path).map_err(|err| TilesError::Io {
        path: path.clone(),
        err,
    })?;
    crate::import::sync_parent(&path).map_err(|err| TilesError::Io {
        path: crate::import::parent_dir(&path).to_path_buf(),
        err,
    })?;
    store.write(|w| {
        if d.layer.shows_ocean() {
            ocean::keep(w, sea.as_ref())?;
        }
        w.clear_dirty(&d.name, generation)?;
        patch::forget_all(w, &d.name, generation)?;
        publish::note_rebuilt(w, &d.name)?;
        w.del_meta(&format!("tiles_rebuild:{}", d.name))?;
        w.set_marker(&d.name, sequence, &d.recipe)
    })?;
    Ok(BuildReport {
        dataset: d.name.clone(),
        features,
        tiles: written,
        sequence,
        reason: None,
    })
}

/// The keys the layer's features carry, for a layer that lists them in
/// the file's metadata (no schema, every key): a pass over the store for
/// them alone, a page at a time, and the sea's. Empty for the others,
/// which never read it.
fn seen_keys(
    store: &Store,
    d: &TileDataset,
    sea: Option<&Feature>,
) -> Result<BTreeSet<String>, StoreError> {
    let mut seen = BTreeSet::new();
    if d.layer.schema.is_some() || d.layer.keys.is_some() {
        return Ok(seen);
    }
    seen.extend(sea.iter().flat_map(|f| f.tags.keys().cloned()));
    store.snapshot(|s| {
        let mut pass = features::Pass::new(&d.layer);
        while let Some(page) = pass.next_page(s)? {
            for (_, f) in page {
                seen.extend(f.tags.into_keys());
            }
        }
        Ok(())
    })?;
    Ok(seen)
}

/// Cuts every tile of the dataset from the (just rebuilt) shapes index
/// into `mb`, through the drain's own cut ([`cut_batch`]): the low zooms
/// zoom by zoom, then block by block ([`listing`]), so that what is held is
/// a block's index rows and a batch's features, whatever the store's size.
/// Returns the features in the index that some zoom shows, and the tiles
/// written.
fn cut_all(
    store: &Store,
    d: &TileDataset,
    sea: Option<&Feature>,
    mb: &mut Mbtiles,
    token: Option<i64>,
) -> Result<(usize, usize), TilesError> {
    let sea_box = sea.map(|f| f.shape.bbox());
    let listing = store.snapshot(|s| listing::list(s, &d.layer, sea_box))?;
    let mut pending: Vec<CutTile> = Vec::new();
    let mut written = 0;
    let mut flush = |pending: &mut Vec<CutTile>, mb: &mut Mbtiles| {
        written += pending.len();
        // A fresh file: every tile is new.
        let r = mb.write(pending, token, &|_| false);
        pending.clear();
        r
    };
    let cut_into = |s: &Store, tiles: &[Tile], pending: &mut Vec<CutTile>| {
        for chunk in tiles.chunks(DRAIN_BATCH_TILES) {
            let batch = cut_batch(s, d, chunk, sea)?;
            pending.extend(batch.into_iter().filter(|(_, b)| b.is_some()));
        }
        Ok::<_, StoreError>(())
    };
    for tiles in &listing.low {
        store.snapshot(|s| cut_into(s, tiles, &mut pending))?;
        if pending.len() >= DRAIN_BATCH_TILES {
            flush(&mut pending, mb)?;
        }
    }
    for &block in &listing.blocks {
        store.snapshot(|s| {
            let bbox = listing::block_box(block, d.layer.buffer);
            let rows = s.shape_rows_in(bbox, Some(d.layer.zoom_max))?;
            let extra = sea_box.filter(|b| meets(*b, bbox));
            for tiles in listing::block_tiles(block, &d.layer, &rows, extra) {
                cut_into(s, &tiles, &mut pending)?;
            }
            Ok(())
        })?;
        if pending.len() >= DRAIN_BATCH_TILES {
            flush(&mut pending, mb)?;
        }
    }
    flush(&mut pending, mb)?;
    let features = store.shapes_shown()? + usize::from(sea.is_some());
    Ok((features, written))
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DrainReport {
    pub dataset: String,
    /// Tiles re-cut (written or deleted).
    pub recut: usize,
    /// Of those, tiles deleted because nothing shows in them any more.
    pub deleted: usize,
    /// Of those, tiles patched from the file's copy rather than cut whole
    /// ([`patch`]).
    pub patched: usize,
    /// Dirty tiles left.
    pub backlog: i64,
    /// The backlog after the previous drain, when it was smaller: the
    /// dirty set grows faster than it drains.
    pub growing_from: Option<i64>,
    /// Set when the drain rebuilt the file instead (and why).
    pub rebuilt: Option<BuildReport>,
}

/// Re-cuts up to `max` dirty tiles, in `order`, from the store as it is.
pub fn drain(
    store: &mut Store,
    d: &TileDataset,
    max: usize,
    order: DrainOrder,
) -> Result<DrainReport, TilesError> {
    drain_with(store, d, max, order, false)
}

/// [`drain`]; with `requested`, the dirty tiles `serve` was asked for go
/// first, the most requested first (issue 23), then the rest in `order`.
pub fn drain_with(
    store: &mut Store,
    d: &TileDataset,
    max: usize,
    order: DrainOrder,
    requested: bool,
) -> Result<DrainReport, TilesError> {
    let path = path_of(d)?.to_path_buf();
    store.lease_writer(false)?;
    let mut report = DrainReport {
        dataset: d.name.clone(),
        ..Default::default()
    };
    let too_many = store.meta(&format!("tiles_rebuild:{}", d.name))?.is_some();
    let dirty = store.dirty_count(&d.name)?;
    let reason = match Mbtiles::open(&path)? {
        None => Some(format!("{} does not exist yet", path.display())),
        Some(mb) if dirty > 0 && dirty as f64 > d.drain_rebuild_share * mb.count()? as f64 => {
            Some(format!(
                "{dirty} of its {} tiles are dirty, more than drain_rebuild_share = {}: a full pass is cheaper",
                mb.count()?,
                d.drain_rebuild_share
            ))
        }
        Some(_) if too_many => Some(format!(
            "a diff affected more than tiles_affected_max = {} tiles at z{}",
            d.tiles_affected_max, d.layer.zoom_max
        )),
        Some(mb) => match mb.metadata("highwater_recipe")? {
            Some(r) if r == d.recipe => None,
            other => Some(format!(
                "its recipe changed ({} was cut with {}, the config now gives {}): new logic must not mix with old tiles",
                path.display(),
                other.as_deref().unwrap_or("no recipe"),
                d.recipe
            )),
        },
    };
    if let Some(reason) = reason {
        let mut b = build(store, d)?;
        b.reason = Some(reason);
        report.rebuilt = Some(b);
        return Ok(report);
    }
    if store.meta("shapes")?.is_none()
        || store.meta("shapes_low")?.as_deref() != Some(d.low.id.as_str())
    {
        rebuild_shapes(store, &d.low)?;
    }
    if d.layer.shows_ocean() {
        ocean::ensure(store)?;
    }
    let mut mb = Mbtiles::open(&path)?.expect("checked above");
    let token = store.writer_token();
    failpoint("fail-drain", &d.name)?;
    let mut first: std::collections::VecDeque<Tile> = if requested {
        fresh::requested_dirty(store, d)?
            .into_iter()
            .map(|(t, _)| t)
            .collect()
    } else {
        Default::default()
    };
    while report.recut < max {
        let generation = store.generation()?;
        let n = (max - report.recut).min(DRAIN_TRANSACTION_TILES);
        let tiles: Vec<Tile> = if first.is_empty() {
            store.dirty_tiles(&d.name, order, n)?
        } else {
            first.drain(..n.min(first.len())).collect()
        };
        if tiles.is_empty() {
            break;
        }
        // One read transaction per batch: one snapshot, one file lock; and
        // each feature built once per batch, however many tiles show it
        // (a low-zoom tile shows most of them).
        // Features come from the shapes index's copy (kept current by
        // apply with the same touched keys that expiry reads), never
        // re-assembled from nodes; a low-zoom tile's candidates come from
        // the low-zoom index, so its cost is what it shows.
        // A tile whose touched features are known is patched from the
        // file's copy ([`patch`]); the rest are cut whole.
        let old = mb.get_raw(&tiles)?;
        let (batch, patched) = store.snapshot(|s| {
            let sea = ocean::for_cut(s, &d.layer)?;
            let mut jobs = Vec::new();
            let mut whole = Vec::new();
            for &t in &tiles {
                match patch::touched_of(s, &d.name, t)? {
                    Some(keys) => jobs.push((t, keys)),
                    None => whole.push(t),
                }
            }
            let (mut batch, not_ours) = patch::patch_batch(s, d, &jobs, &old, sea.as_ref())?;
            let patched = batch.len();
            whole.extend(not_ours);
            for chunk in whole.chunks(DRAIN_BATCH_TILES) {
                batch.extend(cut_batch(s, d, chunk, sea.as_ref())?);
            }
            Ok((batch, patched))
        })?;
        report.deleted += batch.iter().filter(|(_, b)| b.is_none()).count();
        mb.write(&batch, token, &|t| old.contains_key(&t))?;
        failpoint("kill-drain-after-write", &d.name)?;
        store.write(|w| {
            w.clean(&d.name, &tiles, generation)?;
            publish::note_drained(w, &d.name, &tiles)?;
            patch::forget(w, &d.name, &tiles, generation)
        })?;
        report.recut += tiles.len();
        report.patched += patched;
    }
    report.backlog = store.dirty_count(&d.name)?;
    let key = format!("backlog:{}", d.name);
    let previous: Option<i64> = store.meta(&key)?.and_then(|s| s.parse().ok());
    if previous.is_some_and(|p| report.backlog > p) {
        report.growing_from = previous;
    }
    store.write(|w| w.set_meta(&key, &report.backlog.to_string()))?;
    Ok(report)
}

/// A tile and its MVT bytes (`None`: nothing shows in it).
pub type CutTile = (Tile, Option<Vec<u8>>);

/// Cuts `tiles` from the store as it is, reading features from the shapes
/// index: the drain's code, and the code `serve` cuts a dirty tile with
/// (issue 23), so a tile served fresh equals what the next drain writes.
/// Each feature is built once per batch, however many tiles show it (a
/// low-zoom tile shows most of them). Call inside one snapshot.
pub(crate) fn cut_batch(
    s: &Store,
    d: &TileDataset,
    tiles: &[Tile],
    sea: Option<&Feature>,
) -> Result<Vec<CutTile>, StoreError> {
    let mut built: HashMap<ElementKey, Vec<Placement>> = HashMap::new();
    let mut cands = Vec::with_capacity(tiles.len());
    // The sea is not in the shapes index: it is one feature (the kept one,
    // [`ocean::for_cut`], or a build's), a candidate of every tile its box
    // meets. Callers pass none for a layer that does not show it.
    debug_assert!(sea.is_none() || d.layer.shows_ocean());
    let sea = sea.map(|f| (f.shape.bbox(), d.layer.place(f)));
    if let Some((_, p)) = &sea {
        built.insert(crate::coast::OCEAN_KEY, p.clone());
    }
    // Each candidate's stored feature read once (SQLite, in this thread),
    // then decoded and placed in parallel.
    let mut wanted: Vec<(ElementKey, Vec<u8>)> = Vec::new();
    for &t in tiles {
        let tb = tile_box(t, d.layer.buffer);
        // Only what some dataset shows at this zoom: a z13 tile holds the
        // buildings of 16 z14 tiles, and shows none of them.
        let mut keys = s.shapes_in(tb, Some(t.z))?;
        if let Some((b, _)) = &sea {
            if meets(*b, tb) {
                keys.push(crate::coast::OCEAN_KEY);
                keys.sort();
            }
        }
        for &k in &keys {
            if let std::collections::hash_map::Entry::Vacant(e) = built.entry(k) {
                let bytes = s.shape_data(k.0, k.1)?.ok_or_else(|| corrupt(s, d, k))?;
                wanted.push((k, bytes));
                e.insert(Vec::new());
            }
        }
        cands.push(keys);
    }
    place_into(s, d, wanted, &mut built)?;
    let batch: Vec<(Tile, Option<Vec<u8>>)> = tiles
        .par_iter()
        .zip(&cands)
        .map(|(&t, keys)| {
            let fs: Vec<(ElementKey, &[Placement])> = keys
                .iter()
                .filter(|k| !built[*k].is_empty())
                .map(|k| (*k, built[k].as_slice()))
                .collect();
            (t, cut(t, &d.layer, &d.name, &fs))
        })
        .collect();
    // Freed on the workers, as they were allocated there: one thread
    // freeing every placement of a batch costs more than cutting them.
    built.into_par_iter().for_each(drop);
    Ok(batch)
}

/// Decodes and places the shapes index's bytes of each wanted feature (in
/// parallel) into `built`: the cut's and the patch's one way to read a
/// feature.
pub(crate) fn place_into(
    s: &Store,
    d: &TileDataset,
    wanted: Vec<(ElementKey, Vec<u8>)>,
    built: &mut HashMap<ElementKey, Vec<Placement>>,
) -> Result<(), StoreError> {
    let placed: Vec<(ElementKey, Option<Vec<Placement>>)> = wanted
        .into_par_iter()
        .map(|(k, bytes)| {
            let placements = features::decode(&bytes).map(|every| {
                d.layer
                    .narrow_owned(every)
                    .map(|f| d.layer.place(&f))
                    .unwrap_or_default()
            });
            (k, placements)
        })
        .collect();
    for (k, p) in placed {
        built.insert(k, p.ok_or_else(|| corrupt(s, d, k))?);
    }
    Ok(())
}

/// The shapes index lacks a readable feature for a candidate it listed.
fn corrupt(s: &Store, d: &TileDataset, k: ElementKey) -> StoreError {
    StoreError::Corrupt {
        path: s.path().to_path_buf(),
        what: format!(
            "the shapes index has no readable feature for {k:?}; run `highwater osm rebuild {}`",
            d.name
        ),
    }
}

/// Whether two boxes (min x, min y, max x, max y) meet, edges included:
/// the test the shapes index applies to a cut's candidates.
pub(crate) fn meets(a: (f64, f64, f64, f64), b: (f64, f64, f64, f64)) -> bool {
    a.2 >= b.0 && a.0 <= b.2 && a.3 >= b.1 && a.1 <= b.3
}

/// A tile's box grown by the buffer, in world coordinates.
pub(crate) fn tile_box(t: Tile, b: f64) -> (f64, f64, f64, f64) {
    let n = (1u64 << t.z) as f64;
    (
        (t.x as f64 - b) / n,
        (t.y as f64 - b) / n,
        (t.x as f64 + 1.0 + b) / n,
        (t.y as f64 + 1.0 + b) / n,
    )
}

/// One tile that differs between the file and a rebuild.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Difference {
    pub tile: String,
    /// Feature ids (OSM id × 4 + type) only in the file, only in the
    /// rebuild, or in both but different.
    pub only_in_file: Vec<u64>,
    pub only_in_rebuild: Vec<u64>,
    pub changed: Vec<u64>,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct VerifyReport {
    pub dataset: String,
    pub checked: usize,
    /// Dirty tiles are known to be stale until drained; they are skipped.
    pub dirty_skipped: i64,
    pub differences: Vec<Difference>,
}

fn features_of(
    path: &Path,
    dataset: &str,
    t: Tile,
    b: Option<&[u8]>,
) -> Result<BTreeMap<u64, mvt::TileFeature>, TilesError> {
    let Some(b) = b else {
        return Ok(BTreeMap::new());
    };
    let layers = mvt::decode(b).map_err(|e| TilesError::Corrupt {
        path: path.to_path_buf(),
        dataset: dataset.to_string(),
        tile: t.to_zxy(),
        err: e.to_string(),
    })?;
    Ok(layers
        .into_iter()
        .flat_map(|(_, f)| f)
        .map(|f| (f.id, f))
        .collect())
}

/// Re-cuts tiles from a full pass over the store and compares them with
/// the file: every tile (`sample = None`) or a spread sample of them.
pub fn verify(
    store: &Store,
    d: &TileDataset,
    sample: Option<usize>,
) -> Result<VerifyReport, TilesError> {
    let path = path_of(d)?.to_path_buf();
    let mb = Mbtiles::open(&path)?.ok_or_else(|| TilesError::Io {
        path: path.clone(),
        err: std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!(
                "not built yet: run `highwater osm tiles build` for {}",
                d.name
            ),
        ),
    })?;
    let dirty: BTreeSet<Tile> = store
        .dirty_tiles(&d.name, DrainOrder::LowZoomFirst, usize::MAX)?
        .into_iter()
        .collect();
    let spread = |universe: Vec<Tile>, n: usize| -> Vec<Tile> {
        // Spread over the whole range: every k-th tile.
        let step = universe.len() as f64 / n as f64;
        (0..n)
            .map(|i| universe[(i as f64 * step) as usize])
            .collect()
    };
    let file: Vec<Tile> = mb
        .tiles()?
        .into_iter()
        .filter(|t| !dirty.contains(t))
        .collect();
    let (view, chosen) = match sample {
        // A sample of the file's tiles, against a rebuild of those tiles
        // alone: bounded by what they show, at any store size. (A tile the
        // rebuild has and the file lacks is found by `--all`, and by the
        // sample of a tile beside it only if it shows there.)
        Some(n) if n < file.len() => {
            let chosen = spread(file, n);
            let wanted: BTreeSet<Tile> = chosen.iter().copied().collect();
            (rebuild_view_of(store, &d.layer, &wanted)?, chosen)
        }
        _ => {
            // Every tile of either side: the whole view in memory, for
            // stores that fit.
            let view = rebuild_view(store, &d.layer)?;
            let mut universe: BTreeSet<Tile> = view.by_tile.keys().copied().collect();
            universe.extend(file);
            let universe: Vec<Tile> = universe
                .into_iter()
                .filter(|t| !dirty.contains(t))
                .collect();
            let chosen = match sample {
                Some(n) if n < universe.len() => spread(universe, n),
                _ => universe,
            };
            (view, chosen)
        }
    };
    let mut report = VerifyReport {
        dataset: d.name.clone(),
        checked: chosen.len(),
        dirty_skipped: dirty.len() as i64,
        differences: Vec::new(),
    };
    mb.conn.execute_batch("BEGIN").map_err(|e| mb.err(e))?;
    for t in chosen {
        let want = view.cut(t, d);
        let have = mb.get(t)?;
        if want == have {
            continue;
        }
        let a = features_of(&path, &d.name, t, have.as_deref())?;
        let b = features_of(&path, &d.name, t, want.as_deref())?;
        report.differences.push(Difference {
            tile: t.to_zxy(),
            only_in_file: a.keys().filter(|k| !b.contains_key(k)).copied().collect(),
            only_in_rebuild: b.keys().filter(|k| !a.contains_key(k)).copied().collect(),
            changed: a
                .iter()
                .filter(|(k, f)| b.get(k).is_some_and(|g| g != *f))
                .map(|(k, _)| *k)
                .collect(),
        });
    }
    mb.conn.execute_batch("COMMIT").map_err(|e| mb.err(e))?;
    Ok(report)
}

impl TileDataset {
    /// The rest of a diff's derivation, once its affected tiles are
    /// `found` (with its stats and the sea after it): the guard's size,
    /// the bound, the dirty set and the touched features per tile.
    fn affected(
        &self,
        w: &mut crate::store::Writer<'_>,
        found: crate::derive::Affected,
        r: &mut crate::dataset::DatasetReport,
    ) -> Result<(), StoreError> {
        let (touched, s, sea) = found;
        let mut t: BTreeSet<Tile> = touched.keys().copied().collect();
        // The sea after the diff, when the diff touched a coastline: kept
        // for the drain in this (the apply's) transaction.
        if let Some(sea) = sea {
            ocean::keep(w, sea.as_ref())?;
        }
        // For the test of the "derived nothing" warning (issue 23): a
        // derivation bug that loses the affected set.
        if std::env::var_os("HIGHWATER_FAILPOINT")
            .is_some_and(|v| v.to_string_lossy() == format!("derive-nothing:{}", self.name))
        {
            t.clear();
        }
        r.last_affected = Some(t.len());
        r.last_read = s.read_tags_changed;
        let (t, z) = bound(t, &self.layer, self.tiles_affected_max);
        r.changes += s.changes;
        r.filtered += s.filtered;
        if z.is_some() {
            r.zoomed_out_to = z.min(r.zoomed_out_to.or(z));
            if self.mbtiles.is_some() {
                // Coarse dirty tiles stand for their whole subtree, which
                // a drain would not re-cut: the file is rebuilt.
                w.set_meta(&format!("tiles_rebuild:{}", self.name), "1")?;
            }
            // What changed in a coarse tile is not what the touched map
            // says of it: each is cut whole.
            for &tile in &t {
                r.touched.insert(tile, None);
            }
        } else {
            patch::gather(&mut r.touched, touched);
        }
        r.dirty.extend(t);
        Ok(())
    }
}

impl crate::dataset::Dataset for TileDataset {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        KIND.name
    }

    fn recipe(&self) -> &str {
        &self.recipe
    }

    fn dirty_what(&self) -> &'static str {
        "dirty tiles"
    }

    fn dirties_tiles(&self) -> bool {
        true
    }

    fn unit_key(&self) -> Option<&'static str> {
        Some("tiles")
    }

    fn low_zoom(&self) -> Option<std::sync::Arc<crate::features::LowZoom>> {
        Some(self.low.clone())
    }

    fn paths(&self) -> Vec<(String, PathBuf)> {
        self.mbtiles
            .iter()
            .map(|m| (format!("[osm.tiles.{}] mbtiles", self.name), m.clone()))
            .collect()
    }

    fn status(
        &self,
        store: &Store,
        cx: &crate::dataset::StatusContext,
    ) -> Result<serde_json::Value, StoreError> {
        config::status(self, store, cx)
    }

    /// The tiles the diff affects, from the store before it (bounded by
    /// `tiles_affected_max`, zooming out past it). With a live shapes
    /// index, the features before the diff are read from it now and the
    /// set is finished in step 3 ([`Dataset::touched`]) from the index the
    /// apply rewrote; without one, both sides are assembled now.
    fn derive(
        &self,
        w: &mut crate::store::Writer<'_>,
        changes: &[crate::model::Change],
        r: &mut crate::dataset::DatasetReport,
    ) -> Result<(), StoreError> {
        // The condition under which the apply keeps the index
        // (`derive::apply_indexed`): live now, rewritten in step 2.
        if w.meta("shapes")?.is_some() {
            r.before = Some(crate::derive::affected_before(&*w, changes, &self.layer)?);
            return Ok(());
        }
        let found = crate::derive::affected_tiles_touched(&*w, changes, &self.layer)?;
        self.affected(w, found, r)
    }

    fn touched(
        &self,
        w: &mut crate::store::Writer<'_>,
        _touched: &crate::derive::Touched,
        r: &mut crate::dataset::DatasetReport,
    ) -> Result<(), StoreError> {
        match r.before.take() {
            Some(before) => {
                let found = before.after(&*w, &self.layer)?;
                self.affected(w, found, r)
            }
            None => Ok(()),
        }
    }

    fn commit(
        &self,
        w: &mut crate::store::Writer<'_>,
        sequence: Option<i64>,
        r: &mut crate::dataset::DatasetReport,
    ) -> Result<(), StoreError> {
        w.add_dirty(&self.name, &r.dirty)?;
        patch::record(w, &self.name, &r.dirty, &r.touched)?;
        w.set_marker(&self.name, sequence, &self.recipe)?;
        r.tiles = r.dirty.len();
        Ok(())
    }

    /// Its dirty tiles.
    fn dirty_units(&self, store: &Store) -> Result<u64, StoreError> {
        Ok(store.dirty_count(&self.name)? as u64)
    }

    fn drains_on_apply(&self) -> bool {
        self.mbtiles.is_some() && self.drain_on_apply
    }

    fn drain(
        &self,
        store: &mut Store,
        limits: crate::dataset::DrainLimits,
    ) -> Result<crate::dataset::Outcome, crate::dataset::DatasetError> {
        let t0 = std::time::Instant::now();
        let r = drain_with(
            store,
            self,
            limits.tiles_max,
            limits.order,
            limits.requested,
        )
        .map_err(|e| crate::dataset::error_text(&e))?;
        let mut o = match &r.rebuilt {
            Some(b) => {
                let text = build_text(b);
                crate::dataset::Outcome::new("drain", serde_json::json!(r), t0, text)
            }
            None => crate::dataset::Outcome::new("drain", serde_json::json!(r), t0, |s| {
                format!(
                    "{}: re-cut {} tiles ({} patched, {} now empty, deleted) in {s:.2} s; backlog {} dirty tiles",
                    r.dataset, r.recut, r.patched, r.deleted, r.backlog
                )
            }),
        };
        o.warning = r.growing_from.map(|from| {
            format!(
                "{}'s dirty set grows faster than it drains ({from} -> {} tiles): drain more often, with a larger --max, or rebuild",
                r.dataset, r.backlog
            )
        });
        Ok(o)
    }

    fn rebuild(
        &self,
        store: &mut Store,
    ) -> Result<crate::dataset::Outcome, crate::dataset::DatasetError> {
        let t0 = std::time::Instant::now();
        let r = build(store, self).map_err(|e| crate::dataset::error_text(&e))?;
        let text = build_text(&r);
        Ok(crate::dataset::Outcome::new(
            "build",
            serde_json::json!(r),
            t0,
            text,
        ))
    }

    fn verify(
        &self,
        store: &Store,
        sample: Option<usize>,
    ) -> Result<crate::dataset::Outcome, crate::dataset::DatasetError> {
        let t0 = std::time::Instant::now();
        let r = verify(store, self, sample).map_err(|e| crate::dataset::error_text(&e))?;
        let mut text = format!(
            "{}: {} tiles checked against a rebuild, {} differ ({} dirty tiles skipped)",
            r.dataset,
            r.checked,
            r.differences.len(),
            r.dirty_skipped
        );
        for d in &r.differences {
            text += &format!(
                "\n  {}: only in the file {:?}, only in the rebuild {:?}, changed {:?}",
                d.tile, d.only_in_file, d.only_in_rebuild, d.changed
            );
        }
        let mut o = crate::dataset::Outcome::new("verify", serde_json::json!(r), t0, |_| text);
        o.differences = r.differences.len();
        Ok(o)
    }
}

/// What a build says, given the seconds it took.
fn build_text(r: &BuildReport) -> impl FnOnce(f64) -> String + '_ {
    move |s| {
        format!(
            "{}: built {} tiles from {} features at sequence {} in {s:.2} s{}",
            r.dataset,
            r.tiles,
            r.features,
            r.sequence.map_or("(none)".into(), |s| s.to_string()),
            r.reason
                .as_ref()
                .map_or(String::new(), |why| format!(" (rebuilt because {why})"))
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tile round-trips; a stored tile that is not gzip, is cut short,
    /// or whose trailer claims more than `TILE_BYTES_MAX` is refused with
    /// what is wrong, never allocated or panicked on.
    #[test]
    fn tiles_gzip_round_trip_and_damaged_ones_are_refused() {
        let tile: Vec<u8> = (0..10_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let z = gzip(&tile);
        assert!(z.len() < tile.len());
        assert_eq!(gzip(&tile), z, "equal tiles, equal bytes");
        assert_eq!(gunzip(&z).unwrap(), tile);
        assert_eq!(gunzip(&gzip(&[])).unwrap(), Vec::<u8>::new());
        let mut huge = z.clone();
        let n = huge.len();
        huge[n - 4..].copy_from_slice(&u32::MAX.to_le_bytes());
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("short", z[..10].to_vec(), "too short"),
            ("not gzip", vec![7; 64], "not a gzip'd tile"),
            (
                "a piece missing",
                [&z[..12], &z[40..]].concat(),
                "not a gzip'd tile",
            ),
            ("huge", huge, "TILE_BYTES_MAX"),
        ];
        for (name, bytes, want) in cases {
            let e = gunzip(&bytes).expect_err(name).to_string();
            assert!(e.contains(want), "{name}: {e}");
        }
    }
}
