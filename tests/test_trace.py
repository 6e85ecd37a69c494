"""The trace reader: what it accepts, what it refuses (with the line), and prompts from blocks
(two requests sharing k leading hash ids share exactly k x 512 leading tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.run.trace import (
    BLOCK_TOKENS,
    TraceError,
    block_tokens,
    classes,
    prompt_tokens,
    read_trace,
    requests,
    reuse_bounds,
)
from hicache.memory.hashing import page_hashes

REPO = Path(__file__).resolve().parent.parent
EXCERPT = REPO / "traces" / "mooncake_conversation_400.jsonl"


def _row(ts=0, n_in=1000, n_out=10, ids=(0, 1)):
    return {"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": list(ids)}


def _write(tmp_path, lines) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_the_excerpt_reads_whole():
    rows = read_trace(EXCERPT)
    assert len(rows) == 400 and rows[0].line == 1 and rows[-1].timestamp_ms == 141_000
    assert all(r.hash_ids[0] == 0 for r in rows)  # the service's shared first block


def test_window_skip_and_limit(tmp_path):
    path = _write(tmp_path, [_row(ts=i * 100) for i in range(5)])
    rows = read_trace(path, skip=2, limit=2)
    assert [r.line for r in rows] == [1, 2, 3, 4]  # the skipped ones are read too
    reqs = requests(rows, 2, 2.0, classes(rows))
    assert [q.arrival_offset_s for q in reqs] == [0.0, 0.05]  # relative, 2x faster
    assert [q.output_tokens for q in reqs] == [10, 10]


@pytest.mark.parametrize(("line", "why"), [
    ("not json", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    (json.dumps({"timestamp": 0, "input_length": 5, "output_length": 1}),
     "missing field(s) hash_ids"),
    (json.dumps(_row(n_in=-3)), "input_length must be an integer >= 1"),
    (json.dumps(_row(n_out=0)), "output_length must be an integer >= 1"),
    (json.dumps(_row(ts=-1)), "timestamp must be a number >= 0"),
    (json.dumps(_row(ts="soon")), "timestamp must be a number >= 0"),
    (json.dumps(_row(ids=())), "hash_ids must be a non-empty list"),
    (json.dumps(_row(ids=(0, -1))), "hash_ids must be a non-empty list"),
    (json.dumps(_row(n_in=1025, ids=(0, 1))), "2 hash_ids do not fit input_length 1025"),
    (json.dumps(_row(n_in=512, ids=(0, 1))), "2 hash_ids do not fit input_length 512"),
    (json.dumps(_row(n_in=2.5)), "input_length must be an integer"),
])
def test_refusals_name_the_line(tmp_path, line, why):
    path = _write(tmp_path, [_row(), _row(), line])
    with pytest.raises(TraceError) as e:
        read_trace(path)
    assert f"line 3: {why}" in str(e.value)


def test_too_short_a_file_is_refused(tmp_path):
    path = _write(tmp_path, [_row()])
    with pytest.raises(TraceError, match="fewer than --trace-skip 1"):
        read_trace(path, skip=1, limit=1)
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(tmp_path / "absent.jsonl")


def test_last_block_may_be_partial(tmp_path):
    path = _write(tmp_path, [_row(n_in=513, ids=(0, 1)), _row(n_in=1024, ids=(0, 1))])
    short, full = (prompt_tokens(r) for r in read_trace(path))
    assert len(short) == 513 and len(full) == 1024 and full[:513] == short


@pytest.mark.parametrize("k", [0, 1, 3])
def test_k_shared_leading_ids_share_exactly_k_blocks(k):
    a = prompt_tokens(_parsed((*range(k), *range(100, 104 - k)), 4 * BLOCK_TOKENS))
    b = prompt_tokens(_parsed((*range(k), *range(200, 204 - k)), 4 * BLOCK_TOKENS))
    common = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
    assert common == k * BLOCK_TOKENS
    # ...so exactly k x 8 leading page hashes agree (page size 64), and no more.
    ha, hb = page_hashes(a, 64), page_hashes(b, 64)
    assert sum(x == y for x, y in zip(ha, hb, strict=True)) == k * BLOCK_TOKENS // 64


def test_blocks_are_a_pure_function_of_the_id():
    assert block_tokens(7) == block_tokens(7) != block_tokens(8)
    assert len(block_tokens(7)) == BLOCK_TOKENS


def test_reuse_bound_from_the_file(tmp_path):
    path = _write(tmp_path, [_row(n_in=1000, ids=(0, 1)),   # block 1 holds 488 tokens
                             _row(n_in=1300, ids=(0, 1, 2)),  # 0 full, 1 only 448 cached
                             _row(n_in=700, ids=(0, 1)),      # 0 and 188 of 1: 640 cached
                             _row(n_in=1024, ids=(0, 1))])    # 1 was cached whole by row 2
    rows = read_trace(path)
    assert reuse_bounds(rows, 64) == [0, 512 + 448, 640, 1023 // 64 * 64]
    assert classes(rows) == ["bystander", "prefetch", "prefetch", "prefetch"]


def _parsed(ids, n_in):
    from bench.run.trace import _parse

    return _parse(json.dumps(_row(n_in=n_in, ids=ids)), 1, "x")
