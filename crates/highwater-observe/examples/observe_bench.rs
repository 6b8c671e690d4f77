//! Runs one command N times, observed or not, and prints the wall time
//! (issue 24's overhead figure). Used by bench/observe_overhead.sh.
//!
//!     observe_bench (observed|plain) N DIR PROGRAM [ARGS...]
//!
//! `{i}` in an argument is replaced with the run's number.

use std::process::Command;
use std::time::Instant;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 5 {
        eprintln!("usage: observe_bench (observed|plain) N DIR PROGRAM [ARGS...]");
        std::process::exit(2);
    }
    let observed = a[1] == "observed";
    let n: usize = a[2].parse().expect("N");
    let dir = &a[3];
    let t = Instant::now();
    let mut stops = 0u64;
    for i in 0..n {
        let mut cmd = Command::new(&a[4]);
        for arg in &a[5..] {
            cmd.arg(arg.replace("{i}", &i.to_string()));
        }
        cmd.current_dir(dir);
        let ok = if observed {
            let (out, obs) = highwater_observe::output(&mut cmd).expect("observe");
            stops += obs.stops;
            out.status.success()
        } else {
            // As an `observe = false` stage runs it: the same spawner.
            highwater_observe::output_unobserved(&mut cmd)
                .expect("run")
                .status
                .success()
        };
        assert!(ok, "run {i} failed");
    }
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    println!(
        "{} runs={n} total_ms={ms:.0} per_run_ms={:.3} stops_per_run={}",
        a[1],
        ms / n as f64,
        stops / n.max(1) as u64
    );
}
