"""The kernel disk cache (``~/.cache/flydsl`` or ``FLYDSL_CACHE_DIR``): compiled modules as data, never as code.

An entry is one file, ``<dir>/<hash[:2]>/<hash>.flyc`` where ``hash`` is the blake2b of the full key text. Its
first line is JSON metadata: the format version, the full key, the module's launch data (kernel signatures, shared
memory, launch shapes, ptxas's notes, the target), each payload's size and sha256, and a sha256 of the metadata
itself; the raw PTX and cubin bytes follow. Nothing in an entry is executed: a reader parses JSON and compares
hashes. An entry is served only when it is a regular file (opened without following links, never blocking on a
FIFO), owned by this user, at most :data:`MAX_ENTRY_BYTES`, of this format, for this very key, with every checksum
matching; anything else is ignored with one warning per path and process, compiled again and replaced. The
directories are created private to the user (0700); entries are written to a temporary file in place and renamed
(``os.replace``), so concurrent processes see an old entry or a whole new one, and a failed write leaves no
temporary behind. ``FLYDSL_RUNTIME_ENABLE_CACHE=0`` bypasses the cache. What the key covers: docs/kernels.md.

The cache stays within ``FLYDSL_CACHE_MAX_SIZE`` (4 GiB by default): a load marks its entry used (its modification
time), and a process's first store, then every 64th, removes the least recently used entries past the bound
(:func:`prune`; ``python -m flydsl.compiler.cache`` shows the cache and prunes or clears it by hand).

The same entries hold small JSON records (:func:`load_record` / :func:`store_record`: an autotuning winner,
:mod:`flydsl.compiler.autotune`): the metadata line with ``"kind": "record"`` and the record, no payload, read and
written by the same code under the same checks. Every key text is built by :func:`key_text`.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
import stat
import sys
import tempfile
from pathlib import Path

from flydsl.compiler import settings
from flydsl.compiler.compiled import CompiledModule
from flydsl.compiler.target import Target
from flydsl.compiler.tracing import warn_at_user_code

__all__ = [
    "FORMAT",
    "MAX_ENTRY_BYTES",
    "compiler_fingerprint",
    "entry_path",
    "key_text",
    "load",
    "load_record",
    "declare_tunables",
    "package_fingerprint",
    "package_key",
    "prune",
    "store",
    "store_record",
    "usage",
]

FORMAT = 3  # 3: JSON metadata + raw payloads, key and checksums verified (2: a pickle)
MAX_ENTRY_BYTES = 256 << 20  # the largest entry read; the zoo's biggest is well under 1 MB
_SUFFIX = ".flyc"
_warned: set[str] = set()  # paths warned about in this process
_PRUNE_EVERY = 64  # stores of a process between two prunes (its first store prunes too)
_PRUNED_TO = 0.9  # a prune leaves the cache at this fraction of its bound, so that the next store does not prune
_stores = [0]  # entries this process wrote


@functools.lru_cache(maxsize=1)
def compiler_fingerprint() -> str:
    """A hash of FlyDSL's own Python sources (layout, compiler, expr), of its dialect library's file stamp, of the
    Python version (whose standard library the kernel fingerprint names without hashing) and of the cache format,
    through :func:`_sources_digest` (stamps, then a record: a process start reads ~60 stamps, not every source)."""
    # found, not imported: the expression API is the trace's, which a process launching cached kernels never loads
    packages = ("flydsl.layout", "flydsl.compiler", "flydsl.expr")
    roots = [Path(importlib.util.find_spec(package).origin).parent for package in packages]
    dialect = importlib.util.find_spec("flydsl.compiler._fly").origin  # found, not loaded (it loads MLIR)
    return _sources_digest(f"format {FORMAT} python {sys.version}", roots, _stamp(dialect))


@functools.cache
def package_fingerprint(package: str) -> str:
    """A hash of the Python sources of ``package`` (an imported package, namespace packages too: every directory of
    its ``__path__``), for the kernels that read a package whose sources are keyed by their stamps
    (``__flydsl_key_by_stamps__``: :mod:`flydsl.compiler.fingerprint`); computed once per process."""
    roots = [Path(directory) for directory in sys.modules[package].__path__]
    return _sources_digest(f"format {FORMAT} package {package}", roots)


_TUNABLES: dict[str, dict] = {}  # module name -> {name: the value it had when the module declared it}


def declare_tunables(module: str, *names: str) -> None:
    """Declares module constants of ``module`` (a module of a package keyed by its sources' stamps, e.g. the zoo's)
    that a script may set at run time (a mainloop's unroll, a chooser's gains): called by the module itself right
    after binding them, so that the values recorded are its sources'. :func:`package_key` then keys what differs."""
    values = vars(sys.modules[module])
    _TUNABLES[module] = {name: copy.deepcopy(values[name]) for name in names}


