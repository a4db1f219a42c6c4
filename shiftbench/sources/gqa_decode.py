"""Decoding GQA scene-graph files into columnar, integer-coded parts, in worker processes.

msgspec decodes with the GIL held, so threads do not decode side by side: files (or the two halves of one
large file) are decoded in processes, each returning its images and objects as Arrow and numpy arrays
(names and attributes as codes into small dictionaries, object ids as one Arrow string column): the part's
structs live only in the worker, while its columns are made. The parent joins the parts in file order
(:mod:`shiftbench.sources.scene_graphs`).
This module imports only what a worker needs (msgspec, numpy, pyarrow), so that a spawned worker starts fast.

Strictness is the reader's: bad JSON names the file and line, wrong types name the image and the object.
"""

from __future__ import annotations

import gc
import hashlib
import json
import re
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


def _not_utf8(path: Path, data: bytes) -> InputError:
    """The first byte that is not UTF-8, by line (slow path: only after the decoder refused the file)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return InputError(
            f"not UTF-8 ({exc.reason} at byte {exc.start:,})", path=path, line=data.count(b"\n", 0, exc.start) + 1
        )
    return InputError("not UTF-8", path=path)


def _refuse_repeated_images(path: Path, data: bytes, n_images: int) -> None:
    """A JSON object that names one image twice decodes to one of them: refuse the file instead, naming the image.

    Every scene graph has one ``"objects"`` key, so a file whose text holds more of them than it decoded images
    may repeat an image (one ``bytes.count``: 0.1 s for 200 MB). Only then is it parsed again, in Python, to find
    the repeated image id (an object or attribute named "objects" also gets here, and passes).
    """
    if data.count(b'"objects"') <= n_images or len(_OBJECTS_KEY.findall(data)) <= n_images:
        return
    repeated: list[str | None] = []  # per JSON object, its first repeated key; the top-level object comes last

    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        seen: set[str] = set()
        first = None
        for key, _ in items:
            if key in seen:
                first = key
                break
            seen.add(key)
        repeated.append(first)
        return dict(items)

    json.loads(data, object_pairs_hook=pairs)
    if repeated and repeated[-1] is not None:
        key = repeated[-1]
        found = re.finditer(rb'"' + re.escape(json.dumps(key)[1:-1].encode()) + rb'"\s*:\s*\{', data)
        lines = [str(data.count(b"\n", 0, match.start()) + 1) for match in found][:2]
        where = f" (lines {' and '.join(lines)})" if len(lines) == 2 else ""
        raise InputError(f"image {key!r} is defined twice in this file{where}", path=path)


_OBJECTS_KEY = re.compile(rb'"objects"\s*:')


class _Codes(dict[str, int]):
    """Strings to codes in the order first met: a new string gets the next code."""

    def __missing__(self, key: str) -> int:
        code = self[key] = len(self)
        return code


def _scenes(path: Path, data: bytes, part: int, parts: int) -> tuple[list[str], list[_SceneGraph]]:
    """The image ids and scene graphs of images ``part`` of ``parts`` of one file, in file order.

    A whole file is decoded by msgspec in one call (about twice as fast); a part of a large file from the
    top-level mapping's raw slices, one image per call. Whatever the decoder refuses is found again image by image,
    to name the image and the object.
    """
    empty = InputError("no scene graphs: the file maps no image id to a scene graph", path=path)
    if parts == 1:
        try:
            whole = msgspec.json.decode(data, type=dict[str, _SceneGraph])
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass  # found again below, with the image and object named
        except UnicodeDecodeError:
            raise _not_utf8(path, data) from None
        else:
            if not whole:
                raise empty
            _refuse_repeated_images(path, data, len(whole))
            return list(whole), list(whole.values())
    try:
        scenes = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    except msgspec.DecodeError as exc:
        if "UTF-8" in str(exc):  # msgspec >= 0.23 says so itself (before: UnicodeDecodeError)
            raise _not_utf8(path, data) from None
        line, message = _json_error_location(path)
        raise InputError(f"invalid scene-graph JSON: {message}", path=path, line=line) from None
    except UnicodeDecodeError:
        raise _not_utf8(path, data) from None
    except msgspec.ValidationError:
        raise InputError(
            "invalid scene-graph JSON: expected a JSON object mapping image ids to scene graphs", path=path
        ) from None
    if not scenes:
        raise empty
    if part == 0:  # one worker checks the whole file
        _refuse_repeated_images(path, data, len(scenes))
    keys = list(scenes)
    keys = keys[part * len(keys) // parts : (part + 1) * len(keys) // parts]
    try:
        return keys, [_DECODE_SCENE(scenes[image_id]) for image_id in keys]
    except msgspec.ValidationError:
        pass
    except UnicodeDecodeError:
        raise _not_utf8(path, data) from None
    except msgspec.DecodeError as exc:  # msgspec >= 0.23: invalid UTF-8 inside an image's raw slice
        if "UTF-8" in str(exc):
            raise _not_utf8(path, data) from None
        raise
    for image_id in keys:  # slow path: which image
        try:
            _DECODE_SCENE(scenes[image_id])
        except msgspec.ValidationError as exc:
            raise InputError(_scene_problem(image_id, bytes(scenes[image_id]), str(exc)), path=path) from None
    raise AssertionError("the decoder refused a part but none of its images")  # pragma: no cover


def decode_part(path: Path, part: int = 0, parts: int = 1) -> DecodedPart:
    """Images ``part`` of ``parts`` (equal shares, in file order) of one GQA ``*_sceneGraphs.json`` file."""
    if not path.is_file():
        raise InputError("scene-graph file not found", path=path, parameter="SHIFTBENCH_GQA_SCENE_GRAPHS")
    data = path.read_bytes()
    file_sha256 = hashlib.sha256(data).hexdigest() if part == 0 else None
    # Columnar and integer-coded while reading: one flat comprehension per column over all of the part's objects
    # (a loop step per image cost more than the decoding at 100x, 2.5 objects an image); names and attributes
    # become codes into dictionaries, one dict lookup per string. The part's objects exist as msgspec structs (no
    # cycles, not tracked) until the columns are made. The cyclic collector is off meanwhile: it would re-walk
    # every list built so far, many times over.
    collecting = gc.isenabled()
    gc.disable()
    try:
        image_ids, scenes = _scenes(path, data, part, parts)
        del data
        found = [scene.objects for scene in scenes]
        objects = [obj for per_image in found for obj in per_image.values()]
        names, attributes = _Codes(), _Codes()
        name_code = np.fromiter([names[obj.name] for obj in objects], dtype=np.int32, count=len(objects))
        if not all(name.strip() for name in names):
            raise InputError(_blank_name(image_ids, found), path=path)
        attribute_code = np.array(
            [attributes[a] for obj in objects if obj.attributes for a in obj.attributes], dtype=np.int32
        )
        attribute_count = np.fromiter(
            [len(obj.attributes) if obj.attributes else 0 for obj in objects], dtype=np.int64, count=len(objects)
        )
        counts = np.fromiter(map(len, found), dtype=np.int64, count=len(found))
        decoded = DecodedPart(
            image_ids=pa.array(image_ids, type=pa.large_string()),
            locations=pa.array([scene.location for scene in scenes], type=pa.large_string()),
            weathers=pa.array([scene.weather for scene in scenes], type=pa.large_string()),
            object_ids=pa.array([key for per_image in found for key in per_image], type=pa.large_string()),
            object_image=np.repeat(np.arange(len(counts), dtype=np.int32), counts),
            names=list(names),
            name_code=name_code,
            attributes=list(attributes),
            attribute_code=attribute_code,
            attribute_offsets=np.r_[0, np.cumsum(attribute_count)],
            file_sha256=file_sha256,
        )
    finally:
        if collecting:
            gc.enable()
    return decoded


def _blank_name(image_ids: list[str], found: list[dict[str, _SceneObject]]) -> str:
    """The first object (in file order) whose name is empty or blank (slow path: only after one was seen)."""
    for image_id, per_image in zip(image_ids, found, strict=True):
        for object_id, obj in per_image.items():
            if not obj.name.strip():
                return f"image {image_id!r}, object {object_id!r}: object 'name' is empty"
    raise AssertionError("a blank name without an object")  # pragma: no cover
