"""bench/replay.py: the ListOps replays timed both ways, at tiny sizes."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

from tests.tasks.test_listops import SMALL, write_listops

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import replay  # noqa: E402
from latentstruct.data import listops as listops_data  # noqa: E402


def test_both_replays_are_timed_and_the_page_says_at_which_sizes(tmp_path, monkeypatch):
    generate = functools.partial(listops_data.generate, max_depth=3, leaf_prob=0.4, max_args=3)  # short expressions
    monkeypatch.setattr(listops_data, "generate", generate)
    write_listops(tmp_path / "data" / "listops")
    overrides = [*SMALL, "dataset.n_train=16", "dataset.n_valid=6", "trainer.batch_size=8",
                 f"paths.data_dir={tmp_path / 'data'}"]
    seen = []
    forward = replay.MergeParser.forward

    def spy(self, *args, **kwargs):  # which replays scored every pair
        seen.append(kwargs.get("scores", True))
        return forward(self, *args, **kwargs)

    replay.MergeParser.forward = spy
    try:
        assert replay.main(["--out", str(tmp_path / "replay.md"), "--steps", "1", "--repeats", "1",
                            "--experiments", "listops_gold", "--override", *overrides]) == 0
    finally:
        replay.MergeParser.forward = forward
    sheet = json.loads((tmp_path / "replay.json").read_text())
    assert [r["experiment"] for r in sheet["rows"]] == ["listops_gold"]
    assert all(r["before"] > 0 and r["now"] > 0 and len(r["runs"]["before"]) == 1 for r in sheet["rows"])
    # the gold Tree-LSTM replays with scores=False; "before" forced the scoring replay
    assert seen.count(True) == seen.count(False) == 2  # an untimed and a timed step each
    page = (tmp_path / "replay.md").read_text()
    assert "the overrides `task.word_dim=8" in page and "| listops_gold |" in page
