"""The tenants file (``--tenants FILE``): TOML, read whole into an immutable `Tenants`.

The format (docs/tenants.md)::

    [classes.interactive]          # optional
    priority = 10
    reserved_slots = 1
    default_max_tokens = 512

    [[tenant]]
    name = "alice"
    key_env = "ALICE_KEY"          # or key = "...", or key_file = "path" (one of them)
    class = "interactive"
    weight = 1.0
    models = ["gemma*", "tiny-a"]
    admin = false
    max_parallel = 4
    requests_per_minute = 60
    tokens_per_minute = 20000
    tokens_per_day = 1000000

A file troupe cannot use raises `TenantsFileError`, whose message is one line naming the
file and, where the TOML text shows it, the line: ``tenants.toml: line 7: tenant "bob":
weight must be a positive number``. Unknown keys are refused (a typo must not quietly
give a tenant every model), as are duplicate names and duplicate keys. Keys are read
here, once per read (``key_env`` from the environment given, ``key_file``'s first line,
relative to the tenants file); no message ever quotes a key.

Keys from ``--api-key``/``--api-key-file``/``--named-api-keys`` are added as admin
tenants of the default class (`Tenants.from_keys`), checked against the file's for
duplicates.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from troupe.errors import ConfigError
from troupe.tenants.model import DEFAULT_CLASS, Limits, Tenant, TenantClass, Tenants

__all__ = ["TenantsFileError", "parse_tenants", "read_tenants"]

_TOP = frozenset({"tenant", "classes"})
_TENANT_KEYS = frozenset(
    {
        "name",
        "key",
        "key_env",
        "key_file",
        "class",
        "weight",
        "models",
        "admin",
        "max_parallel",
        "requests_per_minute",
        "tokens_per_minute",
        "tokens_per_day",
    }
)
_LIMITS = ("max_parallel", "requests_per_minute", "tokens_per_minute", "tokens_per_day")
_CLASS_KEYS = frozenset({"priority", "reserved_slots", "default_max_tokens"})
_KEY_SOURCES = ("key", "key_env", "key_file")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
_HEADER = re.compile(r"\s*\[")
_TENANT_HEADER = re.compile(r"\s*\[\[\s*tenant\s*\]\]")
_CLASS_HEADER = re.compile(
    r"""\s*\[\s*classes\s*\.\s*(?:"([^"]*)"|'([^']*)'|([A-Za-z0-9_-]+))\s*\]"""
)
_DECODE_AT = re.compile(r"^(.*) \(at line (\d+), column (\d+)\)$")


class TenantsFileError(ConfigError):
    """The tenants file cannot be used; the message is one line, with no key in it."""


