"""Model shapes: the few numbers that set KV bytes, weight bytes and FLOPs of a forward.

A shape feeds three things: the storage bytes model (a KV page's bytes per TP rank), the CPU
step-time model (weights and KV read per decode step, FLOPs per prefill token), and on CUDA
the real forward (matmuls shaped like the model). Add a model by adding one entry to SHAPES.

KV heads are split over TP ranks; when TP exceeds the KV heads, each rank keeps one head
(replicated), as SGLang does.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # MLP inner size (gated: gate, up and down projections)
    vocab: int
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab"):
            if getattr(self, f) < 1:
                raise ValueError(f"{self.name}: {f} must be >= 1, got {getattr(self, f)}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"{self.name}: dtype must be one of {', '.join(DTYPE_BYTES)}")
        if self.heads % self.kv_heads:
            raise ValueError(f"{self.name}: heads ({self.heads}) must be a multiple of "
                             f"kv_heads ({self.kv_heads})")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def kv_heads_per_rank(self, tp: int) -> int:
        return max(1, self.kv_heads // tp)

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """K and V of every layer for one token, on one TP rank."""
        return 2 * self.layers * self.kv_heads_per_rank(tp) * self.head_dim * self.dtype_bytes

    def kv_bytes_per_page(self, page_size: int, tp: int = 1) -> int:
        return self.kv_bytes_per_token(tp) * page_size

    def layer_params(self) -> int:
        """Weights of one decoder layer: q, k, v, o projections, gated MLP, two norms."""
        q_out = self.heads * self.head_dim
        kv_out = self.kv_heads * self.head_dim
        attn = self.hidden * q_out + 2 * self.hidden * kv_out + q_out * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return attn + mlp + 2 * self.hidden

    def params(self) -> int:
        """All weights: embedding, layers, final norm, untied LM head."""
        return 2 * self.vocab * self.hidden + self.layers * self.layer_params() + self.hidden

    def matmul_params(self) -> int:
        """Weights used in matmuls per token (the embedding is a lookup, norms are not)."""
        return self.layers * (self.layer_params() - 2 * self.hidden) + self.vocab * self.hidden

    def weight_bytes_per_rank(self, tp: int = 1) -> int:
        """Bytes of matmul weights one TP rank reads per forward."""
        return self.matmul_params() * self.dtype_bytes // tp

    def flops_per_token(self, context: int = 0) -> int:
        """Forward FLOPs for one token: 2 per matmul weight, plus attention over `context`
        earlier tokens (QK^T and AV: 2 x 2 x heads x head_dim per token attended)."""
        attn = 4 * self.layers * self.heads * self.head_dim * context
        return 2 * self.matmul_params() + attn


SHAPES: dict[str, ModelShape] = {
    # Small enough that a CPU forward is instant: for tests and quick runs.
    "toy": ModelShape("toy", layers=2, hidden=64, heads=4, kv_heads=4, head_dim=16,
                      intermediate=256, vocab=1024, dtype="fp32"),
    # Meta Llama 3 8B / 70B (config.json of the Hugging Face releases).
    "llama3-8b": ModelShape("llama3-8b", layers=32, hidden=4096, heads=32, kv_heads=8,
                            head_dim=128, intermediate=14336, vocab=128256),
    "llama3-70b": ModelShape("llama3-70b", layers=80, hidden=8192, heads=64, kv_heads=8,
                             head_dim=128, intermediate=28672, vocab=128256),
}


def get_shape(name: str) -> ModelShape:
    if name not in SHAPES:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(SHAPES)}")
    return SHAPES[name]
