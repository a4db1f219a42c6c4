"""Data contracts (ODCS v3 YAML: shared tables in ``data_contracts/``, a family's own in its package's
``contracts/``) and their enforcement with DuckDB.

Each published table has one contract. A contract is parsed with the ODCS pydantic model
(``open-data-contract-standard``), so a typo in a field name fails loudly, and turned into
rules that run as SQL over the staged Parquet files:

- schema: every column present with its ``physicalType`` (a DuckDB type), no undeclared column
  (unless the schema's ``customProperties`` allow ``additionalColumns`` of one type);
- ``required`` properties have no NULLs; ``primaryKey`` properties (in ``primaryKeyPosition``
  order) form a unique key; ``unique`` properties have no duplicates; ``enum`` lists the
  allowed values;
- ``quality`` entries: ODCS library metrics (``nullValues``, ``invalidValues`` with
  ``arguments.validValues``, ``duplicateValues`` with ``arguments.properties``, ``rowCount``),
  shiftbench's own library metric ``nonFiniteValues`` (on a ``DOUBLE`` or ``DOUBLE[]`` column: the rows
  holding NaN or an infinity, which SQL's comparisons let through and which no float column may hold: an
  undefined value is NULL) and ``type: sql`` rules whose ``query`` returns one number compared with
  ``mustBe``/``mustBeGreaterThan``/... . In a query ``${object}`` names the contract's table;
  the other tables of the same version are visible under their own names;
- ``type: custom`` rules with ``engine: shiftbench`` and ``implementation: shiftbench.<module>:<function>``:
  the few rules SQL cannot run in reasonable time on large versions (MetaShift's edge overlaps). The
  function gets the version's table files and returns the number compared; its module's source is part
  of the contract's fingerprint, so editing it invalidates earlier check records as editing the YAML does.

The same rules back the blocking Dagster asset checks and the tests.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import duckdb
import yaml
from open_data_contract_standard.model import (
    DataQuality,
    OpenDataContractStandard,
    SchemaObject,
    SchemaProperty,
)
from pydantic import ValidationError

from shiftbench.config.family_registry import REGISTRY
from shiftbench.config.package_files import CONTRACTS_DIR
from shiftbench.config.settings import Settings
from shiftbench.errors import InputError

# Shared tables' contracts in ``data_contracts/``; a packaged family keeps its own tables' in a folder of its name
# there (``data_contracts/breeds/``), a family registered from outside the package in the folder it names.
# libyaml's parser where PyYAML was built with it: the same documents, 10x faster (the 34 contracts: 0.2 -> 0.02 s)
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
CUSTOM_ENGINE = "shiftbench"  # the engine of type: custom rules (functions of this package)
NON_FINITE = "nonFiniteValues"  # shiftbench's library metric: rows holding NaN or an infinity
_FLOAT_TYPES = {"DOUBLE", "FLOAT", "REAL", "FLOAT8", "FLOAT4"}
# A table file up to this size is read into memory once: its contract runs dozens of queries, each of which would
# re-read the Parquet file through a view (a sprites case's checks: 0.27 s as views, 0.13 s in memory). Larger files
# stay views that DuckDB streams within SHIFTBENCH_CHECK_MEMORY (a GQA-scale distance table).
IN_MEMORY_BYTES = 8 * 1024 * 1024
_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "mustBe": lambda v, t: v == t,
    "mustNotBe": lambda v, t: v != t,
    "mustBeGreaterThan": lambda v, t: v > t,
    "mustBeGreaterOrEqualTo": lambda v, t: v >= t,
    "mustBeLessThan": lambda v, t: v < t,
    "mustBeLessOrEqualTo": lambda v, t: v <= t,
    "mustBeBetween": lambda v, t: t[0] <= v <= t[1],
    "mustNotBeBetween": lambda v, t: not t[0] <= v <= t[1],
}


@dataclass(frozen=True)
class Contract:
    table: str
    path: Path
    model: OpenDataContractStandard
    sha256: str = ""  # of the file as it was loaded: a check is tied to the rules it ran

    @property
    def schema(self) -> SchemaObject:
        assert self.model.schema_ is not None
        return self.model.schema_[0]

    @property
    def properties(self) -> list[SchemaProperty]:
        return list(self.schema.properties or [])

    @property
    def columns(self) -> dict[str, str]:
        """Column name -> DuckDB type, in contract order."""
        return {str(p.name): str(p.physicalType) for p in self.properties}

    @property
    def additional_columns_type(self) -> str | None:
        """Type of undeclared columns the table may have (``customProperties: additionalColumns``).

        For tables with one column per attribute of a dataset (``conds_examples``): the names
        vary by dataset, the type does not.
        """
        for custom in self.schema.customProperties or []:
            if custom.property == "additionalColumns":
                return str(custom.value)
        return None

    @property
    def store_key(self) -> str:
        """The column naming the store entry a row's version belongs to (``customProperties: storeKey``).

        ``benchmark`` for split tables; ``run`` for ERM results, whose ``benchmark`` column names the
        split they were trained on while the version is the run's.
        """
        for custom in self.schema.customProperties or []:
            if custom.property == "storeKey":
                return str(custom.value)
        return "benchmark"

    @property
    def primary_key(self) -> list[str]:
        keyed = [p for p in self.properties if p.primaryKey]
        return [str(p.name) for p in sorted(keyed, key=lambda p: p.primaryKeyPosition or 0)]


@dataclass(frozen=True)
class RuleResult:
    table: str
    rule: str
    passed: bool
    observed: Any
    expected: str
    description: str = ""

    def line(self) -> str:
        """``table.rule: observed X, expected Y``: how every report names a rule's outcome."""
        return f"{self.table}.{self.rule}: observed {self.observed}, expected {self.expected}"


