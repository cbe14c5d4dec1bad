#!/usr/bin/env bash
# make model: check the models with Spin in every configuration of model/configurations
# (or only those named as arguments), MODEL_JOBS (2) at a time. A configuration's switches
# may start with the model's file (protocol.pml when they do not). Each is built in a
# temporary directory, removed at the end: spin -a, then pan compiled for a safety search
# (assertions and invalid end states) and run exhaustively. Exits non-zero on any
# counterexample (printed with its trail) and on any search cut short (memory or depth
# bound); a configuration named bug-* models code that would be wrong, and must find one.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
SPIN="${SPIN:-spin}"
CC="${CC:-cc}"
MEMLIM="${MODEL_MEMLIM:-1536}"  # MB per search
JOBS="${MODEL_JOBS:-2}"
work="$(mktemp -d "${TMPDIR:-/tmp}/idempotency-model.XXXXXX")"
trap 'rm -rf "$work"' EXIT

command -v "$SPIN" >/dev/null || { echo "model: spin is not installed (apt-get install spin)" >&2; exit 2; }

check() {  # name [model.pml] flags...: one search; its verdict in $work/$name.verdict
    local name=$1 began=$SECONDS status=0 states model=protocol.pml
    shift
    case "${1:-}" in *.pml) model=$1; shift ;; esac
    local dir="$work/$name"
    mkdir -p "$dir" && cp "$here/$model" "$dir/" && cd "$dir" || return
    if ! "$SPIN" -a "$@" "$model" >spin.log 2>&1; then
        { echo "model: $name: spin -a failed"; cat spin.log; } >"$work/$name.verdict"; return
    fi
    if ! "$CC" -O2 -w -DSAFETY -DCOLLAPSE -DMEMLIM="$MEMLIM" -o pan pan.c 2>cc.log; then
        { echo "model: $name: compiling pan failed"; cat cc.log; } >"$work/$name.verdict"; return
    fi
    ./pan -m10000 >pan.log 2>&1 || status=$?
    states=$(sed -n 's/^ *\([0-9][0-9]*\) states, stored.*/\1/p' pan.log | head -n 1)
    if [[ $name == bug-* ]]; then
        if grep -q "assertion violated" pan.log; then
            echo "ok model: $name: its counterexample found, $(grep -m 1 'assertion violated' pan.log | sed 's/^pan:1: //')" \
                >"$work/$name.verdict"
        else
            { echo "model: $name: FAILED: no counterexample found ($model $*)"; cat pan.log; } \
                >"$work/$name.verdict"
        fi
        return
    fi
    if [ "$status" -ne 0 ] || ! grep -q "errors: 0" pan.log \
        || grep -q "reached -DMEMLIM bound\|max search depth too small\|out of memory" pan.log; then
        {
            echo "model: $name: FAILED ($model $*)"
            cat pan.log
            if [ -e "$model.trail" ]; then
                echo "model: $name: the counterexample (spin -t -p $* $model):"
                "$SPIN" -t -p "$@" "$model" 2>&1 | grep -v '^\s*$' | tail -n 150
            fi
        } >"$work/$name.verdict"
        return
    fi
    echo "ok model: $name: no counterexample, ${states:-?} states, $((SECONDS - began)) s" \
        >"$work/$name.verdict"
}

names=()
while read -r name flags; do
    case "$name" in ''|'#'*) continue ;; esac
    if [ $# -gt 0 ] && ! printf '%s\n' "$@" | grep -qx -- "$name"; then continue; fi
    names+=("$name")
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    # shellcheck disable=SC2086  # the switches are words
    check "$name" $flags &
done <"$here/configurations"
wait

for asked in "$@"; do
    if ! printf '%s\n' "${names[@]}" | grep -qx -- "$asked"; then
        echo "model: no configuration named $asked in model/configurations" >&2
        exit 2
    fi
done
failed=0
for name in "${names[@]}"; do
    verdict="$work/$name.verdict"
    if [ -e "$verdict" ] && head -n 1 "$verdict" | grep -q '^ok '; then
        sed 's/^ok //' "$verdict"
    else
        [ -e "$verdict" ] && cat "$verdict" >&2 || echo "model: $name: no verdict" >&2
        failed=1
    fi
done
exit "$failed"
