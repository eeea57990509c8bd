"""Atomic file writing (temp file in the same directory, fsync, then ``os.replace``: ``atomic_path``), atomic
publishing of a whole output directory (``publish_dir``: checkpoints, converted runs, exports), strict JSON and
safe loading of JSON / YAML.

Nothing here unpickles and nothing imports torch (sweep workers, reports and the CLI's light commands use it);
tensors (safetensors) are written and read beside the checkpoint code, ``normlab.rundir.tensors``.
"""

from __future__ import annotations

import errno
import glob
import json
import math
import os
import re
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import yaml

from normlab.errors import NormlabError


def current_umask() -> int:
    """The process's umask, read without changing it where Linux shows it (``/proc/self/status``); elsewhere the
    usual set-and-restore."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _as_open_would(path: str | Path, directory: bool = False) -> None:
    """Give a ``mkstemp`` file (0600) or ``mkdtemp`` directory (0700) the mode ``open()`` / ``mkdir()`` would have
    given it: 0666 / 0777 less the umask, so colleagues on a shared file system can read what normlab writes
    exactly when they could read a file the user wrote any other way."""
    os.chmod(path, (0o777 if directory else 0o666) & ~current_umask())


def honour_umask(root: str | Path) -> None:
    """Give every file and directory under ``root`` (and ``root``) the mode ``open()`` / ``mkdir()`` would
    (executables keep their x bits): writers that create 0600 files themselves (safetensors' ``save_file``,
    ``save_pretrained`` through it) then publish files as readable as anything else the user writes."""
    mask = current_umask()
    for dirpath, dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o777 & ~mask)
        for name in filenames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                os.chmod(p, (0o777 if os.stat(p).st_mode & 0o100 else 0o666) & ~mask)


def make_temp_dir(prefix: str, parent: str | Path) -> Path:
    """``tempfile.mkdtemp`` in ``parent`` with the mode ``mkdir()`` would give (the umask honoured, not 0700)."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    _as_open_would(tmp, directory=True)
    return tmp


def no_space(e: BaseException) -> bool:
    """Whether ``e`` says the disk is full: ENOSPC / EDQUOT, or a library's own error carrying the OS message
    (safetensors' ``SafetensorError: ... IoError(... StorageFull ...)``)."""
    if isinstance(e, OSError) and e.errno is not None:
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    text = str(e)
    return "No space left on device" in text or "StorageFull" in text or "Disk quota exceeded" in text


def named_os_error(e: BaseException, path: str | Path) -> OSError | None:
    """``e`` as an ``OSError`` naming ``path`` when it names no file (a ``write()`` on an open file, a library's
    disk-full error), so the one-line error says which file could not be written; None when ``e`` already names
    one or is not an operating-system error."""
    if isinstance(e, OSError) and e.filename is None and e.errno is not None:
        return OSError(e.errno, e.strerror or os.strerror(e.errno), str(path))
    if not isinstance(e, OSError) and no_space(e):
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return None


def disk_full(e: BaseException) -> OSError | None:
    """``e`` as the ``OSError`` (ENOSPC / EDQUOT) it is when it says the disk is full (:func:`no_space`), naming
    the file being written where ``e`` does (``atomic_path`` / ``publish_dir`` name it); None for any other error."""
    if not no_space(e):
        return None
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return e
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


_FULL_NOTE = re.compile(r"^disk full \((ENOSPC|EDQUOT)\): (.*)$", re.S)


def disk_full_note(e: OSError) -> str:
    """How a sweep's results store records a run stopped by a full disk (its ``error``): ``disk full (ENOSPC):
    PATH``; :func:`from_disk_full_note` reads it back, so the command that ran the sweep ends with the same one
    line as a run of its own would."""
    return f"disk full ({errno.errorcode.get(e.errno or errno.ENOSPC, 'ENOSPC')}): {e.filename or ''}"


