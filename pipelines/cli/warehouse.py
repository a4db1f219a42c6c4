"""The store and its catalog: ``shiftbench versions``, ``check``, ``catalog`` and ``gc``."""

import argparse
import sys
from typing import TYPE_CHECKING

from shiftbench.config.settings import Settings
from shiftbench.errors import InputError
from shiftbench.pipelines.cli.common import Subcommands

if TYPE_CHECKING:  # imported by the commands that read the store
    from shiftbench.store import Store


def add_versions(sub: Subcommands) -> None:
    versions = sub.add_parser("versions", help="list published versions")
    versions.add_argument("benchmark", nargs="?")
    versions.set_defaults(func=cmd_versions)


def add_check(sub: Subcommands) -> None:
    check = sub.add_parser(
        "check", help="verify the store: records, and the latest versions' files, content hashes and contracts"
    )
    check.add_argument("benchmark", nargs="*")
    check.set_defaults(func=cmd_check)


def add_catalog(sub: Subcommands) -> None:
    catalog = sub.add_parser("catalog", help="recreate the catalog views")
    catalog.set_defaults(func=cmd_catalog)


def add_gc(sub: Subcommands) -> None:
    gc = sub.add_parser("gc", help="delete old versions")
    gc.add_argument("--keep", type=int, default=1)
    gc.add_argument("--dry-run", action="store_true")
    gc.set_defaults(func=cmd_gc)


def cmd_versions(args: argparse.Namespace) -> int:
    from shiftbench.pipelines.terminal import table
    from shiftbench.store import Store

    settings = Settings.from_env()
    store = Store(settings.store_dir)
    versions = store.log.versions(args.benchmark)
    for problem in sorted(store.log.problems):
        print(f"warning: {problem}", file=sys.stderr)
    if not versions and args.benchmark:  # a name never published is bad input, as for `check B`, `leaderboard B`
        raise InputError(_unpublished(store, args.benchmark), parameter="BENCHMARK")
    if not versions:
        print("no published versions")
        return 0
    rows = [
        (
            info.family,
            info.benchmark,
            info.version,
            info.published_at[:19].replace("T", " "),
            "*" if info.is_latest else "",
            info.n_examples,
            info.params.get("hierarchy") or info.params.get("dataset") or "",
        )
        for info in versions
    ]
    print(table(rows, ("family", "benchmark", "version", "first published (UTC)", "latest", "examples", "source")))
    return 0


def _unpublished(store: "Store", name: str) -> str:
    """Why ``versions NAME`` lists nothing, and what is published instead: the paper's name built from other data
    is published as NAME@TAG (``metashift@generated``), else the close names."""
    from shiftbench.families.variants import suggest

    published = sorted({info.benchmark for info in store.log.versions()})
    if not published:
        return f"no published versions of {name}: nothing is published in {store.root}"
    tagged = [other for other in published if other.startswith(f"{name}@")]
    if tagged:
        return f"no published versions of {name}; published: {', '.join(tagged)}"
    listed = f" ({len(published)} benchmark(s) are: `shiftbench versions` lists them)"
    return f"no published versions of {name}{suggest(name, published) or listed}"


def cmd_check(args: argparse.Namespace) -> int:
    """Check every benchmark (or those named): its records, and its latest version's files, content hashes and
    contracts (shiftbench.warehouse.audit); damage is named file by file, exit 1."""
    from shiftbench.store import Store
    from shiftbench.warehouse.audit import check_store

    settings = Settings.from_env()
    audit = check_store(Store(settings.store_dir), args.benchmark, catalog=settings.catalog_path)
    return 1 if audit.findings else 0


def cmd_catalog(args: argparse.Namespace) -> int:
    from shiftbench.warehouse.catalog import refresh_catalog

    settings = Settings.from_env()
    result = refresh_catalog(settings.catalog_path, settings.store_dir)
    if result.changed:
        print(f"{len(result.changed)} listed file(s) changed or gone since the last refresh: their versions re-checked")
    for problem in result.problems:
        print(f"left out (damaged): {problem}")
    print(f"{settings.catalog_path}: {'views refreshed' if result.ok else result.reason}")
    return 0 if result.ok else 1


def cmd_gc(args: argparse.Namespace) -> int:
    """Delete old versions; a benchmark whose records are damaged keeps everything, and says which file (exit 1)."""
    from shiftbench.store import Store
    from shiftbench.warehouse.publishing import refresh_catalog

    settings = Settings.from_env()
    collection = Store(settings.store_dir).retention.garbage_collect(keep=args.keep, dry_run=args.dry_run)
    for path in collection.removed:
        print(("would remove " if args.dry_run else "removed ") + str(path))
    kept = sorted(set(collection.kept))
    for problem in kept:
        print(problem)
    if not collection.removed and not kept:
        print(f"nothing to delete: every benchmark has at most {args.keep} published version(s) and nothing stale")
    if not args.dry_run and collection.removed:
        refresh_catalog(settings)
    return 1 if kept else 0
