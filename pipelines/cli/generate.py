"""``shiftbench generate``: write a benchmark spec chosen from the data (``metashift-dg``: by distance)."""

import argparse
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from shiftbench.config.settings import Settings
from shiftbench.errors import InputError
from shiftbench.pipelines.cli.common import OneLineParser, Subcommands, comma_list, shiftbench_command
from shiftbench.runtime.outputs import output_file, write_output_file

if TYPE_CHECKING:  # imported when a spec is generated: it reads the MetaShift builders
    from shiftbench.metashift.generate import DgRequest


def add_generate(sub: Subcommands) -> None:
    generate = sub.add_parser("generate", help="write a benchmark spec chosen from the data (e.g. by distance)")
    generators = generate.add_subparsers(dest="generator", required=True, parser_class=OneLineParser)
    dg = generators.add_parser(
        "metashift-dg", help="a MetaShift domain-generalization task whose training subsets have increasing distance"
    )
    dg.add_argument("--classes", required=True, metavar="A,B", help="the two classes; B's training varies")
    dg.add_argument("--test", required=True, metavar="B(context)", help="B's test subset, e.g. 'dog(shelf)'")
    dg.add_argument("--n", type=int, default=4, help="number of variants (default 4)")
    dg.add_argument("--quantiles", metavar="Q,...", help="distance quantiles of the variants (default: evenly spaced)")
    dg.add_argument("--name", help="the task's name (default A-B-CONTEXT-dg)")
    dg.add_argument("--train-size", type=int, default=400, help="training images, split over the classes")
    dg.add_argument("--context-kinds", metavar="K,...", help="object,general (default) or attribute")
    dg.add_argument("--out", type=Path, help="write the spec file here (default: stdout)")
    dg.set_defaults(func=cmd_generate_metashift_dg)


def cmd_generate_metashift_dg(args: argparse.Namespace) -> int:
    """Write a distance-controlled MetaShift domain-generalization task spec (shiftbench.metashift.generate)."""
    from shiftbench.families.registry import check_new_name
    from shiftbench.metashift.generate import generate_task

    settings = Settings.from_env()
    if args.out is not None:
        output_file(args.out, "--out")  # before the scenes are read: a directory or a missing folder is one line
    if args.name is not None:
        check_new_name(settings, args.name, "--name")
    task = generate_task(settings, _request(args))
    if args.out is None:
        sys.stdout.write(task.text)
    else:
        write_output_file(args.out, task.text, "--out")
    print(f"{task.name}: {len(task.choices)} variants from {task.n_candidates} candidates", file=sys.stderr)
    for choice in task.choices:
        print(f"  {choice.subset:<30} quantile {choice.quantile:<6g} d={choice.distance:.4f}", file=sys.stderr)
    if args.out is not None:
        build = f"SHIFTBENCH_METASHIFT_SPECS={shlex.quote(str(args.out))} {shiftbench_command()} build metashift"
        print(f"wrote {args.out}: {build}", file=sys.stderr)
    return 0


def _request(args: argparse.Namespace) -> "DgRequest":
    """The command line as the generator's request."""
    from shiftbench.metashift.generate import DgRequest

    classes = comma_list(args.classes)
    if len(classes) != 2:
        raise InputError(f"expected two classes A,B, got {args.classes!r}", parameter="--classes")
    try:
        quantiles = tuple(float(q) for q in args.quantiles.split(",")) if args.quantiles else None
    except ValueError:
        raise InputError(f"expected numbers Q,Q,..., got {args.quantiles!r}", parameter="--quantiles") from None
    kinds = tuple(k.strip() for k in args.context_kinds.split(",")) if args.context_kinds else ("object", "general")
    return DgRequest(
        classes=(classes[0], classes[1]),
        test=args.test,
        n=args.n,
        quantiles=quantiles,
        name=args.name,
        train_size=args.train_size,
        context_kinds=kinds,
    )
