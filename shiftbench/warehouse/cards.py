"""A shift card per version: ``files/card.md`` for people, ``files/croissant.json`` for tools.

The card says what shifts and how much (the version's ``shift_magnitudes``), the sizes per split and
group, the sources with their fingerprints, the parameters, the licences and the plots. The
Croissant file (MLCommons Croissant 1.1, JSON-LD, with its provenance) describes the version's Parquet tables as record
sets, with each file's SHA-256 and the splits as a ``cr:Split`` record set, so Croissant tools
(``mlcroissant``, TFDS, Hugging Face) can load a version without shiftbench. Both are written with
the version (``store.writer.stage``'s ``documents``) and covered by the manifest's checksums.

Croissant is written here as plain JSON rather than through ``mlcroissant``: that library pulls in
pandas, rdflib and TensorFlow-style tooling a build does not need; the tests validate the output with
``mlcroissant`` itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl

from shiftbench.warehouse.magnitudes import SCOPE_ALL, meaning
from shiftbench.store import SCHEMA_VERSION
from shiftbench.tables.streamed import StreamedTable, in_memory

CROISSANT_CONFORMS_TO = "http://mlcommons.org/croissant/1.1"
# The JSON-LD context of Croissant documents (the standard context, 1.0 and 1.1 alike; prov for provenance).
CROISSANT_CONTEXT: dict[str, Any] = {
    "@language": "en",
    "@vocab": "https://schema.org/",
    "citeAs": "cr:citeAs",
    "column": "cr:column",
    "conformsTo": "dct:conformsTo",
    "cr": "http://mlcommons.org/croissant/",
    "rai": "http://mlcommons.org/croissant/RAI/",
    "data": {"@id": "cr:data", "@type": "@json"},
    "dataType": {"@id": "cr:dataType", "@type": "@vocab"},
    "dct": "http://purl.org/dc/terms/",
    "equivalentProperty": "cr:equivalentProperty",
    "examples": {"@id": "cr:examples", "@type": "@json"},
    "extract": "cr:extract",
    "field": "cr:field",
    "fileProperty": "cr:fileProperty",
    "fileObject": "cr:fileObject",
    "fileSet": "cr:fileSet",
    "format": "cr:format",
    "includes": "cr:includes",
    "isLiveDataset": "cr:isLiveDataset",
    "jsonPath": "cr:jsonPath",
    "key": "cr:key",
    "md5": "cr:md5",
    "prov": "http://www.w3.org/ns/prov#",
    "parentField": "cr:parentField",
    "path": "cr:path",
    "recordSet": "cr:recordSet",
    "references": "cr:references",
    "regex": "cr:regex",
    "repeated": "cr:repeated",
    "replace": "cr:replace",
    "samplingRate": "cr:samplingRate",
    "sc": "https://schema.org/",
    "separator": "cr:separator",
    "source": "cr:source",
    "subField": "cr:subField",
    "transform": "cr:transform",
}
# WILDS split names -> Croissant's split types (cr:TrainingSplit, cr:ValidationSplit, cr:TestSplit).
SPLIT_TYPES = {"train": "cr:TrainingSplit", "ood_train": "cr:TrainingSplit", "id_val": "cr:ValidationSplit",
               "val": "cr:ValidationSplit", "id_test": "cr:TestSplit", "test": "cr:TestSplit"}  # fmt: skip
SIZE_ROWS = 40  # groups listed per card; the rest is one query away


@dataclass(frozen=True)
class CardInfo:
    """What a family says on its versions' cards."""

    title: str  # "BREEDS benchmark", "MetaShift task"
    shift: str  # what shifts, in one or two sentences
    licences: tuple[str, ...]  # one line per source: what it is and its licence
    citation: str  # the paper to cite next to the version id


TABLES_READ = ("examples", "shift_magnitudes")  # the tables whose rows a card reads; of the others, the schema


@dataclass(frozen=True)
class Version:
    """What the card and the Croissant file of one version are made from."""

    benchmark: str
    version: str
    manifest: Mapping[str, Any]  # spec, params, sources, warnings, family
    tables: Mapping[
        str, pl.DataFrame | StreamedTable
    ]  # as staged (no benchmark/version columns); may add the split's magnitudes
    files: Mapping[str, Mapping[str, Any]]  # the manifest's table entries: file, rows, bytes, sha256
    figures: Sequence[str]  # attachment names, shown on the card
    info: CardInfo


def _arrow_type(dtype: Any) -> tuple[str, bool]:
    """Croissant data type of a polars column, and whether it is a list (``repeated``)."""
    if isinstance(dtype, pl.List | pl.Array):
        inner, _ = _arrow_type(dtype.inner)
        return inner, True
    if dtype == pl.Boolean:
        return "sc:Boolean", False
    if dtype.is_integer():
        return "sc:Integer", False
    if dtype.is_float():
        return "sc:Float", False
    return "sc:Text", False


