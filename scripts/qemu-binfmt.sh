#!/usr/bin/env bash
# Lets this x64 Linux machine exec arm64 binaries through qemu-user-static, and undoes exactly
# that afterwards (as root; `npm run test:arm64` and .ci/run's arm64 leg use it).
#   scripts/qemu-binfmt.sh up     mount binfmt_misc if it is not, and register
#                                 `createos-qemu-aarch64` unless an enabled entry already runs
#                                 aarch64 binaries; records what it did in the state file
#   scripts/qemu-binfmt.sh down   undoes what the state file records (nothing else), then
#                                 removes it; a second `down` does nothing
# The state file: $CREATEOS_BINFMT_STATE, default ${TMPDIR:-/tmp}/createos-execute-binfmt.state.
set -euo pipefail
dir=/proc/sys/fs/binfmt_misc
name=createos-qemu-aarch64
state="${CREATEOS_BINFMT_STATE:-${TMPDIR:-/tmp}/createos-execute-binfmt.state}"
qemu=/usr/libexec/qemu-binfmt/aarch64-binfmt-P
# Debian's qemu-aarch64 entry (/usr/lib/binfmt.d/qemu-aarch64.conf): an ELF64 header with
# e_machine 183; P keeps argv[0] (the -binfmt-P name tells qemu), F opens qemu now, O passes
# the binary as an open file.
magic='\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00'
mask='\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff'

# An enabled entry for aarch64 ELF binaries other than ours (systemd-binfmt's, a container's).
aarch64_entry() {
  local f
  for f in "$dir"/*; do
    case "$(basename "$f")" in register|status|"$name") continue ;; esac
    if grep -qx enabled "$f" 2>/dev/null && grep -q '^magic 7f454c460201010000000000000000000200b700' "$f" 2>/dev/null; then
      basename "$f"
      return 0
    fi
  done
  return 1
}

case "${1:-}" in
  up)
    if [ -e "$state" ]; then echo "qemu-binfmt: already up ($state)"; exit 0; fi
    [ -x "$qemu" ] || { echo "qemu-binfmt: $qemu is missing: run \`npm run provision:arm64\`" >&2; exit 1; }
    : >"$state"
    if [ ! -e "$dir/register" ]; then
      mount -t binfmt_misc binfmt_misc "$dir"
      echo mounted >>"$state"
      echo "qemu-binfmt: mounted binfmt_misc"
    fi
    if [ "$(cat "$dir/status")" != enabled ]; then
      echo "qemu-binfmt: binfmt_misc is disabled on this machine; not changing that" >&2
      exit 1
    fi
    if existing="$(aarch64_entry)"; then
      echo "qemu-binfmt: using the existing entry $existing"
    elif [ -e "$dir/$name" ]; then
      echo "qemu-binfmt: $name is registered already (by an earlier run); using it"
    else
      printf ':%s:M::%s:%s:%s:OPF' "$name" "$magic" "$mask" "$qemu" >"$dir/register"
      echo registered >>"$state"
      echo "qemu-binfmt: registered $name"
    fi
    ;;
  down)
    [ -e "$state" ] || exit 0
    if grep -qx registered "$state" && [ -e "$dir/$name" ]; then
      echo -1 >"$dir/$name"
      echo "qemu-binfmt: removed $name"
    fi
    if grep -qx mounted "$state" && [ -e "$dir/register" ]; then
      umount "$dir"
      echo "qemu-binfmt: unmounted binfmt_misc"
    fi
    rm -f "$state"
    ;;
  *)
    echo "usage: scripts/qemu-binfmt.sh up|down" >&2
    exit 2
    ;;
esac
