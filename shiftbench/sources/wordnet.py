"""WordNet 3.0 noun hierarchy, offline from Debian's ``wordnet-base`` files (``/usr/share/wordnet``).

``data.noun`` is read directly in its documented format (wndb(5)): one pass, about 1 s, where nltk's
reader took about 15 s for the same tables. Online, ``nltk.download("wordnet")`` is the fallback when
the Debian files are missing (its corpus holds the same ``data.noun``). The result is cached as Parquet
keyed by the database files' content and the reader's version.

The output equals ImageNet's ``wordnet.is_a.txt`` (noun hypernym edges, instance hypernyms
excluded, ids ``n%08d``) and ``words.txt`` (lemma names, underscores as spaces, joined by ", "):
``tests/test_sources.py`` compares all 75,850 edges and 82,115 names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from shiftbench.errors import InputError
from shiftbench.runtime.cache import publish_cache_dir
from shiftbench.tables.fingerprint import sha256_files, sha256_text

# The files nltk's WordNetCorpusReader opens (plus lexnames, written below).
WORDNET_FILES = (
    "adj.exc",
    "adv.exc",
    "cntlist.rev",
    "data.adj",
    "data.adv",
    "data.noun",
    "data.verb",
    "index.adj",
    "index.adv",
    "index.noun",
    "index.sense",
    "index.verb",
    "noun.exc",
    "verb.exc",
)


@dataclass(frozen=True)
class WordNetTables:
    """The noun hierarchy as two tables plus the fingerprint of the database it came from."""

    edges: pl.DataFrame  # parent, child
    nodes: pl.DataFrame  # node, name
    fingerprint: str


def dict_fingerprint(dict_dir: Path) -> str:
    files = [dict_dir / name for name in WORDNET_FILES if (dict_dir / name).exists()]
    return sha256_files(files, root=dict_dir)


def _download_corpus(data_root: Path) -> Path:
    import nltk

    if not nltk.download("wordnet", download_dir=str(data_root), quiet=True, raise_on_error=False):
        raise InputError(
            "no WordNet database: /usr/share/wordnet is missing and nltk.download('wordnet') "
            "failed (offline?). Install the Debian packages wordnet-base and wordnet-sense-index, "
            "or set SHIFTBENCH_IMAGENET_HIERARCHY_DIR to ImageNet's hierarchy files",
            parameter="SHIFTBENCH_WORDNET_DICT_DIR",
        )
    return data_root / "corpora" / "wordnet"


# Bump when read_data_noun's output can change: the Parquet cache is keyed by it.
READER = "wndb-1"
_MARKER = re.compile(r"\(.*\)$")  # an adjective's syntactic marker, "(a)": never part of a name


def read_data_noun(path: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """All noun synsets and their hypernym edges, read from WordNet's ``data.noun`` (format: wndb(5)).

    A line is ``offset lex_filenum ss_type w_cnt word lex_id ... p_cnt pointer... | gloss``, ``w_cnt`` in
    hexadecimal, each pointer ``symbol offset pos source/target``; ``@`` is a hypernym (``@i``, an instance
    hypernym, is left out, as in ImageNet's wordnet.is_a.txt); lines starting with spaces are the licence.
    Read in one pass (about 1 s; nltk's reader takes about 15 s for the same tables).
    """
    nodes: list[str] = []
    names: list[str] = []
    parents: list[str] = []
    children: list[str] = []
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if line.startswith(" "):
                continue
            try:
                fields = line.split(" | ", 1)[0].split()
                wnid = f"n{fields[0]}"
                n_words = int(fields[3], 16)
                words = fields[4 : 4 + 2 * n_words : 2]
                at = 4 + 2 * n_words
                pointers = fields[at + 1 : at + 1 + 4 * int(fields[at])]
            except (IndexError, ValueError):
                raise InputError("not a WordNet data.noun line (wndb(5))", path=path, line=line_no) from None
            nodes.append(wnid)
            names.append(", ".join(_MARKER.sub("", word).replace("_", " ") for word in words))
            for symbol, offset, pos in zip(pointers[0::4], pointers[1::4], pointers[2::4], strict=True):
                if symbol == "@" and pos == "n":
                    parents.append(f"n{offset}")
                    children.append(wnid)
    edges = pl.DataFrame({"parent": parents, "child": children}).unique().sort(["parent", "child"])
    nodes_frame = pl.DataFrame({"node": nodes, "name": names}).sort("node")
    return edges, nodes_frame


def load_wordnet(dict_dir: Path, cache_dir: Path, *, offline: bool = False) -> WordNetTables:
    """The WordNet noun hierarchy, from the Parquet cache when the database is unchanged."""
    data_root = cache_dir / "nltk_data"
    if (dict_dir / "data.noun").exists():
        corpus = dict_dir
    elif offline:
        raise InputError(
            "WordNet database not found and SHIFTBENCH_OFFLINE is set; install the Debian packages "
            "wordnet-base and wordnet-sense-index, or set SHIFTBENCH_IMAGENET_HIERARCHY_DIR",
            path=dict_dir,
        )
    else:
        corpus = _download_corpus(data_root)
    fingerprint = sha256_text(f"{dict_fingerprint(corpus)}|reader={READER}")
    target = cache_dir / "wordnet" / fingerprint
    if (target / "nodes.parquet").exists():
        return WordNetTables(
            pl.read_parquet(target / "edges.parquet"), pl.read_parquet(target / "nodes.parquet"), fingerprint
        )
    edges, nodes = read_data_noun(corpus / "data.noun")

    def write(tmp: Path) -> None:
        edges.write_parquet(tmp / "edges.parquet")
        nodes.write_parquet(tmp / "nodes.parquet")

    publish_cache_dir(target, write)
    return WordNetTables(edges, nodes, fingerprint)
