//! A streaming reader for OSM XML (`.osm`) and change files (`.osc`), plain
//! or gzipped. Change files may interleave and repeat `create`, `modify` and
//! `delete` blocks; the reader reports changes in file order and leaves "the
//! last version wins" to the caller. A malformed file is an error naming the
//! file, the line and the element, before anything is applied.

use crate::model::{Action, Change, Element, Member, MemberKind, Node, Relation, Tags, Way};
use quick_xml::events::{BytesStart, Event};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum OsmError {
    #[error(
        "{path}:{line}: {element}: {message}. The file was not applied; fix or re-download it"
    )]
    Malformed {
        path: PathBuf,
        line: u64,
        element: String,
        message: String,
    },
    #[error("cannot read {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("{path}: unpacks to more than {limit_mb} MB, the limit (--max-diff-mb): a gzip bomb, or a diff larger than the limit (raise --max-diff-mb if it is genuine); refused, nothing was applied")]
    TooLarge { path: PathBuf, limit_mb: u64 },
}

/// Counts what a reader hands out and fails once it passes `max` bytes:
/// the unpacked-size limit, applied while unpacking, so that a small gzip
/// that inflates without bound stops at the limit (plus one read).
struct Capped<R> {
    inner: R,
    read: std::rc::Rc<std::cell::Cell<u64>>,
    max: u64,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let total = self.read.get().saturating_add(n as u64);
        self.read.set(total);
        if total > self.max {
            return Err(std::io::Error::other("past the unpacked-size limit"));
        }
        Ok(n)
    }
}

/// A `BufRead` that counts the newlines it has handed out, so that errors
/// can name a line without holding the file in memory.
struct LineCounter<R> {
    inner: R,
    newlines: u64,
}

impl<R: BufRead> Read for LineCounter<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.newlines += buf[..n].iter().filter(|b| **b == b'\n').count() as u64;
        Ok(n)
    }
}

impl<R: BufRead> BufRead for LineCounter<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        self.inner.fill_buf()
    }
    fn consume(&mut self, amt: usize) {
        if let Ok(buf) = self.inner.fill_buf() {
            let n = amt.min(buf.len());
            self.newlines += buf[..n].iter().filter(|b| **b == b'\n').count() as u64;
        }
        self.inner.consume(amt);
    }
}

fn open(path: &Path, cap: &Capped<()>) -> Result<Box<dyn BufRead>, OsmError> {
    let io = |err| OsmError::Io {
        path: path.to_path_buf(),
        err,
    };
    let f = std::fs::File::open(path).map_err(io)?;
    let gz = path.extension().is_some_and(|e| e == "gz");
    let capped = |inner: Box<dyn Read>| Capped {
        inner,
        read: cap.read.clone(),
        max: cap.max,
    };
    Ok(if gz {
        Box::new(BufReader::with_capacity(
            1 << 16,
            capped(Box::new(flate2::read::MultiGzDecoder::new(BufReader::new(
                f,
            )))),
        ))
    } else {
        Box::new(BufReader::with_capacity(1 << 16, capped(Box::new(f))))
    })
}

/// The element being assembled, with its children.
struct Pending {
    element: Element,
    action: Option<Action>,
}

struct Parser<'p> {
    path: &'p Path,
    reader: quick_xml::Reader<LineCounter<Box<dyn BufRead>>>,
}

