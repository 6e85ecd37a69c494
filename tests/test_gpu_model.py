"""The shaped forward (hicache.model.gpu_model) and the model factory, on CPU; CUDA tests skip
without a GPU (they run in scripts/gpu_check.sh).

The forward is device-agnostic, so its shard shapes, its data-plane count contract (2 x
layers all-reduces per forward at TP > 1) and bf16 all-reduces over gloo are checked here on
CPU with a small Llama-like shape.
"""

from __future__ import annotations

from dataclasses import replace
from math import inf

import pytest
import torch

from hicache.comm.comm import MODEL_ALLREDUCE, CollectiveCounter, Comm
from hicache.comm.groups import Groups, Layout
from hicache.model.gpu_model import GpuModel
from hicache.model.toy_model import Model
from hicache.serve.system import make_model, setup_distributed
from hicache.spec.config import HiCacheConfig
from hicache.spec.shapes import SHAPES, ModelShape
from tests.helpers import launch

MINI = ModelShape("mini", layers=3, hidden=64, heads=8, kv_heads=2, head_dim=8,
                  intermediate=96, vocab=100, dtype="bf16")
CPU = torch.device("cpu")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _solo_comm() -> Comm:
    layout = Layout(0, 1, 1)
    return Comm(layout, Groups(layout, "gloo", 10.0), CollectiveCounter())


def test_shards_like_sglang():
    m = GpuModel(MINI, 2, CPU, _solo_comm())
    assert (m.heads, m.kv_heads, m.q_out, m.kv_out) == (4, 1, 32, 8)
    assert m.w_qkv.shape == (32 + 2 * 8, 64) and m.w_o.shape == (64, 32)
    assert m.w_gate_up.shape == (2 * 48, 64) and m.w_down.shape == (64, 48)
    assert m.w_lm.shape == (50, 64) and m.w_qkv.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="does not divide"):
        GpuModel(MINI, 3, CPU, _solo_comm())


def test_prefill_attention_is_causal_gqa():
    """Against a per-head loop: query head h reads KV head h // (heads / kv_heads)."""
    m = GpuModel(replace(MINI, dtype="fp32"), 1, CPU, _solo_comm())
    t, d = 7, MINI.head_dim
    q, k, v = torch.randn(t, m.q_out), torch.randn(t, m.kv_out), torch.randn(t, m.kv_out)
    mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
    want = []
    for h in range(m.heads):
        kh, vh = (x.view(t, m.kv_heads, d)[:, h // 4] for x in (k, v))
        scores = (q.view(t, m.heads, d)[:, h] @ kh.T / d ** 0.5).masked_fill(mask, -inf)
        want.append(torch.softmax(scores, -1) @ vh)
    assert torch.allclose(m._attend(q, k, v), torch.stack(want, 1).reshape(t, -1), atol=1e-5)


def test_forward_at_tp1_has_no_collectives():
    comm = _solo_comm()
    m = GpuModel(MINI, 1, CPU, comm)
    m.forward(40)  # prefill: causal attention over 40 tokens
    m.forward(0, 5)  # decode step of 5 rows
    m.forward(0, 0)  # idle step: a one-row decode
    assert comm.counter.by_site[MODEL_ALLREDUCE] == 0  # one-rank groups are skipped


def test_make_model_picks_by_device_and_shape():
    comm = _solo_comm()
    assert isinstance(make_model(HiCacheConfig(model="llama3-8b"), CPU, comm), Model)
    assert isinstance(make_model(HiCacheConfig(), CPU, comm), Model)


def _tp2_worker(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    layout = Layout(rank, 2, 1)
    groups = setup_distributed(layout, CPU, 30.0)
    comm = Comm(layout, groups, CollectiveCounter())
    m = GpuModel(MINI, 2, CPU, comm)
    seq0 = groups.sequence_numbers()["data"]
    m.forward(33)
    m.forward(0, 4)
    t = torch.full((3,), float(rank + 1))
    comm._host_all_reduce(t, torch.distributed.ReduceOp.SUM, "data", MODEL_ALLREDUCE)
    return {"count": comm.counter.by_site[MODEL_ALLREDUCE],
            "seq": groups.sequence_numbers()["data"] - seq0, "host_sum": t.tolist()}


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_tp2_count_contract_on_gloo():
    out = launch(2, _tp2_worker, timeout_s=90)
    for r in out:
        # Two forwards x 3 layers x 2 all-reduces (bf16 over gloo), plus the staged one.
        assert r["count"] == 2 * 3 * 2 + 1 == r["seq"]
        assert r["host_sum"] == [3.0, 3.0, 3.0]


@cuda
def test_llama3_8b_forward_on_cuda():
    dev = torch.device("cuda", 0)
    comm = _solo_comm()
    m = make_model(HiCacheConfig(model="llama3-8b"), dev, comm)
    assert isinstance(m, GpuModel) and m.w_qkv.shape == (4096 + 2 * 1024, 4096)
    m.forward(512)
    m.forward(0, 16)
    assert comm.counter.by_site[MODEL_ALLREDUCE] == 0
    assert isinstance(make_model(HiCacheConfig(), dev, comm), Model)  # toy stays toy


@cuda
def test_every_shape_builds_on_cuda_at_its_tp():
    for name, tp in (("llama3-8b", 1), ("llama3-70b", 8)):
        m = GpuModel(SHAPES[name], tp, torch.device("cuda", 0), _solo_comm())
        assert m.w_o.shape == (SHAPES[name].hidden, SHAPES[name].heads // tp * 128)
        del m
