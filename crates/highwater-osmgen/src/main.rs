//! `highwater-osmgen`: writes planet-like synthetic OSM data (issue 25).
//!
//! ```text
//! highwater-osmgen extract --nodes N [--seed S] [-o FILE.osm]
//! highwater-osmgen diff --nodes N --changes C [--seed S] [--diff-seed D] [-o FILE.osc]
//! ```
//! Without `-o` it writes to stdout, e.g. into
//! `osmium cat -F osm - -o world.osm.pbf`. A diff's `--nodes` names the
//! world whose cities it changes: applied to a larger world of the same
//! seed, it changes the same elements (the shared region).

use std::io::{BufWriter, Write};
use std::process::ExitCode;

const USAGE: &str = "usage: highwater-osmgen extract --nodes N [--seed S] [-o FILE]
       highwater-osmgen diff --nodes N --changes C [--seed S] [--diff-seed D] [-o FILE]";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, msg)) => {
            eprintln!("highwater-osmgen: {msg}");
            ExitCode::from(code)
        }
    }
}

fn run(args: Vec<String>) -> Result<(), (u8, String)> {
    let refuse = |m: String| (2u8, format!("{m}\n{USAGE}"));
    let mut it = args.into_iter();
    let cmd = it.next().ok_or_else(|| refuse("give a command".into()))?;
    let (mut nodes, mut changes, mut seed, mut diff_seed, mut out) =
        (None, None, 1u64, 1u64, None::<String>);
    while let Some(a) = it.next() {
        let mut val = |name: &str| {
            it.next()
                .ok_or_else(|| refuse(format!("{name} needs a value")))
        };
        let num = |name: &str, v: String| {
            v.replace('_', "")
                .parse::<u64>()
                .map_err(|_| refuse(format!("{name} {v:?}: give a whole number")))
        };
        match a.as_str() {
            "--nodes" => nodes = Some(num("--nodes", val("--nodes")?)?),
            "--changes" => changes = Some(num("--changes", val("--changes")?)?),
            "--seed" => seed = num("--seed", val("--seed")?)?,
            "--diff-seed" => diff_seed = num("--diff-seed", val("--diff-seed")?)?,
            "-o" | "--output" => out = Some(val("-o")?),
            other => return Err(refuse(format!("unknown argument {other:?}"))),
        }
    }
    let nodes = nodes.ok_or_else(|| refuse("give --nodes".into()))?;
    let world = highwater_osmgen::World::with_nodes(seed, nodes).map_err(refuse)?;
    let sink: Box<dyn Write> = match &out {
        Some(p) => {
            Box::new(std::fs::File::create(p).map_err(|e| (2, format!("{p}: cannot create: {e}")))?)
        }
        None => Box::new(std::io::stdout().lock()),
    };
    let mut w = BufWriter::with_capacity(1 << 20, sink);
    let name = out.as_deref().unwrap_or("stdout");
    let io = |e: std::io::Error| (1u8, format!("{name}: {e}"));
    match cmd.as_str() {
        "extract" => {
            world.write_extract(&mut w).map_err(io)?;
            eprintln!(
                "{name}: {} cities, {} nodes, {} ways, {} relations (seed {seed})",
                world.cities,
                world.nodes(),
                world.ways(),
                world.cities
            );
        }
        "diff" => {
            let c = changes.ok_or_else(|| refuse("give --changes".into()))?;
            let d = world.diff(c as usize, diff_seed);
            d.write(&mut w).map_err(io)?;
            eprintln!(
                "{name}: {} changes to {} cities ({} node creates, {} node modifies, {} node deletes, {} way modifies)",
                d.len(),
                world.cities,
                d.create_nodes.len(),
                d.modify_nodes.len(),
                d.delete_nodes.len(),
                d.modify_ways.len()
            );
        }
        other => return Err(refuse(format!("unknown command {other:?}"))),
    }
    w.flush().map_err(io)
}
