"""ConDS: strict CelebA parsing, every canonical case on the real fixture and on the generated
sprites (checked by an independent re-statement of each shift's definition and by the contracts),
property-based tests of the engine on random attribute tables, clear errors, determinism, CLI."""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shiftbench.conds import family as cp
from shiftbench.conds.attributes import attribute_table
from shiftbench.conds.engine import draw_case
from shiftbench.conds.specs import Attribute, CaseSpec, load_specs, parse_specs
from shiftbench.config.settings import Settings
from shiftbench.errors import InputError
from shiftbench.sources import sprites
from shiftbench.sources.attribute_tables import read_attribute_table
from shiftbench.sources.celeba import read_celeba_attributes
from shiftbench.store.contracts import failures
from shiftbench.warehouse.publishing import check_staged

from .conftest import FIXTURES, stage_one

CELEBA = FIXTURES / "celeba" / "list_attr_celeba_first20000.txt"
TRUNCATED = FIXTURES / "celeba" / "list_attr_celeba_truncated_header_mismatch.txt"
SPECS = load_specs()
TRAINING = ("train", "id_val")


@pytest.fixture(scope="module")
def celeba_table() -> pl.DataFrame:
    raw = read_celeba_attributes(CELEBA).table.rename({"image_id": "example_id"})
    return attribute_table(raw, SPECS.datasets["celeba"])


@pytest.fixture(scope="module")
def sprites_table() -> pl.DataFrame:
    return attribute_table(sprites.attribute_frame(sprites.sprites(100, 0)), SPECS.datasets["sprites"])