impl Parser<'_> {
    fn line(&self) -> u64 {
        self.reader.get_ref().newlines + 1
    }

    fn bad(&self, element: &str, message: impl Into<String>) -> OsmError {
        OsmError::Malformed {
            path: self.path.to_path_buf(),
            line: self.line(),
            element: element.to_string(),
            message: message.into(),
        }
    }

    fn attrs(&self, e: &BytesStart<'_>, what: &str) -> Result<Vec<(String, String)>, OsmError> {
        let mut out = Vec::new();
        for a in e.attributes() {
            let a = a.map_err(|err| self.bad(what, format!("bad attribute: {err}")))?;
            let k = a.key.as_ref().to_string();
            #[allow(deprecated)]
            let v = a
                .unescape_value()
                .map_err(|err| self.bad(what, format!("bad attribute `{k}`: {err}")))?
                .into_owned();
            out.push((k, v));
        }
        Ok(out)
    }

    fn id(&self, attrs: &[(String, String)], what: &str) -> Result<i64, OsmError> {
        let v = get(attrs, "id").ok_or_else(|| self.bad(what, "missing `id`"))?;
        let id: i64 = v
            .parse()
            .map_err(|_| self.bad(what, format!("`id` is not an integer: {v:?}")))?;
        // Named as errors name elements (`n-1`), from `node`, `way`, ...
        let key = format!("{}{id}", what.chars().next().unwrap_or('?'));
        self.in_range(id, &key)
    }

    fn in_range(&self, id: i64, what: &str) -> Result<i64, OsmError> {
        if id < 0 {
            // Issue 50: refused where it is read, naming the file, the
            // line and the element: the first negative id of the file.
            return Err(self.bad(
                what,
                format!("id {id} is negative: {}", crate::model::NEGATIVE_ID_ADVICE),
            ));
        }
        if crate::model::id_in_range(id) {
            Ok(id)
        } else {
            Err(self.bad(
                what,
                format!(
                    "id {id} is beyond ±2^60, the largest id highwater stores (OSM ids are near 2^34)"
                ),
            ))
        }
    }

    fn coord(
        &self,
        attrs: &[(String, String)],
        key: &str,
        what: &str,
        limit: f64,
    ) -> Result<Option<i32>, OsmError> {
        match get(attrs, key) {
            None => Ok(None),
            Some(v) => {
                let d: f64 = v
                    .parse()
                    .map_err(|_| self.bad(what, format!("`{key}` is not a number: {v:?}")))?;
                if !d.is_finite() || d.abs() > limit {
                    return Err(self.bad(what, format!("`{key}` = {d} is out of range")));
                }
                Ok(Some((d * crate::model::COORD_SCALE).round() as i32))
            }
        }
    }
}

fn get<'a>(attrs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    attrs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Reads a file, calling `sink(action, element)` for every element in file
/// order (`action` is `None` outside change blocks, as in a `.osm` file).
fn read(
    path: &Path,
    want_root: &str,
    sink: impl FnMut(Option<Action>, Element) -> Result<(), OsmError>,
) -> Result<(), OsmError> {
    read_capped(path, want_root, u64::MAX, sink).map(|_| ())
}

/// [`read`], refusing a file that unpacks past `max_bytes`; returns the
/// unpacked size.
fn read_capped(
    path: &Path,
    want_root: &str,
    max_bytes: u64,
    sink: impl FnMut(Option<Action>, Element) -> Result<(), OsmError>,
) -> Result<u64, OsmError> {
    let cap = Capped {
        inner: (),
        read: Default::default(),
        max: max_bytes,
    };
    let r = read_uncapped(path, want_root, open(path, &cap)?, sink);
    // Whatever error the cut-off read turned into (most often "not
    // well-formed XML"), the cause is the limit.
    if cap.read.get() > max_bytes {
        return Err(OsmError::TooLarge {
            path: path.to_path_buf(),
            limit_mb: max_bytes >> 20,
        });
    }
    r.map(|()| cap.read.get())
}

