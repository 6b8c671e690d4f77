//! Cross-origin reads (issue 50): a map page served from another origin
//! (a web site, a notebook, a CDN) reads the TileJSON, the style, the
//! tiles and the glyphs from `serve`, which a browser allows only when the
//! answer says so (`Access-Control-Allow-Origin`).
//!
//! Every answer carries the header: `*` by default (what martin and
//! tileserver-gl send; nothing served needs credentials, so `*` gives no
//! page more than a `curl` has), or, with `--cors-origin`, the request's
//! `Origin` when it is one of those given (and `Vary: Origin`, so a shared
//! cache keeps one answer per origin). A preflight (`OPTIONS` with
//! `Access-Control-Request-Method`, sent when a page adds a header such as
//! `If-None-Match` or `Range`) is answered 204 with the methods and the
//! asked headers; every other `OPTIONS` is answered the same way, never
//! 405. Nothing here lets a page write: the only methods are GET and HEAD.

use crate::ServeError;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};

/// How long a browser may keep a preflight's answer, in seconds.
pub const PREFLIGHT_MAX_AGE_S: u64 = 86_400;

/// Headers a page's script may read beyond the CORS-safelisted ones.
const EXPOSED: &str = "ETag, X-Highwater-Fresh, X-Highwater-Stale, X-Highwater-Sequence";

/// Who may read.
#[derive(Clone, Debug, Default)]
pub struct Cors {
    /// Empty: any origin.
    origins: Vec<String>,
}

/// `http[s]://host[:port]` as a browser sends it in `Origin`: lower-case
/// scheme and host, no path, query, user info or trailing slash.
pub fn check_cors_origin(o: &str) -> Result<String, ServeError> {
    let bad = |why| ServeError::CorsOrigin {
        origin: o.to_string(),
        why,
    };
    if o == "*" {
        return Ok("*".into());
    }
    let t = o.trim_end_matches('/').to_ascii_lowercase();
    let rest = t
        .strip_prefix("http://")
        .or_else(|| t.strip_prefix("https://"))
        .ok_or_else(|| bad("give http://host[:port] or https://host[:port]"))?;
    if rest.is_empty() {
        return Err(bad("no host"));
    }
    if rest.contains(['/', '?', '#', '@']) || rest.contains(char::is_whitespace) {
        return Err(bad(
            "an origin is a scheme, a host and a port only: no path, query or user info",
        ));
    }
    HeaderValue::from_str(&t).map_err(|_| bad("not a header value"))?;
    Ok(t)
}

impl Cors {
    pub fn new(origins: &[String]) -> Result<Cors, ServeError> {
        let origins = origins
            .iter()
            .map(|o| check_cors_origin(o))
            .collect::<Result<Vec<_>, _>>()?;
        // `*` among them means any.
        Ok(Cors {
            origins: if origins.iter().any(|o| o == "*") {
                Vec::new()
            } else {
                origins
            },
        })
    }

    /// The `Access-Control-Allow-Origin` value for a request from
    /// `origin`; `None`: that origin may not read.
    fn allow(&self, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
        if self.origins.is_empty() {
            return Some(HeaderValue::from_static("*"));
        }
        let o = origin?;
        let s = o.to_str().ok()?.to_ascii_lowercase();
        self.origins.contains(&s).then(|| o.clone())
    }

    /// Adds the CORS headers to an answer.
    pub fn decorate(&self, origin: Option<&HeaderValue>, r: &mut Response) {
        let h = r.headers_mut();
        if let Some(v) = self.allow(origin) {
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
            h.insert(
                header::ACCESS_CONTROL_EXPOSE_HEADERS,
                HeaderValue::from_static(EXPOSED),
            );
        }
        if !self.origins.is_empty() {
            h.append(header::VARY, HeaderValue::from_static("Origin"));
        }
    }

    /// The answer to any `OPTIONS` request.
    pub fn preflight(&self, headers: &HeaderMap) -> Response {
        let mut r = StatusCode::NO_CONTENT.into_response();
        let h = r.headers_mut();
        h.insert(
            header::ALLOW,
            HeaderValue::from_static("GET, HEAD, OPTIONS"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, HEAD, OPTIONS"),
        );
        // The headers asked for, if they are header names: a page may send
        // any (If-None-Match, Range, Cache-Control); none changes what is
        // served beyond what a GET without them gets.
        if let Some(asked) = headers.get(header::ACCESS_CONTROL_REQUEST_HEADERS) {
            let ok = asked.to_str().is_ok_and(|s| {
                s.split(',').all(|n| {
                    n.trim()
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                })
            });
            if ok {
                h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked.clone());
            }
        }
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from(PREFLIGHT_MAX_AGE_S),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        self.decorate(headers.get(header::ORIGIN), &mut r);
        r
    }

    /// Whether a request is one [`Cors::preflight`] answers.
    pub fn is_options(m: &Method) -> bool {
        m == Method::OPTIONS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 50: `--cors-origin` takes origins, nothing more.
    #[test]
    fn cors_origins_are_checked() {
        for (o, want) in [
            ("https://maps.example.org", Some("https://maps.example.org")),
            ("http://127.0.0.1:8000/", Some("http://127.0.0.1:8000")),
            ("HTTPS://Maps.Example.org", Some("https://maps.example.org")),
            ("maps.example.org", None),
            ("https://maps.example.org/app", None),
            ("https://u@maps.example.org", None),
            ("https://", None),
        ] {
            assert_eq!(check_cors_origin(o).ok().as_deref(), want, "{o}");
        }
    }

    #[test]
    fn only_the_given_origins_are_allowed() {
        let any = Cors::new(&[]).unwrap();
        assert_eq!(any.allow(None).unwrap(), "*");
        let one = Cors::new(&["https://a.example".into()]).unwrap();
        let a = HeaderValue::from_static("https://a.example");
        let b = HeaderValue::from_static("https://b.example");
        assert_eq!(one.allow(Some(&a)).unwrap(), "https://a.example");
        assert!(one.allow(Some(&b)).is_none());
        assert!(one.allow(None).is_none());
    }
}
