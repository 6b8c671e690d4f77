//! Tile schemas: which layers a vector tile has, which OSM features go into
//! each, from which zoom, with which attributes, and how their shapes are
//! simplified and thinned per zoom. A schema is data (TOML); the Shortbread
//! 1.0 schema is one bundled instance (`schema = "shortbread"`, the file
//! `shortbread.toml` beside this one), and a project can give its own file.
//!
//! The schema is applied in two steps, both pure:
//! - [`Schema::classify`]: a feature (the tags the schema reads and the
//!   element's shape) → its placements: per layer, the rule that matched,
//!   the attributes, and the base shape (a polygon's label point for label
//!   layers). Independent of the zoom.
//! - [`Placement::at`]: a placement at one zoom → the shape the tile shows,
//!   if any: below the rule's zoom nothing; below the layer's minimum
//!   length or area in tile pixels nothing; otherwise the shape simplified
//!   with the layer's tolerance in tile pixels.
//!
//! Expiry and the cutter both call these, so a feature expires tiles only
//! at the zooms where it shows, with the shape it shows there; that is what
//! keeps incremental tiles equal to their rebuild.
//!
//! File format (see `shortbread.toml` for a complete one):
//!
//! ```toml
//! name = "my-schema"
//! zoom_max = 14               # min sizes do not apply here: everything shows
//! simplify_px = 0.25          # default tolerance, tile pixels (256 per tile)
//! buffer_px = 4
//!
//! [[layers]]
//! name = "water"
//! geometry = "polygon"        # point | line | outline | polygon | label | polygon_label
//! min_area_px = 1.0
//! sort = "-way_area"          # by an attribute, `-` for descending
//! attributes = { kind = "$kind", way_area = "$way_area", name = "name" }
//! [[layers.features]]
//! tags = { natural = "water", water = "!river" }   # "*" present, "!" absent, "!v" present but not v, [..] one of
//! kind = "water"
//! zoom = 4
//! set = { intermittent = false }                   # typed defaults for attributes left unset
//! ```

use crate::geom::{inside, nesting, Feature, Shape, P};
use crate::mvt::Value;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};

/// The bundled Shortbread 1.0 schema.
pub const SHORTBREAD: &str = include_str!("shortbread.toml");

/// The earth's circumference at the equator in Web Mercator metres: world
/// coordinates times this are Mercator metres (the unit of Shortbread's
/// `way_area`).
const MERCATOR_M: f64 = 40_075_016.685_578_5;

/// Tile pixels per tile, the unit of every `_px` setting (as planetiler and
/// tippecanoe count them).
const TILE_PX: f64 = 256.0;

#[derive(Clone, Debug, PartialEq)]
pub enum Geometry {
    /// Nodes only.
    Point,
    /// Lines (ways that are not areas, route relations, open boundaries).
    Line,
    /// Lines, and the rings of areas drawn as lines (boundaries).
    Outline,
    /// Areas.
    Polygon,
    /// Nodes, and areas as their label point.
    Label,
    /// Areas as their label point.
    PolygonLabel,
}

#[derive(Clone, Debug, PartialEq)]
enum Match {
    /// `"*"`: present.
    Any,
    /// `"!"`: absent.
    Absent,
    /// `"!v"`: present, with another value (`building = "!no"`).
    Not(String),
    OneOf(Vec<String>),
}

impl Match {
    fn test(&self, v: Option<&str>) -> bool {
        match self {
            Match::Any => v.is_some(),
            Match::Absent => v.is_none(),
            Match::Not(x) => v.is_some_and(|v| v != x),
            Match::OneOf(xs) => v.is_some_and(|v| xs.iter().any(|x| x == v)),
        }
    }
}

type Filter = Vec<(String, Match)>;

fn matches(filter: &Filter, tags: &BTreeMap<String, String>) -> bool {
    filter
        .iter()
        .all(|(k, m)| m.test(tags.get(k).map(String::as_str)))
}

#[derive(Clone, Debug)]
enum Kind {
    Literal(String),
    /// `"{key}"`: the value of that tag.
    Tag(String),
}

#[derive(Clone, Debug)]
struct Rule {
    tags: Filter,
    kind: Option<Kind>,
    zoom: u8,
    set: Vec<(String, Value)>,
}

