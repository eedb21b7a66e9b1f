"""Building the catalog: sources, precedence, aliases, hidden entries, startup check."""

from __future__ import annotations

from pathlib import Path

import pytest
from catalog_trees import BuildFn, add_repo, touch

from troupe.catalog import Architecture, ModelEntry, Source, restart_on_reload
from troupe.errors import ConfigError

BIN = "/opt/llama-server"


def args_of(build_result: object, name: str, port: int = 0) -> list[str]:
    cat = build_result
    entry = cat.get(name)  # type: ignore[attr-defined]
    assert entry is not None
    return cat.child_args(entry, port, bin_path=BIN)[1:]  # type: ignore[attr-defined, no-any-return]


def test_sources_names_and_order(tmp_path: Path, build: BuildFn) -> None:
    add_repo(tmp_path / "cache", "ggml-org/x", ["x-Q8_0.gguf", "x-F16.gguf"])
    touch(tmp_path / "models", "b.gguf", "Zed/zed-Q4_0.gguf")
    cat = build(models_dir="models", ini="[a]\nmodel = /m/a.gguf\n[b]\nctx-size = 8\n")
    assert [(e.name, e.source) for e in cat] == [
        ("Zed", Source.MODELS_DIR),  # byte order: upper case first
        ("a", Source.PRESET),
        ("b", Source.PRESET),  # merged over the models-dir entry: last writer
        ("ggml-org/x:F16", Source.CACHE),
        ("ggml-org/x:Q8_0", Source.CACHE),
    ]
    b = cat.get("b")
    assert b is not None
    assert b.preset.get("LLAMA_ARG_MODEL") == "models/b.gguf"
    assert b.model_path == tmp_path / "models" / "b.gguf"
    assert [e.can_remove for e in cat] == [False, False, False, True, True]


def test_rendered_args_and_status_preset_of_a_cache_model(tmp_path: Path, build: BuildFn) -> None:
    add_repo(tmp_path / "cache", "ggml-org/x", ["x-Q8_0.gguf"])
    cat = build(cli=["--temp", "0.8", "--seed", "42", "--no-slots", "-c", "1024"])
    entry = cat.get("ggml-org/x:Q8_0")
    assert entry is not None
    assert cat.child_args(entry, 0, bin_path=BIN) == [
        BIN,
        "--host",
        "127.0.0.1",
        "--log-colors",
        "off",
        "--port",
        "0",
        "--no-slots",
        "--temperature",
        "0.8",
        "--alias",
        "ggml-org/x:Q8_0",
        "--ctx-size",
        "1024",
        "--hf-repo",
        "ggml-org/x:Q8_0",
        "--seed",
        "42",
    ]
    assert cat.status_preset(entry) == (
        "[ggml-org/x:Q8_0]\n"
        "log-colors = off\n"
        "slots = 0\n"
        "temperature = 0.8\n"
        "ctx-size = 1024\n"
        "hf-repo = ggml-org/x:Q8_0\n"
        "seed = 42\n"
        "\n"
    )
    assert cat.child_args(entry, 41234, bin_path=BIN, log_colors=True, app_cmd="serve")[:8] == [
        BIN,
        "serve",
        "--host",
        "127.0.0.1",
        "--log-colors",
        "on",
        "--port",
        "41234",
    ]
    assert cat.child_args(entry, 1, bin_path="", app_cmd="serve")[0] == "--host"


def test_precedence_cli_over_section_over_global(tmp_path: Path, build: BuildFn) -> None:
    add_repo(tmp_path / "cache", "o/r", ["r-Q4_0.gguf"])
    ini = (
        "[*]\nctx-size = 100\nn-predict = 5\nbatch-size = 7\n"
        "[m]\nmodel = m.gguf\nctx-size = 200\nn-predict = 6\n"
    )
    cat = build(ini=ini, cli=["--n-predict", "9"])
    assert args_of(cat, "m")[-8:] == [
        "--batch-size",
        "7",
        "--ctx-size",
        "200",
        "--model",
        "m.gguf",
        "--n-predict",
        "9",
    ]
    # [*] reaches cache entries too
    assert "--batch-size" in args_of(cat, "o/r:Q4_0")
    assert args_of(cat, "o/r:Q4_0")[args_of(cat, "o/r:Q4_0").index("--ctx-size") + 1] == "100"


def test_ini_section_merges_over_cache_entry(tmp_path: Path, build: BuildFn) -> None:
    add_repo(tmp_path / "cache", "o/r", ["r-Q4_K_M.gguf"])
    cat = build(ini="[o/r:q4_k_m]\nalias = short\nstop-timeout = 3\n")
    (entry,) = cat.entries
    assert entry.name == "o/r:Q4_K_M"
    assert entry.source is Source.PRESET
    assert entry.preset.get("LLAMA_ARG_HF_REPO") == "o/r:Q4_K_M"
    assert entry.aliases == {"short"}
    assert entry.stop_timeout == 3
    assert not entry.can_remove


