//! Replication over HTTP: the protocol pyosmium and osmosis use, with every
//! failure sorted into a class that decides what happens next.
//!
//! A replication server offers `state.txt` (the newest sequence and its
//! timestamp) and, per sequence, `AAA/BBB/CCC.osc.gz` with
//! `AAA/BBB/CCC.state.txt`. Diffs are fetched in order, never past the top
//! state, into a cache folder inside the store (`.fetch/`, the same layout
//! as a replication folder), parsed and checked there before anything is
//! applied, and removed once applied.
//!
//! Failure classes (see [`FetchError`]):
//! - transient: connection errors, timeouts, 5xx, 429 (its `Retry-After`
//!   honoured): retried with bounded exponential backoff and jitter, then
//!   exit 1 with the last error;
//! - gone: the store's next sequence is older than the oldest the server
//!   keeps: exit 2, advising a newer extract;
//! - missing: a 404 inside the server's range: retried, then exit 1 naming
//!   the URL;
//! - corrupt: a truncated or unparsable body: fetched once more, then
//!   refused with nothing applied;
//! - backwards: a state whose timestamp is older than its predecessor's:
//!   refused.
//! - unserved: the server's `state.txt` names a sequence that neither it
//!   nor the store's own is served under (a mirror still filling, or the
//!   state of another stream): exit 1, never read as "gone";
//! - too large: a diff that unpacks past `--max-diff-mb` (a gzip bomb, or
//!   a limit set too low): refused at the limit, naming the file.
//!
//! Redirects are followed here, not by the HTTP client: only to http(s),
//! at most [`REDIRECTS_MAX`], with the credentials kept to the origin they
//! were given for; anything else (`file://`) is refused at once, by name.
//!
//! Credentials in a URL (`https://user:secret@host/`) are sent as a Basic
//! `Authorization` header and never shown or stored: every URL this module
//! reports or hands out says `***` in their place ([`redact_url`]).

use crate::import::{sequence_path, State};
use highwater_osm_store::redact::split_userinfo;
pub use highwater_osm_store::redact::{redact_url, REDACTED};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

/// The User-Agent every request carries: servers ask clients to name
/// themselves and a version.
pub const USER_AGENT: &str = concat!(
    "highwater/",
    env!("CARGO_PKG_VERSION"),
    " (+https://github.com/highwater-rs/highwater)"
);

/// How hard to try, and how long to wait.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Attempts after the first for a transient failure or a 404 inside the
    /// server's range.
    pub retries_max: u32,
    /// The first backoff; each retry doubles it, up to `backoff_max_ms`,
    /// with up to half of it added as jitter.
    pub backoff_base_ms: u64,
    pub backoff_max_ms: u64,
    /// One request, connect to last byte.
    pub timeout_s: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            retries_max: 5,
            backoff_base_ms: 1_000,
            backoff_max_ms: 60_000,
            timeout_s: 60,
        }
    }
}

/// A body larger than this is refused: bounds memory per diff (a daily
/// planet diff is about 150 MB compressed).
pub const DIFF_BYTES_MAX: u64 = 2 << 30;

/// A state file is a few hundred bytes; more is not a state file.
pub const STATE_BYTES_MAX: u64 = 64 << 10;

