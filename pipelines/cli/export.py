"""``shiftbench export``: a published split laid out for other trainers (ImageFolder, WILDS, DomainBed, HF)."""

import argparse
from pathlib import Path

from shiftbench.config.settings import Settings
from shiftbench.pipelines.cli.common import Subcommands

LAYOUTS = ("imagefolder", "wilds", "domainbed", "hf")  # shiftbench.exports.LAYOUTS (imported lazily: polars)
IMAGE_MODES = ("link", "copy", "symlink")  # shiftbench.exports.placing.IMAGE_MODES


def add_export(sub: Subcommands) -> None:
    export = sub.add_parser("export", help="export a split for other trainers: ImageFolder, WILDS, DomainBed, HF")
    export.add_argument("benchmark")
    export.add_argument("dir", type=Path)
    export.add_argument("--layout", choices=LAYOUTS, default="imagefolder")
    export.add_argument(
        "--environment",
        metavar="FIELD[,FIELD]",
        help="domainbed: the fields whose values are the environments (default: split); each must hold every class",
    )
    export.add_argument(
        "--images",
        choices=IMAGE_MODES,
        help="imagefolder, wilds, domainbed: link (default: hard links, copies across filesystems), copy, or "
        "symlink (absolute links: no image bytes, but they dangle when the warehouse moves); hf embeds the images",
    )
    export.add_argument(
        "--val-split",
        metavar="SPLIT",
        help="wilds, hf: the split that is WILDS' val / HF's validation (default: val, else id_val)",
    )
    export.add_argument("--version", help="split version (default: latest)")
    export.add_argument("--image-root", help="image root (default: the split's); 'standin' renders stand-ins")
    export.add_argument("--path-template", help="image path under the root; {} is the example id")
    export.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from shiftbench.exports import ExportOptions, check_target, export
    from shiftbench.families.registry import unpublished_paper_name
    from shiftbench.splits.published import published_split, split_images

    settings = Settings.from_env()
    options = ExportOptions(args.layout, args.environment, args.images, args.val_split)
    options.check()  # flags the layout does not read: one line, before anything is read
    check_target(args.dir)  # a file, a full or read-only place: one line, before anything is read
    split = published_split(settings, args.benchmark, args.version, refusal=unpublished_paper_name)
    images = split_images(settings, split, args.image_root, args.path_template)
    done = export(split, images, args.dir, options)
    counts = done.counts
    what = "environments" if args.layout == "domainbed" else "splits"
    detail = ", ".join(
        f"{i} {name} {n:,}" if what == "environments" else f"{name} {n:,}" for i, (name, n) in enumerate(counts.items())
    )
    if len(counts) > 8:
        detail = f"{len(counts)} environments of {min(counts.values()):,} to {max(counts.values()):,} images"
    print(
        f"{args.dir}: {args.layout} layout, {sum(counts.values()):,} {images.kind} images of {split.benchmark} "
        f"{split.version} ({what}: {detail}); images: {done.placed.describe() if args.layout != 'hf' else 'embedded'}; "
        f"{done.bytes / 1e6:,.1f} MB"
    )
    return 0
