"""The kit that tests and benchmarks share (not product code; not in the wheel).

- :mod:`testkit.daemon`: ``bothy-notify run`` as a child process, ready when its
  ``--ready-file`` says so (the process form of ``task_status.started``).
- :mod:`testkit.ws`: the one WebSocket client of the gateway (RFC 6455 by hand
  over a Trio socket; strict about what the server sends).
- :mod:`testkit.fakes`: protocol-speaking stand-ins for what the daemon talks
  to: APNs (h2 on Trio, and nginx), FCM, a Web Push service, a webhook
  receiver.
- :mod:`testkit.events`: one valid payload of every event type, the examples tests
  and benchmarks build their cases from.
- :mod:`testkit.quiet`: the quiet-hours evaluation the current one replaced,
  the reference a test checks against and a benchmark times.

The product never imports this package (``.importlinter``); tests import it
from the repository root (pytest's ``rootdir``), benchmarks after putting the
root on ``sys.path``.
"""
