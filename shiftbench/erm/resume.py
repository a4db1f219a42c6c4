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
key but ``checkpoint_every``), same images, same init checkpoint (by SHA-256), same training code (a hash of the
source of every module the job imports) and torch version; the identity is in ``state.json`` and in the state file
itself, and both must match. Anything else, a file whose bytes fail the SHA-256 in ``state.json`` (or the CRC-32 of
its zip members), a record or a state of another structure, is refused in one line naming the file and what
differs (exit 2); ``shiftbench train --restart`` (or deleting the folder) discards it. The job discards the folder
(renamed away, then deleted: :func:`shiftbench.erm.run_folder.discard_checkpoints`) once its outputs are written.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shiftbench.erm import run_folder
from shiftbench.erm.checkpoints import read as read_checkpoint
from shiftbench.erm.run_folder import write_atomically
from shiftbench.errors import InputError

FORMAT = 2  # 2: the state file carries the identity too (a record's identity alone is only its own word)
# The largest share of a run's time periodic checkpoints may take (shiftbench.erm.run.Resumable.due).
MAX_OVERHEAD = 0.02
FOLDER = "resume"
STATE = "state.json"
UNBOUND = run_folder.UNBOUND
DISCARD = (
    "rerun with --restart (shiftbench train; restart: true in Dagster's launchpad) or delete {folder} to discard it"
)
_PACKAGE = Path(__file__).resolve().parent
# The source a run's bytes depend on: every shiftbench module the job imports (the training package, the images and
# their decoding, the split table, the metrics, the seeds and the groups); tests/test_resume.py checks the list
# against what ``python -m shiftbench.erm.job`` really imports.
JOB_MODULES = (
    "errors", "runtime.cache", "runtime.cpus", "runtime.outputs", "runtime.progress", "runtime.seeding",
    "scoring.grouper", "scoring.method_names", "scoring.metrics", "scoring.training_conflicts", "splits.images",
    "splits.split_dataset", "splits.split_table",
)  # fmt: skip
# A module's file, and its package's __init__ (a docstring, but imported with it).
_CODE = (
    *sorted(_PACKAGE.glob("*.py")),
    *sorted({_PACKAGE.parent / f"{name.replace('.', '/')}.py" for name in JOB_MODULES}
            | {_PACKAGE.parent / name.split(".")[0] / "__init__.py" for name in JOB_MODULES if "." in name}),
)  # fmt: skip
_FILE = re.compile(r"state-\d{9}\.pt")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# What a checkpoint's state holds (shiftbench.erm.loop.Loop.snapshot) and the type of each entry.
STATE_KEYS: dict[str, type | tuple[type, ...]] = {
    "iteration": int, "pending": bool, "model": dict, "step": dict, "method": dict, "stream": dict,
    "augment": torch.Tensor, "random": dict, "running_seen": int, "grid": dict, "selected": dict,
    "identity": dict, "tracker": (dict, type(None)),
}  # fmt: skip
NESTED_KEYS = {
    "grid": {"index", "scores", "best"},
    "selected": {"best_state", "best_score", "best_iteration", "patience_left", "curve"},
}


