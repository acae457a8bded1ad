"""Files written so that a reader never sees half of one: a temporary file beside it, then a rename.

A crash leaves the old file or the new one, never a mix. `durable=True` also fsyncs the data before the rename, for
state a resume depends on after a machine crash (GEPA's state); the rest (run status, batches, the W&B mirror's
state) can be rebuilt or rewritten, so they skip the fsync's cost. `mode` creates the temporary file with that mode
(exactly, whatever the umask), so content that only its owner may read is never readable by others, not even for a
moment (the secrets store).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any


def write_text_atomic(path: Path, text: str, *, durable: bool = False, mode: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        if mode is None:
            fh = open(tmp, "w")
        else:  # the mode is the file's before a byte of `text` is in it
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            os.fchmod(fd, mode)
            fh = os.fdopen(fd, "w")
        with fh:
            fh.write(text)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # only there when the write or rename failed
    return path


def write_json_atomic(path: Path, data: Any, *, indent: int | None = 2, durable: bool = False) -> Path:
    """`data` as JSON (values JSON lacks written with `str`), ending in a newline."""
    return write_text_atomic(path, json.dumps(data, indent=indent, default=str) + "\n", durable=durable)
