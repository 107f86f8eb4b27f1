"""Checkpoints and the other files a peer keeps in its run directory.

A checkpoint file is ``HFL-CHECKPOINT 1 sha256=<64 hex>\\n`` followed by the
bytes ``torch.save`` produced. On load the digest is checked over those bytes
*before* ``torch.load(weights_only=True)`` sees them, so a bit flip, a truncated
copy or a file that is not a checkpoint at all is refused with one line naming
the file, never resumed from (``weights_only`` only rebuilds tensors and plain
containers, so a tampered file cannot run code either).

Every write is durable and atomic: the bytes go to ``<name>.tmp``, which is
fsynced, renamed over the old file, and then the directory is fsynced. A kill or
a power cut at any point leaves the previous file or the new one, never a torn
one. Checkpoints written before checksums existed (they start with ``PK``, a
zip) still load, with a warning that nothing verified them.

A file the peer cannot write or read (a full disk, a read-only or foreign run
directory) raises :class:`RunFileError`, whose message is the single line
``hfl-peer`` prints: ``<file>: ENOSPC (No space left on device): ...``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any

log = logging.getLogger("hfl.peer")

CHECKPOINT_NAME = "checkpoint.pt"
INCARNATION_NAME = "incarnation"
MAGIC = b"HFL-CHECKPOINT 1 sha256="
_HEADER_LEN = len(MAGIC) + 64 + 1  # magic, hex digest, newline
_LEGACY_MAGIC = b"PK\x03\x04"  # torch.save's zip container, before checksums
_REQUIRED = ("round", "algorithm", "torch_rng", "members")

_HINTS = {
    errno.ENOSPC: "the disk is full: free space, then restart the peer (it resumes from its "
                  "last checkpoint)",
    errno.EDQUOT: "the disk quota is used up: free space, then restart the peer",
    errno.EROFS: "the file system is read-only: point node.run_dir at a writable directory",
    errno.EACCES: "permission denied: make the run directory writable for this user, or point "
                  "node.run_dir elsewhere",
    errno.EPERM: "operation not permitted: make the run directory writable for this user, or "
                 "point node.run_dir elsewhere",
    errno.EIO: "an I/O error from the disk: check the device, then restart the peer",
}


class RunFileError(Exception):
    """A run-directory file cannot be written or read, or must not be used.

    ``str()`` is one line for the user, starting with the file's path."""

    def __init__(self, path: str | Path, message: str):
        super().__init__(f"{path}: {message}")
        self.path = Path(path)


def os_error_text(exc: OSError) -> str:
    """``ENOSPC (No space left on device): <what to do>``."""
    name = errno.errorcode.get(exc.errno or 0, "OSError")
    text = exc.strerror or os.strerror(exc.errno or 0)
    hint = _HINTS.get(exc.errno or 0)
    return f"{name} ({text})" + (f": {hint}" if hint else "")


def file_error(path: str | Path, exc: OSError) -> RunFileError:
    err = RunFileError(path, os_error_text(exc))
    err.__cause__ = exc
    return err


def fsync_dir(directory: str | Path) -> None:
    """Make a rename in ``directory`` durable (not every file system can: ignored there)."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path``: temp file, fsync, rename, fsync the directory.

    Raises :class:`RunFileError` naming ``path`` on any OS error (the temp file
    is removed, the previous ``path`` is left as it was)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as exc:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise file_error(path, exc) from exc
    return path


class RunStore:
    """Small durable files in a run directory for an algorithm (``ctx.store``): what must
    be on disk before a message leaves, such as FedHP's privacy ledger."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)

    def write(self, name: str, data: bytes) -> None:
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise file_error(self.run_dir, exc) from exc
        write_atomic(self.run_dir / name, data)

    def read(self, name: str) -> bytes | None:
        path = self.run_dir / name
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise file_error(path, exc) from exc


