#!/usr/bin/env bash
# gotest.sh ARGS...: runs `go test ARGS...` unchanged, and when it fails ends
# its output with what failed: each failing test's own lines (its t.Error and
# t.Fatal messages, cut to 300 characters), panics, races and leaks, and one
# line per failed test. A long -race run interleaves the relays' logs with the
# failure; whoever reads only the end of a CI log still sees which test failed
# and why. The whole output stays in .cache/gotest/last.log.
set -uo pipefail
GO=${GO:-go}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root/.cache/gotest"
log=$(mktemp "$root/.cache/gotest/run.XXXXXX")
"$GO" test "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
cp "$log" "$root/.cache/gotest/last.log" 2>/dev/null || true
if [ "$rc" -ne 0 ]; then
  echo "== gotest.sh: go test $* failed (exit $rc); what failed (whole output: .cache/gotest/last.log):"
  awk '
    function out(s) { if (n < 60) print substr(s, 1, 300); n++ }
    /^[[:space:]]*--- FAIL/ { out($0); infail = 1; cont = 0; next }
    /^panic: |^fatal error: / { out($0); panics = 8; next }
    panics > 0 { out($0); panics--; next }
    /^WARNING: DATA RACE/ { races++ }
    /found unexpected goroutines/ { out($0) }
    infail && /^[[:space:]]+[^[:space:]]+\.go:[0-9]+: / { out($0); cont = 3; next }
    infail && cont > 0 && /^        / { out($0); cont--; next }
    /^[^[:space:]]/ { if (!/^[[:space:]]*--- FAIL/) { infail = 0; cont = 0 } }
    END { if (races) print "data races reported: " races; if (n > 60) print "(" n - 60 " more lines in the log)" }
  ' "$log"
  grep -E '^[[:space:]]*--- FAIL: |^FAIL[[:space:]]' "$log" | sed -E 's/^[[:space:]]+//' | sort -u | head -30
fi
rm -f "$log"
exit "$rc"
