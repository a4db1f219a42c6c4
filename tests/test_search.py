"""Random hyperparameter search and model selection, DomainBed's way (``shiftbench train ... --search N --trials K``).

Checked: DomainBed's distributions, written out here from its hparams_registry.py (facebookresearch/DomainBed at
b93c22a) independently of specs/search.yaml; draw i the same in every process and on every backend (seeded by name,
one stream per parameter); each (draw, trial) an ordinary run; a pinned value inside its distribution kept, outside
refused; the selection view against a hand computation from the published results; a search started again trains
nothing it finished; the leaderboard's selection column; bad input as one line, exit 2, nothing trained; the same
search on the local Slurm cluster.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from pydantic import ValidationError

from shiftbench.config.settings import Settings
from shiftbench.erm import search
from shiftbench.erm.launch import plan_run
from shiftbench.errors import InputError
from shiftbench.pipelines.cli import main
from shiftbench.scoring.selection import SELECTIONS, check_selections
from shiftbench.store import Store
from shiftbench.warehouse.catalog import open_catalog

from .conftest import copied_home, small_sprites_home

CASE = "sprites-uniform"
QUICK = ["--preset", "quick", "--set", "max_iters=10", "--set", "eval_every=5", "--device", "cpu"]

# DomainBed's registry (hparams_registry.py), read by hand: parameter -> (form, bounds) in shiftbench's names.
DOMAINBED = {
    "irm": {"irm_lambda": ("log_uniform", (-1, 5)), "irm_anneal_iters": ("log_uniform_int", (0, 4))},
    "groupdro": {"groupdro_eta": ("log_uniform", (-3, -1))},
    "coral": {"coral_lambda": ("log_uniform", (-1, 1))},
    "causirl_coral": {"causirl_mmd_gamma": ("log_uniform", (-1, 1))},
    "causirl_mmd": {"causirl_mmd_gamma": ("log_uniform", (-1, 1))},
    "mixup": {"mixup_alpha": ("log_uniform", (-1, 1))},
    "sagnet": {"sagnet_w_adv": ("log_uniform", (-2, 1))},
    "cdann": {
        "cdann_lambda": ("log_uniform", (-2, 2)),
        "cdann_weight_decay_d": ("log_uniform", (-6, -2)),
        "cdann_d_steps_per_g": ("log2_uniform_int", (0, 3)),
        "cdann_grad_penalty": ("log_uniform", (-2, 1)),
        "cdann_beta1": ("choice", (0.0, 0.5)),
        "cdann_mlp_width": ("log2_uniform_int", (6, 10)),
        "cdann_mlp_depth": ("choice", (3, 4, 5)),
        "cdann_mlp_dropout": ("choice", (0.0, 0.1, 0.5)),
    },
}
COMMON = {
    "domainbed": {
        "lr": ("log_uniform", (-5, -3.5)),
        "weight_decay": ("log_uniform", (-6, -2)),
        "batch_size": ("log2_uniform_int", (3, 5.5)),
    },
    "domainbed_small_images": {
        "lr": ("log_uniform", (-4.5, -2.5)),
        "weight_decay": ("value", 0.0),
        "batch_size": ("log2_uniform_int", (3, 9)),
    },
}


def _by_hand(space: str, method: str, draw: int, name: str, form: str, bounds: object) -> object:
    """DomainBed's draw of one parameter, from a RandomState seeded by sha256 of (space, method, draw, name)."""
    seed = int(hashlib.sha256(repr((space, method, draw, name)).encode()).hexdigest(), 16) % (2**31)
    r = np.random.RandomState(seed)
    if form == "value":
        return bounds
    if form == "choice":
        assert isinstance(bounds, tuple)
        return bounds[r.randint(len(bounds))]
    assert isinstance(bounds, tuple)
    u = r.uniform(*bounds)
    return {"log_uniform": 10**u, "log_uniform_int": int(10**u), "log2_uniform_int": int(2**u)}[form]


@pytest.mark.parametrize("space", sorted(COMMON))
@pytest.mark.parametrize("method", ["erm", "reweight", *sorted(DOMAINBED)])
def test_draws_follow_domainbeds_distributions_written_out(space: str, method: str) -> None:
    """Every parameter of every draw 1..20 equals the hand draw from DomainBed's distribution; draw 0 is the
    preset's own values (nothing drawn); no parameter is missing or extra."""
    name, loaded = search.space_for(space, "resnet18")
    expected = {**COMMON[space], **DOMAINBED.get(method, {})}
    assert set(loaded.parameters(method)) == set(expected)
    assert search.draw_values(name, loaded, method, 0) == {}
    for draw in range(1, 21):
        values = search.draw_values(name, loaded, method, draw)
        assert values == {k: _by_hand(space, method, draw, k, *expected[k]) for k in expected}
        for key, value in values.items():
            assert loaded.parameters(method)[key].holds(value), (key, value)