class _Lines:
    """Where things are in the file's text, for messages (TOML's parser does not say)."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.tenants: list[int] = []  # the line (0-based) of each [[tenant]] header
        self.classes: dict[str, int] = {}
        for i, line in enumerate(self.lines):
            if _TENANT_HEADER.match(line):
                self.tenants.append(i)
            elif m := _CLASS_HEADER.match(line):
                self.classes.setdefault(m.group(1) or m.group(2) or m.group(3) or "", i)

    def _section_end(self, start: int) -> int:
        for i in range(start + 1, len(self.lines)):
            if _HEADER.match(self.lines[i]) and not self.lines[i].lstrip().startswith("[ "):
                return i
        return len(self.lines)

    def _key_in(self, start: int, end: int, key: str) -> int | None:
        pattern = re.compile(
            rf"""\s*(?:{re.escape(key)}|"{re.escape(key)}"|'{re.escape(key)}')\s*="""
        )
        for i in range(start, end):
            if pattern.match(self.lines[i]):
                return i
        return None

    def top(self, key: str) -> int | None:
        first = next((i for i, line in enumerate(self.lines) if _HEADER.match(line)), None)
        found = self._key_in(0, len(self.lines) if first is None else first, key)
        if found is None:  # a table header: [key] or [key.sub]
            pattern = re.compile(rf"\s*\[+\s*{re.escape(key)}\s*[.\]]")
            found = next((i for i, ln in enumerate(self.lines) if pattern.match(ln)), None)
        return found

    def tenant(self, index: int, *keys: str | None) -> int | None:
        """The line of the first of ``keys`` in the ``index``-th [[tenant]] (its header
        line when none is found there)."""
        if index >= len(self.tenants):
            return None
        start = self.tenants[index]
        end = self._section_end(start)
        for key in keys:
            found = None if key is None else self._key_in(start + 1, end, key)
            if found is not None:
                return found
        return start

    def klass(self, name: str, key: str | None = None) -> int | None:
        start = self.classes.get(name)
        if start is None or key is None:
            return start
        found = self._key_in(start + 1, self._section_end(start), key)
        return start if found is None else found


class _Reader:
    def __init__(self, label: str, text: str, base: Path, environ: Mapping[str, str]) -> None:
        self.label = label
        self.where = _Lines(text)
        self.base = base
        self.environ = environ

    def fail(self, line: int | None, message: str) -> TenantsFileError:
        at = f"line {line + 1}: " if line is not None else ""
        return TenantsFileError(f"{self.label}: {at}{message}")

    def read(
        self, doc: Mapping[str, Any], from_keys: Sequence[Tenant]
    ) -> tuple[list[Tenant], dict[str, TenantClass]]:
        """The file's tenants and classes, in file order: the first mistake is the one
        told. Names and keys are checked against ``from_keys`` (``--api-key``'s) too."""
        for key in doc:
            if key not in _TOP:
                raise self.fail(
                    self.where.top(key), f"unknown key {key!r} (want [[tenant]] or [classes.NAME])"
                )
        classes = self._classes(doc.get("classes", {}))
        raw = doc.get("tenant", [])
        if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
            raise self.fail(self.where.top("tenant"), "tenant must be [[tenant]] tables")
        seen_names: dict[str, int] = {t.name: -1 for t in from_keys}
        seen_keys: dict[str, str] = {t.key: t.name for t in from_keys}
        tenants = []
        for i, table in enumerate(raw):
            tenant = self._tenant(i, table)
            other = seen_names.get(tenant.name)
            if other is not None:
                first = (
                    "an --api-key key's name"
                    if other < 0
                    else f"tenant #{other + 1}'s (line {(self.where.tenant(other) or 0) + 1})"
                )
                raise self.fail(
                    self.where.tenant(i, "name"), f'tenant "{tenant.name}": the name is {first}'
                )
            seen_names[tenant.name] = i
            owner = seen_keys.get(tenant.key)
            if owner is not None:
                raise self.fail(
                    self.where.tenant(i, *_KEY_SOURCES),
                    f'tenant "{tenant.name}": the same key as tenant "{owner}" '
                    "(each key is one tenant)",
                )
            seen_keys[tenant.key] = tenant.name
            tenants.append(tenant)
        return tenants, classes

    def _classes(self, raw: Any) -> dict[str, TenantClass]:
        if not isinstance(raw, dict) or not all(isinstance(c, dict) for c in raw.values()):
            raise self.fail(self.where.top("classes"), "classes must be [classes.NAME] tables")
        out: dict[str, TenantClass] = {}
        for name, table in raw.items():

            def fail(key: str | None, message: str, name: str = name) -> TenantsFileError:
                return self.fail(self.where.klass(name, key), f"class {name!r}: {message}")

            if not name:
                raise fail(None, "a class needs a name")
            for key in table:
                if key not in _CLASS_KEYS:
                    raise fail(
                        key, f"unknown key {key!r} (known: {', '.join(sorted(_CLASS_KEYS))})"
                    )
            priority = table.get("priority", 0)
            if not _is_int(priority):
                raise fail("priority", "priority must be a whole number")
            reserved = table.get("reserved_slots", 0)
            if not _is_int(reserved) or reserved < 0:
                raise fail("reserved_slots", "reserved_slots must be a whole number >= 0")
            default_max = table.get("default_max_tokens", TenantClass(name).default_max_tokens)
            if not _is_int(default_max) or default_max <= 0:
                raise fail("default_max_tokens", "default_max_tokens must be a whole number > 0")
            out[name] = TenantClass(name, priority, reserved, default_max)
        return out

    def _tenant(self, index: int, table: Mapping[str, Any]) -> Tenant:
        where = self.where.tenant
        raw_name = table.get("name")
        label = f'tenant "{raw_name}"' if isinstance(raw_name, str) else f"tenant #{index + 1}"

        def fail(key: str | None, message: str) -> TenantsFileError:
            return self.fail(where(index, key), f"{label}: {message}")

        for key in table:
            if key not in _TENANT_KEYS:
                raise fail(key, f"unknown key {key!r} (known: {', '.join(sorted(_TENANT_KEYS))})")
        if raw_name is None:
            raise fail(None, "name is missing")
        if not isinstance(raw_name, str) or not _NAME.fullmatch(raw_name):
            raise fail(
                "name",
                "name must be 1 to 64 letters, digits, '.', '_', '-' or '@' "
                "(starting with a letter or digit)",
            )
        sources = [k for k in _KEY_SOURCES if k in table]
        if len(sources) != 1:
            raise fail(
                sources[1] if len(sources) > 1 else None,
                "give exactly one of key, key_env, key_file",
            )
        key = self._key(sources[0], table[sources[0]], fail)
        klass = table.get("class", DEFAULT_CLASS)
        if not isinstance(klass, str) or not klass:
            raise fail("class", "class must be a non-empty string")
        weight = table.get("weight", 1.0)
        if (
            isinstance(weight, bool)
            or not isinstance(weight, int | float)
            or not math.isfinite(weight)
            or weight <= 0
        ):
            raise fail("weight", "weight must be a positive number")
        models = table.get("models", ["*"])
        if not isinstance(models, list) or not all(isinstance(m, str) and m for m in models):
            raise fail("models", "models must be a list of model names or globs")
        admin = table.get("admin", False)
        if not isinstance(admin, bool):
            raise fail("admin", "admin must be true or false")
        limits: dict[str, int] = {}
        for name in _LIMITS:
            value = table.get(name)
            if value is not None and (not _is_int(value) or value <= 0):
                raise fail(name, f"{name} must be a whole number > 0")
            if value is not None:
                limits[name] = value
        return Tenant(
            raw_name,
            key,
            klass=klass,
            weight=float(weight),
            models=tuple(models),
            admin=admin,
            limits=Limits(**limits),
        )

    def _key(self, source: str, value: Any, fail: Any) -> str:
        if not isinstance(value, str) or not value:
            raise fail(source, f"{source} must be a non-empty string")
        if source == "key":
            key = value
        elif source == "key_env":
            key = self.environ.get(value, "")
            if not key.strip():
                raise fail(source, f"key_env: the environment variable {value} is not set")
        else:
            path = Path(value).expanduser()
            path = path if path.is_absolute() else self.base / path
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                raise fail(source, f"cannot read key_file '{path}': {reason}") from None
            key = text.splitlines()[0] if text.strip() else ""
        key = key.strip()
        if not key:
            raise fail(source, f"{source}: the key is empty")
        if any(ord(c) < 0x20 or ord(c) == 0x7F or c.isspace() for c in key):
            raise fail(source, f"{source}: the key holds a space or a control character")
        return key


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_tenants(
    text: str,
    *,
    label: str,
    base: Path,
    environ: Mapping[str, str],
    keys: Sequence[str] = (),
    names: Sequence[str] = (),
) -> Tenants:
    """The tenants ``text`` lists (``label`` names the file in messages; ``key_file``
    paths are relative to ``base``), plus the ``--api-key`` keys as admin tenants."""
    reader = _Reader(label, text, base, environ)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = _DECODE_AT.match(str(exc))
        if found is None:
            raise TenantsFileError(f"{label}: not valid TOML: {exc}") from None
        message, line = found.group(1), int(found.group(2))
        raise TenantsFileError(
            f"{label}: line {line}: not valid TOML: {message[:1].lower()}{message[1:]}"
        ) from None
    from_keys = Tenants.from_keys(keys, names).tenants
    tenants, classes = reader.read(doc, from_keys)
    if not tenants and not from_keys:
        raise TenantsFileError(f"{label}: no [[tenant]]: the file lists no tenant and no key")
    return Tenants(
        (*from_keys, *tenants),
        {DEFAULT_CLASS: TenantClass(DEFAULT_CLASS), **classes},
        from_file=True,
    )


def read_tenants(
    path: Path,
    environ: Mapping[str, str],
    keys: Sequence[str] = (),
    names: Sequence[str] = (),
) -> Tenants:
    """Read the tenants file ``path``; `TenantsFileError` with one line if it cannot be."""
    label = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TenantsFileError(
            f"cannot read the tenants file '{path}': {exc.strerror or exc}"
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TenantsFileError(f"{label}: not UTF-8 text: {exc.reason}") from None
    return parse_tenants(
        text, label=label, base=path.parent, environ=environ, keys=keys, names=names
    )
