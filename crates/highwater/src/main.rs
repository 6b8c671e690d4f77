//! The `highwater` binary: everything lives in `highwater-cli`; this file only
//! hands over the exit code.

fn main() {
    std::process::exit(highwater_cli::main());
}
