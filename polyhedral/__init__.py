"""tcdsl.polyhedral: the polyhedral stages (checked def -> Scop -> schedule tree -> loop IR).

Installed as ``tcdsl.polyhedral`` from the top-level ``polyhedral/`` folder; it imports only the layers
below it (``tcdsl.core``, ``tcdsl.grammar``).
"""
