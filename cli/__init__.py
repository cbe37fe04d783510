"""The ``edgeplug`` command: install the CRDs, predict Instance names, run a handler here."""
