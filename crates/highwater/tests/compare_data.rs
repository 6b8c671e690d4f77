//! Issue 49: container files compared as data. A GeoPackage `VACUUM`ed or
//! re-exported by ogr2ogr with the same features, a Parquet file rewritten
//! by pyarrow with another compression and row-group size, a re-gzipped
//! file and a re-saved zip have new bytes and the same data: with
//! `compare = "data"` nothing re-runs, and the plan says `layout`. A changed
//! attribute, geometry, SRS or value re-runs the item.

mod common;
use common::*;
use std::process::Command;

/// One stage copying `data/*` to `out/`, compared as `compare`.
fn config(compare: &str) -> String {
    format!(
        r#"
[stages.copy]
inputs = ["data/*"]
output = "out/{{name}}"
command = ["cp", "{{input}}", "{{output}}"]
observe = false
compare = {compare}
"#
    )
}

fn python() -> String {
    std::env::var("HIGHWATER_TEST_PYTHON").expect(
        "HIGHWATER_TEST_PYTHON is not set: run the tests with `bash scripts/test.sh`, which installs pyarrow in its venv",
    )
}

fn sh(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("{program} cannot be started ({e}); scripts/deps.sh installs it")
        });
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn py(code: &str, args: &[&str]) {
    let mut a = vec!["-c", code];
    a.extend_from_slice(args);
    sh(&python(), &a);
}

