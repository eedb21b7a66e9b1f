"""The chaos harness: ``python bench/chaos/run.py --help``.

Modules: `runner` (the loop, before/after each scenario), `scenario` (what a scenario
gets), `scenarios/` (grouped by kind), `invariants` (what must hold after each),
`client` (a raw-socket HTTP client that can misbehave), `procs` (processes from
outside: descendants, descriptors, orphans), `routers` (starting troupe or
llama.cpp's router), `report` (output).
"""
