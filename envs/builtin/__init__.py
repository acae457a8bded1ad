"""prime-lab's built-in environments: one module each with `load_environment(**args)`, data generated in code
(deterministic by seed), so they run offline. Ids: `primeintellect/<name>` or the bare `<name>`."""
