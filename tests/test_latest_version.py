"""One latest version (issue 48): ``versions``, the catalog (what ``sql`` reads) and ``check`` say the same latest
version of a benchmark whatever was done to its publication log (an event removed and ``HEAD`` rewritten, a forged
event, ``HEAD`` set back), and ``check`` names each such change by file, exit 1. Beside: what ``versions B`` says of
a name that was never published."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from shiftbench.config.settings import Settings
from shiftbench.pipelines.cli import main
from shiftbench.store import Store
from shiftbench.tables.fingerprint import canonical_json
from shiftbench.warehouse.catalog import refresh_catalog
from shiftbench.warehouse.publishing import check_version

from .conftest import ToyDir, toy_tables


@dataclass(frozen=True)
class Log:
    """A warehouse whose ``toy`` has three published versions, oldest first, its catalog built."""

    settings: Settings
    store: Store
    versions: list[str]

    @property
    def directory(self) -> Path:
        return self.store.layout.publications_dir("breeds", "toy")

    def events(self) -> list[Path]:
        return sorted(self.directory.glob("*.json"))

    def append(self, version: str, *, head: bool) -> Path:
        """A forged event as a publish writes it (its number and its predecessor's hash right), ``HEAD`` too."""
        events = self.events()
        event = {
            "family": "breeds", "benchmark": "toy", "version": version, "published_at": "2031-01-01T00:00:00+00:00",
            "sequence": len(events) + 1, "previous": hashlib.sha256(events[-1].read_bytes()).hexdigest(),
        }  # fmt: skip
        path = self.directory / f"{1924992000000000000:020d}-{version}.json"
        path.write_text(canonical_json(event))
        if head:
            self.set_head(path)
        return path

    def set_head(self, event: Path) -> None:
        sequence = self.events().index(event) + 1
        head = {"event": event.name, "sequence": sequence, "sha256": hashlib.sha256(event.read_bytes()).hexdigest()}
        (self.directory / "HEAD").write_text(canonical_json(head))


@pytest.fixture
def log(cli_env: Callable[..., Settings], toy_breeds_dir: ToyDir) -> Log:
    settings = cli_env()
    store = Store(settings.store_dir)
    versions = []
    for seed in (0, 3, 5):
        staged = store.writer.stage("breeds", "toy", toy_tables(toy_breeds_dir(), seed=seed))
        check_version(store, staged)
        store.log.publish(staged)
        versions.append(staged.version)
    assert refresh_catalog(settings.catalog_path, settings.store_dir).ok
    return Log(settings, store, versions)


def _remove_the_newest_and_rewrite_head(log: Log) -> tuple[str, Path, str]:
    events = log.events()
    events[-1].unlink()
    log.set_head(events[-2])
    return log.versions[1], events[-1], "a publication event gone from the log, where the catalog saw it"


def _forge_an_event_for_a_version_not_there(log: Log) -> tuple[str, Path, str]:
    forged = log.append("0123456789abcdef", head=True)
    return log.versions[2], forged, "publishes version 0123456789abcdef, which is not in the store"


def _forge_an_event_for_a_version_gc_removed(log: Log) -> tuple[str, Path, str]:
    assert main(["gc", "--keep", "1"]) == 0  # removes the two older versions (their events stay)
    forged = log.append(log.versions[0], head=True)
    return log.versions[2], forged, f"the newest event publishes version {log.versions[0]}, which gc removed"


def _set_head_back(log: Log) -> tuple[str, Path, str]:
    events = log.events()
    log.set_head(events[-2])
    return log.versions[2], events[-1], "after the event the log's head names"


def _forge_an_event_after_head(log: Log) -> tuple[str, Path, str]:
    forged = log.append(log.versions[0], head=False)  # an older version made latest again, HEAD left as it was
    return log.versions[0], forged, "after the event the log's head names"


TAMPERING = {
    "newest event removed, HEAD rewritten": _remove_the_newest_and_rewrite_head,
    "forged event, a version not in the store": _forge_an_event_for_a_version_not_there,
    "forged event, a version gc removed": _forge_an_event_for_a_version_gc_removed,
    "HEAD set back one event": _set_head_back,
    "forged event after HEAD": _forge_an_event_after_head,
}


def _latest_said(capsys: pytest.CaptureFixture[str]) -> tuple[str, str, str, int, list[str]]:
    """The latest version of toy as `versions`, `sql` and `check` say it; check's exit code and lines."""
    assert main(["versions", "toy"]) == 0
    marked = [line.split() for line in capsys.readouterr().out.splitlines() if " * " in f" {line} "]
    [versions] = [row[2] for row in marked]
    assert main(["sql", "SELECT version FROM latest_versions WHERE benchmark = 'toy'", "--csv"]) == 0
    [sql] = capsys.readouterr().out.split()[1:]
    code = main(["check", "toy"])
    lines = capsys.readouterr().out.splitlines()
    [checked] = [line.split()[1].rstrip(":") for line in lines if line.startswith("toy ") and "log head" in line]
    return versions, sql, checked, code, lines


@pytest.mark.parametrize("tampering", TAMPERING)
def test_versions_sql_and_check_say_one_latest_and_check_names_the_change(
    log: Log, capsys: pytest.CaptureFixture[str], tampering: str
) -> None:
    assert _latest_said(capsys)[:4] == (log.versions[2],) * 3 + (0,)
    expected, path, what = TAMPERING[tampering](log)
    versions, sql, checked, code, lines = _latest_said(capsys)
    assert versions == sql == checked == expected, (versions, sql, checked)
    assert code == 1 and any(line.startswith(f"DAMAGED: {path}: ") and what in line for line in lines), lines


def test_a_head_a_publish_did_not_write_is_completed_by_the_next_publish(
    log: Log, capsys: pytest.CaptureFixture[str], toy_breeds_dir: ToyDir
) -> None:
    """A publish that stopped between its event and ``HEAD`` (what "HEAD set back one event" looks like): check
    names it until any publish of the benchmark, even of the version already latest, writes the head."""
    _set_head_back(log)
    assert main(["check", "toy"]) == 1
    capsys.readouterr()
    again = log.store.writer.stage("breeds", "toy", toy_tables(toy_breeds_dir(), seed=5))
    assert again.version == log.versions[2]
    check_version(log.store, again)
    assert not log.store.log.publish(again).changed_latest
    head = json.loads((log.directory / "HEAD").read_text())
    assert head["event"] == log.events()[-1].name and head["sequence"] == 3
    assert main(["check", "toy"]) == 0, capsys.readouterr().out


def test_a_catalog_that_cannot_be_refreshed_is_not_read_when_the_log_names_another_latest(
    log: Log, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from shiftbench.warehouse import catalog

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(catalog, "_write", full)
    _remove_the_newest_and_rewrite_head(log)
    assert main(["sql", "SELECT version FROM latest_versions"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the publication log changed since the catalog was built, and names other" in err


# -- versions B of a name never published: exit 2, as `check B` and `leaderboard B` ---------------------------------
def test_versions_of_a_name_never_published_says_what_is(
    cli_env: Callable[..., Settings], toy_breeds_dir: ToyDir, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = cli_env()
    assert main(["versions", "metashift"]) == 2
    assert capsys.readouterr().err == (
        f"error: parameter 'BENCHMARK': no published versions of metashift: nothing is published in "
        f"{settings.store_dir}\n"
    )
    store = Store(settings.store_dir)
    for name in ("metashift@generated", "living17"):
        staged = store.writer.stage("breeds", name, toy_tables(toy_breeds_dir(), seed=0))
        check_version(store, staged)
        store.log.publish(staged)
    assert main(["versions", "metashift"]) == 2
    assert capsys.readouterr().err == (
        "error: parameter 'BENCHMARK': no published versions of metashift; published: metashift@generated\n"
    )
    assert main(["versions", "living71"]) == 2
    assert capsys.readouterr().err == (
        "error: parameter 'BENCHMARK': no published versions of living71; did you mean living17?\n"
    )
    assert main(["versions", "entity13"]) == 2
    assert capsys.readouterr().err == (
        "error: parameter 'BENCHMARK': no published versions of entity13 (2 benchmark(s) are: `shiftbench versions` "
        "lists them)\n"
    )
    assert main(["versions", "metashift@generated"]) == 0