def from_disk_full_note(note: object) -> OSError | None:
    """The ``OSError`` a :func:`disk_full_note` records, or None for any other text."""
    m = _FULL_NOTE.match(note) if isinstance(note, str) else None
    if m is None:
        return None
    code = getattr(errno, m.group(1))
    return OSError(code, os.strerror(code), m.group(2) or None)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success it replaces ``path`` atomically, on error it is removed. The
    file ends with the mode ``open(path, "w")`` would give it (0666 less the umask), not ``mkstemp``'s 0600.
    An operating-system error that names no file (a full disk during ``write()``) is raised naming ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        _as_open_would(tmp)  # after the writer: one that recreates the file (safetensors) would keep 0600
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as e:
        named = named_os_error(e, path)
        if named is None:
            raise
        raise named from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def check_new_dir(out: str | Path, flag: str = "--out") -> Path:
    """``out`` as a directory a command will create: an existing file or non-empty directory is a one-line error;
    so is a symbolic link (dangling or not), which ``publish_dir``'s rename could only fail on after the work."""
    out = Path(out)
    if out.is_symlink():
        raise NormlabError(f"{flag} {out} is a symbolic link; give the path of a new directory (the output is "
                           "renamed into place, not written through a link)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise NormlabError(f"{flag} {out} already exists and is not empty")
    return out


@contextmanager
def publish_dir(out: str | Path, *, replace: bool = False) -> Iterator[Path]:
    """Build a whole output directory atomically: yield a fresh temp directory beside ``out``
    (``.NAME.XXXXXXXX``); when the block ends without error it is renamed to ``out`` (an empty ``out`` is
    replaced; with ``replace``, any existing ``out`` is), on error it is removed, so ``out`` is either
    absent/empty or complete; its mode is what ``mkdir()`` gives (the umask honoured). Temp directories of this
    name that a killed earlier command left behind are removed first."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(out.parent, (f"{glob.escape('.' + out.name)}.????????",))
    tmp = make_temp_dir(f".{out.name}.", out.parent)
    try:
        yield tmp
        honour_umask(tmp)
        if out.exists() and replace:
            shutil.rmtree(out)
        elif out.exists():
            out.rmdir()  # empty (check_new_dir); a non-empty one is an OSError naming the path
        os.replace(tmp, out)
    except Exception as e:  # a full disk while a library writes into the directory: the error names ``out``
        named = named_os_error(e, out)
        if named is None:
            raise
        raise named from e
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_text(path: str | Path, text: str) -> None:
    """Atomically write ``text`` to ``path``."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def strict(obj: Any) -> Any:
    """``obj`` with every non-finite float (NaN, inf) replaced by None, numpy scalars as Python numbers: what
    strict JSON can hold (the record's ``status`` says why a value is missing)."""
    if isinstance(obj, float) or (hasattr(obj, "dtype") and getattr(obj, "shape", None) == ()):
        try:
            v = obj.item() if hasattr(obj, "item") else obj
        except (ValueError, TypeError):
            return obj
        return v if not isinstance(v, float) or math.isfinite(v) else None
    if isinstance(obj, dict):
        return {k: strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    return obj


def dumps(obj: Any, **kw: Any) -> str:
    """Strict JSON text (no bare NaN / Infinity): non-finite numbers become null."""
    return json.dumps(strict(obj), allow_nan=False, **kw)


def write_json(path: str | Path, obj: Any) -> None:
    """Atomically write ``obj`` as indented strict JSON (non-finite numbers as null)."""
    write_text(path, dumps(obj, indent=2, sort_keys=False) + "\n")


MAX_JSON_BYTES = 64 * 1024 * 1024  # summary.json, state.json, records: a few KiB; stored claims results: a few MiB
MAX_JSONL_BYTES = 256 * 1024 * 1024  # metrics.jsonl: a few hundred bytes per logged step
MAX_YAML_BYTES = 16 * 1024 * 1024
MAX_NESTING = 64  # levels of nested mappings / lists in a YAML or JSON file normlab reads
# digits of an integer in a YAML or JSON file, a --set value or a NORMLAB_* variable: a seed, a step count or a byte
# count has at most 20; Python refuses to convert more than 4300 (a ValueError deep inside a parser)
MAX_INT_DIGITS = 100

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _not_regular(mode: int) -> str | None:
    """What a non-regular file is (``"a FIFO (named pipe)"``), or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _mib(n: int) -> str:
    return f"{n / 1024 / 1024:g} MiB"


def _open_regular(path: Path, what: str, max_bytes: int) -> int:
    """A read-only descriptor of ``path`` when it is a regular file of at most ``max_bytes`` (opened non-blocking,
    checked again on the descriptor); anything else is the one-line NormlabError of :func:`read_bytes`."""
    try:
        kind = _not_regular(os.stat(path).st_mode)
        if kind is None:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise NormlabError(f"{what} {path} not found") from None
    except OSError as e:
        raise NormlabError(f"cannot read {what} {path}: {e.strerror or e.__class__.__name__}") from None
    if kind is not None:
        raise NormlabError(f"{what} {path} is {kind}, not a regular file; normlab reads only regular files")
    try:
        st = os.fstat(fd)
        kind = _not_regular(st.st_mode)
        if kind is not None:
            raise NormlabError(f"{what} {path} is {kind}, not a regular file; normlab reads only regular files")
        if st.st_size > max_bytes:
            raise NormlabError(f"{what} {path} is {st.st_size:,} bytes, more than the {_mib(max_bytes)} normlab "
                               "reads; it is not a file normlab wrote (or it is damaged)")
    except BaseException as e:
        os.close(fd)
        if isinstance(e, OSError):
            raise NormlabError(f"cannot read {what} {path}: {e.strerror or e.__class__.__name__}") from None
        raise
    return fd


def _chunks(fd: int, path: Path, what: str, max_bytes: int) -> Iterator[bytes]:
    """The bytes of ``fd`` in chunks of at most 1 MiB; a file that grows past ``max_bytes`` while read is cut at
    ``max_bytes + 1`` and refused (one line)."""
    total = 0
    while total <= max_bytes:
        try:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
        except OSError as e:
            raise NormlabError(f"cannot read {what} {path}: {e.strerror or e.__class__.__name__}") from None
        if not chunk:
            return
        total += len(chunk)
        if total > max_bytes:
            break
        yield chunk
    raise NormlabError(f"{what} {path} grew past the {_mib(max_bytes)} normlab reads while being read")


def read_bytes(path: str | Path, what: str = "file", max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``: the one safe way normlab opens a file it reads (run,
    store, sweep, config and report inputs). A FIFO, socket, device or directory in its place is a one-line
    NormlabError and is never read (a FIFO would block forever, ``/dev/zero`` never ends); so is a larger file (a
    sparse 1 GiB ``summary.json`` would take 1 GiB of memory) and a missing or unreadable one. The file is opened
    non-blocking and checked again on the open descriptor (no window in which it can be swapped for a FIFO)."""
    path = Path(path)
    fd = _open_regular(path, what, max_bytes)
    try:
        return b"".join(_chunks(fd, path, what, max_bytes))
    finally:
        os.close(fd)


def read_lines(path: str | Path, what: str = "file", max_bytes: int = MAX_JSON_BYTES) -> Iterator[bytes]:
    """The lines of a file, streamed: opened and checked now, as :func:`read_bytes` does (a FIFO, device, missing,
    unreadable or larger file is one line naming ``what`` and the path, raised by this call), then read 1 MiB at a
    time as the returned iterator is consumed, so memory holds one chunk and one line, not the file. The lines are
    ``bytes.splitlines()`` of the whole file, without their line ends; a file that grows past ``max_bytes`` while
    read is refused when the reader gets there."""
    path = Path(path)
    f = os.fdopen(_open_regular(path, what, max_bytes), "rb", buffering=0)  # closed when done, or when collected

    def lines() -> Iterator[bytes]:
        with f:
            pending: list[bytes] = []  # the start of a line not ended yet (joined once: no quadratic copying)
            for chunk in _chunks(f.fileno(), path, what, max_bytes):
                if b"\n" not in chunk:
                    pending.append(chunk)
                    continue
                parts = chunk.split(b"\n")
                if pending:
                    parts[0] = b"".join(pending) + parts[0]
                last = parts.pop()
                pending = [last] if last else []
                for part in parts:
                    if b"\r" in part:  # what splitlines() also ends a line at
                        yield from part.splitlines()
                    else:
                        yield part
            if pending:
                yield from b"".join(pending).splitlines()

    return lines()


def read_text(path: str | Path, what: str = "file", max_bytes: int = MAX_JSON_BYTES) -> str:
    """:func:`read_bytes` decoded as UTF-8 (anything else is a one-line NormlabError)."""
    try:
        return read_bytes(path, what, max_bytes).decode("utf-8")
    except UnicodeDecodeError:
        raise NormlabError(f"{what} {path} is not UTF-8 text (damaged, or not a file normlab wrote)") from None


def nesting_depth(obj: Any) -> int:
    """How many mappings / lists deep ``obj`` goes (a scalar: 0); iterative, so any depth is measured safely."""
    depth, stack = 0, [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, dict):
            o = list(o.values())
        if isinstance(o, (list, tuple)):
            depth = max(depth, d)
            stack.extend((v, d + 1) for v in o if isinstance(v, (dict, list, tuple)))
    return depth


class _LongInteger(Exception):
    def __init__(self, digits: int) -> None:
        self.digits = digits


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("+-"))
    if digits > MAX_INT_DIGITS:
        raise _LongInteger(digits)
    return int(text)


def long_integer(digits: int, label: str) -> NormlabError:
    """The one-line error for an integer of ``digits`` digits in ``label``."""
    return NormlabError(f"{label} holds an integer of {digits:,} digits; numbers normlab reads have at most "
                        f"{MAX_INT_DIGITS} digits")


def loads_json(text: str | bytes, label: str) -> Any:
    """The one JSON parser of normlab: ``json.loads`` with integers of at most ``MAX_INT_DIGITS`` digits (Python
    refuses to convert more than 4300 with a ValueError that is no JSONDecodeError) and nesting of at most
    ``MAX_NESTING`` levels (deeper: json's recursion would end in a RecursionError); text that is not UTF-8 or not
    JSON, a longer integer or deeper nesting is a one-line NormlabError naming ``label``."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise NormlabError(f"{label} is not UTF-8 text (damaged, or not a file normlab wrote)") from None
    try:
        obj = json.loads(text, parse_int=_bounded_int)
    except json.JSONDecodeError as e:
        raise NormlabError(f"{label} is truncated or corrupted (invalid JSON: {e.msg})") from None
    except _LongInteger as e:
        raise long_integer(e.digits, label) from None
    except RecursionError:
        obj, depth = None, MAX_NESTING + 1
    else:
        depth = nesting_depth(obj)
    if depth > MAX_NESTING:
        raise NormlabError(f"{label} is nested more than {MAX_NESTING} levels deep; it is not a file normlab wrote")
    return obj


def parse_json(raw: bytes, label: str) -> Any:
    """The JSON in ``raw`` (the bytes :func:`read_bytes` read), through :func:`loads_json`: text that is not UTF-8,
    corrupt, nested deeper than ``MAX_NESTING`` or holding an integer longer than ``MAX_INT_DIGITS`` digits is a
    one-line NormlabError naming ``label`` (``"summary RUN/summary.json"``)."""
    return loads_json(raw, label)


def read_json(path: str | Path, what: str = "file", max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Read JSON through :func:`read_bytes` (a regular file, at most ``max_bytes``) and :func:`parse_json`; a
    missing, corrupt or deeper than ``MAX_NESTING`` file is a one-line NormlabError."""
    path = Path(path)
    return parse_json(read_bytes(path, what, max_bytes), f"{what} {path}")


def clean_stale_temps(directory: str | Path, patterns: tuple[str, ...]) -> list[Path]:
    """Remove temporary files/directories a kill -9 left in ``directory`` (names matching ``patterns``)."""
    directory = Path(directory)
    removed = []
    if not directory.is_dir():
        return removed
    for pattern in patterns:
        for p in directory.glob(pattern):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def check_inside(root: str | Path, path: str | Path) -> Path:
    """``path`` for writing under ``root``: refuse (one line) a path that is, or passes through, a symlink leading
    outside ``root`` (a ``diagnostics/`` symlink must not make a command write elsewhere)."""
    root_r = Path(root).resolve()
    path = Path(path)
    target = path.resolve()
    if target != root_r and root_r not in target.parents:
        raise NormlabError(f"refusing to write {path}: it leads outside {root} (a symlink?)")
    return path


def check_dir(path: str | Path, what: str = "directory") -> Path:
    """``path`` as a directory to write into (created); a file in its place is a one-line error."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NormlabError(f"{what} {path} is a file, not a directory; move it away")
    path.mkdir(parents=True, exist_ok=True)
    return path


def check_file_slot(path: str | Path, what: str = "output") -> Path:
    """``path`` as a file to (re)write: a directory in its place is a one-line error."""
    path = Path(path)
    if path.is_dir():
        raise NormlabError(f"{what} {path} is a directory, not a file; move it away")
    return path


class _StrictLoader(yaml.SafeLoader):
    """The one YAML loader of normlab (configs, presets, sweep files, a run's ``config.yaml``, ``--set`` values):
    ``yaml.SafeLoader`` that refuses anchors/aliases (an alias bomb expands to gigabytes from a few lines), a key
    given twice in one mapping (PyYAML keeps the last silently: a config would train another model than the file
    shows) and nesting deeper than ``MAX_NESTING`` (PyYAML's composer recurses: a RecursionError), each as a
    one-line NormlabError with the line numbers (counted from 1)."""

    where = "YAML"
    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: D102
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise NormlabError(f"{self.where}: YAML aliases (*{event.anchor}) are not allowed (line "
                               f"{event.start_mark.line + 1}); write the values out")
        if self._depth >= MAX_NESTING and self.check_event(yaml.MappingStartEvent, yaml.SequenceStartEvent):
            raise NormlabError(f"{self.where}: nested more than {MAX_NESTING} levels deep (line "
                               f"{self.peek_event().start_mark.line + 1}); flatten it")
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node: Any) -> Any:  # noqa: D102
        digits = sum(c.isdigit() or c in "abcdefABCDEF" for c in str(node.value))
        if digits > MAX_INT_DIGITS:  # PyYAML's int() would raise Python's 4300-digit ValueError
            raise NormlabError(f"{self.where}: an integer of {digits:,} digits at line {node.start_mark.line + 1}; "
                               f"numbers normlab reads have at most {MAX_INT_DIGITS} digits")
        return super().construct_yaml_int(node)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:  # noqa: D102
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: SafeLoader's own error follows
                    continue
                if first is not None:
                    raise NormlabError(f"{self.where}: duplicate key '{key}' at lines {first} and {line}; each key "
                                       "may appear once in a mapping (merge the two)")
                seen[key] = line
        return super().construct_mapping(node, deep)


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)


def load_yaml(text: str, where: str = "YAML") -> Any:
    """``yaml.safe_load`` strict and bounded (``_StrictLoader``): aliases, duplicate keys and nesting deeper than
    ``MAX_NESTING`` refused, at most 16 MiB of text (one-line NormlabError)."""
    if len(text) > MAX_YAML_BYTES:
        raise NormlabError(f"{where} is larger than {MAX_YAML_BYTES // 1024 // 1024} MiB; refusing to parse it")
    loader = _StrictLoader(text)
    loader.where = where
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def parse_yaml(raw: bytes, label: str) -> Any:
    """:func:`load_yaml` of ``raw`` (the bytes :func:`read_bytes` read); failures are one line naming ``label``
    (``"config c.yaml"``): ``config c.yaml is not valid YAML at line 3``, ``config c.yaml: duplicate key 'model' at
    lines 1 and 9; ...``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise NormlabError(f"{label} is not UTF-8 text (byte 0x{raw[e.start]:02x} at line {line}); YAML files are "
                           "read as UTF-8") from None
    try:
        return load_yaml(text, label)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise NormlabError(f"{label} is not valid YAML{where}") from None


def read_yaml_file(path: str | Path, what: str) -> Any:
    """:func:`parse_yaml` of a file read through :func:`read_bytes` (a regular file of at most 16 MiB). Failures
    are one line naming ``what`` (``"config"``, ``"sweep file"``) and the path: ``config c.yaml is a directory,
    not a regular file; ...``, ``config c.yaml is not valid YAML at line 3``."""
    return parse_yaml(read_bytes(path, what, MAX_YAML_BYTES), f"{what} {path}")


def json_object(obj: Any, label: str) -> dict[str, Any]:
    """``obj`` when it is a JSON object (``summary.json``, ``state.json`` must hold one); anything else is one line
    naming ``label``."""
    if not isinstance(obj, dict):
        raise NormlabError(f"{label} must hold a JSON object, got {type(obj).__name__}; the file is damaged")
    return obj


def read_json_object(path: str | Path, what: str = "file") -> dict[str, Any]:
    """A JSON file that must hold an object (``summary.json``, ``state.json``): anything else is one line."""
    return json_object(read_json(path, what), f"{what} {path}")
