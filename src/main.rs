//! The `highwater` command: Nexmark queries, the demo, and tools.

/// Operators allocate and free many small records (strings of events, output
/// containers); mimalloc's thread-local free lists make that markedly cheaper
/// than glibc's allocator (see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(highwater::cli::main());
}
