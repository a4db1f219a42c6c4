"""How close the image protocols are to their references, on real photographs: the figures behind
tests/test_photo_transforms.py, recorded.

    .venv/bin/python bench/bench_photo_fidelity.py [--record bench/figures/photo_fidelity.json]

The same photographs, reference script and draws as the test (tests/real_photos.py; .venv-clients runs the robustness
library's objects and DomainBed's transforms). Recorded per protocol: the largest difference of any evaluation image
and of any seeded training image from the reference's (grey levels), how many photographs are equal to the grey
level, and every two-sample KS p-value of the crop and jitter parameters (10,000 draws, another seed than the
reference's), with the smallest. And what ``prepared_side: 256`` costs in fidelity: the same draws' training images
cut from a copy whose shorter side is 256 against those cut from the photograph (the reference's pixels), grey levels.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from scipy.stats import ks_2samp

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))
sys.path.insert(0, str(PROJECT / "bench"))

import records  # noqa: E402

from shiftbench.erm import photo_draws as pd  # noqa: E402
from shiftbench.erm import photo_pixels as pp  # noqa: E402
from shiftbench.erm.prepared import crop_from  # noqa: E402
from shiftbench.erm.protocols import PROTOCOLS  # noqa: E402
from tests.real_photos import make_photos  # noqa: E402
from tests.test_photo_transforms import DRAWS, REFERENCE, SIZES  # noqa: E402

CLIENTS_PYTHON = PROJECT / ".venv-clients" / "bin" / "python"


def _reference(photos: list[Path], out: Path) -> dict[str, np.ndarray]:
    args = [json.dumps([str(p) for p in photos]), str(out), str(DRAWS), json.dumps(SIZES)]
    subprocess.run(
        [str(CLIENTS_PYTHON), "-c", REFERENCE, *args], check=True, capture_output=True, cwd=tempfile.gettempdir()
    )
    with np.load(out) as loaded:
        return {key: loaded[key] for key in loaded.files}


def _pixels(name: str, photos: list[Path], reference: dict[str, np.ndarray]) -> dict[str, object]:
    protocol, base = PROTOCOLS[name], 1000 if name == "robustness_imagenet" else 2000
    evaluation, training = [], []
    for k, path in enumerate(photos):
        image = pp.open_photo(path)
        ours = pp.eval_pixels(image, protocol, 224).astype(np.int16)
        evaluation.append(int(np.abs(ours - reference[f"eval/{name}/{k}"]).max()))
        sample = pd.draw(*image.size, protocol.train, torch.Generator().manual_seed(base + k))
        pixels = pp.train_pixels(image, sample, 224)
        theirs = reference[f"train/{name}/{k}"]
        if protocol.train.lighting:
            x = pd.lighting(
                torch.from_numpy(pixels.copy()).float().div(255).unsqueeze(0), torch.tensor([sample.alphas])
            )
            training.append(float(np.abs(x[0].numpy() - theirs).max()) * 255)
        else:
            training.append(float(np.abs(pixels.astype(np.int16) - theirs).max()))
    return {"eval_max": max(evaluation), "eval_equal": sum(d == 0 for d in evaluation), "train_max": max(training),
            "photos": len(photos)}  # fmt: skip


def _p_values(name: str, reference: dict[str, np.ndarray]) -> dict[str, float]:
    transform, found = PROTOCOLS[name].train, {}
    for w, h in SIZES:
        generator = torch.Generator().manual_seed(8)
        ours = np.array([pd.crop_box(w, h, transform.scale, transform.ratio, generator) for _ in range(DRAWS)])
        theirs = reference[f"crop/{name}/{w}x{h}"]
        for c, part in enumerate(("top", "left", "height", "width")):
            found[f"crop {w}x{h} {part}"] = float(ks_2samp(ours[:, c], theirs[:, c]).pvalue)
    return found


def _smaller_copy(photos: list[Path], side: int = 256, draws: int = 20) -> dict[str, float]:
    """Training images (robustness_imagenet at 224, no lighting) from a copy at ``side`` against the photograph's."""
    protocol, differences = PROTOCOLS["robustness_imagenet"], []
    for k, path in enumerate(photos):
        image = pp.open_photo(path)
        copy = pp.shorter_side_to(image, side) if min(image.size) > side else image
        generator = torch.Generator().manual_seed(3000 + k)
        for _ in range(draws):
            sample = pd.draw(*image.size, protocol.train, generator)
            exact = pp.train_pixels(image, sample, 224).astype(np.int16)
            approximate = pp.to_array(pp.finish(crop_from(copy, image.size, sample, 224), sample)).astype(np.int16)
            differences.append(np.abs(exact - approximate).ravel())
    every = np.concatenate(differences)
    return {"mean": float(every.mean()), "p99": float(np.percentile(every, 99)), "max": int(every.max()),
            "images": len(differences)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    records.add_argument(parser)
    args = parser.parse_args()
    recording = records.start(args.record)
    with tempfile.TemporaryDirectory() as tmp:
        photos = make_photos(CLIENTS_PYTHON, Path(tmp) / "photos")
        reference = _reference(photos, Path(tmp) / "reference.npz")
        figures = {}
        for name in PROTOCOLS:
            pixels, p_values = _pixels(name, photos, reference), _p_values(name, reference)
            recording.run(protocol=name, **pixels, p_values=p_values)
            smallest = min(p_values, key=lambda k: p_values[k])
            figures[name] = {
                "what": f"{name}: largest difference from the reference (grey levels) and the smallest KS p-value",
                "figure": f"evaluation: max {pixels['eval_max']} ({pixels['eval_equal']} of {pixels['photos']} "
                f"photographs equal); seeded training: max {pixels['train_max']:.3f}; crop parameters: smallest KS "
                f"p {p_values[smallest]:.3f} ({smallest}) of {len(p_values)}",
                "median": pixels["eval_max"],
            }
            print(f"{name}: {figures[name]['figure']}")
        smaller = _smaller_copy(photos)
        recording.run(protocol="robustness_imagenet", prepared_side=256, **smaller)
        figures["prepared_side_256"] = {
            "what": "prepared_side 256: training images cut from the smaller copy against the reference's (the "
            "photograph's), robustness_imagenet at 224, grey levels over every pixel",
            "figure": f"mean {smaller['mean']:.2f}, 99th percentile {smaller['p99']:.0f}, max {smaller['max']} grey "
            f"levels over {smaller['images']} training images",
            "median": smaller["mean"],
        }
        print(f"prepared_side 256: {figures['prepared_side_256']['figure']}")
    recording.save("the image protocols against their references on real photographs", figures)


if __name__ == "__main__":
    main()
