"""The Matrix push gateway (SPEC section 14c): a homeserver's notify requests in, one
durable push job per (event, pushkey) out, through the same providers as every push.

- :mod:`~.notification`: the request body as values, and the answer (pure);
- :mod:`~.apps`: ``[matrix_gateway] apps``, each Matrix app id's provider and app;
- :mod:`~.gateway`: serving one notify request (registrations, jobs, the wait);
- :mod:`~.send`: the ``matrix.push_send`` job kind.

Sending the other way (a registration that pushes through an upstream gateway) is a
provider like any other: :mod:`bothy_notify.push.matrix`.
"""
