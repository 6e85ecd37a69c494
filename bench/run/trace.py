"""Real traffic: requests from a trace in the Mooncake format (docs/traces.md), the
format of the Mooncake FAST'25 release, which SGLang's bench_serving, NVIDIA
AIPerf and Dynamo's data generator also read.

One JSON object per line: `timestamp` (ms), `input_length` and `output_length` (tokens),
`hash_ids` (the prompt's blocks of 512 tokens; the last one may be partial). Each hash id
stands for one fixed block of 512 tokens, a pure function of the id, so equal leading ids
give equal tokens, a shared radix prefix and equal page hashes; the last block is cut to
`input_length`. A file that cannot be replayed is refused with the line that says why.

The window: the first `skip` requests are not replayed; the service has served them, so
their pages are in storage before the run (SGLang writes every computed page through to
storage). Then `limit` requests are replayed at their own arrival times, `time_scale` times
faster, relative to the first replayed one (bench_serving's mooncake replay, with its
slowdown factor = 1 / time_scale).

Request class, from the file alone: `prefetch` when its leading blocks beyond the first
(the service's shared system prompt) were seen in an earlier request, a conversation's
later turn; `bystander` when only the first block or nothing is shared.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from bench.run.workload import Workload
from hicache.spec.request import Request

BLOCK_TOKENS = 512
VOCAB = 32000
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
_INTS = list(range(VOCAB))  # one int object per token id: prompts share them, 8 bytes a token
_SEED = 0x6D6F6F6E  # the blocks' tokens are this seed's stream per hash id


class TraceError(ValueError):
    """The trace cannot be replayed; the message names the file and line."""


@dataclass(frozen=True)
class TraceRow:
    line: int  # 1-based line number in the file
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def read_trace(path: Path | str, skip: int = 0, limit: int | None = None) -> list[TraceRow]:
    """The first `skip + limit` requests of the file (all with limit None), validated."""
    rows: list[TraceRow] = []
    want = math.inf if limit is None else skip + limit
    try:
        with open(path, encoding="utf-8") as f:
            for number, text in enumerate(f, start=1):
                if len(rows) >= want:
                    break
                if text.strip():
                    rows.append(_parse(text, number, path))
    except OSError as e:
        raise TraceError(f"cannot read trace {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a text file (JSON lines expected)") from None
    if len(rows) < skip + (limit or 1):
        raise TraceError(f"{path}: {len(rows)} requests, fewer than --trace-skip {skip} + "
                         f"{limit or 1} to replay")
    return rows


def _parse(text: str, line: int, path) -> TraceRow:
    where = f"{path}: line {line}"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(f"{where}: not JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: not a JSON object")
    missing = [k for k in FIELDS if k not in obj]
    if missing:
        raise TraceError(f"{where}: missing field(s) {', '.join(missing)}")
    ts, n_in, n_out, ids = (obj[k] for k in FIELDS)
    if not _number(ts) or ts < 0:
        raise TraceError(f"{where}: timestamp must be a number >= 0, got {ts!r}")
    for name, v in (("input_length", n_in), ("output_length", n_out)):
        if not _integer(v) or v < 1:
            raise TraceError(f"{where}: {name} must be an integer >= 1, got {v!r}")
    if not isinstance(ids, list) or not ids or not all(_integer(b) and b >= 0 for b in ids):
        raise TraceError(f"{where}: hash_ids must be a non-empty list of integers >= 0")
    blocks = -(-n_in // BLOCK_TOKENS)
    if len(ids) != blocks:
        raise TraceError(f"{where}: {len(ids)} hash_ids do not fit input_length {n_in} "
                         f"({blocks} blocks of {BLOCK_TOKENS} tokens, the last may be partial)")
    return TraceRow(line, float(ts), n_in, n_out, tuple(ids))


def _integer(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v) -> bool:
    return (_integer(v) or isinstance(v, float)) and math.isfinite(v)


# ---- prompts from blocks ------------------------------------------------------------------


def block_tokens(hash_id: int) -> list[int]:
    """The 512 tokens hash id `hash_id` stands for (the same in every process)."""
    ids = np.random.default_rng([_SEED, hash_id]).integers(0, VOCAB, BLOCK_TOKENS)
    return list(map(_INTS.__getitem__, ids.tolist()))


def prompt_tokens(row: TraceRow) -> list[int]:
    out: list[int] = []
    for b in row.hash_ids:
        out += block_tokens(b)
    return out[: row.input_length]


class Histories:
    """The skipped requests' prompts, made again on each pass (never all held at once)."""

    def __init__(self, rows: list[TraceRow]):
        self.rows = rows

    def __iter__(self) -> Iterator[list[int]]:
        return (prompt_tokens(r) for r in self.rows)

    def __len__(self) -> int:
        return len(self.rows)


