# The session supervisor (see session.rs). The client prepends three assignments:
# __cos_attempt (the creation attempt), __cos_marker (this supervisor's unique path prefix)
# and __cos_idle (seconds without a record before it exits on its own).
# A record is one line on stdin: "<token> <script, \xHH-escaped> <base64 stdin | ->".
if [ -s "$__cos_marker.cancelled" ]; then
  __cos_c=
  read -r __cos_c < "$__cos_marker.cancelled"
  case $__cos_c in ''|*[!0-9]*) exit 124;; esac
  [ "$__cos_c" -ge "$__cos_attempt" ] && exit 124
fi
command -v setsid >/dev/null 2>&1 || exit 127
command -v base64 >/dev/null 2>&1 || exit 127
__cos_in="$__cos_marker.in"
trap 'rm -f -- "$__cos_in"' EXIT
# A DELETE's SIGTERM (bash runs no EXIT trap on a fatal signal): the staged stdin is removed
# and the exit status says so (script::STAGED_REMOVED_EXIT), so no removal is sent after.
trap 'rm -f -- "$__cos_in"; exit 122' TERM
while IFS= read -r -t "$__cos_idle" __cos_rec; do
  __cos_tok=${__cos_rec%% *}
  __cos_rest=${__cos_rec#* }
  __cos_cmd=${__cos_rest%% *}
  __cos_sin=${__cos_rest#* }
  case $__cos_tok in ''|*[!0-9a-f]*) exit 3;; esac
  [ "${#__cos_tok}" -eq 32 ] || exit 3
  printf -v __cos_script '%b' "$__cos_cmd" || exit 3
  if [ "$__cos_sin" = - ]; then
    __cos_from=/dev/null
  else
    printf %s "$__cos_sin" | base64 -d > "$__cos_in" || exit 3
    __cos_from=$__cos_in
  fi
  printf '\0\036cos-begin:%s\n' "$__cos_tok"
  printf '\0\036cos-begin:%s\n' "$__cos_tok" >&2
  setsid /bin/bash -lc "$__cos_script" < "$__cos_from" &
  __cos_pid=$!
  wait "$__cos_pid" 2>/dev/null
  __cos_rc=$?
  [ "$__cos_from" = /dev/null ] || rm -f -- "$__cos_in"
  __cos_left=0
  kill -0 -- "-$__cos_pid" 2>/dev/null && __cos_left=1
  printf '\0\036cos-end:%s:%s:%s\n' "$__cos_tok" "$__cos_rc" "$__cos_left"
  printf '\0\036cos-end:%s:%s:%s\n' "$__cos_tok" "$__cos_rc" "$__cos_left" >&2
done
exit 0
