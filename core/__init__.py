"""tcdsl.core: the bottom layer, the types every stage shares and the checks that make them.

The AST (``ast``), its printer, scalar types, quasi-affine forms, the builtin table, semantic
analysis and range inference (``Def -> CheckedDef``), binding (``CheckedDef -> Instance``) and
its size limits, ``MappingOptions``, errors and knobs. Installed as ``tcdsl.core`` from the
top-level ``core/`` folder; it imports nothing else of tcdsl (tests/test_layers.py checks).
"""
