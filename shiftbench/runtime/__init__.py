"""The process's plumbing, light enough for the training job (which runs where polars is absent): how many CPUs
it may use (``cpus``), memory given back between stages (``memory``), progress events (``progress``), named random
generators (``seeding``), the content-addressed cache under ``$SHIFTBENCH_HOME/cache`` (``cache``), and where a
command writes, checked first and written whole or not at all (``outputs``).

May import: errors.
"""
