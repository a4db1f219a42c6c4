"""What a MetaShift task spec may say (:mod:`shiftbench.metashift.specs`): its communities' members, the roles each
class needs, and a task's own tag.

- A member is a candidate subset ``class(context)`` or a whole class ``class(*)``: every image of the class. Leakage
  rules apply to both (images of ``exclude_images_in`` and images showing two of the task's classes are removed;
  training pools never hold a test image).
- Domain generalization: every class trains on a community of its own; the test split is the test communities.
  A class without a test community is trained on and never tested on (the eight classes that the ten-class task of
  Appendix B.2.1 adds to task 1); the class whose distance d is measured (``distance_class``) needs one.
- A task that had to choose what its paper leaves open carries a tag of its own, written in its key
  (``animals10-dg@whole-class``): its benchmarks are ``NAME-VARIANT@TAG`` (:mod:`shiftbench.specs.naming`: a paper's
  name
  only for the paper's content). The tags shiftbench gives for other sources (``@generated``, ``@tags``,
  ``@gqa-files``) and stand-in runs (``@standin``) are not a spec's to write.
"""

from __future__ import annotations

from typing import Any

from shiftbench.errors import InputError
from shiftbench.metashift.subsets import parse_subset_name
from shiftbench.specs.naming import TAG_SEPARATOR
from shiftbench.store import benchmark_name_problem

WHOLE_CLASS = "*"  # the context of a member that stands for every image of its class: cat(*)
# Tags shiftbench gives to names (shiftbench.metashift.annotations.NAME_TAGS, shiftbench.sources.gqa_release.TAG,
# shiftbench.scoring.provenance.STANDIN): a spec's own tag may not be one of them (tests/test_metashift_multiclass.py).
RESERVED_TAGS = frozenset({"generated", "tags", "gqa-files", "standin"})


def whole_class(class_name: str) -> str:
    """The member that stands for every image of ``class_name``."""
    return f"{class_name}({WHOLE_CLASS})"


def is_whole_class(member: str) -> bool:
    return member.endswith(f"({WHOLE_CLASS})")


def split_key(key: str, source: str, line: int | None) -> tuple[str, str | None]:
    """A task key ``NAME`` or ``NAME@TAG``: its name and its own tag."""
    name, separator, tag = key.partition(TAG_SEPARATOR)
    problem = benchmark_name_problem(key)
    if separator and problem is None and (not name or not tag or TAG_SEPARATOR in tag):
        problem = f"invalid task name {key!r}: write NAME or NAME@TAG (one tag)"
    if problem is None and tag in RESERVED_TAGS:
        problem = (
            f"task {key}: @{tag} is a tag shiftbench gives when the data are not the paper's; a task's own tag says "
            "what the spec chose (e.g. @whole-class)"
        )
    if problem is not None:
        raise InputError(problem, path=source, line=line)
    return name, tag or None


def check_communities(spec: Any, where: str) -> None:
    """Each community of ``spec`` (a metashift TaskSpec: typed Any, the spec module imports this one) is of a class of
    the task and lists members of that class; the roles each kind needs."""
    names = [c.name for c in spec.communities]
    if len(set(names)) != len(names):
        raise InputError(f"{where}: a community name is used twice", parameter="communities")
    for community in spec.communities:
        if community.class_name not in spec.classes:
            raise InputError(
                f"{where}: community {community.name} is of class {community.class_name!r}, "
                f"not one of {', '.join(spec.classes)}",
                parameter="communities",
            )
        if not community.members:
            raise InputError(f"{where}: community {community.name} has no member subsets", parameter="communities")
        for member in community.members:
            try:
                member_class, _ = parse_subset_name(member)
            except ValueError as exc:
                raise InputError(f"{where}: {exc}", parameter="communities") from None
            if member_class != community.class_name:
                raise InputError(
                    f"{where}: community {community.name} of class {community.class_name} lists {member}",
                    parameter="communities",
                )
    for subset in spec.exclude_images_in:
        try:
            parse_subset_name(subset)
        except ValueError as exc:
            raise InputError(f"{where}: {exc}", parameter="exclude_images_in") from None
        if is_whole_class(subset):
            raise InputError(f"{where}: {subset} is a whole class, not a subset", parameter="exclude_images_in")
    if spec.kind == "domain_generalization":
        _check_domain_generalization(spec, where)


def _check_domain_generalization(spec: Any, where: str) -> None:
    for cls in spec.classes:
        if not any(c.class_name == cls and c.role == "train" for c in spec.communities):
            raise InputError(f"{where}: class {cls} has no train community", parameter="train")
    tested = {c.class_name for c in spec.communities if c.role == "test"}
    if not tested:
        raise InputError(f"{where}: no class has a test community", parameter="test")
    if spec.distance_class is not None and spec.distance_class in spec.classes and spec.distance_class not in tested:
        raise InputError(
            f"{where}: class {spec.distance_class} (distance_class) has no test community", parameter="test"
        )
