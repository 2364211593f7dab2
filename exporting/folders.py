"""The output folder of an export: refused when it is not a folder or not empty (without
`force`), written beside the target and renamed when complete."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from attnmt.exporting.shared import ExportError


def check_output(target: Path, force: bool = False) -> None:
    """Refuse an output that is not a folder, or a non-empty folder without `force`."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise ExportError(f"output {target} exists and is not a folder; choose another -o")
    if target.is_dir() and any(target.iterdir()) and not force:
        raise ExportError(
            f"output folder {target} exists and is not empty; choose another -o or pass "
            "--force to replace it"
        )


@contextlib.contextmanager
def staged_dir(target: Path, force: bool = False) -> Iterator[Path]:
    """A new empty folder beside `target` to write into. When the block ends without error it
    becomes `target` (an existing one is replaced only with `force`); otherwise it is deleted
    and `target` is left as it was."""
    target = Path(target)
    check_output(target, force)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    except OSError as e:
        raise ExportError(
            f"cannot write beside {target} ({e.strerror}); choose another -o"
        ) from None
    try:
        yield staging
        _make_readable(staging)
        if not target.exists():
            staging.rename(target)
            return
        trash = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
        target.rename(trash / target.name)
        try:
            staging.rename(target)
        except OSError:
            (trash / target.name).rename(target)  # put the old folder back
            raise
        shutil.rmtree(trash)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _make_readable(folder: Path) -> None:
    """`mkdtemp` and some writers create owner-only files: give them the usual modes."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [folder, *folder.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)
