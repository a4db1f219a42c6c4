"""The papers' analyses as assets downstream of the results (shiftbench.analysis): one per analysis.

Each depends on its family's published splits and ERM baselines and is rebuilt by the automation
whenever one of them publishes; results scored with ``shiftbench eval`` (outside Dagster) join at
the next rebuild, or at once with ``shiftbench analyse``. The figure and the table show on the
materialization.
"""

from typing import Any

import dagster as dg

from assets.automation import reanalyse
from assets.erm import baseline_keys
from assets.metadata import metadata_table
from assets.resources import ShiftbenchSettings
from shiftbench import registry
from shiftbench.analysis import Analysis
from shiftbench.analysis import publish as publish_analysis
from shiftbench.family import Kind
from shiftbench.plots import png_markdown


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
        description=f"{analysis.title} ({analysis.source}): table {analysis.table} over the leaderboard, "
        "published as a version with its plot.",
    )
    def _analysis(context: dg.AssetExecutionContext, settings: ShiftbenchSettings) -> dg.MaterializeResult[Any]:
        config = settings.get()
        outcome, frame = publish_analysis(config, analysis)
        if outcome is None:
            context.log.info(f"{analysis.name}: no results yet")
            return dg.MaterializeResult(metadata={"rows": 0, "note": "no results yet: train or score a model"})
        figure = (outcome.staged.path / "files" / analysis.figure_file).read_bytes()
        return dg.MaterializeResult(
            metadata={
                "version": outcome.staged.version,
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
