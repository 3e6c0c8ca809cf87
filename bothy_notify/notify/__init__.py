"""Notify: the pure decision, the consumer round, live routes and the notify jobs.

This package never imports :mod:`gateway`; it reaches live connections only
through the kernel ports :class:`~bothy_notify.kernel.presence.PresenceView`
and :class:`~bothy_notify.kernel.ephemeral.EphemeralPublisher`.
"""
