"""How long one scheduler step's forward lasts when the forward is not real (the CPU path).

A real serving step is GPU bound: the scheduler thread launches the forward and waits for
it, and while it waits the cache controller's threads run. On CPU the stand-in therefore
*sleeps* for the modelled forward time (releasing the GIL, as a GPU-bound scheduler would),
after the toy data-plane forward has kept the ranks in lock-step.

    prefill: prefill_base_ms + prefill_ms_per_token x new tokens
    decode:  decode_base_ms  + decode_ms_per_ktoken x (context tokens of the batch) / 1000

`roofline` derives the coefficients from a model shape and a GPU: a decode step reads every
weight once (memory bound) plus the batch's KV cache; a prefill token costs 2 FLOPs per
weight at a fixed model-FLOPs utilisation; TP > 1 adds two all-reduces per layer.

Calibration (sources in docs/design.md section 8): Llama-3-8B on one H100 decodes at about 7 ms per
step at batch 1 (SGLang PR #1401), which fixes the effective HBM efficiency at 0.64 of the
3.35 TB/s peak; with 700-token contexts (an assumption: the published workload's context
lengths are not given) the model then gives 7.4 / 8.7 ms at 10 / 40 running requests
against the 7.6 / 8.8 ms median TPOT published for vLLM on ShareGPT (tests/test_step_time.py
holds it to those figures). Prefill assumes 50% MFU (about 33k
tokens/s for Llama-3-8B at TP1), an assumption, not a measurement: `--model` on a GPU node
measures the real forward instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from hicache.spec.shapes import ModelShape


@dataclass(frozen=True)
class GpuSpec:
    name: str
    bf16_tflops: float  # dense peak
    hbm_tbps: float


GPUS = {
    "h100": GpuSpec("h100", 989.0, 3.35),  # H100 SXM
    "h200": GpuSpec("h200", 989.0, 4.8),
}
HBM_EFFICIENCY = 0.64  # fitted: Llama-3-8B TP1 decode at batch 1 = 7.0 ms on H100
PREFILL_MFU = 0.5  # assumed
TP_ALLREDUCE_MS = 0.015  # one small NCCL all-reduce over NVLink, two per layer when TP > 1


@dataclass(frozen=True)
class StepTimeModel:
    """Forward time of one step in ms; all zero = no modelled time (the step lasts as long
    as its CPU work: the tests' setting)."""

    prefill_base_ms: float = 0.0
    prefill_ms_per_token: float = 0.0
    decode_base_ms: float = 0.0
    decode_ms_per_ktoken: float = 0.0  # per 1000 context tokens in the decode batch

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if not value >= 0:
                raise ValueError(f"step time {name} must be >= 0, got {value}")

    @property
    def enabled(self) -> bool:
        return any(self.__dict__.values())

    def forward_ms(self, new_tokens: int, decode_reqs: int, context_tokens: int) -> float:
        """A prefill of `new_tokens`, else a decode step of `decode_reqs` requests holding
        `context_tokens` in all; 0 for an idle step."""
        if new_tokens > 0:
            return self.prefill_base_ms + self.prefill_ms_per_token * new_tokens
        if decode_reqs > 0:
            return self.decode_base_ms + self.decode_ms_per_ktoken * context_tokens / 1000
        return 0.0


def roofline(shape: ModelShape, tp: int, gpu: str = "h100") -> StepTimeModel:
    """Coefficients for `shape` sharded over `tp` GPUs of kind `gpu` (see module docstring)."""
    if gpu not in GPUS:
        raise ValueError(f"unknown gpu {gpu!r}; choose from {', '.join(GPUS)}")
    spec = GPUS[gpu]
    bytes_per_ms = spec.hbm_tbps * 1e9 * HBM_EFFICIENCY  # TB/s = 1e9 bytes per ms
    weights_ms = shape.weight_bytes_per_rank(tp) / bytes_per_ms
    allreduce_ms = 2 * shape.layers * TP_ALLREDUCE_MS if tp > 1 else 0.0
    base = weights_ms + allreduce_ms
    flops_per_ms = spec.bf16_tflops * 1e9 * PREFILL_MFU
    return StepTimeModel(
        prefill_base_ms=base,
        prefill_ms_per_token=shape.flops_per_token() / tp / flops_per_ms,
        decode_base_ms=base,
        decode_ms_per_ktoken=1000 * shape.kv_bytes_per_token(tp) / bytes_per_ms)
