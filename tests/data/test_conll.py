"""CoNLL-2003 data (latentstruct/data/conll.py): the column reader, IOB2 ↔ BIOES, conlleval's chunks and F1 (checked
against hand-worked cases and against a transcription of conlleval's own per-token rules and counters on random
sequences), vocabularies and padded tensors, on tiny generated files (plus the real files when present)."""

from __future__ import annotations

import gzip
import random
from collections import Counter
from pathlib import Path

import pytest
import torch

from latentstruct.data.conll import (
    CONLL_SIZES,
    TAG_PAD,
    bioes_to_iob2,
    conll_dataset,
    iob2_to_bioes,
    load_conll,
    read_conll,
    span_f1,
    spans,
    tag_names,
    tags_from_spans,
)

TRAIN = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
. . O O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER


-DOCSTART- -X- -X- O

New NNP B-NP B-LOC
York NNP I-NP I-LOC
City NNP I-NP I-LOC
rejects VBZ B-VP O
"""
VALID = """-DOCSTART- -X- -X- O

Peter NNP B-NP B-PER
visits VBZ B-VP O
Paris NNP B-NP B-LOC
"""
TEST = """Unseen FW B-XX O
EU NNP B-NP S-ORG
"""


def write(path: Path, content: str, gz: bool = False) -> Path:
    data = content.encode("utf-8")
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def make_folder(root: Path, test: str = TEST.replace("S-ORG", "B-ORG")) -> Path:
    folder = root / "conll2003"
    folder.mkdir(parents=True)
    write(folder / "train.txt.gz", TRAIN, gz=True)
    write(folder / "valid.txt", VALID)
    write(folder / "test.txt", test)
    return folder


# --- reader --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True])
def test_read_conll(tmp_path, gz):
    sentences = read_conll(write(tmp_path / "train.txt", TRAIN, gz=gz))
    assert [s.tokens for s in sentences] == [
        ["EU", "rejects", "German", "call", "."], ["Peter", "Blackburn"], ["New", "York", "City", "rejects"]
    ]
    first = sentences[0]
    assert first.pos == ["NNP", "VBZ", "JJ", "NN", "."]
    assert first.chunk == ["B-NP", "B-VP", "B-NP", "I-NP", "O"]
    assert first.ner == ["B-ORG", "O", "B-MISC", "O", "O"]
    # no trailing blank line, and a -DOCSTART- right after a token line, still end a sentence
    assert len(read_conll(write(tmp_path / "b.txt", "a A B O\n-DOCSTART- -X- -X- O\nb A B O\n"))) == 2
    # the official files end without a newline: a last line cut mid-line is found by its content
    assert len(read_conll(write(tmp_path / "c.txt", "a A B O\n\nb A B O"))) == 2
    with pytest.raises(ValueError, match=r"c\.txt:3: NER tag 'B-OR' is not O or"):
        read_conll(write(tmp_path / "c.txt", "a A B O\n\nb A B B-OR"))
    with pytest.raises(ValueError, match=r"d\.txt:1: expected 4 columns .* got 1"):  # cut inside -DOCSTART-
        read_conll(write(tmp_path / "d.txt", "-DOCSTART-"))
    with pytest.raises(ValueError, match=r"e\.txt: no sentence"):
        read_conll(write(tmp_path / "e.txt", "-DOCSTART- -X- -X- O\n\n"))
    with pytest.raises(ValueError, match=r"bad\.txt:2: expected 4 columns"):
        read_conll(write(tmp_path / "bad.txt", "a A B O\nb A O\n"))


def test_load_conll(tmp_path):
    folder = make_folder(tmp_path)
    data = load_conll(folder)
    assert {k: len(v) for k, v in data.items()} == {"train": 3, "valid": 1, "test": 1}
    (folder / "valid.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"conll2003/valid\.txt\[\.gz\]"):
        load_conll(folder)


# --- conversions ---------------------------------------------------------------------------------------------------


def test_iob2_bioes_round_trip():
    iob2 = ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC", "I-LOC", "B-ORG", "O", "B-MISC"]
    bioes = ["B-PER", "E-PER", "O", "S-LOC", "B-LOC", "I-LOC", "E-LOC", "S-ORG", "O", "S-MISC"]
    assert iob2_to_bioes(iob2) == bioes
    assert bioes_to_iob2(bioes) == iob2
    assert iob2_to_bioes([]) == [] and iob2_to_bioes(["O", "O"]) == ["O", "O"]
    assert tags_from_spans([("PER", 0, 2), ("LOC", 3, 4)], 4, "iob2") == ["B-PER", "I-PER", "O", "B-LOC"]


@pytest.mark.parametrize(
    "tags, position",
    [
        (["O", "I-PER"], 1),  # I- after O
        (["I-PER"], 0),  # I- at the start
        (["B-PER", "I-LOC"], 1),  # type switch
        (["B-PER", "E-PER"], 1),  # not an IOB2 prefix
    ],
)
def test_iob2_validation(tags, position):
    with pytest.raises(ValueError, match=f"position {position}"):
        iob2_to_bioes(tags)


def test_repair_reads_like_conlleval_and_converts_iob1():
    assert iob2_to_bioes(["O", "I-PER", "I-PER", "I-LOC"], repair=True) == ["O", "B-PER", "E-PER", "S-LOC"]
    # IOB1 (original eng.* files): I- everywhere, B- only between two adjacent chunks of one type
    iob1 = ["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG"]
    assert iob2_to_bioes(iob1, repair=True) == ["B-PER", "E-PER", "S-PER", "O", "S-LOC", "S-ORG"]
    with pytest.raises(ValueError, match="ill-formed BIOES"):
        bioes_to_iob2(["B-PER", "O"])
    with pytest.raises(ValueError, match="ill-formed BIOES"):
        bioes_to_iob2(["S-PER", "I-PER", "E-PER"])
    assert bioes_to_iob2(["B-PER", "O"], repair=True) == ["B-PER", "O"]
    assert bioes_to_iob2(["O", "E-PER", "E-PER"], repair=True) == ["O", "B-PER", "B-PER"]


def test_tag_names():
    bioes = tag_names()
    assert len(bioes) == 17 and bioes[0] == "O" and bioes[1:5] == ["B-LOC", "I-LOC", "E-LOC", "S-LOC"]
    assert tag_names("iob2") == ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]
    with pytest.raises(ValueError, match="unknown tagging scheme"):
        tag_names("iobes2")


# --- chunks --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tags, expected",
    [
        ([], []),
        (["O", "O"], []),
        (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 2), ("LOC", 3, 4)]),
        (["B-PER", "I-PER"], [("PER", 0, 2)]),  # closed at the end
        (["O", "I-PER", "I-PER"], [("PER", 1, 3)]),  # I- after O starts a chunk
        (["I-PER", "O", "I-PER"], [("PER", 0, 1), ("PER", 2, 3)]),
        (["B-PER", "I-LOC", "I-LOC"], [("PER", 0, 1), ("LOC", 1, 3)]),  # a type switch starts a new chunk
        (["B-PER", "B-PER", "I-PER"], [("PER", 0, 1), ("PER", 1, 3)]),
        (["O", "E-PER"], [("PER", 1, 2)]),  # E without B
        (["E-PER", "E-PER"], [("PER", 0, 1), ("PER", 1, 2)]),
        (["I-PER", "E-PER", "I-PER"], [("PER", 0, 2), ("PER", 2, 3)]),  # IOE: E ends, the next I starts
        (["S-PER", "S-PER"], [("PER", 0, 1), ("PER", 1, 2)]),  # conlleval.pl would merge these
        (["B-PER", "E-PER", "B-PER", "E-PER"], [("PER", 0, 2), ("PER", 2, 4)]),
        (["B-ORG", "I-ORG", "E-ORG", "S-LOC", "O"], [("ORG", 0, 3), ("LOC", 3, 4)]),
        (["B-PER", "S-PER"], [("PER", 0, 1), ("PER", 1, 2)]),
        (["S-PER", "I-PER"], [("PER", 0, 1), ("PER", 1, 2)]),
        (["B-PER", "O", "E-PER"], [("PER", 0, 1), ("PER", 2, 3)]),
        (["B-MISC", "I-MISC", "E-LOC"], [("MISC", 0, 2), ("LOC", 2, 3)]),
    ],
)
def test_spans(tags, expected):
    assert spans(tags) == expected


@pytest.mark.parametrize("tag", ["PER", "X-PER", "B-", "b-PER", ""])
def test_spans_refuses_unknown_tags(tag):
    with pytest.raises(ValueError, match="not a chunk tag"):
        spans(["O", tag])


def test_span_f1_hand_worked():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-ORG", "I-ORG", "O"]]
    assert span_f1(gold, gold) == (100.0, 100.0, 100.0)
    # wrong type on LOC; the ORG chunk predicted by an ill-formed I- after O still matches
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["O", "I-ORG", "I-ORG", "O"]]
    p, r, f = span_f1(pred, gold)
    assert (p, r) == (pytest.approx(200 / 3), pytest.approx(200 / 3)) and f == pytest.approx(200 / 3)
    # a type switch inside a predicted chunk splits it: 0 of 2 predicted chunks correct, 0 of 1 gold found
    assert span_f1([["B-PER", "I-LOC"]], [["B-PER", "I-PER"]]) == (0.0, 0.0, 0.0)
    # one extra predicted chunk: P = 2/3, R = 1, F = 0.8
    p, r, f = span_f1([["B-PER", "O", "B-LOC", "S-ORG"]], [["B-PER", "O", "B-LOC", "O"]])
    assert (p, r, f) == (pytest.approx(200 / 3), 100.0, pytest.approx(80.0))
    # BIOES predictions against IOB2 gold: the same chunks
    assert span_f1([iob2_to_bioes(s) for s in gold], gold) == (100.0, 100.0, 100.0)
    # E without B is a chunk of its own
    assert span_f1([["O", "E-PER"]], [["O", "B-PER"]]) == (100.0, 100.0, 100.0)
    # no chunk anywhere: conlleval prints 0 for all three
    assert span_f1([["O"]], [["O"]]) == (0.0, 0.0, 0.0)
    assert span_f1([["O"]], [["B-PER"]]) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="2 predicted tags but 1 gold"):
        span_f1([["O", "O"]], [["O"]])
    with pytest.raises(ValueError, match="1 predicted sequences but 2 gold"):
        span_f1([["O"]], [["O"], ["O"]])


# A transcription of conlleval.pl's per-token logic (startOfChunk, endOfChunk and the correctChunk / foundCorrect /
# foundGuessed counters), independent of the module's code. With extended=True it adds the S rules and B after E.


def _conlleval_end(p: str, q: str, t: str, u: str, extended: bool) -> bool:
    end = (p, q) in {("B", "B"), ("B", "O"), ("I", "B"), ("I", "O"), ("E", "E"), ("E", "I"), ("E", "O")}
    end = end or (p != "O" and t != u)
    if extended:
        end = end or p in ("E", "S") or (p in ("B", "I") and q == "S")
    return end


def _conlleval_start(p: str, q: str, t: str, u: str, extended: bool) -> bool:
    start = (p, q) in {("B", "B"), ("I", "B"), ("O", "B"), ("O", "I"), ("E", "E"), ("E", "I"), ("O", "E")}
    start = start or (q != "O" and t != u)
    if extended:
        start = start or q in ("B", "S") or (p == "S" and q in ("I", "E"))
    return start


def _split(tag: str) -> tuple[str, str]:
    return ("O", "") if tag == "O" else tuple(tag.split("-", 1))


def _conlleval_counts(pred_seqs, gold_seqs, extended):
    correct_chunks = found_gold = found_pred = 0
    for pred, gold in zip(pred_seqs, gold_seqs, strict=True):
        in_correct = False
        last_g, last_gt, last_p, last_pt = "O", "", "O", ""
        for ptag, gtag in zip([*pred, "O"], [*gold, "O"], strict=True):  # the blank line closes the sentence
            (p, pt), (g, gt) = _split(ptag), _split(gtag)
            end_g = _conlleval_end(last_g, g, last_gt, gt, extended)
            end_p = _conlleval_end(last_p, p, last_pt, pt, extended)
            start_g = _conlleval_start(last_g, g, last_gt, gt, extended)
            start_p = _conlleval_start(last_p, p, last_pt, pt, extended)
            if in_correct:
                if end_g and end_p and last_pt == last_gt:
                    in_correct = False
                    correct_chunks += 1
                elif end_g != end_p or pt != gt:
                    in_correct = False
            if start_g and start_p and pt == gt:
                in_correct = True
            found_gold += start_g
            found_pred += start_p
            last_g, last_gt, last_p, last_pt = g, gt, p, pt
        correct_chunks += in_correct
    return correct_chunks, found_pred, found_gold


def _prf(correct, found_pred, found_gold):
    p = 100.0 * correct / found_pred if found_pred else 0.0
    r = 100.0 * correct / found_gold if found_gold else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


@pytest.mark.parametrize("prefixes, extended", [("BI", False), ("IE", False), ("BIES", True)])
def test_span_f1_matches_conlleval_on_random_sequences(prefixes, extended):
    """IOB (and IOE) sequences, ill-formed ones included, against conlleval.pl's own rules; any BIOES mix against
    the rules extended with S. Two types, so that type switches are frequent."""
    rng = random.Random(0)
    tags = ["O"] + [f"{p}-{t}" for p in prefixes for t in ("A", "B")]
    for _ in range(30):
        lengths = [rng.randint(0, 8) for _ in range(20)]
        pred = [[rng.choice(tags) for _ in range(n)] for n in lengths]
        gold = [[rng.choice(tags) for _ in range(n)] for n in lengths]
        assert span_f1(pred, gold) == pytest.approx(_prf(*_conlleval_counts(pred, gold, extended)))
        # the chunk counts themselves: conlleval counts a chunk at each start
        assert sum(len(spans(s)) for s in gold) == _conlleval_counts(gold, gold, extended)[2]


# --- dataset -------------------------------------------------------------------------------------------------------


def test_conll_dataset(tmp_path):
    make_folder(tmp_path)
    data = conll_dataset(tmp_path, features=True)
    names = data.extras["tag_names"]
    assert names == tag_names("bioes") and data.dims["num_tags"] == 17
    vocab = data.extras["vocab"]
    # train words: rejects ×2, then the others alphabetically (code-point order)
    assert vocab.itos[:4] == ["<pad>", "<unk>", "rejects", "."] and len(vocab) == 2 + 10
    assert data.dims == {"vocab_size": 12, "num_tags": 17, "embedding_dim": 0, "pos_vocab_size": 2 + 5,
                         "chunk_vocab_size": 2 + 4}
    train = data.splits["train"]
    assert train["x"].dtype == torch.int64 and train["x"].shape == (3, 5)
    assert train["lengths"].tolist() == [5, 2, 4]
    assert [names[i] for i in train["y"][2, :4].tolist()] == ["B-LOC", "I-LOC", "E-LOC", "O"]
    assert train["y"][1].tolist()[2:] == [TAG_PAD] * 3 and train["x"][1].tolist()[2:] == [0] * 3
    assert [names[i] for i in train["y"][1, :2].tolist()] == ["B-PER", "E-PER"]
    assert train["pos"][1].tolist() == [data.extras["pos_vocab"].stoi["NNP"]] * 2 + [0] * 3
    test = data.splits["test"]
    assert test["x"][0].tolist() == [1, vocab.stoi["EU"]]  # unseen word → <unk>
    assert test["pos"][0, 0].item() == 1 and test["chunk"][0, 0].item() == 1  # unseen POS / chunk tags → <unk>
    assert [names[i] for i in test["y"][0].tolist()] == ["O", "S-ORG"]

    iob2 = conll_dataset(tmp_path, scheme="iob2", lowercase=True, min_count=2)
    assert iob2.dims["num_tags"] == 9 and "pos" not in iob2.splits["train"]
    assert iob2.extras["vocab"].itos == ["<pad>", "<unk>", "rejects"]
    assert iob2.dims["pos_vocab_size"] == 0 and iob2.extras["pos_vocab"] is None
    names = iob2.extras["tag_names"]
    assert [names[i] for i in iob2.splits["train"]["y"][2, :4].tolist()] == ["B-LOC", "I-LOC", "I-LOC", "O"]
    assert iob2.splits["test"]["x"][0].tolist() == [1, 1]

    small = conll_dataset(tmp_path, subset=2, eval_subset=0)
    assert small.size("train") == 2 and small.size("valid") == 0 and small.splits["valid"]["x"].shape == (0, 0)


def test_conll_dataset_errors(tmp_path):
    make_folder(tmp_path / "a", test=TEST)  # S-ORG in an IOB2 file
    with pytest.raises(ValueError, match="test sentence 0.*not allowed in IOB2"):
        conll_dataset(tmp_path / "a")
    make_folder(tmp_path / "b", test=TEST.replace("S-ORG", "I-ORG"))  # I- after O
    with pytest.raises(ValueError, match="ill-formed IOB2"):
        conll_dataset(tmp_path / "b")
    repaired = conll_dataset(tmp_path / "b", repair_tags=True)
    assert repaired.splits["test"]["y"][0, 1].item() == tag_names().index("S-ORG")
    make_folder(tmp_path / "c", test=TEST.replace("S-ORG", "B-GPE"))  # a type outside the 4 CoNLL types
    with pytest.raises(ValueError, match="GPE"):
        conll_dataset(tmp_path / "c")
    with pytest.raises(FileNotFoundError, match=r"conll2003/train\.txt"):
        conll_dataset(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="no file"):
        conll_dataset(tmp_path / "b", repair_tags=True, pretrained="missing.txt")


# --- real data (skipped when absent) -------------------------------------------------------------------------------

@pytest.mark.real_data("conll2003")
def test_real_conll2003(data_root):
    data = load_conll(data_root / "conll2003")
    sizes = {split: (len(s), sum(len(x.tokens) for x in s)) for split, s in data.items()}
    assert sizes == CONLL_SIZES == {"train": (14041, 203621), "valid": (3250, 51362), "test": (3453, 46435)}
    entities = {split: Counter(kind for s in sents for kind, _, _ in spans(s.ner)) for split, sents in data.items()}
    assert entities["train"] == {"LOC": 7140, "MISC": 3438, "ORG": 6321, "PER": 6600}
    assert entities["valid"] == {"LOC": 1837, "MISC": 922, "ORG": 1341, "PER": 1842}
    assert entities["test"] == {"LOC": 1668, "MISC": 702, "ORG": 1661, "PER": 1617}
    for sentences in data.values():
        gold = [s.ner for s in sentences]
        bioes = [iob2_to_bioes(tags) for tags in gold]  # strict: the files are valid IOB2
        assert [bioes_to_iob2(tags) for tags in bioes] == gold
        assert span_f1(gold, gold) == (100.0, 100.0, 100.0)
        assert span_f1(bioes, gold) == (100.0, 100.0, 100.0)

    dataset = conll_dataset(data_root, features=True)
    assert dataset.dims["num_tags"] == 17
    names = dataset.extras["tag_names"]
    for split, sentences in data.items():
        d = dataset.splits[split]
        assert d["lengths"].sum().item() == CONLL_SIZES[split][1]
        mask = torch.arange(d["y"].shape[1]) < d["lengths"][:, None]
        assert (d["y"][~mask] == TAG_PAD).all() and (d["y"][mask] >= 0).all() and (d["x"][~mask] == 0).all()
        k = len(sentences) // 2
        assert [names[i] for i in d["y"][k, : d["lengths"][k]].tolist()] == iob2_to_bioes(sentences[k].ner)
