//! Mapbox Vector Tiles 2.1: the protobuf encoding of one layer, and a
//! decoder for verification and tests. Written by hand (varints and two
//! message shapes) rather than through a protobuf code generator: the
//! format is small, fixed, and this keeps the build free of one.
//!
//! Encoding is deterministic: the same features in the same order give the
//! same bytes, which is what lets `osm verify` compare tiles byte for byte
//! and report differences feature by feature.

use std::collections::BTreeMap;

/// The tile's coordinate range, as almost every renderer expects.
pub const EXTENT: u32 = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum GeomType {
    Point = 1,
    LineString = 2,
    Polygon = 3,
}

/// An attribute value, typed as MVT types them: styles compare typed
/// (`["==", ["get", "tunnel"], true]` does not match the string "true").
/// A double is kept as its bits, so that values are `Eq` and `Ord` and a
/// tile's bytes are a function of its features.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Value {
    String(String),
    Int(i64),
    Double(u64),
    Bool(bool),
}

impl Value {
    /// The TileJSON `fields` type name.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::String(_) => "String",
            Value::Int(_) | Value::Double(_) => "Number",
            Value::Bool(_) => "Boolean",
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::String(s.to_string())
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::String(s) => f.write_str(s),
            Value::Int(i) => write!(f, "{i}"),
            Value::Double(b) => write!(f, "{}", f64::from_bits(*b)),
            Value::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// One feature in tile coordinates. `parts` are points (one point each),
/// lines, or rings (closed implicitly; exterior rings clockwise in tile
/// coordinates, y down, holes counter-clockwise, each hole after its
/// exterior), as the specification asks.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TileFeature {
    pub id: u64,
    pub kind: GeomType,
    pub tags: BTreeMap<String, Value>,
    pub parts: Vec<Vec<(i32, i32)>>,
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn key(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, ((field as u64) << 3) | wire as u64);
}

fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    key(out, field, 2);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn zigzag(v: i32) -> u32 {
    ((v << 1) ^ (v >> 31)) as u32
}

fn unzigzag(v: u32) -> i32 {
    ((v >> 1) as i32) ^ -((v & 1) as i32)
}

fn command(id: u32, count: usize) -> u32 {
    debug_assert!(count < (1 << 29));
    (id & 7) | ((count as u32) << 3)
}

fn geometry(f: &TileFeature) -> Vec<u32> {
    let mut g = Vec::new();
    let mut cur = (0i32, 0i32);
    let mut to = |g: &mut Vec<u32>, p: (i32, i32)| {
        g.push(zigzag(p.0 - cur.0));
        g.push(zigzag(p.1 - cur.1));
        cur = p;
    };
    match f.kind {
        GeomType::Point => {
            let pts: Vec<_> = f.parts.iter().flatten().copied().collect();
            g.push(command(1, pts.len()));
            for p in pts {
                to(&mut g, p);
            }
        }
        GeomType::LineString | GeomType::Polygon => {
            for part in &f.parts {
                g.push(command(1, 1));
                to(&mut g, part[0]);
                g.push(command(2, part.len() - 1));
                for p in &part[1..] {
                    to(&mut g, *p);
                }
                if f.kind == GeomType::Polygon {
                    g.push(command(7, 1));
                }
            }
        }
    }
    g
}