def test_reserved_options_never_reach_children(build: BuildFn) -> None:
    ini = (
        "[m]\nmodel = m.gguf\nlog-file = /tmp/m.log\napi-key = secret\n"
        "ssl-key-file = k.pem\nmodels-max = 9\nhost = 0.0.0.0\nport = 1\n"
    )
    cat = build(
        ini=ini,
        cli=[
            "-m",
            "router.gguf",
            "--mmproj",
            "p.gguf",
            "-a",
            "foo",
            "-hf",
            "o/r",
            "--log-file",
            "/tmp/router.log",
            "--api-key",
            "k",
            "--models-max",
            "2",
            "--no-models-autoload",
            "--ssl-cert-file",
            "c.pem",
            "--host",
            "0.0.0.0",
            "--port",
            "9000",
            "--api-prefix",
            "/v",
        ],
    )
    assert args_of(cat, "m", 5555) == [
        "--api-prefix",
        "/v",
        "--host",
        "127.0.0.1",
        "--log-colors",
        "off",
        "--log-file",
        "/tmp/m.log",
        "--port",
        "5555",
        "--alias",
        "m",
        "--model",
        "m.gguf",
    ]
    entry = cat.get("m")
    assert entry is not None
    assert cat.status_preset(entry) == (
        "[m]\napi-prefix = /v\nlog-colors = off\nlog-file = /tmp/m.log\nmodel = m.gguf\n\n"
    )


def test_flags_render_negative_or_drop(build: BuildFn) -> None:
    ini = (
        "[m]\nmodel = m.gguf\nswa-full = off\noffline = true\njinja = disabled\n"
        "context-shift = maybe\nno-perf = 0\nLLAMA_ARG_NO_CONT_BATCHING = 1\n"
    )
    assert args_of(build(ini=ini), "m") == [
        "--context-shift",  # not falsey: the plain flag
        "--host",
        "127.0.0.1",
        "--no-jinja",
        "--log-colors",
        "off",
        "--offline",
        "--perf",  # no-perf = 0 is perf = true
        "--port",
        "0",
        "--alias",
        "m",
        "--cont-batching",  # an LLAMA_ARG_NO_* key is not inverted upstream
        "--model",
        "m.gguf",
    ]  # swa-full = off has no negative spelling: dropped


def test_two_valued_option_cannot_render(build: BuildFn) -> None:
    with pytest.raises(ConfigError) as info:
        build(ini="[m]\ncontrol-vector-layer-range = 1 2\n")
    assert str(info.value) == (
        "common_preset::to_args(): option '--control-vector-layer-range' has two values, "
        "which is not supported yet"
    )


def test_status_preset_keeps_preset_only_keys_and_escapes_newlines(build: BuildFn) -> None:
    cat = build(
        ini="[m]\ntags = x, y\nalias = a1\nload-on-startup = on\nttl = 30\n",
        cli=["--api-prefix", "/a\nb"],
    )
    entry = cat.get("m")
    assert entry is not None
    assert cat.status_preset(entry, log_colors=True) == (
        "[m]\napi-prefix = /a\\\nb\nlog-colors = on\nload-on-startup = on\nttl = 30\n\n"
    )
    assert entry.tags == {"x", "y"}
    assert entry.sorted_aliases == ("a1",)
    assert entry.load_on_startup
    assert entry.ttl == 30


def test_aliases_and_tags_parsing(build: BuildFn) -> None:
    cat = build(ini="[m]\nalias = b , a,,\t c ,a\ntags = t2,T1, \n")
    entry = cat.get("m")
    assert entry is not None
    assert entry.sorted_aliases == ("a", "b", "c")
    assert entry.sorted_tags == ("T1", "t2")
    # the child knows only its canonical name
    args = cat.child_args(entry, 0, bin_path=BIN)
    assert args[args.index("--alias") + 1] == "m"
    assert args[args.index("--tags") + 1] == "t2,T1,"
    assert cat.resolve("m") is entry
    assert cat.resolve("c") is entry
    assert cat.resolve("M") is None
    assert cat.resolve("nope") is None


@pytest.mark.parametrize(
    ("ini", "message"),
    [
        ("[a]\nalias = b\n[b]\n", "model name 'b' conflicts with alias of model 'a'"),
        ("[a]\n[b]\nalias = a\n", "alias 'a' for model 'b' conflicts with existing model name"),
        (
            "[a]\nalias = x\n[b]\nalias = y,x\n",
            "alias 'x' for model 'b' conflicts with alias of model 'a'",
        ),
    ],
)
def test_alias_conflicts_are_fatal_on_first_load(ini: str, message: str, build: BuildFn) -> None:
    with pytest.raises(ConfigError) as info:
        build(ini=ini)
    assert str(info.value) == message