/// What a run did: (processed, layout inputs, reasons).
fn ran(p: &Project) -> (u64, Vec<String>, serde_json::Value) {
    let r = p.run_json(&[], 0);
    let s = stage(&r, "copy");
    let layout = s["layout"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
        .unwrap_or_default();
    (
        s["processed"].as_u64().unwrap(),
        layout,
        s["reasons"].clone(),
    )
}

fn bytes(p: &Project, rel: &str) -> Vec<u8> {
    std::fs::read(p.path(rel)).unwrap()
}

/// GeoJSON of `n` roads; `tweak` edits one feature's properties or
/// geometry.
fn roads(n: usize, name_of_7: &str, x_of_7: f64) -> String {
    let fs: Vec<String> = (0..n)
        .map(|i| {
            let (name, x) = if i == 7 {
                (name_of_7.to_string(), x_of_7)
            } else {
                (format!("road {i}"), i as f64 * 0.01)
            };
            format!(
                r#"{{"type":"Feature","properties":{{"name":"{name}","lanes":{}}},"geometry":{{"type":"LineString","coordinates":[[{x},50.0],[{},50.1]]}}}}"#,
                i % 4 + 1,
                x + 0.05
            )
        })
        .collect();
    format!(
        r#"{{"type":"FeatureCollection","features":[{}]}}"#,
        fs.join(",")
    )
}

fn export_gpkg(p: &Project, geojson: &str, extra: &[&str]) {
    p.write("src/roads.geojson", geojson);
    let _ = std::fs::remove_file(p.path("data/roads.gpkg"));
    let mut args = vec![
        "-f",
        "GPKG",
        p.path("data/roads.gpkg")
            .to_str()
            .unwrap()
            .to_string()
            .leak() as &str,
        p.path("src/roads.geojson")
            .to_str()
            .unwrap()
            .to_string()
            .leak() as &str,
        "-nln",
        "roads",
    ];
    args.extend_from_slice(extra);
    sh("ogr2ogr", &args);
}

#[test]
fn a_geopackage_vacuumed_or_reexported_by_ogr2ogr_re_runs_nothing_and_a_changed_feature_does() {
    let p = Project::new(&config("\"data\""));
    std::fs::create_dir_all(p.path("data")).unwrap();
    let same = roads(300, "road 7", 0.07);
    export_gpkg(&p, &same, &[]);
    assert_eq!(ran(&p).0, 1);

    // VACUUM: new page layout, same rows. Delete and re-insert first so
    // that the rows also move on disk. By GDAL, not by a bare SQLite
    // connection: the spatial index's triggers call GDAL's SQL functions
    // (`ST_IsEmpty`), which only GDAL registers.
    let before = bytes(&p, "data/roads.gpkg");
    let gpkg = p.path("data/roads.gpkg").to_str().unwrap().to_string();
    let keep = p.path("src/keep.gpkg").to_str().unwrap().to_string();
    std::fs::copy(&gpkg, &keep).unwrap();
    sh(
        "ogrinfo",
        &[&gpkg, "-q", "-sql", "DELETE FROM roads WHERE fid % 3 = 0"],
    );
    sh(
        "ogr2ogr",
        &[
            "-append",
            "-preserve_fid",
            "-where",
            "fid % 3 = 0",
            &gpkg,
            &keep,
            "roads",
            "-nln",
            "roads",
        ],
    );
    sh("ogrinfo", &[&gpkg, "-q", "-sql", "VACUUM"]);
    assert_ne!(bytes(&p, "data/roads.gpkg"), before, "VACUUM changed bytes");
    let plan = p.check(&["plan"], 0).stdout;
    assert!(plan.contains("layout data/roads.gpkg: 1"), "{plan}");
    let json = p.check(&["plan", "--json"], 0).json();
    let st = &json["stages"][0];
    assert_eq!(st["changed"].as_array().unwrap().len(), 0, "{json}");
    assert_eq!(st["layout"][0]["input"], "data/roads.gpkg", "{json}");
    assert_eq!(st["layout"][0]["reason"], "layout", "{json}");
    let (processed, layout, _) = ran(&p);
    assert_eq!(
        (processed, layout),
        (0, vec!["data/roads.gpkg".to_string()])
    );
    // The new byte hash was recorded: the next plan has nothing to say.
    let (processed, layout, _) = ran(&p);
    assert_eq!((processed, layout.len()), (0, 0));

    // ogr2ogr again with the same features: new timestamps inside.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let before = bytes(&p, "data/roads.gpkg");
    export_gpkg(&p, &same, &[]);
    assert_ne!(
        bytes(&p, "data/roads.gpkg"),
        before,
        "a re-export has new bytes"
    );
    let (processed, layout, _) = ran(&p);
    assert_eq!(
        (processed, layout),
        (0, vec!["data/roads.gpkg".to_string()])
    );

    // A changed attribute, a changed geometry, a changed SRS: each re-runs.
    for (what, geojson, extra) in [
        ("attribute", roads(300, "road seven", 0.07), vec![]),
        ("geometry", roads(300, "road seven", 0.0701), vec![]),
        (
            "srs",
            roads(300, "road seven", 0.0701),
            vec!["-a_srs", "EPSG:3857"],
        ),
    ] {
        export_gpkg(&p, &geojson, &extra);
        let (processed, layout, reasons) = ran(&p);
        assert_eq!(processed, 1, "{what}: {reasons}");
        assert!(layout.is_empty(), "{what}");
        assert_eq!(reasons["content"], 1, "{what}: {reasons}");
        assert_eq!(bytes(&p, "out/roads.gpkg"), bytes(&p, "data/roads.gpkg"));
    }
}

#[test]
fn compared_by_bytes_the_same_vacuum_re_runs() {
    let p = Project::new(&config("\"bytes\""));
    std::fs::create_dir_all(p.path("data")).unwrap();
    export_gpkg(&p, &roads(50, "road 7", 0.07), &[]);
    assert_eq!(ran(&p).0, 1);
    let c = rusqlite::Connection::open(p.path("data/roads.gpkg")).unwrap();
    c.execute_batch("PRAGMA page_size = 8192; VACUUM;").unwrap();
    drop(c);
    assert_eq!(ran(&p).0, 1, "bytes are the data under compare = bytes");
}

const WRITE_PARQUET: &str = r#"
import sys, pyarrow as pa, pyarrow.parquet as pq
path, compression, group, change, reverse = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
n = 5000
ids = list(range(n))
amount = [i * 0.25 for i in ids]
note = [None if i % 7 == 0 else f"note {i}" for i in ids]
if change == "1":
    amount[4321] = -1.0
t = pa.table({"id": pa.array(ids, pa.int64()), "amount": amount, "note": note,
              "at": pa.array(ids, pa.timestamp("ms", tz="UTC"))})
if reverse == "1":
    t = t.take(pa.array(list(reversed(range(n)))))
pq.write_table(t, path, compression=compression, row_group_size=group,
               use_dictionary=(compression != "zstd"), data_page_version=("2.0" if group < 1000 else "1.0"))
"#;

fn write_parquet(p: &Project, compression: &str, group: usize, change: bool, reverse: bool) {
    py(
        WRITE_PARQUET,
        &[
            p.path("data/t.parquet").to_str().unwrap(),
            compression,
            &group.to_string(),
            if change { "1" } else { "0" },
            if reverse { "1" } else { "0" },
        ],
    );
}

#[test]
fn parquet_rewritten_by_pyarrow_with_other_compression_and_row_groups_re_runs_nothing() {
    let p = Project::new(&config("\"data\""));
    std::fs::create_dir_all(p.path("data")).unwrap();
    write_parquet(&p, "snappy", 5000, false, false);
    assert_eq!(ran(&p).0, 1);
    for (compression, group) in [("zstd", 333), ("none", 1000), ("lz4", 64)] {
        let before = bytes(&p, "data/t.parquet");
        write_parquet(&p, compression, group, false, false);
        assert_ne!(bytes(&p, "data/t.parquet"), before, "{compression}");
        let (processed, layout, _) = ran(&p);
        assert_eq!((processed, layout.len()), (0, 1), "{compression} {group}");
    }
    // One value changed re-runs.
    write_parquet(&p, "snappy", 5000, true, false);
    let (processed, _, reasons) = ran(&p);
    assert_eq!(processed, 1, "{reasons}");
    // Row order counts by default...
    write_parquet(&p, "snappy", 5000, true, true);
    assert_eq!(ran(&p).0, 1, "ordered: reversed rows are other data");
}

#[test]
fn parquet_compared_with_free_order_ignores_row_order_only() {
    let p = Project::new(&config(
        r#"{ "data/*.parquet" = { mode = "data", order = "free" } }"#,
    ));
    std::fs::create_dir_all(p.path("data")).unwrap();
    write_parquet(&p, "snappy", 5000, false, false);
    assert_eq!(ran(&p).0, 1);
    write_parquet(&p, "zstd", 100, false, true);
    let (processed, layout, _) = ran(&p);
    assert_eq!((processed, layout.len()), (0, 1), "free order: same rows");
    write_parquet(&p, "zstd", 100, true, true);
    assert_eq!(ran(&p).0, 1, "a changed value still counts");
}

const GZIP_AND_ZIP: &str = r#"
import sys, gzip, zipfile
folder, mtime, level, text, order = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
with open(folder + "/a.txt.gz", "wb") as raw:
    with gzip.GzipFile(filename="a.txt", mode="wb", fileobj=raw, mtime=mtime, compresslevel=level) as g:
        g.write(text.encode() * 1000)
members = [("sheet1.xml", text * 50), ("styles.xml", "bold"), ("dir/", None)]
if order == "1":
    members.reverse()
method = zipfile.ZIP_DEFLATED if level > 1 else zipfile.ZIP_STORED
with zipfile.ZipFile(folder + "/book.zip", "w") as z:
    for name, body in members:
        info = zipfile.ZipInfo(name, date_time=(1980 + mtime % 40, 1, 1, 0, 0, mtime % 60))
        info.compress_type = method
        if body is None:
            info.external_attr = 0o40755 << 16
            z.writestr(info, b"")
        else:
            z.writestr(info, body)
"#;

fn write_gzip_and_zip(p: &Project, mtime: u32, level: u32, text: &str, reverse: bool) {
    py(
        GZIP_AND_ZIP,
        &[
            p.path("data").to_str().unwrap(),
            &mtime.to_string(),
            &level.to_string(),
            text,
            if reverse { "1" } else { "0" },
        ],
    );
}

#[test]
fn a_regzipped_file_and_a_resaved_zip_re_run_nothing_and_a_changed_member_does() {
    let p = Project::new(&config("\"data\""));
    std::fs::create_dir_all(p.path("data")).unwrap();
    write_gzip_and_zip(&p, 1, 9, "alpha", false);
    assert_eq!(ran(&p).0, 2);
    let before = (bytes(&p, "data/a.txt.gz"), bytes(&p, "data/book.zip"));
    // New header mtime and level; new timestamps, member order and method.
    write_gzip_and_zip(&p, 7, 1, "alpha", true);
    assert_ne!(bytes(&p, "data/a.txt.gz"), before.0);
    assert_ne!(bytes(&p, "data/book.zip"), before.1);
    let (processed, mut layout, _) = ran(&p);
    layout.sort();
    assert_eq!(processed, 0);
    assert_eq!(layout, ["data/a.txt.gz", "data/book.zip"]);
    write_gzip_and_zip(&p, 7, 1, "omega", true);
    let (processed, _, reasons) = ran(&p);
    assert_eq!(processed, 2, "{reasons}");
}

#[test]
fn a_file_of_no_known_format_is_compared_by_bytes_and_a_bad_container_says_so() {
    let p = Project::new(&config("\"data\""));
    p.write("data/plain.csv", "a,b\n1,2\n");
    p.write("data/broken.parquet", "PAR1 but nothing more");
    assert_eq!(ran(&p).0, 2);
    p.write("data/plain.csv", "a,b\n1,3\n");
    p.write("data/broken.parquet", "PAR1 but nothing else");
    let plan = p.check(&["plan"], 0).stdout;
    assert!(
        plan.contains("data/broken.parquet: compared by its bytes: cannot read it as data"),
        "{plan}"
    );
    assert_eq!(ran(&p).0, 2);
}

#[test]
fn compare_data_with_a_signal_that_reads_no_bytes_is_refused() {
    let p = Project::new(
        &config("\"data\"").replace("observe = false", "observe = false\nsignal = \"mtime\""),
    );
    p.write("data/a.txt", "a");
    let r = p.check(&["plan"], 2);
    assert!(r.stderr.contains("compare"), "{}", r.stderr);
    assert!(r.stderr.contains("signal = \"hash\""), "{}", r.stderr);
    let p = Project::new(&config("\"dataa\""));
    let r = p.check(&["plan"], 2);
    assert!(r.stderr.contains("compare"), "{}", r.stderr);
}

/// Switching `compare` either way re-runs nothing by itself, and a change
/// after the switch is still seen (the byte hash on record and the first
/// half of a data digest are compared; neither vouches for new bytes).
#[test]
fn switching_compare_re_runs_nothing_and_misses_no_change() {
    let p = Project::new(&config("\"bytes\""));
    std::fs::create_dir_all(p.path("data")).unwrap();
    write_gzip_and_zip(&p, 1, 9, "alpha", false);
    assert_eq!(ran(&p).0, 2);
    p.write("highwater.toml", &config("\"data\""));
    assert_eq!(ran(&p).0, 0, "bytes -> data");
    write_gzip_and_zip(&p, 1, 9, "gamma", false);
    assert_eq!(ran(&p).0, 2, "a change right after the switch");
    write_gzip_and_zip(&p, 5, 1, "gamma", true);
    assert_eq!(ran(&p).0, 0, "layout only, now judged as data");
    p.write("highwater.toml", &config("\"bytes\""));
    assert_eq!(ran(&p).0, 0, "data -> bytes");
    write_gzip_and_zip(&p, 6, 9, "gamma", false);
    assert_eq!(ran(&p).0, 2, "by bytes again: new bytes re-run");
    assert_eq!(ran(&p).0, 0, "and the new byte hash was recorded");
}
