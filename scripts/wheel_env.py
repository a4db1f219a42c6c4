"""Give a fresh virtual environment exactly the wheel's resolved dependencies, without downloading them again.

``pip install --dry-run --report`` resolves the wheel's declared dependencies (with the CPU constraints)
from the package index; every resolved distribution that the project's ``.venv`` already holds at that
version is linked file by file (its RECORD) into the fresh environment's site-packages, any other is
installed from the index. Dev tools and anything the wheel does not declare stay out, so an import of an
undeclared package fails here as it would for a user.

usage: python scripts/wheel_env.py REPORT.json SOURCE_SITE_PACKAGES TARGET_PYTHON
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import Distribution, distributions
from pathlib import Path


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _top_levels(dist: Distribution) -> set[str]:
    """The top-level files and folders a distribution installed (its .dist-info included)."""
    return {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}


def link(report: Path, source: Path, target: Path) -> list[str]:
    """Link the resolved distributions found at ``source`` into ``target``; return the specs still missing."""
    wanted = {
        _canonical(item["metadata"]["name"]): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
        if _canonical(item["metadata"]["name"]) != "shiftbench"
    }
    present = {_canonical(d.metadata["Name"]): d for d in distributions(path=[str(source)])}
    missing = []
    for name, version in sorted(wanted.items()):
        dist = present.get(name)
        if dist is None or dist.version != version:
            missing.append(f"{name}=={version}")
            continue
        for top in _top_levels(dist):
            if top.endswith(".pth") or top == "__pycache__" or (target / top).exists():
                continue
            (target / top).symlink_to(source / top)
    return missing


def main() -> int:
    report, source, python = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    target = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    missing = link(report, source, target)
    if missing:
        print(f"[wheel] from the index (not in .venv at the resolved version): {' '.join(missing)}")
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", *missing], check=True)
    print(f"[wheel] {len(json.loads(report.read_text())['install']) - 1} resolved dependencies, nothing else")
    return 0


if __name__ == "__main__":
    sys.exit(main())
