"""A real forward shaped like the model, TP-sharded as SGLang shards Llama (for CUDA runs).

Per decoder layer, on this rank's shard (`tp` ranks):
- RMSNorm, then the QKV projection (column parallel: heads / tp query heads and
  max(1, kv_heads / tp) KV heads), attention, the O projection (row parallel), and one
  all-reduce SUM of the [tokens, hidden] partial output on the data-plane group;
- RMSNorm, the gate/up projection (column parallel, intermediate / tp each), SiLU x up, the
  down projection (row parallel), and the layer's second all-reduce of [tokens, hidden].
Then the final norm and the LM head (vocab / tp columns) on the last row (prefill) or every
row (decode), and a device sync: the first token exists only after it.

What is real and what is not (say it plainly, so step times are read correctly):
- Weights are random and shared by all layers: one layer's weights are allocated and reused
  `layers` times (llama3-8b: 0.44 GB at TP1 instead of 14 GB). Each layer still reads them
  from device memory (far larger than any cache), so matmul time and bytes per layer are
  the real model's. The LM head is allocated once, as in the model.
- Attention: a prefill runs causal scaled-dot-product attention over the step's new tokens
  as one sequence (several requests in one batch attend across each other: slightly more
  FLOPs than per-request masks). The cached prefix is not attended to and a decode step's
  attention over its context is left out (the interface carries no context length): the
  KV-cache reads of a decode step (context x 2 x kv_heads/tp x head_dim x 2 bytes per layer
  per request) are not modelled. KV is not written to a cache.
- The logits all-gather SGLang runs after the LM head is left out, so the data-plane count
  stays exact: 2 x layers model all-reduces per forward when TP > 1 (0 at TP1: `Comm` skips
  one-rank groups, as SGLang does). Embedding lookup is a fill.
The class runs on any device (tests run it on CPU with a small shape and gloo).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from hicache.comm.comm import MODEL_ALLREDUCE, Comm
from hicache.spec.shapes import ModelShape

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class GpuModel:
    def __init__(self, shape: ModelShape, tp: int, device: torch.device, comm: Comm,
                 seed: int = 0):
        if shape.heads % tp:
            raise ValueError(f"{shape.name}: TP {tp} does not divide {shape.heads} heads")
        self.shape, self.device, self.comm = shape, device, comm
        self.dtype = TORCH_DTYPES[shape.dtype]
        self.heads = shape.heads // tp
        self.kv_heads = shape.kv_heads_per_rank(tp)
        self.q_out, self.kv_out = self.heads * shape.head_dim, self.kv_heads * shape.head_dim
        inter = _ceil_div(shape.intermediate, tp)
        gen = torch.Generator(device=device).manual_seed(seed)
        h = shape.hidden
        self.w_qkv = self._weight(self.q_out + 2 * self.kv_out, h, gen)
        self.w_o = self._weight(h, self.q_out, gen)
        self.w_gate_up = self._weight(2 * inter, h, gen)
        self.w_down = self._weight(h, inter, gen)
        self.w_lm = self._weight(_ceil_div(shape.vocab, tp), h, gen)

    def _weight(self, out_features: int, in_features: int, gen: torch.Generator):
        # [out, in] as nn.Linear stores it; scaled so activations stay O(1) over many layers.
        w = torch.randn(out_features, in_features, generator=gen, device=self.device,
                        dtype=torch.float32)
        return (w * in_features ** -0.5).to(self.dtype)

    def forward(self, new_tokens: int, decode_reqs: int = 0) -> None:
        """A prefill of `new_tokens`, or else a decode step of `decode_reqs` rows (one token
        each); an idle step runs a one-row decode (the count contract: every step runs one
        forward)."""
        prefill = new_tokens > 0
        rows = new_tokens if prefill else max(decode_reqs, 1)
        x = torch.full((rows, self.shape.hidden), 0.01, dtype=self.dtype, device=self.device)
        for _ in range(self.shape.layers):  # the same weights for every layer (see above)
            x = x + self._attention(self._norm(x), prefill)
            x = x + self._mlp(self._norm(x))
        last = self._norm(x[-1:] if prefill else x)
        F.linear(last, self.w_lm)  # logits; their all-gather is left out (see above)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the first token exists only after this

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],))

    def _attention(self, h: torch.Tensor, prefill: bool) -> torch.Tensor:
        q, k, v = F.linear(h, self.w_qkv).split([self.q_out, self.kv_out, self.kv_out], dim=-1)
        if prefill:
            q = self._attend(q, k, v)
        out = F.linear(q, self.w_o)
        return self._all_reduce(out)  # row parallel O projection: partial sums over TP

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        d, t = self.shape.head_dim, q.shape[0]
        # [1, heads, tokens, head_dim]: the fused (flash / memory-efficient) kernels want 4-D.
        q = q.view(1, t, self.heads, d).transpose(1, 2)
        group = self.heads // self.kv_heads  # GQA: each KV head serves `group` query heads
        k = k.view(1, t, self.kv_heads, d).transpose(1, 2).repeat_interleave(group, dim=1)
        v = v.view(1, t, self.kv_heads, d).transpose(1, 2).repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).reshape(t, self.q_out)

    def _mlp(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(h, self.w_gate_up).chunk(2, dim=-1)
        out = F.linear(F.silu(gate) * up, self.w_down)
        return self._all_reduce(out)  # row parallel down projection: partial sums over TP

    def _all_reduce(self, out: torch.Tensor) -> torch.Tensor:
        # NCCL: queued on the compute stream, so the next matmul waits for every rank's
        # partial sum without a host sync; gloo (CPU, shared GPUs) blocks the host instead.
        self.comm.all_reduce(out, dist.ReduceOp.SUM, "data", MODEL_ALLREDUCE)
        return out
