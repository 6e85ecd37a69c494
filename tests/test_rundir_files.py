"""bench.rundir.files' fast paths equal the plain pandas they stand for: a cell written as
csv_cell's rule says, a column split by repeat as groupby("repeat") splits it."""

import math

import numpy as np
import pandas as pd

from bench.rundir.files import cells_by_repeat, column_by_repeat, csv_cell


def test_csv_cell_on_every_kind():
    assert [csv_cell(v) for v in ("a", 3, 2.5, True, False, None, math.nan, np.float64("nan"),
                                  np.int64(7), np.float32(1.5), pd.NA, np.bool_(True))] == \
        ["a", "3", "2.5", "True", "False", "", "", "", "7", "1.5", "", "True"]


def test_by_repeat_equals_groupby():
    frame = pd.DataFrame({"repeat": [2, 0, 2, 1, 0, 2], "x": [1.0, None, 3.0, 4.0, 5.0, None],
                          "cells": ["1;2", None, "3", "", "4;5", 6.0]})
    want = {int(r): g["x"].dropna().to_numpy(float) for r, g in frame.groupby("repeat")}
    got = column_by_repeat(frame, "x")
    assert list(got) == [0, 1, 2] and all(np.array_equal(got[r], want[r]) for r in want)
    assert cells_by_repeat(frame, "cells") == {0: [None, "4;5"], 1: [""], 2: ["1;2", "3", 6.0]}
    assert column_by_repeat(frame.iloc[:0], "x") == {} == cells_by_repeat(frame.iloc[:0], "x")
