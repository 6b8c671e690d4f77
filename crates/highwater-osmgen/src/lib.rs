//! Planet-like synthetic OpenStreetMap data (issue 25): extracts and diffs
//! for tests and benchmarks at sizes no real extract on this machine has.
//!
//! A world is a number of cities. City `k` is a street grid with curved
//! segments, a building in every block, points of interest, a place node, a
//! ring road and a bus route relation: about 3,465 nodes and 402 ways, the
//! planet's ratio of about 0.12 ways per node. Everything about city `k`
//! (its place on the globe, its ids, its tags) depends only on the seed and
//! `k`, so the world of 10M nodes holds the world of 1M nodes unchanged:
//! the smaller world is the larger one's "shared region", and a diff made
//! for the smaller world applies to both and touches the same elements.
//!
//! Ids are planet-like: each city's nodes are one run of consecutive ids,
//! and the runs are spread over 1..13 billion (ways over 1..1.2 billion,
//! relations over 1..14 million) in van der Corput order, so even the
//! smallest world spans the whole id range and a larger one fills in
//! between. Output is OSM XML (an extract, sorted by type then id, as
//! `osmium sort` leaves it) or OsmChange XML; `osmium cat` makes PBF.

use std::collections::BTreeSet;
use std::io::{self, Write};

/// Intersections per side of a city's street grid.
pub const GRID: usize = 20;
/// Extra nodes on every street segment between two intersections.
const BENDS: usize = 2;
/// Points of interest per city.
const POIS: usize = 60;
/// Nodes of a city's ring road.
const RING: usize = 40;
/// Slots the id ranges are divided in: at most this many cities (about
/// 227M nodes).
pub const CITIES_MAX: u64 = 1 << 16;
/// The largest node id a world reaches: about the planet's in 2026.
pub const NODE_ID_TOP: u64 = 13_000_000_000;
const WAY_ID_TOP: u64 = 1_200_000_000;
const REL_ID_TOP: u64 = 14_000_000;
/// New nodes a diff creates take ids above every city's.
pub const NEW_NODE_ID_BASE: i64 = NODE_ID_TOP as i64 + 1_000_000;

/// Local node index layout of a city.
const N_GRID: usize = GRID * GRID;
const N_ROW_BENDS: usize = GRID * (GRID - 1) * BENDS;
const N_BLOCKS: usize = (GRID - 1) * (GRID - 1);
const N_BUILDING: usize = N_BLOCKS * 4;
const OFF_ROW_BENDS: usize = N_GRID;
const OFF_COL_BENDS: usize = OFF_ROW_BENDS + N_ROW_BENDS;
const OFF_BUILDINGS: usize = OFF_COL_BENDS + N_ROW_BENDS;
const OFF_POIS: usize = OFF_BUILDINGS + N_BUILDING;
const OFF_PLACE: usize = OFF_POIS + POIS;
const OFF_RING: usize = OFF_PLACE + 1;
/// Nodes per city.
pub const CITY_NODES: usize = OFF_RING + RING;
/// Local way index layout: rows, columns, buildings, the ring road.
const W_COLS: usize = GRID;
const W_BUILDINGS: usize = 2 * GRID;
const W_RING: usize = W_BUILDINGS + N_BLOCKS;
/// Ways per city.
pub const CITY_WAYS: usize = W_RING + 1;

const AMENITIES: [&str; 6] = ["cafe", "restaurant", "pharmacy", "school", "bank", "fuel"];

/// SplitMix64: a well-mixed 64-bit hash of a value, for deterministic
/// pseudo-random choices without a dependency.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn h(seed: u64, parts: &[u64]) -> u64 {
    parts.iter().fold(mix(seed), |a, &p| mix(a ^ p))
}

/// The world: `cities` cities made from `seed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct World {
    pub seed: u64,
    pub cities: u64,
}

