"""tcdsl.codegen: loop IR -> C / CUDA / OpenCL source, and the toolchains that build it.

Installed as ``tcdsl.codegen`` from the top-level ``codegen/`` folder; it imports only the layers below
it (``tcdsl.core``, ``tcdsl.grammar``, ``tcdsl.polyhedral``).
"""
