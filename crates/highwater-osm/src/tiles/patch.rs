//! Patching a dirty tile instead of re-cutting it (issue 25).
//!
//! A tile's cut is a function of what each feature shows in it, feature by
//! feature ([`super::cut`]). Expiry knows, per tile it dirties, which
//! features' cuts there changed ([`crate::derive::affected_tiles_touched`]);
//! every other feature shows as it did. So a drain can take the tile as the
//! file holds it, drop the touched features (MVT feature ids carry the
//! element key), cut only those anew, and merge them back in the order a
//! full cut gives: (sort key, element key), placements in order. A
//! minutely diff touches one or two of the ~140 features a z14 tile shows;
//! the patch reads those, not the 140.
//!
//! The invariant that makes a patch equal a re-cut: **for every dirty tile
//! with touched rows, the file's tile is the cut of some earlier state of
//! the store, and every feature whose cut there changed since is in its
//! rows.** Kept by:
//! - apply writing the rows in the transaction that dirties the tile, each
//!   with the generation that dirtied it (table `tiles_touched`);
//! - a drain removing a tile's rows of generation `upto` or before in the
//!   transaction that cleans the tile, after the file holds the tile cut
//!   from a snapshot at `upto` or later (later rows stay, as the tile does);
//! - a build removing the dataset's rows as it empties the dirty set;
//! - a tile whose rows say "whole", or that has none (dirtied by an older
//!   version, a coarse tile of a diff that zoomed out), or more than
//!   [`TOUCHED_PER_TILE_MAX`], or whose stored bytes do not decode as this
//!   layer's tile, being cut whole.
//!
//! A crash between the file's commit and the store's leaves the rows: the
//! next drain patches the same features again, which changes nothing.

use super::cut::{self, PatchOutcome};
use super::{meets, tile_box, CutTile, TileDataset};
use crate::features::{ElementKey, Feature};
use crate::schema::Placement;
use crate::store::{kind_code, kind_of, Store, StoreError, Writer};
use highwater_core::tile::Tile;
use rayon::prelude::*;
use rusqlite::params;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Per dirty tile and touched feature, the generation that last touched
/// it; a row of kind [`WHOLE`] says the tile is cut whole.
pub const TABLES: &str = "CREATE TABLE IF NOT EXISTS tiles_touched(dataset TEXT NOT NULL, z INTEGER NOT NULL, x INTEGER NOT NULL, y INTEGER NOT NULL, kind INTEGER NOT NULL, id INTEGER NOT NULL, gen INTEGER NOT NULL, PRIMARY KEY(dataset, z, x, y, kind, id)) WITHOUT ROWID;";

/// Touched features kept per dirty tile; past it the tile is cut whole. A
/// patch costs per touched feature about what a cut costs per shown one,
/// plus decoding and re-encoding the old tile, so it pays while the
/// touched are a small part of the shown.
pub const TOUCHED_PER_TILE_MAX: usize = 64;

/// The kind code of a row that says "cut this tile whole".
const WHOLE: i64 = -1;

/// Adds one diff's touched features per tile to a batch's (`None`, "cut
/// whole", absorbs whatever else the tile gets).
pub(crate) fn gather(
    into: &mut BTreeMap<Tile, Option<BTreeSet<ElementKey>>>,
    touched: BTreeMap<Tile, BTreeSet<ElementKey>>,
) {
    for (t, keys) in touched {
        match into.entry(t) {
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(Some(keys));
            }
            std::collections::btree_map::Entry::Occupied(mut e) => {
                if let Some(have) = e.get_mut() {
                    have.extend(keys);
                }
            }
        }
    }
}

/// Records the batch's touched features of each tile it dirtied, in the
/// apply's transaction, at the generation its dirty rows carry.
pub(crate) fn record(
    w: &mut Writer<'_>,
    dataset: &str,
    dirty: &BTreeSet<Tile>,
    touched: &BTreeMap<Tile, Option<BTreeSet<ElementKey>>>,
) -> Result<(), StoreError> {
    let mut st = w
        .tx()
        .prepare_cached(
            "INSERT INTO tiles_touched(dataset, z, x, y, kind, id, gen) VALUES(?1, ?2, ?3, ?4, ?5, ?6,
                COALESCE((SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'generation'), 0))
             ON CONFLICT DO UPDATE SET gen = excluded.gen",
        )
        .map_err(|e| w.err(e))?;
    for t in dirty {
        match touched.get(t) {
            Some(Some(keys)) if keys.len() <= TOUCHED_PER_TILE_MAX => {
                for (kind, id) in keys {
                    st.execute(params![dataset, t.z, t.x, t.y, kind_code(*kind), id])
                        .map_err(|e| w.err(e))?;
                }
            }
            _ => {
                st.execute(params![dataset, t.z, t.x, t.y, WHOLE, 0])
                    .map_err(|e| w.err(e))?;
            }
        }
    }
    Ok(())
}

