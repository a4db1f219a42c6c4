#!/usr/bin/env bash
# Idempotent: the files some tests read that no install provides, fetched into .downloads/ (git-ignored).
# - timm 1.0.31's wheel, which shiftbench/data/imagenet21k_classes.parquet was made from: tests/test_imagenet21k.py
#   checks the shipped lists against its files and rebuilds the Parquet file from it byte for byte
#   (scripts/make_package_data.py --timm-wheel). The download is checked against the SHA-256 the shipped file records.
# scripts/test.sh runs this and sets SHIFTBENCH_REQUIRE_TIMM_WHEEL=1, so those tests fail there without the wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .downloads
read -r wheel wanted < <(.venv/bin/python -c "from shiftbench.sources.imagenet21k import shipped_provenance as p
print(p()['wheel'], p()['wheel_sha256'])")
path=.downloads/$wheel
if [ -f "$path" ] && [ "$(sha256sum "$path" | cut -d' ' -f1)" = "$wanted" ]; then
  echo "[downloads] $path is there"
  exit 0
fi
rm -f "$path"
version=${wheel#timm-}
version=${version%%-*}
echo "[downloads] pip download timm==$version (the wheel only) into .downloads/"
set +e
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: "timm==$version" -d .downloads 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory"
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ] || [ ! -f "$path" ]; then
  echo "[downloads] pip download timm==$version failed" >&2
  exit 1
fi
got=$(sha256sum "$path" | cut -d' ' -f1)
if [ "$got" != "$wanted" ]; then
  rm -f "$path"
  echo "[downloads] $wheel has SHA-256 $got, not the $wanted shiftbench/data/imagenet21k_classes.parquet records" >&2
  exit 1
fi
echo "[downloads] $path (sha256 $got)"
