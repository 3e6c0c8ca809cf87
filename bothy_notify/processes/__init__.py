"""Several node processes from one command: ``server.processes = N`` (``run --processes N``).

::

    bothy-notify run --processes N        the parent (parent.py): no node of its own
    ├── embedded PostgreSQL               without database.url; started and migrated once
    ├── node process 1                    bothy-notify run: a cluster node of server.role
    ├── ...                               sharing api_listen and gateway_listen
    └── node process N                    (SO_REUSEPORT), each with its control channel

- :mod:`~bothy_notify.processes.parent`: ports, database, metrics directory,
  signals; the parent's one ``running`` line.
- :mod:`~bothy_notify.processes.supervisor`: starts the children, waits for
  them to be ready, restarts one that dies, drains and stops them.
- :mod:`~bothy_notify.processes.control`: the channel between the parent and a
  child (the child's spec, ``ready``, ``drain``, ``stop``) and the child's end of it.

With ``server.processes = 1`` none of this runs: ``bothy-notify run`` is the node.
"""
