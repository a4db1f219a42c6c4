"""A collection's declared scope: which classes it builds, and how many contexts each keeps.

A tag table of Open Images' size has about 20,000 tags, each a class with up to 20,000 contexts; a study
names the classes it cares about (Open Images' 600 boxable classes, say) and caps the contexts per class.
``classes`` (inline) or ``classes_file`` (one class per line, ``#`` comments) restricts the classes;
``max_contexts_per_class`` keeps each class's largest subsets of at least ``min_subset_size`` images (ties by
name). Both are parameters of the version (``benchmarks.params``) and its shift card; a class the annotations
do not have is an error naming the file and line (or the parameter), before anything is built.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from shiftbench.config.textio import read_text
from shiftbench.errors import InputError


@dataclass(frozen=True)
class Scope:
    classes: tuple[str, ...] | None  # sorted; None: every class
    source: str | None  # where the list came from (the file's name, or "inline")
    sha256: str | None  # of the list as given (a file's bytes)
    max_contexts_per_class: int | None

    def params(self) -> dict[str, object]:
        """What the version records (no machine's path: the same list gives the same id anywhere)."""
        if self.classes is None:
            return {"max_contexts_per_class": self.max_contexts_per_class}
        return {
            "classes": list(self.classes),
            "classes_from": self.source,
            "classes_sha256": self.sha256,
            "max_contexts_per_class": self.max_contexts_per_class,
        }


def scope_line(params: Mapping[str, Any]) -> str:
    """The scope of a collection version, from its recorded parameters, as one sentence of its shift card."""
    listed = params.get("classes")
    classes = "every class" if listed is None else f"the {len(listed):,} classes of {params.get('classes_from')}"
    cap = params.get("max_contexts_per_class")
    contexts = (
        f"every context of {params.get('min_subset_size')} or more images"
        if cap is None
        else f"at most the {cap:,} largest contexts of {params.get('min_subset_size')} or more images per class "
        "(ties by name)"
    )
    return f"Scope: {classes}; {contexts}."


def read_class_list(path: Path) -> tuple[list[tuple[str, int]], str]:
    """(class, line) of a class-list file and the SHA-256 of its bytes; a repeated class names both lines."""
    text = read_text(path, what="class list", parameter="classes_file")
    seen: dict[str, int] = {}
    rows = []
    for number, raw in enumerate(text.splitlines(), start=1):
        name = raw.split("#", 1)[0].strip()
        if not name:
            continue
        if name in seen:
            raise InputError(
                f"class {name!r} is listed twice (lines {seen[name]} and {number})", path=path, line=number
            )
        seen[name] = number
        rows.append((name, number))
    if not rows:
        raise InputError("the class list names no class", path=path, parameter="classes_file")
    return rows, hashlib.sha256(text.encode("utf-8")).hexdigest()


def resolve_scope(
    classes: tuple[str, ...] | None, classes_file: str | None, cap: int | None, known: pl.Series
) -> Scope:
    """The declared classes, each checked against ``known`` (the classes the annotations have)."""
    if classes is not None and classes_file is not None:
        raise InputError("give classes or classes_file, not both", parameter="classes_file")
    if classes is None and classes_file is None:
        return Scope(None, None, None, cap)
    known_set = set(known.to_list())
    if classes_file is not None:
        path = Path(classes_file)
        rows, digest = read_class_list(path)
        for name, line in rows:
            if name not in known_set:
                raise InputError(f"unknown class {name!r}{_close(name, known)}", path=path, line=line)
        return Scope(tuple(sorted(name for name, _ in rows)), path.name, digest, cap)
    assert classes is not None
    for name in classes:
        if name not in known_set:
            raise InputError(f"unknown class {name!r}{_close(name, known)}", parameter="classes")
    text = "\n".join(classes)
    return Scope(tuple(sorted(set(classes))), "inline", hashlib.sha256(text.encode()).hexdigest(), cap)


def _close(name: str, known: pl.Series) -> str:
    close = difflib.get_close_matches(name, known.to_list(), n=3, cutoff=0.6)
    return (
        f" (not a class of these annotations; did you mean {', '.join(close)}?)"
        if close
        else (" (not a class of these annotations)")
    )