def test_a_draw_is_the_same_in_another_process_and_unmoved_by_a_new_parameter() -> None:
    """Draw 3 of CDANN computed in a fresh interpreter equals this one's; a parameter added to the space leaves
    the others' values as they were (one stream per parameter)."""
    name, space = search.space_for("domainbed", "resnet18")
    here = search.draw_values(name, space, "cdann", 3)
    code = (
        "from shiftbench.erm import search; n, s = search.space_for('domainbed', 'resnet18'); "
        "print(repr(search.draw_values(n, s, 'cdann', 3)))"
    )
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert there.strip() == repr(here)
    wider = space.model_copy(update={"common": {**space.common, "momentum": search.Distribution(uniform=(0.0, 0.9))}})
    widened = search.draw_values(name, wider, "cdann", 3)
    assert {k: v for k, v in widened.items() if k != "momentum"} == here


@pytest.mark.parametrize(
    ("distribution", "inside", "outside"),
    [
        ({"log_uniform": (-5, -3.5)}, [1e-5, 3e-4, 10**-3.5], [0.5, 1e-6, float("nan"), "x", True]),
        ({"log2_uniform_int": (3, 5.5)}, [8, 20, 45], [7, 46, 20.5]),
        ({"log_uniform_int": (0, 4)}, [1, 9999, 10000], [0, 10001]),
        ({"choice": (0.0, 0.5)}, [0.0, 0.5], [0.25]),
        ({"value": 0.0}, [0.0], [1e-4]),
        ({"uniform": (0.1, 0.9)}, [0.1, 0.5], [0.05, 1.0]),
    ],
)
def test_a_distributions_support(distribution: dict[str, object], inside: list[object], outside: list[object]) -> None:
    d = search.Distribution.model_validate(distribution)
    assert all(d.holds(v) for v in inside) and not any(d.holds(v) for v in outside)


@pytest.mark.parametrize(
    "bad", [{}, {"log_uniform": (1, 0)}, {"log_uniform": (0, 1), "choice": (1, 2)}, {"normal": (0, 1)}]
)
def test_a_distribution_with_no_or_two_forms_or_reversed_bounds_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match=r"exactly one of|lower bound|Extra inputs"):
        search.Distribution.model_validate(bad)


@pytest.fixture(scope="module")
def split_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("search") / "base"
    small_sprites_home(home, CASE)
    return home


