//! Facts of the Shortbread 1.0 schema, as data-driven cases:
//! - what one element becomes (layer, kind, zoom, attributes), checked
//!   through the schema alone with `check_element`;
//! - what the tiles of a real extract (Monaco 3047) hold per layer, checked
//!   by decoding every tile with `check_layer`: the lowest zoom a layer
//!   shows at, its attributes and their types, and its `kind` values.

use highwater_core::tile::Tile;
use highwater_osm::features::{Feature, Shape, TileLayer};
use highwater_osm::ops::OsmConfig;
use highwater_osm::tiles::mvt::{self, Value};
use highwater_osm::tiles::{self, Mbtiles};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

mod common;
use common::*;

fn layer() -> TileLayer {
    TileLayer::from_schema(highwater_osm::tiles::schema::Schema::bundled("shortbread").unwrap())
}

fn line() -> Shape {
    Shape::Lines(vec![vec![(0.5, 0.5), (0.5001, 0.5001)]])
}

fn area() -> Shape {
    let (a, b) = (0.5, 0.5001);
    Shape::Polygon(vec![vec![(a, a), (b, a), (b, b), (a, b), (a, a)]])
}

fn point() -> Shape {
    Shape::Point((0.5, 0.5))
}

/// The zoom a placement shows from and its attributes.
type Expected<'a> = (u8, &'a [(&'a str, Value)]);

/// Element cases: tags and shape in; per layer, the zoom it shows from and
/// the attributes out (`None`: in no layer of that name).
fn check_element(tags: &[(&str, &str)], shape: Shape, want: &[(&str, Option<Expected>)]) {
    let l = layer();
    let schema = l.schema.as_ref().unwrap();
    let f = Feature {
        tags: tags
            .iter()
            .filter(|(k, _)| schema.keys.contains(*k))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        shape,
    };
    let placed = l.place(&f);
    for (name, expect) in want {
        let ix = schema.layers.iter().position(|x| x.name == *name).unwrap();
        let got = placed.iter().find(|p| p.layer == ix);
        match (expect, got) {
            (None, None) => {}
            (Some((zoom, attrs)), Some(p)) => {
                assert_eq!(p.zoom, *zoom, "{tags:?} in {name}: zoom");
                let attrs: BTreeMap<String, Value> = attrs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.clone()))
                    .collect();
                assert_eq!(p.attrs, attrs, "{tags:?} in {name}: attributes");
            }
            (e, g) => panic!("{tags:?} in {name}: expected {e:?}, got {g:?}"),
        }
    }
}

fn s(v: &str) -> Value {
    Value::String(v.into())
}

