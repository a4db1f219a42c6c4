"""Which split is the validation split a client expects: WILDS' ``val`` (its ``check_init`` asserts it) and
Hugging Face's ``validation``.

shiftbench names splits as WILDS does: ``val`` is an out-of-distribution validation split, ``id_val`` one drawn
from the training distribution. A split with ``val`` keeps every name. A split with only ``id_val`` (ConDS,
MetaShift tasks built with ``id_val_fraction``) gives it as ``val``, as WILDS' own CivilComments and BDD100K
name a validation split that is identically distributed to training; the export records the mapping
(WILDS: ``split_sources`` in ``wilds.json``; HF: the ``split`` column and the card). A split with neither
(BREEDS: ``train``, ``id_test``, ``test``, ``ood_train``; MetaShift's subpopulation tasks: ``train``, ``test``)
has no validation split unless ``--val-split`` names one (BREEDS: ``id_test``, the source domain's held-out
images); WILDS then gets an empty ``val``, declared as such.
"""

from __future__ import annotations

from collections.abc import Sequence

from shiftbench.errors import InputError

OOD_VAL, ID_VAL = "val", "id_val"
NEVER_VALIDATION = ("train", "test")  # a validation split taken from training or test data is not one


def validation_split(benchmark: str, splits: Sequence[str], chosen: str | None) -> str | None:
    """The split (shiftbench's name) that becomes the client's validation split: ``chosen`` (``--val-split``),
    else ``val``, else ``id_val``; None when the split has none."""
    if chosen is not None:
        if chosen not in splits:
            available = ", ".join(splits)
            raise InputError(f"{benchmark} has no split {chosen!r} (splits: {available})", parameter="--val-split")
        if chosen in NEVER_VALIDATION:
            raise InputError(f"{chosen!r} cannot serve as the validation split", parameter="--val-split")
        if OOD_VAL in splits and chosen != OOD_VAL:
            raise InputError(
                f"{benchmark} has a val split already; it is the validation split", parameter="--val-split"
            )
        return chosen
    return next((name for name in (OOD_VAL, ID_VAL) if name in splits), None)