#[derive(Clone, Debug)]
enum Source {
    Tag(String),
    Int(String),
    /// The tag's value when some rule of the layer lists it for that key.
    Listed(String),
    TrueIf(Vec<(String, String)>),
    Const(Value),
    Kind,
    WayArea,
    WayAreaHa,
    /// `ref` with `;` as line breaks, its rows and its longest row.
    RefLines,
    RefRows,
    RefCols,
}

#[derive(Clone, Debug)]
struct Attr {
    name: String,
    source: Source,
    when: Filter,
}

#[derive(Clone, Debug)]
pub struct Layer {
    pub name: String,
    pub geometry: Geometry,
    rules: Vec<Rule>,
    attrs: Vec<Attr>,
    require_any: Vec<String>,
    exclude_if_in: Vec<usize>,
    min_area_px: f64,
    min_length_px: f64,
    simplify_px: f64,
    sort: Option<(String, bool)>,
    listed: BTreeMap<String, BTreeSet<String>>,
}

impl Layer {
    /// The lowest zoom any of its features shows at.
    pub fn zoom_min(&self) -> u8 {
        self.rules.iter().map(|r| r.zoom).min().unwrap_or(0)
    }

    /// Attribute names and their MVT types, for the MBTiles metadata.
    pub fn fields(&self) -> BTreeMap<String, &'static str> {
        let mut out = BTreeMap::new();
        for a in &self.attrs {
            let t = match &a.source {
                Source::Int(_) | Source::RefRows | Source::RefCols => "Number",
                Source::WayArea | Source::WayAreaHa => "Number",
                Source::TrueIf(_) => "Boolean",
                Source::Const(v) => v.type_name(),
                _ => "String",
            };
            out.insert(a.name.clone(), t);
        }
        for r in &self.rules {
            for (k, v) in &r.set {
                out.entry(k.clone()).or_insert(v.type_name());
            }
        }
        out
    }
}

/// A parsed schema.
#[derive(Clone, Debug)]
pub struct Schema {
    pub name: String,
    pub zoom_max: u8,
    /// In tile widths.
    pub buffer: f64,
    pub layers: Vec<Layer>,
    /// Every tag key a rule or attribute reads: what the features carry.
    pub keys: BTreeSet<String>,
}

