#!/usr/bin/env bash
# mypy --strict over the whole installed package. mypy cannot follow setuptools' package-dir
# mapping, so it checks a mirror of the installed layout made of symlinks (build/typecheck/).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
mirror=build/typecheck
rm -rf "$mirror" && mkdir -p "$mirror/perfdiag"
for entry in perfdiag/* perfdiag/py.typed; do
  [ -e "$entry" ] || continue
  name=$(basename "$entry")
  case "$name" in __pycache__) continue ;; esac
  ln -sfn "$root/$entry" "$mirror/perfdiag/$name"
done
for component in operator collector analyzer; do
  ln -sfn "$root/$component" "$mirror/perfdiag/$component"
done
cd "$mirror"
ln -sfn "$root/tests/support/perfdiag_testing" perfdiag_testing
exec "$root/.venv/bin/mypy" --config-file "$root/pyproject.toml" --strict -p perfdiag -p perfdiag_testing
