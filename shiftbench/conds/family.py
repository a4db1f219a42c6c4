"""The ConDS family: attribute sources -> attribute tables -> cases (SC, LDD, UDS and combinations).

Each configured dataset's attribute table (CelebA, the generated sprites with their PNG files, or a
user's table) is read once into a content-addressed cache directory; every case reads it from there.
Datasets whose source is not configured (CelebA without ``SHIFTBENCH_CELEBA_DIR``) are skipped,
and their cases are not benchmarks on this machine.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl

from shiftbench.conds import build
from shiftbench.conds.attributes import attribute_table
from shiftbench.conds.figures import accuracy_by_shift, conds_cell_counts, conds_grid_vs_paper, conds_value_shares
from shiftbench.conds.settings import CondsSettings
from shiftbench.conds.specs import CaseSpec, DatasetSpec, load_specs
from shiftbench.config.package_files import CONTRACTS_DIR, SQL_DIR
from shiftbench.config.settings import Settings
from shiftbench.errors import InputError
from shiftbench.families.analysis import Analysis
from shiftbench.families.family import Description, Family, Figure, Input, Kind, Markdown, RawSource, Table, Target
from shiftbench.runtime.cache import CachedArtifact, cached, find_cached, home_record, publish_cache_dir
from shiftbench.sources import celeba as celeba_files
from shiftbench.sources import sprites
from shiftbench.sources.attribute_tables import read_attribute_table
from shiftbench.sources.celeba import ATTRIBUTE_FILE, CELEBA_IMAGES, read_celeba_attributes
from shiftbench.specs.naming import tag_paper_names
from shiftbench.splits.images import image_block
from shiftbench.store import StagedVersion
from shiftbench.tables.fingerprint import sha256_files, sha256_json, sha256_table, sha256_text
from shiftbench.warehouse.cards import CardInfo
from shiftbench.warehouse.publishing import stage_tables

# Bump when a change to the ConDS builders can change their output.
CODE_VERSION = "conds-2"
# The names of the specs shipped with the package (the papers' names), parsed once.
SHIPPED_NAMES = functools.cache(lambda: frozenset(load_specs(None).cases))
CELL_FIGURE = "cell_counts.png"
SHARES_FIGURE = "value_shares.png"
CASE_TABLES = (
    "benchmarks",
    "examples",
    "conds_examples",
    "conds_cases",
    "conds_attributes",
    "conds_value_counts",
    "conds_cells",
    "shift_magnitudes",
)


def dataset_unavailable(settings: Settings, dataset: DatasetSpec) -> str | None:
    """Why a dataset cannot be read here (its source is not configured), or None."""
    own = settings.of(CondsSettings)
    if dataset.source == "celeba" and own.celeba_dir is None:
        return "CelebA's annotations are not configured: set SHIFTBENCH_CELEBA_DIR"
    return None


def case_specs(settings: Settings) -> dict[str, CaseSpec]:
    """Cases by benchmark name: the shipped CelebA cases built on a subset of CelebA are ``NAME@partial``, on any
    other file than the release's (by its MD5) ``NAME@celeba-files``."""
    own = settings.of(CondsSettings)
    specs = load_specs(own.conds_specs)
    celeba_tag = celeba_files.source_tag(own.celeba_dir / ATTRIBUTE_FILE) if own.celeba_dir else None

    def tag(case: CaseSpec) -> str | None:
        return celeba_tag if specs.datasets[case.dataset].source == "celeba" else None

    return tag_paper_names(specs.cases, SHIPPED_NAMES(), tag)


TAG_MEANINGS = {  # why a shipped CelebA case is not under the paper's name, and what gives it back
    celeba_files.TAG_PARTIAL: f"the CelebA attribute file in SHIFTBENCH_CELEBA_DIR lists fewer than CelebA's "
    f"{CELEBA_IMAGES:,} images; the whole released file gives the paper's name",
    celeba_files.TAG_FILES: "the CelebA attribute file in SHIFTBENCH_CELEBA_DIR is not the release's (its MD5 "
    "differs); the released file gives the paper's name",
}


