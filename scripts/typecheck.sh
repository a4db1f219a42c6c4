#!/usr/bin/env bash
# mypy over the package as Python imports it: shiftbench, with assets/ and pipelines/ mapped into it
# (pyproject.toml's package-dir). A tree of links in build/typecheck gives mypy the wheel's layout, and it has to:
# mypy finds modules by directory and has no setting that maps a folder to a package name, and the mapping exists
# only in the import hook the editable install writes, which mypy (by design: it runs no code) never follows
# (python/mypy#13392, #12313; setuptools' "strict" editable mode is a tree of links too, made at install time and
# blind to files added since). Without it every import of shiftbench.assets or shiftbench.pipelines would be an
# unchecked Any. ruff needs no such tree: it is told the mapped folders are first-party (pyproject.toml). The
# library is checked with --strict, the Dagster shell without it (Dagster's decorators are only partly typed).
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