def load_contract(path: Path) -> Contract:
    try:
        text = path.read_text(encoding="utf-8")
        raw = yaml.load(text, Loader=_YAML_LOADER)
    except FileNotFoundError:
        raise InputError("contract not found", path=path) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise InputError(f"invalid YAML: {exc}", path=path, line=mark.line + 1 if mark else None) from None
    try:
        model = OpenDataContractStandard(**raw)
    except (ValidationError, TypeError) as exc:
        raise InputError(f"not a valid ODCS contract: {exc}", path=path) from None
    if model.kind != "DataContract" or not (model.apiVersion or "").startswith("v3"):
        raise InputError("expected kind DataContract and an ODCS v3 apiVersion", path=path)
    if not model.schema_ or len(model.schema_) != 1 or not model.schema_[0].name:
        raise InputError("expected exactly one schema object (the table)", path=path)
    digest = hashlib.sha256(text.encode("utf-8"))
    rules = list(model.schema_[0].quality or []) + [
        q for p in model.schema_[0].properties or [] for q in p.quality or []
    ]
    for quality in rules:
        if quality.type == "custom":  # the code a rule runs is part of the rules checked
            digest.update(_custom_module_source(quality, path))
    contract = Contract(str(model.schema_[0].name), path, model, digest.hexdigest())
    for prop in contract.properties:
        if not prop.name or not prop.physicalType:
            raise InputError(f"property {prop.name!r} needs a name and a physicalType", path=path)
    return contract


def _custom_target(quality: DataQuality, path: Path) -> tuple[str, str]:
    """(module, function) of a ``type: custom`` rule; only this package's functions run."""
    name = quality.name or "custom"
    target = quality.implementation if isinstance(quality.implementation, str) else ""
    module, _, function = target.partition(":")
    if quality.engine != CUSTOM_ENGINE or not module.startswith(f"{CUSTOM_ENGINE}.") or not function.isidentifier():
        raise InputError(
            f"custom rule {name!r} needs engine: {CUSTOM_ENGINE} and implementation: "
            f"{CUSTOM_ENGINE}.<module>:<function>",
            path=path,
        )
    return module, function


