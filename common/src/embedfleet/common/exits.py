"""Exit codes that tell a supervisor why a process ended (the worker's, read by the operator and by
`embedfleet serve`)."""

from __future__ import annotations

#: the worker refused its model (an architecture it does not serve, or no model directory it can
#: read): sysexits' EX_CONFIG, which no crash or signal gives. Its one-line reason is the last
#: line of its stderr and its termination message; restarting it changes nothing.
EXIT_REFUSED = 78
