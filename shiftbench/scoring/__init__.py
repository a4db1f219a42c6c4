"""The vocabulary results are scored in, numpy and polars only (training imports it): WILDS-style metrics
(``metrics``), the training objectives' names (``method_names``), groups as WILDS' CombinatorialGrouper
(``grouper``), what a worst-group accuracy is over (``worst_group``), DomainBed's model-selection rules
(``selection``), the training-conflicts regression (``training_conflicts``) and whose images a result is on
(``provenance``: real, generated or stand-in).

May import: errors, runtime, tables, config, store, specs, sources.
"""