#[test]
fn elements_go_where_the_spec_says() {
    check_element(
        &[("building", "yes")],
        area(),
        &[
            ("buildings", Some((14, &[("dummy", Value::Int(1))]))),
            ("land", None),
        ],
    );
    check_element(&[("building", "no")], area(), &[("buildings", None)]);
    // Regression (found by the MapLibre test): `building = "!no"` once
    // matched every area without a building tag, parks and ponds included.
    check_element(
        &[("leisure", "park")],
        area(),
        &[
            ("buildings", None),
            ("land", Some((11, &[("kind", s("park"))]))),
        ],
    );
    check_element(
        &[
            ("highway", "motorway_link"),
            ("oneway", "yes"),
            ("bridge", "viaduct"),
        ],
        line(),
        &[(
            "streets",
            Some((
                5,
                &[
                    ("kind", s("motorway")),
                    ("link", Value::Bool(true)),
                    ("oneway", Value::Bool(true)),
                    ("bridge", Value::Bool(true)),
                ],
            )),
        )],
    );
    check_element(
        &[
            ("highway", "residential"),
            ("name", "Rue Grimaldi"),
            ("ref", "D6;N7"),
        ],
        line(),
        &[
            ("streets", Some((12, &[("kind", s("residential"))]))),
            (
                "street_labels",
                Some((
                    14,
                    &[
                        ("kind", s("residential")),
                        ("name", s("Rue Grimaldi")),
                        ("ref", s("D6\nN7")),
                        ("ref_rows", Value::Int(2)),
                        ("ref_cols", Value::Int(2)),
                    ],
                )),
            ),
        ],
    );
    check_element(
        &[("railway", "rail"), ("service", "yard")],
        line(),
        &[(
            "streets",
            Some((
                10,
                &[
                    ("kind", s("rail")),
                    ("rail", Value::Bool(true)),
                    ("service", s("yard")),
                ],
            )),
        )],
    );
    check_element(
        &[("railway", "rail")],
        line(),
        &[(
            "streets",
            Some((8, &[("kind", s("rail")), ("rail", Value::Bool(true))])),
        )],
    );
    check_element(
        &[
            ("place", "town"),
            ("name", "Vaduz"),
            ("capital", "yes"),
            ("population", "5700"),
        ],
        point(),
        &[(
            "place_labels",
            Some((
                4,
                &[
                    ("kind", s("capital")),
                    ("name", s("Vaduz")),
                    ("population", Value::Int(5700)),
                ],
            )),
        )],
    );
    check_element(
        &[("place", "village"), ("name", "Planken")],
        point(),
        &[(
            "place_labels",
            Some((
                10,
                &[
                    ("kind", s("village")),
                    ("name", s("Planken")),
                    ("population", Value::Int(100)),
                ],
            )),
        )],
    );
    // No name, no label.
    check_element(&[("place", "village")], point(), &[("place_labels", None)]);
    check_element(
        &[("natural", "water"), ("water", "river"), ("name", "Rhein")],
        area(),
        &[
            (
                "water_polygons",
                Some((4, &[("kind", s("river")), ("way_area", way_area())])),
            ),
            (
                "water_polygons_labels",
                Some((
                    4,
                    &[
                        ("kind", s("river")),
                        ("way_area", way_area()),
                        ("name", s("Rhein")),
                    ],
                )),
            ),
        ],
    );
    check_element(
        &[("waterway", "stream")],
        line(),
        &[("water_lines", Some((14, &[("kind", s("stream"))])))],
    );
    check_element(
        &[("landuse", "forest")],
        area(),
        &[("land", Some((7, &[("kind", s("forest"))])))],
    );
    check_element(
        &[("natural", "wood")],
        area(),
        &[("land", Some((7, &[("kind", s("forest"))])))],
    );
    // A POI with an address is a POI, not an address too.
    check_element(
        &[
            ("amenity", "cafe"),
            ("cuisine", "coffee_shop"),
            ("addr:housenumber", "7"),
        ],
        point(),
        &[
            (
                "pois",
                Some((
                    14,
                    &[
                        ("amenity", s("cafe")),
                        ("cuisine", s("coffee_shop")),
                        ("housenumber", s("7")),
                    ],
                )),
            ),
            ("addresses", None),
        ],
    );
    check_element(
        &[("addr:housenumber", "7")],
        area(),
        &[("addresses", Some((14, &[("housenumber", s("7"))])))],
    );
    // An amenity the spec does not list is no POI.
    check_element(&[("amenity", "parking_space")], point(), &[("pois", None)]);
    check_element(
        &[("boundary", "administrative"), ("admin_level", "2")],
        area(),
        &[
            ("boundaries", Some((0, &[("admin_level", Value::Int(2))]))),
            ("boundary_labels", None),
        ],
    );
    check_element(
        &[("aerialway", "rope_tow")],
        line(),
        &[("aerialways", Some((12, &[("kind", s("rope-tow"))])))],
    );
    check_element(
        &[("route", "ferry"), ("motor_vehicle", "no")],
        line(),
        &[("ferries", Some((12, &[("kind", s("ferry"))])))],
    );
    check_element(
        &[("route", "ferry")],
        line(),
        &[("ferries", Some((10, &[("kind", s("ferry"))])))],
    );
    check_element(
        &[
            ("highway", "pedestrian"),
            ("area", "yes"),
            ("name", "Place du Casino"),
        ],
        area(),
        &[
            ("street_polygons", Some((14, &[("kind", s("pedestrian"))]))),
            (
                "streets_polygons_labels",
                Some((
                    14,
                    &[("kind", s("pedestrian")), ("name", s("Place du Casino"))],
                )),
            ),
            ("streets", None),
        ],
    );
}

fn way_area() -> Value {
    // 0.0001² world units in Mercator square metres, rounded.
    let m = 40_075_016.685_578_5_f64 * 0.0001;
    Value::Double((m * m).round().to_bits())
}

/// Monaco's Shortbread tiles, decoded: per layer, per zoom, its features.
fn monaco_tiles() -> &'static BTreeMap<String, BTreeMap<u8, Vec<mvt::TileFeature>>> {
    static TILES: OnceLock<BTreeMap<String, BTreeMap<u8, Vec<mvt::TileFeature>>>> = OnceLock::new();
    TILES.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let text = "[osm]\nstore = \"store\"\n[osm.tiles.sb]\nschema = \"shortbread\"\nmbtiles = \"sb.mbtiles\"\n";
        let v: toml::Value = toml::from_str(text).unwrap();
        let cfg = OsmConfig::parse(v.get("osm"), &tmp.path().join("highwater.toml"), tmp.path()).unwrap();
        let mut store = monaco(&tmp.path().join("store"));
        let d = cfg.of::<highwater_osm::tiles::TileDataset>()[0];
        tiles::build(&mut store, d).unwrap();
        let mb = Mbtiles::open(d.mbtiles.as_ref().unwrap()).unwrap().unwrap();
        let mut out: BTreeMap<String, BTreeMap<u8, Vec<mvt::TileFeature>>> = BTreeMap::new();
        for t in mb.tiles().unwrap() {
            let Tile { z, .. } = t;
            for (name, fs) in mvt::decode(&mb.get(t).unwrap().unwrap()).unwrap() {
                out.entry(name).or_default().entry(z).or_default().extend(fs);
            }
        }
        out
    })
}

