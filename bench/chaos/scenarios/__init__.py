"""Every scenario, in the order the harness runs them, grouped by kind in modules:
`faults` (children that fail), `lifecycle` (the router itself killed, restarted,
stopped), `traffic` (clients: storms, churn, idle connections), `connections`
(connections an attacker holds: slowloris, bodies never sent, trickled), `catalog`
(reload and removal abandoned mid-way), `malformed` (raw bad bytes)."""

from __future__ import annotations

from chaos.scenario import Scenario
from chaos.scenarios import catalog, connections, faults, lifecycle, malformed, traffic

SCENARIOS: list[Scenario] = [
    *faults.SCENARIOS,
    *lifecycle.SCENARIOS,
    *traffic.SCENARIOS,
    *connections.SCENARIOS,
    *catalog.SCENARIOS,
    *malformed.SCENARIOS,
]
