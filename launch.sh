#!/usr/bin/env bash
# One entry point: set up on first use, then run an autotune subcommand.
#   ./launch.sh search --budget 10m     ./launch.sh test [pytest args]     ./launch.sh lint
# User commands install the runtime only; `test` and `lint` add the test tools (and every extra the
# suite exercises) on their first use.
# AUTOTUNE_VENV picks the virtual environment (default .venv next to this file),
# so CI can reuse one venv across fresh clones instead of installing 5.6 GB each time.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${AUTOTUNE_VENV:-$here/.venv}"
cmd="${1:-}"
[ $# -gt 0 ] && shift

case "$cmd" in
  test | lint) target="$here[test]"; stamp="$venv/.autotune-test-installed" ;;
  *) target="$here"; stamp="$venv/.autotune-installed" ;;
esac
# The install is keyed by the files that define it, and by this checkout's path (the project is
# installed editable, so a shared venv must be re-pointed at a new clone); a change re-runs pip.
want="$( (cat "$here/pyproject.toml" "$here/launch.sh"; echo "$here") | sha256sum | cut -c1-16)"

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
# The test install holds the runtime too, so a venv set up for tests needs nothing more for a search.
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] && [ "$(cat "$venv/.autotune-test-installed" 2>/dev/null)" != "$want" ]; then
  log="$venv/install.log"
  what="autotune"; [ "$stamp" = "$venv/.autotune-test-installed" ] && what="autotune's test tools"
  echo "autotune: installing $what into $venv (first run only, a few minutes: torch is large; log: $log)" >&2
  # torch/torchvision pinned here, for a reproducible install; the package itself accepts the torch you have.
  if ! { "$venv/bin/pip" install --upgrade pip \
         && "$venv/bin/pip" install "torch==2.14.1" "torchvision==0.29.1" \
         && "$venv/bin/pip" install -e "$target"; } >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "autotune: install failed; the whole log is in $log" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
  # Both stamps name one editable install: the other holds only if it names this same checkout, else
  # a venv shared across clones would keep a stamp for a checkout it no longer points at.
  for other in "$venv/.autotune-installed" "$venv/.autotune-test-installed"; do
    [ "$(cat "$other" 2>/dev/null)" = "$want" ] || rm -f "$other"
  done
fi

export HF_HUB_OFFLINE=1
case "$cmd" in
  test)
    cd "$here"
    if [ $# -gt 0 ]; then exec "$venv/bin/python" -m pytest "$@"; fi
    # The whole suite in three passes. The quick tests, which time nothing, on every CPU at once; then the
    # slow ones that measure nothing either (marked side_by_side: a trial's processes, files and exit
    # codes), also side by side; then the rest one at a time: the searches and timed comparisons (slow)
    # and what measures CPU time or contention (alone), so that no other test's load reaches their
    # figures. Every pass runs whatever the ones before it found, and the suite fails if any did; the slow
    # passes list their slowest tests, where the suite's time goes.
    failed=0
    workers="${AUTOTUNE_TEST_WORKERS:-auto}"
    "$venv/bin/python" -m pytest -m "not slow and not alone" -n "$workers" || failed=$?
    "$venv/bin/python" -m pytest -m "slow and side_by_side and not alone" -n "$workers" --durations=10 || failed=$?
    "$venv/bin/python" -m pytest -m "alone or (slow and not side_by_side)" --durations=15 || exit $?
    exit "$failed" ;;
  lint)  # the import layers, ruff's lint and format check, and mypy (configured in pyproject.toml)
    cd "$here"
    "$venv/bin/lint-imports"
    "$venv/bin/ruff" check autotune tests benchmarks scripts
    "$venv/bin/ruff" format --check autotune tests benchmarks scripts
    exec "$venv/bin/mypy" --python-executable "$venv/bin/python" ;;
  "")
    exec "$venv/bin/autotune" --help ;;
  *)
    exec "$venv/bin/autotune" "$cmd" "$@" ;;
esac
