//! Search documents as Photon answers them (issue 50): a GeoJSON
//! FeatureCollection whose features carry the GeocodeJSON-style properties
//! Photon's clients read (`osm_type` as `N`/`W`/`R`, `osm_id`, `osm_key`,
//! `osm_value`, `name`, `street`, `housenumber`, `postcode`, `city`,
//! `state`, `county`, `country`, `extent`), a property left out when the
//! document has no value for it, as Photon does. The collection also says
//! which dataset and replication sequence it was read from.

use super::Doc;
use serde_json::{json, Map, Value};

/// Photon's name for an admin level's area, where it has one.
fn admin_property(level: &str) -> Option<&'static str> {
    match level {
        "2" => Some("country"),
        "4" => Some("state"),
        "6" => Some("county"),
        _ => None,
    }
}

/// One document as a Photon feature: a Point at the document's point (no
/// geometry when it has none).
pub fn feature(doc: &Doc) -> Value {
    let mut p = Map::new();
    let mut put = |k: &str, v: Option<&String>| {
        if let Some(v) = v {
            p.insert(k.to_string(), json!(v));
        }
    };
    put("osm_key", doc.osm_key.as_ref());
    put("osm_value", doc.osm_value.as_ref());
    put("name", Some(&doc.name));
    put("street", doc.street.as_ref());
    put("housenumber", doc.housenumber.as_ref());
    put("postcode", doc.postcode.as_ref());
    put("city", doc.place.as_ref());
    for (level, name) in &doc.admin {
        if let Some(k) = admin_property(level) {
            put(k, name.as_ref());
        }
    }
    p.insert("osm_type".into(), json!(doc.osm_type.to_ascii_uppercase()));
    p.insert("osm_id".into(), json!(doc.osm_id));
    if let Some(e) = doc.extent {
        p.insert("extent".into(), json!(e));
    }
    // Every configured level, by number: what Photon's names leave out.
    p.insert("admin".into(), json!(doc.admin));
    let geometry = match (doc.lon, doc.lat) {
        (Some(lon), Some(lat)) => json!({"type": "Point", "coordinates": [lon, lat]}),
        _ => Value::Null,
    };
    json!({"type": "Feature", "geometry": geometry, "properties": p})
}

/// The answer: the features in order, with the dataset and the sequence
/// of the committed state they were read from (`null`: not known).
pub fn collection<'a>(
    docs: impl IntoIterator<Item = &'a Doc>,
    dataset: &str,
    sequence: Option<i64>,
) -> Value {
    let features: Vec<Value> = docs.into_iter().map(feature).collect();
    json!({
        "type": "FeatureCollection",
        "dataset": dataset,
        "sequence": sequence,
        "features": features,
    })
}
