//! Web Mercator tiles (XYZ, y = 0 at the north) and the tiles a geometry
//! covers. Pure: coordinates in, tile sets out.
//!
//! Coverage is computed at one zoom in "tile space" (world coordinates times
//! 2^z) and is exact for the question "does the geometry, grown by `buffer`
//! tile widths, touch this tile (closed)": points and segments touch the
//! cells their buffered square or band overlaps; polygons add every cell
//! whose centre lies inside (even-odd over all rings), which together with
//! the boundary cells is every cell the area touches. Lower zooms are the
//! parents.

use std::collections::BTreeSet;

/// The largest zoom a tile set is computed at: 2^20 tiles a side fits u32.
pub const ZOOM_MAX: u8 = 20;

/// Web Mercator's latitude limit.
pub const LAT_MAX: f64 = 85.051_128_779_806_59;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tile {
    pub z: u8,
    pub x: u32,
    pub y: u32,
}

impl Tile {
    pub fn parent(&self) -> Option<Tile> {
        (self.z > 0).then(|| Tile {
            z: self.z - 1,
            x: self.x / 2,
            y: self.y / 2,
        })
    }

    /// osm2pgsql's expire-file form, `z/x/y`.
    pub fn to_zxy(&self) -> String {
        format!("{}/{}/{}", self.z, self.x, self.y)
    }

    /// The tile's bounds as (west, south, east, north) in degrees.
    pub fn bounds(&self) -> (f64, f64, f64, f64) {
        let n = (1u64 << self.z) as f64;
        let lon = |x: f64| x / n * 360.0 - 180.0;
        let lat = |y: f64| {
            (std::f64::consts::PI * (1.0 - 2.0 * y / n))
                .sinh()
                .atan()
                .to_degrees()
        };
        (
            lon(self.x as f64),
            lat(self.y as f64 + 1.0),
            lon(self.x as f64 + 1.0),
            lat(self.y as f64),
        )
    }
}

/// World coordinates (as [`world`] makes them) back to (lon, lat) in
/// degrees.
pub fn lonlat((x, y): (f64, f64)) -> (f64, f64) {
    let lat = (std::f64::consts::PI * (1.0 - 2.0 * y))
        .sinh()
        .atan()
        .to_degrees();
    (x * 360.0 - 180.0, lat)
}

/// The latitude the projection is computed up to: short of the pole, where
/// Mercator's y is infinite. Only its sign and size beyond `LAT_MAX` matter.
const LAT_PROJECTED_MAX: f64 = 89.999;

/// (lon, lat) in degrees to world coordinates, y down: [0, 1] × [0, 1] for
/// the Web Mercator square (|lat| up to `LAT_MAX`). Beyond it, y is below 0
/// or above 1, not clamped onto the edge: the cell functions below clip
/// there, so a line or area beyond ±85.0511° touches no tile, and one
/// crossing the limit touches only the tiles its part inside does (clamping
/// would lay it along the edge row and expire thousands of tiles there).
pub fn world(lon: f64, lat: f64) -> (f64, f64) {
    let lat = lat.clamp(-LAT_PROJECTED_MAX, LAT_PROJECTED_MAX);
    let x = (lon + 180.0) / 360.0;
    let s = lat.to_radians().sin();
    let y = 0.5 - ((1.0 + s) / (1.0 - s)).ln() / (4.0 * std::f64::consts::PI);
    (x.clamp(0.0, 1.0), y)
}

/// The tile containing a point.
pub fn tile_of(lon: f64, lat: f64, z: u8) -> Tile {
    assert!(z <= ZOOM_MAX);
    let n = 1u32 << z;
    // A point beyond the square still names the edge tile it is nearest.
    let (x, y) = world(lon, lat.clamp(-LAT_MAX, LAT_MAX));
    let cell = |v: f64| ((v * n as f64).floor() as i64).clamp(0, n as i64 - 1) as u32;
    Tile {
        z,
        x: cell(x),
        y: cell(y),
    }
}

/// Cells of one zoom, as (x, y).
pub type Cells = BTreeSet<(u32, u32)>;

fn clamp_cell(v: f64, n: u32) -> u32 {
    (v.floor() as i64).clamp(0, n as i64 - 1) as u32
}