/// A node as written: id, latitude and longitude in 1e-7 degrees, tags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenNode {
    pub id: i64,
    pub lat_e7: i32,
    pub lon_e7: i32,
    pub tags: Vec<(String, String)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenWay {
    pub id: i64,
    pub refs: Vec<i64>,
    pub tags: Vec<(String, String)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenRelation {
    pub id: i64,
    /// (type `n`/`w`/`r`, id, role)
    pub members: Vec<(char, i64, String)>,
    pub tags: Vec<(String, String)>,
}

fn tag(k: &str, v: impl Into<String>) -> (String, String) {
    (k.to_string(), v.into())
}

/// The 16-bit bit reversal of `k`: city `k`'s slot in van der Corput order.
fn slot(k: u64) -> u64 {
    (k as u16).reverse_bits() as u64
}

/// A value in 0..n from a hash.
fn pick(x: u64, n: u64) -> u64 {
    x % n.max(1)
}

impl World {
    /// The smallest world with at least `nodes` nodes (one city at least).
    pub fn with_nodes(seed: u64, nodes: u64) -> Result<World, String> {
        let cities = nodes.div_ceil(CITY_NODES as u64).max(1);
        if cities > CITIES_MAX {
            return Err(format!(
                "{nodes} nodes would need {cities} cities; at most {CITIES_MAX} ({} nodes) fit the id layout",
                CITIES_MAX * CITY_NODES as u64
            ));
        }
        Ok(World { seed, cities })
    }

    pub fn nodes(&self) -> u64 {
        self.cities * CITY_NODES as u64
    }

    pub fn ways(&self) -> u64 {
        self.cities * CITY_WAYS as u64
    }

    /// City indexes in id order (their slots ascending).
    fn cities_in_id_order(&self) -> Vec<u64> {
        let mut v: Vec<u64> = (0..self.cities).collect();
        v.sort_by_key(|&k| slot(k));
        v
    }

    /// The first id of a city's run within a range of `top` ids, jittered
    /// inside its slot but leaving `used` ids before the next slot.
    fn run_base(&self, k: u64, top: u64, used: u64, salt: u64) -> i64 {
        let stride = top / CITIES_MAX;
        let room = stride.saturating_sub(used).max(1);
        (1 + slot(k) * stride + pick(h(self.seed, &[salt, k]), room)) as i64
    }

    fn node_id(&self, k: u64, local: usize) -> i64 {
        self.run_base(k, NODE_ID_TOP, CITY_NODES as u64, 1) + local as i64
    }

    fn way_id(&self, k: u64, local: usize) -> i64 {
        self.run_base(k, WAY_ID_TOP, CITY_WAYS as u64, 2) + local as i64
    }

    fn rel_id(&self, k: u64) -> i64 {
        self.run_base(k, REL_ID_TOP, 1, 3)
    }

    /// A city's centre (lat, lon in degrees): land-ish latitudes, any
    /// longitude.
    fn centre(&self, k: u64) -> (f64, f64) {
        let a = h(self.seed, &[4, k]);
        let lat = -55.0 + (a % 1_200_000) as f64 / 10_000.0;
        let lon = -179.0 + ((a >> 24) % 3_580_000) as f64 / 10_000.0;
        (lat, lon)
    }

    /// A point of a city's plane, in grid units (one unit about 100 m),
    /// as 1e-7 degrees.
    fn at(&self, k: u64, y: f64, x: f64) -> (i32, i32) {
        let (lat, lon) = self.centre(k);
        let unit = 0.0009;
        let la = lat + (y - GRID as f64 / 2.0) * unit;
        let lo = lon + (x - GRID as f64 / 2.0) * unit / lat.to_radians().cos();
        ((la * 1e7).round() as i32, (lo * 1e7).round() as i32)
    }

    /// Node `local` of city `k`, as the extract has it.
    pub fn node(&self, k: u64, local: usize) -> GenNode {
        let id = self.node_id(k, local);
        let jitter = |salt: u64| {
            let v = h(self.seed, &[5, k, local as u64, salt]);
            (v % 1000) as f64 / 1000.0 * 0.3 - 0.15
        };
        let mut tags = Vec::new();
        let (y, x) = if local < OFF_ROW_BENDS {
            ((local / GRID) as f64, (local % GRID) as f64)
        } else if local < OFF_COL_BENDS {
            let r = local - OFF_ROW_BENDS;
            let (row, seg, b) = (
                r / ((GRID - 1) * BENDS),
                (r / BENDS) % (GRID - 1),
                r % BENDS,
            );
            (
                row as f64 + jitter(0),
                seg as f64 + (b + 1) as f64 / (BENDS + 1) as f64,
            )
        } else if local < OFF_BUILDINGS {
            let r = local - OFF_COL_BENDS;
            let (col, seg, b) = (
                r / ((GRID - 1) * BENDS),
                (r / BENDS) % (GRID - 1),
                r % BENDS,
            );
            (
                seg as f64 + (b + 1) as f64 / (BENDS + 1) as f64,
                col as f64 + jitter(0),
            )
        } else if local < OFF_POIS {
            let r = local - OFF_BUILDINGS;
            let (block, corner) = (r / 4, r % 4);
            let (by, bx) = ((block / (GRID - 1)) as f64, (block % (GRID - 1)) as f64);
            let (dy, dx) = [(0.3, 0.3), (0.3, 0.7), (0.7, 0.7), (0.7, 0.3)][corner];
            (by + dy, bx + dx)
        } else if local < OFF_PLACE {
            let p = (local - OFF_POIS) as u64;
            let a = h(self.seed, &[6, k, p]);
            let amenity = AMENITIES[pick(a, AMENITIES.len() as u64) as usize];
            tags.push(tag("amenity", amenity));
            tags.push(tag("name", format!("{amenity} {k}-{p}")));
            (
                (a >> 8) as f64 % 1900.0 / 100.0,
                (a >> 20) as f64 % 1900.0 / 100.0,
            )
        } else if local < OFF_RING {
            tags.push(tag("place", "city"));
            tags.push(tag("name", format!("City {k}")));
            tags.push(tag("population", format!("{}", 10_000 + k * 7)));
            (GRID as f64 / 2.0, GRID as f64 / 2.0)
        } else {
            let i = (local - OFF_RING) as f64;
            let t = i / RING as f64 * std::f64::consts::TAU;
            let r = GRID as f64 * 0.75;
            (
                GRID as f64 / 2.0 + r * t.sin(),
                GRID as f64 / 2.0 + r * t.cos(),
            )
        };
        let (lat_e7, lon_e7) = self.at(k, y, x);
        GenNode {
            id,
            lat_e7,
            lon_e7,
            tags,
        }
    }

    /// Way `local` of city `k`.
    pub fn way(&self, k: u64, local: usize) -> GenWay {
        let n = |l: usize| self.node_id(k, l);
        let id = self.way_id(k, local);
        let (refs, tags) = if local < W_COLS {
            let row = local;
            let mut refs = Vec::new();
            for j in 0..GRID {
                refs.push(n(row * GRID + j));
                if j + 1 < GRID {
                    for b in 0..BENDS {
                        refs.push(n(OFF_ROW_BENDS + (row * (GRID - 1) + j) * BENDS + b));
                    }
                }
            }
            (
                refs,
                vec![
                    tag("highway", "residential"),
                    tag("name", format!("Street {k}-{row}")),
                ],
            )
        } else if local < W_BUILDINGS {
            let col = local - W_COLS;
            let mut refs = Vec::new();
            for i in 0..GRID {
                refs.push(n(i * GRID + col));
                if i + 1 < GRID {
                    for b in 0..BENDS {
                        refs.push(n(OFF_COL_BENDS + (col * (GRID - 1) + i) * BENDS + b));
                    }
                }
            }
            let kind = if col.is_multiple_of(5) {
                "secondary"
            } else {
                "residential"
            };
            (
                refs,
                vec![
                    tag("highway", kind),
                    tag("name", format!("Avenue {k}-{col}")),
                ],
            )
        } else if local < W_RING {
            let block = local - W_BUILDINGS;
            let c = |i| n(OFF_BUILDINGS + block * 4 + i);
            let mut tags = vec![tag("building", "yes")];
            if block.is_multiple_of(7) {
                tags.push(tag("addr:housenumber", format!("{}", block + 1)));
            }
            (vec![c(0), c(1), c(2), c(3), c(0)], tags)
        } else {
            let mut refs: Vec<i64> = (0..RING).map(|i| n(OFF_RING + i)).collect();
            refs.push(refs[0]);
            (
                refs,
                vec![
                    tag("highway", "primary"),
                    tag("name", format!("Ring {k}")),
                    tag("ref", format!("R{k}")),
                ],
            )
        };
        GenWay { id, refs, tags }
    }

    /// City `k`'s relation: a bus route along its streets.
    pub fn relation(&self, k: u64) -> GenRelation {
        let mut members: Vec<(char, i64, String)> = (0..GRID)
            .step_by(3)
            .map(|r| ('w', self.way_id(k, r), String::new()))
            .collect();
        members.push(('n', self.node_id(k, OFF_PLACE), "stop".into()));
        GenRelation {
            id: self.rel_id(k),
            members,
            tags: vec![
                tag("type", "route"),
                tag("route", "bus"),
                tag("name", format!("Bus {k}")),
            ],
        }
    }

    /// Writes the world as an OSM XML extract, sorted by type then id.
    pub fn write_extract(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(out, "<?xml version='1.0' encoding='UTF-8'?>")?;
        writeln!(out, "<osm version=\"0.6\" generator=\"highwater-osmgen\">")?;
        let order = self.cities_in_id_order();
        for &k in &order {
            for l in 0..CITY_NODES {
                write_node(out, &self.node(k, l))?;
            }
        }
        for &k in &order {
            for l in 0..CITY_WAYS {
                write_way(out, &self.way(k, l))?;
            }
        }
        for &k in &order {
            write_relation(out, &self.relation(k))?;
        }
        writeln!(out, "</osm>")
    }

    /// A diff of `changes` element changes to this world's cities, made
    /// from `diff_seed`: about nine node changes per way change (moved
    /// street vertices, renamed and moved POIs, new POIs, deleted POIs)
    /// and way changes (named buildings, re-tagged streets). Applied to a
    /// larger world of the same seed it changes the same elements.
    pub fn diff(&self, changes: usize, diff_seed: u64) -> Diff {
        let mut d = Diff::default();
        let mut used = BTreeSet::new();
        let mut i = 0u64;
        let mut made = 0usize;
        while made < changes {
            i += 1;
            let a = h(self.seed ^ 0x5eed, &[diff_seed, i]);
            let k = pick(a >> 4, self.cities);
            let which = a % 10;
            let b = a >> 32;
            match which {
                0..=5 => {
                    let local = OFF_ROW_BENDS + pick(b, (2 * N_ROW_BENDS) as u64) as usize;
                    if !used.insert(('n', k, local)) {
                        continue;
                    }
                    let mut n = self.node(k, local);
                    n.lat_e7 += (pick(b >> 12, 400) as i32) - 200;
                    n.lon_e7 += (pick(b >> 20, 400) as i32) - 200;
                    d.modify_nodes.push(n);
                }
                6 | 7 => {
                    let local = OFF_POIS + pick(b, POIS as u64) as usize;
                    if !used.insert(('n', k, local)) {
                        continue;
                    }
                    let mut n = self.node(k, local);
                    if which == 6 {
                        n.lat_e7 += (pick(b >> 12, 2000) as i32) - 1000;
                        for t in &mut n.tags {
                            if t.0 == "name" {
                                t.1.push_str(" (renamed)");
                            }
                        }
                        d.modify_nodes.push(n);
                    } else {
                        d.delete_nodes.push(n);
                    }
                }
                8 => {
                    let id = NEW_NODE_ID_BASE + (diff_seed % 1000) as i64 * 1_000_000 + made as i64;
                    let mut n = self.node(k, OFF_POIS + pick(b, POIS as u64) as usize);
                    n.id = id;
                    n.lon_e7 += 500;
                    n.tags = vec![
                        tag("amenity", "cafe"),
                        tag("name", format!("New cafe {id}")),
                    ];
                    d.create_nodes.push(n);
                }
                _ => {
                    let building = !b.is_multiple_of(3);
                    let b = b >> 2;
                    let local = if building {
                        W_BUILDINGS + pick(b, N_BLOCKS as u64) as usize
                    } else {
                        pick(b, W_BUILDINGS as u64) as usize
                    };
                    if !used.insert(('w', k, local)) {
                        continue;
                    }
                    let mut w = self.way(k, local);
                    if building {
                        w.tags.push(tag("name", format!("Hall {k}-{local}")));
                    } else {
                        for t in &mut w.tags {
                            if t.0 == "highway" {
                                t.1 = "tertiary".into();
                            }
                        }
                    }
                    w.tags.sort();
                    d.modify_ways.push(w);
                }
            }
            made += 1;
        }
        d.modify_nodes.sort_by_key(|n| n.id);
        d.create_nodes.sort_by_key(|n| n.id);
        d.delete_nodes.sort_by_key(|n| n.id);
        d.modify_ways.sort_by_key(|w| w.id);
        d
    }
}

/// An OsmChange's contents.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diff {
    pub create_nodes: Vec<GenNode>,
    pub modify_nodes: Vec<GenNode>,
    pub delete_nodes: Vec<GenNode>,
    pub modify_ways: Vec<GenWay>,
}

