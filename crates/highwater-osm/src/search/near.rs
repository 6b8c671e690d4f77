//! Reverse lookup (issue 50): the documents nearest to a point, from the
//! search dataset's spatial index in the store (`search_points`: each
//! document's point, keyed by the shapes index's quadtree cell,
//! [`crate::cells`]), kept by the same writes that keep the documents.
//!
//! Nearest is by great-circle distance on a sphere of the Earth's mean
//! radius. The lookup reads boxes that grow around the point until they
//! hold enough documents within the circle they enclose (or reach the
//! radius asked): a document outside a box is farther than the circle's
//! radius, so the nearest found inside are the nearest of all.

use super::{doc_key, Doc, SearchDataset, SearchError, SearchStore};
use crate::model::MemberKind;
use crate::store::{built_recipe_key, kind_of, Store, StoreError};
use rusqlite::params;

/// The Earth's mean radius, in metres (IUGG).
pub const EARTH_RADIUS_M: f64 = 6_371_008.8;

/// The first box's half-size around the point, in metres.
const FIRST_RADIUS_M: f64 = 100.0;

/// The cell of the spatial index a point (degrees) is kept under.
pub fn cell_of(lon: f64, lat: f64) -> i64 {
    let (x, y) = highwater_core::tile::world(lon, lat);
    crate::cells::cell_of((x, y, x, y))
}

/// Great-circle distance between two points (degrees), in metres.
pub fn distance_m((lon1, lat1): (f64, f64), (lon2, lat2): (f64, f64)) -> f64 {
    let (p1, p2) = (lat1.to_radians(), lat2.to_radians());
    let dp = p2 - p1;
    let dl = (lon2 - lon1).to_radians();
    let h = (dp / 2.0).sin().powi(2) + p1.cos() * p2.cos() * (dl / 2.0).sin().powi(2);
    2.0 * EARTH_RADIUS_M * h.sqrt().min(1.0).asin()
}

/// The boxes (min lon, min lat, max lon, max lat) that hold every point
/// within `r_m` of (lon, lat): one, or two where the circle crosses the
/// antimeridian; the whole band of longitudes where it reaches a pole.
fn boxes((lon, lat): (f64, f64), r_m: f64) -> Vec<(f64, f64, f64, f64)> {
    let ang = r_m / EARTH_RADIUS_M;
    let dlat = ang.to_degrees();
    let (s, n) = (lat - dlat, lat + dlat);
    if s <= -90.0 || n >= 90.0 || ang >= std::f64::consts::FRAC_PI_2 {
        return vec![(-180.0, s.max(-90.0), 180.0, n.min(90.0))];
    }
    // The widest longitude a point of the circle reaches.
    let dlon = (ang.sin() / lat.to_radians().cos())
        .min(1.0)
        .asin()
        .to_degrees();
    let (w, e) = (lon - dlon, lon + dlon);
    if w < -180.0 {
        vec![(-180.0, s, e, n), (w + 360.0, s, 180.0, n)]
    } else if e > 180.0 {
        vec![(w, s, 180.0, n), (-180.0, s, e - 360.0, n)]
    } else {
        vec![(w, s, e, n)]
    }
}

/// The documents' points in the boxes around (lon, lat) of `r_m`, with
/// their distance, those within `r_m` only.
fn within(
    store: &Store,
    dataset: &str,
    at: (f64, f64),
    r_m: f64,
) -> Result<Vec<(f64, MemberKind, i64)>, StoreError> {
    let mut st = store
        .conn()
        .prepare_cached(
            "SELECT kind, id, lon, lat FROM search_points WHERE dataset = ?1 AND cell BETWEEN ?2 AND ?3",
        )
        .map_err(|e| store.err(e))?;
    let mut out = Vec::new();
    for (w, s, e, n) in boxes(at, r_m) {
        // World y grows southwards.
        let (x0, y0) = highwater_core::tile::world(w, n);
        let (x1, y1) = highwater_core::tile::world(e, s);
        for (a, b) in crate::cells::ranges((x0, y0, x1, y1)) {
            let rows = st
                .query_map(params![dataset, a, b], |r| {
                    Ok((
                        kind_of(r.get(0)?),
                        r.get::<_, i64>(1)?,
                        r.get::<_, f64>(2)?,
                        r.get::<_, f64>(3)?,
                    ))
                })
                .map_err(|e| store.err(e))?;
            for r in rows {
                let (kind, id, plon, plat) = r.map_err(|e| store.err(e))?;
                if (w..=e).contains(&plon) && (s..=n).contains(&plat) {
                    let d = distance_m(at, (plon, plat));
                    if d <= r_m {
                        out.push((d, kind, id));
                    }
                }
            }
        }
    }
    Ok(out)
}