def recorded_tag(manifest: Mapping[str, Any]) -> str | None:
    """The tag a published version's recorded CelebA file calls for (None: the release's file, by its MD5)."""
    origin = manifest.get("origin") or {}
    count = origin.get("header_count")
    if count is None:
        return None  # not built from CelebA
    if bool(origin.get("partial")) or count != CELEBA_IMAGES:
        return celeba_files.TAG_PARTIAL
    return None if origin.get("attributes_md5") == celeba_files.RELEASE_MD5 else celeba_files.TAG_FILES


def sources_fingerprint(settings: Settings) -> str:
    """Every configured dataset's source: CelebA's files, users' tables, the sprites generator."""
    own = settings.of(CondsSettings)
    parts = []
    for name, dataset in sorted(load_specs(own.conds_specs).datasets.items()):
        if dataset.source == "celeba":
            names = ("list_attr_celeba.txt", "list_eval_partition.txt")
            files = [own.celeba_dir / f for f in names] if own.celeba_dir else []
            digest = sha256_files([f for f in files if f.is_file()]) if files else "unset"
            parts.append(f"{name}|celeba|{digest}|{own.celeba_allow_partial}")
        elif dataset.source == "sprites":
            parts.append(f"{name}|{sprites.GENERATOR_VERSION}|{own.sprites_per_combination}|{own.sprites_seed}")
        else:
            path = dataset.path
            parts.append(f"{name}|table|{sha256_files([path]) if path is not None and path.is_file() else 'missing'}")
    return sha256_text("\n".join(parts))


def dataset_definition(settings: Settings, name: str) -> str:
    """What in a dataset spec defines its cases (not where in which file it was written)."""
    own = settings.of(CondsSettings)
    return str(replace(load_specs(own.conds_specs).datasets[name], source_file="", line=None))


def _images(dataset: DatasetSpec, image_root: Path | None, home: Path) -> dict[str, Any]:
    if dataset.source == "celeba":
        return image_block("celeba", "img_align_celeba/{}", image_root, "celeba_dir", home=home)
    if dataset.source == "sprites":  # generated into the warehouse's cache: recorded relative to the warehouse
        return image_block("sprites", "images/{}.png", image_root, home=home)
    return image_block("user", "{}", None)


def _raw_table(
    settings: Settings, dataset: DatasetSpec
) -> tuple[pl.DataFrame, dict[str, Any], Path | None, int | None]:
    """The raw table with ``example_id``, where it came from, the image root, the file line of row 0."""
    own = settings.of(CondsSettings)
    if dataset.source == "celeba":
        if own.celeba_dir is None:
            raise InputError(f"dataset {dataset.name} needs CelebA's annotations", parameter="SHIFTBENCH_CELEBA_DIR")
        path = own.celeba_dir / ATTRIBUTE_FILE
        celeba = read_celeba_attributes(path, allow_partial=own.celeba_allow_partial)
        origin = {
            "path": str(path),
            "files_sha256": sha256_files([path]),
            "header_count": celeba.header_count,
            "partial": celeba.partial,
            "attributes_md5": celeba_files.file_md5(path),
        }
        return celeba.table.rename({"image_id": "example_id"}), origin, own.celeba_dir, 3
    if dataset.source == "sprites":
        n, seed = own.sprites_per_combination, own.sprites_seed
        key = sha256_text(f"{sprites.GENERATOR_VERSION}|{n}|{seed}")[:32]
        target = settings.cache_dir / "sprites" / key

        def generate(tmp: Path) -> None:
            sprites.write_sprites(tmp, n, seed)

        publish_cache_dir(target, generate)
        origin = {"generator": sprites.GENERATOR_VERSION, "n_per_combination": n, "seed": seed, "note": "generated"}
        return pl.read_parquet(target / "attributes.parquet"), origin, target, None
    assert dataset.path is not None
    frame, first_line = read_attribute_table(dataset.path, dataset.id_column)
    return frame, {"path": str(dataset.path), "files_sha256": sha256_files([dataset.path])}, None, first_line