/// What is wrong with a schema file, named by its path.
#[derive(Debug, thiserror::Error)]
#[error("tile schema {origin}: {msg}")]
pub struct SchemaError {
    pub origin: String,
    pub msg: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSchema {
    name: String,
    zoom_max: u8,
    #[serde(default)]
    simplify_px: Option<f64>,
    #[serde(default)]
    buffer_px: Option<f64>,
    layers: Vec<RawLayer>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLayer {
    name: String,
    geometry: String,
    #[serde(default)]
    features: Vec<RawRule>,
    #[serde(default)]
    attributes: BTreeMap<String, toml::Value>,
    #[serde(default)]
    require_any: Vec<String>,
    #[serde(default)]
    exclude_if_in: Vec<String>,
    min_area_px: Option<f64>,
    min_length_px: Option<f64>,
    simplify_px: Option<f64>,
    sort: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    tags: BTreeMap<String, toml::Value>,
    kind: Option<String>,
    zoom: u8,
    #[serde(default)]
    set: BTreeMap<String, toml::Value>,
}

fn filter(raw: &BTreeMap<String, toml::Value>, at: &str) -> Result<Filter, String> {
    raw.iter()
        .map(|(k, v)| {
            let m = match v {
                toml::Value::String(s) if s == "*" => Match::Any,
                toml::Value::String(s) if s == "!" => Match::Absent,
                toml::Value::String(s) if s.starts_with('!') => Match::Not(s[1..].to_string()),
                toml::Value::String(s) => Match::OneOf(vec![s.clone()]),
                toml::Value::Array(a) => Match::OneOf(
                    a.iter()
                        .map(|x| {
                            x.as_str().map(str::to_string).ok_or_else(|| {
                                format!("{at}: tag {k:?}: list strings only, found {x:?}")
                            })
                        })
                        .collect::<Result<_, _>>()?,
                ),
                other => {
                    return Err(format!(
                        "{at}: tag {k:?} = {other:?}: give a value, a list of values, \"*\", \"!\" or \"!value\""
                    ))
                }
            };
            Ok((k.clone(), m))
        })
        .collect()
}

fn value(v: &toml::Value, at: &str) -> Result<Value, String> {
    Ok(match v {
        toml::Value::String(s) => Value::String(s.clone()),
        toml::Value::Integer(i) => Value::Int(*i),
        toml::Value::Float(f) => Value::Double(f.to_bits()),
        toml::Value::Boolean(b) => Value::Bool(*b),
        other => {
            return Err(format!(
                "{at}: {other:?} is not a string, number or boolean"
            ))
        }
    })
}

fn attr(name: &str, v: &toml::Value, at: &str) -> Result<Attr, String> {
    let at = format!("{at} attribute {name:?}");
    let plain = |source| Attr {
        name: name.to_string(),
        source,
        when: Vec::new(),
    };
    Ok(match v {
        toml::Value::String(s) => plain(match s.as_str() {
            "$kind" => Source::Kind,
            "$way_area" => Source::WayArea,
            "$way_area_ha" => Source::WayAreaHa,
            "$ref" => Source::RefLines,
            "$ref_rows" => Source::RefRows,
            "$ref_cols" => Source::RefCols,
            s if s.starts_with('$') => {
                return Err(format!(
                    "{at}: {s:?} is not computed here; use $kind, $way_area, $way_area_ha, $ref, $ref_rows or $ref_cols, or a tag key"
                ))
            }
            s => Source::Tag(s.to_string()),
        }),
        toml::Value::Table(t) => {
            let mut source = None;
            let mut when = Vec::new();
            for (k, x) in t {
                let s = || {
                    x.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| format!("{at}: {k} takes a tag key"))
                };
                match k.as_str() {
                    "tag" => source = Some(Source::Tag(s()?)),
                    "int" => source = Some(Source::Int(s()?)),
                    "listed" => source = Some(Source::Listed(s()?)),
                    "true_if" => {
                        let list = x
                            .as_array()
                            .ok_or_else(|| format!("{at}: true_if takes a list of \"key=value\""))?;
                        let mut pairs = Vec::new();
                        for p in list {
                            let (a, b) = p.as_str().and_then(|p| p.split_once('=')).ok_or_else(
                                || format!("{at}: true_if: {p:?} is not \"key=value\""),
                            )?;
                            pairs.push((a.to_string(), b.to_string()));
                        }
                        source = Some(Source::TrueIf(pairs));
                    }
                    "when" => {
                        let t = x
                            .as_table()
                            .ok_or_else(|| format!("{at}: when takes a table of tags"))?;
                        let t: BTreeMap<String, toml::Value> =
                            t.iter().map(|(a, b)| (a.clone(), b.clone())).collect();
                        when = filter(&t, &at)?;
                    }
                    other => {
                        return Err(format!(
                            "{at}: unknown {other:?}; use tag, int, listed, true_if or when"
                        ))
                    }
                }
            }
            Attr {
                name: name.to_string(),
                source: source
                    .ok_or_else(|| format!("{at}: give one of tag, int, listed or true_if"))?,
                when,
            }
        }
        other => plain(Source::Const(value(other, &at)?)),
    })
}

fn geometry(s: &str, at: &str) -> Result<Geometry, String> {
    Ok(match s {
        "point" => Geometry::Point,
        "line" => Geometry::Line,
        "outline" => Geometry::Outline,
        "polygon" => Geometry::Polygon,
        "label" => Geometry::Label,
        "polygon_label" => Geometry::PolygonLabel,
        other => {
            return Err(format!(
            "{at}: geometry {other:?}: use point, line, outline, polygon, label or polygon_label"
        ))
        }
    })
}

impl Schema {
    /// The bundled schema of that name, or the file at `path`.
    pub fn bundled(name: &str) -> Option<Schema> {
        match name {
            "shortbread" => {
                Some(Schema::parse(SHORTBREAD, "shortbread (bundled)").expect("bundled schema"))
            }
            _ => None,
        }
    }