/// What a drain may patch `t` with: its touched features, or `None` when it
/// is cut whole (a "whole" row, no rows, or too many).
pub(crate) fn touched_of(
    s: &Store,
    dataset: &str,
    t: Tile,
) -> Result<Option<BTreeSet<ElementKey>>, StoreError> {
    let mut st = s
        .conn()
        .prepare_cached(
            "SELECT kind, id FROM tiles_touched WHERE dataset = ?1 AND z = ?2 AND x = ?3 AND y = ?4",
        )
        .map_err(|e| s.err(e))?;
    let rows = st
        .query_map(params![dataset, t.z, t.x, t.y], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
        })
        .map_err(|e| s.err(e))?;
    let mut keys = BTreeSet::new();
    for r in rows {
        let (code, id) = r.map_err(|e| s.err(e))?;
        if code == WHOLE {
            return Ok(None);
        }
        keys.insert((kind_of(code), id));
    }
    Ok((!keys.is_empty() && keys.len() <= TOUCHED_PER_TILE_MAX).then_some(keys))
}

/// Forgets the touched rows of `tiles` of generation `upto` or before: the
/// file now holds them cut from the store at `upto` or later.
pub(crate) fn forget(
    w: &mut Writer<'_>,
    dataset: &str,
    tiles: &[Tile],
    upto: i64,
) -> Result<(), StoreError> {
    let mut st = w
        .tx()
        .prepare_cached(
            "DELETE FROM tiles_touched WHERE dataset = ?1 AND z = ?2 AND x = ?3 AND y = ?4 AND gen <= ?5",
        )
        .map_err(|e| w.err(e))?;
    for t in tiles {
        st.execute(params![dataset, t.z, t.x, t.y, upto])
            .map_err(|e| w.err(e))?;
    }
    Ok(())
}

/// Forgets every touched row of the dataset of generation `upto` or
/// before: a build cut the whole file from the store at `upto`.
pub(crate) fn forget_all(w: &mut Writer<'_>, dataset: &str, upto: i64) -> Result<(), StoreError> {
    w.tx()
        .execute(
            "DELETE FROM tiles_touched WHERE dataset = ?1 AND gen <= ?2",
            params![dataset, upto],
        )
        .map(|_| ())
        .map_err(|e| w.err(e))
}

/// Patches `jobs` (each tile with its touched features) from the file's
/// copies in `old` (gzip'd MVT; absent: the tile showed nothing). Returns
/// the patched tiles, and the tiles that must be cut whole instead (their
/// stored bytes are not this layer's tile). Call inside one snapshot.
pub(crate) fn patch_batch(
    s: &Store,
    d: &TileDataset,
    jobs: &[(Tile, BTreeSet<ElementKey>)],
    old: &HashMap<Tile, Vec<u8>>,
    sea: Option<&Feature>,
) -> Result<(Vec<CutTile>, Vec<Tile>), StoreError> {
    let sea = sea.map(|f| (f.shape.bbox(), f));
    // Each touched feature read once, whatever number of tiles it touches.
    let mut entries: HashMap<ElementKey, Option<crate::store::ShapeBox>> = HashMap::new();
    let mut wanted: Vec<(ElementKey, Vec<u8>)> = Vec::new();
    let mut cands: Vec<Vec<ElementKey>> = Vec::with_capacity(jobs.len());
    for (t, keys) in jobs {
        let tb = tile_box(*t, d.layer.buffer);
        let mut mine = Vec::new();
        for &k in keys {
            // A candidate as a full cut's query would list it: the sea
            // when its box meets the tile's; a feature when its index row
            // meets the tile's box and shows at this zoom.
            let candidate = if k == crate::coast::OCEAN_KEY {
                sea.as_ref().is_some_and(|(b, _)| meets(*b, tb))
            } else {
                if let std::collections::hash_map::Entry::Vacant(e) = entries.entry(k) {
                    let entry = s.shape_entry(k.0, k.1)?;
                    e.insert(entry.as_ref().map(|(b, _)| *b));
                    if let Some((_, bytes)) = entry {
                        wanted.push((k, bytes));
                    }
                }
                entries[&k].is_some_and(|(_, b, zmin)| meets(b, tb) && zmin <= t.z)
            };
            if candidate {
                mine.push(k);
            }
        }
        cands.push(mine);
    }
    let mut built: HashMap<ElementKey, Vec<Placement>> = HashMap::new();
    if let Some((_, f)) = &sea {
        built.insert(crate::coast::OCEAN_KEY, d.layer.place(f));
    }
    super::place_into(s, d, wanted, &mut built)?;
    let outcomes: Vec<(Tile, Option<Option<Vec<u8>>>)> = jobs
        .par_iter()
        .zip(&cands)
        .map(|((t, keys), mine)| {
            let fs: Vec<(ElementKey, &[Placement])> = mine
                .iter()
                .filter(|k| !built[*k].is_empty())
                .map(|k| (*k, built[k].as_slice()))
                .collect();
            let before = match old.get(t) {
                None => Some(Vec::new()),
                Some(z) => super::gunzip(z)
                    .ok()
                    .and_then(|b| crate::mvt::decode(&b).ok()),
            };
            let out = before.and_then(|b| match cut::patch(*t, &d.layer, &d.name, b, keys, &fs) {
                PatchOutcome::Patched(bytes) => Some(bytes),
                PatchOutcome::NotOurs => None,
            });
            (*t, out)
        })
        .collect();
    built.into_par_iter().for_each(drop);
    let mut patched = Vec::with_capacity(outcomes.len());
    let mut whole = Vec::new();
    for (t, o) in outcomes {
        match o {
            Some(bytes) => patched.push((t, bytes)),
            None => whole.push(t),
        }
    }
    Ok((patched, whole))
}
