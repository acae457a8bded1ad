"""A workspace: the folder a user works in (`configs/`, `environments/`, a `.gitignore`), and the machine it runs on.

`layout` writes one (`prime lab setup`), `doctor` checks one (`prime lab doctor`), `machine` says what this machine
offers (cores, memory, GPU, sampler engines, models, disk). Nothing here imports torch unless a GPU driver is present,
and nothing imports the trainer or GEPA: config validation is handed in by the caller (`doctor.ConfigValidator`).
"""
