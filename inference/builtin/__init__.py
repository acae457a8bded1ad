"""The built-in OpenAI-compatible server: a transformers causal LM behind vLLM's HTTP protocol.

Run it as its own process: `python -m prime_lab.inference.builtin --model PATH --port N [--adapter NAME=PATH]`.

Modules: `schemas` (request bodies), `errors` (OpenAI-style error JSON), `prompts` (chat template, tokens to
text), `sampling` (batched sampling in torch), `sequences` (per-request and per-choice state, stop conditions),
`kv_cache` (a growable, joinable KV cache), `decode_batch` (the running batch's rows and tensors), `attention`
(grouped-query decode attention without KV copies), `engine` (the request queue and the batched decode loop),
`graph_decode` (the decode step on fixed-shape buffers, replayed as a CUDA graph on a GPU),
`adapters` (base model and LoRA adapters merged into copies of the weights; new full weights copied into the base
model in place), `completions` (requests to engine calls, choices to response bodies), `app` (routes), `server`
(load everything, run uvicorn), `launcher` (start it as its own process: `start_builtin_server`). Nothing here
imports torch until a server is built.
"""
