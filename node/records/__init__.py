"""The node's records: ledger, state folder, session and CAPE state, survivors, atomic writes."""