def _custom_module_source(quality: DataQuality, path: Path) -> bytes:
    module, _ = _custom_target(quality, path)
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise InputError(f"custom rule {quality.name!r}: no module {module}", path=path)
    return Path(spec.origin).read_bytes()


def _custom_function(quality: DataQuality, path: Path) -> Callable[[Mapping[str, Path]], Any]:
    module, function = _custom_target(quality, path)
    found = getattr(importlib.import_module(module), function, None)
    if not callable(found):
        raise InputError(f"custom rule {quality.name!r}: {module} has no function {function}", path=path)
    return found  # type: ignore[no-any-return]


@cache
def _load_all(directories: tuple[Path, ...], stamp: tuple[tuple[str, int, int], ...]) -> dict[str, Contract]:
    loaded: dict[str, Contract] = {}
    for directory in directories:
        for path in sorted(directory.glob("*.yaml")):
            contract = load_contract(path)
            if contract.table in loaded:
                raise InputError(f"a second contract for table {contract.table!r}", path=path)
            loaded[contract.table] = contract
    return loaded


def contracts(directory: Path = CONTRACTS_DIR) -> dict[str, Contract]:
    """Every contract (the shared ones and the registered families' own), loaded again when a file changed (a
    long-lived process checks today's rules)."""
    directories = [directory.resolve()]
    if directory == CONTRACTS_DIR:  # the shared contracts, the packaged families' and the registered ones'
        packaged = sorted(p.resolve() for p in CONTRACTS_DIR.iterdir() if p.is_dir())
        registered = [p.resolve() for p in REGISTRY.contract_directories()]
        directories = list(dict.fromkeys([*directories, *packaged, *registered]))
    files = [p for d in directories for p in sorted(d.glob("*.yaml"))]
    stamp = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in files)
    return _load_all(tuple(directories), stamp)


def contract_for(table: str, directory: Path = CONTRACTS_DIR) -> Contract:
    found = contracts(directory).get(table)
    if found is None:
        raise InputError(f"no contract for table {table!r} in {directory}", parameter="table")
    return found


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def _compare(quality: DataQuality) -> tuple[str, Any] | None:
    for operator in _OPERATORS:
        value = getattr(quality, operator)
        if value is not None:
            return operator, value
    return None