@pytest.fixture
def home(split_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return copied_home(split_home, tmp_path, monkeypatch)


def test_each_draw_is_a_run_of_its_own_with_its_values_recorded(home: Path) -> None:
    """Draws 0-2 of IRM: three run names, the config recording space and draw, the drawn values in the config
    (a drawn batch capped at the split), a pinned value kept; draw 0 trains the preset's values."""
    settings = Settings.from_env()
    base = {"method": "irm", "max_iters": 10}
    plans = [
        plan_run(settings, CASE, preset="quick", overrides={**base, "search": "auto", "search_draw": d}, seed=1)
        for d in range(3)
    ]
    assert len({p.run for p in plans}) == 3 and all(p.run.endswith(".small_cnn.irm.seed1") for p in plans)
    name, space = search.space_for("auto", "small_cnn")
    assert name == "domainbed_small_images"
    plain = plan_run(settings, CASE, preset="quick", overrides=base, seed=1)
    for draw, plan in enumerate(plans):
        assert plan.config["search"] == name and plan.config["search_draw"] == draw
        drawn = search.draw_values(name, space, "irm", draw)
        drawn["batch_size"] = min(drawn.get("batch_size", plain.config["batch_size"]), plan.n_train)
        expected = {**plain.config, **drawn, "search": name, "search_draw": draw}
        assert plan.config == expected
    pinned = plan_run(
        settings, CASE, preset="quick", overrides={**base, "search": name, "search_draw": 2, "lr": 1e-3}, seed=1
    )
    assert pinned.config["lr"] == 1e-3 and pinned.config["irm_lambda"] == plans[2].config["irm_lambda"]


def test_leave_one_domain_out_and_a_missing_split_are_refused_naming_why() -> None:
    with pytest.raises(InputError, match="needs at least two training domains; b has 1"):
        check_selections("b", ["leave_one_domain_out"], {"train", "id_val", "test"}, 1)
    with pytest.raises(InputError, match="held out, which shiftbench does not train"):
        check_selections("b", ["leave_one_domain_out"], {"train", "id_val", "test"}, 4)
    with pytest.raises(InputError, match="ood_validation selects on the split 'val', which b lacks"):
        check_selections("b", ["training_domain", "ood_validation"], {"train", "id_val", "test"}, 4)
    check_selections("b", list(SELECTIONS), {"train", "id_val", "val", "test"}, 4)


def _published_erm(home: Path) -> dict[str, str]:
    store = Store(home / "store")
    return {v.benchmark: v.version for v in store.log.versions() if v.family == "erm"}


def test_a_search_selects_as_computed_by_hand_resumes_without_retraining_and_fills_the_leaderboard(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """3 draws x 2 trials of GroupDRO through the CLI: six runs published; each selection method's pick per trial
    equals the argmax over draws computed here from erm_results (ties to the lowest draw), its report line the mean
    ± standard error over trials; the same command again trains nothing; the leaderboard shows one row per
    selection method beside the runs (selection none), never one mean over two."""
    command = ["train", CASE, *QUICK, "--in-process", "--set", "method=groupdro", "--search", "3", "--trials", "2"]
    assert main(command) == 0
    out = capsys.readouterr().out
    assert "6 runs (1 benchmark x 3 draws x trials 0,1)" in out and "6 published, 0 failed" in out
    runs = _published_erm(home)
    assert len(runs) == 6
    con, _ = open_catalog(Settings.from_env().catalog_path, Settings.from_env().store_dir)
    with con:
        results = con.sql(
            "SELECT r.run, r.seed, CAST(json_extract_string(u.config, '$.search_draw') AS INT) AS draw, r.eval_split, "
            "r.metric, r.value FROM erm_results AS r JOIN erm_runs AS u USING (run)"
        ).pl()
        picked = con.sql("SELECT selection, trial, draw, n_draws FROM search_selection").pl()
        board = con.sql(
            "SELECT selection, setting, n_seeds, mean FROM leaderboard WHERE eval_split = 'test' AND metric = 'acc_avg'"
        ).pl()
    for name, method in SELECTIONS.items():
        if method.eval_split == "val":  # the sprites split has none: not a row
            assert picked.filter(pl.col("selection") == name).is_empty()
            continue
        for trial in (0, 1):
            scores = results.filter(
                (pl.col("seed") == trial)
                & (pl.col("eval_split") == method.eval_split)
                & (pl.col("metric") == method.metric)
            ).sort("draw")
            best = scores.sort(["value", "draw"], descending=[True, False])["draw"][0]
            row = picked.filter((pl.col("selection") == name) & (pl.col("trial") == trial))
            assert row["draw"].to_list() == [best] and row["n_draws"].to_list() == [3]
        test = results.filter((pl.col("eval_split") == "test") & (pl.col("metric") == "acc_avg"))
        chosen = [
            test.filter((pl.col("seed") == t) & (pl.col("draw") == d))["value"][0]
            for t, d in picked.filter(pl.col("selection") == name).select("trial", "draw").iter_rows()
        ]
        se = np.std(chosen, ddof=1) / np.sqrt(2)
        line = re.search(rf"selection: {re.escape(method.label)}\n  .* test/acc_avg (\S+) ± (\S+) ", out)
        assert line is not None, out
        assert (line[1], line[2]) == (f"{100 * np.mean(chosen):.1f}", f"{100 * se:.1f}")
        rows = board.filter(pl.col("selection") == name)
        assert rows["n_seeds"].to_list() == [2] and rows["mean"][0] == pytest.approx(np.mean(chosen))
        assert rows["setting"].to_list() == [f"quick.search-domainbed_small_images.small_cnn.groupdro:{name}"]
    assert board.filter(pl.col("selection") == "none").height == 3  # the draws, each a setting of its own
    assert main(command) == 0
    again = capsys.readouterr().out
    assert again.count("not retrained") == 6 and "0 runs" in again and _published_erm(home) == runs


@pytest.mark.parametrize(
    ("extra", "parameter", "fragment"),
    [
        (["--search", "2", "--select", "leave_one_domain_out"], "--select", "held out"),
        (["--search", "2", "--select", "ood_validation"], "--select", "which sprites-uniform lacks"),
        (["--search", "2", "--select", "best"], "--select", "unknown selection method 'best'"),
        (["--search", "2", "--set", "lr=0.5"], "lr", "lies outside its distribution"),
        (["--search", "2", "--set", "batch_size=7"], "batch_size", "lies outside its distribution"),
        (["--search", "2", "--search-space", "nope"], "search", "unknown search space 'nope'"),
        (["--search", "2", "--set", "method=sgd"], "method", "unknown method 'sgd'"),
        (["--search", "2", "--model", "resnet9"], "model", "unknown model 'resnet9'"),
        (["--search", "0"], "--search", "draws must be at least 1"),
        (["--search", "2", "--trials", "11"], "--trials", "trials are seeds 0..9"),
        (["--search", "2", "--seeds", "0-1"], "--seeds", "a search's seeds are its trials"),
        (["--trials", "2"], "--trials", "belongs to a search"),
        (["--select", "test_oracle"], "--select", "belongs to a search"),
        (["--search-space", "domainbed"], "--search-space", "belongs to a search"),
        (["--set", "search_draw=2"], "search_draw", "belongs to a search"),
    ],
)
def test_bad_search_input_is_one_line_exit_2_and_trains_nothing(
    home: Path, capsys: pytest.CaptureFixture[str], extra: list[str], parameter: str, fragment: str
) -> None:
    assert main(["train", CASE, *QUICK, "--in-process", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: parameter '{parameter}'") and fragment in err[0], err
    assert _published_erm(home) == {} and not (home / "runs" / "sweeps").exists()


@pytest.mark.slurm
def test_a_search_through_slurm_publishes_the_draws_and_again_submits_nothing(
    home: Path, slurm_cluster: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """2 draws x 1 trial of ERM as one job array on the local cluster (both at once): two runs, the values the same
    as planned here (the job trains the plan's config), the selection report; the same command again submits
    nothing. Selection by hand over several trials is checked in process above: a trial is a seed, and a Slurm
    array of several seeds is tests/test_slurm.py's."""
    command = ["train", CASE, *QUICK, "--backend", "slurm", "--search", "2", "--trials", "1", "--parallel", "2"]
    assert main(command) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\[sweep\] 2 runs as Slurm job array \d+", out, re.MULTILINE), out
    assert "[search] selection: training-domain validation" in out
    runs = _published_erm(home)
    assert len(runs) == 2 and sum(".quick." in run for run in runs) == 0
    assert main(command) == 0
    again = capsys.readouterr().out
    assert "Slurm job array" not in again and "[search] selection" in again and _published_erm(home) == runs


def test_a_search_from_dagster_is_planned_by_its_job_and_trained_by_its_sensor(home: Path) -> None:
    """Job erm_search plans 2 draws x 1 trial and writes the request; one tick of erm_search_runs asks for both runs
    (ERM job, partition (benchmark, trial), the draw in the config), which then train and publish the runs the CLI
    plans; the next tick asks for nothing and closes the request; the selection is in the catalog. A bad value fails
    the job with its one line and requests nothing."""
    import dagster as dg

    from shiftbench.assets.resources import resource_class
    from shiftbench.erm.sweep import plan_sweep
    from shiftbench.pipelines import runs
    from shiftbench.pipelines.cli.common import dagster_instance
    from shiftbench.pipelines.definitions import build_definitions
    from shiftbench.pipelines.search import RUN_TAG

    settings = Settings.from_env()
    instance = dagster_instance(settings)
    parameters = ["max_iters=10", "eval_every=5", "device=cpu"]
    config = {"benchmarks": [CASE], "draws": 2, "preset": "quick", "parameters": parameters}
    bad = runs.run_job(
        instance, "erm_search", config={"ops": {"request_search": {"config": {**config, "select": "x"}}}}
    )
    assert not bad.is_success and "unknown selection method 'x'" in runs.run_error(instance, bad)[0]
    assert not (home / "runs" / "searches").exists()
    assert runs.run_job(instance, "erm_search", config={"ops": {"request_search": {"config": config}}}).is_success
    sensor = next(s for s in build_definitions().sensors or [] if s.name == "erm_search_runs")

    def tick() -> dg.SensorResult:
        result = sensor(dg.build_sensor_context(instance=instance, resources={"settings": resource_class()()}))
        assert isinstance(result, dg.SensorResult)
        return result

    first = tick()
    overrides = {"max_iters": 10, "eval_every": 5, "device": "cpu"}
    planned = plan_sweep(settings, [CASE], [0], preset="quick", overrides=overrides, search=("auto", 2))
    assert [r.tags[RUN_TAG] for r in first.run_requests or []] == [p.run for p in planned]
    for request in first.dynamic_partitions_requests or []:
        assert isinstance(request, dg.AddDynamicPartitionsRequest)
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    for request in first.run_requests or []:
        assert request.job_name is not None
        config = request.run_config
        done = runs.run_job(
            instance, request.job_name, partition_key=request.partition_key, config=config, tags=request.tags
        )
        assert done.is_success
    assert sorted(_published_erm(home)) == sorted(p.run for p in planned)
    second = tick()
    assert not second.run_requests and second.skip_reason is not None
    assert "all 2 runs published" in str(second.skip_reason.skip_message)
    assert [p.suffix for p in (home / "runs" / "searches").iterdir()] == [".done"]
    con, _ = open_catalog(settings.catalog_path, settings.store_dir)
    with con:
        picks = con.sql("SELECT selection, n_draws FROM search_selection ORDER BY 1").fetchall()
    assert picks == [("test_oracle", 2), ("training_domain", 2), ("worst_group", 2)]
