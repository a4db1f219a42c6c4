"""Where a split's images are: the one owner of "example id -> image path".

When a family stages a version it records, in the manifest, how its example ids become image
paths (:func:`image_block`): the source, a template (``{}`` is the example id) and the root, or
the setting that names the root when it was not configured at build time. A root inside the warehouse
(generated images in its cache) is recorded relative to it (``root_base: home``), so the split's images are
found after the warehouse is moved; a root outside it (the user's ImageNet) stays absolute. ERM training and the
ImageFolder export read only this block (:func:`resolve_images`); a root given by the user wins.
The training job imports :func:`image_paths` only, so this module stays free of pydantic and torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shiftbench.errors import InputError
from shiftbench.runtime.cache import find_cached, from_home_record, home_record
from shiftbench.runtime.outputs import check_path_template

if TYPE_CHECKING:  # the training job imports this module without pydantic: settings stay out of it
    from shiftbench.config.settings import Settings

STANDIN = "standin"  # generated stand-in images (shiftbench.splits.standin), for splits without real ones


@dataclass(frozen=True)
class ImageSource:
    root: Path
    template: str
    kind: str  # imagenet | gqa | celeba | sprites | user | standin


def image_block(
    source: str, template: str, root: Path | None, setting: str | None = None, *, home: Path | None = None
) -> dict[str, Any]:
    """The manifest's ``images`` entry: ``template.format(example_id)`` is a path under ``root``.

    ``setting`` names the settings field that gives the root when ``root`` is None (e.g. ImageNet
    not configured when the split was built); ``source: standin`` means no real images exist. A root
    inside the warehouse ``home`` is recorded relative to it, with ``root_base: home``.
    """
    block: dict[str, Any] = {"source": source, "template": template, "root": None, "root_setting": setting}
    if root is not None:
        block["root"] = home_record(root, home) if home is not None else str(root)
        if not Path(block["root"]).is_absolute():
            block["root_base"] = "home"
    return block


def resolve_images(
    settings: Settings, manifest: Mapping[str, Any], image_root: str | None = None, path_template: str | None = None
) -> ImageSource:
    """The images of a published split: the user's root, the manifest's, or the setting it names.

    Kind ``standin`` (asked for with ``image_root="standin"``, or a split of generated data that has
    no real images) has no root yet: the caller renders the stand-ins.
    """
    if path_template is not None:
        check_path_template(path_template, "--path-template")
    if image_root == STANDIN:
        return ImageSource(Path(), "{}.png", STANDIN)
    block = manifest.get("images")
    if not isinstance(block, Mapping):
        raise InputError(
            f"version {manifest.get('version')} records no image source: pass --image-root and --path-template",
            parameter="image_root",
        )
    template = path_template or str(block["template"])
    if image_root:
        return ImageSource(Path(image_root), template, "user")
    if block["source"] == STANDIN:
        return ImageSource(Path(), "{}.png", STANDIN)
    root = block.get("root")
    setting = block.get("root_setting")
    if root is None and setting:
        configured = settings.value(str(setting))
        root = str(configured) if configured is not None else None
    if root is None:
        hint = f"set SHIFTBENCH_{str(setting).upper()}" if setting else "pass --image-root"
        raise InputError(
            f"the {block['source']} images of {manifest.get('benchmark')} are not configured: {hint}",
            parameter="image_root",
        )
    if block.get("root_base") == "home":  # inside the warehouse, wherever it is now
        return ImageSource(from_home_record(str(root), settings.home), template, str(block["source"]))
    # An older manifest's absolute root: as written, or, gone since the warehouse moved, its cache folder here.
    return ImageSource(find_cached(str(root), settings.home, settings.cache_dir), template, str(block["source"]))


def image_paths(example_ids: Sequence[str], image_root: Path, template: str) -> list[Path]:
    """Where each example's image is; fails listing how many are missing and the first ones."""
    if not image_root.is_dir():
        raise InputError("image root is not a directory", path=image_root, parameter="image_root")
    paths = [image_root / template.format(example_id) for example_id in example_ids]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        first = ", ".join(str(p) for p in missing[:3])
        raise InputError(
            f"{len(missing):,} of {len(paths):,} images are missing (template {template!r}); first: {first}",
            path=image_root,
            parameter="image_root",
        )
    return paths
