#!/usr/bin/env bash
# What building highwater needs beyond a Rust toolchain, installed when
# missing (Debian/Ubuntu): RocksDB for checkpoint shards, linked from
# Debian's librocksdb-dev (see rocksdb in Cargo.toml), and libclang, which
# the RocksDB bindings are generated with. Sourced by demo.sh and test.sh.

if [ ! -e /usr/include/rocksdb/c.h ] || ! compgen -G '/usr/lib/llvm-*/lib/libclang*.so*' >/dev/null; then
    printf '\n== %s\n' "installing librocksdb-dev and libclang-dev (RocksDB for checkpoints)" >&2
    export DEBIAN_FRONTEND=noninteractive
    SUDO=
    if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends librocksdb-dev libclang-dev
fi
