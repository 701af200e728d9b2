"""Output folders: a command's result appears whole or not at all, and never replaces what we did not write.

Every writer (quantize, export, ORT save_pretrained, benchmark) goes through `atomic_output_dir`:

- **Check first** (`check_output_dir`, also called by commands before their long work): the path must not
  be the filesystem root, a home folder, the current folder or one of its parents; its nearest existing
  folder must be writable; an existing non-empty folder needs `overwrite=True` *and* must be one of our
  outputs. Ours carry a manifest, `.optimum-amdx-output.json`, listing every file the writer produced;
  a folder without it, or with any file the manifest does not list, is never replaced.
- **Write beside, then rename**: the writer fills `.NAME.tmp-<pid>.<host>.<random>` in the same parent
  (created with the user's umask); on success the manifest is written and the folder renamed into place
  (signals held off during the renames). On any exception, Ctrl-C, or SIGTERM/SIGHUP (turned into an
  exception while the folder is open, on the main thread) the temporary folder is removed.
- **Clean up after a hard kill**: temporary folders of a process that no longer exists on this host
  (SIGKILL, power loss) are removed by the next write to the same output; so are the temporary files of
  `write_text_atomic` (results files), which are named the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from .errors import InvalidArgumentError, OutputExistsError

_T = TypeVar("_T")

MANIFEST_NAME = ".optimum-amdx-output.json"
"""Written into every output folder we create: what wrote it and every file and folder it holds (relative paths)."""

_TERMINATING_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


# --------------------------------------------------------------------------------------------- checks
def _protected_reason(out: Path) -> str | None:
    """Why `out` can never be an output folder we replace, or None."""
    if out == Path(out.anchor):
        return "the filesystem root"
    homes = {Path.home().resolve()}
    with contextlib.suppress(KeyError, RuntimeError):
        homes.add(Path(os.path.expanduser("~")).resolve())
    if out in homes:
        return "your home folder"
    try:
        cwd = Path.cwd().resolve()
    except OSError:  # the working folder was deleted
        return None
    if out == cwd:
        return "the current folder"
    if out in cwd.parents:
        return "a parent of the current folder"
    return None


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(path.anchor)


def _check_writable(out: Path) -> None:
    """The folder that will hold the output (and its temporary sibling) accepts new files."""
    base = _nearest_existing(out.parent)
    if not base.is_dir():
        raise InvalidArgumentError(f"Cannot write the output {out}: {base} is a file, not a folder. Choose another path.")
    try:  # os.access says yes to root on read-only disks; a real (anonymous, self-deleting) file does not lie
        with tempfile.TemporaryFile(dir=base):
            pass
    except OSError as err:
        raise InvalidArgumentError(
            f"Cannot write the output {out}: {base} is not writable ({err.strerror or err}). "
            "Choose a folder you can write to."
        ) from err


def read_manifest(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The manifest of an output folder we wrote, or None when it has none (or an unreadable one)."""
    path = Path(folder) / MANIFEST_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("writer") != "optimum-amdx" or not isinstance(data.get("files"), list):
        return None
    return data


def _relative_entries(folder: Path) -> set[str]:
    """Every file and folder under `folder` (relative POSIX paths), without the manifest."""
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")} - {MANIFEST_NAME}


def foreign_files(folder: str | os.PathLike) -> list[str]:
    """Entries of `folder` that our manifest does not list (all of them when it has no manifest)."""
    folder = Path(folder)
    entries = _relative_entries(folder)
    manifest = read_manifest(folder)
    if manifest is None:
        return sorted(entries)
    ours = set(manifest["files"])
    ours |= {parent.as_posix() for f in manifest["files"] for parent in Path(f).parents if str(parent) != "."}
    return sorted(entries - ours)


def check_output_dir(path: str | os.PathLike, overwrite: bool = False) -> Path:
    """Check that `path` can receive an output before any work starts; return the resolved path.

    Raises `InvalidArgumentError` for a protected or unwritable location and `OutputExistsError` for a
    non-empty folder unless `overwrite` is set and the folder is an output we wrote with nothing added.
    """
    out = Path(path).expanduser().resolve()
    reason = _protected_reason(out)
    if reason is not None:
        raise InvalidArgumentError(
            f"Refusing to write the output into {out}: it is {reason}. Give a new subfolder, e.g. {out / 'out'}."
        )
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"Output path {out} exists and is a file; give a folder path.")
    _check_writable(out)
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise OutputExistsError(
                f"Output folder {out} exists and is not empty. Pass --overwrite (overwrite=True) to replace an "
                "earlier optimum-amdx output, or choose another folder."
            )
        foreign = foreign_files(out)
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            what = ("was not written by optimum-amdx" if read_manifest(out) is None
                    else "holds files optimum-amdx did not write")
            raise OutputExistsError(
                f"Output folder {out} {what} ({shown}); --overwrite only replaces folders optimum-amdx wrote, so "
                "nothing was changed. Choose another folder, or move those files away yourself."
            )
    return out


