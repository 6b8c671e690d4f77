//! `/search` (and Photon's own path, `/api`) and `/reverse` (issue 50): a
//! geocoding client's two calls, answered in Photon's shape.
//!
//! This module reads the parameters and refuses bad ones (400, naming the
//! parameter and what it takes); what the answer holds comes from
//! [`crate::Project::search`] and [`crate::Project::reverse`], each one committed state
//! of a search dataset whose replication sequence is in the collection's
//! `sequence` and in the `X-Highwater-Sequence` header.
//!
//! Parameters (Photon's names): `q`, `limit`, `lang` on `/search`; `lat`,
//! `lon`, `radius` (km), `limit`, `lang` on `/reverse`; `dataset` on both
//! to pick a search dataset other than the first. `lang` is accepted and
//! has no effect: documents carry the `name` tag. Any other parameter is
//! refused rather than silently ignored (a client asking for a location
//! bias or a tag filter would otherwise take unbiased, unfiltered hits for
//! what it asked).

use crate::{blocking, not_found, percent_decode, Shared};
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// Hits a request may ask for at most (`limit`), in results.
pub const SEARCH_LIMIT_MAX: usize = 50;

/// Hits `/search` answers when no `limit` is given, in results.
pub const SEARCH_LIMIT_DEFAULT: usize = 10;

/// Hits `/reverse` answers when no `limit` is given, in results (Photon's
/// default: the one nearest).
pub const REVERSE_LIMIT_DEFAULT: usize = 1;

/// `/reverse`'s `radius` when none is given, in kilometres.
pub const REVERSE_RADIUS_KM_DEFAULT: f64 = 1.0;

/// The largest `radius`, in kilometres (Photon's bound).
pub const REVERSE_RADIUS_KM_MAX: f64 = 5000.0;

/// The longest `q`, in bytes once decoded.
pub const SEARCH_QUERY_BYTES_MAX: usize = 500;

/// A search request, its parameters checked.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchAsk {
    /// `None`: the first search dataset of the config.
    pub dataset: Option<String>,
    pub q: String,
    pub limit: usize,
}

/// A reverse request, its parameters checked.
#[derive(Clone, Debug, PartialEq)]
pub struct ReverseAsk {
    pub dataset: Option<String>,
    pub lat: f64,
    pub lon: f64,
    pub radius_m: f64,
    pub limit: usize,
}

/// Why a search or reverse request has no answer: each is a status.
#[derive(Clone, Debug, PartialEq)]
pub enum Unanswered {
    /// 400: a parameter is wrong (the text names it and what it takes).
    BadRequest(String),
    /// 404: no such dataset.
    NotFound(String),
    /// 503: nothing to answer from yet (an index never built, or built by
    /// older code); the text says the command that fixes it.
    Unavailable(String),
    /// 500: reading failed.
    Failed(String),
}

impl IntoResponse for Unanswered {
    fn into_response(self) -> Response {
        let (code, text) = match self {
            Unanswered::BadRequest(t) => (StatusCode::BAD_REQUEST, t),
            Unanswered::NotFound(t) => return not_found(t),
            Unanswered::Unavailable(t) => (StatusCode::SERVICE_UNAVAILABLE, t),
            Unanswered::Failed(t) => (StatusCode::INTERNAL_SERVER_ERROR, t),
        };
        (code, text).into_response()
    }
}

/// The query's parameters, decoded; a parameter given twice is refused.
fn params(query: Option<&str>, allowed: &[&str]) -> Result<Vec<(String, String)>, Unanswered> {
    let mut out: Vec<(String, String)> = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = percent_decode(k);
        if !allowed.contains(&k.as_str()) {
            return Err(Unanswered::BadRequest(format!(
                "{k}: not a parameter of this endpoint; ask with {}",
                allowed.join(", ")
            )));
        }
        if out.iter().any(|(have, _)| *have == k) {
            return Err(Unanswered::BadRequest(format!(
                "{k}: given twice; give it once"
            )));
        }
        out.push((k, percent_decode(v)));
    }
    Ok(out)
}

fn get<'a>(ps: &'a [(String, String)], k: &str) -> Option<&'a str> {
    ps.iter()
        .find(|(have, _)| have == k)
        .map(|(_, v)| v.as_str())
}

fn limit(ps: &[(String, String)], default: usize) -> Result<usize, Unanswered> {
    match get(ps, "limit") {
        None => Ok(default),
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=SEARCH_LIMIT_MAX).contains(&n) => Ok(n),
            _ => Err(Unanswered::BadRequest(format!(
                "limit={v}: give a whole number of results from 1 to {SEARCH_LIMIT_MAX}"
            ))),
        },
    }
}

/// A coordinate in degrees within `-max..=max`.
fn degrees(ps: &[(String, String)], k: &str, max: f64) -> Result<f64, Unanswered> {
    let v = get(ps, k).ok_or_else(|| {
        Unanswered::BadRequest(format!("{k}: missing; give it in degrees (WGS84)"))
    })?;
    match v.parse::<f64>() {
        Ok(x) if x.is_finite() && (-max..=max).contains(&x) => Ok(x),
        _ => Err(Unanswered::BadRequest(format!(
            "{k}={v}: give degrees from -{max} to {max}"
        ))),
    }
}

