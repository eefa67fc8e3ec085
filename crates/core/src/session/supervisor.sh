# The session supervisor (see session/mod.rs). The client prepends four assignments:
# __cos_attempt (the creation attempt), __cos_marker (this supervisor's unique path prefix),
# __cos_sid (its id, which every command carries as CREATEOS_SESSION_ID) and __cos_idle
# (seconds without a record before it exits on its own).
# A record is one line on stdin: "<token> <script, \xHH-escaped> <base64 stdin | ->", or
# "end".
if [ -s "$__cos_marker.cancelled" ]; then
  __cos_c=
  read -r __cos_c < "$__cos_marker.cancelled"
  case $__cos_c in ''|*[!0-9]*) exit 124;; esac
  [ "$__cos_c" -ge "$__cos_attempt" ] && exit 124
fi
command -v base64 >/dev/null 2>&1 || exit 127
__cos_in="$__cos_marker.in"
trap 'rm -f -- "$__cos_in"' EXIT
# A DELETE's SIGTERM (bash runs no EXIT trap on a fatal signal): the staged stdin is removed
# and the exit status says so (script::STAGED_REMOVED_EXIT), so no removal is sent after.
# While a command runs in the foreground, bash runs the trap once that command has ended.
trap 'rm -f -- "$__cos_in"; exit 122' TERM
# Whether any process still carries this session's id: a leftover of a command, in the
# group or out of it. grep when it works (one process for the whole scan), else bash's own
# reads; a scan that cannot run says "leftover".
__cos_want="CREATEOS_SESSION_ID=$__cos_sid"
if printf 'a\0' | grep -qzxF -e a 2>/dev/null; then
  __cos_scan() {
    grep -qszxF -e "$__cos_want" /proc/[0-9]*/environ
    case $? in 0) return 0;; 1|2) return 1;; *) return 0;; esac
  }
else
  __cos_scan() {
    local f kv
    [ -d /proc/self ] || return 0
    for f in /proc/[0-9]*/environ; do
      while IFS= read -r -d '' kv; do
        [ "$kv" = "$__cos_want" ] && return 0
      done < "$f"
    done 2>/dev/null
    return 1
  }
fi
# The tokens of the last commands run (16 at most): a record whose token is among them (an
# input the server took twice) is not run again.
__cos_seen=
while IFS= read -r -t "$__cos_idle" __cos_rec; do
  # "end": the client retires this supervisor (its last command left processes, kept).
  [ "$__cos_rec" = end ] && exit 0
  __cos_tok=${__cos_rec%% *}
  __cos_rest=${__cos_rec#* }
  __cos_cmd=${__cos_rest%% *}
  __cos_sin=${__cos_rest#* }
  case $__cos_tok in ''|*[!0-9a-f]*) exit 3;; esac
  [ "${#__cos_tok}" -eq 32 ] || exit 3
  case " $__cos_seen" in *" $__cos_tok "*) continue;; esac
  __cos_seen="$__cos_tok ${__cos_seen:0:495}"
  printf -v __cos_script '%b' "$__cos_cmd" || exit 3
  if [ "$__cos_sin" = - ]; then
    __cos_from=/dev/null
  else
    printf %s "$__cos_sin" | base64 -d > "$__cos_in" || exit 3
    __cos_from=$__cos_in
  fi
  printf '\0\036cos-begin:%s\n' "$__cos_tok"
  printf '\0\036cos-begin:%s\n' "$__cos_tok" >&2
  # In the foreground and in this process group (a DELETE that signals the group reaches
  # it), with a managed process's signal dispositions; its stdin open and already unlinked.
  {
    [ "$__cos_from" = /dev/null ] || rm -f -- "$__cos_in"
    CREATEOS_SESSION_ID=$__cos_sid /bin/bash -lc "$__cos_script"
  } < "$__cos_from"
  __cos_rc=$?
  __cos_left=0
  __cos_scan && __cos_left=1
  printf '\0\036cos-end:%s:%s:%s\n' "$__cos_tok" "$__cos_rc" "$__cos_left"
  printf '\0\036cos-end:%s:%s:%s\n' "$__cos_tok" "$__cos_rc" "$__cos_left" >&2
done
exit 0