fn read_uncapped(
    path: &Path,
    want_root: &str,
    input: Box<dyn BufRead>,
    mut sink: impl FnMut(Option<Action>, Element) -> Result<(), OsmError>,
) -> Result<(), OsmError> {
    let mut reader = quick_xml::Reader::from_reader(LineCounter {
        inner: input,
        newlines: 0,
    });
    reader.config_mut().trim_text(true);
    let mut p = Parser { path, reader };
    let mut buf = Vec::new();
    let mut action: Option<Action> = None;
    let mut pending: Option<Pending> = None;
    let mut saw_root = false;
    loop {
        let ev = p.reader.read_event_into(&mut buf).map_err(|err| {
            p.bad(
                pending
                    .as_ref()
                    .map_or("document".into(), |x| x.element.key())
                    .as_str(),
                format!("not well-formed XML: {err}"),
            )
        })?;
        let (e, empty) = match ev {
            Event::Eof => break,
            Event::Start(e) => (e.into_owned(), false),
            Event::Empty(e) => (e.into_owned(), true),
            Event::End(e) => {
                match e.name().as_ref() {
                    "node" | "way" | "relation" => {
                        if let Some(x) = pending.take() {
                            sink(x.action, x.element)?;
                        }
                    }
                    "create" | "modify" | "delete" => action = None,
                    _ => {}
                }
                buf.clear();
                continue;
            }
            _ => {
                buf.clear();
                continue;
            }
        };
        let name = e.name().as_ref().to_string();
        match name.as_str() {
            "osm" | "osmChange" if !saw_root => {
                saw_root = true;
                if name != want_root {
                    return Err(p.bad(
                        &name,
                        if want_root == "osmChange" {
                            "this is an .osm extract (root <osm>), not a change file (<osmChange>): import it with `highwater osm import`, or give the .osc diff"
                        } else {
                            "this is a change file (root <osmChange>), not an extract: apply it with `highwater osm apply`, or give the .osm extract"
                        },
                    ));
                }
            }
            "create" | "modify" | "delete" => {
                if pending.is_some() {
                    return Err(p.bad("change block", "a change block inside an element"));
                }
                action = Some(match name.as_str() {
                    "create" => Action::Create,
                    "modify" => Action::Modify,
                    _ => Action::Delete,
                });
                if empty {
                    action = None;
                }
            }
            "node" | "way" | "relation" => {
                if pending.is_some() {
                    return Err(p.bad("element", "an element inside another element"));
                }
                let what = name.clone();
                let attrs = p.attrs(&e, &what)?;
                let id = p.id(&attrs, &what)?;
                let element = match name.as_str() {
                    "node" => {
                        let key = format!("n{id}");
                        let lat = p.coord(&attrs, "lat", &key, 90.0)?;
                        let lon = p.coord(&attrs, "lon", &key, 180.0)?;
                        if action != Some(Action::Delete) && (lat.is_none() || lon.is_none()) {
                            return Err(
                                p.bad(&key, "a node outside a delete needs `lat` and `lon`")
                            );
                        }
                        Element::Node(Node {
                            id,
                            lat_e7: lat,
                            lon_e7: lon,
                            tags: Tags::new(),
                        })
                    }
                    "way" => Element::Way(Way {
                        id,
                        refs: Vec::new(),
                        tags: Tags::new(),
                    }),
                    _ => Element::Relation(Relation {
                        id,
                        members: Vec::new(),
                        tags: Tags::new(),
                    }),
                };
                let x = Pending { element, action };
                if empty {
                    sink(x.action, x.element)?;
                } else {
                    pending = Some(x);
                }
            }
            "tag" | "nd" | "member" => {
                let Some(x) = pending.as_mut() else {
                    return Err(p.bad(&name, "outside a node, way or relation"));
                };
                let key = x.element.key();
                let attrs = p.attrs(&e, &key)?;
                match (name.as_str(), &mut x.element) {
                    ("tag", Element::Node(Node { tags, .. }))
                    | ("tag", Element::Way(Way { tags, .. }))
                    | ("tag", Element::Relation(Relation { tags, .. })) => {
                        let k = get(&attrs, "k").ok_or_else(|| p.bad(&key, "a tag without `k`"))?;
                        let v = get(&attrs, "v")
                            .ok_or_else(|| p.bad(&key, format!("tag `{k}` without `v`")))?;
                        tags.insert(k.to_string(), v.to_string());
                    }
                    ("nd", Element::Way(w)) => {
                        let r =
                            get(&attrs, "ref").ok_or_else(|| p.bad(&key, "an nd without `ref`"))?;
                        let id = r
                            .parse()
                            .map_err(|_| p.bad(&key, format!("nd ref {r:?} is not an integer")))?;
                        w.refs.push(p.in_range(id, &key)?);
                    }
                    ("member", Element::Relation(rel)) => {
                        let kind = match get(&attrs, "type") {
                            Some("node") => MemberKind::Node,
                            Some("way") => MemberKind::Way,
                            Some("relation") => MemberKind::Relation,
                            other => {
                                return Err(p.bad(
                                    &key,
                                    format!("member type {other:?} is not node, way or relation"),
                                ))
                            }
                        };
                        let r = get(&attrs, "ref")
                            .ok_or_else(|| p.bad(&key, "a member without `ref`"))?;
                        rel.members.push(Member {
                            kind,
                            id: p.in_range(
                                r.parse().map_err(|_| {
                                    p.bad(&key, format!("member ref {r:?} is not an integer"))
                                })?,
                                &key,
                            )?,
                            role: get(&attrs, "role").unwrap_or("").to_string(),
                        });
                    }
                    _ => return Err(p.bad(&key, format!("unexpected <{name}>"))),
                }
            }
            // bounds, changeset metadata and anything else carry nothing we use.
            _ => {}
        }
        buf.clear();
    }
    if pending.is_some() {
        return Err(p.bad("document", "the file ends inside an element (truncated?)"));
    }
    if !saw_root {
        return Err(p.bad("document", "no <osm> or <osmChange> root"));
    }
    Ok(())
}

