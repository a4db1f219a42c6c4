"""Peak memory of a command and every process it starts (worker pools, Dagster's step processes), from /proc.

``/usr/bin/time``'s maximum resident set is that of the largest single process; a build that reads in worker
processes or fans out into step processes holds the sum. Linux only (benchmarks, not the package).
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


def tree_rss_kb(root: int) -> int:
    """The resident set of ``root`` and all its descendants (kB)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
        except OSError:
            continue
        parent = re.search(r"^PPid:\s+(\d+)", status, re.M)
        found = re.search(r"^VmRSS:\s+(\d+)", status, re.M)
        rss[int(entry.name)] = int(found.group(1)) if found else 0
        children.setdefault(int(parent.group(1)) if parent else 0, []).append(int(entry.name))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total


def run_sampled(
    command: Sequence[str], env: Mapping[str, str], every_s: float = 0.2
) -> tuple[subprocess.Popen[str], str, str, int]:
    """Run ``command``; its process, stdout, stderr and the largest sum of its tree's resident sets (kB, sampled
    every ``every_s``: a spike shorter than that can be missed)."""
    process = subprocess.Popen(command, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0]

    def sample() -> None:
        while process.poll() is None:
            peak[0] = max(peak[0], tree_rss_kb(process.pid))
            time.sleep(every_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = process.communicate()
    sampler.join()
    return process, stdout, stderr, peak[0]
