"""Atomic writers for result files: a reader never sees a half-written CSV, JSON or plot.

Each writer writes a temporary file in the destination's directory (same file system) and
then `os.replace`s it over the destination, which is atomic on POSIX.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import numbers
import os
import tempfile
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
# pandas (about 0.4 s to import) only where a function reads frames: the ranks import this
# module for its writers and never need it.


@contextlib.contextmanager
def atomic_open(path: Path | str, mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temp file beside `path`; on a clean exit it replaces `path`, else it is removed."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        newline = "" if "b" not in mode else None
        with os.fdopen(fd, mode, newline=newline) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: Path | str, text: str) -> None:
    """Write `text` to `path` atomically."""
    with atomic_open(path, "w") as f:
        f.write(text)


def write_json_atomic(path: Path | str, obj: Any) -> None:
    """Write `obj` as indented JSON atomically (unknown types via str())."""
    write_text_atomic(path, json.dumps(obj, indent=2, default=str) + "\n")


def column_by_repeat(frame: pd.DataFrame, column: str) -> dict[int, np.ndarray]:
    """Repeat -> the column's non-missing values as floats, repeats in order: what
    `{r: g[column].dropna() for r, g in frame.groupby("repeat")}` gives, without cutting
    every other column of the frame per repeat (the summaries call this thousands of times)."""
    import pandas as pd

    if frame.empty:
        return {}
    repeats = frame["repeat"].to_numpy()
    values = frame[column].to_numpy(float)
    keys = pd.unique(repeats[pd.notna(repeats)])
    out = {}
    for r in sorted(keys):
        v = values[repeats == r]
        out[int(r)] = v[~np.isnan(v)]
    return out


def cells_by_repeat(frame: pd.DataFrame, column: str) -> dict[int, list]:
    """Repeat -> the column's raw cells (missing ones included), repeats in order."""
    if frame.empty:
        return {}
    return {int(r): list(x) for r, x in frame.groupby("repeat")[column]}


_PLAIN = (str, int)  # their str() is the cell (bool is an int: handled first)


def csv_cell(value: Any) -> str:
    """One CSV cell: booleans as True/False, None and NaN as empty (unknown, never a number)."""
    kind = type(value)
    if kind is float:
        return "" if value != value else str(value)
    if kind in _PLAIN:
        return value if kind is str else str(value)
    if value is None or type(value).__name__ in ("NAType", "NaTType"):  # pandas' missing values
        return ""
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isnan(value):
        return ""
    return str(value)


def write_csv_atomic(path: Path | str, rows: list[dict], columns: list[str]) -> None:
    """Write `rows` (dicts keyed by `columns`; missing keys are empty) as CSV atomically."""
    write_text_atomic(path, _csv_text([columns]) + _csv_text(_cells(rows, columns)))


class GrowingCsv:
    """A CSV that only grows: at each `add` the file is rewritten whole and atomically, as
    write_csv_atomic would, but each row is formatted once. A run's rows files are written
    after every cell; formatting all of them again each time made that cost grow with the
    run (0.1 s a cell by a 40-repeat run's end: 10k step rows)."""

    def __init__(self, path: Path | str, columns: list[str]):
        self.path, self.columns = Path(path), columns
        self._text = [_csv_text([columns])]

    def add(self, rows: list[dict]) -> None:
        self._text.append(_csv_text(_cells(rows, self.columns)))
        write_text_atomic(self.path, "".join(self._text))


def _cells(rows: list[dict], columns: list[str]) -> Iterator[list[str]]:
    known = set(columns)
    for row in rows:
        extra = set(row) - known
        if extra:
            raise ValueError(f"row has columns not in the header: {sorted(extra)}")
        yield [csv_cell(row.get(c)) for c in columns]


def _csv_text(lines) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(lines)
    return out.getvalue()


class ResultFileError(ValueError):
    """A result file is missing, unreadable or lacks columns; the message is one line."""


