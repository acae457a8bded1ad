"""Files and folders written so that a reader never sees half of one: a temporary sibling, then renames.

A crash leaves the old file or the new one, never a mix. `durable=True` also fsyncs the data before the rename, for
state a resume depends on after a machine crash (GEPA's state); the rest (run status, batches, the W&B mirror's
state) can be rebuilt or rewritten, so they skip the fsync's cost. `mode` creates the temporary file with that mode
(exactly, whatever the umask), so content that only its owner may read is never readable by others, not even for a
moment (the secrets store).

A folder (a model, a policy version, a checkpoint) is written into a staging sibling (`staging_folder`) and swapped
in whole (`publish_folder`, or both at once: `write_folder_atomic`): a reader of the folder's path finds the old
complete folder or the new complete one. Staging folders are hidden and named for their folder
(`.NAME.PID.RANDOM.tmp`), so what a killed writer leaves behind is found by name (`staging_leftovers`).
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

RENAME_EXCHANGE = 2  # renameat2's flag (linux/fs.h): swap the two paths in one step
AT_FDCWD = -100  # renameat2's "relative to the working folder"


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


def staging_folder(final: Path) -> Path:
    """A new empty folder beside `final` (on its file system, so publishing is a rename) to write it into."""
    final.parent.mkdir(parents=True, exist_ok=True)
    staged = final.with_name(_staging_name(final))
    staged.mkdir()
    return staged


def staging_leftovers(final: Path) -> list[Path]:
    """The staging folders of `final` that are there now: being written, or left by a writer that died."""
    pattern = re.compile(rf"^\.{re.escape(final.name)}\.\d+\.[0-9a-f]{{8}}\.tmp$")
    if not final.parent.is_dir():
        return []
    return [path for path in final.parent.iterdir() if pattern.match(path.name)]


def publish_folder(staged: Path, final: Path, *, replace: bool = True) -> Path:
    """Put the fully written folder `staged` (from `staging_folder`) in place as `final`, by renames.

    Where there is no `final` (or an empty one), one rename. Where there is one, `replace=False` leaves it and raises
    FileExistsError (`staged` stays, the caller's to remove), and `replace=True` swaps the two folders in one step
    (Linux's renameat2 RENAME_EXCHANGE), then removes the old one. Where the system or the file system cannot swap,
    the old folder is renamed aside first, so for the moment between two renames there is no `final`; never a half
    one.
    """
    try:
        os.rename(staged, final)
        return final
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        if not replace:
            raise FileExistsError(exc.errno, f"{final} already exists", str(final)) from exc
    if _exchange(staged, final):
        shutil.rmtree(staged, ignore_errors=True)  # the old folder, now under the staging name
        return final
    old = final.with_name(_staging_name(final))
    os.rename(final, old)
    try:
        os.rename(staged, final)
    except OSError:
        os.rename(old, final)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return final


@contextmanager
def write_folder_atomic(final: Path, *, replace: bool = True) -> Iterator[Path]:
    """Write the folder `final` whole: yields an empty staging folder to write into, published as `final` when the
    block ends without an error (`publish_folder`). On an error the staging folder is removed and `final` is left as
    it was."""
    staged = staging_folder(final)
    try:
        yield staged
        publish_folder(staged, final, replace=replace)
    finally:
        shutil.rmtree(staged, ignore_errors=True)  # only there when writing or publishing failed


def _staging_name(final: Path) -> str:
    return f".{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"


def _exchange(a: Path, b: Path) -> bool:
    """Swap the paths `a` and `b` in one step; False where this system or file system cannot."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    import ctypes

    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # a file system or kernel without the exchange
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


@functools.cache
def _renameat2() -> Callable[..., int] | None:
    """libc's renameat2 (Linux, glibc 2.28 or later), or None."""
    import ctypes

    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError, TypeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    function.restype = ctypes.c_int
    result: Callable[..., int] = function
    return result
