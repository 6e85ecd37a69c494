"""Forward-pass emulation for the data plane: per layer a matmul sized by the batch's new
tokens, then an all-reduce on the data-plane group (NCCL on CUDA, gloo otherwise).

The all-reduce carries a fixed number of rows (like a padded decode batch), so ranks whose
batches differ in size (loop-count divergence) still pair their data-plane collectives.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hicache.comm.comm import MODEL_ALLREDUCE, Comm


class Model:
    def __init__(self, layers: int, hidden: int, allreduce_rows: int, device: torch.device,
                 comm: Comm, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.weights = [(torch.randn(hidden, hidden, generator=g) / hidden ** 0.5).to(device)
                        for _ in range(layers)]
        self.rows = torch.zeros(allreduce_rows, hidden, device=device)
        self.device, self.comm = device, comm

    def forward(self, new_tokens: int, decode_reqs: int = 0) -> None:
        """One step's forward: a prefill of `new_tokens`, or else a decode step of
        `decode_reqs` running requests (one token each)."""
        rows = new_tokens if new_tokens else decode_reqs
        x = torch.ones(max(rows, 1), self.weights[0].shape[0], device=self.device)
        for w in self.weights:
            x = torch.tanh(x @ w)
            n = min(len(x), len(self.rows))
            self.rows.zero_()
            self.rows[:n] = x[:n]
            self.comm.all_reduce(self.rows, dist.ReduceOp.SUM, "data", MODEL_ALLREDUCE)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the first token exists only after this
