"""The steps of a session, each a small object over the shared CoordinatorContext.

``joining`` (start, resume, joins), ``uploads``, ``unmask`` (attestations,
corrections, refusals), ``withdraw``, ``deadlines`` (what the clock decides),
``views`` (roster, results, status: reading only) and ``streams`` (payload
streams from the first chunk to a stored file); ``checks`` holds the checks
every message goes through. coordinator/session.py composes them.
"""
