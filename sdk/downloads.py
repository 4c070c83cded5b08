"""Unpack a checkpoint's export (the tar the API streams) into a folder, safely.

The archive holds one folder (``<run>-step-<N>-<format>/``) of plain files; they land
directly in the target folder, so ``-o my-model`` gives ``my-model/config.json``. The
download goes to a temporary file beside the target first (a model is too big for memory)
and is unpacked only when whole; no member may name a path outside the folder or be
anything but a plain file.
"""

from __future__ import annotations

import shutil
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path

from sdk.errors import RlaasError


def unpack_export(chunks: Iterable[bytes], target: Path) -> Path:
    """Write the archive ``chunks`` to a temporary file, then unpack it into ``target``."""
    target = Path(target)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise RlaasError(f"{target} already exists and is not an empty folder; choose another")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".rlaas-download-") as tmp:
        archive = Path(tmp) / "export.tar"
        with archive.open("wb") as f:
            for chunk in chunks:
                f.write(chunk)
        staging = Path(tmp) / "files"
        staging.mkdir()
        try:
            with tarfile.open(archive, mode="r:") as tar:
                for member in tar.getmembers():
                    # Plain files only, each written by its base name (the archive's top
                    # folder dropped): nothing can land outside ``staging``.
                    name = Path(member.name).name
                    if not member.isfile() or not name or name.startswith("."):
                        raise RlaasError(f"the archive holds {member.name!r}, not a plain file")
                    if (staging / name).exists():
                        raise RlaasError(f"the archive holds {name!r} twice")
                    source = tar.extractfile(member)
                    assert source is not None  # a regular file always has content
                    with source, (staging / name).open("wb") as out:
                        shutil.copyfileobj(source, out, 1 << 20)
        except tarfile.TarError as exc:
            raise RlaasError(
                f"the downloaded archive is damaged ({exc}); download it again"
            ) from exc
        target.mkdir(exist_ok=True)
        for path in staging.iterdir():
            shutil.move(str(path), target / path.name)
    return target
