"""Our hand-written models stay loadable with torchvision checkpoints and give torchvision's outputs (models.py,
convnets.py and vit.py promise it): the ResNets, and BREEDS Table 13's and ConDS Table 1's other architectures.

The shape test compares against a snapshot of torchvision's state dicts that
``bench/bench_torchvision.py --write-snapshot tests/data/torchvision_resnet_state.json`` writes in
a venv with torchvision (the CPU torch here cannot load torchvision). The numerical test builds torchvision's
model in .venv-clients (scripts/clients_env.sh, where torchvision loads) and loads its weights into ours here; it
fails where CI requires the clients (SHIFTBENCH_REQUIRE_CLIENTS), else skips naming the script. One client process per
test worker serves every architecture (importing torch and torchvision took 4 s of each test).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, cast

import pytest
import torch

from shiftbench.erm.models import build_model

SNAPSHOT = Path(__file__).parent / "data" / "torchvision_resnet_state.json"
RESNETS = ["resnet18", "resnet50"]
ARCHITECTURES = [*RESNETS, "resnet34", "resnet101", "alexnet", "vgg11", "densenet121", "vit_b_16"]


@pytest.mark.parametrize("name", RESNETS)
def test_state_dict_matches_torchvision_snapshot(name: str) -> None:
    snapshot = json.loads(SNAPSHOT.read_text())
    expected = snapshot["models"][name]
    ours = {k: list(v.shape) for k, v in build_model(name, snapshot["num_classes"], 224).state_dict().items()}
    assert list(ours) == list(expected), "parameter names or their order differ from torchvision's"
    assert ours == expected


# In .venv-clients (torchvision 0.29.1), for each JSON line [name, out, threads] on stdin: torchvision's model with
# perturbed BatchNorms (fresh ones are all alike, so a swapped layer would not show), an input and torchvision's output,
# saved for this process to load into ours, then "out" on stdout. On as many threads as this process has when it asks
# (ResNet-50's outputs reach 1e3: another summation order moves them by 3e-4). Its first line: torchvision's version.
THEIRS = """
import json
import sys
import torch
import torchvision


def save(name, out):
    torch.manual_seed(0)
    theirs = getattr(torchvision.models, name)(weights=None, num_classes=1000)
    g = torch.Generator().manual_seed(1)
    for module in theirs.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            c = module.num_features
            module.weight.data.copy_(0.5 + torch.rand(c, generator=g))
            module.bias.data.copy_(0.1 * torch.randn(c, generator=g))
            module.running_mean.copy_(0.1 * torch.randn(c, generator=g))
            module.running_var.copy_(0.5 + torch.rand(c, generator=g))
    for parameter in theirs.parameters():  # what starts at zero (ViT's head and class token, biases) made to count
        if not parameter.detach().abs().max() > 0:
            parameter.data.copy_(0.02 * torch.randn(parameter.shape, generator=g))
    theirs.eval()
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = theirs(x)
    torch.save({"state_dict": theirs.state_dict(), "x": x, "expected": expected}, out)


print(torchvision.__version__, flush=True)
for line in sys.stdin:
    name, out, threads = json.loads(line)
    torch.set_num_threads(threads)
    save(name, out)
    print(out, flush=True)
"""
Torchvision = Callable[[str, Path], str]


@pytest.fixture(scope="module")
def torchvision_client(clients_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Torchvision]:
    """THEIRS running in .venv-clients as conftest.run_client runs a client (outside the checkout, no SHIFTBENCH_* or
    PYTHON* variable): a function that has it save an architecture's model, input and output to a file and returns
    torchvision's version; a test failure with the client's stderr if the client stops."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHIFTBENCH_", "PYTHON"))}
    with (tmp_path_factory.mktemp("torchvision_client") / "stderr").open("w+") as stderr:
        client = subprocess.Popen(
            [str(clients_python), "-c", THEIRS], cwd=tempfile.gettempdir(), env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=stderr, text=True,
        )  # fmt: skip
        requests, answers = cast(IO[str], client.stdin), cast(IO[str], client.stdout)

        def answer() -> str:
            line = answers.readline()
            if not line:
                stderr.seek(0)
                pytest.fail(f"client exited {client.wait(timeout=60)}:\n{stderr.read()[-4000:]}")
            return line.strip()

        version = answer()

        def save(name: str, out: Path) -> str:
            with contextlib.suppress(BrokenPipeError):  # the client stopped: answer() says why
                requests.write(json.dumps([name, str(out), torch.get_num_threads()]) + "\n")
                requests.flush()
            assert answer() == str(out)
            return version

        try:
            yield save
        finally:
            with contextlib.suppress(BrokenPipeError):
                requests.close()
            client.wait(timeout=60)


@pytest.mark.clients
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_torchvision_weights_give_the_same_outputs(name: str, torchvision_client: Torchvision, tmp_path: Path) -> None:
    """torchvision's own model (in .venv-clients, where it loads) and its weights loaded into ours: same outputs."""
    saved = tmp_path / "theirs.pt"
    version = torchvision_client(name, saved)
    assert version.startswith("0.29.")  # scripts/clients-requirements.txt's torchvision
    theirs = torch.load(saved, weights_only=True)
    ours = build_model(name, 1000, 224)
    ours.load_state_dict(theirs["state_dict"], strict=True)
    ours.eval()
    with torch.no_grad():
        actual = ours(theirs["x"])
    scale = float(theirs["expected"].abs().max())
    assert scale > 0.01 and theirs["expected"].std() > 0  # a non-trivial output
    torch.testing.assert_close(actual, theirs["expected"], rtol=0, atol=1e-5 * max(1.0, scale))