/// Layer cases: the layer has features, none below the spec's `zoom`
/// (thinning may start it later: a small pond is below 1 px at z4), every
/// feature has
/// the `required` attributes with these types, and `kind` (when given)
/// takes only these values.
fn check_layer(name: &str, zoom: u8, required: &[(&str, &str)], kinds: Option<&[&str]>) {
    let all = monaco_tiles();
    let by_zoom = all
        .get(name)
        .unwrap_or_else(|| panic!("Monaco's tiles have no layer {name}"));
    let lowest = *by_zoom.keys().next().unwrap();
    assert!(
        lowest >= zoom,
        "{name}: shows at z{lowest}, the spec says from z{zoom}"
    );
    let mut seen_kinds = BTreeSet::new();
    for f in by_zoom.values().flatten() {
        for (attr, ty) in required {
            let v = f
                .tags
                .get(*attr)
                .unwrap_or_else(|| panic!("{name}: feature {} has no {attr}: {:?}", f.id, f.tags));
            assert_eq!(v.type_name(), *ty, "{name}.{attr} of {}", f.id);
        }
        if let Some(Value::String(k)) = f.tags.get("kind") {
            seen_kinds.insert(k.clone());
        }
    }
    if let Some(kinds) = kinds {
        let allowed: BTreeSet<String> = kinds.iter().map(|k| k.to_string()).collect();
        let extra: Vec<_> = seen_kinds.difference(&allowed).collect();
        assert!(
            extra.is_empty(),
            "{name}: kinds outside the spec: {extra:?}"
        );
        assert!(!seen_kinds.is_empty(), "{name}: no kind at all");
    }
}

const STREET_KINDS: &[&str] = &[
    "motorway",
    "trunk",
    "primary",
    "secondary",
    "tertiary",
    "unclassified",
    "residential",
    "busway",
    "bus_guideway",
    "living_street",
    "service",
    "pedestrian",
    "track",
    "footway",
    "steps",
    "path",
    "cycleway",
    "runway",
    "taxiway",
    "rail",
    "narrow_gauge",
    "tram",
    "light_rail",
    "funicular",
    "subway",
    "monorail",
];

const PLACE_KINDS: &[&str] = &[
    "capital",
    "state_capital",
    "city",
    "town",
    "village",
    "hamlet",
    "suburb",
    "quarter",
    "neighbourhood",
    "isolated_dwelling",
    "farm",
    "island",
    "locality",
];

#[test]
fn buildings_only_from_z14() {
    check_layer("buildings", 14, &[("dummy", "Number")], None);
    assert_eq!(
        monaco_tiles()["buildings"].keys().collect::<Vec<_>>(),
        vec![&14]
    );
}

#[test]
fn streets_carry_shortbreads_kinds() {
    check_layer("streets", 5, &[("kind", "String")], Some(STREET_KINDS));
    // Monaco's primary roads are its most important: from z8, as the spec says.
    assert_eq!(monaco_tiles()["streets"].keys().next(), Some(&8));
}

#[test]
fn place_labels_carry_name_and_kind() {
    check_layer(
        "place_labels",
        4,
        &[
            ("name", "String"),
            ("kind", "String"),
            ("population", "Number"),
        ],
        Some(PLACE_KINDS),
    );
}

#[test]
fn pois_and_addresses_only_at_z14_and_never_both() {
    check_layer("pois", 14, &[], None);
    check_layer("addresses", 14, &[], None);
    let all = monaco_tiles();
    let pois: BTreeSet<u64> = all["pois"].values().flatten().map(|f| f.id).collect();
    let both: Vec<u64> = all["addresses"]
        .values()
        .flatten()
        .map(|f| f.id)
        .filter(|i| pois.contains(i))
        .collect();
    assert!(both.is_empty(), "in pois and addresses: {both:?}");
}

#[test]
fn boundaries_are_typed_lines() {
    check_layer("boundaries", 0, &[("admin_level", "Number")], None);
    for f in monaco_tiles()["boundaries"].values().flatten() {
        assert_eq!(f.kind, mvt::GeomType::LineString);
        assert!(
            matches!(f.tags["admin_level"], Value::Int(2) | Value::Int(4)),
            "{:?}",
            f.tags
        );
    }
}

#[test]
fn water_land_and_labels_are_there() {
    check_layer("land", 10, &[("kind", "String")], None);
    check_layer(
        "water_polygons",
        10,
        &[("kind", "String"), ("way_area", "Number")],
        None,
    );
    check_layer("street_labels", 10, &[("kind", "String")], None);
    check_layer("public_transport", 11, &[("kind", "String")], None);
}
