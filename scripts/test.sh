#!/usr/bin/env bash
# The test command of highwater: sets up what the tests need on a fresh
# machine, then runs formatting and lint checks, every test (unit,
# integration, property, golden, doc) in one profile (release).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*" >&2; }

# Toolchain components (present on most installs; added when missing).
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    log "adding rustfmt and clippy"
    rustup component add rustfmt clippy
fi

# Installs Debian packages whose services must not start (the tests start
# their own servers): a policy-rc.d that forbids it, for the install only.
apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    local policy_added=
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        policy_added=1
    fi
    apt-get update -q
    apt-get install -y -q --no-install-recommends "$@"
    if [ -n "$policy_added" ]; then rm -f /usr/sbin/policy-rc.d; fi
}

# PostgreSQL server binaries for the CDC tests, which start throwaway clusters
# of their own (no system service is started here).
if ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
    log "installing PostgreSQL (for the CDC tests)"
    apt_install postgresql
fi

# An MQTT broker for the MQTT tests: Debian's mosquitto (the tests start it
# on free loopback ports with their own config, tests/common/mqtt.rs).
if [ ! -x /usr/sbin/mosquitto ]; then
    log "installing mosquitto (the broker of the MQTT tests)"
    apt_install mosquitto
fi

# A real browser for the status page test (tests/status_page.rs): Debian's
# chromium, run headless.
if ! command -v chromium >/dev/null 2>&1; then
    log "installing chromium (the status page test renders the page headless)"
    apt_install chromium
fi

# OpenSSL headers for the build (S3 checkpoint store).
source scripts/setup.sh

# An S3-compatible server for the checkpoint store tests: moto's, from PyPI
# (the test starts it on a free loopback port).
if ! command -v moto_server >/dev/null 2>&1; then
    log "installing moto_server (for the S3 checkpoint store test)"
    python3 -m pip install --quiet 'moto[server]'
    hash -r
fi

# A Kafka-protocol broker with transactions for the Kafka tests: noida-db
# from PyPI, pinned (a young project: a new release is taken knowingly). The
# tests start its binary on free loopback ports (tests/common/kafka.rs).
if ! python3 -c 'import noida_db' >/dev/null 2>&1 || [ "$(python3 -m pip show noida-db 2>/dev/null | sed -n 's/^Version: //p')" != 0.2.3 ]; then
    log "installing noida-db 0.2.3 (the Kafka broker of the Kafka tests)"
    python3 -m pip install --quiet 'noida-db==0.2.3'
fi

log "cargo fmt --check"
cargo fmt --all -- --check

# The crash tests use kill points, which only the `fault-injection` feature
# compiles in (see src/checkpoint/kill.rs).
features=(--features highwater/fault-injection)

log "cargo clippy"
cargo clippy --workspace --all-targets --release "${features[@]}" -- -D warnings

log "cargo test (unit, integration, property, golden, doc)"
# Benchmarks are built (by clippy above) but not run: they take minutes.
cargo test --workspace --release "${features[@]}" --lib --bins --tests --examples
cargo test --workspace --release "${features[@]}" --doc

log "cargo doc (every public item documented, no warnings)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps

log "cargo test (operators, debug: timely's capability checks are debug assertions)"
cargo test -p highwater-operators --features rocksdb --tests

# The same operators, their oracles and their checkpoint tests, with every
# keyed state on the encoded backend (values kept as bytes behind a write-back
# cache per activation: an on-disk store's access pattern); and the
# highwater crate's oracle tests likewise. Neither rebuilds anything. (The
# crash tests, whose processes would inherit the variable, pass on it too,
# but take four minutes; the operators' checkpoint tests cover recovery.)
log "cargo test on the encoded state backend (operators debug; oracles release)"
HIGHWATER_STATE_BACKEND=encoded cargo test -p highwater-operators --features rocksdb --tests
HIGHWATER_STATE_BACKEND=encoded cargo test --workspace --release "${features[@]}" \
    --test nexmark_oracle --test window_oracle --test join_oracle --test cep_oracle

# And on RocksDB (a database per operator and worker under
# HIGHWATER_STATE_DIR, removed as each operator ends; release: the oracles'
# inputs are large).
log "cargo test on the RocksDB state backend (operators and oracles, release)"
rocks_dir=$(mktemp -d)
export HIGHWATER_STATE_DIR="$rocks_dir" HIGHWATER_STATE_CACHE=64MiB
# The operators' test binaries are the workspace build's above (its feature
# set includes `rocksdb`): `cargo test -p highwater-operators` would unify
# features differently and rebuild everything in release (~6 min).
operator_tests=$(cargo test --workspace --release "${features[@]}" --tests --no-run --message-format=json |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "/operators#" in m["package_id"]:
        print(m["executable"])
')
if [ -z "$operator_tests" ]; then
    echo "error: no test binary of highwater-operators was found" >&2
    exit 1
fi
for test_binary in $operator_tests; do
    (cd operators && HIGHWATER_STATE_BACKEND=rocksdb "$test_binary")
done
HIGHWATER_STATE_BACKEND=rocksdb cargo test --workspace --release "${features[@]}" \
    --test nexmark_oracle --test window_oracle --test join_oracle --test cep_oracle
unset HIGHWATER_STATE_DIR HIGHWATER_STATE_CACHE
if [ -n "$(ls -A "$rocks_dir")" ]; then
    echo "error: the RocksDB state directory was not cleaned up: $(ls "$rocks_dir")" >&2
    exit 1
fi
rm -rf "$rocks_dir"

# The lean build: a user's crate (tests/user-crate) on highwater with default
# features off compiles no C or C++ library, no TLS, no async runtime and no
# CLI crate, and its program (windows, CEP, checkpoints, exactly-once output)
# checks its own results; each connector feature builds on its own.
log "a user's crate with default features off (tests/user-crate); each feature alone"
user_tree=$(cargo tree --manifest-path tests/user-crate/Cargo.toml --locked -e normal,build --prefix none)
forbidden='^(rocksdb|librocksdb-sys|rdkafka|rdkafka-sys|rumqttc|openssl|openssl-sys|native-tls|ring|aws-lc-sys|cc|cmake|bindgen|tokio|reqwest|object_store|postgres|clap|tracing-subscriber|mimalloc|libmimalloc-sys) '
if grep -E "$forbidden" <<<"$user_tree"; then
    echo "error: the crates above reach a user's build with default features off" >&2
    exit 1
fi
user_dir=$(mktemp -d)
cargo run --manifest-path tests/user-crate/Cargo.toml --locked --target-dir "${CARGO_TARGET_DIR:-$PWD/target}" \
    -- "$user_dir" -w 2
rm -rf "$user_dir"
# In the release profile, so that the C build of librdkafka (kafka) is the
# one the tests made, not a second one.
for feature in postgres s3 kafka mqtt rocksdb; do
    cargo check --release --lib --no-default-features --features "$feature"
done

# The notebooks, executed headless in the evcxr kernel (installs Jupyter
# and evcxr_jupyter when missing); any cell error fails the run.
log "notebooks (evcxr)"
bash scripts/notebooks.sh

log "all checks passed"
