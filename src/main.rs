//! The `highwater` command: Nexmark queries, the demo, and tools.

/// Operators allocate and free many small records (strings of events, output
/// containers); mimalloc's thread-local free lists make that markedly cheaper
/// than glibc's allocator (see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How long mimalloc keeps memory freed by the program before it gives it
/// back to the system. Its default (10 ms) is shorter than the life of a
/// source's batch: the pages of each batch's records were given back and
/// taken again (and zeroed again, 2 MiB at a time with transparent huge
/// pages) a few hundred times a second, 4 % of the time of a
/// `--source-only` run. Memory a job stops using still goes back, a second
/// later.
const PURGE_DELAY_MS: std::ffi::c_long = 1000;

/// `mi_option_purge_delay` in `mimalloc.h` (v2 and v3), which
/// `libmimalloc-sys` does not name.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

fn main() {
    // SAFETY: sets one of mimalloc's options, which it reads whenever it
    // purges; no allocation depends on its value.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    std::process::exit(highwater::cli::main());
}
