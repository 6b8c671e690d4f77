//! Reading tiles and their TileJSON out of an MBTiles file, read-only.

use crate::Tileset;
use highwater_core::tile::Tile;
use rusqlite::{Connection, OpenFlags, OptionalExtension};
use std::path::Path;

fn open(path: &Path) -> Result<Connection, String> {
    // Read-only and without creating: a missing file is an error, never a
    // new empty one.
    Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| format!("{}: {e}", path.display()))
}

/// The stored (gzipped) tile at z/x/y in XYZ numbering, if there is one.
pub fn read_tile(path: &Path, z: u8, x: u32, y: u32) -> Result<Option<Vec<u8>>, String> {
    if z > highwater_core::tile::ZOOM_MAX || x >= 1 << z || y >= 1 << z {
        return Ok(None);
    }
    // MBTiles rows count from the south (TMS).
    let row = (1u32 << z) - 1 - y;
    let c = open(path)?;
    c.query_row(
        "SELECT tile_data FROM tiles WHERE zoom_level = ?1 AND tile_column = ?2 AND tile_row = ?3",
        rusqlite::params![z, x, row],
        |r| r.get(0),
    )
    .optional()
    .map_err(|e| format!("{}: {e}", path.display()))
}

/// Open read-only connections to MBTiles files, reused across requests:
/// opening one (and reading its schema) costs more than the tile read.
/// A file replaced by a rebuild (renamed over) has a new inode: its old
/// connections are dropped, never read from again.
#[derive(Default)]
pub struct Pool {
    idle: std::sync::Mutex<std::collections::HashMap<std::path::PathBuf, Vec<Pooled>>>,
}

struct Pooled {
    conn: Connection,
    inode: (u64, u64),
}

/// How long a read on the blocking path waits for a writer's lock (a
/// drain commits a batch of tiles in place): SQLite's wait as rusqlite
/// opens a connection.
pub const READ_BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Idle connections kept per file at most.
pub const POOL_IDLE_MAX: usize = 8;

fn inode(path: &Path) -> Result<(u64, u64), String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((m.dev(), m.ino()))
}

impl Pool {
    /// [`read_tile`] on a reused connection.
    pub fn read_tile(&self, path: &Path, z: u8, x: u32, y: u32) -> Result<Option<Vec<u8>>, String> {
        if z > highwater_core::tile::ZOOM_MAX || x >= 1 << z || y >= 1 << z {
            return Ok(None);
        }
        let ino = inode(path)?;
        let taken = {
            let mut idle = self.idle.lock().expect("not poisoned");
            let v = idle.entry(path.to_path_buf()).or_default();
            v.retain(|p| p.inode == ino);
            v.pop()
        };
        let p = match taken {
            Some(p) => p,
            None => Pooled {
                conn: open(path)?,
                inode: ino,
            },
        };
        match self.read_on(p, path, z, x, y, READ_BUSY_WAIT) {
            Some(r) => r,
            // Opened before a rename swapped the file in: read again on a
            // new connection.
            None => read_tile(path, z, x, y),
        }
    }

    /// [`Pool::read_tile`] on an idle connection, if one is free right now; `None` when it would have to wait
    /// for the pool's lock or open a connection (serve then reads on a
    /// blocking thread). Nothing else differs: the same query, the same
    /// check for a file renamed over while reading.
    pub fn read_tile_now(&self, path: &Path, z: u8, x: u32, y: u32) -> Option<Option<Vec<u8>>> {
        if z > highwater_core::tile::ZOOM_MAX || x >= 1 << z || y >= 1 << z {
            return Some(None);
        }
        // No stat before: `read_on` stats after the read and refuses a
        // connection to a file renamed over (it is dropped, not kept).
        // The lock is held only to pop or push (never across a read or an
        // open), so waiting for it is waiting for a push.
        let p = self
            .idle
            .lock()
            .expect("not poisoned")
            .get_mut(path)?
            .pop()?;
        // On the event loop: never wait for a writer's lock (a drain
        // committing a batch); the blocking path does.
        self.read_on(p, path, z, x, y, std::time::Duration::ZERO)?
            .ok()
    }

