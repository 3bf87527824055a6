"""The skip policy's bounds (data.on_bad_sample=skip): a step draws again for each bad record,
up to a run of bad records in a row that no data set with usable media produces, and the run
stops when the share of bad records drawn in an epoch passes data.max_bad_fraction, counted
afresh each epoch."""
from __future__ import annotations

import pytest

from mmrl.train.prompts import BadRecords, TooManyBadRecords


def _draw(bad: BadRecords, epoch: int, ok: bool, idx: int, in_a_row: int = 0) -> None:
    if not ok:
        bad.skipped(idx, f"d.jsonl:{idx + 1}: image x{idx}.png: file not found")
    bad.tried(epoch, ok)
    bad.check(in_a_row, want=8)


def test_a_long_run_of_bad_records_stops_though_the_epochs_share_is_low():
    """A sorted data set whose later media folder is missing: 20% of the epoch, but a step
    would draw on and on."""
    bad = BadRecords(size=100_000, max_fraction=0.5)
    for i in range(1000):
        _draw(bad, 0, True, i)
    for n in range(1, BadRecords.IN_A_ROW):
        _draw(bad, 0, False, 1000 + n, in_a_row=n)  # 255 in a row: drawn again
    with pytest.raises(TooManyBadRecords) as e:
        _draw(bad, 0, False, 2000, in_a_row=BadRecords.IN_A_ROW)
    assert str(e.value).startswith("256 training records in a row failed to load, so a step "
                                   "cannot fill its batch; the first:\n  d.jsonl:1002: image")


def test_the_share_is_counted_per_epoch_and_each_record_printed_once():
    bad = BadRecords(size=10, max_fraction=0.5)
    lines = []
    for epoch in range(5):  # 4 of 10 bad every epoch: 40%, under 0.5 each time
        for i in range(10):
            ok = i % 3 != 0
            if not ok:
                lines.append(bad.skipped(i, f"d.jsonl:{i + 1}: bad"))
            bad.tried(epoch, ok)
            bad.check(0, want=8)
    assert bad.count == 20 and [x for x in lines if x] == [f"skipped d.jsonl:{i}: bad"
                                                          for i in (1, 4, 7, 10)]
    for ok in [False] * 6 + [True] * 4:  # the next epoch goes over: 6 of its 10
        bad.tried(5, ok)
    with pytest.raises(TooManyBadRecords, match=r"6 of the 10 training records drawn in epoch 6 "
                                                r"failed to load \(60%, over "
                                                r"data.max_bad_fraction=0.5\)"):
        bad.check(0, want=8)
