"""A reload whose stops are all done swaps in the new model list (upstream's reload,
after its stops), and everyone who asked for it is answered."""

from __future__ import annotations

from troupe.sched.effects import Reloaded
from troupe.sched.events import CatalogReloaded
from troupe.sched.phase import Phase, Restart
from troupe.sched.reasons import StopCause, StopReason
from troupe.sched.rules.parts import Rule

__all__ = ["FinishReload"]


class FinishReload(Rule):
    def due(self) -> bool:
        pending = self.p.changes.reload
        if pending is None:
            return False
        table = self.p.table
        return not any((m := table.get(n)) is not None and m.is_running for n in pending.restart)

    def run(self, now: float) -> None:
        p = self.p
        table, changes = p.table, p.changes
        pending = changes.reload
        assert pending is not None
        changes.reload = None
        fresh = {c.name: c for c in pending.models}
        for name, m in list(table.models.items()):
            if name not in fresh:
                p.forget_measurement(name)
                if m.is_running:
                    table.retire(name)  # dropped once its child is gone
                    p.children.stop(m, StopCause(StopReason.DROPPED), now)
                else:
                    table.drop(name)
        for name, config in fresh.items():
            existing = table.get(name)
            if existing is None or existing.config.fingerprint != config.fingerprint:
                p.forget_measurement(name)  # a new command line: measured again
                if p.projections is not None and config.need:
                    p.projections.add([name])
            if existing is None:
                table.add(config)
                continue
            m = existing
            if p.memory is not None and m.config.fingerprint != config.fingerprint:
                p.memory.ledger.effective.pop(name, None)  # seen under another command line
            m.config = config
            if not changes.removing(name):
                table.keep(name)
            if not m.is_running:
                m.exit_code = 0  # a reload clears "failed"
                m.crashes.clear()
                m.held_until = None
                if m.restart is not Restart.OOM:
                    m.move(Phase.UNLOADED)  # a start on a narrower lane is called off
        if p.memory is not None:
            for config in fresh.values():
                p.apply_estimate(config)
        p.out.emit(CatalogReloaded())
        p.out.add(Reloaded(pending.rid, tuple(pending.rids)))
        for rid in pending.rids:
            p.out.reply(rid, None)
