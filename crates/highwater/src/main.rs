//! The `highwater` binary: everything lives in `highwater-cli`; this file only
//! hands over the exit code.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    highwater_cli::exit(highwater_cli::main());
}
