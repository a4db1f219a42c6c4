"""Lists written in two places agree: the shift-measure vocabulary in code and in its contract."""

from __future__ import annotations

import re

from shiftbench.contracts import contract_for
from shiftbench.magnitudes import MEASURES


def test_the_shift_magnitude_contract_allows_exactly_the_vocabulary() -> None:
    contract = contract_for("shift_magnitudes")
    rule = next(
        q for p in contract.properties if p.name == "measure" for q in p.quality or [] if q.name == "known_measure"
    )
    listed = re.findall(r"'([a-z0-9_]+)'", str(rule.query))
    assert listed == list(MEASURES), "shiftbench/magnitudes.py MEASURES and shift_magnitudes.yaml known_measure differ"
