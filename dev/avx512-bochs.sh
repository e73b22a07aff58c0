#!/usr/bin/env bash
# Runs one x86_64 Linux program on an emulated AVX-512 CPU (AVX512 F/CD/BW/DQ/VL/IFMA/VBMI/VBMI2/
# VNNI/BITALG/VPOPCNTDQ, no BF16/FP16/AVX-VNNI), for machines without AVX-512 (qemu's TCG stops
# at AVX2). It boots Debian's cloud kernel with a busybox initramfs holding the program inside
# Bochs (default CPU model: tigerlake), runs the program with its output on the serial console,
# and exits with the program's exit code.
#
#   dev/avx512-bochs.sh BINARY [ARGS...]
#
# BINARY may be static (RUSTFLAGS="-C target-feature=+crt-static") or dynamic: the shared
# libraries `ldd` finds for it are copied into the guest. It also works as a cargo runner, one
# boot per test binary:
#   CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER=$PWD/dev/avx512-bochs.sh cargo test ...
# Cost (2-core Zen3 host): about 15-18 s to boot, plus about 1 s per 8 MiB of program and files;
# then about 40-50 million simple instructions per second, 30-80 ns per 256/512-bit integer
# instruction and 100-160 ns per 256/512-bit float one (bochs computes floats in software): about
# 100 times slower than the host for scalar code, more for SIMD. One bochs uses one host core.
# Console output goes through an emulated 115200-baud UART: about 40 KB/s.
#
# Environment:
#   TESSERA_BOCHS_TIMEOUT  wall-clock seconds before bochs is killed (default 1200)
#   TESSERA_BOCHS_CPU      bochs CPU model (default tigerlake; corei7_icelake_u also has VNNI,
#                          corei3_cnl and corei7_skylake_x have less AVX-512)
#   TESSERA_BOCHS_MEGS     guest RAM in MiB (default 1024); the program and its libraries are
#                          unpacked into RAM, so they must fit in about half of it
#   TESSERA_BOCHS_FILES    ':'-separated host files/directories copied into the guest at the same
#                          absolute path (test fixtures); the guest starts in a directory named
#                          like the host's current directory
#   TESSERA_BOCHS_VERBOSE  1: show the kernel's boot log (on stderr)
#   TESSERA_BOCHS_KEEP     1: keep the work directory (it is always kept when the run fails)
#   TESSERA_BOCHS_TIMESTAMPS  1: prefix each output line with the wall-clock seconds since the
#                          program started (the guest's own clock only roughly follows the wall
#                          clock: it counts emulated instructions, 50 million to the second)
#   RUST_* and TESSERA_* variables (other than TESSERA_CACHE/TESSERA_BOCHS_*) are passed to BINARY.
#
# Installs what it needs: Debian's bochs, bochsbios, vgabios, bochs-term (only to satisfy bochs'
# GUI dependency without pulling in X), genisoimage and cpio via apt-get; the kernel
# (linux-image-*-cloud-amd64), busybox-static, isolinux and syslinux-common are only downloaded
# (apt-get download) and unpacked into ${TESSERA_CACHE:-~/.cache/tessera}/bochs, never installed.
set -euo pipefail

die() { echo "avx512-bochs: error: $*" >&2; exit 2; }
say() { echo "avx512-bochs: $*" >&2; }

[ $# -ge 1 ] || die "usage: $0 BINARY [ARGS...]"
bin=$1; shift
[ -f "$bin" ] && [ -x "$bin" ] || die "$bin is not an executable file"
[ "$(uname -m)" = x86_64 ] || die "this harness needs an x86_64 host"

timeout_s=${TESSERA_BOCHS_TIMEOUT:-1200}
cpu_model=${TESSERA_BOCHS_CPU:-tigerlake}
megs=${TESSERA_BOCHS_MEGS:-1024}
verbose=${TESSERA_BOCHS_VERBOSE:-0}
stamps=${TESSERA_BOCHS_TIMESTAMPS:-0}
cache=${TESSERA_CACHE:-$HOME/.cache/tessera}/bochs
mkdir -p "$cache"

sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)

# --- host tools (installed) -------------------------------------------------------------------
need=()
if ! command -v bochs-bin >/dev/null || [ ! -f /usr/share/bochs/BIOS-bochs-latest ] \
   || [ ! -f /usr/share/vgabios/vgabios.bin ]; then
  need+=(bochs bochs-term bochsbios vgabios)
fi
command -v genisoimage >/dev/null || need+=(genisoimage)
command -v cpio >/dev/null || need+=(cpio)
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]}"
  if ! "${sudo[@]}" apt-get install -y --no-install-recommends "${need[@]}" >/dev/null; then
    "${sudo[@]}" apt-get update >/dev/null || true
    "${sudo[@]}" apt-get install -y --no-install-recommends "${need[@]}" >/dev/null \
      || die "could not install ${need[*]} with apt-get (needs Debian 12 packages and root or sudo)"
  fi
