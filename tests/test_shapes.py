"""Shape math against numbers worked out by hand from the models' config.json."""

from __future__ import annotations

import pytest

from hicache.spec.shapes import SHAPES, ModelShape, get_shape

L8, L70 = SHAPES["llama3-8b"], SHAPES["llama3-70b"]


def test_kv_bytes_llama3_8b():
    # 2 (K, V) x 32 layers x 8 KV heads x 128 head dim x 2 bytes = 128 KiB per token.
    assert L8.kv_bytes_per_token() == 131072
    assert L8.kv_bytes_per_page(64) == 8 * 2**20  # 8 MiB per 64-token page
    assert L8.kv_bytes_per_page(64, tp=2) == 4 * 2**20  # split by KV heads
    assert L8.kv_bytes_per_token(tp=8) == 16384  # one KV head per rank
    assert L8.kv_bytes_per_token(tp=16) == 16384  # TP > KV heads: heads replicated


def test_kv_bytes_llama3_70b():
    assert L70.kv_bytes_per_token() == 327680  # 320 KiB per token
    assert L70.kv_bytes_per_page(64, tp=4) == 327680 * 64 // 4


def test_params_llama3_8b():
    # attn 4096*4096*2 + 2*4096*1024 = 41943040; MLP 3*4096*14336 = 176160768; norms 8192
    assert L8.layer_params() == 218112000
    # 32 layers + embedding and LM head 2*128256*4096 + final norm 4096
    assert L8.params() == 8030261248
    assert L8.matmul_params() == 32 * 218103808 + 128256 * 4096 == 7504658432
    assert L8.weight_bytes_per_rank(tp=2) == 7504658432


def test_params_llama3_70b():
    # attn 2*8192*8192 + 2*8192*1024; MLP 3*8192*28672; norms 2*8192
    assert L70.layer_params() == 855654400
    assert L70.params() == 80 * 855654400 + 2 * 128256 * 8192 + 8192 == 70553706496


def test_flops_per_token():
    assert L8.flops_per_token() == 2 * 7504658432
    # attention over 1000 earlier tokens: 4 x 32 layers x 32 heads x 128 x 1000
    assert L8.flops_per_token(1000) - L8.flops_per_token() == 4 * 32 * 32 * 128 * 1000


def test_bad_shapes_and_names():
    with pytest.raises(ValueError, match="unknown model"):
        get_shape("gpt5")
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        ModelShape("bad", 1, 8, heads=6, kv_heads=4, head_dim=2, intermediate=8, vocab=8)
    with pytest.raises(ValueError, match="layers must be >= 1"):
        ModelShape("bad", 0, 8, heads=4, kv_heads=4, head_dim=2, intermediate=8, vocab=8)
