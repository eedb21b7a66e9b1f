"""The tenants file (``--tenants``): what it reads into the book, and the one line a file
troupe cannot use gets (the file, the line, the tenant, the key; never a key's value).
A bad file at start ends ``troupe serve`` with that line and a non-zero exit."""

from __future__ import annotations

from pathlib import Path

import pytest

from troupe.tenants.file import TenantsFileError, parse_tenants, read_tenants
from troupe.tenants.model import Limits, TenantClass
from troupe_rig.cli import assert_one_line_error, run_troupe

GOOD = """\
[classes.interactive]   # line 1
priority = 10
reserved_slots = 1
default_max_tokens = 512

[[tenant]]              # line 6
name = "alice"
key = "sk-alice-SECRET"
class = "interactive"
weight = 2
models = ["gemma*", "tiny-a"]
max_parallel = 4
requests_per_minute = 60
tokens_per_minute = 20000
tokens_per_day = 1000000

[[tenant]]              # line 17
name = "bob"
key_env = "BOB_KEY"
admin = true

[[tenant]]              # line 22
name = "carol"
key_file = "carol.key"
"""
ENV = {"BOB_KEY": "sk-bob-SECRET"}


def parse(text: str, env: dict[str, str] | None = None, keys: tuple[str, ...] = ()) -> object:
    return parse_tenants(
        text, label="tenants.toml", base=Path("/nonexistent"), environ=env or ENV, keys=keys
    )


def test_a_good_file_reads_into_the_book(tmp_path: Path) -> None:
    (tmp_path / "carol.key").write_text("sk-carol-SECRET\nignored\n")
    path = tmp_path / "tenants.toml"
    path.write_text(GOOD)
    book = read_tenants(path, ENV, keys=("sk-cli",), names=("cli",))
    assert book.from_file
    assert [t.name for t in book.tenants] == ["cli", "alice", "bob", "carol"]
    alice, bob, carol = (book.named(n) for n in ("alice", "bob", "carol"))
    assert alice is not None
    assert bob is not None
    assert carol is not None
    assert book.classes["interactive"] == TenantClass("interactive", 10, 1, 512)
    assert (alice.klass, alice.weight, alice.admin) == ("interactive", 2.0, False)
    assert alice.limits == Limits(4, 60, 20000, 1000000)
    assert alice.may_use("gemma-3-270m")
    assert alice.may_use("tiny-a")
    assert not alice.may_use("tiny-b")
    assert (bob.admin, bob.models, bob.limits) == (True, ("*",), Limits())
    assert (carol.klass, carol.admin) == ("default", False)
    # Keys: matched, never shown.
    assert book.match("sk-carol-SECRET") is carol
    assert book.match("sk-bob-SECRET") is bob
    assert book.match("sk-cli") is book.named("cli")
    assert book.match("sk-alice") is None
    assert "SECRET" not in repr(book)
    # Rights and privacy from the file.
    assert book.allows("alice", ["tiny-a"])
    assert not book.allows("alice", ["tiny-b"])
    assert book.allows("alice", ["tiny-b", "tiny-a"])  # an alias she may use
    assert not book.allows("gone", ["tiny-a"])  # a tenant a reload removed
    assert book.may_admin("bob")
    assert book.may_admin("cli")
    assert not book.may_admin("alice")
    assert (book.owner("alice"), book.viewer("alice"), book.viewer("bob")) == ("alice", "alice", "")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("weight = 2", "weight = 0"), 'line 10: tenant "alice": weight must be a positive number'),
        (("weight = 2", 'weight = "x"'), 'line 10: tenant "alice": weight must be a positive'),
        (("weight = 2", "modles = []"), "line 10: tenant \"alice\": unknown key 'modles'"),
        (("priority = 10", "prio = 10"), "line 2: class 'interactive': unknown key 'prio'"),
        (("priority = 10", "priority = 1.5"), "line 2: class 'interactive': priority must be"),
        (('name = "bob"', 'name = "alice"'), 'line 18: tenant "alice": the name is tenant #1\'s'),
        (('key_env = "BOB_KEY"', 'key = "sk-alice-SECRET"'), 'line 19: tenant "bob": the same key'),
        (('key_env = "BOB_KEY"', 'key_env = "NOPE"'), 'line 19: tenant "bob": key_env: the'),
        (('key_env = "BOB_KEY"', ""), 'line 17: tenant "bob": give exactly one of key'),
        (("admin = true", 'key = "x"'), 'line 19: tenant "bob": give exactly one of key'),
        (("admin = true", 'admin = "yes"'), 'line 20: tenant "bob": admin must be true or false'),
        (('models = ["gemma*", "tiny-a"]', 'models = "tiny-a"'), 'line 11: tenant "alice": models'),
        (("max_parallel = 4", "max_parallel = 0"), 'line 12: tenant "alice": max_parallel must'),
        (('name = "carol"', 'name = "ca rol"'), 'line 23: tenant "ca rol": name must be'),
        (('name = "carol"', ""), "line 22: tenant #3: name is missing"),
        (("weight = 2", "weight = = 2"), "line 10: not valid TOML: invalid value"),
        (("[[tenant]]              # line 17", "[[tenants]]"), "line 17: unknown key 'tenants'"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_line(change: tuple[str, str], expected: str) -> None:
    old, new = change
    assert old in GOOD
    with pytest.raises(TenantsFileError) as caught:
        parse(GOOD.replace(old, new, 1))
    message = str(caught.value)
    assert message.startswith("tenants.toml: " + expected), message
    assert "\n" not in message
    assert "SECRET" not in message


def test_keys_clash_with_the_command_lines_keys() -> None:
    text = '[[tenant]]\nname = "alice"\nkey = "sk-cli"\n'
    with pytest.raises(
        TenantsFileError, match='line 3: tenant "alice": the same key as tenant "key-1"'
    ):
        parse(text, keys=("sk-cli",))
    text = '[[tenant]]\nname = "key-1"\nkey = "k"\n'
    with pytest.raises(TenantsFileError, match='line 2: tenant "key-1": the name is an --api-key'):
        parse(text, keys=("other",))


def test_a_file_with_no_tenant_and_no_key_is_refused() -> None:
    with pytest.raises(TenantsFileError, match="no \\[\\[tenant\\]\\]"):
        parse("[classes.batch]\npriority = 0\n")
    assert len(parse("", keys=("k",))) == 1  # type: ignore[arg-type]


def test_serve_refuses_a_bad_file_with_one_line(fake_engine_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text(GOOD.replace("weight = 2", "weight = -1"))
    args = ("serve", "--engine", str(fake_engine_path), "--models-dir", str(tmp_path))
    done = run_troupe(*args, "--tenants", str(path), env=ENV)
    assert_one_line_error(
        done, f'{path}: line 10: tenant "alice": weight must be a positive number'
    )
    assert "SECRET" not in done.stderr
    missing = run_troupe(*args, "--tenants", str(tmp_path / "nope.toml"))
    assert_one_line_error(missing, "cannot read the tenants file", "nope.toml")
    # The same from the environment and from the config file.
    done = run_troupe(*args, env={**ENV, "TROUPE_TENANTS": str(path)})
    assert_one_line_error(done, "line 10:")
    config = tmp_path / "troupe.toml"
    config.write_text('[troupe]\ntenants = "tenants.toml"\n')
    done = run_troupe(*args, "--config", str(config), env=ENV)
    assert_one_line_error(done, f"{path}: line 10:")
