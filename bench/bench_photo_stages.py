"""Where a protocol's training image spends its time on one core, from the prepared copy at 256 (the fastest path of
bench_photo_input.py): reading it from the memory-mapped copy, the crop and resize to 224, the flip and colour
jitter, and the uint8 array; what a faster path would have to remove.

    .venv/bin/python bench/bench_photo_stages.py [--images 256] [--rounds 5] [--record bench/figures/photo_stages.json]

The photographs and the prepared copy are bench_photo_input.py's (tests/real_photos.py, re-encoded at ImageNet's
sizes); the draws are the robustness_imagenet protocol's from a seeded generator. Milliseconds per image, median of
the rounds, one process (the job runs one such process per core).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))
sys.path.insert(0, str(PROJECT / "bench"))

import records  # noqa: E402
from bench_photo_input import CLIENTS_PYTHON, _images  # noqa: E402

from shiftbench.erm import photo_draws as pd  # noqa: E402
from shiftbench.erm import photo_pixels as pp  # noqa: E402
from shiftbench.erm.prepared import crop_from, prepare  # noqa: E402
from shiftbench.erm.protocols import PROTOCOLS  # noqa: E402
from tests.real_photos import make_photos  # noqa: E402

STAGES = ("read", "crop_resize", "flip_jitter", "array")


def _round(store, samples) -> dict[str, float]:  # type: ignore[no-untyped-def]
    spent = dict.fromkeys(STAGES, 0.0)
    for slot, sample in enumerate(samples):
        t0 = time.perf_counter()
        image = store.image(slot)
        image.load()
        t1 = time.perf_counter()
        cropped = crop_from(image, store.original_size(slot), sample, 224)
        t2 = time.perf_counter()
        finished = pp.finish(cropped, sample)
        t3 = time.perf_counter()
        np.ascontiguousarray(pp.to_array(finished))
        t4 = time.perf_counter()
        for stage, seconds in zip(STAGES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            spent[stage] += seconds
    return {stage: seconds / len(samples) * 1000 for stage, seconds in spent.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    records.add_argument(parser)
    args = parser.parse_args()
    recording = records.start(args.record)
    transform = PROTOCOLS["robustness_imagenet"].train
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = _images(make_photos(CLIENTS_PYTHON, root / "photos"), root / "folder", args.images)
        store = prepare(paths, root / "copy", 256, 1, {"bench": "photo_stages"}, lambda _: None)
        generator = torch.Generator().manual_seed(0)
        rounds = []
        for _ in range(args.rounds + 1):  # the first warms the page cache
            samples = [pd.draw(*store.original_size(k), transform, generator) for k in range(len(paths))]
            rounds.append(_round(store, samples))
        rounds = rounds[1:]
    figures = {}
    for stage in (*STAGES, "total"):
        runs = [sum(r.values()) if stage == "total" else r[stage] for r in rounds]
        recording.run(stage=stage, ms_per_image=runs)
        figures[stage] = records.median_figure(runs, "ms per image", 3, f"{stage}, one core, prepared copy at 256")
        print(f"{stage:<12} {statistics.median(runs):.3f} ms per image")
    notes = f"{args.images} real-photo JPEGs, robustness_imagenet at 224, {args.rounds} rounds"
    recording.save("a protocol's training image, stage by stage, from the prepared copy at 256", figures, notes=notes)


if __name__ == "__main__":
    main()
