"""The papers' analyses as assets downstream of the results (shiftbench.families.analysis): one per analysis.

Each depends on its family's published splits and ERM baselines and is rebuilt by the automation
whenever one of them publishes; results scored with ``shiftbench eval`` (outside Dagster) join at
the next rebuild, or at once with ``shiftbench analyse``, which runs these assets (job ``analyses``)
on the same instance. The figure and the table show on the materialization. An analysis without
results publishes nothing and so records no materialization: the UI says "Never materialized"
exactly while the store holds no version of it.
"""

from collections.abc import Iterator
from typing import Any

import dagster as dg

from shiftbench.assets.automation import reanalyse
from shiftbench.assets.erm import baseline_keys
from shiftbench.assets.metadata import metadata_table
from shiftbench.assets.resources import ShiftbenchSettings
from shiftbench.families import registry
from shiftbench.families.analysis import Analysis
from shiftbench.families.analysis import publish as publish_analysis
from shiftbench.families.family import Kind
from shiftbench.results.plots import png_markdown

JOB = "analyses"
NO_RESULTS = "no results yet"


def analysis_key(analysis: Analysis) -> dg.AssetKey:
    return dg.AssetKey(["analysis", analysis.name.replace("-", "_")])


def analysis_asset(analysis: Analysis, trained: list[Kind]) -> dg.AssetsDefinition:
    kinds = [k for k in registry.family(analysis.family).kinds if k.trainable]
    deps = [dg.AssetKey(list(k.publish_key)) for k in kinds]
    deps += [baseline_keys(k)[1] for k in trained if k.family == analysis.family]

    @dg.asset(
        key=analysis_key(analysis),
        deps=deps,
        group_name="analysis",
        kinds={"duckdb", "parquet"},
        automation_condition=reanalyse(),
        output_required=False,  # no results: nothing published, nothing materialized
        description=f"{analysis.title} ({analysis.source}): table {analysis.table} over the leaderboard, "
        "published as a version with its plot.",
    )
    def _analysis(
        context: dg.AssetExecutionContext, settings: ShiftbenchSettings
    ) -> Iterator[dg.MaterializeResult[Any]]:
        outcome, frame = publish_analysis(settings.get(), analysis)
        if outcome is None:
            context.log.info(f"{analysis.name}: {NO_RESULTS} (train or score a model); nothing published")
            return
        figure = (outcome.staged.path / "files" / analysis.figure_file).read_bytes()
        yield dg.MaterializeResult(
            metadata={
                "version": outcome.staged.version,
                "became_latest": outcome.publication.changed_latest,
                "rows": frame.height,
                "plot": dg.MetadataValue.md(png_markdown(figure, analysis.title)),
                "table": metadata_table(frame.head(100)),
                "duckdb_query": dg.MetadataValue.md(f"```sql\nSELECT * FROM {analysis.table};\n```"),
                "path": dg.MetadataValue.path(str(outcome.staged.path)),
            },
            data_version=dg.DataVersion(outcome.staged.version),
        )

    return _analysis


def analysis_assets(trained: list[Kind]) -> list[dg.AssetsDefinition]:
    return [analysis_asset(a, trained) for a in registry.analyses().values()]


def analyses_job() -> Any:
    """What ``shiftbench analyse`` runs (a subset of it for named analyses), and the UI can launch."""
    return dg.define_asset_job(
        JOB,
        selection=dg.AssetSelection.assets(*[analysis_key(a) for a in registry.analyses().values()]),
        description="Rebuild the papers' analyses from the results in the catalog; publish those with results.",
    )
