"""Every training objective a run may record is one the erm_runs contract accepts: a method added to
shiftbench.scoring.method_names without the contract would train and then never publish (CDANN and CausIRL once did)."""

from __future__ import annotations

import re

from shiftbench.config.package_files import CONTRACTS_DIR
from shiftbench.scoring.method_names import METHODS


def test_the_erm_runs_contract_accepts_exactly_the_methods() -> None:
    text = " ".join((CONTRACTS_DIR / "erm_runs.yaml").read_text("utf-8").split())
    listed = re.search(r"WHERE method NOT IN \(([^)]*)\) OR json_extract_string\(config, '\$.method'\)", text)
    assert listed is not None
    assert tuple(re.findall(r"'([a-z_]+)'", listed[1])) == METHODS
