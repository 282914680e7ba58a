//! The `highwater` command: Nexmark queries, the demo, and tools.

fn main() {
    std::process::exit(highwater::cli::main());
}
