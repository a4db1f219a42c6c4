#!/usr/bin/env bash
# mypy over the package as Python imports it: shiftbench, with assets/ and pipelines/ mapped into it
# (pyproject.toml's package-dir). mypy cannot follow an editable install's import hook, so a tree of links in
# build/typecheck gives it the wheel's layout; without it every import of shiftbench.assets or
# shiftbench.pipelines would be an unchecked Any. The library is checked with --strict, the Dagster shell without
# it (Dagster's decorators and generic classes are only partly typed).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
tree=build/typecheck
rm -rf "$tree"
mkdir -p "$tree/shiftbench"
for entry in shiftbench/*; do ln -s "$root/$entry" "$tree/shiftbench/"; done
ln -s "$root/assets" "$tree/shiftbench/assets"
ln -s "$root/pipelines" "$tree/shiftbench/pipelines"
cd "$tree"
mypy=("$root/.venv/bin/mypy" --config-file "$root/pyproject.toml" --cache-dir "$root/.mypy_cache")
"${mypy[@]}" --strict shiftbench --exclude '^shiftbench/(assets|pipelines)/'
"${mypy[@]}" shiftbench/assets shiftbench/pipelines