# ---- the replay ---------------------------------------------------------------------------


def reuse_bounds(rows: list[TraceRow], page: int) -> list[int]:
    """Per row: the tokens of its prompt an unbounded cache could reuse, from the file alone:
    its leading blocks seen in earlier rows, as far as an earlier row cached them (a row
    caches the whole pages of its prompt: a partial last block, less), capped at
    input_length - 1 and cut to whole pages."""
    held: dict[int, int] = {}  # hash id -> most of its tokens an earlier row cached
    out = []
    for r in rows:
        reuse = 0
        for b, n in zip(r.hash_ids, _block_sizes(r), strict=True):
            reuse += min(held.get(b, 0), n)
            if held.get(b, 0) < n:
                break
        out.append(min(reuse, r.input_length - 1) // page * page)
        whole = r.input_length // page * page
        for i, b in enumerate(r.hash_ids):
            cached = max(0, min(BLOCK_TOKENS, whole - i * BLOCK_TOKENS))
            held[b] = max(held.get(b, 0), cached)
    return out


def _block_sizes(r: TraceRow) -> list[int]:
    return [min(BLOCK_TOKENS, r.input_length - i * BLOCK_TOKENS) for i in range(len(r.hash_ids))]


def classes(rows: list[TraceRow]) -> list[str]:
    """`prefetch` when a prefix beyond the first block was seen before, else `bystander`."""
    seen: set[int] = set()
    out = []
    for r in rows:
        out.append("prefetch" if len(r.hash_ids) > 1 and r.hash_ids[1] in seen
                   and r.hash_ids[0] in seen else "bystander")
        seen.update(r.hash_ids)
    return out


def requests(rows: list[TraceRow], skip: int, time_scale: float,
             kinds: list[str]) -> list[Request]:
    """The replayed rows (after `skip`) as requests, arrivals `time_scale` times faster."""
    replay = rows[skip:]
    t0 = min(r.timestamp_ms for r in replay)
    return [Request(f"t{r.line:05d}", prompt_tokens(r), (r.timestamp_ms - t0) / 1e3 / time_scale,
                    r.output_length, kind=k)
            for r, k in zip(replay, kinds[skip:], strict=True)]


# ---- a replay the plan names -----------------------------------------------------------------


@dataclass(frozen=True)
class TraceSpec:
    """The trace window a run replays (the plan's; every rank reads the same file)."""

    path: str
    skip: int = 0  # requests served before the run: their pages are in storage
    requests: int | None = None  # replayed after them; None = the rest of the file

    def rows(self) -> list[TraceRow]:
        return _rows(self.path, self.skip, self.requests)

    def base_rate_rps(self) -> float:
        """The replayed window's own arrival rate (requests/s, over its span)."""
        replay = self.rows()[self.skip:]
        span = (replay[-1].timestamp_ms - replay[0].timestamp_ms) / 1e3
        return (len(replay) - 1) / span if span > 0 and len(replay) > 1 else math.inf

    def cell_budget_s(self, offered_rate_rps: float) -> float:
        """A generous bound on one replay (its arrivals, prefills of long prompts, the
        longest answer), so a wedged run still ends."""
        rows = self.rows()[self.skip:]
        return (30.0 + 3.0 * len(rows) / offered_rate_rps
                + 1e-4 * sum(r.input_length for r in rows)
                + 0.02 * max(r.output_length for r in rows))

    def workload(self, offered_rate_rps: float) -> Workload:
        """The replay at an offered load (time scale = offered / base rate). The last one
        built is kept: every protocol of a repeat replays the same requests (they are
        read, never changed, by a run), and a long window takes seconds to build."""
        key = (self, offered_rate_rps)
        if _BUILT.get("key") != key:
            _BUILT.update(key=key, workload=self._build(offered_rate_rps))
        return _BUILT["workload"]

    def _build(self, offered_rate_rps: float) -> Workload:
        rows = self.rows()
        scale = offered_rate_rps / self.base_rate_rps() if math.isfinite(offered_rate_rps) \
            else math.inf
        reqs = requests(rows, self.skip, scale, classes(rows)) if math.isfinite(scale) else \
            [replace(q, arrival_offset_s=0.0) for q in requests(rows, self.skip, 1.0,
                                                                  classes(rows))]
        return Workload(reqs, Histories(rows[: self.skip]))


_CACHE: dict[tuple, list[TraceRow]] = {}
_BUILT: dict[str, object] = {}


def _rows(path: str, skip: int, limit: int | None) -> list[TraceRow]:
    """Read once per process: every cell of a run replays the same window."""
    key = (path, skip, limit)
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = read_trace(path, skip, limit)
    return _CACHE[key]
