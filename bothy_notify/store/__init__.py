"""PostgreSQL access: the embedded server, migrations, the event log, projections,
facts for decisions, the job queue, registrations and secrets.

Every query runs on psycopg's synchronous driver in a worker thread
(:meth:`Database.run`) behind a :class:`trio.CapacityLimiter` sized to the pool:
psycopg's async API is asyncio-only. Writes are never abandoned on
cancellation; a cancelled caller waits for its statement to finish.
"""
