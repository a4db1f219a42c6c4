"""Decoding GQA scene-graph files into columnar, integer-coded parts, in worker processes.

msgspec decodes with the GIL held, so threads do not decode side by side: files (or the two halves of one
large file) are decoded in processes, each returning its images and objects as Arrow and numpy arrays
(names and attributes as codes into small dictionaries, object ids as one Arrow string column), never as a
Python object per object. The parent joins the parts in file order (:mod:`shiftbench.sources.scene_graphs`).
This module imports only what a worker needs (msgspec, numpy, pyarrow), so that a spawned worker starts fast.

Strictness is the reader's: bad JSON names the file and line, wrong types name the image and the object.
"""

from __future__ import annotations

import gc
import hashlib
import json
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa

from shiftbench.errors import InputError


class _SceneObject(msgspec.Struct, gc=False):
    """What MetaShift reads of a GQA object (the decoder skips boxes, relations and anything else)."""

    name: str
    attributes: list[str] | None = None


class _SceneGraph(msgspec.Struct, gc=False):
    objects: dict[str, _SceneObject]
    location: str | None = None
    weather: str | None = None


_DECODE_SCENE = msgspec.json.Decoder(_SceneGraph).decode
_DECODE_OBJECT = msgspec.json.Decoder(_SceneObject).decode


@dataclass(frozen=True)
class DecodedPart:
    """Images ``first..`` of one file, in file order, and their objects, in file order."""

    image_ids: pa.Array  # large_string
    locations: pa.Array  # large_string, NULL when absent
    weathers: pa.Array
    object_ids: pa.Array  # large_string
    object_image: np.ndarray  # int32: the object's image, as a position in ``image_ids``
    names: list[str]  # the part's object names, in the order first met
    name_code: np.ndarray  # int32 into ``names``
    attributes: list[str]  # the part's attributes, in the order first met
    attribute_code: np.ndarray  # int32 into ``attributes``, objects' lists one after the other
    attribute_offsets: np.ndarray  # int64, one more than objects: object k's codes are [offsets[k], offsets[k+1])
    file_sha256: str | None = None  # the file's hash, of the bytes decoded (by part 0 only: parts hash side by side)


def _json_error_location(path: Path) -> tuple[int | None, str]:
    """Line and message of the first syntax error (slow path: only after the decoder refused the file)."""
    try:
        with path.open(encoding="utf-8") as handle:
            json.load(handle)
    except json.JSONDecodeError as exc:
        return exc.lineno, exc.msg
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 ({exc.reason})"
    return None, "unreadable"


def _object_problem(error: str) -> str:
    """msgspec's message about one object, in the words of this reader."""
    if "missing required field `name`" in error:
        return "object without 'name'"
    if error.endswith("`$.name`"):
        return "object 'name' is not a string"
    if "`$.attributes[" in error:
        return "'attributes' holds a non-string value"
    if error.endswith("`$.attributes`"):
        return "'attributes' is not a list"
    return "object is not a JSON object"


def _scene_problem(image_id: str, raw: bytes, error: str) -> str:
    """Where in one image's scene graph the decoder stopped, naming the image and the object (slow path:
    msgspec's path does not name dictionary keys, so the image is decoded again, object by object)."""
    where = f"image {image_id!r}"
    if "`$.objects[" not in error:
        if "missing required field `objects`" in error:
            return f"{where}: missing 'objects'"
        if error.endswith("`$.objects`"):
            return f"{where}: 'objects' is not a JSON object"
        for field in ("location", "weather"):
            if error.endswith(f"`$.{field}`"):
                return f"{where}: '{field}' is not a string"
        return f"{where}: scene graph is not a JSON object"
    objects = msgspec.json.decode(raw)["objects"]
    for object_id, value in objects.items():
        try:
            _DECODE_OBJECT(msgspec.json.encode(value))
        except msgspec.ValidationError as exc:
            return f"{where}, object {object_id!r}: {_object_problem(str(exc))}"
    return f"{where}: {error}"


class _Codes(dict[str, int]):
    """Strings to codes in the order first met: a new string gets the next code."""

    def __missing__(self, key: str) -> int:
        code = self[key] = len(self)
        return code