    /// Parses a schema; `origin` names it in errors (a path, or the
    /// bundled schema's name).
    pub fn parse(text: &str, origin: &str) -> Result<Schema, SchemaError> {
        let err = |msg: String| SchemaError {
            origin: origin.to_string(),
            msg,
        };
        let raw: RawSchema = toml::from_str(text).map_err(|e| err(e.to_string()))?;
        if raw.zoom_max > 20 {
            return Err(err(format!("zoom_max = {}: use 0 to 20", raw.zoom_max)));
        }
        let simplify = raw.simplify_px.unwrap_or(0.0);
        let buffer_px = raw.buffer_px.unwrap_or(4.0);
        if !(0.0..=256.0).contains(&buffer_px) || !(0.0..=16.0).contains(&simplify) {
            return Err(err(
                "buffer_px takes 0 to 256 and simplify_px 0 to 16 tile pixels".into(),
            ));
        }
        let names: Vec<String> = raw.layers.iter().map(|l| l.name.clone()).collect();
        let mut layers = Vec::new();
        let mut keys = BTreeSet::new();
        for (li, l) in raw.layers.iter().enumerate() {
            let at = format!("layer {:?}", l.name);
            if names[..li].contains(&l.name) {
                return Err(err(format!("{at} is given twice")));
            }
            let mut rules = Vec::new();
            let mut listed: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for (ri, r) in l.features.iter().enumerate() {
                let at = format!("{at} feature {}", ri + 1);
                if r.zoom > raw.zoom_max {
                    return Err(err(format!(
                        "{at}: zoom {} is above the schema's zoom_max {}",
                        r.zoom, raw.zoom_max
                    )));
                }
                let tags = filter(&r.tags, &at).map_err(err)?;
                if tags.is_empty() {
                    return Err(err(format!("{at}: give at least one tag")));
                }
                for (k, m) in &tags {
                    keys.insert(k.clone());
                    if let Match::OneOf(v) = m {
                        listed
                            .entry(k.clone())
                            .or_default()
                            .extend(v.iter().cloned());
                    }
                }
                let kind = r.kind.as_ref().map(|k| {
                    match k.strip_prefix('{').and_then(|k| k.strip_suffix('}')) {
                        Some(key) => {
                            keys.insert(key.to_string());
                            Kind::Tag(key.to_string())
                        }
                        None => Kind::Literal(k.clone()),
                    }
                });
                let set = r
                    .set
                    .iter()
                    .map(|(k, v)| Ok((k.clone(), value(v, &at)?)))
                    .collect::<Result<_, String>>()
                    .map_err(err)?;
                rules.push(Rule {
                    tags,
                    kind,
                    zoom: r.zoom,
                    set,
                });
            }
            if rules.is_empty() {
                return Err(err(format!("{at}: give at least one [[layers.features]]")));
            }
            let attrs: Vec<Attr> = l
                .attributes
                .iter()
                .map(|(n, v)| attr(n, v, &at))
                .collect::<Result<_, _>>()
                .map_err(err)?;
            for a in &attrs {
                match &a.source {
                    Source::Tag(k) | Source::Int(k) | Source::Listed(k) => {
                        keys.insert(k.clone());
                    }
                    Source::TrueIf(p) => keys.extend(p.iter().map(|(k, _)| k.clone())),
                    Source::RefLines | Source::RefRows | Source::RefCols => {
                        keys.insert("ref".into());
                    }
                    _ => {}
                }
                keys.extend(a.when.iter().map(|(k, _)| k.clone()));
            }
            keys.extend(l.require_any.iter().cloned());
            let mut exclude_if_in = Vec::new();
            for e in &l.exclude_if_in {
                let i = names.iter().position(|n| n == e).ok_or_else(|| {
                    err(format!(
                        "{at}: exclude_if_in names {e:?}, which is no layer"
                    ))
                })?;
                if i >= li {
                    return Err(err(format!(
                        "{at}: exclude_if_in {e:?} must name a layer given before it"
                    )));
                }
                exclude_if_in.push(i);
            }
            let sort = l.sort.as_ref().map(|s| match s.strip_prefix('-') {
                Some(a) => (a.to_string(), true),
                None => (s.clone(), false),
            });
            let px = |v: Option<f64>, what: &str| -> Result<f64, SchemaError> {
                let v = v.unwrap_or(0.0);
                if (0.0..=1e6).contains(&v) {
                    Ok(v)
                } else {
                    Err(err(format!(
                        "{at}: {what} = {v}: give 0 or more tile pixels"
                    )))
                }
            };
            layers.push(Layer {
                name: l.name.clone(),
                geometry: geometry(&l.geometry, &at).map_err(err)?,
                rules,
                attrs,
                require_any: l.require_any.clone(),
                exclude_if_in,
                min_area_px: px(l.min_area_px, "min_area_px")?,
                min_length_px: px(l.min_length_px, "min_length_px")?,
                simplify_px: px(l.simplify_px.or(Some(simplify)), "simplify_px")?,
                sort,
                listed,
            });
        }
        Ok(Schema {
            name: raw.name,
            zoom_max: raw.zoom_max,
            buffer: buffer_px / TILE_PX,
            layers,
            keys,
        })
    }