@cache
def code_hash() -> str:
    """SHA-256 over the training code's source files: a checkpoint of other code is refused, never continued."""
    digest = hashlib.sha256()
    for path in _CODE:
        digest.update(path.relative_to(_PACKAGE.parent).as_posix().encode() + b"\0" + path.read_bytes())
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
        "torch": str(torch.__version__),  # a plain string: the state file carries the identity too
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

    def _damaged(self, what: str, path: Path | None = None) -> InputError:
        return InputError(
            f"{what}: {DISCARD.format(folder=self.folder)}; the run then starts over", path=path or self.state_path
        )

    def load(self) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The checkpoint's state and its record (``state.json``), checked; None when there is none. Anything
        that is not this run's intact checkpoint is one line naming the file (:class:`InputError`), never a
        traceback: a record or folder of the wrong kind, another run's identity in the record or in the state
        file itself, a file failing its SHA-256 or CRC-32, a state of another structure."""
        if os.path.lexists(self.folder) and not self.folder.is_dir():
            raise self._damaged("damaged checkpoint (not a folder)", self.folder)
        if not os.path.lexists(self.state_path):
            return None
        record = self._record()
        differ = differences(record["identity"], self.identity)
        if differ:
            raise InputError(
                f"checkpoint of another run ({'; '.join(differ)}): {DISCARD.format(folder=self.folder)}",
                path=self.state_path,
            )
        path = self.folder / record["file"]
        try:
            data = read_checkpoint(path).data  # a zip member failing its CRC-32 is refused there
        except InputError as exc:
            raise self._damaged(f"damaged checkpoint ({exc.message})", path) from None
        digest = hashlib.sha256(data).hexdigest()
        if digest != record["sha256"]:
            raise self._damaged(
                f"damaged checkpoint: SHA-256 {digest[:12]}... is not the {record['sha256'][:12]}... {STATE} recorded",
                path,
            )
        return self._state(data, record, path), record

    def _record(self) -> dict[str, Any]:
        """``state.json``, every field of the type a checkpoint writes."""
        try:
            record = json.loads(self.state_path.read_text("utf-8"))
            _check_record(record)
        except (OSError, ValueError, TypeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise InputError(
                f"damaged checkpoint record ({reason}): {DISCARD.format(folder=self.folder)}", path=self.state_path
            ) from None
        return dict(record)

    def _state(self, data: bytes, record: dict[str, Any], path: Path) -> dict[str, Any]:
        """The state file's contents, of the structure a checkpoint writes and naming this run as its own."""
        try:
            state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises pickle's, its own and zip errors: all mean "not a checkpoint"
            raise self._damaged(f"damaged checkpoint (unreadable: {type(exc).__name__})", path) from None
        wrong = _state_problem(state)
        if wrong is not None:
            raise self._damaged(f"damaged checkpoint ({wrong}): not a checkpoint this job writes", path)
        if state["iteration"] != record["iteration"]:
            raise self._damaged(
                f"damaged checkpoint (its iteration {state['iteration']} is not the {record['iteration']} {STATE} "
                "recorded)",
                path,
            )
        differ = differences(state["identity"], self.identity)
        if differ:
            raise InputError(
                f"checkpoint of another run, whatever {STATE} says (the file's own identity: {'; '.join(differ)}): "
                f"{DISCARD.format(folder=self.folder)}",
                path=path,
            )
        return dict(state)

    def save(self, state: dict[str, Any], iteration: int) -> int:
        """Write ``state`` as the run's checkpoint at ``iteration`` (file, then record: each atomically); the
        previous files are deleted after the record points to the new one. Returns the file's size. The file
        carries the run's identity too, so a record copied from another run cannot vouch for it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        torch.save({**state, "identity": self.identity}, buffer)
        data = buffer.getvalue()
        name = f"state-{iteration:09d}.pt"
        write_atomically(self.folder / name, data)
        record = {
            "format": FORMAT, "file": name, "iteration": iteration, "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data), "identity": self.identity,
        }  # fmt: skip
        write_atomically(self.state_path, json.dumps(record, indent=1, sort_keys=True).encode())
        for old in self.folder.glob("state-*.pt"):
            if old.name != name:
                old.unlink(missing_ok=True)
        return len(data)


def _check_record(record: Any) -> None:
    """Raise ValueError naming the first field of ``state.json`` that a checkpoint would not have written."""
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    if record.get("format") != FORMAT:
        raise ValueError(f"format {record.get('format')!r}, this job reads {FORMAT}: written by another shiftbench")
    checks: dict[str, Callable[[Any], bool]] = {
        "file": lambda v: isinstance(v, str) and _FILE.fullmatch(v) is not None,
        "iteration": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "sha256": lambda v: isinstance(v, str) and _SHA256.fullmatch(v) is not None,
        "bytes": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "identity": lambda v: isinstance(v, dict),
    }
    for key, valid in checks.items():
        if key not in record:
            raise ValueError(f"no {key!r}")
        if not valid(record[key]):
            raise ValueError(f"{key!r} is not what a checkpoint writes")


def _state_problem(state: Any) -> str | None:
    """What is wrong with a loaded state's structure, if anything (its values are checked when they load)."""
    if not isinstance(state, dict):
        return f"a {type(state).__name__}, not a mapping"
    for key, kind in STATE_KEYS.items():
        if key not in state:
            return f"no {key!r}"
        if not isinstance(state[key], kind) or (kind is int and isinstance(state[key], bool)):
            return f"{key!r} is a {type(state[key]).__name__}"
    for key, fields in NESTED_KEYS.items():
        if set(state[key]) != fields:
            return f"{key!r} holds {', '.join(sorted(map(str, state[key]))) or 'nothing'}"
    return None
