"""What the methods beside ERM and the batched augmentations cost per training step (CPU, this machine).

Side by side in one run, medians of --repeats: one optimisation step (forward, the method's loss,
backward, Adam) of the small CNN on a batch of 128 32x32 images with 9 training groups, for every
method of shiftbench.erm.methods; and one batch of each augmentation of shiftbench.erm.augment.augment,
against the plain per-image Python loop over the same transforms as the simple baseline.

    .venv/bin/python bench/bench_methods.py --out bench/results/methods.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from shiftbench.erm.augment import augment
from shiftbench.erm.data import normalize
from shiftbench.erm.methods import METHODS, build_method
from shiftbench.erm.models import build_model
from shiftbench.erm.objective import Batch, update

PARAMS = {"groupdro_eta": 0.01, "irm_lambda": 100.0, "irm_anneal_iters": 500, "coral_lambda": 1.0, "lr": 1e-3}
PARAMS |= {"cdann_lambda": 1.0, "cdann_d_steps_per_g": 1, "cdann_grad_penalty": 0.0, "cdann_beta1": 0.5}
PARAMS |= {"cdann_mlp_width": 256, "cdann_mlp_depth": 3, "cdann_mlp_dropout": 0.0, "cdann_weight_decay_d": 0.0}
PARAMS |= {"features": 256, "classes": 3, "causirl_mmd_gamma": 1.0}  # the small CNN's features, the classes
PARAMS |= {"mixup_alpha": 0.2, "sagnet_w_adv": 0.1, "weight_decay": 0.0}


def median_seconds(step: object, repeats: int) -> float:
    assert callable(step)
    step()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def training_step(name: str, x: torch.Tensor, y: torch.Tensor, g: torch.Tensor) -> Callable[[], None]:
    """One optimisation step of the small CNN with method ``name`` (features captured for CORAL), as the training
    step makes it (shiftbench.erm.objective.update; Mixup's pairs and SagNet's three updates included)."""
    model = build_model("small_cnn", 3, 32)
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)
    method = build_method(name, np.arange(9).repeat(10), 9, PARAMS, torch.device("cpu"))
    captured: list[torch.Tensor] = []
    head = model.get_submodule("fc")
    if method.needs_features:
        head.register_forward_hook(lambda _m, inputs, _o: captured.append(inputs[0]))

    def step() -> None:
        x_normal = normalize(x, channels_last=False)
        update(method, Batch(model, head, x_normal, y, g, 1, captured, contextlib.nullcontext), optimizer)

    return step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    x_uint8 = torch.randint(0, 256, (128, 3, 32, 32), dtype=torch.uint8)
    y = torch.randint(0, 3, (128,))
    g = torch.randint(0, 9, (128,))
    results: dict[str, dict[str, float]] = {"step_ms": {}, "augment_ms": {}}
    for name in METHODS:
        results["step_ms"][name] = 1000 * median_seconds(training_step(name, x_uint8, y, g), args.repeats)
    generator = torch.Generator().manual_seed(0)
    for kind in ("none", "flip_rot90", "domainbed"):
        results["augment_ms"][kind] = 1000 * median_seconds(lambda k=kind: augment(x_uint8, k, generator), args.repeats)
    # The simple alternative: the same DomainBed transform applied image by image in a Python loop.
    results["augment_ms"]["domainbed_per_image_loop"] = 1000 * median_seconds(
        lambda: torch.cat([augment(x_uint8[i : i + 1], "domainbed", generator) for i in range(128)]), args.repeats
    )
    results["machine"] = {"cpus": float(torch.get_num_threads())}
    report = {**results, "python": platform.python_version(), "torch": torch.__version__}
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