    /// Where a feature goes: its placements, in layer order.
    pub fn classify(&self, f: &Feature) -> Vec<Placement> {
        let mut out: Vec<Placement> = Vec::new();
        for (li, l) in self.layers.iter().enumerate() {
            if l.exclude_if_in
                .iter()
                .any(|x| out.iter().any(|p| p.layer == *x))
            {
                continue;
            }
            if !l.require_any.is_empty() && !l.require_any.iter().any(|k| f.tags.contains_key(k)) {
                continue;
            }
            // Whether the layer takes this kind of shape, then its rule,
            // before any shape is copied or a label point computed: most
            // layers take most features nowhere.
            let takes = matches!(
                (&l.geometry, &f.shape),
                (Geometry::Point, Shape::Point(_))
                    | (Geometry::Line, Shape::Lines(_))
                    | (Geometry::Outline, Shape::Lines(_) | Shape::Polygon(_))
                    | (Geometry::Polygon, Shape::Polygon(_))
                    | (Geometry::Label, Shape::Point(_) | Shape::Polygon(_))
                    | (Geometry::PolygonLabel, Shape::Polygon(_))
            );
            if !takes {
                continue;
            }
            let Some(rule) = l.rules.iter().find(|r| matches(&r.tags, &f.tags)) else {
                continue;
            };
            let shape = match (&l.geometry, &f.shape) {
                (Geometry::Outline, Shape::Polygon(r)) => Shape::Lines(r.clone()),
                (Geometry::Label | Geometry::PolygonLabel, Shape::Polygon(r)) => {
                    match label_point(r) {
                        Some(p) => Shape::Point(p),
                        None => continue,
                    }
                }
                _ => f.shape.clone(),
            };
            let kind = match &rule.kind {
                Some(Kind::Literal(k)) => Some(k.clone()),
                Some(Kind::Tag(t)) => f.tags.get(t).cloned(),
                None => None,
            };
            let mut attrs = BTreeMap::new();
            for a in &l.attrs {
                if !matches(&a.when, &f.tags) {
                    continue;
                }
                let tag = |k: &str| f.tags.get(k).map(String::as_str);
                let refs = || tag("ref").map(|r| r.split(';').map(str::trim).collect::<Vec<_>>());
                let v = match &a.source {
                    Source::Tag(k) => tag(k).map(|v| Value::String(v.to_string())),
                    Source::Int(k) => tag(k)
                        .and_then(|v| v.trim().parse::<i64>().ok())
                        .map(Value::Int),
                    Source::Listed(k) => tag(k)
                        .filter(|v| l.listed.get(k).is_some_and(|s| s.contains(*v)))
                        .map(|v| Value::String(v.to_string())),
                    Source::TrueIf(p) => p
                        .iter()
                        .any(|(k, v)| tag(k) == Some(v.as_str()))
                        .then_some(Value::Bool(true)),
                    Source::Const(v) => Some(v.clone()),
                    Source::Kind => kind.clone().map(Value::String),
                    Source::WayArea => area_m2(&f.shape).map(|a| Value::Double(a.to_bits())),
                    Source::WayAreaHa => {
                        area_m2(&f.shape).map(|a| Value::Double((a / 10_000.0).to_bits()))
                    }
                    Source::RefLines => refs().map(|r| Value::String(r.join("\n"))),
                    Source::RefRows => refs().map(|r| Value::Int(r.len() as i64)),
                    Source::RefCols => refs().map(|r| {
                        Value::Int(r.iter().map(|x| x.chars().count()).max().unwrap_or(0) as i64)
                    }),
                };
                if let Some(v) = v {
                    attrs.insert(a.name.clone(), v);
                }
            }
            for (k, v) in &rule.set {
                attrs.entry(k.clone()).or_insert_with(|| v.clone());
            }
            out.push(Placement {
                layer: li,
                zoom: rule.zoom,
                attrs,
                shape,
            });
        }
        out
    }

