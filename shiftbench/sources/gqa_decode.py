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
import json
from array import array
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


def decode_part(path: Path, part: int = 0, parts: int = 1) -> DecodedPart:
    """Images ``part`` of ``parts`` (equal shares, in file order) of one GQA ``*_sceneGraphs.json`` file."""
    if not path.is_file():
        raise InputError("scene-graph file not found", path=path, parameter="SHIFTBENCH_GQA_SCENE_GRAPHS")
    data = path.read_bytes()
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
        raise InputError("no scene graphs: the file maps no image id to a scene graph", path=path)
    keys = list(scenes)
    share = keys[part * len(keys) // parts : (part + 1) * len(keys) // parts]
    # Columnar and integer-coded while reading: names and attributes become codes into dictionaries (one
    # dict lookup per string, no Python object kept per object). The cyclic collector is off for the loop:
    # it would re-walk every list built so far, many times over (nothing here makes a reference cycle).
    locations: list[str | None] = []
    weathers: list[str | None] = []
    object_ids: list[str] = []
    object_image, name_code, attribute_code = array("i"), array("i"), array("i")
    attribute_offsets = array("q", [0])
    name_codes: dict[str, int] = {}
    attribute_codes: dict[str, int] = {}
    collecting = gc.isenabled()
    gc.disable()
    try:
        for index, image_id in enumerate(share):
            raw = scenes[image_id]
            try:
                scene = _DECODE_SCENE(raw)
            except msgspec.ValidationError as exc:
                raise InputError(_scene_problem(image_id, bytes(raw), str(exc)), path=path) from None
            locations.append(scene.location)
            weathers.append(scene.weather)
            found = scene.objects
            object_ids.extend(found)
            object_image.extend([index] * len(found))
            for object_id, obj in found.items():
                code = name_codes.get(obj.name)
                if code is None:
                    if not obj.name.strip():
                        raise InputError(f"image {image_id!r}, object {object_id!r}: object 'name' is empty", path=path)
                    code = name_codes[obj.name] = len(name_codes)
                name_code.append(code)
                if obj.attributes:
                    attribute_code.extend([attribute_codes.setdefault(a, len(attribute_codes)) for a in obj.attributes])
                attribute_offsets.append(len(attribute_code))
    finally:
        if collecting:
            gc.enable()
    return DecodedPart(
        image_ids=pa.array(share, type=pa.large_string()),
        locations=pa.array(locations, type=pa.large_string()),
        weathers=pa.array(weathers, type=pa.large_string()),
        object_ids=pa.array(object_ids, type=pa.large_string()),
        object_image=np.frombuffer(object_image, dtype=np.int32).copy(),
        names=list(name_codes),
        name_code=np.frombuffer(name_code, dtype=np.int32).copy(),
        attributes=list(attribute_codes),
        attribute_code=np.frombuffer(attribute_code, dtype=np.int32).copy(),
        attribute_offsets=np.frombuffer(attribute_offsets, dtype=np.int64).copy(),
    )