fi

# --- guest pieces (downloaded and unpacked into the cache, not installed) ---------------------
# fetch_deb PACKAGE: downloads PACKAGE's .deb and unpacks it into $unpacked
unpacked=$cache/unpacked.$$
fetch_deb() {
  local dl=$cache/debs.$$
  rm -rf "$dl" "$unpacked" && mkdir -p "$dl" "$unpacked"
  if ! (cd "$dl" && apt-get download "$1" >/dev/null 2>&1); then
    "${sudo[@]}" apt-get update >/dev/null 2>&1 || true
    (cd "$dl" && apt-get download "$1" >/dev/null 2>&1) \
      || { rm -rf "$dl" "$unpacked"; die "could not download $1 with apt-get download"; }
  fi
  dpkg-deb -x "$dl"/*.deb "$unpacked" || { rm -rf "$dl" "$unpacked"; die "could not unpack $1"; }
  rm -rf "$dl"
}
# install_from PACKAGE FILE DEST: DEST (in the cache) is FILE (a glob) from PACKAGE
install_from() {
  [ -f "$cache/$3" ] && return 0
  fetch_deb "$1"
  # shellcheck disable=SC2086 # $2 is a glob
  cp $unpacked/$2 "$cache/$3.tmp" || { rm -rf "$unpacked"; die "$1 has no $2"; }
  mv "$cache/$3.tmp" "$cache/$3"
  rm -rf "$unpacked"
}

if [ ! -f "$cache/vmlinuz" ]; then
  # Debian 12's cloud flavour: fewer drivers to probe than the generic kernel, so it boots faster.
  # The command-line workarounds below were worked out with 6.1.0-48 (6.1.172).
  kpkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}')
  if [ -z "$kpkg" ]; then
    "${sudo[@]}" apt-get update >/dev/null 2>&1 || true
    kpkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}')
  fi
  [ -n "$kpkg" ] || die "cannot find Debian's linux-image-cloud-amd64 kernel package"
  say "downloading kernel $kpkg"
  install_from "$kpkg" 'boot/vmlinuz-*' vmlinuz
  echo "$kpkg" > "$cache/vmlinuz.version"
fi
install_from busybox-static bin/busybox busybox
install_from isolinux usr/lib/ISOLINUX/isolinux.bin isolinux.bin
install_from syslinux-common usr/lib/syslinux/modules/bios/ldlinux.c32 ldlinux.c32

# --- the initramfs ----------------------------------------------------------------------------
work=$(mktemp -d "${TMPDIR:-/tmp}/bochs-work.XXXXXX")
bochs_pid='' tail_pid='' ok=0
# shellcheck disable=SC2329 # run by the EXIT trap
cleanup() {
  [ -n "$tail_pid" ] && kill "$tail_pid" 2>/dev/null || true
  [ -n "$bochs_pid" ] && kill "$bochs_pid" 2>/dev/null || true
  if [ "$ok" = 1 ] && [ "${TESSERA_BOCHS_KEEP:-0}" != 1 ]; then
    rm -rf "$work"
  else
    say "work directory kept: $work (serial.log, bochs.log, bochs.out)"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

root=$work/initramfs
mkdir -p "$root"/{bin,dev,proc,sys,tmp,tessera}
cp "$cache/busybox" "$root/bin/busybox"
for applet in $("$root/bin/busybox" --list); do
  [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
done
name=$(basename "$bin")
cp -L "$bin" "$root/tessera/$name"

# copy_in PATH: copies a host file or directory into the guest at the same absolute path
copy_in() {
  local src
  src=$(readlink -f "$1") || die "cannot resolve $1"
  mkdir -p "$root$(dirname "$1")"
  cp -a -L "$src" "$root$1" 2>/dev/null || cp -r -L "$src" "$root$1" || die "cannot copy $1 into the guest"
}
# a dynamic executable: copy its ELF interpreter and the libraries ldd resolves
if readelf -l "$bin" 2>/dev/null | grep -q 'Requesting program interpreter'; then
  while read -r lib; do
    [ -n "$lib" ] && [ ! -e "$root$lib" ] && copy_in "$lib"
  done < <(ldd "$bin" | awk '/=> \//{print $3} /^[[:space:]]*\/[^ ]*ld-linux/{print $1}')
fi
if [ -n "${TESSERA_BOCHS_FILES:-}" ]; then
  IFS=: read -r -a extra <<< "$TESSERA_BOCHS_FILES"
  for f in "${extra[@]}"; do
    [ -n "$f" ] || continue
    case $f in /*) ;; *) f=$PWD/$f ;; esac
    copy_in "$f"
  done
fi

# /init: shell-quoted arguments, environment and the sentinel lines the host looks for
q() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }
nonce=$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')
start_mark="TESSERA_START_$nonce"
exit_mark="TESSERA_EXIT_$nonce="
cmd="/tessera/$(q "$name")"
for a in "$@"; do cmd+=" $(q "$a")"; done
{
  echo '#!/bin/sh'
  echo 'export PATH=/bin HOME=/tmp TMPDIR=/tmp'
  echo 'mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev'
  while read -r var; do
    case $var in
      TESSERA_CACHE|TESSERA_BOCHS_*) ;;
      RUST_*|TESSERA_*) echo "export $var=$(q "${!var}")" ;;
    esac
  done < <(compgen -e | grep -E '^(RUST|TESSERA)_' || true)
  [ "$verbose" = 1 ] && echo 'grep -m1 "^flags" /proc/cpuinfo; grep MemTotal /proc/meminfo'
  echo "mkdir -p $(q "$PWD") && cd $(q "$PWD")"
  echo "echo $start_mark"
  echo "$cmd </dev/null"
  echo 'rc=$?'
  echo "echo $exit_mark\$rc"
  # stty sets the console's mode with TCSADRAIN, so it returns only once the output is sent
  echo 'stty -F /dev/console onlcr 2>/dev/null; sync; poweroff -f'
} > "$root/init"
chmod +x "$root/init"
# uncompressed: bochs reads the CD image quickly, but decompressing in the guest is slow
(cd "$root" && find . | cpio -o -H newc --quiet) > "$work/initrd.cpio"
initrd_mb=$(( $(stat -c %s "$work/initrd.cpio") / 1048576 ))
[ $(( initrd_mb * 2 + 200 )) -le "$megs" ] \
  || die "the initramfs is ${initrd_mb} MiB: raise TESSERA_BOCHS_MEGS (now $megs) to at least $(( initrd_mb * 2 + 200 ))"

# --- a bootable CD: isolinux, the kernel, the initramfs ---------------------------------------
# Kernel command line, each flag working around the emulated CPU or saving boot time:
#   clearcpuid=pku       bochs 2.7 lists PKRU in XCR0 but reports its XSAVE area as empty, which
#                        makes the kernel switch XSAVE (and so AVX/AVX-512) off
#   clearcpuid=xsaves,xsavec  bochs reports the standard-format size for the compacted XSAVE
#                        format, another reason for the kernel to switch XSAVE off
#   clearcpuid=fsrm      bochs reports fast strings as disabled (the kernel then clears ERMS) but
#                        FSRM as present; memmove then skips its small-size check and runs away
#                        on copies under 32 bytes (the first printk with a log level hangs)
#   cryptomgr.notests    skips the crypto self-tests (RSA/DH bignum arithmetic: 15 s of boot)
#   tsc_early_khz=50000  bochs' TSC counts emulated instructions; calling it 50 MHz, like ips
#                        below, makes guest time roughly wall time instead of 50 times slower
#                        (and udelay()s during boot 50 times shorter)
#   tsc=reliable no_timer_check mitigations=off nokaslr quiet: less work and less output
iso=$work/iso
mkdir -p "$iso/isolinux"
cp "$cache/isolinux.bin" "$cache/ldlinux.c32" "$iso/isolinux/"
ln -s "$cache/vmlinuz" "$iso/vmlinuz" 2>/dev/null || cp "$cache/vmlinuz" "$iso/vmlinuz"
mv "$work/initrd.cpio" "$iso/initrd.cpio"
append="console=ttyS0,115200 clearcpuid=pku,xsaves,xsavec,fsrm tsc=reliable no_timer_check mitigations=off nokaslr cryptomgr.notests tsc_early_khz=50000"
[ "$verbose" = 1 ] || append+=" quiet"
cat > "$iso/isolinux/isolinux.cfg" <<EOF
DEFAULT linux
PROMPT 0
TIMEOUT 0
LABEL linux
  KERNEL /vmlinuz
  INITRD /initrd.cpio
  APPEND $append
EOF
genisoimage -quiet -f -o "$work/boot.iso" -b isolinux/isolinux.bin -c isolinux/boot.cat \
  -no-emul-boot -boot-load-size 4 -boot-info-table -R "$iso" || die "genisoimage failed"
rm -rf "$iso" "$root"

# --- bochs -----------------------------------------------------------------------------------
# Debian's bochs has neither a 'nogui' display nor a build without the debugger: rfb (VNC) with
# timeout=0 does not wait for a viewer, and the debugger gets a 'continue' from an rc file and EOF
# on stdin, so it quits instead of prompting if the emulation stops. clock sync=none runs as fast
# as the host allows; ips only sets the guest's notion of time (see tsc_early_khz above).
# reset_on_triple_fault=0: a triple fault stops bochs instead of rebooting the guest.
cat > "$work/bochsrc" <<EOF
megs: $megs
romimage: file=/usr/share/bochs/BIOS-bochs-latest
vgaromimage: file=/usr/share/vgabios/vgabios.bin
cpu: model=$cpu_model, count=1, ips=50000000, reset_on_triple_fault=0, ignore_bad_msrs=1
display_library: rfb, options="timeout=0"
vga: extension=vbe, update_freq=1
ata0-master: type=cdrom, path=$work/boot.iso, status=inserted
boot: cdrom
com1: enabled=1, mode=file, dev=$work/serial.log
clock: sync=none, time0=local
mouse: enabled=0
speaker: enabled=0
log: $work/bochs.log
panic: action=fatal
error: action=report
info: action=ignore
debug: action=ignore
EOF
echo c > "$work/debugger.rc"
: > "$work/serial.log"

say "booting $cpu_model with $megs MiB, initramfs ${initrd_mb} MiB, timeout ${timeout_s}s"
t0=$EPOCHREALTIME
# The rfb display listens on TCP port 5900 (or the next free one) on all interfaces: where
# allowed, a private network namespace hides it from the network.
netns=()
if unshare --net true 2>/dev/null; then
  netns=(unshare --net)
elif unshare --map-root-user --net true 2>/dev/null; then
  netns=(unshare --map-root-user --net)
fi
timeout --kill-after=10 "$timeout_s" "${netns[@]}" bochs-bin -q -f "$work/bochsrc" -rc "$work/debugger.rc" \
  </dev/null >"$work/bochs.out" 2>&1 &
bochs_pid=$!

# Stream the serial console: lines before the start mark are the kernel's (shown when verbose),
# then the program's output until the exit mark; a kernel panic ends the run early.
rc='' t_start='' t_end=''
exec 3< <(exec tail -n +1 -F --pid="$bochs_pid" "$work/serial.log" 2>/dev/null)
tail_pid=$!
started=0
while IFS= read -r line <&3; do
  line=${line%$'\r'}
  if [ "$started" = 0 ]; then
    if [[ $line == *"$start_mark"* ]]; then
      started=1; t_start=$EPOCHREALTIME
      continue
    fi
    if [ "$verbose" = 1 ]; then
      if [ "$stamps" = 1 ]; then
        printf '[%s] %s\n' "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1fs", b - a }')" "$line" >&2
      else
        printf '%s\n' "$line" >&2
      fi
    fi
  else
    if [[ $line == *"$exit_mark"* ]]; then
      t_end=$EPOCHREALTIME
      before=${line%%"$exit_mark"*}
      [ -n "$before" ] && printf '%s\n' "$before"
      rc=${line##*"$exit_mark"}
      break
    fi
    if [ "$stamps" = 1 ]; then
      printf '[+%s] %s\n' "$(awk -v a="$t_start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1fs", b - a }')" "$line"
    else
      printf '%s\n' "$line"
    fi
  fi
  if [[ $line == *"Kernel panic - not syncing"* ]]; then
    printf '%s\n' "$line" >&2
    say "the guest kernel panicked"
    break
  fi
done
exec 3<&-
kill "$bochs_pid" 2>/dev/null || true
wait "$bochs_pid" 2>/dev/null || true
bochs_pid=

if [ -z "$rc" ] || ! [[ $rc =~ ^[0-9]+$ ]]; then
  fail=1
  if awk -v a="$t0" -v b="$EPOCHREALTIME" -v t="$timeout_s" 'BEGIN { exit !(b - a >= t) }'; then
    say "timed out after ${timeout_s}s (TESSERA_BOCHS_TIMEOUT)"
    fail=124
  fi
  say "no exit code from the guest; last serial output:"
  tail -n 20 "$work/serial.log" | tr -d '\r' >&2
  say "bochs messages:"
  grep -vE 'RDMSR|WRMSR' "$work/bochs.log" 2>/dev/null | tail -n 10 >&2 || true
  grep -E 'PANIC|exiting|>>' "$work/bochs.out" 2>/dev/null | tail -n 5 >&2 || true
  exit "$fail"
fi
ok=1
awk -v a="$t0" -v b="$t_start" -v c="$t_end" \
  'BEGIN { printf "avx512-bochs: exit code %s; boot %.1fs, program %.1fs (wall clock)\n", "'"$rc"'", b - a, c - b }' >&2
exit "$rc"