/// Reads a change file into memory, in file order. Change files are small
/// (a minutely planet diff is a few MB), and derive-before-apply needs every
/// change at hand anyway.
pub fn read_changes(path: &Path) -> Result<Vec<Change>, OsmError> {
    read_changes_max(path, u64::MAX).map(|(c, _)| c)
}

/// [`read_changes`], refused with [`OsmError::TooLarge`] as soon as the
/// file unpacks past `max_bytes`; with the unpacked size.
pub fn read_changes_max(path: &Path, max_bytes: u64) -> Result<(Vec<Change>, u64), OsmError> {
    let mut out = Vec::new();
    let n = read_capped(path, "osmChange", max_bytes, |action, element| {
        let Some(action) = action else {
            return Err(OsmError::Malformed {
                path: path.to_path_buf(),
                line: 0,
                element: element.key(),
                message: "an element outside a create, modify or delete block".into(),
            });
        };
        out.push(Change { action, element });
        Ok(())
    })?;
    Ok((out, n))
}

/// Streams an `.osm` file's elements to `sink`.
pub fn read_osm(
    path: &Path,
    mut sink: impl FnMut(Element) -> Result<(), OsmError>,
) -> Result<(), OsmError> {
    read(path, "osm", |_, e| sink(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn reads_interleaved_blocks_in_file_order() {
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            "a.osc",
            r#"<?xml version="1.0"?>
<osmChange version="0.6">
  <modify><node id="1" lat="43.7" lon="7.4"><tag k="name" v="A &amp; B"/></node></modify>
  <create><way id="5"><nd ref="1"/><nd ref="2"/><tag k="highway" v="residential"/></way></create>
  <delete><node id="2"/></delete>
  <modify><node id="1" lat="43.8" lon="7.5"/></modify>
  <create><relation id="9"><member type="way" ref="5" role="outer"/><tag k="type" v="multipolygon"/></relation></create>
</osmChange>"#,
        );
        let c = read_changes(&p).unwrap();
        let keys: Vec<_> = c.iter().map(|c| (c.action, c.element.key())).collect();
        assert_eq!(
            keys,
            [
                (Action::Modify, "n1".into()),
                (Action::Create, "w5".into()),
                (Action::Delete, "n2".into()),
                (Action::Modify, "n1".into()),
                (Action::Create, "r9".into())
            ]
        );
        let Element::Node(n) = &c[0].element else {
            panic!()
        };
        assert_eq!(n.tags["name"], "A & B");
        assert_eq!((n.lat_e7, n.lon_e7), (Some(437_000_000), Some(74_000_000)));
        let Element::Node(del) = &c[2].element else {
            panic!()
        };
        assert_eq!(del.lat_e7, None, "a delete may come without coordinates");
        let Element::Way(w) = &c[1].element else {
            panic!()
        };
        assert_eq!(w.refs, [1, 2]);
    }

    #[test]
    fn malformed_files_name_the_line_and_element() {
        let d = tempfile::tempdir().unwrap();
        let cases = [
            ("<osmChange>\n<modify>\n<node id=\"7\" lat=\"1\"/>\n</modify></osmChange>", "n7", 3),
            ("<osmChange>\n<create>\n<way id=\"8\">\n<nd ref=\"x\"/>\n</way></create></osmChange>", "w8", 4),
            ("<osmChange>\n<create>\n<node id=\"1\" lat=\"95\" lon=\"0\"/></create></osmChange>", "n1", 3),
            ("<osmChange>\n<create>\n<way id=\"3\">\n<nd ref=\"1\"/>", "document", 4),
        ];
        for (i, (text, element, line)) in cases.iter().enumerate() {
            let p = write(d.path(), &format!("bad{i}.osc"), text);
            match read_changes(&p) {
                Err(OsmError::Malformed {
                    element: e,
                    line: l,
                    ..
                }) => {
                    assert_eq!(
                        (e.as_str(), l),
                        (*element, *line as u64),
                        "case {i}: {text}"
                    )
                }
                other => panic!("case {i}: {other:?}"),
            }
        }
    }

    #[test]
    fn reads_gzip() {
        use std::io::Write;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.osc.gz");
        let mut gz = flate2::write::GzEncoder::new(
            std::fs::File::create(&p).unwrap(),
            flate2::Compression::default(),
        );
        gz.write_all(b"<osmChange><delete><way id=\"4\"/></delete></osmChange>")
            .unwrap();
        gz.finish().unwrap();
        assert_eq!(read_changes(&p).unwrap()[0].element.key(), "w4");
    }
}