def test_alias_equal_to_own_name_is_fine(build: BuildFn) -> None:
    entry = build(ini="[a]\nalias = a\n").get("a")
    assert entry is not None
    assert entry.aliases == {"a"}


def test_alias_conflicts_are_skipped_on_reload(build: BuildFn) -> None:
    ini = "[a]\nalias = b,x,y\n[b]\nalias = x,z\n[c]\nalias = z,y\n"
    cat = build(ini=ini, reload=True)
    assert [sorted(e.aliases) for e in cat] == [["x", "y"], ["z"], []]
    assert cat.warnings == (
        "(reload) alias 'b' for model 'a' conflicts with model 'b', skipping",
        "(reload) alias 'x' for model 'b' conflicts with model 'a', skipping",
        "(reload) alias 'y' for model 'c' conflicts with model 'a', skipping",
        "(reload) alias 'z' for model 'c' conflicts with model 'b', skipping",
    )


@pytest.mark.parametrize(
    ("value", "seconds", "warned"),
    [("5", 5, False), (" 7s", 7, False), ("-3", -3, False), ("abc", 10, True), ("", 10, True)],
)
def test_stop_timeout(value: str, seconds: int, warned: bool, build: BuildFn) -> None:
    cat = build(ini=f"[m]\nstop-timeout = {value}\n[n]\n")
    assert [e.stop_timeout for e in cat] == [seconds, 10]
    expected = (f"invalid stop-timeout value '{value}' for model 'm', using default 10 seconds",)
    assert cat.warnings == (expected if warned else ())


def test_stop_timeout_from_global_section(build: BuildFn) -> None:
    assert [e.stop_timeout for e in build(ini="[*]\nstop-timeout = 2\n[m]\n[n]\n")] == [2, 2]


def test_troupe_keys_pin_and_ttl(build: BuildFn) -> None:
    cat = build(ini="[a]\npin = true\nttl = 0\n[b]\npin = yes\n[c]\n")
    assert [(e.pin, e.ttl) for e in cat] == [(True, 0), (False, None), (False, None)]
    with pytest.raises(ConfigError) as info:
        build(ini="[m]\nttl = -1\n")
    assert str(info.value) == (
        "invalid value '-1' for 'ttl' in preset 'm': expected a whole number of seconds >= 0"
    )


def test_troupe_key_kv_store(build: BuildFn) -> None:
    cat = build(ini="[a]\nkv-store = off\n[b]\nkv-store = on\n[c]\n")
    assert [e.kv_store for e in cat] == [False, True, True]
    with pytest.raises(ConfigError) as info:
        build(ini="[m]\nkv-store = maybe\n")
    assert (
        str(info.value) == "invalid value 'maybe' for 'kv-store' in preset 'm': expected on or off"
    )


def test_load_on_startup_limit(build: BuildFn) -> None:
    ini = "[a]\nload-on-startup = true\n[b]\nload-on-startup = 1\n[c]\nload-on-startup = yes\n"
    cat = build(ini=ini, models_max=2)
    assert cat.startup_models() == ("a", "b")
    with pytest.raises(ConfigError) as info:
        build(ini=ini, models_max=1)
    assert str(info.value) == "number of models to load on startup (2) exceeds models_max (1)"
    # the quirk: "unlimited" (0) fails as soon as one model loads on startup
    with pytest.raises(ConfigError, match=r"\(2\) exceeds models_max \(0\)"):
        build(ini=ini, models_max=0)
    assert build(ini=ini, models_max=0, reload=True).startup_models() == ("a", "b")


def test_dedup_cache_models_hides_pure_cache_entries(tmp_path: Path, build: BuildFn) -> None:
    cache = tmp_path / "cache"
    add_repo(cache, "o/main", ["m-Q4_K_M.gguf", "m-Q8_0.gguf"])
    add_repo(cache, "o/draft", ["d-Q4_0.gguf", "d-F16.gguf"])
    ini = (
        "[mine]\nhf-repo = o/main:q4_k_m\nspec-draft-hf = o/draft\n"
        "spec-draft-model = d-F16.gguf\ndedup-cache-models = true\n"
        "[o/main:Q8_0]\nctx-size = 1\n"  # merged with its cache entry: never hidden
    )
    cat = build(ini=ini)
    assert [(e.name, e.hidden) for e in cat] == [
        ("mine", False),
        ("o/draft:F16", True),
        ("o/draft:Q4_0", False),
        ("o/main:Q4_K_M", True),
        ("o/main:Q8_0", False),
    ]
    assert [e.name for e in cat.visible()] == ["mine", "o/draft:Q4_0", "o/main:Q8_0"]
    assert cat.resolve("o/main:Q4_K_M") is not None  # hidden, still usable


