"""Bothy Notify: a self-hosted notification daemon on Trio and PostgreSQL.

The package layout follows the architecture (``docs/architecture.md``):

- :mod:`bothy_notify.kernel`: ports shared by modules (presence, ephemeral
  publishing, clock, IDs, metrics) and nothing else.
- :mod:`bothy_notify.notify`: the pure decision, the consumer round, live
  routes and the notify job handlers.
- :mod:`bothy_notify.push`: push providers behind one port.
- :mod:`bothy_notify.store`: PostgreSQL access, migrations, the event log and
  the job queue.
- :mod:`bothy_notify.api`: the HTTP API.
- :mod:`bothy_notify.wiring`: builds the nursery tree for a role.
"""

__version__ = "0.1.0"
