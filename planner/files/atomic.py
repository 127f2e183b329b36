"""Files the user names: JSON read with one-line errors, and written atomically, never over an existing file
without ``force``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from planner.files.file_set import write_files
from store.documents import parse_json, read_document
from store.errors import InputError


def checked_output(path: str | Path) -> Path:
    """``path`` as a file to write; InputError for an empty name, a path with no file name (``.``, ``/``) or one
    that ends in a separator (a folder, even one that does not exist yet), or a name longer than the file system
    allows."""
    text = str(path)
    if not text.strip():
        raise InputError("-o/--output is empty; give a file name such as ds_config.json")
    if text.endswith(("/", os.sep)) and not Path(text).is_dir():
        raise InputError(f"{text} names a folder; give a file name such as {Path(text) / 'ds_config.json'}")
    path = Path(path)
    if not path.name:  # "." and "/": folders, and pathlib has no name to derive the settings file's from
        raise InputError(f"{text} is a folder; give a file name such as {path / 'ds_config.json'}")
    if len(path.name.encode()) > 255 or len(str(path).encode()) > 4096:
        shown = str(path) if len(str(path)) <= 60 else str(path)[:57] + "..."
        raise InputError(f"cannot write {shown}: the file name is longer than the file system allows (255 bytes)")
    return path


def write_text_atomic(path: Path, text: str, *, force: bool = False) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename: all or nothing."""
    return write_bytes_atomic(path, text.encode("utf-8"), force=force)


def _writable(path: Path, *, force: bool) -> Path:
    """``path`` checked as a file to write (see ``write_bytes_atomic``)."""
    path = checked_output(path)
    if path.is_dir():
        raise InputError(f"{path} is a folder; give a file name such as {path / 'ds_config.json'}")
    if path.exists() and not force:
        raise InputError(f"{path} exists; pass --force to overwrite it")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise InputError(f"cannot write {path}: folder {folder} does not exist")
    return path


def write_bytes_atomic(path: Path, data: bytes, *, force: bool = False) -> Path:
    """Write ``data`` to ``path`` through a temporary file and a rename: all or nothing; InputError (one
    line) for an existing file without ``force``, a folder, a missing folder or a failed write. Temporary
    files a killed planner left in that folder are removed first (:mod:`planner.files.file_set`)."""
    path = _writable(path, force=force)
    write_files({path: data})
    return path


def write_json_atomic(path: Path, data: Any, *, force: bool = False) -> Path:
    """Write ``data`` as indented JSON (see ``write_text_atomic``)."""
    return write_text_atomic(path, json.dumps(data, indent=2) + "\n", force=force)


def read_json_file(path: str | Path, what: str) -> Any:
    """Parse a JSON file the user named; any problem is one InputError line (a FIFO or a device is refused
    without waiting on it: ``store.documents.read_document``)."""
    return read_document(path, what)


def config_paths(path: Path, configs: dict[str, Any], *, per_model: bool) -> dict[Path, Any]:
    """Where each config goes: ``path`` itself, or ``<stem>.<model><suffix>`` beside it for RLHF."""
    if not per_model:
        return {path: configs}
    suffix = path.suffix or ".json"
    return {path.with_name(f"{path.stem}.{name}{suffix}"): config for name, config in configs.items()}


def write_configs(path: Path, configs: Any, *, force: bool = False, per_model: bool | None = None) -> list[Path]:
    """Write one config (single model) or one per model (RLHF): every file or, on any problem, none.

    ``per_model`` defaults to whether ``configs`` maps model names (actor, critic, ...) to configs.
    """
    if per_model is None:
        per_model = isinstance(configs, dict) and "actor" in configs
    targets = config_paths(checked_output(path), configs, per_model=per_model)
    return write_texts({target: json.dumps(config, indent=2) + "\n" for target, config in targets.items()}, force=force)


def write_texts(targets: dict[Path, str], *, force: bool = False) -> list[Path]:
    """Write each text to its path: every file or, on any problem, none (InputError, one line).

    Refuses before writing anything when a target exists (without ``force``) or is a folder. A write that
    fails part way (a full disk, a target that cannot be replaced, an interrupt) puts back the files it had
    replaced; a planner killed part way is rolled back by the next write there (:mod:`planner.files.file_set`)."""
    for target in targets:
        checked_output(target)  # companion names are longer than the one given
    checked = [_writable(target, force=force) for target in targets]
    return write_files({path: text.encode("utf-8") for path, text in zip(checked, targets.values(), strict=True)})


def read_strategy(text: str | Path | None, what: str = "--strategy") -> dict[str, Any]:
    """A strategy document from inline JSON (text starting with ``{``) or from a JSON file; ``{}`` for None."""
    if text is None:
        return {}
    if isinstance(text, Path) or not text.lstrip().startswith("{"):
        data = read_json_file(Path(text), what)
    else:
        data = parse_json(text, what)
    if not isinstance(data, dict):
        raise InputError(f"{what}: expected a JSON object")
    return data