/// Adds the cells a point (world coordinates) touches, grown by `buffer`.
pub fn add_point(p: (f64, f64), z: u8, buffer: f64, out: &mut Cells) {
    let n = 1u32 << z;
    let (x, y) = (p.0 * n as f64, p.1 * n as f64);
    if y + buffer < 0.0 || y - buffer > n as f64 {
        // Beyond the Web Mercator square: on no tile.
        return;
    }
    for cy in clamp_cell(y - buffer, n)..=clamp_cell(y + buffer, n) {
        for cx in clamp_cell(x - buffer, n)..=clamp_cell(x + buffer, n) {
            out.insert((cx, cy));
        }
    }
}

/// Adds the cells a polyline (world coordinates) touches, grown by `buffer`.
pub fn add_line(points: &[(f64, f64)], z: u8, buffer: f64, out: &mut Cells) {
    match points {
        [] => {}
        [p] => add_point(*p, z, buffer, out),
        _ => {
            for s in points.windows(2) {
                add_segment(s[0], s[1], z, buffer, out);
            }
        }
    }
}

fn add_segment(a: (f64, f64), b: (f64, f64), z: u8, buffer: f64, out: &mut Cells) {
    segment_cells(a, b, z, buffer, &mut |c| {
        out.insert(c);
    });
}

/// Calls `f` once for each cell a segment (world coordinates), grown by
/// `buffer` tile widths, touches. The per-cell form lets a caller tell what
/// touches one tile, not just which tiles are touched.
pub fn segment_cells(
    a: (f64, f64),
    b: (f64, f64),
    z: u8,
    buffer: f64,
    f: &mut impl FnMut((u32, u32)),
) {
    let n = 1u32 << z;
    let nf = n as f64;
    let (ax, ay, bx, by) = (a.0 * nf, a.1 * nf, b.0 * nf, b.1 * nf);
    let (y_lo, y_hi) = (ay.min(by), ay.max(by));
    for cy in clamp_cell(y_lo - buffer, n)..=clamp_cell(y_hi + buffer, n) {
        // The part of the segment inside the row's band, grown by the buffer.
        let (band_lo, band_hi) = (cy as f64 - buffer, cy as f64 + 1.0 + buffer);
        let (x0, x1) = if (by - ay).abs() < 1e-15 {
            if ay < band_lo || ay > band_hi {
                continue;
            }
            (ax.min(bx), ax.max(bx))
        } else {
            let t_at = |y: f64| (y - ay) / (by - ay);
            let (t0, t1) = {
                let (u, v) = (t_at(band_lo), t_at(band_hi));
                (u.min(v).max(0.0), u.max(v).min(1.0))
            };
            if t0 > t1 {
                continue;
            }
            let xa = ax + (bx - ax) * t0;
            let xb = ax + (bx - ax) * t1;
            (xa.min(xb), xa.max(xb))
        };
        for cx in clamp_cell(x0 - buffer, n)..=clamp_cell(x1 + buffer, n) {
            f((cx, cy));
        }
    }
}

/// Adds the cells an area touches: its rings' boundaries (grown by
/// `buffer`) and every cell whose centre is inside (even-odd over all
/// rings, so inner rings are holes).
pub fn add_polygon(rings: &[Vec<(f64, f64)>], z: u8, buffer: f64, out: &mut Cells) {
    for r in rings {
        add_line(r, z, buffer, out);
    }
    add_fill(rings, z, out);
}

/// Adds the cells whose centre is inside the area (even-odd over all
/// rings). With the boundary cells this is every cell the area touches;
/// alone, it lets a caller tell the inside of two areas apart.
pub fn add_fill(rings: &[Vec<(f64, f64)>], z: u8, out: &mut Cells) {
    fill_cells(rings, z, &mut |c| {
        out.insert(c);
    });
}

/// Calls `f` once for each cell whose centre is inside the area (even-odd
/// over all rings).
pub fn fill_cells(rings: &[Vec<(f64, f64)>], z: u8, f: &mut impl FnMut((u32, u32))) {
    let n = 1u32 << z;
    let nf = n as f64;
    let ys = rings.iter().flatten().map(|p| p.1 * nf);
    let (y_lo, y_hi) = ys.fold((f64::MAX, f64::MIN), |(lo, hi), y| (lo.min(y), hi.max(y)));
    if y_lo > y_hi {
        return;
    }
    let mut xs = Vec::new();
    for cy in clamp_cell(y_lo, n)..=clamp_cell(y_hi, n) {
        let yc = cy as f64 + 0.5;
        xs.clear();
        for r in rings {
            for e in r.windows(2) {
                let (x1, y1, x2, y2) = (e[0].0 * nf, e[0].1 * nf, e[1].0 * nf, e[1].1 * nf);
                if (y1 <= yc) != (y2 <= yc) {
                    xs.push(x1 + (yc - y1) / (y2 - y1) * (x2 - x1));
                }
            }
        }
        xs.sort_by(|a, b| a.total_cmp(b));
        for pair in xs.chunks_exact(2) {
            // Cells whose centre x + 0.5 lies in [pair[0], pair[1]].
            let first = (pair[0] - 0.5).ceil().max(0.0);
            let last = (pair[1] - 0.5).floor().min(nf - 1.0);
            let mut cx = first;
            while cx <= last {
                f((cx as u32, cy));
                cx += 1.0;
            }
        }
    }
}