def package_key(package: str) -> str:
    """The part of a key that stands for ``package`` (keyed by its sources' stamps): :func:`package_fingerprint`,
    and each declared tunable (:func:`declare_tunables`) of its modules whose value differs now from its sources', so
    that kernels and launch plans made with other values are not taken for these (and keys do not depend on which
    modules a process imported). A value set after a kernel was loaded is not seen by that process's loaded kernel."""
    prefix = package + "."
    changed = [
        (module, name, value)
        for module, defaults in sorted(_TUNABLES.items())
        if module.startswith(prefix) and module in sys.modules
        for name, default in defaults.items()
        if (value := getattr(sys.modules[module], name)) != default
    ]
    return f"{package} {package_fingerprint(package)}" + (f" tunables {changed!r}" if changed else "")


def _sources_digest(header: str, roots: list, *extra_stamps: str) -> str:
    """A hash of the ``*.py`` files under ``roots`` (paths relative to their root, and contents), ``header`` and
    ``extra_stamps``, kept as a record keyed by the files' stamps (path, size, modification time), so that a
    process start stats the files instead of reading and hashing them (~5 ms for the compiler's ~60)."""
    sources = [source for root in roots for source in _python_files(str(root), "")]
    stamps = [*extra_stamps] + [f"{path}:{size}:{mtime}" for path, _, size, mtime in sources]
    stamps_key = key_text("sources fingerprint", header, *stamps)
    record = load_record(stamps_key)
    if record is not None:
        return record["digest"]
    digest = hashlib.blake2b(digest_size=16)
    digest.update(header.encode())
    for path, relative, _, _ in sources:
        digest.update(relative.encode())
        with open(path, "rb") as source:
            digest.update(source.read())
    for extra in extra_stamps:
        digest.update(extra.encode())
    store_record(stamps_key, {"digest": digest.hexdigest()})
    return digest.hexdigest()


def _python_files(directory: str, relative: str) -> list:
    """(path, path relative to the root, size, modification time) of every ``*.py`` file under ``directory``, in
    sorted order (os.scandir: a third of pathlib's rglob's time, which a process start pays)."""
    found = []
    with os.scandir(directory) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.is_dir() and entry.name != "__pycache__":
                found += _python_files(entry.path, f"{relative}{entry.name}/")
            elif entry.name.endswith(".py") and entry.is_file():
                info = entry.stat()
                found.append((entry.path, relative + entry.name, info.st_size, info.st_mtime_ns))
    return found


def _stamp(path) -> str:
    stat_result = os.stat(path)
    return f"{path}:{stat_result.st_size}:{stat_result.st_mtime_ns}"


def key_text(*parts) -> str:
    """The full key text of an entry: its parts one a line, a str as it is, anything else as its ``repr`` (the JIT
    cache: compiler and ptxas fingerprints, the kernel's, then its target, attributes and specialization; autotuning:
    :func:`flydsl.compiler.autotune.key_text`)."""
    return "\n".join(part if isinstance(part, str) else repr(part) for part in parts)


def entry_path(key: str) -> Path:
    """Where the entry of the full key text ``key`` lives."""
    name = hashlib.blake2b(key.encode(), digest_size=20).hexdigest()
    return settings.current().cache_dir / name[:2] / f"{name}{_SUFFIX}"


def _warn_once(path: Path, message: str) -> None:
    if str(path) not in _warned:
        _warned.add(str(path))
        warn_at_user_code(f"FlyDSL: {message}")


def load(key: str) -> CompiledModule | None:
    """The cached module for the full key text ``key``, or None: no entry, the cache disabled, or an entry that is
    not to be trusted (warned once per path)."""
    return _load(key, _decode, "compiling again")


def load_record(key: str) -> dict | None:
    """The record stored for the full key text ``key`` (:func:`store_record`), or None as :func:`load` (an entry that
    is a module, not a record, is not to be trusted here)."""
    return _load(key, _decode_record, "computing it again")


def _load(key: str, decode, then: str):
    if not settings.current().cache_enabled:
        return None
    path = entry_path(key)
    try:
        decoded = decode(_read_regular_file(path), key)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        _warn_once(path, f"ignoring the cache entry {path} ({error}); {then}")
        return None
    try:
        os.utime(path)  # used now: the last to go when the cache is pruned
    except OSError:
        pass
    return decoded


