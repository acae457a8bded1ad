"""Runs, the ground floor every other package stands on; imports nothing of prime-lab outside `runs/`.

`registry` (run folders, ids, status, list/stop/delete, in-process lifecycles), `events` (the event bus: one append-
only log per run, writers and tailing readers), `atomic` (the one writer of files and folders that a reader never sees
half of), `paths` (where prime-lab keeps things; the checkout's constraints file), `reaper` (a run's process groups
end with its supervisor), `processes` (child servers: start, wait for health, stop), `hardware` (the hardware probe:
CUDA, visible GPUs, usable cores, memory), `display` (durations and one-line excerpts as a person reads them),
`evaluations` (a run's base -> final evaluation, read from its events), `hub_probe` (is the Hugging Face
Hub reachable: one request, about a second, once per process), `system_metrics` (each process's CPU,
memory and threads and each GPU's use, sampled into the run's events; psutil and NVML imported when it samples).
Importing any of them is cheap: no torch, no textual.
"""
