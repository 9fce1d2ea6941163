"""Cora citations (seed 004 Table 4): both readers and their errors on hand-written files, the splits and tensors on
generated files, and the shared copy's counts against the manifest."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from latentstruct.data.conll import TAG_PAD
from latentstruct.data.cora import (
    CORA_CITATIONS,
    CORA_FIELD_TOKENS,
    CORA_FIELDS,
    CORA_TOKENS,
    Citation,
    cora_dataset,
    cora_splits,
    load_cora,
    read_cora_columns,
    read_cora_tagged,
)
from tests.helpers import write_data_file

_WORDS = {"author": ["A.", "Smith,", "B.", "Jones."], "title": ["Learning", "with", "rules."], "date": ["1999."],
          "booktitle": ["In", "Proc.", "ICML,"], "pages": ["pp.", "1-10."], "journal": ["Machine", "Learning,"],
          "volume": ["3(2):"]}


def write_cora(root: Path, n: int = 40, seed: int = 0, gz: bool = False) -> Path:
    """Tiny Cora files under ``root/cora``: ``n`` citations in both formats (inline tags; 24 columns); returns
    ``root``."""
    rng = random.Random(seed)
    folder = root / "cora"
    folder.mkdir(parents=True, exist_ok=True)
    tagged, columns = [], []
    for _ in range(n):
        fields = ["author", "title", rng.choice(["booktitle", "journal"]), *rng.sample(["date", "pages", "volume"], 2)]
        spans = []
        for f in fields:
            words = rng.sample(_WORDS[f], rng.randint(1, len(_WORDS[f])))
            spans.append(f"<{f}> {' '.join(words)} </{f}>")
            columns += [" ".join([w, *(["x"] * 22), f]) for w in words]
        tagged.append(" ".join(spans))
        columns.append("")
    for name, lines in (("cora.tagged.txt", tagged), ("cora.train", columns)):
        write_data_file(folder, name, "\n".join(lines) + "\n", gz)
    return root


def test_read_tagged_drops_text_outside_fields_and_refuses_damage(tmp_path):
    path = tmp_path / "cora.tagged.txt"
    path.write_text("<author> A. Cau. </author> <title> Formal  methods. </title> <pages> 1-2 </pages>.\n\n"
                    "<date>1992.</date>\n", encoding="utf-8")
    assert read_cora_tagged(path) == [Citation(["A.", "Cau.", "Formal", "methods.", "1-2"],
                                               ["author", "author", "title", "title", "pages"]),
                                      Citation(["1992."], ["date"])]
    for text, error in [
        ("<author> A. </author> <titel> B </titel>\n", r"cora.tagged.txt:1: unknown field <titel>"),
        ("<author> A. <title> B </title>\n", r":1: <title> opens inside <author>"),
        ("<author> A. </title>\n", r":1: </title> closes <author>"),
        ("<author> A. Cau\n", r":1: <author> is never closed"),
        ("<author> A. </auth\n", r":1: a '<' or '>' outside a field tag"),
        ("<author> </author>\n", r":1: a citation without a token"),
        ("<author> A. </author>", r":1: the last line has no line end"),
    ]:
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match=error):
            read_cora_tagged(path)


def test_read_columns_and_its_errors(tmp_path):
    path = tmp_path / "cora.train"
    row = " ".join(["x"] * 22)
    path.write_text(f"A. {row} author\nCau {row} author\n\n\n1992. {row} date\n", encoding="utf-8")
    assert read_cora_columns(path) == [Citation(["A.", "Cau"], ["author", "author"]), Citation(["1992."], ["date"])]
    path.write_text(f"A. {row} author\nCau x author\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"cora.train:2: expected 24 columns"):
        read_cora_columns(path)
    path.write_text(f"A. {row} writer\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"cora.train:1: field 'writer' is not one of author"):
        read_cora_columns(path)


@pytest.mark.parametrize("gz", [False, True])
def test_both_files_of_a_folder_read_the_same_citations(tmp_path, gz):
    root = write_cora(tmp_path, n=7, gz=gz) / "cora"
    assert load_cora(root, "tagged") == load_cora(root, "columns") and len(load_cora(root)) == 7
    with pytest.raises(FileNotFoundError, match="cora.tagged.txt"):
        load_cora(tmp_path / "nowhere")


def test_splits_are_fixed_disjoint_and_the_labelled_pools_nested():
    sizes = {"test": 100, "valid": 100, "pool": 50}
    a = cora_splits(500, 5, sizes=sizes)
    b = cora_splits(500, 50, sizes=sizes)
    assert [len(a[k]) for k in ("test", "valid", "labelled", "unlabelled")] == [100, 100, 5, 250]
    assert a["test"] == b["test"] and a["valid"] == b["valid"] and a["unlabelled"] == b["unlabelled"]
    assert b["labelled"][:5] == a["labelled"]
    assert sorted(sum(b.values(), [])) == list(range(500))
    assert cora_splits(500, 5, sizes=sizes, split_seed=1)["test"] != a["test"]
    with pytest.raises(ValueError, match="labelled pool"):
        cora_splits(500, 51, sizes=sizes)


def test_the_dataset_hides_the_unlabelled_gold_and_balances_the_batches(tmp_path):
    root = write_cora(tmp_path, n=40)
    data = cora_dataset(root, labelled=3, check_sizes=False, n_test=10, n_valid=5, pool=6)
    train, split = data.splits["train"], data.extras["split"]
    n_unlab = 40 - 10 - 5 - 6
    copies = round(n_unlab / 3)
    assert data.size("train") == 3 * copies + n_unlab and data.size("test") == 10 and data.size("valid") == 5
    assert train["labelled"].tolist() == [1.0] * (3 * copies) + [0.0] * n_unlab
    assert (train["y"][3 * copies:] == TAG_PAD).all()  # no gold field of an unlabelled citation
    citations = load_cora(root / "cora")
    for k, i in enumerate(split["test"]):
        tokens, tags = citations[i]
        n = len(tokens)
        assert int(data.splits["test"]["lengths"][k]) == n
        assert [CORA_FIELDS[t] for t in data.splits["test"]["y"][k, :n].tolist()] == tags
        assert (data.splits["test"]["y"][k, n:] == TAG_PAD).all()
    assert data.splits["test"]["cues"].shape[-1] == data.dims["num_cues"] and data.dims["num_tags"] == 13
    assert data.extras["metric"] == "token_acc"
    # digits are one word type once normalised
    assert "0000." in data.extras["vocab"] and "1999." not in data.extras["vocab"]
    assert cora_dataset(root, labelled=3, balance=False, check_sizes=False, n_test=10, n_valid=5,
                        pool=6).size("train") == 3 + n_unlab
    with pytest.raises(ValueError, match="expected the shared copy's 500"):
        cora_dataset(root)


@pytest.mark.real_data("cora")
def test_the_shared_copy_matches_the_manifest_in_both_formats(data_root):
    tagged, columns = load_cora(data_root / "cora", "tagged"), load_cora(data_root / "cora", "columns")
    assert tagged == columns
    assert len(tagged) == CORA_CITATIONS and sum(len(c.tokens) for c in tagged) == CORA_TOKENS
    counts = {f: sum(c.tags.count(f) for c in tagged) for f in CORA_FIELDS}
    assert counts == CORA_FIELD_TOKENS
    assert max(len(c.tokens) for c in tagged) <= 118  # the seed: "a max length of 118 tokens"
    data = cora_dataset(data_root, labelled=50)
    assert {s: data.size(s) for s in data.splits} == {"train": 500, "valid": 100, "test": 100}
    assert int(data.splits["train"]["labelled"].sum()) == 250 and torch.isfinite(data.splits["train"]["cues"]).all()