def append_line(path: str | Path, line: str) -> None:
    """Append one line and fsync it (a metrics row is on disk before its checkpoint)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(line.encode())
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise file_error(path, exc) from exc


def make_run_dir(path: str | Path) -> Path:
    path = Path(path)
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        os.close(probe)
    except OSError as exc:
        raise file_error(exc.filename or path, exc) from exc
    return path


def save_checkpoint(run_dir: str | Path, state: dict[str, Any]) -> Path:
    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    body = buf.getvalue()
    header = MAGIC + hashlib.sha256(body).hexdigest().encode("ascii") + b"\n"
    return write_atomic(Path(run_dir) / CHECKPOINT_NAME, header + body)


def _refuse(path: Path, why: str) -> RunFileError:
    return RunFileError(path, f"{why}; refusing to resume from it. Move it aside to start this "
                              f"peer afresh (mv {path} {path}.bad), or copy back a good one")


def load_checkpoint(run_dir: str | Path) -> dict[str, Any] | None:
    """The checkpoint's state, None when there is none; :class:`RunFileError` when
    it cannot be read or fails its checksum."""
    import torch

    path = Path(run_dir) / CHECKPOINT_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise file_error(path, exc) from exc
    if data.startswith(MAGIC):
        if len(data) < _HEADER_LEN or data[_HEADER_LEN - 1:_HEADER_LEN] != b"\n":
            raise _refuse(path, f"truncated checkpoint ({len(data)} bytes, header incomplete)")
        expected = data[len(MAGIC):_HEADER_LEN - 1].decode("ascii", "replace")
        body = data[_HEADER_LEN:]
        actual = hashlib.sha256(body).hexdigest()
        if actual != expected:
            raise _refuse(path, f"corrupt checkpoint: SHA-256 of its {len(body)} bytes is "
                                f"{actual[:12]}..., the header says {expected[:12]}... (a flipped "
                                "bit, a truncated copy or an edit)")
    elif data.startswith(_LEGACY_MAGIC):
        log.warning("%s: checkpoint written before checksums: loading it unverified", path)
        body = data
    elif data.startswith(b"HFL-CHECKPOINT "):  # (it read "no HFL-CHECKPOINT header")
        version = data[15:data.find(b" ", 15)].decode("ascii", "replace")[:20]
        raise _refuse(path, f"a checkpoint of format {version!r}, which this hfl (format 1) "
                            "cannot read: resume it with the hfl that wrote it")
    else:
        raise _refuse(path, f"not a checkpoint ({len(data)} bytes, no HFL-CHECKPOINT header)")
    try:
        state = torch.load(io.BytesIO(body), map_location="cpu", weights_only=True)
    except Exception as exc:  # a legacy file that is damaged, or pickled code
        raise _refuse(path, f"unreadable checkpoint ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:160] if str(exc) else ''})") from exc
    if not isinstance(state, dict) or any(k not in state for k in _REQUIRED):
        raise _refuse(path, f"checkpoint without {', '.join(_REQUIRED)}")
    why = _state_problem(state)
    if why is not None:  # (a checksummed file edited by hand raised deep in the resume)
        raise _refuse(path, f"checkpoint with {why}")
    return state


def _state_problem(state: dict[str, Any]) -> str | None:
    """Why a checkpoint's fields cannot be resumed from (their types and ranges), or None."""
    import torch

    def whole(v: Any, top: int) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < top

    members = state["members"]
    if not whole(state["round"], 2**31):
        return f"round {state['round']!r} (a whole number >= 0)"
    if "incarnation" in state and not whole(state["incarnation"], 2**62):
        return f"incarnation {state['incarnation']!r} (a whole number >= 0)"
    if not isinstance(members, list) or not all(
            isinstance(m, (list, tuple)) and len(m) == 2 and all(isinstance(x, str) for x in m)
            for m in members):
        return "members that are no list of [peer id, address]"
    if not isinstance(state["algorithm"], dict) or not state["algorithm"]:
        return "no algorithm state"
    rng = state["torch_rng"]
    if not isinstance(rng, torch.Tensor) or rng.dtype != torch.uint8:
        return "a torch_rng that is no byte tensor"
    return None


def read_incarnation(run_dir: str | Path) -> int | None:
    """The incarnation file's number; None when absent; -1 when it is empty or corrupt."""
    path = Path(run_dir) / INCARNATION_NAME
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM, errno.EIO):
            raise file_error(path, exc) from exc
        return -1
    try:
        value = int(text.strip())
    except ValueError:
        return -1
    return value if value >= 0 else -1


def next_incarnation(run_dir: str | Path, at_least: int = 0) -> int:
    """Bump and persist the incarnation number: one per process start.

    ``at_least`` is what the peer's other records imply (the checkpoint's and the
    metrics' incarnation + 1): an emptied or corrupt file must not restart the
    peer as incarnation 0, whose messages everyone would ignore as a dead
    process's. A corrupt file with no other record is refused (the peer cannot
    know which number the cohort last saw)."""
    path = Path(run_dir) / INCARNATION_NAME
    previous = read_incarnation(run_dir)
    if previous == -1:
        if at_least <= 0:
            raise RunFileError(path, "empty or corrupt incarnation file, and no checkpoint or "
                                     "metrics to derive the number from; if this peer never "
                                     "joined a cohort delete the file, otherwise write the last "
                                     "incarnation + 1 into it")
        log.warning("%s: empty or corrupt incarnation file; continuing as incarnation %d "
                    "(from the checkpoint and metrics)", path, at_least)
    elif previous is None and at_least > 0:
        log.warning("%s: incarnation file missing; continuing as incarnation %d (from the "
                    "checkpoint and metrics)", path, at_least)
    incarnation = max((previous if previous is not None else -1) + 1, at_least)
    write_atomic(path, f"{incarnation}\n".encode())
    return incarnation


