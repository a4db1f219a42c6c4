"""A generated scene-graph sample: the embedded default of the MetaShift pipeline.

Not Visual Genome: a seeded generator that writes scene graphs with real Visual Genome object
names and plants the context structure the paper's cat-vs-dog tasks need (cats and dogs
indoors with sofas, beds, shelves, computers, ...; outdoors with grass, benches, boats, ...),
so the canonical collections and tasks run end to end, at the paper's sizes, with no download.
Image ids start with ``gen-``, the dataset is named ``generated-scenes``, and every published
version records it in ``sources``. Distances and accuracies measured on it say nothing about
Visual Genome.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from shiftbench.tables.fingerprint import sha256_text

DATASET = "generated-scenes"
GENERATOR_VERSION = "generated-scenes-1"

# name -> (animal, place, theme objects, number of images, neighbouring themes). Themes mirror
# the paper's communities; an image borrows an object from a neighbouring theme with
# probability NEIGHBOUR_P, which chains the communities of a class in a known order (for dogs:
# shelf - cabinet - bed - sofa - box - bag - cap - bench - bike - vehicle - grass - boat - surfboard),
# so meta-graph distances grow along the chain.
THEMES: dict[str, tuple[str, str, tuple[str, ...], int, tuple[str, ...]]] = {
    "cat-sofa": ("cat", "indoors", ("cup", "sofa", "chair"), 260, ("cat-shelf", "cat-bed")),
    "cat-bed": (
        "cat",
        "indoors",
        ("bed", "comforter", "sheet", "blanket", "remote control", "pillow", "couch"),
        260,
        ("cat-sofa", "cat-book"),
    ),
    "cat-shelf": ("cat", "indoors", ("container", "shelf", "vase", "bowl"), 150, ("cat-sofa",)),
    "cat-book": (
        "cat",
        "indoors",
        ("books", "book", "television", "bookshelf", "blinds"),
        120,
        ("cat-bed", "cat-computer"),
    ),
    "cat-computer": (
        "cat",
        "indoors",
        ("speaker", "computer", "screen", "laptop", "computer mouse", "keyboard", "monitor", "desk"),
        150,
        ("cat-book", "cat-box"),
    ),
    "cat-box": ("cat", "indoors", ("box", "paper", "suitcase", "bag"), 120, ("cat-computer", "cat-sink")),
    "cat-sink": ("cat", "indoors", ("sink", "bottle", "faucet", "towel", "toilet"), 120, ("cat-box", "cat-home")),
    "cat-home": (
        "cat",
        "indoors",
        (
            "counter",
            "curtain",
            "pot",
            "carpet",
            "toy",
            "floor",
            "plate",
            "rug",
            "food",
            "table",
            "picture",
            "papers",
            "lamp",
        ),
        130,
        ("cat-sink",),
    ),
    "cat-grass": ("cat", "outdoors", ("house", "car", "grass", "bird"), 200, ("cat-yard",)),
    "cat-yard": ("cat", "outdoors", ("fence", "roof", "bench"), 130, ("cat-grass",)),
    "dog-shelf": ("dog", "indoors", ("desk", "screen", "laptop", "shelf", "picture", "chair"), 150, ("dog-cabinet",)),
    "dog-cabinet": (
        "dog",
        "indoors",
        ("floor", "clothes", "towel", "door", "rug", "cabinet"),
        170,
        ("dog-shelf", "dog-bed"),
    ),
    "dog-bed": (
        "dog",
        "indoors",
        ("blanket", "bed", "sheet", "remote control", "pillow", "lamp", "couch", "books", "curtain"),
        170,
        ("dog-cabinet", "dog-sofa"),
    ),
    "dog-sofa": ("dog", "indoors", ("sofa", "television", "carpet", "phone", "book"), 110, ("dog-bed", "dog-box")),
    "dog-box": (
        "dog",
        "indoors",
        ("box", "container", "food", "table", "plate", "cup", "bowl"),
        150,
        ("dog-sofa", "dog-bag"),
    ),
    "dog-bag": ("dog", "indoors", ("bag", "backpack", "purse"), 150, ("dog-box", "dog-cap")),
    "dog-cap": ("dog", "outdoors", ("cap", "scarf", "jacket", "toy", "collar", "tie"), 110, ("dog-bag", "dog-bench")),
    "dog-bench": ("dog", "outdoors", ("bench", "trash can"), 180, ("dog-cap", "dog-bike")),
    "dog-bike": ("dog", "outdoors", ("basket", "woman", "bike", "bicycle"), 180, ("dog-bench", "dog-vehicle")),
    "dog-vehicle": (
        "dog",
        "outdoors",
        ("car", "motorcycle", "truck", "skateboard"),
        150,
        ("dog-bike", "dog-grass"),
    ),
    "dog-grass": (
        "dog",
        "outdoors",
        ("house", "grass", "horse", "cow", "sheep", "animal"),
        160,
        ("dog-vehicle", "dog-boat"),
    ),
    "dog-street": ("dog", "outdoors", ("fence", "dirt", "helmet", "snow", "fire hydrant", "pole"), 130, ("dog-grass",)),
    "dog-boat": ("dog", "outdoors", ("frisbee", "rope", "flag", "trees", "boat"), 180, ("dog-grass", "dog-surfboard")),
    "dog-surfboard": ("dog", "outdoors", ("water", "surfboard", "sand"), 180, ("dog-boat",)),
    "cat-with-dog": ("cat", "indoors", ("dog", "sofa", "floor"), 60, ()),  # removed by the leakage rule
}
CLASSES = tuple(sorted({theme[0] for theme in THEMES.values()}))  # the classes it has images of
NEIGHBOUR_P = 0.4
# Scene-wide objects that appear in many images of a place: they connect its themes.
BACKGROUND = {"indoors": ("wall", "window", "light", "ceiling"), "outdoors": ("sky", "tree", "cloud", "road")}
PLACES = {"indoors": ("living room", "bedroom", "kitchen"), "outdoors": ("park", "street", "field", "beach")}
WEATHER = ("clear", "sunny", "cloudy", "overcast")
ANIMAL_ATTRIBUTES = ("black", "white", "brown", "gray", "orange", "sitting", "lying", "standing", "sleeping", "small")
OBJECT_ATTRIBUTES = ("white", "brown", "black", "wooden", "red", "blue", "green", "large", "small", "metal")


def generate_scene_tables(seed: int = 0, scale: float = 1.0) -> tuple[pl.DataFrame, pl.DataFrame, str]:
    """(objects, images, fingerprint) of the generated sample; ``scale`` multiplies every theme's size."""
    rng = np.random.default_rng(seed)
    objects: list[tuple[str, str, str, list[str]]] = []
    images: list[tuple[str, str | None, str | None, list[str]]] = []
    number = 0
    for animal, place, theme, count, neighbours in THEMES.values():
        for _ in range(max(1, round(count * scale))):
            number += 1
            image_id = f"gen-{number:07d}"
            names = [animal]
            k = int(rng.integers(2, min(4, len(theme)) + 1))
            names += [str(x) for x in rng.choice(theme, size=k, replace=False)]
            names += [str(x) for x in BACKGROUND[place] if rng.random() < 0.35]
            if neighbours and rng.random() < NEIGHBOUR_P:
                other = THEMES[neighbours[int(rng.integers(len(neighbours)))]][2]
                names.append(str(other[int(rng.integers(len(other)))]))
            for index, name in enumerate(dict.fromkeys(names)):
                pool = ANIMAL_ATTRIBUTES if name == animal else OBJECT_ATTRIBUTES
                n_attributes = int(rng.integers(1, 3)) if name == animal else int(rng.integers(0, 2))
                attributes = sorted({str(a) for a in rng.choice(pool, size=n_attributes, replace=False)})
                objects.append((image_id, f"{number}{index:02d}", name, attributes))
            location = place if rng.random() < 0.7 else str(rng.choice(PLACES[place]))
            weather = str(rng.choice(WEATHER)) if place == "outdoors" and rng.random() < 0.8 else None
            images.append((image_id, location, weather, []))
    object_frame = pl.DataFrame(
        objects,
        schema={"image_id": pl.String, "object_id": pl.String, "name": pl.String, "attributes": pl.List(pl.String)},
        orient="row",
    )
    image_frame = pl.DataFrame(
        images,
        schema={"image_id": pl.String, "location": pl.String, "weather": pl.String, "general": pl.List(pl.String)},
        orient="row",
    )
    return object_frame, image_frame, sha256_text(f"{GENERATOR_VERSION}|seed={seed}|scale={scale}")
