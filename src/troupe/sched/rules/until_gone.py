"""Ollama's ``keep_alive: 0`` with nothing to generate is answered once the child it
made go is gone."""

from __future__ import annotations

from troupe.sched.rules.parts import Rule

__all__ = ["UntilGone"]


class UntilGone(Rule):
    def due(self) -> bool:
        return bool(self.p.requests.until_gone)

    def run(self, now: float) -> None:
        p = self.p
        for rid, (model, gen) in list(p.requests.until_gone.items()):
            m = p.table.get(model)
            if m is None or m.gen != gen or not m.is_running:  # that child is gone
                del p.requests.until_gone[rid]
                p.out.reply(rid, None)