# ------------------------------------------------------------------------------------ temporary folders
def _host_tag() -> str:
    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def _temp_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"^\.{re.escape(name)}\.(?:tmp|old)-(\d+)\.([0-9a-f]{{8}})\.[0-9a-f]+$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return True
    return True


def remove_stale_temporaries(out: str | os.PathLike) -> list[Path]:
    """Remove `.NAME.tmp-*` / `.NAME.old-*` siblings of `out` left by processes that died on this host.

    Only entries named by our writers with this host's tag and the pid of a process that no longer exists are
    removed: folders of either kind, and `.tmp-` files (`write_text_atomic` makes no other kind of file). Others
    (another host on a shared disk, a live process, a symlink, a `.old-` file) are left alone.
    """
    out = Path(out)
    pattern, host, removed = _temp_pattern(out.name), _host_tag(), []
    if not out.parent.is_dir():
        return removed
    for entry in out.parent.iterdir():
        match = pattern.match(entry.name)
        if match is None or match.group(2) != host or int(match.group(1)) == os.getpid():
            continue
        if entry.is_symlink() or _pid_alive(int(match.group(1))):
            continue
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        elif entry.is_file() and entry.name.startswith(f".{out.name}.tmp-"):
            entry.unlink(missing_ok=True)
        else:
            continue
        removed.append(entry)
    return removed


def _claim_sibling(out: Path, kind: str, claim: Callable[[Path], _T]) -> tuple[Path, _T]:
    """A new sibling name `.NAME.<kind>-<pid>.<host>.<random>` (the one `remove_stale_temporaries` recognizes), made
    by `claim` (which raises `FileExistsError` when the name is taken), and what `claim` returned."""
    for _ in range(100):
        candidate = out.with_name(f".{out.name}.{kind}-{os.getpid()}.{_host_tag()}.{secrets.token_hex(4)}")
        try:
            return candidate, claim(candidate)
        except FileExistsError:
            continue
    raise OutputExistsError(f"Could not create a temporary entry beside {out}.")


def _make_sibling(out: Path, kind: str) -> Path:
    """A new sibling folder `.NAME.<kind>-<pid>.<host>.<random>` (mode from the user's umask)."""
    return _claim_sibling(out, kind, lambda p: p.mkdir(mode=0o777))[0]


def _write_manifest(folder: Path, kind: str | None) -> None:
    from . import __version__

    files = sorted(_relative_entries(folder))
    doc = {"writer": "optimum-amdx", "version": __version__, "kind": kind, "files": files}
    (folder / MANIFEST_NAME).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


# ------------------------------------------------------------------------------------------------ signals
class _Terminated(SystemExit):
    """SIGTERM/SIGHUP arrived while an output was being written (exit status 128 + signal number)."""