    /// The key features of a layer are sorted by in a tile, if any.
    pub fn sort_key(&self, layer: usize, attrs: &BTreeMap<String, Value>) -> Option<f64> {
        let (a, desc) = self.layers[layer].sort.as_ref()?;
        let v = match attrs.get(a)? {
            Value::Int(i) => *i as f64,
            Value::Double(b) => f64::from_bits(*b),
            _ => return None,
        };
        Some(if *desc { -v } else { v })
    }
}

/// One feature in one layer.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    pub layer: usize,
    /// The lowest zoom it shows at.
    pub zoom: u8,
    pub attrs: BTreeMap<String, Value>,
    pub shape: Shape,
}

impl Placement {
    /// What it shows at zoom `z`: nothing below its zoom or (below the
    /// schema's top zoom) below the layer's minimum size; otherwise its
    /// shape simplified for that zoom.
    pub fn at(&self, schema: &Schema, z: u8) -> Option<Shape> {
        if z < self.zoom || z > schema.zoom_max {
            return None;
        }
        let l = &schema.layers[self.layer];
        let px = TILE_PX * (1u64 << z) as f64;
        let top = z >= schema.zoom_max;
        match &self.shape {
            Shape::Point(_) => Some(self.shape.clone()),
            Shape::Lines(lines) => {
                if !top && l.min_length_px > 0.0 {
                    let len: f64 = lines.iter().map(|l| length(l)).sum();
                    if len * px < l.min_length_px {
                        return None;
                    }
                }
                let tol = if top { 0.0 } else { l.simplify_px / px };
                let out: Vec<Vec<P>> = lines
                    .iter()
                    .map(|l| simplify(l, tol))
                    .filter(|l| l.len() >= 2)
                    .collect();
                (!out.is_empty()).then_some(Shape::Lines(out))
            }
            Shape::Polygon(rings) => {
                if !top && l.min_area_px > 0.0 && area_world(rings) * px * px < l.min_area_px {
                    return None;
                }
                let tol = if top { 0.0 } else { l.simplify_px / px };
                let out: Vec<Vec<P>> = rings
                    .iter()
                    .map(|r| simplify(r, tol))
                    .filter(|r| r.len() >= 4)
                    .collect();
                (!out.is_empty()).then_some(Shape::Polygon(out))
            }
        }
    }
}

fn length(l: &[P]) -> f64 {
    l.windows(2)
        .map(|s| ((s[1].0 - s[0].0).powi(2) + (s[1].1 - s[0].1).powi(2)).sqrt())
        .sum()
}

fn ring_area(r: &[P]) -> f64 {
    r.windows(2)
        .map(|s| s[0].0 * s[1].1 - s[1].0 * s[0].1)
        .sum::<f64>()
        / 2.0
}

/// An area's size in world units²: outer rings count, holes subtract.
fn area_world(rings: &[Vec<P>]) -> f64 {
    nesting(rings)
        .iter()
        .zip(rings)
        .map(|((depth, _), r)| {
            let a = ring_area(r).abs();
            if depth % 2 == 0 {
                a
            } else {
                -a
            }
        })
        .sum::<f64>()
        .max(0.0)
}

fn area_m2(s: &Shape) -> Option<f64> {
    match s {
        Shape::Polygon(r) => Some((area_world(r) * MERCATOR_M * MERCATOR_M).round()),
        _ => None,
    }
}

/// Douglas–Peucker with tolerance `tol` in world units; the ends stay.
/// Zero keeps every point.
fn simplify(l: &[P], tol: f64) -> Vec<P> {
    if tol <= 0.0 || l.len() < 3 {
        return l.to_vec();
    }
    let mut keep = vec![false; l.len()];
    keep[0] = true;
    keep[l.len() - 1] = true;
    let mut stack = vec![(0usize, l.len() - 1)];
    while let Some((a, b)) = stack.pop() {
        if b <= a + 1 {
            continue;
        }
        let (pa, pb) = (l[a], l[b]);
        let (dx, dy) = (pb.0 - pa.0, pb.1 - pa.1);
        let len2 = dx * dx + dy * dy;
        let mut best = (0.0, a);
        for (i, p) in l.iter().enumerate().take(b).skip(a + 1) {
            let d = if len2 == 0.0 {
                ((p.0 - pa.0).powi(2) + (p.1 - pa.1).powi(2)).sqrt()
            } else {
                ((p.0 - pa.0) * dy - (p.1 - pa.1) * dx).abs() / len2.sqrt()
            };
            if d > best.0 {
                best = (d, i);
            }
        }
        if best.0 > tol {
            keep[best.1] = true;
            stack.push((a, best.1));
            stack.push((best.1, b));
        }
    }
    l.iter()
        .zip(keep)
        .filter(|(_, k)| *k)
        .map(|(p, _)| *p)
        .collect()
}

