"""Packages as pip finds them, written by the tests that install them (pip runs offline on a folder of them)."""

from __future__ import annotations

import base64
import hashlib
import textwrap
import zipfile
from pathlib import Path


def wheel(folder: Path, name: str, version: str, files: dict[str, str], requires: tuple[str, ...] = (),
          entry_points: str = "") -> Path:
    """A real wheel of the distribution `name` with `files` (path -> source) and Requires-Dist `requires`."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{name.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    contents = {path: textwrap.dedent(text).lstrip("\n") for path, text in files.items()}
    contents[f"{info}/METADATA"] = "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                                            *(f"Requires-Dist: {r}\n" for r in requires)])
    contents[f"{info}/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: prime-lab-tests\nRoot-Is-Purelib: true\n"
                                 "Tag: py3-none-any\n")
    if entry_points:
        contents[f"{info}/entry_points.txt"] = entry_points
    record = []
    for member, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{member},sha256={digest},{len(text.encode())}")
    contents[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    path = folder / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name_in, text in contents.items():
            archive.writestr(name_in, text)
    return path


def env_module(doc: str, imports: str = "") -> str:
    return f'"""{doc}"""\n{imports}\n\ndef load_environment(size: int = 2):\n    return None\n'
