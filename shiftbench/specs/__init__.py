"""What every family's specs share: the base model, its validators, spec files read and merged (``spec_model``), and
the rule that a paper's benchmark name only ever carries that paper's content (``naming``). The shipped spec files
(``breeds.yaml``, ``metashift.yaml``, ``conds.yaml``, ``erm.yaml``, ``search.yaml``) are package data beside them;
a family's own spec models are its ``specs.py``.

May import: errors, runtime, tables, config, store.
"""
