"""Where batch inputs and outputs live: a local path (made absolute by the driver, so workers in
other folders or on other hosts find it) or an fsspec URL (``s3://``, ``gs://``...), read and written
through fsspec, an optional extra imported on first use. Paths travel as strings. See docs/batch.md."""

from __future__ import annotations

import contextlib
import os
import posixpath
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sam3track.errors import UsageError

CLOUD_EXTRA = "pip install 'sam3track[cloud]'"


def is_url(location: str | os.PathLike[str]) -> bool:
    """An fsspec URL other than ``file://`` (which is a local path)."""
    text = os.fspath(location)
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.replace("+", "").replace("-", "").isalnum() and scheme != "file"


def absolute(location: str | os.PathLike[str]) -> str:
    """A URL as given (without a trailing slash), a local path made absolute."""
    text = os.fspath(location)
    if is_url(text):
        return text.rstrip("/")
    if text.startswith("file://"):
        text = text[len("file://"):]
    return os.path.abspath(os.path.expanduser(text))


def join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if is_url(folder) else os.path.join(folder, name)


def parent(location: str) -> str:
    return posixpath.dirname(location) if is_url(location) else os.path.dirname(location)


def basename(location: str) -> str:
    return posixpath.basename(location) if is_url(location) else os.path.basename(location)


def inside(location: str, folder: str) -> bool:
    """``location`` is ``folder`` or lies under it (both absolute, as :func:`absolute` makes them)."""
    if is_url(location) != is_url(folder):
        return False
    sep = "/" if is_url(folder) else os.sep
    return location == folder or location.startswith(folder.rstrip(sep) + sep)


def filesystem(url: str) -> tuple[Any, str]:
    """fsspec's filesystem for ``url`` and the path inside it; :class:`UsageError` naming the URL and
    the package to install when fsspec or the protocol's implementation is missing."""
    try:
        import fsspec
    except ImportError:
        raise UsageError(f"{url}: URLs need fsspec: {CLOUD_EXTRA} (s3fs for s3://, gcsfs for gs://)") from None
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as e:  # fsspec names the package of the protocol (e.g. "Install s3fs ...")
        raise UsageError(f"{url}: {str(e).splitlines()[0]} ({CLOUD_EXTRA} installs s3fs; gs:// needs "
                         f"gcsfs)") from None
    except ValueError as e:
        raise UsageError(f"{url}: {e}; give a local path or a URL fsspec knows (s3://, gs://, ...)") from None


@contextlib.contextmanager
def failing_as_usage(doing: str, location: str) -> Iterator[None]:
    """Any failure of a store or disk (no credentials, no network, no permission, disk full) as one
    :class:`UsageError` line naming what was being done where, instead of a traceback."""
    try:
        yield
    except UsageError:
        raise
    except Exception as e:  # botocore's and gcsfs's errors are not OSErrors
        first = (str(e).strip().splitlines() or [""])[0]
        raise UsageError(f"cannot {doing} {location}: {type(e).__name__}: {first}") from None


def exists(location: str) -> bool:
    if not is_url(location):
        return os.path.exists(location)
    with failing_as_usage("read", location):
        fs, path = filesystem(location)
        return fs.exists(path)


def read_text(location: str) -> str | None:
    """The text of a file or object; None when it does not exist."""
    with failing_as_usage("read", location):
        if not is_url(location):
            path = Path(location)
            return path.read_text(encoding="utf-8") if path.exists() else None
        fs, path = filesystem(location)
        try:
            return fs.cat_file(path).decode("utf-8")
        except FileNotFoundError:
            return None


def find_files(url: str) -> list[str] | None:
    """Every object under the URL ``url`` (sorted), ``[url]`` for one object, None when none is there."""
    with failing_as_usage("list", url):
        fs, path = filesystem(url)
        if fs.isdir(path):
            base = path.rstrip("/")
            # Each URL spelled as the user spelled the folder's (fsspec's own spelling may differ, e.g.
            # memory:///x for memory://x), so comparing with --out and the ledger's keys holds.
            return sorted(url + p[len(base):] if p.startswith(base + "/") else fs.unstrip_protocol(p)
                          for p in fs.find(path))
        return [url] if fs.exists(path) else None


def download(url: str, local: Path) -> None:
    """The object ``url`` copied to the local file ``local``."""
    with failing_as_usage("read", url):
        fs, path = filesystem(url)
        fs.get_file(path, str(local))


def upload(local: Path, url: str) -> None:
    """The local file or folder ``local`` to ``url``; each object appears whole when its upload ends
    (an object store's put), so a reader never sees part of one."""
    with failing_as_usage("write", url):
        fs, path = filesystem(url)
        if local.is_dir():
            for file in sorted(p for p in local.rglob("*") if p.is_file()):
                fs.put_file(str(file), f"{path}/{file.relative_to(local).as_posix()}")
        else:
            fs.put_file(str(local), path)
