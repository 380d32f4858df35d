"""The per-installation secret that authenticates the entries of the on-disk caches.

Contract
--------
- The secret is :data:`SECRET_BYTES` random bytes in a file outside the cache folders:
  ``$GRAMMARSERVE_CACHE_SECRET_FILE`` if set, else ``cache-secret`` under
  ``$XDG_CONFIG_HOME/grammarserve`` (``~/.config/grammarserve`` when that is unset).
- :func:`load_secret` creates it on first use: written whole to a temporary file (``O_EXCL``,
  mode 0600) and linked to its name, which fails if it exists, so of processes that start at
  once exactly one secret is made and every process reads that one, never a partial file.
- A secret file is used only if it is a regular file (no link is followed, nothing blocks),
  owned by this user, not readable or writable by anyone else, in a folder nobody else may
  replace it in, and exactly :data:`SECRET_BYTES` long; anything else raises ``OSError``
  with a message naming the file and the problem (the stores then read and write nothing).
- Processes that share a cache folder must share the secret (same user, same home): an entry
  written under another secret is a miss, never an error.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

#: The environment variable naming the secret file (overrides the default location).
ENV = "GRAMMARSERVE_CACHE_SECRET_FILE"
SECRET_BYTES = 32
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def default_secret_file() -> Path:
    """Where the secret lives: ``$GRAMMARSERVE_CACHE_SECRET_FILE``, else under
    ``$XDG_CONFIG_HOME`` (or ``~/.config``) ``/grammarserve/cache-secret``."""
    named = os.environ.get(ENV)
    if named:
        return Path(named).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path("~/.config").expanduser())
    return Path(config) / "grammarserve" / "cache-secret"


def load_secret(path: str | os.PathLike[str] | None = None) -> bytes:
    """The secret in ``path`` (default :func:`default_secret_file`), created if it is missing;
    raises ``OSError`` (its message naming the file and the problem) if it cannot be made or
    is not to be trusted."""
    file = Path(path).expanduser() if path is not None else default_secret_file()
    try:
        return _read(file)
    except FileNotFoundError:
        pass
    _create(file)
    return _read(file)


def _read(file: Path) -> bytes:
    try:
        fd = os.open(file, _OPEN_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as e:  # NOTE: ELOOP: a link
        raise OSError(f"cache secret {file}: cannot open it ({e})") from e
    try:
        st = os.fstat(fd)
        problem = _file_problem(st) or _folder_problem(os.stat(file.parent))
        if problem is None and st.st_size != SECRET_BYTES:
            problem = f"it holds {st.st_size} bytes, not {SECRET_BYTES}"
        data = os.read(fd, SECRET_BYTES + 1) if problem is None else b""
    except OSError as e:
        raise OSError(f"cache secret {file}: cannot read it ({e})") from e
    finally:
        os.close(fd)
    if problem is None and len(data) != SECRET_BYTES:
        problem = f"read {len(data)} bytes, not {SECRET_BYTES}"
    if problem is not None:
        raise OSError(f"cache secret {file}: {problem}; remove it (a new one is made) or name "
                      f"another file in ${ENV}")
    return data


def _file_problem(st: os.stat_result) -> str | None:
    """Why a secret file with this status is not to be trusted, or None."""
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    if st.st_uid != os.getuid():
        return "it belongs to another user"
    if st.st_mode & 0o077:
        return f"its mode is {stat.S_IMODE(st.st_mode):04o} (others may read it; want 0600)"
    return None


def _folder_problem(st: os.stat_result) -> str | None:
    """Why a secret file's folder with this status is not to be trusted (another user could
    put their own secret in its place), or None."""
    if st.st_uid not in (os.getuid(), 0):
        return "its folder belongs to another user"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return "its folder may be written by others (they could replace it)"
    return None


def _create(file: Path) -> None:
    """Make ``file`` with a new secret unless it appears meanwhile (another process's wins)."""
    try:
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = file.parent / f".{file.name}.{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except OSError as e:
        raise OSError(f"cache secret {file}: cannot create it ({e})") from e
    try:
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(SECRET_BYTES))
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, file)  # NOTE: fails if it exists: the first process's secret stays
        except FileExistsError:
            pass
        except OSError as e:
            raise OSError(f"cache secret {file}: cannot create it ({e})") from e
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
