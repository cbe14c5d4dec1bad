#!/usr/bin/env bash
# make model: check protocol.pml with Spin in every configuration of model/configurations
# (or only those named as arguments). Each is built in a temporary directory (removed at the
# end): spin -a, then pan compiled for a safety search (assertions and invalid end states),
# run exhaustively. Exits non-zero on any error, and when a search was cut short.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
SPIN="${SPIN:-spin}"
CC="${CC:-cc}"
MEMLIM="${MODEL_MEMLIM:-2048}"  # MB, per configuration
work="$(mktemp -d "${TMPDIR:-/tmp}/idempotency-model.XXXXXX")"
trap 'rm -rf "$work"' EXIT

command -v "$SPIN" >/dev/null || { echo "model: spin is not installed (apt-get install spin)" >&2; exit 2; }

failed=0
checked=0
while read -r name flags; do
    case "$name" in ''|'#'*) continue ;; esac
    if [ $# -gt 0 ] && ! printf '%s\n' "$@" | grep -qx "$name"; then continue; fi
    dir="$work/$name"
    mkdir -p "$dir"
    cp "$here/protocol.pml" "$dir/"
    began=$SECONDS
    # shellcheck disable=SC2086  # the switches are words
    if ! (cd "$dir" && "$SPIN" -a $flags protocol.pml >spin.log 2>&1); then
        echo "model: $name: spin -a failed" >&2; cat "$dir/spin.log" >&2; failed=1; continue
    fi
    if ! (cd "$dir" && "$CC" -O2 -w -DSAFETY -DCOLLAPSE -DMEMLIM="$MEMLIM" -o pan pan.c 2>cc.log); then
        echo "model: $name: compiling pan failed" >&2; cat "$dir/cc.log" >&2; failed=1; continue
    fi
    status=0
    (cd "$dir" && ./pan -m10000 >pan.log 2>&1) || status=$?
    log="$dir/pan.log"
    states=$(sed -n 's/^ *\([0-9][0-9]*\) states, stored.*/\1/p' "$log" | head -n 1)
    if [ "$status" -ne 0 ] || ! grep -q "errors: 0" "$log" \
        || grep -q "reached -DMEMLIM bound\|max search depth too small\|out of memory" "$log"; then
        echo "model: $name: FAILED ($flags)" >&2
        cat "$log" >&2
        if [ -e "$dir/protocol.pml.trail" ]; then
            echo "model: $name: the counterexample (spin -t -p $flags protocol.pml):" >&2
            (cd "$dir" && "$SPIN" -t -p $flags protocol.pml 2>&1 | grep -v '^\s*$' | tail -n 120) >&2
        fi
        failed=1
        continue
    fi
    checked=$((checked + 1))
    echo "model: $name: no counterexample, ${states:-?} states, $((SECONDS - began)) s"
done <"$here/configurations"

if [ "$checked" -eq 0 ] && [ "$failed" -eq 0 ]; then
    echo "model: no configuration named $*" >&2
    exit 2
fi
exit "$failed"
