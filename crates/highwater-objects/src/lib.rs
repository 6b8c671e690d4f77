//! Object storage (the S3 API) as a place for highwater's inputs and
//! outputs.
//!
//! `object_store` is async; highwater's engines are threads. One tokio
//! runtime runs on a thread of its own per opened store, and every call here
//! hands it a future and waits for the answer on a channel, so any number of
//! worker threads can call at once (the runtime interleaves their requests).
//!
//! Layout: this file: [`StorageSpec`] (a `[storage.NAME]` table), [`Objects`]
//! (the blocking client), [`ObjectInfo`] (what a listing says of an object)
//! and [`ObjectsError`]; [`compose`]: an object made of new bytes and
//! ranges of stored objects, copied inside the service (issue 50). Keys are
//! `/`-separated and relative to the bucket.
//!
//! What S3 lacks, and what is done instead:
//! - **no rename**: an output is uploaded to its final key in one PUT (or one
//!   multipart upload, which S3 makes visible only when it completes), and
//!   recorded after; a window's files go under a version prefix and become
//!   visible together when its manifest is put.
//! - **no compare-and-swap on files**: a manifest is published with a
//!   conditional put (`If-None-Match: *` for the first, `If-Match: ETAG`
//!   after), so of two racing publishers exactly one wins.
//! - **no stat cache**: the listing's size, ETag and last-modified time are
//!   the evidence; an unchanged ETag means the bytes were not re-read.

pub mod compose;

use bytes::Bytes;
use futures_util::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path as Key;
use object_store::{
    ObjectStore, ObjectStoreExt, PutMode, PutPayload, UpdateVersion, WriteMultipart,
};
use serde::Deserialize;
use std::future::Future;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::mpsc;
use thiserror::Error;

/// Files at least this large are uploaded in parts.
pub const MULTIPART_THRESHOLD_BYTES: u64 = 16 << 20;
/// The size of each part of a multipart upload.
pub const PART_SIZE_BYTES: usize = 8 << 20;
/// Parts of one upload in flight at once.
pub const PARTS_IN_FLIGHT_MAX: usize = 4;

/// A `[storage.NAME]` table.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StorageSpec {
    /// Only "s3" (any S3-compatible service).
    pub kind: String,
    pub bucket: String,
    /// The variable holding the endpoint URL (MinIO, Ceph, moto); without
    /// it, AWS's own endpoint for the region.
    pub endpoint_env: Option<String>,
    pub region: Option<String>,
    /// The smallest part of a multipart upload but the last, which the
    /// service enforces (default 5 MiB, S3's and MinIO's rule); what a
    /// composed object ([`compose`]) sends at least per junction.
    pub part_min_bytes: Option<u64>,
}

#[derive(Debug, Error)]
pub enum ObjectsError {
    #[error("[storage.{name}] {message}")]
    Config { name: String, message: String },
    #[error("storage `{name}`, {key}: {source}")]
    Store {
        name: String,
        key: String,
        #[source]
        source: object_store::Error,
    },
    #[error("storage `{name}`, {key}: {what} {path}: {source}")]
    Local {
        name: String,
        key: String,
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("storage `{name}`, {key}: {message}")]
    Compose {
        name: String,
        key: String,
        message: String,
    },
    #[error("storage `{name}`: its runtime thread stopped")]
    Gone { name: String },
}

/// What a listing says of one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
    /// As the service gives it, quotes removed. An MD5 of the bytes for a
    /// single-part upload; something else (with a `-N` suffix) after a
    /// multipart upload, so it vouches for "unchanged", never for "equal".
    pub etag: String,
    pub last_modified_ns: i64,
}

/// How a conditional put went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Put {
    /// Written; the new ETag.
    Done(String),
    /// The condition failed: someone else wrote first.
    Lost,
}

type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A blocking client of one bucket.
pub struct Objects {
    name: String,
    store: std::sync::Arc<AmazonS3>,
    jobs: tokio::sync::mpsc::UnboundedSender<Job>,
    signing: compose::Signing,
    part_min_bytes: u64,
}

