#!/usr/bin/env bash
# The aarch64 NEON kernels on an x86_64 machine: cross-builds tessera-cpu's NEON tests (and the
# quantized mat-vec tests, which then run on NEON) for aarch64-unknown-linux-gnu and runs them
# under qemu-aarch64, first as a CPU with every extension qemu has (-cpu max: SDOT), then as a
# baseline ARMv8.0 core (-cpu cortex-a53: no SDOT). Installs what it needs (Debian's qemu-user and
# aarch64 cross gcc, rustup's aarch64 standard library) and fails if it cannot.
# On an aarch64 machine, plain `cargo test -p tessera-cpu` runs the same tests natively.
set -euo pipefail
cd "$(dirname "$0")/.."

target=aarch64-unknown-linux-gnu
if [ "$(uname -m)" = aarch64 ]; then
  exec cargo test -p tessera-cpu --lib --test neon --test qdot --test matmul_quant --test qgemv_repack
fi

need=()
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
if [ ${#need[@]} -gt 0 ]; then
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  echo "installing ${need[*]} (for the aarch64 tests)" >&2
  if ! "${sudo[@]}" apt-get install -y --no-install-recommends "${need[@]}" >/dev/null; then
    "${sudo[@]}" apt-get update >/dev/null
    "${sudo[@]}" apt-get install -y --no-install-recommends "${need[@]}" >/dev/null
  fi
fi
if ! rustup target list --installed | grep -qx "$target"; then
  rustup target add "$target"
fi

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
sysroot=/usr/aarch64-linux-gnu
# -cpu max has SDOT (the dot-product extension), cortex-a53 has not: both kernel variants run
for cpu in max:1 cortex-a53:0; do
  echo "== aarch64 tests under qemu-aarch64 -cpu ${cpu%:*}" >&2
  TESSERA_EXPECT_DOTPROD=${cpu#*:} \
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -cpu ${cpu%:*} -L $sysroot" \
    cargo test -p tessera-cpu --target "$target" --lib --test neon --test qdot --test matmul_quant --test qgemv_repack
done