/// `/search`'s parameters.
pub fn search_ask(query: Option<&str>) -> Result<SearchAsk, Unanswered> {
    let ps = params(query, &["q", "limit", "lang", "dataset"])?;
    let q = get(&ps, "q").unwrap_or("").trim().to_string();
    if q.is_empty() {
        return Err(Unanswered::BadRequest(
            "q: missing or empty; give the words to search for, e.g. q=Casino".into(),
        ));
    }
    if q.len() > SEARCH_QUERY_BYTES_MAX {
        return Err(Unanswered::BadRequest(format!(
            "q: {} bytes; give at most {SEARCH_QUERY_BYTES_MAX}",
            q.len()
        )));
    }
    Ok(SearchAsk {
        dataset: get(&ps, "dataset").map(str::to_string),
        q,
        limit: limit(&ps, SEARCH_LIMIT_DEFAULT)?,
    })
}

/// `/reverse`'s parameters.
pub fn reverse_ask(query: Option<&str>) -> Result<ReverseAsk, Unanswered> {
    let ps = params(query, &["lat", "lon", "radius", "limit", "lang", "dataset"])?;
    let lat = degrees(&ps, "lat", 90.0)?;
    let lon = degrees(&ps, "lon", 180.0)?;
    let radius_km = match get(&ps, "radius") {
        None => REVERSE_RADIUS_KM_DEFAULT,
        Some(v) => match v.parse::<f64>() {
            Ok(r) if r.is_finite() && r > 0.0 && r <= REVERSE_RADIUS_KM_MAX => r,
            _ => {
                return Err(Unanswered::BadRequest(format!(
                    "radius={v}: give kilometres, more than 0 and at most {REVERSE_RADIUS_KM_MAX}"
                )))
            }
        },
    };
    Ok(ReverseAsk {
        dataset: get(&ps, "dataset").map(str::to_string),
        lat,
        lon,
        radius_m: radius_km * 1000.0,
        limit: limit(&ps, REVERSE_LIMIT_DEFAULT)?,
    })
}

/// The collection as JSON, its sequence in a header too.
fn answer(doc: serde_json::Value) -> Response {
    let seq = match &doc["sequence"] {
        serde_json::Value::Number(n) => n.to_string(),
        _ => "unknown".to_string(),
    };
    let mut r = (
        [(header::CONTENT_TYPE, "application/geo+json")],
        doc.to_string(),
    )
        .into_response();
    r.headers_mut().insert(
        "x-highwater-sequence",
        HeaderValue::from_str(&seq).expect("digits"),
    );
    r
}

/// `GET /search?q=…&limit=…` (and `/api`, Photon's path).
pub(crate) async fn search(State(app): State<Shared>, uri: axum::http::Uri) -> Response {
    let ask = match search_ask(uri.query()) {
        Ok(a) => a,
        Err(e) => return e.into_response(),
    };
    blocking(&app, move |app| match app.project.search(&ask) {
        Ok(doc) => answer(doc),
        Err(e) => e.into_response(),
    })
    .await
}

/// `GET /reverse?lat=…&lon=…&radius=…&limit=…`.
pub(crate) async fn reverse(State(app): State<Shared>, uri: axum::http::Uri) -> Response {
    let ask = match reverse_ask(uri.query()) {
        Ok(a) => a,
        Err(e) => return e.into_response(),
    };
    blocking(&app, move |app| match app.project.reverse(&ask) {
        Ok(doc) => answer(doc),
        Err(e) => e.into_response(),
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bad(r: Result<impl std::fmt::Debug, Unanswered>, names: &str) {
        match r {
            Err(Unanswered::BadRequest(t)) => assert!(t.starts_with(names), "{t}"),
            other => panic!("{names}: {other:?}"),
        }
    }

    #[test]
    fn search_parameters_are_checked_and_named_when_wrong() {
        assert_eq!(
            search_ask(Some("q=Rue+Grimaldi&limit=3&lang=fr")).unwrap(),
            SearchAsk {
                dataset: None,
                q: "Rue Grimaldi".into(),
                limit: 3
            }
        );
        assert_eq!(search_ask(Some("q=%C3%A9")).unwrap().q, "é");
        assert_eq!(search_ask(Some("q=x")).unwrap().limit, SEARCH_LIMIT_DEFAULT);
        bad(search_ask(None), "q");
        bad(search_ask(Some("q=+")), "q");
        bad(search_ask(Some("q=x&limit=0")), "limit");
        bad(search_ask(Some("q=x&limit=51")), "limit");
        bad(search_ask(Some("q=x&limit=ten")), "limit");
        bad(search_ask(Some("q=x&lat=1")), "lat");
        bad(search_ask(Some("q=x&q=y")), "q");
        bad(search_ask(Some(&format!("q={}", "a".repeat(501)))), "q");
    }

    #[test]
    fn reverse_parameters_are_checked_and_named_when_wrong() {
        let a = reverse_ask(Some("lat=43.73&lon=7.42&radius=2&limit=5")).unwrap();
        assert_eq!(
            (a.lat, a.lon, a.radius_m, a.limit),
            (43.73, 7.42, 2000.0, 5)
        );
        let a = reverse_ask(Some("lon=7.42&lat=43.73")).unwrap();
        assert_eq!((a.radius_m, a.limit), (1000.0, 1));
        bad(reverse_ask(Some("lon=7.42")), "lat");
        bad(reverse_ask(Some("lat=91&lon=7.42")), "lat");
        bad(reverse_ask(Some("lat=43&lon=-181")), "lon");
        bad(reverse_ask(Some("lat=NaN&lon=7")), "lat");
        bad(reverse_ask(Some("lat=43&lon=7&radius=0")), "radius");
        bad(reverse_ask(Some("lat=43&lon=7&radius=5001")), "radius");
        bad(reverse_ask(Some("lat=43&lon=7&q=x")), "q");
    }
}