def test_dedup_from_global_section(tmp_path: Path, build: BuildFn) -> None:
    add_repo(tmp_path / "cache", "o/r", ["r-Q4_K_M.gguf"])
    cat = build(ini="[*]\ndedup-cache-models = on\n[mine]\nhf-repo = o/r\n")
    assert [(e.name, e.hidden) for e in cat] == [("mine", False), ("o/r:Q4_K_M", True)]


def test_dedup_with_a_malformed_repo_is_fatal(tmp_path: Path, build: BuildFn) -> None:
    add_repo(tmp_path / "cache", "o/r", ["r-Q4_K_M.gguf"])
    with pytest.raises(ConfigError, match="invalid HF repo format"):
        build(ini="[m]\nhf-repo = just-a-name\ndedup-cache-models = 1\n")


def test_local_files_of_entries(tmp_path: Path, build: BuildFn) -> None:
    snap = add_repo(tmp_path / "cache", "o/vis", ["v-Q4_K_M.gguf", "mmproj-v-F16.gguf"])
    touch(tmp_path / "models", "d/d-Q4_0.gguf", "d/mmproj-d.gguf")
    ini = "[off]\nhf-repo = o/vis\nno-mmproj = true\n[rel]\nmodel = ../x.gguf\nmmproj = p.gguf\n"
    cat = build(ini=ini, models_dir="models")
    files = {e.name: (e.model_path, e.mmproj_path) for e in cat}
    assert files == {
        "d": (tmp_path / "models/d/d-Q4_0.gguf", tmp_path / "models/d/mmproj-d.gguf"),
        "o/vis:Q4_K_M": (snap / "v-Q4_K_M.gguf", snap / "mmproj-v-F16.gguf"),
        "off": (snap / "v-Q4_K_M.gguf", None),
        "rel": (tmp_path / "../x.gguf", tmp_path / "p.gguf"),
    }


def test_architecture_probe_hook(build: BuildFn) -> None:
    def probe(entry: ModelEntry) -> Architecture:
        if entry.name == "bad":
            raise OSError("unreadable")
        return Architecture(("text", "image"), ("text",))

    cat = build(ini="[bad]\n[good]\n", probe=probe)
    assert [e.architecture.to_json() for e in cat] == [
        {"input_modalities": ["text"], "output_modalities": ["text"]},
        {"input_modalities": ["text", "image"], "output_modalities": ["text"]},
    ]
    assert build(ini="[m]\n").entries[0].architecture == Architecture()


def test_errors_from_sources(tmp_path: Path, build: BuildFn) -> None:
    with pytest.raises(ConfigError, match=r"^option 'nope' not recognized in preset 'm'$"):
        build(ini="[m]\nnope = 1\n")
    with pytest.raises(ConfigError, match=r"failed to parse server config file: presets\.ini"):
        build(ini="[m\n")
    with pytest.raises(ConfigError, match=r"^error: 'gone' does not exist or is not a directory$"):
        build(models_dir="gone")


def test_empty_catalog(build: BuildFn) -> None:
    cat = build()
    assert len(cat) == 0
    assert cat.names == ()


def test_restart_on_reload(build: BuildFn) -> None:
    before = build(ini="[a]\nctx-size = 1\nalias = x\n[b]\nctx-size = 1\n[c]\n")
    after = build(ini="[a]\nctx-size = 1\nalias = y\n[b]\nctx-size = 2\n", reload=True)
    decisions = {e.name: restart_on_reload(e, after.get(e.name)) for e in before}
    assert decisions == {"a": False, "b": True, "c": True}


def test_a_preset_whose_model_file_is_missing_is_warned_about_at_start(
    tmp_path: Path, build: BuildFn
) -> None:
    touch(tmp_path / "m", "here.gguf")
    gone = tmp_path / "m" / "gone.gguf"
    cat = build(ini=f"[here]\nmodel = {tmp_path / 'm' / 'here.gguf'}\n[gone]\nmodel = {gone}\n")
    assert [e.name for e in cat] == ["gone", "here"]  # served: upstream fails its first load
    assert cat.warnings == (
        f"preset section [gone]: model file {gone}: no such file "
        "(its requests fail until it exists)",
    )


def test_an_empty_catalog_starts_with_a_warning_as_upstream(build: BuildFn) -> None:
    cat = build()
    assert len(cat) == 0
    (warning,) = cat.warnings
    assert warning.startswith("no models: give --models-dir DIR or --models-preset FILE")
