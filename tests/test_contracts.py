"""Contracts: valid ODCS, pass on real builds, and each semantic rule catches its violation."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from shiftbench.errors import InputError
from shiftbench.families import registry
from shiftbench.store import Store
from shiftbench.store.contracts import CONTRACTS_DIR, check_tables, contracts, failures, load_contract

from .conftest import ToyDir, toy_tables


def test_every_published_table_has_a_valid_odcs_contract() -> None:
    found = contracts()
    metashift = {
        "metashift_subsets",
        "metashift_classes",
        "metashift_subset_images",  # a view over metashift_scene_* (stored by versions written before it)
        "metashift_scene_images",
        "metashift_scene_objects",
        "metashift_scene_contexts",
        "metashift_scene_attributes",
        "metashift_scene_class_names",
        "metashift_scene_vocabulary",
        "metashift_edges",
        "metashift_distances",
        "metashift_communities",
        "metashift_embeddings",
        "metashift_graphs",
        "metashift_tasks",
        "metashift_task_communities",
    }
    conds = {"conds_examples", "conds_cases", "conds_attributes", "conds_value_counts", "conds_cells"}
    erm = {"erm_results", "erm_runs", "erm_curves", "erm_training_conflicts", "eval_results", "eval_runs"}
    assert set(found) == {
        "benchmarks",
        "examples",
        "breeds_subpopulations",
        "breeds_hierarchy",
        "shift_magnitudes",
        *metashift,
        *conds,
        *erm,
        "analysis_metashift_distance",
        "analysis_metashift_conflicts",
        "analysis_metashift_subpopulation",
        "analysis_metashift_multiclass",
        "analysis_breeds_source_target",
        "analysis_breeds_architectures",
        "analysis_breeds_interventions",
        "analysis_conds_shifts",
        "analysis_conds_grid",
    }
    assert {t for kind in registry.kinds() for t in kind.tables} <= set(found)  # every kind's tables are covered
    assert all("shift_magnitudes" in kind.tables for kind in registry.kinds())  # every version measures its shift
    assert {found[t].store_key for t in erm} == {"run"} and found["examples"].store_key == "benchmark"
    assert found["conds_examples"].additional_columns_type == "VARCHAR"
    assert found["examples"].additional_columns_type is None
    for contract in found.values():
        assert contract.model.apiVersion == "v3.0.2"
        assert contract.primary_key[:2] == [contract.store_key, "version"]  # a version's rows, keyed


def _write(tmp_path: Path, tables: dict[str, pl.DataFrame]) -> dict[str, Path]:
    """Stage the tables so they carry benchmark/version columns exactly as published."""
    staged = Store(tmp_path / "store").writer.stage("breeds", "toy", tables)
    return {t: staged.table_path(t) for t in staged.tables}


def _failed_rules(tmp_path: Path, tables: dict[str, pl.DataFrame]) -> set[str]:
    return {f"{r.table}.{r.rule}" for r in failures(check_tables(_write(tmp_path, tables)))}


@pytest.mark.parametrize("split", ["rand", "good", "bad", "none"])
def test_real_builds_satisfy_all_contracts(tmp_path: Path, toy_breeds_dir: ToyDir, split: str) -> None:
    assert _failed_rules(tmp_path, toy_tables(toy_breeds_dir(), split=split)) == set()


Mutation = Callable[[dict[str, pl.DataFrame]], None]


def _move_to_other_domain(t: dict[str, pl.DataFrame]) -> None:
    # Duplicate one source subclass into the target domain of the same superclass.
    sub = t["breeds_subpopulations"]
    row = sub.filter(pl.col("domain") == "source").head(1).with_columns(pl.lit("target").alias("domain"))
    t["breeds_subpopulations"] = pl.concat([sub, row])


def _drop_one_target(t: dict[str, pl.DataFrame]) -> None:
    sub = t["breeds_subpopulations"]
    victim = sub.filter(pl.col("domain") == "target")["subclass_wnid"][0]
    t["breeds_subpopulations"] = sub.filter(pl.col("subclass_wnid") != victim)
    t["examples"] = t["examples"].filter(pl.col("group") != victim)
    t["benchmarks"] = t["benchmarks"].with_columns(pl.lit(t["examples"].height, pl.Int64).alias("n_examples"))


def _foreign_superclass(t: dict[str, pl.DataFrame]) -> None:
    # Claim a subclass of superclass 1 for superclass 0 (labels and names follow).
    sub = t["breeds_subpopulations"]
    first = sub.filter(pl.col("y") == 0).row(0, named=True)
    t["breeds_subpopulations"] = sub.with_columns(
        pl.when((pl.col("y") == 1) & (pl.col("rank") == 0) & (pl.col("domain") == "source"))
        .then(pl.lit(first["superclass_wnid"]))
        .otherwise(pl.col("superclass_wnid"))
        .alias("superclass_wnid")
    )


def _wrong_split(t: dict[str, pl.DataFrame]) -> None:
    ex = t["examples"]
    t["examples"] = ex.with_columns(
        pl.when(pl.col("split") == "test").then(pl.lit("id_test")).otherwise(pl.col("split")).alias("split")
    )


def _bad_enum(t: dict[str, pl.DataFrame]) -> None:
    t["examples"] = t["examples"].with_columns(pl.lit("validation").alias("split"))


def _duplicate_example(t: dict[str, pl.DataFrame]) -> None:
    t["examples"] = pl.concat([t["examples"], t["examples"].head(1)])
    t["benchmarks"] = t["benchmarks"].with_columns(pl.lit(t["examples"].height, pl.Int64).alias("n_examples"))


def _wrong_count(t: dict[str, pl.DataFrame]) -> None:
    t["benchmarks"] = t["benchmarks"].with_columns(pl.lit(1, pl.Int64).alias("n_examples"))


def _null_name(t: dict[str, pl.DataFrame]) -> None:
    t["examples"] = t["examples"].with_columns(pl.lit(None, pl.String).alias("y_name"))


def _bad_json(t: dict[str, pl.DataFrame]) -> None:
    t["benchmarks"] = t["benchmarks"].with_columns(pl.lit("{not json").alias("params"))


def _wrong_type(t: dict[str, pl.DataFrame]) -> None:
    t["examples"] = t["examples"].with_columns(pl.col("y").cast(pl.String))


def _extra_column(t: dict[str, pl.DataFrame]) -> None:
    t["examples"] = t["examples"].with_columns(pl.lit(1).alias("surprise"))


@pytest.mark.parametrize(
    ("mutate", "rule"),
    [
        (_move_to_other_domain, "breeds_subpopulations.source_target_disjoint"),
        (_drop_one_target, "breeds_subpopulations.balanced_domains"),
        (_foreign_superclass, "breeds_subpopulations.subclass_descends_from_superclass"),
        (_wrong_split, "breeds_subpopulations.examples_match_subpopulations"),
        (_bad_enum, "examples.split: enum"),
        (_duplicate_example, "examples.primary key"),
        (_wrong_count, "benchmarks.n_examples_matches_examples"),
        (_null_name, "examples.y_name: required"),
        (_bad_json, "benchmarks.params_and_sources_are_json"),
        (_wrong_type, "examples.schema"),
        (_extra_column, "examples.schema"),
    ],
)
def test_each_rule_catches_its_violation(tmp_path: Path, toy_breeds_dir: ToyDir, mutate: Mutation, rule: str) -> None:
    tables = toy_tables(toy_breeds_dir())
    mutate(tables)  # type: ignore[arg-type]
    assert rule in _failed_rules(tmp_path, tables)  # type: ignore[arg-type]


def test_a_broken_contract_file_is_a_clear_error(tmp_path: Path) -> None:
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("apiVersion: v3.0.2\nkind: DataContract\nschema: [\n")
    with pytest.raises(InputError, match="invalid YAML") as info:
        load_contract(bad_yaml)
    assert info.value.line is not None
    unknown_field = tmp_path / "unknown.yaml"
    text = (CONTRACTS_DIR / "examples.yaml").read_text().replace("dataProduct:", "dataProdcut:")
    unknown_field.write_text(text)
    with pytest.raises(InputError, match="not a valid ODCS contract"):
        load_contract(unknown_field)


def test_a_wrong_check_memory_setting_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from shiftbench.store.contracts import connect_tables

    monkeypatch.setenv("SHIFTBENCH_CHECK_MEMORY", "lots")
    with pytest.raises(InputError, match=r"SHIFTBENCH_CHECK_MEMORY.*'lots'"):
        connect_tables({})
    monkeypatch.setenv("SHIFTBENCH_CHECK_MEMORY", "256MB")
    connect_tables({}).close()