def metrics_incarnation(path: str | Path) -> int:
    """1 + the highest incarnation in a metrics file (0 when none)."""
    best = -1
    for rec in read_jsonl(path):
        inc = rec.get("incarnation")
        if isinstance(inc, int) and not isinstance(inc, bool):
            best = max(best, inc)
    return best + 1


def read_jsonl(path: str | Path, damaged: Counter | None = None) -> list[dict[str, Any]]:
    """The JSON object lines of ``path`` (a torn last line is skipped, and a line a
    damaged byte made no JSON; bytes that are not UTF-8 read as U+FFFD: they raised
    UnicodeDecodeError, a traceback of hfl-peer and hfl-launch --resume, a review).
    ``damaged["lines"]`` counts the complete lines skipped (not a JSON object): a torn
    last line, the end of a life killed mid-write, is not counted."""
    try:
        text = Path(path).read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise file_error(path, exc) from exc
    out = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if isinstance(rec, dict):
            out.append(rec)
        elif damaged is not None and line.strip() and (i < len(lines) - 1 or text.endswith("\n")):
            damaged["lines"] += 1
    return out


def trim_metrics(path: str | Path, last_round: int) -> int:
    """Keep the rows of rounds ``<= last_round`` (the checkpoint's), drop the rest.

    The metrics line of a round is written before its checkpoint, so a peer
    killed between the two has a row for a round its checkpoint does not hold;
    that round runs again after the restart (or is skipped by catching up) and
    must not appear twice. A torn last line goes too, and a line a damaged byte made no
    JSON (bytes that are not UTF-8 read as U+FFFD, as :func:`read_jsonl` reads them):
    those are kept in ``<name>.damaged`` beside it, never deleted. Returns how many
    lines went."""
    path = Path(path)
    try:
        lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise file_error(path, exc) from exc
    kept, damaged = [], []
    for line in lines:
        try:
            rec = json.loads(line)
            r = int(rec["round"])
        except (ValueError, TypeError, KeyError):
            damaged.append(line)
            continue
        if r <= last_round:
            kept.append(line)
    dropped = len(lines) - len(kept)
    if damaged:  # (before the file loses them)
        append_line(path.with_name(path.name + ".damaged"), "".join(f"{d}\n" for d in damaged))
    if dropped:
        write_atomic(path, "".join(f"{line}\n" for line in kept).encode())
    return dropped


def set_aside_metrics(peer_id: str, path: str | Path, incarnation: int) -> Path | None:
    """Before a start with no checkpoint to resume: a row of round 1 alone (killed between
    its line and its checkpoint) is dropped, as :func:`trim_metrics` drops it. Rows of
    later rounds are an earlier life's whose checkpoint is gone (moved aside as damaged):
    they were deleted without a word. The file moves to ``<name>.before-<incarnation>``,
    named in a warning; returns that path (None: nothing set aside)."""
    path = Path(path)
    last = max((r.get("round", 0) for r in read_jsonl(path)
                if isinstance(r.get("round"), int)), default=0)
    if last <= 1:
        trim_metrics(path, 0)
        return None
    aside = path.with_name(f"{path.name}.before-{incarnation}")
    try:
        os.replace(path, aside)
    except OSError as exc:
        raise file_error(path, exc) from exc
    log.warning("%s: %s holds rounds up to %d but there is no checkpoint to resume them: "
                "starting from round 1, the earlier rows kept in %s", peer_id, path, last, aside)
    return aside


LOCK_NAME = ".lock"


@contextlib.contextmanager
def run_dir_lock(run_dir: str | Path):
    """One peer process per run directory while it runs: a second start of the same peer
    (another port, another terminal) ran beside the first, both writing every round's
    row and the same checkpoint (a checkpoint review). An advisory lock on
    ``<run_dir>/.lock``, released when the peer ends or its process dies; a directory
    the lock file cannot be made in is left to fail at its first real write, naming it."""
    try:
        import fcntl
    except ImportError:  # (not POSIX)
        yield
        return
    path = Path(run_dir) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunFileError(path, "another peer process runs in this run directory (a "
                                     "second start of the same peer?): stop it first, or "
                                     "give this one another node.run_dir") from None
        except OSError as exc:  # a file system without flock (Lustre, some NFS): no lock
            log.debug("%s: no lock (%s)", path, exc)
        else:  # who holds it: a launcher names the process of a peer still running
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