#[derive(Debug, Error)]
pub enum FetchError {
    #[error("{url}: {message} (after {attempts} attempts); the next run continues from here")]
    Transient {
        url: String,
        message: String,
        attempts: u32,
    },
    #[error("{url}: not on the server (404) although the server's range covers it (after {attempts} attempts); the next run tries again")]
    Missing { url: String, attempts: u32 },
    #[error("the store is at sequence {store} but the server at {base} no longer keeps sequence {next} (its oldest is later): import a newer extract with `highwater osm import EXTRACT --replace`")]
    Gone { base: String, store: i64, next: i64 },
    #[error("{url}: {message}; fetched twice and refused, nothing was applied")]
    Corrupt { url: String, message: String },
    #[error("{url}: timestamp {now} is older than the previous state's {before}: the server went backwards; refused, nothing was applied")]
    Backwards {
        url: String,
        before: String,
        now: String,
    },
    #[error("{url}: {message}")]
    Refused { url: String, message: String },
    #[error("{path}: {message}")]
    Cache { path: PathBuf, message: String },
    #[error("the server's state.txt ({base}) names sequence {top}, but neither it nor the store's next, {next}, is on the server (404): a server still filling, or a state.txt of another stream (minutely for a daily store?); nothing was applied, the next run tries again")]
    Unserved { base: String, top: i64, next: i64 },
    #[error("{url}: unpacks to more than --max-diff-mb = {limit_mb} MB (a gzip bomb, or a diff larger than the limit: raise --max-diff-mb if it is genuine); refused, nothing of it was applied")]
    TooLarge { url: String, limit_mb: u64 },
}

impl FetchError {
    /// Exit 2 for what needs an operator (a newer extract, a server that
    /// went backwards, a bad URL); exit 1 for what the next run may fix.
    pub fn needs_operator(&self) -> bool {
        matches!(
            self,
            FetchError::Gone { .. }
                | FetchError::Backwards { .. }
                | FetchError::Refused { .. }
                | FetchError::TooLarge { .. }
        )
    }
}

/// One failed request, classified.
enum Fail {
    /// Worth retrying: connection, timeout, 5xx, 429 (with Retry-After).
    Transient(String, Option<Duration>),
    NotFound,
    /// A body that ended early or could not be read.
    Truncated(String),
    /// Any other status: the URL is wrong, retrying will not help.
    Status(u16),
    /// A redirect that is not followed (another scheme, too many, no
    /// Location): refused at once.
    Redirect(String),
}

/// Redirects followed for one request at most.
pub const REDIRECTS_MAX: u32 = 5;

/// One fetched diff, checked, in the cache.
#[derive(Clone, Debug)]
pub struct Fetched {
    pub sequence: i64,
    pub url: String,
    pub sha256: String,
    pub state: State,
    /// The diff in the cache folder.
    pub path: PathBuf,
    /// Its size unpacked (the gzip trailer's), for batching.
    pub unpacked_bytes: u64,
    /// Its changes, parsed once, when the body was checked.
    pub changes: Vec<crate::model::Change>,
}

pub struct Server {
    /// The base URL as shown and stored: credentials, if any, say `***`.
    base: String,
    /// The base URL requested: no credentials at all.
    plain: String,
    /// `Basic ...` for requests to the base's origin, from the URL's
    /// credentials.
    auth: Option<String>,
    agent: ureq::Agent,
    policy: RetryPolicy,
    /// Seeds the backoff jitter.
    jitter: u64,
}

/// `https://host/path` with no trailing slash; only http and https. The
/// URL is returned as given (credentials and all, for [`Server::new`]); an
/// error shows it redacted.
pub fn check_url(url: &str) -> Result<String, FetchError> {
    let u = url.trim().trim_end_matches('/');
    if !(u.starts_with("http://") || u.starts_with("https://")) || u.contains(char::is_whitespace) {
        return Err(FetchError::Refused {
            url: redact_url(url),
            message: "a replication URL is http:// or https://".into(),
        });
    }
    Ok(u.to_string())
}

