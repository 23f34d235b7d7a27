#!/usr/bin/env bash
# Counts the exported identifiers of the module's public packages, the way
# issue 33 measures the public API: per package, the lines of `go doc
# -short` (one per exported const or var block, function, type, and each
# type's constructors and constant blocks) plus the methods of its exported
# types (the `func (` lines of `go doc -all`). Public packages are every
# package of the main module outside internal/ and cmd/ (examples/, bench/
# and migrations/tooltest are modules of their own).
#
#   scripts/apisurface.sh          the count per package and the total
#   scripts/apisurface.sh -v       also every name counted
#   scripts/apisurface.sh -max N   exit 1 when the total is over N
set -euo pipefail
cd "$(dirname "$0")/.."

verbose= max=
while [ $# -gt 0 ]; do
	case "$1" in
	-v) verbose=1 ;;
	-max) max="${2:?-max needs a number}"; shift ;;
	*) echo "usage: $0 [-v] [-max N]" >&2; exit 2 ;;
	esac
	shift
done

module=$(go list -m)
total=0
for pkg in $(go list ./... | grep -Ev "^$module/(.+/)?(internal|cmd)(/|$)"); do
	short=$(go doc -short "$pkg")
	methods=$(go doc -all "$pkg" | grep '^func (' || true)
	n=$(( $(grep -c . <<<"$short" || true) + $(grep -c . <<<"$methods" || true) ))
	total=$((total + n))
	rel=${pkg#"$module"}
	printf '%4d  %s\n' "$n" "${rel:-/}"
	if [ -n "$verbose" ]; then
		printf '%s\n%s\n' "$short" "$methods" | grep . | sed 's/^ */        /'
	fi
done
printf '%4d  total\n' "$total"
if [ -n "$max" ] && [ "$total" -gt "$max" ]; then
	echo "the public API has $total exported identifiers, over $max" >&2
	exit 1
fi
