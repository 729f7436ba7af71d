"""coordinator: the aggregator of the session protocol — gRPC server, state machine, persistence.

Where to start reading:

* ``session.py``: the :class:`~coordinator.session.Session` facade, every
  method the server and the ``zerosum coordinator`` command call;
* ``transitions.py``: every change of the session's state and of a round's
  status, in one table (``events.py``: the events that drive it);
* ``steps/``: the checks and decisions behind each message, one small object
  per step (joining, uploads, unmask, withdraw, deadlines, views, payload
  streams) over the shared ``context.py``;
* ``store/``: the SQLite state file and its payload files (schema, rows,
  payload files, typed reads and writes);
* ``aggregate.py`` (the running uint64 sum), ``layout.py`` (payload header
  checks), ``config.py`` (what the coordinator takes from the federation
  config), ``messages.py`` (the result view that names a stored file; every
  message in and out is a plain type of ``proto/messages.py``), ``errors.py``
  (refusals and their gRPC status);
* ``server.py`` (the mutual-TLS gRPC server, translating with
  ``proto/convert.py``); ``guard.py`` and ``limits.py``
  (what every call passes through: identity, calls at once per caller and in
  total, stream deadlines, INTERNAL for the unexpected), ``operations.py``
  (health and reflection) and ``logs.py`` (text or JSON log lines);
* ``status_view.py``: ``zerosum coordinator --status``, read from the state
  file alone.
"""