fn install_crypto() {
    // rustls needs one process-wide provider; ring is the one in the tree.
    // An error means one is installed already, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl Objects {
    /// A client for `[storage.NAME]`; credentials come from the usual
    /// `AWS_*` variables. Makes no request.
    pub fn open(name: &str, spec: &StorageSpec) -> Result<Objects, ObjectsError> {
        Self::open_with(name, spec, None)
    }

    /// `open`, with the endpoint and credentials given rather than read
    /// from the environment (tests, which must not change it).
    #[doc(hidden)]
    pub fn open_with(
        name: &str,
        spec: &StorageSpec,
        given: Option<(&str, &str, &str)>,
    ) -> Result<Objects, ObjectsError> {
        let bad = |message: String| ObjectsError::Config {
            name: name.to_string(),
            message,
        };
        if spec.kind != "s3" {
            return Err(bad(format!(
                "kind = {:?}: only \"s3\" (any S3-compatible service) is known",
                spec.kind
            )));
        }
        if spec.bucket.is_empty() {
            return Err(bad("bucket is empty".into()));
        }
        install_crypto();
        let mut b = match given {
            Some((_, key, secret)) => AmazonS3Builder::new()
                .with_access_key_id(key)
                .with_secret_access_key(secret),
            None => AmazonS3Builder::from_env(),
        }
        .with_bucket_name(&spec.bucket);
        if let Some(r) = &spec.region {
            b = b.with_region(r);
        }
        let endpoint = match (given, &spec.endpoint_env) {
            (Some((url, _, _)), _) => Some(url.to_string()),
            (None, Some(var)) => Some(std::env::var(var).map_err(|_| {
                bad(format!(
                    "endpoint_env = {var:?}, but that variable is not set; set it to the service's URL, or remove endpoint_env for AWS"
                ))
            })?),
            (None, None) => None,
        };
        if let Some(url) = endpoint {
            b = b
                .with_allow_http(url.starts_with("http://"))
                .with_endpoint(url)
                // Path-style requests: the bucket need not be a host name.
                .with_virtual_hosted_style_request(false);
        }
        let signing = compose::Signing {
            endpoint: b.get_config_value(&AmazonS3ConfigKey::Endpoint),
            bucket: spec.bucket.clone(),
            region: b
                .get_config_value(&AmazonS3ConfigKey::Region)
                .unwrap_or_else(|| "us-east-1".into()),
        };
        let part_min_bytes = spec.part_min_bytes.unwrap_or(compose::PART_MIN_BYTES_S3);
        if part_min_bytes == 0 {
            return Err(bad(
                "part_min_bytes = 0: give the service's smallest part (S3: 5242880)".into(),
            ));
        }
        let store = b
            .build()
            .map_err(|e| bad(format!("cannot be opened: {e}")))?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Job>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| bad(format!("cannot start its runtime: {e}")))?;
        std::thread::Builder::new()
            .name(format!("storage-{name}"))
            .spawn(move || {
                // Each job is spawned, so that the callers' requests run
                // concurrently; the loop ends when the client is dropped.
                runtime.block_on(async move {
                    while let Some(j) = rx.recv().await {
                        tokio::spawn(j);
                    }
                });
            })
            .map_err(|e| bad(format!("cannot start its runtime thread: {e}")))?;
        Ok(Objects {
            name: name.to_string(),
            store: std::sync::Arc::new(store),
            jobs: tx,
            signing,
            part_min_bytes,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `f` on the runtime thread and waits for its answer.
    fn call<T: Send + 'static>(
        &self,
        f: impl Future<Output = T> + Send + 'static,
    ) -> Result<T, ObjectsError> {
        let (tx, rx) = mpsc::sync_channel(1);
        let job: Job = Box::pin(async move {
            let _ = tx.send(f.await);
        });
        self.jobs.send(job).map_err(|_| ObjectsError::Gone {
            name: self.name.clone(),
        })?;
        rx.recv().map_err(|_| ObjectsError::Gone {
            name: self.name.clone(),
        })
    }

    fn err(&self, key: &str) -> impl Fn(object_store::Error) -> ObjectsError + '_ {
        let key = key.to_string();
        move |source| ObjectsError::Store {
            name: self.name.clone(),
            key: key.clone(),
            source,
        }
    }

    /// Every object under `prefix` (a folder: `a/b` lists `a/b/...`), by key.
    pub fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, ObjectsError> {
        let store = self.store.clone();
        let p = prefix.trim_end_matches('/').to_string();
        let out = self.call(async move {
            let key = (!p.is_empty()).then(|| Key::from(p.as_str()));
            let mut s = store.list(key.as_ref());
            let mut out = Vec::new();
            while let Some(m) = s.next().await {
                let m = m?;
                out.push(ObjectInfo {
                    key: m.location.to_string(),
                    size: m.size,
                    etag: m.e_tag.unwrap_or_default().trim_matches('"').to_string(),
                    last_modified_ns: m.last_modified.timestamp_nanos_opt().unwrap_or(0),
                });
            }
            out.sort_by(|a, b| a.key.cmp(&b.key));
            Ok::<_, object_store::Error>(out)
        })?;
        out.map_err(self.err(prefix))
    }

    /// The object's bytes and ETag, or `None` when there is no such object.
    pub fn get(&self, key: &str) -> Result<Option<(Bytes, String)>, ObjectsError> {
        let store = self.store.clone();
        let k = Key::from(key);
        let r = self.call(async move {
            match store.get(&k).await {
                Ok(g) => {
                    let etag = g.meta.e_tag.clone().unwrap_or_default();
                    let b = g.bytes().await?;
                    Ok(Some((b, etag.trim_matches('"').to_string())))
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })?;
        r.map_err(self.err(key))
    }

    /// Streams the object into a new file at `to`; returns its ETag.
    pub fn get_to(&self, key: &str, to: &Path) -> Result<String, ObjectsError> {
        let local = |what, source| ObjectsError::Local {
            name: self.name.clone(),
            key: key.to_string(),
            what,
            path: to.to_path_buf(),
            source,
        };
        let mut f = std::fs::File::create(to).map_err(|e| local("creating", e))?;
        let store = self.store.clone();
        let k = Key::from(key);
        // Chunks cross from the runtime to this thread over a bounded
        // channel, so a slow disk bounds the memory in flight.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Bytes, object_store::Error>>(8);
        let (etx, erx) = mpsc::sync_channel(1);
        let job: Job = Box::pin(async move {
            match store.get(&k).await {
                Ok(g) => {
                    let _ = etx.send(g.meta.e_tag.clone().unwrap_or_default());
                    let mut s = g.into_stream();
                    while let Some(c) = s.next().await {
                        if tx.send(c).await.is_err() {
                            return;
                        }
                    }
                }
                Err(e) => {
                    let _ = etx.send(String::new());
                    let _ = tx.send(Err(e)).await;
                }
            }
        });
        self.jobs.send(job).map_err(|_| ObjectsError::Gone {
            name: self.name.clone(),
        })?;
        let etag = erx.recv().map_err(|_| ObjectsError::Gone {
            name: self.name.clone(),
        })?;
        while let Some(c) = rx.blocking_recv() {
            let c = c.map_err(self.err(key))?;
            f.write_all(&c).map_err(|e| local("writing", e))?;
        }
        f.sync_all().map_err(|e| local("syncing", e))?;
        Ok(etag.trim_matches('"').to_string())
    }

    /// Uploads the file at `from` to `key` (in parts when large); the object
    /// appears whole or not at all. Returns its ETag.
    pub fn put_file(&self, from: &Path, key: &str) -> Result<String, ObjectsError> {
        let local = |what, source| ObjectsError::Local {
            name: self.name.clone(),
            key: key.to_string(),
            what,
            path: from.to_path_buf(),
            source,
        };
        let mut f = std::fs::File::open(from).map_err(|e| local("opening", e))?;
        let size = f.metadata().map_err(|e| local("reading", e))?.len();
        let store = self.store.clone();
        let k = Key::from(key);
        if size < MULTIPART_THRESHOLD_BYTES {
            let mut buf = Vec::with_capacity(size as usize);
            f.read_to_end(&mut buf).map_err(|e| local("reading", e))?;
            let r = self.call(async move {
                store
                    .put(&k, PutPayload::from(buf))
                    .await
                    .map(|r| r.e_tag.unwrap_or_default())
            })?;
            return r
                .map(|e| e.trim_matches('"').to_string())
                .map_err(self.err(key));
        }
        // Parts are read here and sent to the runtime one at a time; the
        // writer keeps up to PARTS_IN_FLIGHT_MAX uploads going.
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(2);
        let (dtx, drx) = mpsc::sync_channel(1);
        let job: Job = Box::pin(async move {
            let r = async {
                let upload = store.put_multipart(&k).await?;
                let mut w = WriteMultipart::new_with_chunk_size(upload, PART_SIZE_BYTES);
                let mut rx = rx;
                while let Some(b) = rx.recv().await {
                    w.wait_for_capacity(PARTS_IN_FLIGHT_MAX).await?;
                    w.put(b);
                }
                w.finish().await.map(|r| r.e_tag.unwrap_or_default())
            }
            .await;
            let _ = dtx.send(r);
        });
        self.jobs.send(job).map_err(|_| ObjectsError::Gone {
            name: self.name.clone(),
        })?;
        let mut buf = vec![0u8; PART_SIZE_BYTES];
        loop {
            let n = read_full(&mut f, &mut buf).map_err(|e| local("reading", e))?;
            if n == 0 {
                break;
            }
            if tx.blocking_send(Bytes::copy_from_slice(&buf[..n])).is_err() {
                break;
            }
        }
        drop(tx);
        let r = drx.recv().map_err(|_| ObjectsError::Gone {
            name: self.name.clone(),
        })?;
        r.map(|e| e.trim_matches('"').to_string())
            .map_err(self.err(key))
    }

    /// Puts `bytes` at `key` only if the object is absent (`expected` None)
    /// or still has the ETag `expected`.
    pub fn put_if(
        &self,
        key: &str,
        bytes: Vec<u8>,
        expected: Option<&str>,
    ) -> Result<Put, ObjectsError> {
        let store = self.store.clone();
        let k = Key::from(key);
        let mode = match expected {
            None => PutMode::Create,
            Some(e) => PutMode::Update(UpdateVersion {
                e_tag: Some(format!("\"{}\"", e.trim_matches('"'))),
                version: None,
            }),
        };
        let r = self.call(async move {
            let opts = object_store::PutOptions {
                mode,
                ..Default::default()
            };
            store.put_opts(&k, PutPayload::from(bytes), opts).await
        })?;
        match r {
            Ok(r) => Ok(Put::Done(
                r.e_tag.unwrap_or_default().trim_matches('"').to_string(),
            )),
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => Ok(Put::Lost),
            Err(e) => Err(self.err(key)(e)),
        }
    }

    /// `len` bytes of the object from `offset`.
    pub fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Bytes, ObjectsError> {
        let store = self.store.clone();
        let k = Key::from(key);
        let r = self.call(async move { store.get_range(&k, offset..offset + len).await })?;
        r.map_err(self.err(key))
    }

    /// The smallest part but the last this service takes.
    pub fn part_min_bytes(&self) -> u64 {
        self.part_min_bytes
    }

    /// Makes the object `key` from `pieces` in one multipart upload: new
    /// bytes sent, ranges of stored objects copied inside the service
    /// (`UploadPartCopy`), parts planned by [`compose::plan`]. The object
    /// appears whole when the upload completes, or not at all (a failed
    /// upload is aborted; one killed is left for the bucket's lifecycle
    /// rule on incomplete uploads).
    pub fn compose(
        &self,
        key: &str,
        pieces: &[compose::Piece],
    ) -> Result<compose::Composed, ObjectsError> {
        let parts = compose::plan(pieces, self.part_min_bytes);
        if parts.len() > compose::PARTS_MAX {
            return Err(ObjectsError::Config {
                name: self.name.clone(),
                message: format!(
                    "{key}: {} parts, more than S3's {}",
                    parts.len(),
                    compose::PARTS_MAX
                ),
            });
        }
        // Short ranges are read back here, before the upload starts.
        let mut out = compose::Composed {
            parts: parts.len(),
            ..Default::default()
        };
        let mut bodies: Vec<Option<Bytes>> = Vec::with_capacity(parts.len());
        for p in &parts {
            match p {
                compose::Part::Upload(chunks) => {
                    let mut body = Vec::with_capacity(p.len() as usize);
                    for c in chunks {
                        match c {
                            compose::Chunk::Bytes(b) => body.extend_from_slice(b),
                            compose::Chunk::Download { from, offset, len } => {
                                body.extend_from_slice(&self.get_range(from, *offset, *len)?);
                                out.downloaded_bytes += len;
                            }
                        }
                    }
                    out.uploaded_bytes += body.len() as u64;
                    bodies.push(Some(Bytes::from(body)));
                }
                compose::Part::Copy { len, .. } => {
                    out.copied_bytes += len;
                    bodies.push(None);
                }
            }
        }
        let store = self.store.clone();
        let signing = self.signing.clone();
        let k = Key::from(key);
        let key_s = key.to_string();
        let r = self.call(async move {
            let id = store
                .create_multipart(&k)
                .await
                .map_err(|e| e.to_string())?;
            let run = async {
                let client = reqwest::Client::builder()
                    .build()
                    .map_err(|e| format!("an HTTP client: {e}"))?;
                let mut ids = Vec::with_capacity(parts.len());
                for (i, (p, body)) in parts.iter().zip(bodies).enumerate() {
                    let etag = match (p, body) {
                        (compose::Part::Copy { from, offset, len }, _) => {
                            let cred = object_store::CredentialProvider::get_credential(
                                store.credentials().as_ref(),
                            )
                            .await
                            .map_err(|e| e.to_string())?;
                            signing
                                .copy_part(
                                    &client,
                                    &cred,
                                    &key_s,
                                    &id,
                                    i + 1,
                                    (from, *offset, *len),
                                )
                                .await?
                        }
                        (_, body) => {
                            store
                                .put_part(&k, &id, i, PutPayload::from(body.unwrap_or_default()))
                                .await
                                .map_err(|e| e.to_string())?
                                .content_id
                        }
                    };
                    ids.push(PartId { content_id: etag });
                }
                store
                    .complete_multipart(&k, &id, ids)
                    .await
                    .map(|r| r.e_tag.unwrap_or_default())
                    .map_err(|e| e.to_string())
            };
            let r = run.await;
            if r.is_err() {
                let _ = store.abort_multipart(&k, &id).await;
            }
            r
        })?;
        out.etag = r
            .map_err(|message| ObjectsError::Compose {
                name: self.name.clone(),
                key: key.to_string(),
                message,
            })?
            .trim_matches('"')
            .to_string();
        Ok(out)
    }

    /// Removes the object; an absent one is not an error.
    pub fn delete(&self, key: &str) -> Result<(), ObjectsError> {
        let store = self.store.clone();
        let k = Key::from(key);
        let r = self.call(async move {
            match store.delete(&k).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        })?;
        r.map_err(self.err(key))
    }
}

fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Splits `NAME:rest` when NAME is one of `names`; `None` for a local path.
pub fn split_place<'a>(s: &'a str, names: &[&str]) -> Option<(&'a str, &'a str)> {
    let (n, rest) = s.split_once(':')?;
    names.contains(&n).then_some((n, rest))
}

/// A throw-away S3-compatible server for tests: moto (PyPI `moto[server]`,
/// which enforces conditional writes) on 127.0.0.1, one request at a time
/// (see `SERIAL_MOTO`), killed when dropped. `scripts/deps.sh` installs it
/// in the test venv and exports `HIGHWATER_TEST_PYTHON`; without it this
/// panics, so no test skips.
#[doc(hidden)]
pub mod testing {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    /// moto's own server (`moto_server`) is threaded, and its S3 backend
    /// checks `If-Match` and writes in separate steps: two racing updates
    /// from one ETag can both succeed (the race test below caught it, in
    /// one of 20 rounds). S3 makes each conditional put atomic; so does this
    /// launcher, by serving one request at a time over threaded connections.
    const SERIAL_MOTO: &str = r#"
import sys, threading
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication, MotoRequestHandler, create_backend_app)
import json, os
inner = DomainDispatcherApplication(create_backend_app)
lock = threading.Lock()
log = os.environ.get("HW_MOTO_LOG")
def app(environ, start_response):
    with lock:
        if log:
            # The server's own record of each request, for tests that count
            # what crossed the network (issue 50).
            with open(log, "a") as f:
                f.write(json.dumps({
                    "method": environ.get("REQUEST_METHOD"),
                    "path": environ.get("PATH_INFO"),
                    "query": environ.get("QUERY_STRING", ""),
                    "length": int(environ.get("CONTENT_LENGTH") or 0),
                    "copy_source": environ.get("HTTP_X_AMZ_COPY_SOURCE"),
                    "copy_range": environ.get("HTTP_X_AMZ_COPY_SOURCE_RANGE"),
                }) + "\n")
        return list(inner(environ, start_response))
run_simple(sys.argv[1], int(sys.argv[2]), app, threaded=True,
           request_handler=MotoRequestHandler)
"#;

    pub struct Moto {
        child: Child,
        pub endpoint: String,
        port: u16,
    }

    /// How to start the server.
    #[derive(Default)]
    pub struct Options {
        /// Append one JSON line per request (method, path, query, body
        /// length, copy source and range) to this file.
        pub request_log: Option<std::path::PathBuf>,
        /// moto's smallest part but the last (`S3_UPLOAD_PART_MIN_SIZE`;
        /// default S3's 5 MiB), which it enforces when an upload completes.
        pub part_min_bytes: Option<u64>,
    }

    impl Moto {
        pub fn start() -> Moto {
            Self::start_with(Options::default())
        }

        pub fn start_with(opts: Options) -> Moto {
            let python = std::env::var("HIGHWATER_TEST_PYTHON").unwrap_or_else(|_| {
                panic!("HIGHWATER_TEST_PYTHON is not set: run the tests with `bash scripts/test.sh`, which installs moto[server] in its venv")
            });
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("a free port");
            let mut cmd = Command::new(&python);
            if let Some(l) = &opts.request_log {
                cmd.env("HW_MOTO_LOG", l);
            }
            if let Some(m) = opts.part_min_bytes {
                cmd.env("S3_UPLOAD_PART_MIN_SIZE", m.to_string());
            }
            let child = cmd
                .args(["-c", SERIAL_MOTO, "127.0.0.1", &port.to_string()])
                .env("MOTO_PORT", port.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start moto with {python}: {e}"));
            let m = Moto {
                child,
                endpoint: format!("http://127.0.0.1:{port}"),
                port,
            };
            let t = Instant::now();
            while TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(
                    t.elapsed() < Duration::from_secs(60),
                    "moto_server did not listen"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            m
        }

        /// Creates a bucket (moto takes an unsigned request).
        pub fn bucket(&self, name: &str) {
            let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
            write!(
                s,
                "PUT /{name} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                self.port
            )
            .unwrap();
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            assert!(
                out.starts_with("HTTP/1.1 200"),
                "creating bucket {name}: {out}"
            );
        }

        /// A client of `bucket` on this server (creating the bucket).
        pub fn client(&self, bucket: &str) -> crate::Objects {
            self.bucket(bucket);
            crate::Objects::open_with(
                "lake",
                &crate::StorageSpec {
                    kind: "s3".into(),
                    bucket: bucket.into(),
                    endpoint_env: None,
                    region: Some("us-east-1".into()),
                    part_min_bytes: None,
                },
                Some((&self.endpoint, "testing", "testing")),
            )
            .expect("a client of the test server")
        }

        /// The variables a highwater process needs.
        pub fn env(&self) -> Vec<(&'static str, String)> {
            vec![
                ("S3_ENDPOINT", self.endpoint.clone()),
                ("AWS_ACCESS_KEY_ID", "testing".into()),
                ("AWS_SECRET_ACCESS_KEY", "testing".into()),
                ("AWS_REGION", "us-east-1".into()),
            ]
        }
    }

    impl Drop for Moto {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