def attribute_source(settings: Settings, dataset: DatasetSpec) -> CachedArtifact:
    """The dataset's attribute table (``example_id`` + one column per attribute), cached by content."""
    raw, origin, image_root, first_line = _raw_table(settings, dataset)
    path = Path(origin["path"]) if "path" in origin else None
    table = attribute_table(raw, dataset, path=path, first_line=first_line)
    # Generated images are part of what a split is: another sprites seed is another source.
    images = f"|{origin['generator']}|{origin['n_per_combination']}|{origin['seed']}" if "generator" in origin else ""
    fingerprint = sha256_text(f"{dataset.name}|{sha256_table(table)}{images}")
    target = settings.cache_dir / "conds_attributes" / fingerprint[:32]
    meta = {
        "dataset": dataset.name,
        "source": dataset.source,
        "fingerprint": fingerprint,
        "n_examples": table.height,
        "image_root": home_record(image_root, settings.home) if image_root else None,
        "origin": origin,
    }

    def write(tmp: Path) -> None:
        table.write_parquet(tmp / "attributes.parquet")

    return cached(target, fingerprint, meta, write)


def attribute_tables(settings: Settings, upstream: Mapping[str, CachedArtifact] | None = None) -> CachedArtifact:
    """Every configured dataset's attribute table; skipped datasets are listed with the reason."""
    own = settings.of(CondsSettings)
    specs = load_specs(own.conds_specs)
    datasets: dict[str, CachedArtifact] = {}
    skipped: dict[str, str] = {}
    for name, dataset in specs.datasets.items():
        reason = dataset_unavailable(settings, dataset)
        if reason is not None:
            skipped[name] = reason
            continue
        datasets[name] = attribute_source(settings, dataset)
    index = {
        name: {"path": home_record(a.path, settings.home), "fingerprint": a.fingerprint, "meta": a.meta}
        for name, a in datasets.items()
    }
    fingerprint = sha256_json({name: a.fingerprint for name, a in datasets.items()})
    meta = {
        "fingerprint": fingerprint,
        "datasets": {name: a.meta["n_examples"] for name, a in datasets.items()},
        "skipped": skipped,
        "n_examples": sum(a.meta["n_examples"] for a in datasets.values()),
    }

    def write(tmp: Path) -> None:
        (tmp / "datasets.json").write_text(json.dumps(index, indent=2, sort_keys=True), "utf-8")

    return cached(settings.cache_dir / "conds_attribute_tables" / fingerprint[:32], fingerprint, meta, write)


def dataset_artifact(settings: Settings, tables: CachedArtifact, dataset: str) -> CachedArtifact:
    """One dataset's attribute table, found in this warehouse's cache (``datasets.json`` names it relative to the
    warehouse; an older release's absolute path is found at the same place after a move)."""
    index = json.loads((tables.path / "datasets.json").read_text("utf-8"))
    if dataset not in index:
        reason = tables.meta.get("skipped", {}).get(dataset, "not read")
        raise InputError(f"dataset {dataset} is not available: {reason}", parameter="dataset")
    entry = index[dataset]
    return CachedArtifact(
        find_cached(entry["path"], settings.home, settings.cache_dir), entry["fingerprint"], entry["meta"]
    )