/// A point inside an area for its label: the centroid of its largest outer
/// ring when the area (even-odd, holes excluded) contains it; otherwise the
/// middle of the widest inside span of the horizontal line through it.
pub fn label_point(rings: &[Vec<P>]) -> Option<P> {
    let outer = rings
        .iter()
        .zip(nesting(rings))
        .filter(|(_, (d, _))| d % 2 == 0)
        .map(|(r, _)| r)
        .max_by(|a, b| ring_area(a).abs().total_cmp(&ring_area(b).abs()))?;
    let a = ring_area(outer);
    let c = if a.abs() > 0.0 {
        let (mut cx, mut cy) = (0.0, 0.0);
        for s in outer.windows(2) {
            let k = s[0].0 * s[1].1 - s[1].0 * s[0].1;
            cx += (s[0].0 + s[1].0) * k;
            cy += (s[0].1 + s[1].1) * k;
        }
        (cx / (6.0 * a), cy / (6.0 * a))
    } else {
        outer[0]
    };
    let odd = |p: P| rings.iter().filter(|r| inside(p, r)).count() % 2 == 1;
    if odd(c) {
        return Some(c);
    }
    let y = c.1;
    let mut xs: Vec<f64> = Vec::new();
    for r in rings {
        for s in r.windows(2) {
            let (a, b) = (s[0], s[1]);
            if (a.1 <= y) != (b.1 <= y) {
                xs.push(a.0 + (y - a.1) / (b.1 - a.1) * (b.0 - a.0));
            }
        }
    }
    xs.sort_by(f64::total_cmp);
    xs.chunks(2)
        .filter(|c| c.len() == 2)
        .max_by(|a, b| (a[1] - a[0]).total_cmp(&(b[1] - b[0])))
        .map(|c| ((c[0] + c[1]) / 2.0, y))
        .or(Some(outer[0]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sq(x: f64, y: f64, s: f64) -> Vec<P> {
        vec![(x, y), (x + s, y), (x + s, y + s), (x, y + s), (x, y)]
    }

    #[test]
    fn the_bundled_shortbread_schema_parses() {
        let s = Schema::bundled("shortbread").unwrap();
        assert_eq!(s.zoom_max, 14);
        // The spec's 26 layers: ocean (assembled from coastlines) and 25
        // from elements.
        assert_eq!(s.layers.len(), 26);
        assert_eq!(s.layers[0].name, "ocean");
        assert!(s.keys.contains("building") && s.keys.contains("highway"));
        assert!(s.keys.contains(crate::coast::OCEAN_TAG.0));
    }

    #[test]
    fn a_label_point_avoids_the_hole() {
        let rings = vec![sq(0.0, 0.0, 1.0), sq(0.25, 0.25, 0.5)];
        let p = label_point(&rings).unwrap();
        assert!(inside(p, &rings[0]) && !inside(p, &rings[1]), "{p:?}");
    }

    #[test]
    fn simplify_keeps_the_ends_and_drops_small_wiggles() {
        let l = vec![(0.0, 0.0), (0.5, 0.001), (1.0, 0.0)];
        assert_eq!(simplify(&l, 0.01), vec![(0.0, 0.0), (1.0, 0.0)]);
        assert_eq!(simplify(&l, 0.0001).len(), 3);
    }

    #[test]
    fn errors_name_the_layer_and_what_to_do() {
        let e = Schema::parse(
            "name='x'\nzoom_max=14\n[[layers]]\nname='a'\ngeometry='blob'\n[[layers.features]]\ntags={a='*'}\nzoom=1\n",
            "x.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("x.toml") && e.contains("layer \"a\"") && e.contains("polygon"),
            "{e}"
        );
    }
}
