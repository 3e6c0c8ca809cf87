"""The HTTP API (Starlette, served by Hypercorn's Trio worker).

Device endpoints take the gateway's JWT; producer endpoints a token with scope
``events:write``; operator endpoints (``/healthz``, ``/readyz``, ``/metrics``)
take none. The contract is ``schemas/openapi.yaml``.
"""
