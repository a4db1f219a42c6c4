"""Worker processes that cut a run's training images, one image a task: decoding and Pillow's per-image steps hold
Python's GIL between their C calls, so threads scale poorly (1.4x on 2 threads, measured) where processes scale with
the cores, as a DataLoader's workers do.

A worker is spawned (never forked from a process running torch's threads), imports Pillow and numpy only
(:mod:`shiftbench.erm.photo_pixels`, :mod:`shiftbench.erm.prepared`), receives the run's image files or its prepared
copy once, then turns ``(slot, Draw)`` tasks into uint8 ``[3, S, S]`` arrays. The parameters are drawn in the main
process from the run's generator, so the number of workers never changes a pixel. Workers ignore the stop signals:
the main process answers a stop (it checkpoints at the next step) and ends them.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from shiftbench.erm import photo_pixels as pp
from shiftbench.erm.prepared import PreparedImages, crop_from

_STATE: dict[str, Any] = {}


def _start(paths: Sequence[str], store: str | None, size: int) -> None:
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    _STATE.update(paths=paths, store=PreparedImages.open(Path(store)) if store else None, size=size)


def _cut(task: tuple[int, pp.Draw]) -> np.ndarray:
    slot, sample = task
    size, store = _STATE["size"], _STATE["store"]
    if store is None:
        return pp.train_pixels(pp.open_photo(Path(_STATE["paths"][slot])), sample, size)
    image = crop_from(store.image(slot), store.original_size(slot), sample, size)
    return pp.to_array(pp.finish(image, sample))


class Cutters:
    """``workers`` processes cutting training images from ``paths`` (by position) or a prepared copy."""

    def __init__(self, workers: int, paths: Sequence[Path], store: PreparedImages | None, size: int) -> None:
        names = [] if store is not None else [str(p) for p in paths]
        self.pool = ProcessPoolExecutor(
            max_workers=workers, mp_context=multiprocessing.get_context("spawn"), initializer=_start,
            initargs=(names, str(store.folder) if store is not None else None, size),
        )  # fmt: skip

    def cut(self, tasks: Iterable[tuple[int, pp.Draw]]) -> list[np.ndarray]:
        return list(self.pool.map(_cut, tasks, chunksize=4))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
