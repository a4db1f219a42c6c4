"""A hyperparameter search from Dagster: job ``erm_search`` asks for one, sensor ``erm_search_runs`` trains it.

The job's op plans the whole search (:mod:`shiftbench.erm.search_requests`) and writes the request; the sensor asks,
each tick, for every planned run neither published nor under way, as a run of the kind's ERM job for the partition
(benchmark, trial) with the draw in its config (``search``, ``search_draw``): the run ``shiftbench train B --set
search=S --set search_draw=I --seed T`` starts. Once every run of a request is published, the request is closed
and the selection is in the catalog.
"""

from collections.abc import Sequence
from typing import Any

import dagster as dg

from shiftbench.assets.erm import baseline_job_name
from shiftbench.assets.resources import ShiftbenchSettings
from shiftbench.config.settings import Settings
from shiftbench.errors import ShiftbenchError
from shiftbench.families import registry

SEARCH_TAG = "shiftbench/search"
RUN_TAG = "shiftbench/run"
MAX_FAILURES = 2  # a run that failed this often is not asked for again (its runs in the UI say why)
UNDER_WAY = [
    dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING,
]  # fmt: skip


class SearchConfig(dg.Config):
    """``shiftbench train B... --search N --trials K`` in the launchpad."""

    benchmarks: list[str]
    draws: int
    trials: int = 1
    search_space: str = "auto"
    select: str = ""  # selection methods, comma-separated (default: every one the splits allow)
    preset: str | None = None
    parameters: list[str] = []  # KEY=VALUE, as --set  # noqa: RUF012 (a pydantic default, copied per instance)


@dg.op(name="request_search")
def request_search(context: dg.OpExecutionContext, config: SearchConfig, settings: ShiftbenchSettings) -> None:
    """Plan the search (a bad value fails here, asking for nothing) and write the request the sensor trains."""
    from shiftbench.erm.search_requests import SearchRequest, plan_request, save_request
    from shiftbench.families.plans import training_overrides

    overrides = training_overrides(config.parameters)
    from shiftbench.pipelines.cli.train import typed_training

    typed_training(overrides)  # every value checked as the CLI checks it
    request = SearchRequest(
        benchmarks=config.benchmarks, draws=config.draws, trials=config.trials, search_space=config.search_space,
        select=config.select, preset=config.preset, overrides=overrides,
    )  # fmt: skip
    plans, selections = plan_request(settings.get(), request)
    path = save_request(settings.get(), request)
    context.log.info(f"search {request.id}: {len(plans)} runs planned, selection by {', '.join(selections)}; {path}")
    context.add_output_metadata({"search": request.id, "runs": len(plans), "selection": ", ".join(selections)})


@dg.job(
    name="erm_search", description="A random hyperparameter search (docs/erm.md): plans it; erm_search_runs trains it."
)
def search_job() -> None:
    request_search()


def run_requests(settings: Settings, instance: dg.DagsterInstance) -> tuple[list[dg.RunRequest], list[str], list[Any]]:
    """The runs to ask for now, one line per request about where it stands (closing those that are done), and the
    benchmark partitions those runs need."""
    from shiftbench.erm.backends import published_version
    from shiftbench.erm.search_requests import close_request, open_requests, plan_request

    requests: list[dg.RunRequest] = []
    lines: list[str] = []
    partitions: dict[str, set[str]] = {}
    for path, request in open_requests(settings):
        plans, _ = plan_request(settings, request)
        waiting = [plan for plan in plans if published_version(settings, plan) is None]
        if not waiting:
            close_request(path)
            lines.append(f"search {request.id}: all {len(plans)} runs published")
            continue
        failed = [plan.run for plan in waiting if _failures(instance, plan.run) >= MAX_FAILURES]
        new = [plan for plan in waiting if plan.run not in failed and not _under_way(instance, plan.run)]
        for plan in new:
            kind = registry.kind_of(settings, plan.benchmark)
            requests.append(_run_request(request, plan, kind))
            partitions.setdefault(kind.qualified, set()).add(plan.benchmark)
        done = len(plans) - len(waiting)
        gave_up = f"; failed {MAX_FAILURES} times, not asked for again: {', '.join(failed)}" if failed else ""
        lines.append(f"search {request.id}: {done} of {len(plans)} published, {len(new)} asked for{gave_up}")
    adds = [dg.DynamicPartitionsDefinition(name=q).build_add_request(sorted(b)) for q, b in partitions.items()]
    return requests, lines, adds


def _failures(instance: dg.DagsterInstance, run: str) -> int:
    return len(instance.get_run_ids(dg.RunsFilter(tags={RUN_TAG: run}, statuses=[dg.DagsterRunStatus.FAILURE])))


def _under_way(instance: dg.DagsterInstance, run: str) -> bool:
    return bool(instance.get_run_ids(dg.RunsFilter(tags={RUN_TAG: run}, statuses=UNDER_WAY), limit=1))


def _run_request(request: Any, plan: Any, kind: Any) -> dg.RunRequest:
    """A run of the kind's ERM job for (benchmark, trial), the draw in its config; what the CLI's run would be."""
    from shiftbench.pipelines.cli.train import typed_training

    draw = {"search": plan.config["search"], "search_draw": plan.config["search_draw"]}
    config = typed_training({**request.overrides, **draw})
    if request.preset:
        config["preset"] = request.preset
    return dg.RunRequest(
        job_name=baseline_job_name(kind),
        partition_key=dg.MultiPartitionKey({"benchmark": plan.benchmark, "seed": str(plan.config["seed"])}),
        run_config={"ops": {kind.baseline_op: {"config": config}}},
        tags={SEARCH_TAG: request.id, RUN_TAG: plan.run},
    )


def search_sensor(jobs: Sequence[Any]) -> dg.SensorDefinition:
    """The sensor that trains requested searches through ``jobs`` (the ERM jobs of the kinds that train here)."""

    @dg.sensor(
        name="erm_search_runs",
        jobs=list(jobs),
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Asks for every planned run of a requested search (job erm_search) not yet published or under way.",
    )
    def _sensor(context: dg.SensorEvaluationContext, settings: ShiftbenchSettings) -> dg.SensorResult:
        try:
            requests, lines, partitions = run_requests(settings.get(), context.instance)
        except ShiftbenchError as exc:  # a split gone since the request: said on the tick, nothing asked for
            return dg.SensorResult(skip_reason=dg.SkipReason(str(exc)))
        if not requests:
            return dg.SensorResult(skip_reason=dg.SkipReason("; ".join(lines) or "no search requested"))
        return dg.SensorResult(run_requests=requests, dynamic_partitions_requests=partitions)

    return _sensor