    /// Reads on `p`, waiting at most `busy` for a writer's lock. `None`:
    /// the file was renamed over while reading (it may have read the old
    /// file), or the read failed and `busy` is zero (the caller reads again
    /// on the blocking path, which waits for the lock and says the error).
    fn read_on(
        &self,
        p: Pooled,
        path: &Path,
        z: u8,
        x: u32,
        y: u32,
        busy: std::time::Duration,
    ) -> Option<Result<Option<Vec<u8>>, String>> {
        let row = (1u32 << z) - 1 - y;
        let r = p
            .conn
            .busy_timeout(busy)
            .and_then(|_| {
                p.conn.prepare_cached(
                "SELECT tile_data FROM tiles WHERE zoom_level = ?1 AND tile_column = ?2 AND tile_row = ?3",
            )
            })
            .and_then(|mut st| {
                st.query_row(rusqlite::params![z, x, row], |r| r.get(0))
                    .optional()
            })
            .map_err(|e| format!("{}: {e}", path.display()));
        if inode(path).ok()? != p.inode || (r.is_err() && busy.is_zero()) {
            return None;
        }
        if r.is_ok() {
            let mut idle = self.idle.lock().expect("not poisoned");
            let v = idle.entry(path.to_path_buf()).or_default();
            if v.len() < POOL_IDLE_MAX {
                v.push(p);
            }
        }
        Some(r)
    }
}

/// What ODbL asks of every map made from OpenStreetMap data (issue 50),
/// as TileJSON's and a style source's `attribution` (HTML, which MapLibre's
/// attribution control shows as a link).
pub const OSM_ATTRIBUTION: &str =
    "<a href=\"https://www.openstreetmap.org/copyright\" target=\"_blank\">© OpenStreetMap contributors</a>";

/// TileJSON 3.0 for a tileset, its tile URL under `origin`: absolute, as
/// TileJSON 3.0 has it, when `origin` is (issue 50). The attribution is
/// the MBTiles file's, else [`OSM_ATTRIBUTION`] (a file written before
/// issue 50 has none, and every dataset here is made from OSM data).
pub fn tilejson(t: &Tileset, origin: &str) -> Result<serde_json::Value, String> {
    let c = open(&t.mbtiles)?;
    let meta = |k: &str| -> Option<String> {
        c.query_row("SELECT value FROM metadata WHERE name = ?1", [k], |r| {
            r.get(0)
        })
        .optional()
        .ok()
        .flatten()
    };
    let layers: serde_json::Value = meta("json")
        .and_then(|j| serde_json::from_str::<serde_json::Value>(&j).ok())
        .map(|v| v["vector_layers"].clone())
        .unwrap_or_else(|| serde_json::json!([]));
    // The bounds of what is there, from the tile index at the top zoom.
    let z = t.zoom_max;
    let extent: Option<(u32, u32, u32, u32)> = c
        .query_row(
            "SELECT min(tile_column), max(tile_column), min(tile_row), max(tile_row) FROM tiles WHERE zoom_level = ?1",
            [z],
            |r| Ok((r.get::<_, Option<u32>>(0)?, r.get::<_, Option<u32>>(1)?, r.get::<_, Option<u32>>(2)?, r.get::<_, Option<u32>>(3)?)),
        )
        .map_err(|e| format!("{}: {e}", t.mbtiles.display()))
        .map(|(a, b, c2, d)| Some((a?, b?, c2?, d?)))?;
    let bounds = match extent {
        Some((x0, x1, r0, r1)) => {
            let n = 1u32 << z;
            let (y0, y1) = (n - 1 - r1, n - 1 - r0);
            let (w, _, _, north) = Tile { z, x: x0, y: y0 }.bounds();
            let (_, south, east, _) = Tile { z, x: x1, y: y1 }.bounds();
            [w, south, east, north]
        }
        None => [-180.0, -85.051_129, 180.0, 85.051_129],
    };
    let view = data_view(&c, t)?.unwrap_or(bounds);
    let center = [
        (view[0] + view[2]) / 2.0,
        (view[1] + view[3]) / 2.0,
        t.zoom_min.max(t.zoom_max.saturating_sub(2)) as f64,
    ];
    Ok(serde_json::json!({
        "tilejson": "3.0.0",
        "name": t.name,
        "scheme": "xyz",
        "tiles": [format!("{origin}/tiles/{}/{{z}}/{{x}}/{{y}}.pbf", t.name)],
        "attribution": meta("attribution").unwrap_or_else(|| OSM_ATTRIBUTION.to_string()),
        "minzoom": t.zoom_min,
        "maxzoom": t.zoom_max,
        "bounds": bounds,
        "center": center,
        "highwater_view": view,
        "vector_layers": layers,
        "tile_schema": meta("highwater_schema"),
    }))
}