def _read_regular_file(path: Path) -> bytes:
    """The bytes of ``path`` if it is a regular file of this user, not a link, at most MAX_ENTRY_BYTES long."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # a link fails, a FIFO does not block
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if info.st_uid != os.getuid():
            raise ValueError(f"owned by uid {info.st_uid}, not this user ({os.getuid()})")
        if info.st_size > MAX_ENTRY_BYTES:
            raise ValueError(f"{info.st_size} bytes, more than the {MAX_ENTRY_BYTES} an entry may have")
        chunks, left = [], info.st_size + 1  # one byte more: a file that grew is refused below
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) != info.st_size:
            raise ValueError("changed while read")
        return data
    finally:
        os.close(fd)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _canonical(meta: dict) -> bytes:
    return json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()


def _encode(key: str, compiled: CompiledModule) -> bytes:
    ptx = compiled.ptx.encode()
    cubin = compiled.cubin
    meta = {
        "format": FORMAT,
        "key": key,
        "name": compiled.name,
        "target": dataclasses.asdict(compiled.target),
        "kernels": compiled.kernels,
        "shared_bytes": compiled.shared_bytes,
        "launch_shapes": compiled.launch_shapes,
        "performance_notes": list(compiled.performance_notes),
        "ptx": {"size": len(ptx), "sha256": _sha256(ptx)},
        "cubin": None if cubin is None else {"size": len(cubin), "sha256": _sha256(cubin)},
    }
    meta["checksum"] = _sha256(_canonical(meta))
    return _canonical(meta) + b"\n" + ptx + (cubin or b"")


def _metadata(data: bytes, key: str) -> tuple[dict, bytes]:
    """An entry's metadata and payload, its format, metadata checksum and key checked; ValueError (KeyError, TypeError,
    AttributeError for a malformed one) naming what does not hold."""
    header, newline, payload = data.partition(b"\n")
    if not newline:
        raise ValueError("no metadata line")
    meta = json.loads(header)
    if not isinstance(meta, dict):
        raise ValueError("metadata is not a JSON object")
    if meta.get("format") != FORMAT:
        raise ValueError(f"format {meta.get('format')!r}, expected {FORMAT}")
    checksum = meta.pop("checksum", None)
    if checksum != _sha256(_canonical(meta)):
        raise ValueError("the metadata checksum does not match")
    if meta["key"] != key:
        raise ValueError("the entry is another key's")
    return meta, payload


def _decode(data: bytes, key: str) -> CompiledModule:
    """The module of an entry's bytes; ValueError (KeyError, TypeError, AttributeError for a malformed one) naming
    what does not hold."""
    meta, payload = _metadata(data, key)
    if meta.get("kind", "module") != "module":
        raise ValueError(f"a {meta['kind']!r} entry, not a compiled module")
    ptx_size = meta["ptx"]["size"]
    cubin_size = 0 if meta["cubin"] is None else meta["cubin"]["size"]
    if len(payload) != ptx_size + cubin_size:
        raise ValueError(f"{len(payload)} payload bytes, expected {ptx_size + cubin_size}")
    ptx, cubin = payload[:ptx_size], payload[ptx_size:] if meta["cubin"] is not None else None
    if _sha256(ptx) != meta["ptx"]["sha256"]:
        raise ValueError("the PTX checksum does not match")
    if cubin is not None and _sha256(cubin) != meta["cubin"]["sha256"]:
        raise ValueError("the cubin checksum does not match")
    shapes = {
        name: tuple(None if shape is None else tuple(shape) for shape in pair)
        for name, pair in meta["launch_shapes"].items()
    }
    return CompiledModule(
        name=meta["name"],
        target=Target(**meta["target"]),
        ptx=ptx.decode(),
        cubin=cubin,
        kernels=dict(meta["kernels"]),
        shared_bytes=dict(meta["shared_bytes"]),
        launch_shapes=shapes,
        performance_notes=tuple(meta["performance_notes"]),
        cache_key=key,
    )


def _encode_record(key: str, record: dict) -> bytes:
    meta = {"format": FORMAT, "key": key, "kind": "record", "record": record}
    meta["checksum"] = _sha256(_canonical(meta))
    return _canonical(meta) + b"\n"


def _decode_record(data: bytes, key: str) -> dict:
    """The record of an entry's bytes; ValueError naming what does not hold."""
    meta, payload = _metadata(data, key)
    if meta.get("kind") != "record":
        raise ValueError(f"a {meta.get('kind', 'module')!r} entry, not a record")
    if payload:
        raise ValueError(f"{len(payload)} payload bytes after a record")
    if not isinstance(meta["record"], dict):
        raise ValueError("the record is not a JSON object")
    return meta["record"]


def store(key: str, compiled: CompiledModule) -> None:
    """Writes the entry of ``key`` atomically (a private temporary file renamed into place); a failure to write
    warns once per path and leaves no temporary file."""
    _store(key, lambda: _encode(key, compiled), "this kernel is not cached")