/// Liang–Barsky: the part of segment a-b inside the closed box
/// (x0, y0, x1, y1), if any. The tile cutter clips with it, and the tests
/// use it as the plain definition of "a segment meets a tile".
pub fn clip_segment(
    a: (f64, f64),
    b: (f64, f64),
    (x0, y0, x1, y1): (f64, f64, f64, f64),
) -> Option<((f64, f64), (f64, f64))> {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let (mut t0, mut t1) = (0.0f64, 1.0f64);
    for (p, q) in [
        (-dx, a.0 - x0),
        (dx, x1 - a.0),
        (-dy, a.1 - y0),
        (dy, y1 - a.1),
    ] {
        if p == 0.0 {
            if q < 0.0 {
                return None;
            }
        } else {
            let r = q / p;
            if p < 0.0 {
                t0 = t0.max(r);
            } else {
                t1 = t1.min(r);
            }
            if t0 > t1 {
                return None;
            }
        }
    }
    let at = |t: f64| (a.0 + dx * t, a.1 + dy * t);
    Some((
        if t0 == 0.0 { a } else { at(t0) },
        if t1 == 1.0 { b } else { at(t1) },
    ))
}

/// The cells of zoom `z_max` and all their parents down to `z_min`.
pub fn with_parents(cells: &Cells, z_max: u8, z_min: u8) -> BTreeSet<Tile> {
    assert!(z_min <= z_max && z_max <= ZOOM_MAX);
    let mut out = BTreeSet::new();
    let mut level: BTreeSet<(u32, u32)> = cells.clone();
    let mut z = z_max;
    loop {
        for &(x, y) in &level {
            out.insert(Tile { z, x, y });
        }
        if z == z_min {
            break;
        }
        level = level.iter().map(|&(x, y)| (x / 2, y / 2)).collect();
        z -= 1;
    }
    out
}

