"""Every real-format reader against damaged files (issue #20 part 5): each damage of :mod:`reliability.readers`
ends in one clear line naming the file, or is a damage that no reader can tell from a valid file."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reliability import readers
from reliability.readers import CASES, check, draw_params

PAIRS = [(case, mutation) for case, spec in CASES.items() for mutation in spec.mutations]


@pytest.mark.parametrize("case, mutation", PAIRS, ids=[f"{c}-{m}" for c, m in PAIRS])
@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_damage_is_clear_or_undetectable(case, mutation, data, tmp_path):
    params = draw_params(case, mutation, lambda name, lo, hi: data.draw(st.integers(lo, hi), label=name))
    outcome = check(case, mutation, params, tmp_path)
    assert outcome.verdict in ("clear", "undetectable"), outcome


def test_run_covers_every_pair_deterministically():
    outcomes = readers.run(examples_per_pair=1, seed=3)
    assert [(o.reader, o.mutation) for o in outcomes] == PAIRS
    assert {o.verdict for o in outcomes} <= {"clear", "undetectable"}
    assert [o.params for o in readers.run(examples_per_pair=1, seed=3)] == [o.params for o in outcomes]


def test_the_mutations_are_plain_functions_of_their_parameters():
    data = b"a b c\nd e f\n"
    assert readers.truncate(data, 3) == b"a b"
    assert readers.cut_mid_record(data, 1, 2) == b"a b c\nd \n"
    assert readers.wrong_field_count(data, 0, 1, 1, sep=b" ") == b"a b b c\nd e f\n"
    assert readers.wrong_field_count(data, 0, 1, 0, sep=b" ") == b"a c\nd e f\n"
    assert readers.wrong_label(data, 1, b"X", pattern=rb"^(\S+)") == b"a b c\nX e f\n"
    assert readers.bad_encoding(data, 1) == b"a\xff b c\nd e f\n"
    assert readers.wrong_magic(b"\x00\x00\x08\x01", 2, 9) == b"\x00\x00\x09\x01"
    assert readers.corrupt_byte(b"\x00\x0f", 1, 0xFF) == b"\x00\xf0"


# --- regression examples: the exact lines --------------------------------------------------------------------------


def _message(case: str, mutation: str, params: dict, tmp_path: Path) -> str:
    outcome = check(case, mutation, params, tmp_path)
    assert outcome.verdict == "clear", outcome
    return re.sub(r"/\S*/", "", outcome.message)  # the files' folder is a temporary one


@pytest.mark.parametrize(
    "case, mutation, params, expected",
    [
        # plain files truncated mid-line (before: SST, SNLI, CoNLL, GloVe read a shorter file silently)
        ("glove", "truncate", {"at": 30}, "glove.txt:2: the last line has no line end, so the file looks truncated "
         "mid-line (a complete file ends with a newline)"),
        ("conll", "truncate", {"at": 0}, "train.txt: the file is empty"),
        # invalid UTF-8 (before: replaced by U+FFFD and read silently)
        ("conll", "bad_encoding", {"at": 30}, "train.txt:3: invalid UTF-8 (byte 0xFF at column 9)"),
        # a corrupt gzip stream (before: a bare EOFError / zlib.error / BadGzipFile)
        ("snli_tsv_gz", "truncate", {"at": 133}, "dev.tsv.gz: corrupt or truncated gzip stream after line 3 "
         "(EOFError: Compressed file ended before the end-of-stream marker was reached)"),
        # wrong labels (before: read silently, or named without a line)
        ("conll", "wrong_label", {"line_index": 4, "value": b"X"},
         "train.txt:5: NER tag 'X' is not O or B-, I-, E-, S- followed by one of LOC, MISC, ORG, PER"),
        ("twpos", "wrong_label", {"line_index": 0, "value": b"NN"},
         "oct27.train:1: tag 'NN' is not in the Twitter tagset NO^SZVAR!DP&TXY#@~UE$,GLM"),
        ("arff_dense", "wrong_label", {"line_index": 9, "value": b"2"},
         "toy.arff:10: label values must be 0 or 1, found 2 for 'lab_b'"),
        ("mulan_xml", "wrong_label", {"line_index": 2, "value": b"lab_c"},
         "toy.xml: label 0 'lab_c' is not among the last 2 attributes of toy.arff (the XML's labels must be the "
         "ARFF's last attributes, each once)"),
        ("glove", "wrong_label", {"line_index": 2, "value": b"nan"},
         "glove.txt:3: the vector of 'of' holds nan or inf"),
        ("idx", "wrong_label", {"record": 2, "value": 107},
         "train-labels-idx1-ubyte: record 2: label 107 outside 0..9"),
        # wrong field counts (before: an extra SNLI TSV field, a cut ListOps bracket were read silently)
        ("snli_tsv", "wrong_field_count", {"line_index": 1, "field_index": 0, "extra": 1},
         "dev.tsv:2: expected 3 tab-separated fields, got 4"),
        ("listops", "cut_mid_record", {"line_index": 1, "keep": 22},
         "test_d20s.tsv:2: unbalanced brackets (3 '(' but 2 ')')"),
        # CIFAR pickles (before: UnpicklingError, MemoryError or a silent label 255)
        ("cifar10", "truncate", {"at": 2927}, "data_batch_1: not a readable CIFAR-10 batch, the pickle is truncated or "
         "corrupt (UnpicklingError: pickle data was truncated)"),
        ("cifar10", "wrong_label", {"record": 0, "value": 255}, "data_batch_1: record 0: label 255 outside 0..9"),
    ],
)
def test_regression_messages(case, mutation, params, expected, tmp_path):
    assert _message(case, mutation, params, tmp_path) == expected


def test_a_cut_at_a_line_end_is_undetectable_and_a_cut_line_is_not(tmp_path):
    valid = readers.valid_bytes("sst")
    first_line_end = valid.index(b"\n") + 1
    assert check("sst", "truncate", {"at": first_line_end}, tmp_path).verdict == "undetectable"
    assert check("sst", "truncate", {"at": first_line_end - 1}, tmp_path).verdict == "clear"


def test_the_verdicts_can_fail(tmp_path, monkeypatch):
    """A reader that ignores the damage is judged silent, one that raises a bare error unclear."""
    sst = CASES["sst"]
    monkeypatch.setitem(CASES, "sst", readers.Case(sst.write, lambda path: [], sst.mutations))
    assert check("sst", "wrong_label", random.Random(0), tmp_path).verdict == "silent"

    def bare(path: Path) -> list:
        raise KeyError("gold_label")

    monkeypatch.setitem(CASES, "sst", readers.Case(sst.write, bare, sst.mutations))
    assert check("sst", "wrong_label", random.Random(0), tmp_path).verdict == "unclear"
