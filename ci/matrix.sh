#!/usr/bin/env bash
# The version matrix: runs the nox smoke session of every non-default Spark/Beam line
# (noxfile.py, tag "smoke": PySpark 3.5.x and 4.0.x with the newest Beam, the oldest Beam
# we support with the newest PySpark). `make test` covers the default line.
#
#   ci/matrix.sh                   every smoke session
#   ci/matrix.sh smoke-spark3.5    only the sessions named
#
# Each session runs in its own virtualenv, created on the first run (a PySpark download and
# install of 300-450 MB) and reused afterwards: under .nox/, or with CI=true (CI runs in a
# fresh clone) under ~/.cache/beam-spark-runner/nox so that later CI runs on the machine
# reuse them; NOX_ENVDIR overrides both. Every session runs even if an earlier one failed;
# the exit status is non-zero if any failed. The whole run stops after MATRIX_TIMEOUT
# seconds (default 3000), counted as a failure. .ci/run runs it after `make test` (about
# 1 850 s on CI's machine in 2026-11), inside CI's 5 400: the three sessions took 2 700+ s
# there with every unit test; without those marked slow (noxfile.py) 2 500 s on a machine
# as slow (778, 970 and 750 s, 2026-11-27).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PY="$VENV/bin/python"
MATRIX_TIMEOUT=${MATRIX_TIMEOUT:-3000}
if [ -n "${NOX_ENVDIR:-}" ]; then
    envdir=$NOX_ENVDIR
elif [ "${CI:-}" = "true" ]; then
    envdir="${XDG_CACHE_HOME:-$HOME/.cache}/beam-spark-runner/nox"
else
    envdir=.nox
fi

# nox runs the sessions; with uv beside it, nox makes the venvs with uv (much faster).
if ! "$PY" -c "import nox, uv" 2>/dev/null; then
    echo "matrix: installing nox and uv into $VENV"
    "$PY" -m pip install --quiet "nox>=2024.4.15" "uv>=0.4"
fi

if [ "$#" -gt 0 ]; then
    sessions=("$@")
else
    mapfile -t sessions < <(
        "$PY" -m nox --no-color -t smoke -l --json |
            "$PY" -c 'import json, sys; print("\n".join(s["session"] for s in json.load(sys.stdin)))'
    )
    if [ "${#sessions[@]}" -eq 0 ]; then
        echo "matrix: nox found no session tagged smoke in noxfile.py" >&2
        exit 1
    fi
fi

deadline=$((SECONDS + MATRIX_TIMEOUT))
declare -a results
passed=0
failed=0
for session in "${sessions[@]}"; do
    left=$((deadline - SECONDS))
    if [ "$left" -le 0 ]; then
        results+=("$session: not run (MATRIX_TIMEOUT=${MATRIX_TIMEOUT}s reached)")
        failed=$((failed + 1))
        continue
    fi
    echo "matrix: nox -s $session (at most ${left}s left)"
    started=$SECONDS
    status=0
    timeout --kill-after=30 "$left" "$PY" -m nox --no-color --envdir "$envdir" -s "$session" ||
        status=$?
    seconds=$((SECONDS - started))
    if [ "$status" -eq 0 ]; then
        results+=("$session: passed in ${seconds}s")
        passed=$((passed + 1))
    else
        [ "$status" -eq 124 ] && why="timed out" || why="failed (exit $status)"
        results+=("$session: $why after ${seconds}s")
        failed=$((failed + 1))
    fi
done

echo
echo "Version matrix (install and test times are in each session's log above):"
for line in "${results[@]}"; do
    echo "  $line"
done
echo "matrix sessions: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