/// What a reverse lookup found: the documents nearest first, with their
/// distance in metres, and the committed state they were read from.
#[derive(Clone, Debug)]
pub struct Nearest {
    pub docs: Vec<(Doc, f64)>,
    /// The replication sequence the documents reflect: the store's when
    /// the dataset was last drained or rebuilt.
    pub sequence: Option<i64>,
    /// Whether the documents were made by the configured recipe (a store
    /// whose search dataset was last built by older code has no points).
    pub current: bool,
}

/// The `limit` documents nearest to (lat, lon) within `radius_m`, nearest
/// first (ties by type and id), read in one snapshot of the store.
pub fn nearest(
    store: &Store,
    d: &SearchDataset,
    (lat, lon): (f64, f64),
    radius_m: f64,
    limit: usize,
) -> Result<Nearest, SearchError> {
    let out = store.snapshot(|s| {
        // What the documents reflect, not the marker (which runs ahead
        // of them by the dirty keys a drain has yet to take).
        let sequence = super::drained_sequence(s, &d.name)?;
        let current = s.meta(&built_recipe_key(&d.name))?.as_deref() == Some(d.recipe.as_str());
        let mut r = FIRST_RADIUS_M.min(radius_m);
        let mut found = loop {
            let found = within(s, &d.name, (lon, lat), r)?;
            if found.len() >= limit || r >= radius_m {
                break found;
            }
            r = (r * 4.0).min(radius_m);
        };
        found.sort_by(|a, b| {
            a.0.total_cmp(&b.0)
                .then_with(|| doc_key((a.1, a.2)).cmp(&doc_key((b.1, b.2))))
        });
        // A point on the antimeridian may sit in both boxes.
        found.dedup_by(|a, b| (a.1, a.2) == (b.1, b.2));
        let mut docs = Vec::new();
        for (dist, kind, id) in found.into_iter().take(limit) {
            if let Some((doc, _)) = s.search_doc(&d.name, (kind, id))? {
                docs.push((doc, dist));
            }
        }
        Ok(Nearest {
            docs,
            sequence,
            current,
        })
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_box_holds_its_circle_across_the_antimeridian_and_at_the_poles() {
        // The circle's points are in some box.
        for (at, r) in [
            ((179.9, 10.0), 50_000.0),
            ((-179.9, -10.0), 50_000.0),
            ((7.42, 43.73), 1000.0),
            ((0.0, 89.99), 5_000.0),
        ] {
            let bs = boxes(at, r);
            for i in 0..360 {
                let b = (i as f64).to_radians();
                // A point at distance r*0.999 in bearing b.
                let d = r * 0.999 / EARTH_RADIUS_M;
                let (p1, l1) = (at.1.to_radians(), at.0.to_radians());
                let p2 = (p1.sin() * d.cos() + p1.cos() * d.sin() * b.cos()).asin();
                let l2 = l1 + (b.sin() * d.sin() * p1.cos()).atan2(d.cos() - p1.sin() * p2.sin());
                let mut lon = l2.to_degrees();
                if lon > 180.0 {
                    lon -= 360.0;
                }
                if lon < -180.0 {
                    lon += 360.0;
                }
                let lat = p2.to_degrees();
                assert!(
                    bs.iter()
                        .any(|(w, s, e, n)| (*w..=*e).contains(&lon) && (*s..=*n).contains(&lat)),
                    "{at:?} r {r}: ({lon}, {lat}) in none of {bs:?}"
                );
            }
        }
    }

    #[test]
    fn distances_are_great_circle_metres() {
        // One degree of latitude is about 111.2 km on the mean sphere.
        let d = distance_m((7.0, 43.0), (7.0, 44.0));
        assert!((d - 111_195.0).abs() < 1.0, "{d}");
        assert_eq!(distance_m((7.0, 43.0), (7.0, 43.0)), 0.0);
    }
}
