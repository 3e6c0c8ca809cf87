"""The notify job handlers: ``notify.push_send``, ``notify.gateway_send``, ``notify.flush``."""