def _scenes(path: Path, data: bytes, part: int, parts: int) -> Iterator[tuple[str, _SceneGraph]]:
    """The (image id, scene graph) pairs of images ``part`` of ``parts`` of one file, in file order.

    A whole small file is decoded by msgspec in one call (about twice as fast); a part of a large file, or a file
    the one call refused, one image at a time from the top-level mapping's raw slices, which finds the bad image.
    """
    empty = InputError("no scene graphs: the file maps no image id to a scene graph", path=path)
    if parts == 1:
        try:
            whole = msgspec.json.decode(data, type=dict[str, _SceneGraph])
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass  # found again below, with the image and object named
        else:
            if not whole:
                raise empty
            yield from whole.items()
            return
    try:
        scenes = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    except msgspec.DecodeError:
        line, message = _json_error_location(path)
        raise InputError(f"invalid scene-graph JSON: {message}", path=path, line=line) from None
    except msgspec.ValidationError:
        raise InputError(
            "invalid scene-graph JSON: expected a JSON object mapping image ids to scene graphs", path=path
        ) from None
    if not scenes:
        raise empty
    keys = list(scenes)
    for image_id in keys[part * len(keys) // parts : (part + 1) * len(keys) // parts]:
        raw = scenes[image_id]
        try:
            yield image_id, _DECODE_SCENE(raw)
        except msgspec.ValidationError as exc:
            raise InputError(_scene_problem(image_id, bytes(raw), str(exc)), path=path) from None


def decode_part(path: Path, part: int = 0, parts: int = 1) -> DecodedPart:
    """Images ``part`` of ``parts`` (equal shares, in file order) of one GQA ``*_sceneGraphs.json`` file."""
    if not path.is_file():
        raise InputError("scene-graph file not found", path=path, parameter="SHIFTBENCH_GQA_SCENE_GRAPHS")
    data = path.read_bytes()
    file_sha256 = hashlib.sha256(data).hexdigest() if part == 0 else None
    # Columnar and integer-coded while reading: names and attributes become codes into dictionaries (one
    # dict lookup per string, in comprehensions: no Python loop step per object, no Python object kept per
    # object). The cyclic collector is off meanwhile: it would re-walk every list built so far, many times over
    # (nothing here makes a reference cycle).
    image_ids: list[str] = []
    locations: list[str | None] = []
    weathers: list[str | None] = []
    object_ids: list[str] = []
    objects_per_image, name_code, attribute_code, attribute_count = array("q"), array("i"), array("i"), array("q")
    names, attributes = _Codes(), _Codes()
    collecting = gc.isenabled()
    gc.disable()
    try:
        for image_id, scene in _scenes(path, data, part, parts):
            image_ids.append(image_id)
            locations.append(scene.location)
            weathers.append(scene.weather)
            found = scene.objects
            objects_per_image.append(len(found))
            object_ids.extend(found)
            known = len(names)
            name_code.extend([names[obj.name] for obj in found.values()])
            if len(names) != known:  # new names: none may be empty
                for object_id, obj in found.items():
                    if not obj.name.strip():
                        raise InputError(f"image {image_id!r}, object {object_id!r}: object 'name' is empty", path=path)
            attribute_code.extend([attributes[a] for obj in found.values() if obj.attributes for a in obj.attributes])
            attribute_count.extend([len(obj.attributes) if obj.attributes else 0 for obj in found.values()])
    finally:
        if collecting:
            gc.enable()
    counts = np.frombuffer(objects_per_image, dtype=np.int64)
    return DecodedPart(
        image_ids=pa.array(image_ids, type=pa.large_string()),
        locations=pa.array(locations, type=pa.large_string()),
        weathers=pa.array(weathers, type=pa.large_string()),
        object_ids=pa.array(object_ids, type=pa.large_string()),
        object_image=np.repeat(np.arange(len(counts), dtype=np.int32), counts),
        names=list(names),
        name_code=np.frombuffer(name_code, dtype=np.int32).copy(),
        attributes=list(attributes),
        attribute_code=np.frombuffer(attribute_code, dtype=np.int32).copy(),
        attribute_offsets=np.r_[0, np.cumsum(np.frombuffer(attribute_count, dtype=np.int64))],
        file_sha256=file_sha256,
    )
