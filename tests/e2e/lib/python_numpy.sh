# Sourced by end-to-end tests: sets $PY to a Python 3 that has NumPy (the interpreter on PATH, or
# Debian's, where scripts/install_deps.sh installs python3-numpy). Fails the test when there is
# none: the NumPy references are part of CI, not optional.
PY=""
for cand in python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import numpy" >/dev/null 2>&1; then PY=$cand; break; fi
done
if [ -z "$PY" ]; then
  echo "FAIL: no python3 with NumPy (install python3-numpy: scripts/install_deps.sh)"; exit 1
fi