def store_record(key: str, record: dict) -> None:
    """Writes ``record`` (a JSON object: str keys; str, number, bool, None, list and dict values) as the entry of
    ``key``, as :func:`store` writes modules. A record that JSON cannot encode raises ``TypeError``/``ValueError``."""
    data = _encode_record(key, record)  # before any file is touched: an unencodable record is the caller's error
    _store(key, lambda: data, "this record is not kept on disk")


def _store(key: str, encode, then: str) -> None:
    if not settings.current().cache_enabled:
        return
    path = entry_path(key)
    temporary = None
    try:
        root = path.parent.parent
        os.makedirs(root.parent, exist_ok=True)
        for directory in (root, path.parent):  # private to the user (makedirs' mode applies to the last only)
            try:
                os.mkdir(directory, 0o700)
            except FileExistsError:
                pass
        if path.is_dir() and not path.is_symlink():
            os.rmdir(path)  # an empty directory where the entry belongs; a full one raises and is left alone
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            handle.write(encode())
        os.replace(temporary, path)
        temporary = None
        _stores[0] += 1
        if _stores[0] % _PRUNE_EVERY == 1:
            _prune_quietly()
    except OSError as error:
        _warn_once(path, f"could not write the cache entry {path}: {error}; {then}")
    finally:
        if temporary is not None:
            try:
                os.unlink(temporary)
            except OSError:
                pass


def _entries() -> list:
    """The cache's entries as ``(modification time, size, path)``: regular files of this user named ``*.flyc`` in
    its two-character shard directories (links, temporaries and anything else are left alone)."""
    entries = []
    try:
        shards = [
            d for d in os.scandir(settings.current().cache_dir) if len(d.name) == 2 and d.is_dir(follow_symlinks=False)
        ]
    except FileNotFoundError:
        return entries
    uid = os.getuid()
    for shard in shards:
        try:
            files = list(os.scandir(shard.path))
        except OSError:
            continue
        for entry in files:
            if not entry.name.endswith(_SUFFIX) or not entry.is_file(follow_symlinks=False):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:  # removed meanwhile (another process pruning)
                continue
            if info.st_uid == uid:
                entries.append((info.st_mtime, info.st_size, entry.path))
    return entries


def _prune_quietly() -> None:
    """:func:`prune` after a store: a cache that cannot be walked stays as it is (the entry was written)."""
    try:
        prune()
    except OSError:
        pass


def usage() -> tuple[int, int]:
    """``(entries, bytes)`` the disk cache holds."""
    entries = _entries()
    return len(entries), sum(size for _, size, _ in entries)


def prune(max_bytes: int | None = None) -> tuple[int, int]:
    """Removes the least recently used entries (loaded or written longest ago) until the cache holds at most
    ``max_bytes`` (0: every entry); by default the bound ``FLYDSL_CACHE_MAX_SIZE`` (0: none), pruned down to 90% of
    it once passed. Returns ``(entries, bytes)`` removed. Safe beside other processes: a reader whose entry goes
    compiles it again."""
    if max_bytes is None:
        bound = settings.current().cache_max_bytes
        if bound <= 0:
            return 0, 0
        entries = _entries()
        total = sum(size for _, size, _ in entries)
        if total <= bound:
            return 0, 0
        target = bound * _PRUNED_TO
    else:
        entries = _entries()
        total, target = sum(size for _, size, _ in entries), max_bytes
    removed = freed = 0
    for _, size, path in sorted(entries):
        if total - freed <= target:
            break
        try:
            os.unlink(path)
        except OSError:  # gone already, or not ours to remove
            continue
        removed, freed = removed + 1, freed + size
    return removed, freed


def main(argv: list[str] | None = None) -> int:
    """``python -m flydsl.compiler.cache [--prune [SIZE] | --clear]``: the cache's place, entries, size and bound."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m flydsl.compiler.cache", description=main.__doc__)
    action = parser.add_mutually_exclusive_group()
    action.add_argument(
        "--prune",
        nargs="?",
        const="",
        metavar="SIZE",
        help="remove the least recently used entries past SIZE (e.g. 1G; default: FLYDSL_CACHE_MAX_SIZE)",
    )
    action.add_argument("--clear", action="store_true", help="remove every entry")
    args = parser.parse_args(argv)
    current = settings.current()
    if args.clear or args.prune is not None:
        try:
            bound = 0 if args.clear else settings.parse_size("--prune", args.prune, 0) if args.prune else None
        except ValueError as error:
            parser.error(str(error))  # (exit status 2, the usage above it)
        removed, freed = prune(bound)
        print(f"removed {removed} entries ({freed / 2**20:.1f} MiB)")
    entries, size = usage()
    limit = f"{current.cache_max_bytes / 2**30:.2f} GiB" if current.cache_max_bytes else "none"
    print(f"{current.cache_dir}: {entries} entries, {size / 2**20:.1f} MiB (bound: {limit})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
