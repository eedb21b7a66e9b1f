"""Operations: Prometheus metrics, every model's log, the dashboard, the ready line.

Kept apart from the request path: the scheduler feeds it through listeners, the relay
through one call, and its routes are registered on the router's own app.
"""