/// Encodes one layer as a whole tile. Features keep their order; keys and
/// values are numbered in order of first use.
pub fn encode(layer: &str, features: &[TileFeature]) -> Vec<u8> {
    let mut keys: Vec<&str> = Vec::new();
    let mut values: Vec<&Value> = Vec::new();
    let mut key_ix: BTreeMap<&str, u32> = BTreeMap::new();
    let mut val_ix: BTreeMap<&Value, u32> = BTreeMap::new();
    let mut body = Vec::new();
    key(&mut body, 15, 0);
    varint(&mut body, 2);
    bytes(&mut body, 1, layer.as_bytes());
    for f in features {
        let mut fb = Vec::new();
        key(&mut fb, 1, 0);
        varint(&mut fb, f.id);
        let mut tags = Vec::new();
        for (k, v) in &f.tags {
            let ki = *key_ix.entry(k).or_insert_with(|| {
                keys.push(k);
                keys.len() as u32 - 1
            });
            let vi = *val_ix.entry(v).or_insert_with(|| {
                values.push(v);
                values.len() as u32 - 1
            });
            varint(&mut tags, ki as u64);
            varint(&mut tags, vi as u64);
        }
        if !tags.is_empty() {
            bytes(&mut fb, 2, &tags);
        }
        key(&mut fb, 3, 0);
        varint(&mut fb, f.kind as u64);
        let mut geom = Vec::new();
        for c in geometry(f) {
            varint(&mut geom, c as u64);
        }
        bytes(&mut fb, 4, &geom);
        bytes(&mut body, 2, &fb);
    }
    for k in keys {
        bytes(&mut body, 3, k.as_bytes());
    }
    for v in values {
        let mut vb = Vec::new();
        match v {
            Value::String(s) => bytes(&mut vb, 1, s.as_bytes()),
            Value::Double(b) => {
                key(&mut vb, 3, 1);
                vb.extend_from_slice(&b.to_le_bytes());
            }
            Value::Int(i) => {
                key(&mut vb, 4, 0);
                varint(&mut vb, *i as u64);
            }
            Value::Bool(b) => {
                key(&mut vb, 7, 0);
                varint(&mut vb, *b as u64);
            }
        }
        bytes(&mut body, 4, &vb);
    }
    key(&mut body, 5, 0);
    varint(&mut body, EXTENT as u64);
    let mut tile = Vec::new();
    bytes(&mut tile, 3, &body);
    tile
}

/// What is wrong with bytes that do not decode as a tile.
#[derive(Debug, thiserror::Error)]
#[error("not a vector tile: {0}")]
pub struct DecodeError(&'static str);

struct Reader<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Reader<'a> {
    fn done(&self) -> bool {
        self.i >= self.b.len()
    }
    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.b.get(self.i).ok_or(DecodeError("truncated varint"))?;
            self.i += 1;
            v |= ((byte & 0x7f) as u64) << shift;
            if byte < 0x80 {
                return Ok(v);
            }
        }
        Err(DecodeError("varint too long"))
    }
    fn field(&mut self) -> Result<(u32, Field<'a>), DecodeError> {
        let k = self.varint()?;
        let field = (k >> 3) as u32;
        match k & 7 {
            0 => Ok((field, Field::Varint(self.varint()?))),
            2 => {
                let n = self.varint()? as usize;
                let end = self.i.checked_add(n).filter(|e| *e <= self.b.len());
                let end = end.ok_or(DecodeError("length past the end"))?;
                let s = &self.b[self.i..end];
                self.i = end;
                Ok((field, Field::Bytes(s)))
            }
            1 => {
                let b = self
                    .b
                    .get(self.i..self.i + 8)
                    .ok_or(DecodeError("truncated fixed64"))?;
                self.i += 8;
                Ok((
                    field,
                    Field::Fixed64(u64::from_le_bytes(b.try_into().expect("8 bytes"))),
                ))
            }
            5 => {
                let b = self
                    .b
                    .get(self.i..self.i + 4)
                    .ok_or(DecodeError("truncated fixed32"))?;
                self.i += 4;
                Ok((
                    field,
                    Field::Fixed32(u32::from_le_bytes(b.try_into().expect("4 bytes"))),
                ))
            }
            _ => Err(DecodeError("unsupported wire type")),
        }
    }
}

enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed64(u64),
    Fixed32(u32),
}

fn packed(b: &[u8]) -> Result<Vec<u32>, DecodeError> {
    let mut r = Reader { b, i: 0 };
    let mut out = Vec::new();
    while !r.done() {
        out.push(r.varint()? as u32);
    }
    Ok(out)
}

/// Decodes every layer of a tile: (layer name, features).
pub fn decode(tile: &[u8]) -> Result<Vec<(String, Vec<TileFeature>)>, DecodeError> {
    let mut out = Vec::new();
    let mut r = Reader { b: tile, i: 0 };
    while !r.done() {
        if let (3, Field::Bytes(layer)) = r.field()? {
            out.push(decode_layer(layer)?);
        }
    }
    Ok(out)
}