/// Tiles read at most to place the opening view: past this many at a zoom,
/// a lower zoom is read (a limit on everything: TileJSON is asked for at
/// every page load).
pub const VIEW_TILES_MAX: u32 = 65_536;

/// Where most of the data is, as `[west, south, east, north]`: the box
/// between the 5th and 95th percentiles of tile bytes along each axis, at
/// the highest zoom with at most [`VIEW_TILES_MAX`] tiles. Tile bytes
/// stand for features, so one long feature (a ferry line, a maritime
/// boundary) that stretches the bounds moves this box little (issue 25:
/// the map opened on such bounds with the data in a corner). `None` when
/// there are no tiles.
fn data_view(c: &Connection, t: &Tileset) -> Result<Option<[f64; 4]>, String> {
    let err = |e: rusqlite::Error| format!("{}: {e}", t.mbtiles.display());
    let mut z = t.zoom_max;
    loop {
        let n: u32 = c
            .query_row(
                // Counted no further than the limit: the cost of a look
                // stays bounded however many tiles a zoom has.
                "SELECT count(*) FROM (SELECT 1 FROM tiles WHERE zoom_level = ?1 LIMIT ?2)",
                rusqlite::params![z, VIEW_TILES_MAX + 1],
                |r| r.get(0),
            )
            .map_err(err)?;
        if n <= VIEW_TILES_MAX || z <= t.zoom_min {
            break;
        }
        z -= 1;
    }
    let mut st = c
        .prepare(
            "SELECT tile_column, tile_row, length(tile_data) FROM tiles WHERE zoom_level = ?1 LIMIT ?2",
        )
        .map_err(err)?;
    let rows: Vec<(u32, u32, u64)> = st
        .query_map(rusqlite::params![z, VIEW_TILES_MAX], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)?.max(0) as u64))
        })
        .map_err(err)?
        .collect::<Result<_, _>>()
        .map_err(err)?;
    let n = 1u32 << z;
    let xs: Vec<(u32, u64)> = rows.iter().map(|&(x, _, b)| (x, b)).collect();
    // XYZ y from the TMS row, so the percentiles run north to south.
    let ys: Vec<(u32, u64)> = rows.iter().map(|&(_, r, b)| (n - 1 - r, b)).collect();
    let (Some((x0, x1)), Some((y0, y1))) = (middle(xs), middle(ys)) else {
        return Ok(None);
    };
    let (w, _, _, north) = Tile { z, x: x0, y: y0 }.bounds();
    let (_, south, east, _) = Tile { z, x: x1, y: y1 }.bounds();
    Ok(Some([w, south, east, north]))
}

/// The 5th and 95th percentiles of `v` (position, weight) by weight.
fn middle(mut v: Vec<(u32, u64)>) -> Option<(u32, u32)> {
    v.sort_unstable();
    let total: u64 = v.iter().map(|p| p.1).sum();
    if v.is_empty() {
        return None;
    }
    let at = |q: u64| {
        let mut seen = 0;
        for &(pos, w) in &v {
            seen += w;
            if seen * 100 >= total * q {
                return pos;
            }
        }
        v[v.len() - 1].0
    };
    Some((at(5), at(95)))
}

/// Tiles as GeoJSON polygons (the dirty-tile outline layer).
pub fn tiles_geojson(tiles: &[(u8, u32, u32)]) -> serde_json::Value {
    let tiles: Vec<Tile> = tiles.iter().map(|&(z, x, y)| Tile { z, x, y }).collect();
    highwater_core::tile::tiles_geojson(&tiles)
}