def stage_case(settings: Settings, target: Target, inputs: Mapping[str, CachedArtifact]) -> StagedVersion:
    """Draw the case's splits, measure its shift summary, stage the version with two figures."""
    own = settings.of(CondsSettings)
    case, benchmark = target.spec, target.benchmark
    assert isinstance(case, CaseSpec)
    source = dataset_artifact(settings, inputs[ATTRIBUTES.name], case.dataset)
    dataset = load_specs(own.conds_specs).datasets[case.dataset]
    table = pl.read_parquet(source.path / "attributes.parquet")
    sources = {"dataset": case.dataset, "source": source.meta["source"], "attributes_sha256": source.fingerprint}
    tables, draw, summary = build.case_tables(case, table, sources, target.overrides)

    def figures() -> dict[str, bytes]:
        return {
            CELL_FIGURE: conds_cell_counts(draw.cells, f"{benchmark}: examples per cell"),
            SHARES_FIGURE: conds_value_shares(
                summary.value_counts, tables["conds_attributes"], f"{benchmark}: value shares, train vs test"
            ),
        }

    recorded = source.meta.get("image_root")
    image_root = find_cached(recorded, settings.home, settings.cache_dir) if recorded else None
    return stage_tables(
        settings,
        build.FAMILY,
        benchmark,
        tables,
        spec=case.name,
        origin={**source.meta["origin"], "image_root": source.meta["image_root"]},
        code_version=CODE_VERSION,
        images=_images(dataset, image_root, settings.home),
        attachments=figures,
        card=card_info(case, dataset),
        check=target.check,
    )


CITATION = "An Analysis of Model Robustness across Concurrent Distribution Shifts (Jeon et al., TMLR 2025)."
SHIFT_WORDS = {
    "sc": "a spurious correlation (SC) of {a} with the label in training, broken at test",
    "ldd": "low data drift (LDD): some values of {a} are rare in training, common at test",
    "uds": "an unseen data shift (UDS): some values of {a} never appear in training but do at test",
}
SOURCE_LICENCES = {
    "celeba": "Annotations and images: CelebA (non-commercial research purposes only, CelebA agreement); "
    "images not redistributed",
    "sprites": "Images and attributes: generated by shiftbench's sprite generator (MIT)",
    "table": "Attributes: the user's table (its own licence)",
}


def card_info(case: CaseSpec, dataset: DatasetSpec) -> CardInfo:
    shifts = [SHIFT_WORDS[shift].format(a=attribute) for shift, attribute in case.shifts]
    shift = (
        ("Concurrent attribute shifts: " + "; ".join(shifts) + ". ")
        if shifts
        else "No shift: train and test are drawn uniformly over the attribute cells (the reference case). "
    )
    return CardInfo(
        title=f"ConDS case ({build.shift_kind(case)}) on {case.dataset}",
        shift=shift + "The test set is uniform over cells.",
        licences=(SOURCE_LICENCES.get(dataset.source, f"Attributes: {dataset.source}"),),
        citation=CITATION,
    )


def describe_case(staged: StagedVersion) -> Description:
    summary = pl.read_parquet(staged.table_path("conds_cases")).row(0, named=True)
    metadata: dict[str, Any] = {
        key: summary[key] for key in ("shift_kind", "n_train", "n_id_val", "n_test", "scaled_down")
    }
    metadata["tv_distance"] = float(summary["tv_distance"])
    for key in ("sc_observed_fraction", "ldd_observed_ratio"):
        if summary[key] is not None:
            metadata[key] = float(summary[key])
    attributes = pl.read_parquet(staged.table_path("conds_attributes"))
    metadata["shift_summary"] = Table(
        attributes.select(
            "attribute",
            "role",
            "shift",
            pl.col("unseen_in_train").list.join(", "),
            pl.col("cramers_v").round(4),
            pl.col("mutual_information").round(4),
        )
    )
    files = staged.manifest().get("attachments", {})
    for key, name, alt in (
        ("cell_counts_plot", CELL_FIGURE, "train vs test examples per cell"),
        ("value_shares_plot", SHARES_FIGURE, "value shares, train vs test"),
    ):
        if name in files:
            metadata[key] = Figure((staged.path / files[name]["file"]).read_bytes(), alt)
    query = f"SELECT split, \"group\", count(*) FROM examples WHERE benchmark = '{staged.benchmark}' GROUP BY ALL"
    metadata["duckdb_query"] = Markdown(query)
    line = (
        f"{summary['shift_kind']}: {summary['n_train']:,} train, {summary['n_id_val']:,} id_val, "
        f"{summary['n_test']:,} test, TV {summary['tv_distance']:.3f}"
    )
    return Description(metadata, line)