@contextlib.contextmanager
def _terminate_raises() -> Iterator[None]:
    """While open (main thread only), SIGTERM/SIGHUP raise in the main thread so cleanup code runs.

    A Python handler installed before (e.g. the CLI's, which turns SIGTERM into Ctrl-C) keeps deciding:
    whatever it raises cleans up the output, and if it returns the write goes on. An ignored signal stays
    ignored. The previous handlers come back on exit.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}

    def handler(signum: int, frame: Any) -> None:
        before = previous.get(signum)
        if callable(before):
            before(signum, frame)
            return
        raise _Terminated(128 + signum)

    try:
        for sig in _TERMINATING_SIGNALS:
            before = signal.getsignal(sig)
            if before is signal.SIG_IGN or before is None:  # None: set from C, leave it alone
                continue
            previous[sig] = before
            signal.signal(sig, handler)
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP back (delivered on exit) so a rename pair is never cut in half."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    held = {signal.SIGINT, *_TERMINATING_SIGNALS}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


# ------------------------------------------------------------------------------------------- the writer
@contextlib.contextmanager
def atomic_output_dir(path: str | os.PathLike, overwrite: bool = False, kind: str | None = None) -> Iterator[Path]:
    """Yield a temporary sibling folder to write into; on success it becomes `path`.

    `path` is checked with `check_output_dir` (refused unless new, empty, or an earlier output of ours
    with `overwrite`). On any exception, Ctrl-C or SIGTERM the temporary folder is removed and `path`
    is left as it was. `kind` ("gptq-checkpoint", "onnx-export", ...) is recorded in the manifest.
    """
    out = check_output_dir(path, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out)
    old: Path | None = None
    with _terminate_raises():
        tmp = _make_sibling(out, "tmp")
        try:
            yield tmp
            _write_manifest(tmp, kind)
            if out.exists():
                check_output_dir(out, overwrite)  # nothing was added to it meanwhile
            with _signals_held():
                if out.exists():
                    old = _make_sibling(out, "old")
                    old.rmdir()
                    out.rename(old)
                tmp.rename(out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            if old is not None and old.exists() and not out.exists():  # put the previous output back
                old.rename(out)
                old = None
            raise
        finally:
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)


def parse_size(value: str | int, what: str = "--max-shard-size") -> int:
    """Bytes from `5GB`, `500MB`, `2GiB`, `1e9` or an int; raise `InvalidArgumentError` naming `what` otherwise."""
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
        unit = match.group(2).upper() if match else None
        if match is None or unit not in units:
            raise InvalidArgumentError(
                f"{what}={value!r} is not a size; give a number of bytes or a size with a unit, e.g. 5GB, 500MB, 2GiB."
            )
        size = int(float(match.group(1)) * units[unit])
    if size <= 0:
        raise InvalidArgumentError(f"{what}={value!r} must be larger than zero, e.g. 5GB.")
    return size


# --------------------------------------------------------------------------------------------- single files
RESULT_MARK = {"written_by": "optimum-amdx"}
"""Carried by every JSON result `write_json` writes, so a later write may replace that file and no other."""


def check_output_file(path: str | os.PathLike, flag: str = "--output", example: str = "result.json") -> Path:
    """The file path a command will write, checked before any long work: not a folder (the message suggests
    `example` inside it), in an existing folder that accepts new files (`_check_writable`: its temporary sibling is
    made there). Raises `InvalidArgumentError` naming `flag` and the fix."""
    out = Path(path)
    if out.is_dir():
        raise InvalidArgumentError(f"{flag} {path} is a folder; give a file path such as {out / example}.")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise InvalidArgumentError(f"{flag} {path}: the folder {parent} does not exist; create it first.")
    _check_writable(out)
    return out


_SWEPT: set[Path] = set()
"""Paths whose stale temporaries `write_text_atomic` already removed in this process."""


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` through a temporary sibling renamed over it (mode from the user's umask): a reader, or
    a run cut off mid-write, sees the previous file or the new one, never half of one. A failed write leaves no
    temporary file; one left by a hard kill (`.NAME.tmp-<pid>.<host>.<random>`) is removed by this process's first
    write of that path (`_SWEPT`: a benchmark rewrites its result once per row, and listing the folder every time
    would cost more than the write)."""
    target = Path(path)
    key = target.absolute()
    if key not in _SWEPT:
        remove_stale_temporaries(target)
        _SWEPT.add(key)
    # created with mode 0o666 under the user's umask, as `open` would make the file itself (no process-wide umask read)
    tmp, fd = _claim_sibling(target, "tmp", lambda p: os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_result_file(path: str | os.PathLike, flag: str = "--out", example: str = "result.json") -> Path:
    """`check_output_file`, and an existing file there must be a JSON result we wrote (`RESULT_MARK`): a results
    file never replaces what the user wrote. Raises `OutputExistsError` naming the fix otherwise."""
    out = check_output_file(path, flag, example)
    if out.exists():
        try:
            ours = json.loads(out.read_text(encoding="utf-8")).get("written_by") == RESULT_MARK["written_by"]
        except (OSError, UnicodeDecodeError, ValueError, AttributeError):
            ours = False
        if not ours:
            raise OutputExistsError(f"{flag} {path} exists and was not written by optimum-amdx; choose another path or "
                                    "remove it yourself.")
    return out


def result_path_or_exit(path: str | os.PathLike, flag: str = "--out") -> Path:
    """`check_result_file` for a script's output argument, before it measures anything: a refusal ends the script
    with its one-line message instead of a traceback."""
    try:
        return check_result_file(path, flag)
    except (InvalidArgumentError, OutputExistsError) as err:
        raise SystemExit(f"error: {err}") from None


def write_json(path: str | os.PathLike, obj: dict[str, Any], flag: str = "--out", indent: int = 1) -> None:
    """Write the result `obj` (a dict, marked `RESULT_MARK`) as indented JSON with `write_text_atomic`, after
    `check_result_file`: it replaces only a result we wrote. Values JSON cannot hold are written as their `str`
    (benchmark results carry dtypes and devices)."""
    check_result_file(path, flag)
    write_text_atomic(path, json.dumps({**RESULT_MARK, **obj}, indent=indent, default=str) + "\n")
