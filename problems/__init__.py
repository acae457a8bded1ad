"""Config problems with their lines, on the ground floor beside `runs/`.

`validation` (parse TOML, validate against a schema, every problem with file, line and dotted key: the one
collector the CLI, the launchers and the editor share), `schema` (`ConfigSection`, the one strict base of every
config schema: RL, SFT, GEPA, evaluation), `messages` (pydantic's errors in words, did-you-mean), `toml_lines`
(which line each key is on).
"""
