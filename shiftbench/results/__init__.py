"""Results for people: tables for papers from the leaderboard (``reporting``), predictions made outside
shiftbench scored on a published split and published (``scored_predictions``, ``shiftbench eval``), and the small
PNG plots of the UI (``plots``).

May import: errors, runtime, tables, config, store, specs, sources, scoring, splits, warehouse, families.
"""
