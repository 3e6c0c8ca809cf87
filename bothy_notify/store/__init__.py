"""PostgreSQL access: the embedded server, migrations, the event log, projections,
facts for decisions, the job queue, registrations and secrets.

Queries run on psycopg's synchronous driver in a worker thread
(:meth:`Database.run`) behind a :class:`trio.CapacityLimiter` sized to the pool
(psycopg's async API is asyncio-only), except the hot path's single statements,
which the Trio thread drives itself (:mod:`~bothy_notify.store.direct`). Both
keep one rule (:mod:`~bothy_notify.store.connection`): a statement once sent is
waited for, for at most ``database.response_timeout``, and a cancelled caller
gets its result before the cancellation; nothing is abandoned halfway.
"""
