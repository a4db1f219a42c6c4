"""Automation shared by every family: the nightly rebuild condition."""

import dagster as dg

REBUILD_CRON = "0 3 * * *"


def rebuild_condition() -> dg.AutomationCondition:
    """At the nightly tick, rebuild only what a changed input reaches; at once after a code bump.

    ``on_cron`` waits for *all* deps to update after the tick, which never happens for a
    benchmark whose spec changed but whose hierarchy did not. This condition asks instead:
    has *any* dep's data version changed since this asset was last requested or built (or is
    a dep being rebuilt in this same tick, or was this asset never built)? Observable sources
    only count as updated when their data version changes, so unchanged raw files request
    nothing.
    """
    cond = dg.AutomationCondition
    tick = cond.cron_tick_passed(REBUILD_CRON)
    changed_since_built = cond.any_deps_updated().since(cond.newly_requested() | cond.newly_updated())
    dep_rebuilding = cond.any_deps_match(cond.will_be_requested())
    nightly = tick & (cond.missing() | changed_since_built | dep_rebuilding) & ~cond.in_progress()
    return (nightly | cond.code_version_changed()).with_label("nightly rebuild if inputs, spec or code changed")
