"""What the user sets and the package ships: the typed settings from ``SHIFTBENCH_*`` variables (``settings``),
which families exist, by name, with their settings models, contracts' folders and scoring subsets (``family_registry``,
the registry object: it imports no family), YAML read with each key's line (``located_yaml``), a user's text file
read with one clear error (``textio``), and the package's folders of SQL and contracts (``package_files``).

May import: errors, runtime, tables.
"""