class _Checker:
    def __init__(self, con: duckdb.DuckDBPyConnection, contract: Contract, files: Mapping[str, Path]) -> None:
        self.con = con
        self.files = files
        self.contract = contract
        self.table = _quote(contract.table)
        self.results: list[RuleResult] = []

    def scalar(self, sql: str) -> Any:
        row = self.con.execute(sql).fetchone()
        return None if row is None else row[0]

    def add(self, rule: str, observed: Any, operator: str, threshold: Any, description: str = "") -> None:
        passed = observed is not None and bool(_OPERATORS[operator](observed, threshold))
        self.results.append(
            RuleResult(self.contract.table, rule, passed, observed, f"{operator} {threshold}", description)
        )

    def schema(self) -> bool:
        described = self.con.execute(f"DESCRIBE SELECT * FROM {self.table}").fetchall()
        actual = {str(row[0]): str(row[1]) for row in described}
        problems = []
        for column, expected in self.contract.columns.items():
            if column not in actual:
                problems.append(f"missing column {column}")
            elif actual[column].upper() != expected.upper():
                problems.append(f"{column} is {actual[column]}, contract says {expected}")
        extra_type = self.contract.additional_columns_type
        for column in [c for c in actual if c not in self.contract.columns]:
            if extra_type is None:
                problems.append(f"undeclared column {column}")
            elif actual[column].upper() != extra_type.upper():
                problems.append(f"additional column {column} is {actual[column]}, contract allows {extra_type}")
        self.results.append(
            RuleResult(
                self.contract.table,
                "schema",
                not problems,
                "; ".join(problems) or "ok",
                "columns and types as declared",
            )
        )
        return not problems

    def key(self, rule: str, columns: Sequence[str], description: str) -> None:
        cols = ", ".join(_quote(c) for c in columns)
        # As many distinct 64-bit hashes of the key as rows proves the key unique, with a hash table of
        # integers instead of the keys' strings (a 27 M-row distance table: 1.7 s instead of 17 s). Fewer
        # (a duplicate, or a hash collision) falls back to counting duplicated keys exactly.
        if self.scalar(f"SELECT count(*) = count(DISTINCT hash({cols})) FROM {self.table}"):
            self.add(rule, 0, "mustBe", 0, description)
            return
        dupes = self.scalar(f"SELECT count(*) FROM (SELECT {cols} FROM {self.table} GROUP BY ALL HAVING count(*) > 1)")
        self.add(rule, dupes, "mustBe", 0, description)

    def properties(self) -> None:
        for prop in self.contract.properties:
            column = _quote(str(prop.name))
            if prop.required:
                nulls = self.scalar(f"SELECT count(*) FROM {self.table} WHERE {column} IS NULL")
                self.add(f"{prop.name}: required", nulls, "mustBe", 0, "no NULL values")
            if prop.unique:
                self.key(f"{prop.name}: unique", [str(prop.name)], "no duplicate values")
            if prop.enum:
                allowed = ", ".join(_literal(e.value) for e in prop.enum)
                invalid = self.scalar(
                    f"SELECT count(*) FROM {self.table} WHERE {column} IS NOT NULL AND {column} NOT IN ({allowed})"
                )
                self.add(f"{prop.name}: enum", invalid, "mustBe", 0, f"values in ({allowed})")
            for quality in prop.quality or []:
                self.quality(quality, str(prop.name))

    def non_finite(self, column: str, rule: str) -> str:
        """The SQL condition of a row whose ``column`` holds NaN or an infinity (a list: in any element; the largest
        element is NaN when any is, as DuckDB orders NaN above every number)."""
        kind = self.contract.columns.get(column, "").upper()
        quoted = _quote(column)
        if kind in _FLOAT_TYPES:
            return f"NOT isfinite({quoted})"
        if kind.endswith("[]") and kind[:-2] in _FLOAT_TYPES:
            return f"NOT isfinite(list_max({quoted})) OR NOT isfinite(list_min({quoted}))"
        raise InputError(
            f"quality rule {rule!r}: {NON_FINITE} needs a DOUBLE or DOUBLE[] column", path=self.contract.path
        )

    def quality(self, quality: DataQuality, column: str | None) -> None:
        comparison = _compare(quality)
        name = quality.name or quality.metric or quality.rule or "quality"
        rule = f"{column}: {name}" if column else name
        if comparison is None:
            raise InputError(f"quality rule {rule!r} has no mustBe* comparison", path=self.contract.path)
        operator, threshold = comparison
        description = quality.description or ""
        metric = quality.metric or quality.rule
        args = quality.arguments or {}
        if quality.type == "sql":
            if not quality.query:
                raise InputError(f"sql rule {rule!r} has no query", path=self.contract.path)
            sql = quality.query.replace("${object}", self.table).replace("${property}", _quote(column or ""))
            try:
                observed = self.scalar(sql)
            except duckdb.Error as exc:
                raise InputError(f"sql rule {rule!r} failed: {exc}", path=self.contract.path) from None
        elif quality.type == "custom":
            observed = _custom_function(quality, self.contract.path)(self.files)
        elif metric == "nullValues" and column:
            observed = self.scalar(f"SELECT count(*) FROM {self.table} WHERE {_quote(column)} IS NULL")
        elif metric == "invalidValues" and column:
            allowed = ", ".join(_literal(v) for v in args.get("validValues", []))
            observed = self.scalar(
                f"SELECT count(*) FROM {self.table} WHERE {_quote(column)} NOT IN ({allowed or 'NULL'})"
            )
        elif metric == "duplicateValues":
            columns = list(args.get("properties") or ([column] if column else []))
            cols = ", ".join(_quote(str(c)) for c in columns)
            observed = self.scalar(
                f"SELECT count(*) FROM (SELECT {cols} FROM {self.table} GROUP BY ALL HAVING count(*) > 1)"
            )
        elif metric == "rowCount":
            observed = self.scalar(f"SELECT count(*) FROM {self.table}")
        elif metric == NON_FINITE and column:
            observed = self.scalar(f"SELECT count(*) FROM {self.table} WHERE {self.non_finite(column, rule)}")
        else:
            raise InputError(f"unsupported quality rule {rule!r} (type {quality.type!r})", path=self.contract.path)
        self.add(rule, observed, operator, threshold, description)


