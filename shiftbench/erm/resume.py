"""Checkpoints a training run resumes from, bit-identically on CPU: what is saved, where, and who may use it.

A checkpoint holds everything the run's next iteration depends on: the model, the optimizer and its learning-rate
schedule, the method's state (GroupDRO's group weights), every random generator (torch's CPU and CUDA generators,
numpy's and Python's, the generators of the batch order and of the augmentation), the position in the batch
stream, the running training loss, the curve, the best weights and score so far, the patience left and, with a
learning-rate grid, the grid's finished fits. It is written every ``checkpoint_every`` iterations (less often
where writing one would take more than ``MAX_OVERHEAD`` of the run's time) and when the run is asked to stop
(:mod:`shiftbench.erm.interrupt`), into ``<out_dir>/resume/``:

- ``state-<iteration>.pt``: the state (``torch.save``; loaded with ``weights_only=True``, so a checkpoint runs no
  code), written to a temporary file, flushed to disk (fsync) and renamed;
- ``state.json``: which file is current, its SHA-256 and size, and the identity of the run that wrote it, replaced
  the same way after the file (its rename is the commit: a crash before it leaves the previous checkpoint whole).

A checkpoint is used only by the run that wrote it: same benchmark and split version, same training config (every
key but ``checkpoint_every``), same images, same init checkpoint (by SHA-256), same training code (a hash of its
source files) and torch version. Anything else, and a file whose bytes fail the SHA-256 in ``state.json`` (or the
CRC-32 of its zip members), is refused in one line naming the file and what differs (exit 2); ``shiftbench train
--restart`` (or deleting the folder) discards it. The job deletes the folder once its outputs are written.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shiftbench.erm.checkpoints import read as read_checkpoint
from shiftbench.errors import InputError

FORMAT = 1
# The largest share of a run's time periodic checkpoints may take (shiftbench.erm.run.Resumable.due).
MAX_OVERHEAD = 0.02
FOLDER = "resume"
STATE = "state.json"
# Keys of the training config that do not change a run's bytes: a resumed run may change them.
UNBOUND = frozenset({"checkpoint_every"})
DISCARD = (
    "rerun with --restart (shiftbench train; restart: true in Dagster's launchpad) or delete {folder} to discard it"
)
_PACKAGE = Path(__file__).resolve().parent
# The source a run's numbers depend on: the training package, the seeds and the groups.
_CODE = (*sorted(_PACKAGE.glob("*.py")), _PACKAGE.parent / "seeding.py", _PACKAGE.parent / "grouper.py")


@cache
def code_hash() -> str:
    """SHA-256 over the training code's source files: a checkpoint of other code is refused, never continued."""
    digest = hashlib.sha256()
    for path in _CODE:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def identity(
    benchmark: str, split_version: str, config: Mapping[str, Any], images: Mapping[str, str], init_sha256: str | None
) -> dict[str, Any]:
    """What a checkpoint must share with the run that loads it."""
    return {
        "benchmark": benchmark,
        "split_version": split_version,
        "config": {k: v for k, v in sorted(config.items()) if k not in UNBOUND},
        "images": dict(images),
        "init_sha256": init_sha256,
        "code": code_hash(),
        "torch": torch.__version__,
    }


def differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """What differs between two identities, config keys one by one (``lr 0.001 vs 0.01``: saved, then now)."""
    found = []
    for key in sorted(set(saved) | set(current)):
        old, new = saved.get(key), current.get(key)
        if old == new:
            continue
        if key == "config" and isinstance(old, dict) and isinstance(new, dict):
            changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            found += [f"{k} {old.get(k)!r} vs {new.get(k)!r}" for k in changed]
        elif key == "code":
            found.append("the training code changed")
        else:
            found.append(f"{key} {old!r} vs {new!r}")
    return found


def random_states() -> dict[str, Any]:
    """Every global generator's state (CUDA's when a GPU is in use), as plain values and tensors."""
    kind, keys, position, has_gauss, gauss = np.random.get_state(legacy=True)
    on_gpu = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if on_gpu else [],
        "numpy": [kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), position, has_gauss, gauss],
        "python": random.getstate(),
    }


def restore_random_states(states: Mapping[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    if states["cuda"]:
        torch.cuda.set_rng_state_all(states["cuda"])
    kind, keys, position, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, gauss))
    version, internal, gauss_next = states["python"]
    random.setstate((version, tuple(internal), gauss_next))


@dataclass
class Checkpoints:
    """The run's checkpoint folder and the identity its checkpoints carry."""

    folder: Path
    identity: dict[str, Any]

    @property
    def state_path(self) -> Path:
        return self.folder / STATE

    def load(self) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The checkpoint's state and its record (``state.json``), checked; None when there is none."""
        if not self.state_path.is_file():
            return None
        record = self._record()
        differ = differences(record.get("identity", {}), self.identity)
        if differ:
            raise InputError(
                f"checkpoint of another run ({'; '.join(differ)}): {DISCARD.format(folder=self.folder)}",
                path=self.state_path,
            )
        path = self.folder / str(record["file"])
        damaged = f"{DISCARD.format(folder=self.folder)}; the run then starts over"
        try:
            data = read_checkpoint(path).data  # a zip member failing its CRC-32 is refused there
        except InputError as exc:
            raise InputError(f"damaged checkpoint ({exc.message}): {damaged}", path=path) from None
        digest = hashlib.sha256(data).hexdigest()
        if digest != record["sha256"]:
            raise InputError(
                f"damaged checkpoint: SHA-256 {digest[:12]}... is not the {str(record['sha256'])[:12]}... "
                f"{STATE} recorded: {damaged}",
                path=path,
            )
        state: dict[str, Any] = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        return state, record

    def _record(self) -> dict[str, Any]:
        try:
            record = json.loads(self.state_path.read_text("utf-8"))
            if not isinstance(record, dict) or record.get("format") != FORMAT or "file" not in record:
                raise ValueError(f"not a checkpoint record of format {FORMAT}")
        except (OSError, ValueError) as exc:
            raise InputError(
                f"damaged checkpoint record ({exc}): {DISCARD.format(folder=self.folder)}", path=self.state_path
            ) from None
        return record

    def save(self, state: dict[str, Any], iteration: int) -> int:
        """Write ``state`` as the run's checkpoint at ``iteration`` (file, then record: each atomically); the
        previous files are deleted after the record points to the new one. Returns the file's size."""
        self.folder.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        torch.save(state, buffer)
        data = buffer.getvalue()
        name = f"state-{iteration:09d}.pt"
        _write_atomically(self.folder / name, data)
        record = {
            "format": FORMAT, "file": name, "iteration": iteration, "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data), "identity": self.identity,
        }  # fmt: skip
        _write_atomically(self.state_path, json.dumps(record, indent=1, sort_keys=True).encode())
        for old in self.folder.glob("state-*.pt"):
            if old.name != name:
                old.unlink(missing_ok=True)
        return len(data)


def _write_atomically(path: Path, data: bytes) -> None:
    """Temporary file, fsync, rename, fsync of the folder: the path holds the old bytes or the new, never a mix."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with temporary.open("wb") as sink:
        sink.write(data)
        sink.flush()
        os.fsync(sink.fileno())
    temporary.replace(path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
