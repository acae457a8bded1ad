"""Model servers that speak vLLM's OpenAI-compatible protocol, and what controls them.

`builtin/` (our server: transformers + torch, batched decode, runtime LoRA), `vllm` (the vLLM launcher and its
weight-update worker, `vllm_worker`), `launch` (a sampler for a job, either engine), `backend` (which engine
`auto` picks here), `control` (adapters and weights loaded into a running engine; both engines answer the same
routes), `weights` (reading weight files for an update), `scoring` (prompt logprobs from a teacher), `nucleus` (the
top-p rule the samplers and the trainer share). Nothing here imports torch until a server or model is built.
"""
