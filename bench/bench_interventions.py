"""What BREEDS Table 14's interventions and Table 13's architectures cost per training step on CPU, beside ERM.

    .venv/bin/python bench/bench_interventions.py [--steps 5] [--rounds 3] [--record bench/figures/interventions.json]

Side by side in one run, on the same batch: one SGD step (forward, cross-entropy, backward, update) of ResNet-18 on
32 images of 64x64 (normalised as the breeds presets normalise), plain (ERM) and with each intervention (its draws, or
the 3-step l2 PGD attack before the step); then one plain step of every architecture on 16 images at 64x64. Seconds per
100 steps (the median of the rounds' mean step, times 100); PGD with 3 steps is 3 more forward and backward passes and
one more forward (its worst iterate scored): about 4.5 times an ERM step in arithmetic.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn import functional as F

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))
sys.path.insert(0, str(PROJECT / "bench"))

import records  # noqa: E402

from shiftbench.erm import interventions as iv  # noqa: E402
from shiftbench.erm.data import pixel_constants, standardize  # noqa: E402
from shiftbench.erm.models import build_model  # noqa: E402

KIND = "robustness_custom_imagenet"
ARCHITECTURES = ["resnet18", "resnet34", "resnet50", "alexnet", "vgg11", "densenet121", "vit_b_16"]


def _step(model_name: str, batch: int, intervention: str) -> Callable[[], None]:
    torch.manual_seed(0)
    model = build_model(model_name, 10, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    pixels = torch.rand(batch, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    target = torch.arange(batch) % 10
    generator = torch.Generator().manual_seed(2)
    setting = iv.Intervention(intervention)
    mean, std = pixel_constants(KIND, torch.device("cpu"))

    def step() -> None:
        x = standardize(pixels, KIND)
        if intervention in ("gaussian_noise", "random_erasing"):
            x = standardize(iv.perturb(x * std + mean, setting, generator), KIND)
        elif intervention == "pgd_l2":
            x = iv.attack(model, x, target, KIND, setting)
        loss = F.cross_entropy(model(x), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()

    return step


def _per_100(step: Callable[[], None], steps: int, rounds: int) -> list[float]:
    step()  # warm-up
    runs = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        runs.append((time.perf_counter() - start) / steps * 100)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    records.add_argument(parser)
    args = parser.parse_args()
    recording = records.start(args.record)
    figures = {}
    erm = 0.0
    for intervention in ("none", "gaussian_noise", "random_erasing", "pgd_l2"):
        runs = _per_100(_step("resnet18", 32, intervention), args.steps, args.rounds)
        recording.run(model="resnet18", intervention=intervention, seconds_per_100=runs)
        median = statistics.median(runs)
        erm = median if intervention == "none" else erm
        name = "erm" if intervention == "none" else intervention
        figures[name] = records.median_figure(runs, "s per 100 steps", 1, f"ResNet-18, 32 at 64x64: {name}")
        figures[f"{name}_over_erm"] = {
            "what": f"{name} / erm",
            "figure": f"{median / erm:.2f}x",
            "median": median / erm,
        }
        print(f"{name:<16} {median:7.1f} s per 100 steps  {median / erm:5.2f}x ERM")
    for model in ARCHITECTURES:
        runs = _per_100(_step(model, 16, "none"), args.steps, args.rounds)
        recording.run(model=model, intervention="none", seconds_per_100=runs)
        figures[f"arch.{model}"] = records.median_figure(runs, "s per 100 steps", 1, f"{model}, 16 at 64x64: erm")
        print(f"{model:<16} {statistics.median(runs):7.1f} s per 100 steps")
    recording.save("a training step on CPU by intervention and architecture", figures,
                   notes=f"{args.steps} steps per round, {args.rounds} rounds, SGD, 64x64 inputs")  # fmt: skip


if __name__ == "__main__":
    main()