def assert_definition(case: CaseSpec, table: pl.DataFrame, assignments: pl.DataFrame) -> None:
    """Each shift's definition, stated again from the paper, checked on a drawn split."""
    names = [case.label.name, *[a.name for a in case.attributes]]
    data = assignments.join(table, on="example_id", how="left")
    assert data.select(pl.col(names).is_null().any()).row(0) == tuple([False] * len(names))
    assert assignments["example_id"].is_unique().all(), "an example is in two splits"
    drawn = data.filter(pl.col("split").is_in(TRAINING))
    test = data.filter(pl.col("split") == "test")
    n_cells = math.prod(len(a.values) for a in [case.label, *case.attributes])
    per_cell = test.group_by(names).len()
    assert per_cell.height == n_cells and set(per_cell["len"]) == {case.test_per_cell}, "test is not uniform"
    size = drawn.height
    if case.train_size is not None:
        assert size == case.train_size
    assert data.filter(pl.col("split") == "id_val").height == math.floor(size * case.id_val_fraction + 0.5)
    cells_per_value = {a.name: n_cells // len(a.values) for a in [case.label, *case.attributes]}
    for attribute in [case.label, *case.attributes]:
        counts = {v: drawn.filter(pl.col(attribute.name) == v).height for v in attribute.values}
        shift = case.shift_of(attribute.name)
        if shift == "none":  # uniform up to rounding (each cell within 1.5 of its quota)
            assert max(counts.values()) - min(counts.values()) <= 3 * cells_per_value[attribute.name]
        elif shift == "uds":
            unseen = case.uds_unseen_values[attribute.name]
            assert all(counts[v] == 0 for v in unseen)
            assert all(test.filter(pl.col(attribute.name) == v).height > 0 for v in unseen)
        elif shift == "ldd":
            rare = case.ldd_rare_values[attribute.name]
            tolerance = 1.5 * cells_per_value[attribute.name] * (1 + case.ldd_rare_frequency)
            for r in rare:
                for c in [v for v in attribute.values if v not in rare]:
                    assert abs(counts[r] - case.ldd_rare_frequency * counts[c]) <= tolerance
        elif shift == "sc":
            aligned = {y: case.aligned_value(attribute.name, y) for y in case.label.values}
            counter = drawn.filter(pl.col(attribute.name) != pl.col(case.label.name).replace_strict(aligned)).height
            assert counter == math.floor(size * case.sc_counterexample_fraction + 0.5)


# -- CelebA ---------------------------------------------------------------------------------------
def test_celeba_reader_is_strict(tmp_path: Path) -> None:
    celeba = read_celeba_attributes(CELEBA)
    assert celeba.table.height == 20000 and celeba.table.width == 42 and not celeba.partial
    assert celeba.table["image_id"][0] == "000001.jpg" and set(celeba.table["Male"].unique()) == {1, -1}
    with pytest.raises(InputError, match=r"truncated_header_mismatch.txt:1: header says 202599 images but the file"):
        read_celeba_attributes(TRUNCATED)
    partial = read_celeba_attributes(TRUNCATED, allow_partial=True)
    assert partial.partial and partial.table.height == 500 and partial.header_count == 202599

    lines = CELEBA.read_text().splitlines()
    bad_value = tmp_path / "bad_value.txt"
    bad_value.write_text("\n".join(["3", lines[1], lines[2], lines[3].replace(" 1", " 0", 1), lines[4]]) + "\n")
    with pytest.raises(InputError, match=r"bad_value.txt:4: .* is '0'; values must be 1 or -1"):
        read_celeba_attributes(bad_value)
    short = tmp_path / "short.txt"
    short.write_text("\n".join(["2", lines[1], lines[2], " ".join(lines[3].split()[:-1])]) + "\n")
    with pytest.raises(InputError, match=r"short.txt:4: expected an image name and 40 values \(41 fields\), found 40"):
        read_celeba_attributes(short)
    names = tmp_path / "names.txt"
    names.write_text("\n".join(["1", "Male Smiling", lines[2]]) + "\n")
    with pytest.raises(InputError, match=r"names.txt:2: expected 40 distinct attribute names, found 2"):
        read_celeba_attributes(names)


def test_celeba_partition_file_is_joined_and_checked(tmp_path: Path) -> None:
    shutil.copy(TRUNCATED, tmp_path / "list_attr_celeba.txt")
    ids = read_celeba_attributes(TRUNCATED, allow_partial=True).table["image_id"].to_list()
    (tmp_path / "list_eval_partition.txt").write_text("".join(f"{i} {k % 3}\n" for k, i in enumerate(ids)))
    table = read_celeba_attributes(tmp_path / "list_attr_celeba.txt", allow_partial=True).table
    assert table["partition"].value_counts().height == 3
    (tmp_path / "list_eval_partition.txt").write_text(f"{ids[0]} 7\n")
    with pytest.raises(InputError, match=r"list_eval_partition.txt:1: expected 'image_name split'"):
        read_celeba_attributes(tmp_path / "list_attr_celeba.txt", allow_partial=True)


# -- the canonical suites ------------------------------------------------------------------------------
def test_the_canonical_suite_has_33_cases_plus_uniform_per_dataset() -> None:
    for dataset in ("celeba", "sprites"):
        names = [n for n, c in SPECS.cases.items() if c.dataset == dataset]
        assert len(names) == 34 and len(set(names)) == 34
        assert f"{dataset}-uniform" in names
    assert "celeba-sc-black_hair-uds-smiling" in SPECS.cases
    assert "sprites-sc-object_color" in SPECS.cases
    kinds = [len(c.shifts) for n, c in SPECS.cases.items() if c.dataset == "celeba"]
    assert [kinds.count(k) for k in (0, 1, 2, 3)] == [1, 9, 18, 6]


@pytest.mark.slow
def test_every_celeba_case_builds_on_the_real_fixture_and_satisfies_its_definition(
    celeba_table: pl.DataFrame,
) -> None:
    sizes = {}
    for name, case in SPECS.cases.items():
        if case.dataset != "celeba":
            continue
        draw = draw_case(celeba_table, case)
        assert_definition(case, celeba_table, draw.assignments)
        sizes[name] = draw.assignments.filter(pl.col("split").is_in(TRAINING)).height
        assert draw.largest_train_size == sizes[name]  # train_size: max
    assert min(sizes.values()) > 1000 and sizes["celeba-uniform"] == 3441


@pytest.mark.slow
def test_every_sprites_case_builds_at_the_default_size(sprites_table: pl.DataFrame) -> None:
    for case in [c for c in SPECS.cases.values() if c.dataset == "sprites"]:
        assert case.train_size == 1080
        draw = draw_case(sprites_table, case)
        assert_definition(case, sprites_table, draw.assignments)
        assert draw.assignments.filter(pl.col("split") == "test").height == 810


def test_every_case_of_a_dataset_shares_the_same_test_split(sprites_table: pl.DataFrame) -> None:
    tests = set()
    for name in ("sprites-uniform", "sprites-sc-size", "sprites-ldd-object_color-uds-size"):
        draw = draw_case(sprites_table, SPECS.cases[name])
        tests.add(tuple(draw.assignments.filter(pl.col("split") == "test")["example_id"].to_list()))
    assert len(tests) == 1


def test_published_cases_pass_contracts_and_tampering_is_caught(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    directory = tmp_path / "celeba"
    directory.mkdir()
    shutil.copy(CELEBA, directory / "list_attr_celeba.txt")
    settings = make_settings(SHIFTBENCH_CELEBA_DIR=str(directory))
    # The fixture holds 20,000 of CelebA's 202,599 images: not the paper's data, so not the paper's name.
    case = "celeba-sc-black_hair-ldd-smiling-uds-straight_hair@partial"
    staged = stage_one(settings, "conds/case", case)
    assert not failures(check_staged(staged))
    again = stage_one(settings, "conds/case", case)
    assert again.version == staged.version and not again.created
    assert sorted(staged.manifest()["attachments"]) == sorted(
        [cp.CELL_FIGURE, cp.SHARES_FIGURE, "card.md", "croissant.json"]
    )
    assert staged.manifest()["spec"] == case  # the case it was built from, as in every family
    assert pl.read_parquet(staged.table_path("benchmarks"))["spec"].to_list() == [case]

    def tampered(edit: Callable[[pl.DataFrame], pl.DataFrame]) -> list[str]:
        for table in ("examples", "conds_examples"):
            path = staged.table_path(table)
            frame = pl.read_parquet(path)
            edit(frame).write_parquet(path)
        return sorted(f"{r.table}.{r.rule}" for r in failures(check_staged(staged)))

    original = {t: pl.read_parquet(staged.table_path(t)) for t in ("examples", "conds_examples")}
    unseen = pl.col("example_id").is_in(
        pl.read_parquet(staged.table_path("conds_examples"))
        .filter((pl.col("split") == "test") & (pl.col("straight_hair") == "straight"))["example_id"]
        .head(1)
        .implode()
    )
    broken = tampered(lambda f: f.with_columns(pl.when(unseen).then(pl.lit("train")).otherwise("split").alias("split")))
    assert "conds_cases.uds_values_unseen_in_training_present_at_test" in broken
    assert "conds_cases.test_is_uniform" in broken
    for table, frame in original.items():
        frame.write_parquet(staged.table_path(table))
    aligned = (pl.col("split") == "train") & (pl.col("black_hair") == "black") & (pl.col("male") == "male")
    flip_ids = pl.read_parquet(staged.table_path("conds_examples")).filter(aligned)["example_id"].head(30)

    def flip(frame: pl.DataFrame) -> pl.DataFrame:
        if "black_hair" not in frame.columns:
            return frame
        hit = pl.col("example_id").is_in(flip_ids.implode())
        return frame.with_columns(pl.when(hit).then(pl.lit("other")).otherwise("black_hair").alias("black_hair"))

    assert "conds_cases.sc_counterexample_fraction_within_rounding" in tampered(flip)
    for table, frame in original.items():
        frame.write_parquet(staged.table_path(table))
    numeric = tampered(lambda f: f.with_columns(pl.lit(1).alias("age")) if "black_hair" in f.columns else f)
    assert "conds_examples.schema" in numeric  # extra columns must be VARCHAR attributes


# -- the engine, property-based -------------------------------------------------------------------------
@st.composite
def random_cases(draw: st.DrawFn) -> tuple[CaseSpec, pl.DataFrame]:
    n_attributes = draw(st.integers(1, 3))
    label = Attribute(name="label", values=tuple(f"y{k}" for k in range(draw(st.integers(2, 3)))))
    attributes = tuple(
        Attribute(name=f"a{i}", values=tuple(f"a{i}v{k}" for k in range(draw(st.integers(2, 3)))))
        for i in range(n_attributes)
    )
    shift_types = draw(st.permutations(["sc", "ldd", "uds", "none", "none", "none"]))[:n_attributes]
    shifts = tuple((s, a.name) for s, a in zip(shift_types, attributes, strict=True) if s != "none")
    shifts = tuple(sorted(shifts, key=lambda p: ["sc", "ldd", "uds"].index(p[0])))
    test_per_cell = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    columns = [label, *attributes]
    rows = []
    for cell in np.ndindex(*[len(a.values) for a in columns]):
        for _ in range(int(rng.integers(0, 40))):
            rows.append([a.values[k] for a, k in zip(columns, cell, strict=True)])
    table = pl.DataFrame(rows, schema=[a.name for a in columns], orient="row").with_row_index("n")
    table = table.select(pl.format("ex{}", "n").alias("example_id"), *[a.name for a in columns])
    case = CaseSpec(
        name="random",
        dataset="random",
        label=label,
        attributes=attributes,
        shifts=shifts,
        train_size=draw(st.one_of(st.none(), st.integers(1, 400))),
        test_per_cell=test_per_cell,
        id_val_fraction=draw(st.sampled_from([0.0, 0.15, 0.2, 0.5])),
        seed=draw(st.integers(0, 3)),
        sc_counterexample_fraction=draw(st.sampled_from([0.0, 0.01, 0.1, 0.3])),
        ldd_rare_frequency=draw(st.sampled_from([0.05, 0.1, 0.5])),
        ldd_rare_values={a.name: a.values[:1] for a in attributes},
        uds_unseen_values={a.name: a.values[-1:] for a in attributes},
        sc_aligned_values={
            a.name: tuple(a.values[i % len(a.values)] for i in range(len(label.values))) for a in attributes
        },
        allow_scale_down=draw(st.booleans()),
    )
    return case, table


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_cases())
def test_every_split_the_engine_returns_satisfies_its_case(drawn: tuple[CaseSpec, pl.DataFrame]) -> None:
    case, table = drawn
    try:
        result = draw_case(table, case)
    except InputError as exc:  # refused: it must say why, naming the cell or the parameter
        message = str(exc)
        assert "cell (" in message or "train_size" in message
        return
    requested = case.train_size
    if result.scaled_down:
        assert requested is not None and requested > result.largest_train_size and case.allow_scale_down
        case = case.model_copy(update={"train_size": result.largest_train_size})
    assert_definition(case, table, result.assignments)
    again = draw_case(table.sample(fraction=1.0, shuffle=True, seed=1), case)
    assert again.assignments.equals(result.assignments)  # input row order does not matter


# -- errors ----------------------------------------------------------------------------------------
def test_errors_name_the_cell_parameter_or_line(celeba_table: pl.DataFrame, tmp_path: Path) -> None:
    case = SPECS.cases["celeba-sc-black_hair"]
    with pytest.raises(InputError, match=r"train_size=50000 needs \d+ training examples in cell \(male=\w+, "):
        draw_case(celeba_table, case.with_overrides({"train_size": 50000}))
    scaled = draw_case(celeba_table, case.with_overrides({"train_size": 50000, "allow_scale_down": True}))
    assert scaled.scaled_down and scaled.largest_train_size == draw_case(celeba_table, case).largest_train_size
    assert scaled.assignments.filter(pl.col("split").is_in(TRAINING)).height == scaled.largest_train_size
    with pytest.raises(InputError, match=r"cell \(male=female, black_hair=black, smiling=not_smiling, "):
        draw_case(celeba_table, case.with_overrides({"test_per_cell": 300}))
    for key, value in (
        ("sc_counterexample_fraction", 1.5),
        ("id_val_fraction", -0.1),
        ("ldd_rare_frequency", 0),
        ("test_per_cell", 0),
        ("colour", 1),
    ):
        with pytest.raises(InputError, match=key):
            case.with_overrides({key: value})
    text = (Path(__file__).parents[1] / "shiftbench" / "specs" / "conds.yaml").read_text()
    with pytest.raises(InputError, match=r"'hair' is not an attribute"):
        parse_specs(text.replace("label: male", "label: hair"), "conds.yaml")
    with pytest.raises(InputError, match=r"attribute 'smiling' is used twice"):
        parse_specs(text.replace("[black_hair, smiling, straight_hair]", "[black_hair, smiling, smiling]"), "x")
    csv = tmp_path / "mine.csv"
    csv.write_text("id,shape,object_color,background_color,size\na,square,red,green,small\nb,star,red,green,big\n")
    frame, first_line = read_attribute_table(csv, "id")
    with pytest.raises(InputError, match=r"mine.csv:3: unknown value 'star' in column 'shape' of example 'b'"):
        attribute_table(frame, SPECS.datasets["sprites"], path=csv, first_line=first_line)
    with pytest.raises(InputError, match=r"no id column 'image'"):
        read_attribute_table(csv, "image")


def test_a_user_table_with_flag_columns_builds_through_a_spec(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    n = 8000
    pl.DataFrame(
        {
            "photo": [f"p{k:05d}" for k in range(n)],
            "Dress": rng.choice(["1", "-1"], n),
            "Floral": rng.choice(["1", "0"], n),
            "Solid": rng.choice(["true", "false"], n),
            "sleeve": rng.choice(["long", "none"], n),
            "fabric": rng.choice(["chiffon", "cotton", "wool"], n),
        }
    ).write_parquet(tmp_path / "fashion.parquet")
    spec = f"""
family: conds
case_defaults: {{train_size: 300}}
datasets:
  fashion:
    source: table
    path: {tmp_path / "fashion.parquet"}
    id_column: photo
    label: dress
    attributes: [pattern, sleeve, fabric]
    columns:
      dress: {{flags: {{skirt: Dress}}, others: other}}
      pattern: {{flags: {{floral: Floral, solid: Solid}}, others: mixed}}
      sleeve: {{column: sleeve, values: {{long_sleeve: long, sleeveless: none}}}}
      fabric: {{column: fabric, values: [chiffon, cotton], others: other}}
    test_per_cell: 5
"""
    specs = parse_specs(spec, str(tmp_path / "spec.yaml"))
    dataset = specs.datasets["fashion"]
    frame, first_line = read_attribute_table(dataset.path or Path(), dataset.id_column)
    table = attribute_table(frame, dataset, first_line=first_line)
    assert table.columns == ["example_id", "dress", "pattern", "sleeve", "fabric"]
    assert set(table["pattern"]) == {"floral", "solid", "mixed"}
    assert set(table["fabric"]) == {"chiffon", "cotton", "other"}
    cases = [c for c in specs.cases.values() if c.dataset == "fashion"]
    assert len(cases) == 34
    for case in cases:
        assert_definition(case, table, draw_case(table, case).assignments)


# -- sprites -----------------------------------------------------------------------------------------
def test_sprites_are_deterministic_64px_rgb_images(tmp_path: Path) -> None:
    first = sprites.write_sprites(tmp_path / "a", 1, seed=3)
    second = sprites.write_sprites(tmp_path / "b", 1, seed=3)
    assert first.height == 81 and first.equals(second)
    files = sorted((tmp_path / "a" / "images").iterdir())
    assert len(files) == 81
    assert all(f.read_bytes() == (tmp_path / "b" / "images" / f.name).read_bytes() for f in files)
    from PIL import Image

    with Image.open(files[0]) as image:
        assert image.size == (64, 64) and image.mode == "RGB"
    one = sprites.sprites(1, seed=3)[0][1]
    pixels = sprites.render(one)
    background = np.array(sprites.BACKGROUND_COLORS[one.background_color])
    covered = (np.abs(pixels.astype(int) - background).sum(axis=2) > 0).mean()
    assert 0.01 < covered < 0.5  # the shape is drawn, inside the image
    assert sprites.render(replace(one, object_color="blue")).tobytes() != pixels.tobytes()
    assert sprites.sprites(1, seed=4)[0][1] != one


@pytest.mark.slow
def test_cli_builds_conds_cases_on_generated_sprites(
    make_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from shiftbench.pipelines.cli import main

    settings = make_settings()
    monkeypatch.setenv("SHIFTBENCH_HOME", str(settings.home))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.setenv("SHIFTBENCH_SPRITES_PER_COMBINATION", "20")
    for case, name in (("sprites-uniform", "sprites-uniform-150"), ("sprites-sc-object_color-uds-size", "sc-uds-150")):
        small = ["build", "--benchmark", case, "--set", "train_size=150", "--name", name]
        assert main(small) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert f"[1/1] {name}: version" in out
    assert "sprites: 1,620 examples" in out
    query = (
        "SELECT benchmark, split, count(*) FILTER (object_color = 'blue'), count(*) FROM conds_examples "
        "GROUP BY ALL ORDER BY ALL"
    )
    assert main(["sql", query, "--csv"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert "sprites-uniform-150,test,270,810" in rows
    blue = {r.split(",")[1]: (int(r.split(",")[2]), int(r.split(",")[3])) for r in rows if "sprites-uniform-150," in r}
    assert blue["train"][1] == 120 and blue["id_val"][1] == 30
    assert abs(blue["train"][0] - 40) <= 3 and abs(blue["id_val"][0] - 10) <= 3  # a third, up to rounding
    unseen = "SELECT count(*) FROM conds_examples WHERE benchmark = 'sc-uds-150' AND split <> 'test' AND size = 'big'"
    assert main(["sql", unseen, "--csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "0"
    too_big = ["build", "--benchmark", "sprites-uniform", "--set", "train_size=100000", "--name", "sprites-huge"]
    assert main(too_big) == 2
    err = capsys.readouterr().err
    assert "train_size=100000 needs" in err and "nothing published" in err
    assert err.count("\n") == 1 and "Stack Trace" not in err and "Traceback" not in err
    assert main(["build", "--benchmark", "sprites-uniform", "--set", "train_size=150"]) == 2  # no --name
    assert "needs --name NEW" in capsys.readouterr().err