/// Tiles as a GeoJSON FeatureCollection of their outlines, each with its
/// z, x and y (for maps of expired or dirty tiles).
pub fn tiles_geojson<'a>(tiles: impl IntoIterator<Item = &'a Tile>) -> serde_json::Value {
    let features: Vec<serde_json::Value> = tiles
        .into_iter()
        .map(|t| {
            let (w, s, e, n) = t.bounds();
            serde_json::json!({
                "type": "Feature",
                "properties": {"z": t.z, "x": t.x, "y": t.y},
                "geometry": {"type": "Polygon", "coordinates": [[[w, s], [e, s], [e, n], [w, n], [w, s]]]},
            })
        })
        .collect();
    serde_json::json!({"type": "FeatureCollection", "features": features})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_tiles() {
        // Monaco's port at zoom 14 (checked against the slippy-map formula
        // in Python) and the origin at zoom 1.
        assert_eq!(
            tile_of(7.4246, 43.7350, 14),
            Tile {
                z: 14,
                x: 8529,
                y: 5974
            }
        );
        assert_eq!(tile_of(0.0, 0.0, 1), Tile { z: 1, x: 1, y: 1 });
        assert_eq!(tile_of(-180.0, 89.0, 3), Tile { z: 3, x: 0, y: 0 });
        let t = Tile {
            z: 14,
            x: 8529,
            y: 5974,
        };
        let (w, s, e, n) = t.bounds();
        assert!(w <= 7.4246 && 7.4246 < e && s <= 43.7350 && 43.7350 < n);
        assert_eq!(
            t.parent(),
            Some(Tile {
                z: 13,
                x: 4264,
                y: 2987
            })
        );
        assert_eq!(t.to_zxy(), "14/8529/5974");
    }

    #[test]
    fn a_segment_touches_exactly_the_cells_it_crosses() {
        let mut c = Cells::new();
        // From (0.5, 0.5) to (3.5, 1.7) in cell units at z = 2: it crosses
        // y = 1 at x = 1.75.
        let seg = [(0.5 / 4.0, 0.5 / 4.0), (3.5 / 4.0, 1.7 / 4.0)];
        add_line(&seg, 2, 0.0, &mut c);
        let want: Cells = [(0, 0), (1, 0), (1, 1), (2, 1), (3, 1)]
            .into_iter()
            .collect();
        assert_eq!(c, want);
        // Through a corner, the closed rule touches the cell at the corner.
        let mut k = Cells::new();
        add_line(
            &[(0.5 / 4.0, 0.5 / 4.0), (3.5 / 4.0, 1.5 / 4.0)],
            2,
            0.0,
            &mut k,
        );
        assert!(k.contains(&(2, 0)) && k.contains(&(1, 0)) && k.contains(&(2, 1)));
        let mut b = Cells::new();
        add_line(&seg, 2, 0.6, &mut b);
        assert!(b.is_superset(&c) && b.contains(&(0, 1)) && b.contains(&(3, 2)));
    }

    #[test]
    fn a_polygon_covers_its_shape_not_its_bounding_box() {
        // A thin diagonal triangle over a 16 x 16 grid: its bounding box has
        // 256 cells, the shape far fewer.
        let tri = vec![(0.01, 0.01), (0.99, 0.99), (0.9, 0.99), (0.01, 0.01)];
        let mut c = Cells::new();
        add_polygon(&[tri], 4, 0.0, &mut c);
        assert!(c.len() < 60, "{}", c.len());
        assert!(c.contains(&(8, 8)) && !c.contains(&(15, 0)));
        // A big square with a hole: the hole's inner cells are not covered.
        let outer = vec![(0.0, 0.0), (1.0, 0.0), (1.0, 1.0), (0.0, 1.0), (0.0, 0.0)];
        let hole = vec![
            (0.25, 0.25),
            (0.75, 0.25),
            (0.75, 0.75),
            (0.25, 0.75),
            (0.25, 0.25),
        ];
        let mut d = Cells::new();
        add_polygon(&[outer, hole], 3, 0.0, &mut d);
        assert!(
            d.contains(&(0, 0))
                && d.contains(&(2, 2))
                && !d.contains(&(3, 3))
                && !d.contains(&(4, 4))
        );
    }

    #[test]
    fn parents_cover_every_zoom() {
        let cells: Cells = [(8528, 5974), (8529, 5974)].into_iter().collect();
        let t = with_parents(&cells, 14, 12);
        let zs: Vec<_> = t.iter().map(|t| t.z).collect();
        assert_eq!(zs.iter().filter(|z| **z == 14).count(), 2);
        assert_eq!(zs.iter().filter(|z| **z == 13).count(), 1);
        assert_eq!(zs.iter().filter(|z| **z == 12).count(), 1);
    }

    /// Issue 10's precision case: beyond ±85.0511° nothing is clamped onto
    /// the edge row.
    #[test]
    fn issue10_beyond_the_mercator_limit_is_clipped_not_clamped() {
        let w = |lon: f64, lat: f64| world(lon, lat);
        for z in [2u8, 6, 10] {
            let mut c = Cells::new();
            // A line along 89°N, wholly beyond the limit.
            add_line(&[w(-170.0, 89.0), w(170.0, 89.0)], z, 0.1, &mut c);
            add_point(w(10.0, -88.0), z, 0.1, &mut c);
            assert!(c.is_empty(), "z{z}: {} cells", c.len());
            // A line from 80°N to 89°N at one longitude: only the tiles of
            // its part inside the square, one column wide.
            let mut c = Cells::new();
            add_line(&[w(10.0, 80.0), w(10.0, 89.0)], z, 0.0, &mut c);
            let xs: BTreeSet<u32> = c.iter().map(|(x, _)| *x).collect();
            assert_eq!(xs.len(), 1, "z{z}: {c:?}");
            assert!(c.iter().all(|(_, y)| *y <= tile_of(10.0, 80.0, z).y));
            // An area from 80°N to 89°N over 20° of longitude: the same
            // cells as the area cut at the limit.
            let ring = |top: f64| {
                vec![
                    w(0.0, 80.0),
                    w(20.0, 80.0),
                    w(20.0, top),
                    w(0.0, top),
                    w(0.0, 80.0),
                ]
            };
            let (mut a, mut b) = (Cells::new(), Cells::new());
            add_polygon(&[ring(89.0)], z, 0.0, &mut a);
            add_polygon(&[ring(LAT_MAX)], z, 0.0, &mut b);
            assert_eq!(a, b, "z{z}");
        }
    }
}
