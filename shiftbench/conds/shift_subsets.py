"""What ConDS scores besides splits and groups: the examples each of a case's shifts concerns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl


def shift_subsets(version_dir: Path, examples: pl.DataFrame) -> dict[str, np.ndarray]:
    """Masks of the examples with unseen (UDS) values, rare (LDD) values and SC counterexamples: the subsets
    ``shiftbench eval`` reports accuracy on besides the splits and groups."""
    attributes_path = version_dir / "conds_attributes.parquet"
    if not attributes_path.is_file():
        return {}
    attributes = pl.read_parquet(attributes_path)
    label = attributes.filter(pl.col("role") == "label").row(0, named=True)
    values = pl.read_parquet(version_dir / "conds_examples.parquet")
    joined = examples.select("example_id").join(values, on="example_id", how="left")
    masks: dict[str, np.ndarray] = {}
    for row in attributes.filter(pl.col("shift") != "none").iter_rows(named=True):
        column = joined[row["attribute"]]
        if row["shift"] == "uds":
            masks["uds_unseen"] = column.is_in(row["uds_unseen_values"]).to_numpy()
        elif row["shift"] == "ldd":
            masks["ldd_rare"] = column.is_in(row["ldd_rare_values"]).to_numpy()
        elif row["shift"] == "sc":
            aligned = dict(zip(label["values"], row["sc_aligned_values"], strict=True))
            expected = joined[label["attribute"]].replace_strict(aligned, return_dtype=pl.String)
            masks["sc_counterexample"] = (column != expected).to_numpy()
    return masks
