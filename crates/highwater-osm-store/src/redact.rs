//! Replication URLs may carry credentials (`https://user:secret@host/`):
//! what the store keeps and what reports show of one says `***` in their
//! place. Here, below the store, because the store and the import record
//! URLs; `highwater_osm::fetch` (replication over HTTP) uses the same
//! split to send them as a header.

/// What a redacted URL says in place of its credentials.
pub const REDACTED: &str = "***";

/// Splits `scheme://userinfo@rest` into the scheme with `://`, the
/// userinfo (if any) and the rest. A password may hold an unescaped `/`:
/// the userinfo ends at the last `@` before the first `/`, `?` or `#` that
/// follows the first `@`.
pub fn split_userinfo(url: &str) -> (&str, Option<&str>, &str) {
    let Some(i) = url.find("://") else {
        return ("", None, url);
    };
    let (scheme, rest) = url.split_at(i + 3);
    let Some(first) = rest.find('@') else {
        return (scheme, None, rest);
    };
    let end = rest[first..]
        .find(['/', '?', '#'])
        .map_or(rest.len(), |j| first + j);
    let at = rest[..end].rfind('@').expect("the first @ is before end");
    (scheme, Some(&rest[..at]), &rest[at + 1..])
}

/// The URL with its credentials (userinfo) replaced by `***`: what is
/// shown and stored of any replication URL.
pub fn redact_url(url: &str) -> String {
    match split_userinfo(url) {
        (scheme, Some(_), rest) => format!("{scheme}{REDACTED}@{rest}"),
        _ => url.to_string(),
    }
}
