"""WebSocket conformance: an echo server on the gateway's own transport and frame code,
the Autobahn testsuite's cases of sections 1 to 7 against it as a table test, and the
runner of the testsuite itself (``make autobahn``)."""