def croissant(v: Version) -> dict[str, Any]:
    """The Croissant 1.1 JSON-LD of one version: one FileObject and one RecordSet per Parquet table, and
    its provenance (PROV-O, as Croissant 1.1 records it): the source datasets with their checksums, and the
    build that made the version from them."""
    benchmark, version, manifest, tables, files, info = v.benchmark, v.version, v.manifest, v.tables, v.files, v.info
    distribution = [
        {
            "@type": "cr:FileObject",
            "@id": entry["file"],
            "name": entry["file"],
            "description": f"the {table} table of {benchmark} version {version}",
            "contentUrl": f"../{entry['file']}",  # croissant.json lies in files/, next to the tables
            "contentSize": f"{entry['bytes']} B",
            "encodingFormat": "application/x-parquet",
            "sha256": entry["sha256"],
        }
        for table, entry in sorted(files.items())
    ]
    record_sets: list[dict[str, Any]] = []
    splits = sorted(in_memory(tables["examples"])["split"].unique().to_list()) if "examples" in tables else []
    if splits:
        record_sets.append(
            {
                "@type": "cr:RecordSet",
                "@id": "splits",
                "name": "splits",
                "description": "The WILDS-style splits of the examples table.",
                "dataType": "cr:Split",
                "key": {"@id": "splits/name"},
                "field": [
                    {"@type": "cr:Field", "@id": "splits/name", "name": "splits/name", "dataType": "sc:Text"},
                    {"@type": "cr:Field", "@id": "splits/url", "name": "splits/url", "dataType": "sc:URL"},
                ],
                "data": [{"splits/name": s, "splits/url": SPLIT_TYPES.get(s, "cr:TestSplit")} for s in splits],
            }
        )
    for table in sorted(files):
        frame_schema = {"benchmark": pl.String(), "version": pl.String(), **dict(tables[table].schema)}
        fields = []
        for column, dtype in frame_schema.items():
            data_type, repeated = _arrow_type(dtype)
            field: dict[str, Any] = {
                "@type": "cr:Field",
                "@id": f"{table}/{column}",
                "name": f"{table}/{column}",
                "dataType": data_type,
                "source": {"fileObject": {"@id": files[table]["file"]}, "extract": {"column": column}},
            }
            if repeated:
                field["repeated"] = True
            if table == "examples" and column == "split" and splits:  # none: a version without images
                field["references"] = {"field": {"@id": "splits/name"}}
            fields.append(field)
        record_sets.append({"@type": "cr:RecordSet", "@id": table, "name": table, "field": fields})
    return {
        "@context": CROISSANT_CONTEXT,
        "@type": "sc:Dataset",
        "conformsTo": CROISSANT_CONFORMS_TO,
        "name": f"{benchmark}-{version}",
        "alternateName": benchmark,
        "description": f"{info.title} {benchmark}, shiftbench version {version}. {info.shift}",
        "identifier": version,
        # Croissant wants MAJOR.MINOR.PATCH: the store's schema version, with the content id as build metadata.
        "version": f"{SCHEMA_VERSION}.0.0+{version}",
        "datePublished": datetime.now(UTC).date().isoformat(),
        "citeAs": info.citation,
        "license": "; ".join(info.licences),
        "keywords": ["distribution shift", manifest.get("family", ""), benchmark],
        "creator": {"@type": "sc:Organization", "name": "shiftbench"},
        "distribution": distribution,
        "recordSet": record_sets,
        **provenance(manifest),
    }


def provenance(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """``prov:wasDerivedFrom`` (each source the manifest names with a ``<name>_sha256`` checksum, or a
    results version's split) and ``prov:wasGeneratedBy`` (the shiftbench build, its code version)."""
    sources = manifest.get("sources", {})
    derived = []
    for key, value in sorted(sources.items()):
        if key.endswith("_sha256") and isinstance(value, str):
            name = key.removesuffix("_sha256")
            label = f"{name}: {sources[name]}" if isinstance(sources.get(name), str) else name
            derived.append({"@type": "sc:Dataset", "name": label, "sha256": value})
    split = manifest.get("split")
    if isinstance(split, Mapping) and split.get("version"):
        derived.append({"@type": "sc:Dataset", "name": f"{split.get('benchmark', '')} version {split['version']}"})
    environment = manifest.get("environment", {})
    activity = {
        "@type": "prov:Activity",
        "name": f"shiftbench {environment.get('shiftbench', '')}".strip(),
        "description": f"built from the sources with the spec and parameters in manifest.json (family "
        f"{manifest.get('family', '')}, code version {manifest.get('code_version', '')})",
    }
    return (
        {"prov:wasDerivedFrom": derived, "prov:wasGeneratedBy": activity}
        if derived
        else {"prov:wasGeneratedBy": activity}
    )


def markdown_table(frame: pl.DataFrame) -> str:
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "| " + " | ".join("---" for _ in frame.columns) + " |"
    rows = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in frame.iter_rows()]
    return "\n".join([header, rule, *rows])


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|") if value is not None else "NULL"


