"""A published split as a researcher reads it: the version looked up and checked against its manifest
(``published``), its examples as arrays (``split_table``) and as a torch ``Dataset`` (``split_dataset``), its
images (``images``; ``standin`` renders stand-ins where the real ones are absent), and predictions scored on it
(``evaluation``). Reading and scoring import no family's build, no registry of families, no publishing and no
DuckDB (``tests/test_api.py`` checks it in a fresh process).

May import: errors, runtime, tables, config, store, specs, sources, scoring.
"""

from typing import Any

# What ``shiftbench.splits`` held when it was one module (0.1): still found here, with a DeprecationWarning, until the
# next release (only these names: looking up anything else imports nothing, which the training job relies on).
_OLD_NAMES = ("RESULT_FAMILIES", "PublishedSplit", "published_split", "split_images")


def __getattr__(name: str) -> Any:
    if name not in _OLD_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import warnings

    from shiftbench.splits import published

    warnings.warn(f"shiftbench.splits.{name} is now shiftbench.splits.published.{name}", DeprecationWarning, 2)
    return getattr(published, name)
