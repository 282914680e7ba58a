#!/usr/bin/env bash
# What building highwater's `highwater` binary (default features) needs
# beyond a Rust toolchain, installed when missing (Debian/Ubuntu): OpenSSL's
# headers and pkg-config, for the S3 checkpoint store's TLS (reqwest over
# native-tls; feature `s3`); RocksDB's library and libclang, for the RocksDB
# state backend (feature `rocksdb`: the rocksdb crate links the system's
# RocksDB, .cargo/config.toml, and generates its bindings with libclang). A
# library build without default features needs nothing: no C or C++
# library. Sourced by demo.sh and test.sh.

if ! pkg-config --exists openssl 2>/dev/null; then
    printf '\n== %s\n' "installing libssl-dev and pkg-config (TLS for S3 checkpoint stores)" >&2
    export DEBIAN_FRONTEND=noninteractive
    SUDO=
    if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends libssl-dev pkg-config
fi

if [ ! -e /usr/lib/x86_64-linux-gnu/librocksdb.so ] || ! compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null; then
    printf '\n== %s\n' "installing librocksdb-dev and libclang-dev (the RocksDB state backend)" >&2
    export DEBIAN_FRONTEND=noninteractive
    SUDO=
    if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends librocksdb-dev libclang-dev
fi