def card(v: Version) -> str:
    """The Markdown card of one version."""
    benchmark, version, manifest, tables, files, info = v.benchmark, v.version, v.manifest, v.tables, v.files, v.info
    figures = v.figures
    lines = [f"# {benchmark}", "", f"{info.title}, shiftbench version `{version}` (spec `{manifest.get('spec')}`).", ""]
    lines += ["## What shifts", "", info.shift, ""]
    lines += ["## How much", ""]
    magnitudes = in_memory(tables["shift_magnitudes"]) if "shift_magnitudes" in tables else None
    if magnitudes is not None and magnitudes.height:
        overall = magnitudes.filter(pl.col("scope") == SCOPE_ALL).sort("measure")
        lines += [markdown_table(overall.select("measure", "value")), ""]
        for family, measure in overall.select("family", "measure").iter_rows():
            lines.append(f"- `{measure}`: {meaning(family, measure)}")
        n_scoped = magnitudes.height - overall.height
        if n_scoped:
            lines.append(f"- {n_scoped} more values per superclass, class, community or attribute: "
                         f"`SELECT * FROM shift_magnitudes WHERE benchmark = '{benchmark}'`")  # fmt: skip
        lines.append("")
    if "examples" in tables:
        examples = in_memory(tables["examples"])
        per_group = examples.group_by("split", "group").agg(pl.len().alias("examples")).sort("split", "group")
        per_split = per_group.group_by("split").agg(
            pl.col("examples").sum(),
            pl.len().alias("groups"),
            pl.col("examples").min().alias("smallest_group"),
            pl.col("examples").max().alias("largest_group"),
        )
        lines += ["## Sizes", "", markdown_table(per_split.sort("split")), ""]
        if per_group.height <= SIZE_ROWS:
            lines += [markdown_table(per_group), ""]
        else:
            query = f"SELECT split, \"group\", count(*) FROM examples WHERE benchmark = '{benchmark}' GROUP BY ALL"
            lines += [f"Per split and group ({per_group.height} rows): `{query}`", ""]
    lines += ["## Sources", ""]
    lines += [f"- `{key}`: `{value}`" for key, value in sorted(manifest.get("sources", {}).items())] + [""]
    lines += [
        "## Parameters",
        "",
        "```json",
        json.dumps(manifest.get("params", {}), indent=2, sort_keys=True),
        "```",
        "",
    ]
    lines += ["## Licences", ""] + [f"- {line}" for line in info.licences]
    lines += ["- The tables of this version: MIT (shiftbench); they list image ids, never images.", ""]
    if figures:
        lines += ["## Plots", ""] + [f"![{name}]({name})" for name in figures] + [""]
    lines += ["## Files", "", markdown_table(pl.DataFrame(
        [(e["file"], e["rows"], e["bytes"], e["sha256"]) for _, e in sorted(files.items())],
        schema=["file", "rows", "bytes", "sha256"], orient="row"))]  # fmt: skip
    lines += ["", "## Cite", "", f"{info.citation} Benchmark `{benchmark}`, shiftbench version `{version}`.", ""]
    warnings = manifest.get("warnings") or []
    if warnings:
        lines += ["## Warnings", ""] + [f"- {w}" for w in warnings] + [""]
    return "\n".join(lines)


def with_split_magnitudes(tables: Mapping[str, pl.DataFrame], split_dir: Path) -> dict[str, pl.DataFrame]:
    """A results version's tables plus its split's ``shift_magnitudes``: its card shows the shift it was tested on."""
    described = dict(tables)
    if (split_dir / "shift_magnitudes.parquet").is_file():
        described["shift_magnitudes"] = pl.read_parquet(split_dir / "shift_magnitudes.parquet")
    return described


def without_images(card_text: str) -> str:
    """The card for the UI, which shows the figures itself and cannot resolve the card's relative links."""
    return "\n".join(line for line in card_text.splitlines() if not line.startswith("!["))


def documents(v: Version) -> dict[str, bytes]:
    """``card.md`` and ``croissant.json`` of one version."""
    document = croissant(v)
    return {
        "card.md": card(v).encode(),
        "croissant.json": (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode(),
    }
