"""What a benchmark family is and how its benchmarks are built: ``Family``, ``Kind``, ``Input`` (``family``),
the registered families, typed, and the rules on names across them (``registry``), builds of a family's benchmarks
(``benchmark_builds``), named variants (``variants``), what a command decides before it runs (``plans``), the one
row of a version's ``benchmarks`` table (``benchmarks_table``) and the papers' analyses (``analysis``). A family's
own code is its package (``shiftbench/breeds``, ``metashift``, ``conds``), which reaches this one through the
registry.

May import: errors, runtime, tables, config, store, specs, sources, scoring, splits, warehouse.
"""
