# Sourced by the device scripts (device_issue40.sh, device_issue41.sh, device_moe_fp8bs_sm90.sh): their
# budget and their bounded steps, written once. The caller sets LOG (its log file), BUDGET_S (the call's
# seconds) and START ($SECONDS when it began) before a step runs; and, where its default does not suit:
#   RUN_RESERVE_S (0)  seconds every step leaves of the budget (kept for the script's packing at the end)
#   RUN_MIN_S (15)     a step that would get fewer seconds is skipped (status 124)
#   RUN_MERGE (0)      1: a step's stderr joins its stdout; 0: its stdout stays the caller's (a JSON
#                      answer redirected to a file stays clean) and its stderr goes to stderr; both
#                      streams go to the log either way
left() { echo $((BUDGET_S - (SECONDS - START))); }
say() { echo "$*" | tee -a "$LOG" >&2; }
# `run LIMIT cmd...`: the command bounded by LIMIT seconds and by what is left of the budget
run() {
  local lim=$1; shift
  local l=$(( $(left) - ${RUN_RESERVE_S:-0} ))
  [ "$lim" -gt "$l" ] && lim=$l
  if [ "$lim" -lt "${RUN_MIN_S:-15}" ]; then say "skip (budget: $(left)s left): $*"; return 124; fi
  say "+ [${lim}s] $*"
  if [ "${RUN_MERGE:-0}" = 1 ]; then
    timeout -k 10 "$lim" "$@" 2>&1 | tee -a "$LOG"
  else
    timeout -k 10 "$lim" "$@" 2> >(tee -a "$LOG" >&2) | tee -a "$LOG"
  fi
  local rc=${PIPESTATUS[0]}
  say "rc=$rc after $((SECONDS - START))s"
  return "$rc"
}