/// The vendored Shortbread style with its one vector source pointed at
/// `tilejson` and its glyphs at `glyphs` (this server's own, see
/// [`crate::glyphs`]), and without what would load from elsewhere or what
/// the tiles do not have: the sprite, so every icon (symbol layers keep
/// their text, and those with only an icon, the one-way arrows, go), and
/// style layers reading a source layer outside `have` (`ocean` when the
/// extract has no coastline).
pub fn shortbread_style(tilejson: &str, glyphs: &str, have: &[&str]) -> serde_json::Value {
    let mut s: serde_json::Value =
        serde_json::from_str(crate::assets::SHORTBREAD_STYLE).expect("the vendored style is JSON");
    let o = s.as_object_mut().expect("a style is an object");
    o.insert("glyphs".into(), glyphs.into());
    o.remove("sprite");
    if let Some(sources) = o.get_mut("sources").and_then(|v| v.as_object_mut()) {
        for (_, src) in sources.iter_mut() {
            if src["type"] == "vector" {
                *src = serde_json::json!({"type": "vector", "url": tilejson, "attribution": OSM_ATTRIBUTION});
            }
        }
    }
    if let Some(layers) = o.get_mut("layers").and_then(|v| v.as_array_mut()) {
        layers.retain(|l| {
            (l["type"] != "symbol" || !l["layout"]["text-field"].is_null())
                && l["source-layer"]
                    .as_str()
                    .is_none_or(|sl| have.contains(&sl))
        });
        for l in layers.iter_mut().filter(|l| l["type"] == "symbol") {
            for part in ["layout", "paint"] {
                if let Some(props) = l.get_mut(part).and_then(|v| v.as_object_mut()) {
                    props.retain(|k, _| !k.starts_with("icon-"));
                }
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_view_is_where_most_bytes_are() {
        // (positions with weights) -> the 5th..95th percentile positions.
        let check = |v: &[(u32, u64)]| super::middle(v.to_vec());
        type Case<'a> = (&'a [(u32, u64)], Option<(u32, u32)>);
        let cases: &[Case] = &[
            (&[], None),
            (&[(7, 10)], Some((7, 7))),
            // A long feature's thin tiles far out do not stretch the view.
            (
                &[(0, 1), (1, 1), (50, 500), (51, 400), (99, 1)],
                Some((50, 51)),
            ),
            (&[(3, 0), (4, 0)], Some((3, 3))),
        ];
        for (v, want) in cases {
            assert_eq!(check(v), *want, "{v:?}");
        }
    }

    #[test]
    fn the_shortbread_style_loads_nothing_from_elsewhere() {
        let s = super::shortbread_style(
            "http://127.0.0.1:1/tiles/x.json",
            "/glyphs/{fontstack}/{range}.pbf",
            &["streets", "buildings", "street_labels", "pois"],
        );
        let text = s.to_string();
        assert!(!text.contains("versatiles.org"), "{}", &text[..200]);
        assert!(s["sprite"].is_null());
        assert_eq!(s["glyphs"], "/glyphs/{fontstack}/{range}.pbf");
        let layers = s["layers"].as_array().unwrap();
        assert!(layers.len() > 100);
        assert!(layers.iter().all(|l| l["source-layer"].is_null()
            || ["streets", "buildings", "street_labels", "pois"]
                .contains(&l["source-layer"].as_str().unwrap())));
        assert_eq!(
            s["sources"]["versatiles-shortbread"]["url"],
            "http://127.0.0.1:1/tiles/x.json"
        );
        // Labels stay, in the fonts this server ships, and no icon is asked for.
        let symbols: Vec<_> = layers.iter().filter(|l| l["type"] == "symbol").collect();
        assert!(symbols
            .iter()
            .any(|l| l["id"] == "label-street-residential"));
        assert!(symbols.iter().any(|l| l["id"] == "poi-amenity"));
        assert!(!text.contains("icon-image"));
        for l in &symbols {
            assert!(!l["layout"]["text-field"].is_null(), "{}", l["id"]);
            for f in l["layout"]["text-font"].as_array().unwrap() {
                assert!(crate::glyphs::FONTS.contains(&f.as_str().unwrap()), "{f}");
            }
        }
    }
}
