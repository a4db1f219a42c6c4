"""``shiftbench export``: a published split laid out for other trainers (ImageFolder, WILDS, DomainBed, HF)."""

import argparse
from pathlib import Path

from pipelines.cli.common import Subcommands
from shiftbench.errors import InputError
from shiftbench.settings import Settings


def add_export(sub: Subcommands) -> None:
    export = sub.add_parser("export", help="export a split for other trainers: ImageFolder, WILDS, DomainBed, HF")
    export.add_argument("benchmark")
    export.add_argument("dir", type=Path)
    export.add_argument("--layout", choices=("imagefolder", "wilds", "domainbed", "hf"), default="imagefolder")
    export.add_argument(
        "--environment", metavar="FIELD[,FIELD]", help="domainbed: the fields whose values are the environments (group)"
    )
    export.add_argument("--version", help="split version (default: latest)")
    export.add_argument("--image-root", help="image root (default: the split's); 'standin' renders stand-ins")
    export.add_argument("--path-template", help="image path under the root; {} is the example id")
    export.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from shiftbench.erm.export import EXPORTS, check_target, export_domainbed
    from shiftbench.erm.launch import published_split, resolve_images

    settings = Settings.from_env()
    check_target(args.dir)  # before anything is read: a file, a full or read-only place is one line
    if args.environment and args.layout != "domainbed":
        raise InputError("--environment is for --layout domainbed", parameter="--environment")
    split = published_split(settings, args.benchmark, args.version)
    images = resolve_images(settings, split, args.image_root, args.path_template)
    if args.layout == "domainbed":
        counts = export_domainbed(split, images, args.dir, args.environment or "group")
    else:
        counts = EXPORTS[args.layout](split, images, args.dir)
    total = sum(counts.values())
    detail = ", ".join(f"{name} {n:,}" for name, n in sorted(counts.items()))
    if len(counts) > 8:
        detail = f"{len(counts)} environments of {min(counts.values()):,} to {max(counts.values()):,} images"
    print(
        f"{args.dir}: {args.layout} layout, {total:,} {images.kind} images of {split.benchmark} {split.version} "
        f"({detail})"
    )
    return 0