fn decode_layer(b: &[u8]) -> Result<(String, Vec<TileFeature>), DecodeError> {
    let mut r = Reader { b, i: 0 };
    let (mut name, mut keys, mut values, mut raw) = (String::new(), vec![], vec![], vec![]);
    while !r.done() {
        match r.field()? {
            (1, Field::Bytes(s)) => name = String::from_utf8_lossy(s).into_owned(),
            (2, Field::Bytes(s)) => raw.push(s),
            (3, Field::Bytes(s)) => keys.push(String::from_utf8_lossy(s).into_owned()),
            (4, Field::Bytes(s)) => {
                let mut vr = Reader { b: s, i: 0 };
                let mut v = Value::String(String::new());
                while !vr.done() {
                    v = match vr.field()? {
                        (1, Field::Bytes(s)) => {
                            Value::String(String::from_utf8_lossy(s).into_owned())
                        }
                        (2, Field::Fixed32(b)) => {
                            Value::Double((f32::from_bits(b) as f64).to_bits())
                        }
                        (3, Field::Fixed64(b)) => Value::Double(b),
                        (4, Field::Varint(n)) | (5, Field::Varint(n)) => Value::Int(n as i64),
                        (6, Field::Varint(n)) => Value::Int(((n >> 1) as i64) ^ -((n & 1) as i64)),
                        (7, Field::Varint(n)) => Value::Bool(n != 0),
                        _ => return Err(DecodeError("unknown value type")),
                    };
                }
                values.push(v);
            }
            _ => {}
        }
    }
    let mut features = Vec::new();
    for f in raw {
        let mut fr = Reader { b: f, i: 0 };
        let (mut id, mut tags, mut kind, mut geom) = (0, vec![], 0, vec![]);
        while !fr.done() {
            match fr.field()? {
                (1, Field::Varint(v)) => id = v,
                (2, Field::Bytes(s)) => tags = packed(s)?,
                (3, Field::Varint(v)) => kind = v,
                (4, Field::Bytes(s)) => geom = packed(s)?,
                _ => {}
            }
        }
        let kind = match kind {
            1 => GeomType::Point,
            2 => GeomType::LineString,
            3 => GeomType::Polygon,
            _ => return Err(DecodeError("unknown geometry type")),
        };
        let mut t = BTreeMap::new();
        for pair in tags.chunks(2) {
            let k = keys.get(pair[0] as usize).ok_or(DecodeError("key index"))?;
            let v = pair
                .get(1)
                .and_then(|i| values.get(*i as usize))
                .ok_or(DecodeError("value index"))?;
            t.insert(k.clone(), v.clone());
        }
        let mut parts: Vec<Vec<(i32, i32)>> = Vec::new();
        let (mut i, mut cur) = (0, (0i32, 0i32));
        while i < geom.len() {
            let (cmd, count) = (geom[i] & 7, (geom[i] >> 3) as usize);
            i += 1;
            match cmd {
                1 | 2 => {
                    for _ in 0..count {
                        let (dx, dy) = match (geom.get(i), geom.get(i + 1)) {
                            (Some(a), Some(b)) => (unzigzag(*a), unzigzag(*b)),
                            _ => return Err(DecodeError("truncated geometry")),
                        };
                        i += 2;
                        cur = (cur.0 + dx, cur.1 + dy);
                        if cmd == 1 {
                            parts.push(vec![cur]);
                        } else {
                            parts
                                .last_mut()
                                .ok_or(DecodeError("LineTo before MoveTo"))?
                                .push(cur);
                        }
                    }
                }
                7 => {}
                _ => return Err(DecodeError("unknown command")),
            }
        }
        features.push(TileFeature {
            id,
            kind,
            tags: t,
            parts,
        });
    }
    Ok((name, features))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let f = vec![
            TileFeature {
                id: 5,
                kind: GeomType::Point,
                tags: [
                    ("amenity".into(), "cafe".into()),
                    ("level".into(), Value::Int(-2)),
                    ("area".into(), Value::Double(1.5f64.to_bits())),
                    ("tunnel".into(), Value::Bool(true)),
                ]
                .into(),
                parts: vec![vec![(10, 20)]],
            },
            TileFeature {
                id: 9,
                kind: GeomType::Polygon,
                tags: [("building".into(), "yes".into())].into(),
                parts: vec![
                    vec![(0, 0), (100, 0), (100, 100), (0, 100)],
                    vec![(-5, 300), (-5, 310), (7, 310)],
                ],
            },
        ];
        let bytes = encode("base", &f);
        let d = decode(&bytes).unwrap();
        assert_eq!(d, vec![("base".to_string(), f.clone())]);
        assert_eq!(bytes, encode("base", &f), "deterministic");
        assert!(decode(&bytes[..bytes.len() - 3]).is_err());
    }
}
