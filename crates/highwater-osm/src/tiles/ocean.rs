//! The sea in the tiles (issue 25): the polygon [`crate::coast`] assembles
//! from the coastline ways, as the feature [`crate::coast::OCEAN_KEY`] of
//! a schema's `ocean` layer ([`crate::features::TileLayer::shows_ocean`]).
//!
//! - A build (`tiles::build`) and the reference rebuild (`features::all`)
//!   assemble it from every coastline way.
//! - Expiry ([`crate::derive::affected_tiles`]): a diff that touches a
//!   coastline way (its own, or one through a node it moves) assembles the
//!   sea before and after, from the old store and the diff laid over it,
//!   and expires the tiles whose signature changed, like any feature's.
//! - The drain reads the kept copy (table `tiles_ocean`, one row), which
//!   the tile dataset's derive rewrites, in the apply's transaction, with
//!   the sea it assembled for the store after the diff; a build rewrites it
//!   from the rebuild's, and a drain that finds none assembles it.
//!
//! The sea is one feature: a diff touching a coastline assembles it whole
//! (every coastline way read twice, and a scan of the ways' tags to find
//! them). For an extract that is a few hundred ways; for a continent, a
//! planet's water polygons (osmdata.openstreetmap.de) would be the input,
//! which this does not do.

use crate::features::{self, Feature, TileLayer};
use crate::store::{Store, StoreError, Writer};
use rusqlite::OptionalExtension;

/// The kept sea: one row (id 0) once assembled; `data` NULL when the
/// extract has no sea.
pub const TABLES: &str =
    "CREATE TABLE IF NOT EXISTS tiles_ocean(id INTEGER PRIMARY KEY CHECK (id = 0), data BLOB);";

fn corrupt(path: &std::path::Path) -> StoreError {
    StoreError::Corrupt {
        path: path.to_path_buf(),
        what: "the kept sea (table tiles_ocean) does not decode; run `highwater osm rebuild` for the tile dataset".into(),
    }
}

/// The kept sea: `None` when none was kept yet, `Some(None)` when the
/// extract has none.
pub fn kept(s: &Store) -> Result<Option<Option<Feature>>, StoreError> {
    let row: Option<Option<Vec<u8>>> = s
        .conn()
        .query_row("SELECT data FROM tiles_ocean WHERE id = 0", [], |r| {
            r.get(0)
        })
        .optional()
        .map_err(|e| s.err(e))?;
    row.map(|d| {
        d.map(|b| features::decode(&b).ok_or_else(|| corrupt(s.path())))
            .transpose()
    })
    .transpose()
}

/// Keeps `f` as the sea, in the writer's transaction.
pub fn keep(w: &mut Writer<'_>, f: Option<&Feature>) -> Result<(), StoreError> {
    let data = f.map(features::encode);
    w.tx()
        .execute(
            "INSERT OR REPLACE INTO tiles_ocean(id, data) VALUES(0, ?1)",
            [data],
        )
        .map(|_| ())
        .map_err(|e| w.err(e))
}

/// Assembles and keeps the sea if none is kept (a store imported, never
/// built): the drain's first step.
pub fn ensure(store: &mut Store) -> Result<(), StoreError> {
    if kept(store)?.is_none() {
        let f = store.snapshot(features::assemble_sea)?;
        store.write(|w| keep(w, f.as_ref()))?;
    }
    Ok(())
}

/// The sea a cut for `layer` reads: none for a layer that does not show
/// it; else the kept copy, or (a reader finding none kept, as `serve` can
/// before the first drain) one assembled now.
pub(crate) fn for_cut(s: &Store, layer: &TileLayer) -> Result<Option<Feature>, StoreError> {
    if !layer.shows_ocean() {
        return Ok(None);
    }
    match kept(s)? {
        Some(f) => Ok(f),
        None => features::assemble_sea(s),
    }
}
