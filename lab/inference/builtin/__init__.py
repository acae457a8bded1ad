"""The built-in OpenAI-compatible server: a transformers causal LM behind vLLM's HTTP protocol.

Run it as its own process: `python -m lab.inference.builtin --model PATH --port N [--adapter NAME=PATH]`.

Modules: `schemas` (request bodies), `errors` (OpenAI-style error JSON), `prompts` (chat template, tokens to
text), `sampling` (batched sampling in torch), `kv_batch` (the running batch: KV cache, masks, joining and
dropping rows), `engine` (the request queue and the batched decode loop), `adapters` (base model and LoRA
adapters merged into copies of the weights), `responses` (chat and completion bodies), `app` (routes), `server`
(load everything, run uvicorn). Nothing here imports torch until a server is built.
"""
