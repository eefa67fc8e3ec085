#!/usr/bin/env bash
# `npm run fuzz` (not CI): runs every cargo-fuzz target of fuzz/ for FUZZ_SECONDS each
# (default 120). Works on the stable toolchain: cargo-fuzz's `-s none` needs no sanitizer
# runtime, and RUSTC_BOOTSTRAP=1 lets stable accept the few -Z flags cargo-fuzz passes.
#
#   scripts/fuzz.sh                      every target, 120 s each
#   scripts/fuzz.sh utf8_tail envelope   only these targets
#   FUZZ_SECONDS=10 scripts/fuzz.sh      a smoke run
#   scripts/fuzz.sh --update-corpus      also merge new, minimised inputs into fuzz/corpus/
#
# The committed seed corpus (fuzz/corpus/<target>/) is only read; new inputs go to
# fuzz/target/corpus/<target>/ (ignored). A crash stops that target, leaves the input in
# fuzz/artifacts/<target>/ and makes the script exit non-zero after the other targets ran.
# Installs cargo-fuzz on first use (`cargo install cargo-fuzz --locked`). Inputs in fuzz/regressions/ are replayed first.
set -uo pipefail
cd "$(dirname "$0")/../fuzz"

SECONDS_EACH="${FUZZ_SECONDS:-120}"
UPDATE=0
TARGETS=()
for a in "$@"; do
  case "$a" in
    --update-corpus) UPDATE=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) TARGETS+=("$a") ;;
  esac
done
ALL=(line_splitter process_frame exec_frame envelope utf8_tail)
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=("${ALL[@]}")

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz (once)" >&2
  cargo install cargo-fuzz --locked || { echo "cargo-fuzz could not be installed" >&2; exit 2; }
fi

export RUSTC_BOOTSTRAP=1
FUZZ=(cargo fuzz)
FLAGS=(-s none -O)
JOBS_FLAGS=(-rss_limit_mb=2048 -max_total_time="$SECONDS_EACH" -print_final_stats=1)

echo "== building fuzz targets (stable + RUSTC_BOOTSTRAP=1, sanitizer none)"
"${FUZZ[@]}" build "${FLAGS[@]}" || exit 2
BIN_DIR="target/x86_64-unknown-linux-gnu/release"
[ -d "$BIN_DIR" ] || BIN_DIR="$(dirname "$(find target -path '*/release/utf8_tail' -type f | head -1)")"

failed=()
for t in "${TARGETS[@]}"; do
  # Replay recorded regressions (known bugs) first, so a fix is visible at once.
  for r in regressions/"$t"-*; do
    [ -e "$r" ] || continue
    if "$BIN_DIR/$t" "$r" >/dev/null 2>&1; then
      echo "-- regression $r: passes"
    else
      echo "-- regression $r: STILL FAILS (known bug, see the file name)"
    fi
  done
  work="target/corpus/$t"
  mkdir -p "$work" "corpus/$t"
  echo "== $t: ${SECONDS_EACH}s"
  # Array frames are a known, reported parser leniency; tolerate them in the long run
  # (the regressions above show whether it is fixed).
  if FUZZ_ALLOW_ARRAY_FRAMES=1 "${FUZZ[@]}" run "${FLAGS[@]}" "$t" "$work" "corpus/$t" -- "${JOBS_FLAGS[@]}" \
       > "target/fuzz-$t.log" 2>&1; then
    grep -E '^(Done|#[0-9]+ +DONE)|stat::number_of_executed_units' "target/fuzz-$t.log" | tail -2
  else
    echo "!! $t crashed; see fuzz/target/fuzz-$t.log and fuzz/artifacts/$t/"
    grep -A4 'panicked' "target/fuzz-$t.log" | head -8
    failed+=("$t")
  fi
  if [ "$UPDATE" = 1 ]; then
    # Adds to the committed corpus only inputs that bring new coverage.
    FUZZ_ALLOW_ARRAY_FRAMES=1 "$BIN_DIR/$t" -merge=1 "corpus/$t" "$work" >/dev/null 2>&1 || true
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: ${#failed[@]} target(s) crashed: ${failed[*]}"
  exit 1
fi
echo "fuzz: ${#TARGETS[@]} target(s), ${SECONDS_EACH}s each, no crash"
