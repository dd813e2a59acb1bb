#!/usr/bin/env bash
# Print the path of a Python interpreter of at least the given version (default 3.12), for
# the Django 6 test environment; exit 1 saying what was tried when there is none.
#   scripts/find-python.sh 3.12
# Tried in order: $DJANGO6_PYTHON, python3.14 .. python3.12 on PATH, then pyenv's versions
# (pyenv's shims are on PATH but fail for a version that is not selected, so each candidate
# is run, not only looked up).
set -u
minimum="${1:-3.12}"
minor="${minimum#3.}"

works() {
    "$1" -c "import sys, venv; sys.exit(sys.version_info < (3, $minor))" >/dev/null 2>&1
}

tried=()
candidates=()
if [ -n "${DJANGO6_PYTHON:-}" ]; then
    candidates+=("$DJANGO6_PYTHON")
fi
for version in 3.14 3.13 3.12; do
    candidates+=("python$version")
done
pyenv_root="${PYENV_ROOT:-$HOME/.pyenv}"
if command -v pyenv >/dev/null 2>&1; then
    pyenv_root="$(pyenv root 2>/dev/null || echo "$pyenv_root")"
fi
for path in $(ls -d "$pyenv_root"/versions/3.1[2-9]* 2>/dev/null | sort -rV); do
    candidates+=("$path/bin/python3")
done

for candidate in "${candidates[@]}"; do
    tried+=("$candidate")
    if works "$candidate"; then
        command -v "$candidate"
        exit 0
    fi
done

{
    echo "error: the Django 6 tests need Python $minimum or newer, and none was found."
    echo "  tried: ${tried[*]}"
    echo "  install one (e.g. 'pyenv install 3.12', or your system's python3.12 package with venv),"
    echo "  or point DJANGO6_PYTHON at it: make test DJANGO6_PYTHON=/path/to/python3.12"
} >&2
exit 1
