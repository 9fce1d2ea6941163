"""Text readers (SST trees, SNLI jsonl/TSV), the tokenizer, Vocab, GloVe and padding, on tiny generated files (plus
the real SST / SNLI / GloVe files in the shared data folder when present)."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import zipfile
from collections import Counter
from pathlib import Path

import pytest
import torch

import latentstruct.data.text as text
from latentstruct.data.text import (
    SNLI_LABELS,
    Vocab,
    glove_cache,
    load_snli,
    load_sst,
    pad_batch,
    parse_ptb_tree,
    read_glove,
    read_snli_jsonl,
    read_snli_tsv,
    read_sst,
    tokenize,
)


def write(path: Path, content: str, compress: str | None = None) -> Path:
    data = content.encode("utf-8")
    if compress == "gz":
        data = gzip.compress(data)
    elif compress == "xz":
        data = lzma.compress(data)
    elif compress == "bz2":
        data = bz2.compress(data)
    path.write_bytes(data)
    return path


# --- SST -----------------------------------------------------------------------------------------------------------

SST_LINES = [
    "(3 (2 It) (4 (2 's) (3 good)))",  # positive
    "(2 (2 Just) (2 okay))",  # neutral: dropped in the binary task
    "(0 (1 -LRB-) (0 (0 awful) (2 -RRB-)))",  # negative
    "(4 (4 Great) (2 (2 fun) (2 \\/)))",  # positive
    "(1 (2 Not) (1 (2 André) (1 bad-ish)))",  # negative
]


def test_parse_ptb_tree_keeps_tokens_as_written():
    assert parse_ptb_tree("(3 (2 It) (4 (2 's) (3 good)))") == (3, ["It", "'s", "good"])
    assert parse_ptb_tree("(0 (1 -LRB-) (0 (0 awful) (2 -RRB-)))") == (0, ["-LRB-", "awful", "-RRB-"])
    assert parse_ptb_tree("  (2 word)\n") == (2, ["word"])
    assert parse_ptb_tree("(4 (2 a) (2 b) (2 c))") == (4, ["a", "b", "c"])  # non-binary nodes are accepted
    assert parse_ptb_tree("(2 (2 8\xa01\\/2) (2 x))") == (2, ["8\xa01\\/2", "x"])  # NBSP inside a token


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("(3 (2 It) (4 (2 's) (3 good))", "unclosed"),
        ("(3 (2 It)) (2 x))", "after the root"),
        ("(3 (2 It)))", "after the root"),
        ("((2 It) (2 x))", "missing label"),
        ("(3 (It) (2 x))", "non-integer label"),
        ("(x (2 It))", "non-integer label"),
        ("(3 (2 It) x)", "mixes subtrees"),
        ("(3 (2 It x))", "more than one token"),
        ("(3 x (2 y))", "mixes a token"),
        ("(3 (2))", "empty node"),
        ("3 (2 x)", "must start"),
        ("", "must start"),
    ],
)
def test_parse_ptb_tree_errors(line, reason):
    with pytest.raises(ValueError, match=reason) as info:
        parse_ptb_tree(line)
    assert f"in tree {line[:10]!r}"[:-1] in str(info.value).replace('"', "'")  # the offending line is quoted


@pytest.mark.parametrize("compress", [None, "gz"])
def test_read_sst_binary_and_fine(tmp_path, compress):
    path = write(tmp_path / "trees.txt", "\n".join(SST_LINES) + "\n\n", compress)
    binary = read_sst(path)
    assert binary == [
        (["It", "'s", "good"], 1),
        (["-LRB-", "awful", "-RRB-"], 0),
        (["Great", "fun", "\\/"], 1),
        (["Not", "André", "bad-ish"], 0),
    ]
    fine = read_sst(path, binary=False)
    assert [label for _, label in fine] == [3, 2, 0, 4, 1]
    assert fine[1] == (["Just", "okay"], 2)


def test_read_sst_reports_line_and_range(tmp_path):
    path = write(tmp_path / "bad.txt", "(3 (2 a))\n(3 (2 b)\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: .*unclosed"):
        read_sst(path)
    path = write(tmp_path / "range.txt", "(7 (2 a))\n")
    with pytest.raises(ValueError, match="outside 0..4"):
        read_sst(path)


def test_load_sst_folder(tmp_path):
    write(tmp_path / "train.txt.gz", "\n".join(SST_LINES) + "\n", "gz")
    write(tmp_path / "dev.txt", SST_LINES[0] + "\n")
    write(tmp_path / "test.txt", SST_LINES[2] + "\n" + SST_LINES[1] + "\n")
    with pytest.raises(ValueError, match="6920"):
        load_sst(tmp_path)
    data = load_sst(tmp_path, check_sizes=False)
    assert {k: len(v) for k, v in data.items()} == {"train": 4, "valid": 1, "test": 1}
    fine = load_sst(tmp_path, binary=False)  # sizes are only checked for the binary task
    assert {k: len(v) for k, v in fine.items()} == {"train": 5, "valid": 1, "test": 2}
    write(tmp_path / "dev.txt.gz", SST_LINES[2] + "\n", "gz")  # the plain file wins
    assert load_sst(tmp_path, check_sizes=False)["valid"][0][1] == 1
    (tmp_path / "test.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"test\.txt\[\.gz\]"):
        load_sst(tmp_path, check_sizes=False)


# --- tokenizer -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            "Don't stop—it's 3.5 km, isn't it?",
            ["Do", "n't", "stop", "—", "it", "'s", "3.5", "km", ",", "is", "n't", "it", "?"],
        ),
        (
            "I can't, he cannot; they won't.",
            ["I", "ca", "n't", ",", "he", "can", "not", ";", "they", "wo", "n't", "."],
        ),
        (
            "I'M SURE they're here, we'll see, I've won and you'd know.",
            ["I", "'M", "SURE", "they", "'re", "here", ",", "we", "'ll", "see", ",", "I", "'ve", "won", "and", "you",
             "'d", "know", "."],
        ),
        (
            "The U.S. price is $1,000.50 (approx.) at 5 o'clock.",
            ["The", "U.S.", "price", "is", "$", "1,000.50", "(", "approx", ".", ")", "at", "5", "o'clock", "."],
        ),
        (
            'Mr. Smith\'s dog said "hi" -- wait... 50% off!',
            ["Mr.", "Smith", "'s", "dog", "said", "``", "hi", "''", "--", "wait", "...", "50", "%", "off", "!"],
        ),
        (
            "A man in a t-shirt, the students' books, André’s “café”.",
            ["A", "man", "in", "a", "t-shirt", ",", "the", "students", "'", "books", ",", "André", "’s", "``", "café",
             "''", "."],
        ),
        ("Two women are embracing.", ["Two", "women", "are", "embracing", "."]),
        ("  ", []),
    ],
)
def test_tokenize(raw, expected):
    assert tokenize(raw) == expected


def test_tokenize_is_stable_on_tokenized_text():
    tokens = "The man does n't like the woman 's hat .".split()
    assert tokenize(" ".join(tokens)) == tokens


# --- SNLI ----------------------------------------------------------------------------------------------------------

SNLI_RECORDS = [
    ("neutral", "Two women are embracing.", "The sisters aren't hugging."),
    ("-", "A man.", "A dog."),
    ("entailment", "A man plays.", "Someone plays."),
    ("contradiction", "A cat sleeps.", "The cat is running."),
    ("entailment", " ".join(["word"] * 100) + ".", "Short."),  # 101 tokens with the final period → dropped
    ("neutral", " ".join(["word"] * 99) + ".", "Short."),  # exactly 100 tokens → kept
]


def write_jsonl(path: Path, records, compress: str | None = None) -> Path:
    lines = [
        json.dumps({"annotator_labels": [label], "captionID": "x", "gold_label": label, "pairID": f"p{i}",
                    "sentence1": s1, "sentence1_binary_parse": "( x )", "sentence2": s2})
        for i, (label, s1, s2) in enumerate(records)
    ]
    return write(path, "\n".join(lines) + "\n", compress)


def test_snli_labels():
    assert SNLI_LABELS == {"entailment": 0, "neutral": 1, "contradiction": 2}


@pytest.mark.parametrize("compress", [None, "gz"])
def test_read_snli_jsonl(tmp_path, compress):
    data = read_snli_jsonl(write_jsonl(tmp_path / "snli.jsonl", SNLI_RECORDS, compress))
    assert [label for *_, label in data] == [1, 0, 2, 1]
    assert data[0] == (["Two", "women", "are", "embracing", "."], ["The", "sisters", "are", "n't", "hugging", "."], 1)
    assert len(data[3][0]) == 100
    assert [label for *_, label in read_snli_jsonl(tmp_path / "snli.jsonl", max_tokens=4)] == [0]


def test_read_snli_tsv_with_and_without_header(tmp_path):
    rows = [
        "neutral\tTwo women are embracing .\tThe sisters are hugging .",
        "-\tA man .\tA dog .",
        "contradiction\tA cat does n't sleep .\tThe cat 's running .",
        "entailment\t" + " ".join(["w"] * 101) + "\tShort .",
        "entailment\tA\t",  # empty hypothesis → dropped
    ]
    plain = write(tmp_path / "dev.tsv", "\n".join(rows) + "\n")
    headed = write(tmp_path / "h.tsv.gz", "gold_label\tsentence1\tsentence2\n" + "\n".join(rows) + "\n", "gz")
    expected = [
        (["Two", "women", "are", "embracing", "."], ["The", "sisters", "are", "hugging", "."], 1),
        (["A", "cat", "does", "n't", "sleep", "."], ["The", "cat", "'s", "running", "."], 2),
    ]
    assert read_snli_tsv(plain) == expected
    assert read_snli_tsv(headed) == expected


def test_read_snli_tsv_official_txt_columns(tmp_path):
    header = "gold_label\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1\tsentence2\tpairID"
    row = "entailment\t( A man )\t( Someone )\tA man isn't sad.\tSomeone's fine.\tp1"
    path = write(tmp_path / "snli_1.0_dev.txt", header + "\n" + row + "\n")
    assert read_snli_tsv(path, tokenized=False) == [(["A", "man", "is", "n't", "sad", "."],
                                                     ["Someone", "'s", "fine", "."], 0)]


def test_snli_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown gold label 'maybe'"):
        read_snli_tsv(write(tmp_path / "a.tsv", "maybe\ta\tb\n"))
    with pytest.raises(ValueError, match="a.tsv:1: expected 3 tab-separated fields, got 2"):
        read_snli_tsv(write(tmp_path / "a.tsv", "neutral\tonly one\n"))
    with pytest.raises(ValueError, match="b.jsonl:1: not an SNLI record"):
        read_snli_jsonl(write(tmp_path / "b.jsonl", '{"gold_label": "neutral"}\n'))


def test_load_snli_finds_jsonl_and_tsv(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"snli_1\.0_train\.jsonl.*dev\.tsv\.gz"):
        load_snli(tmp_path)
    (tmp_path / "snli_1.0").mkdir()
    write_jsonl(tmp_path / "snli_1.0" / "snli_1.0_train.jsonl", SNLI_RECORDS)
    write(tmp_path / "dev.tsv.gz", "entailment\tA b .\tC .\n", "gz")
    data = load_snli(tmp_path)
    assert sorted(data) == ["train", "valid"]
    assert len(data["train"]) == 4 and data["valid"] == [(["A", "b", "."], ["C", "."], 0)]
    write_jsonl(tmp_path / "snli_1.0_dev.jsonl", SNLI_RECORDS[:1])  # jsonl is preferred over TSV
    assert load_snli(tmp_path)["valid"][0][2] == 1


# --- vocabulary ----------------------------------------------------------------------------------------------------


def test_vocab_build_is_deterministic():
    corpus = [["b", "a", "c"], ["c", "b", "d"], ["c", "<unk>", "e"]]
    vocab = Vocab.build(corpus)
    assert vocab.itos == ["<pad>", "<unk>", "c", "b", "a", "d", "e"]
    assert vocab.stoi == {tok: i for i, tok in enumerate(vocab.itos)}
    assert Vocab.build(list(reversed([list(reversed(t)) for t in corpus]))).itos == vocab.itos
    assert len(vocab) == 7 and "c" in vocab and "z" not in vocab
    assert vocab.encode(["c", "z", "a", "<pad>"]) == [2, 1, 4, 0]
    assert Vocab.build(corpus, min_freq=2).itos == ["<pad>", "<unk>", "c", "b"]
    with pytest.raises(ValueError, match="must start"):
        Vocab(["a", "<pad>", "<unk>"])
    with pytest.raises(ValueError, match="duplicate"):
        Vocab(["<pad>", "<unk>", "a", "a"])


# --- GloVe ---------------------------------------------------------------------------------------------------------

GLOVE_TEXT = (
    "the 0.1 0.2 0.3\n"
    ", -1 -2 -3\n"
    "not_in_vocab 9 9 9\n"
    ". . . 1.5 2.5 3.5\n"  # a word containing spaces (as in 840B)
    "a\xa0b 4 5 6 \n"  # a non-breaking space is part of the word; a trailing space is ignored
    "the 7 7 7\n"  # a duplicate keeps the first vector
    "<unk> 8 8 8\n"  # specials are never read
    "Cat 1e-1 -2.5E+00 0\r\n"
)


@pytest.fixture
def glove_vocab() -> Vocab:
    return Vocab(["<pad>", "<unk>", "the", ",", ". . .", "a\xa0b", "Cat", "missing"])


def expected_glove() -> torch.Tensor:
    return torch.tensor(
        [[0, 0, 0], [0, 0, 0], [0.1, 0.2, 0.3], [-1, -2, -3], [1.5, 2.5, 3.5], [4, 5, 6], [0.1, -2.5, 0], [0, 0, 0]],
        dtype=torch.float32,
    )


@pytest.mark.parametrize("compress", [None, "gz", "xz", "bz2"])
def test_read_glove_formats(tmp_path, glove_vocab, compress):
    path = write(tmp_path / "glove.txt", GLOVE_TEXT, compress)
    matrix, found = read_glove(path, glove_vocab)
    assert matrix.dtype == torch.float32 and matrix.shape == (8, 3)
    assert found == 5
    torch.testing.assert_close(matrix, expected_glove())
    matrix3, found3 = read_glove(path, glove_vocab, dim=3)
    assert found3 == 5 and torch.equal(matrix3, matrix)


def test_read_glove_zip_and_header(tmp_path, glove_vocab):
    zpath = tmp_path / "glove.zip"
    with zipfile.ZipFile(zpath, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("glove.txt", GLOVE_TEXT)
    torch.testing.assert_close(read_glove(zpath, glove_vocab)[0], expected_glove())
    path = write(tmp_path / "w2v.txt", "7 3\n" + GLOVE_TEXT)
    torch.testing.assert_close(read_glove(path, glove_vocab)[0], expected_glove())


def test_read_glove_errors(tmp_path, glove_vocab):
    with pytest.raises(ValueError, match="g.txt:3: expected a word and 3 values"):
        read_glove(write(tmp_path / "g.txt", "the 1 2 3\n, 1 2 3\nthe 1 2\n"), glove_vocab)
    with pytest.raises(ValueError, match="g.txt:2: 3 values where the first line has 2"):  # a first line cut short
        read_glove(write(tmp_path / "g.txt", "the 1 2\n, 1 2 3\n"), glove_vocab)
    with pytest.raises(ValueError, match="bad vector"):
        read_glove(write(tmp_path / "g.txt", "the 1 2 x\n"), glove_vocab)
    with pytest.raises(ValueError, match="g.txt: the file is empty"):  # a file truncated to nothing
        read_glove(write(tmp_path / "g.txt", ""), glove_vocab, dim=4)
    with pytest.raises(ValueError, match="no vectors"):
        read_glove(write(tmp_path / "g.txt", "\n"), glove_vocab)
    matrix, found = read_glove(tmp_path / "g.txt", glove_vocab, dim=4)
    assert matrix.shape == (8, 4) and found == 0 and not matrix.any()


def test_glove_cache_hit_and_key(tmp_path, glove_vocab, monkeypatch):
    path = write(tmp_path / "glove.txt.gz", GLOVE_TEXT, "gz")
    cache = tmp_path / "cache"
    first = glove_cache(path, glove_vocab, cache)
    torch.testing.assert_close(first, expected_glove())
    files = list(cache.glob("*.pt"))
    assert len(files) == 1 and files[0].name.startswith("glove-glove-")
    assert not list(cache.glob("*.tmp"))

    def fail(*args, **kwargs):
        raise AssertionError("the text file was read again")

    monkeypatch.setattr(text, "read_glove", fail)
    assert torch.equal(glove_cache(path, glove_vocab, cache), first)
    # another vocabulary, or a changed file, is another key
    with pytest.raises(AssertionError, match="read again"):
        glove_cache(path, Vocab([*glove_vocab.itos, "extra"]), cache)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(AssertionError, match="read again"):
        glove_cache(path, glove_vocab, cache)


# --- padding -------------------------------------------------------------------------------------------------------


def test_pad_batch():
    ids, lengths = pad_batch([[5, 6, 7], [8], []])
    assert ids.dtype == torch.int64 and lengths.dtype == torch.int64
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0], [0, 0, 0]] and lengths.tolist() == [3, 1, 0]
    ids, _ = pad_batch([[1, 2], [3]], pad=-1)
    assert ids.tolist() == [[1, 2], [3, -1]]
    ids, lengths = pad_batch([])
    assert ids.shape == (0, 0) and lengths.shape == (0,)


# --- real data (skipped when absent) -------------------------------------------------------------------------------

@pytest.mark.real_data("sst")
def test_real_sst(data_root):
    data = load_sst(data_root / "sst")  # enforces 6920 / 872 / 1821
    assert {k: len(v) for k, v in data.items()} == {"train": 6920, "valid": 872, "test": 1821}
    tokens, label = data["train"][0]
    assert label == 1  # root label 3
    assert tokens[:5] == ["The", "Rock", "is", "destined", "to"] and tokens[-1] == "."
    assert Counter(label for _, label in data["valid"]) == {0: 139 + 289, 1: 279 + 165}


@pytest.mark.real_data("snli")
def test_real_snli(data_root):
    data = load_snli(data_root / "snli")
    assert sorted(data) == ["test", "valid"]
    counts = {split: Counter(label for *_, label in pairs) for split, pairs in data.items()}
    assert counts["valid"] == {0: 3329, 1: 3235, 2: 3278} and sum(counts["valid"].values()) == 9842
    assert counts["test"] == {0: 3368, 1: 3219, 2: 3237} and sum(counts["test"].values()) == 9824
    premise, hypothesis, label = data["valid"][0]
    assert premise == "Two women are embracing while holding to go packages .".split() and label == 1
    assert [label for *_, label in data["valid"][:3]] == [1, 0, 2]


_GLOVE_840B = "glove.840B-top100sample.300d.sst_conll.txt.xz"


@pytest.mark.real_data(f"glove/{_GLOVE_840B}")
def test_real_glove_840b_sample(tmp_path, data_root):
    path = data_root / "glove" / _GLOVE_840B
    with lzma.open(path, "rt", encoding="utf-8") as f:
        words = [line.rstrip("\n").rsplit(" ", 300)[0] for line in f]
    assert len(words) == 98
    vocab = Vocab.build([words + ["zzz-not-in-glove"]])
    matrix, found = read_glove(path, vocab)
    assert matrix.shape == (101, 300) and found == 98
    assert not matrix[vocab.stoi["zzz-not-in-glove"]].any() and not matrix[0].any()
    assert matrix[vocab.stoi[","]][:2].tolist() == pytest.approx([-0.082752, 0.67204])
    assert torch.equal(glove_cache(path, vocab, tmp_path), matrix)
