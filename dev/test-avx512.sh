#!/usr/bin/env bash
# The AVX-512 VNNI kernels (`Isa::Avx512`), run where they can run: on an emulated AVX-512 CPU.
# This machine has no AVX-512 and qemu's x86 emulation stops at AVX2, so dev/avx512-bochs.sh
# boots a small Linux in Bochs (CPU model tigerlake: AVX-512 F/BW/DQ/VL + VNNI) around each test
# binary. The binaries are the host's own tessera-cpu test binaries (the debug/test profile that
# `cargo test` builds; the harness copies their shared libraries into the guest), run with
# TESSERA_EXPECT_AVX512=1, so a run that did not choose the VNNI kernels fails
# (`vnni_kernels_run_where_expected`). Emulation is about 100 times slower than the host, so the
# runs are the tests that reach the VNNI kernels: ggml's fixtures through every kernel entry
# point, the VNNI kernels against the AVX2 and scalar ones bit for bit, and the tiled mat-mat.
# About five minutes on a 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(uname -m)" = x86_64 ] || { echo "test-avx512: x86_64 only" >&2; exit 2; }

tests=(--lib --test qdot --test qdot_fp --test qdot_tiles --test qgemm_0 --test qgemm_k --test qgemv_repack)
# (the build's messages are printed once it is done: `tee /dev/stderr` would reopen, and so
# truncate, a log file that stderr is redirected to)
build=$(cargo test -p tessera-cpu --no-run "${tests[@]}" 2>&1) || { echo "$build" >&2; exit 1; }
echo "$build" >&2
echo "$build" | sed -n 's/^ *Executable .* (\(.*\))$/\1/p' > "${TMPDIR:-/tmp}/tessera-avx512-bins.txt"
bin() {
  local b
  b=$(grep -E "/$1-[0-9a-f]+$" "${TMPDIR:-/tmp}/tessera-avx512-bins.txt" | head -1)
  [ -n "$b" ] || { echo "test-avx512: no test binary named $1" >&2; exit 2; }
  echo "$b"
}

export TESSERA_EXPECT_AVX512=1
# Bochs reports GFNI but returns the complement of every vgf2p8affineqb result (a probe: 0xf5
# where Intel's definition and the Zen 4 give 0x0a), so q5_K's GFNI kernel runs natively only
# (`qgemv_0::gfni`); here the kernel without it.
export TESSERA_NO_GFNI=1
run() {
  echo "test-avx512: $*" >&2
  dev/avx512-bochs.sh "$@" --test-threads=1
}
run "$(bin tessera_cpu)" qdot:: matmul_quant:: qgemm
run "$(bin qdot)"
run "$(bin qdot_tiles)"
run "$(bin qdot_fp)" four_row_kernel_of_mxfp4
run "$(bin qgemm_0)" every_element q8_0_extreme_codes strided_columns iq4_nl_equals_ggml
run "$(bin qgemm_k)" equals_ggml_bit_for_bit
run "$(bin qgemv_repack)" repacked_rows_equal_ggml repacked_q4_k_rows kernels_equal
echo "test-avx512: every AVX-512 VNNI run passed" >&2
