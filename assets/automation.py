"""Automation conditions shared by every family (declarative automation, ``since_last_handled``).

- Raw file sources are observed at the nightly tick (their data version is a content fingerprint,
  so unchanged files change nothing downstream). Spec sources are observed by the partition sensor
  (``pipelines/sensors.py``), which reads the spec files anyway, whenever a spec changes.
- Inputs and staged benchmarks that were built before rebuild when a dependency's *data
  version* changed since they were last handled (requested or built), and at once after a
  ``code_version`` bump; those never built are built at the nightly tick. A rebuild with
  identical content changes no data version, so it requests nothing further.
- Publishing follows a rebuild in the same run, or later once the blocking checks passed; the
  store refuses anything else anyway.
- ERM baselines are never started by automation; a baseline that was trained is retrained when
  its split publishes a new version, so results never silently describe an old split.
"""

import dagster as dg

NIGHTLY_CRON = "0 3 * * *"
C = dg.AutomationCondition


def observe_nightly() -> dg.AutomationCondition:
    return (C.cron_tick_passed(NIGHTLY_CRON) & ~C.in_progress()).with_label("observe at the nightly tick")


def _settled() -> dg.AutomationCondition:
    return ~C.any_deps_missing() & ~C.any_deps_in_progress() & ~C.in_progress()


def rebuild() -> dg.AutomationCondition:
    """Rebuild what a changed input, spec or code reaches; build what was never built at the nightly tick.

    Only a partition that was built before rebuilds at once: a new benchmark (a spec added to a
    user's file, or every benchmark of a fresh instance, whose specs are observed for the first
    time) waits for the nightly tick, so starting ``dagster dev`` never starts a full build.
    """
    changed = (C.any_deps_match(C.data_version_changed()) & ~C.missing()).with_label(
        "a dependency's data version changed"
    )
    never_built = (C.missing() & C.cron_tick_passed(NIGHTLY_CRON)).with_label("never built, at the nightly tick")
    either: dg.AutomationCondition = changed | never_built
    wanted = either.since_last_handled() | C.code_version_changed()
    return (wanted & _settled()).with_label("rebuild when inputs, spec or code changed")


def publish() -> dg.AutomationCondition:
    """Publish with the staging in the same run, or once the staged version's blocking checks passed."""
    with_staging = C.any_deps_match(C.will_be_requested()).with_label("staged in the same run")
    checked = C.any_deps_updated().since_last_handled() & C.all_deps_blocking_checks_passed()
    return ((with_staging | checked) & ~C.in_progress()).with_label("publish what passed its checks")


def retrain() -> dg.AutomationCondition:
    """Retrain a baseline that exists when its split published a new version (never start new ones)."""
    new_split = C.any_deps_match(C.data_version_changed()).with_label("the split has a new version")
    return (~C.missing() & new_split.since_last_handled() & _settled()).with_label(
        "retrain trained baselines on a new split version"
    )


def reanalyse() -> dg.AutomationCondition:
    """Rebuild an analysis when a result (or a split) it reads was published since it was last handled."""
    published = C.any_deps_updated().with_label("a result or split it reads was published")
    return (published.since_last_handled() & ~C.any_deps_in_progress() & ~C.in_progress()).with_label(
        "reanalyse when results change"
    )
