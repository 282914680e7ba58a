#!/usr/bin/env bash
# What building highwater's `highwater` binary (default features) needs
# beyond a Rust toolchain, installed when missing (Debian/Ubuntu): OpenSSL's
# headers and pkg-config, for the S3 checkpoint store's TLS (reqwest over
# native-tls; feature `s3`). A library build without default features needs
# nothing: no C or C++ library. Sourced by demo.sh and test.sh.

if ! pkg-config --exists openssl 2>/dev/null; then
    printf '\n== %s\n' "installing libssl-dev and pkg-config (TLS for S3 checkpoint stores)" >&2
    export DEBIAN_FRONTEND=noninteractive
    SUDO=
    if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends libssl-dev pkg-config
fi