impl Diff {
    pub fn len(&self) -> usize {
        self.create_nodes.len()
            + self.modify_nodes.len()
            + self.delete_nodes.len()
            + self.modify_ways.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes the diff as OsmChange XML: creates, modifies, deletes.
    pub fn write(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(out, "<?xml version='1.0' encoding='UTF-8'?>")?;
        writeln!(
            out,
            "<osmChange version=\"0.6\" generator=\"highwater-osmgen\">"
        )?;
        writeln!(out, "<create>")?;
        for n in &self.create_nodes {
            write_node(out, n)?;
        }
        writeln!(out, "</create>\n<modify>")?;
        for n in &self.modify_nodes {
            write_node(out, n)?;
        }
        for w in &self.modify_ways {
            write_way(out, w)?;
        }
        writeln!(out, "</modify>\n<delete>")?;
        for n in &self.delete_nodes {
            writeln!(
                out,
                " <node id=\"{}\" version=\"2\" lat=\"{}\" lon=\"{}\"/>",
                n.id,
                e7(n.lat_e7),
                e7(n.lon_e7)
            )?;
        }
        writeln!(out, "</delete>\n</osmChange>")
    }
}

/// 1e-7 degrees as a decimal with 7 places.
pub fn e7(v: i32) -> String {
    let sign = if v < 0 { "-" } else { "" };
    let a = (v as i64).abs();
    format!("{sign}{}.{:07}", a / 10_000_000, a % 10_000_000)
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('"', "&quot;")
}

fn write_tags(out: &mut impl Write, tags: &[(String, String)]) -> io::Result<()> {
    for (k, v) in tags {
        writeln!(out, "  <tag k=\"{}\" v=\"{}\"/>", esc(k), esc(v))?;
    }
    Ok(())
}

fn write_node(out: &mut impl Write, n: &GenNode) -> io::Result<()> {
    let head = format!(
        " <node id=\"{}\" version=\"1\" lat=\"{}\" lon=\"{}\"",
        n.id,
        e7(n.lat_e7),
        e7(n.lon_e7)
    );
    if n.tags.is_empty() {
        writeln!(out, "{head}/>")
    } else {
        writeln!(out, "{head}>")?;
        write_tags(out, &n.tags)?;
        writeln!(out, " </node>")
    }
}

fn write_way(out: &mut impl Write, w: &GenWay) -> io::Result<()> {
    writeln!(out, " <way id=\"{}\" version=\"1\">", w.id)?;
    for r in &w.refs {
        writeln!(out, "  <nd ref=\"{r}\"/>")?;
    }
    write_tags(out, &w.tags)?;
    writeln!(out, " </way>")
}

fn write_relation(out: &mut impl Write, r: &GenRelation) -> io::Result<()> {
    writeln!(out, " <relation id=\"{}\" version=\"1\">", r.id)?;
    for (t, id, role) in &r.members {
        let t = match t {
            'n' => "node",
            'w' => "way",
            _ => "relation",
        };
        writeln!(
            out,
            "  <member type=\"{t}\" ref=\"{id}\" role=\"{}\"/>",
            esc(role)
        )?;
    }
    write_tags(out, &r.tags)?;
    writeln!(out, " </relation>")
}

impl World {
    /// The same seed with `cities` cities: the shared region of a larger
    /// world.
    pub fn with_cities(&self, cities: u64) -> World {
        World {
            seed: self.seed,
            cities,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(w: &World) -> String {
        let mut v = Vec::new();
        w.write_extract(&mut v).unwrap();
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn deterministic_and_the_small_world_is_inside_the_large() {
        let small = World { seed: 7, cities: 3 };
        let large = World { seed: 7, cities: 9 };
        assert_eq!(text(&small), text(&small));
        for k in 0..3 {
            assert_eq!(small.node(k, 17), large.node(k, 17));
            assert_eq!(small.way(k, 30), large.way(k, 30));
            assert_eq!(small.relation(k), large.relation(k));
        }
        assert_eq!(small.diff(200, 1), large.with_cities(3).diff(200, 1));
    }

    #[test]
    fn ids_are_sorted_runs_spread_to_billions() {
        let w = World {
            seed: 1,
            cities: 40,
        };
        let mut ids = Vec::new();
        for k in w.cities_in_id_order() {
            for l in 0..CITY_NODES {
                ids.push(w.node(k, l).id);
            }
        }
        assert!(ids.windows(2).all(|p| p[0] < p[1]), "ascending, no repeats");
        assert!(*ids.last().unwrap() > 1 << 33, "beyond 2^33");
        assert!(*ids.last().unwrap() < NODE_ID_TOP as i64);
        let ways = CITY_WAYS as f64 / CITY_NODES as f64;
        assert!((0.10..0.14).contains(&ways), "{ways} ways per node");
    }

    #[test]
    fn a_diff_has_the_changes_asked_for_and_refs_that_exist() {
        let w = World { seed: 3, cities: 5 };
        let d = w.diff(500, 9);
        assert_eq!(d.len(), 500);
        assert!(!d.modify_ways.is_empty() && !d.create_nodes.is_empty());
        let mut out = Vec::new();
        d.write(&mut out).unwrap();
        assert!(String::from_utf8(out).unwrap().contains("<delete>"));
    }

    #[test]
    fn coordinates_print_with_seven_places() {
        for (v, s) in [
            (0, "0.0000000"),
            (-5, "-0.0000005"),
            (1234567890, "123.4567890"),
        ] {
            assert_eq!(e7(v), s);
        }
    }
}