/// `%XX` escapes of a URL's userinfo, decoded.
fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// Standard base64 with padding (RFC 4648), for a Basic header.
fn base64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for k in 0..4 {
            if k <= c.len() {
                out.push(A[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `scheme://host:port` of an absolute URL without credentials, for
/// telling whether a redirect leaves the origin.
fn origin(url: &str) -> &str {
    let (scheme, _, rest) = split_userinfo(url);
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    &url[..scheme.len() + end]
}

/// Where a redirect's `Location` points, from the URL that answered it.
fn resolve(from: &str, location: &str) -> String {
    // Absolute when it starts with a scheme (`file:/x` and `mailto:x`
    // included): letters, digits, `+`, `-` or `.` before the first `:`.
    let scheme = location.split(':').next().unwrap_or("");
    let absolute = location.contains(':')
        && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    if absolute {
        return location.to_string();
    }
    let o = origin(from);
    if let Some(rest) = location.strip_prefix("//") {
        let scheme = &o[..o.find("://").map_or(0, |i| i + 3)];
        return format!("{scheme}{rest}");
    }
    if location.starts_with('/') {
        return format!("{o}{location}");
    }
    let path = &from[o.len()..];
    let path = path.split(['?', '#']).next().unwrap_or("");
    let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
    let dir = if dir.is_empty() { "/" } else { dir };
    format!("{o}{dir}{location}")
}

/// A URL's scheme (before `:`), for naming a refused redirect.
fn scheme_of(url: &str) -> &str {
    url.split(':').next().unwrap_or("")
}

impl Server {
    pub fn new(base: &str, policy: RetryPolicy) -> Result<Server, FetchError> {
        let given = check_url(base)?;
        let (scheme, userinfo, rest) = split_userinfo(&given);
        // A URL already redacted (from the store, or status) has no
        // credentials to send: those come only from the config, its
        // variable, or --url, at use.
        let auth = userinfo
            .filter(|u| *u != REDACTED)
            .map(|u| format!("Basic {}", base64(&percent_decode(u))));
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(policy.timeout_s)))
            .user_agent(USER_AGENT)
            // Statuses are classified here, not turned into errors.
            .http_status_as_error(false)
            // Redirects are followed by `get_once`, which refuses other
            // schemes at once and keeps the credentials to their origin.
            .max_redirects(0)
            .build();
        Ok(Server {
            base: redact_url(&given),
            plain: format!("{scheme}{rest}"),
            auth,
            agent: config.into(),
            policy,
            jitter: highwater_store::lease::now_ns() as u64,
        })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn state_url(&self, seq: Option<i64>) -> String {
        match seq {
            None => format!("{}/state.txt", self.base),
            Some(s) => format!("{}/{}.state.txt", self.base, sequence_path(s)),
        }
    }

    pub fn diff_url(&self, seq: i64) -> String {
        format!("{}/{}.osc.gz", self.base, sequence_path(seq))
    }

    /// One GET, its body in memory (at most `limit` bytes). `url` is one
    /// this server made (redacted); the request goes to its plain form,
    /// with the credentials as a header, following http(s) redirects.
    fn get_once(&self, url: &str, limit: u64) -> Result<Vec<u8>, Fail> {
        let mut target = match url.strip_prefix(self.base.as_str()) {
            Some(path) => format!("{}{path}", self.plain),
            None => url.to_string(),
        };
        let home = origin(&self.plain).to_string();
        let mut redirects = 0;
        let mut resp = loop {
            let mut req = self.agent.get(&target);
            if let Some(a) = self.auth.as_ref().filter(|_| origin(&target) == home) {
                req = req.header("Authorization", a);
            }
            let resp = match req.call() {
                Ok(r) => r,
                Err(e) => return Err(Fail::Transient(redact_url(&e.to_string()), None)),
            };
            let status = resp.status().as_u16();
            if !(300..400).contains(&status) || status == 304 {
                break resp;
            }
            let Some(location) = resp
                .headers()
                .get("location")
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
            else {
                return Err(Fail::Redirect(format!(
                    "HTTP {status} without a Location; check the replication URL"
                )));
            };
            let next = resolve(&target, location);
            let scheme = scheme_of(&next).to_ascii_lowercase();
            if scheme != "http" && scheme != "https" {
                return Err(Fail::Redirect(format!(
                    "HTTP {status} redirects to {} ({scheme}:): only http:// and https:// redirects are followed; check the replication URL",
                    redact_url(&next)
                )));
            }
            redirects += 1;
            if redirects > REDIRECTS_MAX {
                return Err(Fail::Redirect(format!(
                    "more than {REDIRECTS_MAX} redirects (the last to {}); check the replication URL",
                    redact_url(&next)
                )));
            }
            // Credentials in a Location are not ours to send or show.
            let (sch, _, rest) = split_userinfo(&next);
            target = format!("{sch}{rest}");
        };
        let status = resp.status().as_u16();
        if status == 404 || status == 410 {
            return Err(Fail::NotFound);
        }
        if status == 429 || status >= 500 {
            let after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            return Err(Fail::Transient(format!("HTTP {status}"), after));
        }
        if status != 200 {
            return Err(Fail::Status(status));
        }
        let mut body = Vec::new();
        let reader = resp.body_mut().with_config().limit(limit).reader();
        match reader.take(limit + 1).read_to_end(&mut body) {
            Ok(_) => Ok(body),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Err(Fail::Transient(
                format!("reading the body: {}", redact_url(&e.to_string())),
                None,
            )),
            Err(e) => Err(Fail::Truncated(format!(
                "reading the body: {}",
                redact_url(&e.to_string())
            ))),
        }
    }

    /// The wait before retry `attempt` (1-based).
    fn backoff(&mut self, attempt: u32, hint: Option<Duration>) -> Duration {
        let base = self
            .policy
            .backoff_base_ms
            .saturating_mul(1 << (attempt - 1).min(16))
            .min(self.policy.backoff_max_ms);
        // xorshift: jitter only has to differ between clients.
        self.jitter ^= self.jitter << 13;
        self.jitter ^= self.jitter >> 7;
        self.jitter ^= self.jitter << 17;
        let jitter = self.jitter % (base / 2 + 1);
        let d = Duration::from_millis(base + jitter);
        match hint {
            // Retry-After is the server's word, within our own ceiling.
            Some(h) => h
                .min(Duration::from_millis(self.policy.backoff_max_ms))
                .max(d),
            None => d,
        }
    }

    /// GET with the retry policy; `Ok(None)` on a 404 when `missing_ok`.
    /// `check` validates the body; a body it refuses (or a truncated one)
    /// is fetched once more, then refused.
    fn get(
        &mut self,
        url: &str,
        limit: u64,
        missing_ok: bool,
        check: &mut dyn FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<Option<Vec<u8>>, FetchError> {
        let mut attempts = 0;
        let mut corrupt_seen = false;
        loop {
            attempts += 1;
            let wait = match self.get_once(url, limit) {
                Ok(body) => match check(&body) {
                    Ok(()) => return Ok(Some(body)),
                    Err(message) if corrupt_seen => {
                        return Err(FetchError::Corrupt {
                            url: url.to_string(),
                            message,
                        })
                    }
                    Err(_) => {
                        corrupt_seen = true;
                        Duration::ZERO
                    }
                },
                Err(Fail::Truncated(message)) => {
                    if corrupt_seen {
                        return Err(FetchError::Corrupt {
                            url: url.to_string(),
                            message,
                        });
                    }
                    corrupt_seen = true;
                    Duration::ZERO
                }
                Err(Fail::NotFound) if missing_ok => return Ok(None),
                Err(Fail::NotFound) => {
                    if attempts > self.policy.retries_max {
                        return Err(FetchError::Missing {
                            url: url.to_string(),
                            attempts,
                        });
                    }
                    self.backoff(attempts, None)
                }
                Err(Fail::Transient(message, hint)) => {
                    if attempts > self.policy.retries_max {
                        return Err(FetchError::Transient {
                            url: url.to_string(),
                            message,
                            attempts,
                        });
                    }
                    self.backoff(attempts, hint)
                }
                Err(Fail::Status(s)) => {
                    return Err(FetchError::Refused {
                        url: url.to_string(),
                        message: format!("HTTP {s}; check the replication URL"),
                    })
                }
                Err(Fail::Redirect(message)) => {
                    return Err(FetchError::Refused {
                        url: url.to_string(),
                        message,
                    })
                }
            };
            std::thread::sleep(wait);
        }
    }

    fn parse_state(url: &str, body: &[u8]) -> Result<State, String> {
        // The state parser reads files; a state is small enough to go
        // through a string here.
        let text = std::str::from_utf8(body).map_err(|_| "a state file that is not text")?;
        crate::import::parse_state_text(text, Path::new(url)).map_err(|e| e.to_string())
    }

    /// The server's newest state (`state.txt`).
    pub fn top(&mut self) -> Result<State, FetchError> {
        let url = self.state_url(None);
        let body = self
            .get(&url, STATE_BYTES_MAX, false, &mut |b| {
                Self::parse_state(&url, b).map(|_| ())
            })?
            .expect("not missing_ok");
        Ok(Self::parse_state(&url, &body).expect("checked above"))
    }

    /// A sequence's state, `None` when the server does not have it.
    pub fn state(&mut self, seq: i64) -> Result<Option<State>, FetchError> {
        let url = self.state_url(Some(seq));
        let body = self.get(&url, STATE_BYTES_MAX, true, &mut |b| {
            let s = Self::parse_state(&url, b)?;
            if s.sequence != seq {
                return Err(format!(
                    "sequenceNumber={} where the path says {seq}",
                    s.sequence
                ));
            }
            Ok(())
        })?;
        Ok(body.map(|b| Self::parse_state(&url, &b).expect("checked above")))
    }

    /// A sequence's state inside the server's range: a 404 is retried,
    /// then an error naming the URL.
    pub fn state_in_range(&mut self, seq: i64) -> Result<State, FetchError> {
        let url = self.state_url(Some(seq));
        let body = self
            .get(&url, STATE_BYTES_MAX, false, &mut |b| {
                Self::parse_state(&url, b).map(|_| ())
            })?
            .expect("not missing_ok");
        let s = Self::parse_state(&url, &body).expect("checked above");
        if s.sequence != seq {
            return Err(FetchError::Refused {
                url,
                message: format!("sequenceNumber={} where the path says {seq}", s.sequence),
            });
        }
        Ok(s)
    }

    /// Fetches diff `seq` (whose state is known) into `cache`, checked:
    /// gzip whole, osmChange parsed, unpacked to at most `unpacked_max`
    /// bytes (past it, refused at once: fetching it again would not help).
    pub fn diff(
        &mut self,
        seq: i64,
        state: State,
        cache: &Path,
        unpacked_max: u64,
    ) -> Result<Fetched, FetchError> {
        let url = self.diff_url(seq);
        let path = cache.join(format!("{}.osc.gz", sequence_path(seq)));
        let parent = path.parent().expect("a sequence path has folders");
        std::fs::create_dir_all(parent).map_err(|e| FetchError::Cache {
            path: parent.to_path_buf(),
            message: e.to_string(),
        })?;
        let write = |p: &Path, b: &[u8]| {
            std::fs::write(p, b).map_err(|e| FetchError::Cache {
                path: p.to_path_buf(),
                message: e.to_string(),
            })
        };
        let mut stop = None;
        let mut changes = Vec::new();
        let mut unpacked_bytes = 0;
        let body = self
            .get(&url, DIFF_BYTES_MAX, false, &mut |b| {
                if let Err(e) = write(&path, b) {
                    stop = Some(e);
                    return Ok(());
                }
                match crate::xml::read_changes_max(&path, unpacked_max) {
                    Ok((c, n)) => {
                        changes = c;
                        unpacked_bytes = n;
                        Ok(())
                    }
                    Err(crate::xml::OsmError::TooLarge { limit_mb, .. }) => {
                        stop = Some(FetchError::TooLarge {
                            url: url.clone(),
                            limit_mb,
                        });
                        Ok(())
                    }
                    Err(e) => Err(e.to_string()),
                }
            })?
            .expect("not missing_ok");
        if let Some(e) = stop {
            return Err(e);
        }
        Ok(Fetched {
            sequence: seq,
            url,
            sha256: Sha256::digest(&body)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
            state,
            path,
            unpacked_bytes,
            changes,
        })
    }

    /// The store is at `store_seq` and `next` is not on the server: is
    /// that a hole inside the server's range (it still has `store_seq`),
    /// has the server dropped everything up to past `next` (it has its
    /// `top`), or does it serve neither (its `state.txt` names a sequence
    /// it does not have: still filling, or another stream's)? Only the
    /// second is "gone", which sends an operator to re-import.
    pub fn missing_next(&mut self, store_seq: i64, next: i64, top: i64) -> FetchError {
        match self.state(store_seq) {
            Ok(Some(_)) => {
                return FetchError::Missing {
                    url: self.state_url(Some(next)),
                    attempts: 1,
                }
            }
            Ok(None) => {}
            Err(e) => return e,
        }
        match self.state(top) {
            Ok(Some(_)) if top != next => FetchError::Gone {
                base: self.base.clone(),
                store: store_seq,
                next,
            },
            Ok(_) => FetchError::Unserved {
                base: self.state_url(None),
                top,
                next,
            },
            Err(e) => e,
        }
    }
}

/// Refuses a state older than the one before it.
pub fn check_forward(before: Option<&State>, now: &State, url: &str) -> Result<(), FetchError> {
    if let Some(b) = before {
        // RFC 3339 in UTC with `Z` compares as text.
        if now.timestamp < b.timestamp {
            return Err(FetchError::Backwards {
                url: url.to_string(),
                before: b.timestamp.clone(),
                now: now.timestamp.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 20: what is shown of a URL, what is requested, what is sent.
    #[test]
    fn credentials_are_split_off_every_url_form() {
        for (given, shown, auth) in [
            ("https://host/r", "https://host/r", None),
            (
                "https://user:secret@host:8080/r",
                "https://***@host:8080/r",
                Some("Basic dXNlcjpzZWNyZXQ="),
            ),
            // An unescaped `/` and `@` in the password, and escapes.
            (
                "http://u:p/a@ss@host/r",
                "http://***@host/r",
                Some("Basic dTpwL2FAc3M="),
            ),
            (
                "http://u%40x:p%3Aw@host/r",
                "http://***@host/r",
                Some("Basic dUB4OnA6dw=="),
            ),
            // Already redacted (from the store): nothing to send.
            ("http://***@host/r", "http://***@host/r", None),
        ] {
            let s = Server::new(given, RetryPolicy::default()).unwrap();
            assert_eq!(s.base(), shown, "{given}");
            assert_eq!(redact_url(given), shown, "{given}");
            assert!(!s.plain.contains('@'), "{given}: {}", s.plain);
            assert_eq!(s.auth.as_deref(), auth, "{given}");
        }
        let e = check_url("ftp://user:secret@host/")
            .unwrap_err()
            .to_string();
        assert!(
            !e.contains("secret") && e.contains("ftp://***@host/"),
            "{e}"
        );
    }

    #[test]
    fn redirect_locations_resolve_against_the_url_that_answered() {
        let from = "http://a:1/r/state.txt";
        for (location, to) in [
            ("http://b/x", "http://b/x"),
            ("file:///etc/passwd", "file:///etc/passwd"),
            ("file:/etc/passwd", "file:/etc/passwd"),
            ("//c/y", "http://c/y"),
            ("/z", "http://a:1/z"),
            ("s.txt", "http://a:1/r/s.txt"),
        ] {
            assert_eq!(resolve(from, location), to, "{location}");
        }
        assert_eq!(origin("https://h:2/p?q"), "https://h:2");
    }
}