def check_contract(
    con: duckdb.DuckDBPyConnection, contract: Contract, files: Mapping[str, Path] | None = None
) -> list[RuleResult]:
    """Run every rule of ``contract`` against the relation named ``contract.table`` in ``con`` (custom rules read
    the version's ``files``)."""
    checker = _Checker(con, contract, files or {})
    if not checker.schema():
        return checker.results  # the other rules would fail on missing columns for no new reason
    if contract.primary_key:
        checker.key("primary key", contract.primary_key, f"({', '.join(contract.primary_key)}) unique")
    checker.properties()
    for quality in contract.schema.quality or []:
        checker.quality(quality, None)
    return checker.results


def empty_relation(columns: Mapping[str, str]) -> str:
    """A typed relation without rows, so that queries over an absent table still bind."""
    cols = ", ".join(f"CAST(NULL AS {kind}) AS {_quote(name)}" for name, kind in columns.items())
    return f"(SELECT {cols} WHERE FALSE)"


def connect_tables(tables: Mapping[str, Path]) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with one relation per table file (a table read once, or a view over a large file), as
    contract queries expect.

    Contract tables a version does not have (a MetaShift collection has no ``examples``) are
    empty views, so cross-table rules see zero rows instead of failing to bind.
    """
    # DuckDB's own default is 80 % of RAM, which a GQA-scale collection's self-joins took: the setting bounds it.
    limit = Settings.from_env().check_memory
    try:
        con = duckdb.connect(
            config={
                "memory_limit": limit,
                "temp_directory": str(Path(tempfile.gettempdir()) / "shiftbench-duckdb"),
                "preserve_insertion_order": False,  # counts only: lets DuckDB spill joins and aggregates
            }
        )
    except duckdb.Error:
        raise InputError(
            f"not a memory size such as 1GB or 512MB: {limit!r}", parameter="SHIFTBENCH_CHECK_MEMORY"
        ) from None
    statements = []
    for name, path in tables.items():
        small = path.is_file() and path.stat().st_size <= IN_MEMORY_BYTES
        relation = "TEMP TABLE" if small else "VIEW"
        statements.append(f"CREATE {relation} {_quote(name)} AS SELECT * FROM read_parquet({_literal(str(path))})")
    for name, contract in contracts().items():
        if name not in tables:
            statements.append(f"CREATE VIEW {_quote(name)} AS SELECT * FROM {empty_relation(contract.columns)}")
    con.execute(";\n".join(statements))  # one call: DuckDB parses and runs them in turn
    return con


def check_tables(tables: Mapping[str, Path], only: Sequence[str] | None = None) -> dict[str, list[RuleResult]]:
    """Check the given table files (one version) against their contracts."""
    con = connect_tables(tables)
    try:
        return {name: check_contract(con, contract_for(name), tables) for name in (only or sorted(tables))}
    finally:
        con.close()


def failures(results: Mapping[str, list[RuleResult]]) -> list[RuleResult]:
    return [r for rules in results.values() for r in rules if not r.passed]


def contracts_fingerprint(tables: Sequence[str], directory: Path = CONTRACTS_DIR) -> str:
    """Hash of the contracts of ``tables`` (their files, and the code of their custom rules): a check is valid only
    under the contracts it ran."""
    digest = hashlib.sha256()
    loaded = contracts(directory)
    for table in sorted(tables):
        contract = loaded.get(table)
        digest.update(f"{table}\0{contract.sha256 if contract is not None else '(no contract)'}\n".encode())
    return digest.hexdigest()
