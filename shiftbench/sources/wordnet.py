"""WordNet 3.0 noun hierarchy through nltk, offline from Debian's ``wordnet-base`` files.

nltk will not read ``/usr/share/wordnet`` in place: it only opens corpora under its data roots,
resolves symlinks before checking, and needs a ``lexnames`` file Debian does not ship. So we
copy the database files into ``<cache>/nltk_data/corpora/wordnet/``, write ``lexnames`` (the
standard lexicographer file list of ``man 5 lexnames``), and read from there. Online,
``nltk.download("wordnet")`` is the fallback. Reading all noun synsets takes ~10 s, so the
result is cached as Parquet keyed by the database files' content.

The output equals ImageNet's ``wordnet.is_a.txt`` (noun hypernym edges, instance hypernyms
excluded, ids ``n%08d``) and ``words.txt`` (lemma names, underscores as spaces, joined by ", ").
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from shiftbench.cache import publish_cache_dir, write_file_atomic
from shiftbench.errors import InputError
from shiftbench.fingerprint import sha256_files, sha256_text

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

# WordNet's lexicographer files: number, name, syntactic category (1 noun, 2 verb, 3 adj, 4 adv).
_LEXNAMES = [
    "adj.all", "adj.pert", "adv.all", "noun.Tops", "noun.act", "noun.animal", "noun.artifact",
    "noun.attribute", "noun.body", "noun.cognition", "noun.communication", "noun.event",
    "noun.feeling", "noun.food", "noun.group", "noun.location", "noun.motive", "noun.object",
    "noun.person", "noun.phenomenon", "noun.plant", "noun.possession", "noun.process",
    "noun.quantity", "noun.relation", "noun.shape", "noun.state", "noun.substance", "noun.time",
    "verb.body", "verb.change", "verb.cognition", "verb.communication", "verb.competition",
    "verb.consumption", "verb.contact", "verb.creation", "verb.emotion", "verb.motion",
    "verb.perception", "verb.possession", "verb.social", "verb.stative", "verb.weather", "adj.ppl",
]  # fmt: skip
_CATEGORY = {"noun": 1, "verb": 2, "adj": 3, "adv": 4}


def lexnames_text() -> str:
    lines = [f"{i:02d}\t{name}\t{_CATEGORY[name.split('.')[0]]}" for i, name in enumerate(_LEXNAMES)]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class WordNetTables:
    """The noun hierarchy as two tables plus the fingerprint of the database it came from."""

    edges: pl.DataFrame  # parent, child
    nodes: pl.DataFrame  # node, name
    fingerprint: str


def dict_fingerprint(dict_dir: Path) -> str:
    files = [dict_dir / name for name in WORDNET_FILES if (dict_dir / name).exists()]
    return sha256_files(files, root=dict_dir)


def prepare_nltk_root(dict_dir: Path, data_root: Path) -> Path:
    """Lay the Debian database out as an nltk corpus under ``data_root``; returns the corpus dir."""
    missing = [name for name in WORDNET_FILES if not (dict_dir / name).is_file()]
    if missing:
        raise InputError(
            f"WordNet database incomplete (missing {', '.join(missing)}); install the Debian "
            "packages wordnet-base and wordnet-sense-index, or set SHIFTBENCH_IMAGENET_HIERARCHY_DIR",
            path=dict_dir,
        )
    corpus = data_root / "corpora" / "wordnet"
    corpus.mkdir(parents=True, exist_ok=True)
    for name in WORDNET_FILES:
        target = corpus / name
        source = dict_dir / name
        if not target.exists() or target.stat().st_size != source.stat().st_size:
            # Copy, never symlink: nltk resolves links and refuses targets outside its roots.
            write_file_atomic(target, source.read_bytes())
    lexnames = corpus / "lexnames"
    if not lexnames.is_file() or lexnames.read_text("utf-8") != lexnames_text():
        write_file_atomic(lexnames, lexnames_text())
    return corpus


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


def read_noun_hierarchy(corpus_dir: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """All noun synsets and their (non-instance) hypernym edges through nltk."""
    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    data_root = str(corpus_dir.parent.parent)
    if data_root not in nltk.data.path:
        nltk.data.path.insert(0, data_root)
    with warnings.catch_warnings():
        # Without the Open Multilingual WordNet nltk warns; we only read English nouns.
        warnings.simplefilter("ignore", UserWarning)
        reader = WordNetCorpusReader(str(corpus_dir), None)
    nodes: list[str] = []
    names: list[str] = []
    parents: list[str] = []
    children: list[str] = []
    for synset in reader.all_synsets(pos="n"):
        wnid = f"n{synset.offset():08d}"
        nodes.append(wnid)
        names.append(", ".join(lemma.name().replace("_", " ") for lemma in synset.lemmas()))
        for hypernym in synset.hypernyms():  # instance_hypernyms() deliberately excluded
            parents.append(f"n{hypernym.offset():08d}")
            children.append(wnid)
    edges = pl.DataFrame({"parent": parents, "child": children}).unique().sort(["parent", "child"])
    nodes_frame = pl.DataFrame({"node": nodes, "name": names}).sort("node")
    return edges, nodes_frame


def load_wordnet(dict_dir: Path, cache_dir: Path, *, offline: bool = False) -> WordNetTables:
    """The WordNet noun hierarchy, from the Parquet cache when the database is unchanged."""
    import nltk

    data_root = cache_dir / "nltk_data"
    if (dict_dir / "data.noun").exists():
        fingerprint = sha256_text(f"{dict_fingerprint(dict_dir)}|nltk={nltk.__version__}")
        target = cache_dir / "wordnet" / fingerprint
        if (target / "nodes.parquet").exists():
            return WordNetTables(
                pl.read_parquet(target / "edges.parquet"),
                pl.read_parquet(target / "nodes.parquet"),
                fingerprint,
            )
        corpus = prepare_nltk_root(dict_dir, data_root)
    elif offline:
        raise InputError(
            "WordNet database not found and SHIFTBENCH_OFFLINE is set; install the Debian packages "
            "wordnet-base and wordnet-sense-index, or set SHIFTBENCH_IMAGENET_HIERARCHY_DIR",
            path=dict_dir,
        )
    else:
        corpus = _download_corpus(data_root)
        fingerprint = sha256_text(f"{dict_fingerprint(corpus)}|nltk={nltk.__version__}")
        target = cache_dir / "wordnet" / fingerprint
    edges, nodes = read_noun_hierarchy(corpus)

    def write(tmp: Path) -> None:
        edges.write_parquet(tmp / "edges.parquet")
        nodes.write_parquet(tmp / "nodes.parquet")

    publish_cache_dir(target, write)
    return WordNetTables(edges, nodes, fingerprint)
