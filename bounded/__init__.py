"""Bounded readers of what someone else may have written: local files, and text parsed from them.

A TRE reads files it did not write (a cohort table, a peer's certificate, an
approval, a model file) and text that came from elsewhere (a federation
config, a state file). These readers refuse before they are hurt: a file that
is not a regular file, is too large, or changes while read
(:mod:`bounded.files`); text nested deeper than any honest document
(:mod:`bounded.nesting`). They import only the standard library, so every
package may use them, the brain-age library and the simulations included;
``noise`` reads no files.
"""