def _summary(artifact: CachedArtifact) -> str:
    """The datasets read, and those skipped with why (a fact of this build, not a warning about its content)."""
    read = ", ".join(f"{name}: {n:,} examples" for name, n in artifact.meta["datasets"].items()) or "no dataset"
    skipped = "; ".join(f"{name} skipped ({reason})" for name, reason in artifact.meta.get("skipped", {}).items())
    return f"{read}; {skipped}" if skipped else read


ATTRIBUTES = Input(
    key=("conds", "attribute_tables"),
    description="Each configured dataset's examples with one categorical column per attribute (raw columns mapped "
    "as the dataset spec says), cached as Parquet; for sprites, the generated PNG files too.",
    build=attribute_tables,
    summary=_summary,
    rows="n_examples",
    sources=("conds_attribute_sources",),
)
CASE = Kind(
    family=build.FAMILY,
    name="case",
    plural="cases",
    description="One ConDS case (label + SC/LDD/UDS per attribute): disjoint pools per cell, uniform test, shaped "
    "train and id_val, measured shift summary; checked against the case's definition.",
    tables=CASE_TABLES,
    inputs=(ATTRIBUTES.name,),
    spec_model=CaseSpec,
    specs=case_specs,
    stage=stage_case,
    describe=describe_case,
    unavailable=lambda settings, case: dataset_unavailable(
        settings,
        load_specs(settings.of(CondsSettings).conds_specs).datasets[case.dataset],  # type: ignore[attr-defined]
    ),
    code_version=CODE_VERSION,
    spec_source="conds_specs",
    spec_context=lambda settings, case: dataset_definition(settings, case.dataset),  # type: ignore[attr-defined]
    example="sprites-uniform",
)
# The paper's analyses over this family's results (shiftbench.families.analysis).
ANALYSES = (
    Analysis(
        "conds-accuracy-by-shift",
        "conds",
        "analysis_conds_shifts",
        "conds_accuracy_by_shift.sql",
        "ConDS: accuracy by shift kind and by number of concurrent shifts",
        "Jeon et al., Concurrent distribution shifts (TMLR 2025), Sections 4-5",
        accuracy_by_shift,
        "accuracy_by_shift.png",
        SQL_DIR / "conds",
    ),
    Analysis(
        "conds-grid-vs-paper",
        "conds",
        "analysis_conds_grid",
        "conds_grid_vs_paper.sql",
        "ConDS: the grid per learner beside the paper's Table 3, by concurrent shifts and SC",
        "Jeon et al., Concurrent distribution shifts (TMLR 2025), Table 3 and Figure 4",
        conds_grid_vs_paper,
        "grid_vs_paper.png",
        SQL_DIR / "conds",
    ),
)
CONDS = Family(
    name=build.FAMILY,
    title="ConDS",
    description="ConDS (Jeon et al., TMLR 2025): concurrent attribute shifts (SC, LDD, UDS) on CelebA, sprites or "
    "your table.",
    raw_sources=(
        RawSource(
            "conds_attribute_sources",
            "Each ConDS dataset's source: SHIFTBENCH_CELEBA_DIR's files, a user's attribute table, or the sprites "
            "generator's version and parameters.",
            sources_fingerprint,
        ),
    ),
    inputs=(ATTRIBUTES,),
    kinds=(CASE,),
    shipped_names=SHIPPED_NAMES,
    source_tag=recorded_tag,
    tag_meaning=TAG_MEANINGS.get,
    eval_subsets="shiftbench.conds.shift_subsets:shift_subsets",
    settings=CondsSettings,
    analyses=ANALYSES,
    contracts_dir=CONTRACTS_DIR / "conds",
    measures=build.MEASURES,
)
