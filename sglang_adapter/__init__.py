"""SGLang's own HiCache code on the harness's ranks (docs/sglang.md).

A package of its own: `hicache/` never imports it. `source` resolves `--sglang SPEC`;
`loader` imports SGLang's decision path from it, unchanged; `door` counts every collective
SGLang issues where it calls torch.distributed, by its calling frame; `poll` drives
UnifiedRadixCache's own poll on real gloo ranks.
"""
