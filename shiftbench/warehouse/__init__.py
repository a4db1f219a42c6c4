"""Versions becoming latest, and what reads them: stage -> check -> publish -> refresh the catalog, the one
path every version takes (``publishing``), the DuckDB catalog, its files and one query on it (``catalog``,
``catalog_files``, ``catalog_query``), a shift card and Croissant file per version (``cards``), the shift-magnitude
vocabulary every version's ``shift_magnitudes`` table speaks (``magnitudes``) and ``shiftbench check`` (``audit``).

May import: errors, runtime, tables, config, store, specs, sources, scoring, splits.
"""