def read_csv_checked(path: Path | str, required: list[str]) -> pd.DataFrame:
    """Read a result CSV, requiring `required` columns; ResultFileError says what is wrong."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise ResultFileError(f"{path}: no such file")
    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError, pd.errors.ParserError) as e:  # EmptyDataError is a ValueError
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise ResultFileError(f"{path}: unreadable CSV ({first})") from e
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise ResultFileError(f"{path}: missing columns {', '.join(missing)}")
    return frame


def numeric_columns(frame: pd.DataFrame, columns: list[str], where: Path | str,
                    not_empty: list[str] = ()) -> pd.DataFrame:
    """A copy with `columns` (those present) as numbers; a non-numeric cell, or an empty one
    in a `not_empty` column, is a ResultFileError naming the file and column."""
    import pandas as pd

    frame = frame.copy()
    for col in (c for c in columns if c in frame.columns):
        values = pd.to_numeric(frame[col], errors="coerce")
        if (values.isna() & frame[col].notna()).any():
            raise ResultFileError(f"{where}: non-numeric values in column {col}")
        if col in not_empty and values.isna().any():
            raise ResultFileError(f"{where}: empty cells in column {col}")
        frame[col] = values
    return frame


def read_json_object(path: Path | str, required: list[str] = ()) -> dict:
    """A JSON object file with `required` keys; ResultFileError (one line) says what is wrong."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultFileError(f"{path}: no such file") from None
    except (OSError, ValueError) as e:
        raise ResultFileError(f"{path}: unreadable JSON ({e})") from e
    if not isinstance(data, dict):
        raise ResultFileError(f"{path}: expected a JSON object")
    missing = [k for k in required if k not in data]
    if missing:
        raise ResultFileError(f"{path}: missing keys {', '.join(missing)}")
    return data


# ---- list cells: several numbers in one CSV cell, 'a;b;c' -----------------------------------

def list_cell(values, fmt: str = ".4f") -> str:
    """Numbers as one cell 'a;b;c' (empty for none)."""
    return ";".join(format(v, fmt) for v in values)


def parse_list_cell(cell: object, where: str, column: str) -> list[float]:
    """'a;b;c' -> floats; an empty cell -> []; anything else a ResultFileError naming the
    file and column."""
    import pandas as pd

    if pd.isna(cell) or not str(cell).strip():
        return []
    try:
        return [float(v) for v in str(cell).split(";")]
    except ValueError as e:
        raise ResultFileError(f"{where}: bad {column} cell {str(cell)[:40]!r}") from e


def parse_gaps(cell: object) -> list[float]:
    """requests.csv `itl_ms`: a request's inter-token gaps ([] with fewer than two tokens)."""
    return parse_list_cell(cell, "requests.csv", "itl_ms")


# ---- reading cells back: the inverse of csv_cell ------------------------------------------

_TRUE = {True, "True", "true", "TRUE", "1"}  # 1 and 1.0 hash as True
_FALSE = {False, "False", "false", "FALSE", "0"}


def is_true(value: object) -> bool:
    """A cell that says True (a bool or one of its CSV spellings)."""
    return isinstance(value, Hashable) and value in _TRUE


def as_bool(series: pd.Series) -> pd.Series:
    """True/False from bools or their CSV spellings; anything else (empty, NaN) -> None."""
    def cell(v: object) -> bool | None:
        if isinstance(v, Hashable) and v in _TRUE:
            return True
        if isinstance(v, Hashable) and v in _FALSE:
            return False
        return None
    return series.map(cell).astype(object)


def clean_key(key: tuple) -> tuple:
    """Group key with NaN -> None and numpy scalars -> Python, so keys compare across frames."""
    out = []
    for v in key:
        if isinstance(v, float) and math.isnan(v):
            out.append(None)
        else:
            out.append(v.item() if isinstance(v, np.generic) else v)
    return tuple(out)
